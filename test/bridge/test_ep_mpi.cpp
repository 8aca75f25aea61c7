// EP dispatch/combine and the bridge executor on real ranks. Expected values come from the test's
// own formulas: row i of rank s holds value(s, i, f); expert e multiplies by (e + 1); the router's
// choice is a fixed function of (s, i, k). The code under test only moves and sums.
#include <doctest/doctest.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdint>
#include <relayout/bridge.hpp>
#include <relayout/comm.hpp>
#include <relayout/placement.hpp>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "mpi_world.hpp"

using namespace relayout;

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using relayout::test::world;
constexpr int kHidden = 5, kExperts = 8;

double value(int s, std::int64_t i, int f) { return 1.0 + s * 100.0 + double(i) + 0.01 * f; }
// Row (s, i)'s k-th expert and weight: distinct experts, spread over the ranks.
int expert_of(int s, std::int64_t i, int k, int K) { return int((s * 7 + i * 3 + k * (kExperts / K + 1)) % kExperts); }
double weight_of(int k) { return 1.0 / double(k + 2); }

// Expert e: y = (e + 1) x. Records the experts it saw, to check the grouping.
template <class T>
struct ScaleExpertsOf {
  std::vector<int> seen_first;
  void operator()(const Space& exec, const ExpertBatch<T, Space>& b, const RowsView<T, Space>& y) {
    auto xh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b.x);
    auto yh = Kokkos::create_mirror_view(y);
    for (int e = 0; e < b.experts(); ++e)
      for (std::int64_t r = b.offset(e); r < b.offset(e) + b.count(e); ++r)
        for (int f = 0; f < kHidden; ++f) yh(r, f) = T(b.first_expert + e + 1) * xh(r, f);
    Kokkos::deep_copy(exec, y, yh);
    seen_first.push_back(b.first_expert);
  }
};
using ScaleExperts = ScaleExpertsOf<double>;

struct Setup {
  ProcessGroups pg;
  std::int64_t m;
  Rows<double, RowShard<AttnTp>, DpLocal, Space> rows;
  TopK<double, Space> route;
};

// Every rank its own DP group and the EP all-to-all: path direct, moe_ep = np.
RuntimeLayout direct_layout(int np) {
  return RuntimeLayout(LayoutConfig{.tp = np, .dp = np, .enable_dp_attention = true, .moe_a2a_backend = Backend::deepep});
}

RowsView<double, Space> rows_of(int s, std::int64_t m) {
  RowsView<double, Space> v("x", std::size_t(m), kHidden);
  auto h = Kokkos::create_mirror_view(v);
  for (std::int64_t i = 0; i < m; ++i)
    for (int f = 0; f < kHidden; ++f) h(i, f) = value(s, i, f);
  Kokkos::deep_copy(v, h);
  return v;
}

TopK<double, Space> route_of(int s, std::int64_t m, int K) {
  TopK<double, Space> r(m, K);
  auto ih = Kokkos::create_mirror_view(r.ids);
  auto wh = Kokkos::create_mirror_view(r.weights);
  for (std::int64_t i = 0; i < m; ++i)
    for (int k = 0; k < K; ++k) {
      ih(i, k) = expert_of(s, i, k, K);
      wh(i, k) = weight_of(k);
    }
  Kokkos::deep_copy(r.ids, ih);
  Kokkos::deep_copy(r.weights, wh);
  return r;
}

}  // namespace

TEST_CASE("ep_dispatch/ep_combine: each row once per destination rank, complete rows back in order") {
  const int np = world().size(), s = world().rank();
  const ProcessGroups pg(direct_layout(np), world());
  for (int K : {1, 2, 4}) {
    CAPTURE(K);
    const std::int64_t m = s == 1 ? 0 : 6 + s;  // rank 1 is idle and still takes part
    const Rows<double, RowShard<AttnTp>, DpLocal, Space> x(rows_of(s, m), m);
    const TopK<double, Space> route = route_of(s, m, K);
    std::vector<std::int64_t> tags;
    for (std::int64_t i = 0; i < m; ++i) tags.push_back(s * 1000 + i);
    TrafficLog log;
    const Space exec;
    const Dispatched<double, Space> d = ep_dispatch(exec, pg, x, route, kExperts, &log, &tags);

    // Rows sent: one per (row, destination rank holding at least one of its experts).
    const int per_rank = kExperts / np;
    std::int64_t expect_sent = 0;
    for (std::int64_t i = 0; i < m; ++i) {
      std::set<int> dest;
      for (int k = 0; k < K; ++k) dest.insert(expert_of(s, i, k, K) / per_rank);
      expect_sent += std::int64_t(dest.size());
    }
    CHECK(d.sent == expect_sent);
    // One message per sent row: k weights (8 B) and k ids (4 B), padded to 8 B, then the row.
    if (np > 1)
      CHECK(log.bytes_of(TrafficOp::dispatch, GroupKind::moe_ep) ==
            expect_sent * ((K * 12 + 7) / 8 * 8 + kHidden * 8));
    // Every received row is routed here, and its tag names its source row.
    for (std::int64_t t : d.tags) {
      const int src = int(t / 1000);
      const std::int64_t i = t % 1000;
      bool here = false;
      for (int k = 0; k < K; ++k) here = here || expert_of(src, i, k, K) / per_rank == world().rank();
      CHECK(here);
    }
    // The batch groups rows by local expert: group e holds exactly the (row, k) pairs routed to it.
    CHECK(d.batch.first_expert == s * per_rank);
    CHECK(d.batch.experts() == per_rank);

    ScaleExperts experts;
    RowsView<double, Space> y("y", std::size_t(d.batch.rows()), kHidden);
    experts(exec, d.batch, y);
    const auto out = ep_combine(exec, pg, d, y, &log);
    REQUIRE(out.rows() == m);
    CHECK(out.full_rows() == m);
    auto oh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out.view());
    double err = 0;
    for (std::int64_t i = 0; i < m; ++i)
      for (int f = 0; f < kHidden; ++f) {
        double want = 0;
        for (int k = 0; k < K; ++k) want += weight_of(k) * double(expert_of(s, i, k, K) + 1) * value(s, i, f);
        err = std::max(err, std::abs(oh(i, f) - want));
      }
    CHECK(err < 1e-12);
  }
}

TEST_CASE("ep_dispatch: top-4 moves at most twice the bytes of top-1 at ep 2 (once per destination rank)") {
  if (world().size() != 2) return;
  const ProcessGroups pg(RuntimeLayout(LayoutConfig{.tp = 2, .dp = 2, .enable_dp_attention = true,
                                                    .moe_a2a_backend = Backend::deepep}),
                         world());
  const std::int64_t m = 64;
  const Space exec;
  std::int64_t bytes[5] = {};
  for (int K : {1, 4}) {
    TrafficLog log;
    const Rows<double, RowShard<AttnTp>, DpLocal, Space> x(rows_of(world().rank(), m), m);
    const auto d = ep_dispatch(exec, pg, x, route_of(world().rank(), m, K), kExperts, &log);
    ScaleExperts experts;
    RowsView<double, Space> y("y", std::size_t(d.batch.rows()), kHidden);
    experts(exec, d.batch, y);
    ep_combine(exec, pg, d, y, &log);
    bytes[K] = log.bytes_of(TrafficOp::dispatch, GroupKind::moe_ep) + log.bytes_of(TrafficOp::combine, GroupKind::moe_ep);
  }
  MESSAGE("dispatch+combine bytes: top-1 ", bytes[1], ", top-4 ", bytes[4]);
  CHECK(bytes[4] <= 2 * bytes[1] + m * 4 * 12 * 2);  // the rows at most twice, plus the ids and weights
  CHECK(bytes[4] > bytes[1]);
}

TEST_CASE("ep_dispatch: an expert id outside the model is a LayoutError, not a wild write") {
  const int np = world().size();
  const ProcessGroups pg(direct_layout(np), world());
  TopK<double, Space> r = route_of(world().rank(), 3, 2);
  auto ih = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), r.ids);
  ih(1, 1) = kExperts;
  Kokkos::deep_copy(r.ids, ih);
  const Rows<double, RowShard<AttnTp>, DpLocal, Space> x(rows_of(0, 3), 3);
  CHECK_THROWS_WITH_AS(ep_dispatch(Space(), pg, x, r, kExperts), doctest::Contains("1 expert id(s) outside [0, 8)"),
                       LayoutError);
}

TEST_CASE("ep_dispatch and local_experts: a NaN or infinite router weight is a LayoutError naming the route") {
  const int np = world().size();
  const ProcessGroups pg(direct_layout(np), world());
  for (double bad : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                     -std::numeric_limits<double>::infinity()}) {
    CAPTURE(bad);
    TopK<double, Space> r = route_of(world().rank(), 3, 2);
    auto wh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), r.weights);
    wh(2, 0) = bad;
    Kokkos::deep_copy(r.weights, wh);
    const Rows<double, RowShard<AttnTp>, DpLocal, Space> x(rows_of(0, 3), 3);
    CHECK_THROWS_WITH_AS(ep_dispatch(Space(), pg, x, r, kExperts),
                         doctest::Contains("1 router weight(s) NaN or infinite"), LayoutError);
    ScaleExperts experts;
    RowsView<double, Space> out("out", 3, kHidden);
    try {
      local_experts(Space(), x.view(), r, 0, kExperts, kExperts, experts, out);
      FAIL("local_experts took a NaN or infinite weight");
    } catch (const LayoutError& e) {
      CHECK(e.input() == "route");
      CHECK(std::string(e.what()).find("local_experts: 1 router weight(s) NaN or infinite") != std::string::npos);
    }
    CHECK(experts.seen_first.empty());  // refused before any expert ran
  }
}

TEST_CASE("ep_dispatch: a router output refused on one member makes every member throw (none waits forever)") {
  const int np = world().size(), s = world().rank();
  const ProcessGroups pg(direct_layout(np), world());
  TopK<double, Space> r = route_of(s, 4, 2);
  if (s == 0) {
    auto wh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), r.weights);
    wh(3, 1) = std::numeric_limits<double>::quiet_NaN();
    Kokkos::deep_copy(r.weights, wh);
  }
  const Rows<double, RowShard<AttnTp>, DpLocal, Space> x(rows_of(s, 4), 4);
  try {
    ep_dispatch(Space(), pg, x, r, kExperts);
    FAIL("ep_dispatch went on although member 0 refused its router output");
  } catch (const LayoutError& e) {
    CHECK(e.input() == "route");
    const std::string what = e.what();
    if (s == 0) CHECK(what.find("1 router weight(s) NaN or infinite") != std::string::npos);
    else CHECK(what.find("moe_ep member 0 refused its router output") != std::string::npos);
  }
  // The group is still usable: the next dispatch of good rows goes through.
  const auto d = ep_dispatch(Space(), pg, x, route_of(s, 4, 2), kExperts);
  CHECK(d.rows == 4);
}

TEST_CASE("EpWorkspace: a second dispatch + combine with the same workspace allocates nothing and gives the same rows") {
  const int np = world().size(), s = world().rank();
  const ProcessGroups pg(direct_layout(np), world());
  const std::int64_t m = 9 + s;
  const int K = 2;
  const Rows<double, RowShard<AttnTp>, DpLocal, Space> x(rows_of(s, m), m);
  const TopK<double, Space> route = route_of(s, m, K);
  const Space exec;
  EpWorkspace<double, Space> ws;
  std::vector<const double*> batch_at, out_at;
  std::vector<std::vector<double>> results;
  std::int64_t allocs_after_first = -1;
  for (int call = 0; call < 2; ++call) {
    const Dispatched<double, Space> d = ep_dispatch(exec, pg, x, route, kExperts, ws);
    const auto y = ws.expert_outputs(d.batch.rows(), kHidden);
    ScaleExperts experts;
    experts(exec, d.batch, y);
    const auto out = ep_combine(exec, pg, d, y);
    auto oh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out.view());
    results.emplace_back(oh.data(), oh.data() + oh.size());
    batch_at.push_back(d.batch.x.data());
    out_at.push_back(out.view().data());
    if (call == 0) allocs_after_first = ws.allocations();
  }
  CHECK(allocs_after_first > 0);
  CHECK(ws.allocations() == allocs_after_first);
  CHECK(batch_at[1] == batch_at[0]);
  CHECK(out_at[1] == out_at[0]);
  REQUIRE(results[0].size() == std::size_t(m * kHidden));
  CHECK(results[1] == results[0]);
  // And the rows are right: sum_k w_k (e_k + 1) x.
  double err = 0;
  for (std::int64_t i = 0; i < m; ++i)
    for (int f = 0; f < kHidden; ++f) {
      double want = 0;
      for (int k = 0; k < K; ++k) want += weight_of(k) * double(expert_of(s, i, k, K) + 1) * value(s, i, f);
      err = std::max(err, std::abs(results[1][std::size_t(i * kHidden + f)] - want));
    }
  CHECK(err < 1e-12);
}

TEST_CASE("ep_dispatch<bf16>: float rows travel as bf16 (half the row bytes) and come back from bf16-rounded inputs") {
  const int np = world().size(), s = world().rank();
  const ProcessGroups pg(direct_layout(np), world());
  const std::int64_t m = 7 + s;
  const int K = 2;
  RowsView<float, Space> xv("x", std::size_t(m), kHidden);
  TopK<float, Space> route(m, K);
  auto xh = Kokkos::create_mirror_view(xv);
  auto ih = Kokkos::create_mirror_view(route.ids);
  auto wh = Kokkos::create_mirror_view(route.weights);
  for (std::int64_t i = 0; i < m; ++i) {
    for (int f = 0; f < kHidden; ++f) xh(i, f) = float(value(s, i, f));  // e.g. 101.03: not a bf16 value
    for (int k = 0; k < K; ++k) {
      ih(i, k) = expert_of(s, i, k, K);
      wh(i, k) = float(weight_of(k));
    }
  }
  Kokkos::deep_copy(xv, xh);
  Kokkos::deep_copy(route.ids, ih);
  Kokkos::deep_copy(route.weights, wh);
  const Rows<float, RowShard<AttnTp>, DpLocal, Space> x(xv, m);
  const Space exec;
  TrafficLog log;
  EpWorkspace<float, Space> ws;
  const Dispatched<float, Space> d = ep_dispatch<bf16>(exec, pg, x, route, kExperts, ws, EpOptions{&log});
  // k weights (4 B) and k ids (4 B), then the row as bf16 (2 B each), padded to 4 B.
  CHECK(d.message.bytes == K * 8 + (kHidden * 2 + 3) / 4 * 4);
  if (np > 1) CHECK(log.bytes_of(TrafficOp::dispatch, GroupKind::moe_ep) == d.sent * d.message.bytes);
  ScaleExpertsOf<float> experts;
  const auto y = ws.expert_outputs(d.batch.rows(), kHidden);
  experts(exec, d.batch, y);
  const auto out = ep_combine(exec, pg, d, y);
  auto oh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out.view());
  double err_rounded = 0, err_exact = 0;
  for (std::int64_t i = 0; i < m; ++i)
    for (int f = 0; f < kHidden; ++f) {
      const float rounded = static_cast<float>(bf16(xh(i, f)));
      float want = 0, exact = 0;
      for (int k = 0; k < K; ++k) {
        want += wh(i, k) * float(ih(i, k) + 1) * rounded;
        exact += wh(i, k) * float(ih(i, k) + 1) * xh(i, f);
      }
      err_rounded = std::max(err_rounded, double(std::abs(oh(i, f) - want)));
      err_exact = std::max(err_exact, double(std::abs(oh(i, f) - exact)));
    }
  CHECK(err_rounded <= 1e-3);  // the experts saw bf16(x): float sums of the same products
  if (m > 0) CHECK(err_exact > 1e-2);  // and not x itself: the rows did travel as bf16
}

namespace {
// The router of the bridge tests: row i of rank s goes to expert_of(s, i, k, K) with weight_of(k)
// (path direct: the rows a rank routes are its own).
struct FixedRouter {
  int s = 0, K = 2;
  int top_k() const { return K; }
  void operator()(const Space& exec, const RowsView<float, Space>& x, TopK<float, Space>& out) const {
    auto ih = Kokkos::create_mirror_view(out.ids);
    auto wh = Kokkos::create_mirror_view(out.weights);
    for (std::size_t i = 0; i < x.extent(0); ++i)
      for (int k = 0; k < K; ++k) {
        ih(i, k) = expert_of(s, std::int64_t(i), k, K);
        wh(i, k) = float(weight_of(k));
      }
    Kokkos::deep_copy(exec, out.ids, ih);
    Kokkos::deep_copy(exec, out.weights, wh);
  }
};
}  // namespace

TEST_CASE("MoeBridge dispatch_dtype bf16/fp16: the rows travel in 2 bytes per value and the result is the rounded rows'") {
  const int np = world().size(), s = world().rank();
  const ProcessGroups pg(direct_layout(np), world());
  const std::int64_t m = 6 + s;
  const int K = 2;
  RowsView<float, Space> xv("x", std::size_t(m), kHidden);
  auto xh = Kokkos::create_mirror_view(xv);
  for (std::int64_t i = 0; i < m; ++i)
    for (int f = 0; f < kHidden; ++f) xh(i, f) = float(value(s, i, f));  // e.g. 101.03: not a bf16 value
  Kokkos::deep_copy(xv, xh);
  const Rows<float, Replicated<AttnTp>, DpLocal, Space> x(xv);
  const Space exec;
  FixedRouter router{s, K};
  // The message of one dispatched row, by this test's own count: k weights (4 B) and k ids (4 B),
  // then the row in 4-byte floats, or in 2-byte values padded to 4 B.
  const std::int64_t full = K * 8 + kHidden * 4, half = K * 8 + (kHidden * 2 + 3) / 4 * 4;
  std::int64_t sent = 0;  // rows this rank dispatches (one per destination rank of each row)
  for (std::int64_t i = 0; i < m; ++i) {
    std::set<int> dest;
    for (int k = 0; k < K; ++k) dest.insert(expert_of(s, i, k, K) / (kExperts / np));
    sent += std::int64_t(dest.size());
  }
  for (const DispatchDtype dt : {DispatchDtype::compute, DispatchDtype::bf16, DispatchDtype::fp16}) {
    CAPTURE(int(dt));
    BridgeOptions o;
    o.dispatch_dtype = dt;
    MoeBridge<MpiCommunicator, float, Space> bridge(pg, kExperts, o);
    ScaleExpertsOf<float> experts;
    TrafficLog log;
    const auto y = bridge.run(exec, x, nullptr, router, experts, nullptr, NoObserver{}, &log);
    if (np > 1)
      CHECK(log.bytes_of(TrafficOp::dispatch, GroupKind::moe_ep) == sent * (dt == DispatchDtype::compute ? full : half));
    REQUIRE(y.rows() == m);
    auto yh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y.view());
    double err_rounded = 0, err_exact = 0;
    for (std::int64_t i = 0; i < m; ++i)
      for (int f = 0; f < kHidden; ++f) {
        const float v = xh(i, f);
        const float rounded = dt == DispatchDtype::bf16   ? static_cast<float>(bf16(v))
                              : dt == DispatchDtype::fp16 ? static_cast<float>(fp16(v))
                                                          : v;
        double want = 0, exact = 0;
        for (int k = 0; k < K; ++k) {
          want += weight_of(k) * double(expert_of(s, i, k, K) + 1) * double(rounded);
          exact += weight_of(k) * double(expert_of(s, i, k, K) + 1) * double(v);
        }
        // Tolerance: float sums of at most K products, relative 1e-6 of the value.
        err_rounded = std::max(err_rounded, std::abs(double(yh(i, f)) - want) / std::abs(want));
        err_exact = std::max(err_exact, std::abs(double(yh(i, f)) - exact) / std::abs(exact));
      }
    CHECK(err_rounded <= 1e-6);
    // bf16 keeps 8 significant bits, fp16 11: the rows did travel rounded.
    if (dt == DispatchDtype::bf16) CHECK(err_exact > 1e-4);
    if (dt == DispatchDtype::fp16) CHECK(err_exact > 1e-5);
  }
}

TEST_CASE("MoeBridge: a 16-bit dispatch dtype on a path that does not dispatch is a LayoutError") {
  const int np = world().size();
  const ProcessGroups pg(RuntimeLayout(LayoutConfig{.tp = np, .dp = np, .enable_dp_attention = true}), world());
  BridgeOptions o;
  o.dispatch_dtype = DispatchDtype::bf16;
  using Bridge = MoeBridge<MpiCommunicator, float, Space>;
  CHECK_THROWS_WITH_AS(Bridge(pg, kExperts, o), doctest::Contains("needs a path that dispatches rows"), LayoutError);
}

TEST_CASE("bridge plans: each path's plan sums the expert outputs exactly once and names its groups") {
  CHECK(plan_sums(bridge_plan(BridgePath::dp_gather)) == 1);
  CHECK(plan_sums(bridge_plan(BridgePath::dp_gather, PaddingMode::max_len)) == 1);
  CHECK(plan_sums(bridge_plan(BridgePath::dp_gather, PaddingMode::sum_len, BridgeRestore::scatter)) == 1);
  CHECK(plan_sums(bridge_plan(BridgePath::a2a_split)) == 1);
  CHECK(plan_sums(bridge_plan(BridgePath::tp_moe)) == 1);
  const auto a = bridge_plan(BridgePath::a2a_split);
  REQUIRE(a.size() == 7);
  CHECK(a[0].step == BridgeStep::split_rows);
  CHECK(a[2].group == GroupKind::moe_ep);
  CHECK(a[6].step == BridgeStep::all_gather);
  CHECK(a[6].group == GroupKind::attn_tp);
  const auto g = bridge_plan(BridgePath::dp_gather, PaddingMode::max_len);
  CHECK(g[0].step == BridgeStep::dp_gather);
  CHECK(g.back().step == BridgeStep::dp_reduce_scatter);
}
