// Internal: decode attention over a bf16 KV cache with fp32 queries, outputs and arithmetic
// (relayout/kernels/attention.hpp). Decode reads the whole cache for a few query rows, so its cost
// is the bytes read: bf16 halves them. The keys adapter below widens each run of rows AttendCore
// asks for into fp32 rows in team scratch, so AttendCore<ExecSpace, float> runs unchanged on them.
// Not public API.
#pragma once

#include <Kokkos_Core.hpp>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "relayout/comm/scalar.hpp"
#include "relayout/kernels/impl/attention_core.hpp"

#if defined(RELAYOUT_KERNELS_HOST_SIMD) && (defined(__AVX2__) || defined(__AVX512F__))
#include <immintrin.h>
#endif

namespace relayout::kernels::impl {

// n bf16 values to fp32: a bf16 is the high half of a float, so widening is a 16-bit shift.
KOKKOS_FORCEINLINE_FUNCTION void widen_bf16(const relayout::bf16* src, float* dst, int n) {
  const auto* s = reinterpret_cast<const std::uint16_t*>(src);
  int i = 0;
#if defined(RELAYOUT_KERNELS_HOST_SIMD) && defined(__AVX512F__)
  // The zero-masked forms: g++ 12 warns of the undefined source the unmasked ones pass.
  const __mmask16 all = __mmask16(0xffff);
  for (; i + 16 <= n; i += 16) {
    const __m512i w = _mm512_maskz_cvtepu16_epi32(all, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i)));
    _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_maskz_slli_epi32(all, w, 16)));
  }
#elif defined(RELAYOUT_KERNELS_HOST_SIMD) && defined(__AVX2__)
  for (; i + 8 <= n; i += 8) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
  }
#endif
  for (; i < n; ++i) dst[i] = relayout::impl::bf16_bits_to_float(s[i]);
}

// Keys of a bf16 cache (ContiguousKeys or PagedKeys over bf16 rows) as fp32 rows: row() widens
// the run of rows it is asked for (at most `cap`) into one of `buffers` buffers of team scratch,
// filled in turn, and returns it; stride() is the buffers' row stride. A buffer is overwritten
// `buffers` calls later, so there must be as many buffers as runs live at once: AttendCore::attend
// asks for the next chunk while the current one is still to be computed, one run per chunk from
// contiguous rows (2 buffers of a chunk), up to two through a block table, the end of one block
// and the start of the next (4 buffers of at most a block). attend_lone asks for at most
// kMaxRanges runs at a time, all used before it asks again (kMaxRanges buffers). The buffers stay
// this small so the widened rows, read by the score pass and again by p . V, stay in L1 as the
// rows of a fp32 cache would.
//
// The buffers and the turn belong to one work item: bind() takes them from the team's scratch,
// and the launch runs one thread per team (several threads would widen the same rows into the
// same buffers, each on its own turn).
template <class Keys>
struct WidenKeys {
  Keys keys;
  int head_dim = 0;
  int cap = 0;      // rows per buffer
  int buffers = 0;  // buffers filled in turn
  int ld = 0;       // floats per buffer row: head_dim rounded up to a cache line, so rows start aligned
  float* buf = nullptr;
  mutable int turn = 0;

  static int row_stride(int head_dim) { return (head_dim + 15) / 16 * 16; }
  template <class ExecSpace>
  std::size_t scratch_bytes() const {
    return Kokkos::View<float*, typename ExecSpace::scratch_memory_space, Kokkos::MemoryUnmanaged>::shmem_size(
        std::size_t(buffers) * cap * ld);
  }
  template <class Member>
  KOKKOS_INLINE_FUNCTION WidenKeys bind(const Member& team) const {
    using S = Kokkos::View<float*, typename Member::scratch_memory_space, Kokkos::MemoryUnmanaged>;
    WidenKeys k = *this;
    S s(team.team_scratch(0), std::size_t(buffers) * cap * ld);
    k.buf = s.data();
    k.turn = 0;
    return k;
  }

  KOKKOS_INLINE_FUNCTION std::int64_t length(std::int64_t b) const { return keys.length(b); }
  KOKKOS_INLINE_FUNCTION const float* row(std::int64_t b, std::int64_t p, std::int64_t end, int& run) const {
    const relayout::bf16* src = keys.row(b, p, end, run);
    if (run > cap) run = cap;
    float* dst = buf + std::size_t(turn) * cap * ld;
    turn = turn + 1 == buffers ? 0 : turn + 1;
    const std::int64_t sld = keys.stride();
    const int line = kLineBytes / int(sizeof(relayout::bf16));
    for (int j = 0; j < run; ++j) {
      // The run after this one is most likely the rows that follow: start reading them, as the
      // core does for fp32 rows (the keys it prefetches are the widened ones, already in cache). A
      // paged cache's next block lies elsewhere; a prefetch of a wrong address costs only the slot.
      const relayout::bf16* ahead = src + (j + run) * sld;
      for (int d = 0; d < head_dim; d += line) prefetch(ahead + d);
      widen_bf16(src + j * sld, dst + std::size_t(j) * ld, head_dim);
    }
    return dst;
  }
  KOKKOS_INLINE_FUNCTION std::int64_t stride() const { return ld; }
};

template <class Keys>
inline constexpr bool is_widen_keys_v = false;
template <class Keys>
inline constexpr bool is_widen_keys_v<WidenKeys<Keys>> = true;

// The keys a work item reads: ordinary keys as they are, widening keys bound to its scratch.
template <class Keys, class Member>
KOKKOS_INLINE_FUNCTION const Keys& bind_keys(const Keys& k, const Member&) {
  return k;
}
template <class Keys, class Member>
KOKKOS_INLINE_FUNCTION WidenKeys<Keys> bind_keys(const WidenKeys<Keys>& k, const Member& team) {
  return k.bind(team);
}
// Team scratch the keys take beside the core's.
template <class ExecSpace, class Keys>
std::size_t keys_scratch_bytes(const Keys& k) {
  if constexpr (is_widen_keys_v<Keys>) return k.template scratch_bytes<ExecSpace>();
  else return 0;
}

template <class Keys>
inline constexpr bool is_paged_keys_v = false;
template <class T, class MemSpace>
inline constexpr bool is_paged_keys_v<PagedKeys<T, MemSpace>> = true;

// Keys over a bf16 cache widened for a core of `heads` heads of `head_dim` (its chunk: chunk_keys).
template <class Keys>
WidenKeys<Keys> widen_keys(const Keys& keys, int head_dim, int heads) {
  const int chunk = chunk_keys<float>(head_dim, heads);
  int cap = chunk, buffers = 2;
  if (heads == 1) {
    buffers = kMaxRanges;
  } else if constexpr (is_paged_keys_v<Keys>) {
    buffers = 4;
    cap = keys.kv.block_size < chunk ? keys.kv.block_size : chunk;
  }
  return WidenKeys<Keys>{keys, head_dim, cap, buffers, WidenKeys<Keys>::row_stride(head_dim)};
}

}  // namespace relayout::kernels::impl
