// Attention with one shared KV head (DeepSeek-V4 style MQA, K = V): every query head attends the
// same kv rows. Causal prefill over a batch of variable-length requests (cu_seqlens row offsets)
// and decode against a KV cache, optional sliding window, online (running-max) softmax. The query
// may hold any number of heads: an attn_tp shard passes just its own heads.
#pragma once

#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdint>
#include <string>

#include "relayout/kernels/error.hpp"
#include "relayout/kernels/impl/simd.hpp"
#include "relayout/kernels/types.hpp"

namespace relayout::kernels {

struct AttentionParams {
  int head_dim = 0;
  double scale = 0.0;  // softmax scale; 1/sqrt(head_dim) is the usual choice
  int window = 0;      // sliding window in keys, the query's own included; 0: unlimited
};

inline double default_softmax_scale(int head_dim) { return 1.0 / std::sqrt(double(head_dim)); }

namespace impl {

inline constexpr int kKeyBlock = 32;
inline constexpr int kHeadGroup = 4;

// One query row (heads x head_dim) against kv rows [begin, end), by key blocks of kKeyBlock. Heads
// go in groups of kHeadGroup (one team thread per group), so each kv vector loaded feeds four
// heads: scores are a register-tiled (heads x 2 keys) dot-product tile, the running max / sum are
// updated per head, and p . V is a register-tiled (heads x 2 vectors) outer-product tile that also
// applies the rescale of the previous blocks. The output row itself is the accumulator.
template <class ExecSpace, class Q, class KV, class O>
struct AttendRow {
  using T = typename O::non_const_value_type;
  using Scratch = Kokkos::View<T*, typename ExecSpace::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  static constexpr int L = lanes_v<ExecSpace, T>;
  using V = typename Vec<T, L>::type;

  Q q;
  KV kv;
  O out;
  int heads, head_dim;
  T scale;

  // s[h][j] = q_h . kv_{j0+j} for MH heads from h0 and MK keys from j.
  template <int MH, int MK>
  KOKKOS_FORCEINLINE_FUNCTION void score_tile(std::int64_t row, int h0, std::int64_t key, T* s, int j) const {
    const int D = head_dim;
    const T* qh[MH];
    const T* kj[MK];
    for (int a = 0; a < MH; ++a) qh[a] = &q(row, std::size_t(h0 + a) * D);
    for (int b = 0; b < MK; ++b) kj[b] = &kv(key + b, 0);
    V acc[MH][MK];
    for (int a = 0; a < MH; ++a)
      for (int b = 0; b < MK; ++b) acc[a][b] = V{};
    int d = 0;
    for (; d + L <= D; d += L) {
      V kvv[MK];
      for (int b = 0; b < MK; ++b) kvv[b] = load<V>(kj[b] + d);
      for (int a = 0; a < MH; ++a) {
        const V qv = load<V>(qh[a] + d);
        for (int b = 0; b < MK; ++b) acc[a][b] += qv * kvv[b];
      }
    }
    for (int a = 0; a < MH; ++a)
      for (int b = 0; b < MK; ++b) {
        T r = hsum<L>(acc[a][b]);
        for (int dd = d; dd < D; ++dd) r += qh[a][dd] * kj[b][dd];
        s[a * kKeyBlock + j + b] = r;
      }
  }

  // o_h = corr_h * o_h + sum_j p[h][j] kv_{j0+j} for MH heads (first block: no previous o_h).
  template <int MH>
  KOKKOS_FORCEINLINE_FUNCTION void value_tile(std::int64_t row, int h0, std::int64_t j0, int nb,
                                              const T* p, const T* corr, bool first) const {
    const int D = head_dim;
    constexpr int NV = 2;
    T* oh[MH];
    for (int a = 0; a < MH; ++a) oh[a] = &out(row, std::size_t(h0 + a) * D);
    int d = 0;
    for (; d + NV * L <= D; d += NV * L) {
      V acc[MH][NV];
      for (int a = 0; a < MH; ++a)
        for (int v = 0; v < NV; ++v) acc[a][v] = first ? V{} : T(corr[a]) * load<V>(oh[a] + d + v * L);
      for (int j = 0; j < nb; ++j) {
        const T* vj = &kv(j0 + j, d);
        V vv[NV];
        for (int v = 0; v < NV; ++v) vv[v] = load<V>(vj + v * L);
        for (int a = 0; a < MH; ++a) {
          const T pa = p[a * kKeyBlock + j];
          for (int v = 0; v < NV; ++v) acc[a][v] += pa * vv[v];
        }
      }
      for (int a = 0; a < MH; ++a)
        for (int v = 0; v < NV; ++v) store<V>(oh[a] + d + v * L, acc[a][v]);
    }
    for (; d < D; ++d)
      for (int a = 0; a < MH; ++a) {
        T r = first ? T(0) : T(corr[a] * oh[a][d]);
        for (int j = 0; j < nb; ++j) r += p[a * kKeyBlock + j] * kv(j0 + j, d);
        oh[a][d] = r;
      }
  }

  template <int MH>
  KOKKOS_FORCEINLINE_FUNCTION void block(std::int64_t row, int h0, std::int64_t j0, int nb, bool first,
                                         T* m, T* l, T* s) const {
    int j = 0;
    for (; j + 2 <= nb; j += 2) score_tile<MH, 2>(row, h0, j0 + j, s, j);
    for (; j < nb; ++j) score_tile<MH, 1>(row, h0, j0 + j, s, j);
    T corr[MH];
    for (int a = 0; a < MH; ++a) {
      T* sa = s + a * kKeyBlock;
      T mb = sa[0] * scale;
      for (j = 0; j < nb; ++j) {
        sa[j] *= scale;
        mb = impl::max(mb, sa[j]);
      }
      const T m_new = first ? mb : impl::max(m[a], mb);
      corr[a] = first ? T(0) : impl::exp(T(m[a] - m_new));
      T sum = T(0);
      for (j = 0; j < nb; ++j) sum += (sa[j] = impl::exp(T(sa[j] - m_new)));
      l[a] = first ? sum : T(l[a] * corr[a] + sum);
      m[a] = m_new;
    }
    value_tile<MH>(row, h0, j0, nb, s, corr, first);
  }

  template <class Member>
  KOKKOS_INLINE_FUNCTION void run(const Member& team, std::int64_t row, std::int64_t begin,
                                  std::int64_t end) const {
    Scratch m(team.team_scratch(0), heads), l(team.team_scratch(0), heads),
        s(team.team_scratch(0), std::size_t(heads) * kKeyBlock);
    const int groups = (heads + kHeadGroup - 1) / kHeadGroup;
    for (std::int64_t j0 = begin; j0 < end; j0 += kKeyBlock) {
      const int nb = end - j0 < kKeyBlock ? int(end - j0) : kKeyBlock;
      const bool first = j0 == begin;
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, groups), [&](const int g) {
        const int h0 = g * kHeadGroup;
        T* mg = &m(h0);
        T* lg = &l(h0);
        T* sg = &s(std::size_t(h0) * kKeyBlock);
        switch (heads - h0 < kHeadGroup ? heads - h0 : kHeadGroup) {
          case 1: block<1>(row, h0, j0, nb, first, mg, lg, sg); break;
          case 2: block<2>(row, h0, j0, nb, first, mg, lg, sg); break;
          case 3: block<3>(row, h0, j0, nb, first, mg, lg, sg); break;
          default: block<kHeadGroup>(row, h0, j0, nb, first, mg, lg, sg); break;
        }
      });
    }
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, heads), [&](const int h) {
      T* oh = &out(row, std::size_t(h) * head_dim);
      const T inv = T(1) / l(h);
      for (int d = 0; d < head_dim; ++d) oh[d] *= inv;
    });
  }

  static std::size_t scratch_bytes(int heads) {
    return Scratch::shmem_size(heads) * 2 + Scratch::shmem_size(std::size_t(heads) * kKeyBlock);
  }
};

template <class ExecSpace, class Q, class KV, class O, class Cu>
struct PrefillFunctor {
  AttendRow<ExecSpace, Q, KV, O> attend;
  Cu cu;
  int n_req, window;
  template <class Member>
  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const std::int64_t t = team.league_rank();
    int lo = 0, hi = n_req;  // the request b with cu[b] <= t < cu[b+1]
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (cu(mid) <= t) lo = mid; else hi = mid;
    }
    const std::int64_t start = cu(lo);
    std::int64_t begin = start;
    if (window > 0 && t + 1 - window > begin) begin = t + 1 - window;
    attend.run(team, t, begin, t + 1);
  }
};

template <class ExecSpace, class Q, class KV, class O, class Cu>
struct DecodeFunctor {
  AttendRow<ExecSpace, Q, KV, O> attend;
  Cu cu;
  int window;
  template <class Member>
  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const std::int64_t b = team.league_rank();
    const std::int64_t end = cu(b + 1);
    std::int64_t begin = cu(b);
    if (window > 0 && end - window > begin) begin = end - window;
    attend.run(team, b, begin, end);
  }
};

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

// Copies cu_seqlens to the host (a synchronisation point) and checks it.
template <class Cu>
void check_offsets(const char* fn, const char* name, const Cu& cu, std::int64_t rows, bool exact,
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
  require(exact ? last == rows : last <= rows, fn, name,
          std::string("last entry must ") + (exact ? "equal" : "not exceed") + " the kv rows " +
              str(rows) + ", got " + str(last));
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
  using Attend = impl::AttendRow<ExecSpace, Q, KV, O>;
  const int n_req = int(cu_seqlens.extent(0)) - 1;
  Kokkos::TeamPolicy<ExecSpace> policy(exec, int(q.extent(0)), Kokkos::AUTO);
  const std::size_t bytes = Attend::scratch_bytes(heads);
  Kokkos::parallel_for("relayout::kernels::attention_prefill",
                       policy.set_scratch_size(0, Kokkos::PerTeam(bytes)),
                       impl::PrefillFunctor<ExecSpace, Q, KV, O, Cu>{
                           Attend{q, kv, out, heads, params.head_dim, T(params.scale)}, cu_seqlens,
                           n_req, params.window});
}

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
  impl::check_offsets("attention_decode", "cu_cache", cu_cache, std::int64_t(kv_cache.extent(0)), false, true);
  if (q.extent(0) == 0) return;
  using T = scalar_of<O>;
  using Attend = impl::AttendRow<ExecSpace, Q, KV, O>;
  Kokkos::TeamPolicy<ExecSpace> policy(exec, int(q.extent(0)), Kokkos::AUTO);
  const std::size_t bytes = Attend::scratch_bytes(heads);
  Kokkos::parallel_for("relayout::kernels::attention_decode",
                       policy.set_scratch_size(0, Kokkos::PerTeam(bytes)),
                       impl::DecodeFunctor<ExecSpace, Q, KV, O, Cu>{
                           Attend{q, kv_cache, out, heads, params.head_dim, T(params.scale)}, cu_cache,
                           params.window});
}

}  // namespace relayout::kernels
