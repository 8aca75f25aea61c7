// all_reduce: every rank receives the element-wise reduction of every rank's send buffer.
#pragma once

#include "relayout/comm/impl/args.hpp"

namespace relayout {

template <Communicator C, CommBuffer S, WritableBuffer R>
void all_reduce(const C& comm, const S& send, R&& recv, ReduceOp op = ReduceOp::sum,
                std::source_location site = std::source_location::current()) {
  RELAYOUT_SAME_ELEMENT_ASSERT(S, R);
  impl::run_collective(comm, CollectiveKind::all_reduce, impl::dtype_of<R>(), site, [&](auto& scope) {
    const auto in = impl::read_span(send, "send");
    const auto out = impl::write_span(recv, "recv");
    impl::require_size(out.size(), in.size(), "recv", "all_reduce: recv.size() == send.size()");
    impl::require_fits_int(in.size(), "send");
    impl::require_disjoint(in, out, "all_reduce");
    scope.call.count = static_cast<std::int64_t>(in.size());
    scope.call.reduce_op = static_cast<int>(op);
    scope.agree();
    comm.all_reduce(in, out, op);
  });
}

template <Communicator C, WritableBuffer B>
void all_reduce_in_place(const C& comm, B&& buf, ReduceOp op = ReduceOp::sum,
                         std::source_location site = std::source_location::current()) {
  impl::run_collective(comm, CollectiveKind::all_reduce_in_place, impl::dtype_of<B>(), site, [&](auto& scope) {
    const auto io = impl::write_span(buf, "buf");
    impl::require_fits_int(io.size(), "buf");
    scope.call.count = static_cast<std::int64_t>(io.size());
    scope.call.reduce_op = static_cast<int>(op);
    scope.agree();
    comm.all_reduce_in_place(io, op);
  });
}

}  // namespace relayout
