// Rebalancing moves the weights: a bridge with redundant experts runs a skewed router's rows,
// rebalances for the load it counted and moves the engine's expert weights with the new map. The
// experts read their weights by slot only (as an engine's fused kernel would), so the rows come
// out right only if every slot received its new expert's weights. Expected rows come from the
// test's own formula: expert l scales feature f by 1 + 0.1 l + 0.01 f.
#include <doctest/doctest.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdint>
#include <memory>
#include <relayout/bridge.hpp>
#include <relayout/comm.hpp>
#include <relayout/placement.hpp>
#include <vector>

#include "mpi_world.hpp"

using namespace relayout;

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using relayout::test::world;
constexpr int kHidden = 6, kExperts = 8, kTopK = 2;

double scale_of(int logical, int f) { return 1.0 + 0.1 * logical + 0.01 * f; }
double value(int s, std::int64_t i, int f) { return 1.0 + s * 10.0 + double(i) * 0.5 + 0.01 * f; }
// Skewed: most rows pick experts 0 and 1; the rest spread.
int expert_of(int s, std::int64_t i, int k) {
  const int hot = int((s + i) % 5) < 4 ? k : int((s * 3 + i + 2 * k) % kExperts);
  return k == 1 && hot == 0 ? 1 : hot;
}
double weight_of(int k) { return k == 0 ? 0.75 : 0.25; }

// The engine's weights: one tensor of kHidden scales per local slot, in its own memory.
struct SlotWeights {
  using value_type = double;
  std::vector<Kokkos::View<double*, Space>> slot;
  int slots() const { return static_cast<int>(slot.size()); }
  int tensors() const { return 1; }
  Kokkos::View<double*, Space> tensor(int s, int) const { return slot.at(static_cast<std::size_t>(s)); }
};
SlotWeights weights_for(const ExpertLocation& loc, int member) {
  SlotWeights w;
  for (int s = 0; s < loc.per_rank(); ++s) {
    Kokkos::View<double*, Space> v("w", kHidden);
    auto h = Kokkos::create_mirror_view(v);
    for (int f = 0; f < kHidden; ++f) h(f) = scale_of(loc.logical_of(member * loc.per_rank() + s), f);
    Kokkos::deep_copy(v, h);
    w.slot.push_back(v);
  }
  return w;
}

// Experts that read slot (first_expert + e - first slot of this member)'s weights: never the map.
struct SlotExperts {
  const SlotWeights* w;
  int first_slot;
  void operator()(const Space& exec, const ExpertBatch<double, Space>& b, const RowsView<double, Space>& y) const {
    auto xh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b.x);
    auto yh = Kokkos::create_mirror_view(y);
    for (int e = 0; e < b.experts(); ++e) {
      auto wh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), w->tensor(b.first_expert + e - first_slot, 0));
      for (std::int64_t r = b.offset(e); r < b.offset(e) + b.count(e); ++r)
        for (int f = 0; f < kHidden; ++f) yh(r, f) = wh(f) * xh(r, f);
    }
    Kokkos::deep_copy(exec, y, yh);
    exec.fence();
  }
};

struct SkewRouter {
  int s;
  int top_k() const { return kTopK; }
  void operator()(const Space& exec, const RowsView<double, Space>& x, TopK<double, Space>& out) const {
    auto ih = Kokkos::create_mirror_view(out.ids);
    auto wh = Kokkos::create_mirror_view(out.weights);
    for (std::size_t i = 0; i < x.extent(0); ++i)
      for (int k = 0; k < kTopK; ++k) {
        ih(i, k) = expert_of(s, std::int64_t(i), k);
        wh(i, k) = weight_of(k);
      }
    Kokkos::deep_copy(exec, out.ids, ih);
    Kokkos::deep_copy(exec, out.weights, wh);
    exec.fence();
  }
};

// The largest distance of the bridge's rows from the formula.
double error_of(const Rows<double, Replicated<AttnTp>, DpLocal, Space>& out, int s) {
  auto oh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out.view());
  double worst = 0;
  for (std::size_t i = 0; i < oh.extent(0); ++i)
    for (int f = 0; f < kHidden; ++f) {
      double want = 0;
      for (int k = 0; k < kTopK; ++k) want += weight_of(k) * scale_of(expert_of(s, std::int64_t(i), k), f) * value(s, std::int64_t(i), f);
      worst = std::max(worst, std::abs(oh(i, f) - want));
    }
  return worst;
}

}  // namespace

TEST_CASE("set_expert_location with the weights: after a rebalance for a skewed load the rows equal the static placement's") {
  const auto& comm = world();
  const int np = comm.size(), s = comm.rank();
  const ProcessGroups pg(RuntimeLayout(LayoutConfig{.tp = np, .dp = np, .enable_dp_attention = true,
                                                    .moe_a2a_backend = Backend::deepep}),
                         comm);
  const Space exec;
  const std::int64_t m = 40;
  RowsView<double, Space> xv("x", m, kHidden);
  auto xh = Kokkos::create_mirror_view(xv);
  for (std::int64_t i = 0; i < m; ++i)
    for (int f = 0; f < kHidden; ++f) xh(i, f) = value(s, i, f);
  Kokkos::deep_copy(xv, xh);
  const Rows<double, Replicated<AttnTp>, DpLocal, Space> x(xv);

  // np redundant slots over np members (none at np 1), first replicating the coldest experts: the
  // hot experts 0 and 1 live on member 0 alone.
  const int redundant = np > 1 ? np : 0;
  std::vector<int> map(static_cast<std::size_t>(kExperts + redundant));
  for (int p = 0; p < kExperts + redundant; ++p) map[std::size_t(p)] = p < kExperts ? p : kExperts - 1 - (p - kExperts);
  const auto identity = std::make_shared<const ExpertLocation>(ExpertLocation::from_map(kExperts, np, map));
  MoeBridge<MpiCommunicator, double, Space> bridge(pg, kExperts, {.expert_location = identity});
  SlotWeights weights = weights_for(*identity, s);
  const int per_rank = identity->per_rank();
  SkewRouter router{s};
  SlotExperts experts{&weights, s * per_rank};
  const auto before = bridge.run(exec, x, router, experts);
  CHECK(error_of(before, s) < 1e-12);
  const ExpertLoad load = sum_expert_load(exec, pg.moe_ep(), *identity, bridge.last_expert_load());
  const double imbalance_before = load.imbalance();

  const auto rebalanced = std::make_shared<const ExpertLocation>(
      ExpertLocation::rebalanced(load.logical_as_double(), redundant, np));
  if (np > 1) CHECK(*rebalanced != *identity);  // the skew moves experts: the test moves weights
  bridge.set_expert_location(exec, rebalanced, weights);
  // Every slot holds its new expert's weights (independent of the move: the formula).
  bool moved = true;
  for (int sl = 0; sl < per_rank; ++sl) {
    auto wh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), weights.tensor(sl, 0));
    for (int f = 0; f < kHidden; ++f) moved = moved && wh(f) == scale_of(rebalanced->logical_of(s * per_rank + sl), f);
  }
  CHECK(moved);
  const auto after = bridge.run(exec, x, router, experts);
  CHECK(error_of(after, s) < 1e-12);
  const ExpertLoad load_after = sum_expert_load(exec, pg.moe_ep(), *rebalanced, bridge.last_expert_load());
  if (np > 1) CHECK(load_after.imbalance() < imbalance_before);

  // The map alone, weights left where they were: the same experts now compute with the wrong
  // weights, which is what moving them prevents (shown on a map that moves slots).
  if (np > 1) {
    SlotWeights stale = weights_for(*identity, s);
    SlotExperts stale_experts{&stale, s * per_rank};
    MoeBridge<MpiCommunicator, double, Space> map_only(pg, kExperts, {.expert_location = identity});
    map_only.set_expert_location(exec, rebalanced);
    const double err = error_of(map_only.run(exec, x, router, stale_experts), s);
    double worst = 0;
    MPI_Allreduce(&err, &worst, 1, MPI_DOUBLE, MPI_MAX, comm.native());
    CHECK(worst > 1e-3);
  }
}
