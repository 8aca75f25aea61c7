// reduce_scatterv: the element-wise reduction of every rank's send buffer (sum(counts) elements);
// rank i keeps the counts[i] elements at its packed offset. Also with an execution-space instance
// as the first argument (see all_reduce.hpp).
#pragma once

#include <string>

#include "relayout/comm/impl/args.hpp"

namespace relayout {

namespace impl {

template <class F, Communicator C, CommBuffer S, WritableBuffer R, CountRange K>
void reduce_scatterv_on(const F& fence, const C& comm, const S& send, R&& recv, const K& counts, ReduceOp op,
                        std::source_location site) {
  RELAYOUT_SAME_ELEMENT_ASSERT(S, R);
  run_collective(fence, comm, CollectiveKind::reduce_scatterv, dtype_of<R>(), site, [&](auto& scope) {
    const auto in = read_span(fence, send, "send");
    const auto out = write_span(fence, recv, "recv");
    const auto c = checked_counts(counts, comm.size(), "counts");
    const auto me = static_cast<std::size_t>(comm.rank());
    require_size(in.size(), c.total, "send", "reduce_scatterv: send.size() == sum(counts)");
    require_size(out.size(), static_cast<std::size_t>(c.counts[me]), "recv", "reduce_scatterv: recv.size() == counts[rank]");
    require_disjoint(in, out, "reduce_scatterv");
    scope.call.counts = c.counts.span();
    scope.call.reduce_op = static_cast<int>(op);
    scope.agree();
    transfer<S, R>(fence, comm, in, out, [&] { comm.reduce_scatterv(in, out, c.counts.span(), op); });
  });
}

}  // namespace impl

template <Communicator C, CommBuffer S, WritableBuffer R, CountRange K>
void reduce_scatterv(const C& comm, const S& send, R&& recv, const K& counts, ReduceOp op = ReduceOp::sum,
                     std::source_location site = std::source_location::current()) {
  impl::reduce_scatterv_on(impl::ViewSpaces{}, comm, send, recv, counts, op, site);
}
template <ExecutionSpaceInstance E, Communicator C, CommBuffer S, WritableBuffer R, CountRange K>
void reduce_scatterv(const E& space, const C& comm, const S& send, R&& recv, const K& counts,
                     ReduceOp op = ReduceOp::sum, std::source_location site = std::source_location::current()) {
  impl::reduce_scatterv_on(space, comm, send, recv, counts, op, site);
}

}  // namespace relayout
