// The collectives relayout's communicators run, by name: what the agreement check compares and
// what a traffic log counts. Kept apart from agreement.hpp so that code which only names
// collectives (placement/traffic.hpp, the command-line tools) needs nothing else.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>

namespace relayout {

enum class CollectiveKind : std::uint8_t {
  all_reduce, all_reduce_in_place, all_gather, all_gather_in_place, all_gatherv,
  all_gatherv_in_place, reduce_scatter, reduce_scatter_in_place, reduce_scatterv, all_to_all,
  all_to_all_in_place, all_to_allv, broadcast, barrier,
  // Making a communicator (MpiCommunicator::dup, split, split_shared): collective as well, and
  // checked and watched the same way; not data-moving, so traffic logs do not count them.
  comm_dup, comm_split, comm_split_shared
};

inline const char* to_string(CollectiveKind k) {
  static constexpr const char* names[] = {
      "all_reduce", "all_reduce_in_place", "all_gather", "all_gather_in_place", "all_gatherv",
      "all_gatherv_in_place", "reduce_scatter", "reduce_scatter_in_place", "reduce_scatterv",
      "all_to_all", "all_to_all_in_place", "all_to_allv", "broadcast", "barrier",
      "comm_dup", "comm_split", "comm_split_shared"};
  const auto i = static_cast<std::size_t>(k);
  return i < std::size(names) ? names[i] : "unknown collective";
}

}  // namespace relayout
