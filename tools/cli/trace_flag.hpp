// The examples' --trace DIR flag: opens this rank's JSON Lines file, and turns a directory that
// cannot be created or a file that cannot be written into a LayoutError naming --trace.
#pragma once

#include <exception>
#include <string>

#include "relayout/mesh/error.hpp"
#include "relayout/trace/jsonl.hpp"

namespace relayout::cli {

inline void open_trace(trace::JsonlSink& sink, const std::string& dir, int rank, int world_size,
                       const std::string& program) {
  try {
    sink.open(dir, rank, world_size, program);
  } catch (const std::exception& e) {
    throw LayoutError("--trace", "--trace " + dir + ": cannot write the trace there (" + e.what() + ")");
  }
}

}  // namespace relayout::cli
