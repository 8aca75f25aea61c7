// relayout plan's arithmetic against values worked out by hand: the uniform-routing destinations,
// the alpha-beta collective times per link tier, the ranking's enumeration of the layouts of 4 GPUs
// and the DeepSeek-V3 preset.
#include <doctest/doctest.h>

#include <set>
#include <string>

#include "cli/plan_rank.hpp"
#include "relayout/comm/scalar.hpp"
#include "relayout/placement/ep_message.hpp"

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

TEST_CASE("plan: attention CP: the CP shares' rows, the KV all-gather over attn_cp and K/V per CP rank") {
  cli::PlanInput in;
  in.dims.hidden = 16;
  in.dims.heads = 4;
  in.dims.head_dim = 4;
  in.dims.q_lora = 8;
  in.dims.experts = 8;
  in.dims.moe_inter = 8;
  in.dims.shared_inter = 8;
  in.dims.layers = 2;
  in.requests = {5, 3};
  // --tp 4 --cp 2: one DP group of 8 tokens; plain CP cuts 5 into 3 + 2 and 3 into 2 + 1: shares 5
  // and 3, CP rank 0 on ranks 0-1, CP rank 1 on ranks 2-3.
  const cli::LayerPlan p = cli::plan_layer(RuntimeLayout({.tp = 4, .cp = 2}), in);
  CHECK(p.global_num_tokens == std::vector<std::int64_t>{5, 3});
  CHECK(p.ranks[1].attention_rows == 5);
  CHECK(p.ranks[2].attention_rows == 3);
  const std::size_t kv = TrafficLog::slot(TrafficOp::all_gatherv, GroupKind::attn_cp);
  for (const cli::RankPlan& r : p.ranks) {
    CHECK(r.calls[kv] == 2);           // once per layer
    CHECK(r.bytes[kv] == 2 * 8 * 4 * 4);  // the group's 8 rows x head_dim 4 x 4 bytes, 2 layers
  }
  // K/V memory: its own rows' kv_raw and kv (2 x rows x 4 x 4 B) and the gathered and reordered
  // group (2 x 8 x 4 x 4 B).
  CHECK(p.ranks[0].memory.kv == 2 * 5 * 16 + 2 * 8 * 16);
  CHECK(p.ranks[3].memory.kv == 2 * 3 * 16 + 2 * 8 * 16);
  // The attention all-reduce over attn_tp moves the share's rows: 5 x 16 x 4 B per layer.
  CHECK(p.ranks[0].bytes[TrafficLog::slot(TrafficOp::all_reduce, GroupKind::attn_tp)] == 2 * 5 * 64);
  // Prefill CP at tp 4 (attn_cp 4): the group's 9 tokens dealt round-robin, 3 2 2 2.
  in.requests = {5, 1, 3};
  const cli::LayerPlan q = cli::plan_layer(RuntimeLayout({.tp = 4, .enable_prefill_cp = true}), in);
  CHECK(q.global_num_tokens == std::vector<std::int64_t>{3, 2, 2, 2});
  // Plain CP 4 on the same requests: 5 -> 2 1 1 1, 1 -> 1 0 0 0, 3 -> 1 1 1 0.
  const cli::LayerPlan c = cli::plan_layer(RuntimeLayout({.tp = 4, .cp = 4}), in);
  CHECK(c.global_num_tokens == std::vector<std::int64_t>{4, 2, 2, 1});
}

TEST_CASE("plan: a dispatched row is ep_dispatch's message") {
  cli::PlanInput in;  // hidden 64, top-2 by default
  in.dims.hidden = 64;
  in.dims.topk = 2;
  const cli::LayerPlan p = cli::plan_layer(RuntimeLayout({.tp = 2, .moe_a2a_backend = Backend::deepep}), in);
  // float: 2 weights and 2 ids (8 B each pair) and 64 values: 16 + 256 B.
  CHECK(p.message.bytes == 16 + 256);
  CHECK(p.message.bytes == EpMessage::of<float>(2, 64).bytes);
  in.elem = 2;  // bf16 values: 2 x (2 + 4) + 128 = 140 B, padded to 4
  CHECK(cli::plan_layer(RuntimeLayout({.tp = 2, .moe_a2a_backend = Backend::deepep}), in).message.bytes ==
        EpMessage::of<bf16>(2, 64).bytes);
  CHECK(EpMessage::of<bf16>(2, 64).bytes == 140);
  in.elem = 3;
  CHECK_THROWS_WITH_AS(cli::plan_layer(RuntimeLayout({.tp = 2}), in), doctest::Contains("--element-bytes must be 1, 2, 4 or 8"),
                       LayoutError);
  // --dispatch-dtype bf16: float weights and ids (2 x 8 B) and 64 bf16 values (128 B), as
  // ep_dispatch<float, bf16> sends them; only on a path that dispatches rows.
  in.elem = 4;
  in.dispatch_dtype = "bf16";
  const cli::LayerPlan half = cli::plan_layer(RuntimeLayout({.tp = 2, .moe_a2a_backend = Backend::deepep}), in);
  CHECK(half.message.bytes == 16 + 128);
  CHECK(half.message.bytes == EpMessage::of<float, bf16>(2, 64).bytes);
  CHECK_THROWS_WITH_AS(cli::plan_layer(RuntimeLayout({.tp = 2}), in),
                       doctest::Contains("--dispatch-dtype bf16 needs a path that dispatches rows"), LayoutError);
  in.dispatch_dtype = "fp16";
  CHECK_THROWS_WITH_AS(cli::plan_layer(RuntimeLayout({.tp = 2, .moe_a2a_backend = Backend::deepep}), in),
                       doctest::Contains("--dispatch-dtype must be fp32 or bf16, got 'fp16'"), LayoutError);
}

TEST_CASE("plan: the ranking enumerates every layout of 4 GPUs the layer runs") {
  // By hand, without CP: 4 replicas of tp 1 (backend none; all-to-all): 2; 2 replicas of tp 2
  // (ep 1, 2; all-to-all): 3; tp 4 without DP attention (ep 1, 2, 4; all-to-all): 4; with DP
  // attention dp 2 and 4: 4 each. 17.
  // With CP (tp 4 only: 2 replicas of tp 2 cannot hold cp 2, tp % (dp * cp) != 0): cp 2 (attn_tp
  // 2): ep 1, 2, 4 and moe_dp 2 with ep 1, 2, all-to-all: 6; cp 4: ep 1, 2, 4, moe_dp 4, all-to-all:
  // 5; dp 2 with DP attention and cp 2: 6 as cp 2; prefill CP (attn_cp 4, round-robin): 5 as cp 4.
  // 22. Nothing is skipped.
  cli::PlanInput in;
  const cli::Ranking r = cli::rank_layouts(4, 512, 128, in, cli::Cluster{}, 1e12);
  CHECK(r.layouts.size() == 39);
  std::set<std::string> flags;
  int cp = 0;
  for (std::size_t i = 0; i < r.layouts.size(); ++i) {
    flags.insert(r.layouts[i].flags);
    if (i > 0) CHECK(r.layouts[i - 1].time.total() <= r.layouts[i].time.total());
    CHECK(r.layouts[i].fits);
    cp += RuntimeLayout(r.layouts[i].config).widths().attn_cp > 1;
  }
  CHECK(flags.size() == 39);
  CHECK(cp == 22);
  CHECK(r.skipped.empty());
  // Each all-to-all row names every backend the layout engine accepts for it: FlashInfer's need
  // dp == tp with DP attention, pplx two DP groups, prefill CP deepep, mori or megamoe.
  const auto backends_of = [&](const std::string& f) -> std::string {
    for (const cli::RankedLayout& l : r.layouts)
      if (l.flags.rfind(f + " --moe-a2a-backend ", 0) == 0) return l.flags.substr(f.size() + 19);
    return "missing";
  };
  CHECK(backends_of("--tp 4") == "deepep|deepep_v2|mooncake|nixl|mori|ascend_fuseep|megamoe");
  CHECK(backends_of("--tp 4 --dp 2 --enable-dp-attention") == "deepep|deepep_v2|mooncake|nixl|mori|ascend_fuseep|megamoe|pplx");
  CHECK(backends_of("--tp 4 --dp 4 --enable-dp-attention") ==
        "deepep|deepep_v2|mooncake|nixl|mori|ascend_fuseep|flashinfer|flashinfer_megamoe|megamoe|pplx");
  CHECK(backends_of("--tp 4 --enable-prefill-cp") == "deepep|mori|megamoe");
  CHECK(flags.count("--tp 1 --dp 4") == 1);
  CHECK(flags.count("--tp 4 --cp 2 --ep 2 --moe-dp-size 2") == 1);
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
