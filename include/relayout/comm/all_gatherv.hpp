// all_gatherv: rank i contributes counts[i] elements; recv holds them packed in rank order.
// Each form also takes an execution-space instance as its first argument (see all_reduce.hpp).
#pragma once

#include <string>

#include "relayout/comm/impl/args.hpp"

namespace relayout {

namespace impl {

template <class F, Communicator C, CommBuffer S, WritableBuffer R, CountRange K>
void all_gatherv_on(const F& fence, const C& comm, const S& send, R&& recv, const K& counts,
                    std::source_location site) {
  RELAYOUT_SAME_ELEMENT_ASSERT(S, R);
  run_collective(fence, comm, CollectiveKind::all_gatherv, dtype_of<R>(), site, [&](auto& scope) {
    const auto in = read_span(fence, send, "send");
    const auto out = write_span(fence, recv, "recv");
    const auto c = checked_counts(counts, comm.size(), "counts");
    const auto me = static_cast<std::size_t>(comm.rank());
    require_size(in.size(), static_cast<std::size_t>(c.counts[me]), "send", "all_gatherv: send.size() == counts[rank]");
    require_size(out.size(), c.total, "recv", "all_gatherv: recv.size() == sum(counts)");
    require_disjoint(in, out, "all_gatherv");
    scope.call.counts = c.counts.span();
    scope.agree();
    transfer<S, R>(fence, comm, in, out, [&] { comm.all_gatherv(in, out, c.counts.span(), c.displs.span()); });
  });
}

template <class F, Communicator C, WritableBuffer B, CountRange K>
void all_gatherv_in_place_on(const F& fence, const C& comm, B&& buf, const K& counts, std::source_location site) {
  run_collective(fence, comm, CollectiveKind::all_gatherv_in_place, dtype_of<B>(), site, [&](auto& scope) {
    const auto io = write_span(fence, buf, "buf");
    const auto c = checked_counts(counts, comm.size(), "counts");
    require_size(io.size(), c.total, "buf", "all_gatherv_in_place: buf.size() == sum(counts)");
    scope.call.counts = c.counts.span();
    scope.agree();
    comm.all_gatherv_in_place(io, c.counts.span(), c.displs.span());
  });
}

}  // namespace impl

template <Communicator C, CommBuffer S, WritableBuffer R, CountRange K>
void all_gatherv(const C& comm, const S& send, R&& recv, const K& counts,
                 std::source_location site = std::source_location::current()) {
  impl::all_gatherv_on(impl::ViewSpaces{}, comm, send, recv, counts, site);
}
template <ExecutionSpaceInstance E, Communicator C, CommBuffer S, WritableBuffer R, CountRange K>
void all_gatherv(const E& space, const C& comm, const S& send, R&& recv, const K& counts,
                 std::source_location site = std::source_location::current()) {
  impl::all_gatherv_on(space, comm, send, recv, counts, site);
}

// In place: buf holds sum(counts) elements; this rank's part is already at its packed offset.
template <Communicator C, WritableBuffer B, CountRange K>
void all_gatherv_in_place(const C& comm, B&& buf, const K& counts,
                          std::source_location site = std::source_location::current()) {
  impl::all_gatherv_in_place_on(impl::ViewSpaces{}, comm, buf, counts, site);
}
template <ExecutionSpaceInstance E, Communicator C, WritableBuffer B, CountRange K>
void all_gatherv_in_place(const E& space, const C& comm, B&& buf, const K& counts,
                          std::source_location site = std::source_location::current()) {
  impl::all_gatherv_in_place_on(space, comm, buf, counts, site);
}

}  // namespace relayout
