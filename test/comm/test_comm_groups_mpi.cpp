// ProcessGroups on real ranks: for every attention factorization (attn_dp, attn_cp) and every valid
// MoE factorization (moe_ep, moe_dp) of the world size, each group communicator has exactly the
// members and order the layout engine names; handle sharing follows the policy; a world of
// pipeline stages and replicas splits into every group SGLang's initialize_model_parallel builds.
#include <doctest/doctest.h>
#include <mpi.h>

#include <algorithm>
#include <relayout/comm.hpp>
#include <vector>

#include "mpi_world.hpp"

using namespace relayout;

namespace {

// Owned by the shared test main, which frees it before MPI_Finalize.
using relayout::test::world;

std::vector<std::pair<int, int>> factor_pairs(int n) {
  std::vector<std::pair<int, int>> out;
  for (int a = 1; a <= n; ++a)
    for (int b = 1; a * b <= n; ++b)
      if (n % (a * b) == 0) out.emplace_back(a, b);
  return out;
}

// The groups of a layout depend only on its attention factorization and its MoE factorization
// (the MoE-DP group being the attention-CP group when attn_cp > moe_dp). SGLang ties them (moe_dp > 1
// needs attn_cp == moe_dp), so keep, from all pairings, each valid layout that brings an attention
// or a MoE pair not seen yet: every group a valid layout of n ranks can produce, with few splits.
std::vector<LayoutConfig> covering_layouts(int n) {
  std::vector<LayoutConfig> out;
  std::vector<std::pair<int, int>> seen_attn, seen_moe;
  const auto seen = [](const auto& list, std::pair<int, int> p) {
    return std::find(list.begin(), list.end(), p) != list.end();
  };
  for (const auto& [dp, cp] : factor_pairs(n))
    for (const auto& [ep, moe_dp] : factor_pairs(n)) {
      const LayoutConfig c{.tp = n, .dp = dp, .cp = cp, .ep = ep, .moe_dp = moe_dp, .enable_dp_attention = true};
      if (derive_widths(c).rule != LayoutRule::ok) continue;
      if (seen(seen_attn, {dp, cp}) && seen(seen_moe, {ep, moe_dp})) continue;
      seen_attn.emplace_back(dp, cp);
      seen_moe.emplace_back(ep, moe_dp);
      out.push_back(c);
    }
  return out;
}

void check_membership(const ProcessGroups& pg) {
  const WorldLayout& l = pg.world_layout();
  const int me = world().rank();
  for (GroupKind kind : kWorldGroupKinds) {
    CAPTURE(to_string(kind));
    const MpiCommunicator& c = pg.comm(kind);
    CHECK(c.size() == l.group_size(kind));  // not REQUIRE: every rank must reach the all_gather
    CHECK(c.rank() == l.group_rank(kind, me));
    std::vector<int> mine{me}, members(static_cast<std::size_t>(c.size()));
    all_gather(c, mine, members);
    CHECK(members == l.group_members(kind, me));
  }
}

}  // namespace

TEST_CASE("mpi: process groups have the layout engine's members for every factorization") {
  const int n = world().size();
  const auto layouts = covering_layouts(n);
  // Every attention factorization is valid with moe_dp = 1, so each one is covered.
  CHECK(layouts.size() >= factor_pairs(n).size());
  for (const LayoutConfig& c : layouts) {
    CAPTURE(c.dp);
    CAPTURE(c.cp);
    CAPTURE(c.ep);
    CAPTURE(c.moe_dp);
    const ProcessGroups pg(RuntimeLayout(c), world());
    CHECK(pg.rank() == world().rank());
    check_membership(pg);
  }
}

TEST_CASE("mpi: handle re-use follows the policy, and the ids agree on every rank") {
  const int n = world().size();
  // DeepEP forces moe_ep = tp; dp = n makes attn_tp, attn_cp, moe_tp and moe_dp single-rank.
  const RuntimeLayout layout({.tp = n, .dp = n, .enable_dp_attention = true, .moe_a2a_backend = Backend::deepep});

  const ProcessGroups shared(layout, world());
  CHECK(shared.shares_handle(GroupKind::moe_ep, GroupKind::tp));
  CHECK(shared.handle_id(GroupKind::tp) == 0);
  if (n > 1) {
    CHECK(shared.handle_count() == 2);  // TP, and one single-rank handle for the four size-1 groups
    CHECK(shared.shares_handle(GroupKind::attn_tp, GroupKind::moe_dp));
    CHECK_FALSE(shared.shares_handle(GroupKind::attn_tp, GroupKind::tp));
  } else {
    CHECK(shared.handle_count() == 1);  // with one rank every group is the TP group
  }
  CHECK(shared.describe().find("moe_ep: handle 0 (shared with tp") != std::string::npos);
  check_membership(shared);

  const ProcessGroups ascend(layout, world(), HandlePolicy::distinct_moe_ep);
  CHECK_FALSE(ascend.shares_handle(GroupKind::moe_ep, GroupKind::tp));
  CHECK(ascend.moe_ep().native() != ascend.tp().native());
  CHECK(ascend.handle_count() == shared.handle_count() + 1);
  check_membership(ascend);

  const ProcessGroups distinct(layout, world(), HandlePolicy::distinct_all);
  CHECK(distinct.handle_count() == 9);  // the six bridge groups, dcp, dense_tp and pp
  for (GroupKind a : kWorldGroupKinds)
    for (GroupKind b : kWorldGroupKinds) CHECK(distinct.shares_handle(a, b) == (a == b));

  // Same ids everywhere: the max and the min over ranks agree.
  std::vector<int> ids, lo(6), hi(6);
  for (GroupKind k : kAllGroupKinds) ids.push_back(ascend.handle_id(k));
  all_reduce(world(), ids, lo, ReduceOp::min);
  all_reduce(world(), ids, hi, ReduceOp::max);
  CHECK(lo == ids);
  CHECK(hi == ids);
}

TEST_CASE("mpi: a world whose size is not tp is refused before any split") {
  const int n = world().size();
  CHECK_THROWS_WITH_AS(ProcessGroups(RuntimeLayout({.tp = 2 * n}), world()),
                       doctest::Contains(("the world communicator has " + std::to_string(n) +
                                          " ranks but the layout's tp = " + std::to_string(2 * n)).c_str()),
                       LayoutError);
}

// parallel_state.py initialize_model_parallel: TP groups are consecutive blocks of tp ranks, PP
// groups take one rank of each stage (stride tp); replicas are separate blocks of tp * pp ranks.
TEST_CASE("mpi: a world of pipeline stages or replicas splits into every group") {
  const int n = world().size();
  if (n % 2 != 0) return;
  LayoutConfig stages{.tp = n / 2, .moe_a2a_backend = Backend::deepep};
  stages.pp = 2;
  LayoutConfig replicas{.tp = n / 2, .dp = 2};
  LayoutConfig both{.tp = n / 2};
  both.pp = 2;
  for (const LayoutConfig& c : {stages, replicas, both}) {
    if (WorldLayout(c).size() != n) continue;
    CAPTURE(c.pp);
    CAPTURE(c.dp);
    const ProcessGroups pg(WorldLayout(c), world());
    CHECK(pg.world_rank() == world().rank());
    CHECK(pg.rank() == world().rank() % (n / 2));
    check_membership(pg);
    // Hand-written: pipeline partners are n/2 ranks apart, the TP group is this half of the world.
    if (c.pp == 2) {
      std::vector<int> mine{world().rank()}, partners(2);
      all_gather(pg.pp(), mine, partners);
      CHECK(partners == std::vector<int>{world().rank() % (n / 2), world().rank() % (n / 2) + n / 2});
      CHECK(pg.world_coords().pp_rank == world().rank() / (n / 2));
    } else {
      CHECK(pg.world_coords().replica == world().rank() / (n / 2));
      CHECK(pg.pp().size() == 1);
    }
    CHECK(pg.tp().size() == n / 2);
  }
  LayoutConfig too_big{.tp = n};
  too_big.pp = 2;
  CHECK_THROWS_WITH_AS(ProcessGroups(WorldLayout(too_big), world()),
                       doctest::Contains(("replicas x pp x tp = " + std::to_string(2 * n)).c_str()), LayoutError);
}

TEST_CASE("single rank process groups need no MPI") {
  const ProcessGroupsOf<SingleRankCommunicator> pg(RuntimeLayout({.tp = 1}), SingleRankCommunicator{});
  CHECK(pg.handle_count() == 1);
  CHECK(pg.moe_ep().size() == 1);
}
