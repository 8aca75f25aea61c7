// linear: y = x . W^T (+ bias) for token rows, W stored like torch (out_features x in_features),
// and the tensor-parallel shard helpers: which output rows of W a rank holds for a column-parallel
// layer (wq_b over attn_tp: whole query heads), which input columns for a row-parallel one (wo_b:
// partial sums, completed by an all-reduce outside this header).
#pragma once

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <string>

#include "relayout/kernels/error.hpp"
#include "relayout/kernels/impl/gemm.hpp"
#include "relayout/kernels/types.hpp"

namespace relayout::kernels {

// Weights packed for the GEMM of ExecSpace: `count` matrices of out_features x in_features (one per
// expert; 1 for a plain layer). Pack once at load time; packing costs one pass over W.
template <class T, class ExecSpace = Kokkos::DefaultExecutionSpace>
struct PackedWeights {
  using execution_space = ExecSpace;
  using memory_space = typename ExecSpace::memory_space;
  using tile = impl::GemmTile<ExecSpace, T>;

  int count = 0;
  int out_features = 0;
  int in_features = 0;
  Kokkos::View<T*, memory_space> data;

  std::int64_t panels() const { return impl::ceil_div(out_features, tile::nr); }
  std::int64_t matrix_size() const { return panels() * in_features * tile::nr; }
  const T* matrix(int e) const { return data.data() + e * matrix_size(); }
};

namespace impl {

// Reads W(e, o, i) from a rank-2 (count 1) or rank-3 view, and a second one stacked below it.
template <class W1, class W2>
struct PackB {
  using T = typename W1::non_const_value_type;
  W1 w1;
  W2 w2;  // rows out1.. of the stacked matrix; extent 0 when absent
  int out1, out_total, in, nr;
  std::int64_t panels;
  T* out;

  KOKKOS_INLINE_FUNCTION T read(const W1& w, int e, int o, int i) const {
    if constexpr (static_cast<int>(W1::rank) == 2) {
      (void)e;
      return w(o, i);
    } else {
      return w(e, o, i);
    }
  }
  KOKKOS_INLINE_FUNCTION T read2(int e, int o, int i) const {
    if constexpr (static_cast<int>(W2::rank) == 2) {
      (void)e;
      return w2(o, i);
    } else {
      return w2(e, o, i);
    }
  }
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t idx) const {
    const std::int64_t e = idx / (panels * in);
    const std::int64_t p = (idx / in) % panels;
    const int i = static_cast<int>(idx % in);
    T* dst = out + idx * nr;
    for (int j = 0; j < nr; ++j) {
      const int o = static_cast<int>(p * nr + j);
      T v = T(0);
      if (o < out1)
        v = read(w1, int(e), o, i);
      else if (o < out_total)
        v = read2(int(e), o - out1, i);
      dst[j] = v;
    }
  }
};

template <class ExecSpace, class W1, class W2>
auto pack_stacked(const ExecSpace& exec, const W1& w1, const W2& w2, int out2, const char* what) {
  using T = typename W1::non_const_value_type;
  static_assert(accessible_from<ExecSpace, W1> && accessible_from<ExecSpace, W2>,
                "relayout::kernels: weights must live in a memory space the execution space can read");
  constexpr bool three = static_cast<int>(W1::rank) == 3;
  PackedWeights<T, ExecSpace> packed;
  packed.count = three ? int(w1.extent(0)) : 1;
  const int out1 = int(w1.extent(three ? 1 : 0));
  packed.out_features = out1 + out2;
  packed.in_features = int(w1.extent(three ? 2 : 1));
  require(packed.out_features > 0, what, "W", "out_features must be >= 1");
  packed.data = Kokkos::View<T*, typename ExecSpace::memory_space>(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("relayout::packed_weights")),
      packed.count * packed.matrix_size());
  using Tile = GemmTile<ExecSpace, T>;
  const std::int64_t total = std::int64_t(packed.count) * packed.panels() * packed.in_features;
  Kokkos::parallel_for("relayout::kernels::pack_b", Kokkos::RangePolicy<ExecSpace>(exec, 0, total),
                       PackB<W1, W2>{w1, w2, out1, packed.out_features, packed.in_features, Tile::nr,
                                     packed.panels(), packed.data.data()});
  return packed;
}

}  // namespace impl

// Packs W (out_features x in_features, any layout: a shard subview packs directly).
template <class ExecSpace, MatrixView W>
PackedWeights<scalar_of<W>, ExecSpace> pack_weights(const ExecSpace& exec, const W& w) {
  return impl::pack_stacked(exec, w, w, 0, "pack_weights");
}

// Packs a stack of matrices (count x out_features x in_features), e.g. one per expert.
template <class ExecSpace, Matrix3View W>
PackedWeights<scalar_of<W>, ExecSpace> pack_weights(const ExecSpace& exec, const W& w) {
  return impl::pack_stacked(exec, w, w, 0, "pack_weights");
}

// Packs [top; bottom] stacked along out_features (same rank, count and in_features), e.g. the gate
// and up projections of SwiGLU as one GEMM.
template <class ExecSpace, KokkosView Top, KokkosView Bottom>
  requires(static_cast<int>(Top::rank) == static_cast<int>(Bottom::rank))
PackedWeights<scalar_of<Top>, ExecSpace> pack_weights_stacked(const ExecSpace& exec, const Top& top,
                                                              const Bottom& bottom) {
  constexpr int r = static_cast<int>(Top::rank);
  static_assert(r == 2 || r == 3, "relayout::kernels::pack_weights_stacked: rank-2 or rank-3 views");
  for (int d = 0; d < r; ++d) {
    if (d == r - 2) continue;
    impl::require(top.extent(d) == bottom.extent(d), "pack_weights_stacked", "bottom",
                  "extent(" + std::to_string(d) + ") must equal top's (" +
                      impl::str(top.extent(d)) + "), got " + impl::str(bottom.extent(d)));
  }
  return impl::pack_stacked(exec, top, bottom, int(bottom.extent(r - 2)), "pack_weights_stacked");
}

namespace impl {
template <class ExecSpace, class X, class T, class Y, class B>
void check_linear(const X& x, const PackedWeights<T, ExecSpace>& w, const Y& y, const B& bias) {
  require(w.count == 1, "linear", "w", "must hold one matrix (count == 1), got " + str(w.count));
  require(int(x.extent(1)) == w.in_features, "linear", "x",
          "x.extent(1) must equal in_features " + str(w.in_features) + ", got " + str(x.extent(1)));
  require(y.extent(0) == x.extent(0), "linear", "y",
          "y.extent(0) must equal x.extent(0) " + str(x.extent(0)) + ", got " + str(y.extent(0)));
  require(int(y.extent(1)) == w.out_features, "linear", "y",
          "y.extent(1) must equal out_features " + str(w.out_features) + ", got " + str(y.extent(1)));
  require(bias.extent(0) == 0 || int(bias.extent(0)) == w.out_features, "linear", "bias",
          "must be empty or hold out_features " + str(w.out_features) + " entries, got " +
              str(bias.extent(0)));
  require(x.extent(0) <= 0x7fffffff && x.extent(1) <= 0x7fffffff, "linear", "x",
          "extents must fit in int");
}
}  // namespace impl

// y = x . W^T + bias (bias may be an empty view); accumulate: y += x . W^T + bias.
// x: rows x in_features, y: rows x out_features, both LayoutRight. y must not alias x.
template <class ExecSpace, RowMatrixView X, MutableRowMatrixView Y, class T,
          VectorView B = Kokkos::View<const T*, typename ExecSpace::memory_space>>
void linear(const ExecSpace& exec, const X& x, const PackedWeights<T, ExecSpace>& w, const Y& y,
            const B& bias = B(), bool accumulate = false) {
  static_assert(std::is_same_v<scalar_of<X>, T> && std::is_same_v<scalar_of<Y>, T> &&
                    std::is_same_v<scalar_of<B>, T>,
                "relayout::kernels::linear: x, W, y and bias must have the same scalar type");
  static_assert(accessible_from<ExecSpace, X> && accessible_from<ExecSpace, Y>,
                "relayout::kernels::linear: x and y must be readable by the execution space");
  impl::check_linear(x, w, y, bias);
  const int m = int(x.extent(0)), k = w.in_features;
  Kokkos::View<T*, typename ExecSpace::memory_space> a_pack(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("relayout::linear_a_pack")),
      impl::gemm_a_pack_size<ExecSpace, T>(m, k));
  impl::gemm_packed(exec, x.data(), std::int64_t(x.stride(0)), static_cast<const int*>(nullptr), m, k,
                    w.matrix(0), w.out_features, y.data(), std::int64_t(y.stride(0)),
                    bias.extent(0) ? bias.data() : static_cast<const T*>(nullptr), accumulate,
                    a_pack.data());
}

// Convenience: packs W (out_features x in_features) for this call only. Prefer packing once.
template <class ExecSpace, RowMatrixView X, MatrixView W, MutableRowMatrixView Y,
          VectorView B = Kokkos::View<const scalar_of<X>*, typename ExecSpace::memory_space>>
void linear(const ExecSpace& exec, const X& x, const W& w, const Y& y, const B& bias = B(),
            bool accumulate = false) {
  linear(exec, x, pack_weights(exec, w), y, bias, accumulate);
}

// ---- tensor-parallel shards -----------------------------------------------------------------

namespace impl {
inline ShardRange even_shard(const char* fn, std::int64_t features, std::int64_t unit, int n, int r) {
  require(n >= 1, fn, "n", "group size must be >= 1, got " + str(n));
  require(r >= 0 && r < n, fn, "r", "group rank must be in [0, " + str(n) + "), got " + str(r));
  require(unit >= 1, fn, "unit", "must be >= 1 (1 feature, or head_dim for whole heads), got " + str(unit));
  require(features >= 0 && features % unit == 0, fn, "features",
          "must be a multiple of unit " + str(unit) + ", got " + str(features));
  const std::int64_t units = features / unit;
  require(units % n == 0, fn, "n",
          "the " + str(units) + " units (features / unit) must split evenly over the group size " +
              str(n));
  const std::int64_t per = units / n * unit;
  return {r * per, per};
}
}  // namespace impl

// Column-parallel (wq_b over attn_tp): the output features [begin, end) group rank r of n holds,
// whole units of `unit` features (unit = head_dim: whole query heads). Rank r computes
// y[:, begin:end) = x . W[begin:end, :]^T + bias[begin:end); no reduction follows.
inline ShardRange column_parallel_shard(std::int64_t out_features, std::int64_t unit, int n, int r) {
  return impl::even_shard("column_parallel_shard", out_features, unit, n, r);
}

// Row-parallel (wo_b over attn_tp, w2 over moe_tp): the input features [begin, end) rank r holds.
// Rank r computes the partial sum x[:, begin:end) . W[:, begin:end)^T; the sum over the group (an
// all-reduce) completes it. Add the bias once: on rank 0 only, or after the reduction.
inline ShardRange row_parallel_shard(std::int64_t in_features, std::int64_t unit, int n, int r) {
  return impl::even_shard("row_parallel_shard", in_features, unit, n, r);
}

// The rows of W (out x in) a column-parallel rank holds, as a subview (pack it with pack_weights).
template <MatrixView W>
auto column_parallel_weight(const W& w, std::int64_t unit, int n, int r) {
  const ShardRange s = column_parallel_shard(std::int64_t(w.extent(0)), unit, n, r);
  return Kokkos::subview(w, s.pair(), Kokkos::ALL());
}
template <VectorView B>
auto column_parallel_bias(const B& bias, std::int64_t unit, int n, int r) {
  const ShardRange s = column_parallel_shard(std::int64_t(bias.extent(0)), unit, n, r);
  return Kokkos::subview(bias, s.pair());
}
// The columns of W (out x in) a row-parallel rank holds (a strided subview; pack_weights copies it
// into the packed layout).
template <MatrixView W>
auto row_parallel_weight(const W& w, std::int64_t unit, int n, int r) {
  const ShardRange s = row_parallel_shard(std::int64_t(w.extent(1)), unit, n, r);
  return Kokkos::subview(w, Kokkos::ALL(), s.pair());
}

}  // namespace relayout::kernels
