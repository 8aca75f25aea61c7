// What the layer sent (relayout::TrafficLog) and, when asked, the owners of the rows this rank
// holds after each layout boundary (the "A B C D" picture of docs/bridge.md).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "relayout/mesh/names.hpp"
#include "relayout/placement/traffic.hpp"

namespace relayout::model {

// The library's traffic log, under the names the demo's programs print.
using Op = relayout::TrafficOp;
using TrafficLog = relayout::TrafficLog;
inline constexpr const auto& kOpNames = relayout::kTrafficOpNames;

// The owners of the rows a rank holds after one boundary of one layer.
struct Boundary {
  int layer = 0;
  std::string name;
  std::vector<std::int64_t> owners;
};

}  // namespace relayout::model
