// Internal: the inner loops of shared-KV attention (relayout/kernels/attention.hpp): how keys are
// read (contiguous rows or through a paged cache's block table) and AttendCore, one query row
// against a range of keys by chunks with an online softmax. Not public API.
#pragma once

#include <Kokkos_Core.hpp>
#include <cstddef>
#include <cstdint>

#include "relayout/kernels/impl/simd.hpp"
#include "relayout/kernels/kv_cache.hpp"

namespace relayout::kernels::impl {

inline constexpr int kChunkMax = 32;  // keys per chunk, at most (the score scratch stride)
inline constexpr int kHeadGroup = 4;  // heads per register tile (one team thread per group)
inline constexpr int kLineBytes = 64;
inline constexpr int kMaxRanges = 4;  // key ranges a lone head's decode work item reads side by side

KOKKOS_FORCEINLINE_FUNCTION void prefetch(const void* p) {
#if defined(RELAYOUT_KERNELS_HOST_SIMD)
  __builtin_prefetch(p);
#else
  (void)p;
#endif
}

// Keys per chunk. The chunk is read from memory by the score pass and again by the value pass: a
// lone head does 2 FMAs per element, so its chunk should stay in L1 (16 KiB) in between. With
// several heads every element feeds 2 FMAs per head, which hides reading the chunk again from L2,
// and each chunk costs a read and write of the output rows and a softmax step per head: there the
// longest chunk wins (measured at 8 heads of 512: 32 keys against 8, 1.10-1.15x; 64 and 128 keys
// were no faster).
template <class T>
int chunk_keys(int head_dim, int heads) {
  if (heads > 1) return kChunkMax;
  const int c = int(16384 / (std::size_t(head_dim) * sizeof(T)));
  return c < 4 ? 4 : (c > kChunkMax ? kChunkMax : c);
}

// Keys [begin, end) of request b stored in consecutive rows of one matrix.
template <class KV, class Cu>
struct ContiguousKeys {
  using T = typename KV::non_const_value_type;
  KV kv;
  Cu cu;
  KOKKOS_INLINE_FUNCTION std::int64_t length(std::int64_t b) const { return cu(b + 1) - cu(b); }
  // Row of key p of request b, and how many keys from p on lie in consecutive rows.
  KOKKOS_INLINE_FUNCTION const T* row(std::int64_t b, std::int64_t p, std::int64_t end, int& run) const {
    run = int(end - p < kChunkMax ? end - p : kChunkMax);
    return &kv(cu(b) + p, 0);
  }
  KOKKOS_INLINE_FUNCTION std::int64_t stride() const { return std::int64_t(kv.stride(0)); }
};

// Keys of request slots(b) through its block table: consecutive only within a block.
template <class T, class MemSpace>
struct PagedKeys {
  PagedKv<T, MemSpace> kv;
  KOKKOS_INLINE_FUNCTION std::int64_t length(std::int64_t b) const { return kv.lengths(kv.slots(b)); }
  KOKKOS_INLINE_FUNCTION const T* row(std::int64_t b, std::int64_t p, std::int64_t end, int& run) const {
    const int bs = kv.block_size;
    const std::int64_t in_block = bs - p % bs;
    run = int(end - p < in_block ? end - p : in_block);
    if (run > kChunkMax) run = kChunkMax;
    return &kv.pool(std::int64_t(kv.block_table(kv.slots(b), p / bs)) * bs + p % bs, 0);
  }
  KOKKOS_INLINE_FUNCTION std::int64_t stride() const { return std::int64_t(kv.pool.stride(0)); }
};

// One query row (heads x head_dim) against keys [begin, end) of one request, by chunks of at most
// `chunk` consecutive keys. Heads go in groups of kHeadGroup, one team thread per group, so every
// key vector loaded feeds four heads: scores are a (4 heads x 3 keys) register tile of dot
// products, the softmax weights of a chunk are one vectorised exp per head, and p . V is a
// (4 heads x 3 vectors) register tile that also applies the rescale of the previous chunks. A
// lone head reads its keys row after row instead, and a decode work item with one head walks
// several key ranges side by side (attend_lone). `o` accumulates unnormalised; m and l are the
// running max and sum per head.
template <class ExecSpace, class T>
struct AttendCore {
  static constexpr int L = lanes_v<ExecSpace, T>;
  using V = typename Vec<T, L>::type;
  int heads, head_dim, chunk;
  T scale;

  // s[a][j + b] = q_a . k_(j + b) for MH heads and MK keys. Rows j .. j + MK of the next chunk
  // (pf, pf_rows rows; null: none) are prefetched line by line meanwhile, so memory streams while
  // this chunk computes (the hardware prefetchers alone leave the two serialised).
  template <int MH, int MK>
  KOKKOS_FORCEINLINE_FUNCTION void score_tile(const T* const* qh, const T* k0, std::int64_t ld, T* s, int j,
                                              const T* pf, int pf_rows) const {
    const int D = head_dim;
    const T* kj[MK];
    for (int b = 0; b < MK; ++b) kj[b] = k0 + (j + b) * ld;
    V acc[MH][MK];
    for (int a = 0; a < MH; ++a)
      for (int b = 0; b < MK; ++b) acc[a][b] = V{};
    auto body = [&](int d) {
      V kv[MK];
      for (int b = 0; b < MK; ++b) kv[b] = load<V>(kj[b] + d);
      for (int a = 0; a < MH; ++a) {
        const V qv = load<V>(qh[a] + d);
        for (int b = 0; b < MK; ++b) acc[a][b] += qv * kv[b];
      }
    };
    int d = 0;
    constexpr int S = kLineBytes / int(sizeof(T));
    if (pf && S % L == 0) {
      const int pb = pf_rows - j < MK ? pf_rows - j : MK;
      for (; d + S <= D; d += S) {
        for (int b = 0; b < pb; ++b) prefetch(pf + (j + b) * ld + d);
        for (int u = 0; u < S; u += L) body(d + u);
      }
    }
    for (; d + L <= D; d += L) body(d);
    for (int a = 0; a < MH; ++a)
      for (int b = 0; b < MK; ++b) {
        T r = hsum<L>(acc[a][b]);
        for (int dd = d; dd < D; ++dd) r += qh[a][dd] * kj[b][dd];
        s[a * kChunkMax + j + b] = r;
      }
  }

  template <int MH, int NV>
  KOKKOS_FORCEINLINE_FUNCTION void value_tile(T* const* oh, int d, const T* k0, std::int64_t ld, int nb,
                                              const T* p, const T* corr, bool first) const {
    V acc[MH][NV];
    for (int a = 0; a < MH; ++a)
      for (int v = 0; v < NV; ++v) acc[a][v] = first ? V{} : corr[a] * load<V>(oh[a] + d + v * L);
    for (int j = 0; j < nb; ++j) {
      const T* kj = k0 + j * ld + d;
      V kv[NV];
      for (int v = 0; v < NV; ++v) kv[v] = load<V>(kj + v * L);
      for (int a = 0; a < MH; ++a) {
        const T pa = p[a * kChunkMax + j];
        for (int v = 0; v < NV; ++v) acc[a][v] += pa * kv[v];
      }
    }
    for (int a = 0; a < MH; ++a)
      for (int v = 0; v < NV; ++v) store<V>(oh[a] + d + v * L, acc[a][v]);
  }

  // One chunk of nb keys from row k0 for heads h0 .. h0 + MH.
  template <int MH>
  KOKKOS_FORCEINLINE_FUNCTION void chunk_step(const T* q, T* o, int h0, const T* k0, std::int64_t ld, int nb,
                                              bool first, T* m, T* l, T* s, const T* pf, int pf_rows,
                                              bool scored = false) const {
    const int D = head_dim;
    const T* qh[MH];
    T* oh[MH];
    for (int a = 0; a < MH; ++a) {
      qh[a] = q + std::size_t(h0 + a) * D;
      oh[a] = o + std::size_t(h0 + a) * D;
    }
    // Register tiles sized to the 16 vector registers: with several heads every key vector loaded
    // feeds a tile of heads x keys. A lone head has too little arithmetic per byte to hide memory,
    // so it reads its keys in address order, one row after the other: the hardware prefetcher
    // follows that one stream, where rows read side by side break it into short ones (measured
    // 1.07-1.29x over an 8-key tile that prefetched the next chunk by hand).
    constexpr int MK = MH == 2 ? 4 : 3;
    constexpr int NV = MH == 1 ? 12 : (MH == 2 ? 6 : (MH == 3 ? 4 : 3));
    int j = scored ? nb : 0;  // scored: the caller wrote the scores (attend_lone)
    if constexpr (MH == 1) {
      for (; j < nb; ++j) s[j] = dot<L>(qh[0], k0 + j * ld, D);
    } else {
      for (; j + MK <= nb; j += MK) score_tile<MH, MK>(qh, k0, ld, s, j, pf, pf_rows);
      for (; j + 2 <= nb; j += 2) score_tile<MH, 2>(qh, k0, ld, s, j, pf, pf_rows);
      for (; j < nb; ++j) score_tile<MH, 1>(qh, k0, ld, s, j, pf, pf_rows);
    }
    T corr[MH];
    for (int a = 0; a < MH; ++a) {
      T* sa = s + a * kChunkMax;
      T mb = sa[0] * scale;
      for (j = 0; j < nb; ++j) mb = impl::max(mb, T(sa[j] * scale));
      const T m_new = first ? mb : impl::max(m[a], mb);
      corr[a] = first ? T(0) : impl::exp(T(m[a] - m_new));
      for (j = 0; j < nb; j += L) store<V>(sa + j, vexp<L>(load<V>(sa + j) * scale - m_new));
      T sum = T(0);
      for (j = 0; j < nb; ++j) sum += sa[j];
      l[a] = first ? sum : T(l[a] * corr[a] + sum);
      m[a] = m_new;
    }
    int d = 0;
    for (; d + NV * L <= D; d += NV * L) value_tile<MH, NV>(oh, d, k0, ld, nb, s, corr, first);
    for (; d + L <= D; d += L) value_tile<MH, 1>(oh, d, k0, ld, nb, s, corr, first);
    for (; d < D; ++d)
      for (int a = 0; a < MH; ++a) {
        T r = first ? T(0) : T(corr[a] * oh[a][d]);
        for (j = 0; j < nb; ++j) r += s[a * kChunkMax + j] * k0[j * ld + d];
        oh[a][d] = r;
      }
  }

  // One chunk for head group g (heads g*kHeadGroup ..), its m, l and scores in the scratch.
  // Group 0 prefetches the next chunk (pf, pf_rows), unless it is a lone head (see chunk_step).
  KOKKOS_FORCEINLINE_FUNCTION void step(int g, const T* q, T* o, const T* k0, std::int64_t ld, int nb, bool first,
                                        T* scratch, const T* pf, int pf_rows) const {
    T* m = scratch + g * group_scratch;
    T* l = m + kHeadGroup;
    T* s = l + kHeadGroup;
    const int h0 = g * kHeadGroup;
    switch (heads - h0 < kHeadGroup ? heads - h0 : kHeadGroup) {
      case 1: chunk_step<1>(q, o, h0, k0, ld, nb, first, m, l, s, g == 0 ? pf : nullptr, pf_rows); break;
      case 2: chunk_step<2>(q, o, h0, k0, ld, nb, first, m, l, s, g == 0 ? pf : nullptr, pf_rows); break;
      case 3: chunk_step<3>(q, o, h0, k0, ld, nb, first, m, l, s, g == 0 ? pf : nullptr, pf_rows); break;
      default: chunk_step<kHeadGroup>(q, o, h0, k0, ld, nb, first, m, l, s, g == 0 ? pf : nullptr, pf_rows); break;
    }
  }

  // Team scratch per group: m, l (kHeadGroup each) and the scores (kHeadGroup x kChunkMax); a
  // lone head takes one such block per key range.
  using Scratch = Kokkos::View<T*, typename ExecSpace::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  static constexpr std::size_t group_scratch = 2 * kHeadGroup + kHeadGroup * kChunkMax;
  static std::size_t scratch_bytes(int heads, int ranges = 1) {
    const int groups = (heads + kHeadGroup - 1) / kHeadGroup;
    return Scratch::shmem_size(std::size_t(groups > ranges ? groups : ranges) * group_scratch);
  }

  // Heads h0 .. h0 + count of one range, done: m, l to ml (heads, then heads) when ml is not null,
  // else the output rows normalised by l. `any`: the range held a key.
  KOKKOS_FORCEINLINE_FUNCTION void finish(const T* m, const T* l, int h0, int count, bool any, T* out, T* ml) const {
    for (int a = 0; a < count; ++a) {
      if (ml) {
        ml[h0 + a] = any ? m[a] : T(0);
        ml[heads + h0 + a] = any ? l[a] : T(0);
      } else {
        T* oh = out + std::size_t(h0 + a) * head_dim;
        const T inv = T(1) / l[a];
        for (int d = 0; d < head_dim; ++d) oh[d] *= inv;
      }
    }
  }

  // Every head group of one work item: o = softmax(q K^T) V over [begin, end), normalised into
  // `out` when `ml` is null, else left unnormalised with m, l written to ml (heads, then heads).
  // The chunk loop is outside the head groups so each chunk comes from memory once; a team thread
  // keeps the same groups throughout, so the groups need no barrier.
  template <class Member, class Keys>
  KOKKOS_INLINE_FUNCTION void attend(const Member& team, const Keys& keys, std::int64_t b, std::int64_t begin,
                                     std::int64_t end, const T* q, T* out, T* ml) const {
    if (heads == 1) {
      attend_lone(team, keys, b, 1, &begin, &end, q, &out, &ml);
      return;
    }
    const int groups = (heads + kHeadGroup - 1) / kHeadGroup;
    Scratch scratch(team.team_scratch(0), std::size_t(groups) * group_scratch);
    const std::int64_t ld = keys.stride();
    int nb = 0;
    const T* k0 = begin < end ? keys.row(b, begin, end, nb) : nullptr;
    for (std::int64_t p = begin; p < end;) {
      if (nb > chunk) nb = chunk;
      int next_nb = 0;
      const T* next = p + nb < end ? keys.row(b, p + nb, end, next_nb) : nullptr;
      if (next_nb > chunk) next_nb = chunk;
      const bool first = p == begin;
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, groups), [&](const int g) {
        step(g, q, out, k0, ld, nb, first, scratch.data(), next, next_nb);
      });
      p += nb;
      k0 = next;
      nb = next_nb;
    }
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, groups), [&](const int g) {
      const T* m = scratch.data() + g * group_scratch;
      const int h0 = g * kHeadGroup;
      finish(m, m + kHeadGroup, h0, heads - h0 < kHeadGroup ? heads - h0 : kHeadGroup, end > begin, out, ml);
    });
  }

  // A lone head over n_ranges (<= kMaxRanges) key ranges of request b, range r into out[r] (and
  // ml[r]). One head does 2 FMAs per cached element, too little arithmetic to hide memory behind,
  // so the kernel runs at the speed one core streams the cache: the ranges advance together, and
  // the score pass reads one row of each side by side, each range in address order. One core then
  // keeps n_ranges streams in flight, and the hardware prefetcher follows each (measured with 4
  // ranges from DRAM: 1.4-1.6x one range; rows of one range read side by side were slower still).
  template <class Member, class Keys>
  KOKKOS_INLINE_FUNCTION void attend_lone(const Member& team, const Keys& keys, std::int64_t b, int n_ranges,
                                          const std::int64_t* begin, const std::int64_t* end, const T* q,
                                          T* const* out, T* const* ml) const {
    Scratch scratch(team.team_scratch(0), std::size_t(n_ranges) * group_scratch);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, 1), [&](const int) {
      const std::int64_t ld = keys.stride();
      std::int64_t p[kMaxRanges];
      for (int r = 0; r < n_ranges; ++r) p[r] = begin[r];
      for (;;) {
        int live[kMaxRanges], n_live = 0, n = chunk;
        const T* k0[kMaxRanges];
        for (int r = 0; r < n_ranges; ++r) {
          if (p[r] >= end[r]) continue;
          int run = 0;
          k0[n_live] = keys.row(b, p[r], end[r], run);
          n = run < n ? run : n;
          live[n_live++] = r;
        }
        if (n_live == 0) break;
        T* s[kMaxRanges];
        for (int i = 0; i < n_live; ++i) s[i] = scratch.data() + live[i] * group_scratch + 2 * kHeadGroup;
        for (int j = 0; j < n; ++j) {
          const T* rows[kMaxRanges];
          T sc[kMaxRanges];
          for (int i = 0; i < n_live; ++i) rows[i] = k0[i] + j * ld;
          switch (n_live) {
            case 1: dot_rows<L, 1>(q, rows, head_dim, sc); break;
            case 2: dot_rows<L, 2>(q, rows, head_dim, sc); break;
            case 3: dot_rows<L, 3>(q, rows, head_dim, sc); break;
            default: dot_rows<L, kMaxRanges>(q, rows, head_dim, sc); break;
          }
          for (int i = 0; i < n_live; ++i) s[i][j] = sc[i];
        }
        for (int i = 0; i < n_live; ++i) {
          const int r = live[i];
          T* m = scratch.data() + r * group_scratch;
          chunk_step<1>(q, out[r], 0, k0[i], ld, n, p[r] == begin[r], m, m + kHeadGroup, m + 2 * kHeadGroup,
                        nullptr, 0, true);
          p[r] += n;
        }
      }
      for (int r = 0; r < n_ranges; ++r) {
        const T* m = scratch.data() + r * group_scratch;
        finish(m, m + kHeadGroup, 0, 1, end[r] > begin[r], out[r], ml[r]);
      }
    });
  }
};

}  // namespace relayout::kernels::impl
