// A MoeBridge run's entry and exit: the step's token counts (given, gathered or agreed), the EP
// mode, the choice of path and the rows' conservation.
#pragma once

#include "relayout/bridge/impl/run.hpp"

namespace relayout::impl {

// The step's token counts: the engine's, or gathered here (one all_gather over tp).
template <class C, class T, class Space>
auto BridgeRun<C, T, Space>::counts(std::int64_t group_rows) -> std::span<const std::int64_t> {
  if (!run_opts.global_num_tokens.empty()) return run_opts.global_num_tokens;
  if (gathered.empty()) gathered = b.gather_num_tokens(group_rows);
  return gathered;
}

// Paths that dispatch: this run's EP mode and this rank's refusal of the counts it was given
// (agreed in the dispatch, with the counts' digest, so no rank waits on another's mistake; the
// dispatch names the call site).
template <class C, class T, class Space>
auto BridgeRun<C, T, Space>::prepare_dispatch(std::int64_t group_rows) -> void {
  const auto& forced = run_opts.ep_mode ? run_opts.ep_mode : b.opts_.ep_mode;
  const bool need = !forced || !run_opts.global_num_tokens.empty();
  const std::span<const std::int64_t> c = need ? counts(group_rows) : std::span<const std::int64_t>{};
  mode = forced ? *forced : auto_ep_mode(c, widths().attn_tp, b.ep_->low_latency_capacity());
  if (run_opts.global_num_tokens.empty()) return;
  // Auto on the engine's counts: counts that differ between ranks (found by the dispatch's digest)
  // may pick different modes, whose exchanges do not match. With the collective check on, the
  // members first agree (normal if any picks it); off, the hot path makes no extra exchange.
  if (!forced && agreement_settings().check) {
    int normal = mode == EpMode::normal ? 1 : 0;
    all_reduce_in_place(exec, pg().moe_ep(), std::span<int>(&normal, 1), ReduceOp::max, site);
    mode = normal ? EpMode::normal : EpMode::low_latency;
  }
  const std::size_t g = static_cast<std::size_t>(dpg().coords().attn_dp_rank);
  refusal_counts = true;
  if (c.size() != static_cast<std::size_t>(dpg().layout().widths().attn_dp))
    refusal = "global_num_tokens has " + std::to_string(c.size()) + " entries; the step has " +
              std::to_string(dpg().layout().widths().attn_dp) + " attention-DP groups";
  else if (c[g] != group_rows)
    refusal = "this DP group holds " + std::to_string(group_rows) + " rows but global_num_tokens[" +
              std::to_string(g) + "] = " + std::to_string(c[g]);
  else
    refusal_counts = false;
}

template <class C, class T, class Space>
auto BridgeRun<C, T, Space>::go(const In& x) -> Out {
  if (run_opts.ep_mode) check_ep_mode(*run_opts.ep_mode, b.path(), "BridgeRunOptions::ep_mode");
  return checked(x.rows(), [&](const std::vector<std::int64_t>&) -> Out {
    switch (b.path()) {
      case BridgePath::dp_gather: {
        const DpSlotsPtr slots = b.slots(agreed_counts(x.rows()));
        plan = bridge_plan(BridgePath::dp_gather, slots->mode(), b.opts_.restore, b.shares_ != nullptr);
        return dp_gather(x, slots);
      }
      case BridgePath::tp_moe: plan = bridge_plan(BridgePath::tp_moe); return tp_moe(x);
      case BridgePath::a2a_split:
      case BridgePath::direct: break;
    }
    plan = bridge_plan(b.path());
    prepare_dispatch(x.rows());
    return a2a(x);
  });
}

// Path dp_gather: the engine's counts checked against every rank's rows and against each
// other in one all_gather over tp (or gathered there when it gave none): every rank throws
// the same error before the gather of rows.
template <class C, class T, class Space>
auto BridgeRun<C, T, Space>::agreed_counts(std::int64_t rows) -> std::vector<std::int64_t> {
  if (run_opts.global_num_tokens.empty()) return b.gather_num_tokens(rows);
  const std::span<const std::int64_t> c = run_opts.global_num_tokens;
  const int n = pg().tp().size(), A = widths().attn_tp;
  const std::int64_t digest = impl::counts_digest(c);
  std::vector<std::int64_t> mine{rows, digest}, all(2 * static_cast<std::size_t>(n));
  all_gather(exec, pg().tp(), mine, all, site);
  for (int r = 0; r < n; ++r) {
    const std::size_t g = static_cast<std::size_t>(r / A);
    const std::int64_t held = all[2 * static_cast<std::size_t>(r)];
    if (all[2 * static_cast<std::size_t>(r) + 1] != digest)
      throw LayoutError("global_num_tokens", "MoeBridge::run: rank " + std::to_string(r) +
                                                 " of the TP domain was given other token counts "
                                                 "(global_num_tokens) than this rank" + impl::called_at(site));
    if (g >= c.size() || c[g] != held)
      throw LayoutError("global_num_tokens", "MoeBridge::run: rank " + std::to_string(r) + " holds " +
                                                 std::to_string(held) + " rows, but global_num_tokens lists " +
                                                 (g < c.size() ? std::to_string(c[g]) : std::string("no entry")) +
                                                 " for its DP group " + std::to_string(g) + impl::called_at(site));
  }
  return {c.begin(), c.end()};
}

// Rows already split over attn_tp, on a path that dispatches rows: the chunk's hand-over.
template <class C, class T, class Space>
auto BridgeRun<C, T, Space>::go_scattered(const ScatteredIn& x) -> ScatteredIn {
  // This member's chunk as tensor_split gives it (what reduce_scatter and split_rows make): the
  // dispatch numbers the group's tokens by it, and another split would mislabel them.
  const Range mine = tensor_split_range(x.full_rows(), pg().attn_tp().size(), pg().attn_tp().rank());
  if (x.rows() != mine.count)
    refusal = "this attn_tp member holds " + std::to_string(x.rows()) + " of the " + std::to_string(x.full_rows()) +
              " rows split over attn_tp = " + std::to_string(pg().attn_tp().size()) + "; tensor_split gives member " +
              std::to_string(pg().attn_tp().rank()) + " " + std::to_string(mine.count) +
              " (reduce_scatter or split_rows the rows)";
  if (b.path() == BridgePath::tp_moe) {
    // No dispatch carries the verdict here: the members agree on it first, so none waits in the
    // gather of the chunks.
    const auto& tp = pg().attn_tp();
    int first_bad = refusal.empty() ? tp.size() : tp.rank();
    all_reduce_in_place(exec, tp, std::span<int>(&first_bad, 1), ReduceOp::min, site);
    if (first_bad < tp.size())
      throw LayoutError("rows", "MoeBridge::run: " +
                                    (refusal.empty() ? "attn_tp member " + std::to_string(first_bad) +
                                                           " holds a chunk other than tensor_split's (its error says "
                                                           "which); no rows were exchanged"
                                                     : refusal) +
                                    impl::called_at(site));
  }
  return checked(x.rows(), [&](const std::vector<std::int64_t>& in_owners) -> ScatteredIn {
    plan = bridge_plan(b.path(), PaddingMode::sum_len, b.opts_.restore, false, true);
    if (b.path() == BridgePath::tp_moe) return tp_moe_scattered(x);
    const std::string chunk_refusal = std::move(refusal);
    prepare_dispatch(x.full_rows());
    if (!chunk_refusal.empty()) {
      refusal = chunk_refusal;
      refusal_counts = false;
    }
    return a2a_chunk(x, in_owners, x.full_rows());
  });
}

// Row conservation: every row that entered leaves exactly once, in order. A broken invariant
// can be local, so the ranks agree before anyone throws: every rank throws together.
template <class C, class T, class Space>
auto BridgeRun<C, T, Space>::conserve(std::int64_t n_in, const std::vector<std::int64_t>& in_owners, std::int64_t n_out) -> void {
  const bool ok = n_out == n_in && (!owners || in_owners == *owners);
  int first_bad = ok ? pg().layout().size() : pg().rank();
  all_reduce_in_place(exec, pg().tp(), std::span<int>(&first_bad, 1), ReduceOp::min);
  if (first_bad >= pg().layout().size()) return;
  std::string what = "row conservation broken on rank " + std::to_string(first_bad);
  if (first_bad != pg().rank()) {
    what += " of the domain (this rank's rows are intact)";
  } else {
    what += ": " + std::to_string(n_in) + " rows entered the bridge and " + std::to_string(n_out) + " left";
    if (owners) {
      std::size_t i = 0;
      while (i < in_owners.size() && i < owners->size() && in_owners[i] == (*owners)[i]) ++i;
      what += "; first difference at row " + std::to_string(i);
    }
  }
  throw LayoutError("bridge", what);
}

}  // namespace relayout::impl
