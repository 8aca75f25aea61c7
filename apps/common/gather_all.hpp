// For the examples' reports: every rank's int64 payload on every rank (sizes, then all_gatherv over
// the world), so rank 0 can print what each rank did.
#pragma once

#include <cstdint>
#include <vector>

#include "relayout/comm.hpp"

namespace relayout::cli {

inline std::vector<std::vector<std::int64_t>> gather_all(const MpiCommunicator& world,
                                                         const std::vector<std::int64_t>& mine) {
  std::vector<std::int64_t> n{std::int64_t(mine.size())}, sizes(static_cast<std::size_t>(world.size()));
  all_gather(world, n, sizes);
  std::vector<int> counts;
  std::int64_t total = 0;
  for (std::int64_t s : sizes) {
    counts.push_back(int(s));
    total += s;
  }
  std::vector<std::int64_t> all(static_cast<std::size_t>(total));
  all_gatherv(world, mine, all, counts);
  std::vector<std::vector<std::int64_t>> out;
  std::size_t at = 0;
  for (int c : counts) {
    out.emplace_back(all.begin() + std::ptrdiff_t(at), all.begin() + std::ptrdiff_t(at + std::size_t(c)));
    at += std::size_t(c);
  }
  return out;
}

}  // namespace relayout::cli
