// A prefill workload: requests (prompt lengths) placed on attention-DP groups, the owner of every
// token row (request, position), and the input rows, generated from (seed, request, position) so
// every rank and the reference build identical inputs without communication.
#pragma once

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "relayout/attention/cp_share.hpp"
#include "relayout/mesh/layout.hpp"
#include "relayout/trace/owner.hpp"
#include "demo_model/weights.hpp"

namespace relayout::model {

using RowOwner = trace::RowOwner;

// Which of a DP group's rows one attention-CP rank holds: the library's (relayout/attention).
using CpShare = relayout::CpShare;

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
  // DP group g's batch as the CP ranks share it.
  CpBatch batch_of(int g, CpTokenSplit split, int cp) const {
    std::vector<int> n;
    for (int r : requests_of(g)) n.push_back(lengths[std::size_t(r)]);
    return CpBatch(std::move(n), split, cp);
  }
  CpBatch batch_of(int g, const RuntimeLayout& l) const { return batch_of(g, l.cp_token_split(), l.widths().attn_cp); }
  // Where the rows of CP share `s` sit among DP group g's rows (owners_of(g)), in group order.
  std::vector<int> positions_of(int g, const CpShare& s) const { return batch_of(g, s.split, s.cp).rows_of(s.rank); }
  // The owners of the rows of CP share `s` of DP group g (all of the group's rows when cp == 1).
  std::vector<std::int64_t> owners_of(int g, const CpShare& s) const {
    const std::vector<std::int64_t> all = owners_of(g);
    std::vector<std::int64_t> out;
    for (int i : positions_of(g, s)) out.push_back(all[std::size_t(i)]);
    return out;
  }
  // The CP rank that holds row `position` of request r in its DP group: a prompt row by the prefill
  // split of `s`, a decode row (position >= the prompt length) round-robin by position, p mod cp,
  // so a request's KV stays spread evenly over the CP ranks as it grows (docs/kv_cache.md).
  int cp_rank_of(int r, int position, const CpShare& s) const {
    const std::vector<int> group = requests_of(placement[std::size_t(r)]);
    const int j = int(std::find(group.begin(), group.end(), r) - group.begin());
    return batch_of(placement[std::size_t(r)], s.split, s.cp).rank_of(j, position);
  }
  std::int64_t total_rows() const {
    std::int64_t n = 0;
    for (int l : lengths) n += l;
    return n;
  }
};

// Decode steps after the prefill: request i feeds one new row per step for lengths[i] steps
// (--decode-lengths; requests not listed run every step), so requests finish at different steps.
struct DecodePlan {
  int steps = 0;
  std::vector<int> lengths;

  static DecodePlan make(int steps, std::vector<int> lengths, int requests) {
    if (steps < 0) throw LayoutError("--decode-steps", "--decode-steps must be >= 0, got " + std::to_string(steps));
    if (int(lengths.size()) > requests)
      throw LayoutError("--decode-lengths", "--decode-lengths names " + std::to_string(lengths.size()) +
                                                " requests but --requests has " + std::to_string(requests));
    for (std::size_t i = 0; i < lengths.size(); ++i)
      if (lengths[i] < 0 || lengths[i] > steps)
        throw LayoutError("--decode-lengths", "--decode-lengths: request " + std::to_string(i) + " runs " +
                                                  std::to_string(lengths[i]) + " steps; it must be in [0, --decode-steps = " +
                                                  std::to_string(steps) + "]");
    lengths.resize(std::size_t(requests), steps);
    return {steps, std::move(lengths)};
  }
  // Whether request i feeds a row at step s (1-based).
  bool live(int i, int s) const { return s <= lengths[std::size_t(i)]; }
  // The owners of the decode rows of DP group g at step s that CP share `c` holds (all of the group's
  // live requests when cp == 1), in request order; step 0: the prefill rows of the share.
  std::vector<std::int64_t> owners_of(const Workload& w, int g, int s, const CpShare& c) const {
    if (s == 0) return w.owners_of(g, c);
    std::vector<std::int64_t> out;
    for (int r : w.requests_of(g)) {
      const int p = w.lengths[std::size_t(r)] + s - 1;
      if (live(r, s) && w.cp_rank_of(r, p, c) == c.rank) out.push_back(RowOwner::pack(r, p));
    }
    return out;
  }
};

// The input row of a decode step, from the request's previous output row: that row scaled to unit
// RMS (a deterministic function both the layer, in float, and the reference, in double, apply).
template <class T>
void next_input(const T* prev, T* next, int hidden) {
  double ss = 0;
  for (int f = 0; f < hidden; ++f) ss += double(prev[f]) * double(prev[f]);
  const double inv = 1.0 / std::sqrt(ss / hidden + 1e-6);
  for (int f = 0; f < hidden; ++f) next[f] = T(double(prev[f]) * inv);
}

// Input hidden row of (request, position): a deterministic "embedding" in [-1, 1).
KOKKOS_INLINE_FUNCTION float input_value(std::uint64_t seed, std::int64_t owner, int feature, int hidden) {
  return counter_uniform(tensor_key(seed, 0, Tensor::embedding),
                         std::uint64_t(owner) * std::uint64_t(hidden) + std::uint64_t(feature), 1.0f);
}

}  // namespace relayout::model
