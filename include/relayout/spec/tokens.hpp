// DSpark token units (docs/dspark.md): on decode-family rounds the per-rank values are request counts;
// DP/MoE geometry needs token rows. They are distinct types: mixing or comparing them does not
// compile, and the only way from one to the other is an explicit scaling by the per-request width.
#pragma once

#include <compare>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "relayout/mesh/error.hpp"

namespace relayout::spec {

template <class Unit>
struct Quantity {
  std::int64_t value = 0;

  friend constexpr auto operator<=>(Quantity, Quantity) = default;
  friend constexpr Quantity operator+(Quantity a, Quantity b) { return {a.value + b.value}; }
};

struct RequestUnit {};
struct RowUnit {};
using RequestCount = Quantity<RequestUnit>;  // requests (graph buckets, admission)
using TokenRows = Quantity<RowUnit>;         // rows of hidden states (DP/MoE geometry)

// Uniform rows per request in a speculative round (draft tokens + 1 verify row, for example).
struct TokensPerRequest {
  int value = 1;
};

inline TokenRows scale(RequestCount requests, TokensPerRequest width) {
  if (width.value < 1)
    throw LayoutError("num_tokens_per_req", "num_tokens_per_req = " + std::to_string(width.value) +
                                                ": a request contributes at least one row");
  if (requests.value < 0)
    throw LayoutError("global_num_tokens", "a request count cannot be negative (got " +
                                               std::to_string(requests.value) + ")");
  return {requests.value * width.value};
}

// [1,3,0,2] x 6 -> [6,18,0,12].
inline std::vector<TokenRows> scale_global_num_tokens(std::span<const RequestCount> raw,
                                                      TokensPerRequest width) {
  std::vector<TokenRows> rows;
  rows.reserve(raw.size());
  for (RequestCount r : raw) rows.push_back(scale(r, width));
  return rows;
}

// What every rank agrees on before a speculative DP/MoE round: both units, side by side.
struct DpSyncMetadata {
  std::vector<RequestCount> raw;   // per attention-DP group: requests (for graph bucket/admission)
  std::vector<TokenRows> scaled;   // per attention-DP group: rows (for DP/MoE geometry)
  TokensPerRequest width;

  static DpSyncMetadata from_requests(std::vector<RequestCount> raw, TokensPerRequest width) {
    DpSyncMetadata m{std::move(raw), {}, width};
    m.scaled = scale_global_num_tokens(m.raw, width);
    return m;
  }
  // A group with no requests still takes part in every collective with zero rows (docs/dspark.md).
  bool idle(std::size_t group) const { return raw.at(group).value == 0; }
  bool any_work() const {
    for (RequestCount r : raw)
      if (r.value > 0) return true;
    return false;
  }
  std::vector<std::int64_t> scaled_values() const {
    std::vector<std::int64_t> v;
    for (TokenRows r : scaled) v.push_back(r.value);
    return v;
  }
};

}  // namespace relayout::spec
