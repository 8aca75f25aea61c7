// linear: y = x . W^T (+ bias) for token rows, W stored like torch (out_features x in_features),
// and the tensor-parallel shard helpers: which output rows of W a rank holds for a column-parallel
// layer (wq_b over attn_tp: whole query heads), which input columns for a row-parallel one (wo_b:
// partial sums, completed by an all-reduce outside this header). Every GEMM of the kernels goes
// through one dispatch point here (impl::gemm_dispatch): relayout's packed kernel or the vendor
// library (Kokkos Kernels, when the build has it), as the weights were packed for.
#pragma once

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <string>
#include <type_traits>

#include "relayout/kernels/error.hpp"
#include "relayout/kernels/impl/gemm.hpp"
#include "relayout/kernels/impl/gemm_bf16.hpp"
#include "relayout/kernels/impl/gemm_vendor.hpp"
#include "relayout/kernels/types.hpp"

namespace relayout::kernels {

// Which GEMM runs on a set of packed weights. packed: relayout's register-tiled kernel (panels of
// NR outputs). vendor: KokkosBlas::gemm (cuBLAS, rocBLAS or the host BLAS Kokkos Kernels calls) on
// the plain in_features x out_features matrix; float and double, builds with Kokkos Kernels only.
// automatic: the rule of impl::choose_gemm_backend. The weights' layout follows the choice, so it
// is made once, when they are packed.
enum class GemmBackend : std::uint8_t { automatic, packed, vendor };

// Weights packed for the GEMM of ExecSpace: `count` matrices of out_features x in_features (one per
// expert; 1 for a plain layer). Pack once at load time; packing costs one pass over W. T = bf16
// packs k in pairs (the layout AVX512-BF16 reads) and computes in fp32; such weights multiply bf16
// rows or fp32 rows (weights_fit_rows_v below).
template <class T, class ExecSpace = Kokkos::DefaultExecutionSpace>
struct PackedWeights {
  using execution_space = ExecSpace;
  using memory_space = typename ExecSpace::memory_space;
  using tile = impl::GemmTile<ExecSpace, T>;

  int count = 0;
  int out_features = 0;
  int in_features = 0;
  GemmBackend backend = GemmBackend::packed;  // packed or vendor, never automatic
  // bf16 weights only: fp32 rows are rounded to bf16 (nearest even) before they are multiplied,
  // so the GEMM takes bf16 activations with fp32 accumulation and output, and runs the bf16
  // instructions where they pay (impl::bf16_kernel: AMX-BF16 tiles where the CPU has them and Linux
  // grants them, 2.7-3.4x the fp32 GEMM from 16 rows; vdpbf16ps on AMD parts with AVX512-BF16,
  // about twice; elsewhere the widening kernel on the rounded rows). false: fp32 rows
  // multiply the bf16 weights exactly (the widening kernel), the weights' rounding the only one.
  bool round_rows = false;
  Kokkos::View<T*, memory_space> data;

  // vendor: one "panel" as wide as the matrix, i.e. W^T row-major (in_features x out_features).
  bool vendor() const { return backend == GemmBackend::vendor; }
  std::int64_t panel_width() const { return vendor() ? out_features : tile::nr; }
  std::int64_t k_step() const { return vendor() ? 1 : tile::k_step; }
  std::int64_t panels() const { return impl::ceil_div(out_features, panel_width()); }
  std::int64_t k_padded() const { return impl::ceil_div(in_features, k_step()) * k_step(); }
  std::int64_t matrix_size() const { return panels() * k_padded() * panel_width(); }
  const T* matrix(int e) const { return data.data() + e * matrix_size(); }
};

// The kernels' settings from the environment, checked: RELAYOUT_BF16_KERNEL (amx, dpbf16 or widen;
// unset: chosen from the CPU). Throws KernelError naming the variable and the values it takes. The
// bf16 GEMM checks it again on every call; a program calls this at its start to refuse a bad value
// before any work.
inline void check_kernel_settings() { impl::bf16_kernel_setting(); }

// Whether weights of scalar W multiply rows of scalar T (linear, the experts, the router): the same
// type, or bf16 weights for fp32 rows (bf16 weights, fp32 activations and outputs, fp32
// accumulation: each product is exact in fp32, so the weights' rounding is the only one added).
template <class T, class W>
inline constexpr bool weights_fit_rows_v =
    std::is_same_v<T, W> || (std::is_same_v<W, relayout::bf16> && std::is_same_v<T, float>);

// The scalar of the output rows of linear on rows of T with weights of W: T, or fp32 for bf16 rows
// and bf16 weights (the fp32 sums unrounded: router logits, or an fp32 residual stream).
template <class T, class W, class Y>
inline constexpr bool output_fits_rows_v =
    std::is_same_v<Y, T> ||
    (std::is_same_v<T, relayout::bf16> && std::is_same_v<W, relayout::bf16> && std::is_same_v<Y, float>);

namespace impl {

// The dispatch rule, per execution space, scalar and weight shape (the row count is not known when
// weights are packed). Non-host spaces: the vendor library wherever the build has it (a hand-written
// GEMM is far below cuBLAS/rocBLAS there). The host: the packed kernel for every shape class
// measured (a layer and the experts' GEMMs, 1 to 1024 rows: faster or even from 8 to 256 rows,
// within 14% at 1024; docs/benchmarks.md, "GEMM dispatch"), so the shape does not enter yet.
// bf16, and builds without Kokkos Kernels: the packed kernel. A forced vendor the build cannot run
// is the caller's error.
template <class ExecSpace, class T>
GemmBackend choose_gemm_backend(int out_features, int in_features, GemmBackend requested = GemmBackend::automatic) {
  (void)out_features;
  (void)in_features;
  if (requested == GemmBackend::vendor)
    require(vendor_gemm_available_v<T>, "pack_weights", "backend",
            "GemmBackend::vendor needs a build with Kokkos Kernels (RELAYOUT_HAVE_KOKKOS_KERNELS) and "
            "float or double weights");
  if (requested != GemmBackend::automatic) return requested;
  if constexpr (!vendor_gemm_available_v<T>) return GemmBackend::packed;
  return is_host_space_v<ExecSpace> ? GemmBackend::packed : GemmBackend::vendor;
}

// Reads W(e, o, i) from a rank-2 (count 1) or rank-3 view, and a second one stacked below it.
template <class W1, class W2>
struct PackB {
  using T = typename W1::non_const_value_type;
  W1 w1;
  W2 w2;  // rows out1.. of the stacked matrix; extent 0 when absent
  int out1, out_total, in, nr;
  std::int64_t panels;
  T* out;
  int k_step = 1, k_padded = 0;  // k_step 2: k-pairs, [panels][k_padded / 2][nr][2]

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
    int step = 1;
    if (k_step == 2) {
      dst = out + ((e * panels + p) * k_padded + (i & ~1)) * nr + (i & 1);
      step = 2;
    }
    for (int j = 0; j < nr; ++j) {
      const int o = static_cast<int>(p * nr + j);
      T v = T(0);
      if (o < out1)
        v = read(w1, int(e), o, i);
      else if (o < out_total)
        v = read2(int(e), o - out1, i);
      dst[j * step] = v;
    }
  }
};

template <class ExecSpace, class W1, class W2>
auto pack_stacked(const ExecSpace& exec, const W1& w1, const W2& w2, int out2, const char* what,
                  GemmBackend backend) {
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
  packed.backend = choose_gemm_backend<ExecSpace, T>(packed.out_features, packed.in_features, backend);
  // k-pairs of an odd k end in a padding element no pass writes: allocate zeroed.
  const std::string label("relayout::packed_weights");
  const std::int64_t size = packed.count * packed.matrix_size();
  packed.data = packed.k_step() > 1 && packed.k_padded() != packed.in_features
                    ? Kokkos::View<T*, typename ExecSpace::memory_space>(label, size)
                    : Kokkos::View<T*, typename ExecSpace::memory_space>(Kokkos::view_alloc(Kokkos::WithoutInitializing, label), size);
  const std::int64_t total = std::int64_t(packed.count) * packed.panels() * packed.in_features;
  Kokkos::parallel_for("relayout::kernels::pack_b", Kokkos::RangePolicy<ExecSpace>(exec, 0, total),
                       PackB<W1, W2>{w1, w2, out1, packed.out_features, packed.in_features,
                                     int(packed.panel_width()), packed.panels(), packed.data.data(),
                                     int(packed.k_step()), int(packed.k_padded())});
  return packed;
}

}  // namespace impl

// Packs W (out_features x in_features, any layout: a shard subview packs directly). `backend`
// forces one GEMM (GemmBackend above); automatic picks by execution space, scalar and shape.
template <class ExecSpace, MatrixView W>
PackedWeights<scalar_of<W>, ExecSpace> pack_weights(const ExecSpace& exec, const W& w,
                                                    GemmBackend backend = GemmBackend::automatic) {
  return impl::pack_stacked(exec, w, w, 0, "pack_weights", backend);
}

// Packs a stack of matrices (count x out_features x in_features), e.g. one per expert.
template <class ExecSpace, Matrix3View W>
PackedWeights<scalar_of<W>, ExecSpace> pack_weights(const ExecSpace& exec, const W& w,
                                                    GemmBackend backend = GemmBackend::automatic) {
  return impl::pack_stacked(exec, w, w, 0, "pack_weights", backend);
}

// Packs [top; bottom] stacked along out_features (same rank, count and in_features), e.g. the gate
// and up projections of SwiGLU as one GEMM.
template <class ExecSpace, KokkosView Top, KokkosView Bottom>
  requires(static_cast<int>(Top::rank) == static_cast<int>(Bottom::rank))
PackedWeights<scalar_of<Top>, ExecSpace> pack_weights_stacked(const ExecSpace& exec, const Top& top,
                                                              const Bottom& bottom,
                                                              GemmBackend backend = GemmBackend::automatic) {
  constexpr int r = static_cast<int>(Top::rank);
  static_assert(r == 2 || r == 3, "relayout::kernels::pack_weights_stacked: rank-2 or rank-3 views");
  for (int d = 0; d < r; ++d) {
    if (d == r - 2) continue;
    impl::require(top.extent(d) == bottom.extent(d), "pack_weights_stacked", "bottom",
                  "extent(" + std::to_string(d) + ") must equal top's (" +
                      impl::str(top.extent(d)) + "), got " + impl::str(bottom.extent(d)));
  }
  return impl::pack_stacked(exec, top, bottom, int(bottom.extent(r - 2)), "pack_weights_stacked", backend);
}

namespace impl {

// Scratch of gemm_dispatch for m rows of T and k, weights of W: the packed kernel's A blocks, or the
// vendor side's gathered rows (m * k, never more), in T slots.
template <class ExecSpace, class T, class W = T>
std::int64_t gemm_workspace_size(std::int64_t m, std::int64_t k) {
  static_assert(weights_fit_rows_v<T, W>, "relayout::kernels: weights of this scalar do not multiply these rows");
  if constexpr (std::is_same_v<W, relayout::bf16>)
    return gemm_a_pack_size_bf16<ExecSpace, T>(m, k);
  else
    return gemm_a_pack_size<ExecSpace, T>(m, k);
}

// The one GEMM entry point of the kernels: C[m x n] (+)= rows of A . W_e^T (+ bias), n =
// w.out_features, k = w.in_features, A rows read through `rows` when non-null. Runs the GEMM the
// weights were packed for; workspace holds gemm_workspace_size<ExecSpace, T, W>(m, k) scalars.
// A is T; W is T, or bf16 for fp32 rows (weights_fit_rows_v); C and bias are TC: T, or fp32 for
// bf16 rows (output_fits_rows_v).
template <class ExecSpace, class T, class W, class TC = T>
void gemm_dispatch(const ExecSpace& exec, const T* a, std::int64_t lda, const int* rows, int m,
                   const PackedWeights<W, ExecSpace>& w, int e, TC* c, std::int64_t ldc, const TC* bias,
                   bool accumulate, T* workspace) {
  static_assert(weights_fit_rows_v<T, W>, "relayout::kernels: weights of this scalar do not multiply these rows");
  static_assert(output_fits_rows_v<T, W, TC>, "relayout::kernels: these rows and weights do not give outputs of this scalar");
  const int k = w.in_features, n = w.out_features;
  if constexpr (std::is_same_v<W, relayout::bf16>) {  // fp32 accumulation, AVX512-BF16 where the CPU has it
    gemm_packed_bf16(exec, a, lda, rows, m, k, w.matrix(e), n, c, ldc, bias, accumulate, workspace,
                     bf16_kernel<ExecSpace>(), w.round_rows);
  } else if constexpr (std::is_same_v<TC, T>) {
#if defined(RELAYOUT_HAVE_KOKKOS_KERNELS)
    if constexpr (vendor_gemm_available_v<T>) {
      if (w.vendor()) return gemm_vendor(exec, a, lda, rows, m, k, w.matrix(e), n, c, ldc, bias, accumulate, workspace);
    }
#endif
    gemm_packed(exec, a, lda, rows, m, k, w.matrix(e), n, c, ldc, bias, accumulate);
  }
}

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
// x: rows x in_features, y: rows x out_features, both LayoutRight. y must not alias x. x, y and bias
// share one scalar T; the weights' W is T, or bf16 for fp32 x (weights_fit_rows_v). bf16 x and
// weights may write fp32 y and bias instead (output_fits_rows_v: the fp32 sums, unrounded).
template <class ExecSpace, RowMatrixView X, MutableRowMatrixView Y, class W,
          VectorView B = Kokkos::View<const scalar_of<Y>*, typename ExecSpace::memory_space>>
void linear(const ExecSpace& exec, const X& x, const PackedWeights<W, ExecSpace>& w, const Y& y,
            const B& bias = B(), bool accumulate = false) {
  using T = scalar_of<X>;
  using TC = scalar_of<Y>;
  static_assert(output_fits_rows_v<T, W, TC> && std::is_same_v<scalar_of<B>, TC>,
                "relayout::kernels::linear: x, y and bias must have the same scalar type (or, for bf16 x and "
                "weights, fp32 y and bias)");
  static_assert(weights_fit_rows_v<T, W>,
                "relayout::kernels::linear: the weights' scalar must be x's, or bf16 for float x");
  static_assert(accessible_from<ExecSpace, X> && accessible_from<ExecSpace, Y>,
                "relayout::kernels::linear: x and y must be readable by the execution space");
  impl::check_linear(x, w, y, bias);
  const int m = int(x.extent(0));
  Kokkos::View<T*, typename ExecSpace::memory_space> workspace(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("relayout::linear_a_pack")),
      impl::gemm_workspace_size<ExecSpace, T, W>(m, w.in_features));
  impl::gemm_dispatch(exec, x.data(), std::int64_t(x.stride(0)), static_cast<const int*>(nullptr), m, w, 0,
                      y.data(), std::int64_t(y.stride(0)),
                      bias.extent(0) ? bias.data() : static_cast<const TC*>(nullptr),
                      accumulate, workspace.data());
}

// Convenience: packs W (out_features x in_features) for this call only. Prefer packing once.
template <class ExecSpace, RowMatrixView X, MatrixView W, MutableRowMatrixView Y,
          VectorView B = Kokkos::View<const scalar_of<Y>*, typename ExecSpace::memory_space>>
void linear(const ExecSpace& exec, const X& x, const W& w, const Y& y, const B& bias = B(),
            bool accumulate = false) {
  linear(exec, x, pack_weights(exec, w), y, bias, accumulate);
}

// ---- tensor-parallel shards -----------------------------------------------------------------

namespace impl {
inline Range even_shard(const char* fn, std::int64_t features, std::int64_t unit, int n, int r) {
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
inline Range column_parallel_shard(std::int64_t out_features, std::int64_t unit, int n, int r) {
  return impl::even_shard("column_parallel_shard", out_features, unit, n, r);
}

// Row-parallel (wo_b over attn_tp, w2 over moe_tp): the input features [begin, end) rank r holds.
// Rank r computes the partial sum x[:, begin:end) . W[:, begin:end)^T; the sum over the group (an
// all-reduce) completes it. Add the bias once: on rank 0 only, or after the reduction.
inline Range row_parallel_shard(std::int64_t in_features, std::int64_t unit, int n, int r) {
  return impl::even_shard("row_parallel_shard", in_features, unit, n, r);
}

// The rows of W (out x in) a column-parallel rank holds, as a subview (pack it with pack_weights).
template <MatrixView W>
auto column_parallel_weight(const W& w, std::int64_t unit, int n, int r) {
  const Range s = column_parallel_shard(std::int64_t(w.extent(0)), unit, n, r);
  return Kokkos::subview(w, s.pair(), Kokkos::ALL());
}
template <VectorView B>
auto column_parallel_bias(const B& bias, std::int64_t unit, int n, int r) {
  const Range s = column_parallel_shard(std::int64_t(bias.extent(0)), unit, n, r);
  return Kokkos::subview(bias, s.pair());
}
// The columns of W (out x in) a row-parallel rank holds (a strided subview; pack_weights copies it
// into the packed layout).
template <MatrixView W>
auto row_parallel_weight(const W& w, std::int64_t unit, int n, int r) {
  const Range s = row_parallel_shard(std::int64_t(w.extent(1)), unit, n, r);
  return Kokkos::subview(w, Kokkos::ALL(), s.pair());
}

}  // namespace relayout::kernels
