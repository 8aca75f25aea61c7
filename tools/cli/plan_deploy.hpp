// `relayout plan --preset deepseek-v3`: the real DeepSeek-V3/R1 model (MLA attention, 3 dense
// layers then 58 MoE layers, embeddings and LM head, FP8 weights and BF16 activations) on a layout
// and a GPU, per layer and per step, for prefill or decode, over the world: pipeline stages each
// holding SGLang's share of the layers (plan_world.hpp; embeddings on the first, LM head on the
// last, hidden states and residual handed between them) and replicas. The compute is a roofline per kernel
// (flops at the FP8 or BF16 rate, bytes at the HBM rate, each times an achieved share); the EP
// all-to-all is DeepEP's (normal: one RDMA copy per destination node then NVLink fan-out;
// low-latency: one copy per expert, one latency per call); two-batch overlap, redundant experts
// and an expert-load imbalance (from a load file: placed by the library's rebalancer) apply to it. The demo layer's exact plan stays in plan.hpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "cli/plan_kernels.hpp"
#include "cli/plan_rank.hpp"
#include "cli/plan_time.hpp"
#include "cli/plan_world.hpp"
#include "relayout/mesh.hpp"
#include "relayout/placement/ep_message.hpp"
#include "relayout/placement/expert_load_json.hpp"
#include "relayout/placement/expert_location.hpp"
#include "relayout/placement/experts.hpp"

namespace relayout::cli {

// DeepSeek-V3's config.json (deepseek-ai/DeepSeek-V3 on Hugging Face; DeepSeek-R1 has the same dims).
struct MlaModel {
  std::string name = "deepseek-v3";
  int hidden = 7168;         // hidden_size
  int layers = 61;           // num_hidden_layers
  int dense_layers = 3;      // first_k_dense_replace
  int dense_inter = 18432;   // intermediate_size
  int experts = 256;         // n_routed_experts
  int shared_experts = 1;    // n_shared_experts
  int topk = 8;              // num_experts_per_tok
  int moe_inter = 2048;      // moe_intermediate_size
  int groups = 8;            // n_group
  int topk_groups = 4;       // topk_group (node-limited routing)
  int heads = 128;           // num_attention_heads
  int q_lora = 1536;         // q_lora_rank
  int kv_lora = 512;         // kv_lora_rank
  int qk_nope = 128;         // qk_nope_head_dim
  int qk_rope = 64;          // qk_rope_head_dim
  int v_head = 128;          // v_head_dim
  int vocab = 129280;        // vocab_size

  int moe_layers() const { return layers - dense_layers; }
  // Parameters of one layer's attention: replicated over attn_tp (q_a, kv_a) and split over it.
  double attn_replicated() const { return double(hidden) * q_lora + double(hidden) * (kv_lora + qk_rope); }
  double attn_split() const {
    return double(q_lora) * heads * (qk_nope + qk_rope) + double(kv_lora) * heads * (qk_nope + v_head) +
           double(heads) * v_head * hidden;
  }
  double expert_params() const { return 3.0 * hidden * moe_inter; }  // gate, up, down
  double kv_per_token_layer() const { return double(kv_lora + qk_rope); }  // MLA's cached latent + rope key
};

inline bool is_mla_preset(const std::string& name) { return name == "deepseek-v3" || name == "deepseek-r1"; }

inline MlaModel mla_preset(const std::string& name) {
  if (!is_mla_preset(name))
    throw LayoutError("--preset", "--preset: unknown model '" + name + "'; expected one of: demo, deepseek-v3, deepseek-r1");
  MlaModel m;
  m.name = name;
  return m;
}

enum class Phase { prefill, decode };
// --deepep-mode (SGLang's flag): the library's EP modes (relayout::EpMode, experts.hpp), or auto,
// which SGLang resolves per forward (low-latency for decode, normal for prefill): nullopt.
inline std::optional<EpMode> parse_deepep_mode(const std::string& s) {
  if (s == "auto") return std::nullopt;
  if (s != "normal" && s != "low_latency")
    throw LayoutError("--deepep-mode", "--deepep-mode must be normal, low_latency or auto, got '" + s + "'");
  return parse_ep_mode(s, "--deepep-mode");
}

inline Phase parse_phase(const std::string& s) {
  if (s == "prefill") return Phase::prefill;
  if (s == "decode") return Phase::decode;
  throw LayoutError("--phase", "--phase must be prefill or decode, got '" + s + "'");
}

// Max over mean tokens per moe_ep rank for logical per-expert loads (expert_load_factors, the
// demo layer's function: each layer's busiest rank, averaged over the layers): the experts placed
// as the library places them, contiguously without redundant experts, by its rebalancer
// (ExpertLocation::rebalanced: groups onto nodes, hot experts replicated, replicas packed onto
// ranks) with them; each expert's load split evenly over its replicas.
// A ranking asks again for every layout of the same moe_ep: the answers for the last loads asked
// about are kept (per thread; one copy of the loads, one number per width and placement).
inline double imbalance_of(const std::vector<std::vector<double>>& layers, int ep, int redundant, int nodes, int groups) {
  struct Memo {
    std::vector<std::vector<double>> layers;
    std::map<std::tuple<int, int, int, int>, double> imbalance;
  };
  thread_local Memo memo;
  if (memo.layers != layers) memo = {layers, {}};
  const std::tuple<int, int, int, int> key{ep, redundant, nodes, groups};
  if (const auto it = memo.imbalance.find(key); it != memo.imbalance.end()) return it->second;
  return memo.imbalance[key] = expert_load_factors(layers, ep, [&](const std::vector<double>& load) {
           const int routed = int(load.size());
           if ((routed + redundant) % ep != 0)
             throw LayoutError("--expert-load", "--expert-load: " + std::to_string(routed) + " experts + " +
                                                    std::to_string(redundant) + " redundant must be a multiple of moe_ep = " +
                                                    std::to_string(ep));
           return redundant > 0 ? ExpertLocation::rebalanced(load, redundant, ep, {.nodes = nodes, .groups = groups})
                                : ExpertLocation::identity(routed, 0, ep);
         }).imbalance;
}

// Where a token's top-k experts land under node-limited routing: topk_groups of `groups` expert
// groups chosen uniformly, then k experts uniformly among the chosen groups' experts; experts are
// placed contiguously over `ep` ranks (expert e on rank e * ep / experts), gpus_per_node ranks a
// node. Expected ranks and nodes a token reaches.
struct Spread {
  double ranks = 0, nodes = 0;
  int node_count = 1;
};

inline double miss_probability(int pool, int mine, int k) {  // C(pool - mine, k) / C(pool, k)
  double p = 1.0;
  for (int i = 0; i < k; ++i) p *= std::max(0.0, double(pool - mine - i) / double(pool - i));
  return p;
}

inline Spread routing_spread(int experts, int k, int groups, int topk_groups, int ep, int gpus_per_node) {
  Spread s;
  const int per_node = std::min(gpus_per_node, ep);
  s.node_count = (ep + per_node - 1) / per_node;
  if (groups < 1 || experts % groups != 0 || topk_groups >= groups) groups = topk_groups = 1;
  const int per_group = experts / groups;
  std::vector<int> pick(static_cast<std::size_t>(topk_groups));
  for (int i = 0; i < topk_groups; ++i) pick[std::size_t(i)] = i;
  double subsets = 0;
  std::vector<int> rank_n(static_cast<std::size_t>(ep)), node_n(static_cast<std::size_t>(s.node_count));
  while (true) {
    std::fill(rank_n.begin(), rank_n.end(), 0);
    std::fill(node_n.begin(), node_n.end(), 0);
    for (int g : pick)
      for (int e = g * per_group; e < (g + 1) * per_group; ++e) {
        const int r = int(std::int64_t(e) * ep / experts);
        ++rank_n[std::size_t(r)];
        ++node_n[std::size_t(r / per_node)];
      }
    const int pool = topk_groups * per_group;
    const int kk = std::min(k, pool);
    for (int n : rank_n) s.ranks += 1.0 - miss_probability(pool, n, kk);
    for (int n : node_n) s.nodes += 1.0 - miss_probability(pool, n, kk);
    subsets += 1;
    int i = topk_groups - 1;  // next subset in lexicographic order
    while (i >= 0 && pick[std::size_t(i)] == groups - topk_groups + i) --i;
    if (i < 0) break;
    ++pick[std::size_t(i)];
    for (int j = i + 1; j < topk_groups; ++j) pick[std::size_t(j)] = pick[std::size_t(j - 1)] + 1;
  }
  s.ranks /= subsets;
  s.nodes /= subsets;
  return s;
}

// One DeepEP call on one rank sending `tokens` rows: seconds. Normal kernels: a token travels once
// over RDMA to each other destination node (to the GPU of its own local index there), which
// forwards it over NVLink to the GPUs holding its experts; inside one node, once per destination
// GPU over NVLink. Low-latency kernels: one copy per (token, expert), over RDMA to other nodes and
// NVLink inside the node, one latency per call. `row` is the bytes a copy carries.
struct DeepEpCost {
  double seconds = 0, rdma_bytes = 0, nvlink_bytes = 0;
};

inline DeepEpCost deepep_seconds(bool low_latency, double tokens, double row, int k, const Spread& s, int ep,
                                 const Cluster& c) {
  DeepEpCost out;
  if (ep < 2 || tokens <= 0) return out;
  const Efficiency& e = c.eff;
  const int per_node = std::min(c.gpus_per_node, ep);
  if (low_latency) {
    const double copies = tokens * k;
    const double remote = s.node_count > 1 ? 1.0 - double(per_node) / ep : 0.0;
    out.rdma_bytes = remote * copies * row;
    out.nvlink_bytes = (1.0 - remote) * copies * row;
    out.seconds = e.ll_latency + std::max(out.rdma_bytes / (c.inter_bw * e.ll_rdma), out.nvlink_bytes / (c.intra_bw * e.ll_nvlink));
    return out;
  }
  if (s.node_count == 1) {
    out.nvlink_bytes = tokens * s.ranks * (1.0 - 1.0 / ep) * row;
  } else {
    out.rdma_bytes = tokens * s.nodes * (1.0 - 1.0 / s.node_count) * row;
    out.nvlink_bytes = tokens * s.ranks * (1.0 - 1.0 / per_node) * row;
  }
  out.seconds = e.normal_latency +
                std::max(out.rdma_bytes / (c.inter_bw * e.normal_rdma), out.nvlink_bytes / (c.intra_bw * e.normal_nvlink));
  return out;
}

// The busiest EP rank's load over the mean left after EPLB, by default: LMSYS measured SGLang's
// prefill at EP32 with its EPLB against simulated perfect balance, 50,302 against 59,337 tokens/s
// per node (lmsys.org/blog/2025-05-05-large-scale-ep): x1.18.
inline constexpr double kEplbImbalance = 59337.0 / 50302.0;

// What a deployment is planned from (besides its layout and cluster).
struct DeployInput {
  MlaModel model;
  Phase phase = Phase::prefill;
  std::int64_t batch_tokens = 0;  // prefill: tokens of one forward over the domain
  int request_tokens = 2048;      // prefill: prompt length
  int kv_len = 0;                 // decode: tokens already cached per request
  int requests_per_gpu = 0;       // decode: requests each GPU steps
  double weight_bytes = 1, act_bytes = 2, kv_bytes = 2;  // FP8 weights, BF16 activations and KV
  std::optional<EpMode> deepep_mode;  // nullopt: auto
  bool two_batch_overlap = false;
  bool attn_tp_input_scattered = false;  // --enable-attn-tp-input-scattered (where attn_input_scattered)
  int redundant_experts = 0;
  double imbalance = kEplbImbalance;  // busiest EP rank's tokens over the mean (at moe_ep > 1)
  std::optional<std::vector<std::vector<double>>> load;  // --expert-load: per layer, per logical expert
  double attn_dp_imbalance = 1.0;  // busiest attention-DP group's attention work over the mean
  double batch_fill = 1.0;         // decode: share of the --requests-per-gpu slots holding a request
  double cache_hit = 0.0;          // prefill: share of each request's tokens found in the KV cache
  double mtp_acceptance = 0.0;     // decode: > 0 runs one MTP draft token a step, accepted at this rate
  bool explain = false;            // --explain: print how the step was built
};

// How one layer's compute was built, both micro-batches together: each kernel's seconds and the
// achieved share of the peak it ran at.
struct LayerBuild {
  double proj = 0, core = 0, dense_mlp = 0, router = 0, shared = 0, routed = 0;  // seconds
  double other_kernels = 0, gaps = 0;        // kernels that are not GEMMs or attention; launch gaps
  double proj_share = 0, core_share = 0, dense_share = 0, shared_share = 0, routed_share = 0;  // of the peak
  double rows_per_expert = 0, kernels = 0;   // M of the grouped GEMM; kernels launched
  double overlap_slowdown = 0;               // seconds the compute lost to DeepEP's SMs under overlap
};

// Seconds of one layer on the busiest rank, split as the ranking prints it.
struct LayerTime {
  double attention = 0, experts = 0, dispatch = 0, combine = 0, other_comm = 0;  // other: attn_tp all-reduce, gathers
  double other = 0;               // kernels that are not GEMMs or attention, and launch gaps
  double total = 0, exposed = 0;  // exposed: the layer's time beyond its compute
  LayerBuild parts;
  double compute() const { return attention + experts + other; }
  double comm() const { return dispatch + combine + other_comm; }
};

struct DeployMemory {
  double attention = 0, dense_mlp = 0, experts = 0, shared = 0, router = 0, embeddings = 0, kv = 0, activations = 0;
  double weights() const { return attention + dense_mlp + experts + shared + router + embeddings; }
  double total() const { return weights() + kv + activations; }
};

// One pipeline stage: its layers (SGLang's split; the dense layers are the model's first), the
// embeddings on the first stage and the LM head on the last, and its hand-over to the next stage
// (SGLang's DeepSeek model hands over two tensors: hidden states and residual).
inline constexpr int kMlaHandoverTensors = 2;
struct DeployStage {
  StageLayers layers;
  int dense = 0, moe = 0;
  bool embed = false, head = false, sends = false, receives = false;
  Handover handover;                             // per rank, one micro-batch
  double send_s = 0, gather_s = 0, seconds = 0;  // one micro-batch on the busiest rank
  DeployMemory memory;
};

struct Deployment {
  Widths widths;
  BridgePath path = BridgePath::tp_moe;
  bool deepep = false, low_latency = false;
  double group_tokens = 0, group_requests = 0, routed_rows = 0, expert_pairs = 0, local_experts = 0;
  Spread spread;
  std::int64_t dispatch_row = 0, combine_row = 0;  // bytes of one dispatched / combined copy
  LayerTime dense, moe;
  double head = 0;  // LM head and sampling, once per step
  double mtp = 0;   // decode with MTP: the draft layer, once per step
  double step = 0;  // seconds of one forward / decode step: pp micro-batches through the slowest stage
  double input_tokens = 0;  // prefill: tokens of a DP group including cache hits; decode: tokens out per step
  double tokens_per_gpu_s = 0;
  double imbalance = 1.0;
  DeployMemory memory;  // the fullest stage's rank
  // The world: replicas x pp stages x this domain.
  int replicas = 1, pp = 1, world_ranks = 1, ranks_per_node = 8;
  std::int64_t nodes = 1;
  std::vector<DeployStage> stages;
  double gpu_memory = 0;                 // bytes a GPU has (--gpu-memory, else the --hardware preset's)
  bool fits() const { return memory.total() <= gpu_memory; }
  int fullest = 0;                       // the stage of `memory`
  double latency = 0, interval = 0;      // a micro-batch through every stage; the slowest stage
  double micro_tokens = 0;               // tokens (decode: requests) of one micro-batch over the domain
  double world_tokens_s = 0;
};

// Bytes of one FP8 weight with its 128x128 block scale (fp32 weight_scale_inv, as the checkpoint ships).
inline double weight_bytes_of(double w) { return w == 1 ? 1.0 + 4.0 / (128.0 * 128.0) : w; }

inline double roofline(double flops, double rate, double bytes, const Cluster& c) {
  return std::max(flops / rate, bytes / (c.hbm_bw * c.eff.hbm));
}

// Where SGLang applies --enable-attn-tp-input-scattered: TP without attention DP, prefill CP or an
// all-to-all backend (path tp_moe), attn_tp > 1. Each attn_tp rank then computes the replicated
// projections (q_a, kv_a) for its chunk of the tokens and the ranks all-gather their outputs.
inline bool attn_input_scattered(BridgePath path, const Widths& w) {
  return path == BridgePath::tp_moe && w.attn_tp > 1 && w.attn_cp == 1;
}

namespace impl {

// The rank's per-layer quantities for `share` of the batch (1, or 0.5 per micro-batch): seconds of
// attention, dense MLP, experts (their kernels in `b`), DeepEP's calls and the collectives.
struct LayerParts {
  double attention = 0, dense_mlp = 0, experts = 0, dispatch = 0, combine = 0, attn_comm = 0, moe_comm = 0;
  double other_attn = 0, other_dense = 0, other_moe = 0, gaps_dense = 0, gaps_moe = 0;
  LayerBuild b;  // attention's, the dense MLP's and the experts' kernels (proj, core, ...)
};

// One GEMM of m rows by an (n x k) weight: at the achieved share of `peak` (DeepGEMM's table for
// the nearest shape, or --gemm-efficiency), at least the weight's bytes over HBM. Adds its flops to *flops.
inline double gemm_seconds(double m, double n, double k, double wb, double peak, const Cluster& c, double* flops) {
  if (m <= 0) return 0.0;
  const double share = c.eff.gemm_table ? deepgemm_share(m, n, k) : c.eff.gemm;
  *flops += 2.0 * m * n * k;
  return roofline(2.0 * m * n * k, peak * share, n * k * weight_bytes_of(wb), c);
}

// Core attention's flops, the cache bytes it reads and the length it runs over for R requests:
// prefill (non-absorbed, causal) over each request's computed tokens after its cached prefix;
// decode (absorbed) over S cached tokens for each of a request's tokens (two with an MTP draft).
struct CoreAttention {
  double flops = 0, bytes = 0, length = 0;
};
inline CoreAttention core_attention(const DeployInput& in, double R, double h) {
  const MlaModel& m = in.model;
  if (in.phase == Phase::prefill) {
    const double L = in.request_tokens, P = std::floor(in.cache_hit * L), C = L - P;
    return {2.0 * R * (C * P + C * (C + 1) / 2) * h * (m.qk_nope + m.qk_rope + m.v_head), 0.0, L};
  }
  const double S = in.kv_len + 1.0, queries = in.mtp_acceptance > 0 ? 2.0 : 1.0;
  return {2.0 * R * queries * S * h * (m.kv_lora + m.qk_rope + m.kv_lora), R * S * m.kv_per_token_layer() * in.kv_bytes, S};
}

// Attention of T tokens in R requests: q_a + kv_a (one GEMM, replicated over attn_tp; scattered
// input: 1/A of the tokens), q_b, kv_b and o split over heads (decode runs MLA absorbed: kv_b's
// flops on each token), core attention, the attn_tp collectives and the kernels between them.
inline void attention_parts(LayerParts& p, const Deployment& d, const DeployInput& in, const Cluster& c, double T, double R) {
  const MlaModel& m = in.model;
  const Widths& w = d.widths;
  const double H = m.hidden, A = w.attn_tp, wb = in.weight_bytes, peak = wb == 1 ? c.fp8_flops : c.gpu_flops, h = m.heads / A;
  LayerBuild& b = p.b;
  const bool scattered = in.attn_tp_input_scattered && attn_input_scattered(d.path, w);
  double f = 0;
  b.proj = gemm_seconds(scattered ? T / A : T, m.q_lora + m.kv_lora + m.qk_rope, H, wb, peak, c, &f) +
           gemm_seconds(T, h * (m.qk_nope + m.qk_rope), m.q_lora, wb, peak, c, &f) +
           gemm_seconds(T, h * (m.qk_nope + m.v_head), m.kv_lora, wb, peak, c, &f) +
           gemm_seconds(T, H, h * m.v_head, wb, peak, c, &f);
  b.proj_share = b.proj > 0 ? f / (b.proj * peak) : 0;
  const CoreAttention core = core_attention(in, R, h);
  const bool prefill = in.phase == Phase::prefill;
  const double share = prefill && c.eff.prefill_table ? fa3_share(core.length) : c.eff.attention;
  b.core = roofline(core.flops, c.gpu_flops * share, core.bytes, c);
  b.core_share = b.core > 0 ? core.flops / (b.core * c.gpu_flops) : 0;
  p.attention = (b.proj + b.core) * in.attn_dp_imbalance;
  p.other_attn = T * in.attn_dp_imbalance *
                 attention_side_bytes(H, m.q_lora, m.kv_lora, h, m.v_head, m.qk_nope + m.qk_rope, prefill) /
                 (c.hbm_bw * c.eff.hbm);
  const bool one_node = A <= c.gpus_per_node;
  if (A > 1) p.attn_comm = collective_seconds(TrafficOp::all_reduce, A, one_node, 1, T * H * in.act_bytes, c);
  if (scattered)  // the q_a and kv_a outputs of every token
    p.attn_comm += collective_seconds(TrafficOp::all_gather, A, one_node, 1,
                                      T * (m.q_lora + m.kv_lora + m.qk_rope) * in.act_bytes, c);
  // Dense MLP (first layers): split over attn_tp like the attention, one more all-reduce.
  f = 0;
  const double di = m.dense_inter / A;
  b.dense_mlp = gemm_seconds(T, 2 * di, H, wb, peak, c, &f) + gemm_seconds(T, H, di, wb, peak, c, &f);
  b.dense_share = b.dense_mlp > 0 ? f / (b.dense_mlp * peak) : 0;
  p.dense_mlp = b.dense_mlp;
  p.other_dense = T * (2 * 2.0 * 2 * di + di) / (c.hbm_bw * c.eff.hbm);  // SwiGLU: read gate and up, write down's input
}

// The MoE on `rows` routed rows and `pairs` (row, expert) pairs: the router (BF16) and the shared
// expert on the rows, the routed experts as a grouped GEMM of pairs / (experts hit) rows each,
// the kernels between them, and DeepEP's calls (or backend none's collectives) for the rows.
inline void moe_parts(LayerParts& p, const Deployment& d, const DeployInput& in, const Cluster& c, double rows, double pairs) {
  const MlaModel& m = in.model;
  const Widths& w = d.widths;
  const double H = m.hidden, wb = in.weight_bytes, peak = wb == 1 ? c.fp8_flops : c.gpu_flops;
  const double inter = double(m.moe_inter) / w.moe_tp, si = d.deepep ? m.moe_inter : inter;
  LayerBuild& b = p.b;
  double f = 0;
  b.router = gemm_seconds(rows, m.experts, H, 2, c.gpu_flops, c, &f);
  f = 0;
  b.shared = m.shared_experts * (gemm_seconds(rows, 2 * si, H, wb, peak, c, &f) + gemm_seconds(rows, H, si, wb, peak, c, &f));
  b.shared_share = b.shared > 0 ? m.shared_experts * f / (b.shared * peak) : 0;
  const double hit = d.local_experts * (1.0 - std::exp(-pairs / std::max(d.local_experts, 1e-9)));
  b.rows_per_expert = hit > 0 ? pairs / hit : 0;
  f = 0;
  b.routed = hit * (gemm_seconds(b.rows_per_expert, 2 * inter, H, wb, peak, c, &f) +
                    gemm_seconds(b.rows_per_expert, H, inter, wb, peak, c, &f));
  b.routed_share = b.routed > 0 ? hit * f / (b.routed * peak) : 0;
  p.experts = b.router + b.shared + b.routed;
  p.other_moe = (pairs * moe_side_bytes(H, inter, in.phase == Phase::prefill) + rows * (3 * 2.0 * si + 2.0 * H)) /
                (c.hbm_bw * c.eff.hbm);
  if (d.deepep) {
    const double sent = rows * in.imbalance;
    p.dispatch = deepep_seconds(d.low_latency, sent, double(d.dispatch_row), m.topk, d.spread, w.moe_ep, c).seconds;
    p.combine = deepep_seconds(d.low_latency, sent, double(d.combine_row), m.topk, d.spread, w.moe_ep, c).seconds;
  } else if (w.tp > 1) {
    // Backend none: path dp_gather all-gathers every row over tp and reduce-scatters the outputs;
    // path tp_moe all-reduces them.
    const bool tp_node = w.tp <= c.gpus_per_node;
    const double bytes = rows * H * in.act_bytes;
    if (d.path == BridgePath::dp_gather)
      p.moe_comm = collective_seconds(TrafficOp::all_gather, w.tp, tp_node, 1, bytes, c) +
                   collective_seconds(TrafficOp::reduce_scatter, w.tp, tp_node, 1, bytes, c);
    else
      p.moe_comm = collective_seconds(TrafficOp::all_reduce, w.tp, tp_node, 1, bytes, c);
  }
}

inline LayerParts layer_parts(const Deployment& d, const DeployInput& in, const Cluster& c, double share) {
  LayerParts p;
  attention_parts(p, d, in, c, d.group_tokens * share, d.group_requests * share);
  moe_parts(p, d, in, c, d.routed_rows * share, d.expert_pairs * share);
  const double gap = in.phase == Phase::prefill ? c.eff.gap_eager : c.eff.gap_graph;
  p.gaps_dense = (kAttentionKernels + kDenseMlpKernels) * gap;
  p.gaps_moe = (kAttentionKernels + kMoeKernels) * gap;
  return p;
}

// The LM head (BF16, vocab over attn_tp) on `logits` tokens and the sampling after it: the logits
// written and read twice in fp32 (softmax, then the draw).
inline double head_seconds(const Deployment& d, const DeployInput& in, const Cluster& c, double logits) {
  const MlaModel& m = in.model;
  const double V = double(m.vocab) / d.widths.attn_tp;
  double f = 0;
  return gemm_seconds(logits, V, m.hidden, 2, c.gpu_flops, c, &f) + logits * V * 3 * 4.0 / (c.hbm_bw * c.eff.hbm);
}

}  // namespace impl

// Two-batch overlap as two streams in the order SGLang and DeepSeek run them: the compute stream
// runs A's attention, B's attention, A's MLP, B's MLP; the communication stream A's dispatch, B's
// dispatch, A's combine, B's combine. A dispatch waits for its attention, an MLP for its dispatch,
// a combine for its MLP, the next layer's attention for its combine; while a communication kernel
// runs the compute runs at 1 - s of its rate (s: the SMs it holds). Seconds a layer, steady state.
inline double overlap_period(double attn, double mlp, double disp, double comb, double s) {
  constexpr int kLayers = 6;
  // Task i of a stream: layer i / 4, its kind i % 4 (A, B, A, B); the end time of each task.
  std::vector<double> comp_end(4 * kLayers, -1), comm_end(4 * kLayers, -1);
  const double comp_len[4] = {attn, attn, mlp, mlp}, comm_len[4] = {disp, disp, comb, comb};
  const auto comp_ready = [&](int i) {  // attention: the micro-batch's previous combine; MLP: its dispatch
    const int L = i / 4, k = i % 4;
    if (k < 2) return L == 0 || comm_end[std::size_t(4 * (L - 1) + 2 + k)] >= 0;
    return comm_end[std::size_t(4 * L + k - 2)] >= 0;
  };
  const auto comm_ready = [&](int i) {  // dispatch: its attention; combine: its MLP
    return comp_end[std::size_t(i)] >= 0;
  };
  double t = 0, comp_left = -1, comm_left = -1;
  int ci = 0, mi = 0;
  while (mi < 4 * kLayers) {
    if (comp_left < 0 && ci < 4 * kLayers && comp_ready(ci)) comp_left = comp_len[ci % 4];
    if (comm_left < 0 && comm_ready(mi)) comm_left = comm_len[mi % 4];
    const double rate = comm_left >= 0 ? 1.0 - s : 1.0;
    const double dt = std::min(comp_left >= 0 ? comp_left / rate : 1e300, comm_left >= 0 ? comm_left : 1e300);
    t += dt;
    if (comp_left >= 0 && (comp_left -= dt * rate) <= 1e-15) {
      comp_end[std::size_t(ci++)] = t;
      comp_left = -1;
    }
    if (comm_left >= 0 && (comm_left -= dt) <= 1e-15) {
      comm_end[std::size_t(mi++)] = t;
      comm_left = -1;
    }
  }
  return (comm_end[std::size_t(4 * kLayers - 1)] - comm_end[std::size_t(4 * (kLayers - 2) - 1)]) / 2;
}

// The busiest rank's layer times: without two-batch overlap compute and communication add up.
// With it the batch runs as two micro-batches, one's dispatch/combine beside the other's compute
// (each computed on half the rows: decode reads every weight twice), as overlap_period orders
// them; DeepEP's kernels hold --deepep-normal-sms (or -ll-sms) of the GPU's SMs meanwhile. The
// attn_tp all-reduce is not overlapped.
inline LayerTime layer_time(const Deployment& d, const DeployInput& in, const Cluster& c, bool moe) {
  const bool tbo = in.two_batch_overlap && moe && d.widths.tp > 1;
  const int n = tbo ? 2 : 1;
  const impl::LayerParts p = impl::layer_parts(d, in, c, 1.0 / n);
  LayerTime t;
  t.attention = n * p.attention;
  t.experts = n * (moe ? p.experts : p.dense_mlp);
  t.other = n * (p.other_attn + (moe ? p.other_moe + p.gaps_moe : p.other_dense + p.gaps_dense));
  t.dispatch = moe ? n * p.dispatch : 0.0;
  t.combine = moe ? n * p.combine : 0.0;
  t.other_comm = n * (p.attn_comm * (moe ? 1 : 2) + (moe ? p.moe_comm : 0.0));
  t.parts = p.b;
  for (double LayerBuild::*x : {&LayerBuild::proj, &LayerBuild::core, &LayerBuild::dense_mlp, &LayerBuild::router,
                                &LayerBuild::shared, &LayerBuild::routed})
    t.parts.*x *= n;
  t.parts.other_kernels = n * (p.other_attn + (moe ? p.other_moe : p.other_dense));
  t.parts.gaps = n * (moe ? p.gaps_moe : p.gaps_dense);
  t.parts.kernels = n * (kAttentionKernels + (moe ? kMoeKernels : kDenseMlpKernels));
  if (!moe) t.parts.router = t.parts.shared = t.parts.routed = 0;
  else t.parts.dense_mlp = 0;
  const double overlappable = t.dispatch + t.combine + (moe ? n * p.moe_comm : 0.0);
  const double fixed = t.other_comm - (moe ? n * p.moe_comm : 0.0);
  if (tbo) {
    const Efficiency& e = c.eff;
    const double s = d.deepep ? std::min(1.0, (d.low_latency ? e.ll_sms : e.normal_sms) / c.sms) : 0.0;
    const double gap = in.phase == Phase::prefill ? e.gap_eager : e.gap_graph;
    const double attn = p.attention + p.other_attn + kAttentionKernels * gap;
    const double mlp = p.experts + p.other_moe + kMoeKernels * gap;
    const double shared = overlap_period(attn, mlp, p.dispatch, p.combine + p.moe_comm, s);
    t.parts.overlap_slowdown = shared - std::max(overlappable, t.compute());
    t.total = shared + fixed;
  } else {
    t.total = t.compute() + overlappable + fixed;
  }
  t.exposed = t.total - t.compute();
  return t;
}

// A rank of stage `s` of `pp`: its layers' weights, and K/V for the pp micro-batches in flight.
inline DeployMemory deploy_memory(const Deployment& d, const DeployInput& in, const DeployStage& s, int pp) {
  const MlaModel& m = in.model;
  const Widths& w = d.widths;
  const double H = m.hidden, A = w.attn_tp, wb = weight_bytes_of(in.weight_bytes);
  DeployMemory mem;
  // Norms stay BF16 (2 per layer of hidden, q_lora's and kv_lora's).
  mem.attention = s.layers.count * ((m.attn_replicated() + m.attn_split() / A) * wb + (2.0 * H + m.q_lora + m.kv_lora) * 2.0);
  mem.dense_mlp = s.dense * 3.0 * H * m.dense_inter / A * wb;
  mem.experts = s.moe * d.local_experts * 3.0 * H * (double(m.moe_inter) / w.moe_tp) * wb;
  mem.shared = s.moe * m.shared_experts * 3.0 * H * (d.deepep ? m.moe_inter : double(m.moe_inter) / w.moe_tp) * wb;
  mem.router = s.moe * double(m.experts) * H * 2.0;  // the gate stays BF16
  // Embeddings (first stage) and LM head (last), BF16, over attn_tp.
  mem.embeddings = ((s.embed ? 1.0 : 0.0) + (s.head ? 1.0 : 0.0)) * double(m.vocab) * H * 2.0 / A;
  // MLA caches one latent (kv_lora) and one rope key per token and layer, the same on every attn_tp rank.
  const double cached = in.phase == Phase::prefill ? d.input_tokens
                                                   : double(in.requests_per_gpu) * w.attn_tp * (in.kv_len + 1.0);
  mem.kv = pp * cached * s.layers.count * m.kv_per_token_layer() * in.kv_bytes;
  // One layer at a time: the rows' hidden states, queries and attention output, and the experts'
  // received rows with their intermediate.
  const double T = d.group_tokens, h = m.heads / A;
  mem.activations = in.act_bytes * (T * (4.0 * H + h * 2.0 * (m.qk_nope + m.qk_rope + m.v_head)) +
                                    (s.moe > 0 ? d.expert_pairs * in.imbalance * (H + 3.0 * double(m.moe_inter) / w.moe_tp) : 0.0));
  return mem;
}

// Whether every rank of the domain at world rank `first` sits on the node of its peer `tp` ranks on
// (the same tp rank of the next stage).
inline bool handover_on_node(std::int64_t first, int tp, int gpus_per_node) {
  for (std::int64_t t = 0; t < tp; ++t)
    if ((first + t) / gpus_per_node != (first + t + tp) / gpus_per_node) return false;
  return true;
}

namespace impl {

// The layout rules of the MLA presets (besides the layout engine's): no attention CP or moe_dp,
// heads over attn_tp, physical experts over moe_ep, the intermediate over moe_tp.
inline void check_deploy_layout(const Widths& w, const DeployInput& in) {
  const MlaModel& m = in.model;
  if (w.attn_cp > 1 || w.moe_dp > 1)
    throw LayoutError(w.attn_cp > 1 ? "--cp" : "--moe-dp-size",
                      std::string(w.attn_cp > 1 ? "--cp" : "--moe-dp-size") + ": attention CP and --moe-dp-size are not " +
                          "modelled for --preset " + m.name);
  if (m.heads % w.attn_tp != 0)
    throw LayoutError("--tp", "--preset " + m.name + ": heads = " + std::to_string(m.heads) +
                                  " must be a multiple of attn_tp = " + std::to_string(w.attn_tp));
  if (in.redundant_experts > 0 && w.moe_ep < 2)
    throw LayoutError("--ep-num-redundant-experts", "--ep-num-redundant-experts " + std::to_string(in.redundant_experts) +
                                                        " needs expert parallelism (moe_ep > 1), this layout has moe_ep = 1");
  const int physical = m.experts + in.redundant_experts;
  if (physical % w.moe_ep != 0)
    throw LayoutError(in.redundant_experts > 0 ? "--ep-num-redundant-experts" : "--ep",
                      (in.redundant_experts > 0 ? "--ep-num-redundant-experts " + std::to_string(in.redundant_experts)
                                                : "--preset " + m.name) +
                          ": physical experts = " + std::to_string(m.experts) + " routed + " +
                          std::to_string(in.redundant_experts) + " redundant = " + std::to_string(physical) +
                          " must be a multiple of moe_ep = " + std::to_string(w.moe_ep));
  if (m.moe_inter % w.moe_tp != 0)
    throw LayoutError("--ep", "--preset " + m.name + ": moe_intermediate_size 2048 must be a multiple of moe_tp = " +
                                  std::to_string(w.moe_tp));
}

// The routing (destinations, imbalance from a load file, DeepEP's mode) and the batch: tokens and
// requests per attention-DP group, rows routed and (row, expert) pairs per rank, the rows' bytes.
inline void deploy_batch(Deployment& d, DeployInput& in, const Cluster& c) {
  const MlaModel& m = in.model;
  const Widths& w = d.widths;
  d.spread = routing_spread(m.experts, m.topk, m.groups, m.topk_groups, w.moe_ep, c.gpus_per_node);
  if (in.load) {
    if (in.load->front().size() != std::size_t(m.experts))
      throw LayoutError("--expert-load", "--expert-load: " + std::to_string(in.load->front().size()) + " experts; --preset " +
                                             m.name + " routes over " + std::to_string(m.experts));
    const int nodes = w.moe_ep % d.spread.node_count == 0 ? d.spread.node_count : 1;
    in.imbalance = imbalance_of(*in.load, w.moe_ep, in.redundant_experts, nodes, m.groups);
  }
  if (w.moe_ep < 2) in.imbalance = 1.0;  // every rank holds a slice of every expert
  d.deepep = d.path == BridgePath::a2a_split || d.path == BridgePath::direct;
  d.low_latency = d.deepep && in.deepep_mode.value_or(in.phase == Phase::decode ? EpMode::low_latency : EpMode::normal) ==
                                  EpMode::low_latency;
  // Prefill computes each request's tokens after its cached prefix; decode steps the requests the
  // batch holds, each one token (two with an MTP draft).
  if (in.phase == Phase::prefill) {
    d.input_tokens = double(in.batch_tokens) / d.replicas / d.pp / w.attn_dp;
    d.group_requests = d.input_tokens / in.request_tokens;
    d.group_tokens = d.group_requests * (in.request_tokens - std::floor(in.cache_hit * in.request_tokens));
  } else {
    d.group_requests = double(in.requests_per_gpu) * in.batch_fill * w.attn_tp;
    d.group_tokens = d.group_requests * (in.mtp_acceptance > 0 ? 2.0 : 1.0);
    d.input_tokens = d.group_requests * (1.0 + in.mtp_acceptance);
  }
  const double domain_tokens = d.group_tokens * w.attn_dp;
  // Rows entering this rank's MoE: its share of its group's rows (all-to-all paths), every row of
  // the domain (dp_gather) or of its group (tp_moe, one group).
  d.routed_rows = d.deepep ? d.group_tokens / w.attn_tp : (d.path == BridgePath::dp_gather ? domain_tokens : d.group_tokens);
  const double moe_tokens = d.deepep ? domain_tokens : d.routed_rows;
  d.expert_pairs = moe_tokens * m.topk / w.moe_ep * in.imbalance;
  d.local_experts = double(m.experts + in.redundant_experts) / w.moe_ep;
  // FP8 dispatch (e4m3 + one fp32 scale per 128 values) and BF16 combine, as DeepEP sends them;
  // low-latency copies carry the row only.
  d.dispatch_row = d.low_latency ? EpMessage::fp8_row_bytes(m.hidden) : EpMessage::of_fp8<float>(m.topk, m.hidden).bytes;
  d.combine_row = std::int64_t(m.hidden) * 2;
  d.imbalance = in.imbalance;
  d.micro_tokens = in.phase == Phase::prefill ? d.input_tokens * w.attn_dp : d.group_requests * w.attn_dp;
}

// Stage `s` of the pipeline: its layers, its hand-over to the next stage and the gather of what it
// received, its time and memory (the layer times in `d` already set).
inline DeployStage deploy_stage(const Deployment& d, const DeployInput& in, const Cluster& c, int s, int tp) {
  const MlaModel& m = in.model;
  const int pp = d.pp, A = d.widths.attn_tp;
  DeployStage st;
  st.layers = stage_layers(m.layers, pp, s);
  st.dense = std::clamp(m.dense_layers - st.layers.first, 0, st.layers.count);
  st.moe = st.layers.count - st.dense;
  st.embed = s == 0;
  st.head = s + 1 == pp;
  st.sends = s + 1 < pp;
  st.receives = s > 0;
  st.handover = handover(d.group_tokens, m.hidden, in.act_bytes, kMlaHandoverTensors, A);
  if (st.sends) {
    bool one_node = true;  // over every replica's offset modulo the node size
    for (int rep = 0; rep < std::min(d.replicas, c.gpus_per_node); ++rep)
      one_node = one_node && handover_on_node((std::int64_t{rep} * pp + s) * tp, tp, c.gpus_per_node);
    st.send_s = p2p_seconds(st.handover.sent, one_node, c);
  }
  if (st.receives && st.handover.gathered > 0)
    st.gather_s = collective_seconds(TrafficOp::all_gather, A, A <= c.gpus_per_node, 1, st.handover.gathered, c);
  st.seconds = st.dense * d.dense.total + st.moe * d.moe.total + (st.head ? d.head + d.mtp : 0.0) + st.send_s + st.gather_s;
  st.memory = deploy_memory(d, in, st, pp);
  return st;
}

}  // namespace impl

// The deployment of the MLA model on the world `world` (`c`: the time model, its node size the
// world's: world_cluster). The prefill batch is the world's: split evenly over the replicas and into
// pp micro-batches; the decode batch is --requests-per-gpu on every GPU, pp micro-batches in
// flight. Throws LayoutError naming the flag when the model or the flags do not fit the layout.
inline Deployment plan_deployment(const WorldLayout& world, const DeployInput& given, const Cluster& c,
                                  bool nnodes_given = false) {
  DeployInput in = given;
  const MlaModel& m = in.model;
  const RuntimeLayout& layout = world.domain();
  const int pp = world.pp();
  check_stages(m.layers, pp, "--preset " + m.name + " (" + std::to_string(m.layers) + " layers)");
  Deployment d;
  d.replicas = world.replicas();
  d.pp = pp;
  d.world_ranks = world.size();
  d.ranks_per_node = c.gpus_per_node;
  d.nodes = world_nodes(world, nnodes_given, c);
  d.gpu_memory = c.memory;
  d.widths = layout.widths();
  d.path = layout.bridge_path();
  impl::check_deploy_layout(d.widths, in);
  impl::deploy_batch(d, in, c);
  d.dense = layer_time(d, in, c, false);
  d.moe = layer_time(d, in, c, true);
  d.head = impl::head_seconds(d, in, c, d.group_requests);
  // MTP: the draft layer (one MoE layer, its projection of the embedding and hidden state) and its head.
  if (in.phase == Phase::decode && in.mtp_acceptance > 0) {
    double f = 0;
    d.mtp = d.moe.total + impl::gemm_seconds(d.group_requests, m.hidden, 2.0 * m.hidden, in.weight_bytes,
                                             in.weight_bytes == 1 ? c.fp8_flops : c.gpu_flops, c, &f) + d.head;
    d.head = impl::head_seconds(d, in, c, d.group_tokens);  // the main head on both tokens of each request
  }
  for (int s = 0; s < pp; ++s) {
    const DeployStage st = impl::deploy_stage(d, in, c, s, layout.size());
    d.latency += st.seconds;
    d.interval = std::max(d.interval, st.seconds);
    if (d.stages.empty() || st.memory.total() > d.stages[std::size_t(d.fullest)].memory.total()) d.fullest = s;
    d.stages.push_back(st);
  }
  d.step = pp * d.interval;
  const double out = in.phase == Phase::decode ? 1.0 + in.mtp_acceptance : 1.0;  // tokens a request gains a step
  d.tokens_per_gpu_s = d.micro_tokens * out / layout.size() / d.step;
  d.memory = d.stages[std::size_t(d.fullest)].memory;
  d.world_tokens_s = d.replicas * d.micro_tokens * out / d.interval;
  return d;
}

// The MLA model on one domain `layout` taken as the whole world.
inline Deployment plan_deployment(const RuntimeLayout& layout, const DeployInput& given, const Cluster& c) {
  return plan_deployment(WorldLayout::single_domain(layout), given, c);
}

// A layer's times; `components` splits its compute by kernel (both micro-batches), `efficiency`
// gives the achieved share of the peak each ran at.
inline nlohmann::json layer_json(const LayerTime& t) {
  const LayerBuild& b = t.parts;
  return {{"attention_s", t.attention}, {"experts_s", t.experts}, {"dispatch_s", t.dispatch}, {"combine_s", t.combine},
          {"other_comm_s", t.other_comm}, {"other_s", t.other}, {"exposed_comm_s", t.exposed}, {"total_s", t.total},
          {"components",
           {{"projections_s", b.proj}, {"core_attention_s", b.core}, {"dense_mlp_s", b.dense_mlp}, {"router_s", b.router},
            {"shared_expert_s", b.shared}, {"routed_experts_s", b.routed}, {"other_kernels_s", b.other_kernels},
            {"launch_gaps_s", b.gaps}, {"kernels", b.kernels}, {"overlap_slowdown_s", b.overlap_slowdown},
            {"rows_per_expert", b.rows_per_expert}}},
          {"efficiency",
           {{"projections", b.proj_share}, {"core_attention", b.core_share}, {"dense_mlp", b.dense_share},
            {"shared_expert", b.shared_share}, {"routed_experts", b.routed_share}}}};
}

inline nlohmann::json memory_json(const DeployMemory& m) {
  return {{"attention", m.attention}, {"dense_mlp", m.dense_mlp}, {"experts", m.experts}, {"shared_expert", m.shared},
          {"router", m.router}, {"embeddings_lm_head", m.embeddings}, {"weights", m.weights()}, {"kv", m.kv},
          {"activations", m.activations}, {"total", m.total()}};
}

// The world of a deployment and its stages, one micro-batch each.
inline nlohmann::json deploy_world_json(const Deployment& d) {
  nlohmann::json stages = nlohmann::json::array();
  for (std::size_t s = 0; s < d.stages.size(); ++s) {
    const DeployStage& st = d.stages[s];
    stages.push_back({{"stage", s},
                      {"first_layer", st.layers.first},
                      {"layers", st.layers.count},
                      {"dense_layers", st.dense},
                      {"moe_layers", st.moe},
                      {"embeddings", st.embed},
                      {"lm_head", st.head},
                      {"handover_bytes", st.sends ? st.handover.sent : 0.0},
                      {"gather_bytes", st.receives ? st.handover.gathered : 0.0},
                      {"handover_s", st.send_s},
                      {"gather_s", st.gather_s},
                      {"stage_s", st.seconds},
                      {"memory", memory_json(st.memory)}});
  }
  return {{"replicas", d.replicas},
          {"pp", d.pp},
          {"tp", d.widths.tp},
          {"size", d.world_ranks},
          {"nnodes", d.nodes},
          {"ranks_per_node", d.ranks_per_node},
          {"layer_split", kLayerSplitNote},
          {"handover_tensors", kMlaHandoverTensors},
          {"micro_batch", d.micro_tokens},
          {"pipeline_latency_s", d.latency},
          {"stage_interval_s", d.interval},
          {"world_tokens_per_s", d.world_tokens_s},
          {"fullest_stage", d.fullest},
          {"stages", stages}};
}

inline nlohmann::json deployment_json(const Deployment& d, const DeployInput& in) {
  return {{"model", in.model.name},
          {"phase", in.phase == Phase::prefill ? "prefill" : "decode"},
          {"path", std::string(to_string(d.path))},
          {"deepep_mode", d.deepep ? (d.low_latency ? "low_latency" : "normal") : "none"},
          {"two_batch_overlap", in.two_batch_overlap},
          {"attn_tp_input_scattered", in.attn_tp_input_scattered && attn_input_scattered(d.path, d.widths)},
          {"imbalance", d.imbalance},
          {"physical_experts", in.model.experts + in.redundant_experts},
          {"tokens_per_group", d.group_tokens},
          {"routed_rows_per_rank", d.routed_rows},
          {"expert_pairs_per_rank", d.expert_pairs},
          {"destination_ranks_per_token", d.spread.ranks},
          {"destination_nodes_per_token", d.spread.nodes},
          {"dispatch_row_bytes", d.dispatch_row},
          {"combine_row_bytes", d.combine_row},
          {"dense_layer", layer_json(d.dense)},
          {"moe_layer", layer_json(d.moe)},
          {"lm_head_s", d.head},
          {"mtp_s", d.mtp},
          {"input_tokens_per_group", in.phase == Phase::prefill ? d.input_tokens : 0.0},
          {"attn_dp_imbalance", in.attn_dp_imbalance},
          {"decode_batch_fill", in.batch_fill},
          {"prefill_cache_hit", in.cache_hit},
          {"mtp_acceptance", in.mtp_acceptance},
          {"step_s", d.step},
          {"tokens_per_gpu_s", d.tokens_per_gpu_s},
          {"memory", memory_json(d.memory)},
          {"gpu_memory", d.gpu_memory},
          {"fits", d.fits()},
          {"world", deploy_world_json(d)}};
}

inline std::string us_text(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f us", s * 1e6);
  return b;
}

inline std::string deployment_text(const Deployment& d, const DeployInput& in) {
  const Widths& w = d.widths;
  const MlaModel& m = in.model;
  std::ostringstream s;
  char b[400];
  s << "plan: " << m.name << " (" << (in.phase == Phase::prefill ? "prefill" : "decode") << "), tp=" << w.tp
    << " attn dp x tp = " << w.attn_dp << " x " << w.attn_tp << ", moe ep x tp = " << w.moe_ep << " x " << w.moe_tp
    << " -> bridge " << to_string(d.path);
  if (d.deepep) s << ", DeepEP " << (d.low_latency ? "low_latency" : "normal");
  s << (in.two_batch_overlap ? ", two-batch overlap" : "")
    << (in.attn_tp_input_scattered && attn_input_scattered(d.path, w) ? ", attention-TP input scattered" : "") << "\n";
  std::snprintf(b, sizeof b,
                "model: config.json dims, %d layers (%d dense), %d routed experts%s + %d shared, top-%d, node-limited "
                "routing %d groups top-%d; %.3g-byte weights, %.3g-byte activations and K/V\n",
                m.layers, m.dense_layers, m.experts,
                in.redundant_experts > 0 ? (" + " + std::to_string(in.redundant_experts) + " redundant").c_str() : "",
                m.shared_experts, m.topk, m.groups, m.topk_groups, in.weight_bytes, in.act_bytes);
  s << b;
  if (in.phase == Phase::prefill)
    std::snprintf(b, sizeof b, "batch: %.0f tokens per attention-DP group (requests of %d tokens)\n", d.group_tokens,
                  in.request_tokens);
  else
    std::snprintf(b, sizeof b, "batch: %d requests per GPU, %d tokens cached per request\n", in.requests_per_gpu, in.kv_len);
  s << b;
  std::snprintf(b, sizeof b,
                "per rank: %.1f rows routed, %.1f (row, expert) pairs on %.3g local experts (imbalance %.3g); a token "
                "reaches %.2f ranks on %.2f of %d nodes; dispatch %lld B a copy, combine %lld B\n",
                d.routed_rows, d.expert_pairs, d.local_experts, d.imbalance, d.spread.ranks, d.spread.nodes,
                d.spread.node_count, static_cast<long long>(d.dispatch_row), static_cast<long long>(d.combine_row));
  s << b << "\nper layer (busiest rank)  attention     experts       other    dispatch     combine  other comm     exposed       total\n";
  for (const auto& [name, t] : {std::pair<const char*, const LayerTime&>{"dense layer (x", d.dense}, {"MoE layer (x", d.moe}}) {
    const int n = std::string(name) == "dense layer (x" ? m.dense_layers : m.moe_layers();
    std::snprintf(b, sizeof b, "%-24s %11s %11s %11s %11s %11s %11s %11s %11s\n", (name + std::to_string(n) + ")").c_str(),
                  us_text(t.attention).c_str(), us_text(t.experts).c_str(), us_text(t.other).c_str(), us_text(t.dispatch).c_str(),
                  us_text(t.combine).c_str(), us_text(t.other_comm).c_str(), us_text(t.exposed).c_str(),
                  us_text(t.total).c_str());
    s << b;
  }
  if (d.pp > 1) {
    s << "stages: " << kLayerSplitNote << ":";
    for (std::size_t i = 0; i < d.stages.size(); ++i) {
      const DeployStage& st = d.stages[i];
      std::string parts;
      if (st.dense > 0) parts += std::to_string(st.dense) + " dense";
      if (st.moe > 0) parts += (parts.empty() ? "" : " + ") + std::to_string(st.moe) + " MoE";
      if (st.embed) parts += " + embeddings";
      if (st.head) parts += " + LM head";
      s << " stage " << i << " [" << st.layers.first << ", " << st.layers.end() << ") " << parts << ": " << ms_text(st.seconds)
        << (i + 1 < d.stages.size() ? ";" : "\n");
    }
    const DeployStage& first = d.stages.front();
    std::snprintf(b, sizeof b,
                  "pipeline: a micro-batch of %.0f %s over the domain; each rank hands hidden states and residual to the "
                  "next stage, %s a rank%s in %s; a micro-batch crosses the %d stages in %s, one leaves every %s; %d "
                  "micro-batches in flight\n",
                  d.micro_tokens, in.phase == Phase::prefill ? "tokens" : "requests", bytes_text(first.handover.sent).c_str(),
                  first.handover.gathered > 0 ? " (its 1/attn_tp slice, all-gathered over attn_tp there)" : "",
                  us_text(first.send_s).c_str(), d.pp, ms_text(d.latency).c_str(), ms_text(d.interval).c_str(), d.pp);
    s << b;
  }
  if (d.mtp > 0) s << "MTP draft layer and head: " << us_text(d.mtp) << "\n";
  std::snprintf(b, sizeof b, "LM head and sampling: %s\n%s: %s; %.0f tokens/s per GPU\n", us_text(d.head).c_str(),
                in.phase == Phase::prefill ? "forward" : "decode step", ms_text(d.step).c_str(), d.tokens_per_gpu_s);
  s << b;
  std::snprintf(b, sizeof b, "world: %d replica%s x pp %d x tp %d = %d ranks on %lld node%s: %.0f tokens/s in all\n", d.replicas,
                d.replicas == 1 ? "" : "s", d.pp, w.tp, d.world_ranks, static_cast<long long>(d.nodes), d.nodes == 1 ? "" : "s",
                d.world_tokens_s);
  s << b;
  const DeployMemory& mm = d.memory;
  s << "memory per rank " << bytes_text(mm.total()) << " of " << bytes_text(d.gpu_memory) << ": weights "
    << bytes_text(mm.weights()) << " (attention " << bytes_text(mm.attention) << ", dense MLP " << bytes_text(mm.dense_mlp)
    << ", experts " << bytes_text(mm.experts) << ", shared expert " << bytes_text(mm.shared) << ", router "
    << bytes_text(mm.router) << ", embeddings + LM head " << bytes_text(mm.embeddings) << "), K/V " << bytes_text(mm.kv)
    << ", activations " << bytes_text(mm.activations)
    << (d.pp > 1 ? " (stage " + std::to_string(d.fullest) + ", the fullest)" : std::string()) << "\n";
  s << fit_text(mm.total(), d.gpu_memory);
  return s.str();
}

// --explain: how one layer's time on the busiest rank was built, kernel by kernel.
inline std::string layer_explain(const char* what, const LayerTime& t, const Deployment& d, const DeployInput& in,
                                 const Cluster& c, bool moe) {
  const LayerBuild& b = t.parts;
  const bool tbo = in.two_batch_overlap && moe && d.widths.tp > 1;
  const bool prefill = in.phase == Phase::prefill;
  const std::string gemm = c.eff.gemm_table ? "DeepGEMM's H800 table for the shape" : "--gemm-efficiency";
  std::ostringstream s;
  char b2[400];
  const auto line = [&](const char* fmt, auto... v) {
    std::snprintf(b2, sizeof b2, fmt, v...);
    s << "  " << b2 << "\n";
  };
  s << what << " (busiest rank" << (tbo ? ", both micro-batches together" : "") << "):\n";
  line("projections q_a+kv_a, q_b, kv_b, o: %s at %.3f of the %s peak (%s)", us_text(b.proj).c_str(), b.proj_share,
       in.weight_bytes == 1 ? "FP8" : "BF16", gemm.c_str());
  line("core attention: %s at %.3f of the BF16 peak (%s)", us_text(b.core).c_str(), b.core_share,
       prefill && c.eff.prefill_table ? "FlashAttention-3's causal table at the prompt length"
                                      : "--attention-efficiency, or the cache read at --hbm-efficiency");
  if (in.attn_dp_imbalance != 1) line("attention x %.3g (--attn-dp-imbalance): %s", in.attn_dp_imbalance, us_text(t.attention).c_str());
  if (moe) {
    line("router (BF16): %s", us_text(b.router).c_str());
    line("shared expert: %s at %.3f of the peak (%s)", us_text(b.shared).c_str(), b.shared_share, gemm.c_str());
    line("routed experts: %.3g local, %.1f rows each (imbalance %.3g): %s at %.3f of the peak (%s)", d.local_experts,
         b.rows_per_expert, d.imbalance, us_text(b.routed).c_str(), b.routed_share, gemm.c_str());
  } else {
    line("dense MLP: %s at %.3f of the peak (%s)", us_text(b.dense_mlp).c_str(), b.dense_share, gemm.c_str());
  }
  line("other kernels (norms, quantization, rope, SwiGLU, permutation) over HBM at %.2f of %.0f GB/s: %s", c.eff.hbm,
       c.hbm_bw / 1e9, us_text(b.other_kernels).c_str());
  line("launch gaps: %.0f kernels x %.2f us (%s): %s", b.kernels, (prefill ? c.eff.gap_eager : c.eff.gap_graph) * 1e6,
       prefill ? "--kernel-gap-eager" : "--kernel-gap-graph", us_text(b.gaps).c_str());
  line("= compute %s", us_text(t.compute()).c_str());
  if (moe && d.deepep)
    line("DeepEP %s: dispatch %s, combine %s", d.low_latency ? "low_latency" : "normal", us_text(t.dispatch).c_str(),
         us_text(t.combine).c_str());
  if (tbo) {
    const double sms = d.low_latency ? c.eff.ll_sms : c.eff.normal_sms;
    line("two-batch overlap: two streams, attention A, B, MLP A, B beside dispatch A, B, combine A, B, DeepEP holding "
         "%.0f of %.0f SMs; beyond max(compute, communication): %s", sms, c.sms, us_text(b.overlap_slowdown).c_str());
  } else if (t.dispatch + t.combine > 0) {
    line("no overlap: compute + dispatch + combine");
  }
  if (t.other_comm > 0) line("collectives over tp / attn_tp: %s", us_text(t.other_comm).c_str());
  line("= %s a layer", us_text(t.total).c_str());
  return s.str();
}

// --explain: the layers, the LM head and the step, then tokens/s per GPU.
inline std::string deployment_explain(const Deployment& d, const DeployInput& in, const Cluster& c) {
  const MlaModel& m = in.model;
  std::ostringstream s;
  s << "\nhow the step was built:\n" << layer_explain("a dense layer", d.dense, d, in, c, false)
    << layer_explain("a MoE layer", d.moe, d, in, c, true);
  char b[500];
  std::snprintf(b, sizeof b,
                "step: %d dense x %s + %d MoE x %s + LM head and sampling %s%s%s, over %d stage%s = %s; %.0f %s a GPU "
                "per step -> %.0f tokens/s per GPU\n",
                m.dense_layers, us_text(d.dense.total).c_str(), m.moe_layers(), us_text(d.moe.total).c_str(),
                us_text(d.head).c_str(), d.mtp > 0 ? " + MTP draft " : "", d.mtp > 0 ? us_text(d.mtp).c_str() : "", d.pp,
                d.pp == 1 ? "" : "s", ms_text(d.step).c_str(), d.tokens_per_gpu_s * d.step,
                in.phase == Phase::prefill ? "input tokens" : "tokens out", d.tokens_per_gpu_s);
  s << b;
  return s.str();
}

// `relayout plan --gpus N --preset deepseek-v3`: every domain size (replicas of it: independent
// instances, each with its own DP attention), DP attention of every width, backend none with every
// ep and DeepEP (EP over the domain), sorted by tokens/s per GPU (those that fit first).
struct RankedDeployment {
  std::string flags, unit;
  LayoutConfig config;
  int replicas = 1;
  Deployment plan;
  bool fits = true;
};

struct DeployRanking {
  int gpus = 0;
  std::vector<RankedDeployment> layouts;
  std::map<std::string, int> skipped;  // reason -> layouts
};

inline std::string unit_text(int replicas, const Deployment& d) {
  const Widths& w = d.widths;
  std::string u = std::to_string(replicas) + " x " + (d.pp > 1 ? "PP" + std::to_string(d.pp) + " x " : "") +
                  (w.moe_ep > 1 ? "EP" + std::to_string(w.moe_ep) : "TP" + std::to_string(w.tp));
  if (w.attn_dp > 1) u += " DP" + std::to_string(w.attn_dp);
  return u;
}

inline DeployRanking rank_deployments(int gpus, const DeployInput& in, const Cluster& c, double gpu_memory) {
  DeployRanking out;
  out.gpus = gpus;
  for (int replicas : divisors(gpus))
    for (int pp : divisors(gpus / replicas)) {
    if (pp > in.model.layers) break;  // every stage needs a layer
    const int n = gpus / replicas / pp;
    DeployInput each = in;
    each.batch_tokens = in.batch_tokens / replicas;
    if (in.phase == Phase::prefill && each.batch_tokens / pp < 1) continue;
    for (bool dpa : {false, true})
      for (int dp : dpa ? divisors(n) : std::vector<int>{1}) {
        if (dpa && dp == 1) continue;
        for (Backend b : {Backend::none, Backend::deepep})
          for (int ep : b == Backend::none ? divisors(n) : std::vector<int>{1}) {
            const LayoutConfig cfg{.tp = n, .dp = dp, .ep = ep, .enable_dp_attention = dpa, .moe_a2a_backend = b, .pp = pp};
            if (derive_widths(cfg).rule != LayoutRule::ok) continue;
            RankedDeployment r;
            try {
              r.plan = plan_deployment(WorldLayout(cfg), each, c);
            } catch (const LayoutError& e) {
              ++out.skipped[std::string(e.input()) + " (e.g. " + e.what() + ")"];
              continue;
            }
            r.config = cfg;
            r.replicas = replicas;
            r.flags = layout_flags(cfg, {b});
            r.unit = unit_text(replicas, r.plan);
            r.plan.gpu_memory = gpu_memory;
            r.fits = r.plan.fits();
            out.layouts.push_back(std::move(r));
          }
      }
  }
  if (out.layouts.empty()) {
    std::string why;
    for (const auto& [reason, k] : out.skipped) why += "; " + std::to_string(k) + " skipped for " + reason;
    throw LayoutError("--gpus", "--gpus " + std::to_string(gpus) + ": no layout of " + std::to_string(gpus) +
                                    " GPUs runs " + in.model.name + why);
  }
  std::stable_sort(out.layouts.begin(), out.layouts.end(), [](const RankedDeployment& a, const RankedDeployment& b) {
    return a.fits != b.fits ? a.fits : a.plan.tokens_per_gpu_s > b.plan.tokens_per_gpu_s;
  });
  return out;
}

inline nlohmann::json deploy_ranking_json(const DeployRanking& r, const DeployInput& in) {
  nlohmann::json j;
  j["gpus"] = r.gpus;
  j["layouts"] = nlohmann::json::array();
  for (const RankedDeployment& l : r.layouts) {
    nlohmann::json e = deployment_json(l.plan, in);
    e["flags"] = l.flags;
    e["unit"] = l.unit;
    e["replicas"] = l.replicas;
    e["fits"] = l.fits;
    j["layouts"].push_back(e);
  }
  j["skipped"] = nlohmann::json::object();
  for (const auto& [reason, n] : r.skipped) j["skipped"][reason] = n;
  return j;
}

// One row per layout: the step, tokens/s per GPU and the split of the step over its parts.
inline std::string deploy_ranking_text(const DeployRanking& r, const DeployInput& in, const std::string& header,
                                       std::size_t top) {
  std::ostringstream s;
  s << header;
  char line[600];
  std::snprintf(line, sizeof line, "%4s  %11s  %9s  %10s  %10s  %10s  %10s  %10s  %11s  %-4s  %-20s  %s\n", "#",
                in.phase == Phase::prefill ? "forward" : "step", "tok/s/GPU", "attention", "experts", "dispatch",
                "combine", "exposed", "memory/rank", "fits", "unit", "flags");
  s << line;
  std::size_t i = 0;
  for (const RankedDeployment& l : r.layouts) {
    if (top > 0 && i >= top) break;
    const Deployment& d = l.plan;
    const MlaModel& m = in.model;
    // Whole-step seconds of each part: dense and MoE layers together.
    const auto sum = [&](double LayerTime::*f) { return m.dense_layers * d.dense.*f + m.moe_layers() * d.moe.*f; };
    std::snprintf(line, sizeof line, "%4zu  %11s  %9.0f  %10s  %10s  %10s  %10s  %10s  %11s  %-4s  %-20s  %s\n", ++i,
                  ms_text(d.step).c_str(), d.tokens_per_gpu_s, ms_text(sum(&LayerTime::attention)).c_str(),
                  ms_text(sum(&LayerTime::experts)).c_str(), ms_text(sum(&LayerTime::dispatch)).c_str(),
                  ms_text(sum(&LayerTime::combine)).c_str(), ms_text(sum(&LayerTime::exposed)).c_str(),
                  bytes_text(d.memory.total()).c_str(), l.fits ? "yes" : "NO", l.unit.c_str(), l.flags.c_str());
    s << line;
  }
  if (top > 0 && r.layouts.size() > top) s << "  ... " << r.layouts.size() - top << " more (--top 0 lists all)\n";
  for (const auto& [reason, n] : r.skipped) s << "skipped: " << n << " layout" << (n > 1 ? "s" : "") << ", " << reason << "\n";
  return s.str();
}

}  // namespace relayout::cli
