// The communication layer: the Communicator concept, the MPI and single-rank backends (and NCCL
// when RELAYOUT_HAVE_NCCL is defined), the checked collectives as free functions, and the process
// groups of one TP domain. The only place in relayout that calls MPI.
#pragma once

#include "relayout/comm/agreement.hpp"
#include "relayout/comm/all_gather.hpp"
#include "relayout/comm/all_gatherv.hpp"
#include "relayout/comm/all_reduce.hpp"
#include "relayout/comm/all_to_all.hpp"
#include "relayout/comm/all_to_allv.hpp"
#include "relayout/comm/barrier.hpp"
#include "relayout/comm/broadcast.hpp"
#include "relayout/comm/buffer.hpp"
#include "relayout/comm/clock.hpp"
#include "relayout/comm/collective_kind.hpp"
#include "relayout/comm/communicator.hpp"
#include "relayout/comm/error.hpp"
#include "relayout/comm/job.hpp"
#include "relayout/comm/mpi.hpp"
#include "relayout/comm/nccl.hpp"
#include "relayout/comm/process_groups.hpp"
#include "relayout/comm/reduce_scatter.hpp"
#include "relayout/comm/reduce_scatterv.hpp"
#include "relayout/comm/request.hpp"
#include "relayout/comm/scalar.hpp"
#include "relayout/comm/single.hpp"
