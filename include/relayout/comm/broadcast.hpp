// broadcast from a group-local root: `root` is a rank of this communicator, not a world rank.
#pragma once

#include "relayout/comm/impl/args.hpp"

namespace relayout {

template <Communicator C, WritableBuffer B>
void broadcast(const C& comm, B&& buf, int root,
               std::source_location site = std::source_location::current()) {
  impl::run_collective(comm, CollectiveKind::broadcast, impl::dtype_of<B>(), site, [&](auto& scope) {
    const auto io = impl::write_span(buf, "buf");
    impl::require_root(root, comm.size());
    impl::require_fits_int(io.size(), "buf");
    scope.call.count = static_cast<std::int64_t>(io.size());
    scope.call.root = root;
    scope.agree();
    comm.broadcast(io, root);
  });
}

}  // namespace relayout
