// The instantiations relayout::instances compiles once (MPI ranks, the default execution space,
// float, double and bf16 rows): a program linking that target compiles EpBuffer and MoeBridge's
// run for those types in no translation unit of its own. Any other combination still compiles in
// place, as everywhere in this header-only library.
#pragma once

#include <Kokkos_Core.hpp>

#include "relayout/bridge/bridge.hpp"
#include "relayout/comm/mpi.hpp"
#include "relayout/placement/ep.hpp"

// RELAYOUT_INSTANCES(X) applies X to every (communicator, element type, execution space) compiled once.
#define RELAYOUT_INSTANCES(X)                                         \
  X(::relayout::MpiCommunicator, float, ::Kokkos::DefaultExecutionSpace) \
  X(::relayout::MpiCommunicator, double, ::Kokkos::DefaultExecutionSpace) \
  X(::relayout::MpiCommunicator, ::relayout::bf16, ::Kokkos::DefaultExecutionSpace)

#define RELAYOUT_EXTERN_INSTANCE(C, T, S)                 \
  extern template class ::relayout::EpBuffer<C, T, S>; \
  extern template class ::relayout::impl::BridgeRun<C, T, S>;

#if defined(RELAYOUT_PREBUILT_INSTANCES) && !defined(RELAYOUT_COMPILING_INSTANCES)
RELAYOUT_INSTANCES(RELAYOUT_EXTERN_INSTANCE)
#endif
