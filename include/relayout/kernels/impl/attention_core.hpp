// Internal: the inner loops of shared-KV attention (relayout/kernels/attention.hpp): how keys are
// read (contiguous rows or through a paged cache's block table) and AttendCore, one query row
// against a range of keys by chunks with an online softmax. Not public API.
#pragma once

#include <Kokkos_Core.hpp>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "relayout/kernels/impl/attention_bf16.hpp"
#include "relayout/kernels/impl/simd.hpp"
#include "relayout/kernels/kv_cache.hpp"

namespace relayout::kernels::impl {

// Vector registers of the host ISA: AVX-512 has 32, AVX2 and SSE 16. The register tiles below are
// sized to them.
#if defined(RELAYOUT_KERNELS_HOST_SIMD) && defined(__AVX512F__)
inline constexpr int kVectorRegs = 32;
#else
inline constexpr int kVectorRegs = 16;
#endif
inline constexpr int kChunkMax = 32;  // keys per chunk, at most (the score scratch stride)
// Heads per group (one team thread per group): the heads one key vector loaded feeds.
inline constexpr int kHeadGroup = kVectorRegs >= 32 ? 8 : 4;
inline constexpr int kLineBytes = 64;
inline constexpr int kMaxRanges = 4;  // key ranges a lone head's decode work item reads side by side

// Prefetch to L2, not L1: the chunk being computed keeps L1 (measured with 8 heads of 512: 1.0-1.15x
// over prefetching to L1; without the prefetch the row ran at 0.55-0.6x).
KOKKOS_FORCEINLINE_FUNCTION void prefetch(const void* p) {
#if defined(RELAYOUT_KERNELS_HOST_SIMD)
  __builtin_prefetch(p, 0, 2);
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
  using key_type = T;
  KV kv;
  Cu cu;
  KOKKOS_INLINE_FUNCTION std::int64_t length(std::int64_t b) const { return cu(b + 1) - cu(b); }
  // Row of key p of request b, and how many keys from p on lie in consecutive rows.
  KOKKOS_INLINE_FUNCTION const T* row(std::int64_t b, std::int64_t p, std::int64_t end, int& run) const {
    run = int(end - p < kChunkMax ? end - p : kChunkMax);
    return &kv(cu(b) + p, 0);
  }
  KOKKOS_INLINE_FUNCTION std::int64_t stride() const { return std::int64_t(kv.stride(0)); }
  // Optional: the keys again, transposed by chunks (TransposedKeys), or null.
  const T* kt = nullptr;
  const std::int64_t* kt_base = nullptr;  // request b's first chunk in kt
  int kt_dim = 0;                         // head_dim
  // The transposed chunk of request b's keys from p on (p a multiple of kChunkMax), or null.
  KOKKOS_INLINE_FUNCTION const T* transposed(std::int64_t b, std::int64_t p) const {
    return kt ? kt + (kt_base[b] + p / kChunkMax) * std::int64_t(kt_dim) * kChunkMax : nullptr;
  }
};

// Keys of request slots(b) through its block table: consecutive only within a block.
template <class T, class MemSpace>
struct PagedKeys {
  using key_type = T;
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
  KOKKOS_INLINE_FUNCTION const T* transposed(std::int64_t, std::int64_t) const { return nullptr; }
};

// The rows of one chunk: keys 0 .. n0 from p0 on and the rest from p1 on, each part in rows ld
// apart. A chunk of a paged cache spans the end of one block and the start of the next, so it is
// as long with blocks of 16 rows as without (measured at 16 heads of 128: 16-key chunks 0.75x
// 32-key ones).
template <class T>
struct ChunkRows {
  const T* p0;
  const T* p1;
  int n0;
  std::int64_t ld;
  KOKKOS_FORCEINLINE_FUNCTION const T* row(int j) const { return j < n0 ? p0 + j * ld : p1 + (j - n0) * ld; }
};

// a * b + c rounded once. The scalar tails of the dot products (head_dim not a multiple of the
// lanes) are written with it: left to g++, `r += a * b` over a tail became vector products and
// ordered adds for some elements and FMAs for others, chosen per loop, so a key read as bf16 and
// the same key read as fp32 could round differently.
template <class T>
KOKKOS_FORCEINLINE_FUNCTION T fmadd(T a, T b, T c) {
#if defined(RELAYOUT_KERNELS_HOST_SIMD)
  if constexpr (std::is_same_v<T, float>) return __builtin_fmaf(a, b, c);
  else return __builtin_fma(a, b, c);
#else
  return a * b + c;
#endif
}

// q . k over n elements, L lanes at a time with 4 independent accumulators (dot in simd.hpp, the
// keys read by load_key).
template <int L, class T, class K>
KOKKOS_FORCEINLINE_FUNCTION T dot_key(const T* q, const K* k, int n) {
  using V = typename Vec<T, L>::type;
  V s0{}, s1{}, s2{}, s3{};
  int i = 0;
  for (; i + 4 * L <= n; i += 4 * L) {
    s0 += load<V>(q + i) * load_key<V>(k + i);
    s1 += load<V>(q + i + L) * load_key<V>(k + i + L);
    s2 += load<V>(q + i + 2 * L) * load_key<V>(k + i + 2 * L);
    s3 += load<V>(q + i + 3 * L) * load_key<V>(k + i + 3 * L);
  }
  for (; i + L <= n; i += L) s0 += load<V>(q + i) * load_key<V>(k + i);
  T s = hsum<L>((s0 + s1) + (s2 + s3));
  for (; i < n; ++i) s = fmadd(q[i], key_value<T>(k[i]), s);
  return s;
}

// out[r] = q . k[r] for R rows at once, sharing the loads of q: R streams read side by side.
// Accumulators per row: enough chains in all to cover the FMA latency.
template <int L, int R, class T, class K>
KOKKOS_FORCEINLINE_FUNCTION void dot_rows(const T* q, const K* const* k, int n, T* out) {
  if constexpr (R == 1) {
    out[0] = dot_key<L>(q, k[0], n);
  } else {
    using V = typename Vec<T, L>::type;
    constexpr int A = R == 2 ? 2 : 1;
    V s[R][A];
    for (int r = 0; r < R; ++r)
      for (int u = 0; u < A; ++u) s[r][u] = V{};
    int i = 0;
    for (; i + A * L <= n; i += A * L)
      for (int u = 0; u < A; ++u) {
        const V qv = load<V>(q + i + u * L);
        for (int r = 0; r < R; ++r) s[r][u] += qv * load_key<V>(k[r] + i + u * L);
      }
    for (; i + L <= n; i += L) {
      const V qv = load<V>(q + i);
      for (int r = 0; r < R; ++r) s[r][0] += qv * load_key<V>(k[r] + i);
    }
    for (int r = 0; r < R; ++r) {
      V a = s[r][0];
      for (int u = 1; u < A; ++u) a += s[r][u];
      T t = hsum<L>(a);
      for (int ii = i; ii < n; ++ii) t = fmadd(q[ii], key_value<T>(k[r][ii]), t);
      out[r] = t;
    }
  }
}

// One query row (heads x head_dim) against keys [begin, end) of one request, by chunks of at most
// `chunk` keys. Heads go in groups of kHeadGroup, one team thread per group, so every key vector
// loaded feeds the whole group: scores are a register tile of dot products (8 heads x 2 keys with
// 32 vector registers, 4 x 3 with 16) whose horizontal sums go L at a time through one transpose
// and add, the softmax weights of a chunk are one vectorised exp per head, and p . V is a register
// tile (4 heads x 4 vectors; 4 x 3 with 16 registers) that also applies the rescale of the
// previous chunks. A lone head reads its keys row after row instead, and a decode work item with
// one head walks several key ranges side by side (attend_lone). `o` accumulates unnormalised; m
// and l are the running max and sum per head.
template <class ExecSpace, class T, class K = T>
struct AttendCore {
  static constexpr int L = lanes_v<ExecSpace, T>;
  using V = typename Vec<T, L>::type;
  int heads, head_dim, chunk;
  T scale;

  // s[a][j + b] = q_a . k_(j + b) for MH heads and MK keys. Rows j .. j + MK of the next chunk
  // (pf, pf_rows rows; null: none) are prefetched line by line meanwhile, so memory streams while
  // this chunk computes (the hardware prefetchers alone leave the two serialised).
  template <int MH, int MK>
  KOKKOS_FORCEINLINE_FUNCTION void score_tile(const T* const* qh, const ChunkRows<K>& k, T* s, int j,
                                              const ChunkRows<K>* pf, int pf_rows) const {
    const int D = head_dim;
    const K* kj[MK];
    for (int b = 0; b < MK; ++b) kj[b] = k.row(j + b);
    V acc[MH * MK];
    for (int i = 0; i < MH * MK; ++i) acc[i] = V{};
    auto body = [&](int d) RELAYOUT_INLINE_LAMBDA {
      V kv[MK];
      for (int b = 0; b < MK; ++b) kv[b] = load_key<V>(kj[b] + d);
      for (int a = 0; a < MH; ++a) {
        V qv = load<V>(qh[a] + d);
        if constexpr (MK > 1) in_register(qv);
        for (int b = 0; b < MK; ++b) acc[a * MK + b] += qv * kv[b];
      }
    };
    int d = 0;
    constexpr int S = kLineBytes / int(sizeof(K));
    if (pf && S % L == 0) {
      const int pb = pf_rows - j < MK ? pf_rows - j : MK;
      const K* pr[MK];
      for (int b = 0; b < pb; ++b) pr[b] = pf->row(j + b);
      for (; d + S <= D; d += S) {
        for (int b = 0; b < pb; ++b) prefetch(pr[b] + d);
        for (int u = 0; u < S; u += L) body(d + u);
      }
    }
    for (; d + L <= D; d += L) body(d);
    // The MH x MK sums: L at a time by one transpose and add, the rest one by one, all in the same
    // lane order (hsum_tree), so a score does not depend on the tile it was in.
    constexpr int N = MH * MK;
    T r[N];
    int i = 0;
    if constexpr (L > 1)
      for (; i + L <= N; i += L) store<V>(r + i, transpose_sum<L>(acc + i));
    for (; i < N; ++i) r[i] = hsum_tree<L>(acc[i]);
    if (d < D)
      for (int a = 0; a < MH; ++a)
        for (int b = 0; b < MK; ++b)
          for (int dd = d; dd < D; ++dd) r[a * MK + b] = fmadd(qh[a][dd], key_value<T>(kj[b][dd]), r[a * MK + b]);
    for (int a = 0; a < MH; ++a) __builtin_memcpy(s + a * kChunkMax + j, r + a * MK, MK * sizeof(T));
  }

  // s[a][0 .. kChunkMax) = q_a . k_j for the keys of one chunk read from its transposed copy kt
  // (head_dim rows of kChunkMax keys, TransposedKeys): the keys lie along the lanes, so a tile is
  // MH heads x KB key vectors of accumulators, each d one load per key vector and one broadcast
  // per head, and the scores come out as whole vectors with no horizontal sums. Every score is
  // one chain of FMAs over d in order, whatever the tile: a head's scores do not depend on the
  // heads beside it. Lanes past the chunk's keys hold scores of the zero padding.
  template <int MH>
  KOKKOS_FORCEINLINE_FUNCTION void score_kt(const T* const* qh, const T* kt, T* s) const {
    constexpr int NK = kChunkMax / L;  // key vectors of a chunk
    constexpr int KB = kt_key_vectors(MH, NK);
    const int D = head_dim;
    for (int kb = 0; kb < NK; kb += KB) {
      V acc[MH][KB];
      for (int a = 0; a < MH; ++a)
        for (int u = 0; u < KB; ++u) acc[a][u] = V{};
      const T* kd = kt + kb * L;
      for (int d = 0; d < D; ++d, kd += kChunkMax) {
        V kv[KB];
        for (int u = 0; u < KB; ++u) {
          kv[u] = load<V>(kd + u * L);
          in_register(kv[u]);  // one load per key vector, not one per head
        }
        for (int a = 0; a < MH; ++a) {
          const T qa = qh[a][d];
          for (int u = 0; u < KB; ++u) acc[a][u] += qa * kv[u];
        }
      }
      for (int a = 0; a < MH; ++a)
        for (int u = 0; u < KB; ++u) store<V>(s + a * kChunkMax + (kb + u) * L, acc[a][u]);
    }
  }
  // Key vectors per score_kt tile: half the vector registers as accumulators, a power of two that
  // divides the chunk's nk vectors.
  static constexpr int kt_key_vectors(int mh, int nk) {
    int kb = 1;
    while (kb * 2 <= nk && kb * 2 * mh <= kVectorRegs / 2) kb *= 2;
    return kb;
  }

  template <int MH, int NV>
  KOKKOS_FORCEINLINE_FUNCTION void value_tile(T* const* oh, int d, const ChunkRows<K>& k, int nb, const T* p,
                                              const T* corr, bool first) const {
    V acc[MH][NV];
    for (int a = 0; a < MH; ++a)
      for (int v = 0; v < NV; ++v) acc[a][v] = first ? V{} : corr[a] * load<V>(oh[a] + d + v * L);
    auto key = [&](const K* kj, int j) RELAYOUT_INLINE_LAMBDA {
      V kv[NV];
      for (int v = 0; v < NV; ++v) {
        kv[v] = load_key<V>(kj + v * L);
        if constexpr (MH > 1) in_register(kv[v]);  // one load per vector, not one per head
      }
      for (int a = 0; a < MH; ++a) {
        const T pa = p[a * kChunkMax + j];
        for (int v = 0; v < NV; ++v) acc[a][v] += pa * kv[v];
      }
    };
    const int n0 = k.n0 < nb ? k.n0 : nb;
    int j = 0;
    for (; j < n0; ++j) key(k.p0 + j * k.ld + d, j);
    for (; j < nb; ++j) key(k.p1 + (j - n0) * k.ld + d, j);
    for (int a = 0; a < MH; ++a)
      for (int v = 0; v < NV; ++v) store<V>(oh[a] + d + v * L, acc[a][v]);
  }

  // One chunk of nb keys (rows k) for heads h0 .. h0 + MH.
  template <int MH>
  KOKKOS_FORCEINLINE_FUNCTION void chunk_step(const T* q, T* o, int h0, const ChunkRows<K>& k, int nb, bool first,
                                              T* m, T* l, T* s, const ChunkRows<K>* pf, int pf_rows,
                                              bool scored = false, const T* kt = nullptr) const {
    const int D = head_dim;
    const T* qh[MH];
    T* oh[MH];
    for (int a = 0; a < MH; ++a) {
      qh[a] = q + std::size_t(h0 + a) * D;
      oh[a] = o + std::size_t(h0 + a) * D;
    }
    // Register tiles sized to the vector registers: with several heads every key vector loaded
    // feeds a tile of heads x keys. A lone head has too little arithmetic per byte to hide memory,
    // so it reads its keys in address order, one row after the other: the hardware prefetcher
    // follows that one stream, where rows read side by side break it into short ones (measured
    // 1.07-1.29x over an 8-key tile that prefetched the next chunk by hand).
    constexpr bool wide = kVectorRegs >= 32;
    // Scores: MH x MK accumulators, MH + MK loads per MH * MK FMAs. With 32 registers, 16
    // accumulators (8 heads x 2 keys: 10 loads per 16 FMAs), a multiple of the lanes, so their
    // sums take whole transposes.
    constexpr int MK = wide ? (MH >= 6 ? 2 : (16 / MH > 8 ? 8 : 16 / MH)) : (MH == 2 ? 4 : 3);
    // p . V: HB heads x NV vectors per pass over the chunk's rows. With 32 registers, 16
    // accumulators (4 heads x 4 vectors: 8 loads per 16 FMAs; 4 x 6 and 8 x 2 measured no faster)
    // and about as many for a group of other sizes; a lone head keeps its 12.
    constexpr int HB = wide && MH % 4 == 0 ? 4 : MH;
    constexpr int NV = !wide || HB == 1 ? (HB == 1 ? 12 : (HB == 2 ? 6 : (HB == 3 ? 4 : 3)))
                                        : (16 / HB > 8 ? 8 : 16 / HB);
    int j = scored ? nb : 0;  // scored: the caller wrote the scores (attend_lone)
    if (kt && !scored) {
      score_kt<MH>(qh, kt, s);
      j = nb;
    }
    // (A group of one head in a several-head row goes through the tiles too, so its scores are
    // summed in the same order as in any other group.)
    for (; j + MK <= nb; j += MK) score_tile<MH, MK>(qh, k, s, j, pf, pf_rows);
    if constexpr (MK > 4)
      for (; j + 4 <= nb; j += 4) score_tile<MH, 4>(qh, k, s, j, pf, pf_rows);
    for (; j + 2 <= nb; j += 2) score_tile<MH, 2>(qh, k, s, j, pf, pf_rows);
    for (; j < nb; ++j) score_tile<MH, 1>(qh, k, s, j, pf, pf_rows);
    // The softmax step per head, vectorised over the chunk's keys: max, weights, their sum. The
    // rescale factors of all MH heads come from one vector exp (one libm call per head cost as
    // much as the rest of the step at head_dim 128).
    constexpr int MR = (MH + L - 1) / L * L;
    T m_new[MH], corr[MR];
    for (int a = 0; a < MH; ++a) {
      const T* sa = s + a * kChunkMax;
      T mx = sa[0];
      j = 0;
      if constexpr (L > 1) {
        if (nb >= L) {
          V mv = load<V>(sa);
          for (j = L; j + L <= nb; j += L) {
            const V x = load<V>(sa + j);
            mv = mv < x ? x : mv;
          }
          mx = hmax<L>(mv);
        }
      }
      for (; j < nb; ++j) mx = impl::max(mx, sa[j]);
      const T mb = mx * scale;  // scale > 0: the max of the scaled scores
      m_new[a] = first ? mb : impl::max(m[a], mb);
    }
    for (int a = 0; a < MR; ++a) corr[a] = first || a >= MH ? T(0) : T(m[a] - m_new[a]);
    if (!first)
      for (int a = 0; a < MR; a += L) store<V>(corr + a, vexp<L>(load<V>(corr + a)));
    for (int a = 0; a < MH; ++a) {
      T* sa = s + a * kChunkMax;
      V vs{};
      for (j = 0; j + L <= nb; j += L) {
        const V e = vexp<L>(load<V>(sa + j) * scale - m_new[a]);
        store<V>(sa + j, e);
        vs += e;
      }
      if (j < nb) store<V>(sa + j, vexp<L>(load<V>(sa + j) * scale - m_new[a]));
      T sum = hsum_tree<L>(vs);
      for (; j < nb; ++j) sum += sa[j];
      l[a] = first ? sum : T(l[a] * corr[a] + sum);
      m[a] = m_new[a];
    }
    int d = 0;
    for (; d + NV * L <= D; d += NV * L)
      for (int a = 0; a < MH; a += HB) value_tile<HB, NV>(oh + a, d, k, nb, s + a * kChunkMax, corr + a, first);
    for (; d + L <= D; d += L) value_tile<MH, 1>(oh, d, k, nb, s, corr, first);
    for (; d < D; ++d)
      for (int a = 0; a < MH; ++a) {
        T r = first ? T(0) : T(corr[a] * oh[a][d]);
        for (j = 0; j < nb; ++j) r = fmadd(s[a * kChunkMax + j], key_value<T>(k.row(j)[d]), r);
        oh[a][d] = r;
      }
  }

  // One chunk for head group g (heads g*kHeadGroup ..), its m, l and scores in the scratch.
  // Group 0 prefetches the next chunk (pf, pf_rows), unless it is a lone head (see chunk_step).
  KOKKOS_FORCEINLINE_FUNCTION void step(int g, const T* q, T* o, const ChunkRows<K>& k, int nb, bool first,
                                        T* scratch, const ChunkRows<K>* pf, int pf_rows, const T* kt) const {
    T* m = scratch + g * group_scratch;
    T* l = m + kHeadGroup;
    T* s = l + kHeadGroup;
    const int h0 = g * kHeadGroup;
    step_heads<kHeadGroup>(heads - h0 < kHeadGroup ? heads - h0 : kHeadGroup, q, o, h0, k, nb, first, m, l, s,
                           g == 0 ? pf : nullptr, pf_rows, kt);
  }

  // chunk_step for the n <= MH heads of a group (the last group may hold fewer).
  template <int MH>
  KOKKOS_FORCEINLINE_FUNCTION void step_heads(int n, const T* q, T* o, int h0, const ChunkRows<K>& k, int nb,
                                              bool first, T* m, T* l, T* s, const ChunkRows<K>* pf,
                                              int pf_rows, const T* kt) const {
    if constexpr (MH > 1)
      if (n < MH) return step_heads<MH - 1>(n, q, o, h0, k, nb, first, m, l, s, pf, pf_rows, kt);
    chunk_step<MH>(q, o, h0, k, nb, first, m, l, s, pf, pf_rows, false, kt);
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
    // The chunk from key p: up to `chunk` keys in at most two runs of consecutive rows.
    auto rows_from = [&](std::int64_t p, ChunkRows<K>& c) {
      int n0 = 0;
      c.p0 = keys.row(b, p, end, n0);
      c.ld = ld;
      if (n0 > chunk) n0 = chunk;
      c.n0 = n0;
      c.p1 = c.p0;
      if (n0 == chunk || p + n0 >= end) return n0;
      int n1 = 0;
      c.p1 = keys.row(b, p + n0, end, n1);
      return n0 + (n1 < chunk - n0 ? n1 : chunk - n0);
    };
    ChunkRows<K> cur{}, next{};
    int nb = begin < end ? rows_from(begin, cur) : 0;
    for (std::int64_t p = begin; p < end;) {
      const int next_nb = p + nb < end ? rows_from(p + nb, next) : 0;
      const bool first = p == begin;
      // A chunk of kChunkMax keys from a multiple of kChunkMax: its transposed copy, if the keys
      // have one (the chunks of a window that starts elsewhere go through the row tiles).
      const T* kt = nullptr;
      if constexpr (std::is_same_v<K, T>)
        if (chunk == kChunkMax && p % kChunkMax == 0) kt = keys.transposed(b, p);
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, groups), [&](const int g) {
        step(g, q, out, cur, nb, first, scratch.data(), next_nb > 0 ? &next : nullptr, next_nb, kt);
      });
      p += nb;
      cur = next;
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
        const K* k0[kMaxRanges];
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
          const K* rows[kMaxRanges];
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
          chunk_step<1>(q, out[r], 0, ChunkRows<K>{k0[i], k0[i], n, ld}, n, p[r] == begin[r], m, m + kHeadGroup,
                        m + 2 * kHeadGroup, nullptr, 0, true);
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
