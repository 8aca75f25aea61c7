// The one range type of the library: [begin, begin + count) of rows, tokens or features. Row
// shards, CP token chunks and tensor-parallel feature shards are all a Range.
#pragma once

#include <cstdint>
#include <utility>

namespace relayout {

struct Range {
  std::int64_t begin = 0;
  std::int64_t count = 0;
  constexpr std::int64_t end() const { return begin + count; }
  constexpr bool contains(std::int64_t i) const { return i >= begin && i < begin + count; }
  // For Kokkos::subview: the half-open pair {begin, end}.
  constexpr std::pair<std::int64_t, std::int64_t> pair() const { return {begin, begin + count}; }
  friend constexpr bool operator==(const Range&, const Range&) = default;
};

}  // namespace relayout
