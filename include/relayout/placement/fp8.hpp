// FP8 E4M3 rows for the dispatch: one byte per value with one fp32 scale per block of 128 values
// of a row, as DeepEP sends them. The scalar conversion (OCP E4M3FN, round to nearest even,
// saturating at +-448), the block quantisation, and kernels over rows on the caller's instance.
#pragma once

#include <bit>
#include <cstdint>
#include <string>
#include <type_traits>

#include <Kokkos_Core.hpp>

#include "relayout/comm/scalar.hpp"
#include "relayout/mesh/error.hpp"
#include "relayout/placement/ep_message.hpp"
#include "relayout/placement/rows_view.hpp"

namespace relayout {

// E4M3FN: 1 sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities, S.1111.111 is NaN.
inline constexpr float fp8_e4m3_max = 448.0f;        // S.1111.110
inline constexpr float fp8_e4m3_min_normal = 0.015625f;  // 2^-6
inline constexpr float fp8_e4m3_min_subnormal = 0.001953125f;  // 2^-9
// Values per scale, and the smallest amax a block's scale is computed from (a block of zeros, or
// of values below it, gets the scale fp8_amax_floor / 448: finite, never 0, so nothing is NaN).
inline constexpr int fp8_block = static_cast<int>(EpMessage::kFp8Block);
inline constexpr float fp8_amax_floor = 0x1p-64f;

namespace impl {

KOKKOS_INLINE_FUNCTION constexpr std::uint8_t float_to_e4m3_bits(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint32_t>((x >> 24) & 0x80u);
  const std::uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint8_t>(sign | 0x7fu);  // NaN stays NaN
  // From 448 up (infinity included) the result is 448: 464 and above would round to the NaN code.
  if (a >= 0x43e00000u) return static_cast<std::uint8_t>(sign | 0x7eu);
  if (a >= 0x3c800000u) {  // 2^-6 and up: normal. Rebias the exponent (127 -> 7), keep 3 bits.
    std::uint32_t r = (a - 0x3c000000u) >> 20;
    const std::uint32_t rem = a & 0xfffffu;
    if (rem > 0x80000u || (rem == 0x80000u && (r & 1u))) ++r;
    return static_cast<std::uint8_t>(sign | r);
  }
  // Subnormal: a multiple of 2^-9. Up to 2^-10 (half of 2^-9, a tie to the even 0) is zero.
  if (a <= 0x3a800000u) return static_cast<std::uint8_t>(sign);
  const std::uint32_t e = a >> 23;  // 117..120
  const std::uint32_t m = (a & 0x7fffffu) | 0x800000u;
  const std::uint32_t shift = 141u - e;  // value / 2^-9 = m * 2^(e - 141)
  std::uint32_t r = m >> shift;
  const std::uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (r & 1u))) ++r;  // r == 8 is the smallest normal, 2^-6
  return static_cast<std::uint8_t>(sign | r);
}

KOKKOS_INLINE_FUNCTION constexpr float e4m3_bits_to_float(std::uint8_t b) {
  const std::uint32_t sign = static_cast<std::uint32_t>(b & 0x80u) << 24;
  const std::uint32_t e = (b >> 3) & 0xfu, m = b & 7u;
  if (e == 15 && m == 7) return std::bit_cast<float>(sign | 0x7fc00000u);
  if (e == 0) {
    const float v = static_cast<float>(m) * fp8_e4m3_min_subnormal;
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | ((e + 120u) << 23) | (m << 20));
}

}  // namespace impl

// E4M3FN as raw storage, like bf16 and fp16 (comm/scalar.hpp).
struct fp8_e4m3 {
  std::uint8_t bits = 0;

  fp8_e4m3() = default;
  KOKKOS_INLINE_FUNCTION constexpr explicit fp8_e4m3(float f) : bits(impl::float_to_e4m3_bits(f)) {}
  KOKKOS_INLINE_FUNCTION static constexpr fp8_e4m3 from_bits(std::uint8_t b) {
    fp8_e4m3 v;
    v.bits = b;
    return v;
  }
  KOKKOS_INLINE_FUNCTION constexpr explicit operator float() const { return impl::e4m3_bits_to_float(bits); }
  KOKKOS_INLINE_FUNCTION constexpr bool is_nan() const { return (bits & 0x7fu) == 0x7fu; }
  friend constexpr bool operator==(fp8_e4m3, fp8_e4m3) = default;
};
static_assert(sizeof(fp8_e4m3) == 1 && std::is_trivially_copyable_v<fp8_e4m3>);

// Blocks of a row of `hidden` values (the last one may be shorter).
KOKKOS_INLINE_FUNCTION constexpr std::int64_t fp8_blocks(std::int64_t hidden) {
  return (hidden + fp8_block - 1) / fp8_block;
}
// The bytes of one fp8 row (values and scales) are EpMessage::fp8_row_bytes (ep_message.hpp), the
// formula the dispatch message and relayout plan share.

// The scale of a block whose largest finite magnitude is amax: amax / 448, so amax maps to 448.
KOKKOS_INLINE_FUNCTION constexpr float fp8_scale(float amax) {
  return (amax > fp8_amax_floor ? amax : fp8_amax_floor) / fp8_e4m3_max;
}

// Quantises x[0, n) (n <= fp8_block; T is float, double, bf16, fp16 or anything with an explicit
// conversion to float) into q[0, n) and returns the block's scale s: q = e4m3(x / s). amax is
// taken over the finite values; NaN stays NaN and infinities saturate to +-448 s.
template <class T>
KOKKOS_INLINE_FUNCTION float fp8_quantize_block(const T* x, int n, std::uint8_t* q) {
  float amax = 0;
  for (int i = 0; i < n; ++i) {
    const float v = static_cast<float>(x[i]);
    const float a = v < 0 ? -v : v;
    if (a > amax && a <= 3.4028234663852886e38f) amax = a;  // false for NaN and infinity
  }
  const float s = fp8_scale(amax);
  for (int i = 0; i < n; ++i) q[i] = impl::float_to_e4m3_bits(static_cast<float>(x[i]) / s);
  return s;
}

// y[i] = T(e4m3(q[i]) * s), i in [0, n).
template <class T>
KOKKOS_INLINE_FUNCTION void fp8_dequantize_block(const std::uint8_t* q, int n, float s, T* y) {
  for (int i = 0; i < n; ++i) y[i] = static_cast<T>(impl::e4m3_bits_to_float(q[i]) * s);
}

// Rows in fp8: values rows x hidden (e4m3 bits) and scales rows x fp8_blocks(hidden).
template <class MemSpace = Kokkos::DefaultExecutionSpace::memory_space>
struct Fp8Rows {
  RowsView<std::uint8_t, MemSpace> values;
  RowsView<float, MemSpace> scales;

  Fp8Rows() = default;
  Fp8Rows(std::int64_t rows, std::int64_t hidden)
      : values(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("relayout::fp8_values")),
               static_cast<std::size_t>(rows), static_cast<std::size_t>(hidden)),
        scales(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("relayout::fp8_scales")),
               static_cast<std::size_t>(rows), static_cast<std::size_t>(fp8_blocks(hidden))) {}
  std::int64_t rows() const { return static_cast<std::int64_t>(values.extent(0)); }
  std::int64_t hidden() const { return static_cast<std::int64_t>(values.extent(1)); }
};

namespace impl {

template <class V>
inline constexpr bool is_rows_view_v =
    Kokkos::is_view<V>::value && V::rank == 2 && std::is_same_v<typename V::array_layout, Kokkos::LayoutRight>;

template <class X, class Q, class S>
struct Fp8Quantize {
  X x;
  Q q;
  S s;
  std::int64_t blocks, hidden;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i) const {
    const std::int64_t r = i / blocks, b = i % blocks, c = b * fp8_block;
    const int n = static_cast<int>(hidden - c < fp8_block ? hidden - c : fp8_block);
    s(r, b) = fp8_quantize_block(&x(r, c), n, &q(r, c));
  }
};

template <class Q, class S, class Y>
struct Fp8Dequantize {
  Q q;
  S s;
  Y y;
  std::int64_t blocks, hidden;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i) const {
    const std::int64_t r = i / blocks, b = i % blocks, c = b * fp8_block;
    const int n = static_cast<int>(hidden - c < fp8_block ? hidden - c : fp8_block);
    fp8_dequantize_block(&q(r, c), n, s(r, b), &y(r, c));
  }
};

template <class A, class B>
void require_fp8_shape(const char* fn, const A& rows, const B& out, const char* name) {
  if (out.values.extent(0) != rows.extent(0) || out.values.extent(1) != rows.extent(1) ||
      out.scales.extent(0) != rows.extent(0) ||
      out.scales.extent(1) != static_cast<std::size_t>(fp8_blocks(static_cast<std::int64_t>(rows.extent(1)))))
    throw LayoutError(name, std::string(fn) + ": " + name + " holds " + std::to_string(out.values.extent(0)) + " x " +
                                std::to_string(out.values.extent(1)) + " values and " +
                                std::to_string(out.scales.extent(0)) + " x " + std::to_string(out.scales.extent(1)) +
                                " scales; the rows are " + std::to_string(rows.extent(0)) + " x " +
                                std::to_string(rows.extent(1)) + ", which need " + std::to_string(rows.extent(0)) +
                                " x " + std::to_string(fp8_blocks(static_cast<std::int64_t>(rows.extent(1)))) +
                                " scales (one per " + std::to_string(fp8_block) + " values)");
}

}  // namespace impl

// Quantises every row of x (rows x hidden, LayoutRight, any element type convertible to float) into
// out, block by block, on exec. Asynchronous on exec, like any kernel on it.
template <class ExecSpace, class X, class MemSpace>
void quantize_fp8_rows(const ExecSpace& exec, const X& x, const Fp8Rows<MemSpace>& out) {
  static_assert(impl::is_rows_view_v<X>, "relayout::quantize_fp8_rows: x must be a rank-2 LayoutRight View");
  static_assert(Kokkos::SpaceAccessibility<ExecSpace, MemSpace>::accessible &&
                    Kokkos::SpaceAccessibility<ExecSpace, typename X::memory_space>::accessible,
                "relayout::quantize_fp8_rows: x and out must be accessible from the execution space");
  impl::require_fp8_shape("quantize_fp8_rows", x, out, "out");
  const auto hidden = static_cast<std::int64_t>(x.extent(1)), blocks = fp8_blocks(hidden);
  Kokkos::parallel_for("relayout::quantize_fp8_rows",
                       Kokkos::RangePolicy<ExecSpace>(exec, 0, static_cast<std::int64_t>(x.extent(0)) * blocks),
                       impl::Fp8Quantize<X, decltype(out.values), decltype(out.scales)>{x, out.values, out.scales,
                                                                                         blocks, hidden});
}

// y(r, c) = T(e4m3(in.values(r, c)) * in.scales(r, c / 128)) on exec; y has in's shape.
template <class ExecSpace, class MemSpace, class Y>
void dequantize_fp8_rows(const ExecSpace& exec, const Fp8Rows<MemSpace>& in, const Y& y) {
  static_assert(impl::is_rows_view_v<Y> && !std::is_const_v<typename Y::value_type>,
                "relayout::dequantize_fp8_rows: y must be a writable rank-2 LayoutRight View");
  static_assert(Kokkos::SpaceAccessibility<ExecSpace, MemSpace>::accessible &&
                    Kokkos::SpaceAccessibility<ExecSpace, typename Y::memory_space>::accessible,
                "relayout::dequantize_fp8_rows: in and y must be accessible from the execution space");
  impl::require_fp8_shape("dequantize_fp8_rows", y, in, "in");
  const auto hidden = static_cast<std::int64_t>(y.extent(1)), blocks = fp8_blocks(hidden);
  Kokkos::parallel_for("relayout::dequantize_fp8_rows",
                       Kokkos::RangePolicy<ExecSpace>(exec, 0, static_cast<std::int64_t>(y.extent(0)) * blocks),
                       impl::Fp8Dequantize<decltype(in.values), decltype(in.scales), Y>{in.values, in.scales, y,
                                                                                         blocks, hidden});
}

}  // namespace relayout
