// Placement transitions end to end on real ranks. Expected rows are written out from the test's
// own formulas (row j of DP group g holds value(g, j, c)); the code under test only moves them.
#include <doctest/doctest.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdint>
#include <relayout/comm.hpp>
#include <relayout/placement.hpp>
#include <vector>

#include "mpi_world.hpp"

using namespace relayout;

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using View = Kokkos::View<double**, Kokkos::LayoutRight, Space::memory_space>;
constexpr int kHidden = 3;

// Owned by the shared test main, which frees it before MPI_Finalize.
using relayout::test::world;

template <class F>
View make_rows(std::int64_t n, F value) {
  View v("rows", static_cast<std::size_t>(n), kHidden);
  auto h = Kokkos::create_mirror_view(v);
  for (std::int64_t j = 0; j < n; ++j)
    for (int c = 0; c < kHidden; ++c) h(j, c) = value(j, c);
  Kokkos::deep_copy(v, h);
  return v;
}

std::vector<std::vector<double>> host_rows(const View& v) {
  auto h = Kokkos::create_mirror_view(v);
  Kokkos::deep_copy(h, v);
  std::vector<std::vector<double>> out(v.extent(0), std::vector<double>(kHidden));
  for (std::size_t j = 0; j < v.extent(0); ++j)
    for (int c = 0; c < kHidden; ++c) out[j][static_cast<std::size_t>(c)] = h(j, c);
  return out;
}

// Row j of DP group g, column c.
double value(int g, std::int64_t j, int c) { return 1000.0 * g + 10.0 * static_cast<double>(j) + c; }

// The layouts of these tests: DP attention with attn_tp = A (A = 1, and A = 2 when np >= 2).
std::vector<int> attn_tp_widths(int np) { return np >= 2 ? std::vector<int>{1, 2} : std::vector<int>{1}; }
RuntimeLayout dp_layout(int np, int attn_tp) {
  return RuntimeLayout({.tp = np, .dp = np / attn_tp, .enable_dp_attention = true});
}

// torch.tensor_split(range(5), parts) chunk sizes, written out.
std::vector<std::int64_t> split5(int parts) {
  switch (parts) {
    case 1: return {5};
    case 2: return {3, 2};
    case 4: return {2, 1, 1, 1};
    case 8: return {1, 1, 1, 1, 1, 0, 0, 0};
  }
  return {};
}

}  // namespace

TEST_CASE("mpi: partial sums [1,2] + [3,4] all-reduce to [4,6]; replicated rows cannot be summed again") {
  const int np = world().size();
  const int A = np >= 2 ? 2 : 1;
  const ProcessGroups pg(dp_layout(np, A), world());
  const int t = pg.coords().attn_tp_rank;
  // attn_tp_rank t holds [2t+1, 2t+2]: with two members that is [1,2] and [3,4].
  const Rows<double, Partial<AttnTp>> partial(make_rows(1, [t](auto, int c) { return 2.0 * t + 1 + c; }));
  const auto before = host_rows(partial.view());
  const Rows<double, Replicated<AttnTp>> full = all_reduce(pg, partial);
  const double s0 = A * A, s1 = A * A + A;  // sum over t of 2t+1 and of 2t+2
  const double s2 = A * A + 2.0 * A;  // column 2 holds 2t+3
  CHECK(host_rows(full.view()) == std::vector<std::vector<double>>{{s0, s1, s2}});
  if (A == 2) CHECK(host_rows(full.view()) == std::vector<std::vector<double>>{{4, 6, 8}});
  CHECK(host_rows(partial.view()) == before);  // the caller's partial rows are untouched

  // Handing the rows over reuses their storage.
  Rows<double, Partial<AttnTp>> handed(make_rows(1, [t](auto, int c) { return 2.0 * t + 1 + c; }));
  const double* storage = handed.view().data();
  const auto reduced = all_reduce(pg, std::move(handed));
  CHECK(reduced.view().data() == storage);
  CHECK(host_rows(reduced.view()) == host_rows(full.view()));

  // The runtime twin refuses the double count with the compile-time sentence.
  const AnyRows<double> twin(full);
  CHECK_THROWS_WITH_AS(all_reduce(pg, twin),
                       "relayout: rows are already Replicated over attn_tp: all_reduce would double-count "
                       "them; use split_rows or dp_gather_replicate",
                       PlacementError);
  const auto again = all_reduce(pg, AnyRows<double>(partial));
  CHECK(again.placement() == Placement{RowState::replicated, GroupKind::attn_tp, RowScope::dp_local});
  CHECK(host_rows(again.view()) == host_rows(full.view()));
}

TEST_CASE("mpi: split_rows keeps this member's tensor_split chunk and its ids; all_gather restores") {
  const int np = world().size();
  const ProcessGroups pg(RuntimeLayout({.tp = np}), world());
  const int me = pg.rank();
  const View all = make_rows(5, [](std::int64_t j, int c) { return value(0, j, c); });
  const std::vector<std::int64_t> ids{1000, 1001, 1002, 1003, 1004};
  const Rows<double, Replicated<group::Tp>> rows(all);

  const auto sizes = split5(np);
  std::int64_t begin = 0;
  for (int i = 0; i < me; ++i) begin += sizes[static_cast<std::size_t>(i)];
  const std::int64_t mine = sizes[static_cast<std::size_t>(me)];

  const auto [shard, shard_ids] = split_rows(pg, rows, ids);
  CHECK(shard.rows() == mine);  // CHECK, not REQUIRE: every rank must reach the collectives below
  CHECK(shard.full_rows() == 5);
  for (std::int64_t j = 0; j < std::min(mine, shard.rows()); ++j) {
    CHECK(host_rows(shard.view())[static_cast<std::size_t>(j)][1] == value(0, begin + j, 1));
    CHECK(shard_ids[static_cast<std::size_t>(j)] == 1000 + begin + j);
  }
  CHECK(shard_ids.size() == static_cast<std::size_t>(mine));
  if (mine > 0) CHECK(shard_ids.data() == ids.data() + begin);  // a slice of the ids given
  CHECK_THROWS_AS(split_rows(pg, rows, std::vector<std::int64_t>{1, 2}), LayoutError);

  // MoE on the chunk (x2 here), then all_gather restores the replicated rows: not a sum.
  View moe_out("moe_out", static_cast<std::size_t>(mine), kHidden);
  auto h = Kokkos::create_mirror_view(moe_out);
  for (std::int64_t j = 0; j < mine; ++j)
    for (int c = 0; c < kHidden; ++c) h(j, c) = 2 * value(0, begin + j, c);
  Kokkos::deep_copy(moe_out, h);
  const auto restored = all_gather(pg, Rows<double, RowShard<group::Tp>>(moe_out, 5));
  std::vector<std::vector<double>> expect;
  for (int j = 0; j < 5; ++j) expect.push_back({2 * value(0, j, 0), 2 * value(0, j, 1), 2 * value(0, j, 2)});
  CHECK(host_rows(restored.view()) == expect);

  // reduce_scatter: sum and split in one step. Rank r holds rows * (r + 1).
  const Rows<double, Partial<group::Tp>> partial(make_rows(5, [me](std::int64_t j, int c) { return (me + 1) * value(0, j, c); }));
  const auto summed = reduce_scatter(pg, partial);
  CHECK(summed.rows() == mine);
  for (std::int64_t j = 0; j < std::min(mine, summed.rows()); ++j)
    CHECK(host_rows(summed.view())[static_cast<std::size_t>(j)][2] == np * (np + 1) / 2.0 * value(0, begin + j, 2));

  const AnyRows<double> any_shard(shard);
  CHECK_THROWS_WITH_AS(split_rows(pg, any_shard), doctest::Contains("rows are already a RowShard over tp"), PlacementError);
}

TEST_CASE("mpi: the DP bridge in both padding modes, with zero and uneven token counts") {
  const int np = world().size();
  for (int A : attn_tp_widths(np)) {
    const ProcessGroups pg(dp_layout(np, A), world());
    const int D = pg.layout().widths().attn_dp, g = pg.coords().attn_dp_rank, t = pg.coords().attn_tp_rank;
    // Uneven counts with zeros: 0, 3, 1, 4, 2, 0, 3, 1 (the first D of them).
    const std::vector<std::int64_t> base{0, 3, 1, 4, 2, 0, 3, 1};
    const std::vector<std::int64_t> counts(base.begin(), base.begin() + D);
    CHECK(gather_num_tokens(pg, counts[static_cast<std::size_t>(g)]) == counts);

    for (PaddingMode mode : {PaddingMode::sum_len, PaddingMode::max_len}) {
      CAPTURE(A);
      CAPTURE(to_string(mode));
      const DpSlotsPtr slots = make_dp_slots(pg.layout(), counts, mode);
      const std::int64_t n = counts[static_cast<std::size_t>(g)];
      // Slot layout worked out here: packed for sum_len; max rounded up to attn_tp for max_len.
      std::int64_t max = 0;
      for (auto c : counts) max = std::max(max, c);
      const std::int64_t slot = (max + A - 1) / A * A;
      std::vector<std::vector<double>> expect_global;
      for (int gg = 0; gg < D; ++gg) {
        const std::int64_t rows = counts[static_cast<std::size_t>(gg)];
        const std::int64_t width = mode == PaddingMode::sum_len ? rows : slot;
        for (std::int64_t j = 0; j < width; ++j)
          expect_global.push_back(j < rows ? std::vector<double>{value(gg, j, 0), value(gg, j, 1), value(gg, j, 2)}
                                           : std::vector<double>{0, 0, 0});
      }

      // Replicated rows; with sum_len only attn_tp_rank 0 contributes, so other members' copies
      // are made different here to prove it (with max_len every member sends a distinct chunk of
      // identical replicas, so they are kept identical).
      const double skew = mode == PaddingMode::sum_len ? 0.5 * t : 0.0;
      const Rows<double, Replicated<AttnTp>> local(make_rows(n, [&](std::int64_t j, int c) { return value(g, j, c) + skew; }));
      const auto before = host_rows(local.view());
      const Rows<double, Replicated<group::Tp>, DpGlobal> global = dp_gather_replicate(pg, local, slots);
      CHECK(host_rows(global.view()) == expect_global);
      CHECK(host_rows(local.view()) == before);  // docs/bridge.md#padding: a gather never mutates the caller's rows

      // Partial rows over attn_tp: member t holds value * (t + 1) / (A (A + 1) / 2).
      const double share = A * (A + 1) / 2.0;
      const Rows<double, Partial<AttnTp>> partial(make_rows(n, [&](std::int64_t j, int c) { return value(g, j, c) * (t + 1) / share; }));
      const auto partial_before = host_rows(partial.view());
      const auto from_partial = dp_gather_partial(pg, partial, slots);
      CHECK(host_rows(from_partial.view()) == expect_global);
      CHECK(host_rows(partial.view()) == partial_before);

      // Copy-only restore.
      const Rows<double, Replicated<AttnTp>> back = dp_scatter(pg, from_partial);
      std::vector<std::vector<double>> expect_local;
      for (std::int64_t j = 0; j < n; ++j) expect_local.push_back({value(g, j, 0), value(g, j, 1), value(g, j, 2)});
      CHECK(host_rows(back.view()) == expect_local);

      // The MoE's expert partials over tp: rank r holds the global rows * (r + 1); the restore
      // sums them exactly once (x tp(tp+1)/2).
      const int r = pg.rank();
      const double total = np * (np + 1) / 2.0;
      View moe("moe", static_cast<std::size_t>(slots->total_rows()), kHidden);
      auto h = Kokkos::create_mirror_view(moe);
      for (std::size_t j = 0; j < expect_global.size(); ++j)
        for (int c = 0; c < kHidden; ++c) h(j, c) = expect_global[j][static_cast<std::size_t>(c)] * (r + 1);
      Kokkos::deep_copy(moe, h);
      const Rows<double, Partial<group::Tp>, DpGlobal> experts(moe, slots);
      const auto restored = mode == PaddingMode::sum_len ? reduce_scatterv(pg, experts) : dp_reduce_scatter(pg, experts);
      std::vector<std::vector<double>> expect_sum = expect_local;
      for (auto& row : expect_sum)
        for (double& x : row) x *= total;
      CHECK(host_rows(restored.view()) == expect_sum);

      // The other restore is refused for this padding mode, on every rank, before any collective.
      if (mode == PaddingMode::sum_len)
        CHECK_THROWS_WITH_AS(dp_reduce_scatter(pg, experts), doctest::Contains("use reduce_scatterv"), LayoutError);
      else
        CHECK_THROWS_WITH_AS(reduce_scatterv(pg, experts), doctest::Contains("use dp_reduce_scatter"), LayoutError);

      // The runtime twin takes the same path and refuses the missing reduction.
      const AnyRows<double> any_experts(experts);
      CHECK_THROWS_WITH_AS(dp_scatter(pg, any_experts),
                           doctest::Contains("dp_scatter only copies, so every token would miss the other ranks' expert outputs"),
                           PlacementError);
      const auto any_global = dp_gather_replicate(pg, AnyRows<double>(local), slots);
      CHECK(host_rows(any_global.view()) == expect_global);
      CHECK(any_global.placement() == Rows<double, Replicated<group::Tp>, DpGlobal>::placement);
      CHECK_THROWS_WITH_AS(dp_gather_partial(pg, AnyRows<double>(local), slots),
                           doctest::Contains("dp_gather_partial would add attn_tp copies of every row"), PlacementError);
    }

    // A DP group's rows that disagree with global_num_tokens are refused on every rank.
    const auto slots = make_dp_slots(pg.layout(), counts);
    const Rows<double, Replicated<AttnTp>> wrong(make_rows(counts[static_cast<std::size_t>(g)] + 1, [](auto, int) { return 0.0; }));
    CHECK_THROWS_WITH_AS(dp_gather_replicate(pg, wrong, slots), doctest::Contains("differ from global_num_tokens"), LayoutError);
    // The error names this line, where the transition was called, not the library's.
    const auto gather = [&] { (void)dp_gather_replicate(pg, wrong, slots); }; const int line = __LINE__;
    CHECK_THROWS_WITH_AS(gather(), doctest::Contains(("; dp_gather_replicate called at placement/test_placement_mpi.cpp:" +
                                                      std::to_string(line)).c_str()), LayoutError);
  }
}

TEST_CASE("mpi: token counts are gathered once per DP group; disagreeing members are refused") {
  const int np = world().size();
  if (np < 2) return;
  const ProcessGroups pg(dp_layout(np, 2), world());
  const int g = pg.coords().attn_dp_rank, t = pg.coords().attn_tp_rank;
  const auto counts = gather_num_tokens(pg, 7 * g);
  CHECK(counts.size() == static_cast<std::size_t>(np / 2));
  for (int gg = 0; gg < std::min<int>(np / 2, static_cast<int>(counts.size())); ++gg) CHECK(counts[static_cast<std::size_t>(gg)] == 7 * gg);
  CHECK_THROWS_WITH_AS(gather_num_tokens(pg, t), doctest::Contains("rank 1 reports 1 tokens"), LayoutError);
}

TEST_CASE("mpi: the DP bridge refuses attention context parallelism") {
  const int np = world().size();
  if (np < 2) return;
  const ProcessGroups pg(RuntimeLayout({.tp = np, .cp = 2}), world());
  const std::vector<std::int64_t> counts{2};
  const Rows<double, Replicated<AttnTp>> rows(make_rows(2, [](auto, int) { return 1.0; }));
  CHECK_THROWS_WITH_AS(dp_gather_replicate(pg, rows, make_dp_slots(pg.layout(), counts)),
                       doctest::Contains("dp_gather_replicate needs attn_cp == 1"), LayoutError);
}
