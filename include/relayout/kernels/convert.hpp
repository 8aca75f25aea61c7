// Rows of one scalar type as rows of another: dst(i, j) = src(i, j) converted, on the caller's
// execution-space instance, one work item per row.
//
// What converts, and how:
// - the same type: a copy;
// - widening (bf16 or fp16 to float or double, float to double): exact;
// - float to bf16 or fp16: rounded once, to nearest even (NaN stays NaN, overflow goes to inf);
// - double to float: the C++ conversion (nearest).
// Narrowing double straight to bf16 or fp16 is refused at compile time: rounding through float
// would round twice, which is not nearest. Convert to float first if that is what you want.
//
// Rows whose features are contiguous on both sides (stride(1) == 1, the usual RowsView and its row
// slices) convert in vectors where the host has them (simd.hpp: one widening load or one
// narrowing store per vector, bit for bit the scalar rule); any other layout (a column subview,
// a strided view) converts element by element. Rows are addressed through each view's own
// strides, never as one flat array.
#pragma once

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <type_traits>

#include "relayout/comm/scalar.hpp"
#include "relayout/kernels/error.hpp"
#include "relayout/kernels/impl/simd.hpp"
#include "relayout/kernels/types.hpp"

namespace relayout::kernels {

namespace impl {

template <class T>
inline constexpr bool row_scalar_v = std::is_same_v<T, float> || std::is_same_v<T, double> ||
                                     std::is_same_v<T, relayout::bf16> || std::is_same_v<T, relayout::fp16>;

template <class T>
inline constexpr bool half16_v = std::is_same_v<T, relayout::bf16> || std::is_same_v<T, relayout::fp16>;

// One element, by the rules above: through float for the 16-bit types (exact on the way in,
// one rounding on the way out).
template <class D, class S>
KOKKOS_FORCEINLINE_FUNCTION D convert_value(const S& s) {
  if constexpr (std::is_same_v<S, D>) return s;
  else if constexpr (half16_v<S>) return D(float(s));
  else return D(s);
}

}  // namespace impl

// Whether convert_rows takes rows of S into rows of D (see the rules at the top).
template <class S, class D>
inline constexpr bool convertible_rows_v = impl::row_scalar_v<S> && impl::row_scalar_v<D> &&
                                           !(std::is_same_v<S, double> && impl::half16_v<D>);

// dst = src converted element by element (the rules at the top of this header). src and dst have
// the same shape; they must not overlap unless they are the same view of the same type (then
// nothing is done). Asynchronous on exec, as every kernel: fence exec before reading dst elsewhere.
template <class ExecSpace, MatrixView S, MatrixView D>
void convert_rows(const ExecSpace& exec, const S& src, const D& dst) {
  using ST = scalar_of<S>;
  using DT = scalar_of<D>;
  static_assert(!std::is_const_v<typename D::value_type>, "relayout::kernels::convert_rows: dst must be writable");
  static_assert(impl::row_scalar_v<ST> && impl::row_scalar_v<DT>,
                "relayout::kernels::convert_rows: rows of float, double, bf16 or fp16 only");
  static_assert(convertible_rows_v<ST, DT>,
                "relayout::kernels::convert_rows: double rows do not narrow straight to bf16 or fp16 (that would "
                "round twice); convert them to float rows first");
  static_assert(accessible_from<ExecSpace, S> && accessible_from<ExecSpace, D>,
                "relayout::kernels::convert_rows: src and dst must be in memory exec can read");
  impl::require(dst.extent(0) == src.extent(0) && dst.extent(1) == src.extent(1), "convert_rows", "dst",
                "must have src's shape " + impl::str(std::int64_t(src.extent(0))) + " x " +
                    impl::str(std::int64_t(src.extent(1))) + ", got " + impl::str(std::int64_t(dst.extent(0))) +
                    " x " + impl::str(std::int64_t(dst.extent(1))));
  const std::int64_t rows = std::int64_t(src.extent(0));
  const int cols = int(src.extent(1));
  if (rows == 0 || cols == 0) return;
  if constexpr (std::is_same_v<ST, DT>)
    if (static_cast<const void*>(src.data()) == static_cast<const void*>(dst.data()) &&
        src.stride(0) == dst.stride(0) && src.stride(1) == dst.stride(1))
      return;
  const bool contiguous = (cols == 1 || (src.stride(1) == 1 && dst.stride(1) == 1));
  Kokkos::parallel_for(
      "relayout::kernels::convert_rows", Kokkos::RangePolicy<ExecSpace>(exec, 0, rows),
      KOKKOS_LAMBDA(const std::int64_t r) {
        if constexpr (std::is_same_v<ST, relayout::bf16> && std::is_same_v<DT, float>) {
          if (contiguous) return impl::widen_bf16_row<ExecSpace>(&src(r, 0), &dst(r, 0), cols);
        } else if constexpr (std::is_same_v<ST, float> && std::is_same_v<DT, relayout::bf16>) {
          if (contiguous) return impl::round_bf16_row<ExecSpace>(&src(r, 0), &dst(r, 0), cols);
        }
        for (int j = 0; j < cols; ++j) dst(r, j) = impl::convert_value<DT>(src(r, j));
      });
}

}  // namespace relayout::kernels
