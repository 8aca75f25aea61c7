// barrier: returns on every rank once every rank of the group has entered it. With an
// execution-space instance first, that instance is fenced before entering.
#pragma once

#include "relayout/comm/impl/args.hpp"

namespace relayout {

namespace impl {

template <class F, Communicator C>
void barrier_on(const F& fence, const C& comm, std::source_location site) {
  run_collective(fence, comm, CollectiveKind::barrier, "none", site, [&](auto& scope) {
    scope.agree();
    comm.barrier();
  });
}

}  // namespace impl

template <Communicator C>
void barrier(const C& comm, std::source_location site = std::source_location::current()) {
  impl::barrier_on(impl::ViewSpaces{}, comm, site);
}
template <ExecutionSpaceInstance E, Communicator C>
void barrier(const E& space, const C& comm, std::source_location site = std::source_location::current()) {
  impl::barrier_on(space, comm, site);
}

}  // namespace relayout
