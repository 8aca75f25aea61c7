// Internal: how the attention core (attention_core.hpp) reads a vector of keys, for decode over a
// bf16 KV cache with fp32 queries, outputs and arithmetic (relayout/kernels/attention.hpp). Decode
// reads the whole cache for a few query rows, so its cost is the bytes read: bf16 halves them.
// AttendCore<ExecSpace, float, bf16> reads the bf16 rows in place and widens each key vector in
// registers where it loads it, in the score pass (q . k) and in p . V alike: a bf16 is the high
// half of a float, so L keys become L floats by a zero extension of their 16-bit lanes to 32 bits
// and a 16-bit left shift (AVX-512: vpmovzxwd from memory and vpslld, 16 lanes; AVX2 the same at
// 8). Widening is exact, so decode over a bf16 cache gives bitwise the rows decode over a fp32 cache
// of the widened keys gives; a float key is a plain load, so the fp32 core loads as it did.
//
// No copy of the keys exists, so the launch is the fp32 one (any team size). Widening each run of
// rows into fp32 rows of team scratch first and running the fp32 core on those cost a write and a
// read-back of every key: on a 2-core Zen 4 a lone head of 512 ran at 0.36 of its bf16 byte bound
// and about the fp32 time, 8 heads of 512 at 0.48; reading in place, 0.60-0.62x the fp32 time for
// the lone head and 0.64-0.74 of the bound on every row measured (docs/benchmarks.md, "bf16 KV cache"). Not public API.
#pragma once

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <type_traits>

#include "relayout/comm/scalar.hpp"
#include "relayout/kernels/impl/simd.hpp"

#if defined(RELAYOUT_KERNELS_HOST_SIMD) && (defined(__AVX2__) || defined(__AVX512F__))
#include <immintrin.h>
#endif

namespace relayout::kernels::impl {

// A key as the core's scalar T: a float as it is, a bf16 widened (exact).
template <class T, class K>
KOKKOS_FORCEINLINE_FUNCTION T key_value(const K& k) {
  if constexpr (std::is_same_v<K, T>) return k;
  else return T(k);
}

#if defined(RELAYOUT_KERNELS_HOST_SIMD)
// L bf16 bit patterns widened to the bits of L floats: zero-extend each 16-bit lane to 32 bits,
// shift left by 16. (Spelled out per width: g++ 12 rejects __builtin_convertvector of a vector
// type that depends on a template parameter.)
namespace widen {
// (Only the widths the host's vectors hold: a wider one changes the ABI.)
template <int L> struct Half;
typedef std::uint16_t H4 __attribute__((vector_size(8)));
typedef std::uint32_t W4 __attribute__((vector_size(16)));
KOKKOS_FORCEINLINE_FUNCTION W4 bits(H4 h) { return __builtin_convertvector(h, W4) << 16; }
template <> struct Half<4> { using type = H4; };
#if defined(__AVX__) || defined(__AVX512F__)
typedef std::uint16_t H8 __attribute__((vector_size(16)));
typedef std::uint32_t W8 __attribute__((vector_size(32)));
KOKKOS_FORCEINLINE_FUNCTION W8 bits(H8 h) { return __builtin_convertvector(h, W8) << 16; }
template <> struct Half<8> { using type = H8; };
#endif
#if defined(__AVX512F__)
typedef std::uint16_t H16 __attribute__((vector_size(32)));
typedef std::uint32_t W16 __attribute__((vector_size(64)));
KOKKOS_FORCEINLINE_FUNCTION W16 bits(H16 h) { return __builtin_convertvector(h, W16) << 16; }
template <> struct Half<16> { using type = H16; };
#endif
}  // namespace widen
#endif

// The lanes of V (L floats, or one float) from the keys at p: a plain load of float keys; bf16
// keys widened in registers: vpmovzxwd from memory and vpslld on AVX-512 (16 lanes) and AVX2 (8),
// the vector extension's zero-extending convert and shift elsewhere (pmovzxwd and pslld on
// SSE4.1), one key shifted on a device.
template <class V, class K>
KOKKOS_FORCEINLINE_FUNCTION V load_key(const K* p) {
  if constexpr (!std::is_same_v<K, relayout::bf16>) {
    return load<V>(p);
  } else if constexpr (std::is_same_v<V, float>) {
    return relayout::impl::bf16_bits_to_float(p->bits);
  } else {
#if defined(RELAYOUT_KERNELS_HOST_SIMD)
    constexpr int L = int(sizeof(V) / sizeof(float));
#if defined(__AVX512F__)
    // Spelled with intrinsics: g++ 12 tuned for Zen 4 (256-bit preferred) splits the generic form
    // into two 8-lane converts and an insert (measured 16 heads of 128: the score and p . V loops
    // spent more on those than on the FMAs). The zero-masked forms: g++ 12 warns of the undefined
    // source the unmasked ones pass.
    if constexpr (L == 16) {
      const __mmask16 all = __mmask16(0xffff);
      const __m512i w = _mm512_maskz_cvtepu16_epi32(all, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
      return (V)_mm512_castsi512_ps(_mm512_maskz_slli_epi32(all, w, 16));
    }
#endif
#if defined(__AVX2__)
    if constexpr (L == 8) {
      const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
      return (V)_mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
    }
#endif
    typename widen::Half<L>::type h;
    __builtin_memcpy(&h, p, sizeof(h));
    return (V)widen::bits(h);
#else
    return V{};  // not reached: without the vector extension V is one float
#endif
  }
}

}  // namespace relayout::kernels::impl
