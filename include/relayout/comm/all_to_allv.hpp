// all_to_allv: this rank sends send_counts[j] elements (packed in rank order) to rank j and
// receives recv_counts[j] elements from rank j (packed in rank order). Each rank checks its own
// counts against its buffers; that rank j's send_counts[i] equals rank i's recv_counts[j] is
// checked pairwise by the collective agreement check when it is on (agreement.hpp), and is the
// caller's contract otherwise (exchange the counts with all_to_all first when unsure); on one rank
// it is always checked. Also with an execution-space instance as the first argument (see
// all_reduce.hpp).
//
// all_to_allv_start is the nonblocking form (request.hpp): the same checks and agreement when it
// starts, a CollectiveRequest to test or wait on; the counts are kept by the request and the
// buffers must stay untouched until it completes.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "relayout/comm/impl/args.hpp"
#include "relayout/comm/request.hpp"

namespace relayout {

namespace impl {

template <class F, Communicator C, CommBuffer S, CountRange KS, WritableBuffer R, CountRange KR>
CollectiveRequest all_to_allv_on(const F& fence, const C& comm, const S& send, const KS& send_counts, R&& recv,
                                 const KR& recv_counts, std::source_location site, bool start = false) {
  RELAYOUT_SAME_ELEMENT_ASSERT(S, R);
  CollectiveRequest request;
  run_collective(fence, comm, CollectiveKind::all_to_allv, dtype_of<R>(), site, [&](auto& scope) {
    const auto in = read_span(fence, send, "send");
    const auto out = write_span(fence, recv, "recv");
    auto sc = checked_counts(send_counts, comm.size(), "send_counts");
    auto rc = checked_counts(recv_counts, comm.size(), "recv_counts");
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
    using E = std::remove_const_t<buffer_element_t<R>>;
    if constexpr (NonblockingAllToAllv<C, E>) {
      if (start) {
        auto held = std::make_shared<Held<CheckedCounts, S, R>>(std::move(sc), std::move(rc), send, recv);
        const CheckedCounts& s2 = std::get<0>(held->counts);
        const CheckedCounts& r2 = std::get<1>(held->counts);
        request = comm.start_all_to_allv(in, s2.counts.span(), s2.displs.span(), out, r2.counts.span(), r2.displs.span());
        request.keep(std::move(held));
        return;
      }
    }
    transfer<S, R>(fence, comm, in, out, [&] {
      comm.all_to_allv(in, sc.counts.span(), sc.displs.span(), out, rc.counts.span(), rc.displs.span());
    });
  });
  return request;
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

// The nonblocking form: starts the exchange and returns its request (wait() before reading recv or
// writing send). The caller's instance is fenced first, as for the blocking call.
template <ExecutionSpaceInstance E, Communicator C, CommBuffer S, CountRange KS, WritableBuffer R, CountRange KR>
[[nodiscard]] CollectiveRequest all_to_allv_start(const E& space, const C& comm, const S& send, const KS& send_counts,
                                                  R&& recv, const KR& recv_counts,
                                                  std::source_location site = std::source_location::current()) {
  return impl::all_to_allv_on(space, comm, send, send_counts, recv, recv_counts, site, true);
}

}  // namespace relayout
