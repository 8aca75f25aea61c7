// The single-rank reference: the same DeepSeek-V4-like layers with no parallelism at all, written
// plainly on relayout::reference kernels (plain loops, double accumulation). The distributed layer
// is checked row by row against it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <vector>

#include "relayout/kernels/reference.hpp"
#include "demo/model/layer_weights.hpp"
#include "demo/model/router.hpp"
#include "demo_model/workload.hpp"

namespace relayout::model {

struct ReferenceRows {
  reference::Matrix rows;             // one row per token, requests in request order
  std::vector<std::int64_t> owners;   // owner of each row
  // Per row, the smallest router margin its value depends on (router_exposure): the check compares
  // rows whose margin is within the rounding error apart, as a choice of experts may differ there.
  std::vector<double> router_margin;
};

// A router's choice is decided by the gap between the k-th and (k+1)-th logits of a row (the demo
// scores with softmax or sigmoid, both monotone, no bias, no groups); a row whose gap is below the
// error of its logits may pick another expert than the reference, and its output then differs by
// the difference of two experts (of order 1), outside every rounding bound. Per row, that gap
// (+inf with top_k = experts: nothing to choose).
inline std::vector<double> topk_margins(const reference::Matrix& logits, int top_k) {
  std::vector<double> m(std::size_t(logits.rows), std::numeric_limits<double>::infinity());
  if (top_k >= logits.cols) return m;
  std::vector<double> v(std::size_t(logits.cols));
  for (int t = 0; t < logits.rows; ++t) {
    std::copy(logits.row(t), logits.row(t) + logits.cols, v.begin());
    std::sort(v.begin(), v.end(), std::greater<>());
    m[std::size_t(t)] = v[std::size_t(top_k) - 1] - v[std::size_t(top_k)];
  }
  return m;
}

// After a layer: `exposure` (per row, the smallest margin of the row's own choices so far) takes
// min with this layer's margins. A row that chose otherwise carries that into its own later layers
// (and, in decode, into the request's next steps: reference_decode chains them). Its effect on the
// request's later rows through attention is one value row among the keys they average, scaled by
// its attention weight: those rows stay held to the tolerance, and a check can fail there.
inline void router_exposure(std::vector<double>& exposure, const std::vector<double>& own) {
  for (std::size_t i = 0; i < exposure.size(); ++i) exposure[i] = std::min(exposure[i], own[i]);
}

// The --check tolerance of the distributed layer against this reference (which reads the weights
// as generated, fp32 values in double). fp32 weights: 1e-4 (fp32 sums over K products err by about
// sqrt(K) 2^-24 of sum |w x|, far below). bf16 weights (ModelDims::weights): each weight is rounded
// to nearest even with 8 significant bits, w^ = w (1 + d), |d| <= u = 2^-8 (half an ulp, 2^-7 at
// 1), and a value uniform within its ulp has d of mean 0 and spread sigma_d <= u / sqrt(3). One
// output of a K-length dot product y = sum_k w_k x_k, accumulated in fp32, errs by
//   dy = sum_k d_k w_k x_k  (+ the fp32 sum's own <= K 2^-24 sum |w_k x_k|, 2^-15 of it at K = 512),
// at worst u sum |w_k x_k| (about u sqrt(K) |y| for products of random sign: 0.09 |y| at K = 512, no
// use), and for independent roundings a sum of K zero-mean terms of spread
//   sigma(dy) = sigma_d sqrt(sum_k w_k^2 x_k^2) <= (u / sqrt(3)) sqrt(sum_k w_k^2 x_k^2).
// The demo's weights are uniform in +-1/sqrt(K) (init_scale) and its rows have rms r <= 1 (inputs
// in [-1, 1), rms-normalised projections), so sum_k w_k^2 x_k^2 ~ r^2 / 3 and sigma(dy) <= u / 3
// for any K: the error does not grow with K, the fp32 sum's does (negligible here).
// The rows entering each bf16 GEMM are rounded to bf16 as well (bf16 activations,
// PackedWeights::round_rows): x^ = x (1 + e) with e like d, an error sum_k e_k w_k x_k of the same
// spread <= u / 3, independent of the weights' one: each GEMM adds two.
// A layer output collects the errors of every bf16 GEMM on its path, G of them: wq_a, wq_b, wkv,
// wo_b, the experts' w13 and w2, the shared expert's w13 and w2 (G = 8; 6 without one); rms_norm
// and the softmax pass relative errors on with gain <= 1, the combine's weights sum to
// routed_scaling.
// The activations between the kernels are bf16 as well (the residual stream between layers stays
// fp32): each stored activation a^ = a (1 + e), an error of spread <= (u / sqrt(3)) |a| per value,
// 3 (u / 3)^2 in variance for values of rms <= 1. Besides the GEMM inputs above, a layer rounds R
// of them: the outputs of wq_a, wkv and kv_norm (the attended kv), wq_b (q), wo_b, the experts'
// gate/up sums, their outputs and the weighted combine (8), the shared expert's gate/up sums and
// its sum into the MoE output (2 more), and the sums over ranks: each bf16 sum of partials over a
// group of P ranks (the attention all-reduce, the MoE's reduction or the EP combine) rounds at most
// P - 1 partial sums, two such per layer, so 2 (ranks - 1) with ranks the TP domain's size.
// Over L layers the 2 G L + 3 R L variances add: sigma(out) <= (u / 3) sqrt((2 G + 3 R) L).
// --check takes the largest error over N <= 2^20 outputs; z = 6 spreads (a normal tail of 2e-9
// per output) covers that maximum, so
//   tol(bf16) = 6 (u / 3) sqrt((2 G + 3 R) L) + 1e-4 = 2^-7 sqrt((2 G + 3 R) L) + 1e-4,
// 0.0750 for the default demo on one rank (G 8, R 10, L 2), 0.0798 on two. Decode step s reads
// next_input of step s - 1's output (rms-normalised, gain <= 1) and the cached kv of the prompt, so
// its rows hold (s + 1) times those errors: the decode check of S steps takes tol sqrt(1 + S).
// Outside every rounding bound: a row whose k-th and (k+1)-th router scores lie closer than its
// router input's error may pick another expert than the reference (the gate stays fp32, its input
// does not); its error is then that of a different expert, of order 1, and carries on into the
// request's later decode steps.
inline constexpr const char* kCheckToleranceRule =
    "bf16 weights and the rows entering their GEMMs round by up to 2^-8 relative; each rounding adds a dot-product "
    "error of spread <= 2^-8 / 3 for rows of rms 1, a layer has G = 8 such GEMMs (6 without a shared expert); its "
    "other bf16 activations (R = 10, 8 without a shared expert, plus 2 (ranks - 1) sums over ranks) add spread "
    "2^-8 / sqrt(3) each, so the bound is 2^-7 sqrt((2 G + 3 R) layers) + 1e-4";

// The prefill's tolerance for the weights of `d` (and with them the activations), on a TP domain of
// `ranks` ranks.
inline double check_tolerance(const ModelDims& d, int ranks = 1) {
  if (d.weights == WeightDtype::fp32) return 1e-4;
  const bool shared = d.shared_inter > 0;
  const int gemms = shared ? 8 : 6, roundings = (shared ? 10 : 8) + 2 * (std::max(ranks, 1) - 1);
  return std::ldexp(1.0, -7) * std::sqrt(double(2 * gemms + 3 * roundings) * d.layers) + 1e-4;
}

// Rows dispatched as fp8 (e4m3, one fp32 scale per 128 values): each value comes back within
// 2^-4 of itself (3 mantissa bits: half a step of 2^(E-3) in the binade [2^E, 2^(E+1))), and a
// block's values within amax / 28, 16 times the 2^-8 of bf16 rows. The dispatched rows are the MoE
// input, rms-normalised (rms <= 1), rounded once per layer; the experts and the combine (weights
// summing to routed_scaling) pass that error on to the layer output with gain <= 1, and the layers'
// errors, independent, add in quadrature:
//   tol(fp8 dispatch) = 2^-4 sqrt(layers) (+ the weights' tolerance, 1e-4 for fp32 weights),
// 0.0885 for the default demo (2 layers). Measured (np 2, a2a_split): 0.010 at 1 layer, 0.015 and
// 0.020 at 2 (small and default dims), 0.030 at 4, 0.064 at 6: 2.4 to 6 times under the bound. As
// for bf16 weights, decode step s reads next_input of step s - 1's output, so the decode check
// takes tol sqrt(1 + S). Outside the bound: a row whose router scores tie within its error (see
// above), where an expert of the next layer differs from the reference's.
inline constexpr const char* kFp8DispatchToleranceRule =
    "fp8 (e4m3) dispatched rows come back within 2^-4 of each value, 16x bf16's 2^-8; the MoE input (rms <= 1) is "
    "rounded once per layer and passed on with gain <= 1, so the bound is 2^-4 sqrt(layers) + the weights' tolerance";
inline double fp8_dispatch_tolerance(const ModelDims& d) { return std::ldexp(1.0, -4) * std::sqrt(double(d.layers)); }
// The prefill's tolerance for the weights of `d` and rows dispatched as fp8 (fp8_dispatch) or not.
inline double check_tolerance(const ModelDims& d, bool fp8_dispatch, int ranks = 1) {
  return check_tolerance(d, ranks) + (fp8_dispatch ? fp8_dispatch_tolerance(d) : 0.0);
}
// The router margin below which a checked row counts as near a tie (ReferenceRows::router_margin):
// a row's router input errs by at most the check's tolerance `tol` per element (6 spreads of its
// error, see above), a logit is its dot product with a gate row of norm <= 1/sqrt(3) (uniform in
// +-1/sqrt(hidden)), so each logit errs with spread <= (tol / 6) / sqrt(3), the gap of two by
// sqrt(2) times that, and 6 spreads of the gap are sqrt(2/3) tol. Rows within it may choose
// otherwise than the reference. fp32 weights and rows err by about 2^-24: no row is set apart.
inline double router_tie_margin(const ModelDims& d, double tol, bool fp8_dispatch) {
  return d.weights == WeightDtype::fp32 && !fp8_dispatch ? 0.0 : std::sqrt(2.0 / 3.0) * tol;
}

// The bf16 KV cache (kv_cache_bf16: with bf16 weights). Decode and extend rows attend the cached
// kv rows rounded to bf16, k^ = k (1 + e), e like d above (|e| <= u = 2^-8, spread <= u / sqrt(3));
// the prefill attends its fp32 rows, so only decode rows see it. K = V, and both q and the cached
// rows are fp32 values from rms-normalised rows: a kv row has rms about 1 (kv_norm, weights
// 1 +- 0.25: rms 1.01), a query head rms r_q <= 1/sqrt(3) (wq_b's output on rows of rms 1, weights
// uniform in +-1/sqrt(q_lora)).
//   scores: s_j = scale q.k_j, scale = 1/sqrt(D), moves by ds_j = scale sum_d q_d k_jd e_jd, of
//     spread (u / sqrt(3)) scale sqrt(sum_d q_d^2 k_jd^2) ~ (u / sqrt(3)) r_q <= u / 3;
//   out: o = sum_j p_j v_j moves by sum_j p_j v_j e_j (values) + sum_j p_j (ds_j - sum_i p_i ds_i)
//     (v_j - o) (softmax weights). Per element the first has spread (u / sqrt(3)) sqrt(sum_j p_j^2
//     v_jd^2) and the second (u / 3) sqrt(sum_j p_j^2 (v_jd - o_d)^2); p_j <= 1 bounds each sum by
//     the p-weighted mean of v_jd^2, of mean 1 over d: spreads u / sqrt(3) and u / 3, together
//     u sqrt(1/3 + 1/9) = 2u / 3, for an o of rms <= 1;
//   wo_b (weights uniform in +-1/sqrt(K)) passes a per-element error of spread sigma on with
//     sigma / sqrt(3): sigma_kv = 2u / (3 sqrt(3)) = (2 / sqrt(3)) (u / 3).
// One such error per layer and decode step, independent of the GEMMs' (rounding of other values),
// of variance (4/3) (u/3)^2 against the (u/3)^2 of one GEMM rounding above. Step s of a decode
// holds (s + 1) 2 G L GEMM errors and s (4/3) L cache errors, at most (s + 1) (2 G L + (4/3) L):
//   tol(decode S) = sqrt(1 + S) 2^-7 sqrt(2 G L + 4 L / 3) + 1e-4
//                <= sqrt(1 + S) (tol(bf16) + 2^-7 sqrt(4 L / 3)),
// the bound --check takes (the sum bounds the quadrature and keeps a --tolerance given by the user
// as its first term). 2^-7 sqrt(4 L / 3): 0.0128 for two layers, 0.0090 for one.
inline constexpr const char* kKvCacheToleranceRule =
    "the bf16 KV cache rounds each cached kv value by up to 2^-8 relative; through the scores and the values of "
    "one decode attention that adds, after wo_b, an error of spread <= (2/sqrt(3)) 2^-8 / 3 per layer and step, so "
    "the decode bound is sqrt(1 + steps) (tolerance + 2^-7 sqrt(4 layers / 3))";
inline double kv_cache_tolerance(const ModelDims& d) {
  return kv_cache_bf16(d) ? std::ldexp(1.0, -7) * std::sqrt(4.0 * d.layers / 3.0) : 0.0;
}

// The decode check of `decode_steps` steps: the prefill's `tolerance` (and with a bf16 cache
// kv_cache_tolerance) grown by sqrt(1 + steps) for rounded weights, rows or cache.
inline double decode_check_tolerance(const ModelDims& d, double tolerance, int decode_steps, bool fp8_dispatch = false) {
  return d.weights == WeightDtype::fp32 && !fp8_dispatch
             ? tolerance
             : (tolerance + kv_cache_tolerance(d)) * std::sqrt(1.0 + decode_steps);
}

inline reference::Matrix input_rows(const ModelDims& d, const std::vector<std::int64_t>& owners) {
  reference::Matrix x(int(owners.size()), d.hidden);
  for (int i = 0; i < x.rows; ++i)
    for (int f = 0; f < d.hidden; ++f) x(i, f) = input_value(d.seed, owners[std::size_t(i)], f, d.hidden);
  return x;
}

// One decoder layer on every row: attention (per request, causal), residual, MoE, residual. The
// skewed router (ModelDims::expert_skew > 0) needs the rows' owners.
// `exposure` (per row of x, or null): updated by router_exposure.
inline reference::Matrix reference_layer(const ModelDims& d, const LayerFull& w, const reference::Matrix& x,
                                         const std::vector<int>& cu, std::span<const std::int64_t> owners = {},
                                         std::vector<double>* exposure = nullptr) {
  namespace ref = relayout::reference;
  const ref::Matrix xn = ref::rms_norm(x, w.attn_norm, d.rms_eps);
  const ref::Matrix q = ref::linear(ref::rms_norm(ref::linear(xn, w.wq_a), w.q_norm, d.rms_eps), w.wq_b);
  const ref::Matrix kv = ref::rms_norm(ref::linear(xn, w.wkv), w.kv_norm, d.rms_eps);
  const ref::Matrix o = ref::attention_prefill(q, kv, cu, d.head_dim,
                                               kernels::default_softmax_scale(d.head_dim), d.window);
  const ref::AddRmsNormResult h = ref::add_rms_norm(ref::linear(o, w.wo_b), x, w.ffn_norm, d.rms_eps);
  ref::Matrix logits = ref::linear(h.out, w.router);
  if (d.expert_skew > 0) logits = skewed_logits(d, std::move(logits), owners);
  if (exposure) router_exposure(*exposure, topk_margins(logits, d.topk));
  const ref::Routing routing = ref::route(logits, d.router());
  ref::Matrix y = ref::moe(h.out, routing.ids, routing.weights, w.w1, w.w3, w.w2);
  if (d.shared_inter > 0) {
    const ref::Matrix s = ref::swiglu_ffn(h.out, w.shared_w1, w.shared_w3, w.shared_w2);
    for (std::size_t i = 0; i < y.data.size(); ++i) y.data[i] += s.data[i];
  }
  ref::Matrix out = h.residual;
  for (std::size_t i = 0; i < out.data.size(); ++i) out.data[i] += y.data[i];
  return out;
}

inline ReferenceRows reference_forward(const ModelDims& d, const Workload& work) {
  ReferenceRows r;
  std::vector<int> cu{0};
  for (int i = 0; i < work.requests(); ++i) {
    for (int p = 0; p < work.lengths[std::size_t(i)]; ++p) r.owners.push_back(RowOwner::pack(i, p));
    cu.push_back(cu.back() + work.lengths[std::size_t(i)]);
  }
  r.rows = input_rows(d, r.owners);
  r.router_margin.assign(r.owners.size(), std::numeric_limits<double>::infinity());
  for (int layer = 0; layer < d.layers; ++layer)
    r.rows = reference_layer(d, LayerFull::make(d, layer), r.rows, cu, r.owners, &r.router_margin);
  return r;
}

// Decode steps recomputed without a cache: at step s every live request's whole sequence (its
// prompt rows, then the inputs of steps 1..s, each next_input of the previous step's output) goes
// through every layer again, and its last row is the step's output. steps[s - 1] holds the rows of
// the requests live at step s, in request order.
inline std::vector<ReferenceRows> reference_decode(const ModelDims& d, const Workload& work, const DecodePlan& plan) {
  const ReferenceRows prefill = reference_forward(d, work);
  std::vector<reference::Matrix> seq;      // each request's input rows so far
  std::vector<std::vector<double>> last;   // each request's latest output row
  std::vector<double> chain;               // the smallest router margin of that row's inputs so far
  for (int i = 0, row = 0; i < work.requests(); ++i) {
    std::vector<std::int64_t> owners;
    for (int p = 0; p < work.lengths[std::size_t(i)]; ++p) owners.push_back(RowOwner::pack(i, p));
    seq.push_back(input_rows(d, owners));
    row += work.lengths[std::size_t(i)];
    last.emplace_back(prefill.rows.row(row - 1), prefill.rows.row(row - 1) + d.hidden);
    chain.push_back(prefill.router_margin[std::size_t(row - 1)]);
  }
  std::vector<ReferenceRows> steps;
  for (int s = 1; s <= plan.steps; ++s) {
    ReferenceRows out;
    std::vector<int> live, cu{0};
    std::vector<std::int64_t> owners;  // of every row of x: each live request's positions 0, 1, ...
    for (int i = 0; i < work.requests(); ++i) {
      if (!plan.live(i, s)) continue;
      reference::Matrix& m = seq[std::size_t(i)];
      m.data.resize(m.data.size() + std::size_t(d.hidden));
      next_input(last[std::size_t(i)].data(), &m.data[std::size_t(m.rows) * d.hidden], d.hidden);
      ++m.rows;
      live.push_back(i);
      cu.push_back(cu.back() + m.rows);
      for (int p = 0; p < m.rows; ++p) owners.push_back(RowOwner::pack(i, p));
      out.owners.push_back(RowOwner::pack(i, work.lengths[std::size_t(i)] + s - 1));
    }
    reference::Matrix x(cu.back(), d.hidden);
    for (std::size_t j = 0; j < live.size(); ++j)
      std::copy(seq[std::size_t(live[j])].data.begin(), seq[std::size_t(live[j])].data.end(),
                x.data.begin() + std::ptrdiff_t(std::size_t(cu[j]) * d.hidden));
    std::vector<double> exposure(std::size_t(x.rows), std::numeric_limits<double>::infinity());
    for (int layer = 0; layer < d.layers; ++layer)
      x = reference_layer(d, LayerFull::make(d, layer), x, cu, owners, &exposure);
    out.rows = reference::Matrix(int(live.size()), d.hidden);
    for (std::size_t j = 0; j < live.size(); ++j) {
      double& c = chain[std::size_t(live[j])];  // this step's input is the previous step's output
      c = std::min(c, exposure[std::size_t(cu[j + 1] - 1)]);
      out.router_margin.push_back(c);
      const double* r = x.row(cu[j + 1] - 1);
      std::copy(r, r + d.hidden, &out.rows(int(j), 0));
      last[std::size_t(live[j])].assign(r, r + d.hidden);
    }
    steps.push_back(std::move(out));
  }
  return steps;
}

}  // namespace relayout::model
