// Expert locations on real ranks: every member must hold the same map (a member with another map
// makes every member throw the same error, and the group stays usable); the per-step loads summed
// over the ranks equal the counts of all ranks' tokens worked out on one rank; and EpBuffer with
// physical ids over a map with replicas gives the rows the logical experts would (replicas hold
// the same weights: expert e multiplies by e + 1 here, written out in the expected sum).
#include <doctest/doctest.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <relayout/comm.hpp>
#include <relayout/placement/ep.hpp>
#include <relayout/placement/expert_location_sync.hpp>
#include <relayout/placement/zipf_routing.hpp>
#include <vector>

#include "mpi_world.hpp"

using namespace relayout;
using relayout::test::world;

namespace {
using Space = Kokkos::DefaultExecutionSpace;
using Ids = Kokkos::View<int**, Kokkos::LayoutRight, Space::memory_space>;
const std::vector<double> kLoad{40, 3, 9, 1, 7, 7, 2, 11};
}  // namespace

TEST_CASE("expert location: the same map on every member, or the same error on every member") {
  const auto& comm = world();
  const Space exec;
  const auto loc = ExpertLocation::rebalanced(kLoad, 4, 4);
  CHECK_NOTHROW(require_same_expert_location(exec, comm, loc));
  if (comm.size() < 2) return;
  // Member 1 rebalanced from another load: its map differs.
  std::vector<double> other = kLoad;
  other[0] = 1;
  const auto mine = comm.rank() == 1 ? ExpertLocation::rebalanced(other, 4, 4) : loc;
  REQUIRE((comm.rank() == 1) == (mine.fingerprint() != loc.fingerprint()));
  CHECK_THROWS_WITH_AS(require_same_expert_location(exec, comm, mine),
                       "expert location differs across the group: members [1] hold another map than member 0; every "
                       "member must dispatch with the same logical -> physical map",
                       LayoutError);
  CHECK_NOTHROW(require_same_expert_location(exec, comm, loc));  // the group is still usable
}

TEST_CASE("expert load: each rank counts its tokens, the sum over ranks is every token's count") {
  const auto& comm = world();
  const Space exec;
  const int np = comm.size(), ep = 4;
  const auto loc = ExpertLocation::rebalanced(kLoad, 4, ep);
  const ZipfRouting z{.experts = 8, .top_k = 3, .s = 1.2, .seed = 5};
  const std::int64_t rows = 50;
  for (ReplicaChoice c : {ReplicaChoice::static_per_rank, ReplicaChoice::by_token}) {
    Ids ids("ids", rows, 3), phys("phys", rows, 3);
    zipf_topk_ids(exec, z, comm.rank() * rows, ids);
    to_physical(exec, replica_table(exec, loc, comm.rank() % ep, c), ids, comm.rank() * rows, phys);
    const ExpertLoad total = sum_expert_load(exec, comm, loc, count_expert_load(exec, loc, phys));
    // Every rank's tokens, routed and placed on the host.
    std::vector<std::int64_t> want(static_cast<std::size_t>(loc.physical()), 0);
    Kokkos::View<int**, Kokkos::LayoutRight, Kokkos::HostSpace> all("all", static_cast<std::size_t>(rows * np), 3);
    zipf_topk_ids(Kokkos::DefaultHostExecutionSpace(), z, 0, all);
    for (std::int64_t t = 0; t < rows * np; ++t)
      for (int j = 0; j < 3; ++j)
        ++want[static_cast<std::size_t>(loc.choose(all(t, j), t, static_cast<int>(t / rows) % ep, c))];
    CHECK(total.physical == want);
    std::int64_t sum = 0;
    for (auto v : total.members) sum += v;
    CHECK(sum == rows * np * 3);
  }
}

namespace {

double value(int s, std::int64_t i, int f) { return 1.0 + s * 100.0 + double(i) + 0.01 * f; }
double weight_of(int k) { return 1.0 / double(k + 2); }
constexpr int kHidden = 3;

// The engine's experts under a map with replicas: physical expert p computes logical_of(p), here
// y = (logical + 1) x.
// Expert e of the batch scales by its logical id + 1, read from the batch (the buffer's one map).
struct LogicalScale {
  void operator()(const Space& exec, const ExpertBatch<double, Space>& b, const RowsView<double, Space>& y) const {
    auto xh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b.x);
    auto yh = Kokkos::create_mirror_view(y);
    for (int e = 0; e < b.experts(); ++e)
      for (std::int64_t r = b.offset(e); r < b.offset(e) + b.count(e); ++r)
        for (int f = 0; f < kHidden; ++f) yh(r, f) = double(b.logical_expert(e) + 1) * xh(r, f);
    Kokkos::deep_copy(exec, y, yh);
  }
};

}  // namespace

TEST_CASE("EpBuffer with an expert location: every replica choice gives the logical experts' rows") {
  const auto& comm = world();
  const int np = comm.size(), s = comm.rank();
  const ProcessGroups pg(RuntimeLayout(LayoutConfig{.tp = np, .dp = np, .enable_dp_attention = true,
                                                    .moe_a2a_backend = Backend::deepep}),
                         comm);
  const Space exec;
  // moe_ep = np; np redundant experts (none at np 1), rebalanced for a Zipf load.
  const auto loc = ExpertLocation::rebalanced(kLoad, np > 1 ? np : 0, np);
  const ZipfRouting z{.experts = 8, .top_k = 2, .s = 1.2, .seed = 8};
  const std::int64_t m = 12;
  RowsView<double, Space> xv("x", m, kHidden);
  auto xh = Kokkos::create_mirror_view(xv);
  for (std::int64_t i = 0; i < m; ++i)
    for (int f = 0; f < kHidden; ++f) xh(i, f) = value(s, i, f);
  Kokkos::deep_copy(xv, xh);
  const Rows<double, RowShard<AttnTp>, DpLocal, Space> x(xv, m);
  Ids logical("logical", m, 2);
  zipf_topk_ids(exec, z, s * m, logical);
  auto lh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), logical);
  const auto shared_loc = std::make_shared<const ExpertLocation>(loc);
  for (ReplicaChoice c : {ReplicaChoice::static_per_rank, ReplicaChoice::by_token}) {
    // The router's logical ids; the buffer maps them to replicas (by_token: token s * m + i).
    TopK<double, Space> route(m, 2);
    Kokkos::deep_copy(route.ids, logical);
    EpBuffer<MpiCommunicator, double, Space> buf(pg, 8, {.expert_location = shared_loc, .replica_choice = c});
    Kokkos::deep_copy(route.weights, 0.0);
    auto wh = Kokkos::create_mirror_view(route.weights);
    for (std::int64_t i = 0; i < m; ++i)
      for (int k = 0; k < 2; ++k) wh(i, k) = weight_of(k);
    Kokkos::deep_copy(route.weights, wh);
    const auto h = buf.dispatch(exec, x, route, {.first_token = s * m});
    const auto y = buf.expert_outputs(h);
    LogicalScale{}(exec, h.batch(), y);
    for (int e = 0; e < h.batch().experts(); ++e)
      CHECK(h.batch().logical_expert(e) == loc.logical_of(h.batch().first_expert + e));
    const auto out = buf.combine(exec, h, y);
    // The load the buffer counted: every (token, expert) pair of this rank once.
    std::int64_t counted = 0;
    for (auto v : buf.expert_load().physical) counted += v;
    CHECK(counted == m * 2);
    auto oh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out.view());
    double worst = 0;
    for (std::int64_t i = 0; i < m; ++i)
      for (int f = 0; f < kHidden; ++f) {
        double want = 0;
        for (int k = 0; k < 2; ++k) want += weight_of(k) * double(lh(i, k) + 1) * value(s, i, f);
        worst = std::max(worst, std::abs(oh(i, f) - want));
      }
    CHECK_MESSAGE(worst <= 1e-12, std::string(to_string(c)));
  }
}
