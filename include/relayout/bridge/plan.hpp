// The Attention -> MoE hand-over of one decoder layer as a constexpr plan: for each bridge path
// (and, on path dp_gather, each padding mode and restore) the ordered steps, the group each runs
// on and the placement the rows have after it. The executor (bridge.hpp) runs exactly these steps
// and checks it as it goes; `relayout explain` prints them. One source, so the description and
// the execution cannot drift apart. See docs/bridge.md.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "relayout/mesh/names.hpp"
#include "relayout/placement/ep_message.hpp"
#include "relayout/placement/tags.hpp"

namespace relayout {

// Path dp_gather's restore: a collective that sums the expert partials (reduce_scatterv with
// sum_len padding, dp_reduce_scatter with max_len), or an all-reduce over tp and a copy
// (dp_scatter). Either way the partials are summed exactly once.
enum class BridgeRestore : std::uint8_t { reduce, scatter };
inline constexpr impl::NameTable<BridgeRestore, 2> kBridgeRestoreNames{
    {{{BridgeRestore::reduce, "reduce"}, {BridgeRestore::scatter, "scatter"}}}};
constexpr std::string_view to_string(BridgeRestore r) { return kBridgeRestoreNames.name(r); }
// A restore by name ("reduce", "scatter"); `input` names the flag or field in the error.
inline BridgeRestore parse_restore(std::string_view text, const char* input = "restore") {
  return impl::parse_name(kBridgeRestoreNames, text, input, "restore");
}

// Whether a path sends rows through the EP dispatch: only there does a dispatch dtype apply.
constexpr bool dispatches_rows(BridgePath path) { return path == BridgePath::a2a_split || path == BridgePath::direct; }

// The one rule for a dispatch dtype: a 16-bit or fp8 one needs a path that dispatches rows (elsewhere no
// row is dispatched, so the setting would silently do nothing). MoeBridge and the programs' flag
// both check with it; `input` names the option or flag in the error.
inline void check_dispatch_dtype(DispatchDtype dtype, BridgePath path, const char* input = "dispatch_dtype") {
  if (dtype == DispatchDtype::compute || dispatches_rows(path)) return;
  throw LayoutError(input, std::string(input) + " " + std::string(to_string(dtype)) +
                               " needs a path that dispatches rows (a2a_split or direct: --moe-a2a-backend deepep); "
                               "this layout takes path " + std::string(to_string(path)));
}

enum class BridgeStep : std::uint8_t {
  dp_gather,          // dp_gather_replicate over tp: one contributor per attention-TP group
  split_rows,         // keep this attn_tp member's tensor_split chunk (local)
  route,              // the engine's router on the rows this rank routes (local)
  local_experts,      // this rank's experts on rows every MoE rank holds: Partial<tp> (local)
  dispatch,           // EP dispatch over moe_ep: each row once per destination rank
  experts,            // the engine's experts on the rows dispatched here (local)
  combine,            // EP combine over moe_ep: weighted, summed rows back in order
  shared_expert,      // the engine's shared expert, if it has one (local)
  all_reduce,         // sum of the expert partials over tp
  reduce_scatterv,    // sum and return each DP group's rows (sum_len)
  dp_reduce_scatter,  // sum and return each DP group's rows (max_len)
  dp_scatter,         // copy this DP group's rows out of the global buffer (local)
  all_gather,         // concatenate the attn_tp chunks back (not a sum)
  reduce_scatter,     // sum of the expert partials over attn_tp (== tp), each member keeping its chunk
};

struct PlanStep {
  BridgeStep step;
  std::optional<GroupKind> group;  // the collective's group; nullopt for a local step
  std::string_view name;           // boundary name (trace records, explain)
  std::string_view state;          // what the values mean afterwards: moe_in, moe_partial, dispatched, moe_out
  // The rows' placement afterwards; none where no row placement describes them: after route (the
  // rows of the step before, routed) and between dispatch and combine (rows grouped by local
  // expert on the experts' ranks).
  std::optional<Placement> placement;
  std::string_view what;           // one sentence for people
};

namespace impl {
using G = GroupKind;
inline constexpr Placement kReplicatedAttnTp{RowState::replicated, G::attn_tp, RowScope::dp_local};
inline constexpr Placement kRowShardAttnTp{RowState::row_shard, G::attn_tp, RowScope::dp_local};
inline constexpr Placement kPartialTpLocal{RowState::partial, G::tp, RowScope::dp_local};
inline constexpr Placement kPartialTpGlobal{RowState::partial, G::tp, RowScope::dp_global};
inline constexpr Placement kReplicatedTpGlobal{RowState::replicated, G::tp, RowScope::dp_global};
inline constexpr PlanStep kRoute{BridgeStep::route, std::nullopt, "route", "moe_in", std::nullopt, "the engine's router picks each row's top-k experts"};
// The experts on gathered rows (dp_gather paths): partial sums until the step that follows.
inline constexpr PlanStep kExpertsGlobal{BridgeStep::local_experts, std::nullopt, "experts", "moe_partial",
                                         kPartialTpGlobal,
                                         "this rank's experts (and moe_tp share) on its moe_dp slice of the rows; no sum yet"};

inline constexpr std::array<PlanStep, 4> kPlanGatherSum{{
    {BridgeStep::dp_gather, G::tp, "dp_gather", "moe_in", kReplicatedTpGlobal,
     "every DP group's rows into one buffer (attn_tp_rank 0 of each group contributes; sum_len: packed)"},
    kRoute,
    kExpertsGlobal,
    {BridgeStep::reduce_scatterv, G::tp, "reduce_scatterv", "moe_out", kReplicatedAttnTp,
     "sums the partials over tp and returns each DP group its rows, in one collective (the only sum)"},
}};
inline constexpr std::array<PlanStep, 4> kPlanGatherMax{{
    {BridgeStep::dp_gather, G::tp, "dp_gather", "moe_in", kReplicatedTpGlobal,
     "every DP group's rows into one buffer, each group padded to the longest (max_len)"},
    kRoute,
    kExpertsGlobal,
    {BridgeStep::dp_reduce_scatter, G::tp, "dp_reduce_scatter", "moe_out", kReplicatedAttnTp,
     "reduce-scatter over tp of equal slots, all-gather over attn_tp, padding dropped (the only sum)"},
}};
inline constexpr std::array<PlanStep, 5> kPlanGatherScatter{{
    {BridgeStep::dp_gather, G::tp, "dp_gather", "moe_in", kReplicatedTpGlobal,
     "every DP group's rows into one buffer (attn_tp_rank 0 of each group contributes)"},
    kRoute,
    kExpertsGlobal,
    {BridgeStep::all_reduce, G::tp, "all_reduce", "moe_out", kReplicatedTpGlobal,
     "the MoE sums its partials over tp (the only sum)"},
    {BridgeStep::dp_scatter, std::nullopt, "dp_scatter", "moe_out", kReplicatedAttnTp,
     "copy this DP group's rows out of the global buffer (no sum)"},
}};
inline constexpr std::array<PlanStep, 3> kPlanTpMoe{{
    kRoute,
    {BridgeStep::local_experts, std::nullopt, "experts", "moe_partial", kPartialTpLocal,
     "this rank's experts (and moe_tp share) on every row; no sum yet"},
    {BridgeStep::all_reduce, G::tp, "all_reduce", "moe_out", kReplicatedAttnTp,
     "sums the partials over tp (attn_tp == tp here; the only sum)"},
}};
// tp_moe on rows already split over attn_tp (== tp here): every MoE rank multiplies every row, so
// the chunks are gathered first and the partials summed back into the chunks.
inline constexpr std::array<PlanStep, 4> kPlanTpMoeScattered{{
    {BridgeStep::all_gather, G::attn_tp, "all_gather", "moe_in", kReplicatedAttnTp,
     "concatenate the members' chunks: every row on every rank, as the MoE needs them (not a sum)"},
    kRoute,
    {BridgeStep::local_experts, std::nullopt, "experts", "moe_partial", kPartialTpLocal,
     "this rank's experts (and moe_tp share) on every row; no sum yet"},
    {BridgeStep::reduce_scatter, G::attn_tp, "reduce_scatter", "moe_out", kRowShardAttnTp,
     "sums the partials over attn_tp (== tp here), each member keeping its own chunk (the only sum)"},
}};
inline constexpr std::array<PlanStep, 7> kPlanA2a{{
    {BridgeStep::split_rows, std::nullopt, "split_rows", "moe_in", kRowShardAttnTp,
     "keep this rank's tensor_split chunk of its group's replicated rows (earlier chunks one row larger)"},
    kRoute,
    {BridgeStep::dispatch, G::moe_ep, "dispatch", "dispatched", std::nullopt,
     "each row to every moe_ep rank holding one of its experts, once per rank, with their weights"},
    {BridgeStep::experts, std::nullopt, "dispatch+experts", "dispatched", std::nullopt,
     "the engine's experts on the rows that arrived"},
    {BridgeStep::combine, G::moe_ep, "combine", "moe_out", kRowShardAttnTp,
     "weighted sums back to the rows' owners, summed over destination ranks: complete rows"},
    {BridgeStep::shared_expert, std::nullopt, "shared_expert", "moe_out", kRowShardAttnTp,
     "the shared expert on this rank's own rows, added"},
    {BridgeStep::all_gather, G::attn_tp, "all_gather", "moe_out", kReplicatedAttnTp,
     "concatenate the chunks over attn_tp (restores split rows; not a sum)"},
}};

// Path dp_gather under attention context parallelism (backend none, attn_cp > 1): each CP rank
// holds only its share of its DP group's rows, so the CP partners share rows before the MoE (the
// MoE-DP group is the attention-CP group) and each gets its own share back. The ranks run
// (attn_dp, attn_cp, attn_tp), so every (DP group, CP rank) pair is one block of the gathered
// buffer and the DP steps run unchanged with those blocks as groups: DpLocal there means the CP
// share (the share's own DP group in cp_share_layout).
inline constexpr std::array<PlanStep, 4> kPlanCpGatherSum{{
    {BridgeStep::dp_gather, G::tp, "dp_gather", "moe_in", kReplicatedTpGlobal,
     "every CP rank's share of every DP group into one buffer: the CP partners share their rows "
     "(attn_tp_rank 0 of each CP rank contributes; sum_len: packed)"},
    kRoute,
    kExpertsGlobal,
    {BridgeStep::reduce_scatterv, G::tp, "reduce_scatterv", "moe_out", kReplicatedAttnTp,
     "sums the partials over tp and returns each CP rank its own share, in one collective (the only sum)"},
}};
inline constexpr std::array<PlanStep, 4> kPlanCpGatherMax{{
    {BridgeStep::dp_gather, G::tp, "dp_gather", "moe_in", kReplicatedTpGlobal,
     "every CP rank's share of every DP group into one buffer, each share padded to the longest "
     "(max_len): the CP partners share their rows"},
    kRoute,
    kExpertsGlobal,
    {BridgeStep::dp_reduce_scatter, G::tp, "dp_reduce_scatter", "moe_out", kReplicatedAttnTp,
     "reduce-scatter over tp of equal slots, all-gather over attn_tp: each CP rank its own share, "
     "padding dropped (the only sum)"},
}};
inline constexpr std::array<PlanStep, 5> kPlanCpGatherScatter{{
    {BridgeStep::dp_gather, G::tp, "dp_gather", "moe_in", kReplicatedTpGlobal,
     "every CP rank's share of every DP group into one buffer: the CP partners share their rows"},
    kRoute,
    kExpertsGlobal,
    {BridgeStep::all_reduce, G::tp, "all_reduce", "moe_out", kReplicatedTpGlobal,
     "the MoE sums its partials over tp (the only sum)"},
    {BridgeStep::dp_scatter, std::nullopt, "dp_scatter", "moe_out", kReplicatedAttnTp,
     "copy this CP rank's own share out of the global buffer (no sum)"},
}};
}  // namespace impl

// The steps of one layer's hand-over for a path; `padding` and `restore` matter on dp_gather only,
// `cp` (attn_cp > 1) there too: the gathered blocks are CP shares, not whole DP groups.
// `scattered`: the rows enter already split over attn_tp (RowShard<AttnTp>, SGLang's scattered
// mode) and leave so: on a path that dispatches rows, its plan without split_rows and all_gather;
// on tp_moe the chunks gathered, the experts, and the sum scattered back into the chunks; on
// dp_gather no plan (empty: the bridge refuses such rows there).
constexpr std::span<const PlanStep> bridge_plan(BridgePath path, PaddingMode padding = PaddingMode::sum_len,
                                                BridgeRestore restore = BridgeRestore::reduce, bool cp = false,
                                                bool scattered = false) {
  if (scattered) {
    if (dispatches_rows(path)) return std::span<const PlanStep>(impl::kPlanA2a).subspan(1, impl::kPlanA2a.size() - 2);
    return path == BridgePath::tp_moe ? std::span<const PlanStep>(impl::kPlanTpMoeScattered) : std::span<const PlanStep>{};
  }
  switch (path) {
    case BridgePath::dp_gather:
      if (restore == BridgeRestore::scatter) return cp ? impl::kPlanCpGatherScatter : impl::kPlanGatherScatter;
      if (cp)
        return padding == PaddingMode::max_len ? std::span<const PlanStep>(impl::kPlanCpGatherMax)
                                               : std::span<const PlanStep>(impl::kPlanCpGatherSum);
      return padding == PaddingMode::max_len ? std::span<const PlanStep>(impl::kPlanGatherMax)
                                             : std::span<const PlanStep>(impl::kPlanGatherSum);
    case BridgePath::tp_moe: return impl::kPlanTpMoe;
    case BridgePath::a2a_split:
    case BridgePath::direct: return impl::kPlanA2a;
  }
  return {};
}

// How many times a plan sums the expert partials: exactly once on every path that has partials.
constexpr int plan_sums(std::span<const PlanStep> plan) {
  int n = 0;
  for (const PlanStep& s : plan)
    n += s.step == BridgeStep::all_reduce || s.step == BridgeStep::reduce_scatterv ||
         s.step == BridgeStep::dp_reduce_scatter || s.step == BridgeStep::reduce_scatter ||
         s.step == BridgeStep::combine;
  return n;
}
static_assert(plan_sums(impl::kPlanGatherSum) == 1 && plan_sums(impl::kPlanGatherMax) == 1 &&
                  plan_sums(impl::kPlanGatherScatter) == 1 && plan_sums(impl::kPlanTpMoe) == 1 &&
                  plan_sums(impl::kPlanA2a) == 1 && plan_sums(impl::kPlanCpGatherSum) == 1 &&
                  plan_sums(impl::kPlanCpGatherMax) == 1 && plan_sums(impl::kPlanCpGatherScatter) == 1 &&
                  plan_sums(impl::kPlanTpMoeScattered) == 1,
              "every bridge plan sums the expert outputs exactly once");

}  // namespace relayout
