// all_to_allv: this rank sends send_counts[j] elements (packed in rank order) to rank j and
// receives recv_counts[j] elements from rank j (packed in rank order). Each rank checks its own
// counts against its buffers; that rank j's send_counts[i] equals rank i's recv_counts[j] is
// checked pairwise by the collective agreement check when it is on (agreement.hpp), and is the
// caller's contract otherwise (exchange the counts with all_to_all first when unsure).
#pragma once

#include "relayout/comm/impl/args.hpp"

namespace relayout {

template <Communicator C, CommBuffer S, CountRange KS, WritableBuffer R, CountRange KR>
void all_to_allv(const C& comm, const S& send, const KS& send_counts, R&& recv,
                 const KR& recv_counts, std::source_location site = std::source_location::current()) {
  RELAYOUT_SAME_ELEMENT_ASSERT(S, R);
  impl::run_collective(comm, CollectiveKind::all_to_allv, impl::dtype_of<R>(), site, [&](auto& scope) {
    const auto in = impl::read_span(send, "send");
    const auto out = impl::write_span(recv, "recv");
    const auto sc = impl::checked_counts(send_counts, comm.size(), "send_counts");
    const auto rc = impl::checked_counts(recv_counts, comm.size(), "recv_counts");
    impl::require_size(in.size(), sc.total, "send", "all_to_allv: send.size() == sum(send_counts)");
    impl::require_size(out.size(), rc.total, "recv", "all_to_allv: recv.size() == sum(recv_counts)");
    impl::require_disjoint(in, out, "all_to_allv");
    scope.call.send_counts = sc.counts.span();
    scope.call.recv_counts = rc.counts.span();
    scope.agree();
    comm.all_to_allv(in, sc.counts.span(), sc.displs.span(), out, rc.counts.span(), rc.displs.span());
  });
}

}  // namespace relayout
