// relayout plan over the world (plan_world.hpp, the MLA model's stages in plan_deploy.hpp) against
// values worked out by hand: SGLang's layer split, the weights a stage holds, the pipeline's
// hand-over bytes and times, the steady state's throughput, replicas, nodes and the demo layer's
// expert load.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "cli/plan_deploy.hpp"
#include "cli/plan_world.hpp"

#include "tolerance.hpp"

using relayout::test::within_abs;
using relayout::test::within_rel;

using namespace relayout;

namespace {
// A time model with no latencies and round bandwidths: 1 GB/s inside a node, 0.1 GB/s across.
cli::Cluster slow_links(int gpus_per_node = 8) {
  cli::Cluster c;
  c.gpus_per_node = gpus_per_node;
  c.intra_latency = c.inter_latency = 0;
  c.intra_bw = 1e9;
  c.inter_bw = 1e8;
  return c;
}
cli::WorldPlan demo_world(const LayoutConfig& cfg, int layers, const cli::Cluster& c = cli::Cluster{}) {
  cli::PlanInput in;  // dsv4_layer's default 24 rows: 5,3,4,2,6,1,3
  in.dims.layers = layers;
  return cli::plan_world(WorldLayout(cfg), in, c);
}
}  // namespace

TEST_CASE("plan world: SGLang's layer split, the last layers % pp stages one layer more") {
  const auto split = [](int layers, int pp) {
    std::string s;
    for (int i = 0; i < pp; ++i) {
      const cli::StageLayers l = cli::stage_layers(layers, pp, i);
      s += "[" + std::to_string(l.first) + "," + std::to_string(l.end()) + ")";
    }
    return s;
  };
  CHECK(split(4, 2) == "[0,2)[2,4)");
  CHECK(split(5, 2) == "[0,2)[2,5)");
  CHECK(split(8, 3) == "[0,2)[2,5)[5,8)");
  CHECK(split(61, 4) == "[0,15)[15,30)[30,45)[45,61)");
  CHECK(split(61, 2) == "[0,30)[30,61)");
  CHECK(split(3, 3) == "[0,1)[1,2)[2,3)");
  CHECK_NOTHROW(cli::check_stages(2, 2, "--layers 2"));
  CHECK_THROWS_WITH_AS(cli::check_stages(2, 3, "--layers 2"),
                       "--pp-size 3 with --layers 2: 3 pipeline stages cannot each hold a layer of 2; relayout plan: "
                       "--pp-size must be <= the model's layers",
                       LayoutError);
}

TEST_CASE("plan world: a stage holds its layers' weights") {
  // tp 2, ep 2 (tp_moe): per layer, rank 0 holds attention 2H + Q + D + QH + HD*Q + DH + H*HD with
  // H 64, Q 32, D 16, HD = 8 / 2 * 16 = 64: 9392; router E*H = 512; its 4 experts 4 * 3 * 32 * 64 =
  // 24576; the shared expert 3 * 32 * 64 = 6144. 40624 values of 4 bytes = 162496 B a layer.
  const cli::WorldPlan one = demo_world({.tp = 2, .ep = 2}, 4);
  const cli::WorldPlan two = demo_world({.tp = 2, .ep = 2, .pp = 2}, 4);
  REQUIRE(one.stages.size() == 1);
  REQUIRE(two.stages.size() == 2);
  CHECK(one.plan_of(one.stages[0]).ranks[0].weights.total() == within_rel(4 * 162496.0, 1e-9));
  for (const cli::WorldStage& s : two.stages) {
    CHECK(s.layers.count == 2);
    CHECK(two.plan_of(s).ranks[0].weights.total() == within_rel(2 * 162496.0, 1e-9));  // half of pp 1's
    CHECK(two.plan_of(s).ranks[0].memory.flops ==
          within_rel(one.plan_of(one.stages[0]).ranks[0].memory.flops / 2, 1e-9));
  }
  // 3 layers over 2 stages: 1 then 2.
  const cli::WorldPlan odd = demo_world({.tp = 2, .ep = 2, .pp = 2}, 3);
  CHECK(odd.stages[0].layers.count == 1);
  CHECK(odd.stages[1].layers.count == 2);
  CHECK(odd.plan_of(odd.stages[0]).ranks[0].weights.total() == within_rel(162496.0, 1e-9));
  CHECK(odd.plan_of(odd.stages[1]).ranks[0].weights.total() == within_rel(2 * 162496.0, 1e-9));
  CHECK(odd.plans.size() == 2);  // one plan per layer count
}

TEST_CASE("plan world: the hand-over is tokens x hidden x 4 bytes, sliced over attn_tp") {
  // tp 1: the 24 rows x hidden 64 x 4 bytes, whole.
  const cli::WorldPlan tp1 = demo_world({.tp = 1, .pp = 2}, 2);
  CHECK(tp1.micro_tokens == 24);
  CHECK(tp1.handover[0].sent == 24 * 64 * 4);
  CHECK(tp1.handover[0].gathered == 0);
  // attn_tp 2: each rank sends half (3072 B); the next stage all-gathers the 6144 B.
  const cli::WorldPlan tp2 = demo_world({.tp = 2, .pp = 2}, 2);
  for (const cli::Handover& h : tp2.handover) {
    CHECK(h.sent == 24 * 64 * 4 / 2);
    CHECK(h.gathered == 24 * 64 * 4);
  }
  // DP attention dp 2 (attn_tp 1): request i on group i mod 2, 5+4+6+3 = 18 and 3+2+1 = 6 rows.
  const cli::WorldPlan dp2 = demo_world({.tp = 2, .dp = 2, .enable_dp_attention = true, .pp = 2}, 2);
  CHECK(dp2.handover[0].sent == 18 * 64 * 4);
  CHECK(dp2.handover[1].sent == 6 * 64 * 4);
  CHECK(cli::handover(7, 3, 2, 2, 2).gathered == 0);  // 21 values do not split over 2: sent whole
  CHECK(cli::handover(7, 3, 2, 2, 2).sent == 7 * 3 * 2 * 2);
}

TEST_CASE("plan world: stage times with the hand-over, the steady state and replicas") {
  // tp 1, 2 stages, 1 GB/s inside a node and no latency: stage 0 has no collective (one rank) but
  // its send of 6144 B, 6.144 us; stage 1 none. Compute: the same flops on each stage.
  const cli::WorldPlan w = demo_world({.tp = 1, .pp = 2}, 2, slow_links());
  CHECK(w.stages[0].time.send_s == within_rel(6144e-9, 1e-9));
  CHECK(w.stages[0].time.time.comm == within_rel(6144e-9, 1e-9));
  CHECK(w.stages[1].time.time.comm == 0);
  const double compute = w.plan_of(w.stages[0]).ranks[0].memory.flops / slow_links().gpu_flops;
  CHECK(w.stages[1].time.time.compute == within_rel(compute, 1e-9));
  CHECK(w.latency() == within_rel(6144e-9 + 2 * compute, 1e-9));
  CHECK(w.interval() == within_rel(6144e-9 + compute, 1e-9));
  CHECK(w.tokens_per_s() == within_rel(24 / (6144e-9 + compute), 1e-9));
  // One GPU a node: the send crosses nodes at 0.1 GB/s.
  const cli::WorldPlan far = demo_world({.tp = 1, .pp = 2}, 2, slow_links(1));
  CHECK(far.stages[0].time.send_s == within_rel(6144e-8, 1e-9));
  // attn_tp 2: stage 1 all-gathers 6144 B over 2 ranks of one node: (n-1)/n of it, 3.072 us.
  const cli::WorldPlan tp2 = demo_world({.tp = 2, .pp = 2}, 2, slow_links());
  CHECK(tp2.stages[1].time.gather_s == within_rel(3072e-9, 1e-9));
  CHECK(tp2.stages[0].time.send_s == within_rel(3072e-9, 1e-9));
  // Replicas multiply the tokens per second, not the memory per rank.
  const cli::WorldPlan reps = demo_world({.tp = 1, .dp = 2, .pp = 2}, 2, slow_links());
  CHECK(reps.world.size() == 4);
  CHECK(reps.world_tokens_per_s() == within_rel(2 * w.tokens_per_s(), 1e-9));
  CHECK(reps.plan_of(reps.stages[0]).ranks[0].memory.total() == w.plan_of(w.stages[0]).ranks[0].memory.total());
}

TEST_CASE("plan world: a replica's domain that straddles two nodes is timed there") {
  // tp 2, 2 replicas, 3 GPUs a node: replica 1 is world ranks 2 and 3, on nodes 0 and 1.
  const cli::Cluster c = slow_links(3);
  const cli::WorldPlan w = demo_world({.tp = 2, .dp = 2, .ep = 2}, 2, c);
  const cli::LayerPlan& p = w.plan_of(w.stages[0]);
  CHECK(w.stages[0].time.time.total() == within_rel(cli::forward_time(p, c, 2).total(), 1e-9));
  CHECK(cli::forward_time(p, c, 2).total() > cli::forward_time(p, c, 0).total());
}

TEST_CASE("plan world: --nnodes sets the ranks a node, which must fit a node") {
  cli::Cluster c;  // 8 GPUs a node
  CHECK(cli::world_cluster(WorldLayout(LayoutConfig{.tp = 16, .nnodes = 2}), true, c).gpus_per_node == 8);
  CHECK(cli::world_cluster(WorldLayout(LayoutConfig{.tp = 8, .pp = 2, .nnodes = 4}), true, c).gpus_per_node == 4);
  CHECK(cli::world_cluster(WorldLayout(LayoutConfig{.tp = 16}), false, c).gpus_per_node == 8);
  CHECK_THROWS_WITH_AS(cli::world_cluster(WorldLayout(LayoutConfig{.tp = 16}), true, c),
                       doctest::Contains("--nnodes 1: the world's 16 ranks are 16 ranks a node, more than the 8 GPUs"),
                       LayoutError);
}

TEST_CASE("plan world: the JSON carries the world and every stage") {
  const nlohmann::json j = cli::world_plan_json(demo_world({.tp = 2, .dp = 2, .pp = 2}, 2));
  CHECK(j["layers"] == 2);
  CHECK(j["world"]["replicas"] == 2);
  CHECK(j["world"]["pp"] == 2);
  CHECK(j["world"]["tp"] == 2);
  CHECK(j["world"]["size"] == 8);
  CHECK(j["world"]["micro_batch_tokens"] == 24);
  REQUIRE(j["stages"].size() == 2);
  CHECK(j["stages"][1]["first_layer"] == 1);
  CHECK(j["stages"][1]["layers"] == 1);
  CHECK(j["stages"][1]["ranks"][1]["world_rank"] == 3);
  int found = 0;
  for (const nlohmann::json& e : j["stages"][1]["ranks"][0]["collectives"]) {
    if (e["op"] == "pp_recv") found += e["bytes"] == 3072;
    if (e["op"] == "pp_all_gather") found += e["bytes"] == 6144 && e["group"] == "attn_tp";
    CHECK(e["op"] != "pp_send");  // the last stage sends nothing on
  }
  CHECK(found == 2);
  bool sends = false;
  for (const nlohmann::json& e : j["ranks"][0]["collectives"]) sends = sends || (e["op"] == "pp_send" && e["bytes"] == 3072);
  CHECK(sends);
  CHECK(j["predicted_s"].get<double>() ==
        within_rel(j["stages"][0]["predicted_s"].get<double>() + j["stages"][1]["predicted_s"].get<double>(), 1e-9));
}

TEST_CASE("plan world: the demo layer's expert load from a file") {
  // Experts 0-3 (moe_ep rank 0 of 2) carry 3 each, 4-7 one: rank 0 computes 12 / 8 = 1.5x the mean
  // pairs, rank 1 0.5x. tp_moe at tp 2: each rank routes all 24 rows, 24 * 2 / 2 = 24 pairs on average.
  cli::PlanInput in;
  in.load = cli::parse_load_layers(R"({"experts": 8, "loads": [3, 3, 3, 3, 1, 1, 1, 1]})", "test");
  const cli::LayerPlan p = cli::plan_layer(RuntimeLayout({.tp = 2, .ep = 2}), in);
  CHECK(p.imbalance() == within_rel(1.5, 1e-9));
  CHECK(p.ranks[0].expert_pairs == within_rel(36, 1e-9));
  CHECK(p.ranks[1].expert_pairs == within_rel(12, 1e-9));
  // DeepEP at tp 2: a row reaches rank 0 with P 1.571 / 2 x 1.5 > 1 (every one of the 24 arriving
  // rows), rank 1 with 1.571 / 2 x 0.5.
  const cli::LayerPlan a2a = cli::plan_layer(RuntimeLayout({.tp = 2, .moe_a2a_backend = Backend::deepep}), in);
  const double hit = cli::expected_destinations(8, 2, 2) / 2;
  CHECK(a2a.ranks[0].expert_rows == within_rel(24, 1e-9));
  CHECK(a2a.ranks[1].expert_rows == within_rel(24 * hit * 0.5, 1e-9));
  CHECK(a2a.ranks[0].expert_pairs == within_rel(36, 1e-9));
  // Per layer: (1.5 + 1) / 2 and (0.5 + 1) / 2.
  in.load = cli::parse_load_layers(R"({"experts": 8, "layers": [[3, 3, 3, 3, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1]]})", "test");
  CHECK(cli::plan_layer(RuntimeLayout({.tp = 2, .ep = 2}), in).load_factors == std::vector<double>{1.25, 0.75});
  // The imbalance is each layer's busiest rank, averaged: rank 0 is hot in layer 0 (12 of 16: 1.5x),
  // rank 1 in layer 1 (1.5x). Averaged per rank the two are even (1 and 1), yet every layer waits
  // 1.5x the mean: the demo plan and the MLA plan (imbalance_of) give 1.5 from one function.
  in.load = cli::parse_load_layers(R"({"experts": 8, "layers": [[3, 3, 3, 3, 1, 1, 1, 1], [1, 1, 1, 1, 3, 3, 3, 3]]})", "test");
  const cli::LayerPlan swapped = cli::plan_layer(RuntimeLayout({.tp = 2, .ep = 2}), in);
  CHECK(swapped.load_factors == std::vector<double>{1.0, 1.0});
  CHECK(swapped.imbalance() == within_rel(1.5, 1e-9));
  CHECK(cli::imbalance_of(*in.load, 2, 0, 1, 1) == within_rel(1.5, 1e-9));
  in.load = cli::parse_load_layers(R"({"experts": 4, "loads": [1, 1, 1, 1]})", "test");
  CHECK_THROWS_WITH_AS(cli::plan_layer(RuntimeLayout({.tp = 2, .ep = 2}), in),
                       "--expert-load: the file holds the loads of 4 experts; the demo layer routes over --experts 8: "
                       "the file must come from a run with the same --experts",
                       LayoutError);
}

TEST_CASE("plan world: DeepSeek-V3 over 2 stages of EP8") {
  // 16384 tokens: 2 micro-batches of 8192 over the domain, 1024 a DP group. Stage 0: layers [0, 30),
  // the 3 dense ones, 27 MoE and the embeddings; stage 1: [30, 61), 31 MoE and the LM head. Each
  // rank hands 2 tensors (hidden states, residual) x 1024 x 7168 x 2 bytes to the next stage's.
  cli::DeployInput in;
  in.batch_tokens = 16384;
  in.request_tokens = 1024;
  const LayoutConfig cfg{.tp = 8, .dp = 8, .enable_dp_attention = true, .moe_a2a_backend = Backend::deepep, .pp = 2};
  const cli::Cluster c;  // 8 GPUs a node: stage 0 on node 0, stage 1 on node 1
  const cli::Deployment d = cli::plan_deployment(WorldLayout(cfg), in, c);
  REQUIRE(d.stages.size() == 2);
  CHECK(d.group_tokens == 1024);
  const cli::DeployStage &s0 = d.stages[0], &s1 = d.stages[1];
  CHECK((s0.dense == 3 && s0.moe == 27 && s0.embed && !s0.head));
  CHECK((s1.dense == 0 && s1.moe == 31 && !s1.embed && s1.head));
  const double sent = 2.0 * 1024 * 7168 * 2;
  CHECK(s0.handover.sent == sent);
  CHECK(s0.send_s == within_rel(c.inter_latency + sent / c.inter_bw, 1e-9));
  CHECK(s0.seconds == within_rel(3 * d.dense.total + 27 * d.moe.total + s0.send_s, 1e-9));
  CHECK(s1.seconds == within_rel(31 * d.moe.total + d.head, 1e-9));
  CHECK(d.step == within_rel(2 * std::max(s0.seconds, s1.seconds), 1e-9));
  CHECK(d.tokens_per_gpu_s == within_rel(8192 / 8 / d.step, 1e-9));
  // Memory: 32 local experts of FP8 (a 4-byte scale per 128 x 128 block); K/V of 2 micro-batches.
  const double fp8 = 1 + 4.0 / (128 * 128), expert = 3.0 * 7168 * 2048, vocab = 129280.0 * 7168;
  CHECK(s0.memory.experts == within_rel(27 * 32 * expert * fp8, 1e-9));
  CHECK(s1.memory.experts == within_rel(31 * 32 * expert * fp8, 1e-9));
  CHECK(s0.memory.embeddings == within_rel(vocab * 2, 1e-9));
  CHECK(s1.memory.embeddings == within_rel(vocab * 2, 1e-9));
  CHECK(s0.memory.kv == within_rel(2 * 1024.0 * 30 * 576 * 2, 1e-9));
  CHECK(s1.memory.kv == within_rel(2 * 1024.0 * 31 * 576 * 2, 1e-9));
  CHECK(d.fullest == 1);
  CHECK(d.memory.total() == s1.memory.total());
  // 2 replicas of tp 8 (no DP attention): each takes half the tokens; the world twice the tokens/s.
  const cli::Deployment r = cli::plan_deployment(WorldLayout(LayoutConfig{.tp = 8, .dp = 2}), in, c);
  CHECK(r.replicas == 2);
  CHECK(r.group_tokens == 8192);
  CHECK(r.world_tokens_s == within_rel(2 * 8192 / r.interval, 1e-9));
  CHECK_THROWS_WITH_AS(cli::plan_deployment(WorldLayout(LayoutConfig{.tp = 1, .pp = 62}), in, c),
                       doctest::Contains("--pp-size 62 with --preset deepseek-v3 (61 layers)"), LayoutError);
}

TEST_CASE("plan world: the rankings list pipelines") {
  cli::PlanInput in;
  in.dims.layers = 4;
  const cli::Ranking r = cli::rank_layouts(4, 512, 128, in, cli::Cluster{}, 1e12);
  int pp4 = 0;
  for (const cli::RankedLayout& l : r.layouts)
    if (l.pp == 4) {
      ++pp4;
      CHECK(l.flags.rfind("--tp 1 --pp-size 4", 0) == 0);
    }
  // tp 1 in 4 stages: backend none and the all-to-all row, each also with --enable-prefill-cp
  // (attn_cp = tp / dp = 1 at tp 1), as the ranking lists it for every domain it accepts.
  CHECK(pp4 == 4);
  cli::DeployInput dep;
  dep.batch_tokens = 16384;
  const cli::DeployRanking dr = cli::rank_deployments(16, dep, cli::Cluster{}, 80.0 * (1 << 30));
  bool piped = false;
  for (const cli::RankedDeployment& l : dr.layouts)
    piped = piped || (l.unit == "1 x PP2 x EP8 DP8" && l.flags.find("--pp-size 2") != std::string::npos);
  CHECK(piped);
}
