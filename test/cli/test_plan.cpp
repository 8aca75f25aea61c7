// relayout plan's arithmetic against values worked out by hand: the uniform-routing destinations,
// the alpha-beta collective times per link tier, the ranking's enumeration of the layouts of 4 GPUs
// and the DeepSeek-V3 preset.
#include <doctest/doctest.h>

#include <set>
#include <string>

#include "cli/plan_rank.hpp"

using namespace relayout;

TEST_CASE("plan: expected moe_ep destinations per row under uniform routing") {
  // 8 experts on 2 ranks, top-2: P(both on one given other rank) = C(4,2)/C(8,2) = 6/28.
  CHECK(cli::expected_destinations(8, 2, 2) == doctest::Approx(2.0 * (1.0 - 6.0 / 28.0)));
  // One expert per rank: every expert of a row is on its own rank, k destinations.
  CHECK(cli::expected_destinations(8, 2, 8) == doctest::Approx(2.0));
  // One rank holding every expert: 1 destination.
  CHECK(cli::expected_destinations(16, 4, 1) == doctest::Approx(1.0));
}

TEST_CASE("plan: ring and all-to-all times per link tier") {
  cli::Cluster c;
  c.gpus_per_node = 2;
  c.intra_bw = 100e9;
  c.intra_latency = 1e-6;
  c.inter_bw = 10e9;
  c.inter_latency = 5e-6;
  // all-reduce of 1 MB on 2 ranks of one node: 2(n-1) = 2 steps, 2(n-1)/n = 1 of the buffer.
  CHECK(cli::collective_seconds(TrafficOp::all_reduce, {0, 1}, 1, 1e6, c) == doctest::Approx(2e-6 + 1e6 / 100e9));
  // the same over two nodes (ranks 1 and 2): the inter-node link.
  CHECK(cli::collective_seconds(TrafficOp::all_reduce, {1, 2}, 1, 1e6, c) == doctest::Approx(10e-6 + 1e6 / 10e9));
  // all-gather of 4 MB assembled on 4 ranks (two nodes), in 2 calls: each 3 steps, 3/4 of 2 MB.
  CHECK(cli::collective_seconds(TrafficOp::all_gatherv, {0, 1, 2, 3}, 2, 4e6, c) ==
        doctest::Approx(2 * (3 * 5e-6 + 0.75 * 2e6 / 10e9)));
  // dispatch on 4 ranks of one node (4 per node): 3/4 of what a rank sends leaves it.
  c.gpus_per_node = 4;
  CHECK(cli::collective_seconds(TrafficOp::dispatch, {0, 1, 2, 3}, 1, 8e6, c) == doctest::Approx(3e-6 + 0.75 * 8e6 / 100e9));
  CHECK(cli::collective_seconds(TrafficOp::all_reduce, {3}, 5, 1e6, c) == 0.0);  // a group of one sends nothing
}

TEST_CASE("plan: the forward is the slowest rank's collectives plus its flops") {
  // tp_moe at tp 2 (one node), 24 rows of hidden 64: per layer one all-reduce of 24 * 64 * 4 =
  // 6144 B over attn_tp and one over tp, and the counts all-gather (16 B) once.
  cli::PlanInput in;
  const cli::LayerPlan p = cli::plan_layer(RuntimeLayout({.tp = 2, .ep = 2}), in);
  cli::Cluster c;
  c.intra_latency = 0;
  c.intra_bw = 1e9;
  const cli::RankTime t = cli::forward_time(p, c);
  CHECK(t.comm == doctest::Approx(4 * 6144 / 1e9 + 0.5 * 16 / 1e9));
  CHECK(t.compute == doctest::Approx(std::max(p.ranks[0].memory.flops, p.ranks[1].memory.flops) / c.gpu_flops));
}

TEST_CASE("plan: the ranking enumerates every layout of 4 GPUs the layer runs") {
  // By hand: 4 replicas of tp 1 (backend none, deepep): 2; 2 replicas of tp 2 (ep 1, 2; deepep):
  // 3; tp 4 without DP attention (ep 1, 2, 4; deepep): 4; with DP attention dp 2 and 4: 4 each.
  // The attention-CP layouts are skipped, under one reason.
  cli::PlanInput in;
  const cli::Ranking r = cli::rank_layouts(4, 512, 128, in, cli::Cluster{}, 1e12);
  CHECK(r.layouts.size() == 17);
  std::set<std::string> flags;
  for (std::size_t i = 0; i < r.layouts.size(); ++i) {
    flags.insert(r.layouts[i].flags);
    if (i > 0) CHECK(r.layouts[i - 1].time.total() <= r.layouts[i].time.total());
    CHECK(r.layouts[i].fits);
  }
  CHECK(flags.size() == 17);
  CHECK(flags.count("--tp 4 --dp 2 --enable-dp-attention --moe-a2a-backend deepep") == 1);
  CHECK(flags.count("--tp 1 --dp 4") == 1);
  CHECK(r.skipped.size() == 1);
  // Too little memory for any: still ranked, none fits.
  const cli::Ranking tight = cli::rank_layouts(4, 512, 128, in, cli::Cluster{}, 1024);
  for (const cli::RankedLayout& l : tight.layouts) CHECK_FALSE(l.fits);
}

TEST_CASE("plan: the DeepSeek-V3 preset is its published config") {
  const model::ModelDims d = cli::preset_dims("deepseek-v3");
  CHECK(d.hidden == 7168);
  CHECK(d.layers == 61);
  CHECK(d.experts == 256);
  CHECK(d.topk == 8);
  CHECK(d.moe_inter == 2048);
  CHECK(d.shared_inter == 2048);
  CHECK(d.heads == 128);
  CHECK(d.q_lora == 1536);
  CHECK(d.head_dim == 512);
  CHECK_THROWS_WITH_AS(cli::preset_dims("llama"), doctest::Contains("--preset: unknown model 'llama'"), LayoutError);
}
