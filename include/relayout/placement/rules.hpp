// The legal placement transitions and, for every illegal one, the sentence that says why and which
// call to make instead. One table serves both the compile-time checks (static_assert in the typed
// functions) and the runtime twin (PlacementError), so both say the same thing.
#pragma once

#include <array>
#include <optional>
#include <string>

#include "relayout/mesh/error.hpp"
#include "relayout/placement/tags.hpp"

namespace relayout {

enum class Transition : std::uint8_t {
  all_reduce,           // Partial<G>                 -> Replicated<G>
  reduce_scatter,       // Partial<G>                 -> RowShard<G>
  all_gather,           // RowShard<G>                -> Replicated<G>
  split_rows,           // Replicated<G>              -> RowShard<G>        (local)
  dp_gather_replicate,  // Replicated<attn_tp>, local -> Replicated<tp>, global
  dp_gather_partial,    // Partial<attn_tp>, local    -> Replicated<tp>, global
  dp_scatter,           // Replicated<tp>, global     -> Replicated<attn_tp>, local (copy)
  reduce_scatterv,      // Partial<tp>, global        -> Replicated<attn_tp>, local (sum, sum_len)
  dp_reduce_scatter,    // Partial<tp>, global        -> Replicated<attn_tp>, local (sum, max_len)
};

constexpr std::string_view to_string(Transition t) {
  constexpr std::array<std::string_view, 9> names{
      "all_reduce", "reduce_scatter", "all_gather", "split_rows", "dp_gather_replicate",
      "dp_gather_partial", "dp_scatter", "reduce_scatterv", "dp_reduce_scatter"};
  return names[static_cast<std::size_t>(t)];
}

// The placement a legal transition produces; nullopt when the transition is illegal.
constexpr std::optional<Placement> transition_result(Transition t, Placement p) {
  using S = RowState;
  using G = GroupKind;
  const bool dp_local = p.scope == RowScope::dp_local;
  switch (t) {
    case Transition::all_reduce:
      if (p.state == S::partial) return Placement{S::replicated, p.group, p.scope};
      break;
    case Transition::reduce_scatter:
      if (p.state == S::partial) return Placement{S::row_shard, p.group, p.scope};
      break;
    case Transition::all_gather:
      if (p.state == S::row_shard) return Placement{S::replicated, p.group, p.scope};
      break;
    case Transition::split_rows:
      if (p.state == S::replicated) return Placement{S::row_shard, p.group, p.scope};
      break;
    case Transition::dp_gather_replicate:
      if (p == Placement{S::replicated, G::attn_tp, RowScope::dp_local})
        return Placement{S::replicated, G::tp, RowScope::dp_global};
      break;
    case Transition::dp_gather_partial:
      if (p == Placement{S::partial, G::attn_tp, RowScope::dp_local})
        return Placement{S::replicated, G::tp, RowScope::dp_global};
      break;
    case Transition::dp_scatter:
      if (!dp_local && p.state == S::replicated && p.group == G::tp)
        return Placement{S::replicated, G::attn_tp, RowScope::dp_local};
      break;
    case Transition::reduce_scatterv:
    case Transition::dp_reduce_scatter:
      if (!dp_local && p.state == S::partial && p.group == G::tp)
        return Placement{S::replicated, G::attn_tp, RowScope::dp_local};
      break;
  }
  return std::nullopt;
}

// Each rejection: (transition, state, group, scope) with `any` wildcards, and a sentence
// "relayout: " HEAD <group name> TAIL. The first matching entry is the one reported.
#define RELAYOUT_PLACEMENT_REJECTIONS(X)                                                           \
  X(all_reduce, replicated, attn_tp, dp_local, "rows are already Replicated over ",                 \
    ": all_reduce would double-count them; use split_rows or dp_gather_replicate")                  \
  X(all_reduce, replicated, tp, dp_global, "rows are already Replicated over ",                     \
    " (the MoE summed its experts already): all_reduce would double-count them; use dp_scatter")    \
  X(all_reduce, replicated, any, any, "rows are already Replicated over ",                          \
    ": all_reduce would double-count them; use split_rows to shard them")                           \
  X(all_reduce, row_shard, any, any, "rows are a RowShard over ",                                   \
    ": all_reduce would add different rows together; use all_gather to restore the replicated rows") \
  X(reduce_scatter, replicated, any, any, "rows are already Replicated over ",                      \
    ": reduce_scatter would double-count them; use split_rows to keep this rank's chunk")           \
  X(reduce_scatter, row_shard, any, any, "rows are a RowShard over ",                               \
    ": reduce_scatter would add different rows together; use all_gather")                           \
  X(all_gather, partial, any, any, "rows are Partial sums over ",                                   \
    ": all_gather would concatenate summands instead of adding them; use all_reduce (or "           \
    "reduce_scatter)")                                                                              \
  X(all_gather, replicated, any, any, "rows are already Replicated over ",                          \
    ": all_gather would repeat every row; use split_rows to shard them first")                      \
  X(split_rows, partial, any, any, "rows are Partial sums over ",                                   \
    ": split_rows would keep incomplete rows; use reduce_scatter (sum and split in one step) or "   \
    "all_reduce first")                                                                             \
  X(split_rows, row_shard, any, any, "rows are already a RowShard over ",                           \
    ": use all_gather to restore them before splitting again")                                      \
  X(dp_gather_replicate, any, any, dp_global, "rows are already DpGlobal (placed over ",            \
    "): dp_gather_replicate would gather them again; use dp_scatter, reduce_scatterv or "           \
    "dp_reduce_scatter to return to DpLocal")                                                       \
  X(dp_gather_replicate, partial, attn_tp, dp_local, "rows are Partial sums over ",                 \
    ": dp_gather_replicate would keep only attn_tp_rank 0's summand; use dp_gather_partial (or "    \
    "all_reduce first)")                                                                            \
  X(dp_gather_replicate, row_shard, attn_tp, dp_local, "rows are a RowShard over ",                 \
    ": dp_gather_replicate would keep only attn_tp_rank 0's chunk; use all_gather first")           \
  X(dp_gather_replicate, any, any, dp_local,                                                        \
    "dp_gather_replicate needs DpLocal rows Replicated over attn_tp; these rows are placed over ",  \
    "")                                                                                             \
  X(dp_gather_partial, any, any, dp_global, "rows are already DpGlobal (placed over ",              \
    "): dp_gather_partial would gather them again; use reduce_scatterv or dp_reduce_scatter to "    \
    "return to DpLocal")                                                                            \
  X(dp_gather_partial, replicated, attn_tp, dp_local, "rows are already Replicated over ",          \
    " (complete sums): dp_gather_partial would add attn_tp copies of every row; use "               \
    "dp_gather_replicate")                                                                          \
  X(dp_gather_partial, row_shard, attn_tp, dp_local, "rows are a RowShard over ",                   \
    ": dp_gather_partial would add different rows together; use all_gather, then "                  \
    "dp_gather_replicate")                                                                          \
  X(dp_gather_partial, any, any, dp_local,                                                          \
    "dp_gather_partial needs DpLocal rows holding Partial sums over attn_tp; these rows are "       \
    "placed over ",                                                                                 \
    "")                                                                                             \
  X(dp_scatter, any, any, dp_local, "rows are DpLocal already (placed over ",                       \
    "): dp_scatter returns DpGlobal rows (from dp_gather_*) to their DP groups")                    \
  X(dp_scatter, partial, tp, dp_global, "rows are Partial sums over ",                              \
    " (the MoE skipped its all-reduce): dp_scatter only copies, so every token would miss the "     \
    "other ranks' expert outputs; use reduce_scatterv (or dp_reduce_scatter with max_len padding)") \
  X(dp_scatter, any, any, dp_global,                                                                \
    "dp_scatter needs DpGlobal rows Replicated over tp; these rows are placed over ", "")           \
  X(reduce_scatterv, any, any, dp_local, "rows are DpLocal (placed over ",                          \
    "): reduce_scatterv returns DpGlobal rows to their DP groups; for this DP group's rows use "     \
    "reduce_scatter")                                                                               \
  X(reduce_scatterv, replicated, tp, dp_global, "rows are already Replicated over ",                \
    " (the MoE summed its experts already): reduce_scatterv would sum them again (output x tp); "   \
    "use dp_scatter")                                                                               \
  X(reduce_scatterv, any, any, dp_global,                                                           \
    "reduce_scatterv needs DpGlobal rows holding Partial sums over tp; these rows are placed over ", \
    "")                                                                                             \
  X(dp_reduce_scatter, any, any, dp_local, "rows are DpLocal (placed over ",                        \
    "): dp_reduce_scatter returns DpGlobal rows to their DP groups; for this DP group's rows use "   \
    "reduce_scatter")                                                                               \
  X(dp_reduce_scatter, replicated, tp, dp_global, "rows are already Replicated over ",              \
    " (the MoE summed its experts already): dp_reduce_scatter would sum them again (output x tp); " \
    "use dp_scatter")                                                                               \
  X(dp_reduce_scatter, any, any, dp_global,                                                         \
    "dp_reduce_scatter needs DpGlobal rows holding Partial sums over tp; these rows are placed "    \
    "over ",                                                                                        \
    "")

namespace impl {

enum class StateMatch : std::uint8_t { partial, replicated, row_shard, any };
enum class GroupMatch : std::uint8_t { tp, attn_tp, attn_cp, moe_tp, moe_ep, moe_dp, any };
enum class ScopeMatch : std::uint8_t { dp_local, dp_global, any };

struct RejectRule {
  Transition op;
  StateMatch state;
  GroupMatch group;
  ScopeMatch scope;
  const char* head;
  const char* tail;

  constexpr bool matches(Transition t, Placement p) const {
    return t == op && (state == StateMatch::any || static_cast<int>(state) == static_cast<int>(p.state)) &&
           (group == GroupMatch::any || static_cast<int>(group) == static_cast<int>(p.group)) &&
           (scope == ScopeMatch::any || static_cast<int>(scope) == static_cast<int>(p.scope));
  }
  constexpr bool is(Transition t, StateMatch s, GroupMatch g, ScopeMatch c) const {
    return op == t && state == s && group == g && scope == c;
  }
};

#define RELAYOUT_IMPL_RULE_ENTRY(op, st, gr, sc, head, tail)                                   \
  RejectRule{Transition::op, StateMatch::st, GroupMatch::gr, ScopeMatch::sc, head, tail},
inline constexpr RejectRule kRejectRules[] = {RELAYOUT_PLACEMENT_REJECTIONS(RELAYOUT_IMPL_RULE_ENTRY)};
#undef RELAYOUT_IMPL_RULE_ENTRY

// The first rule matching an illegal transition; -1 for a legal one.
constexpr int first_rejection(Transition t, Placement p) {
  if (transition_result(t, p).has_value()) return -1;
  for (std::size_t i = 0; i < std::size(kRejectRules); ++i)
    if (kRejectRules[i].matches(t, p)) return static_cast<int>(i);
  return -1;
}

constexpr bool rejected_by(Transition t, Placement p, StateMatch s, GroupMatch g, ScopeMatch c) {
  const int i = first_rejection(t, p);
  return i >= 0 && kRejectRules[static_cast<std::size_t>(i)].is(t, s, g, c);
}

// Every (transition, placement) pair is either legal or has a sentence.
constexpr bool rules_are_complete() {
  for (int t = 0; t < 9; ++t)
    for (int s = 0; s < 3; ++s)
      for (GroupKind g : kAllGroupKinds)
        for (int c = 0; c < 2; ++c) {
          const Placement p{static_cast<RowState>(s), g, static_cast<RowScope>(c)};
          const auto op = static_cast<Transition>(t);
          if (transition_result(op, p).has_value() == (first_rejection(op, p) >= 0)) return false;
        }
  return true;
}
static_assert(rules_are_complete(), "every placement transition is either legal or has a sentence");

}  // namespace impl

// The sentence for an illegal transition (the same text the compile-time check prints).
inline std::string transition_error(Transition t, Placement p) {
  const int i = impl::first_rejection(t, p);
  if (i < 0) return {};
  const auto& r = impl::kRejectRules[static_cast<std::size_t>(i)];
  return std::string("relayout: ") + r.head + std::string(to_string(p.group)) + r.tail;
}

// What the runtime twin throws for an illegal transition or a placement that does not match.
class PlacementError : public LayoutError {
 public:
  explicit PlacementError(const std::string& message) : LayoutError("rows", message) {}
};

namespace impl {

// One static_assert per rule and group name: exactly the one for this placement fires.
#define RELAYOUT_IMPL_REJECT_FOR(op, st, gr, sc, head, tail, G, gname)                        \
  static_assert(!(Op == Transition::op && rejected_by(Op, p, StateMatch::st, GroupMatch::gr, ScopeMatch::sc) && \
                  p.group == GroupKind::G),                                                     \
                "relayout: " head gname tail);
#define RELAYOUT_IMPL_REJECT(op, st, gr, sc, head, tail)                 \
  RELAYOUT_IMPL_REJECT_FOR(op, st, gr, sc, head, tail, tp, "tp")           \
  RELAYOUT_IMPL_REJECT_FOR(op, st, gr, sc, head, tail, attn_tp, "attn_tp") \
  RELAYOUT_IMPL_REJECT_FOR(op, st, gr, sc, head, tail, attn_cp, "attn_cp") \
  RELAYOUT_IMPL_REJECT_FOR(op, st, gr, sc, head, tail, moe_tp, "moe_tp")   \
  RELAYOUT_IMPL_REJECT_FOR(op, st, gr, sc, head, tail, moe_ep, "moe_ep")   \
  RELAYOUT_IMPL_REJECT_FOR(op, st, gr, sc, head, tail, moe_dp, "moe_dp")

// Instantiated only by the rejecting overloads of the typed transitions.
template <Transition Op, RowStateTag State, RowScopeTag Scope>
constexpr void reject_transition() {
  [[maybe_unused]] constexpr Placement p = placement_of<State, Scope>;
  static_assert(!transition_result(Op, p).has_value());
  RELAYOUT_PLACEMENT_REJECTIONS(RELAYOUT_IMPL_REJECT)
}

#undef RELAYOUT_IMPL_REJECT
#undef RELAYOUT_IMPL_REJECT_FOR

}  // namespace impl
}  // namespace relayout
