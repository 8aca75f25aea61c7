// Path tp_moe of a MoeBridge run (no DP attention, no all-to-all backend): the experts on the rows
// every rank holds, the partials summed over tp; and the same on rows split over attn_tp.
#pragma once

#include "relayout/bridge/impl/run.hpp"

namespace relayout::impl {

// No DP attention, no all-to-all backend: every rank holds every row; partials summed over tp.
template <class C, class T, class Space>
auto BridgeRun<C, T, Space>::tp_moe(const In& x) -> Out {
  const Range mine = tensor_split_range(x.rows(), widths().moe_dp, pg().coords().moe_dp_rank);
  auto partial = moe_partial(x.view(), mine);
  const PlanStep& e_step = step(BridgeStep::local_experts);
  const std::vector<std::int64_t> own = owners ? *owners : std::vector<std::int64_t>{};
  see(e_step, RowState::partial, moe_holders(), span_of(own, mine.begin, mine.count), partial, mine.begin);
  Rows<T, Partial<group::Tp>, DpLocal, Space> p(partial);
  if (fault() == BridgeFault::double_reduce)
    p = Rows<T, Partial<group::Tp>, DpLocal, Space>(
        impl::all_reduce_rows_in_place(pg().tp(), std::move(p).data(), GroupKind::tp, impl::ctx(exec, traffic, site)));
  const PlanStep& r_step = step(BridgeStep::all_reduce);
  Out o = fault() == BridgeFault::skip_reduce ? Out(std::move(p).data())
                                              : as_attn_tp(pg(), all_reduce(exec, pg(), std::move(p), traffic));
  see(r_step, RowState::replicated, widths().tp, span_of(own), o.view());
  return o;
}

// tp_moe on this member's chunk: the chunks gathered, the experts on every row, the partials
// summed over attn_tp (== tp) into the chunks.
template <class C, class T, class Space>
auto BridgeRun<C, T, Space>::tp_moe_scattered(const ScatteredIn& x) -> ScatteredIn {
  if (pg().attn_tp().size() != pg().tp().size())  // every rank alike: before any collective
    throw LayoutError("bridge", "MoeBridge: path tp_moe with attn_tp = " + std::to_string(pg().attn_tp().size()) +
                                    " != tp = " + std::to_string(pg().tp().size()));
  const PlanStep& g_step = step(BridgeStep::all_gather);
  const In all = all_gather(exec, pg(), x, traffic);
  std::vector<std::int64_t> g_owners;
  if (owners)
    g_owners = to_vector(all_gather(pg(), OwnerRows<RowShard<AttnTp>, DpLocal>(owner_view(*owners), x.full_rows())).view());
  see(g_step, RowState::replicated, group_ranks(), span_of(g_owners), all.view());
  const Range mine = tensor_split_range(all.rows(), widths().moe_dp, pg().coords().moe_dp_rank);
  auto partial = moe_partial(all.view(), mine);
  const PlanStep& e_step = step(BridgeStep::local_experts);
  see(e_step, RowState::partial, moe_holders(), span_of(g_owners, mine.begin, mine.count), partial, mine.begin);
  Rows<T, Partial<AttnTp>, DpLocal, Space> p(partial);
  if (fault() == BridgeFault::double_reduce)
    p = Rows<T, Partial<AttnTp>, DpLocal, Space>(
        impl::all_reduce_rows_in_place(pg().attn_tp(), std::move(p).data(), GroupKind::attn_tp, impl::ctx(exec, traffic, site)));
  const PlanStep& r_step = step(BridgeStep::reduce_scatter);
  ScatteredIn o = fault() == BridgeFault::skip_reduce
                      ? split_rows(pg(), Rows<T, Replicated<AttnTp>, DpLocal, Space>(std::move(p).data()))
                      : reduce_scatter(exec, pg(), std::move(p), traffic);
  see(r_step, RowState::replicated, 1, owners ? span_of(*owners) : std::span<const std::int64_t>{}, o.view());
  return o;
}

// Rows [mine) of x through route + this rank's experts (+ its shared share): Partial<tp> rows.
template <class C, class T, class Space>
auto BridgeRun<C, T, Space>::moe_partial(const view_type& x, Range mine) -> view_type {
  const std::int64_t n = static_cast<std::int64_t>(x.extent(0));
  auto partial = impl::alloc_rows<T, Space>("relayout::moe_partial", n, impl::hidden_of(x.extent(1)));
  // Rows [mine) are written by local_experts (zero where none of this rank's experts took a
  // row); only the rows of the other moe_dp slices are zero-filled here.
  if (mine.begin > 0) Kokkos::deep_copy(exec, impl::row_slice(partial, 0, mine.begin), T(0));
  if (mine.begin + mine.count < n)
    Kokkos::deep_copy(exec, impl::row_slice(partial, mine.begin + mine.count, n - mine.begin - mine.count), T(0));
  const view_type xs = impl::row_slice(x, mine.begin, mine.count);
  const view_type ps = impl::row_slice(partial, mine.begin, mine.count);
  const TopK<T, Space> r = route(xs);
  const int local = b.experts_ / widths().moe_ep;
  local_experts(exec, xs, r, pg().coords().moe_ep_rank * local, local, b.experts_, experts, ps, b.scratch_,
                b.opts_.check_route);
  if (experts.has_shared())
    if (pg().coords().moe_ep_rank == 0) experts.shared(exec, xs, ps);
  exec.fence();
  return partial;
}

}  // namespace relayout::impl
