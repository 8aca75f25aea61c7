// Compile-time layout policies: Layout<Tp<32>, Dp<16>, DpAttention<true>, A2a<Backend::deepep>>.
// Every launch flag of LayoutConfig has an option (Tp ... Nnodes below).
// Widths and coordinates are constexpr and come from the same rules as RuntimeLayout; an invalid
// layout (SGLang's launch rules included), or one the DSpark start-up check rejects, is a
// static_assert with a sentence.
#pragma once

#include <concepts>
#include <type_traits>

#include "relayout/mesh/layout.hpp"

namespace relayout {

namespace impl {
// Each option knows which field it sets; a Layout may name each kind of option at most once.
enum class OptionKind {
  tp, dp, cp, ep, moe_dp, dp_attention, a2a, draft, attn_dp, prefill_cp, dp_lm_head,
  tp_lm_head_a2a, dense_tp, dcp, redundant_experts, pp, nnodes
};
}  // namespace impl

template <int N>
struct Tp {
  static constexpr impl::OptionKind kind = impl::OptionKind::tp;
  static constexpr void apply(LayoutConfig& c) { c.tp = N; }
};
template <int N>
struct Dp {
  static constexpr impl::OptionKind kind = impl::OptionKind::dp;
  static constexpr void apply(LayoutConfig& c) { c.dp = N; }
};
template <int N>
struct Cp {
  static constexpr impl::OptionKind kind = impl::OptionKind::cp;
  static constexpr void apply(LayoutConfig& c) { c.cp = N; }
};
template <int N>
struct Ep {
  static constexpr impl::OptionKind kind = impl::OptionKind::ep;
  static constexpr void apply(LayoutConfig& c) { c.ep = N; }
};
template <int N>
struct MoeDp {
  static constexpr impl::OptionKind kind = impl::OptionKind::moe_dp;
  static constexpr void apply(LayoutConfig& c) { c.moe_dp = N; }
};
template <bool On>
struct DpAttention {
  static constexpr impl::OptionKind kind = impl::OptionKind::dp_attention;
  static constexpr void apply(LayoutConfig& c) { c.enable_dp_attention = On; }
};
template <Backend B>
struct A2a {
  static constexpr impl::OptionKind kind = impl::OptionKind::a2a;
  static constexpr void apply(LayoutConfig& c) { c.moe_a2a_backend = B; }
};
template <Draft D>
struct DraftModel {
  static constexpr impl::OptionKind kind = impl::OptionKind::draft;
  static constexpr void apply(LayoutConfig& c) { c.draft = D; }
};

template <class T>
concept LayoutOption = requires(LayoutConfig& c) {
  { T::kind } -> std::convertible_to<impl::OptionKind>;
  T::apply(c);
};

// Either layout form: what generic code (process groups, the bridge) may ask of a layout.
template <class L>
concept RankLayout = requires(const L& l, int rank, GroupKind kind) {
  { l.config() } -> std::convertible_to<LayoutConfig>;
  { l.widths() } -> std::convertible_to<Widths>;
  { l.coords(rank) } -> std::convertible_to<RankCoords>;
  { l.bridge_path() } -> std::convertible_to<BridgePath>;
  { l.group_size(kind) } -> std::convertible_to<int>;
};

// --attn-dp-size N: the attention-DP width itself.
template <int N>
struct AttnDp {
  static constexpr impl::OptionKind kind = impl::OptionKind::attn_dp;
  static constexpr void apply(LayoutConfig& c) { c.attn_dp_size = N; }
};
// DeepSeek-V4 prefill CP: --enable-prefill-cp with --cp-strategy S.
template <bool On, CpStrategy S = CpStrategy::interleave>
struct PrefillCp {
  static constexpr impl::OptionKind kind = impl::OptionKind::prefill_cp;
  static constexpr void apply(LayoutConfig& c) {
    c.enable_prefill_cp = On;
    if (On) c.cp_strategy = S;
  }
};

// --enable-dp-lm-head: the LM head's vocabulary split over the attention-TP group.
template <bool On>
struct DpLmHead {
  static constexpr impl::OptionKind kind = impl::OptionKind::dp_lm_head;
  static constexpr void apply(LayoutConfig& c) { c.enable_dp_lm_head = On; }
};

// --enable-tp-lm-head-all-to-all: the TP-sharded LM head exchanged by one all-to-all.
template <bool On>
struct TpLmHeadAllToAll {
  static constexpr impl::OptionKind kind = impl::OptionKind::tp_lm_head_a2a;
  static constexpr void apply(LayoutConfig& c) { c.enable_tp_lm_head_all_to_all = On; }
};
// --moe-dense-tp-size N: the TP width of the dense (non-MoE) layers (1 or tp).
template <int N>
struct MoeDenseTp {
  static constexpr impl::OptionKind kind = impl::OptionKind::dense_tp;
  static constexpr void apply(LayoutConfig& c) { c.moe_dense_tp_size = N; }
};
// --dcp-size N: decode context parallelism, blocks of N ranks inside the TP group.
template <int N>
struct Dcp {
  static constexpr impl::OptionKind kind = impl::OptionKind::dcp;
  static constexpr void apply(LayoutConfig& c) { c.dcp = N; }
};
// --ep-num-redundant-experts N: redundant expert copies over the EP ranks.
template <int N>
struct EpRedundantExperts {
  static constexpr impl::OptionKind kind = impl::OptionKind::redundant_experts;
  static constexpr void apply(LayoutConfig& c) { c.ep_num_redundant_experts = N; }
};
// --pp-size N and --nnodes N describe the world around the domain; a Layout is still one TP
// domain (size() == tp), and WorldLayout(L::config()) numbers the whole world.
template <int N>
struct Pp {
  static constexpr impl::OptionKind kind = impl::OptionKind::pp;
  static constexpr void apply(LayoutConfig& c) { c.pp = N; }
};
template <int N>
struct Nnodes {
  static constexpr impl::OptionKind kind = impl::OptionKind::nnodes;
  static constexpr void apply(LayoutConfig& c) { c.nnodes = N; }
};

template <LayoutOption... Opts>
struct Layout {
  static_assert(((impl::OptionKind{Opts::kind} == Opts::kind) && ...));
  static_assert([] {
    constexpr impl::OptionKind kinds[] = {Opts::kind..., impl::OptionKind::tp};
    for (std::size_t i = 0; i < sizeof...(Opts); ++i)
      for (std::size_t j = i + 1; j < sizeof...(Opts); ++j)
        if (kinds[i] == kinds[j]) return false;
    return true;
  }(), "relayout: a Layout names each option (Tp, Dp, Cp, Ep, MoeDp, DpAttention, A2a, DraftModel, "
     "AttnDp, PrefillCp, DpLmHead, TpLmHeadAllToAll, MoeDenseTp, Dcp, EpRedundantExperts, Pp, "
     "Nnodes) at most once");

 private:
  static constexpr LayoutConfig make_config() {
    LayoutConfig c;
    (Opts::apply(c), ...);
    return c;
  }
  static constexpr LayoutConfig config_ = make_config();
  static constexpr WidthsResult result_ = derive_widths(config_);
  static_assert(result_.rule != LayoutRule::width_positive, RELAYOUT_RULE_WIDTH_POSITIVE);
  static_assert(result_.rule != LayoutRule::width_limit, RELAYOUT_RULE_WIDTH_LIMIT);
  static_assert(result_.rule != LayoutRule::attn_dp_size_range, RELAYOUT_RULE_ATTN_DP_SIZE_RANGE);
  static_assert(result_.rule != LayoutRule::attn_dp_replicas, RELAYOUT_RULE_ATTN_DP_REPLICAS);
  static_assert(result_.rule != LayoutRule::attn_dp_conflict, RELAYOUT_RULE_ATTN_DP_CONFLICT);
  static_assert(result_.rule != LayoutRule::prefill_cp_strategy, RELAYOUT_RULE_PREFILL_CP_STRATEGY);
  static_assert(result_.rule != LayoutRule::prefill_cp_dp, RELAYOUT_RULE_PREFILL_CP_DP);
  static_assert(result_.rule != LayoutRule::prefill_cp_tp, RELAYOUT_RULE_PREFILL_CP_TP);
  static_assert(result_.rule != LayoutRule::prefill_cp_backend, RELAYOUT_RULE_PREFILL_CP_BACKEND);
  static_assert(result_.rule != LayoutRule::backend_dp_eq_tp, RELAYOUT_RULE_BACKEND_DP_EQ_TP);
  static_assert(result_.rule != LayoutRule::backend_pplx, RELAYOUT_RULE_BACKEND_PPLX);
  static_assert(result_.rule != LayoutRule::attn_divides, RELAYOUT_RULE_ATTN_DIVIDES);
  static_assert(result_.rule != LayoutRule::cp_dp_divides, RELAYOUT_RULE_CP_DP_DIVIDES);
  static_assert(result_.rule != LayoutRule::moe_divides, RELAYOUT_RULE_MOE_DIVIDES);
  static_assert(result_.rule != LayoutRule::moe_dp_fills_tp, RELAYOUT_RULE_MOE_DP_FILLS_TP);
  static_assert(result_.rule != LayoutRule::cp_moe_dp, RELAYOUT_RULE_CP_MOE_DP);
  static_assert(result_.rule != LayoutRule::prefill_cp_no_strategy, RELAYOUT_RULE_PREFILL_CP_NO_STRATEGY);
  static_assert(result_.rule != LayoutRule::count_range, RELAYOUT_RULE_COUNT_RANGE);
  static_assert(result_.rule != LayoutRule::redundant_range, RELAYOUT_RULE_REDUNDANT_RANGE);
  static_assert(result_.rule != LayoutRule::pp_moe_dp, RELAYOUT_RULE_PP_MOE_DP);
  static_assert(result_.rule != LayoutRule::dense_tp, RELAYOUT_RULE_DENSE_TP);
  static_assert(result_.rule != LayoutRule::dcp_divides, RELAYOUT_RULE_DCP_DIVIDES);
  static_assert(result_.rule != LayoutRule::dp_lm_head, RELAYOUT_RULE_DP_LM_HEAD);
  static_assert(result_.rule != LayoutRule::tp_lm_head_a2a, RELAYOUT_RULE_TP_LM_HEAD_A2A);
  static_assert(result_.rule != LayoutRule::redundant_needs_ep, RELAYOUT_RULE_REDUNDANT_NEEDS_EP);
  static_assert(result_.rule != LayoutRule::pp_speculative, RELAYOUT_RULE_PP_SPECULATIVE);
  static_assert(result_.rule != LayoutRule::nnodes_divides, RELAYOUT_RULE_NNODES_DIVIDES);
  static_assert(result_.rule != LayoutRule::nnodes_replicas, RELAYOUT_RULE_NNODES_REPLICAS);
  // Every LayoutRule has its sentence above; a rule added later still stops the build here.
  static_assert(result_.rule == LayoutRule::ok, "relayout: this layout breaks one of SGLang's launch rules");
  static constexpr Widths widths_ = result_.widths;
  static constexpr DsparkVerdict dspark_ = dspark_verdict(config_, widths_);
  static_assert(dspark_.error != std::string_view(RELAYOUT_DSPARK_MOE_DRAFT_MESSAGE), RELAYOUT_DSPARK_MOE_DRAFT_MESSAGE);
  static_assert(dspark_.error != std::string_view(RELAYOUT_DSPARK_DP_LM_HEAD_MESSAGE), RELAYOUT_DSPARK_DP_LM_HEAD_MESSAGE);
  static_assert(dspark_.error != std::string_view(RELAYOUT_DSPARK_BACKEND_MESSAGE), RELAYOUT_DSPARK_BACKEND_MESSAGE);
  static_assert(dspark_.error != std::string_view(RELAYOUT_DSPARK_CP_MESSAGE), RELAYOUT_DSPARK_CP_MESSAGE);

 public:
  static constexpr int tp = widths_.tp;
  static constexpr int attn_dp = widths_.attn_dp;
  static constexpr int attn_cp = widths_.attn_cp;
  static constexpr int attn_tp = widths_.attn_tp;
  static constexpr int moe_dp = widths_.moe_dp;
  static constexpr int moe_ep = widths_.moe_ep;
  static constexpr int moe_tp = widths_.moe_tp;
  static constexpr int dcp = widths_.dcp;            // decode-CP width inside TP (--dcp-size)
  static constexpr int dense_tp = widths_.dense_tp;  // the dense layers' TP width: 1 or tp
  static constexpr int pp = config_.pp;              // pipeline stages of the world (--pp-size)
  static constexpr int nnodes = config_.nnodes;      // machines of the world (--nnodes)
  static constexpr Backend backend = resolved_backend(config_.moe_a2a_backend);
  static constexpr BridgePath path = relayout::bridge_path(widths_, backend);

  static constexpr LayoutConfig config() { return config_; }
  static constexpr Widths widths() { return widths_; }
  static constexpr int size() { return tp; }
  static constexpr BridgePath bridge_path() { return path; }
  static constexpr CpTokenSplit cp_token_split() { return relayout::cp_token_split(config_); }
  static constexpr DsparkVerdict dspark() { return dspark_; }
  static constexpr LmHeadLayout lm_head() { return lm_head_layout(config_, widths_); }

  // Coordinates of a rank known at compile time; an out-of-range rank does not compile.
  template <int Rank>
  static constexpr RankCoords coords() {
    static_assert(Rank >= 0 && Rank < tp, "relayout: a rank of this domain must be in [0, tp)");
    return rank_coords(widths_, Rank);
  }
  // Coordinates of a runtime rank; out of range throws LayoutError (and fails constant evaluation).
  static constexpr RankCoords coords(int rank) {
    if (rank < 0 || rank >= tp)
      throw LayoutError("rank", "rank " + std::to_string(rank) + " is out of range [0, tp)");
    return rank_coords(widths_, rank);
  }
  static constexpr int group_size(GroupKind kind) {
    const auto g = group_geometry(widths_, kind);
    return g.radix.group_size(g.free);
  }
  static constexpr int group_count(GroupKind kind) {
    const auto g = group_geometry(widths_, kind);
    return g.radix.group_count(g.free);
  }
  static constexpr int group_index(GroupKind kind, int rank) {
    const auto g = group_geometry(widths_, kind);
    return g.radix.group_id(coords(rank).rank, g.free);
  }
  static constexpr int group_rank(GroupKind kind, int rank) {
    const auto g = group_geometry(widths_, kind);
    return g.radix.group_rank(coords(rank).rank, g.free);
  }

  // The runtime twin, for code that takes a RuntimeLayout.
  static RuntimeLayout runtime() { return RuntimeLayout(config_); }
};

}  // namespace relayout
