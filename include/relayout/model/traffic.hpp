// What the layer sent: calls and bytes per (collective, group) on this rank, and, when asked, the
// owners of the rows this rank holds after each layout boundary (the seeds' "A B C D" picture).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "relayout/mesh/names.hpp"

namespace relayout::model {

enum class Op : std::uint8_t {
  all_gather_counts,
  all_reduce,
  all_gather,
  all_gatherv,
  reduce_scatter,
  reduce_scatterv,
  all_to_all,
  all_to_allv,
};
inline constexpr std::array<std::string_view, 8> kOpNames = {
    "all_gather(counts)", "all_reduce", "all_gather", "all_gatherv",
    "reduce_scatter", "reduce_scatterv", "all_to_all", "all_to_allv"};

struct TrafficLog {
  static constexpr std::size_t kOps = kOpNames.size();
  static constexpr std::size_t kGroups = kAllGroupKinds.size();
  // calls and bytes, flattened [op][group] so ranks can exchange them as one int64 array.
  std::array<std::int64_t, kOps * kGroups> calls{};
  std::array<std::int64_t, kOps * kGroups> bytes{};

  static std::size_t slot(Op op, GroupKind g) {
    return std::size_t(op) * kGroups + std::size_t(g);
  }
  void add(Op op, GroupKind g, std::int64_t n_bytes) {
    calls[slot(op, g)] += 1;
    bytes[slot(op, g)] += n_bytes;
  }
  std::int64_t calls_of(Op op, GroupKind g) const { return calls[slot(op, g)]; }
  std::int64_t bytes_of(Op op, GroupKind g) const { return bytes[slot(op, g)]; }
  void clear() { *this = TrafficLog{}; }
};

// The owners of the rows a rank holds after one boundary of one layer.
struct Boundary {
  int layer = 0;
  std::string name;
  std::vector<std::int64_t> owners;
};

}  // namespace relayout::model
