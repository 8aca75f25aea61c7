// Routed experts: one SwiGLU FFN pass per expert over the rows grouped for it (an ExpertBatch from
// relayout::group_by_expert, EpBuffer::dispatch or the bridge: gate and up projections as one GEMM, the
// activation, the down projection); relayout::combine_experts weighs and sums them per row, or
// expert_ffn_into adds each expert's weighted outputs straight into their rows (local_experts'
// path for float and double rows). The expert intermediate dimension may be a moe_tp shard (a rank
// holds rows [begin, end) of w1/w3 and the same columns of w2): outputs are then partial sums,
// completed by a reduction outside this header. The shared expert is swiglu_ffn on all rows. The
// weights' scalar W is a template parameter of its own: the rows' T, or bf16 for fp32 rows
// (weights_fit_rows_v: bf16 weights, fp32 activations, fp32 accumulation).
#pragma once

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <string>

#include "relayout/kernels/error.hpp"
#include "relayout/kernels/impl/gemm.hpp"
#include "relayout/kernels/impl/simd.hpp"
#include "relayout/kernels/linear.hpp"
#include "relayout/kernels/router.hpp"
#include "relayout/kernels/types.hpp"
#include "relayout/placement/experts.hpp"

namespace relayout::kernels {

// Packed SwiGLU weights of `count` experts: w13 = [w1; w3] (2*intermediate x hidden each) and
// w2 (hidden x intermediate each). intermediate may be a moe_tp shard. W: the weights' scalar.
template <class W, class ExecSpace = Kokkos::DefaultExecutionSpace>
struct ExpertWeights {
  using weight_type = W;
  PackedWeights<W, ExecSpace> w13;
  PackedWeights<W, ExecSpace> w2;
  int count() const { return w13.count; }
  int hidden() const { return w13.in_features; }
  int intermediate() const { return w2.in_features; }
};

// Packs experts from w1, w3 (experts x intermediate x hidden) and w2 (experts x hidden x
// intermediate), or one expert (the shared expert) from rank-2 views. Any layout: moe_tp shard
// subviews (intermediate_shard) pack directly.
template <class ExecSpace, KokkosView W1, KokkosView W3, KokkosView W2>
ExpertWeights<scalar_of<W1>, ExecSpace> pack_experts(const ExecSpace& exec, const W1& w1, const W3& w3,
                                                     const W2& w2) {
  constexpr int r = static_cast<int>(W1::rank);
  static_assert(r == static_cast<int>(W3::rank) && r == static_cast<int>(W2::rank) && (r == 2 || r == 3),
                "relayout::kernels::pack_experts: w1, w3, w2 must all be rank 3 (experts) or rank 2 (one)");
  const int off = r - 2;
  const auto s = [](std::size_t v) { return impl::str(std::int64_t(v)); };
  if constexpr (r == 3) {
    impl::require(w3.extent(0) == w1.extent(0) && w2.extent(0) == w1.extent(0), "pack_experts", "w3",
                  "w1, w3 and w2 must hold the same number of experts " + s(w1.extent(0)));
  }
  impl::require(w3.extent(off) == w1.extent(off) && w3.extent(off + 1) == w1.extent(off + 1),
                "pack_experts", "w3", "must have w1's shape (intermediate x hidden)");
  impl::require(w2.extent(off) == w1.extent(off + 1) && w2.extent(off + 1) == w1.extent(off),
                "pack_experts", "w2",
                "must be hidden x intermediate = " + s(w1.extent(off + 1)) + " x " + s(w1.extent(off)) +
                    ", got " + s(w2.extent(off)) + " x " + s(w2.extent(off + 1)));
  return {pack_weights_stacked(exec, w1, w3), pack_weights(exec, w2)};
}

// The slice of the intermediate dimension a moe_tp rank holds (whole `unit`s, even split).
inline Range intermediate_shard(std::int64_t intermediate, int n, int r, std::int64_t unit = 1) {
  return impl::even_shard("intermediate_shard", intermediate, unit, n, r);
}

namespace impl {

// h[i, c] = silu(gu[i, c]) * gu[i, I + c] for the rows of one expert, in compute_t<T> (bf16 and
// fp16 rows widened as they are read, each h rounded once).
template <class T>
struct SwiGlu {
  using C = compute_t<T>;
  const T* gu;
  T* h;
  int inter;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t idx) const {
    const std::int64_t i = idx / inter;
    const int c = int(idx % inter);
    const C g = C(gu[i * 2 * inter + c]);
    h[i * inter + c] = T(g / (C(1) + impl::exp(-g)) * C(gu[i * 2 * inter + inter + c]));
  }
};

// ... a row per work item, in vectors of the execution space's lanes with a polynomial exp (vexp)
// where compute_t<T> is float or double on a host with SIMD: the scalar form calls libm's exp per
// element, 8% of a 1024-token layer (SwiGLU 5.5%, expf 2.6%). bf16 and fp16 rows pass through L
// floats at a time (widened in, rounded out).
template <class ExecSpace, class T>
struct SwiGluRows {
  using C = compute_t<T>;
  static constexpr int L = lanes_v<ExecSpace, C>;
  using V = typename Vec<C, L>::type;
  const T* gu;
  T* h;
  int inter;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i) const {
    const T* g = gu + i * 2 * inter;
    const T* u = g + inter;
    T* o = h + i * inter;
    int c = 0;
    if constexpr (L > 1) {
      for (; c + L <= inter; c += L) {
        if constexpr (std::is_same_v<T, C>) {
          const V gv = load<V>(g + c);
          store<V>(o + c, gv / (C(1) + vexp<L>(-gv)) * load<V>(u + c));
        } else if constexpr (std::is_same_v<T, relayout::bf16>) {
          const V gv = load_key<V>(g + c);
          store_bf16<L>(o + c, gv / (C(1) + vexp<L>(-gv)) * load_key<V>(u + c));
        } else {
          C gw[L], uw[L], ow[L];
          for (int l = 0; l < L; ++l) {
            gw[l] = C(g[c + l]);
            uw[l] = C(u[c + l]);
          }
          const V gv = load<V>(gw);
          store<V>(ow, gv / (C(1) + vexp<L>(-gv)) * load<V>(uw));
          for (int l = 0; l < L; ++l) o[c + l] = T(ow[l]);
        }
      }
    }
    for (; c < inter; ++c) {
      const C gc = C(g[c]);
      o[c] = T(gc / (C(1) + impl::exp(-gc)) * C(u[c]));
    }
  }
};

// One SwiGLU pass over m rows of x (row i at x + i * ldx, or at x + rows[i] * ldx when rows is
// not null: the gate/up GEMM reads them through the index), written to y rows (gu, h: T scratch;
// a_pack: gemm_workspace_size<ExecSpace, T, W>).
template <class ExecSpace, class T, class W>
void swiglu_rows(const ExecSpace& exec, const T* x, std::int64_t ldx, const int* rows, int m,
                 const ExpertWeights<W, ExecSpace>& w, int e, T* y, std::int64_t ldy, bool accumulate,
                 T* gu, T* h, T* a_pack) {
  if (m == 0) return;
  const int I = w.intermediate();
  gemm_dispatch(exec, x, ldx, rows, m, w.w13, e, gu, std::int64_t(2) * I, static_cast<const T*>(nullptr), false,
                a_pack);
  if constexpr (std::is_same_v<compute_t<T>, float> || std::is_same_v<compute_t<T>, double>)
    Kokkos::parallel_for("relayout::kernels::swiglu", Kokkos::RangePolicy<ExecSpace>(exec, 0, std::int64_t(m)),
                         SwiGluRows<ExecSpace, T>{gu, h, I});
  else
    Kokkos::parallel_for("relayout::kernels::swiglu", Kokkos::RangePolicy<ExecSpace>(exec, 0, std::int64_t(m) * I),
                         SwiGlu<T>{gu, h, I});
  gemm_dispatch(exec, static_cast<const T*>(h), std::int64_t(I), static_cast<const int*>(nullptr), m, w.w2, e, y,
                ldy, static_cast<const T*>(nullptr), accumulate, a_pack);
}

template <class ExecSpace, class T, class W = T>
struct FfnWorkspace {
  using Mem = typename ExecSpace::memory_space;
  Kokkos::View<T*, Mem> gu, h, a_pack, y;  // y: one expert's outputs (with_outputs)
  FfnWorkspace(std::int64_t max_rows, int hidden, int inter, bool with_outputs = false)
      : gu(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("relayout::ffn_gu")),
           max_rows * 2 * inter),
        h(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("relayout::ffn_h")), max_rows * inter),
        a_pack(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("relayout::ffn_a_pack")),
               gemm_workspace_size<ExecSpace, T, W>(max_rows, hidden > inter ? hidden : inter)),
        y(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("relayout::ffn_y")),
          with_outputs ? max_rows * hidden : 0) {}
};

// out(row(s)) += weight(s) * y(s) for the rows s of one expert (one work item per row, in vectors
// where T is float or double on a host with SIMD).
template <class ExecSpace, class T, class Out>
struct AddWeightedRows {
  static constexpr int L = lanes_v<ExecSpace, T>;
  using V = typename Vec<T, L>::type;
  const T* y;
  std::int64_t hidden;
  Kokkos::View<const std::int64_t*, typename ExecSpace::memory_space> row;
  Kokkos::View<const T*, typename ExecSpace::memory_space> weight;
  std::int64_t first;  // the expert's first batch row
  Out out;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t s) const {
    const T* ys = y + s * hidden;
    T* o = &out(row(first + s), 0);
    const T wk = weight(first + s);
    std::int64_t f = 0;
    if constexpr (L > 1) {
      const V wv = V{} + wk;
      for (; f + L <= hidden; f += L) store<V>(o + f, load<V>(o + f) + wv * load<V>(ys + f));
    }
    for (; f < hidden; ++f) o[f] += wk * ys[f];
  }
};

}  // namespace impl

// Dense SwiGLU FFN on every row (the shared expert; `w` holds one expert). accumulate: y += FFN(x).
template <class ExecSpace, RowMatrixView X, class W, MutableRowMatrixView Y>
void swiglu_ffn(const ExecSpace& exec, const X& x, const ExpertWeights<W, ExecSpace>& w, const Y& y,
                bool accumulate = false) {
  using T = scalar_of<X>;
  static_assert(std::is_same_v<scalar_of<Y>, T>, "relayout::kernels::swiglu_ffn: x and y must have the same scalar type");
  static_assert(weights_fit_rows_v<T, W>,
                "relayout::kernels::swiglu_ffn: the weights' scalar must be x's, or bf16 for float x");
  using impl::require;
  using impl::str;
  require(w.count() == 1, "swiglu_ffn", "weights", "must hold one expert, got " + str(w.count()));
  require(int(x.extent(1)) == w.hidden(), "swiglu_ffn", "x",
          "x.extent(1) must equal hidden " + str(w.hidden()) + ", got " + str(x.extent(1)));
  require(y.extent(0) == x.extent(0) && int(y.extent(1)) == w.hidden(), "swiglu_ffn", "y",
          "must be x.extent(0) x hidden = " + str(x.extent(0)) + " x " + str(w.hidden()));
  const int m = int(x.extent(0));
  if (m == 0) return;
  impl::FfnWorkspace<ExecSpace, T, W> ws(m, w.hidden(), w.intermediate());
  impl::swiglu_rows(exec, x.data(), std::int64_t(x.stride(0)), static_cast<const int*>(nullptr), m, w, 0,
                    y.data(), std::int64_t(y.stride(0)), accumulate, ws.gu.data(), ws.h.data(),
                    ws.a_pack.data());
}

namespace impl {

// The checks every pass over a batch makes (named for `who`); returns the largest group's rows.
template <class T, class W, class ExecSpace>
std::int64_t check_expert_batch(const ExpertBatch<T, ExecSpace>& batch, const ExpertWeights<W, ExecSpace>& w,
                                const char* who) {
  require(w.count() == batch.experts(), who, "weights",
          "must hold the batch's " + str(batch.experts()) + " local experts, got " + str(w.count()));
  require(batch.rows() == 0 || int(batch.x.extent(1)) == w.hidden(), who, "batch",
          "rows must have hidden " + str(w.hidden()) + " columns, got " + str(batch.x.extent(1)));
  if (batch.indexed)
    require(batch.source != nullptr && std::int64_t(batch.index.extent(0)) >= batch.rows(), who, "batch",
            "an indexed batch needs its source rows and one index per batch row");
  std::int64_t max_rows = 0;
  for (int e = 0; e < batch.experts(); ++e) max_rows = batch.count(e) > max_rows ? batch.count(e) : max_rows;
  return max_rows;
}

// Local expert e of the batch (its rows read through the index, or where the batch holds them)
// into rows y, ldy scalars apart.
template <class ExecSpace, class T, class W>
void swiglu_expert(const ExecSpace& exec, const ExpertBatch<T, ExecSpace>& batch, const ExpertWeights<W, ExecSpace>& w,
                   int e, T* y, std::int64_t ldy, FfnWorkspace<ExecSpace, T, W>& ws) {
  const std::int64_t off = batch.offset(e);
  if (batch.indexed) {
    swiglu_rows(exec, batch.source, batch.source_ld, batch.index.data() + off, int(batch.count(e)), w, e, y, ldy, false,
                ws.gu.data(), ws.h.data(), ws.a_pack.data());
  } else {
    const std::int64_t ldx = std::int64_t(batch.x.stride(0));
    swiglu_rows(exec, batch.x.data() + off * ldx, ldx, static_cast<const int*>(nullptr), int(batch.count(e)), w, e, y,
                ldy, false, ws.gu.data(), ws.h.data(), ws.a_pack.data());
  }
}

}  // namespace impl

// SwiGLU experts on rows already grouped by local expert (an ExpertBatch from group_by_expert,
// EpBuffer::dispatch or the bridge): y(i) = FFN_e(x(i)) for the rows of group e, unweighted. An indexed
// batch is read through its index (the gate/up GEMM reads the rows where they are).
template <class ExecSpace, class T, class W, MutableRowMatrixView Y>
void expert_ffn(const ExecSpace& exec, const ExpertBatch<T, ExecSpace>& batch, const ExpertWeights<W, ExecSpace>& w,
                const Y& y) {
  static_assert(weights_fit_rows_v<T, W>,
                "relayout::kernels::expert_ffn: the weights' scalar must be the rows', or bf16 for float rows");
  using impl::str;
  const std::int64_t max_rows = impl::check_expert_batch(batch, w, "expert_ffn");
  impl::require(std::int64_t(y.extent(0)) == batch.rows() && (batch.rows() == 0 || int(y.extent(1)) == w.hidden()),
                "expert_ffn", "y", "must be batch.rows() x hidden = " + str(batch.rows()) + " x " + str(w.hidden()));
  if (max_rows == 0) return;
  impl::FfnWorkspace<ExecSpace, T, W> ws(max_rows, w.hidden(), w.intermediate());
  const std::int64_t ldy = std::int64_t(y.stride(0));
  for (int e = 0; e < batch.experts(); ++e) impl::swiglu_expert(exec, batch, w, e, y.data() + batch.offset(e) * ldy, ldy, ws);
}

// The same experts, each one's outputs added to the rows they belong to while they are in cache:
// out(dest.row(s)) += dest.weight(s) * FFN_e(x(s)) for the batch rows s of every group e, in expert
// order (a local_experts path; CombinesIntoRows). out's rows must be contiguous (stride(1) == 1).
// No batch row may share its destination with another row of the same expert (local_experts
// checks it). Float and double rows.
template <class ExecSpace, class T, class W, MutableRowMatrixView Out>
void expert_ffn_into(const ExecSpace& exec, const ExpertBatch<T, ExecSpace>& batch, const ExpertWeights<W, ExecSpace>& w,
                     const ExpertDestinations<T, ExecSpace>& dest, const Out& out) {
  static_assert(std::is_same_v<T, compute_t<T>>,
                "relayout::kernels::expert_ffn_into: float or double rows (bf16 rows are summed in fp32 by combine_experts)");
  static_assert(std::is_same_v<scalar_of<Out>, T>, "relayout::kernels::expert_ffn_into: out must hold the rows' scalar");
  static_assert(weights_fit_rows_v<T, W>,
                "relayout::kernels::expert_ffn_into: the weights' scalar must be the rows', or bf16 for float rows");
  using impl::require;
  using impl::str;
  const std::int64_t max_rows = impl::check_expert_batch(batch, w, "expert_ffn_into");
  require(std::int64_t(dest.row.extent(0)) >= batch.rows() && std::int64_t(dest.weight.extent(0)) >= batch.rows(),
          "expert_ffn_into", "dest", "must hold a row and a weight for each of the batch's " + str(batch.rows()) + " rows");
  require(batch.rows() == 0 || (int(out.extent(1)) == w.hidden() && (out.extent(1) <= 1 || out.stride(1) == 1)),
          "expert_ffn_into", "out", "must be rows x hidden " + str(w.hidden()) + " with contiguous rows");
  if (max_rows == 0) return;
  // Every destination must be a row of out: the adds write there.
  const auto rows = dest.row;
  const std::int64_t n_out = std::int64_t(out.extent(0));
  std::int64_t outside = 0;
  Kokkos::parallel_reduce(
      "relayout::kernels::check_destinations", Kokkos::RangePolicy<ExecSpace>(exec, 0, batch.rows()),
      KOKKOS_LAMBDA(const std::int64_t s, std::int64_t& n) { n += rows(s) < 0 || rows(s) >= n_out ? 1 : 0; }, outside);
  exec.fence();
  require(outside == 0, "expert_ffn_into", "dest",
          "rows must name rows of out [0, " + str(n_out) + "); " + str(outside) + " do not");
  const int H = w.hidden();
  impl::FfnWorkspace<ExecSpace, T, W> ws(max_rows, H, w.intermediate(), true);
  for (int e = 0; e < batch.experts(); ++e) {
    const std::int64_t m = batch.count(e);
    if (m == 0) continue;
    impl::swiglu_expert(exec, batch, w, e, ws.y.data(), std::int64_t(H), ws);
    Kokkos::parallel_for("relayout::kernels::add_weighted_rows", Kokkos::RangePolicy<ExecSpace>(exec, 0, m),
                         impl::AddWeightedRows<ExecSpace, T, Out>{ws.y.data(), std::int64_t(H), dest.row, dest.weight,
                                                                   batch.offset(e), out});
  }
}

// relayout's ready-made Experts (ExpertsFor): SwiGLU routed experts, and a shared SwiGLU expert
// when `shared_experts` holds one (its count is 0 otherwise). Engines with other experts bring
// their own callable. T: the rows' scalar; W: the weights' (T, or bf16 for float rows).
template <class T, class ExecSpace = Kokkos::DefaultExecutionSpace, class W = T>
struct SwigluExperts {
  static_assert(weights_fit_rows_v<T, W>,
                "relayout::kernels::SwigluExperts: the weights' scalar must be T, or bf16 for float rows");
  ExpertWeights<W, ExecSpace> routed;
  ExpertWeights<W, ExecSpace> shared_experts;
  static constexpr bool reads_indexed_rows = true;  // expert_ffn reads an indexed batch

  void operator()(const ExecSpace& exec, const ExpertBatch<T, ExecSpace>& batch,
                  const relayout::RowsView<T, ExecSpace>& y) const {
    expert_ffn(exec, batch, routed, y);
  }
  // local_experts on float and double rows: the weighted outputs added as each expert finishes.
  void combine_into(const ExecSpace& exec, const ExpertBatch<T, ExecSpace>& batch,
                    const ExpertDestinations<T, ExecSpace>& dest, const relayout::RowsView<T, ExecSpace>& out) const
    requires std::is_same_v<T, compute_t<T>>
  {
    expert_ffn_into(exec, batch, routed, dest, out);
  }
  void shared(const ExecSpace& exec, const relayout::RowsView<T, ExecSpace>& x,
              const relayout::RowsView<T, ExecSpace>& y) const {
    if (shared_experts.count() > 0 && x.extent(0) > 0) swiglu_ffn(exec, x, shared_experts, y, true);
  }
};

// relayout's ready-made router (RouterFor): a gate projection, then route() (softmax or sigmoid
// scoring, grouped top-k, renormalisation and scaling as `config` says). W: the gate's scalar (T,
// or bf16 for float rows; a bf16 gate can change the top-k of near ties).
template <class T, class ExecSpace = Kokkos::DefaultExecutionSpace, class W = T>
struct LinearTopkRouter {
  static_assert(weights_fit_rows_v<T, W>,
                "relayout::kernels::LinearTopkRouter: the gate's scalar must be T, or bf16 for float rows");
  PackedWeights<W, ExecSpace> gate;  // experts x hidden
  RouterConfig config;

  int top_k() const { return config.top_k; }
  // bf16 rows: fp32 logits (the gate's fp32 sums, unrounded), as the TopK weights are fp32.
  void operator()(const ExecSpace& exec, const relayout::RowsView<T, ExecSpace>& x, TopK<T, ExecSpace>& out) const {
    relayout::RowsView<compute_t<T>, ExecSpace> logits(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("relayout::router_logits")), x.extent(0),
        std::size_t(gate.out_features));
    linear(exec, x, gate, logits);
    route(exec, logits, config, out.ids, out.weights);
  }
};

}  // namespace relayout::kernels
