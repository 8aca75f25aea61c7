// all_gather: rank i's send buffer lands in block i of every rank's recv buffer (equal blocks).
#pragma once

#include <string>

#include "relayout/comm/impl/args.hpp"

namespace relayout {

template <Communicator C, CommBuffer S, WritableBuffer R>
void all_gather(const C& comm, const S& send, R&& recv,
                std::source_location site = std::source_location::current()) {
  RELAYOUT_SAME_ELEMENT_ASSERT(S, R);
  impl::run_collective(comm, CollectiveKind::all_gather, impl::dtype_of<R>(), site, [&](auto& scope) {
    const auto in = impl::read_span(send, "send");
    const auto out = impl::write_span(recv, "recv");
    const auto n = static_cast<std::size_t>(comm.size());
    impl::require_size(out.size(), in.size() * n, "recv",
                       "all_gather: recv.size() == send.size() * group size");
    impl::require_fits_int(in.size(), "send");
    impl::require_disjoint(in, out, "all_gather");
    scope.call.count = static_cast<std::int64_t>(in.size());
    scope.agree();
    comm.all_gather(in, out);
  });
}

// In place: buf holds group-size equal blocks; this rank's block is already at index rank().
template <Communicator C, WritableBuffer B>
void all_gather_in_place(const C& comm, B&& buf,
                         std::source_location site = std::source_location::current()) {
  impl::run_collective(comm, CollectiveKind::all_gather_in_place, impl::dtype_of<B>(), site, [&](auto& scope) {
    const auto io = impl::write_span(buf, "buf");
    const auto n = static_cast<std::size_t>(comm.size());
    if (io.size() % n != 0)
      throw LayoutError("buf", "all_gather_in_place: buf has " + std::to_string(io.size()) +
                                   " elements, not a multiple of the group size " + std::to_string(n));
    impl::require_fits_int(io.size() / n, "buf");
    scope.call.count = static_cast<std::int64_t>(io.size() / n);
    scope.agree();
    comm.all_gather_in_place(io);
  });
}

}  // namespace relayout
