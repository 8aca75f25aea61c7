// The experts' moe_tp contract, checked (the collective check is on in the tests): on path tp_moe
// with moe_tp = np, experts that each compute the whole expert are refused on every rank; experts
// that compute their share give the formula's rows. Expert e scales a row by e + 1.
#include <doctest/doctest.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdint>
#include <relayout/bridge.hpp>
#include <relayout/comm.hpp>
#include <string>

#include "mpi_world.hpp"

using namespace relayout;

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using relayout::test::world;
constexpr int kHidden = 4, kExperts = 4;

double value(std::int64_t i, int f) { return 1.0 + double(i) + 0.1 * f; }
int expert_of(std::int64_t i) { return int(i % kExperts); }

struct OneRouter {
  int top_k() const { return 1; }
  void operator()(const Space& exec, const RowsView<double, Space>& x, TopK<double, Space>& out) const {
    auto ih = Kokkos::create_mirror_view(out.ids);
    auto wh = Kokkos::create_mirror_view(out.weights);
    for (std::size_t i = 0; i < x.extent(0); ++i) {
      ih(i, 0) = expert_of(std::int64_t(i));
      wh(i, 0) = 1.0;
    }
    Kokkos::deep_copy(exec, out.ids, ih);
    Kokkos::deep_copy(exec, out.weights, wh);
    exec.fence();
  }
};

// share = (r + 1) / (1 + 2 + ... + n) of expert e's output on moe_tp member r of n (the shares sum
// to the whole); share < 0: the whole expert on every member (the contract ignored).
struct ShareExperts {
  double share;
  void operator()(const Space& exec, const ExpertBatch<double, Space>& b, const RowsView<double, Space>& y) const {
    auto xh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b.x);
    auto yh = Kokkos::create_mirror_view(y);
    for (int e = 0; e < b.experts(); ++e)
      for (std::int64_t r = b.offset(e); r < b.offset(e) + b.count(e); ++r)
        for (int f = 0; f < kHidden; ++f) yh(r, f) = (share < 0 ? 1.0 : share) * double(b.first_expert + e + 1) * xh(r, f);
    Kokkos::deep_copy(exec, y, yh);
    exec.fence();
  }
};

}  // namespace

TEST_CASE("MoeBridge: experts that ignore their moe_tp share are refused on every rank; a share gives the rows") {
  const auto& comm = world();
  const int np = comm.size();
  if (np < 2) return;  // moe_tp = 1: every member computes the whole expert by right
  const ProcessGroups pg(RuntimeLayout(LayoutConfig{.tp = np}), comm);  // tp_moe, moe_tp = np
  REQUIRE(pg.layout().bridge_path() == BridgePath::tp_moe);
  REQUIRE(pg.moe_tp().size() == np);
  const Space exec;
  const std::int64_t m = 6;
  RowsView<double, Space> xv("x", m, kHidden);
  auto xh = Kokkos::create_mirror_view(xv);
  for (std::int64_t i = 0; i < m; ++i)
    for (int f = 0; f < kHidden; ++f) xh(i, f) = value(i, f);
  Kokkos::deep_copy(xv, xh);
  const Rows<double, Replicated<AttnTp>, DpLocal, Space> x(xv);
  MoeBridge<MpiCommunicator, double, Space> bridge(pg, kExperts);
  OneRouter router;

  ShareExperts whole{-1.0};
  CHECK_THROWS_WITH_AS(bridge.run(exec, x, router, whole), doctest::Contains("computed the whole expert instead of its moe_tp share"),
                       LayoutError);

  ShareExperts share{double(pg.coords().moe_tp_rank + 1) / double(np * (np + 1) / 2)};
  const auto out = bridge.run(exec, x, router, share);
  auto oh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out.view());
  double worst = 0;
  for (std::int64_t i = 0; i < m; ++i)
    for (int f = 0; f < kHidden; ++f) worst = std::max(worst, std::abs(oh(i, f) - double(expert_of(i) + 1) * value(i, f)));
  CHECK(worst < 1e-12);
}
