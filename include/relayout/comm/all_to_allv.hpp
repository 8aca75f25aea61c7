// all_to_allv: this rank sends send_counts[j] elements (packed in rank order) to rank j and
// receives recv_counts[j] elements from rank j (packed in rank order). Each rank checks its own
// counts against its buffers; that rank j's send_counts[i] equals rank i's recv_counts[j] is
// checked pairwise by the collective agreement check when it is on (agreement.hpp), and is the
// caller's contract otherwise (exchange the counts with all_to_all first when unsure); on one rank
// it is always checked. Also with an execution-space instance as the first argument (see
// all_reduce.hpp).
#pragma once

#include <string>

#include "relayout/comm/impl/args.hpp"

namespace relayout {

namespace impl {

template <class F, Communicator C, CommBuffer S, CountRange KS, WritableBuffer R, CountRange KR>
void all_to_allv_on(const F& fence, const C& comm, const S& send, const KS& send_counts, R&& recv,
                    const KR& recv_counts, std::source_location site) {
  RELAYOUT_SAME_ELEMENT_ASSERT(S, R);
  run_collective(fence, comm, CollectiveKind::all_to_allv, dtype_of<R>(), site, [&](auto& scope) {
    const auto in = read_span(fence, send, "send");
    const auto out = write_span(fence, recv, "recv");
    const auto sc = checked_counts(send_counts, comm.size(), "send_counts");
    const auto rc = checked_counts(recv_counts, comm.size(), "recv_counts");
    require_size(in.size(), sc.total, "send", "all_to_allv: send.size() == sum(send_counts)");
    require_size(out.size(), rc.total, "recv", "all_to_allv: recv.size() == sum(recv_counts)");
    if (comm.size() == 1 && rc.total != sc.total)
      throw LayoutError("recv_counts", "all_to_allv on one rank: recv_counts[0] = " + std::to_string(rc.total) +
                                           " but send_counts[0] = " + std::to_string(sc.total) +
                                           "; a rank that is its own peer receives what it sends");
    require_disjoint(in, out, "all_to_allv");
    scope.call.send_counts = sc.counts.span();
    scope.call.recv_counts = rc.counts.span();
    scope.agree();
    transfer<S, R>(fence, comm, in, out, [&] {
      comm.all_to_allv(in, sc.counts.span(), sc.displs.span(), out, rc.counts.span(), rc.displs.span());
    });
  });
}

}  // namespace impl

template <Communicator C, CommBuffer S, CountRange KS, WritableBuffer R, CountRange KR>
void all_to_allv(const C& comm, const S& send, const KS& send_counts, R&& recv, const KR& recv_counts,
                 std::source_location site = std::source_location::current()) {
  impl::all_to_allv_on(impl::ViewSpaces{}, comm, send, send_counts, recv, recv_counts, site);
}
template <ExecutionSpaceInstance E, Communicator C, CommBuffer S, CountRange KS, WritableBuffer R, CountRange KR>
void all_to_allv(const E& space, const C& comm, const S& send, const KS& send_counts, R&& recv,
                 const KR& recv_counts, std::source_location site = std::source_location::current()) {
  impl::all_to_allv_on(space, comm, send, send_counts, recv, recv_counts, site);
}

}  // namespace relayout
