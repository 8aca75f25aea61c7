// The MLA presets' time model against values written out by hand from its sources: DeepGEMM's and
// FlashAttention-3's published tables, the kernels that are not GEMMs, launch gaps, the serving
// conditions, MTP, and the published deployments of docs/planning.md (predicted / published).
#include <doctest/doctest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/plan_deploy.hpp"

using namespace relayout;

namespace {
// |a - b| within `rel` of |b|: the tolerance each check states.
bool near(double a, double b, double rel) { return std::fabs(a - b) <= rel * std::fabs(b); }

cli::DeployInput prefill(std::int64_t tokens, int request = 4096) {
  cli::DeployInput in;
  in.batch_tokens = tokens;
  in.request_tokens = request;
  return in;
}
cli::DeployInput decode(int requests, int kv) {
  cli::DeployInput in;
  in.phase = cli::Phase::decode;
  in.requests_per_gpu = requests;
  in.kv_len = kv;
  return in;
}
RuntimeLayout ep_dp(int n) {
  return RuntimeLayout({.tp = n, .dp = n, .enable_dp_attention = true, .moe_a2a_backend = Backend::deepep});
}
}  // namespace

TEST_CASE("plan model: DeepGEMM's table, per shape, linear in log2(M)") {
  // Expert gate + up (N 4096, K 7168): masked 1233 TFLOP/s at M 1024, contiguous 1288 at 4096.
  CHECK(near(cli::deepgemm_share(1024, 4096, 7168), 1233.0 / 1979, 1e-12));
  CHECK(near(cli::deepgemm_share(2048, 4096, 7168), (1233.0 + 1288) / 2 / 1979, 1e-12));
  // Expert down (N 7168, K 2048) beyond its last point, 1099 at 8192; below the first, the time of M 64.
  CHECK(near(cli::deepgemm_share(16384, 7168, 2048), 1099.0 / 1979, 1e-12));
  CHECK(near(cli::deepgemm_share(32, 4096, 7168), 287.0 / 1979 / 2, 1e-12));
  // The dense MLP's gate + up (N 36864, K 7168) reads the nearest row, the experts' (1288 at 4096).
  CHECK(near(cli::deepgemm_share(4096, 36864, 7168), 1288.0 / 1979, 1e-12));
  // o_proj (N 7168, K 16384): 645 at 128, 1358 at 4096; q_b (N 24576, K 1536) at 128: 535.
  CHECK(near(cli::deepgemm_share(4096, 7168, 16384), 1358.0 / 1979, 1e-12));
  CHECK(near(cli::deepgemm_share(128, 24576, 1536), 535.0 / 1979, 1e-12));
}

TEST_CASE("plan model: FlashAttention-3's causal table by prompt length") {
  CHECK(near(cli::fa3_share(4096), 579.0 / 989, 1e-12));
  CHECK(near(cli::fa3_share(4096 * std::sqrt(2.0)), (579.0 + 602) / 2 / 989, 1e-9));
  CHECK(near(cli::fa3_share(100), 292.0 / 989, 1e-12));
  CHECK(near(cli::fa3_share(65536), 616.0 / 989, 1e-12));
}

TEST_CASE("plan model: two-batch overlap: two streams in SGLang's order, DeepEP holding SMs") {
  // Unit times, worked out by hand event by event (attention A, B, MLP A, B on the compute stream;
  // dispatch A, B, combine A, B on the other): with everything 1, a layer every 4; with attention 2
  // and combine 2 (both sides 6 a layer) B's next attention waits for its combine: 7; with
  // everything 1 and half the SMs held by the communication, a layer every 6.
  CHECK(near(cli::overlap_period(1, 1, 1, 1, 0), 4, 1e-12));
  CHECK(near(cli::overlap_period(2, 1, 1, 2, 0), 7, 1e-12));
  CHECK(near(cli::overlap_period(1, 1, 1, 1, 0.5), 6, 1e-12));
}

TEST_CASE("plan model: the routed experts as one grouped GEMM of their rows per expert") {
  // EP32 prefill, 16384 tokens a GPU, perfect balance, no overlap: 131072 (row, expert) pairs on 8
  // experts, 16384 rows each, beyond DeepGEMM's contiguous 8192: 1297 (gate + up), 1099 (down).
  cli::DeployInput in = prefill(32 * 16384);
  in.imbalance = 1.0;
  const cli::Deployment d = cli::plan_deployment(ep_dp(32), in, cli::Cluster::preset("h800"));
  CHECK(near(d.moe.parts.rows_per_expert, 16384, 1e-9));
  const double routed = 8 * (2 * 16384.0 * 4096 * 7168 / 1297e12 + 2 * 16384.0 * 7168 * 2048 / 1099e12);
  CHECK(near(d.moe.parts.routed, routed, 1e-9));
  // The shared expert: the same two shapes on the GPU's 16384 rows, at the same rates.
  CHECK(near(d.moe.parts.shared, routed / 8, 1e-9));
}

TEST_CASE("plan model: what is not a kernel: the kernels between them and the launch gaps") {
  // One 4096-token prompt at tp 1, no overlap. Per token, attention side: the two fused add +
  // RMSNorms 16 x 7168 + the q_a / kv_a norms 4 x (1536 + 512) = 122880 B, quantization 3 x (2 x
  // 7168 + 1536 + 128 x 128) = 96768 B, the assembled keys 4 x 128 x 192 = 98304 B: 317952 B.
  // MoE side per pair: permutation 2 x 7168 x 1.03125, SwiGLU 4 x 2048 + 2048 x 1.03125, the
  // weighted sum 2 x 7168: 39424 B; per row the shared expert's SwiGLU and output, 6 x 2048 + 2 x 7168.
  const cli::Cluster c = cli::Cluster::preset("h100");
  const cli::Deployment d = cli::plan_deployment(RuntimeLayout({.tp = 1}), prefill(4096), c);
  const double hbm = 3350e9 * 0.85;
  const double attn = 4096 * 317952.0, moe = 4096 * 8 * 39424.0 + 4096 * (6 * 2048.0 + 2 * 7168);
  CHECK(near(d.moe.parts.other_kernels, (attn + moe) / hbm, 1e-9));
  // 13 attention kernels + 11 MoE kernels, each after a 2.1 us gap (launched one by one in prefill).
  CHECK(d.moe.parts.kernels == 24);
  CHECK(near(d.moe.parts.gaps, 24 * 2.1e-6, 1e-9));
  CHECK(near(d.moe.other, d.moe.parts.other_kernels + d.moe.parts.gaps, 1e-12));
  // Decode replays a CUDA graph: 1.3 us a gap; two micro-batches launch every kernel twice.
  cli::DeployInput dec = decode(64, 2000);
  dec.two_batch_overlap = true;
  const cli::Deployment g = cli::plan_deployment(ep_dp(32), dec, c);
  CHECK(g.moe.parts.kernels == 48);
  CHECK(near(g.moe.parts.gaps, 48 * 1.3e-6, 1e-9));
}

TEST_CASE("plan model: the imbalance left after EPLB: LMSYS's x1.18 at moe_ep > 1, none without EP") {
  const cli::Cluster c = cli::Cluster::preset("h100");
  CHECK(near(cli::plan_deployment(ep_dp(32), prefill(32 * 4096), c).imbalance, 59337.0 / 50302, 1e-12));
  CHECK(cli::plan_deployment(RuntimeLayout({.tp = 8}), prefill(8192), c).imbalance == 1.0);
}

TEST_CASE("plan model: serving conditions: a decode batch not full, a prefill cache-hit ratio") {
  const cli::Cluster c = cli::Cluster::preset("h100");
  // Half of 128 slots hold a request: 64 requests stepped, the K/V pool still the batch's 128.
  cli::DeployInput in = decode(128, 2000);
  const cli::Deployment full = cli::plan_deployment(ep_dp(8), in, c);
  in.batch_fill = 0.5;
  const cli::Deployment half = cli::plan_deployment(ep_dp(8), in, c);
  CHECK(half.group_requests == 64);
  CHECK(near(half.tokens_per_gpu_s, 64 / half.step, 1e-12));
  CHECK(half.memory.kv == full.memory.kv);
  CHECK(half.step < full.step);
  // 4096-token prompts, half of each cached: 2048 tokens computed after a 2048-token prefix, so
  // 2048 x 2048 + 2048 x 2049 / 2 query-key pairs of 128 heads x 320 x 2 flops, at 579 TFLOP/s
  // (FlashAttention-3 at the prompt's 4096); tokens/s counts every input token.
  cli::DeployInput p = prefill(4096);
  p.cache_hit = 0.5;
  const cli::Deployment hit = cli::plan_deployment(RuntimeLayout({.tp = 1}), p, c);
  CHECK(hit.group_tokens == 2048);
  const double pairs = 2048.0 * 2048 + 2048.0 * 2049 / 2;
  CHECK(near(hit.moe.parts.core, 2 * pairs * 128 * 320 / 579e12, 1e-9));
  CHECK(near(hit.tokens_per_gpu_s, 4096 / hit.step, 1e-12));
}

TEST_CASE("plan model: MTP: two tokens a request a step, 1 + acceptance out, the draft layer once") {
  const cli::Cluster c = cli::Cluster::preset("h800");
  cli::DeployInput in = decode(64, 4096);
  in.mtp_acceptance = 0.85;
  const cli::Deployment d = cli::plan_deployment(ep_dp(32), in, c);
  CHECK(d.group_tokens == 128);
  CHECK(near(d.tokens_per_gpu_s, 64 * 1.85 / d.step, 1e-12));
  CHECK(d.mtp > d.moe.total);
  CHECK(near(d.step, 3 * d.dense.total + 58 * d.moe.total + d.head + d.mtp, 1e-12));
}

TEST_CASE("plan model: the JSON gives each component's time and the efficiency it ran at") {
  const cli::DeployInput in = prefill(32 * 16384);
  const cli::Deployment d = cli::plan_deployment(ep_dp(32), in, cli::Cluster::preset("h800"));
  const nlohmann::json j = cli::deployment_json(d, in);
  const nlohmann::json& moe = j["moe_layer"];
  for (const char* k : {"projections_s", "core_attention_s", "router_s", "shared_expert_s", "routed_experts_s",
                        "other_kernels_s", "launch_gaps_s", "overlap_slowdown_s"})
    CHECK(moe["components"].contains(k));
  CHECK(near(moe["efficiency"]["core_attention"].get<double>(), 579.0 / 989, 1e-9));
  CHECK(moe["efficiency"]["routed_experts"].get<double>() > 0.5);
  CHECK(j["lm_head_s"].get<double>() > 0);
}

// Published throughputs (tokens/s per GPU, the per-node figures / 8) and what the model predicts
// for the commands of docs/planning.md's table, as the table states them (within 0.01).
TEST_CASE("plan model: the published deployments of docs/planning.md, predicted / published") {
  struct Case {
    const char* name;
    RuntimeLayout layout;
    cli::DeployInput in;
    const char* hardware;
    double published, ratio;
  };
  cli::DeployInput ds_prefill = prefill(524288), sgl_prefill = prefill(524288), gb_prefill = prefill(131072, 2000);
  ds_prefill.redundant_experts = sgl_prefill.redundant_experts = 32;
  ds_prefill.cache_hit = 0.563;
  cli::DeployInput ds_decode = decode(128, 4989), sgl_decode = decode(256, 2000), gb_decode = decode(256, 2000);
  ds_decode.redundant_experts = sgl_decode.redundant_experts = gb_decode.redundant_experts = 32;
  // DeepSeek's profiles route "absolutely balanced"; SGLang's 1K prompts; SGLang's simulated perfect EPLB.
  cli::DeployInput ds_profile_prefill = sgl_prefill, ds_profile_decode = decode(128, 4096), sgl_1k = prefill(524288, 1024);
  sgl_1k.redundant_experts = 32;
  ds_profile_prefill.imbalance = ds_profile_decode.imbalance = 1.0;
  cli::DeployInput sgl_perfect = ds_profile_prefill;
  for (cli::DeployInput* i : {&ds_prefill, &sgl_prefill, &gb_prefill, &ds_decode, &sgl_decode, &ds_profile_prefill,
                              &ds_profile_decode, &sgl_1k, &sgl_perfect})
    i->two_batch_overlap = true;
  const Case cases[] = {
      {"DeepSeek prefill H800 EP32", ep_dp(32), ds_prefill, "h800", 73700.0 / 8, 2.01},
      {"DeepSeek decode H800 EP144", ep_dp(144), ds_decode, "h800", 14800.0 / 8, 1.33},
      {"SGLang prefill H100 EP32", ep_dp(32), sgl_prefill, "h100", 50302.0 / 8, 1.40},
      {"SGLang decode H100 EP72", ep_dp(72), sgl_decode, "h100", 22282.0 / 8, 1.26},
      {"SGLang decode GB200 EP48", ep_dp(48), gb_decode, "gb200", 7583, 1.28},
      {"SGLang prefill GB200 EP8", ep_dp(8), gb_prefill, "gb200", 18471, 1.41},
      {"DeepSeek profile prefill H800 EP32", ep_dp(32), ds_profile_prefill, "h800", 62713.0 / 8, 1.24},
      {"DeepSeek profile decode H800 EP128", ep_dp(128), ds_profile_decode, "h800", 18598.0 / 8, 1.20},
      {"SGLang prefill H100 EP32, 1K prompts", ep_dp(32), sgl_1k, "h100", 57674.0 / 8, 1.29},
      {"SGLang prefill H100 EP32, perfect EPLB", ep_dp(32), sgl_perfect, "h100", 59337.0 / 8, 1.31},
  };
  for (const Case& k : cases) {
    const cli::Cluster c = cli::Cluster::preset(k.hardware);
    const double r = cli::plan_deployment(k.layout, k.in, c).tokens_per_gpu_s / k.published;
    MESSAGE((std::string(k.name) + ": predicted / published " + std::to_string(r)));
    CHECK(std::fabs(r - k.ratio) <= 0.01);
  }
}
