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


namespace relayout::kernels::impl {

// A key as the core's scalar T: a float as it is, a bf16 widened (exact).
template <class T, class K>
KOKKOS_FORCEINLINE_FUNCTION T key_value(const K& k) {
  if constexpr (std::is_same_v<K, T>) return k;
  else return T(k);
}

// (load_key, simd.hpp: the lanes of V from float keys, or bf16 keys widened in registers.)

}  // namespace relayout::kernels::impl
