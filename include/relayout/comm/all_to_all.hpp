// all_to_all: block j of rank i's send buffer becomes block i of rank j's recv buffer (equal blocks).
#pragma once

#include <string>

#include "relayout/comm/impl/args.hpp"

namespace relayout {

namespace impl {
inline void require_blocks(std::size_t size, std::size_t n, const char* what, const char* call) {
  if (size % n != 0)
    throw LayoutError(what, std::string(call) + ": " + what + " has " + std::to_string(size) +
                                " elements, not a multiple of the group size " + std::to_string(n));
}
}  // namespace impl

template <Communicator C, CommBuffer S, WritableBuffer R>
void all_to_all(const C& comm, const S& send, R&& recv,
                std::source_location site = std::source_location::current()) {
  RELAYOUT_SAME_ELEMENT_ASSERT(S, R);
  impl::run_collective(comm, CollectiveKind::all_to_all, impl::dtype_of<R>(), site, [&](auto& scope) {
    const auto in = impl::read_span(send, "send");
    const auto out = impl::write_span(recv, "recv");
    const auto n = static_cast<std::size_t>(comm.size());
    impl::require_size(out.size(), in.size(), "recv", "all_to_all: recv.size() == send.size()");
    impl::require_blocks(in.size(), n, "send", "all_to_all");
    impl::require_fits_int(in.size() / n, "send");
    impl::require_disjoint(in, out, "all_to_all");
    scope.call.count = static_cast<std::int64_t>(in.size() / n);
    scope.agree();
    comm.all_to_all(in, out);
  });
}

template <Communicator C, WritableBuffer B>
void all_to_all_in_place(const C& comm, B&& buf,
                         std::source_location site = std::source_location::current()) {
  impl::run_collective(comm, CollectiveKind::all_to_all_in_place, impl::dtype_of<B>(), site, [&](auto& scope) {
    const auto io = impl::write_span(buf, "buf");
    const auto n = static_cast<std::size_t>(comm.size());
    impl::require_blocks(io.size(), n, "buf", "all_to_all_in_place");
    impl::require_fits_int(io.size() / n, "buf");
    scope.call.count = static_cast<std::int64_t>(io.size() / n);
    scope.agree();
    comm.all_to_all_in_place(io);
  });
}

}  // namespace relayout
