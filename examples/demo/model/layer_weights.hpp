// The weights of one decoder layer: a rank's shard (packed for the kernels) and the whole tensors
// for the single-rank reference, both read from the counter-based generator, so the shard a rank
// holds is bit-identical to the same block of the reference's tensor.
// ModelDims::weights picks the shard's element type: fp32, or bf16 (each generated fp32 value
// rounded to nearest even) for the attention projections (wq_a, wq_b, wkv, wo_b) and the routed
// and shared experts (w1, w3, w2). The router's gate and the norms stay fp32 (a rounded gate could
// flip the top-k choice of a near tie, an error no rounding bound covers), and so do the
// activations: every GEMM multiplies fp32 rows by the stored weights with fp32 accumulation.
#pragma once

#include <Kokkos_Core.hpp>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "relayout/comm/scalar.hpp"
#include "relayout/kernels/linear.hpp"
#include "relayout/kernels/moe.hpp"
#include "relayout/kernels/reference.hpp"
#include "demo_model/config.hpp"
#include "demo_model/weights.hpp"

namespace relayout::model {

// Scale of a projection with `fan_in` inputs: keeps activations of order 1.
inline float init_scale(int fan_in) { return float(1.0 / std::sqrt(double(fan_in))); }

// Which parts of the layer this rank holds.
struct ShardSpec {
  int head_begin = 0, heads = 0;          // query heads (attn_tp shard of wq_b / wo_b)
  int expert_begin = 0, experts = 0;      // routed experts (moe_ep shard)
  std::vector<int> expert_ids;            // with redundant experts: the logical expert of each slot
  int inter_begin = 0, inter = 0;         // routed expert intermediate (moe_tp shard)
  int shared_begin = 0, shared = 0;       // shared expert intermediate held (0: none here)
};

// One projection of the layer: packed fp32 or bf16 weights (the other one empty); fp32 rows, or
// bf16 rows with bf16 weights.
template <class ExecSpace>
struct Projection {
  kernels::PackedWeights<float, ExecSpace> f32;
  kernels::PackedWeights<relayout::bf16, ExecSpace> b16;

  bool is_bf16() const { return b16.count > 0; }
  int out_features() const { return is_bf16() ? b16.out_features : f32.out_features; }
  // y = x . W^T, fp32 accumulation either way.
  template <class X, class Y>
  void operator()(const ExecSpace& exec, const X& x, const Y& y) const {
    if constexpr (std::is_same_v<typename X::non_const_value_type, relayout::bf16>) {
      if (!is_bf16()) throw LayoutError("weights", "bf16 rows need the layer's bf16 weights");
      kernels::linear(exec, x, b16, y);
    } else if (is_bf16()) {
      kernels::linear(exec, x, b16, y);
    } else {
      kernels::linear(exec, x, f32, y);
    }
  }
};

// The layer's SwiGLU experts (the library's SwigluExperts, ExpertsFor<float> and ExpertsFor<bf16>)
// with fp32 or bf16 weights: one of the two holds them. bf16 rows take the bf16 weights (b16_rows
// shares b16's packed weights).
template <class ExecSpace>
struct LayerExperts {
  kernels::SwigluExperts<float, ExecSpace, float> f32;
  kernels::SwigluExperts<float, ExecSpace, relayout::bf16> b16;
  kernels::SwigluExperts<relayout::bf16, ExecSpace, relayout::bf16> b16_rows;
  bool bf16 = false;
  static constexpr bool reads_indexed_rows = true;  // all read an indexed batch

  void operator()(const ExecSpace& exec, const ExpertBatch<relayout::bf16, ExecSpace>& batch,
                  const RowsView<relayout::bf16, ExecSpace>& y) const {
    b16_rows(exec, batch, y);
  }
  void shared(const ExecSpace& exec, const RowsView<relayout::bf16, ExecSpace>& x,
              const RowsView<relayout::bf16, ExecSpace>& y) const {
    b16_rows.shared(exec, x, y);
  }

  void operator()(const ExecSpace& exec, const ExpertBatch<float, ExecSpace>& batch,
                  const RowsView<float, ExecSpace>& y) const {
    if (bf16)
      b16(exec, batch, y);
    else
      f32(exec, batch, y);
  }
  // fp32 rows on paths dp_gather and tp_moe: each expert's weighted outputs added as it finishes
  // (CombinesIntoRows).
  void combine_into(const ExecSpace& exec, const ExpertBatch<float, ExecSpace>& batch,
                    const ExpertDestinations<float, ExecSpace>& dest, const RowsView<float, ExecSpace>& out) const {
    if (bf16)
      b16.combine_into(exec, batch, dest, out);
    else
      f32.combine_into(exec, batch, dest, out);
  }
  void shared(const ExecSpace& exec, const RowsView<float, ExecSpace>& x, const RowsView<float, ExecSpace>& y) const {
    if (bf16)
      b16.shared(exec, x, y);
    else
      f32.shared(exec, x, y);
  }
};

template <class ExecSpace = Kokkos::DefaultExecutionSpace>
struct LayerShard {
  using Mem = typename ExecSpace::memory_space;
  using Vec = Kokkos::View<float*, Mem>;
  using Packed = kernels::PackedWeights<float, ExecSpace>;

  Vec attn_norm, q_norm, kv_norm, ffn_norm;
  Projection<ExecSpace> wq_a, wq_b, wkv, wo_b;
  Packed router;  // fp32 whatever ModelDims::weights says
  LayerExperts<ExecSpace> ffn;  // routed experts, and the shared expert (count 0 when this rank holds none)
  ShardSpec spec;

  // The experts for the bridge (ExpertsFor<float>, HasSharedExpert).
  const LayerExperts<ExecSpace>& experts() const { return ffn; }

  static LayerShard make(const ExecSpace& exec, const ModelDims& d, int layer, const ShardSpec& s) {
    using M2 = Kokkos::View<float**, Kokkos::LayoutRight, Mem>;
    using M3 = Kokkos::View<float***, Kokkos::LayoutRight, Mem>;
    const std::uint64_t seed = d.seed;
    const int H = d.hidden, Q = d.q_lora, D = d.head_dim, HD = d.heads * D;
    const bool bf16 = d.weights == WeightDtype::bf16;
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
      return m;
    };
    auto projection = [&](Tensor t, int rows, int cols, int full_cols, int row0, int col0, float scale) {
      const M2 m = block(t, rows, cols, full_cols, row0, col0, scale);
      Projection<ExecSpace> p;
      if (bf16) {
        p.b16 = kernels::pack_weights(exec, to_bf16(exec, m));
        p.b16.round_rows = true;  // bf16 activations into the GEMM (vdpbf16ps where the CPU has it)
      } else
        p.f32 = kernels::pack_weights(exec, m);
      return p;
    };
    w.wq_a = projection(Tensor::wq_a, Q, H, H, 0, 0, init_scale(H));
    w.wq_b = projection(Tensor::wq_b, s.heads * D, Q, Q, s.head_begin * D, 0, init_scale(Q));
    w.wkv = projection(Tensor::wkv, D, H, H, 0, 0, init_scale(H));
    w.wo_b = projection(Tensor::wo_b, H, s.heads * D, HD, 0, s.head_begin * D, init_scale(HD));
    w.router = kernels::pack_weights(exec, block(Tensor::router, d.experts, H, H, 0, 0, init_scale(H)));

    auto ffn = [&](auto& out, Tensor t1, Tensor t3, Tensor t2, int count, int first, int inter_full, int i0, int il,
                   const std::vector<int>& ids) {
      M3 w1("relayout::w1", std::size_t(count), std::size_t(il), std::size_t(H));
      M3 w3("relayout::w3", std::size_t(count), std::size_t(il), std::size_t(H));
      M3 w2("relayout::w2", std::size_t(count), std::size_t(H), std::size_t(il));
      for (int e = 0; e < count; ++e) {
        const int expert = ids.empty() ? first + e : ids[std::size_t(e)];
        fill_block(Kokkos::subview(w1, e, Kokkos::ALL(), Kokkos::ALL()), tensor_key(seed, layer, t1, expert), H, i0, 0, init_scale(H));
        fill_block(Kokkos::subview(w3, e, Kokkos::ALL(), Kokkos::ALL()), tensor_key(seed, layer, t3, expert), H, i0, 0, init_scale(H));
        fill_block(Kokkos::subview(w2, e, Kokkos::ALL(), Kokkos::ALL()), tensor_key(seed, layer, t2, expert), inter_full, 0, i0, init_scale(inter_full));
      }
      if constexpr (std::is_same_v<typename std::decay_t<decltype(out)>::weight_type, relayout::bf16>) {
        out = kernels::pack_experts(exec, to_bf16(exec, w1), to_bf16(exec, w3), to_bf16(exec, w2));
        out.w13.round_rows = out.w2.round_rows = true;
      } else
        out = kernels::pack_experts(exec, w1, w3, w2);
    };
    auto experts = [&](auto& sw) {
      ffn(sw.routed, Tensor::expert_w1, Tensor::expert_w3, Tensor::expert_w2, s.experts, s.expert_begin,
          d.moe_inter, s.inter_begin, s.inter, s.expert_ids);
      if (s.shared > 0)
        ffn(sw.shared_experts, Tensor::shared_w1, Tensor::shared_w3, Tensor::shared_w2, 1, 0, d.shared_inter,
            s.shared_begin, s.shared, {});
    };
    w.ffn.bf16 = bf16;
    if (bf16) {
      experts(w.ffn.b16);
      w.ffn.b16_rows = {w.ffn.b16.routed, w.ffn.b16.shared_experts};
    } else {
      experts(w.ffn.f32);
    }
    return w;
  }

 private:
  // The same tensor (LayoutRight, contiguous) rounded to bf16, nearest even, element by element.
  template <class F>
  static auto to_bf16(const ExecSpace& exec, const F& m) {
    constexpr int r = static_cast<int>(F::rank);
    using B = std::conditional_t<r == 2, Kokkos::View<relayout::bf16**, Kokkos::LayoutRight, Mem>,
                                 Kokkos::View<relayout::bf16***, Kokkos::LayoutRight, Mem>>;
    B b(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("relayout::weight_bf16")), m.layout());
    const float* src = m.data();
    relayout::bf16* dst = b.data();
    Kokkos::parallel_for(
        "relayout::weights_to_bf16", Kokkos::RangePolicy<ExecSpace>(exec, 0, std::int64_t(m.span())),
        KOKKOS_LAMBDA(const std::int64_t i) { dst[i] = relayout::bf16(src[i]); });
    exec.fence();
    return b;
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
