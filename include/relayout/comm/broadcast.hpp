// broadcast from a group-local root: `root` is a rank of this communicator, not a world rank.
#pragma once

#include "relayout/comm/impl/args.hpp"

namespace relayout {

template <Communicator C, WritableBuffer B>
void broadcast(const C& comm, B&& buf, int root) {
  const auto io = impl::write_span(buf, "buf");
  impl::require_root(root, comm.size());
  impl::require_fits_int(io.size(), "buf");
  comm.broadcast(io, root);
}

}  // namespace relayout
