// barrier: returns on every rank once every rank of the group has entered it.
#pragma once

#include "relayout/comm/communicator.hpp"

namespace relayout {

template <Communicator C>
void barrier(const C& comm) {
  comm.barrier();
}

}  // namespace relayout
