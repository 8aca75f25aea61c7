// Errors of the communication layer. A failing MPI/NCCL/CUDA call throws CommError naming the call,
// file and line; wrong sizes or counts a caller passes throw LayoutError before any call is made.
#pragma once

#include <stdexcept>
#include <string>

#include "relayout/mesh/error.hpp"

namespace relayout {

class CommError : public std::runtime_error {
 public:
  CommError(std::string call, const char* file, int line, const std::string& detail)
      : std::runtime_error(call + " failed at " + file + ":" + std::to_string(line) + ": " + detail),
        call_(std::move(call)) {}

  // The call expression that failed, as written in the source.
  const std::string& call() const noexcept { return call_; }

 private:
  std::string call_;
};

}  // namespace relayout
