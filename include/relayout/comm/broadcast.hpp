// broadcast from a group-local root: `root` is a rank of this communicator, not a world rank.
// Also with an execution-space instance as the first argument (see all_reduce.hpp).
#pragma once

#include "relayout/comm/impl/args.hpp"

namespace relayout {

namespace impl {

template <class F, Communicator C, WritableBuffer B>
void broadcast_on(const F& fence, const C& comm, B&& buf, int root, std::source_location site) {
  run_collective(fence, comm, CollectiveKind::broadcast, dtype_of<B>(), site, [&](auto& scope) {
    const auto io = write_span(fence, buf, "buf");
    require_root(root, comm.size());
    require_fits_int(io.size(), "buf");
    scope.call.count = static_cast<std::int64_t>(io.size());
    scope.call.root = root;
    scope.agree();
    comm.broadcast(io, root);
  });
}

}  // namespace impl

template <Communicator C, WritableBuffer B>
void broadcast(const C& comm, B&& buf, int root, std::source_location site = std::source_location::current()) {
  impl::broadcast_on(impl::ViewSpaces{}, comm, buf, root, site);
}
template <ExecutionSpaceInstance E, Communicator C, WritableBuffer B>
void broadcast(const E& space, const C& comm, B&& buf, int root,
               std::source_location site = std::source_location::current()) {
  impl::broadcast_on(space, comm, buf, root, site);
}

}  // namespace relayout
