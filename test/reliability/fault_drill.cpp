// Fault drills under mpiexec, for the command tests in this folder. Each mode breaks a job in one
// known way; the tests check that the job ends, in bounded time, with a message that says what
// happened and a non-zero exit code.
//
//   fault_drill skip        the last rank skips a collective and waits elsewhere: the others'
//                           watchdog (RELAYOUT_COLLECTIVE_TIMEOUT) names it and aborts the job
//   fault_drill stop        the last rank arrives at an all_reduce (passes the arrival check) and
//                           stops itself with SIGSTOP before the MPI call: the others, inside
//                           the collective, see the deadline pass and name it
//   fault_drill throw       rank 1 throws in the middle of a decoder layer (from its trace sink,
//                           at the split_rows boundary): JobGuard ends the job with its message
//   fault_drill all-throw   every rank throws the same LayoutError: a clean exit 2, one message
//   fault_drill mismatch    the last rank calls all_gather where the others call all_reduce: every
//                           rank throws CollectiveMismatch, the job exits 2 with the diagnostic
//   fault_drill stop-start  the last rank stops (SIGSTOP) before the job starts (before JobGuard):
//                           the others' start under the deadline ends the job
//   fault_drill stop-split  the last rank stops before a split the others make: their arrival
//                           check names it
//   fault_drill stop-host   the last rank stops before the programs' memory check counts the ranks
//                           of this host (a shared-memory split): the same, from cli::memory_limit
//   fault_drill stop-groups the last rank stops before the others make the process groups: the
//                           deadline (RELAYOUT_CHECK_COLLECTIVES=0, as a default launch) ends the job
//                           naming this file's line
//   fault_drill stop-in-split  the last rank passes a split's arrival check and stops before
//                           MPI_Comm_split: the others, inside it, are ended by its watch
//   fault_drill skip-start  the last rank skips a started all_to_all (all_to_all_start): the
//                           others' wait() names the call and the member not heard from
//   fault_drill stop-end    after the job's last collective the last rank stops (SIGSTOP) instead
//                           of finishing: the others, finished, wait for it at the end of the job
//                           (JobGuard::finish) within the deadline, then name it and abort
//   fault_drill stop-end-alone  the same while rank 0 works alone (JobGuard::working_alone) past
//                           the deadline: the message names both, rank 0 as working alone
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <relayout/relayout.hpp>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/memory.hpp"
#include "demo/model/layer.hpp"

using namespace relayout;

namespace {

// Throws on one rank at one boundary of the layer.
struct FailingSink {
  static constexpr bool enabled = true;
  int rank = 0, fail_rank = 1;
  std::string at = "split_rows";
  bool active() const { return true; }
  void write(const trace::Record& r) {
    if (rank == fail_rank && r.boundary == at)
      throw std::runtime_error("injected failure on rank " + std::to_string(rank) + " at boundary \"" + at +
                               "\" of layer " + std::to_string(r.layer));
  }
};

int skip(const MpiCommunicator& world) {
  MpiCommunicator c = world.dup();
  c.set_name("drill");
  std::vector<float> v{1.0f};  // dup() opened the check's channel: the first call can name who is missing
  if (c.rank() == c.size() - 1) {
    // This rank never joins the next all_reduce; it waits where the others never come.
    MPI_Barrier(MPI_COMM_WORLD);
    return 0;
  }
  all_reduce_in_place(c, v);
  std::printf("unreachable: the all_reduce completed without the last rank\n");
  return 1;
}

// The same with the nonblocking form: the others start it and wait.
int skip_start(const MpiCommunicator& world) {
  MpiCommunicator c = world.dup();
  c.set_name("drill");
  std::vector<float> send(static_cast<std::size_t>(c.size()), 1.0f), recv(send.size());
  if (c.rank() == c.size() - 1) {
    MPI_Barrier(MPI_COMM_WORLD);
    return 0;
  }
  CollectiveRequest r = all_to_all_start(Kokkos::DefaultHostExecutionSpace(), c, send, recv);
  r.wait();
  std::printf("unreachable: the all_to_all completed without the last rank\n");
  return 1;
}

int stop(const MpiCommunicator& world) {
  MpiCommunicator c = world.dup();
  c.set_name("drill");
  std::vector<float> v{1.0f};
  all_reduce_in_place(c, v);  // the job is running: one collective done
  const auto site = std::source_location::current();
  if (c.rank() == c.size() - 1) {
    // The same call from the same line, as far as the arrival check can tell; then this rank stops
    // where the others are already inside MPI.
    c.agree(CollectiveCall{.kind = CollectiveKind::all_reduce_in_place, .dtype = "float", .reduce_op = 0, .count = 1,
                           .site = site});
    std::raise(SIGSTOP);
    return 0;
  }
  all_reduce_in_place(c, v, ReduceOp::sum, site);
  std::printf("unreachable: the all_reduce completed without the last rank\n");
  return 1;
}

int throw_in_layer(const MpiCommunicator& world) {
  // Path B (DeepEP): attention all-reduce, split_rows, dispatch, experts, combine, all_gather.
  const RuntimeLayout layout(LayoutConfig{.tp = world.size(), .dp = world.size() / 2, .enable_dp_attention = true,
                                          .moe_a2a_backend = Backend::deepep});
  const ProcessGroups groups(layout, world);
  const model::ModelDims dims{.hidden = 16, .heads = 2, .head_dim = 8, .q_lora = 8, .experts = 4, .topk = 2,
                              .moe_inter = 8, .shared_inter = 0, .layers = 2};
  model::LayerOptions opts;
  opts.record_boundaries = true;
  model::DistributedModel<MpiCommunicator, Kokkos::DefaultExecutionSpace, FailingSink> net(groups, dims, opts);
  FailingSink sink;
  sink.rank = world.rank();
  net.trace_to(sink);
  std::vector<int> lengths(static_cast<std::size_t>(layout.widths().attn_dp), 3);
  const auto work = model::Workload::make(lengths, {}, layout.widths().attn_dp);
  net.forward(work);
  std::printf("rank %d: forward finished\n", world.rank());
  return 0;
}

int mismatch(const MpiCommunicator& world) {
  std::vector<float> send(2, 1.0f), recv(2 * static_cast<std::size_t>(world.size()));
  if (world.rank() == world.size() - 1) all_gather(world, send, recv);
  else all_reduce(world, send, std::span<float>(recv.data(), 2));
  return 0;
}

// The last rank stops before a communicator is made from `world`'s duplicate; the others make it.
int stop_before_split(const MpiCommunicator& world, bool host) {
  MpiCommunicator c = world.dup();
  c.set_name("drill");
  if (c.rank() == c.size() - 1) std::raise(SIGSTOP);
  if (host) {
    cli::memory_limit(c, 0);
  } else {
    const MpiCommunicator half = c.split(c.rank() % 2, c.rank());
  }
  std::printf("unreachable: rank %d made a communicator without the last rank\n", c.rank());
  return 1;
}

// The last rank stops before the process groups are made; the others start making them.
int stop_before_groups(const MpiCommunicator& world) {
  const RuntimeLayout layout(LayoutConfig{.tp = world.size(), .dp = world.size() / 2, .enable_dp_attention = true});
  if (world.rank() == world.size() - 1) std::raise(SIGSTOP);
  const ProcessGroups groups(layout, world);
  std::printf("unreachable: rank %d made the process groups without the last rank\n", world.rank());
  return 1;
}

// The last rank passes the split's arrival check (the same call, as far as the check can tell) and
// stops; the others are inside MPI_Comm_split, which has no nonblocking form.
int stop_inside_split(const MpiCommunicator& world) {
  MpiCommunicator c = world.dup();
  c.set_name("drill");
  const auto site = std::source_location::current();
  if (c.rank() == c.size() - 1) {
    c.agree(CollectiveCall{.kind = CollectiveKind::comm_split, .site = site});
    std::raise(SIGSTOP);
    return 0;
  }
  const MpiCommunicator half = c.split(c.rank() % 2, c.rank(), site);
  std::printf("unreachable: rank %d split without the last rank\n", c.rank());
  return 1;
}

// Every rank makes the job's last collective; then the last rank stops (a moment later, so the
// others are already at the end of the job), and with `alone` rank 0 announces work of its own that
// outlasts the deadline.
int stop_at_end(const MpiCommunicator& world, bool alone) {
  MpiCommunicator c = world.dup();
  c.set_name("drill");
  std::vector<float> v{1.0f};
  all_reduce_in_place(c, v);
  if (c.rank() == c.size() - 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::raise(SIGSTOP);
  }
  if (alone && c.rank() == 0) {
    JobGuard::working_alone("writing the drill's report");
    std::this_thread::sleep_for(std::chrono::seconds(30));  // ended by the others' abort
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Kokkos::initialize(argc, argv);
  int rc = 0;
  {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "stop-start") {
      int rank = 0, size = 1;
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      MPI_Comm_size(MPI_COMM_WORLD, &size);
      if (rank == size - 1) std::raise(SIGSTOP);
    }
    JobGuard job;
    rc = job.run([&] {
      const MpiCommunicator world = MpiCommunicator::world();
      if (world.size() < 2 || world.size() % 2 != 0)
        throw LayoutError("mpiexec -n", "fault_drill needs an even number of ranks, at least 2");
      if (mode == "skip") return skip(world);
      if (mode == "stop") return stop(world);
      if (mode == "skip-start") return skip_start(world);
      if (mode == "throw") return throw_in_layer(world);
      if (mode == "all-throw") throw LayoutError("--tp", "every rank rejects this layout the same way");
      if (mode == "mismatch") return mismatch(world);
      if (mode == "stop-split") return stop_before_split(world, false);
      if (mode == "stop-host") return stop_before_split(world, true);
      if (mode == "stop-groups") return stop_before_groups(world);
      if (mode == "stop-in-split") return stop_inside_split(world);
      if (mode == "stop-end") return stop_at_end(world, false);
      if (mode == "stop-end-alone") return stop_at_end(world, true);
      if (mode == "stop-start") throw std::runtime_error("unreachable: the job started without the last rank");
      throw LayoutError("mode", "unknown mode '" + mode + "': skip, skip-start, stop, throw, all-throw, mismatch, stop-start, "
                                "stop-split, stop-host, stop-groups, stop-in-split, stop-end or stop-end-alone");
    });
  }
  Kokkos::finalize();
  MPI_Finalize();
  return rc;
}
