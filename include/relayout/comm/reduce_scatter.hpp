// reduce_scatter: the element-wise reduction of every rank's send buffer, split into equal blocks;
// rank i keeps block i.
#pragma once

#include <string>

#include "relayout/comm/impl/args.hpp"

namespace relayout {

template <Communicator C, CommBuffer S, WritableBuffer R>
void reduce_scatter(const C& comm, const S& send, R&& recv, ReduceOp op = ReduceOp::sum,
                    std::source_location site = std::source_location::current()) {
  RELAYOUT_SAME_ELEMENT_ASSERT(S, R);
  impl::run_collective(comm, CollectiveKind::reduce_scatter, impl::dtype_of<R>(), site, [&](auto& scope) {
    const auto in = impl::read_span(send, "send");
    const auto out = impl::write_span(recv, "recv");
    const auto n = static_cast<std::size_t>(comm.size());
    impl::require_size(in.size(), out.size() * n, "send",
                       "reduce_scatter: send.size() == recv.size() * group size");
    impl::require_fits_int(out.size(), "recv");
    impl::require_disjoint(in, out, "reduce_scatter");
    scope.call.count = static_cast<std::int64_t>(out.size());
    scope.call.reduce_op = static_cast<int>(op);
    scope.agree();
    comm.reduce_scatter(in, out, op);
  });
}

// In place: buf holds group-size equal blocks; this rank's reduced block ends up at the start of
// buf (MPI_IN_PLACE semantics), the rest is unspecified.
template <Communicator C, WritableBuffer B>
void reduce_scatter_in_place(const C& comm, B&& buf, ReduceOp op = ReduceOp::sum,
                             std::source_location site = std::source_location::current()) {
  impl::run_collective(comm, CollectiveKind::reduce_scatter_in_place, impl::dtype_of<B>(), site, [&](auto& scope) {
    const auto io = impl::write_span(buf, "buf");
    const auto n = static_cast<std::size_t>(comm.size());
    if (io.size() % n != 0)
      throw LayoutError("buf", "reduce_scatter_in_place: buf has " + std::to_string(io.size()) +
                                   " elements, not a multiple of the group size " + std::to_string(n));
    impl::require_fits_int(io.size() / n, "buf");
    scope.call.count = static_cast<std::int64_t>(io.size() / n);
    scope.call.reduce_op = static_cast<int>(op);
    scope.agree();
    comm.reduce_scatter_in_place(io, op);
  });
}

}  // namespace relayout
