// Path dp_gather of a MoeBridge run: every DP group's rows gathered over tp, this rank's experts on
// its moe_dp slice, the partial sums restored to each DP group.
#pragma once

#include "relayout/bridge/impl/run.hpp"

namespace relayout::impl {

// Path A: gather every DP group's rows, this rank's experts on its moe_dp slice, restore.
template <class C, class T, class Space>
auto BridgeRun<C, T, Space>::dp_gather(const In& x, const DpSlotsPtr& slots) -> Out {
  const DpSlots& s = *slots;
  const PlanStep& g_step = step(BridgeStep::dp_gather);
  Rows<T, Replicated<group::Tp>, DpGlobal, Space> global = [&] {
    if (fault() == BridgeFault::gather_partial)  // complete rows summed as partials: x attn_tp
      return dp_gather_partial(exec, dpg(), Rows<T, Partial<AttnTp>, DpLocal, Space>(x.view()), slots, traffic);
    return dp_gather_replicate(exec, dpg(), x, slots, traffic);
  }();
  std::vector<std::int64_t> g_owners;
  if (owners) {
    g_owners = to_vector(
        dp_gather_replicate(dpg(), OwnerRows<Replicated<AttnTp>, DpLocal>(owner_view(*owners)), slots).view());
    if (s.mode() == PaddingMode::max_len)
      for (int grp = 0; grp < s.groups(); ++grp)
        for (std::int64_t r = s.count(grp); r < s.slot_rows(); ++r)
          g_owners[static_cast<std::size_t>(s.offset(grp) + r)] = kPadRow;
  }
  see(g_step, RowState::replicated, widths().tp, span_of(g_owners), global.view());

  // This rank's moe_dp slice of the global rows (tensor_split over moe_dp).
  const Range mine = tensor_split_range(global.rows(), widths().moe_dp, pg().coords().moe_dp_rank);
  auto partial = moe_partial(global.view(), mine);
  const PlanStep& e_step = step(BridgeStep::local_experts);
  see(e_step, RowState::partial, moe_holders(), span_of(g_owners, mine.begin, mine.count), partial, mine.begin);
  Rows<T, Partial<group::Tp>, DpGlobal, Space> p(partial, slots);
  if (fault() == BridgeFault::double_reduce)  // the MoE sums, and the restore sums again
    p = Rows<T, Partial<group::Tp>, DpGlobal, Space>(
        impl::all_reduce_rows_in_place(pg().tp(), std::move(p).data(), GroupKind::tp, impl::ctx(exec, traffic, site)));

  const int g = dpg().coords().attn_dp_rank;  // under CP: this rank's share
  const std::vector<std::int64_t> out_owners(g_owners.empty() ? g_owners.begin() : g_owners.begin() + s.offset(g),
                                             g_owners.empty() ? g_owners.begin() : g_owners.begin() + s.offset(g) + s.count(g));
  Out out = dp_restore(std::move(p), s, g_owners, out_owners);
  if (owners) *owners = out_owners;
  return out;
}

// Path dp_gather's restore: this DP group's rows from the partial sums (all-reduce and scatter, or
// one reduce-scatter); a wired fault's copy where a sum was due.
template <class C, class T, class Space>
auto BridgeRun<C, T, Space>::dp_restore(Rows<T, Partial<group::Tp>, DpGlobal, Space> p, const DpSlots& s,
                                        const std::vector<std::int64_t>& g_owners,
                                        const std::vector<std::int64_t>& out_owners) -> Out {
  if (b.opts_.restore == BridgeRestore::scatter) {
    const PlanStep& r_step = step(BridgeStep::all_reduce);
    auto summed = fault() == BridgeFault::skip_reduce
                      ? Rows<T, Replicated<group::Tp>, DpGlobal, Space>(std::move(p).data())
                      : all_reduce(exec, dpg(), std::move(p), traffic);
    see(r_step, RowState::replicated, widths().tp, span_of(g_owners), summed.view());
    const PlanStep& s_step = step(BridgeStep::dp_scatter);
    Out o = dp_scatter(exec, dpg(), summed, traffic);
    see(s_step, RowState::replicated, group_ranks(), span_of(out_owners), o.view());
    return o;
  }
  if (fault() == BridgeFault::skip_reduce) {  // a copy where a sum was due
    const PlanStep& r_step =
        step(s.mode() == PaddingMode::sum_len ? BridgeStep::reduce_scatterv : BridgeStep::dp_reduce_scatter);
    Out o = dp_scatter(exec, dpg(), Rows<T, Replicated<group::Tp>, DpGlobal, Space>(std::move(p).data()), traffic);
    see(r_step, RowState::replicated, group_ranks(), span_of(out_owners), o.view(), 0, "dp_scatter");
    return o;
  }
  if (s.mode() == PaddingMode::sum_len) {
    const PlanStep& r_step = step(BridgeStep::reduce_scatterv);
    Out o = reduce_scatterv(exec, dpg(), p, traffic);
    see(r_step, RowState::replicated, group_ranks(), span_of(out_owners), o.view());
    return o;
  }
  const PlanStep& r_step = step(BridgeStep::dp_reduce_scatter);
  Out o = dp_reduce_scatter(exec, dpg(), p, traffic);
  see(r_step, RowState::replicated, group_ranks(), span_of(out_owners), o.view());
  return o;
}

}  // namespace relayout::impl
