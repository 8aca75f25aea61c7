// all_reduce: every rank receives the element-wise reduction of every rank's send buffer.
// Every collective has two forms: without an execution-space instance (Views are fenced on their
// execution space) and with one as the first argument, which is fenced, alone, before the
// communication library touches the buffers (kokkos-comm's convention). Both check the same
// things and report the same call site.
#pragma once

#include "relayout/comm/impl/args.hpp"

namespace relayout {

namespace impl {

template <class F, Communicator C, CommBuffer S, WritableBuffer R>
void all_reduce_on(const F& fence, const C& comm, const S& send, R&& recv, ReduceOp op, std::source_location site) {
  RELAYOUT_SAME_ELEMENT_ASSERT(S, R);
  run_collective(fence, comm, CollectiveKind::all_reduce, dtype_of<R>(), site, [&](auto& scope) {
    const auto in = read_span(fence, send, "send");
    const auto out = write_span(fence, recv, "recv");
    require_size(out.size(), in.size(), "recv", "all_reduce: recv.size() == send.size()");
    require_fits_int(in.size(), "send");
    require_disjoint(in, out, "all_reduce");
    scope.call.count = static_cast<std::int64_t>(in.size());
    scope.call.reduce_op = static_cast<int>(op);
    scope.agree();
    transfer<S, R>(fence, comm, in, out, [&] { comm.all_reduce(in, out, op); });
  });
}

template <class F, Communicator C, WritableBuffer B>
void all_reduce_in_place_on(const F& fence, const C& comm, B&& buf, ReduceOp op, std::source_location site) {
  run_collective(fence, comm, CollectiveKind::all_reduce_in_place, dtype_of<B>(), site, [&](auto& scope) {
    const auto io = write_span(fence, buf, "buf");
    require_fits_int(io.size(), "buf");
    scope.call.count = static_cast<std::int64_t>(io.size());
    scope.call.reduce_op = static_cast<int>(op);
    scope.agree();
    comm.all_reduce_in_place(io, op);
  });
}

}  // namespace impl

template <Communicator C, CommBuffer S, WritableBuffer R>
void all_reduce(const C& comm, const S& send, R&& recv, ReduceOp op = ReduceOp::sum,
                std::source_location site = std::source_location::current()) {
  impl::all_reduce_on(impl::ViewSpaces{}, comm, send, recv, op, site);
}
template <ExecutionSpaceInstance E, Communicator C, CommBuffer S, WritableBuffer R>
void all_reduce(const E& space, const C& comm, const S& send, R&& recv, ReduceOp op = ReduceOp::sum,
                std::source_location site = std::source_location::current()) {
  impl::all_reduce_on(space, comm, send, recv, op, site);
}

template <Communicator C, WritableBuffer B>
void all_reduce_in_place(const C& comm, B&& buf, ReduceOp op = ReduceOp::sum,
                         std::source_location site = std::source_location::current()) {
  impl::all_reduce_in_place_on(impl::ViewSpaces{}, comm, buf, op, site);
}
template <ExecutionSpaceInstance E, Communicator C, WritableBuffer B>
void all_reduce_in_place(const E& space, const C& comm, B&& buf, ReduceOp op = ReduceOp::sum,
                         std::source_location site = std::source_location::current()) {
  impl::all_reduce_in_place_on(space, comm, buf, op, site);
}

}  // namespace relayout
