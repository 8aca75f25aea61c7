// Shape errors of the kernels. Every kernel validates its arguments on the host before it launches
// anything and throws KernelError naming the argument and the rule it broke.
#pragma once

#include <cstdint>
#include <string>

#include "relayout/mesh/error.hpp"

namespace relayout::kernels {

class KernelError : public LayoutError {
 public:
  using LayoutError::LayoutError;
};

namespace impl {

// Throws KernelError(arg, "<kernel>: <arg>: <rule>") when `ok` is false.
inline void require(bool ok, const char* kernel, const char* arg, const std::string& rule) {
  if (!ok) throw KernelError(arg, std::string("relayout::kernels::") + kernel + ": " + arg + ": " + rule);
}

inline std::string str(std::int64_t v) { return std::to_string(v); }

}  // namespace impl
}  // namespace relayout::kernels
