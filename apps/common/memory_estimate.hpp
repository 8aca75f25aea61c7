// The memory and flops of the DeepSeek-V4-like demo model per rank, from its dims and a layout:
// weights by shard, activations, attention K/V, buffers. One formula serves the examples' size
// check (memory.hpp: the largest rank, refused before anything is allocated) and `relayout plan`
// (each rank with its own rows). An upper bound of the model's largest terms, not an exact count.
// Also the model flags, registered once for every program that takes them.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>

#include "common/numbers.hpp"
#include "demo_model/config.hpp"
#include "relayout/mesh.hpp"
#include "relayout/placement/ep_message.hpp"

namespace relayout::cli {

struct MemoryEstimate {
  double weights = 0, activations = 0, kv = 0, buffers = 0;  // bytes per rank
  double flops = 0;                                          // per rank, whole run (for progress)
  double total() const { return weights + activations + kv + buffers; }
  MemoryEstimate& operator+=(const MemoryEstimate& o) {
    weights += o.weights;
    activations += o.activations;
    kv += o.kv;
    buffers += o.buffers;
    flops += o.flops;
    return *this;
  }
};

inline std::string bytes_text(double b) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (b >= 1024.0 && u < 6) {
    b /= 1024.0;
    ++u;
  }
  char s[48];
  std::snprintf(s, sizeof s, u == 0 ? "%.0f %s" : "%.1f %s", b, unit[u]);
  return s;
}

// --max-memory, --gpu-memory: bytes, with an optional K, M, G or T suffix (powers of 1024), e.g. 512M.
inline std::uint64_t parse_bytes(const std::string& flag, const std::string& text) {
  std::string digits = text;
  std::uint64_t scale = 1;
  if (!digits.empty()) {
    const char s = digits.back();
    const std::string units = "KMGT";
    if (const auto k = units.find(char(s & ~0x20)); k != std::string::npos) {
      scale = std::uint64_t(1) << (10 * (k + 1));
      digits.pop_back();
    }
  }
  const std::uint64_t max = std::numeric_limits<std::uint64_t>::max() / scale;
  try {
    return parse_int<std::uint64_t>(flag, digits, 1, max) * scale;
  } catch (const CLI::ConversionError&) {
    throw number_error(flag, text, "expected a number of bytes >= 1 with an optional K, M, G or T suffix, e.g. 512M");
  }
}

// The weights one rank holds, in elements, all layers: its attention heads (attn_tp shard), the
// router (whole), its routed experts (moe_ep shard, moe_tp slice of the intermediate) and its
// slice of the shared expert (`shared_here`: the demo layer keeps it on moe_ep rank 0 of each
// replica on paths dp_gather and tp_moe, on every rank on the all-to-all paths).
struct WeightShards {
  double attention = 0, router = 0, experts = 0, shared = 0;
  double total() const { return attention + router + experts + shared; }
};

// `redundant`: extra physical replicas of routed experts (--ep-num-redundant-experts), split over
// moe_ep like the routed ones; the router stays logical.
inline WeightShards weight_shards(const model::ModelDims& d, const Widths& w, bool shared_here = true,
                                  int redundant = 0) {
  const double H = d.hidden, Q = d.q_lora, D = d.head_dim, L = d.layers, E = d.experts;
  const double physical = E + redundant;
  const double HD = double(d.heads) / w.attn_tp * D;
  const double inter = double(d.moe_inter) / w.moe_tp, shared = double(d.shared_inter) / w.moe_tp;
  WeightShards s;
  // norms (2H + Q + D), wq_a, wq_b (heads shard), wkv, wo_b (heads shard)
  s.attention = L * (2 * H + Q + D + Q * H + HD * Q + D * H + H * HD);
  s.router = L * E * H;
  s.experts = L * (physical / w.moe_ep) * 3 * inter * H;  // gate, up, down of each local expert
  s.shared = shared_here ? L * 3 * shared * H : 0.0;
  return s;
}

// The rows one rank works on in one forward: `attention` rows of its DP group (attention, K/V),
// `moe` rows entering its MoE step (the gathered rows on path dp_gather, its chunk on the
// all-to-all paths), `expert` (row, expert) pairs its experts compute; under attention CP
// `kv_gathered` K/V rows all-gathered over attn_cp (its whole DP group's).
struct RankRows {
  double attention = 0, moe = 0, expert = 0, kv_gathered = 0;
};

// One rank of a DistributedModel of dims `d`; `longest` is the longest request; `elem` the bytes
// of one value (the demo layer computes in float), `weight_elem` of one weight (0: elem).
inline MemoryEstimate estimate_rank(const model::ModelDims& d, const Widths& w, const RankRows& r, double longest,
                                    bool shared_here = true, double elem = 4, double weight_elem = 0,
                                    int redundant = 0) {
  if (weight_elem <= 0) weight_elem = elem;
  const double H = d.hidden, Q = d.q_lora, D = d.head_dim, L = d.layers, E = d.experts;
  const double HD = double(d.heads) / w.attn_tp * D;
  const double inter = double(d.moe_inter) / w.moe_tp, shared = double(d.shared_inter) / w.moe_tp;
  const WeightShards ws = weight_shards(d, w, shared_here, redundant);
  MemoryEstimate m;
  m.weights = weight_elem * ws.total();
  // One layer's views at a time (xn, qa, qn, q, o, attention output, residual, input), the bridge's
  // gathered, partial and restored rows (padded: twice the rows), the routed rows' expert work.
  m.activations = elem * r.attention * (5 * H + 2 * Q + 2 * HD) + elem * r.moe * (6 * H + E) +
                  elem * r.expert * (3 * inter + H);
  m.kv = elem * r.attention * 2 * D + elem * r.kv_gathered * 2 * D;  // kv_raw, kv; CP: gathered and reordered
  m.buffers = weight_elem * ws.total() / L + 8 * L * 8 * r.moe;         // weights being packed; owners per boundary
  const double attention = 2.0 * 2.0 * HD * longest * r.attention;  // causal: ~len^2 per request, bounded
  m.flops = 2 * L * (r.attention * (Q * H + HD * Q + D * H + H * HD) + r.moe * E * H + r.expert * 3 * inter * H +
                     (shared_here ? r.moe * 3 * shared * H : 0.0)) +
            L * attention;
  return m;
}

// One DistributedModel of dims `d` over `tokens` rows of the whole domain, longest request
// `longest`, per rank (the largest rank: its shards, and every row when the bridge gathers them).
// Values are fp32; weights fp32 or bf16 (--dtype). bf16 weights are filled in fp32 one tensor at a
// time and converted before packing: one layer's fp32 copy is counted with the packing buffers.
inline MemoryEstimate estimate_model(const model::ModelDims& d, const Widths& w, double tokens, double longest,
                                     int redundant = 0) {
  const double weight_elem = d.weights == model::WeightDtype::bf16 ? 2 : 4;
  MemoryEstimate m = estimate_rank(d, w, {tokens, tokens, tokens * d.topk}, longest, true, 4, weight_elem, redundant);
  m.buffers += (4 - weight_elem) / weight_elem * m.weights / d.layers;
  return m;
}

// Bytes of one dispatched row's message (EpMessage: its top-k ids and fp32 weights, then its values
// as `dtype`: "fp32", "bf16" or "fp8" with an fp32 scale per 128 values).
inline double ep_message_bytes(const model::ModelDims& d, const std::string& dtype) {
  if (dtype == "fp8") return double(EpMessage::of_fp8(d.topk, d.hidden, 4, 4).bytes);
  const std::int64_t value = dtype == "bf16" ? 2 : 4;
  return double(EpMessage::of(d.topk, d.hidden, 4, 4, value, value).bytes);
}

// The low-latency decode dispatch's fixed blocks on one rank (EpBuffer::low_latency_bytes): a send
// and a receive block per moe_ep member, each a 16-byte head and room for `capacity` messages,
// allocated whole whatever a step dispatches; `sets` of them (2 under two-batch overlap: one per
// micro-batch in flight).
inline double low_latency_bytes(const model::ModelDims& d, const Widths& w, double capacity, const std::string& dtype,
                                int sets = 1) {
  return double(sets) * 2.0 * w.moe_ep * (16.0 + capacity * ep_message_bytes(d, dtype));
}

// What two-batch overlap holds beside one batch's buffers, for `tokens` rows: the joined combined
// rows (fp32) and the second micro-batch's messages in flight while the first's are held.
inline double two_batch_overlap_bytes(const model::ModelDims& d, double tokens, const std::string& dtype) {
  return 4.0 * tokens * d.hidden + tokens * d.topk * ep_message_bytes(d, dtype);
}

// Bytes of one value of the demo layer's KV cache (DistributedModel::reserve_kv): 2 when it holds
// bf16 (bf16 weights, model::kv_cache_bf16), else 4.
inline double kv_cache_elem(const model::ModelDims& d) { return model::kv_cache_bf16(d) ? 2.0 : 4.0; }

// --check's single-rank reference: one layer of the whole model in double at a time, and its rows.
inline double reference_bytes(const model::ModelDims& d, double tokens) {
  const double H = d.hidden, Q = d.q_lora, D = d.head_dim, HD = double(d.heads) * d.head_dim, E = d.experts;
  const double layer = Q * H + HD * Q + D * H + H * HD + E * H + E * 3 * d.moe_inter * H + 3.0 * d.shared_inter * H;
  return 8 * (layer + tokens * (8 * H + 2 * Q + 2 * HD + 2 * D + E + double(d.topk) * 3 * d.moe_inter));
}

// The model flags an estimate is made from, as the user would write them.
inline std::string model_flags(const model::ModelDims& d, const char* layers_flag = "--layers") {
  return "--hidden " + std::to_string(d.hidden) + " " + layers_flag + " " + std::to_string(d.layers) + " --heads " +
         std::to_string(d.heads) + " --head-dim " + std::to_string(d.head_dim) + " --q-lora " + std::to_string(d.q_lora) +
         " --experts " + std::to_string(d.experts) + " --topk " + std::to_string(d.topk) + " --moe-inter " +
         std::to_string(d.moe_inter) + " --shared-inter " + std::to_string(d.shared_inter);
}

// The model flags of dsv4_layer and `relayout plan` (one parser for both). The table lets a
// program tell which were given (e.g. over a preset).
struct ModelFlag {
  const char* name;
  int model::ModelDims::*member;
  const char* help;
};
inline constexpr ModelFlag kModelFlags[] = {
    {"--hidden", &model::ModelDims::hidden, "hidden size"},
    {"--heads", &model::ModelDims::heads, "query heads (split over attn_tp)"},
    {"--head-dim", &model::ModelDims::head_dim, "head dimension (also the shared KV width)"},
    {"--q-lora", &model::ModelDims::q_lora, "wq_a output (query low-rank) dimension"},
    {"--experts", &model::ModelDims::experts, "routed experts (split over moe_ep)"},
    {"--topk", &model::ModelDims::topk, "experts per token"},
    {"--moe-inter", &model::ModelDims::moe_inter, "expert intermediate size (split over moe_tp)"},
    {"--shared-inter", &model::ModelDims::shared_inter, "shared expert intermediate size (0: none)"},
    {"--layers", &model::ModelDims::layers, "stacked decoder layers"},
    {"--window", &model::ModelDims::window, "sliding attention window (0: full causal)"},
};

inline void add_model_flags(CLI::App& app, model::ModelDims& d) {
  for (const ModelFlag& f : kModelFlags) add_int(app, f.name, d.*f.member, f.help);
  add_int(app, "--seed", d.seed, "seed of the counter-based weights and inputs");
}

}  // namespace relayout::cli
