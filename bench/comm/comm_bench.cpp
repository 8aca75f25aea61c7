// Each relayout collective next to the raw MPI call on the same buffers, 1 KiB to 16 MiB (powers
// of 4), float elements. Sizes follow nccl-tests: the all-reduce/broadcast buffer, the gathered
// (all-gather) or scattered (reduce-scatter) whole, and the per-rank all-to-all buffer. Names are
// <collective>/<relayout|mpi>/<bytes>; ratio_table.py pairs their medians.
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <relayout/comm.hpp>
#include <string>
#include <vector>

#include "support/mpi_bench.hpp"

namespace {

using relayout::MpiCommunicator;
using View = Kokkos::View<float*, Kokkos::HostSpace>;

int comm_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

View filled(std::size_t n, float v) {
  View out(Kokkos::view_alloc(Kokkos::WithoutInitializing, "buf"), n);
  Kokkos::deep_copy(out, v);
  return out;
}

double bus_factor(const std::string& name, int n) {
  if (name == "broadcast") return 1.0;
  if (name == "all_reduce") return 2.0 * (n - 1) / n;
  return double(n - 1) / n;
}

// One benchmark body: `relayout_call` or `raw_call` over buffers made for `bytes`.
template <class Body>
void run(benchmark::State& state, const std::string& name, std::int64_t bytes, Body body) {
  const int n = comm_size();
  relayout::bench::run_timed(state, MPI_COMM_WORLD, body);
  relayout::bench::report_bandwidth(state, bytes, bus_factor(name, n));
}

void all_reduce_bench(benchmark::State& state, bool use_relayout) {
  const auto bytes = state.range(0);
  const auto count = static_cast<std::size_t>(bytes) / sizeof(float);
  const auto w = MpiCommunicator::world();
  View send = filled(count, 1.0f), recv = filled(count, 0.0f);
  if (use_relayout)
    run(state, "all_reduce", bytes, [&] { relayout::all_reduce(w, send, recv); });
  else
    run(state, "all_reduce", bytes, [&] {
      MPI_Allreduce(send.data(), recv.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    });
}

void all_gather_bench(benchmark::State& state, bool use_relayout) {
  const auto bytes = state.range(0);
  const int n = comm_size();
  const auto block = static_cast<std::size_t>(bytes) / sizeof(float) / static_cast<std::size_t>(n);
  const auto w = MpiCommunicator::world();
  View send = filled(block, 1.0f), recv = filled(block * static_cast<std::size_t>(n), 0.0f);
  if (use_relayout)
    run(state, "all_gather", bytes, [&] { relayout::all_gather(w, send, recv); });
  else
    run(state, "all_gather", bytes, [&] {
      MPI_Allgather(send.data(), static_cast<int>(block), MPI_FLOAT, recv.data(), static_cast<int>(block),
                    MPI_FLOAT, MPI_COMM_WORLD);
    });
}

void all_gatherv_bench(benchmark::State& state, bool use_relayout) {
  const auto bytes = state.range(0);
  const int n = comm_size();
  const auto block = static_cast<std::size_t>(bytes) / sizeof(float) / static_cast<std::size_t>(n);
  const auto w = MpiCommunicator::world();
  View send = filled(block, 1.0f), recv = filled(block * static_cast<std::size_t>(n), 0.0f);
  std::vector<int> counts(static_cast<std::size_t>(n), static_cast<int>(block)), displs;
  for (int i = 0; i < n; ++i) displs.push_back(i * static_cast<int>(block));
  if (use_relayout)
    run(state, "all_gatherv", bytes, [&] { relayout::all_gatherv(w, send, recv, counts); });
  else
    run(state, "all_gatherv", bytes, [&] {
      MPI_Allgatherv(send.data(), static_cast<int>(block), MPI_FLOAT, recv.data(), counts.data(),
                     displs.data(), MPI_FLOAT, MPI_COMM_WORLD);
    });
}

void reduce_scatter_bench(benchmark::State& state, bool use_relayout) {
  const auto bytes = state.range(0);
  const int n = comm_size();
  const auto block = static_cast<std::size_t>(bytes) / sizeof(float) / static_cast<std::size_t>(n);
  const auto w = MpiCommunicator::world();
  View send = filled(block * static_cast<std::size_t>(n), 1.0f), recv = filled(block, 0.0f);
  if (use_relayout)
    run(state, "reduce_scatter", bytes, [&] { relayout::reduce_scatter(w, send, recv); });
  else
    run(state, "reduce_scatter", bytes, [&] {
      MPI_Reduce_scatter_block(send.data(), recv.data(), static_cast<int>(block), MPI_FLOAT, MPI_SUM,
                               MPI_COMM_WORLD);
    });
}

void reduce_scatterv_bench(benchmark::State& state, bool use_relayout) {
  const auto bytes = state.range(0);
  const int n = comm_size();
  const auto block = static_cast<std::size_t>(bytes) / sizeof(float) / static_cast<std::size_t>(n);
  const auto w = MpiCommunicator::world();
  View send = filled(block * static_cast<std::size_t>(n), 1.0f), recv = filled(block, 0.0f);
  std::vector<int> counts(static_cast<std::size_t>(n), static_cast<int>(block));
  if (use_relayout)
    run(state, "reduce_scatterv", bytes, [&] { relayout::reduce_scatterv(w, send, recv, counts); });
  else
    run(state, "reduce_scatterv", bytes, [&] {
      MPI_Reduce_scatter(send.data(), recv.data(), counts.data(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    });
}

void all_to_all_bench(benchmark::State& state, bool use_relayout) {
  const auto bytes = state.range(0);
  const int n = comm_size();
  const auto count = static_cast<std::size_t>(bytes) / sizeof(float);
  const auto block = count / static_cast<std::size_t>(n);
  const auto w = MpiCommunicator::world();
  View send = filled(block * static_cast<std::size_t>(n), 1.0f), recv = filled(block * static_cast<std::size_t>(n), 0.0f);
  if (use_relayout)
    run(state, "all_to_all", bytes, [&] { relayout::all_to_all(w, send, recv); });
  else
    run(state, "all_to_all", bytes, [&] {
      MPI_Alltoall(send.data(), static_cast<int>(block), MPI_FLOAT, recv.data(), static_cast<int>(block),
                   MPI_FLOAT, MPI_COMM_WORLD);
    });
}

void all_to_allv_bench(benchmark::State& state, bool use_relayout) {
  const auto bytes = state.range(0);
  const int n = comm_size();
  const auto block = static_cast<std::size_t>(bytes) / sizeof(float) / static_cast<std::size_t>(n);
  const auto w = MpiCommunicator::world();
  View send = filled(block * static_cast<std::size_t>(n), 1.0f), recv = filled(block * static_cast<std::size_t>(n), 0.0f);
  std::vector<int> counts(static_cast<std::size_t>(n), static_cast<int>(block)), displs;
  for (int i = 0; i < n; ++i) displs.push_back(i * static_cast<int>(block));
  if (use_relayout)
    run(state, "all_to_allv", bytes, [&] { relayout::all_to_allv(w, send, counts, recv, counts); });
  else
    run(state, "all_to_allv", bytes, [&] {
      MPI_Alltoallv(send.data(), counts.data(), displs.data(), MPI_FLOAT, recv.data(), counts.data(),
                    displs.data(), MPI_FLOAT, MPI_COMM_WORLD);
    });
}

void broadcast_bench(benchmark::State& state, bool use_relayout) {
  const auto bytes = state.range(0);
  const auto count = static_cast<std::size_t>(bytes) / sizeof(float);
  const auto w = MpiCommunicator::world();
  View buf = filled(count, 1.0f);
  if (use_relayout)
    run(state, "broadcast", bytes, [&] { relayout::broadcast(w, buf, 0); });
  else
    run(state, "broadcast", bytes, [&] {
      MPI_Bcast(buf.data(), static_cast<int>(count), MPI_FLOAT, 0, MPI_COMM_WORLD);
    });
}

// Registered per size so that the relayout and raw runs of one size are adjacent in time.
const bool registered = [] {
  using Fn = void (*)(benchmark::State&, bool);
  const std::pair<const char*, Fn> cases[] = {
      {"all_reduce", all_reduce_bench},         {"all_gather", all_gather_bench},
      {"all_gatherv", all_gatherv_bench},       {"reduce_scatter", reduce_scatter_bench},
      {"reduce_scatterv", reduce_scatterv_bench}, {"all_to_all", all_to_all_bench},
      {"all_to_allv", all_to_allv_bench},       {"broadcast", broadcast_bench}};
  for (const auto& [name, fn] : cases)
    for (std::int64_t bytes = 1 << 10; bytes <= (std::int64_t{1} << 24); bytes *= 4)
      for (bool use_relayout : {true, false})
        benchmark::RegisterBenchmark(
            (std::string(name) + (use_relayout ? "/relayout" : "/mpi")).c_str(),
            [fn, use_relayout](benchmark::State& s) { fn(s, use_relayout); })
            ->Arg(bytes)
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond)
            ->Repetitions(5)
            ->ReportAggregatesOnly(true);
  return true;
}();

}  // namespace
