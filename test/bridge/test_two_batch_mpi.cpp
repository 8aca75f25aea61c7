// Two-batch overlap (BridgeOptions::two_batch_overlap) on real ranks: the bridge's rows with and
// without it, each compared row by row with the test's own formula. Row i of DP group g holds
// value(g, i, f); the router picks experts from the row's first value (as a real router, from
// the row, not from its position in a micro-batch); expert e multiplies by (e + 1) and the shared
// expert adds half the row. The code under test only moves and sums.
#include <doctest/doctest.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <relayout/bridge.hpp>
#include <relayout/bridge/testing.hpp>
#include <relayout/comm.hpp>
#include <relayout/placement.hpp>
#include <string>
#include <vector>

#include "mpi_world.hpp"

using namespace relayout;

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using relayout::test::world;
using Bridge = MoeBridge<MpiCommunicator, float, Space>;
using In = Bridge::In;
constexpr int kHidden = 5, kExperts = 8, kTopK = 2;

double value(int g, std::int64_t i, int f) { return 1.0 + g * 100.0 + double(i) + 0.01 * f; }
int expert_for(double x0, int k) { return (int(std::lround(x0)) + 3 * k) % kExperts; }
double weight_of(int k) { return 1.0 / double(k + 2); }

struct ValueRouter {
  int top_k() const { return kTopK; }
  void operator()(const Space& exec, const RowsView<float, Space>& x, TopK<float, Space>& out) const {
    auto xh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x);
    auto ih = Kokkos::create_mirror_view(out.ids);
    auto wh = Kokkos::create_mirror_view(out.weights);
    for (std::size_t i = 0; i < x.extent(0); ++i)
      for (int k = 0; k < kTopK; ++k) {
        ih(i, k) = expert_for(xh(i, 0), k);
        wh(i, k) = float(weight_of(k));
      }
    Kokkos::deep_copy(exec, out.ids, ih);
    Kokkos::deep_copy(exec, out.weights, wh);
    exec.fence();  // the host mirrors end here
  }
};

// Expert p (physical; logical_of(p) with an expert location): y = (logical + 1) x; shared: + x / 2.
// Counts its calls, and the rows each physical expert computed.
struct ScaleExperts {
  std::shared_ptr<const ExpertLocation> loc;
  int calls = 0, shared_calls = 0;
  std::vector<std::int64_t> rows_of = std::vector<std::int64_t>(64, 0);
  void operator()(const Space& exec, const ExpertBatch<float, Space>& b, const RowsView<float, Space>& y) {
    ++calls;
    auto xh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b.x);
    auto yh = Kokkos::create_mirror_view(y);
    for (int e = 0; e < b.experts(); ++e) {
      const int p = b.first_expert + e, l = loc ? loc->logical_of(p) : p;
      rows_of[std::size_t(p)] += b.count(e);
      for (std::int64_t r = b.offset(e); r < b.offset(e) + b.count(e); ++r)
        for (std::size_t f = 0; f < xh.extent(1); ++f) yh(r, f) = float(l + 1) * xh(r, f);
    }
    Kokkos::deep_copy(exec, y, yh);
    exec.fence();  // yh ends here
  }
  void shared(const Space& exec, const RowsView<float, Space>& x, const RowsView<float, Space>& y) {
    ++shared_calls;
    auto xh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x);
    auto yh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y);
    for (std::size_t i = 0; i < xh.extent(0); ++i)
      for (std::size_t f = 0; f < xh.extent(1); ++f) yh(i, f) += 0.5f * xh(i, f);
    Kokkos::deep_copy(exec, y, yh);
    exec.fence();  // yh ends here
  }
};

// This DP group's rows: `rows` of them.
In rows_of_group(int g, std::int64_t rows) {
  RowsView<float, Space> v("x", std::size_t(rows), kHidden);
  auto h = Kokkos::create_mirror_view(v);
  for (std::int64_t i = 0; i < rows; ++i)
    for (int f = 0; f < kHidden; ++f) h(i, f) = float(value(g, i, f));
  Kokkos::deep_copy(v, h);
  return In(v);
}

// The largest relative difference from the formula, over this rank's output rows.
double error_of(const In& y, int g, std::int64_t rows) {
  REQUIRE(y.rows() == rows);
  auto yh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y.view());
  double err = 0;
  for (std::int64_t i = 0; i < rows; ++i)
    for (int f = 0; f < kHidden; ++f) {
      const double x = double(float(value(g, i, f)));
      double want = 0.5 * x;
      for (int k = 0; k < kTopK; ++k) want += weight_of(k) * double(expert_for(value(g, i, 0), k) + 1) * x;
      err = std::max(err, std::abs(double(yh(i, f)) - want) / want);
    }
  return err;
}

bool same_rows(const In& a, const In& b) {
  if (a.rows() != b.rows()) return false;
  auto ah = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), a.view());
  auto bh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b.view());
  for (std::size_t i = 0; i < ah.extent(0); ++i)
    for (std::size_t f = 0; f < ah.extent(1); ++f)
      if (ah(i, f) != bh(i, f)) return false;
  return true;
}

struct Case {
  const char* name;
  RuntimeLayout layout;
};
// The layouts that dispatch at this rank count: direct (every rank its own DP group), and
// a2a_split (attn_tp = tp, no DP attention) from 2 ranks.
std::vector<Case> dispatching_layouts(int np) {
  std::vector<Case> c;
  c.push_back({"direct", RuntimeLayout(LayoutConfig{.tp = np, .dp = np, .enable_dp_attention = true,
                                                    .moe_a2a_backend = Backend::deepep})});
  if (np >= 2) c.push_back({"a2a_split", RuntimeLayout(LayoutConfig{.tp = np, .moe_a2a_backend = Backend::deepep})});
  if (np >= 4)
    c.push_back({"a2a_split dp 2", RuntimeLayout(LayoutConfig{.tp = np, .dp = 2, .enable_dp_attention = true,
                                                              .moe_a2a_backend = Backend::deepep})});
  return c;
}

// Rows of DP group g in each workload: several per group, 0 or 1 (fewer than two), one, none.
std::int64_t rows_in(int workload, int g) {
  switch (workload) {
    case 0: return 3 + 2 * g;
    case 1: return g % 2;
    case 2: return 1;
    default: return 0;
  }
}

}  // namespace

TEST_CASE("two_batch_range: SGLang's decode split, n / 2 rows first; fewer than 2 rows leave the first empty") {
  CHECK(two_batch_range(5, 0).begin == 0);
  CHECK(two_batch_range(5, 0).count == 2);
  CHECK(two_batch_range(5, 1).begin == 2);
  CHECK(two_batch_range(5, 1).count == 3);
  CHECK(two_batch_range(1, 0).count == 0);
  CHECK(two_batch_range(1, 1).count == 1);
  CHECK(two_batch_range(0, 0).count == 0);
  CHECK(two_batch_range(0, 1).count == 0);
}

TEST_CASE("MoeBridge two_batch_overlap: the one-batch rows exactly, and the formula's, on every dispatching path") {
  const int np = world().size();
  const Space exec;
  ValueRouter router;
  for (const Case& c : dispatching_layouts(np)) {
    CAPTURE(c.name);
    const ProcessGroups pg(c.layout, world());
    const int g = pg.coords().attn_dp_rank;
    REQUIRE(dispatches_rows(c.layout.bridge_path()));
    for (int workload = 0; workload < 4; ++workload) {
      CAPTURE(workload);
      const std::int64_t rows = rows_in(workload, g);
      const In x = rows_of_group(g, rows);
      std::int64_t most = 1;
      for (int q = 0; q < c.layout.widths().attn_dp; ++q) most = std::max(most, rows_in(workload, q));
      for (const EpMode mode : {EpMode::normal, EpMode::low_latency}) {
        CAPTURE(to_string(mode));
        BridgeOptions one_o{.ep_mode = mode, .num_max_dispatch_tokens_per_rank = mode == EpMode::low_latency ? most : 128};
        BridgeOptions two_o = one_o;
        two_o.two_batch_overlap = true;
        Bridge one(pg, kExperts, one_o), two(pg, kExperts, two_o);
        ScaleExperts e1, e2;
        TrafficLog t1, t2;
        const In y1 = one.run(exec, x, router, e1, {.traffic = &t1});
        const In y2 = two.run(exec, x, router, e2, {.traffic = &t2});
        CHECK(error_of(y1, g, rows) <= 1e-6);
        CHECK(error_of(y2, g, rows) <= 1e-6);
        CHECK(same_rows(y1, y2));
        // The experts and the shared expert run once per micro-batch, on the same rows in all.
        CHECK(e1.calls == 1);
        CHECK(e2.calls == 2);
        CHECK(e2.shared_calls == 2);
        CHECK(e1.rows_of == e2.rows_of);
        if (np > 1) {
          CHECK(t2.calls_of(TrafficOp::dispatch, GroupKind::moe_ep) == 2 * t1.calls_of(TrafficOp::dispatch, GroupKind::moe_ep));
          CHECK(t2.calls_of(TrafficOp::combine, GroupKind::moe_ep) == 2);
          // Normal mode sends each row once per destination in either case: the same bytes.
          if (mode == EpMode::normal)
            CHECK(t2.bytes_of(TrafficOp::dispatch, GroupKind::moe_ep) == t1.bytes_of(TrafficOp::dispatch, GroupKind::moe_ep));
          CHECK(t2.bytes_of(TrafficOp::combine, GroupKind::moe_ep) == t1.bytes_of(TrafficOp::combine, GroupKind::moe_ep));
        }
      }
    }
  }
}

TEST_CASE("MoeBridge two_batch_expert_chunks: experts called in groups, the exchange polled between, the one-batch rows") {
  const int np = world().size();
  const Space exec;
  ValueRouter router;
  for (const Case& c : dispatching_layouts(np)) {
    CAPTURE(c.name);
    const ProcessGroups pg(c.layout, world());
    const int g = pg.coords().attn_dp_rank, local = kExperts / c.layout.widths().moe_ep;
    for (int workload = 0; workload < 4; ++workload) {
      CAPTURE(workload);
      const std::int64_t rows = rows_in(workload, g);
      const In x = rows_of_group(g, rows);
      for (const int chunks : {2, 3, 16})
      for (const EpMode mode : {EpMode::normal, EpMode::low_latency}) {
        CAPTURE(chunks);
        CAPTURE(to_string(mode));
        Bridge one(pg, kExperts, {.ep_mode = mode}),
            two(pg, kExperts, {.ep_mode = mode, .two_batch_overlap = true, .two_batch_expert_chunks = chunks});
        ScaleExperts e1, e2;
        const In y1 = one.run(exec, x, router, e1), y2 = two.run(exec, x, router, e2);
        CHECK(error_of(y2, g, rows) <= 1e-6);
        CHECK(same_rows(y1, y2));
        CHECK(e1.rows_of == e2.rows_of);  // every (row, expert) pair computed once
        // Both micro-batches' experts run behind an exchange: min(chunks, local experts) calls
        // each; the first's shared expert in `chunks` row chunks, the second's once.
        CHECK(e2.calls == 2 * std::min(chunks, local));
        CHECK(e2.shared_calls == chunks + 1);
      }
    }
  }
  const ProcessGroups pg(dispatching_layouts(np)[0].layout, world());
  CHECK_THROWS_WITH_AS(Bridge(pg, kExperts, {.two_batch_overlap = true, .two_batch_expert_chunks = 0}),
                       doctest::Contains("two_batch_expert_chunks = 0"), LayoutError);
}

TEST_CASE("MoeBridge two_batch_overlap: owners, boundaries, dispatch dtypes and redundant experts as one batch") {
  const int np = world().size();
  const Space exec;
  ValueRouter router;
  for (const Case& c : dispatching_layouts(np)) {
    CAPTURE(c.name);
    const ProcessGroups pg(c.layout, world());
    const int g = pg.coords().attn_dp_rank;
    const std::int64_t rows = 4 + g;
    const In x = rows_of_group(g, rows);
    // The owner column and what the observer sees at each boundary (owners sorted: the experts'
    // batch is grouped per micro-batch).
    struct Seen {
      std::vector<std::string> names;
      std::vector<std::vector<std::int64_t>> owners;
    };
    const auto observe = [](Seen& s) {
      return [&s](const BoundaryInfo& b, std::span<const std::int64_t> o, const RowsView<float, Space>&, std::int64_t) {
        s.names.emplace_back(b.name);
        std::vector<std::int64_t> v(o.begin(), o.end());
        std::sort(v.begin(), v.end());
        s.owners.push_back(v);
      };
    };
    std::vector<std::int64_t> in_owners;
    for (std::int64_t i = 0; i < rows; ++i) in_owners.push_back(1000 * g + i);
    for (const EpMode mode : {EpMode::normal, EpMode::low_latency}) {
      CAPTURE(to_string(mode));
      Seen s1, s2;
      std::vector<std::int64_t> o1 = in_owners, o2 = in_owners;
      Bridge one(pg, kExperts, {.ep_mode = mode}), two(pg, kExperts, {.ep_mode = mode, .two_batch_overlap = true});
      ScaleExperts e1, e2;
      const In y1 = one.run(exec, x, router, e1, {.owners = &o1, .observer = observe(s1)});
      const In y2 = two.run(exec, x, router, e2, {.owners = &o2, .observer = observe(s2)});
      CHECK(error_of(y2, g, rows) <= 1e-6);
      CHECK(same_rows(y1, y2));
      CHECK(o2 == in_owners);
      CHECK(s2.names == s1.names);
      CHECK(s2.owners == s1.owners);
    }

    // bf16 and fp8 rows: the one-batch rows exactly (each row is rounded the same way).
    for (const DispatchDtype dt : {DispatchDtype::bf16, DispatchDtype::fp8}) {
      CAPTURE(to_string(dt));
      Bridge a(pg, kExperts, {.dispatch_dtype = dt}), b(pg, kExperts, {.dispatch_dtype = dt, .two_batch_overlap = true});
      ScaleExperts ea, eb;
      CHECK(same_rows(a.run(exec, x, router, ea), b.run(exec, x, router, eb)));
    }

    // Redundant experts: replicas chosen by the row's index in its DP group, so the same replica
    // computes each row in both runs, and the load the bridge counts is the same.
    if (np > 1) {
      auto loc = std::make_shared<const ExpertLocation>(ExpertLocation::identity(kExperts, np, np));
      Bridge a(pg, kExperts, {.expert_location = loc}), b(pg, kExperts, {.expert_location = loc, .two_batch_overlap = true});
      ScaleExperts ea{loc}, eb{loc};
      const In ya = a.run(exec, x, router, ea), yb = b.run(exec, x, router, eb);
      CHECK(error_of(yb, g, rows) <= 1e-6);
      CHECK(same_rows(ya, yb));
      CHECK(ea.rows_of == eb.rows_of);
      CHECK(a.last_expert_load().physical == b.last_expert_load().physical);
      CHECK(a.last_expert_load().logical == b.last_expert_load().logical);
      std::int64_t pairs = 0;
      for (const std::int64_t v : b.last_expert_load().physical) pairs += v;
      const std::int64_t chunk = tensor_split_range(rows, pg.layout().widths().attn_tp, pg.coords().attn_tp_rank).count;
      CHECK(pairs == chunk * kTopK);  // both micro-batches counted
    }
  }
}

TEST_CASE("MoeBridge two_batch_overlap: refused with a LayoutError naming it where nothing is dispatched") {
  const int np = world().size();
  // No all-to-all backend: path dp_gather (tp_moe at one rank), as SGLang refuses it with backend none.
  const ProcessGroups pg(RuntimeLayout(LayoutConfig{.tp = np, .dp = np, .ep = np, .enable_dp_attention = np > 1}), world());
  CHECK_THROWS_WITH_AS(Bridge(pg, kExperts, {.two_batch_overlap = true}),
                       doctest::Contains("two_batch_overlap needs a path that dispatches rows"), LayoutError);
  CHECK_THROWS_WITH_AS(check_two_batch_overlap(true, BridgePath::tp_moe, "--enable-two-batch-overlap"),
                       doctest::Contains("--enable-two-batch-overlap needs a path that dispatches rows"), LayoutError);
  CHECK_NOTHROW(check_two_batch_overlap(false, BridgePath::dp_gather));
  CHECK_NOTHROW(check_two_batch_overlap(true, BridgePath::direct));
}

// Rows already split over attn_tp (MoeBridge::ScatteredIn, SGLang's scattered mode under DeepEP):
// each member hands over its chunk and gets that chunk's MoE rows back, the rows the replicated
// run returns there, bit for bit; no attention-TP all-gather is sent, the owners come back as they
// went in, and the plan is the dispatching one without split_rows and all_gather.
TEST_CASE("MoeBridge scattered rows: each attn_tp member's chunk of the replicated run, on every dispatching path") {
  const int np = world().size();
  const Space exec;
  ValueRouter router;
  using Shard = Bridge::ScatteredIn;
  for (const Case& c : dispatching_layouts(np)) {
    CAPTURE(c.name);
    const ProcessGroups pg(c.layout, world());
    const int g = pg.coords().attn_dp_rank, A = c.layout.widths().attn_tp, me = pg.coords().attn_tp_rank;
    for (int workload = 0; workload < 4; ++workload) {
      CAPTURE(workload);
      const std::int64_t rows = rows_in(workload, g);
      const In x = rows_of_group(g, rows);
      for (const bool two : {false, true}) {
        CAPTURE(two);
        Bridge full(pg, kExperts, {.two_batch_overlap = two}), split(pg, kExperts, {.two_batch_overlap = two});
        ScaleExperts e1, e2;
        TrafficLog t1, t2;
        std::vector<std::int64_t> all_owners;
        for (std::int64_t i = 0; i < rows; ++i) all_owners.push_back(1000 * g + i);
        std::vector<std::int64_t> owners1 = all_owners;
        const In y1 = full.run(exec, x, router, e1, {.owners = &owners1, .traffic = &t1});
        const Range mine = tensor_split_range(rows, A, me);
        std::vector<std::int64_t> owners2(all_owners.begin() + mine.begin, all_owners.begin() + mine.begin + mine.count);
        const std::vector<std::int64_t> chunk_owners = owners2;
        const Shard y2 = split.run(exec, split_rows(pg, x), router, e2, {.owners = &owners2, .traffic = &t2});
        REQUIRE(y2.rows() == mine.count);
        CHECK(y2.full_rows() == rows);
        CHECK(owners2 == chunk_owners);
        CHECK(same_rows(In(impl::row_slice(y1.view(), mine.begin, mine.count)), In(y2.view())));
        CHECK(e1.rows_of == e2.rows_of);
        CHECK(t2.calls_of(TrafficOp::all_gather, GroupKind::attn_tp) + t2.calls_of(TrafficOp::all_gatherv, GroupKind::attn_tp) == 0);
        if (A > 1)
          CHECK(t1.calls_of(TrafficOp::all_gather, GroupKind::attn_tp) + t1.calls_of(TrafficOp::all_gatherv, GroupKind::attn_tp) == 1);
      }
    }
  }
  const auto plan = bridge_plan(BridgePath::a2a_split, PaddingMode::sum_len, BridgeRestore::reduce, false, true);
  REQUIRE(plan.size() == 5);
  CHECK(plan.front().step == BridgeStep::route);
  CHECK(plan.back().step == BridgeStep::shared_expert);
  CHECK(plan_sums(plan) == 1);
  CHECK(bridge_plan(BridgePath::dp_gather, PaddingMode::sum_len, BridgeRestore::reduce, false, true).empty());
}

// Path tp_moe on rows split over attn_tp (== tp): the chunks gathered, every row through this
// rank's experts, the partials reduce-scattered into the chunks: the replicated run's rows there.
TEST_CASE("MoeBridge scattered rows on tp_moe: the chunks gathered, the sum scattered back, the replicated rows") {
  const int np = world().size();
  const Space exec;
  ValueRouter router;
  const ProcessGroups pg(RuntimeLayout(LayoutConfig{.tp = np}), world());
  REQUIRE(pg.layout().bridge_path() == BridgePath::tp_moe);
  const int me = pg.coords().attn_tp_rank;
  for (int workload = 0; workload < 4; ++workload) {
    CAPTURE(workload);
    const std::int64_t rows = rows_in(workload, 0);
    const In x = rows_of_group(0, rows);
    Bridge full(pg, kExperts), split(pg, kExperts);
    ScaleExperts e1, e2;
    TrafficLog t2;
    const In y1 = full.run(exec, x, router, e1);
    const Range mine = tensor_split_range(rows, np, me);
    std::vector<std::int64_t> owners;
    for (std::int64_t i = mine.begin; i < mine.begin + mine.count; ++i) owners.push_back(7 * i + 1);
    const std::vector<std::int64_t> sent = owners;
    const Bridge::ScatteredIn y2 = split.run(exec, split_rows(pg, x), router, e2, {.owners = &owners, .traffic = &t2});
    REQUIRE(y2.rows() == mine.count);
    CHECK(owners == sent);
    // (ScaleExperts writes whole rows, not a moe_tp share: both runs sum np of them, alike.)
    auto a = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y1.view());
    auto b = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y2.view());
    double diff = 0;
    for (std::int64_t i = 0; i < mine.count; ++i)
      for (int f = 0; f < kHidden; ++f)
        diff = std::max(diff, std::abs(double(b(i, f)) - double(a(mine.begin + i, f))) / std::abs(double(a(mine.begin + i, f))));
    CHECK(diff <= 1e-6);  // the same sum, over the ranks in the order each collective takes
    if (np > 1) {
      CHECK(t2.calls_of(TrafficOp::all_reduce, GroupKind::tp) + t2.calls_of(TrafficOp::all_reduce, GroupKind::attn_tp) == 0);
      CHECK(t2.calls_of(TrafficOp::reduce_scatter, GroupKind::attn_tp) + t2.calls_of(TrafficOp::reduce_scatterv, GroupKind::attn_tp) == 1);
    }
  }
  const auto plan = bridge_plan(BridgePath::tp_moe, PaddingMode::sum_len, BridgeRestore::reduce, false, true);
  REQUIRE(plan.size() == 4);
  CHECK(plan.front().step == BridgeStep::all_gather);
  CHECK(plan.back().step == BridgeStep::reduce_scatter);
  CHECK(plan_sums(plan) == 1);
}

TEST_CASE("MoeBridge scattered rows: refused with a LayoutError on dp_gather, and with no_split") {
  const int np = world().size();
  const Space exec;
  ValueRouter router;
  ScaleExperts e;
  const In x = rows_of_group(0, 4);
  if (np >= 2) {
    // Path dp_gather gathers whole DP groups.
    const ProcessGroups dpg(RuntimeLayout(LayoutConfig{.tp = np, .dp = np, .enable_dp_attention = true}), world());
    REQUIRE(dpg.layout().bridge_path() == BridgePath::dp_gather);
    Bridge b(dpg, kExperts);
    CHECK_THROWS_WITH_AS(b.run(exec, split_rows(dpg, x), router, e),
                         doctest::Contains("rows split over attn_tp (RowShard<AttnTp>) need path a2a_split, direct or tp_moe"),
                         LayoutError);
    const ProcessGroups a2a(RuntimeLayout(LayoutConfig{.tp = np, .moe_a2a_backend = Backend::deepep}), world());
    Bridge faulty(a2a, kExperts);
    testing::inject_fault(faulty, BridgeFault::no_split);
    CHECK_THROWS_WITH_AS(faulty.run(exec, split_rows(a2a, x), router, e),
                         doctest::Contains("fault no_split wires the split before the dispatch"), LayoutError);
    // A chunk other than tensor_split's (every member one row too many here): the dispatch would
    // number the group's tokens wrongly, so it is refused on every member.
    Bridge plain(a2a, kExperts);
    const std::int64_t chunk = tensor_split_range(4, np, a2a.coords().attn_tp_rank).count + 1;
    const Bridge::ScatteredIn wrong(impl::row_slice(rows_of_group(0, 5).view(), 0, chunk), 4);
    const std::string rule = "tensor_split gives member " + std::to_string(a2a.coords().attn_tp_rank);
    CHECK_THROWS_WITH_AS(plain.run(exec, wrong, router, e), doctest::Contains(rule.c_str()), LayoutError);
  }
}
