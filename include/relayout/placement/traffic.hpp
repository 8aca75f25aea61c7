// What a rank sent: calls and bytes per (operation, group), counted by the bridge and by the EP
// dispatch/combine when given a log. Bytes are what this rank hands to the collective (its send
// buffer; for gathers, the assembled receive buffer), so ranks can be compared with each other and
// with a prediction. A group of one rank moves nothing and is not counted.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "relayout/mesh/names.hpp"

namespace relayout {

enum class TrafficOp : std::uint8_t {
  all_gather_counts,
  all_reduce,
  all_gather,
  all_gatherv,
  reduce_scatter,
  reduce_scatterv,
  all_to_all,
  all_to_allv,
  dispatch,  // EP dispatch: rows (once per destination rank) with their expert ids and weights
  combine,   // EP combine: one weighted row per (row, destination rank)
};
inline constexpr std::array<std::string_view, 10> kTrafficOpNames = {
    "all_gather(counts)", "all_reduce", "all_gather", "all_gatherv", "reduce_scatter",
    "reduce_scatterv",    "all_to_all", "all_to_allv", "dispatch",   "combine"};
constexpr std::string_view to_string(TrafficOp op) { return kTrafficOpNames[static_cast<std::size_t>(op)]; }

struct TrafficLog {
  static constexpr std::size_t kOps = kTrafficOpNames.size();
  static constexpr std::size_t kGroups = kAllGroupKinds.size();
  // calls and bytes, flattened [op][group] so ranks can exchange them as one int64 array.
  std::array<std::int64_t, kOps * kGroups> calls{};
  std::array<std::int64_t, kOps * kGroups> bytes{};

  static std::size_t slot(TrafficOp op, GroupKind g) { return std::size_t(op) * kGroups + std::size_t(g); }
  void add(TrafficOp op, GroupKind g, std::int64_t n_bytes) {
    calls[slot(op, g)] += 1;
    bytes[slot(op, g)] += n_bytes;
  }
  std::int64_t calls_of(TrafficOp op, GroupKind g) const { return calls[slot(op, g)]; }
  std::int64_t bytes_of(TrafficOp op, GroupKind g) const { return bytes[slot(op, g)]; }
  void clear() { *this = TrafficLog{}; }
};

}  // namespace relayout
