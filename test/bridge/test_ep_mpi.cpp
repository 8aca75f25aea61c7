// EP dispatch/combine and the bridge executor on real ranks. Expected values come from the test's
// own formulas: row i of rank s holds value(s, i, f); expert e multiplies by (e + 1); the router's
// choice is a fixed function of (s, i, k). The code under test only moves and sums.
#include <doctest/doctest.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdint>
#include <relayout/bridge.hpp>
#include <relayout/bridge/testing.hpp>
#include <relayout/comm.hpp>
#include <relayout/placement.hpp>
#include <limits>
#include <memory>
#include <optional>
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
        for (std::size_t f = 0; f < xh.extent(1); ++f) yh(r, f) = T(b.first_expert + e + 1) * xh(r, f);
    Kokkos::deep_copy(exec, y, yh);
    exec.fence();  // yh ends here
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

using Buffer = EpBuffer<MpiCommunicator, double, Space>;

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

// Rows rank s holds in the first test (rank 1 idle).
std::int64_t rows_on(int s) { return s == 1 ? 0 : 6 + s; }

TEST_CASE("EpBuffer dispatch/combine: each row once per destination rank, complete rows back in order") {
  const int np = world().size(), s = world().rank();
  const ProcessGroups pg(direct_layout(np), world());
  Buffer buf(pg, kExperts);
  for (int K : {1, 2, 4}) {
    CAPTURE(K);
    const std::int64_t m = rows_on(s);  // rank 1 is idle and still takes part
    const Rows<double, RowShard<AttnTp>, DpLocal, Space> x(rows_of(s, m), m);
    const TopK<double, Space> route = route_of(s, m, K);
    std::vector<std::int64_t> tags;
    for (std::int64_t i = 0; i < m; ++i) tags.push_back(s * 1000 + i);
    TrafficLog log;
    const Space exec;
    const EpHandle<double, Space> d = buf.dispatch(exec, x, route, {.tags = &tags, .traffic = &log});
    CHECK(d.mode() == EpMode::normal);
    CHECK(d.rows() == m);

    // Rows sent: one per (row, destination rank holding at least one of its experts); rows
    // received: one per (row of any rank, this rank among its destinations).
    const int per_rank = kExperts / np;
    std::int64_t expect_sent = 0, expect_received = 0;
    for (int src = 0; src < np; ++src)
      for (std::int64_t i = 0; i < rows_on(src); ++i) {
        std::set<int> dest;
        for (int k = 0; k < K; ++k) dest.insert(expert_of(src, i, k, K) / per_rank);
        if (src == s) expect_sent += std::int64_t(dest.size());
        expect_received += dest.count(s) ? 1 : 0;
      }
    CHECK(d.received() == expect_received);
    REQUIRE(d.tags().size() == std::size_t(expect_received));
    // One message per sent row: k weights (8 B) and k ids (4 B), padded to 8 B, then the row.
    if (np > 1)
      CHECK(log.bytes_of(TrafficOp::dispatch, GroupKind::moe_ep) ==
            expect_sent * ((K * 12 + 7) / 8 * 8 + kHidden * 8));
    // Every received row is routed here, and its tag names its source row.
    for (std::int64_t t : d.tags()) {
      const int src = int(t / 1000);
      const std::int64_t i = t % 1000;
      bool here = false;
      for (int k = 0; k < K; ++k) here = here || expert_of(src, i, k, K) / per_rank == world().rank();
      CHECK(here);
    }
    // The batch groups rows by local expert: group e holds exactly the (row, k) pairs routed to it.
    CHECK(d.batch().first_expert == s * per_rank);
    CHECK(d.batch().experts() == per_rank);
    std::int64_t pairs_here = 0;  // (row, k) pairs of any rank routed to this rank's experts
    for (int src = 0; src < np; ++src)
      for (std::int64_t i = 0; i < rows_on(src); ++i)
        for (int k = 0; k < K; ++k) pairs_here += expert_of(src, i, k, K) / per_rank == s ? 1 : 0;
    CHECK(d.batch().rows() == pairs_here);

    ScaleExperts experts;
    RowsView<double, Space> y("y", std::size_t(d.batch().rows()), kHidden);
    experts(exec, d.batch(), y);
    const auto out = buf.combine(exec, d, y);
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

// Expert e: y = (e + 1) x, reading an indexed batch (the rows where they arrived, through the index).
struct ScaleIndexedExperts {
  static constexpr bool reads_indexed_rows = true;
  void operator()(const Space& exec, const ExpertBatch<double, Space>& b, const RowsView<double, Space>& y) const {
    REQUIRE(b.indexed);
    auto ih = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b.index);
    auto yh = Kokkos::create_mirror_view(y);
    for (int e = 0; e < b.experts(); ++e)
      for (std::int64_t r = b.offset(e); r < b.offset(e) + b.count(e); ++r)
        for (int f = 0; f < kHidden; ++f) yh(r, f) = double(b.first_expert + e + 1) * b.source[ih(r) * b.source_ld + f];
    Kokkos::deep_copy(exec, y, yh);
    exec.fence();
  }
};

TEST_CASE("EpBuffer dispatch with indexed_batch: the experts read the received rows through an index, same result") {
  const int np = world().size(), s = world().rank();
  const ProcessGroups pg(direct_layout(np), world());
  const Space exec;
  Buffer buf(pg, kExperts);  // both handles live at once: each keeps its own memory
  for (int K : {1, 2, 4}) {
    CAPTURE(K);
    const std::int64_t m = 5 + 2 * s;
    const Rows<double, RowShard<AttnTp>, DpLocal, Space> x(rows_of(s, m), m);
    const TopK<double, Space> route = route_of(s, m, K);
    const EpHandle<double, Space> dc = buf.dispatch(exec, x, route);
    const EpHandle<double, Space> di = buf.dispatch(exec, x, route, {.indexed_batch = true});
    const ExpertBatch<double, Space>& bc = dc.batch();
    const ExpertBatch<double, Space>& bi = di.batch();
    CHECK(!bc.indexed);
    CHECK(bi.indexed == (di.received() > 0));
    CHECK(bi.offsets == bc.offsets);
    CHECK(bi.x.extent(0) == 0);
    if (bi.indexed) {
      // Batch row r of the copy is the received row the index names.
      auto xc = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), bc.x);
      auto ih = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), bi.index);
      int wrong = 0;
      for (std::int64_t r = 0; r < bi.rows(); ++r)
        for (int f = 0; f < kHidden; ++f) wrong += xc(r, f) != bi.source[ih(r) * bi.source_ld + f];
      CHECK(wrong == 0);
    }
    ScaleExperts copied_experts;
    const ScaleIndexedExperts indexed_experts;
    const RowsView<double, Space> yc = buf.expert_outputs(dc), yi = buf.expert_outputs(di);
    copied_experts(exec, bc, yc);
    if (bi.indexed) indexed_experts(exec, bi, yi);
    else Kokkos::deep_copy(yi, yc);  // nothing received: both empty
    auto oc = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), buf.combine(exec, dc, yc).view());
    auto oi = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), buf.combine(exec, di, yi).view());
    int diffs = 0;
    double err = 0;
    for (std::int64_t i = 0; i < m; ++i)
      for (int f = 0; f < kHidden; ++f) {
        diffs += oc(i, f) != oi(i, f);
        double want = 0;
        for (int k = 0; k < K; ++k) want += weight_of(k) * double(expert_of(s, i, k, K) + 1) * value(s, i, f);
        err = std::max(err, std::abs(oi(i, f) - want));
      }
    CHECK(diffs == 0);
    CHECK(err < 1e-12);
  }
  // Rows travelling as another type (bf16) arrive converted: the batch is copied, whatever the option.
  const std::int64_t m = 4;
  const Rows<float, RowShard<AttnTp>, DpLocal, Space> xf(RowsView<float, Space>("xf", std::size_t(m), kHidden), m);
  TopK<float, Space> rf(m, 1);
  Kokkos::deep_copy(rf.ids, s * (kExperts / np));
  Kokkos::deep_copy(rf.weights, 1.0f);
  EpBuffer<MpiCommunicator, float, Space> bf(pg, kExperts);
  const EpHandle<float, Space> db = bf.dispatch(exec, xf, rf, {.dtype = DispatchDtype::bf16, .indexed_batch = true});
  CHECK(db.dtype() == DispatchDtype::bf16);
  CHECK(!db.batch().indexed);
  CHECK(db.batch().x.extent(0) == std::size_t(db.batch().rows()));
  CHECK(db.batch().rows() == m);  // every rank routes its rows to its own first expert
  const auto yb = bf.expert_outputs(db);
  Kokkos::deep_copy(yb, 0.0f);
  CHECK(bf.combine(exec, db, yb).rows() == m);
}

TEST_CASE("EpBuffer dispatch: top-4 moves at most twice the bytes of top-1 at ep 2 (once per destination rank)") {
  if (world().size() != 2) return;
  const ProcessGroups pg(RuntimeLayout(LayoutConfig{.tp = 2, .dp = 2, .enable_dp_attention = true,
                                                    .moe_a2a_backend = Backend::deepep}),
                         world());
  const std::int64_t m = 64;
  const Space exec;
  std::int64_t bytes[5] = {};
  Buffer buf(pg, kExperts);
  for (int K : {1, 4}) {
    TrafficLog log;
    const Rows<double, RowShard<AttnTp>, DpLocal, Space> x(rows_of(world().rank(), m), m);
    const auto d = buf.dispatch(exec, x, route_of(world().rank(), m, K), {.traffic = &log});
    ScaleExperts experts;
    const auto y = buf.expert_outputs(d);
    experts(exec, d.batch(), y);
    buf.combine(exec, d, y);
    bytes[K] = log.bytes_of(TrafficOp::dispatch, GroupKind::moe_ep) + log.bytes_of(TrafficOp::combine, GroupKind::moe_ep);
  }
  MESSAGE("dispatch+combine bytes: top-1 ", bytes[1], ", top-4 ", bytes[4]);
  CHECK(bytes[4] <= 2 * bytes[1] + m * 4 * 12 * 2);  // the rows at most twice, plus the ids and weights
  CHECK(bytes[4] > bytes[1]);
}

TEST_CASE("EpBuffer dispatch: an expert id outside the model is a LayoutError, not a wild write") {
  const int np = world().size();
  const ProcessGroups pg(direct_layout(np), world());
  TopK<double, Space> r = route_of(world().rank(), 3, 2);
  auto ih = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), r.ids);
  ih(1, 1) = kExperts;
  Kokkos::deep_copy(r.ids, ih);
  const Rows<double, RowShard<AttnTp>, DpLocal, Space> x(rows_of(0, 3), 3);
  Buffer buf(pg, kExperts);
  CHECK_THROWS_WITH_AS(buf.dispatch(Space(), x, r), doctest::Contains("EpBuffer::dispatch: 1 expert id(s) outside [0, 8)"),
                       LayoutError);
}

TEST_CASE("EpBuffer dispatch and local_experts: a NaN or infinite router weight is a LayoutError naming the route") {
  const int np = world().size();
  const ProcessGroups pg(direct_layout(np), world());
  Buffer buf(pg, kExperts);
  for (double bad : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                     -std::numeric_limits<double>::infinity()}) {
    CAPTURE(bad);
    TopK<double, Space> r = route_of(world().rank(), 3, 2);
    auto wh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), r.weights);
    wh(2, 0) = bad;
    Kokkos::deep_copy(r.weights, wh);
    const Rows<double, RowShard<AttnTp>, DpLocal, Space> x(rows_of(0, 3), 3);
    CHECK_THROWS_WITH_AS(buf.dispatch(Space(), x, r), doctest::Contains("1 router weight(s) NaN or infinite"),
                         LayoutError);
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

TEST_CASE("EpBuffer dispatch: a router output refused on one member makes every member throw (none waits forever)") {
  const int np = world().size(), s = world().rank();
  const ProcessGroups pg(direct_layout(np), world());
  Buffer buf(pg, kExperts);
  TopK<double, Space> r = route_of(s, 4, 2);
  if (s == 0) {
    auto wh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), r.weights);
    wh(3, 1) = std::numeric_limits<double>::quiet_NaN();
    Kokkos::deep_copy(r.weights, wh);
  }
  const Rows<double, RowShard<AttnTp>, DpLocal, Space> x(rows_of(s, 4), 4);
  try {
    buf.dispatch(Space(), x, r);
    FAIL("EpBuffer::dispatch went on although member 0 refused its router output");
  } catch (const LayoutError& e) {
    CHECK(e.input() == "route");
    const std::string what = e.what();
    if (s == 0) CHECK(what.find("1 router weight(s) NaN or infinite") != std::string::npos);
    else CHECK(what.find("moe_ep member 0 refused its router output") != std::string::npos);
  }
  // The group is still usable: the next dispatch of good rows goes through.
  const auto d = buf.dispatch(Space(), x, route_of(s, 4, 2));
  CHECK(d.rows() == 4);
}

TEST_CASE("EpBuffer: a second dispatch + combine with the same buffer allocates nothing and gives the same rows") {
  const int np = world().size(), s = world().rank();
  const ProcessGroups pg(direct_layout(np), world());
  const std::int64_t m = 9 + s;
  const int K = 2;
  const Rows<double, RowShard<AttnTp>, DpLocal, Space> x(rows_of(s, m), m);
  const TopK<double, Space> route = route_of(s, m, K);
  const Space exec;
  Buffer buf(pg, kExperts);
  std::vector<const double*> batch_at, out_at;
  std::vector<std::vector<double>> results;
  std::int64_t allocs_after_first = -1;
  for (int call = 0; call < 2; ++call) {
    const EpHandle<double, Space> d = buf.dispatch(exec, x, route);
    const auto y = buf.expert_outputs(d);
    ScaleExperts experts;
    experts(exec, d.batch(), y);
    const auto out = buf.combine(exec, d, y);
    auto oh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out.view());
    results.emplace_back(oh.data(), oh.data() + oh.size());
    batch_at.push_back(d.batch().x.data());
    out_at.push_back(out.view().data());
    if (call == 0) allocs_after_first = buf.allocations();
  }  // the first handle is gone before the second dispatch: its memory is reused
  CHECK(allocs_after_first > 0);
  CHECK(buf.allocations() == allocs_after_first);
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

TEST_CASE("EpBuffer dispatch dtype bf16: float rows travel as bf16 (half the row bytes) and come back from bf16-rounded inputs") {
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
  EpBuffer<MpiCommunicator, float, Space> buf(pg, kExperts);
  const EpHandle<float, Space> d = buf.dispatch(exec, x, route, {.dtype = DispatchDtype::bf16, .traffic = &log});
  CHECK(d.dtype() == DispatchDtype::bf16);
  // k weights (4 B) and k ids (4 B), then the row as bf16 (2 B each), padded to 4 B.
  const std::int64_t message = K * 8 + (kHidden * 2 + 3) / 4 * 4;
  CHECK(EpMessage::of<float, bf16>(K, kHidden).bytes == message);
  std::int64_t sent = 0;  // one message per (row, destination rank)
  for (std::int64_t i = 0; i < m; ++i) {
    std::set<int> dest;
    for (int k = 0; k < K; ++k) dest.insert(expert_of(s, i, k, K) / (kExperts / np));
    sent += std::int64_t(dest.size());
  }
  if (np > 1) CHECK(log.bytes_of(TrafficOp::dispatch, GroupKind::moe_ep) == sent * message);
  ScaleExpertsOf<float> experts;
  const auto y = buf.expert_outputs(d);
  experts(exec, d.batch(), y);
  const auto out = buf.combine(exec, d, y);
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
    exec.fence();  // the host mirrors end here
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
    o.ep_mode = EpMode::normal;  // one message per sent row (low latency sends whole blocks)
    MoeBridge<MpiCommunicator, float, Space> bridge(pg, kExperts, o);
    ScaleExpertsOf<float> experts;
    TrafficLog log;
    const auto y = bridge.run(exec, x, router, experts, {.traffic = &log});
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

namespace {
// bf16 rows: row r of DP group g holds its key g * 16 + r (an integer, exact in bf16) in column 0
// and key + 0.01 f after it (rounded to bf16). The router reads the key, so every member routes a
// row alike whichever subset of the rows the bridge hands it; expert e gives (e + 1) x, rounded to
// T. T = float runs the same rows widened, for the byte count of its bf16 dispatch.
template <class T>
struct KeyRouterOf {
  int K = 2;
  int top_k() const { return K; }
  void operator()(const Space& exec, const RowsView<T, Space>& x, TopK<T, Space>& out) const {
    static_assert(std::is_same_v<typename TopK<T, Space>::weight_type, float>);
    auto xh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x);
    auto ih = Kokkos::create_mirror_view(out.ids);
    auto wh = Kokkos::create_mirror_view(out.weights);
    for (std::size_t i = 0; i < x.extent(0); ++i)
      for (int k = 0; k < K; ++k) {
        ih(i, k) = expert_of(0, std::int64_t(float(xh(i, 0))), k, K);
        wh(i, k) = float(weight_of(k));  // 1/2, 1/3: the second is no bf16 value
      }
    Kokkos::deep_copy(exec, out.ids, ih);
    Kokkos::deep_copy(exec, out.weights, wh);
    exec.fence();
  }
};
template <class T>
struct KeyExpertsOf {
  int moe_tp = 1;  // each moe_tp member gives its share, (e + 1) x / moe_tp (exact: a power of 2)
  void operator()(const Space& exec, const ExpertBatch<T, Space>& b, const RowsView<T, Space>& y) const {
    auto xh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b.x);
    auto yh = Kokkos::create_mirror_view(y);
    for (int e = 0; e < b.experts(); ++e)
      for (std::int64_t r = b.offset(e); r < b.offset(e) + b.count(e); ++r)
        for (std::size_t f = 0; f < xh.extent(1); ++f)
          yh(r, f) = T(float(b.first_expert + e + 1) * float(xh(r, f)) / float(moe_tp));
    Kokkos::deep_copy(exec, y, yh);
    exec.fence();
  }
};
}  // namespace

// Every bf16 value the bridge stores is one rounding of an fp32 sum of positive terms, each at most
// the row's total: the per-rank weighted sum, then at most np - 1 sums over ranks (the MoE's
// reduction, or the EP combine's one sum). So |y - want| <= np 2^-8 |want| (+ fp32 slack), want the
// weighted sum of the experts' rounded outputs (a moe_tp share is that output over a power of 2:
// the same rounding).
TEST_CASE("MoeBridge<bf16>: bf16 rows on every path, fp32 router weights in the message, within the rounding bound") {
  const int np = world().size();
  const int K = 2;
  std::vector<LayoutConfig> layouts = {LayoutConfig{.tp = np}};
  if (np > 1) {
    layouts.push_back(LayoutConfig{.tp = np, .moe_a2a_backend = Backend::deepep});
    layouts.push_back(LayoutConfig{.tp = np, .dp = np, .enable_dp_attention = true});
    layouts.push_back(LayoutConfig{.tp = np, .dp = np, .enable_dp_attention = true, .moe_a2a_backend = Backend::deepep});
  }
  std::set<std::string> paths;
  for (const LayoutConfig& cfg : layouts) {
    const ProcessGroups pg{RuntimeLayout(cfg), world()};
    const int g = pg.coords().attn_dp_rank;
    const std::int64_t m = 6 + g;
    paths.insert(std::string(to_string(pg.layout().bridge_path())));
    CAPTURE(to_string(pg.layout().bridge_path()));
    RowsView<bf16, Space> xv("x", std::size_t(m), kHidden);
    auto xh = Kokkos::create_mirror_view(xv);
    for (std::int64_t i = 0; i < m; ++i)
      for (int f = 0; f < kHidden; ++f) xh(i, f) = bf16(float(g * 16 + i) + 0.01f * float(f));
    Kokkos::deep_copy(xv, xh);
    const Space exec;
    MoeBridge<MpiCommunicator, bf16, Space> bridge(pg, kExperts, {});
    KeyRouterOf<bf16> router{K};
    KeyExpertsOf<bf16> experts{pg.layout().widths().moe_tp};
    TrafficLog log;
    const auto y = bridge.run(exec, Rows<bf16, Replicated<AttnTp>, DpLocal, Space>(xv), router, experts, {.traffic = &log});
    REQUIRE(y.rows() == m);
    // Where rows are dispatched, the bytes are those of float rows dispatched as bf16 (fp32 weights
    // and ids, 2-byte values): the same rows widened, through MoeBridge<float>.
    if (dispatches_rows(pg.layout().bridge_path())) {
      RowsView<float, Space> wide("wide", std::size_t(m), kHidden);
      auto wh = Kokkos::create_mirror_view(wide);
      for (std::int64_t i = 0; i < m; ++i)
        for (int f = 0; f < kHidden; ++f) wh(i, f) = float(xh(i, f));
      Kokkos::deep_copy(wide, wh);
      BridgeOptions o;
      o.dispatch_dtype = DispatchDtype::bf16;
      MoeBridge<MpiCommunicator, float, Space> fbridge(pg, kExperts, o);
      KeyRouterOf<float> frouter{K};
      KeyExpertsOf<float> fexperts{pg.layout().widths().moe_tp};
      TrafficLog flog;
      (void)fbridge.run(exec, Rows<float, Replicated<AttnTp>, DpLocal, Space>(wide), frouter, fexperts, {.traffic = &flog});
      CHECK(log.bytes_of(TrafficOp::dispatch, GroupKind::moe_ep) == flog.bytes_of(TrafficOp::dispatch, GroupKind::moe_ep));
      CHECK(relayout::EpMessage::of<float, bf16>(K, kHidden).bytes == K * 8 + (kHidden * 2 + 3) / 4 * 4);
    }
    auto yh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y.view());
    int bad = 0;
    for (std::int64_t i = 0; i < m; ++i)
      for (int f = 0; f < kHidden; ++f) {
        double want = 0;
        for (int k = 0; k < K; ++k) {
          const int e = expert_of(0, g * 16 + i, k, K);
          want += double(float(weight_of(k))) * double(float(bf16(float(e + 1) * float(xh(i, f)))));
        }
        bad += std::abs(double(float(yh(i, f))) - want) > (np * std::ldexp(1.0, -8) + 1e-6) * std::abs(want);
      }
    CHECK(bad == 0);
  }
  if (np > 1) CHECK(paths.size() == 4);
}

TEST_CASE("MoeBridge dispatch_dtype fp8: e4m3 rows with a scale per 128 values, within amax / 28 of the fp32 dispatch") {
  const int np = world().size(), s = world().rank();
  const ProcessGroups pg(direct_layout(np), world());
  const std::int64_t m = 5 + s;
  const int K = 2, H = 300;  // three blocks of scales, the last one 44 values
  RowsView<float, Space> xv("x", std::size_t(m), std::size_t(H));
  auto xh = Kokkos::create_mirror_view(xv);
  for (std::int64_t i = 0; i < m; ++i)
    for (int f = 0; f < H; ++f) xh(i, f) = float((f % 3 == 0 ? -1.0 : 1.0) * value(s, i, f) / double(1 + f / 128));
  Kokkos::deep_copy(xv, xh);
  const Rows<float, Replicated<AttnTp>, DpLocal, Space> x(xv);
  const Space exec;
  FixedRouter router{s, K};
  // One row's message by this test's own count: k weights and k ids (4 B each), 3 fp32 scales,
  // 300 one-byte values (already a multiple of 4).
  const std::int64_t fp8_row = K * 8 + 3 * 4 + H;
  CHECK(EpMessage::of_fp8<float>(K, H).bytes == fp8_row);
  std::int64_t sent = 0;
  for (std::int64_t i = 0; i < m; ++i) {
    std::set<int> dest;
    for (int k = 0; k < K; ++k) dest.insert(expert_of(s, i, k, K) / (kExperts / np));
    sent += std::int64_t(dest.size());
  }
  std::vector<Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::HostSpace>> out;
  for (const DispatchDtype dt : {DispatchDtype::compute, DispatchDtype::fp8}) {
    BridgeOptions o;
    o.dispatch_dtype = dt;
    o.ep_mode = EpMode::normal;  // one message per sent row
    MoeBridge<MpiCommunicator, float, Space> bridge(pg, kExperts, o);
    ScaleExpertsOf<float> experts;
    TrafficLog log;
    const auto y = bridge.run(exec, x, router, experts, {.traffic = &log});
    if (np > 1 && dt == DispatchDtype::fp8) CHECK(log.bytes_of(TrafficOp::dispatch, GroupKind::moe_ep) == sent * fp8_row);
    REQUIRE(y.rows() == m);
    out.push_back(Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y.view()));
  }
  double worst = 0, largest = 0;  // error / bound, and the largest error
  for (std::int64_t i = 0; i < m; ++i)
    for (int f = 0; f < H; ++f) {
      float amax = 0;  // of the value's block
      for (int c = f / 128 * 128; c < std::min(H, f / 128 * 128 + 128); ++c) amax = std::max(amax, std::abs(xh(i, c)));
      double gain = 0, exact = 0;  // what the experts scale the value by, and the fp32 result
      for (int k = 0; k < K; ++k) {
        gain += weight_of(k) * double(expert_of(s, i, k, K) + 1);
        exact += weight_of(k) * double(expert_of(s, i, k, K) + 1) * double(xh(i, f));
      }
      CHECK(std::abs(double(out[0](i, f)) - exact) <= 1e-5 * std::abs(exact));
      const double err = std::abs(double(out[1](i, f)) - double(out[0](i, f)));
      // Each value is off by at most its block's amax / 28 (fp8.hpp), scaled by the experts' gain;
      // plus the float rounding of both results.
      const double bound = gain * double(amax) / 28.0 + 2e-5 * std::abs(exact);
      worst = std::max(worst, err / bound);
      largest = std::max(largest, err / std::abs(exact));
    }
  CHECK(worst <= 1.0);
  CHECK(largest > 1e-3);  // and the rows did travel as e4m3 (3 mantissa bits)
}

namespace {
// Expert p (physical) applies the weights of its logical expert: y = (logical + 1) x. Counts the
// rows each physical expert computed.
struct ReplicaExperts {
  std::shared_ptr<const ExpertLocation> loc;
  std::vector<std::int64_t> rows_of;  // per physical expert
  void operator()(const Space& exec, const ExpertBatch<float, Space>& b, const RowsView<float, Space>& y) {
    auto xh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b.x);
    auto yh = Kokkos::create_mirror_view(y);
    rows_of.assign(std::size_t(loc->physical()), 0);
    for (int e = 0; e < b.experts(); ++e) {
      const int p = b.first_expert + e;
      CHECK(b.logical_expert(e) == loc->logical_of(p));  // the batch names the bridge's current map
      rows_of[std::size_t(p)] += b.count(e);
      for (std::int64_t r = b.offset(e); r < b.offset(e) + b.count(e); ++r)
        for (std::size_t f = 0; f < xh.extent(1); ++f) yh(r, f) = float(loc->logical_of(p) + 1) * xh(r, f);
    }
    Kokkos::deep_copy(exec, y, yh);
    exec.fence();  // yh ends here
  }
};
}  // namespace

TEST_CASE("MoeBridge with redundant experts: every token is computed by exactly one replica of each of its experts") {
  const int np = world().size(), s = world().rank();
  if (np == 1) {  // replicas need moe_ep > 1
    CHECK_THROWS_WITH_AS(ExpertLocation::identity(kExperts, 1, 1), doctest::Contains("moe_ep = 1"), LayoutError);
    return;
  }
  const ProcessGroups pg(direct_layout(np), world());
  // np redundant experts: physical p holds logical p mod 8, so experts 0 .. np-1 have two replicas.
  auto loc = std::make_shared<const ExpertLocation>(ExpertLocation::identity(kExperts, np, np));
  const std::int64_t m = 7 + s;
  const int K = 2;
  RowsView<float, Space> xv("x", std::size_t(m), kHidden);
  auto xh = Kokkos::create_mirror_view(xv);
  for (std::int64_t i = 0; i < m; ++i)
    for (int f = 0; f < kHidden; ++f) xh(i, f) = float(value(s, i, f));
  Kokkos::deep_copy(xv, xh);
  const Rows<float, Replicated<AttnTp>, DpLocal, Space> x(xv);
  const Space exec;
  FixedRouter router{s, K};
  for (const ReplicaChoice choice : {ReplicaChoice::by_token, ReplicaChoice::static_per_rank}) {
    CAPTURE(to_string(choice));
    BridgeOptions o;
    o.expert_location = loc;
    o.replica_choice = choice;
    MoeBridge<MpiCommunicator, float, Space> bridge(pg, kExperts, o);
    ReplicaExperts experts{loc, {}};
    const auto y = bridge.run(exec, x, router, experts);
    // A token sent to two replicas of one expert would be summed twice: the output is exact only
    // if each of its experts computed it once.
    auto yh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y.view());
    double err = 0;
    for (std::int64_t i = 0; i < m; ++i)
      for (int f = 0; f < kHidden; ++f) {
        double want = 0;
        for (int k = 0; k < K; ++k) want += weight_of(k) * double(expert_of(s, i, k, K) + 1) * xh(i, f);
        err = std::max(err, std::abs(double(yh(i, f)) - want) / want);
      }
    CHECK(err <= 1e-6);
    // The rows the replicas computed, over all ranks, per logical expert: the (token, expert)
    // pairs routed to it, counted here from the router's rule.
    std::vector<std::int64_t> computed(experts.rows_of.size()), routed(std::size_t(kExperts), 0);
    MPI_Allreduce(experts.rows_of.data(), computed.data(), int(computed.size()), MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    for (int r = 0; r < np; ++r)
      for (std::int64_t i = 0; i < 7 + r; ++i)
        for (int k = 0; k < K; ++k) ++routed[std::size_t(expert_of(r, i, k, K))];
    std::vector<std::int64_t> per_logical(std::size_t(kExperts), 0);
    for (int p = 0; p < loc->physical(); ++p) per_logical[std::size_t(loc->logical_of(p))] += computed[std::size_t(p)];
    CHECK(per_logical == routed);
    // The bridge's load counts are the pairs the experts computed.
    const ExpertLoad total = sum_expert_load(exec, world(), *loc, bridge.last_expert_load());
    CHECK(total.physical == computed);
    CHECK(total.logical == routed);
    if (choice == ReplicaChoice::by_token)  // tokens of a replicated expert spread over both replicas
      for (int l = 0; l < np; ++l)
        if (routed[std::size_t(l)] >= 2) {
          CAPTURE(l);
          CHECK(computed[std::size_t(l)] > 0);
          CHECK(computed[std::size_t(l + kExperts)] > 0);
        }
  }
  // Refused: a location on a path that does not dispatch, or for other experts.
  BridgeOptions o;
  o.expert_location = loc;
  using Bridge = MoeBridge<MpiCommunicator, float, Space>;
  const ProcessGroups gathered(RuntimeLayout(LayoutConfig{.tp = np, .dp = np, .enable_dp_attention = true}), world());
  CHECK_THROWS_WITH_AS(Bridge(gathered, kExperts, o), doctest::Contains("needs a path that dispatches rows"), LayoutError);
  CHECK_THROWS_WITH_AS(Bridge(pg, 2 * kExperts, o), doctest::Contains("maps 8 routed experts"), LayoutError);
}

namespace {
// A skewed router: the first choice of most rows is expert 5, of every third row expert 6; the
// second is spread over the others. Row i's ids depend on (s, i) only.
int skewed_expert(int s, std::int64_t i, int k) {
  const int hot = i % 3 == 2 ? 6 : 5;
  if (k == 0) return hot;
  const int e = int((s + 3 * i) % kExperts);
  return e == hot ? (e + 1) % kExperts : e;
}
struct SkewedRouter {
  int s = 0;
  int top_k() const { return 2; }
  void operator()(const Space& exec, const RowsView<float, Space>& x, TopK<float, Space>& out) const {
    auto ih = Kokkos::create_mirror_view(out.ids);
    auto wh = Kokkos::create_mirror_view(out.weights);
    for (std::size_t i = 0; i < x.extent(0); ++i)
      for (int k = 0; k < 2; ++k) {
        ih(i, k) = skewed_expert(s, std::int64_t(i), k);
        wh(i, k) = float(weight_of(k));
      }
    Kokkos::deep_copy(exec, out.ids, ih);
    Kokkos::deep_copy(exec, out.weights, wh);
    exec.fence();
  }
};
}  // namespace

TEST_CASE("MoeBridge::set_expert_location: a map rebalanced from the counted load between runs, same rows, better balance") {
  const int np = world().size(), s = world().rank();
  const ProcessGroups pg(direct_layout(np), world());
  using Bridge = MoeBridge<MpiCommunicator, float, Space>;
  const Space exec;
  const std::int64_t m = 24;
  RowsView<float, Space> xv("x", std::size_t(m), kHidden);
  auto xh = Kokkos::create_mirror_view(xv);
  for (std::int64_t i = 0; i < m; ++i)
    for (int f = 0; f < kHidden; ++f) xh(i, f) = float(value(s, i, f));
  Kokkos::deep_copy(xv, xh);
  const Rows<float, Replicated<AttnTp>, DpLocal, Space> x(xv);
  // The rows every run must give: sum_k w_k (e_k + 1) x, whatever replica computed them.
  const auto check_rows = [&](const Rows<float, Replicated<AttnTp>, DpLocal, Space>& y) {
    auto yh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y.view());
    double err = 0;
    for (std::int64_t i = 0; i < m; ++i)
      for (int f = 0; f < kHidden; ++f) {
        double want = 0;
        for (int k = 0; k < 2; ++k) want += weight_of(k) * double(skewed_expert(s, i, k) + 1) * xh(i, f);
        err = std::max(err, std::abs(double(yh(i, f)) - want) / want);
      }
    return err;
  };
  SkewedRouter router{s};
  if (np == 1) {  // no replicas at moe_ep 1; a map of other experts is still refused
    BridgeOptions o;
    o.expert_location = std::make_shared<const ExpertLocation>(ExpertLocation::identity(kExperts, 0, 1));
    Bridge bridge(pg, kExperts, o);
    CHECK_THROWS_WITH_AS(bridge.set_expert_location(exec, ExpertLocation::identity(2 * kExperts, 0, 1)),
                         doctest::Contains("maps 16 routed experts over moe_ep = 1; the buffer routes 8"), LayoutError);
    ReplicaExperts experts{o.expert_location, {}};
    CHECK(check_rows(bridge.run(exec, x, router, experts)) <= 1e-6);
    return;
  }
  // The first map replicates experts 0 .. np-1; the router's hot experts 5 and 6 have one replica.
  auto first = std::make_shared<const ExpertLocation>(ExpertLocation::identity(kExperts, np, np));
  BridgeOptions o;
  o.expert_location = first;
  Bridge bridge(pg, kExperts, o);
  ReplicaExperts experts{first, {}};
  CHECK(check_rows(bridge.run(exec, x, router, experts)) <= 1e-6);
  const ExpertLoad before = sum_expert_load(exec, world(), *first, bridge.last_expert_load());
  // The (token, expert) pairs per logical expert, from the router's rule.
  std::vector<std::int64_t> routed(std::size_t(kExperts), 0);
  for (int r = 0; r < np; ++r)
    for (std::int64_t i = 0; i < m; ++i)
      for (int k = 0; k < 2; ++k) ++routed[std::size_t(skewed_expert(r, i, k))];
  CHECK(before.logical == routed);
  // Per member, the pairs its physical experts computed under the first map: counted here.
  std::vector<std::int64_t> members(std::size_t(np), 0), computed(experts.rows_of.size());
  MPI_Allreduce(experts.rows_of.data(), computed.data(), int(computed.size()), MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  for (int p = 0; p < first->physical(); ++p) members[std::size_t(first->rank_of(p))] += computed[std::size_t(p)];
  CHECK(before.members == members);

  // Rebalanced from the counted load, set between runs: the same rows, a better balance.
  const ExpertLocation next = ExpertLocation::rebalanced(before.logical_as_double(), np, np);
  REQUIRE_FALSE(next == *first);
  bridge.set_expert_location(exec, next);
  CHECK(*bridge.expert_location() == next);
  experts.loc = bridge.expert_location();
  CHECK(check_rows(bridge.run(exec, x, router, experts)) <= 1e-6);
  const ExpertLoad after = sum_expert_load(exec, world(), next, bridge.last_expert_load());
  CHECK(after.logical == routed);
  computed.assign(experts.rows_of.size(), 0);
  MPI_Allreduce(experts.rows_of.data(), computed.data(), int(computed.size()), MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  std::vector<std::int64_t> per_logical(std::size_t(kExperts), 0);
  members.assign(std::size_t(np), 0);
  for (int p = 0; p < next.physical(); ++p) {
    per_logical[std::size_t(next.logical_of(p))] += computed[std::size_t(p)];
    members[std::size_t(next.rank_of(p))] += computed[std::size_t(p)];
  }
  CHECK(per_logical == routed);  // every pair computed once, by a replica of the new map
  CHECK(after.members == members);
  const double was = max_over_mean(before.members), now = max_over_mean(after.members);
  if (s == 0) MESSAGE("max/mean (token, expert) pairs per member at np ", np, ": ", was, " -> ", now);
  CHECK(now < was);
  CHECK(now < 1.3);

  // Refused on every rank, the bridge keeping its map: another expert count, a null map, a map
  // refused on one rank only, and maps that differ between ranks.
  CHECK_THROWS_WITH_AS(bridge.set_expert_location(exec, ExpertLocation::identity(2 * kExperts, np, np)),
                       doctest::Contains("maps 16 routed experts"), LayoutError);
  CHECK_THROWS_WITH_AS(bridge.set_expert_location(exec, std::shared_ptr<const ExpertLocation>{}),
                       doctest::Contains("the expert location is null"), LayoutError);
  // (Every rank calls from the same line: the collectives name their call site, and differing
  // sites are a collective mismatch of their own.)
  const std::string refused = s == 0 ? "maps 16 routed experts" : "rank 0 of the TP domain refused";
  CHECK_THROWS_WITH_AS(bridge.set_expert_location(exec, s == 0 ? ExpertLocation::identity(2 * kExperts, np, np) : next),
                       doctest::Contains(refused.c_str()), LayoutError);
  CHECK_THROWS_WITH_AS(bridge.set_expert_location(exec, s == 0 ? *first : next),
                       doctest::Contains("expert location differs across the group"), LayoutError);
  CHECK(*bridge.expert_location() == next);
  CHECK(check_rows(bridge.run(exec, x, router, experts)) <= 1e-6);
  // A bridge made with maps that differ between ranks refuses its first run on every rank.
  BridgeOptions mixed;
  mixed.expert_location = s == 0 ? first : bridge.expert_location();
  Bridge other(pg, kExperts, mixed);
  ReplicaExperts mixed_experts{mixed.expert_location, {}};
  CHECK_THROWS_WITH_AS(other.run(exec, x, router, mixed_experts), doctest::Contains("expert location differs across the group"),
                       LayoutError);
}

TEST_CASE("MoeBridge: a 16-bit dispatch dtype on a path that does not dispatch is a LayoutError") {
  const int np = world().size();
  const ProcessGroups pg(RuntimeLayout(LayoutConfig{.tp = np, .dp = np, .enable_dp_attention = true}), world());
  BridgeOptions o;
  o.dispatch_dtype = DispatchDtype::bf16;
  using Bridge = MoeBridge<MpiCommunicator, float, Space>;
  CHECK_THROWS_WITH_AS(Bridge(pg, kExperts, o), doctest::Contains("needs a path that dispatches rows"), LayoutError);
  o.dispatch_dtype = DispatchDtype::fp8;
  CHECK_THROWS_WITH_AS(Bridge(pg, kExperts, o), doctest::Contains("dispatch_dtype fp8 needs a path that dispatches rows"),
                       LayoutError);
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

namespace {
// A router that reads each row's experts off its values (row (s, i) starts with 1 + 100 s + i), so
// every rank that routes a row routes it alike, on every path.
struct ValueRouter {
  static constexpr int K = 2;
  int top_k() const { return K; }
  static int expert_for(double x0, int k) { return (int(std::lround(x0)) + 3 * k) % kExperts; }
  void operator()(const Space& exec, const RowsView<float, Space>& x, TopK<float, Space>& out) const {
    auto xh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x);
    auto ih = Kokkos::create_mirror_view(out.ids);
    auto wh = Kokkos::create_mirror_view(out.weights);
    for (std::size_t i = 0; i < x.extent(0); ++i)
      for (int k = 0; k < K; ++k) {
        ih(i, k) = expert_for(xh(i, 0), k);
        wh(i, k) = float(weight_of(k));
      }
    Kokkos::deep_copy(exec, out.ids, ih);
    Kokkos::deep_copy(exec, out.weights, wh);
    exec.fence();  // the host mirrors end here
  }
};
}  // namespace

TEST_CASE("MoeBridge::run: token counts given or gathered by the bridge; owners, observer and traffic as options") {
  const int np = world().size(), s = world().rank();
  // Every rank its own DP group, experts over ep = np, no all-to-all backend: path dp_gather
  // (tp_moe at np 1), whose gathered buffer is laid out from the counts.
  const ProcessGroups pg(RuntimeLayout(LayoutConfig{.tp = np, .dp = np, .ep = np, .enable_dp_attention = np > 1}),
                         world());
  const std::int64_t m = 2 + s;
  RowsView<float, Space> xv("x", std::size_t(m), kHidden);
  auto xh = Kokkos::create_mirror_view(xv);
  for (std::int64_t i = 0; i < m; ++i)
    for (int f = 0; f < kHidden; ++f) xh(i, f) = float(value(s, i, f));
  Kokkos::deep_copy(xv, xh);
  const Rows<float, Replicated<AttnTp>, DpLocal, Space> x(xv);
  const Space exec;
  MoeBridge<MpiCommunicator, float, Space> bridge(pg, kExperts);
  ValueRouter router;
  ScaleExpertsOf<float> experts;
  const auto check = [&](const Rows<float, Replicated<AttnTp>, DpLocal, Space>& y) {
    REQUIRE(y.rows() == m);
    auto yh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y.view());
    double err = 0;
    for (std::int64_t i = 0; i < m; ++i)
      for (int f = 0; f < kHidden; ++f) {
        double want = 0;
        for (int k = 0; k < ValueRouter::K; ++k)
          want += weight_of(k) * double(ValueRouter::expert_for(xh(i, 0), k) + 1) * double(xh(i, f));
        err = std::max(err, std::abs(double(yh(i, f)) - want) / std::abs(want));
      }
    CHECK(err <= 1e-6);  // float sums of K products
  };
  const std::vector<std::int64_t> counts = bridge.gather_num_tokens(m);
  std::vector<std::int64_t> want_counts;
  for (int r = 0; r < np; ++r) want_counts.push_back(2 + r);
  CHECK(counts == want_counts);
  check(bridge.run(exec, x, router, experts, {.global_num_tokens = counts}));
  check(bridge.run(exec, x, router, experts));  // the bridge gathers the counts itself

  std::vector<std::int64_t> owners;
  for (std::int64_t i = 0; i < m; ++i) owners.push_back(1000 * s + i);
  const std::vector<std::int64_t> in_owners = owners;
  std::vector<std::string> seen;
  TrafficLog log;
  check(bridge.run(exec, x, router, experts,
                   {.owners = &owners,
                    .observer = [&](const BoundaryInfo& b, std::span<const std::int64_t>, const RowsView<float, Space>&,
                                    std::int64_t) { seen.emplace_back(b.name); },
                    .traffic = &log}));
  CHECK(owners == in_owners);
  std::vector<std::string> want_seen;  // every step of the plan but route, which leaves the rows as they are
  for (const PlanStep& p : bridge.plan(counts))
    if (p.step != BridgeStep::route) want_seen.emplace_back(p.name);
  CHECK(seen == want_seen);
  if (np > 1) CHECK(log.calls_of(TrafficOp::all_gatherv, GroupKind::tp) + log.calls_of(TrafficOp::all_gather, GroupKind::tp) >= 1);
  // A wrong owner count is refused before anything moves.
  std::vector<std::int64_t> short_owners(std::size_t(m + 1), 0);
  CHECK_THROWS_WITH_AS(bridge.run(exec, x, router, experts, {.owners = &short_owners}),
                       doctest::Contains("owners for"), LayoutError);
}

TEST_CASE("gather_num_tokens under attention CP: one entry per (DP group, CP rank) share, as the bridge's") {
  const int np = world().size(), s = world().rank();
  if (np < 2) return;
  // attn_cp = np: every rank is a CP share of the one DP group.
  {
    const ProcessGroups pg(RuntimeLayout(LayoutConfig{.tp = np, .cp = np}), world());
    REQUIRE(pg.layout().widths().attn_cp == np);
    std::vector<std::int64_t> want;
    for (int r = 0; r < np; ++r) want.push_back(3 * r + 1);
    CHECK(gather_num_tokens(pg, 3 * s + 1) == want);
    const MoeBridge<MpiCommunicator, float, Space> bridge(pg, kExperts);
    CHECK(bridge.gather_num_tokens(3 * s + 1) == want);
  }
  if (np == 4) {
    // attn_cp 2 x attn_tp 2: ranks {0, 1} and {2, 3} are the shares; their members agree.
    const ProcessGroups pg(RuntimeLayout(LayoutConfig{.tp = 4, .cp = 2}), world());
    REQUIRE(pg.layout().widths().attn_tp == 2);
    CHECK(gather_num_tokens(pg, 5 + s / 2) == std::vector<std::int64_t>{5, 6});
    CHECK_THROWS_WITH_AS(gather_num_tokens(pg, s), doctest::Contains("attention-TP group leader reports"), LayoutError);
  }
}

TEST_CASE("bridge vocabulary: faults and restores by name, the fault and dispatch-dtype rules, typed plan placements") {
  CHECK(parse_fault("no_split") == BridgeFault::no_split);
  CHECK(to_string(BridgeFault::gather_partial) == "gather_partial");
  CHECK_THROWS_WITH_AS(parse_fault("foo", "--inject"),
                       "--inject: unknown injected bug 'foo'; expected one of: none, double_reduce, skip_reduce, "
                       "gather_partial, no_split",
                       LayoutError);
  CHECK(parse_restore("scatter") == BridgeRestore::scatter);
  CHECK(to_string(BridgeRestore::reduce) == "reduce");
  CHECK_THROWS_WITH_AS(parse_restore("sum", "--restore"), doctest::Contains("--restore: unknown restore 'sum'"), LayoutError);

  const RuntimeLayout tp_moe(LayoutConfig{.tp = 2, .ep = 2});
  REQUIRE(tp_moe.bridge_path() == BridgePath::tp_moe);
  CHECK_NOTHROW(check_fault(BridgeFault::double_reduce, tp_moe));
  CHECK_THROWS_WITH_AS(check_fault(BridgeFault::no_split, tp_moe, "--inject"),
                       "--inject no_split needs path a2a_split (attn_tp > 1 with an all-to-all backend); this layout "
                       "takes path tp_moe with tp = 2, attn_tp = 2",
                       LayoutError);
  CHECK_THROWS_WITH_AS(check_fault(BridgeFault::double_reduce, RuntimeLayout(LayoutConfig{.tp = 1})),
                       doctest::Contains("needs a layout whose MoE partials are summed over tp > 1"), LayoutError);
  CHECK(dispatches_rows(BridgePath::direct));
  CHECK(!dispatches_rows(BridgePath::dp_gather));
  CHECK_NOTHROW(check_dispatch_dtype(DispatchDtype::bf16, BridgePath::a2a_split));
  CHECK_NOTHROW(check_dispatch_dtype(DispatchDtype::compute, BridgePath::tp_moe));
  CHECK_THROWS_WITH_AS(check_dispatch_dtype(DispatchDtype::fp16, BridgePath::dp_gather, "--dispatch-dtype"),
                       "--dispatch-dtype fp16 needs a path that dispatches rows (a2a_split or direct: --moe-a2a-backend "
                       "deepep); this layout takes path dp_gather",
                       LayoutError);

  // Every plan step's placement is the type the executor's rows have there.
  const auto a = bridge_plan(BridgePath::a2a_split);
  CHECK(a[0].placement == Placement{RowState::row_shard, GroupKind::attn_tp, RowScope::dp_local});
  CHECK(!a[1].placement);  // route: the rows of the step before
  CHECK(!a[2].placement);  // dispatched: grouped by local expert on the experts' ranks
  CHECK(a[4].placement == placement_of<RowShard<AttnTp>, DpLocal>);
  CHECK(a[6].placement == placement_of<Replicated<AttnTp>, DpLocal>);
  const auto g = bridge_plan(BridgePath::dp_gather, PaddingMode::sum_len, BridgeRestore::scatter);
  CHECK(g[0].placement == placement_of<Replicated<group::Tp>, DpGlobal>);
  CHECK(g[2].placement == placement_of<Partial<group::Tp>, DpGlobal>);
  CHECK(g[3].placement == placement_of<Replicated<group::Tp>, DpGlobal>);
  CHECK(g[4].placement == placement_of<Replicated<AttnTp>, DpLocal>);
  CHECK(bridge_plan(BridgePath::tp_moe)[1].placement == placement_of<Partial<group::Tp>, DpLocal>);
}

TEST_CASE("EpMode::low_latency: one exchange of fixed blocks gives the normal mode's rows exactly; overflow refused on every member") {
  const int np = world().size(), s = world().rank();
  const ProcessGroups pg(direct_layout(np), world());
  const Space exec;
  const int K = 3;
  for (const std::int64_t m : {std::int64_t(0), std::int64_t(1 + s), std::int64_t(4 + 2 * s)}) {
    CAPTURE(m);
    const Rows<double, RowShard<AttnTp>, DpLocal, Space> x(rows_of(s, m), m);
    const TopK<double, Space> route = route_of(s, m, K);
    const std::vector<std::int64_t> tags = [&] {
      std::vector<std::int64_t> t;
      for (std::int64_t i = 0; i < m; ++i) t.push_back(100 * s + i);
      return t;
    }();
    Buffer normal(pg, kExperts), low(pg, kExperts, {.num_max_dispatch_tokens_per_rank = 4 + 2 * (np - 1)});
    TrafficLog n_log, l_log;
    const EpHandle<double, Space> dn = normal.dispatch(exec, x, route, {.tags = &tags, .traffic = &n_log});
    const EpHandle<double, Space> dl =
        low.dispatch(exec, x, route, {.mode = EpMode::low_latency, .tags = &tags, .traffic = &l_log});
    CHECK(dn.mode() == EpMode::normal);
    CHECK(dl.mode() == EpMode::low_latency);
    CHECK(dl.received() == dn.received());
    CHECK(dl.batch().offsets == dn.batch().offsets);
    CHECK(std::vector<std::int64_t>(dl.tags().begin(), dl.tags().end()) ==
          std::vector<std::int64_t>(dn.tags().begin(), dn.tags().end()));
    CHECK(dl.batch_tags(exec) == dn.batch_tags(exec));
    ScaleExperts experts;
    const auto yn = normal.expert_outputs(dn);
    const auto yl = low.expert_outputs(dl);
    experts(exec, dn.batch(), yn);
    experts(exec, dl.batch(), yl);
    auto bn = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), dn.batch().x);
    auto bl = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), dl.batch().x);
    bool same_batch = bn.extent(0) == bl.extent(0);
    for (std::size_t i = 0; same_batch && i < bn.extent(0); ++i)
      for (int f = 0; f < kHidden; ++f) same_batch = same_batch && bn(i, f) == bl(i, f);
    CHECK(same_batch);
    auto on = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), normal.combine(exec, dn, yn).view());
    auto ol = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), low.combine(exec, dl, yl).view());
    REQUIRE(ol.extent(0) == std::size_t(m));
    bool same = true;
    double err = 0;  // and both are the rows the test computes itself
    for (std::int64_t i = 0; i < m; ++i)
      for (int f = 0; f < kHidden; ++f) {
        same = same && on(i, f) == ol(i, f);
        double want = 0;
        for (int k = 0; k < K; ++k) want += weight_of(k) * double(expert_of(s, i, k, K) + 1) * value(s, i, f);
        err = std::max(err, std::abs(ol(i, f) - want) / want);
      }
    CHECK(same);
    CHECK(err <= 1e-14);
    // Low latency sends its whole blocks: ep x (head + capacity messages), whatever the rows.
    if (np > 1)
      CHECK(l_log.bytes_of(TrafficOp::dispatch, GroupKind::moe_ep) ==
            np * (16 + low.low_latency_capacity() * EpMessage::of<double>(K, kHidden).bytes));
  }
  // Over the capacity on one member: every member throws (none waits), the one over it names its
  // rows and the capacity, the others name that member.
  if (np > 1) {
    const std::int64_t m = s == 1 ? 5 : 2;
    const Rows<double, RowShard<AttnTp>, DpLocal, Space> x(rows_of(s, m), m);
    Buffer low(pg, kExperts, {.num_max_dispatch_tokens_per_rank = 4});
    const std::string want = s == 1 ? "this member dispatches 5 rows, over the low-latency capacity of 4 rows per rank"
                                    : "moe_ep member 1 dispatches 5 rows, over the low-latency capacity of 4 rows per rank";
    CHECK_THROWS_WITH_AS(low.dispatch(exec, x, route_of(s, m, K), {.mode = EpMode::low_latency}),
                         doctest::Contains(want.c_str()), LayoutError);
    // The same rows in normal mode go through: the capacity bounds low-latency calls only.
    CHECK(low.dispatch(exec, x, route_of(s, m, K)).rows() == m);
  }
  CHECK_THROWS_WITH_AS(Buffer(pg, kExperts, {.num_max_dispatch_tokens_per_rank = 0}),
                       doctest::Contains("num_max_dispatch_tokens_per_rank = 0; a low-latency block holds at least 1 row"),
                       LayoutError);
  CHECK(parse_ep_mode("low_latency") == EpMode::low_latency);
  CHECK_THROWS_WITH_AS(parse_ep_mode("fast", "--deepep-mode"), doctest::Contains("--deepep-mode: unknown EP mode 'fast'"),
                       LayoutError);
}

TEST_CASE("MoeBridge with ep_mode low_latency: the normal bridge's rows; refused where nothing is dispatched") {
  const int np = world().size(), s = world().rank();
  const ProcessGroups pg(direct_layout(np), world());
  const std::int64_t m = 3 + s;
  RowsView<float, Space> xv("x", std::size_t(m), kHidden);
  auto xh = Kokkos::create_mirror_view(xv);
  for (std::int64_t i = 0; i < m; ++i)
    for (int f = 0; f < kHidden; ++f) xh(i, f) = float(value(s, i, f));
  Kokkos::deep_copy(xv, xh);
  const Rows<float, Replicated<AttnTp>, DpLocal, Space> x(xv);
  const Space exec;
  FixedRouter router{s, 2};
  ScaleExpertsOf<float> experts;
  MoeBridge<MpiCommunicator, float, Space> normal(pg, kExperts, {.ep_mode = EpMode::normal});
  MoeBridge<MpiCommunicator, float, Space> low(pg, kExperts,
                                               {.ep_mode = EpMode::low_latency, .num_max_dispatch_tokens_per_rank = 3 + np});
  auto yn = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), normal.run(exec, x, router, experts).view());
  auto yl = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), low.run(exec, x, router, experts).view());
  REQUIRE(yl.extent(0) == yn.extent(0));
  bool same = true;
  for (std::size_t i = 0; i < yn.extent(0); ++i)
    for (int f = 0; f < kHidden; ++f) same = same && yn(i, f) == yl(i, f);
  CHECK(same);
  const ProcessGroups gather(RuntimeLayout(LayoutConfig{.tp = np, .dp = np, .ep = np, .enable_dp_attention = np > 1}), world());
  using Bridge = MoeBridge<MpiCommunicator, float, Space>;
  CHECK_THROWS_WITH_AS(Bridge(gather, kExperts, {.ep_mode = EpMode::low_latency, .num_max_dispatch_tokens_per_rank = 4}),
                       doctest::Contains("ep_mode low_latency needs a path that dispatches rows"), LayoutError);
  CHECK_THROWS_WITH_AS(Bridge(pg, kExperts, {.ep_mode = EpMode::low_latency, .num_max_dispatch_tokens_per_rank = 0}),
                       doctest::Contains("num_max_dispatch_tokens_per_rank = 0; a low-latency block holds at least 1 row"),
                       LayoutError);
}

namespace {
using FloatBridge = MoeBridge<MpiCommunicator, float, Space>;
using FloatRows = Rows<float, Replicated<AttnTp>, DpLocal, Space>;

// DP group g's n rows: row i holds value(g, i, f) (ValueRouter routes it by value(g, i, 0)).
FloatRows group_rows(int g, std::int64_t n) {
  RowsView<float, Space> v("x", std::size_t(n), kHidden);
  auto h = Kokkos::create_mirror_view(v);
  for (std::int64_t i = 0; i < n; ++i)
    for (int f = 0; f < kHidden; ++f) h(i, f) = float(value(g, i, f));
  Kokkos::deep_copy(v, h);
  return FloatRows(v);
}

// The largest relative difference of rows [first, first + n) of DP group g from the formula
// sum_k w_k (e_k + 1) x, e_k ValueRouter's choice.
double value_router_error(const RowsView<float, Space>& y, int g, std::int64_t first, std::int64_t n) {
  REQUIRE(std::int64_t(y.extent(0)) == n);
  auto yh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y);
  double err = 0;
  for (std::int64_t i = 0; i < n; ++i)
    for (int f = 0; f < kHidden; ++f) {
      const double x = double(float(value(g, first + i, f)));
      double want = 0;
      for (int k = 0; k < ValueRouter::K; ++k)
        want += weight_of(k) * double(ValueRouter::expert_for(value(g, first + i, 0), k) + 1) * x;
      err = std::max(err, std::abs(double(yh(i, f)) - want) / std::abs(want));
    }
  return err;
}

bool same_values(const RowsView<float, Space>& a, const RowsView<float, Space>& b) {
  if (a.extent(0) != b.extent(0)) return false;
  auto ah = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), a);
  auto bh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b);
  for (std::size_t i = 0; i < ah.extent(0); ++i)
    for (std::size_t f = 0; f < ah.extent(1); ++f)
      if (ah(i, f) != bh(i, f)) return false;
  return true;
}

// Messages this rank sends in a normal-mode dispatch of its DP group's n rows: one per (row of its
// attn_tp chunk, moe_ep member holding one of the row's experts).
std::int64_t messages_sent(const ProcessGroups& pg, std::int64_t n) {
  const int g = pg.coords().attn_dp_rank, per_rank = kExperts / pg.layout().widths().moe_ep;
  const Range mine = tensor_split_range(n, pg.layout().widths().attn_tp, pg.coords().attn_tp_rank);
  std::int64_t sent = 0;
  for (std::int64_t i = mine.begin; i < mine.begin + mine.count; ++i) {
    std::set<int> dest;
    for (int k = 0; k < ValueRouter::K; ++k) dest.insert(ValueRouter::expert_for(value(g, i, 0), k) / per_rank);
    sent += std::int64_t(dest.size());
  }
  return sent;
}

struct NamedLayout {
  const char* name;
  RuntimeLayout layout;
};
// The dispatching layouts at this rank count: direct (every rank its own DP group), a2a_split (one
// DP group split over attn_tp = np) from 2 ranks, a2a_split with two DP groups at 4.
std::vector<NamedLayout> dispatching(int np) {
  std::vector<NamedLayout> c;
  c.push_back({"direct", direct_layout(np)});
  if (np >= 2) c.push_back({"a2a_split", RuntimeLayout(LayoutConfig{.tp = np, .moe_a2a_backend = Backend::deepep})});
  if (np == 4)
    c.push_back({"a2a_split dp 2", RuntimeLayout(LayoutConfig{.tp = 4, .dp = 2, .enable_dp_attention = true,
                                                              .moe_a2a_backend = Backend::deepep})});
  return c;
}

// The message of a failed call (empty: it did not throw) and the input it named.
struct Thrown {
  std::string what, input;
  bool threw() const { return !what.empty(); }
  bool names(const std::string& s) const { return what.find(s) != std::string::npos; }
};
template <class F>
Thrown thrown_by(F&& f) {
  try {
    f();
  } catch (const LayoutError& e) {
    return {e.what(), std::string(e.input())};
  }
  return {};
}
}  // namespace

TEST_CASE("MoeBridge one bridge for prefill and decode: auto mode picks normal, then low latency, the forced bridge's rows") {
  const int np = world().size();
  const Space exec;
  ValueRouter router;
  constexpr std::int64_t kCap = 4;
  for (const NamedLayout& c : dispatching(np)) {
    CAPTURE(std::string(c.name));
    const ProcessGroups pg(c.layout, world());
    const int g = pg.coords().attn_dp_rank, A = c.layout.widths().attn_tp, ep = c.layout.widths().moe_ep;
    FloatBridge auto_bridge(pg, kExperts, {.num_max_dispatch_tokens_per_rank = kCap});
    FloatBridge normal_bridge(pg, kExperts, {.ep_mode = EpMode::normal, .num_max_dispatch_tokens_per_rank = kCap});
    CHECK(!auto_bridge.options().ep_mode);
    REQUIRE(auto_bridge.ep_buffer() != nullptr);
    CHECK(auto_bridge.ep_buffer()->low_latency_capacity() == kCap);
    // Low latency sends whole blocks to every member: a 16-byte head and kCap messages each.
    const std::int64_t message = EpMessage::of<float>(ValueRouter::K, kHidden).bytes;
    const std::int64_t blocks = ep * (16 + kCap * message);
    // Prefill: every DP group's largest attn_tp chunk holds more than kCap rows; decode: none does
    // (the last group's chunks are exactly kCap); an empty step.
    struct Step {
      const char* name;
      std::int64_t rows;
      EpMode mode;
    };
    const Step steps[] = {{"prefill", A * kCap + 1 + g, EpMode::normal},
                          {"decode", A * (1 + (g + (4 - c.layout.widths().attn_dp)) % 4), EpMode::low_latency},
                          {"empty", 0, EpMode::low_latency},
                          {"prefill again", A * kCap + 3, EpMode::normal}};
    for (const Step& st : steps) {
      CAPTURE(st.name);
      const FloatRows x = group_rows(g, st.rows);
      const std::vector<std::int64_t> counts = auto_bridge.gather_num_tokens(st.rows);
      CHECK(auto_ep_mode(counts, A, kCap) == st.mode);
      ScaleExpertsOf<float> ea, eb, en;
      TrafficLog ta, tb, tn;
      const FloatRows ya = auto_bridge.run(exec, x, router, ea, {.global_num_tokens = counts, .traffic = &ta});
      const FloatRows yb = auto_bridge.run(exec, x, router, eb, {.traffic = &tb});  // the bridge gathers the counts
      const FloatRows yn = normal_bridge.run(exec, x, router, en, {.traffic = &tn});
      CHECK(value_router_error(ya.view(), g, 0, st.rows) <= 1e-6);
      CHECK(same_values(ya.view(), yn.view()));
      CHECK(same_values(yb.view(), yn.view()));
      if (ep > 1) {
        const std::int64_t normal_bytes = messages_sent(pg, st.rows) * message;
        CHECK(tn.bytes_of(TrafficOp::dispatch, GroupKind::moe_ep) == normal_bytes);
        const std::int64_t want = st.mode == EpMode::low_latency ? blocks : normal_bytes;
        CHECK(ta.bytes_of(TrafficOp::dispatch, GroupKind::moe_ep) == want);
        CHECK(tb.bytes_of(TrafficOp::dispatch, GroupKind::moe_ep) == want);
      }
    }
    // The run's own mode over the bridge's: a decode step forced to normal sends one message per
    // row; a prefill step forced to low latency is over the capacity on every member, refused
    // on every member (none waits), and the bridge goes on.
    const FloatRows decode = group_rows(g, A), prefill = group_rows(g, A * kCap + 1);
    ScaleExpertsOf<float> e1, e2;
    TrafficLog t1;
    const FloatRows y1 = auto_bridge.run(exec, decode, router, e1, {.traffic = &t1, .ep_mode = EpMode::normal});
    CHECK(value_router_error(y1.view(), g, 0, A) <= 1e-6);
    if (ep > 1) CHECK(t1.bytes_of(TrafficOp::dispatch, GroupKind::moe_ep) == messages_sent(pg, A) * message);
    const Thrown over = thrown_by([&] { auto_bridge.run(exec, prefill, router, e2, {.ep_mode = EpMode::low_latency}); });
    CHECK(over.input == "capacity");
    CHECK(over.names("over the low-latency capacity of 4 rows per rank"));
    // A bridge forced to low latency, one run in normal mode (its rows over the capacity).
    FloatBridge low_bridge(pg, kExperts, {.ep_mode = EpMode::low_latency, .num_max_dispatch_tokens_per_rank = kCap});
    TrafficLog t2;
    const FloatRows y2 = low_bridge.run(exec, prefill, router, e2, {.traffic = &t2, .ep_mode = EpMode::normal});
    CHECK(value_router_error(y2.view(), g, 0, A * kCap + 1) <= 1e-6);
    if (ep > 1) CHECK(t2.bytes_of(TrafficOp::dispatch, GroupKind::moe_ep) == messages_sent(pg, A * kCap + 1) * message);
    CHECK(thrown_by([&] { low_bridge.run(exec, prefill, router, e2); }).names("over the low-latency capacity of 4 rows"));
  }
  CHECK(auto_ep_mode(std::vector<std::int64_t>{9, 8}, 2, 4) == EpMode::normal);  // ceil(9 / 2) = 5 > 4
  CHECK(auto_ep_mode(std::vector<std::int64_t>{8, 8}, 2, 4) == EpMode::low_latency);
  CHECK(auto_ep_mode(std::vector<std::int64_t>{}, 1, 4) == EpMode::low_latency);
  // A forced low-latency run where nothing is dispatched is refused as the option is.
  const ProcessGroups gather(RuntimeLayout(LayoutConfig{.tp = np, .dp = np, .ep = np, .enable_dp_attention = np > 1}), world());
  FloatBridge gb(gather, kExperts);
  ScaleExpertsOf<float> e;
  CHECK(gb.ep_buffer() == nullptr);
  CHECK(thrown_by([&] { gb.run(exec, group_rows(0, 2), router, e, {.ep_mode = EpMode::low_latency}); })
            .names("BridgeRunOptions::ep_mode low_latency needs a path that dispatches rows"));
}

TEST_CASE("EpBuffer: the mode is chosen per call on one buffer; both modes give the same rows") {
  const int np = world().size(), s = world().rank();
  const ProcessGroups pg(direct_layout(np), world());
  const Space exec;
  const int K = 2;
  Buffer buf(pg, kExperts, {.num_max_dispatch_tokens_per_rank = 6});
  for (const std::int64_t m : {std::int64_t(6), std::int64_t(2 + s % 3), std::int64_t(9)}) {
    CAPTURE(m);
    const Rows<double, RowShard<AttnTp>, DpLocal, Space> x(rows_of(s, m), m);
    const TopK<double, Space> route = route_of(s, m, K);
    std::vector<std::vector<double>> outs;
    for (const EpMode mode : {EpMode::normal, EpMode::low_latency}) {
      if (mode == EpMode::low_latency && m > 6) {  // over the capacity: refused on every member
        CHECK_THROWS_WITH_AS(buf.dispatch(exec, x, route, {.mode = mode}), doctest::Contains("over the low-latency capacity of 6"),
                             LayoutError);
        continue;
      }
      const EpHandle<double, Space> h = buf.dispatch(exec, x, route, {.mode = mode});
      CHECK(h.mode() == mode);
      const auto y = buf.expert_outputs(h);
      ScaleExperts experts;
      experts(exec, h.batch(), y);
      auto oh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), buf.combine(exec, h, y).view());
      outs.emplace_back(oh.data(), oh.data() + oh.size());
      double err = 0;
      for (std::int64_t i = 0; i < m; ++i)
        for (int f = 0; f < kHidden; ++f) {
          double want = 0;
          for (int k = 0; k < K; ++k) want += weight_of(k) * double(expert_of(s, i, k, K) + 1) * value(s, i, f);
          err = std::max(err, std::abs(oh(i, f) - want) / want);
        }
      CHECK(err <= 1e-14);
    }
    if (outs.size() == 2) CHECK(outs[0] == outs[1]);
  }
}

TEST_CASE("MoeBridge: rows that disagree with global_num_tokens on one rank only are the same error on every rank") {
  const int np = world().size(), s = world().rank();
  const Space exec;
  ValueRouter router;
  std::vector<NamedLayout> layouts = dispatching(np);
  if (np >= 2) layouts.push_back({"dp_gather", RuntimeLayout(LayoutConfig{.tp = np, .dp = np, .ep = np, .enable_dp_attention = true})});
  const int bad = np - 1;  // the one rank whose rows disagree (at np 1: the only one)
  for (const NamedLayout& c : layouts) {
    CAPTURE(std::string(c.name));
    const ProcessGroups pg(c.layout, world());
    const bool dispatches = dispatches_rows(c.layout.bridge_path());
    REQUIRE(dispatches == (std::string(c.name) != "dp_gather"));
    const int g = pg.coords().attn_dp_rank, groups = c.layout.widths().attn_dp;
    std::vector<std::int64_t> counts;  // the step's true counts: 3 + 2 q rows in DP group q
    for (int q = 0; q < groups; ++q) counts.push_back(3 + 2 * q);
    const std::int64_t held = counts[std::size_t(g)] + (s == bad ? 1 : 0);
    const FloatRows x = group_rows(g, held);
    FloatBridge bridge(pg, kExperts);
    ScaleExpertsOf<float> experts;
    for (const std::optional<EpMode> mode : {std::optional<EpMode>{}, std::optional<EpMode>{EpMode::normal},
                                             std::optional<EpMode>{EpMode::low_latency}}) {
      if (!dispatches && mode) continue;
      CAPTURE(mode ? to_string(*mode) : std::string_view("auto"));
      const Thrown t = thrown_by([&] { bridge.run(exec, x, router, experts, {.global_num_tokens = counts, .ep_mode = mode}); });
      CHECK(t.threw());
      CHECK(t.input == "global_num_tokens");
      CHECK(t.names("global_num_tokens"));
      if (s == bad) CHECK(t.names("holds " + std::to_string(held) + " rows"));
    }
    // The ranks are still in step: the true counts go through.
    const FloatRows good = group_rows(g, counts[std::size_t(g)]);
    const FloatRows y = bridge.run(exec, good, router, experts, {.global_num_tokens = counts});
    CHECK(value_router_error(y.view(), g, 0, counts[std::size_t(g)]) <= 1e-6);
  }
}

TEST_CASE("MoeBridge: global_num_tokens that differ on one rank only are the same error on every rank") {
  const int np = world().size(), s = world().rank();
  if (np < 2) return;  // one rank has nobody to differ from
  const Space exec;
  ValueRouter router;
  std::vector<NamedLayout> layouts;
  layouts.push_back({"direct", direct_layout(np)});
  if (np == 4) layouts.push_back(dispatching(np)[2]);  // a2a_split with 2 DP groups
  layouts.push_back({"dp_gather", RuntimeLayout(LayoutConfig{.tp = np, .dp = np, .ep = np, .enable_dp_attention = true})});
  for (const NamedLayout& c : layouts) {
    CAPTURE(std::string(c.name));
    const ProcessGroups pg(c.layout, world());
    const int g = pg.coords().attn_dp_rank, groups = c.layout.widths().attn_dp, A = c.layout.widths().attn_tp;
    std::vector<std::int64_t> counts;  // decode-sized: every chunk within the capacity of 4
    for (int q = 0; q < groups; ++q) counts.push_back(A * (1 + q % 2));
    // The last rank (in the last DP group) is told that group 0 holds 40 rows: its own count
    // still matches its rows, and in auto mode it alone would pick normal.
    std::vector<std::int64_t> told = counts;
    if (s == np - 1) told[0] = 40;
    REQUIRE((pg.coords().attn_dp_rank != 0 || s != np - 1));
    const FloatRows x = group_rows(g, counts[std::size_t(g)]);
    FloatBridge bridge(pg, kExperts, {.num_max_dispatch_tokens_per_rank = 4});
    ScaleExpertsOf<float> experts;
    const bool dispatches = dispatches_rows(c.layout.bridge_path());
    for (const std::optional<EpMode> mode : {std::optional<EpMode>{}, std::optional<EpMode>{EpMode::normal},
                                             std::optional<EpMode>{EpMode::low_latency}}) {
      if (!dispatches && mode) continue;
      CAPTURE(mode ? to_string(*mode) : std::string_view("auto"));
      const Thrown t = thrown_by([&] { bridge.run(exec, x, router, experts, {.global_num_tokens = told, .ep_mode = mode}); });
      CHECK(t.threw());
      CHECK(t.input == "global_num_tokens");
      CHECK(t.names("other token counts (global_num_tokens)"));
    }
    const FloatRows y = bridge.run(exec, x, router, experts, {.global_num_tokens = counts});
    CHECK(value_router_error(y.view(), g, 0, counts[std::size_t(g)]) <= 1e-6);
  }
}

TEST_CASE("MoeBridge scattered rows: one member passing a chunk other than tensor_split's is an error on every rank") {
  const int np = world().size(), s = world().rank();
  const Space exec;
  ValueRouter router;
  std::vector<NamedLayout> layouts = dispatching(np);
  layouts.push_back({"tp_moe", RuntimeLayout(LayoutConfig{.tp = np, .ep = np})});  // whole experts, moe_tp 1
  const int bad = np - 1;
  for (const NamedLayout& c : layouts) {
    CAPTURE(std::string(c.name));
    const ProcessGroups pg(c.layout, world());
    const int g = pg.coords().attn_dp_rank, A = c.layout.widths().attn_tp, me = pg.coords().attn_tp_rank;
    const std::int64_t n = 2 * A + 1;  // the DP group's rows
    const Range mine = tensor_split_range(n, A, me);
    // The bad member's chunk has one row fewer than tensor_split gives it; the others' are right.
    const std::int64_t held = mine.count - (s == bad ? 1 : 0);
    const FloatRows all = group_rows(g, n);
    const FloatBridge::ScatteredIn chunk(impl::row_slice(all.view(), mine.begin, held), n);
    FloatBridge bridge(pg, kExperts);
    ScaleExpertsOf<float> experts;
    const Thrown t = thrown_by([&] { bridge.run(exec, chunk, router, experts); });
    CHECK(t.threw());
    if (s == bad) CHECK(t.names("tensor_split gives member " + std::to_string(me) + " " + std::to_string(mine.count)));
    // The ranks are still in step: the right chunks go through.
    const FloatBridge::ScatteredIn right(impl::row_slice(all.view(), mine.begin, mine.count), n);
    const FloatBridge::ScatteredIn y = bridge.run(exec, right, router, experts);
    CHECK(value_router_error(y.view(), g, mine.begin, mine.count) <= 1e-6);
  }
}

TEST_CASE("errors of EpBuffer and MoeBridge name the caller's line, once") {
  const int np = world().size(), s = world().rank();
  const Space exec;
  const ProcessGroups pg(direct_layout(np), world());
  const auto at = [](int line) { return " (called at test_ep_mpi.cpp:" + std::to_string(line) + ")"; };
  const auto once = [](const std::string& what, const std::string& s) {
    const std::size_t first = what.find(s);
    return first != std::string::npos && what.find(" (called at ", first + 1) == std::string::npos;
  };
  // The bridge: one rank's rows disagree with the counts; every rank names the run's line.
  {
    ValueRouter router;
    ScaleExpertsOf<float> experts;
    FloatBridge bridge(pg, kExperts);
    std::vector<std::int64_t> counts;
    for (int q = 0; q < np; ++q) counts.push_back(2 + q);
    const FloatRows x = group_rows(s, 2 + s + (s == 0 ? 1 : 0));
    Thrown t;
    const int line = __LINE__ + 1;
    try { bridge.run(exec, x, router, experts, {.global_num_tokens = counts}); } catch (const LayoutError& e) { t = {e.what(), std::string(e.input())}; }
    CAPTURE(t.what);
    CHECK(once(t.what, at(line)));
    CHECK(t.what.ends_with(at(line)));
  }
  // EpBuffer::dispatch: an expert id out of range on one member.
  {
    Buffer buf(pg, kExperts);
    TopK<double, Space> r = route_of(s, 3, 2);
    if (s == 0) Kokkos::deep_copy(Kokkos::subview(r.ids, 0, 0), kExperts);
    const Rows<double, RowShard<AttnTp>, DpLocal, Space> x(rows_of(s, 3), 3);
    Thrown t;
    const int line = __LINE__ + 1;
    try { buf.dispatch(exec, x, r); } catch (const LayoutError& e) { t = {e.what(), std::string(e.input())}; }
    CAPTURE(t.what);
    CHECK(t.input == "route");
    CHECK(once(t.what, at(line)));
    CHECK(t.what.ends_with(at(line)));
    // EpBuffer::combine: outputs of the wrong shape (refused before any exchange, on every rank).
    const EpHandle<double, Space> h = buf.dispatch(exec, x, route_of(s, 3, 2));
    RowsView<double, Space> y("y", std::size_t(h.batch().rows() + 1), kHidden);
    const int line2 = __LINE__ + 1;
    try { buf.combine(exec, h, y); } catch (const LayoutError& e) { t = {e.what(), std::string(e.input())}; }
    CHECK(t.what.starts_with("EpBuffer::combine: the experts' outputs are"));
    CHECK(t.what.ends_with(at(line2)));
  }
  // Construction: a capacity of 0, through the bridge and the buffer.
  {
    Thrown t;
    const int line = __LINE__ + 1;
    try { FloatBridge b(pg, kExperts, {.num_max_dispatch_tokens_per_rank = 0}); } catch (const LayoutError& e) { t = {e.what(), std::string(e.input())}; }
    CHECK(t.input == "num_max_dispatch_tokens_per_rank");
    CHECK(t.what.ends_with(at(line)));
  }
}

namespace {
// Expert group e applies the weights of its logical expert, read from the batch:
// y = (logical_expert(e) + 1) x. Counts the groups whose logical expert differs from the map's.
struct LogicalExperts {
  std::shared_ptr<const ExpertLocation> loc;
  int wrong = 0, groups = 0;
  void operator()(const Space& exec, const ExpertBatch<double, Space>& b, const RowsView<double, Space>& y) {
    auto xh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b.x);
    auto yh = Kokkos::create_mirror_view(y);
    for (int e = 0; e < b.experts(); ++e) {
      ++groups;
      wrong += b.logical_expert(e) != loc->logical_of(b.first_expert + e);
      for (std::int64_t r = b.offset(e); r < b.offset(e) + b.count(e); ++r)
        for (std::size_t f = 0; f < xh.extent(1); ++f) yh(r, f) = double(b.logical_expert(e) + 1) * xh(r, f);
    }
    Kokkos::deep_copy(exec, y, yh);
    exec.fence();
  }
};
}  // namespace

TEST_CASE("EpBuffer with an expert location: the batch names each group's logical expert; the static placement's rows") {
  const int np = world().size(), s = world().rank();
  const ProcessGroups pg(direct_layout(np), world());
  const Space exec;
  const int K = 2, redundant = np > 1 ? np : 0;
  // Physical p < 8 holds logical (3 p + 1) mod 8 (a permutation); the redundant ones (np > 1)
  // logical p - 8 again: no physical expert holds its own id where the map is permuted.
  std::vector<int> map;
  for (int p = 0; p < kExperts + redundant; ++p) map.push_back(p < kExperts ? (3 * p + 1) % kExperts : p - kExperts);
  auto loc = std::make_shared<const ExpertLocation>(ExpertLocation::from_map(kExperts, np, map));
  // And a second map, set between dispatches: physical p < 8 holds (5 p + 2) mod 8.
  std::vector<int> map2 = map;
  for (int p = 0; p < kExperts; ++p) map2[std::size_t(p)] = (5 * p + 2) % kExperts;
  auto loc2 = std::make_shared<const ExpertLocation>(ExpertLocation::from_map(kExperts, np, map2));
  Buffer mapped(pg, kExperts, {.expert_location = loc}), plain(pg, kExperts);
  CHECK(mapped.physical_experts() == kExperts + redundant);
  CHECK(mapped.local_experts() == (kExperts + redundant) / np);
  const std::int64_t m = 5 + s;
  const Rows<double, RowShard<AttnTp>, DpLocal, Space> x(rows_of(s, m), m);
  const TopK<double, Space> route = route_of(s, m, K);
  const auto run = [&](Buffer& buf, auto& experts) {
    const EpHandle<double, Space> h = buf.dispatch(exec, x, route, {.first_token = 0});
    const auto y = buf.expert_outputs(h);
    experts(exec, h.batch(), y);
    return Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), buf.combine(exec, h, y).view());
  };
  ScaleExperts static_experts;
  const auto want = run(plain, static_experts);
  for (const auto& current : {loc, loc2}) {
    if (current == loc2) mapped.set_expert_location(exec, loc2);
    CHECK(mapped.expert_location() == current);
    LogicalExperts experts{current};
    const auto got = run(mapped, experts);
    CHECK(experts.groups == mapped.local_experts());
    CHECK(experts.wrong == 0);
    REQUIRE(got.extent(0) == std::size_t(m));
    double err = 0;
    for (std::int64_t i = 0; i < m; ++i)
      for (int f = 0; f < kHidden; ++f) {
        double formula = 0;
        for (int k = 0; k < K; ++k) formula += weight_of(k) * double(expert_of(s, i, k, K) + 1) * value(s, i, f);
        err = std::max(err, std::max(std::abs(got(i, f) - formula), std::abs(got(i, f) - want(i, f))) / formula);
      }
    CHECK(err <= 1e-14);
  }
}
