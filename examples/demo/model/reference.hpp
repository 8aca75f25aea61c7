// The single-rank reference: the same DeepSeek-V4-like layers with no parallelism at all, written
// plainly on relayout::reference kernels (plain loops, double accumulation). The distributed layer
// is checked row by row against it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "relayout/kernels/reference.hpp"
#include "demo/model/layer_weights.hpp"
#include "demo/model/workload.hpp"

namespace relayout::model {

struct ReferenceRows {
  reference::Matrix rows;             // one row per token, requests in request order
  std::vector<std::int64_t> owners;   // owner of each row
};

inline reference::Matrix input_rows(const ModelDims& d, const std::vector<std::int64_t>& owners) {
  reference::Matrix x(int(owners.size()), d.hidden);
  for (int i = 0; i < x.rows; ++i)
    for (int f = 0; f < d.hidden; ++f) x(i, f) = input_value(d.seed, owners[std::size_t(i)], f, d.hidden);
  return x;
}

// One decoder layer on every row: attention (per request, causal), residual, MoE, residual.
inline reference::Matrix reference_layer(const ModelDims& d, const LayerFull& w, const reference::Matrix& x,
                                         const std::vector<int>& cu) {
  namespace ref = relayout::reference;
  const ref::Matrix xn = ref::rms_norm(x, w.attn_norm, d.rms_eps);
  const ref::Matrix q = ref::linear(ref::rms_norm(ref::linear(xn, w.wq_a), w.q_norm, d.rms_eps), w.wq_b);
  const ref::Matrix kv = ref::rms_norm(ref::linear(xn, w.wkv), w.kv_norm, d.rms_eps);
  const ref::Matrix o = ref::attention_prefill(q, kv, cu, d.head_dim,
                                               kernels::default_softmax_scale(d.head_dim), d.window);
  const ref::AddRmsNormResult h = ref::add_rms_norm(ref::linear(o, w.wo_b), x, w.ffn_norm, d.rms_eps);
  const ref::Routing routing = ref::route(ref::linear(h.out, w.router), d.router());
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
  for (int layer = 0; layer < d.layers; ++layer)
    r.rows = reference_layer(d, LayerFull::make(d, layer), r.rows, cu);
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
  for (int i = 0, row = 0; i < work.requests(); ++i) {
    std::vector<std::int64_t> owners;
    for (int p = 0; p < work.lengths[std::size_t(i)]; ++p) owners.push_back(RowOwner::pack(i, p));
    seq.push_back(input_rows(d, owners));
    row += work.lengths[std::size_t(i)];
    last.emplace_back(prefill.rows.row(row - 1), prefill.rows.row(row - 1) + d.hidden);
  }
  std::vector<ReferenceRows> steps;
  for (int s = 1; s <= plan.steps; ++s) {
    ReferenceRows out;
    std::vector<int> live, cu{0};
    for (int i = 0; i < work.requests(); ++i) {
      if (!plan.live(i, s)) continue;
      reference::Matrix& m = seq[std::size_t(i)];
      m.data.resize(m.data.size() + std::size_t(d.hidden));
      next_input(last[std::size_t(i)].data(), &m.data[std::size_t(m.rows) * d.hidden], d.hidden);
      ++m.rows;
      live.push_back(i);
      cu.push_back(cu.back() + m.rows);
      out.owners.push_back(RowOwner::pack(i, work.lengths[std::size_t(i)] + s - 1));
    }
    reference::Matrix x(cu.back(), d.hidden);
    for (std::size_t j = 0; j < live.size(); ++j)
      std::copy(seq[std::size_t(live[j])].data.begin(), seq[std::size_t(live[j])].data.end(),
                x.data.begin() + std::ptrdiff_t(std::size_t(cu[j]) * d.hidden));
    for (int layer = 0; layer < d.layers; ++layer) x = reference_layer(d, LayerFull::make(d, layer), x, cu);
    out.rows = reference::Matrix(int(live.size()), d.hidden);
    for (std::size_t j = 0; j < live.size(); ++j) {
      const double* r = x.row(cu[j + 1] - 1);
      std::copy(r, r + d.hidden, &out.rows(int(j), 0));
      last[std::size_t(live[j])].assign(r, r + d.hidden);
    }
    steps.push_back(std::move(out));
  }
  return steps;
}

}  // namespace relayout::model
