// The collectives over an expert location map: a step's expert loads summed over the ranks that
// route tokens, and the check that every member dispatches with the same logical -> physical map.
// Kept apart from expert_location.hpp so that tools predicting loads need no communicator.
#pragma once

#include <bit>
#include <cstdint>
#include <string>
#include <vector>

#include "relayout/comm.hpp"
#include "relayout/placement/expert_location.hpp"

namespace relayout {

// The step's load over all ranks: every member's physical counts summed over comm (the group
// whose members route tokens: moe_ep, or the whole TP domain), on exec.
template <ExecutionSpaceInstance E, Communicator C>
ExpertLoad sum_expert_load(const E& exec, const C& comm, const ExpertLocation& loc, const ExpertLoad& local) {
  std::vector<std::int64_t> total(local.physical.size());
  all_reduce(exec, comm, local.physical, total, ReduceOp::sum);
  return ExpertLoad(loc, std::move(total));
}

// Throws the same LayoutError on every member of comm unless all hold the same map (compared by
// fingerprint): a member dispatching with another map would send tokens to the wrong replicas.
template <ExecutionSpaceInstance E, Communicator C>
void require_same_expert_location(const E& exec, const C& comm, const ExpertLocation& loc) {
  const std::vector<std::int64_t> mine{std::bit_cast<std::int64_t>(loc.fingerprint())};
  std::vector<std::int64_t> all(static_cast<std::size_t>(comm.size()));
  all_gather(exec, comm, mine, all);
  std::vector<int> differ;
  for (std::size_t m = 0; m < all.size(); ++m)
    if (all[m] != all[0]) differ.push_back(static_cast<int>(m));
  if (differ.empty()) return;
  std::string list;
  for (int m : differ) {
    if (!list.empty()) list += ' ';
    list += std::to_string(m);
  }
  throw LayoutError("expert_location", "expert location differs across the group: members [" + list +
                                           "] hold another map than member 0; every member must dispatch with the "
                                           "same logical -> physical map");
}

}  // namespace relayout
