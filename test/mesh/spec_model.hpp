// docs/layout.md#widths-docs/bridge.md and SGLang's launch rules written out plainly, independent of the layout engine
// (widths.hpp, radix.hpp, layout.hpp): the brute-force statement the mesh tests compare it with.
#pragma once

#include <cstdint>
#include <optional>
#include <relayout/mesh.hpp>
#include <tuple>
#include <vector>

namespace relayout::spec_model {

struct Expected {
  int attn_dp, attn_cp, attn_tp, moe_dp, moe_ep, moe_tp;
  int dcp = 1;       // decode-CP block width
  int dense_tp = 0;  // 0: tp
};

// SGLang's launch arithmetic restated step by step from its server-argument hooks, independent of
// derive_widths(): what it resolves the flags to, and whether it starts. Products in 64 bits.
struct Sglang {
  bool starts = false;
  Expected w{};
};

inline Sglang sglang_launch(const LayoutConfig& c) {
  using I = std::int64_t;
  const I cap = I{1} << 20;
  Sglang out;
  for (I v : {I{c.tp}, I{c.dp}, I{c.cp}, I{c.ep}, I{c.moe_dp}, I{c.dcp}, I{c.pp}, I{c.nnodes}})
    if (v < 1 || v > cap) return out;
  if (c.ep_num_redundant_experts < 0 || c.ep_num_redundant_experts > cap) return out;
  I tp = c.tp, dp = c.dp, attn_cp = c.cp;
  bool dp_attention = c.enable_dp_attention;
  // --attn-dp-size: the width itself; the old spelling is --dp-size N --enable-dp-attention.
  if (c.attn_dp_size) {
    const I n = *c.attn_dp_size;
    if (n < 1 || n > cap) return out;
    if (n > 1 && dp > 1) return out;                               // replicas plus attention DP
    if (n == 1 && c.enable_dp_attention && dp > 1) return out;     // two different widths
    dp_attention = n > 1;
    if (n > 1) dp = n;
  }
  // overrides.py _data_parallelism_defaults: dp_size 1 turns DP attention and the DP LM head off.
  bool dp_lm_head = c.enable_dp_lm_head;
  if (dp == 1) dp_attention = dp_lm_head = false;
  // moe_hook.py handle_a2a_moe: ascend_tp runs as none.
  const Backend b = c.moe_a2a_backend == Backend::ascend_tp ? Backend::none : c.moe_a2a_backend;
  I dense_tp = c.moe_dense_tp_size ? I{*c.moe_dense_tp_size} : tp;
  // deepseek_v4_hook.py validate_deepseek_v4_cp (a missing --cp-strategy is not interleave)
  // It turns DP attention on, and _data_parallelism_defaults, which runs after it, turns it off again
  // at dp 1; it reads the backend as typed (ascend_tp is not yet none).
  if (c.enable_prefill_cp) {
    if (c.cp_strategy != CpStrategy::interleave) return out;
    dp_attention = dp > 1;
    dense_tp = 1;
    attn_cp = tp / dp;
    if (dp != 1 || tp > 8) return out;
    const Backend typed = c.moe_a2a_backend;
    if (typed != Backend::none && typed != Backend::deepep && typed != Backend::megamoe && typed != Backend::mori)
      return out;
  }
  // moe_hook.py handle_a2a_moe (overrides.py _a2a_ep_size forces ep = tp for every backend)
  const I ep = b == Backend::none ? c.ep : tp;
  if ((b == Backend::flashinfer || b == Backend::flashinfer_megamoe) && !(dp_attention && dp == tp))
    return out;
  if (b == Backend::pplx && !(dp_attention && dp >= 2)) return out;
  // The widths must divide exactly.
  const I attn_dp = dp_attention ? dp : 1;
  if (tp % (attn_dp * attn_cp) != 0 || tp % (ep * c.moe_dp) != 0) return out;
  // parallel_hook.py handle_context_parallelism
  if (attn_cp > 1 && (tp % attn_cp != 0 || tp % (dp * attn_cp) != 0)) return out;
  if (c.moe_dp > 1) {
    if (tp % c.moe_dp != 0 || ep * c.moe_dp > tp || c.pp != 1) return out;
    if (ep > 1 && ep * c.moe_dp != tp) return out;
  }
  if (attn_cp != c.moe_dp && c.moe_dp != 1) return out;
  // validation_hook.py check_server_args
  if (dense_tp != 1 && dense_tp != tp) return out;
  if (c.pp > 1 && c.draft != Draft::none) return out;
  if ((tp * c.pp) % c.nnodes != 0) return out;
  if (dp > 1 && c.nnodes != 1 && !dp_attention) return out;
  // parallel_state.py initialize_model_parallel
  if (tp % c.dcp != 0) return out;
  // overrides.py _dp_lm_head_validation
  if (dp_lm_head && !dp_attention) return out;
  if (c.enable_tp_lm_head_all_to_all &&
      (!dp_attention || dp_lm_head || tp != dp || attn_cp != 1))
    return out;
  // Redundant experts place extra expert copies over the EP ranks.
  if (c.ep_num_redundant_experts > 0 && ep < 2) return out;
  out.starts = true;
  out.w = {int(attn_dp), int(attn_cp), int(tp / attn_dp / attn_cp), c.moe_dp, int(ep),
           int(tp / ep / c.moe_dp), c.dcp, int(dense_tp)};
  return out;
}

inline bool spec_valid(const LayoutConfig& c) { return sglang_launch(c).starts; }
inline Expected spec_widths(const LayoutConfig& c) { return sglang_launch(c).w; }

// docs/layout.md#rank-coordinates formulas verbatim.
inline RankCoords spec_coords(const Expected& e, int tp, int r) {
  RankCoords k;
  k.rank = r;
  k.attn_tp_rank = r % e.attn_tp;
  k.attn_cp_rank = (r / e.attn_tp) % e.attn_cp;
  k.attn_dp_rank = r / (e.attn_tp * e.attn_cp);
  k.moe_dp_rank = r / (tp / e.moe_dp);
  k.moe_ep_rank = (r % (tp / e.moe_dp)) / e.moe_tp;
  k.moe_tp_rank = r % e.moe_tp;
  k.dcp_rank = r % e.dcp;
  k.dense_tp_rank = r % (e.dense_tp > 0 ? e.dense_tp : tp);
  return k;
}

// docs/layout.md#groups: a group is the set of ranks sharing the coordinates named here.
inline std::tuple<int, int, int> group_key(GroupKind g, const RankCoords& k) {
  switch (g) {
    case GroupKind::tp: return {0, 0, 0};
    case GroupKind::attn_tp: return {k.attn_dp_rank, k.attn_cp_rank, 0};
    case GroupKind::attn_cp: return {k.attn_dp_rank, k.attn_tp_rank, 0};
    case GroupKind::moe_tp: return {k.moe_dp_rank, k.moe_ep_rank, 0};
    case GroupKind::moe_ep: return {k.moe_dp_rank, k.moe_tp_rank, 0};
    case GroupKind::moe_dp: return {k.moe_ep_rank, k.moe_tp_rank, 0};
    // Blocks of consecutive ranks: the block number is the rank with its position taken off.
    case GroupKind::dcp: return {k.rank - k.dcp_rank, 0, 0};
    case GroupKind::dense_tp: return {k.rank - k.dense_tp_rank, 0, 0};
    case GroupKind::pp: return {k.rank, 0, 0};  // inside one domain: every rank alone
  }
  return {};
}

// parallel_state.py initialize_model_parallel: with attn_cp > moe_dp the MoE-DP group *is* the
// attention-CP group (CP partners share tokens before the MoE).
inline std::tuple<int, int, int> group_key(GroupKind g, const RankCoords& k, const Expected& e) {
  if (g == GroupKind::moe_dp && e.attn_cp > e.moe_dp) return group_key(GroupKind::attn_cp, k);
  return group_key(g, k);
}

inline int expected_group_size(GroupKind g, const Expected& e, int tp) {
  switch (g) {
    case GroupKind::tp: return tp;
    case GroupKind::attn_tp: return e.attn_tp;
    case GroupKind::attn_cp: return e.attn_cp;
    case GroupKind::moe_tp: return e.moe_tp;
    case GroupKind::moe_ep: return e.moe_ep;
    case GroupKind::moe_dp: return e.attn_cp > e.moe_dp ? e.attn_cp : e.moe_dp;
    case GroupKind::dcp: return e.dcp;
    case GroupKind::dense_tp: return e.dense_tp > 0 ? e.dense_tp : tp;
    case GroupKind::pp: return 1;
  }
  return 0;
}

// docs/bridge.md path selection: without a backend, ranks holding different rows (DP groups, or
// CP ranks each with a share of its group's tokens) gather them before the MoE.
inline BridgePath spec_path(const Expected& e, Backend b) {
  if (b == Backend::none) return e.attn_dp > 1 || e.attn_cp > 1 ? BridgePath::dp_gather : BridgePath::tp_moe;
  return e.attn_tp > 1 ? BridgePath::a2a_split : BridgePath::direct;
}

// Brute force: the members of r's group of kind g, the ranks sharing its group key, ascending
// (each group's free coordinates are the fastest-varying ones, so ascending rank is group-rank order).
inline std::vector<int> spec_members(GroupKind g, const Expected& e, int tp, int r) {
  const auto key = group_key(g, spec_coords(e, tp, r), e);
  std::vector<int> m;
  for (int q = 0; q < tp; ++q)
    if (group_key(g, spec_coords(e, tp, q), e) == key) m.push_back(q);
  return m;
}

}  // namespace relayout::spec_model
