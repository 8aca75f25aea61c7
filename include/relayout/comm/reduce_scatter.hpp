// reduce_scatter: the element-wise reduction of every rank's send buffer, split into equal blocks;
// rank i keeps block i. Each form also takes an execution-space instance as its first argument
// (see all_reduce.hpp).
#pragma once

#include <string>

#include "relayout/comm/impl/args.hpp"

namespace relayout {

namespace impl {

template <class F, Communicator C, CommBuffer S, WritableBuffer R>
void reduce_scatter_on(const F& fence, const C& comm, const S& send, R&& recv, ReduceOp op, std::source_location site) {
  RELAYOUT_SAME_ELEMENT_ASSERT(S, R);
  run_collective(fence, comm, CollectiveKind::reduce_scatter, dtype_of<R>(), site, [&](auto& scope) {
    const auto in = read_span(fence, send, "send");
    const auto out = write_span(fence, recv, "recv");
    const auto n = static_cast<std::size_t>(comm.size());
    require_size(in.size(), out.size() * n, "send", "reduce_scatter: send.size() == recv.size() * group size");
    require_fits_int(out.size(), "recv");
    require_disjoint(in, out, "reduce_scatter");
    scope.call.count = static_cast<std::int64_t>(out.size());
    scope.call.reduce_op = static_cast<int>(op);
    scope.agree();
    transfer<S, R>(fence, comm, in, out, [&] { comm.reduce_scatter(in, out, op); });
  });
}

template <class F, Communicator C, WritableBuffer B>
void reduce_scatter_in_place_on(const F& fence, const C& comm, B&& buf, ReduceOp op, std::source_location site) {
  run_collective(fence, comm, CollectiveKind::reduce_scatter_in_place, dtype_of<B>(), site, [&](auto& scope) {
    const auto io = write_span(fence, buf, "buf");
    const auto n = static_cast<std::size_t>(comm.size());
    if (io.size() % n != 0)
      throw LayoutError("buf", "reduce_scatter_in_place: buf has " + std::to_string(io.size()) +
                                   " elements, not a multiple of the group size " + std::to_string(n));
    require_fits_int(io.size() / n, "buf");
    scope.call.count = static_cast<std::int64_t>(io.size() / n);
    scope.call.reduce_op = static_cast<int>(op);
    scope.agree();
    comm.reduce_scatter_in_place(io, op);
  });
}

}  // namespace impl

template <Communicator C, CommBuffer S, WritableBuffer R>
void reduce_scatter(const C& comm, const S& send, R&& recv, ReduceOp op = ReduceOp::sum,
                    std::source_location site = std::source_location::current()) {
  impl::reduce_scatter_on(impl::ViewSpaces{}, comm, send, recv, op, site);
}
template <ExecutionSpaceInstance E, Communicator C, CommBuffer S, WritableBuffer R>
void reduce_scatter(const E& space, const C& comm, const S& send, R&& recv, ReduceOp op = ReduceOp::sum,
                    std::source_location site = std::source_location::current()) {
  impl::reduce_scatter_on(space, comm, send, recv, op, site);
}

// In place: buf holds group-size equal blocks; this rank's reduced block ends up at the start of
// buf (MPI_IN_PLACE semantics), the rest is unspecified.
template <Communicator C, WritableBuffer B>
void reduce_scatter_in_place(const C& comm, B&& buf, ReduceOp op = ReduceOp::sum,
                             std::source_location site = std::source_location::current()) {
  impl::reduce_scatter_in_place_on(impl::ViewSpaces{}, comm, buf, op, site);
}
template <ExecutionSpaceInstance E, Communicator C, WritableBuffer B>
void reduce_scatter_in_place(const E& space, const C& comm, B&& buf, ReduceOp op = ReduceOp::sum,
                             std::source_location site = std::source_location::current()) {
  impl::reduce_scatter_in_place_on(space, comm, buf, op, site);
}

}  // namespace relayout
