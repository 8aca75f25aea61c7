// EP dispatch + combine alone (the experts copy their rows): a workspace made for every call
// (ep_dispatch without one) against one EpWorkspace kept across calls, in one run. Rows and routing
// are path B's per-rank chunk of the demo configuration: 512 rows x 512 floats, top-4 of 16 experts.
#include <benchmark/benchmark.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <numeric>
#include <random>
#include <relayout/comm.hpp>
#include <relayout/placement.hpp>
#include <vector>

#include "support/mpi_bench.hpp"

using namespace relayout;

namespace {

using Space = Kokkos::DefaultExecutionSpace;
constexpr std::int64_t kRows = 512, kHidden = 512;
constexpr int kExperts = 16, kTopK = 4;

void BM_EpDispatchCombine(benchmark::State& state) {
  const bool keep = state.range(0) != 0;
  const MpiCommunicator world = MpiCommunicator::world();
  const int np = world.size();
  const ProcessGroups pg(RuntimeLayout(LayoutConfig{.tp = np, .dp = np, .enable_dp_attention = true,
                                                    .moe_a2a_backend = Backend::deepep}),
                         world);
  impl::RowsView<float, Space> xv("x", kRows, kHidden);
  TopK<float, Space> route(kRows, kTopK);
  auto xh = Kokkos::create_mirror_view(xv);
  auto ih = Kokkos::create_mirror_view(route.ids);
  auto wh = Kokkos::create_mirror_view(route.weights);
  std::mt19937 gen(7 + unsigned(world.rank()));
  std::vector<int> e(kExperts);
  for (std::int64_t i = 0; i < kRows; ++i) {
    for (std::int64_t f = 0; f < kHidden; ++f) xh(i, f) = float(i + f) * 1e-3f;
    std::iota(e.begin(), e.end(), 0);
    std::shuffle(e.begin(), e.end(), gen);  // distinct experts, uniform over the ranks
    for (int k = 0; k < kTopK; ++k) {
      ih(i, k) = e[std::size_t(k)];
      wh(i, k) = 1.0f / kTopK;
    }
  }
  Kokkos::deep_copy(xv, xh);
  Kokkos::deep_copy(route.ids, ih);
  Kokkos::deep_copy(route.weights, wh);
  const Rows<float, RowShard<AttnTp>, DpLocal, Space> x(xv, kRows);
  const Space exec;
  EpWorkspace<float, Space> ws;
  const auto layer = [&] {
    EpWorkspace<float, Space> fresh;
    EpWorkspace<float, Space>& use = keep ? ws : fresh;
    const Dispatched<float, Space> d = ep_dispatch(exec, pg, x, route, kExperts, use);
    const auto y = use.expert_outputs(d.batch.rows(), kHidden);
    Kokkos::deep_copy(exec, y, d.batch.x);
    benchmark::DoNotOptimize(ep_combine(exec, pg, d, y).view().data());
  };
  layer();  // warm-up
  bench::run_timed(state, world.native(), layer);
  state.SetLabel(keep ? "workspace kept" : "workspace per call");
}
BENCHMARK(BM_EpDispatchCombine)->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
