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

// One query row (heads x head_dim) against kv rows [begin, end): key blocks of kKeyBlock; per block
// each head (one team thread each) scores the block, updates its running max and sum, rescales its
// output accumulator (the output row itself) and adds p . V. The kv block stays in cache across heads.
template <class ExecSpace, class Q, class KV, class O>
struct AttendRow {
  using T = typename O::non_const_value_type;
  using Scratch = Kokkos::View<T*, typename ExecSpace::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  static constexpr int L = lanes_v<ExecSpace, T>;

  Q q;
  KV kv;
  O out;
  int heads, head_dim;
  T scale;

  template <class Member>
  KOKKOS_INLINE_FUNCTION void run(const Member& team, std::int64_t row, std::int64_t begin,
                                  std::int64_t end) const {
    Scratch m(team.team_scratch(0), heads), l(team.team_scratch(0), heads),
        s(team.team_scratch(0), std::size_t(heads) * kKeyBlock);
    const int D = head_dim;
    for (std::int64_t j0 = begin; j0 < end; j0 += kKeyBlock) {
      const int nb = end - j0 < kKeyBlock ? int(end - j0) : kKeyBlock;
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, heads), [&](const int h) {
        const T* qh = &q(row, std::size_t(h) * D);
        T* oh = &out(row, std::size_t(h) * D);
        T* sh = &s(std::size_t(h) * kKeyBlock);
        int j = 0;
        for (; j + 4 <= nb; j += 4)
          dot4<L>(qh, &kv(j0 + j, 0), &kv(j0 + j + 1, 0), &kv(j0 + j + 2, 0), &kv(j0 + j + 3, 0), D, sh + j);
        for (; j < nb; ++j) sh[j] = dot<L>(qh, &kv(j0 + j, 0), D);
        T mb = sh[0] * scale;
        for (j = 0; j < nb; ++j) {
          sh[j] *= scale;
          mb = impl::max(mb, sh[j]);
        }
        const bool first = j0 == begin;
        const T m_new = first ? mb : impl::max(m(h), mb);
        const T corr = first ? T(0) : impl::exp(T(m(h) - m_new));
        T sum = T(0);
        for (j = 0; j < nb; ++j) sum += (sh[j] = impl::exp(T(sh[j] - m_new)));
        l(h) = first ? sum : T(l(h) * corr + sum);
        m(h) = m_new;
        if (first) {
          for (int d = 0; d < D; ++d) oh[d] = T(0);
        } else if (corr != T(1)) {
          for (int d = 0; d < D; ++d) oh[d] *= corr;
        }
        // oh += sum_j p_j v_j, four keys per pass over oh.
        j = 0;
        for (; j + 4 <= nb; j += 4) {
          const T p0 = sh[j], p1 = sh[j + 1], p2 = sh[j + 2], p3 = sh[j + 3];
          const T *v0 = &kv(j0 + j, 0), *v1 = &kv(j0 + j + 1, 0), *v2 = &kv(j0 + j + 2, 0),
                  *v3 = &kv(j0 + j + 3, 0);
          for (int d = 0; d < D; ++d) oh[d] += p0 * v0[d] + p1 * v1[d] + p2 * v2[d] + p3 * v3[d];
        }
        for (; j < nb; ++j) {
          const T p = sh[j];
          const T* v = &kv(j0 + j, 0);
          for (int d = 0; d < D; ++d) oh[d] += p * v[d];
        }
      });
    }
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, heads), [&](const int h) {
      T* oh = &out(row, std::size_t(h) * D);
      const T inv = T(1) / l(h);
      for (int d = 0; d < D; ++d) oh[d] *= inv;
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
