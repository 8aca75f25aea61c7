// reduce_scatterv: the element-wise reduction of every rank's send buffer (sum(counts) elements);
// rank i keeps the counts[i] elements at its packed offset.
#pragma once

#include <string>

#include "relayout/comm/impl/args.hpp"

namespace relayout {

template <Communicator C, CommBuffer S, WritableBuffer R, CountRange K>
void reduce_scatterv(const C& comm, const S& send, R&& recv, const K& counts,
                     ReduceOp op = ReduceOp::sum,
                     std::source_location site = std::source_location::current()) {
  RELAYOUT_SAME_ELEMENT_ASSERT(S, R);
  impl::run_collective(comm, CollectiveKind::reduce_scatterv, impl::dtype_of<R>(), site, [&](auto& scope) {
    const auto in = impl::read_span(send, "send");
    const auto out = impl::write_span(recv, "recv");
    const auto c = impl::checked_counts(counts, comm.size(), "counts");
    const auto me = static_cast<std::size_t>(comm.rank());
    impl::require_size(in.size(), c.total, "send", "reduce_scatterv: send.size() == sum(counts)");
    impl::require_size(out.size(), static_cast<std::size_t>(c.counts[me]), "recv",
                       "reduce_scatterv: recv.size() == counts[rank]");
    impl::require_disjoint(in, out, "reduce_scatterv");
    scope.call.counts = c.counts.span();
    scope.call.reduce_op = static_cast<int>(op);
    scope.agree();
    comm.reduce_scatterv(in, out, c.counts.span(), op);
  });
}

}  // namespace relayout
