// all_to_all: block j of rank i's send buffer becomes block i of rank j's recv buffer (equal blocks).
// Each form also takes an execution-space instance as its first argument (see all_reduce.hpp).
// all_to_all_start is the nonblocking form (request.hpp), checked and agreed when it starts.
#pragma once

#include <memory>
#include <string>

#include "relayout/comm/impl/args.hpp"
#include "relayout/comm/request.hpp"

namespace relayout {

namespace impl {

inline void require_blocks(std::size_t size, std::size_t n, const char* what, const char* call) {
  if (size % n != 0)
    throw LayoutError(what, std::string(call) + ": " + what + " has " + std::to_string(size) +
                                " elements, not a multiple of the group size " + std::to_string(n));
}

template <class F, Communicator C, CommBuffer S, WritableBuffer R>
CollectiveRequest all_to_all_on(const F& fence, const C& comm, const S& send, R&& recv, std::source_location site,
                                bool start = false) {
  RELAYOUT_SAME_ELEMENT_ASSERT(S, R);
  CollectiveRequest request;
  run_collective(fence, comm, CollectiveKind::all_to_all, dtype_of<R>(), site, [&](auto& scope) {
    const auto in = read_span(fence, send, "send");
    const auto out = write_span(fence, recv, "recv");
    const auto n = static_cast<std::size_t>(comm.size());
    require_size(out.size(), in.size(), "recv", "all_to_all: recv.size() == send.size()");
    require_blocks(in.size(), n, "send", "all_to_all");
    require_fits_int(in.size() / n, "send");
    require_disjoint(in, out, "all_to_all");
    scope.call.count = static_cast<std::int64_t>(in.size() / n);
    scope.agree();
    using E = std::remove_const_t<buffer_element_t<R>>;
    if constexpr (NonblockingAllToAll<C, E>) {
      if (start) {
        request = comm.start_all_to_all(in, out);
        request.keep(std::make_shared<Held<int, S, R>>(0, 0, send, recv));
        return;
      }
    }
    transfer<S, R>(fence, comm, in, out, [&] { comm.all_to_all(in, out); });
  });
  return request;
}

template <class F, Communicator C, WritableBuffer B>
void all_to_all_in_place_on(const F& fence, const C& comm, B&& buf, std::source_location site) {
  run_collective(fence, comm, CollectiveKind::all_to_all_in_place, dtype_of<B>(), site, [&](auto& scope) {
    const auto io = write_span(fence, buf, "buf");
    const auto n = static_cast<std::size_t>(comm.size());
    require_blocks(io.size(), n, "buf", "all_to_all_in_place");
    require_fits_int(io.size() / n, "buf");
    scope.call.count = static_cast<std::int64_t>(io.size() / n);
    scope.agree();
    comm.all_to_all_in_place(io);
  });
}

}  // namespace impl

template <Communicator C, CommBuffer S, WritableBuffer R>
void all_to_all(const C& comm, const S& send, R&& recv, std::source_location site = std::source_location::current()) {
  impl::all_to_all_on(impl::ViewSpaces{}, comm, send, recv, site);
}
template <ExecutionSpaceInstance E, Communicator C, CommBuffer S, WritableBuffer R>
void all_to_all(const E& space, const C& comm, const S& send, R&& recv,
                std::source_location site = std::source_location::current()) {
  impl::all_to_all_on(space, comm, send, recv, site);
}

// The nonblocking form: starts the exchange and returns its request (wait() before reading recv or
// writing send). The caller's instance is fenced first, as for the blocking call.
template <ExecutionSpaceInstance E, Communicator C, CommBuffer S, WritableBuffer R>
[[nodiscard]] CollectiveRequest all_to_all_start(const E& space, const C& comm, const S& send, R&& recv,
                                                 std::source_location site = std::source_location::current()) {
  return impl::all_to_all_on(space, comm, send, recv, site, true);
}

template <Communicator C, WritableBuffer B>
void all_to_all_in_place(const C& comm, B&& buf, std::source_location site = std::source_location::current()) {
  impl::all_to_all_in_place_on(impl::ViewSpaces{}, comm, buf, site);
}
template <ExecutionSpaceInstance E, Communicator C, WritableBuffer B>
void all_to_all_in_place(const E& space, const C& comm, B&& buf,
                         std::source_location site = std::source_location::current()) {
  impl::all_to_all_in_place_on(space, comm, buf, site);
}

}  // namespace relayout
