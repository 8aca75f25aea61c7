// Paths a2a_split and direct of a MoeBridge run: each attn_tp member dispatches its chunk of the
// rows through the bridge's EpBuffer, the experts run on what arrives, the combine brings it back.
#pragma once

#include "relayout/bridge/impl/run.hpp"

namespace relayout::impl {

// Path B and direct: split over attn_tp, dispatch this chunk, experts, combine, all-gather.
template <class C, class T, class Space>
auto BridgeRun<C, T, Space>::a2a(const In& x) -> Out {
  const int A = widths().attn_tp;
  const std::int64_t n = x.rows();
  const PlanStep& s_step = step(BridgeStep::split_rows);
  // The no_split fault keeps every row on every member: dispatched attn_tp times.
  const Rows<T, RowShard<AttnTp>, DpLocal, Space> chunk =
      fault() == BridgeFault::no_split ? Rows<T, RowShard<AttnTp>, DpLocal, Space>(x.view(), n * A)
                                       : split_rows(pg(), x);
  std::vector<std::int64_t> c_owners;
  if (owners) {
    if (fault() == BridgeFault::no_split) c_owners = *owners;
    else c_owners = to_vector(split_rows(pg(), OwnerRows<Replicated<AttnTp>, DpLocal>(owner_view(*owners))).view());
  }
  see(s_step, RowState::replicated, 1, span_of(c_owners), chunk.view());
  const Rows<T, RowShard<AttnTp>, DpLocal, Space> combined = a2a_chunk(chunk, c_owners, n);
  const PlanStep& g_step = step(BridgeStep::all_gather);
  Out o = all_gather(exec, pg(), combined, traffic);
  if (owners) {
    const std::int64_t full = fault() == BridgeFault::no_split ? n * A : n;
    *owners = to_vector(all_gather(pg(), OwnerRows<RowShard<AttnTp>, DpLocal>(owner_view(c_owners), full)).view());
  }
  see(g_step, RowState::replicated, group_ranks(), owners ? span_of(*owners) : std::span<const std::int64_t>{}, o.view());
  return o;
}

// This member's chunk (c_owners: its rows' owners, when carried; group_rows: its DP group's
// rows) through route, dispatch, experts, combine and the shared expert: the chunk's MoE rows.
template <class C, class T, class Space>
auto BridgeRun<C, T, Space>::a2a_chunk(const ScatteredIn& chunk, const std::vector<std::int64_t>& c_owners,
                                       std::int64_t group_rows) -> ScatteredIn {
  // One batch, or two micro-batches whose exchanges overlap the other's compute.
  const bool two = b.opts_.two_batch_overlap;
  const std::int64_t m = chunk.rows(), H = impl::hidden_of(chunk.view().extent(1));
  Micro mb[2];
  for (int i = 0; i < (two ? 2 : 1); ++i) {
    Micro& u = mb[i];
    u.range = two ? two_batch_range(m, i) : Range{0, m};
    u.x = impl::row_slice(chunk.view(), u.range.begin, u.range.count);
    if (owners)
      u.owners.assign(c_owners.begin() + u.range.begin, c_owners.begin() + u.range.begin + u.range.count);
  }
  step(BridgeStep::route);
  const PlanStep& d_step = step(BridgeStep::dispatch);
  static_cast<void>(d_step);
  b.ep_->reset_expert_load();
  begin_dispatch(mb[0], group_rows, chunk.full_rows());
  if (two) {
    begin_dispatch(mb[1], group_rows, chunk.full_rows());  // behind the first one's exchange
    mb[0].pd->test();
  }
  finish_dispatch(mb[0], two ? &mb[1] : nullptr);  // and its experts: behind the second one's exchange
  const PlanStep& e_step = step(BridgeStep::experts);
  if (two) {
    begin_combine(mb[0]);
    finish_dispatch(mb[1], &mb[0]);  // and its experts: behind the first one's combine
  }
  see_experts(e_step, mb, two ? 2 : 1);
  const PlanStep& c_step = step(BridgeStep::combine);
  const PlanStep& h_step = step(BridgeStep::shared_expert);
  static_cast<void>(h_step);
  view_type joined;
  if (two) {
    begin_combine(mb[1]);
    finish_combine(mb[0], &mb[1]);  // and its shared expert: behind the second one's combine
    finish_combine(mb[1]);
    joined = impl::alloc_rows<T, Space>("relayout::two_batch_combined", m, H);
    for (const Micro& u : mb)
      if (u.range.count > 0)
        Kokkos::deep_copy(exec, impl::row_slice(joined, u.range.begin, u.range.count), u.combined);
  } else {
    begin_combine(mb[0]);
    finish_combine(mb[0]);
    joined = mb[0].combined;
  }
  exec.fence();
  const Rows<T, RowShard<AttnTp>, DpLocal, Space> combined(joined, chunk.full_rows());
  see(c_step, RowState::replicated, 1, span_of(c_owners), combined.view());
  return combined;
}

// The observer's view of the experts' step: one owner per (row, local expert) of the micro-batches'
// batches (over all ranks each row appears top_k times).
template <class C, class T, class Space>
auto BridgeRun<C, T, Space>::see_experts(const PlanStep& s, const Micro* mb, int count) -> void {
  if (!obs) return;
  std::vector<std::int64_t> batch_owners;
  for (int i = 0; i < count; ++i) {
    const EpHandle<T, Space>& h = mb[i].h;
    if (!owners) {
      batch_owners.resize(batch_owners.size() + static_cast<std::size_t>(h.batch().rows()));
      continue;
    }
    const std::vector<std::int64_t> t = h.batch_tags(exec);
    batch_owners.insert(batch_owners.end(), t.begin(), t.end());
  }
  see(s, RowState::replicated, router.top_k(), owners ? span_of(batch_owners) : std::span<const std::int64_t>{},
      view_type());
}

}  // namespace relayout::impl
