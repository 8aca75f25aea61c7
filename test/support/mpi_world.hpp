// The world communicator of the MPI tests. The shared MPI test main (mpi_test_main.cpp) makes it on
// first use and destroys it before MPI_Finalize: a communicator, and the private duplicate its
// agreement check opens at the first checked collective, must be freed while MPI is still up
// (a function-local static would be destroyed after MPI_Finalize, and MPICH would leak the
// duplicate's requests, which LeakSanitizer reports under make test-sanitize).
#pragma once

#include <relayout/comm/mpi.hpp>

namespace relayout::test {

const MpiCommunicator& world();

}  // namespace relayout::test
