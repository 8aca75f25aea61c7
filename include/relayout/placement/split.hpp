// torch.tensor_split row ranges: n rows in `parts` chunks, the first n % parts chunks one row
// larger. Used for RowShard placements and for any array that must stay aligned with the rows.
#pragma once

#include <cstdint>
#include <string>

#include "relayout/mesh/error.hpp"
#include "relayout/mesh/range.hpp"

namespace relayout {

// Chunk `index` of n rows split into `parts` (tensor_split semantics).
constexpr Range tensor_split_range(std::int64_t n, int parts, int index) {
  if (n < 0 || parts < 1 || index < 0 || index >= parts)
    throw LayoutError("tensor_split", "tensor_split_range(" + std::to_string(n) + ", " +
                                          std::to_string(parts) + ", " + std::to_string(index) +
                                          "): need n >= 0, parts >= 1 and 0 <= index < parts");
  const std::int64_t base = n / parts, extra = n % parts;
  return {index * base + (index < extra ? index : extra), base + (index < extra ? 1 : 0)};
}

}  // namespace relayout
