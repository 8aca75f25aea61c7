// Shapes of the DeepSeek-V4-like decoder layer (small by default) and the rules that tie them to a
// layout: query heads split over attn_tp, experts over moe_ep, the expert intermediate over moe_tp.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "relayout/kernels/router.hpp"
#include "relayout/mesh/layout.hpp"

namespace relayout::model {

// The element type the layer's weights are stored in (dsv4_layer --dtype): fp32, or bf16 for the
// attention projections and the experts (examples/demo/model/layer_weights.hpp says which).
enum class WeightDtype : std::uint8_t { fp32, bf16 };

struct ModelDims {
  int hidden = 64;
  int heads = 8;
  int head_dim = 16;
  int q_lora = 32;        // wq_a output (the query low-rank dimension), normalised by q_norm
  int experts = 8;
  int topk = 2;
  int moe_inter = 32;     // routed expert intermediate dimension
  int shared_inter = 32;  // shared expert intermediate dimension; 0: no shared expert
  int layers = 2;
  int window = 0;         // sliding attention window in keys; 0: full causal
  double rms_eps = 1e-6;
  kernels::Scoring scoring = kernels::Scoring::softmax;
  double routed_scaling = 1.0;
  std::uint64_t seed = 1234;
  // The skewed router's Zipf exponent (demo/model/router.hpp): 0 routes by the gate's top-k.
  double expert_skew = 0;
  WeightDtype weights = WeightDtype::fp32;

  kernels::RouterConfig router() const {
    kernels::RouterConfig c;
    c.top_k = topk;
    c.scoring = scoring;
    c.renormalize = true;
    c.routed_scaling_factor = routed_scaling;
    return c;
  }
};

// The element type of the layer's KV cache (DistributedModel::reserve_kv): bf16 with bf16 weights
// (kernels::PagedKvCache<bf16>: fp32 kv rows rounded to nearest even as they are cached, widened
// to fp32 as decode reads them), else fp32. The prefill attends its fp32 kv rows; decode and
// extend rows attend the cache.
inline bool kv_cache_bf16(const ModelDims& d) { return d.weights == WeightDtype::bf16; }
inline const char* kv_cache_dtype(const ModelDims& d) { return kv_cache_bf16(d) ? "bf16" : "fp32"; }

namespace impl {
inline void require_dim(bool ok, const char* flag, const std::string& rule) {
  if (!ok) throw LayoutError(flag, std::string(flag) + ": " + rule);
}
}  // namespace impl

// Throws LayoutError naming the flag and the rule when the dims do not fit the layout.
inline void validate(const ModelDims& d, const Widths& w) {
  using impl::require_dim;
  const auto s = [](std::int64_t v) { return std::to_string(v); };
  require_dim(d.hidden >= 1, "--hidden", "must be >= 1, got " + s(d.hidden));
  require_dim(d.heads >= 1, "--heads", "must be >= 1, got " + s(d.heads));
  require_dim(d.head_dim >= 1, "--head-dim", "must be >= 1, got " + s(d.head_dim));
  require_dim(d.q_lora >= 1, "--q-lora", "must be >= 1, got " + s(d.q_lora));
  require_dim(d.experts >= 1, "--experts", "must be >= 1, got " + s(d.experts));
  require_dim(d.topk >= 1 && d.topk <= d.experts, "--topk",
              "must be in [1, experts = " + s(d.experts) + "], got " + s(d.topk));
  require_dim(d.moe_inter >= 1, "--moe-inter", "must be >= 1, got " + s(d.moe_inter));
  require_dim(d.shared_inter >= 0, "--shared-inter", "must be >= 0, got " + s(d.shared_inter));
  require_dim(d.layers >= 1, "--layers", "must be >= 1, got " + s(d.layers));
  require_dim(d.window >= 0, "--window", "must be >= 0, got " + s(d.window));
  require_dim(std::isfinite(d.expert_skew) && d.expert_skew >= 0, "--expert-skew",
              "the Zipf exponent must be finite and >= 0, got " + std::to_string(d.expert_skew));
  require_dim(d.expert_skew == 0 || d.topk < d.experts, "--expert-skew",
              "a skew needs --topk < --experts: with topk = experts = " + s(d.experts) +
                  " every token goes to every expert, whatever the skew");
  require_dim(d.heads % w.attn_tp == 0, "--heads",
              "wq_b is column-parallel over attn_tp: heads = " + s(d.heads) +
                  " must be a multiple of attn_tp = " + s(w.attn_tp));
  require_dim(d.experts % w.moe_ep == 0, "--experts",
              "experts = " + s(d.experts) + " must be a multiple of moe_ep = " + s(w.moe_ep));
  require_dim(d.moe_inter % w.moe_tp == 0, "--moe-inter",
              "the expert intermediate is sharded over moe_tp: moe_inter = " + s(d.moe_inter) +
                  " must be a multiple of moe_tp = " + s(w.moe_tp));
  require_dim(d.shared_inter % w.moe_tp == 0, "--shared-inter",
              "shared_inter = " + s(d.shared_inter) + " must be a multiple of moe_tp = " + s(w.moe_tp));
}

}  // namespace relayout::model
