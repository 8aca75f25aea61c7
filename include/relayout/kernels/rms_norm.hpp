// RMS norm over the features of each token row, and the engines' fused form that first adds the
// residual: residual += x; x = rms_norm(residual) * weight.
#pragma once

#include <Kokkos_Core.hpp>
#include <string>
#include <type_traits>

#include "relayout/comm/scalar.hpp"
#include "relayout/kernels/error.hpp"
#include "relayout/kernels/impl/simd.hpp"
#include "relayout/kernels/types.hpp"

namespace relayout::kernels {

namespace impl {

template <class ExecSpace, class T>
KOKKOS_FORCEINLINE_FUNCTION T sum_squares(const T* x, int n) {
  return dot<lanes_v<ExecSpace, T>>(x, x, n);
}

// Input rows of float or double (compute_t of the output's scalar): the arithmetic in that type,
// the sum of squares in vectors; into bf16 or fp16 rows each stored value is rounded once, so the
// result is bitwise the rounding of the float norm.
// Input rows of bf16 or fp16 (compute_t<T> = float): each element widened as it is read, the
// arithmetic in float, each stored value rounded once to nearest even.
template <class ExecSpace, class X, class W, class Y>
struct RmsNorm {
  using T = typename Y::non_const_value_type;
  using C = compute_t<T>;
  X x;
  W weight;
  Y y;
  C eps;
  int n;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t row) const {
    const auto* xr = &x(row, 0);
    if constexpr (std::is_same_v<C, typename X::non_const_value_type>) {
      const C inv = C(1) / impl::sqrt(sum_squares<ExecSpace>(xr, n) / C(n) + eps);
      for (int j = 0; j < n; ++j) y(row, j) = T(xr[j] * inv * C(weight(j)));
    } else {
      C ss = 0;
      for (int j = 0; j < n; ++j) ss += C(xr[j]) * C(xr[j]);
      const C inv = C(1) / impl::sqrt(ss / C(n) + eps);
      for (int j = 0; j < n; ++j) y(row, j) = T(C(xr[j]) * inv * C(weight(j)));
    }
  }
};

// residual += x, then x = rms_norm(residual): for bf16 or fp16 rows the sum is rounded once into
// the residual and the norm is that of the stored residual, so add_rms_norm is rms_norm of what
// the residual holds afterwards.
template <class ExecSpace, class X, class R, class W>
struct AddRmsNorm {
  using T = typename X::non_const_value_type;
  using C = compute_t<T>;
  X x;
  R residual;
  W weight;
  C eps;
  int n;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t row) const {
    T* r = &residual(row, 0);
    if constexpr (std::is_same_v<C, T>) {
      for (int j = 0; j < n; ++j) r[j] += x(row, j);
      const T inv = T(1) / impl::sqrt(sum_squares<ExecSpace>(r, n) / T(n) + eps);
      for (int j = 0; j < n; ++j) x(row, j) = r[j] * inv * T(weight(j));
    } else {
      C ss = 0;
      for (int j = 0; j < n; ++j) {
        r[j] = T(C(r[j]) + C(x(row, j)));
        ss += C(r[j]) * C(r[j]);
      }
      const C inv = C(1) / impl::sqrt(ss / C(n) + eps);
      for (int j = 0; j < n; ++j) x(row, j) = T(C(r[j]) * inv * C(weight(j)));
    }
  }
};

// The norm's weight: the rows' scalar, or compute_t of it (fp32 weights on bf16 rows).
template <class W, class T>
inline constexpr bool norm_weight_fits_v = std::is_same_v<W, T> || std::is_same_v<W, compute_t<T>>;

template <class X, class W, class Y>
void check_norm(const char* fn, const X& x, const W& weight, const Y& y, const char* yname, double eps) {
  require(weight.extent(0) == x.extent(1), fn, "weight",
          "must hold x.extent(1) = " + str(x.extent(1)) + " entries, got " + str(weight.extent(0)));
  require(y.extent(0) == x.extent(0) && y.extent(1) == x.extent(1), fn, yname,
          "must have x's shape " + str(x.extent(0)) + " x " + str(x.extent(1)) + ", got " +
              str(y.extent(0)) + " x " + str(y.extent(1)));
  require(eps > 0, fn, "eps", "must be > 0");
  require(x.extent(1) >= 1, fn, "x", "must have at least one feature");
}

}  // namespace impl

// y = x / sqrt(mean(x^2) + eps) * weight, row by row. y may be x itself.
// y holds rows of T; x holds rows of T, or of compute_t<T> (fp32 rows normed into bf16 rows in
// one pass, bitwise the bf16 rounding of the fp32 norm); weight is T or compute_t<T> (float
// weights for bf16 rows).
template <class ExecSpace, RowMatrixView X, VectorView W, MutableRowMatrixView Y>
void rms_norm(const ExecSpace& exec, const X& x, const W& weight, double eps, const Y& y) {
  static_assert((std::is_same_v<scalar_of<X>, scalar_of<Y>> || std::is_same_v<scalar_of<X>, compute_t<scalar_of<Y>>>) &&
                    impl::norm_weight_fits_v<scalar_of<W>, scalar_of<Y>>,
                "relayout::kernels::rms_norm: y holds rows of T, x rows of T or compute_t<T>, weight T or "
                "compute_t<T>");
  impl::check_norm("rms_norm", x, weight, y, "y", eps);
  using C = compute_t<scalar_of<Y>>;
  Kokkos::parallel_for("relayout::kernels::rms_norm",
                       Kokkos::RangePolicy<ExecSpace>(exec, 0, std::int64_t(x.extent(0))),
                       impl::RmsNorm<ExecSpace, X, W, Y>{x, weight, y, C(eps), int(x.extent(1))});
}

// Fused residual add + RMS norm, in place: residual += x; x = rms_norm(residual) * weight.
// x and residual share one scalar T; weight is T or compute_t<T>.
template <class ExecSpace, MutableRowMatrixView X, MutableRowMatrixView R, VectorView W>
void add_rms_norm(const ExecSpace& exec, const X& x, const R& residual, const W& weight, double eps) {
  static_assert(std::is_same_v<scalar_of<X>, scalar_of<R>> && impl::norm_weight_fits_v<scalar_of<W>, scalar_of<R>>,
                "relayout::kernels::add_rms_norm: x and residual must have the same scalar type T, weight T or "
                "compute_t<T>");
  impl::check_norm("add_rms_norm", x, weight, residual, "residual", eps);
  using C = compute_t<scalar_of<X>>;
  Kokkos::parallel_for("relayout::kernels::add_rms_norm",
                       Kokkos::RangePolicy<ExecSpace>(exec, 0, std::int64_t(x.extent(0))),
                       impl::AddRmsNorm<ExecSpace, X, R, W>{x, residual, weight, C(eps), int(x.extent(1))});
}

}  // namespace relayout::kernels
