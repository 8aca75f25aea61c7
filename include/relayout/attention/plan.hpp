// The attention side of one decoder layer as a constexpr plan: for the prefill and for decode /
// extend, with and without attention CP and attention TP, the ordered steps, the group each runs
// on and what it does. CpAttention (cp_attention.hpp) runs these steps (the kv append is the
// caller's append_extend); `relayout explain` prints them. See docs/cp.md.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "relayout/mesh/names.hpp"

namespace relayout {

enum class AttentionPhase : std::uint8_t { prefill, extend };  // extend: decode and extend rows

enum class AttentionStep : std::uint8_t {
  kv_gather,      // all_gatherv of every CP rank's kv rows over attn_cp, put in the group's order
  prefill,        // the attention kernel: queries against the group's keys by global position (local)
  kv_append,      // this rank's new kv rows into its paged cache (local)
  query_gather,   // all_gatherv of the group's new queries over attn_cp
  partial,        // every gathered row over the keys held here: output and log-sum-exp (local)
  partials_back,  // all_to_allv of each row's partials to the row's CP rank
  merge,          // the log-sum-exp merge of a row's partials (local)
  attend,         // the attention kernel over the paged cache, causal by position (local)
  all_reduce,     // the wo_b partial sums over attn_tp: Partial<attn_tp> -> Replicated<attn_tp>
};

struct AttentionPlanStep {
  AttentionStep step;
  std::optional<GroupKind> group;  // the collective's group; nullopt for a local step
  std::string_view name;
  std::string_view what;  // one sentence for people
};

namespace impl {
inline constexpr AttentionPlanStep kKvGather{
    AttentionStep::kv_gather, GroupKind::attn_cp, "all_gatherv",
    "every CP rank's kv rows (head_dim floats per token): the shared KV of its DP group, attended by global position"};
inline constexpr AttentionPlanStep kPrefill{AttentionStep::prefill, std::nullopt, "attention",
                                            "this rank's queries against its DP group's keys, causal by position"};
inline constexpr AttentionPlanStep kAllReduce{AttentionStep::all_reduce, GroupKind::attn_tp, "all_reduce",
                                              "wo_b partial sums -> identical complete rows (Replicated)"};
inline constexpr AttentionPlanStep kAppend{AttentionStep::kv_append, std::nullopt, "kv_append",
                                           "the kv rows of this rank's new rows into its paged cache (append_extend)"};
inline constexpr AttentionPlanStep kAttend{AttentionStep::attend, std::nullopt, "attention",
                                           "each new row against its request's cached keys up to its own position"};
inline constexpr AttentionPlanStep kQueryGather{
    AttentionStep::query_gather, GroupKind::attn_cp, "all_gatherv",
    "the queries of every new row of the DP group (this rank's heads), CP rank after CP rank"};
inline constexpr AttentionPlanStep kPartial{
    AttentionStep::partial, std::nullopt, "partial",
    "every new row over the keys held here, up to its position: output and log-sum-exp per head"};
inline constexpr AttentionPlanStep kPartialsBack{AttentionStep::partials_back, GroupKind::attn_cp, "all_to_allv",
                                                 "each row's partial output and log-sum-exp to the row's CP rank"};
inline constexpr AttentionPlanStep kMerge{AttentionStep::merge, std::nullopt, "merge",
                                          "the CP ranks' partials of each row merged by log-sum-exp (exact)"};

inline constexpr std::array<AttentionPlanStep, 2> kAttnPrefill{{kPrefill, kAllReduce}};
inline constexpr std::array<AttentionPlanStep, 3> kAttnPrefillCp{{kKvGather, kPrefill, kAllReduce}};
inline constexpr std::array<AttentionPlanStep, 3> kAttnExtend{{kAppend, kAttend, kAllReduce}};
inline constexpr std::array<AttentionPlanStep, 6> kAttnExtendCp{
    {kAppend, kQueryGather, kPartial, kPartialsBack, kMerge, kAllReduce}};
}  // namespace impl

// The steps of one layer's attention. `cp`: attn_cp > 1. `tp`: attn_tp > 1; without it the
// all-reduce step is left out (wo_b's output is complete already).
constexpr std::span<const AttentionPlanStep> attention_plan(AttentionPhase phase, bool cp, bool tp) {
  std::span<const AttentionPlanStep> s;
  if (phase == AttentionPhase::prefill) s = cp ? std::span<const AttentionPlanStep>(impl::kAttnPrefillCp)
                                               : std::span<const AttentionPlanStep>(impl::kAttnPrefill);
  else s = cp ? std::span<const AttentionPlanStep>(impl::kAttnExtendCp) : std::span<const AttentionPlanStep>(impl::kAttnExtend);
  return tp ? s : s.first(s.size() - 1);
}

}  // namespace relayout
