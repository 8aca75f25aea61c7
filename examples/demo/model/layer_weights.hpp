// The weights of one decoder layer: a rank's shard (packed for the kernels) and the whole tensors
// for the single-rank reference, both read from the counter-based generator, so the shard a rank
// holds is bit-identical to the same block of the reference's tensor.
#pragma once

#include <Kokkos_Core.hpp>
#include <cmath>
#include <vector>

#include "relayout/kernels/linear.hpp"
#include "relayout/kernels/moe.hpp"
#include "relayout/kernels/reference.hpp"
#include "demo/model/config.hpp"
#include "demo/model/weights.hpp"

namespace relayout::model {

// Scale of a projection with `fan_in` inputs: keeps activations of order 1.
inline float init_scale(int fan_in) { return float(1.0 / std::sqrt(double(fan_in))); }

// Which parts of the layer this rank holds.
struct ShardSpec {
  int head_begin = 0, heads = 0;          // query heads (attn_tp shard of wq_b / wo_b)
  int expert_begin = 0, experts = 0;      // routed experts (moe_ep shard)
  int inter_begin = 0, inter = 0;         // routed expert intermediate (moe_tp shard)
  int shared_begin = 0, shared = 0;       // shared expert intermediate held (0: none here)
};

template <class ExecSpace = Kokkos::DefaultExecutionSpace>
struct LayerShard {
  using Mem = typename ExecSpace::memory_space;
  using Vec = Kokkos::View<float*, Mem>;
  using Packed = kernels::PackedWeights<float, ExecSpace>;

  Vec attn_norm, q_norm, kv_norm, ffn_norm;
  Packed wq_a, wq_b, wkv, wo_b, router;
  kernels::ExpertWeights<float, ExecSpace> experts;
  kernels::ExpertWeights<float, ExecSpace> shared;  // count 0 when this rank holds none
  ShardSpec spec;

  static LayerShard make(const ExecSpace& exec, const ModelDims& d, int layer, const ShardSpec& s) {
    using M2 = Kokkos::View<float**, Kokkos::LayoutRight, Mem>;
    using M3 = Kokkos::View<float***, Kokkos::LayoutRight, Mem>;
    const std::uint64_t seed = d.seed;
    const int H = d.hidden, Q = d.q_lora, D = d.head_dim, HD = d.heads * D;
    LayerShard w;
    w.spec = s;
    auto norm = [&](Tensor t, int n) {
      Vec v("relayout::norm", std::size_t(n));
      fill_norm(v, tensor_key(seed, layer, t));
      return v;
    };
    w.attn_norm = norm(Tensor::attn_norm, H);
    w.q_norm = norm(Tensor::q_norm, Q);
    w.kv_norm = norm(Tensor::kv_norm, D);
    w.ffn_norm = norm(Tensor::ffn_norm, H);
    auto block = [&](Tensor t, int rows, int cols, int full_cols, int row0, int col0, float scale) {
      M2 m("relayout::weight", std::size_t(rows), std::size_t(cols));
      fill_block(m, tensor_key(seed, layer, t), full_cols, row0, col0, scale);
      return kernels::pack_weights(exec, m);
    };
    w.wq_a = block(Tensor::wq_a, Q, H, H, 0, 0, init_scale(H));
    w.wq_b = block(Tensor::wq_b, s.heads * D, Q, Q, s.head_begin * D, 0, init_scale(Q));
    w.wkv = block(Tensor::wkv, D, H, H, 0, 0, init_scale(H));
    w.wo_b = block(Tensor::wo_b, H, s.heads * D, HD, 0, s.head_begin * D, init_scale(HD));
    w.router = block(Tensor::router, d.experts, H, H, 0, 0, init_scale(H));

    auto ffn = [&](Tensor t1, Tensor t3, Tensor t2, int count, int first, int inter_full, int i0, int il) {
      M3 w1("relayout::w1", std::size_t(count), std::size_t(il), std::size_t(H));
      M3 w3("relayout::w3", std::size_t(count), std::size_t(il), std::size_t(H));
      M3 w2("relayout::w2", std::size_t(count), std::size_t(H), std::size_t(il));
      for (int e = 0; e < count; ++e) {
        const int expert = first + e;
        fill_block(Kokkos::subview(w1, e, Kokkos::ALL(), Kokkos::ALL()), tensor_key(seed, layer, t1, expert), H, i0, 0, init_scale(H));
        fill_block(Kokkos::subview(w3, e, Kokkos::ALL(), Kokkos::ALL()), tensor_key(seed, layer, t3, expert), H, i0, 0, init_scale(H));
        fill_block(Kokkos::subview(w2, e, Kokkos::ALL(), Kokkos::ALL()), tensor_key(seed, layer, t2, expert), inter_full, 0, i0, init_scale(inter_full));
      }
      return kernels::pack_experts(exec, w1, w3, w2);
    };
    w.experts = ffn(Tensor::expert_w1, Tensor::expert_w3, Tensor::expert_w2, s.experts, s.expert_begin,
                    d.moe_inter, s.inter_begin, s.inter);
    if (s.shared > 0)
      w.shared = ffn(Tensor::shared_w1, Tensor::shared_w3, Tensor::shared_w2, 1, 0, d.shared_inter,
                     s.shared_begin, s.shared);
    return w;
  }
};

// The whole layer for the single-rank reference, in double (the same float values, widened).
struct LayerFull {
  using Matrix = reference::Matrix;
  std::vector<double> attn_norm, q_norm, kv_norm, ffn_norm;
  Matrix wq_a, wq_b, wkv, wo_b, router;
  std::vector<Matrix> w1, w3, w2;
  Matrix shared_w1, shared_w3, shared_w2;

  static LayerFull make(const ModelDims& d, int layer) {
    const std::uint64_t seed = d.seed;
    const int H = d.hidden, Q = d.q_lora, D = d.head_dim, HD = d.heads * D;
    auto norm = [&](Tensor t, int n) {
      std::vector<double> v(static_cast<std::size_t>(n));
      for (int i = 0; i < n; ++i) v[std::size_t(i)] = counter_norm_weight(tensor_key(seed, layer, t), std::uint64_t(i));
      return v;
    };
    auto matrix = [&](TensorKey key, int rows, int cols, float scale) {
      Matrix m(rows, cols);
      for (int i = 0; i < rows; ++i)
        for (int j = 0; j < cols; ++j) m(i, j) = counter_uniform(key, std::uint64_t(i) * std::uint64_t(cols) + std::uint64_t(j), scale);
      return m;
    };
    LayerFull w;
    w.attn_norm = norm(Tensor::attn_norm, H);
    w.q_norm = norm(Tensor::q_norm, Q);
    w.kv_norm = norm(Tensor::kv_norm, D);
    w.ffn_norm = norm(Tensor::ffn_norm, H);
    w.wq_a = matrix(tensor_key(seed, layer, Tensor::wq_a), Q, H, init_scale(H));
    w.wq_b = matrix(tensor_key(seed, layer, Tensor::wq_b), HD, Q, init_scale(Q));
    w.wkv = matrix(tensor_key(seed, layer, Tensor::wkv), D, H, init_scale(H));
    w.wo_b = matrix(tensor_key(seed, layer, Tensor::wo_b), H, HD, init_scale(HD));
    w.router = matrix(tensor_key(seed, layer, Tensor::router), d.experts, H, init_scale(H));
    for (int e = 0; e < d.experts; ++e) {
      w.w1.push_back(matrix(tensor_key(seed, layer, Tensor::expert_w1, e), d.moe_inter, H, init_scale(H)));
      w.w3.push_back(matrix(tensor_key(seed, layer, Tensor::expert_w3, e), d.moe_inter, H, init_scale(H)));
      w.w2.push_back(matrix(tensor_key(seed, layer, Tensor::expert_w2, e), H, d.moe_inter, init_scale(d.moe_inter)));
    }
    if (d.shared_inter > 0) {
      w.shared_w1 = matrix(tensor_key(seed, layer, Tensor::shared_w1), d.shared_inter, H, init_scale(H));
      w.shared_w3 = matrix(tensor_key(seed, layer, Tensor::shared_w3), d.shared_inter, H, init_scale(H));
      w.shared_w2 = matrix(tensor_key(seed, layer, Tensor::shared_w2), H, d.shared_inter, init_scale(d.shared_inter));
    }
    return w;
  }
};

}  // namespace relayout::model
