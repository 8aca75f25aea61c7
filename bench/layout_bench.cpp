// Layout engine cost: what an engine pays at start-up to build a layout and enumerate every group,
// and per lookup for a rank's coordinates.
#include <benchmark/benchmark.h>

#include "relayout/mesh.hpp"
#include "support/mpi_bench.hpp"

namespace {

relayout::LayoutConfig seed_like(int tp) {
  // DP attention with attn_tp = 2 and a backend spanning EP, as in the TP32/DP16 seed layout.
  return {.tp = tp, .dp = tp / 2, .enable_dp_attention = true,
          .moe_a2a_backend = relayout::Backend::deepep};
}

void BM_BuildAndEnumerateGroups(benchmark::State& state) {
  const int tp = static_cast<int>(state.range(0));
  std::int64_t members = 0;
  relayout::bench::run_timed(state, MPI_COMM_WORLD, [&] {
    const relayout::RuntimeLayout layout(seed_like(tp));
    for (relayout::GroupKind g : relayout::kAllGroupKinds)
      for (const auto& group : layout.groups(g)) members += static_cast<std::int64_t>(group.size());
    benchmark::DoNotOptimize(members);
  });
  state.counters["ranks"] = tp;
}
BENCHMARK(BM_BuildAndEnumerateGroups)->Arg(8)->Arg(32)->Arg(256)->Arg(4096)->UseManualTime();

void BM_CoordsOfEveryRank(benchmark::State& state) {
  const int tp = static_cast<int>(state.range(0));
  const relayout::RuntimeLayout layout(seed_like(tp));
  relayout::bench::run_timed(state, MPI_COMM_WORLD, [&] {
    int sum = 0;
    for (int r = 0; r < tp; ++r) sum += layout.coords(r).moe_ep_rank;
    benchmark::DoNotOptimize(sum);
  });
  state.counters["time_per_rank"] = benchmark::Counter(
      static_cast<double>(tp), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_CoordsOfEveryRank)->Arg(32)->Arg(4096)->UseManualTime();

}  // namespace
