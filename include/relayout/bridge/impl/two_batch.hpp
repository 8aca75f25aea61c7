// The micro-batches of paths a2a_split and direct: dispatch and combine in two halves, so one
// micro-batch's exchange runs while the other's experts compute (two-batch overlap).
#pragma once

#include "relayout/bridge/impl/run.hpp"

namespace relayout::impl {

// Route, then start the dispatch (the rows' exchange left in flight).
// group_rows: the DP group's rows, whose index numbers each token for the replica choice.
template <class C, class T, class Space>
auto BridgeRun<C, T, Space>::begin_dispatch(Micro& u, std::int64_t group_rows, std::int64_t full_rows) -> void {
  const TopK<T, Space> r = route_rows(u.x);
  const Rows<T, RowShard<AttnTp>, DpLocal, Space> rows(u.x, full_rows);
  EpDispatchOptions o{.mode = mode,
                      .dtype = b.opts_.dispatch_dtype,
                      .global_num_tokens = run_opts.global_num_tokens,
                      .first_token = tensor_split_range(group_rows, widths().attn_tp, pg().coords().attn_tp_rank).begin +
                                     u.range.begin,
                      .tags = owners ? &u.owners : nullptr,
                      .check_route = b.opts_.check_route,
                      .indexed_batch = experts.reads_indexed(),
                      .traffic = traffic,
                      .refuse = refusal,
                      .refuse_counts = refusal_counts};
  u.pd.emplace(b.ep_->dispatch_start(exec, rows, r, o, site));
}

// Wait for the rows, run the experts on them; `other`: the micro-batch whose exchange is in
// flight meanwhile (polled between expert chunks).
template <class C, class T, class Space>
auto BridgeRun<C, T, Space>::finish_dispatch(Micro& u, Micro* other) -> void {
  u.h = b.ep_->dispatch_finish(exec, std::move(*u.pd));
  u.pd.reset();
  u.y = b.ep_->expert_outputs(u.h);
  const ExpertBatch<T, Space>& batch = u.h.batch();
  const int groups = batch.experts(), n = other ? std::min(b.opts_.two_batch_expert_chunks, groups) : 1;
  if (n <= 1) {
    experts(exec, batch, u.y);
    return;
  }
  for (int c = 0; c < n; ++c) {
    const int e0 = c * groups / n, e1 = (c + 1) * groups / n;
    const std::int64_t r0 = batch.offset(e0), r1 = batch.offset(e1);
    ExpertBatch<T, Space> part;
    if (batch.indexed) {
      part.x = batch.x;  // no rows; the index's slice says which
      part.indexed = true;
      part.source = batch.source;
      part.source_ld = batch.source_ld;
      part.index = Kokkos::subview(batch.index, Kokkos::make_pair(r0, r1));
    } else {
      part.x = impl::row_slice(batch.x, r0, r1 - r0);
    }
    part.first_expert = batch.first_expert + e0;
    if (!batch.logical.empty())
      part.logical.assign(batch.logical.begin() + e0, batch.logical.begin() + e1);
    for (int e = e0; e <= e1; ++e) part.offsets.push_back(batch.offset(e) - r0);
    experts(exec, part, impl::row_slice(u.y, r0, r1 - r0));
    if (c + 1 < n) poll(*other);
  }
}

// Wait for the outputs, sum them, add the shared expert's (in row chunks, polling `other`'s
// combine between them, when it is in flight).
template <class C, class T, class Space>
auto BridgeRun<C, T, Space>::finish_combine(Micro& u, Micro* other) -> void {
  u.combined = b.ep_->combine_finish(exec, std::move(*u.pc)).view();
  u.pc.reset();
  if (experts.has_shared()) {
    const int n = other ? b.opts_.two_batch_expert_chunks : 1;
    if (n <= 1) {
      experts.shared(exec, u.x, u.combined);
      return;
    }
    const std::int64_t rows = static_cast<std::int64_t>(u.x.extent(0));
    for (int c = 0; c < n; ++c) {
      const Range r = tensor_split_range(rows, n, c);
      experts.shared(exec, impl::row_slice(u.x, r.begin, r.count), impl::row_slice(u.combined, r.begin, r.count));
      if (c + 1 < n) poll(*other);
    }
  }
}

// One poll of the exchange `u` has in flight (it lets MPI progress it); the experts' work so
// far is fenced first, so a host backend has finished it.
template <class C, class T, class Space>
auto BridgeRun<C, T, Space>::poll(Micro& u) -> void {
  exec.fence();
  if (u.pd) u.pd->test();
  else if (u.pc) u.pc->test();
}

}  // namespace relayout::impl
