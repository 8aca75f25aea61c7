// all_gatherv: rank i contributes counts[i] elements; recv holds them packed in rank order.
#pragma once

#include <string>

#include "relayout/comm/impl/args.hpp"

namespace relayout {

template <Communicator C, CommBuffer S, WritableBuffer R, CountRange K>
void all_gatherv(const C& comm, const S& send, R&& recv, const K& counts,
                 std::source_location site = std::source_location::current()) {
  RELAYOUT_SAME_ELEMENT_ASSERT(S, R);
  impl::run_collective(comm, CollectiveKind::all_gatherv, impl::dtype_of<R>(), site, [&](auto& scope) {
    const auto in = impl::read_span(send, "send");
    const auto out = impl::write_span(recv, "recv");
    const auto c = impl::checked_counts(counts, comm.size(), "counts");
    const auto me = static_cast<std::size_t>(comm.rank());
    impl::require_size(in.size(), static_cast<std::size_t>(c.counts[me]), "send",
                       "all_gatherv: send.size() == counts[rank]");
    impl::require_size(out.size(), c.total, "recv", "all_gatherv: recv.size() == sum(counts)");
    impl::require_disjoint(in, out, "all_gatherv");
    scope.call.counts = c.counts.span();
    scope.agree();
    comm.all_gatherv(in, out, c.counts.span(), c.displs.span());
  });
}

// In place: buf holds sum(counts) elements; this rank's part is already at its packed offset.
template <Communicator C, WritableBuffer B, CountRange K>
void all_gatherv_in_place(const C& comm, B&& buf, const K& counts,
                          std::source_location site = std::source_location::current()) {
  impl::run_collective(comm, CollectiveKind::all_gatherv_in_place, impl::dtype_of<B>(), site, [&](auto& scope) {
    const auto io = impl::write_span(buf, "buf");
    const auto c = impl::checked_counts(counts, comm.size(), "counts");
    impl::require_size(io.size(), c.total, "buf", "all_gatherv_in_place: buf.size() == sum(counts)");
    scope.call.counts = c.counts.span();
    scope.agree();
    comm.all_gatherv_in_place(io, c.counts.span(), c.displs.span());
  });
}

}  // namespace relayout
