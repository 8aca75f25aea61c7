// The rank layout of one TP domain (docs/layout.md#rank-coordinates–docs/dspark.md): coordinates, groups, bridge path, padding mode,
// which CP rank holds which token, and the DSpark start-up verdict as constexpr rules, and
// RuntimeLayout, the checked runtime form.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "relayout/mesh/error.hpp"
#include "relayout/mesh/names.hpp"
#include "relayout/mesh/range.hpp"
#include "relayout/mesh/radix.hpp"
#include "relayout/mesh/widths.hpp"

namespace relayout {

struct RankCoords {
  int rank = 0;
  int attn_dp_rank = 0;
  int attn_cp_rank = 0;
  int attn_tp_rank = 0;
  int moe_dp_rank = 0;
  int moe_ep_rank = 0;
  int moe_tp_rank = 0;
  int dcp_rank = 0;       // position in the decode-CP block of the TP group
  int dense_tp_rank = 0;  // position in the dense layers' TP group

  friend constexpr bool operator==(const RankCoords&, const RankCoords&) = default;
};

// Attention order (dp, cp, tp) and MoE order (moe_dp, moe_ep, moe_tp), fastest last (docs/layout.md#rank-coordinates).
constexpr MixedRadix<3> attention_radix(const Widths& w) { return {{w.attn_dp, w.attn_cp, w.attn_tp}}; }
constexpr MixedRadix<3> moe_radix(const Widths& w) { return {{w.moe_dp, w.moe_ep, w.moe_tp}}; }

// Decode CP (contiguous dcp-rank blocks of the TP group, parallel_state.py
// initialize_model_parallel) and the dense layers' TP group (blocks of dense_tp), each as a block
// split of tp. A width left 0 (a hand-made Widths) reads as 1 and tp.
constexpr MixedRadix<3> block_radix(int tp, int block) {
  const int b = block > 0 ? block : 1;
  return {{1, tp / b, b}};
}
constexpr MixedRadix<3> dcp_radix(const Widths& w) { return block_radix(w.tp, w.dcp); }
constexpr MixedRadix<3> dense_tp_radix(const Widths& w) {
  return block_radix(w.tp, w.dense_tp > 0 ? w.dense_tp : w.tp);
}

constexpr RankCoords rank_coords(const Widths& w, int rank) {
  const auto a = attention_radix(w).coords(rank);
  const auto m = moe_radix(w).coords(rank);
  return {rank, a[0], a[1], a[2], m[0], m[1], m[2], dcp_radix(w).coords(rank)[2],
          dense_tp_radix(w).coords(rank)[2]};
}

// Which factorization and which of its axes vary inside a group of the given kind (docs/layout.md#groups).
struct GroupGeometry {
  MixedRadix<3> radix;
  unsigned free;
};

constexpr GroupGeometry group_geometry(const Widths& w, GroupKind kind) {
  // SGLang makes the attention-CP group serve as the MoE-DP group when attn_cp > moe_dp.
  if (kind == GroupKind::moe_dp && moe_dp_group_is_attn_cp(w)) kind = GroupKind::attn_cp;
  switch (kind) {
    case GroupKind::tp: return {attention_radix(w), 0b111u};
    case GroupKind::attn_tp: return {attention_radix(w), 0b100u};
    case GroupKind::attn_cp: return {attention_radix(w), 0b010u};
    case GroupKind::moe_tp: return {moe_radix(w), 0b100u};
    case GroupKind::moe_ep: return {moe_radix(w), 0b010u};
    case GroupKind::moe_dp: return {moe_radix(w), 0b001u};
    case GroupKind::dcp: return {dcp_radix(w), 0b100u};
    case GroupKind::dense_tp: return {dense_tp_radix(w), 0b100u};
    // Inside one domain every rank is its own pipeline group; WorldLayout spans the stages.
    case GroupKind::pp: return {attention_radix(w), 0b000u};
  }
  return {attention_radix(w), 0b111u};
}

// Without an all-to-all backend, rows that differ between ranks (attention DP, or CP ranks each
// holding a share of their group's tokens) are gathered before the MoE: path dp_gather.
constexpr BridgePath bridge_path(const Widths& w, Backend backend) {
  if (resolved_backend(backend) == Backend::none) return w.attn_dp > 1 || w.attn_cp > 1 ? BridgePath::dp_gather : BridgePath::tp_moe;
  return w.attn_tp > 1 ? BridgePath::a2a_split : BridgePath::direct;
}

struct DsparkVerdict {
  bool allowed = true;
  std::string_view error{};  // empty when allowed
  std::string_view input{};  // the flag to change; empty when allowed
};

// docs/dspark.md: rejected before the draft worker exists. Generic, not tied to a device type.
// The MoE-draft rule (SGLang's DSpark worker) is checked first because its layout corrupts
// results; then speculative_hook.py _handle_dspark's DP-attention rules, which apply with dp > 1
// only ("dp_size == 1 with dp attention is a degenerate flag under DeepSeek-V4 CP").
constexpr DsparkVerdict dspark_verdict(const LayoutConfig& c, const Widths& w) {
  if (c.draft == Draft::none) return {};
  if (dp_attention_on(c) && c.draft == Draft::moe && w.attn_tp > 1)
    return {false, RELAYOUT_DSPARK_MOE_DRAFT_MESSAGE, "--draft"};
  if (dp_attention_on(c) && resolved_dp(c) > 1) {
    if (!c.enable_dp_lm_head) return {false, RELAYOUT_DSPARK_DP_LM_HEAD_MESSAGE, "--enable-dp-lm-head"};
    if (resolved_backend(c.moe_a2a_backend) != Backend::none)
      return {false, RELAYOUT_DSPARK_BACKEND_MESSAGE, "--moe-a2a-backend"};
    if (w.attn_cp > 1) return {false, RELAYOUT_DSPARK_CP_MESSAGE, "--cp"};
  }
  return {};
}

// The LM head's layout (--enable-dp-lm-head, --enable-tp-lm-head-all-to-all): which group splits
// the vocabulary, into how many slices, and how the logits meet the rows. SGLang's
// VocabParallelEmbedding shards the vocabulary over the attention-TP group with the DP LM head
// (each DP group computes its own rows' logits, no gather across DP groups) and over the whole TP
// group otherwise; the TP LM-head all-to-all keeps the TP split and exchanges hidden rows and
// logits by one all-to-all over tp in place of the DP gather and scatter.
struct LmHeadLayout {
  GroupKind vocab_group = GroupKind::tp;  // attn_tp with the DP LM head (dp > 1), tp otherwise
  int vocab_shards = 1;                   // that group's size: the slices of the vocabulary
  bool dp_lm_head = false;                // --enable-dp-lm-head as resolved (dp_lm_head_on)
  bool tp_all_to_all = false;             // --enable-tp-lm-head-all-to-all

  friend constexpr bool operator==(const LmHeadLayout&, const LmHeadLayout&) = default;
};

constexpr LmHeadLayout lm_head_layout(const LayoutConfig& c, const Widths& w) {
  const bool dp_head = dp_lm_head_on(c);
  return {dp_head ? GroupKind::attn_tp : GroupKind::tp, dp_head ? w.attn_tp : w.tp, dp_head,
          c.enable_tp_lm_head_all_to_all};
}

// Which attention-CP rank holds which token of a request. Plain CP (`--cp`, SGLang's
// "in-seq-split", the only split its plain prefill CP has) cuts every request into 2 * cp blocks
// and gives CP rank r blocks r and 2 * cp - 1 - r: an early and a late block each, so causal
// attention costs about the same on every CP rank. DeepSeek-V4 prefill CP deals tokens round-robin
// (SGLang's "round-robin-split"). `contiguous` (CP rank r holds the r-th of cp chunks) is no
// launch flag's split; an engine can still build a CpBatch with it.
enum class CpTokenSplit : std::uint8_t { contiguous, round_robin, zigzag };

constexpr const char* cp_token_split_name(CpTokenSplit s) {
  return s == CpTokenSplit::round_robin ? "round_robin" : s == CpTokenSplit::zigzag ? "zigzag" : "contiguous";
}

constexpr CpTokenSplit cp_token_split(const LayoutConfig& c) {
  return c.enable_prefill_cp ? CpTokenSplit::round_robin : CpTokenSplit::zigzag;
}

// Prefill CP: token i of the batch goes to CP rank i mod cp.
constexpr int prefill_cp_rank_of_token(std::int64_t i, int cp) { return static_cast<int>(i % cp); }

// The chunk of n tokens that rank r of `parts` holds when they are cut into `parts` contiguous
// chunks; the first n % parts chunks are one longer.
constexpr Range cp_chunk(std::int64_t n, int parts, int r) {
  const std::int64_t base = n / parts, extra = n % parts;
  const std::int64_t begin = r * base + (r < extra ? r : extra);
  return {begin, base + (r < extra ? 1 : 0)};
}

// The chunk (of `parts`, as cp_chunk cuts them) that holds token i of n.
constexpr int cp_chunk_rank_of_token(std::int64_t i, std::int64_t n, int parts) {
  const std::int64_t base = n / parts, extra = n % parts;
  const std::int64_t in_long = extra * (base + 1);  // tokens in the longer, leading chunks
  return static_cast<int>(i < in_long ? i / (base + 1) : extra + (i - in_long) / base);
}

// Plain CP: the two blocks of a request of n tokens that CP rank r holds, in position order
// (block r, then block 2 * cp - 1 - r; cp_chunk over 2 * cp blocks).
struct ZigzagBlocks {
  Range early, late;
  constexpr std::int64_t count() const { return early.count + late.count; }
};
constexpr ZigzagBlocks cp_zigzag_blocks(std::int64_t n, int cp, int r) {
  return {cp_chunk(n, 2 * cp, r), cp_chunk(n, 2 * cp, 2 * cp - 1 - r)};
}

// Plain CP: the CP rank holding token i of a request of n tokens.
constexpr int cp_zigzag_rank_of_token(std::int64_t i, std::int64_t n, int cp) {
  const int b = cp_chunk_rank_of_token(i, n, 2 * cp);
  return b < cp ? b : 2 * cp - 1 - b;
}

// Tokens of n that CP rank r holds under `split`: n / cp, plus one when r < n % cp, for the
// contiguous and round-robin splits; the sizes of its two blocks for the zigzag split.
constexpr std::int64_t cp_token_count(std::int64_t n, int cp, int r, CpTokenSplit split) {
  if (split == CpTokenSplit::zigzag) return cp_zigzag_blocks(n, cp, r).count();
  return n / cp + (r < n % cp ? 1 : 0);
}

// The CP rank holding token i of a request (or, round-robin, of a batch) of n tokens under `split`.
constexpr int cp_rank_of_token(CpTokenSplit split, std::int64_t i, std::int64_t n, int cp) {
  switch (split) {
    case CpTokenSplit::round_robin: return prefill_cp_rank_of_token(i, cp);
    case CpTokenSplit::zigzag: return cp_zigzag_rank_of_token(i, n, cp);
    case CpTokenSplit::contiguous: break;
  }
  return cp_chunk_rank_of_token(i, n, cp);
}

// Token counts are rounded up to a multiple of attn_tp so rows split evenly (docs/bridge.md#padding).
constexpr std::int64_t round_up_tokens(std::int64_t n, int attn_tp) {
  return (n + attn_tp - 1) / attn_tp * attn_tp;
}

// docs/bridge.md#padding: MAX_LEN if 2*sum >= max*attn_dp else SUM_LEN; pplx always MAX_LEN. Every rank calls
// this on the same all-gathered counts, so every rank picks the same mode.
inline PaddingMode padding_mode(std::span<const std::int64_t> global_num_tokens, int attn_dp,
                                Backend backend) {
  if (global_num_tokens.size() != static_cast<std::size_t>(attn_dp))
    throw LayoutError("global_num_tokens",
                      "global_num_tokens has " + std::to_string(global_num_tokens.size()) +
                          " entries; it needs one per attention-DP group (attn_dp = " +
                          std::to_string(attn_dp) + ")");
  std::int64_t sum = 0, max = 0;
  for (std::size_t i = 0; i < global_num_tokens.size(); ++i) {
    const std::int64_t n = global_num_tokens[i];
    if (n < 0 || n > (std::int64_t{1} << 40))
      throw LayoutError("global_num_tokens", "global_num_tokens[" + std::to_string(i) + "] = " +
                                                 std::to_string(n) +
                                                 ": a token count must be in [0, 2^40]");
    sum += n;
    max = n > max ? n : max;
  }
  if (forces_max_len(backend)) return PaddingMode::max_len;
  return 2 * sum >= max * attn_dp ? PaddingMode::max_len : PaddingMode::sum_len;
}

// The runtime layout: constructed from flags, checked, and answering every question the
// compile-time policy answers with the same constexpr rules.
// Something a reader of a layout should know that its widths do not say; `relayout explain`
// prints them under the widths.
struct LayoutNote {
  enum class Kind {
    dp_replicas,  // dp > 1 without DP attention: dp counts whole replicas, not ranks of this domain
  };
  Kind kind;
  std::string text;

  static constexpr std::string_view kind_name(Kind k) {
    switch (k) {
      case Kind::dp_replicas: return "dp_replicas";
    }
    return "";
  }
};

class RuntimeLayout {
 public:
  explicit RuntimeLayout(const LayoutConfig& config)
      : config_(config), widths_(checked_widths(config)) {}

  const LayoutConfig& config() const { return config_; }
  const Widths& widths() const { return widths_; }
  int size() const { return widths_.tp; }
  // The backend as SGLang runs it (ascend_tp is none).
  Backend backend() const { return resolved_backend(config_.moe_a2a_backend); }

  RankCoords coords(int rank) const { return rank_coords(widths_, checked_rank(rank)); }

  int group_size(GroupKind kind) const {
    const auto g = group_geometry(widths_, kind);
    return g.radix.group_size(g.free);
  }
  int group_count(GroupKind kind) const {
    const auto g = group_geometry(widths_, kind);
    return g.radix.group_count(g.free);
  }
  // Which group of this kind `rank` is in, and its position (group rank) inside it.
  int group_index(GroupKind kind, int rank) const {
    const auto g = group_geometry(widths_, kind);
    return g.radix.group_id(checked_rank(rank), g.free);
  }
  int group_rank(GroupKind kind, int rank) const {
    const auto g = group_geometry(widths_, kind);
    return g.radix.group_rank(checked_rank(rank), g.free);
  }
  std::vector<int> group_members(GroupKind kind, int rank) const {
    return members_of(kind, group_index(kind, rank));
  }
  std::vector<std::vector<int>> groups(GroupKind kind) const {
    std::vector<std::vector<int>> all;
    for (int id = 0; id < group_count(kind); ++id) all.push_back(members_of(kind, id));
    return all;
  }

  BridgePath bridge_path() const { return relayout::bridge_path(widths_, backend()); }
  DsparkVerdict dspark() const { return dspark_verdict(config_, widths_); }
  PaddingMode padding_mode(std::span<const std::int64_t> global_num_tokens) const {
    return relayout::padding_mode(global_num_tokens, widths_.attn_dp, backend());
  }
  CpTokenSplit cp_token_split() const { return relayout::cp_token_split(config_); }
  // The LM head's vocabulary-parallel group and how its logits are exchanged (LmHeadLayout).
  LmHeadLayout lm_head() const { return lm_head_layout(config_, widths_); }
  // Which slice of the vocabulary `rank` holds: its position in the LM head's vocabulary group.
  int lm_head_vocab_shard(int rank) const { return group_rank(lm_head().vocab_group, rank); }
  // The attention-CP rank that holds token `token` of a request of `tokens` tokens.
  int cp_rank_of_token(std::int64_t token, std::int64_t tokens) const {
    if (tokens < 0 || tokens > (std::int64_t{1} << 40))
      throw LayoutError("tokens", "a request of " + std::to_string(tokens) +
                                      " tokens: a token count must be in [0, 2^40]");
    if (token < 0 || token >= tokens)
      throw LayoutError("token", "token " + std::to_string(token) + " is out of range [0, " +
                                     std::to_string(tokens) + ")");
    return relayout::cp_rank_of_token(cp_token_split(), token, tokens, widths_.attn_cp);
  }
  // Throws the docs/dspark.md message when the DSpark start-up check rejects this layout.
  void require_dspark_allowed() const {
    if (const auto v = dspark(); !v.allowed) throw LayoutError(std::string(v.input), std::string(v.error));
  }
  std::vector<LayoutNote> notes() const {
    std::vector<LayoutNote> out;
    if (!dp_attention_on(config_) && config_.dp > 1)
      out.push_back({LayoutNote::Kind::dp_replicas,
                     "dp = " + std::to_string(config_.dp) + " without DP attention: replicas outside this domain; " +
                         "this domain has tp = " + std::to_string(widths_.tp) + " ranks"});
    return out;
  }

 private:
  int checked_rank(int rank) const {
    if (rank < 0 || rank >= widths_.tp)
      throw LayoutError("rank", "rank " + std::to_string(rank) + " is out of range: a rank of this "
                                "domain must be in [0, tp) = [0, " + std::to_string(widths_.tp) + ")");
    return rank;
  }
  std::vector<int> members_of(GroupKind kind, int id) const {
    const auto g = group_geometry(widths_, kind);
    std::vector<int> members(static_cast<std::size_t>(g.radix.group_size(g.free)));
    for (int pos = 0; pos < static_cast<int>(members.size()); ++pos)
      members[static_cast<std::size_t>(pos)] = g.radix.group_member(id, pos, g.free);
    return members;
  }

  LayoutConfig config_;
  Widths widths_;
};

// Under attention CP, the layout in which every (attention-DP group, CP rank) share is a DP group
// of its own: ranks run (attn_dp, attn_cp, attn_tp), fastest last, so the ranks holding one CP share
// of one DP group are attn_tp consecutive ranks, like an attention-DP group with attn_cp == 1. The
// MoE hand-over moves shares with this layout's DP groups; the planner counts its token slots.
inline RuntimeLayout cp_share_layout(const RuntimeLayout& l) {
  const Widths& w = l.widths();
  if (w.attn_cp == 1) return l;
  return RuntimeLayout(LayoutConfig{.tp = w.tp, .dp = w.attn_dp * w.attn_cp, .enable_dp_attention = true});
}

}  // namespace relayout
