// Element types the collectives move: float, double, int32, int64 and the 16-bit floating formats
// bf16 and fp16, stored as raw bits and converted through float (round to nearest even).
#pragma once

#include <bit>
#include <concepts>
#include <cstdint>
#include <type_traits>

#include <Kokkos_Core.hpp>

namespace relayout {

enum class ReduceOp : std::uint8_t { sum, prod, min, max };

namespace impl {

KOKKOS_INLINE_FUNCTION constexpr std::uint16_t float_to_bf16_bits(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

KOKKOS_INLINE_FUNCTION constexpr float bf16_bits_to_float(std::uint16_t b) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

KOKKOS_INLINE_FUNCTION constexpr std::uint16_t float_to_fp16_bits(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t a = x & 0x7fffffffu;
  if (a >= 0x7f800000u)  // inf or NaN (NaN stays quiet)
    return static_cast<std::uint16_t>(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u | ((a >> 13) & 0x3ffu) : 0u));
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds past 65504
  if (a < 0x38800000u) {  // below 2^-14: subnormal half (or zero)
    if (a < 0x33000000u) return static_cast<std::uint16_t>(sign);  // below half of 2^-24
    const std::uint32_t e = a >> 23;
    const std::uint32_t m = (a & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - e;
    std::uint32_t r = m >> shift;
    const std::uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<std::uint16_t>(sign | r);
  }
  std::uint32_t r = (a - 0x38000000u) >> 13;
  const std::uint32_t rem = a & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return static_cast<std::uint16_t>(sign | r);
}

KOKKOS_INLINE_FUNCTION constexpr float fp16_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    const float v = static_cast<float>(m) * 5.9604644775390625e-8f;  // m * 2^-24
    return sign ? -v : v;
  }
  if (e == 31) return std::bit_cast<float>(sign | 0x7f800000u | (m << 13));
  return std::bit_cast<float>(sign | ((e + 112u) << 23) | (m << 13));
}

}  // namespace impl

// bfloat16 as raw storage: 1 sign, 8 exponent, 7 mantissa bits.
struct bf16 {
  std::uint16_t bits = 0;

  bf16() = default;
  KOKKOS_INLINE_FUNCTION constexpr explicit bf16(float f) : bits(impl::float_to_bf16_bits(f)) {}
  KOKKOS_INLINE_FUNCTION static constexpr bf16 from_bits(std::uint16_t b) {
    bf16 v;
    v.bits = b;
    return v;
  }
  KOKKOS_INLINE_FUNCTION constexpr explicit operator float() const { return impl::bf16_bits_to_float(bits); }
  friend constexpr bool operator==(bf16, bf16) = default;
};

// IEEE binary16 as raw storage: 1 sign, 5 exponent, 10 mantissa bits.
struct fp16 {
  std::uint16_t bits = 0;

  fp16() = default;
  KOKKOS_INLINE_FUNCTION constexpr explicit fp16(float f) : bits(impl::float_to_fp16_bits(f)) {}
  KOKKOS_INLINE_FUNCTION static constexpr fp16 from_bits(std::uint16_t b) {
    fp16 v;
    v.bits = b;
    return v;
  }
  KOKKOS_INLINE_FUNCTION constexpr explicit operator float() const { return impl::fp16_bits_to_float(bits); }
  friend constexpr bool operator==(fp16, fp16) = default;
};

static_assert(sizeof(bf16) == 2 && sizeof(fp16) == 2 && std::is_trivially_copyable_v<bf16>);

template <class T>
concept Half16 = std::same_as<T, bf16> || std::same_as<T, fp16>;

// The scalar arithmetic on rows of T is done in: float for the 16-bit storage types (bf16 and
// fp16 rows are widened as they are read and rounded once, to nearest even, when a result is
// stored), T itself otherwise. Router weights, softmax statistics and accumulators of T rows are
// compute_t<T>.
template <class T>
using compute_t = std::conditional_t<Half16<T>, float, T>;

// The element types every backend can move and reduce.
template <class T>
concept CommScalar = std::same_as<T, float> || std::same_as<T, double> ||
                     std::same_as<T, std::int32_t> || std::same_as<T, std::int64_t> || Half16<T>;

}  // namespace relayout
