// MPI-aware Google Benchmark harness. Benchmarks use manual time: each iteration is timed on every
// rank and the maximum over ranks is what counts (a collective is as slow as its slowest member),
// so every rank sees the same time and Google Benchmark picks the same iteration count everywhere.
#pragma once

#include <benchmark/benchmark.h>
#include <mpi.h>

#include <chrono>
#include <cstdint>

namespace relayout::bench {

// Times one call of `body` on every rank of `comm` and returns the maximum over ranks in seconds.
template <class F>
double max_over_ranks(MPI_Comm comm, F&& body) {
  const auto t0 = std::chrono::steady_clock::now();
  body();
  const double local = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double max = local;
  MPI_Allreduce(&local, &max, 1, MPI_DOUBLE, MPI_MAX, comm);
  return max;
}

// The loop every distributed benchmark uses: register it with ->UseManualTime().
template <class F>
void run_timed(benchmark::State& state, MPI_Comm comm, F&& body) {
  for (auto _ : state) state.SetIterationTime(max_over_ranks(comm, body));
}

// nccl-tests' bandwidth definitions: algbw = bytes / time; busbw = algbw * factor, with factor
// 2(n-1)/n for all-reduce, (n-1)/n for all-gather, reduce-scatter and all-to-all, 1 for broadcast.
inline void report_bandwidth(benchmark::State& state, std::int64_t bytes, double bus_factor) {
  state.SetBytesProcessed(state.iterations() * bytes);
  state.counters["algbw_GBps"] = benchmark::Counter(
      static_cast<double>(bytes) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["busbw_GBps"] = benchmark::Counter(
      static_cast<double>(bytes) * 1e-9 * bus_factor, benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace relayout::bench
