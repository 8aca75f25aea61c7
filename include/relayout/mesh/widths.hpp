// The width formulas of docs/layout.md#widths, docs/layout.md#derived-widths and SGLang's further launch rules, written once as constexpr
// functions. The compile-time policy (policy.hpp) and the runtime layout (layout.hpp) both call
// derive_widths(), so both accept and reject the same layouts with the same sentences.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "relayout/mesh/error.hpp"
#include "relayout/mesh/names.hpp"

// Sentences shared by the static_asserts of the compile-time policy and the runtime errors.
#define RELAYOUT_RULE_WIDTH_POSITIVE "relayout: every width (tp, dp, cp, ep, moe_dp) must be >= 1"
#define RELAYOUT_RULE_WIDTH_LIMIT "relayout: every width must be <= 1048576 (2^20 ranks)"
#define RELAYOUT_RULE_ATTN_DP_SIZE_RANGE "relayout: --attn-dp-size must be in [1, 1048576]"
#define RELAYOUT_RULE_ATTN_DP_REPLICAS                                                        \
  "relayout: --attn-dp-size > 1 cannot be combined with --dp-size > 1 (data-parallel replicas " \
  "of the domain together with attention DP inside it are not supported)"
#define RELAYOUT_RULE_ATTN_DP_CONFLICT                                                          \
  "relayout: --attn-dp-size contradicts --dp-size with --enable-dp-attention (both set the " \
  "attention-DP width; give one of them)"
#define RELAYOUT_RULE_PREFILL_CP_STRATEGY                                                   \
  "relayout: DeepSeek-V4 prefill CP (--enable-prefill-cp) supports --cp-strategy interleave " \
  "only (zigzag runs on Ascend NPUs only)"
#define RELAYOUT_RULE_PREFILL_CP_DP                                                          \
  "relayout: DeepSeek-V4 prefill CP (--enable-prefill-cp) needs dp == 1 (its round-robin " \
  "token split does not combine with attention DP)"
#define RELAYOUT_RULE_PREFILL_CP_TP                                                         \
  "relayout: DeepSeek-V4 prefill CP (--enable-prefill-cp) needs tp <= 8 (one machine; CP " \
  "across machines loses precision)"
#define RELAYOUT_RULE_PREFILL_CP_BACKEND                                                      \
  "relayout: DeepSeek-V4 prefill CP (--enable-prefill-cp) supports --moe-a2a-backend none, " \
  "deepep, megamoe or mori only"
#define RELAYOUT_RULE_BACKEND_DP_EQ_TP                                                     \
  "relayout: --moe-a2a-backend flashinfer and flashinfer_megamoe need DP attention with " \
  "dp == tp (--enable-dp-attention --dp-size <tp>)"
#define RELAYOUT_RULE_BACKEND_PPLX                                                     \
  "relayout: --moe-a2a-backend pplx needs DP attention with at least 2 DP groups " \
  "(--enable-dp-attention --dp-size >= 2)"
#define RELAYOUT_RULE_ATTN_DIVIDES \
  "relayout: attn_tp = tp / attn_dp / attn_cp must divide exactly (tp % (attn_dp * attn_cp) == 0)"
#define RELAYOUT_RULE_CP_DP_DIVIDES                                                           \
  "relayout: with attn_cp > 1, tp must be divisible by dp * attn_cp, dp being --dp-size even " \
  "without DP attention"
#define RELAYOUT_RULE_MOE_DIVIDES \
  "relayout: moe_tp = tp / moe_ep / moe_dp must divide exactly (tp % (moe_ep * moe_dp) == 0)"
#define RELAYOUT_RULE_MOE_DP_FILLS_TP                                                        \
  "relayout: with moe_dp > 1 and moe_ep > 1, moe_ep * moe_dp must equal tp (no MoE TP left " \
  "over)"
#define RELAYOUT_RULE_CP_MOE_DP                                                                 \
  "relayout: moe_dp > 1 needs attn_cp == moe_dp (attn_cp != moe_dp is only supported with " \
  "moe_dp == 1)"
#define RELAYOUT_DSPARK_MOE_DRAFT_MESSAGE                                                \
  "DSpark + dp attention with a DeepSeek-V4 (MoE) draft requires attn_tp == 1 (set "   \
  "--dp-size == --tp). attn_tp > 1 corrupts the MoE-under-DP all-reduce."
#define RELAYOUT_DSPARK_DP_LM_HEAD_MESSAGE                                                       \
  "DSpark with DP attention (dp > 1) requires --enable-dp-lm-head: the draft computes each DP " \
  "group's logits on its own ranks, so the vocabulary is split over the attention-TP group, "   \
  "not across DP groups"
#define RELAYOUT_DSPARK_BACKEND_MESSAGE                                                           \
  "DSpark with DP attention (dp > 1) only supports the built-in TP MoE (--moe-a2a-backend none); " \
  "relayout is stricter than SGLang here: SGLang also lets --moe-a2a-backend megamoe through "     \
  "behind an environment switch (SGLANG_RAGGED_VERIFY_MODE=static), which relayout does not read"
#define RELAYOUT_DSPARK_CP_MESSAGE                                                           \
  "DSpark with DP attention (dp > 1) does not support attention context parallelism (attn_cp " \
  "must be 1)"
#define RELAYOUT_RULE_COUNT_RANGE "relayout: --dcp-size, --pp-size and --nnodes must be in [1, 1048576]"
#define RELAYOUT_RULE_REDUNDANT_RANGE "relayout: --ep-num-redundant-experts must be in [0, 1048576]"
#define RELAYOUT_RULE_PREFILL_CP_NO_STRATEGY                                                   \
  "relayout: --enable-prefill-cp needs --cp-strategy (SGLang has no default strategy; DeepSeek-V4 " \
  "takes --cp-strategy interleave)"
#define RELAYOUT_RULE_PP_MOE_DP "relayout: --moe-dp-size > 1 does not combine with --pp-size > 1"
#define RELAYOUT_RULE_DENSE_TP "relayout: --moe-dense-tp-size must be unset, 1 or tp"
#define RELAYOUT_RULE_DCP_DIVIDES \
  "relayout: --dcp-size must divide tp (decode-CP groups are blocks of dcp ranks inside the TP group)"
#define RELAYOUT_RULE_DP_LM_HEAD \
  "relayout: --enable-dp-lm-head needs DP attention (--enable-dp-attention with --dp-size > 1)"
#define RELAYOUT_RULE_TP_LM_HEAD_A2A                                                              \
  "relayout: --enable-tp-lm-head-all-to-all needs DP attention with tp == dp, attn_cp == 1 and no " \
  "--enable-dp-lm-head"
#define RELAYOUT_RULE_REDUNDANT_NEEDS_EP                                                          \
  "relayout: --ep-num-redundant-experts > 0 needs expert parallelism (moe_ep > 1); relayout is "  \
  "stricter than SGLang here: SGLang starts with moe_ep == 1 and gives the one EP rank every "   \
  "redundant copy, which places nothing and only duplicates experts"
#define RELAYOUT_RULE_PP_SPECULATIVE \
  "relayout: --pp-size > 1 does not combine with speculative decoding (--draft)"
#define RELAYOUT_RULE_NNODES_DIVIDES "relayout: tp * pp must be divisible by --nnodes"
#define RELAYOUT_RULE_NNODES_REPLICAS                                                         \
  "relayout: --nnodes > 1 with --dp-size > 1 needs DP attention (multi-node data-parallel " \
  "replicas are not supported)"

namespace relayout {

inline constexpr int kMaxWidth = 1 << 20;
// DeepSeek-V4 prefill CP runs on one machine (SGLang's limit).
inline constexpr int kMaxPrefillCpTp = 8;

// What an engine's server flags say (SGLang's names in comments).
struct LayoutConfig {
  int tp = 1;                             // --tp-size
  int dp = 1;                             // --dp-size
  int cp = 1;                             // --attn-cp-size: attention context parallel
  int ep = 1;                             // --ep-size, honoured only with Backend::none
  int moe_dp = 1;                         // --moe-dp-size
  bool enable_dp_attention = false;       // --enable-dp-attention
  Backend moe_a2a_backend = Backend::none;  // --moe-a2a-backend
  Draft draft = Draft::none;              // speculative draft model kind
  std::optional<int> attn_dp_size{};      // --attn-dp-size: the attention-DP width itself
  bool enable_prefill_cp = false;         // --enable-prefill-cp (DeepSeek-V4 prefill CP)
  std::optional<CpStrategy> cp_strategy{};  // --cp-strategy: no default, as in SGLang
  bool enable_dp_lm_head = false;         // --enable-dp-lm-head: vocabulary split over attention TP
  bool enable_tp_lm_head_all_to_all = false;  // --enable-tp-lm-head-all-to-all
  std::optional<int> moe_dense_tp_size{};  // --moe-dense-tp-size: the dense layers' TP width
  int dcp = 1;                            // --dcp-size: decode context parallelism inside TP
  int ep_num_redundant_experts = 0;       // --ep-num-redundant-experts
  int pp = 1;                             // --pp-size: pipeline stages of the world
  int nnodes = 1;                         // --nnodes

  friend constexpr bool operator==(const LayoutConfig&, const LayoutConfig&) = default;
};

// The derived widths. tp == attn_dp*attn_cp*attn_tp == moe_dp*moe_ep*moe_tp.
struct Widths {
  int tp = 0;
  int attn_dp = 0;
  int attn_cp = 0;
  int attn_tp = 0;
  int moe_dp = 0;
  int moe_ep = 0;
  int moe_tp = 0;
  int dcp = 0;       // decode-CP width inside TP
  int dense_tp = 0;  // TP width of the dense (non-MoE) layers: 1 or tp

  friend constexpr bool operator==(const Widths&, const Widths&) = default;
};

enum class LayoutRule : std::uint8_t {
  ok,
  width_positive,
  width_limit,
  attn_dp_size_range,
  attn_dp_replicas,
  attn_dp_conflict,
  prefill_cp_strategy,
  prefill_cp_dp,
  prefill_cp_tp,
  prefill_cp_backend,
  backend_dp_eq_tp,
  backend_pplx,
  attn_divides,
  cp_dp_divides,
  moe_divides,
  moe_dp_fills_tp,
  cp_moe_dp,
  count_range,
  redundant_range,
  prefill_cp_no_strategy,
  pp_moe_dp,
  dense_tp,
  dcp_divides,
  dp_lm_head,
  tp_lm_head_a2a,
  redundant_needs_ep,
  pp_speculative,
  nnodes_divides,
  nnodes_replicas,
};

struct WidthsResult {
  LayoutRule rule = LayoutRule::ok;
  const char* input = "";  // the flag that broke the rule
  Widths widths{};
};

// SGLang resolves some flags into others before it checks a layout; these are the resolved values.
// --attn-dp-size N is the attention-DP width itself: N > 1 is DP attention over N groups (what
// --dp-size N --enable-dp-attention says), N == 1 is none. --enable-dp-attention with --dp-size 1
// is off (overrides.py _data_parallelism_defaults). Prefill CP turns DP attention on
// (deepseek_v4_hook.py validate_deepseek_v4_cp) and needs dp == 1, so _data_parallelism_defaults
// turns it off again: SGLang's final value under prefill CP is off.
constexpr bool dp_attention_on(const LayoutConfig& c) {
  if (c.attn_dp_size) return *c.attn_dp_size > 1;
  return (c.enable_dp_attention || c.enable_prefill_cp) && c.dp > 1;
}
// True when --enable-dp-attention was given but --dp-size 1 turned it off.
constexpr bool dp_attention_dropped(const LayoutConfig& c) {
  return c.enable_dp_attention && !c.enable_prefill_cp && !c.attn_dp_size && c.dp == 1;
}
// --dp-size after --attn-dp-size: the dp that SGLang's CP and backend rules read.
constexpr int resolved_dp(const LayoutConfig& c) {
  return c.attn_dp_size && *c.attn_dp_size > 1 ? *c.attn_dp_size : c.dp;
}
constexpr int attn_dp_width(const LayoutConfig& c) { return dp_attention_on(c) ? resolved_dp(c) : 1; }
// Prefill CP replaces --cp with tp / dp (dp must be 1 there, so every rank is a CP rank).
constexpr int attn_cp_width(const LayoutConfig& c) {
  return c.enable_prefill_cp ? c.tp / resolved_dp(c) : c.cp;
}
constexpr int moe_ep_width(const LayoutConfig& c) {
  return spans_ep(c.moe_a2a_backend) ? c.tp : c.ep;
}
// --enable-dp-lm-head as resolved: _data_parallelism_defaults turns it off with dp == 1.
constexpr bool dp_lm_head_on(const LayoutConfig& c) { return c.enable_dp_lm_head && resolved_dp(c) > 1; }
// The dense layers' TP width: --moe-dense-tp-size, tp when unset; prefill CP forces 1.
constexpr int dense_tp_width(const LayoutConfig& c) {
  return c.enable_prefill_cp ? 1 : c.moe_dense_tp_size.value_or(c.tp);
}
// Native data-parallel replicas of the world: --dp-size without DP attention (each a TP domain).
constexpr int replica_count(const LayoutConfig& c) { return dp_attention_on(c) ? 1 : resolved_dp(c); }
// True when the user asked for an --ep that the layout does not use (a backend forced EP to tp).
constexpr bool ep_overridden(const LayoutConfig& c) { return c.ep != 1 && moe_ep_width(c) != c.ep; }
// True when prefill CP replaced a --cp the user gave.
constexpr bool cp_overridden(const LayoutConfig& c) {
  return c.enable_prefill_cp && c.cp != 1 && c.cp != attn_cp_width(c);
}
// True when prefill CP replaced a --moe-dense-tp-size the user gave.
constexpr bool dense_tp_overridden(const LayoutConfig& c) {
  return c.enable_prefill_cp && c.moe_dense_tp_size && *c.moe_dense_tp_size != 1;
}
// When CP is wider than MoE DP, CP partners must share their tokens before the MoE, so SGLang's
// MoE-DP group is the attention-CP group although moe_dp stays 1 as a width.
constexpr bool moe_dp_group_is_attn_cp(const Widths& w) { return w.attn_cp > w.moe_dp; }

// Backends SGLang allows with DeepSeek-V4 prefill CP.
constexpr bool prefill_cp_allows(Backend b) {
  return b == Backend::none || b == Backend::deepep || b == Backend::megamoe || b == Backend::mori;
}
// FlashInfer's all-to-all kernels need one attention-DP group per rank.
constexpr bool needs_dp_equal_tp(Backend b) {
  return b == Backend::flashinfer || b == Backend::flashinfer_megamoe;
}
// pplx's all-to-all is built over the attention-DP groups and needs at least two.
constexpr bool needs_two_dp_groups(Backend b) { return b == Backend::pplx; }

namespace impl {

// The flags SGLang resolves before it checks a layout: ranges, --attn-dp-size, prefill CP
// (deepseek_v4_hook.py validate_deepseek_v4_cp, parallel_hook.py handle_context_parallelism) and
// the backends' DP-attention needs (moe_hook.py handle_a2a_moe).
constexpr WidthsResult check_flags(const LayoutConfig& c) {
  struct Flag {
    int value;
    const char* name;
  };
  const Flag flags[] = {{c.tp, "--tp"}, {c.dp, "--dp"}, {c.cp, "--cp"}, {c.ep, "--ep"},
                        {c.moe_dp, "--moe-dp-size"}};
  for (const Flag& f : flags) {
    if (f.value < 1) return {LayoutRule::width_positive, f.name, {}};
    if (f.value > kMaxWidth) return {LayoutRule::width_limit, f.name, {}};
  }
  const Flag counts[] = {{c.dcp, "--dcp-size"}, {c.pp, "--pp-size"}, {c.nnodes, "--nnodes"}};
  for (const Flag& f : counts)
    if (f.value < 1 || f.value > kMaxWidth) return {LayoutRule::count_range, f.name, {}};
  if (c.ep_num_redundant_experts < 0 || c.ep_num_redundant_experts > kMaxWidth)
    return {LayoutRule::redundant_range, "--ep-num-redundant-experts", {}};
  if (c.attn_dp_size) {
    const int n = *c.attn_dp_size;
    if (n < 1 || n > kMaxWidth) return {LayoutRule::attn_dp_size_range, "--attn-dp-size", {}};
    if (n > 1 && c.dp > 1) return {LayoutRule::attn_dp_replicas, "--attn-dp-size", {}};
    if (n == 1 && c.enable_dp_attention && c.dp > 1)
      return {LayoutRule::attn_dp_conflict, "--attn-dp-size", {}};
  }
  if (c.enable_prefill_cp) {
    if (!c.cp_strategy) return {LayoutRule::prefill_cp_no_strategy, "--cp-strategy", {}};
    if (*c.cp_strategy != CpStrategy::interleave)
      return {LayoutRule::prefill_cp_strategy, "--cp-strategy", {}};
    if (resolved_dp(c) != 1)
      return {LayoutRule::prefill_cp_dp, c.attn_dp_size ? "--attn-dp-size" : "--dp", {}};
    if (c.tp > kMaxPrefillCpTp) return {LayoutRule::prefill_cp_tp, "--tp", {}};
    // The backend as typed: validate_deepseek_v4_cp runs before handle_a2a_moe runs ascend_tp as none.
    if (!prefill_cp_allows(c.moe_a2a_backend))
      return {LayoutRule::prefill_cp_backend, "--moe-a2a-backend", {}};
  }
  const Backend b = c.moe_a2a_backend;
  if (needs_dp_equal_tp(b) && !(dp_attention_on(c) && resolved_dp(c) == c.tp))
    return {LayoutRule::backend_dp_eq_tp, "--moe-a2a-backend", {}};
  if (needs_two_dp_groups(b) && !(dp_attention_on(c) && resolved_dp(c) >= 2))
    return {LayoutRule::backend_pplx, "--moe-a2a-backend", {}};
  return {};
}

// The attention and MoE factorizations of tp (parallel_hook.py handle_context_parallelism).
constexpr WidthsResult split_widths(const LayoutConfig& c) {
  Widths w;
  w.tp = c.tp;
  w.attn_dp = attn_dp_width(c);
  w.attn_cp = attn_cp_width(c);
  // Every factor is <= 2^20, so the products are exact in 64 bits.
  const std::int64_t attn_outer = std::int64_t{w.attn_dp} * w.attn_cp;
  if (c.tp % attn_outer != 0)
    return {LayoutRule::attn_divides,
            !dp_attention_on(c) ? "--cp" : c.attn_dp_size ? "--attn-dp-size" : "--dp", {}};
  w.attn_tp = static_cast<int>(c.tp / attn_outer);
  // SGLang checks CP against the raw --dp-size, so dp replicas without DP attention count too.
  if (w.attn_cp > 1 && c.tp % (std::int64_t{resolved_dp(c)} * w.attn_cp) != 0)
    return {LayoutRule::cp_dp_divides, "--cp", {}};
  w.moe_ep = moe_ep_width(c);
  w.moe_dp = c.moe_dp;
  const std::int64_t moe_outer = std::int64_t{w.moe_ep} * w.moe_dp;
  if (c.tp % moe_outer != 0)
    return {LayoutRule::moe_divides, c.ep != 1 && !spans_ep(c.moe_a2a_backend) ? "--ep"
                                                                                : "--moe-dp-size",
            {}};
  w.moe_tp = static_cast<int>(c.tp / moe_outer);
  if (w.moe_dp > 1 && w.moe_ep > 1 && w.moe_tp != 1)
    return {LayoutRule::moe_dp_fills_tp, "--moe-dp-size", {}};
  if (w.moe_dp > 1 && c.pp > 1) return {LayoutRule::pp_moe_dp, "--moe-dp-size", {}};
  if (w.moe_dp > 1 && w.attn_cp != w.moe_dp) return {LayoutRule::cp_moe_dp, "--moe-dp-size", {}};
  w.dcp = c.dcp;
  w.dense_tp = dense_tp_width(c);
  return {LayoutRule::ok, "", w};
}

// The flags that read the widths: dense TP and decode CP (validation_hook.py check_server_args,
// parallel_state.py initialize_model_parallel), the LM head (overrides.py _dp_lm_head_validation),
// redundant experts, pipeline stages and nodes (check_server_args).
constexpr WidthsResult check_widths(const LayoutConfig& c, const Widths& w) {
  if (!c.enable_prefill_cp && c.moe_dense_tp_size && *c.moe_dense_tp_size != 1 &&
      *c.moe_dense_tp_size != c.tp)
    return {LayoutRule::dense_tp, "--moe-dense-tp-size", {}};
  if (c.tp % c.dcp != 0) return {LayoutRule::dcp_divides, "--dcp-size", {}};
  if (dp_lm_head_on(c) && !dp_attention_on(c))
    return {LayoutRule::dp_lm_head, "--enable-dp-lm-head", {}};
  if (c.enable_tp_lm_head_all_to_all &&
      (!dp_attention_on(c) || dp_lm_head_on(c) || c.tp != resolved_dp(c) || w.attn_cp != 1))
    return {LayoutRule::tp_lm_head_a2a, "--enable-tp-lm-head-all-to-all", {}};
  if (c.ep_num_redundant_experts > 0 && w.moe_ep < 2)
    return {LayoutRule::redundant_needs_ep, "--ep-num-redundant-experts", {}};
  if (c.pp > 1 && c.draft != Draft::none) return {LayoutRule::pp_speculative, "--pp-size", {}};
  if ((std::int64_t{c.tp} * c.pp) % c.nnodes != 0)
    return {LayoutRule::nnodes_divides, "--nnodes", {}};
  if (c.nnodes > 1 && replica_count(c) > 1)
    return {LayoutRule::nnodes_replicas, "--nnodes", {}};
  return {LayoutRule::ok, "", w};
}

}  // namespace impl

constexpr WidthsResult derive_widths(const LayoutConfig& c) {
  if (const WidthsResult r = impl::check_flags(c); r.rule != LayoutRule::ok) return r;
  const WidthsResult split = impl::split_widths(c);
  if (split.rule != LayoutRule::ok) return split;
  return impl::check_widths(c, split.widths);
}

namespace impl {

// The rules of the further flags (LM head, dense TP, decode CP, redundant experts, the world).
inline std::string describe_new_rule(const WidthsResult& r, const LayoutConfig& c) {
  const std::string in = r.input;
  const auto s = [](std::int64_t v) { return std::to_string(v); };
  switch (r.rule) {
    case LayoutRule::count_range: {
      const int value = in == "--dcp-size" ? c.dcp : in == "--pp-size" ? c.pp : c.nnodes;
      return in + " = " + s(value) + " is invalid: " + RELAYOUT_RULE_COUNT_RANGE;
    }
    case LayoutRule::redundant_range:
      return "--ep-num-redundant-experts = " + s(c.ep_num_redundant_experts) + " is invalid: " +
             RELAYOUT_RULE_REDUNDANT_RANGE;
    case LayoutRule::pp_moe_dp:
      return "--moe-dp-size " + s(c.moe_dp) + " with --pp-size " + s(c.pp) + ": " + RELAYOUT_RULE_PP_MOE_DP;
    case LayoutRule::dense_tp:
      return "--moe-dense-tp-size " + s(*c.moe_dense_tp_size) + " with --tp " + s(c.tp) + ": " +
             RELAYOUT_RULE_DENSE_TP;
    case LayoutRule::dcp_divides:
      return "--dcp-size " + s(c.dcp) + ": tp = " + s(c.tp) + " is not divisible by dcp = " + s(c.dcp) +
             "; " + RELAYOUT_RULE_DCP_DIVIDES;
    case LayoutRule::dp_lm_head:
      return "--enable-dp-lm-head with --dp-size " + s(resolved_dp(c)) +
             " and DP attention off: " RELAYOUT_RULE_DP_LM_HEAD;
    case LayoutRule::tp_lm_head_a2a: {
      const std::string why =
          !dp_attention_on(c)       ? std::string("DP attention is off")
          : dp_lm_head_on(c)        ? std::string("--enable-dp-lm-head is set")
          : c.tp != resolved_dp(c)  ? "tp = " + s(c.tp) + " != dp = " + s(resolved_dp(c))
                                    : "attn_cp = " + s(attn_cp_width(c)) + " != 1";
      return "--enable-tp-lm-head-all-to-all (" + why + "): " + RELAYOUT_RULE_TP_LM_HEAD_A2A;
    }
    case LayoutRule::redundant_needs_ep:
      return "--ep-num-redundant-experts " + s(c.ep_num_redundant_experts) + " with moe_ep = " +
             s(moe_ep_width(c)) + ": " + RELAYOUT_RULE_REDUNDANT_NEEDS_EP;
    case LayoutRule::pp_speculative:
      return "--pp-size " + s(c.pp) + " with --draft " + std::string(to_string(c.draft)) + ": " +
             RELAYOUT_RULE_PP_SPECULATIVE;
    case LayoutRule::nnodes_divides:
      return "--nnodes " + s(c.nnodes) + ": tp * pp = " + s(c.tp) + " * " + s(c.pp) +
             " is not divisible by " + s(c.nnodes) + "; " + RELAYOUT_RULE_NNODES_DIVIDES;
    case LayoutRule::nnodes_replicas:
      return "--nnodes " + s(c.nnodes) + " with " + s(replica_count(c)) +
             " data-parallel replicas (--dp-size " + s(c.dp) + " without DP attention): " +
             RELAYOUT_RULE_NNODES_REPLICAS;
    default:
      return "unknown rule";
  }
}

inline std::string describe_rule(const WidthsResult& r, const LayoutConfig& c) {
  const std::string in = r.input;
  const auto s = [](std::int64_t v) { return std::to_string(v); };
  const std::string backend(to_string(c.moe_a2a_backend));
  const std::string dp_flags =
      c.attn_dp_size ? "--attn-dp-size " + s(*c.attn_dp_size) + ", --dp-size " + s(c.dp)
                     : "--dp-size " + s(c.dp) +
                           (c.enable_dp_attention ? " with --enable-dp-attention"
                                                  : " without --enable-dp-attention");
  // --enable-dp-attention with --dp-size 1 is turned off, as SGLang turns it off.
  const std::string dp_off = dp_attention_dropped(c)
                                 ? " (DP attention off: --dp-size 1 turns --enable-dp-attention off)"
                                 : " (DP attention off)";
  switch (r.rule) {
    case LayoutRule::ok:
      return "ok";
    case LayoutRule::width_positive:
    case LayoutRule::width_limit: {
      const int value = in == "--tp" ? c.tp : in == "--dp" ? c.dp : in == "--cp" ? c.cp
                        : in == "--ep" ? c.ep : c.moe_dp;
      return in + " = " + s(value) + " is invalid: " +
             (r.rule == LayoutRule::width_positive ? RELAYOUT_RULE_WIDTH_POSITIVE
                                                   : RELAYOUT_RULE_WIDTH_LIMIT);
    }
    case LayoutRule::attn_dp_size_range:
      return "--attn-dp-size = " + s(*c.attn_dp_size) + " is invalid: " +
             RELAYOUT_RULE_ATTN_DP_SIZE_RANGE;
    case LayoutRule::attn_dp_replicas:
      return "--attn-dp-size " + s(*c.attn_dp_size) + " with --dp-size " + s(c.dp) + ": " +
             RELAYOUT_RULE_ATTN_DP_REPLICAS;
    case LayoutRule::attn_dp_conflict:
      return "--attn-dp-size 1 with --dp-size " + s(c.dp) + " --enable-dp-attention: " +
             RELAYOUT_RULE_ATTN_DP_CONFLICT;
    case LayoutRule::prefill_cp_strategy:
      return "--cp-strategy " + std::string(to_string(*c.cp_strategy)) + ": " +
             RELAYOUT_RULE_PREFILL_CP_STRATEGY;
    case LayoutRule::prefill_cp_no_strategy:
      return "--enable-prefill-cp without --cp-strategy: " RELAYOUT_RULE_PREFILL_CP_NO_STRATEGY;
    case LayoutRule::prefill_cp_dp:
      return in + ": --enable-prefill-cp with " + dp_flags + " (dp = " + s(resolved_dp(c)) +
             "): " + RELAYOUT_RULE_PREFILL_CP_DP;
    case LayoutRule::prefill_cp_tp:
      return "--tp " + s(c.tp) + ": --enable-prefill-cp with tp = " + s(c.tp) + " > 8: " +
             RELAYOUT_RULE_PREFILL_CP_TP;
    case LayoutRule::prefill_cp_backend:
      return "--moe-a2a-backend " + backend +
             (c.moe_a2a_backend == Backend::ascend_tp
                  ? " (checked as typed, before SGLang runs ascend_tp as none)"
                  : std::string()) +
             ": " + RELAYOUT_RULE_PREFILL_CP_BACKEND;
    case LayoutRule::backend_dp_eq_tp:
      return "--moe-a2a-backend " + backend + " with --tp " + s(c.tp) + ", " + dp_flags +
             (dp_attention_on(c) ? " (dp = " + s(resolved_dp(c)) + " != tp)" : dp_off) + ": " +
             RELAYOUT_RULE_BACKEND_DP_EQ_TP;
    case LayoutRule::backend_pplx:
      return "--moe-a2a-backend pplx with " + dp_flags +
             (dp_attention_on(c) ? " (one DP group)" : dp_off) + ": " + RELAYOUT_RULE_BACKEND_PPLX;
    case LayoutRule::attn_divides:
      return in + ": tp = " + s(c.tp) + " is not divisible by attn_dp * attn_cp = " +
             s(attn_dp_width(c)) + " * " + s(attn_cp_width(c)) + "; " + RELAYOUT_RULE_ATTN_DIVIDES;
    case LayoutRule::cp_dp_divides:
      return "--cp " + s(c.cp) + " with --dp-size " + s(resolved_dp(c)) + ": tp = " + s(c.tp) +
             " is not divisible by dp * attn_cp = " + s(resolved_dp(c)) + " * " +
             s(attn_cp_width(c)) + "; " + RELAYOUT_RULE_CP_DP_DIVIDES;
    case LayoutRule::moe_divides:
      return in + ": tp = " + s(c.tp) + " is not divisible by moe_ep * moe_dp = " +
             s(moe_ep_width(c)) + " * " + s(c.moe_dp) +
             (spans_ep(c.moe_a2a_backend)
                  ? " (moe_ep is forced to tp by --moe-a2a-backend " + backend + ")"
                  : std::string()) +
             "; " + RELAYOUT_RULE_MOE_DIVIDES;
    case LayoutRule::moe_dp_fills_tp:
      return "--moe-dp-size " + s(c.moe_dp) + " with moe_ep = " + s(moe_ep_width(c)) +
             (spans_ep(c.moe_a2a_backend) ? " (--moe-a2a-backend " + backend + ")"
                                          : " (--ep " + s(c.ep) + ")") +
             ": moe_ep * moe_dp = " + s(std::int64_t{moe_ep_width(c)} * c.moe_dp) + " != tp = " +
             s(c.tp) + "; " + RELAYOUT_RULE_MOE_DP_FILLS_TP;
    case LayoutRule::cp_moe_dp:
      return "--moe-dp-size " + s(c.moe_dp) + " with attn_cp = " + s(attn_cp_width(c)) +
             (c.enable_prefill_cp ? " (set by --enable-prefill-cp)" : " (--cp)") + ": " +
             RELAYOUT_RULE_CP_MOE_DP;
    default:
      return describe_new_rule(r, c);
  }
}

}  // namespace impl

// Derives the widths or throws LayoutError naming the flag and the rule.
inline Widths checked_widths(const LayoutConfig& c) {
  const WidthsResult r = derive_widths(c);
  if (r.rule != LayoutRule::ok) throw LayoutError(r.input, impl::describe_rule(r, c));
  return r.widths;
}

}  // namespace relayout
