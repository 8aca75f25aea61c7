// barrier: returns on every rank once every rank of the group has entered it.
#pragma once

#include "relayout/comm/impl/args.hpp"

namespace relayout {

template <Communicator C>
void barrier(const C& comm, std::source_location site = std::source_location::current()) {
  impl::run_collective(comm, CollectiveKind::barrier, "none", site, [&](auto& scope) {
    scope.agree();
    comm.barrier();
  });
}

}  // namespace relayout
