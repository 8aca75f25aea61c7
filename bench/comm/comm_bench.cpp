// Each relayout collective next to the raw MPI call on the same buffers, 1 KiB to 16 MiB (powers
// of 4), float elements in Kokkos Views. Sizes follow nccl-tests: the all-reduce/broadcast buffer,
// the gathered (all-gather) or scattered (reduce-scatter) whole, the per-rank all-to-all buffer.
// Names are <collective>/paired/<bytes>; ratio_table.py prints the medians over repetitions.
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
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

// Times the relayout call and the raw MPI call on the same buffers in the order relayout, MPI,
// MPI, relayout in every iteration (each call as the max over ranks), so a change in machine load hits both alike.
// The reported time is
// relayout's; counters carry MPI's time, the median per-iteration ratio and both bus bandwidths.
template <class Relayout, class Raw>
void paired(benchmark::State& state, const std::string& name, std::int64_t bytes, Relayout relayout_call,
            Raw raw_call) {
  const int n = comm_size();
  double raw_total = 0;
  std::vector<double> ratios;
  for (auto _ : state) {
    const double a = relayout::bench::max_over_ranks(MPI_COMM_WORLD, relayout_call);
    const double b = relayout::bench::max_over_ranks(MPI_COMM_WORLD, raw_call);
    const double c = relayout::bench::max_over_ranks(MPI_COMM_WORLD, raw_call);
    const double d = relayout::bench::max_over_ranks(MPI_COMM_WORLD, relayout_call);
    raw_total += (b + c) / 2;
    ratios.push_back((a + d) / (b + c));
    state.SetIterationTime((a + d) / 2);
  }
  std::sort(ratios.begin(), ratios.end());
  relayout::bench::report_bandwidth(state, bytes, bus_factor(name, n));
  const double iters = static_cast<double>(state.iterations());
  state.counters["mpi_us"] = raw_total / iters * 1e6;
  // The median of the per-iteration ratios: one call descheduled by other load moves it little.
  state.counters["ratio"] = ratios.empty() ? 1.0 : ratios[ratios.size() / 2];
  state.counters["busbw_mpi_GBps"] = raw_total > 0 ? bytes * 1e-9 * bus_factor(name, n) * iters / raw_total : 0.0;
}

void all_reduce_bench(benchmark::State& state) {
  const auto bytes = state.range(0);
  const auto count = static_cast<std::size_t>(bytes) / sizeof(float);
  const auto w = MpiCommunicator::world();
  View send = filled(count, 1.0f), recv = filled(count, 0.0f);
  paired(state, "all_reduce", bytes, [&] { relayout::all_reduce(w, send, recv); },
         [&] {
      MPI_Allreduce(send.data(), recv.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
         });
}

// Control: the raw call against itself, the noise floor of the ratio on this machine.
void control_all_reduce_bench(benchmark::State& state) {
  const auto bytes = state.range(0);
  const auto count = static_cast<std::size_t>(bytes) / sizeof(float);
  View send = filled(count, 1.0f), recv = filled(count, 0.0f);
  const auto raw = [&] {
    MPI_Allreduce(send.data(), recv.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  };
  paired(state, "all_reduce", bytes, raw, raw);
}

void all_gather_bench(benchmark::State& state) {
  const auto bytes = state.range(0);
  const int n = comm_size();
  const auto block = static_cast<std::size_t>(bytes) / sizeof(float) / static_cast<std::size_t>(n);
  const auto w = MpiCommunicator::world();
  View send = filled(block, 1.0f), recv = filled(block * static_cast<std::size_t>(n), 0.0f);
  paired(state, "all_gather", bytes, [&] { relayout::all_gather(w, send, recv); },
         [&] {
      MPI_Allgather(send.data(), static_cast<int>(block), MPI_FLOAT, recv.data(), static_cast<int>(block),
                    MPI_FLOAT, MPI_COMM_WORLD);
         });
}

void all_gatherv_bench(benchmark::State& state) {
  const auto bytes = state.range(0);
  const int n = comm_size();
  const auto block = static_cast<std::size_t>(bytes) / sizeof(float) / static_cast<std::size_t>(n);
  const auto w = MpiCommunicator::world();
  View send = filled(block, 1.0f), recv = filled(block * static_cast<std::size_t>(n), 0.0f);
  std::vector<int> counts(static_cast<std::size_t>(n), static_cast<int>(block)), displs;
  for (int i = 0; i < n; ++i) displs.push_back(i * static_cast<int>(block));
  paired(state, "all_gatherv", bytes, [&] { relayout::all_gatherv(w, send, recv, counts); },
         [&] {
      MPI_Allgatherv(send.data(), static_cast<int>(block), MPI_FLOAT, recv.data(), counts.data(),
                     displs.data(), MPI_FLOAT, MPI_COMM_WORLD);
         });
}

void reduce_scatter_bench(benchmark::State& state) {
  const auto bytes = state.range(0);
  const int n = comm_size();
  const auto block = static_cast<std::size_t>(bytes) / sizeof(float) / static_cast<std::size_t>(n);
  const auto w = MpiCommunicator::world();
  View send = filled(block * static_cast<std::size_t>(n), 1.0f), recv = filled(block, 0.0f);
  paired(state, "reduce_scatter", bytes, [&] { relayout::reduce_scatter(w, send, recv); },
         [&] {
      MPI_Reduce_scatter_block(send.data(), recv.data(), static_cast<int>(block), MPI_FLOAT, MPI_SUM,
                               MPI_COMM_WORLD);
         });
}

void reduce_scatterv_bench(benchmark::State& state) {
  const auto bytes = state.range(0);
  const int n = comm_size();
  const auto block = static_cast<std::size_t>(bytes) / sizeof(float) / static_cast<std::size_t>(n);
  const auto w = MpiCommunicator::world();
  View send = filled(block * static_cast<std::size_t>(n), 1.0f), recv = filled(block, 0.0f);
  std::vector<int> counts(static_cast<std::size_t>(n), static_cast<int>(block));
  paired(state, "reduce_scatterv", bytes, [&] { relayout::reduce_scatterv(w, send, recv, counts); },
         [&] {
      MPI_Reduce_scatter(send.data(), recv.data(), counts.data(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
         });
}

void all_to_all_bench(benchmark::State& state) {
  const auto bytes = state.range(0);
  const int n = comm_size();
  const auto count = static_cast<std::size_t>(bytes) / sizeof(float);
  const auto block = count / static_cast<std::size_t>(n);
  const auto w = MpiCommunicator::world();
  View send = filled(block * static_cast<std::size_t>(n), 1.0f), recv = filled(block * static_cast<std::size_t>(n), 0.0f);
  paired(state, "all_to_all", bytes, [&] { relayout::all_to_all(w, send, recv); },
         [&] {
      MPI_Alltoall(send.data(), static_cast<int>(block), MPI_FLOAT, recv.data(), static_cast<int>(block),
                   MPI_FLOAT, MPI_COMM_WORLD);
         });
}

void all_to_allv_bench(benchmark::State& state) {
  const auto bytes = state.range(0);
  const int n = comm_size();
  const auto block = static_cast<std::size_t>(bytes) / sizeof(float) / static_cast<std::size_t>(n);
  const auto w = MpiCommunicator::world();
  View send = filled(block * static_cast<std::size_t>(n), 1.0f), recv = filled(block * static_cast<std::size_t>(n), 0.0f);
  std::vector<int> counts(static_cast<std::size_t>(n), static_cast<int>(block)), displs;
  for (int i = 0; i < n; ++i) displs.push_back(i * static_cast<int>(block));
  paired(state, "all_to_allv", bytes, [&] { relayout::all_to_allv(w, send, counts, recv, counts); },
         [&] {
      MPI_Alltoallv(send.data(), counts.data(), displs.data(), MPI_FLOAT, recv.data(), counts.data(),
                    displs.data(), MPI_FLOAT, MPI_COMM_WORLD);
         });
}

void broadcast_bench(benchmark::State& state) {
  const auto bytes = state.range(0);
  const auto count = static_cast<std::size_t>(bytes) / sizeof(float);
  const auto w = MpiCommunicator::world();
  View buf = filled(count, 1.0f);
  paired(state, "broadcast", bytes, [&] { relayout::broadcast(w, buf, 0); },
         [&] {
      MPI_Bcast(buf.data(), static_cast<int>(count), MPI_FLOAT, 0, MPI_COMM_WORLD);
         });
}

const bool registered = [] {
  using Fn = void (*)(benchmark::State&);
  const std::pair<const char*, Fn> cases[] = {
      {"all_reduce", all_reduce_bench},         {"all_gather", all_gather_bench},
      {"all_gatherv", all_gatherv_bench},       {"reduce_scatter", reduce_scatter_bench},
      {"reduce_scatterv", reduce_scatterv_bench}, {"all_to_all", all_to_all_bench},
      {"all_to_allv", all_to_allv_bench},       {"broadcast", broadcast_bench},
      {"control_mpi_vs_mpi_all_reduce", control_all_reduce_bench}};
  for (const auto& [name, fn] : cases)
    for (std::int64_t bytes = 1 << 10; bytes <= (std::int64_t{1} << 24); bytes *= 4)
      benchmark::RegisterBenchmark((std::string(name) + "/paired").c_str(), fn)
          ->Arg(bytes)
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.1)
          ->Repetitions(7)
          ->ReportAggregatesOnly(true);
  return true;
}();

}  // namespace
