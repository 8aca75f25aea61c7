// Which token rows of an attention-DP group's batch each attention-CP rank holds (docs/cp.md):
// two blocks of every request, an early and a late one (plain --cp, the zigzag split), or token i
// of the batch on CP rank i mod cp (DeepSeek-V4 prefill CP), with each held token's row in the batch, which is where its own key
// sits in the group's KV and what its causal mask is measured from.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "relayout/mesh/error.hpp"
#include "relayout/mesh/layout.hpp"

namespace relayout {

// One CP rank's share: the split rule, the CP width and the rank.
struct CpShare {
  CpTokenSplit split = CpTokenSplit::zigzag;
  int cp = 1;
  int rank = 0;

  static CpShare of(const RuntimeLayout& l, int cp_rank) {
    if (cp_rank < 0 || cp_rank >= l.widths().attn_cp)
      throw LayoutError("cp_rank", "CpShare: cp_rank " + std::to_string(cp_rank) + " is not in [0, attn_cp = " +
                                       std::to_string(l.widths().attn_cp) + ")");
    return {l.cp_token_split(), l.widths().attn_cp, cp_rank};
  }
  friend constexpr bool operator==(const CpShare&, const CpShare&) = default;
};

// The prefill batch of one attention-DP group (its requests' prompt lengths, in batch order) as
// the CP ranks share it. Every rank of the group builds the same one without communication.
class CpBatch {
 public:
  CpBatch(std::vector<int> lengths, CpTokenSplit split, int cp) : lengths_(std::move(lengths)), split_(split), cp_(cp) {
    if (cp < 1 || cp > (1 << 20))
      throw LayoutError("cp", "CpBatch: attn_cp " + std::to_string(cp) + " must be in [1, 2^20]");
    cu_.push_back(0);
    for (std::size_t j = 0; j < lengths_.size(); ++j) {
      if (lengths_[j] < 0 || lengths_[j] > (1 << 30))
        throw LayoutError("lengths", "CpBatch: request " + std::to_string(j) + " has length " +
                                         std::to_string(lengths_[j]) + "; a length must be in [0, 2^30]");
      if (std::int64_t(cu_.back()) + lengths_[j] > INT32_MAX)
        throw LayoutError("lengths", "CpBatch: the batch holds more than 2^31 - 1 tokens");
      cu_.push_back(cu_.back() + lengths_[j]);
    }
  }
  // The batch of the DP group as `layout` splits it (its split rule and attn_cp).
  CpBatch(std::vector<int> lengths, const RuntimeLayout& layout)
      : CpBatch(std::move(lengths), layout.cp_token_split(), layout.widths().attn_cp) {}

  int requests() const { return int(lengths_.size()); }
  int cp() const { return cp_; }
  CpTokenSplit split() const { return split_; }
  const std::vector<int>& lengths() const { return lengths_; }
  // Row offsets of the requests in the batch (cu_seqlens of the group's KV).
  const std::vector<int>& cu_seqlens() const { return cu_; }
  int tokens() const { return cu_.back(); }

  // The CP rank holding position p of request j: a prompt token by the split rule, a later token
  // (decode or extend, p >= the prompt length) round-robin by position, p mod cp, so a request's
  // KV stays spread evenly over the CP ranks as it grows (docs/kv_cache.md).
  int rank_of(int j, std::int64_t p) const {
    check_request("rank_of", j);
    if (p < 0) throw LayoutError("position", "CpBatch::rank_of: position " + std::to_string(p) + " must be >= 0");
    const int n = lengths_[std::size_t(j)];
    if (p >= n || cp_ == 1) return int(p % cp_);
    if (split_ == CpTokenSplit::round_robin) return prefill_cp_rank_of_token(cu_[std::size_t(j)] + p, cp_);
    return cp_rank_of_token(split_, p, n, cp_);
  }
  // The batch rows CP rank r holds, in batch order: for each, the row of its own key.
  std::vector<int> rows_of(int r) const {
    check_rank(r);
    std::vector<int> out;
    for (int j = 0; j < requests(); ++j)
      for (int p = 0; p < lengths_[std::size_t(j)]; ++p)
        if (rank_of(j, p) == r) out.push_back(cu_[std::size_t(j)] + p);
    return out;
  }
  // The positions of request j that CP rank r holds, ascending (what its KV cache keeps of j).
  std::vector<int> positions_of(int r, int j) const {
    check_rank(r);
    check_request("positions_of", j);
    std::vector<int> out;
    for (int p = 0; p < lengths_[std::size_t(j)]; ++p)
      if (rank_of(j, p) == r) out.push_back(p);
    return out;
  }
  // Rows per CP rank, and all of them CP rank after CP rank: the order an all_gatherv over attn_cp
  // leaves the CP ranks' rows in (order()[i] is where gathered row i belongs in the batch).
  std::vector<int> counts() const {
    std::vector<int> c(std::size_t(cp_), 0);
    for (int j = 0; j < requests(); ++j)
      for (int p = 0; p < lengths_[std::size_t(j)]; ++p) ++c[std::size_t(rank_of(j, p))];
    return c;
  }
  std::vector<int> order() const {
    std::vector<int> out;
    for (int r = 0; r < cp_; ++r) {
      const std::vector<int> mine = rows_of(r);
      out.insert(out.end(), mine.begin(), mine.end());
    }
    return out;
  }

 private:
  void check_rank(int r) const {
    if (r < 0 || r >= cp_)
      throw LayoutError("cp_rank", "CpBatch: CP rank " + std::to_string(r) + " is not in [0, " + std::to_string(cp_) + ")");
  }
  void check_request(const char* fn, int j) const {
    if (j < 0 || j >= requests())
      throw LayoutError("request", std::string("CpBatch::") + fn + ": request " + std::to_string(j) +
                                       " is not in [0, " + std::to_string(requests()) + ")");
  }

  std::vector<int> lengths_;
  CpTokenSplit split_;
  int cp_;
  std::vector<int> cu_;
};

}  // namespace relayout
