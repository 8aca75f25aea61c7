// Attention with one shared KV head (DeepSeek-V4 style MQA, K = V): every query head attends the
// same kv rows. Causal prefill over a batch of variable-length requests (cu_seqlens row offsets)
// and decode against a KV cache, optional sliding window, online (running-max) softmax. The query
// may hold any number of heads: an attn_tp shard passes just its own heads.
#pragma once

#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "relayout/kernels/error.hpp"
#include "relayout/kernels/impl/simd.hpp"
#include "relayout/kernels/kv_cache.hpp"
#include "relayout/kernels/types.hpp"

namespace relayout::kernels {

struct AttentionParams {
  int head_dim = 0;
  double scale = 0.0;  // softmax scale; 1/sqrt(head_dim) is the usual choice
  int window = 0;      // sliding window in keys, the query's own included; 0: unlimited
  int splits = 0;      // decode: key ranges per request, merged by log-sum-exp; 0: fill the execution space
};

inline double default_softmax_scale(int head_dim) { return 1.0 / std::sqrt(double(head_dim)); }

namespace impl {

// exp of every lane: range reduction x = n ln2 + r, |r| <= ln2/2, a polynomial for e^r and 2^n
// from the exponent bits, so the softmax weights of a key chunk cost a few vector FMAs instead of
// one libm call per key. Inputs below the normal range give the smallest normal number (softmax
// only needs "negligible"); one lane falls back to the scalar exp.
template <int L, class V>
KOKKOS_FORCEINLINE_FUNCTION V vexp(V x) {
  if constexpr (L == 1) {
    return impl::exp(x);
  } else {
    using T = decltype(+x[0]);
    if constexpr (sizeof(T) == 4) {
      typedef std::int32_t VI __attribute__((vector_size(sizeof(V))));
      const V lo = V{} + T(-87.33654f), hi = V{} + T(88.37626f);
      x = x < lo ? lo : x;
      x = x > hi ? hi : x;
      const V t = x * T(1.44269504088896341f) + T(12582912.0f);  // round to nearest, n in the low bits
      const V n = t - T(12582912.0f);
      V r = x - n * T(0.693359375f);
      r = r - n * T(-2.12194440e-4f);
      V y = V{} + T(1.9875691500e-4f);
      y = y * r + T(1.3981999507e-3f);
      y = y * r + T(8.3334519073e-3f);
      y = y * r + T(4.1665795894e-2f);
      y = y * r + T(1.6666665459e-1f);
      y = y * r + T(5.0000001201e-1f);
      y = y * (r * r) + r + T(1);
      const VI e = ((VI)t - 0x4B400000 + 127) << 23;
      return y * (V)e;
    } else {
      typedef std::int64_t VI __attribute__((vector_size(sizeof(V))));
      const V lo = V{} + T(-708.0), hi = V{} + T(709.0);
      x = x < lo ? lo : x;
      x = x > hi ? hi : x;
      const V t = x * T(1.4426950408889634) + T(6755399441055744.0);
      const V n = t - T(6755399441055744.0);
      V r = x - n * T(6.93147180369123816490e-01);
      r = r - n * T(1.90821492927058770002e-10);
      // Taylor to r^12: |r| <= 0.347 leaves a remainder below 2e-16.
      V y = V{} + T(1.0 / 479001600.0);
      y = y * r + T(1.0 / 39916800.0);
      y = y * r + T(1.0 / 3628800.0);
      y = y * r + T(1.0 / 362880.0);
      y = y * r + T(1.0 / 40320.0);
      y = y * r + T(1.0 / 5040.0);
      y = y * r + T(1.0 / 720.0);
      y = y * r + T(1.0 / 120.0);
      y = y * r + T(1.0 / 24.0);
      y = y * r + T(1.0 / 6.0);
      y = y * r + T(0.5);
      y = y * r + T(1);
      y = y * r + T(1);
      const VI e = ((VI)t - 0x4338000000000000LL + 1023) << 52;
      return y * (V)e;
    }
  }
}

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

// Query row i is kv row i (plain prefill: every rank holds whole requests).
struct SameRow {
  KOKKOS_INLINE_FUNCTION std::int64_t operator()(std::int64_t i) const { return i; }
};

// Query row i is the kv row positions(i) (attention context parallelism).
template <class Pos>
struct RowAt {
  Pos p;
  KOKKOS_INLINE_FUNCTION std::int64_t operator()(std::int64_t i) const { return p(i); }
};

template <class ExecSpace, class Q, class KV, class O, class Cu, class Pos = SameRow>
struct PrefillFunctor {
  using T = typename O::non_const_value_type;
  AttendCore<ExecSpace, T> core;
  Q q;
  O out;
  ContiguousKeys<KV, Cu> keys;
  int n_req, window;
  Pos pos{};
  template <class Member>
  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const std::int64_t i = team.league_rank();
    const std::int64_t t = pos(i);  // the kv row of query i's own token: masks go by it
    int lo = 0, hi = n_req;  // the request b with cu[b] <= t < cu[b+1]
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (keys.cu(mid) <= t) lo = mid; else hi = mid;
    }
    const std::int64_t p = t - keys.cu(lo);
    std::int64_t begin = 0;
    if (window > 0 && p + 1 - window > begin) begin = p + 1 - window;
    core.attend(team, keys, lo, begin, p + 1, &q(i, 0), &out(i, 0), static_cast<T*>(nullptr));
  }
};

// The first key request b attends among its len keys: the last `window` of them (0: all).
struct WindowStart {
  int window;
  KOKKOS_INLINE_FUNCTION std::int64_t operator()(std::int64_t, std::int64_t len) const {
    return window > 0 && len - window > 0 ? len - window : 0;
  }
};
// ... or first(b), given per query row (a CP shard's keys: where the window starts among them).
template <class First>
struct FirstKey {
  First first;
  KOKKOS_INLINE_FUNCTION std::int64_t operator()(std::int64_t b, std::int64_t len) const {
    return first(b) < len ? std::int64_t(first(b)) : len;
  }
};

// Work item of decode: `ranges` consecutive splits of request b's keys from start(b, len), the
// keys split into `splits` ranges (a multiple of `ranges`) whose length is a multiple of the chunk,
// so the ranges of a paged cache start alike within their blocks and advance together. Without
// partial rows the output row is final (one split); with them, each split leaves an unnormalised
// partial row and its (m, l) for DecodeMerge.
template <class ExecSpace, class Q, class O, class Keys, class Start>
struct DecodeFunctor {
  using T = typename O::non_const_value_type;
  AttendCore<ExecSpace, T> core;
  Q q;
  O out;
  Keys keys;
  Kokkos::View<T**, typename ExecSpace::memory_space> partial, ml;  // (requests x splits) rows, or none
  Start start;
  int splits, ranges;
  template <class Member>
  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const std::int64_t teams_per_row = splits / ranges;
    const std::int64_t b = team.league_rank() / teams_per_row;
    const std::int64_t first_split = (team.league_rank() % teams_per_row) * ranges;
    const std::int64_t len = keys.length(b);
    const std::int64_t lo = start(b, len);
    std::int64_t per = (len - lo + splits - 1) / splits;
    if (splits > 1) per = (per + core.chunk - 1) / core.chunk * core.chunk;
    std::int64_t begin[kMaxRanges], end[kMaxRanges];
    T* o[kMaxRanges];
    T* m[kMaxRanges];
    for (int r = 0; r < ranges; ++r) {
      const std::int64_t sp = first_split + r, item = b * splits + sp;
      begin[r] = lo + sp * per < len ? lo + sp * per : len;
      end[r] = begin[r] + per < len ? begin[r] + per : len;
      o[r] = partial.extent(0) == 0 ? &out(b, 0) : &partial(item, 0);
      m[r] = partial.extent(0) == 0 ? static_cast<T*>(nullptr) : &ml(item, 0);
    }
    if (ranges == 1)
      core.attend(team, keys, b, begin[0], end[0], &q(b, 0), o[0], m[0]);
    else
      core.attend_lone(team, keys, b, ranges, begin, end, &q(b, 0), o, m);
  }
};

// The parts DecodeMerge combines for (row b, head h): unnormalised rows with their running max m
// and sum l (the key splits of one decode launch, part s of row b at b * parts + s) ...
template <class T, class Mem>
struct SplitParts {
  Kokkos::View<T**, Mem> partial, ml;
  int heads, head_dim, parts;
  KOKKOS_INLINE_FUNCTION std::int64_t at(std::int64_t b, int s) const { return b * parts + s; }
  KOKKOS_INLINE_FUNCTION T m(std::int64_t b, int s, int h) const { return ml(at(b, s), h); }
  KOKKOS_INLINE_FUNCTION T l(std::int64_t b, int s, int h) const { return ml(at(b, s), heads + h); }
  KOKKOS_INLINE_FUNCTION const T* o(std::int64_t b, int s, int h) const {
    return &partial(at(b, s), std::size_t(h) * head_dim);
  }
};
// ... or normalised rows with their log-sum-exp (attention_decode_partial's output from `parts`
// shards, part s of row b at s * n + b): m = lse, l = 1, and a part with lse = -inf holds no key.
template <class P, class L>
struct LseParts {
  using T = typename P::non_const_value_type;
  P partial;
  L lse;
  std::int64_t n;
  int head_dim, parts;
  KOKKOS_INLINE_FUNCTION T m(std::int64_t b, int s, int h) const { return lse(s * n + b, h); }
  KOKKOS_INLINE_FUNCTION T l(std::int64_t b, int s, int h) const { return m(b, s, h) > neg_inf<T>() ? T(1) : T(0); }
  KOKKOS_INLINE_FUNCTION const T* o(std::int64_t b, int s, int h) const {
    return &partial(s * n + b, std::size_t(h) * head_dim);
  }
};

// Merges the parts of (row, head) with the log-sum-exp rule: weights e^(m_s - max m). Writes the
// merged log-sum-exp too when lse has rows. A row no part has a key for gets 0 (lse -inf).
template <class O, class Parts, class L>
struct DecodeMerge {
  using T = typename O::non_const_value_type;
  O out;
  Parts parts;
  L lse;
  int heads, head_dim, n_parts;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i) const {
    const std::int64_t b = i / heads;
    const int h = int(i % heads);
    T mmax = T(0);
    bool any = false;
    for (int s = 0; s < n_parts; ++s)
      if (parts.l(b, s, h) > T(0) && (!any || parts.m(b, s, h) > mmax)) mmax = parts.m(b, s, h), any = true;
    T* oh = &out(b, std::size_t(h) * head_dim);
    for (int d = 0; d < head_dim; ++d) oh[d] = T(0);
    if (!any) {
      if (lse.extent(0) > 0) lse(b, h) = neg_inf<T>();
      return;
    }
    T sum = T(0);
    for (int s = 0; s < n_parts; ++s) {
      if (!(parts.l(b, s, h) > T(0))) continue;
      const T w = impl::exp(T(parts.m(b, s, h) - mmax));
      sum += w * parts.l(b, s, h);
      const T* ph = parts.o(b, s, h);
      for (int d = 0; d < head_dim; ++d) oh[d] += w * ph[d];
    }
    const T inv = T(1) / sum;
    for (int d = 0; d < head_dim; ++d) oh[d] *= inv;
    if (lse.extent(0) > 0) lse(b, h) = mmax + impl::log(sum);
  }
};

// Key splits per request: enough work items to fill the execution space, no split shorter than
// a few chunks (each costs a partial row and a merge). On the host a lone head's work item reads
// several splits side by side (decode_ranges), so a request of enough keys gets kMaxRanges of
// them even where one thread runs everything.
template <class ExecSpace>
int decode_splits(const ExecSpace& exec, int requested, std::int64_t n_req, std::int64_t longest, int heads) {
  if (requested > 0) return requested;
  const std::int64_t by_len = (longest + 255) / 256;
  std::int64_t by_width = (std::int64_t(exec.concurrency()) + n_req - 1) / (n_req > 0 ? n_req : 1);
  if (is_host_space_v<ExecSpace> && heads == 1 && by_width < kMaxRanges) by_width = kMaxRanges;
  const std::int64_t s = by_len < by_width ? by_len : by_width;
  return s < 1 ? 1 : int(s);
}

// Splits one work item reads side by side: for a lone head on the host, the most (up to
// kMaxRanges) that divide `splits`; otherwise one (several heads have the arithmetic to hide
// memory; on a device the splits are the parallelism).
template <class ExecSpace>
int decode_ranges(int splits, int heads) {
  if (!is_host_space_v<ExecSpace> || heads != 1) return 1;
  for (int r = kMaxRanges; r > 1; --r)
    if (splits % r == 0) return r;
  return 1;
}

template <class Q, class KV, class O>
int check_attention(const char* fn, const Q& q, const KV& kv, const O& out, const AttentionParams& p) {
  require(p.head_dim >= 1, fn, "head_dim", "must be >= 1, got " + str(p.head_dim));
  require(int(kv.extent(1)) == p.head_dim, fn, "kv",
          "kv.extent(1) must equal head_dim " + str(p.head_dim) + " (one shared KV head), got " +
              str(kv.extent(1)));
  require(q.extent(1) % p.head_dim == 0 && q.extent(1) > 0, fn, "q",
          "q.extent(1) must be a positive multiple of head_dim " + str(p.head_dim) + ", got " +
              str(q.extent(1)));
  require(out.extent(0) == q.extent(0) && out.extent(1) == q.extent(1), fn, "out",
          "must have q's shape " + str(q.extent(0)) + " x " + str(q.extent(1)));
  require(p.window >= 0, fn, "window", "must be >= 0 (0: unlimited), got " + str(p.window));
  require(p.scale > 0 && std::isfinite(p.scale), fn, "scale", "must be finite and > 0");
  return int(q.extent(1) / p.head_dim);
}

// Copies cu_seqlens to the host (a synchronisation point), checks it; returns the longest request.
template <class Cu>
std::int64_t check_offsets(const char* fn, const char* name, const Cu& cu, std::int64_t rows, bool exact,
                   bool nonempty) {
  require(cu.extent(0) >= 1, fn, name, "must hold n_requests + 1 offsets (at least one)");
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), cu);
  require(h(0) == 0, fn, name, "must start at 0, got " + str(h(0)));
  for (std::size_t b = 0; b + 1 < h.extent(0); ++b) {
    require(h(b + 1) >= h(b) + (nonempty ? 1 : 0), fn, name,
            std::string(nonempty ? "must be strictly increasing (every request holds >= 1 row)"
                                 : "must be non-decreasing") +
                ", entries " + str(std::int64_t(b)) + ".." + str(std::int64_t(b + 1)) + " are " +
                str(h(b)) + ", " + str(h(b + 1)));
  }
  const std::int64_t last = h(h.extent(0) - 1);
  std::int64_t longest = 0;
  for (std::size_t b = 0; b + 1 < h.extent(0); ++b) longest = h(b + 1) - h(b) > longest ? h(b + 1) - h(b) : longest;
  require(exact ? last == rows : last <= rows, fn, name,
          std::string("last entry must ") + (exact ? "equal" : "not exceed") + " the kv rows " +
              str(rows) + ", got " + str(last));
  return longest;
}

}  // namespace impl

// Causal prefill. Request b owns rows [cu_seqlens[b], cu_seqlens[b+1]) of q (tokens x heads*head_dim)
// and kv (tokens x head_dim); the token at position p of its request attends that request's keys
// max(0, p - window + 1) .. p. out: tokens x heads*head_dim.
template <class ExecSpace, RowMatrixView Q, RowMatrixView KV, VectorView Cu, MutableRowMatrixView O>
void attention_prefill(const ExecSpace& exec, const Q& q, const KV& kv, const Cu& cu_seqlens,
                       const O& out, const AttentionParams& params) {
  static_assert(std::is_same_v<scalar_of<Q>, scalar_of<O>> && std::is_same_v<scalar_of<KV>, scalar_of<O>>,
                "relayout::kernels::attention_prefill: q, kv and out must have the same scalar type");
  static_assert(std::is_same_v<scalar_of<Cu>, int>, "relayout::kernels: cu_seqlens must hold int");
  const int heads = impl::check_attention("attention_prefill", q, kv, out, params);
  impl::require(kv.extent(0) == q.extent(0), "attention_prefill", "kv",
                "must have one row per query row (" + impl::str(q.extent(0)) + "), got " +
                    impl::str(kv.extent(0)));
  impl::check_offsets("attention_prefill", "cu_seqlens", cu_seqlens, std::int64_t(q.extent(0)), true, false);
  if (q.extent(0) == 0) return;
  using T = scalar_of<O>;
  using Core = impl::AttendCore<ExecSpace, T>;
  const int n_req = int(cu_seqlens.extent(0)) - 1;
  Kokkos::TeamPolicy<ExecSpace> policy(exec, int(q.extent(0)), Kokkos::AUTO);
  Kokkos::parallel_for("relayout::kernels::attention_prefill",
                       policy.set_scratch_size(0, Kokkos::PerTeam(Core::scratch_bytes(heads))),
                       impl::PrefillFunctor<ExecSpace, Q, KV, O, Cu>{
                           Core{heads, params.head_dim, impl::chunk_keys<T>(params.head_dim, heads), T(params.scale)},
                           q, out, {kv, cu_seqlens}, n_req, params.window});
}

// Causal prefill of query rows that are a subset of the kv rows (attention context parallelism:
// a CP rank holds some of each request's tokens and all of their keys). Query row i is the token
// whose own key is kv row positions[i]; it attends the keys of that token's request from
// max(start, positions[i] - window + 1) to positions[i], so causality and the window go by global
// position. kv and cu_seqlens cover the whole requests; q, out: positions.extent(0) rows.
template <class ExecSpace, RowMatrixView Q, RowMatrixView KV, VectorView Cu, VectorView Pos, MutableRowMatrixView O>
void attention_prefill(const ExecSpace& exec, const Q& q, const KV& kv, const Cu& cu_seqlens, const Pos& positions,
                       const O& out, const AttentionParams& params) {
  static_assert(std::is_same_v<scalar_of<Q>, scalar_of<O>> && std::is_same_v<scalar_of<KV>, scalar_of<O>>,
                "relayout::kernels::attention_prefill: q, kv and out must have the same scalar type");
  static_assert(std::is_same_v<scalar_of<Cu>, int>, "relayout::kernels: cu_seqlens must hold int");
  static_assert(std::is_same_v<scalar_of<Pos>, int>, "relayout::kernels: positions must hold int");
  const int heads = impl::check_attention("attention_prefill", q, kv, out, params);
  impl::require(positions.extent(0) == q.extent(0), "attention_prefill", "positions",
                "must hold one kv row per query row (" + impl::str(q.extent(0)) + "), got " +
                    impl::str(positions.extent(0)));
  impl::check_offsets("attention_prefill", "cu_seqlens", cu_seqlens, std::int64_t(kv.extent(0)), true, false);
  {
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), positions);
    for (std::size_t i = 0; i < h.extent(0); ++i)
      impl::require(h(i) >= 0 && std::int64_t(h(i)) < std::int64_t(kv.extent(0)), "attention_prefill", "positions",
                    "entry " + impl::str(std::int64_t(i)) + " is " + impl::str(h(i)) + "; a kv row must be in [0, " +
                        impl::str(kv.extent(0)) + ")");
  }
  if (q.extent(0) == 0) return;
  using T = scalar_of<O>;
  using Core = impl::AttendCore<ExecSpace, T>;
  using At = impl::RowAt<Pos>;
  const int n_req = int(cu_seqlens.extent(0)) - 1;
  Kokkos::TeamPolicy<ExecSpace> policy(exec, int(q.extent(0)), Kokkos::AUTO);
  Kokkos::parallel_for("relayout::kernels::attention_prefill",
                       policy.set_scratch_size(0, Kokkos::PerTeam(Core::scratch_bytes(heads))),
                       impl::PrefillFunctor<ExecSpace, Q, KV, O, Cu, At>{
                           Core{heads, params.head_dim, impl::chunk_keys<T>(params.head_dim, heads), T(params.scale)},
                           q, out, {kv, cu_seqlens}, n_req, params.window, At{positions}});
}

namespace impl {

// Decode of every query row over keys from start(b, len) (longest: the most keys a row attends),
// normalised into out; with lse rows (heads per query row), also each row's log-sum-exp per head,
// which makes every launch go through the partial rows and the merge.
template <class ExecSpace, class Q, class O, class Keys, class Start, class L>
void decode_launch(const ExecSpace& exec, const Q& q, const Keys& keys, const O& out, const AttentionParams& params,
                   int heads, std::int64_t longest, const Start& start, const L& lse) {
  using T = scalar_of<O>;
  using Mem = typename ExecSpace::memory_space;
  using Core = AttendCore<ExecSpace, T>;
  const std::int64_t n_req = std::int64_t(q.extent(0));
  const std::int64_t keys_used = params.window > 0 && params.window < longest ? params.window : longest;
  const int splits = decode_splits(exec, params.splits, n_req, keys_used, heads);
  Kokkos::View<T**, Mem> partial, ml;
  if (splits > 1 || lse.extent(0) > 0) {
    partial = Kokkos::View<T**, Mem>(Kokkos::view_alloc(exec, "relayout::attention_partial", Kokkos::WithoutInitializing),
                                     n_req * splits, q.extent(1));
    ml = Kokkos::View<T**, Mem>(Kokkos::view_alloc(exec, "relayout::attention_ml", Kokkos::WithoutInitializing),
                                n_req * splits, 2 * heads);
  }
  const int ranges = decode_ranges<ExecSpace>(splits, heads);
  Kokkos::TeamPolicy<ExecSpace> policy(exec, int(n_req * (splits / ranges)), Kokkos::AUTO);
  Kokkos::parallel_for("relayout::kernels::attention_decode",
                       policy.set_scratch_size(0, Kokkos::PerTeam(Core::scratch_bytes(heads, ranges))),
                       DecodeFunctor<ExecSpace, Q, O, Keys, Start>{
                           Core{heads, params.head_dim, chunk_keys<T>(params.head_dim, heads), T(params.scale)}, q, out,
                           keys, partial, ml, start, splits, ranges});
  if (partial.extent(0) > 0)
    Kokkos::parallel_for("relayout::kernels::attention_decode_merge",
                         Kokkos::RangePolicy<ExecSpace>(exec, 0, n_req * heads),
                         DecodeMerge<O, SplitParts<T, Mem>, L>{out, {partial, ml, heads, params.head_dim, splits}, lse,
                                                               heads, params.head_dim, splits});
}

// No log-sum-exp wanted.
template <class O>
using NoLse = Kokkos::View<typename O::non_const_value_type**, Kokkos::LayoutRight, typename O::memory_space>;

// Checks a paged view's slots against q; returns the lengths of the slots (host) and the slots.
template <class Q, class T, class MemSpace>
auto check_slots(const Q& q, const PagedKv<T, MemSpace>& kv, bool nonempty) {
  require(kv.slots.extent(0) == q.extent(0), "attention_decode", "slots",
          "must name one request slot per query row (" + str(q.extent(0)) + "), got " + str(kv.slots.extent(0)));
  auto slots = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), kv.slots);
  auto lengths = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), kv.lengths);
  for (std::size_t b = 0; b < slots.extent(0); ++b) {
    const int s = slots(b);
    require(s >= 0 && std::size_t(s) < lengths.extent(0), "attention_decode", "slots",
            "entry " + str(std::int64_t(b)) + " is " + str(s) + ", not a slot of the cache");
    require(!nonempty || lengths(s) >= 1, "attention_decode", "slots",
            "request slot " + str(s) + " holds no rows (append the new token's kv first)");
  }
  return std::make_pair(slots, lengths);
}

}  // namespace impl

// Decode: one new query row per request (q: n_requests x heads*head_dim). Request b's cache is
// rows [cu_cache[b], cu_cache[b+1]) of kv_cache (rows x head_dim), its new token's kv already
// appended (so every request holds >= 1 row); it attends the last min(window, L) of them.
template <class ExecSpace, RowMatrixView Q, RowMatrixView KV, VectorView Cu, MutableRowMatrixView O>
void attention_decode(const ExecSpace& exec, const Q& q, const KV& kv_cache, const Cu& cu_cache,
                      const O& out, const AttentionParams& params) {
  static_assert(std::is_same_v<scalar_of<Q>, scalar_of<O>> && std::is_same_v<scalar_of<KV>, scalar_of<O>>,
                "relayout::kernels::attention_decode: q, kv_cache and out must have the same scalar type");
  static_assert(std::is_same_v<scalar_of<Cu>, int>, "relayout::kernels: cu_cache must hold int");
  const int heads = impl::check_attention("attention_decode", q, kv_cache, out, params);
  impl::require(cu_cache.extent(0) == q.extent(0) + 1, "attention_decode", "cu_cache",
                "must hold n_requests + 1 = " + impl::str(q.extent(0) + 1) + " offsets, got " +
                    impl::str(cu_cache.extent(0)));
  const std::int64_t longest =
      impl::check_offsets("attention_decode", "cu_cache", cu_cache, std::int64_t(kv_cache.extent(0)), false, true);
  if (q.extent(0) == 0) return;
  impl::decode_launch(exec, q, impl::ContiguousKeys<KV, Cu>{kv_cache, cu_cache}, out, params, heads, longest,
                      impl::WindowStart{params.window}, impl::NoLse<O>());
}

// Decode through a paged cache (PagedKvCache::view): query row b attends the last min(window, L)
// rows of request slot kv.slots(b), read in place through its block table.
template <class ExecSpace, RowMatrixView Q, class T, class MemSpace, MutableRowMatrixView O>
void attention_decode(const ExecSpace& exec, const Q& q, const PagedKv<T, MemSpace>& kv, const O& out,
                      const AttentionParams& params) {
  static_assert(std::is_same_v<scalar_of<Q>, T> && std::is_same_v<scalar_of<O>, T>,
                "relayout::kernels::attention_decode: q, the cache and out must have the same scalar type");
  const int heads = impl::check_attention("attention_decode", q, kv.pool, out, params);
  const auto [slots, lengths] = impl::check_slots(q, kv, true);
  std::int64_t longest = 0;
  for (std::size_t b = 0; b < slots.extent(0); ++b) longest = lengths(slots(b)) > longest ? lengths(slots(b)) : longest;
  if (q.extent(0) == 0) return;
  impl::decode_launch(exec, q, impl::PagedKeys<T, MemSpace>{kv}, out, params, heads, longest,
                      impl::WindowStart{params.window}, impl::NoLse<O>());
}

// Partial decode over one shard of each request's keys (attention context parallelism: a CP rank
// holds some positions of every request, in order). Query row b attends rows [first(b), L) of
// request slot kv.slots(b), L its length in this cache, and gets its normalised output row in out
// and, per head, the log-sum-exp of its scaled scores in lse (rows x heads). first(b) is where
// the sliding window starts among this shard's rows (0: all of them), so params.window must be 0.
// A row with no key here (first(b) >= L) gets out = 0, lse = -inf. attention_merge combines the
// shards' partials into what attention_decode over all the keys gives.
template <class ExecSpace, RowMatrixView Q, class T, class MemSpace, VectorView First, MutableRowMatrixView O,
          MutableRowMatrixView L>
void attention_decode_partial(const ExecSpace& exec, const Q& q, const PagedKv<T, MemSpace>& kv, const First& first,
                              const O& out, const L& lse, const AttentionParams& params) {
  static_assert(std::is_same_v<scalar_of<Q>, T> && std::is_same_v<scalar_of<O>, T> && std::is_same_v<scalar_of<L>, T>,
                "relayout::kernels::attention_decode_partial: q, the cache, out and lse must have the same scalar type");
  static_assert(std::is_same_v<scalar_of<First>, int>, "relayout::kernels: first must hold int");
  const char* fn = "attention_decode_partial";
  const int heads = impl::check_attention(fn, q, kv.pool, out, params);
  impl::require(params.window == 0, fn, "window",
                "must be 0: the window of a shard is given per query row by first, got " + impl::str(params.window));
  impl::require(first.extent(0) == q.extent(0), fn, "first",
                "must hold one entry per query row (" + impl::str(q.extent(0)) + "), got " + impl::str(first.extent(0)));
  impl::require(lse.extent(0) == q.extent(0) && int(lse.extent(1)) == heads, fn, "lse",
                "must be " + impl::str(q.extent(0)) + " x " + impl::str(heads) + " (query rows x heads), got " +
                    impl::str(lse.extent(0)) + " x " + impl::str(lse.extent(1)));
  const auto [slots, lengths] = impl::check_slots(q, kv, false);
  auto f = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), first);
  std::int64_t longest = 0;
  for (std::size_t b = 0; b < slots.extent(0); ++b) {
    impl::require(f(b) >= 0, fn, "first", "entry " + impl::str(std::int64_t(b)) + " is " + impl::str(f(b)) + "; must be >= 0");
    longest = lengths(slots(b)) - f(b) > longest ? lengths(slots(b)) - f(b) : longest;
  }
  if (q.extent(0) == 0) return;
  impl::decode_launch(exec, q, impl::PagedKeys<T, MemSpace>{kv}, out, params, heads, longest,
                      impl::FirstKey<First>{first}, lse);
}

// Merges the partials of n query rows from P shards (attention_decode_partial on each):
// partials ((P * n) x heads*head_dim) and lse ((P * n) x heads), shard p's row b at p * n + b (the
// order an all-gather or all-to-all over P ranks leaves). out(b) = sum_p e^(lse_p - M) partial_p /
// sum_p e^(lse_p - M), M the largest lse of the row and head; shards with lse = -inf add nothing,
// and a row no shard has a key for gets 0.
template <class ExecSpace, RowMatrixView P, RowMatrixView L, MutableRowMatrixView O>
void attention_merge(const ExecSpace& exec, const P& partials, const L& lse, const O& out) {
  static_assert(std::is_same_v<scalar_of<P>, scalar_of<O>> && std::is_same_v<scalar_of<L>, scalar_of<O>>,
                "relayout::kernels::attention_merge: partials, lse and out must have the same scalar type");
  const char* fn = "attention_merge";
  const int heads = int(lse.extent(1));
  const std::int64_t n = std::int64_t(out.extent(0));
  impl::require(heads >= 1 && out.extent(1) % std::size_t(heads) == 0, fn, "lse",
                "must have one column per head, a positive divisor of out's " + impl::str(out.extent(1)) +
                    " columns, got " + impl::str(heads));
  impl::require(partials.extent(1) == out.extent(1), fn, "partials",
                "must have out's " + impl::str(out.extent(1)) + " columns, got " + impl::str(partials.extent(1)));
  impl::require(partials.extent(0) == lse.extent(0) && (n == 0 ? partials.extent(0) == 0 : partials.extent(0) % n == 0),
                fn, "partials",
                "must hold P x " + impl::str(n) + " rows (P shards of out's rows), as lse does; got " +
                    impl::str(partials.extent(0)) + " and " + impl::str(lse.extent(0)));
  if (n == 0) return;
  const int head_dim = int(out.extent(1)) / heads, parts = int(std::int64_t(partials.extent(0)) / n);
  Kokkos::parallel_for("relayout::kernels::attention_merge", Kokkos::RangePolicy<ExecSpace>(exec, 0, n * heads),
                       impl::DecodeMerge<O, impl::LseParts<P, L>, impl::NoLse<O>>{
                           out, {partials, lse, n, head_dim, parts}, impl::NoLse<O>(), heads, head_dim, parts});
}

}  // namespace relayout::kernels
