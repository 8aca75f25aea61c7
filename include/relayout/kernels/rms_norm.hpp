// RMS norm over the features of each token row, and the engines' fused form that first adds the
// residual: residual += x; x = rms_norm(residual) * weight.
#pragma once

#include <Kokkos_Core.hpp>
#include <string>

#include "relayout/kernels/error.hpp"
#include "relayout/kernels/impl/simd.hpp"
#include "relayout/kernels/types.hpp"

namespace relayout::kernels {

namespace impl {

template <class ExecSpace, class T>
KOKKOS_FORCEINLINE_FUNCTION T sum_squares(const T* x, int n) {
  return dot<lanes_v<ExecSpace, T>>(x, x, n);
}

template <class ExecSpace, class X, class W, class Y>
struct RmsNorm {
  using T = typename Y::non_const_value_type;
  X x;
  W weight;
  Y y;
  T eps;
  int n;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t row) const {
    const T* xr = &x(row, 0);
    const T inv = T(1) / impl::sqrt(sum_squares<ExecSpace>(xr, n) / T(n) + eps);
    for (int j = 0; j < n; ++j) y(row, j) = xr[j] * inv * weight(j);
  }
};

template <class ExecSpace, class X, class R, class W>
struct AddRmsNorm {
  using T = typename X::non_const_value_type;
  X x;
  R residual;
  W weight;
  T eps;
  int n;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t row) const {
    T* r = &residual(row, 0);
    for (int j = 0; j < n; ++j) r[j] += x(row, j);
    const T inv = T(1) / impl::sqrt(sum_squares<ExecSpace>(r, n) / T(n) + eps);
    for (int j = 0; j < n; ++j) x(row, j) = r[j] * inv * weight(j);
  }
};

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
template <class ExecSpace, RowMatrixView X, VectorView W, MutableRowMatrixView Y>
void rms_norm(const ExecSpace& exec, const X& x, const W& weight, double eps, const Y& y) {
  static_assert(std::is_same_v<scalar_of<X>, scalar_of<Y>> && std::is_same_v<scalar_of<W>, scalar_of<Y>>,
                "relayout::kernels::rms_norm: x, weight and y must have the same scalar type");
  impl::check_norm("rms_norm", x, weight, y, "y", eps);
  using T = scalar_of<Y>;
  Kokkos::parallel_for("relayout::kernels::rms_norm",
                       Kokkos::RangePolicy<ExecSpace>(exec, 0, std::int64_t(x.extent(0))),
                       impl::RmsNorm<ExecSpace, X, W, Y>{x, weight, y, T(eps), int(x.extent(1))});
}

// Fused residual add + RMS norm, in place: residual += x; x = rms_norm(residual) * weight.
template <class ExecSpace, MutableRowMatrixView X, MutableRowMatrixView R, VectorView W>
void add_rms_norm(const ExecSpace& exec, const X& x, const R& residual, const W& weight, double eps) {
  static_assert(std::is_same_v<scalar_of<X>, scalar_of<R>> && std::is_same_v<scalar_of<W>, scalar_of<R>>,
                "relayout::kernels::add_rms_norm: x, residual and weight must have the same scalar type");
  impl::check_norm("add_rms_norm", x, weight, residual, "residual", eps);
  using T = scalar_of<X>;
  Kokkos::parallel_for("relayout::kernels::add_rms_norm",
                       Kokkos::RangePolicy<ExecSpace>(exec, 0, std::int64_t(x.extent(0))),
                       impl::AddRmsNorm<ExecSpace, X, R, W>{x, residual, weight, T(eps), int(x.extent(1))});
}

}  // namespace relayout::kernels
