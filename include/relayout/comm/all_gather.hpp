// all_gather: rank i's send buffer lands in block i of every rank's recv buffer (equal blocks).
// Each form also takes an execution-space instance as its first argument (see all_reduce.hpp).
#pragma once

#include <string>

#include "relayout/comm/impl/args.hpp"

namespace relayout {

namespace impl {

template <class F, Communicator C, CommBuffer S, WritableBuffer R>
void all_gather_on(const F& fence, const C& comm, const S& send, R&& recv, std::source_location site) {
  RELAYOUT_SAME_ELEMENT_ASSERT(S, R);
  run_collective(fence, comm, CollectiveKind::all_gather, dtype_of<R>(), site, [&](auto& scope) {
    const auto in = read_span(fence, send, "send");
    const auto out = write_span(fence, recv, "recv");
    const auto n = static_cast<std::size_t>(comm.size());
    require_size(out.size(), in.size() * n, "recv", "all_gather: recv.size() == send.size() * group size");
    require_fits_int(in.size(), "send");
    require_disjoint(in, out, "all_gather");
    scope.call.count = static_cast<std::int64_t>(in.size());
    scope.agree();
    transfer<S, R>(fence, comm, in, out, [&] { comm.all_gather(in, out); });
  });
}

template <class F, Communicator C, WritableBuffer B>
void all_gather_in_place_on(const F& fence, const C& comm, B&& buf, std::source_location site) {
  run_collective(fence, comm, CollectiveKind::all_gather_in_place, dtype_of<B>(), site, [&](auto& scope) {
    const auto io = write_span(fence, buf, "buf");
    const auto n = static_cast<std::size_t>(comm.size());
    if (io.size() % n != 0)
      throw LayoutError("buf", "all_gather_in_place: buf has " + std::to_string(io.size()) +
                                   " elements, not a multiple of the group size " + std::to_string(n));
    require_fits_int(io.size() / n, "buf");
    scope.call.count = static_cast<std::int64_t>(io.size() / n);
    scope.agree();
    comm.all_gather_in_place(io);
  });
}

}  // namespace impl

template <Communicator C, CommBuffer S, WritableBuffer R>
void all_gather(const C& comm, const S& send, R&& recv, std::source_location site = std::source_location::current()) {
  impl::all_gather_on(impl::ViewSpaces{}, comm, send, recv, site);
}
template <ExecutionSpaceInstance E, Communicator C, CommBuffer S, WritableBuffer R>
void all_gather(const E& space, const C& comm, const S& send, R&& recv,
                std::source_location site = std::source_location::current()) {
  impl::all_gather_on(space, comm, send, recv, site);
}

// In place: buf holds group-size equal blocks; this rank's block is already at index rank().
template <Communicator C, WritableBuffer B>
void all_gather_in_place(const C& comm, B&& buf, std::source_location site = std::source_location::current()) {
  impl::all_gather_in_place_on(impl::ViewSpaces{}, comm, buf, site);
}
template <ExecutionSpaceInstance E, Communicator C, WritableBuffer B>
void all_gather_in_place(const E& space, const C& comm, B&& buf,
                         std::source_location site = std::source_location::current()) {
  impl::all_gather_in_place_on(space, comm, buf, site);
}

}  // namespace relayout
