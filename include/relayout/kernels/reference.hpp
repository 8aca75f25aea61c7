// Single-rank reference of every kernel: plain loops, double accumulation, host memory, written
// for clarity and independent of the optimized kernels' algorithms (full sorts instead of repeated
// arg-max, two-pass softmax instead of online softmax, a per-token loop instead of buckets).
// The tests compare against it; a model-level single-rank reference can be built from it.
#pragma once

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "relayout/kernels/router.hpp"

namespace relayout::reference {

// A row-major host matrix of doubles (rows x cols).
struct Matrix {
  int rows = 0;
  int cols = 0;
  std::vector<double> data;

  Matrix() = default;
  Matrix(int r, int c, double fill = 0.0) : rows(r), cols(c), data(std::size_t(r) * c, fill) {}
  double& operator()(int r, int c) { return data[std::size_t(r) * cols + c]; }
  double operator()(int r, int c) const { return data[std::size_t(r) * cols + c]; }
  const double* row(int r) const { return data.data() + std::size_t(r) * cols; }
};

// Copies a rank-2 view (any memory space, any layout) into a Matrix.
template <class V>
Matrix to_matrix(const V& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  Matrix m(int(v.extent(0)), int(v.extent(1)));
  for (int i = 0; i < m.rows; ++i)
    for (int j = 0; j < m.cols; ++j) m(i, j) = double(h(i, j));
  return m;
}
template <class V>
std::vector<double> to_vector(const V& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  std::vector<double> out(v.extent(0));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = double(h(i));
  return out;
}

// y = x . W^T + bias (bias empty: none).
inline Matrix linear(const Matrix& x, const Matrix& w, const std::vector<double>& bias = {}) {
  Matrix y(x.rows, w.rows);
  for (int i = 0; i < x.rows; ++i)
    for (int o = 0; o < w.rows; ++o) {
      double s = bias.empty() ? 0.0 : bias[o];
      for (int k = 0; k < x.cols; ++k) s += x(i, k) * w(o, k);
      y(i, o) = s;
    }
  return y;
}

inline Matrix rms_norm(const Matrix& x, const std::vector<double>& weight, double eps) {
  Matrix y(x.rows, x.cols);
  for (int i = 0; i < x.rows; ++i) {
    double ss = 0;
    for (int j = 0; j < x.cols; ++j) ss += x(i, j) * x(i, j);
    const double inv = 1.0 / std::sqrt(ss / x.cols + eps);
    for (int j = 0; j < x.cols; ++j) y(i, j) = x(i, j) * inv * weight[j];
  }
  return y;
}

struct AddRmsNormResult {
  Matrix out;       // rms_norm(residual + x) * weight
  Matrix residual;  // residual + x
};
inline AddRmsNormResult add_rms_norm(const Matrix& x, const Matrix& residual,
                                     const std::vector<double>& weight, double eps) {
  AddRmsNormResult r;
  r.residual = residual;
  for (std::size_t i = 0; i < r.residual.data.size(); ++i) r.residual.data[i] += x.data[i];
  r.out = rms_norm(r.residual, weight, eps);
  return r;
}

// One query row (heads x head_dim) against keys [begin, end) of kv (K = V), two-pass softmax.
inline void attend(const double* q, int heads, int head_dim, const Matrix& kv, int begin, int end,
                   double scale, double* out) {
  std::vector<double> s(std::size_t(end - begin));
  for (int h = 0; h < heads; ++h) {
    const double* qh = q + std::size_t(h) * head_dim;
    double mx = -INFINITY;
    for (int j = begin; j < end; ++j) {
      double d = 0;
      for (int c = 0; c < head_dim; ++c) d += qh[c] * kv(j, c);
      s[j - begin] = d * scale;
      mx = std::max(mx, s[j - begin]);
    }
    double sum = 0;
    for (double& v : s) sum += (v = std::exp(v - mx));
    for (int c = 0; c < head_dim; ++c) {
      double o = 0;
      for (int j = begin; j < end; ++j) o += s[j - begin] * kv(j, c);
      out[std::size_t(h) * head_dim + c] = o / sum;
    }
  }
}

// Causal prefill: request b owns rows [cu[b], cu[b+1]) of q (heads*head_dim wide) and kv
// (head_dim wide); position p attends keys max(0, p - window + 1) .. p (window 0: no limit).
inline Matrix attention_prefill(const Matrix& q, const Matrix& kv, const std::vector<int>& cu,
                                int head_dim, double scale, int window = 0) {
  Matrix out(q.rows, q.cols);
  const int heads = q.cols / head_dim;
  for (std::size_t b = 0; b + 1 < cu.size(); ++b)
    for (int t = cu[b]; t < cu[b + 1]; ++t) {
      const int begin = window > 0 ? std::max(cu[b], t - window + 1) : cu[b];
      attend(q.row(t), heads, head_dim, kv, begin, t + 1, scale, &out(t, 0));
    }
  return out;
}

// Decode: query row b attends the last min(window, L) of its cache rows [cu[b], cu[b+1]) (the new
// token's kv already appended).
inline Matrix attention_decode(const Matrix& q, const Matrix& kv_cache, const std::vector<int>& cu,
                               int head_dim, double scale, int window = 0) {
  Matrix out(q.rows, q.cols);
  const int heads = q.cols / head_dim;
  for (int b = 0; b < q.rows; ++b) {
    const int begin = window > 0 ? std::max(cu[b], cu[b + 1] - window) : cu[b];
    attend(q.row(b), heads, head_dim, kv_cache, begin, cu[b + 1], scale, &out(b, 0));
  }
  return out;
}

struct Routing {
  std::vector<int> ids;  // tokens x top_k, row-major
  Matrix weights;        // tokens x top_k
};

inline Routing route(const Matrix& logits, const kernels::RouterConfig& c,
                     const std::vector<double>& bias = {}) {
  const int tokens = logits.rows, experts = logits.cols;
  Routing r{std::vector<int>(std::size_t(tokens) * c.top_k), Matrix(tokens, c.top_k)};
  const auto before = [](const std::pair<double, int>& a, const std::pair<double, int>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  for (int t = 0; t < tokens; ++t) {
    std::vector<double> score(experts), choice(experts);
    double mx = -INFINITY, sum = 0;
    for (int e = 0; e < experts; ++e) mx = std::max(mx, logits(t, e));
    for (int e = 0; e < experts; ++e) sum += std::exp(logits(t, e) - mx);
    for (int e = 0; e < experts; ++e) {
      score[e] = c.scoring == kernels::Scoring::sigmoid ? 1.0 / (1.0 + std::exp(-logits(t, e)))
                                                        : std::exp(logits(t, e) - mx) / sum;
      choice[e] = score[e] + (bias.empty() ? 0.0 : bias[e]);
    }
    std::vector<bool> eligible(experts, true);
    if (c.n_group > 1) {
      const int per = experts / c.n_group;
      std::vector<std::pair<double, int>> groups;
      for (int g = 0; g < c.n_group; ++g) {
        std::vector<double> v(choice.begin() + g * per, choice.begin() + (g + 1) * per);
        std::sort(v.rbegin(), v.rend());
        groups.push_back({(!bias.empty() && per >= 2) ? v[0] + v[1] : v[0], g});
      }
      std::sort(groups.begin(), groups.end(), before);
      std::fill(eligible.begin(), eligible.end(), false);
      for (int i = 0; i < c.topk_group; ++i)
        for (int e = groups[i].second * per; e < (groups[i].second + 1) * per; ++e) eligible[e] = true;
    }
    std::vector<std::pair<double, int>> ranked;
    for (int e = 0; e < experts; ++e)
      if (eligible[e]) ranked.push_back({choice[e], e});
    std::sort(ranked.begin(), ranked.end(), before);
    double total = 0;
    for (int j = 0; j < c.top_k; ++j) total += score[ranked[j].second];
    for (int j = 0; j < c.top_k; ++j) {
      const int e = ranked[j].second;
      r.ids[std::size_t(t) * c.top_k + j] = e;
      r.weights(t, j) = score[e] * (c.renormalize ? c.routed_scaling_factor / total
                                                  : c.routed_scaling_factor);
    }
  }
  return r;
}

// Stable counting sort of the (token, j) slots by local expert id - first_expert; ids outside
// [first_expert, first_expert + n_experts) are not handled here (slot_of = -1).
struct Buckets {
  std::vector<int> counts, offsets, slot_token, slot_of;
};
inline Buckets bucket(const std::vector<int>& ids, int top_k, int n_experts, int first_expert = 0) {
  Buckets b;
  b.counts.assign(n_experts, 0);
  b.slot_of.assign(ids.size(), -1);
  for (int id : ids)
    if (id >= first_expert && id < first_expert + n_experts) ++b.counts[id - first_expert];
  b.offsets.assign(n_experts + 1, 0);
  std::partial_sum(b.counts.begin(), b.counts.end(), b.offsets.begin() + 1);
  b.slot_token.assign(b.offsets.back(), -1);
  std::vector<int> next(b.offsets.begin(), b.offsets.end() - 1);
  for (std::size_t s = 0; s < ids.size(); ++s) {
    const int e = ids[s] - first_expert;
    if (e < 0 || e >= n_experts) continue;
    b.slot_of[s] = next[e]++;
    b.slot_token[b.slot_of[s]] = int(s / top_k);
  }
  return b;
}

inline double silu(double g) { return g / (1.0 + std::exp(-g)); }

// SwiGLU FFN of one expert: (silu(x . w1^T) * (x . w3^T)) . w2^T.
inline Matrix swiglu_ffn(const Matrix& x, const Matrix& w1, const Matrix& w3, const Matrix& w2) {
  const Matrix g = linear(x, w1), u = linear(x, w3);
  Matrix h(x.rows, w1.rows);
  for (std::size_t i = 0; i < h.data.size(); ++i) h.data[i] = silu(g.data[i]) * u.data[i];
  return linear(h, w2);
}

// Routed experts, token by token: out[t] = sum_j weight[t][j] * FFN_{ids[t][j]}(x[t]) over the ids
// this rank holds (first_expert .. first_expert + w1.size() - 1).
inline Matrix moe(const Matrix& x, const std::vector<int>& ids, const Matrix& weights,
                  const std::vector<Matrix>& w1, const std::vector<Matrix>& w3,
                  const std::vector<Matrix>& w2, int first_expert = 0) {
  const int top_k = weights.cols, n_experts = int(w1.size());
  Matrix out(x.rows, x.cols);
  for (int t = 0; t < x.rows; ++t) {
    Matrix xt(1, x.cols);
    std::copy(x.row(t), x.row(t) + x.cols, xt.data.begin());
    for (int j = 0; j < top_k; ++j) {
      const int e = ids[std::size_t(t) * top_k + j] - first_expert;
      if (e < 0 || e >= n_experts) continue;
      const Matrix y = swiglu_ffn(xt, w1[e], w3[e], w2[e]);
      for (int c = 0; c < x.cols; ++c) out(t, c) += weights(t, j) * y(0, c);
    }
  }
  return out;
}

}  // namespace relayout::reference
