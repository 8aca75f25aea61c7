// What a rank sent: calls and bytes per (operation, group), counted by the bridge and by the EP
// dispatch/combine when given a log. Bytes are what this rank hands to the collective (its send
// buffer; for gathers, the assembled receive buffer), so ranks can be compared with each other and
// with a prediction. A group of one rank moves nothing and is not counted.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "relayout/comm/collective_kind.hpp"
#include "relayout/mesh/names.hpp"

namespace relayout {

// What a log counts: a collective, named as the agreement check names it (its value is the
// CollectiveKind's), or one of three operations that are not a single collective call.
inline constexpr std::size_t kCollectiveKinds = static_cast<std::size_t>(CollectiveKind::barrier) + 1;
enum class TrafficOp : std::uint8_t {
  all_reduce = static_cast<std::uint8_t>(CollectiveKind::all_reduce),
  all_gather = static_cast<std::uint8_t>(CollectiveKind::all_gather),
  all_gatherv = static_cast<std::uint8_t>(CollectiveKind::all_gatherv),
  reduce_scatter = static_cast<std::uint8_t>(CollectiveKind::reduce_scatter),
  reduce_scatterv = static_cast<std::uint8_t>(CollectiveKind::reduce_scatterv),
  all_to_all = static_cast<std::uint8_t>(CollectiveKind::all_to_all),
  all_to_allv = static_cast<std::uint8_t>(CollectiveKind::all_to_allv),
  all_gather_counts = kCollectiveKinds,  // the token counts of every DP group
  dispatch,  // EP dispatch: rows (once per destination rank) with their expert ids and weights
  combine,   // EP combine: one weighted row per (row, destination rank)
};
inline constexpr std::size_t kTrafficOps = static_cast<std::size_t>(TrafficOp::combine) + 1;
inline std::string_view to_string(TrafficOp op) {
  constexpr std::string_view own[] = {"all_gather(counts)", "dispatch", "combine"};
  const auto i = static_cast<std::size_t>(op);
  return i < kCollectiveKinds ? std::string_view(to_string(static_cast<CollectiveKind>(op))) : own[i - kCollectiveKinds];
}

// Every op's name by index, for loops over a log's slots.
inline const std::array<std::string_view, kTrafficOps> kTrafficOpNames = [] {
  std::array<std::string_view, kTrafficOps> a{};
  for (std::size_t i = 0; i < kTrafficOps; ++i) a[i] = to_string(static_cast<TrafficOp>(i));
  return a;
}();

struct TrafficLog {
  static constexpr std::size_t kOps = kTrafficOps;
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
