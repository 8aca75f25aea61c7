// A prefill workload: requests (prompt lengths) placed on attention-DP groups, the owner of every
// token row (request, position), and the input rows, generated from (seed, request, position) so
// every rank and the reference build identical inputs without communication.
#pragma once

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "relayout/mesh/error.hpp"
#include "relayout/trace/owner.hpp"
#include "demo/model/weights.hpp"

namespace relayout::model {

using RowOwner = trace::RowOwner;

struct Workload {
  std::vector<int> lengths;    // prompt length of request i
  std::vector<int> placement;  // attention-DP group of request i

  // Request i goes to group i mod attn_dp unless `placement` names each request's group.
  static Workload make(std::vector<int> lengths, std::vector<int> placement, int attn_dp) {
    if (placement.empty())
      for (std::size_t i = 0; i < lengths.size(); ++i) placement.push_back(int(i) % attn_dp);
    if (placement.size() != lengths.size())
      throw LayoutError("--placement", "--placement names " + std::to_string(placement.size()) +
                                           " groups for " + std::to_string(lengths.size()) +
                                           " requests: give one group per request");
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      if (lengths[i] < 1 || lengths[i] > (1 << 20))
        throw LayoutError("--requests", "--requests: request " + std::to_string(i) + " has length " +
                                            std::to_string(lengths[i]) + "; a prompt length must be in [1, 2^20]");
      if (placement[i] < 0 || placement[i] >= attn_dp)
        throw LayoutError("--placement", "--placement: request " + std::to_string(i) + " is placed on group " +
                                             std::to_string(placement[i]) + "; a group must be in [0, attn_dp = " +
                                             std::to_string(attn_dp) + ")");
    }
    return {std::move(lengths), std::move(placement)};
  }

  int requests() const { return int(lengths.size()); }
  // Requests of DP group g, in request order.
  std::vector<int> requests_of(int g) const {
    std::vector<int> out;
    for (int i = 0; i < requests(); ++i)
      if (placement[std::size_t(i)] == g) out.push_back(i);
    return out;
  }
  // The owners of DP group g's rows, request after request.
  std::vector<std::int64_t> owners_of(int g) const {
    std::vector<std::int64_t> out;
    for (int r : requests_of(g))
      for (int p = 0; p < lengths[std::size_t(r)]; ++p) out.push_back(RowOwner::pack(r, p));
    return out;
  }
  // Row offsets of DP group g's requests (cu_seqlens for the attention kernel).
  std::vector<int> cu_seqlens_of(int g) const {
    std::vector<int> cu{0};
    for (int r : requests_of(g)) cu.push_back(cu.back() + lengths[std::size_t(r)]);
    return cu;
  }
  std::int64_t total_rows() const {
    std::int64_t n = 0;
    for (int l : lengths) n += l;
    return n;
  }
};

// Input hidden row of (request, position): a deterministic "embedding" in [-1, 1).
KOKKOS_INLINE_FUNCTION float input_value(std::uint64_t seed, std::int64_t owner, int feature, int hidden) {
  return counter_uniform(tensor_key(seed, 0, Tensor::embedding),
                         std::uint64_t(owner) * std::uint64_t(hidden) + std::uint64_t(feature), 1.0f);
}

}  // namespace relayout::model
