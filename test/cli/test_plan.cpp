// relayout plan's arithmetic against values worked out by hand: the uniform-routing destinations,
// the alpha-beta collective times per link tier, the ranking's enumeration of the layouts of 4 GPUs,
// the fp8 message, DeepEP's published kernel timings, and DeepSeek-V3's memory and costs from its
// config.json.
#include <doctest/doctest.h>

#include <set>
#include <string>

#include "cli/plan_deploy.hpp"
#include "cli/plan_rank.hpp"
#include "relayout/comm/scalar.hpp"
#include "relayout/placement/ep_message.hpp"
#include "relayout/placement/fp8.hpp"
#include <nlohmann/json.hpp>

#include "tolerance.hpp"

using relayout::test::within_abs;
using relayout::test::within_rel;

using namespace relayout;

namespace {
// |a - b| within `rel` of |b|: the tolerance each check states.
bool near(double a, double b, double rel) { return std::fabs(a - b) <= rel * std::fabs(b); }
}  // namespace

TEST_CASE("plan: expected moe_ep destinations per row under uniform routing") {
  // 8 experts on 2 ranks, top-2: P(both on one given other rank) = C(4,2)/C(8,2) = 6/28.
  CHECK(cli::expected_destinations(8, 2, 2) == within_rel(2.0 * (1.0 - 6.0 / 28.0), 1e-9));
  // One expert per rank: every expert of a row is on its own rank, k destinations.
  CHECK(cli::expected_destinations(8, 2, 8) == within_rel(2.0, 1e-9));
  // One rank holding every expert: 1 destination.
  CHECK(cli::expected_destinations(16, 4, 1) == within_rel(1.0, 1e-9));
}

TEST_CASE("plan: ring and all-to-all times per link tier") {
  cli::Cluster c;
  c.gpus_per_node = 2;
  c.intra_bw = 100e9;
  c.intra_latency = 1e-6;
  c.inter_bw = 10e9;
  c.inter_latency = 5e-6;
  // all-reduce of 1 MB on 2 ranks of one node: 2(n-1) = 2 steps, 2(n-1)/n = 1 of the buffer.
  CHECK(cli::collective_seconds(TrafficOp::all_reduce, {0, 1}, 1, 1e6, c) == within_rel(2e-6 + 1e6 / 100e9, 1e-9));
  // the same over two nodes (ranks 1 and 2): the inter-node link.
  CHECK(cli::collective_seconds(TrafficOp::all_reduce, {1, 2}, 1, 1e6, c) == within_rel(10e-6 + 1e6 / 10e9, 1e-9));
  // all-gather of 4 MB assembled on 4 ranks (two nodes), in 2 calls: each 3 steps, 3/4 of 2 MB.
  CHECK(cli::collective_seconds(TrafficOp::all_gatherv, {0, 1, 2, 3}, 2, 4e6, c) ==
        within_rel(2 * (3 * 5e-6 + 0.75 * 2e6 / 10e9), 1e-9));
  // dispatch on 4 ranks of one node (4 per node): 3/4 of what a rank sends leaves it.
  c.gpus_per_node = 4;
  CHECK(cli::collective_seconds(TrafficOp::dispatch, {0, 1, 2, 3}, 1, 8e6, c) == within_rel(3e-6 + 0.75 * 8e6 / 100e9, 1e-9));
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
  CHECK(t.comm == within_rel(4 * 6144 / 1e9 + 0.5 * 16 / 1e9, 1e-9));
  CHECK(t.compute == within_rel(std::max(p.ranks[0].memory.flops, p.ranks[1].memory.flops) / c.gpu_flops, 1e-9));
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
  // --tp 4 --cp 2: one DP group of 8 tokens; plain CP cuts each request into 4 blocks and gives CP
  // rank r blocks r and 3 - r: 5 -> blocks 2 1 1 1 (rank 0: 2 + 1, rank 1: 1 + 1), 3 -> blocks
  // 1 1 1 0 (rank 0: 1 + 0, rank 1: 1 + 1): shares 4 and 4, CP rank 0 on ranks 0-1, CP rank 1 on
  // ranks 2-3.
  const cli::LayerPlan p = cli::plan_layer(RuntimeLayout({.tp = 4, .cp = 2}), in);
  CHECK(p.global_num_tokens == std::vector<std::int64_t>{4, 4});
  CHECK(p.ranks[1].attention_rows == 4);
  CHECK(p.ranks[2].attention_rows == 4);
  const std::size_t kv = TrafficLog::slot(TrafficOp::all_gatherv, GroupKind::attn_cp);
  for (const cli::RankPlan& r : p.ranks) {
    CHECK(r.calls[kv] == 2);           // once per layer
    CHECK(r.bytes[kv] == 2 * 8 * 4 * 4);  // the group's 8 rows x head_dim 4 x 4 bytes, 2 layers
  }
  // K/V memory: its own rows' kv_raw and kv (2 x rows x 4 x 4 B) and the gathered and reordered
  // group (2 x 8 x 4 x 4 B).
  CHECK(p.ranks[0].memory.kv == 2 * 4 * 16 + 2 * 8 * 16);
  CHECK(p.ranks[3].memory.kv == 2 * 4 * 16 + 2 * 8 * 16);
  // The attention all-reduce over attn_tp moves the share's rows: 4 x 16 x 4 B per layer.
  CHECK(p.ranks[0].bytes[TrafficLog::slot(TrafficOp::all_reduce, GroupKind::attn_tp)] == 2 * 4 * 64);
  // Prefill CP at tp 4 (attn_cp 4): the group's 9 tokens dealt round-robin, 3 2 2 2.
  in.requests = {5, 1, 3};
  const cli::LayerPlan q = cli::plan_layer(RuntimeLayout({.tp = 4, .enable_prefill_cp = true, .cp_strategy = CpStrategy::interleave}), in);
  CHECK(q.global_num_tokens == std::vector<std::int64_t>{3, 2, 2, 2});
  // Plain CP 4 on the same requests, 8 blocks each, CP rank r holding blocks r and 7 - r:
  // 5 -> 1 1 1 1 1 0 0 0 (1 1 1 2), 1 -> 1 0 ... (1 0 0 0), 3 -> 1 1 1 0 ... (1 1 1 0).
  const cli::LayerPlan c = cli::plan_layer(RuntimeLayout({.tp = 4, .cp = 4}), in);
  CHECK(c.global_num_tokens == std::vector<std::int64_t>{3, 2, 2, 2});
}

TEST_CASE("plan: a dispatched row is EpBuffer's message") {
  cli::PlanInput in;  // hidden 64, top-2 by default
  in.dims.hidden = 64;
  in.dims.topk = 2;
  const cli::LayerPlan p = cli::plan_layer(RuntimeLayout({.tp = 2, .moe_a2a_backend = Backend::deepep}), in);
  // float: 2 weights and 2 ids (8 B each pair) and 64 values: 16 + 256 B.
  CHECK(p.message.bytes == 16 + 256);
  CHECK(p.message.bytes == EpMessage::of<float>(2, 64).bytes);
  in.elem = 2;  // bf16 values, fp32 router weights: 2 x (4 + 4) + 128 = 144 B
  CHECK(cli::plan_layer(RuntimeLayout({.tp = 2, .moe_a2a_backend = Backend::deepep}), in).message.bytes ==
        EpMessage::of<float, bf16>(2, 64).bytes);
  CHECK(EpMessage::of<float, bf16>(2, 64).bytes == 144);
  CHECK(EpMessage::of<bf16>(2, 64).bytes == 140);  // 16-bit weights (what the planner no longer assumes)
  in.elem = 3;
  CHECK_THROWS_WITH_AS(cli::plan_layer(RuntimeLayout({.tp = 2}), in), doctest::Contains("--element-bytes must be 1, 2, 4 or 8"),
                       LayoutError);
  // --dispatch-dtype bf16: float weights and ids (2 x 8 B) and 64 bf16 values (128 B), as
  // EpBuffer sends them with DispatchDtype::bf16; only on a path that dispatches rows.
  in.elem = 4;
  in.dispatch_dtype = "bf16";
  const cli::LayerPlan half = cli::plan_layer(RuntimeLayout({.tp = 2, .moe_a2a_backend = Backend::deepep}), in);
  CHECK(half.message.bytes == 16 + 128);
  CHECK(half.message.bytes == EpMessage::of<float, bf16>(2, 64).bytes);
  CHECK_THROWS_WITH_AS(cli::plan_layer(RuntimeLayout({.tp = 2}), in),
                       doctest::Contains("--dispatch-dtype bf16 needs a path that dispatches rows"), LayoutError);
  in.dispatch_dtype = "fp16";
  CHECK_THROWS_WITH_AS(cli::plan_layer(RuntimeLayout({.tp = 2, .moe_a2a_backend = Backend::deepep}), in),
                       doctest::Contains("--dispatch-dtype must be fp32, bf16 or fp8, got 'fp16'"), LayoutError);
}

TEST_CASE("plan: the ranking enumerates every layout of 4 GPUs the layer runs") {
  // By hand, without CP: 4 replicas of tp 1 (backend none; all-to-all): 2; 2 replicas of tp 2
  // (ep 1, 2; all-to-all): 3; tp 4 without DP attention (ep 1, 2, 4; all-to-all): 4; with DP
  // attention dp 2 and 4: 4 each. 17.
  // With CP (tp 4 only: 2 replicas of tp 2 cannot hold cp 2, tp % (dp * cp) != 0): cp 2 (attn_tp
  // 2): ep 1, 2, 4 and moe_dp 2 with ep 1, 2, all-to-all: 6; cp 4: ep 1, 2, 4, moe_dp 4, all-to-all:
  // 5; dp 2 with DP attention and cp 2: 6 as cp 2; prefill CP (attn_cp 4, round-robin): 5 as cp 4.
  // 22. Nothing is skipped.
  // Pipelines of 2 stages (the demo's 2 layers allow no more; --moe-dp-size > 1 does not combine
  // with them): one of tp 2: ep 1, 2 and all-to-all: 3; cp 2: 3; DP attention dp 2: 3; prefill CP
  // (attn_cp 2): 3; 2 replicas of tp 1: 2. 14, of them 6 with CP.
  cli::PlanInput in;
  const cli::Ranking r = cli::rank_layouts(4, 512, 128, in, cli::Cluster{}, 1e12);
  CHECK(r.layouts.size() == 39 + 14);
  std::set<std::string> flags;
  int cp = 0, piped = 0, piped_cp = 0;
  for (std::size_t i = 0; i < r.layouts.size(); ++i) {
    flags.insert(r.layouts[i].flags);
    if (i > 0) CHECK(r.layouts[i - 1].time.total() <= r.layouts[i].time.total());
    CHECK(r.layouts[i].fits);
    const bool has_cp = RuntimeLayout(r.layouts[i].config).widths().attn_cp > 1;
    cp += has_cp;
    CHECK(r.layouts[i].pp == r.layouts[i].config.pp);
    if (r.layouts[i].pp > 1) {
      CHECK(r.layouts[i].pp == 2);
      CHECK(r.layouts[i].flags.find(" --pp-size 2") != std::string::npos);
      ++piped;
      piped_cp += has_cp;
    }
  }
  CHECK(flags.size() == 39 + 14);
  CHECK(piped == 14);
  CHECK(cp == 22 + 6);
  CHECK(piped_cp == 6);
  CHECK(flags.count("--tp 1 --pp-size 2 --dp 2") == 1);
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
  CHECK(backends_of("--tp 4 --enable-prefill-cp --cp-strategy interleave") == "deepep|mori|megamoe");
  CHECK(flags.count("--tp 1 --dp 4") == 1);
  CHECK(flags.count("--tp 4 --cp 2 --ep 2 --moe-dp-size 2") == 1);
  // Too little memory for any: still ranked, none fits.
  const cli::Ranking tight = cli::rank_layouts(4, 512, 128, in, cli::Cluster{}, 1024);
  for (const cli::RankedLayout& l : tight.layouts) CHECK_FALSE(l.fits);
}

TEST_CASE("plan: an fp8 dispatched row: e4m3 values, one fp32 scale per 128 values, the weights and ids") {
  for (std::int64_t h : {1, 127, 128, 129, 7168})  // the scales Fp8Rows holds (fp8.hpp) are the ones counted
    CHECK(EpMessage::fp8_row_bytes(h) == h + relayout::fp8_blocks(h) * 4);
  // DeepSeek-V3: hidden 7168 = 56 blocks of 128; top-8 float weights and int32 ids: 64 B.
  CHECK(EpMessage::fp8_row_bytes(7168) == 7168 + 56 * 4);
  const EpMessage m = EpMessage::of_fp8<float>(8, 7168);
  CHECK(m.scales == 64);
  CHECK(m.row == 64 + 224);
  CHECK(m.bytes == 64 + 224 + 7168);
  // hidden 100: one (partial) block, 100 values padded to 4: 2 x 8 + 4 + 100 = 120.
  CHECK(EpMessage::of_fp8<float>(2, 100).bytes == 120);
  CHECK(EpMessage::of_fp8<double>(1, 130).bytes == 8 + 4 + 8 + 130 + 2);  // 152: aligned to 8
  CHECK(EpMessage::of<float>(2, 64).scales == -1);
}

// DeepEP's README (deepseek-ai/DeepEP, "Performance"): H800 (~160 GB/s NVLink), CX7 400 Gb/s
// (~50 GB/s). Normal kernels: 4096 tokens, hidden 7168, top-4 groups (groups = nodes), top-8,
// FP8 dispatch, BF16 combine, bottleneck bandwidth per rank. Low-latency kernels: 128 tokens,
// top-8, 256 experts, latency per call. The README's bandwidth counts one row per (token,
// destination node) internode, per (token, destination rank) intranode, own node / rank included
// (so 58 GB/s can exceed the NIC): its time is those rows x row bytes / bandwidth.
namespace {
struct NormalRow {
  int ep;
  double dispatch_gbs, combine_gbs;
};
constexpr NormalRow kDeepEpNormal[] = {{8, 153, 158}, {16, 43, 43}, {32, 58, 57}, {64, 51, 50}};
struct LowLatencyRow {
  int ep;
  double dispatch_us, combine_us;
};
constexpr LowLatencyRow kDeepEpLowLatency[] = {{8, 77, 114},   {16, 118, 195},  {32, 155, 273},
                                              {64, 173, 314}, {128, 192, 369}, {256, 194, 360}};

// P(a rank holding `mine` of `pool` candidate experts gets none of k): by hand, not the planner's.
double none_of(int pool, int mine, int k) {
  double p = 1;
  for (int i = 0; i < k; ++i) p *= double(pool - mine - i) / double(pool - i);
  return p;
}
}  // namespace

TEST_CASE("plan: DeepEP's normal kernels, planned against its README's table within 25%") {
  const cli::Cluster c = cli::Cluster::preset("h800");
  const double fp8 = 7168 * (1 + 4.0 / 128), bf16 = 7168 * 2;  // the README's bytes per row
  for (const NormalRow& row : kDeepEpNormal) {
    const int nodes = row.ep / 8, experts = 256 / row.ep * row.ep;
    // Rows the README counts: intranode, 4096 x expected destination ranks (32 experts a rank,
    // top-8 of 256 uniform); internode, 4096 x min(nodes, 4) (each chosen group is one node).
    const double counted = nodes == 1 ? 4096 * 8 * (1 - none_of(256, 32, 8)) : 4096.0 * std::min(nodes, 4);
    const cli::Spread s = cli::routing_spread(experts, 8, nodes, std::min(nodes, 4), row.ep, 8);
    const double t_dispatch = counted * fp8 / (row.dispatch_gbs * 1e9);
    const double t_combine = counted * bf16 / (row.combine_gbs * 1e9);
    const double p_dispatch = cli::deepep_seconds(false, 4096, double(EpMessage::of_fp8<float>(8, 7168).bytes), 8, s, row.ep, c).seconds;
    const double p_combine = cli::deepep_seconds(false, 4096, bf16, 8, s, row.ep, c).seconds;
    MESSAGE("normal EP", row.ep, ": dispatch README ", t_dispatch * 1e6, " us, planned ", p_dispatch * 1e6,
            " us; combine README ", t_combine * 1e6, " us, planned ", p_combine * 1e6, " us");
    CHECK(p_dispatch == within_rel(t_dispatch, 0.25));
    CHECK(p_combine == within_rel(t_combine, 0.25));
  }
}

// deepep_seconds' byte and time terms by hand, across nodes: EP16 on two nodes of 8 GPUs, a token
// reaching 6 ranks on 1.5 nodes on average. The normal kernels send a token once over RDMA to each
// other node it reaches (per node, not per destination rank) and once over NVLink to each other
// destination GPU; the low-latency kernels send each (token, expert) copy, half of them off-node.
TEST_CASE("plan: DeepEP's byte and time terms across nodes, by hand") {
  const cli::Cluster c = cli::Cluster::preset("h800");
  cli::Spread s;
  s.ranks = 6.0;
  s.nodes = 1.5;
  s.node_count = 2;
  const double row = 7392;  // 7168 fp8 values and 56 fp32 scales
  const cli::DeepEpCost n = cli::deepep_seconds(false, 4096, row, 8, s, 16, c);
  // RDMA: 4096 tokens x 1.5 nodes x (1 - 1/2: one of the two nodes is its own) x 7392 B.
  CHECK(n.rdma_bytes == within_rel(22708224.0, 1e-12));
  // NVLink: 4096 x 6 ranks x (1 - 1/8: one of a node's 8 GPUs is its own) x 7392 B.
  CHECK(n.nvlink_bytes == within_rel(158957568.0, 1e-12));
  const double rdma_s = 22708224.0 / (c.inter_bw * c.eff.normal_rdma);
  const double nvlink_s = 158957568.0 / (c.intra_bw * c.eff.normal_nvlink);
  CHECK(n.seconds == within_rel(c.eff.normal_latency + std::max(rdma_s, nvlink_s), 1e-12));
  // One node (EP8): no RDMA; NVLink 4096 x 6 x (1 - 1/8) x 7392 B.
  s.nodes = 1.0;
  s.node_count = 1;
  const cli::DeepEpCost one = cli::deepep_seconds(false, 4096, row, 8, s, 8, c);
  CHECK(one.rdma_bytes == 0.0);
  CHECK(one.nvlink_bytes == within_rel(158957568.0, 1e-12));
  // Low latency, EP16 on 2 nodes: 128 tokens x 8 copies x 7392 B, 8 of the 16 ranks off-node.
  s.node_count = 2;
  const cli::DeepEpCost ll = cli::deepep_seconds(true, 128, row, 8, s, 16, c);
  CHECK(ll.rdma_bytes == within_rel(3784704.0, 1e-12));
  CHECK(ll.nvlink_bytes == within_rel(3784704.0, 1e-12));
  CHECK(ll.seconds == within_rel(c.eff.ll_latency + std::max(3784704.0 / (c.inter_bw * c.eff.ll_rdma),
                                                             3784704.0 / (c.intra_bw * c.eff.ll_nvlink)),
                                 1e-12));
}

TEST_CASE("plan: DeepEP's low-latency kernels, planned against its README's table within 25%") {
  const cli::Cluster c = cli::Cluster::preset("h800");
  for (const LowLatencyRow& row : kDeepEpLowLatency) {
    const cli::Spread s = cli::routing_spread(256, 8, 1, 1, row.ep, 8);
    const double d = cli::deepep_seconds(true, 128, double(EpMessage::fp8_row_bytes(7168)), 8, s, row.ep, c).seconds;
    const double k = cli::deepep_seconds(true, 128, 7168 * 2, 8, s, row.ep, c).seconds;
    MESSAGE("low-latency EP", row.ep, ": dispatch README ", row.dispatch_us, " us, planned ", d * 1e6, " us; combine README ",
            row.combine_us, " us, planned ", k * 1e6, " us");
    CHECK(d * 1e6 == within_rel(row.dispatch_us, 0.25));
    CHECK(k * 1e6 == within_rel(row.combine_us, 0.25));
  }
}

// DeepSeek-V3's config.json, by hand: hidden 7168, 61 layers of which 3 dense (intermediate
// 18432), 256 routed + 1 shared experts of intermediate 2048, 128 heads, q_lora 1536, kv_lora 512,
// qk nope 128 + rope 64, v 128, vocab 129280.
namespace {
constexpr double kAttn = 7168.0 * 1536 + 7168.0 * (512 + 64) + 1536.0 * 128 * (128 + 64) + 512.0 * 128 * (128 + 128) +
                         128.0 * 128 * 7168;  // q_a, kv_a, q_b, kv_b, o
constexpr double kExpert = 3.0 * 7168 * 2048;
constexpr double kDense = 3.0 * 7168 * 18432;
constexpr double kVocab = 129280.0 * 7168;

cli::DeployInput prefill(std::int64_t tokens) {
  cli::DeployInput in;
  in.batch_tokens = tokens;
  in.request_tokens = 4096;
  return in;
}
cli::DeployInput decode(int requests, int kv) {
  cli::DeployInput in;
  in.phase = cli::Phase::decode;
  in.requests_per_gpu = requests;
  in.kv_len = kv;
  return in;
}
const RuntimeLayout kEp32({.tp = 32, .dp = 32, .enable_dp_attention = true, .moe_a2a_backend = Backend::deepep});
}  // namespace

TEST_CASE("plan: DeepSeek-V3's parameters and memory per rank, from config.json by hand") {
  CHECK(kAttn == within_rel(187.1e6, 0.001));  // 187 M per layer, not the demo shape's 585 M
  // One GPU holding everything in BF16 (2-byte weights, no block scales): 671 B parameters.
  cli::DeployInput in = prefill(4096);
  in.weight_bytes = 2;
  const cli::Deployment one = cli::plan_deployment(RuntimeLayout({.tp = 1}), in, cli::Cluster{});
  const double norms = 61 * (2 * 7168.0 + 1536 + 512);
  const double params = 61 * kAttn + 3 * kDense + 58 * (257 * kExpert + 256 * 7168.0) + 2 * kVocab;
  CHECK(params == within_rel(671.0e9, 0.002));
  CHECK(one.memory.weights() == within_rel(2 * (params + norms), 1e-9));
  // EP32 with DP attention 32 (attn_tp 1), FP8 weights with one fp32 scale per 128 x 128 block:
  // 8 routed experts a layer, the shared expert and all of attention on every rank.
  const cli::Deployment ep = cli::plan_deployment(kEp32, prefill(32 * 16384), cli::Cluster{});
  const double fp8 = 1 + 4.0 / (128 * 128);
  CHECK(ep.memory.experts == within_rel(58 * 8 * kExpert * fp8, 1e-9));
  CHECK(ep.memory.shared == within_rel(58 * kExpert * fp8, 1e-9));
  CHECK(ep.memory.attention == within_rel(61 * kAttn * fp8 + 2 * norms, 1e-9));
  CHECK(ep.memory.embeddings == within_rel(2 * kVocab * 2, 1e-9));
  // 16384 prompt tokens a rank: MLA caches 512 + 64 BF16 values per token and layer (68.6 KiB a token).
  CHECK(61 * 576 * 2 == 70272);
  CHECK(ep.memory.kv == within_rel(16384.0 * 70272, 1e-9));
  CHECK(ep.memory.weights() / double(1 << 30) == within_rel(36.8, 0.01));  // fits an 80 GB H100
  CHECK(ep.memory.total() < cli::Cluster::preset("h100").memory);
  // Decode: 64 requests a GPU with 4096 tokens cached (and the new one) each.
  const cli::Deployment dec = cli::plan_deployment(kEp32, decode(64, 4096), cli::Cluster{});
  CHECK(dec.memory.kv == within_rel(64.0 * 4097 * 70272, 1e-9));
  // Redundant experts: (256 + 32) / 32 = 9 physical experts a rank.
  cli::DeployInput red = decode(64, 4096);
  red.redundant_experts = 32;
  CHECK(cli::plan_deployment(kEp32, red, cli::Cluster{}).memory.experts == within_rel(58 * 9 * kExpert * fp8, 1e-9));
  CHECK_THROWS_WITH_AS(cli::plan_deployment(RuntimeLayout({.tp = 8}), red, cli::Cluster{}),
                       doctest::Contains("--ep-num-redundant-experts 32 needs expert parallelism"), LayoutError);
  red.redundant_experts = 3;
  CHECK_THROWS_WITH_AS(cli::plan_deployment(kEp32, red, cli::Cluster{}),
                       doctest::Contains("physical experts = 256 routed + 3 redundant = 259 must be a multiple of moe_ep = 32"),
                       LayoutError);
}

TEST_CASE("plan: DeepSeek-V3 decode reads the KV cache and every weight; prefill halves the causal pairs") {
  const cli::Cluster c = cli::Cluster::preset("h100");
  const cli::Deployment d = cli::plan_deployment(kEp32, decode(64, 4096), c);
  // Attention of one layer cannot beat reading its cache: 64 x 4097 x 576 x 2 B at 85% of 3.35 TB/s.
  const double kv_read = 64.0 * 4097 * 576 * 2 / (3350e9 * 0.85);
  CHECK(d.moe.attention > kv_read);
  // Nor the experts reading their 8 experts' FP8 weights (64 x 32 x 8 pairs hit all 8).
  CHECK(d.moe.experts > 8 * kExpert / (3350e9 * 0.85) * 0.99);
  CHECK(d.low_latency);  // auto: low-latency kernels for decode
  CHECK(d.dispatch_row == 7168 + 56 * 4);
  // Prefill of one 4096-token request at tp 1: causal attention is 4096 x 4097 / 2 query-key pairs
  // of 128 heads x (192 + 128) x 2 flops at FlashAttention-3's 579 TFLOP/s (causal, 4k, its
  // paper's figure 5); the projections at DeepGEMM's M = 4096 rates for their shapes (README
  // table): q_a + kv_a 1058, q_b 990, kv_b 590, o 1358 TFLOP/s.
  cli::DeployInput in = prefill(4096);
  const cli::Deployment p = cli::plan_deployment(RuntimeLayout({.tp = 1}), in, c);
  const double core = 4096.0 * 4097 / 2 * 128 * 320 * 2 / 579e12;
  const double proj = 2 * 4096.0 *
                      (7168.0 * 2112 / 1058e12 + 1536.0 * 24576 / 990e12 + 512.0 * 32768 / 590e12 + 16384.0 * 7168 / 1358e12);
  CHECK(near(p.moe.attention, core + proj, 1e-9));
}

TEST_CASE("plan: two-batch overlap takes max(compute, communication) of the two micro-batches") {
  const cli::Cluster c = cli::Cluster::preset("h800");
  cli::DeployInput in = prefill(32 * 16384);
  const cli::Deployment plain = cli::plan_deployment(kEp32, in, c);
  CHECK(plain.moe.total == within_rel(plain.moe.compute() + plain.moe.comm(), 1e-9));
  CHECK(plain.moe.exposed == within_rel(plain.moe.comm(), 1e-9));
  in.two_batch_overlap = true;
  const cli::Deployment tbo = cli::plan_deployment(kEp32, in, c);
  // The two micro-batches overlap (test_plan_model checks the order they run in by hand): no
  // shorter than the compute or the communication, no longer than both added; DeepEP's 20 SMs
  // and the order cost time beyond the larger.
  const double comm = tbo.moe.dispatch + tbo.moe.combine;
  CHECK(tbo.moe.total > std::max(comm, tbo.moe.compute()));
  CHECK(tbo.moe.total < tbo.moe.compute() + comm);
  // Each micro-batch pays its own DeepEP latency: two calls of half the rows.
  CHECK(tbo.moe.dispatch == within_rel(plain.moe.dispatch + c.eff.normal_latency, 1e-9));
  CHECK(tbo.step < plain.step);
}

TEST_CASE("plan: --enable-attn-tp-input-scattered divides q_a and kv_a by attn_tp on path tp_moe only") {
  const cli::Cluster c = cli::Cluster::preset("h100");
  cli::DeployInput in = prefill(8192);
  const RuntimeLayout tp8({.tp = 8});  // path tp_moe, attn_tp 8
  const cli::Deployment plain = cli::plan_deployment(tp8, in, c);
  in.attn_tp_input_scattered = true;
  const cli::Deployment scattered = cli::plan_deployment(tp8, in, c);
  // q_a (7168 x 1536) and kv_a (7168 x (512 + 64)) on 8192 / 8 tokens instead of 8192, one FP8
  // GEMM of N 2112, K 7168: DeepGEMM's table gives 1058 TFLOP/s at M 4096 (and beyond) and 352 at
  // M 128, so 352 + (1058 - 352) * log2(1024 / 128) / log2(4096 / 128) = 775.6 at M 1024
  // (compute-bound both ways: the weights are read whole either way).
  const double replicated = 7168.0 * 1536 + 7168.0 * (512 + 64);
  CHECK(near(plain.moe.attention - scattered.moe.attention,
             2.0 * 8192 * replicated / 1058e12 - 2.0 * 1024 * replicated / 775.6e12, 1e-9));
  CHECK(plain.dense.attention > scattered.dense.attention);
  // ... and their outputs all-gathered over attn_tp: 8192 tokens x (1536 + 512 + 64) BF16 values.
  CHECK(scattered.moe.other_comm - plain.moe.other_comm ==
        within_rel(cli::collective_seconds(TrafficOp::all_gather, 8, true, 1, 8192.0 * 2112 * 2, c), 1e-9));
  CHECK(scattered.memory.total() == within_rel(plain.memory.total(), 1e-9));  // same weights on every rank
  CHECK(scattered.step < plain.step);
  // SGLang applies it on TP without DP attention or an all-to-all backend only: elsewhere the plan is unchanged.
  const cli::Deployment direct = cli::plan_deployment(kEp32, in, c);
  in.attn_tp_input_scattered = false;
  CHECK(direct.step == cli::plan_deployment(kEp32, in, c).step);
  CHECK_FALSE(cli::attn_input_scattered(BridgePath::direct, kEp32.widths()));
  CHECK(cli::attn_input_scattered(BridgePath::tp_moe, tp8.widths()));
}

TEST_CASE("plan: the expert-load imbalance, given or from a load file, on the busiest rank") {
  // 8 experts on 2 ranks: rank loads 16 and 4, mean 10: 1.6. Per layer 1.6 and 1.0: 1.3.
  const std::vector<double> skewed = {4, 4, 4, 4, 1, 1, 1, 1}, flat(8, 1.0);
  CHECK(cli::imbalance_of({skewed}, 2, 0, 1, 1) == within_rel(1.6, 1e-9));
  CHECK(cli::imbalance_of({skewed, flat}, 2, 0, 1, 1) == within_rel(1.3, 1e-9));
  CHECK(cli::imbalance_of({skewed}, 8, 0, 1, 1) == within_rel(1.6, 1e-9));  // 4 / 2.5
  // With 2 redundant experts (5 a rank) the library's rebalancer replicates experts 0 and 1 (load 2
  // a replica) and packs 4 2 2 1 1 and 4 2 2 1 1: 10 and 10, balanced.
  CHECK(cli::imbalance_of({skewed}, 2, 2, 1, 1) == within_rel(1.0, 1e-9));
  CHECK_THROWS_WITH_AS(cli::imbalance_of({skewed}, 3, 0, 1, 1), doctest::Contains("8 experts + 0 redundant must be a multiple of moe_ep = 3"),
                       LayoutError);
  // The file: the library's {"experts", "loads"} form, or one list per layer.
  CHECK(cli::parse_load_layers("{\"experts\": 2, \"loads\": [3, 1]}", "f") == std::vector<std::vector<double>>{{3, 1}});
  CHECK(cli::parse_load_layers("{\"experts\": 2, \"layers\": [[3, 1], [0, 2]]}", "f") ==
        std::vector<std::vector<double>>{{3, 1}, {0, 2}});
  CHECK_THROWS_WITH_AS(cli::parse_load_layers("{\"experts\": 8, \"layers\": [[1, 2]]}", "f"),
                       doctest::Contains("f: \"layers\"[0] holds 2 numbers for \"experts\": 8"), LayoutError);
  CHECK_THROWS_WITH_AS(cli::parse_load_layers("{\"experts\": 8, \"loads\": [1, 2", "f"), doctest::Contains("f: "), LayoutError);
  // The per-layer form is as strict as the single list: each key once, no other key, one of the two
  // lists, every list of "experts" numbers with a finite sum.
  const auto refusal = [](const char* text) {
    try {
      cli::parse_load_layers(text, "f");
    } catch (const LayoutError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK(refusal("{\"experts\": 2, \"layers\": [[1, 2]], \"layers\": [[1, 2]]}").starts_with("f: \"layers\" appears twice"));
  CHECK(refusal("{\"experts\": 2, \"layers\": [[1, 2]], \"step\": 1}")
            .starts_with("f: unknown key \"step\" (expected \"experts\" and one of \"loads\" and \"layers\")"));
  CHECK(refusal("{\"experts\": 2, \"layers\": [[1, 2]], \"loads\": [1, 2]}").starts_with("f: both \"loads\" and \"layers\""));
  CHECK(refusal("{\"experts\": 2, \"loads\": [1, 2], \"layers\": [[1, 2]]}").starts_with("f: both \"loads\" and \"layers\""));
  CHECK(refusal("{\"experts\": 2, \"layers\": []}").starts_with("f: \"layers\" must hold at least one list"));
  CHECK(refusal("{\"experts\": 2, \"layers\": [[1, 2], [3]]}").starts_with("f: \"layers\"[1] holds 1 numbers for \"experts\": 2"));
  CHECK(refusal("{\"experts\": 2, \"experts\": 2, \"layers\": [[1, 2]]}").starts_with("f: \"experts\" appears twice"));
  CHECK(refusal("{\"experts\": 2, \"layers\": [[1, -2]]}").starts_with("f: a load must be a finite number >= 0"));
  CHECK(refusal("{\"experts\": 2, \"layers\": [[1, 1], [1e308, 1e308]]}")
            .starts_with("f: \"layers\"[1]: the loads sum to more than the largest finite number (1.8e308)"));
  // Loads near the largest double with a finite sum: the factors are ratios, taken before any
  // product. 8 experts on 8 ranks, 5e307 against 7 x 1e307: the busiest 5e307 over the mean 1.5e307.
  std::vector<double> huge(8, 1e307);
  huge[0] = 5e307;
  CHECK(cli::imbalance_of({huge}, 8, 0, 1, 1) == within_rel(5.0 / 1.5, 1e-12));
  const cli::Cluster c = cli::Cluster::preset("h800");
  cli::DeployInput in = prefill(32 * 16384);
  in.imbalance = 1.0;
  const cli::Deployment even = cli::plan_deployment(kEp32, in, c);
  in.imbalance = 1.5;
  const cli::Deployment skew = cli::plan_deployment(kEp32, in, c);
  CHECK(skew.expert_pairs == within_rel(1.5 * even.expert_pairs, 1e-9));
  CHECK(skew.moe.dispatch - c.eff.normal_latency == within_rel(1.5 * (even.moe.dispatch - c.eff.normal_latency), 1e-9));
  CHECK(skew.moe.attention == within_rel(even.moe.attention, 1e-9));
}

TEST_CASE("plan: node-limited routing: 4 of 8 groups, one group a node at EP64") {
  // Each chosen group is one node of 32 experts in a pool of 128: hit unless all 8 experts miss it.
  const cli::Spread s = cli::routing_spread(256, 8, 8, 4, 64, 8);
  CHECK(s.node_count == 8);
  CHECK(s.nodes == within_rel(4 * (1 - none_of(128, 32, 8)), 1e-9));
  // Each chosen group's 32 experts on 8 ranks of 4: 32 ranks could be hit.
  CHECK(s.ranks == within_rel(32 * (1 - none_of(128, 4, 8)), 1e-9));
  // Without groups: 256 experts uniformly, 8 ranks of 32.
  CHECK(cli::routing_spread(256, 8, 1, 1, 8, 8).ranks == within_rel(8 * (1 - none_of(256, 32, 8)), 1e-9));
}

TEST_CASE("plan: the DeepSeek-V3 ranking lists replicas of DP-attention domains") {
  const cli::DeployRanking r = cli::rank_deployments(64, prefill(64 * 16384), cli::Cluster::preset("h800"), 80.0 * (1 << 30));
  std::set<std::string> units;
  for (const cli::RankedDeployment& l : r.layouts) units.insert(l.unit);
  CHECK(units.count("4 x EP16 DP16") == 1);
  CHECK(units.count("2 x EP32 DP32") == 1);
  CHECK(units.count("1 x EP64 DP64") == 1);
  for (std::size_t i = 1; i < r.layouts.size(); ++i)
    if (r.layouts[i].fits == r.layouts[i - 1].fits)
      CHECK(r.layouts[i - 1].plan.tokens_per_gpu_s >= r.layouts[i].plan.tokens_per_gpu_s);
  CHECK(cli::mla_preset("deepseek-r1").hidden == 7168);
  CHECK_THROWS_WITH_AS(cli::mla_preset("llama"), doctest::Contains("--preset: unknown model 'llama'"), LayoutError);
  CHECK_THROWS_WITH_AS(cli::hardware_preset("a100"), doctest::Contains("--hardware: unknown GPU 'a100'"), LayoutError);
}

TEST_CASE("plan: every efficiency constant has a flag, and the time model reads it") {
  CLI::App app;
  cli::Cluster c;
  c.add_to(app);
  const char* argv[] = {"plan", "--gemm-efficiency", "0.5", "--attention-efficiency", "0.4", "--hbm-efficiency", "0.9",
                        "--deepep-normal-nvlink", "0.6", "--deepep-normal-rdma", "0.7", "--deepep-normal-latency", "20",
                        "--deepep-ll-nvlink", "0.75", "--deepep-ll-rdma", "0.85", "--deepep-ll-latency", "40",
                        "--deepep-normal-sms", "24", "--deepep-ll-sms", "8", "--gpu-sms", "100",
                        "--kernel-gap-graph", "2", "--kernel-gap-eager", "5"};
  app.parse(int(std::size(argv)), argv);
  c.resolve(&app);
  CHECK(c.eff.gemm == 0.5);
  CHECK(c.eff.attention == 0.4);
  CHECK(c.eff.hbm == 0.9);
  CHECK(c.eff.normal_nvlink == 0.6);
  CHECK(c.eff.normal_rdma == 0.7);
  CHECK(c.eff.normal_latency == within_rel(20e-6, 1e-9));
  CHECK(c.eff.ll_nvlink == 0.75);
  CHECK(c.eff.ll_rdma == 0.85);
  CHECK(c.eff.ll_latency == within_rel(40e-6, 1e-9));
  // Unset, they are the documented defaults (a preset does not touch them).
  const cli::Cluster d = cli::Cluster::preset("h800");
  CHECK(c.eff.normal_sms == 24);
  CHECK(c.eff.ll_sms == 8);
  CHECK(c.sms == 100);
  CHECK(near(c.eff.gap_graph, 2e-6, 1e-12));
  CHECK(near(c.eff.gap_eager, 5e-6, 1e-12));
  CHECK_FALSE(c.eff.gemm_table);     // one share for every GEMM once --gemm-efficiency is given
  CHECK_FALSE(c.eff.prefill_table);  // and for prefill attention once --attention-efficiency is
  CHECK(d.eff.gemm_table);
  CHECK(d.eff.prefill_table);
  CHECK(d.eff.normal_sms == 20);
  CHECK(d.sms == 132);
  CHECK(cli::Cluster::preset("gb200").sms == 148);
  CHECK(near(d.eff.gap_graph, 1.3e-6, 1e-12));
  CHECK(near(d.eff.gap_eager, 2.1e-6, 1e-12));
  CHECK(d.eff.normal_latency == within_rel(25e-6, 1e-9));
  CHECK(d.eff.ll_latency == within_rel(30e-6, 1e-9));
  // Decode without two-batch overlap: one low-latency dispatch a MoE layer, so 10 us more latency
  // a call is 10 us more dispatch.
  cli::Cluster slow = cli::Cluster::preset("h800");
  slow.eff.ll_latency += 10e-6;
  const cli::Deployment base = cli::plan_deployment(kEp32, decode(64, 4096), cli::Cluster::preset("h800"));
  const cli::Deployment later = cli::plan_deployment(kEp32, decode(64, 4096), slow);
  CHECK(later.moe.dispatch - base.moe.dispatch == within_rel(10e-6, 1e-9));
  CHECK(later.moe.combine - base.moe.combine == within_rel(10e-6, 1e-9));
}
