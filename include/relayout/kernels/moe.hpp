// Routed experts: bucket the (token, k) slots by expert, run one SwiGLU FFN pass per expert over its
// rows (gate and up projections as one GEMM, the activation, the down projection), and combine the
// top-k outputs of each token with its router weights. The expert intermediate dimension may be a
// moe_tp shard (a rank holds rows [begin, end) of w1/w3 and the same columns of w2): outputs are then
// partial sums, completed by a reduction outside this header. The shared expert is swiglu_ffn on all
// rows.
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
#include "relayout/placement/ep.hpp"

namespace relayout::kernels {

// The (token, j) slots of topk_ids sorted by local expert, stable (token order within an expert).
template <class MemSpace>
struct ExpertBuckets {
  int n_experts = 0;
  int first_expert = 0;
  int n_tokens = 0;
  int top_k = 0;
  Kokkos::View<int*, MemSpace> counts;      // rows per local expert
  Kokkos::View<int*, MemSpace> offsets;     // n_experts + 1 prefix sums of counts
  Kokkos::View<int*, MemSpace> slot_token;  // sorted position -> token row
  Kokkos::View<int*, MemSpace> slot_of;     // token * top_k + j -> sorted position, -1: not local
  Kokkos::View<int*, Kokkos::HostSpace> host_offsets;  // offsets, on the host (launch sizes)
  int rows() const { return host_offsets(n_experts); }
};

// Buckets topk_ids (tokens x top_k) by expert. This rank holds experts
// [first_expert, first_expert + n_experts); other ids (another EP rank's, or -1) are skipped.
// The sort is one sequential pass (O(tokens * top_k), deterministic); the offsets are copied to the
// host because each expert's GEMM is launched with its own row count.
template <class ExecSpace, RowMatrixView Ids>
ExpertBuckets<typename ExecSpace::memory_space> bucket_by_expert(const ExecSpace& exec, const Ids& topk_ids,
                                                                 int n_experts, int first_expert = 0) {
  static_assert(std::is_same_v<scalar_of<Ids>, int>, "relayout::kernels::bucket_by_expert: ids must be int");
  using Mem = typename ExecSpace::memory_space;
  impl::require(n_experts >= 1, "bucket_by_expert", "n_experts", "must be >= 1, got " + impl::str(n_experts));
  impl::require(first_expert >= 0, "bucket_by_expert", "first_expert", "must be >= 0");
  ExpertBuckets<Mem> b;
  b.n_experts = n_experts;
  b.first_expert = first_expert;
  b.n_tokens = int(topk_ids.extent(0));
  b.top_k = int(topk_ids.extent(1));
  const int slots = b.n_tokens * b.top_k;
  b.counts = Kokkos::View<int*, Mem>("relayout::counts", n_experts);
  b.offsets = Kokkos::View<int*, Mem>("relayout::offsets", n_experts + 1);
  b.slot_of = Kokkos::View<int*, Mem>("relayout::slot_of", slots);
  Kokkos::View<int*, Mem> slot_token("relayout::slot_token", slots);  // trimmed to rows() below
  auto counts = b.counts;
  auto offsets = b.offsets;
  auto slot_of = b.slot_of;
  const int top_k = b.top_k;
  Kokkos::parallel_for(
      "relayout::kernels::bucket_by_expert", Kokkos::RangePolicy<ExecSpace>(exec, 0, 1),
      KOKKOS_LAMBDA(const int) {
        for (int s = 0; s < slots; ++s) {
          const int e = topk_ids(s / top_k, s % top_k) - first_expert;
          if (e >= 0 && e < n_experts) ++counts(e);
        }
        offsets(0) = 0;
        for (int e = 0; e < n_experts; ++e) offsets(e + 1) = offsets(e) + counts(e);
        for (int e = 0; e < n_experts; ++e) counts(e) = 0;  // reused as fill cursors
        for (int s = 0; s < slots; ++s) {
          const int e = topk_ids(s / top_k, s % top_k) - first_expert;
          if (e >= 0 && e < n_experts) {
            const int pos = offsets(e) + counts(e)++;
            slot_of(s) = pos;
            slot_token(pos) = s / top_k;
          } else {
            slot_of(s) = -1;
          }
        }
      });
  b.host_offsets = Kokkos::View<int*, Kokkos::HostSpace>("relayout::host_offsets", n_experts + 1);
  Kokkos::deep_copy(exec, b.host_offsets, b.offsets);
  exec.fence();
  b.slot_token = Kokkos::subview(slot_token, std::make_pair(0, b.rows()));
  return b;
}

// Packed SwiGLU weights of `count` experts: w13 = [w1; w3] (2*intermediate x hidden each) and
// w2 (hidden x intermediate each). intermediate may be a moe_tp shard.
template <class T, class ExecSpace = Kokkos::DefaultExecutionSpace>
struct ExpertWeights {
  PackedWeights<T, ExecSpace> w13;
  PackedWeights<T, ExecSpace> w2;
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
inline ShardRange intermediate_shard(std::int64_t intermediate, int n, int r, std::int64_t unit = 1) {
  return impl::even_shard("intermediate_shard", intermediate, unit, n, r);
}

namespace impl {

// h[i, c] = silu(gu[i, c]) * gu[i, I + c] for the rows of one expert.
template <class T>
struct SwiGlu {
  const T* gu;
  T* h;
  int inter;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t idx) const {
    const std::int64_t i = idx / inter;
    const int c = int(idx % inter);
    const T g = gu[i * 2 * inter + c];
    h[i * inter + c] = g / (T(1) + impl::exp(-g)) * gu[i * 2 * inter + inter + c];
  }
};

// One SwiGLU pass over m rows of x (through `rows`, or contiguous when null), written to y rows.
template <class ExecSpace, class T>
void swiglu_rows(const ExecSpace& exec, const T* x, std::int64_t ldx, const int* rows, int m,
                 const ExpertWeights<T, ExecSpace>& w, int e, T* y, std::int64_t ldy, bool accumulate,
                 T* gu, T* h, T* a_pack) {
  if (m == 0) return;
  const int H = w.hidden(), I = w.intermediate();
  gemm_packed(exec, x, ldx, rows, m, H, w.w13.matrix(e), 2 * I, gu, std::int64_t(2) * I,
              static_cast<const T*>(nullptr), false, a_pack);
  Kokkos::parallel_for("relayout::kernels::swiglu", Kokkos::RangePolicy<ExecSpace>(exec, 0, std::int64_t(m) * I),
                       SwiGlu<T>{gu, h, I});
  gemm_packed(exec, static_cast<const T*>(h), std::int64_t(I), static_cast<const int*>(nullptr), m, I,
              w.w2.matrix(e), H, y, ldy, static_cast<const T*>(nullptr), accumulate, a_pack);
}

template <class ExecSpace, class T>
struct FfnWorkspace {
  using Mem = typename ExecSpace::memory_space;
  Kokkos::View<T*, Mem> gu, h, a_pack;
  FfnWorkspace(std::int64_t max_rows, int hidden, int inter)
      : gu(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("relayout::ffn_gu")),
           max_rows * 2 * inter),
        h(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("relayout::ffn_h")), max_rows * inter),
        a_pack(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("relayout::ffn_a_pack")),
               gemm_a_pack_size<ExecSpace, T>(max_rows, hidden > inter ? hidden : inter)) {}
};

}  // namespace impl

// Runs every local expert on its rows: y_sorted (buckets.rows() x hidden) row p holds
// FFN_e(x[slot_token[p]]) for the expert e whose bucket holds p. With an intermediate shard the rows
// are partial sums.
template <class ExecSpace, RowMatrixView X, class T, MutableRowMatrixView Y>
void expert_ffn(const ExecSpace& exec, const X& x, const ExpertBuckets<typename ExecSpace::memory_space>& buckets,
                const ExpertWeights<T, ExecSpace>& w, const Y& y_sorted) {
  static_assert(std::is_same_v<scalar_of<X>, T> && std::is_same_v<scalar_of<Y>, T>,
                "relayout::kernels::expert_ffn: x, weights and y must have the same scalar type");
  using impl::require;
  using impl::str;
  require(w.count() == buckets.n_experts, "expert_ffn", "weights",
          "must hold the buckets' " + str(buckets.n_experts) + " experts, got " + str(w.count()));
  require(int(x.extent(1)) == w.hidden(), "expert_ffn", "x",
          "x.extent(1) must equal hidden " + str(w.hidden()) + ", got " + str(x.extent(1)));
  require(int(x.extent(0)) == buckets.n_tokens, "expert_ffn", "x",
          "must have the buckets' " + str(buckets.n_tokens) + " token rows, got " + str(x.extent(0)));
  require(int(y_sorted.extent(0)) == buckets.rows() && int(y_sorted.extent(1)) == w.hidden(), "expert_ffn",
          "y_sorted", "must be buckets.rows() x hidden = " + str(buckets.rows()) + " x " + str(w.hidden()));
  int max_rows = 0;
  for (int e = 0; e < buckets.n_experts; ++e) {
    const int n = buckets.host_offsets(e + 1) - buckets.host_offsets(e);
    max_rows = n > max_rows ? n : max_rows;
  }
  if (max_rows == 0) return;
  impl::FfnWorkspace<ExecSpace, T> ws(max_rows, w.hidden(), w.intermediate());
  for (int e = 0; e < buckets.n_experts; ++e) {
    const int begin = buckets.host_offsets(e), m = buckets.host_offsets(e + 1) - begin;
    impl::swiglu_rows(exec, x.data(), std::int64_t(x.stride(0)), buckets.slot_token.data() + begin, m, w, e,
                      y_sorted.data() + std::int64_t(begin) * y_sorted.stride(0),
                      std::int64_t(y_sorted.stride(0)), false, ws.gu.data(), ws.h.data(), ws.a_pack.data());
  }
}

// Dense SwiGLU FFN on every row (the shared expert; `w` holds one expert). accumulate: y += FFN(x).
template <class ExecSpace, RowMatrixView X, class T, MutableRowMatrixView Y>
void swiglu_ffn(const ExecSpace& exec, const X& x, const ExpertWeights<T, ExecSpace>& w, const Y& y,
                bool accumulate = false) {
  static_assert(std::is_same_v<scalar_of<X>, T> && std::is_same_v<scalar_of<Y>, T>,
                "relayout::kernels::swiglu_ffn: x, weights and y must have the same scalar type");
  using impl::require;
  using impl::str;
  require(w.count() == 1, "swiglu_ffn", "weights", "must hold one expert, got " + str(w.count()));
  require(int(x.extent(1)) == w.hidden(), "swiglu_ffn", "x",
          "x.extent(1) must equal hidden " + str(w.hidden()) + ", got " + str(x.extent(1)));
  require(y.extent(0) == x.extent(0) && int(y.extent(1)) == w.hidden(), "swiglu_ffn", "y",
          "must be x.extent(0) x hidden = " + str(x.extent(0)) + " x " + str(w.hidden()));
  const int m = int(x.extent(0));
  if (m == 0) return;
  impl::FfnWorkspace<ExecSpace, T> ws(m, w.hidden(), w.intermediate());
  impl::swiglu_rows(exec, x.data(), std::int64_t(x.stride(0)), static_cast<const int*>(nullptr), m, w, 0,
                    y.data(), std::int64_t(y.stride(0)), accumulate, ws.gu.data(), ws.h.data(),
                    ws.a_pack.data());
}

// out[t] = sum_j topk_weights[t][j] * y_sorted[slot_of(t, j)] over the slots this rank handled, in
// j order (deterministic, no atomics); accumulate: out[t] += that sum (e.g. on top of the shared
// expert's output).
template <class ExecSpace, RowMatrixView Y, RowMatrixView W, MutableRowMatrixView O>
void moe_combine(const ExecSpace& exec, const Y& y_sorted,
                 const ExpertBuckets<typename ExecSpace::memory_space>& buckets, const W& topk_weights,
                 const O& out, bool accumulate = false) {
  static_assert(std::is_same_v<scalar_of<Y>, scalar_of<O>> && std::is_same_v<scalar_of<W>, scalar_of<O>>,
                "relayout::kernels::moe_combine: y_sorted, weights and out must have the same scalar type");
  using impl::require;
  using impl::str;
  require(int(y_sorted.extent(0)) == buckets.rows(), "moe_combine", "y_sorted",
          "must have buckets.rows() = " + str(buckets.rows()) + " rows, got " + str(y_sorted.extent(0)));
  require(int(topk_weights.extent(0)) == buckets.n_tokens && int(topk_weights.extent(1)) == buckets.top_k,
          "moe_combine", "topk_weights",
          "must be tokens x top_k = " + str(buckets.n_tokens) + " x " + str(buckets.top_k));
  require(int(out.extent(0)) == buckets.n_tokens && out.extent(1) == y_sorted.extent(1), "moe_combine", "out",
          "must be tokens x hidden = " + str(buckets.n_tokens) + " x " + str(y_sorted.extent(1)));
  using T = scalar_of<O>;
  const int top_k = buckets.top_k, hidden = int(out.extent(1));
  auto slot_of = buckets.slot_of;
  Kokkos::parallel_for(
      "relayout::kernels::moe_combine", Kokkos::RangePolicy<ExecSpace>(exec, 0, std::int64_t(buckets.n_tokens)),
      KOKKOS_LAMBDA(const std::int64_t t) {
        T* o = &out(t, 0);
        if (!accumulate)
          for (int d = 0; d < hidden; ++d) o[d] = T(0);
        for (int j = 0; j < top_k; ++j) {
          const int p = slot_of(t * top_k + j);
          if (p < 0) continue;
          const T wj = topk_weights(t, j);
          const T* yr = &y_sorted(p, 0);
          for (int d = 0; d < hidden; ++d) o[d] += wj * yr[d];
        }
      });
}

}  // namespace relayout::kernels

namespace relayout::kernels {

// SwiGLU experts on rows already grouped by local expert (an ExpertBatch from ep_dispatch or the
// bridge): y(i) = FFN_e(x(i)) for the rows of group e, unweighted.
template <class ExecSpace, class T, MutableRowMatrixView Y>
void expert_ffn(const ExecSpace& exec, const ExpertBatch<T, ExecSpace>& batch, const ExpertWeights<T, ExecSpace>& w,
                const Y& y) {
  using impl::require;
  using impl::str;
  require(w.count() == batch.experts(), "expert_ffn", "weights",
          "must hold the batch's " + str(batch.experts()) + " local experts, got " + str(w.count()));
  require(batch.rows() == 0 || int(batch.x.extent(1)) == w.hidden(), "expert_ffn", "batch",
          "rows must have hidden " + str(w.hidden()) + " columns, got " + str(batch.x.extent(1)));
  require(std::int64_t(y.extent(0)) == batch.rows() && (batch.rows() == 0 || int(y.extent(1)) == w.hidden()),
          "expert_ffn", "y", "must be batch.rows() x hidden = " + str(batch.rows()) + " x " + str(w.hidden()));
  std::int64_t max_rows = 0;
  for (int e = 0; e < batch.experts(); ++e) max_rows = batch.count(e) > max_rows ? batch.count(e) : max_rows;
  if (max_rows == 0) return;
  impl::FfnWorkspace<ExecSpace, T> ws(max_rows, w.hidden(), w.intermediate());
  const std::int64_t ldx = std::int64_t(batch.x.stride(0)), ldy = std::int64_t(y.stride(0));
  for (int e = 0; e < batch.experts(); ++e)
    impl::swiglu_rows(exec, batch.x.data() + batch.offset(e) * ldx, ldx, static_cast<const int*>(nullptr),
                      int(batch.count(e)), w, e, y.data() + batch.offset(e) * ldy, ldy, false, ws.gu.data(),
                      ws.h.data(), ws.a_pack.data());
}

// relayout's ready-made Experts (ExpertsFor): SwiGLU routed experts, and a shared SwiGLU expert
// when `shared_experts` holds one (its count is 0 otherwise). Engines with other experts bring
// their own callable.
template <class T, class ExecSpace = Kokkos::DefaultExecutionSpace>
struct SwigluExperts {
  ExpertWeights<T, ExecSpace> routed;
  ExpertWeights<T, ExecSpace> shared_experts;

  void operator()(const ExecSpace& exec, const ExpertBatch<T, ExecSpace>& batch,
                  const relayout::impl::RowsView<T, ExecSpace>& y) const {
    expert_ffn(exec, batch, routed, y);
  }
  void shared(const ExecSpace& exec, const relayout::impl::RowsView<T, ExecSpace>& x,
              const relayout::impl::RowsView<T, ExecSpace>& y) const {
    if (shared_experts.count() > 0 && x.extent(0) > 0) swiglu_ffn(exec, x, shared_experts, y, true);
  }
};

// relayout's ready-made router (RouterFor): a gate projection, then route() (softmax or sigmoid
// scoring, grouped top-k, renormalisation and scaling as `config` says).
template <class T, class ExecSpace = Kokkos::DefaultExecutionSpace>
struct LinearTopkRouter {
  PackedWeights<T, ExecSpace> gate;  // experts x hidden
  RouterConfig config;

  int top_k() const { return config.top_k; }
  void operator()(const ExecSpace& exec, const relayout::impl::RowsView<T, ExecSpace>& x, TopK<T, ExecSpace>& out) const {
    relayout::impl::RowsView<T, ExecSpace> logits(
        Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("relayout::router_logits")), x.extent(0),
        std::size_t(gate.out_features));
    linear(exec, x, gate, logits);
    route(exec, logits, config, out.ids, out.weights);
  }
};

}  // namespace relayout::kernels
