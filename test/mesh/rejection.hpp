// What the layout engine says of a configuration it refuses: the input it names and its message
// (both empty when it accepts), shared by the launch-rule tests.
#pragma once

#include <relayout/mesh.hpp>
#include <string>

namespace relayout::test {

struct Rejection {
  std::string input, message;
};

inline Rejection rejection_of(const LayoutConfig& c) {
  try {
    RuntimeLayout l(c);
  } catch (const LayoutError& e) {
    return {e.input(), e.what()};
  }
  return {};
}

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace relayout::test
