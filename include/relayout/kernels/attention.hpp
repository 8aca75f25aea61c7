// Attention with one shared KV head (DeepSeek-V4 style MQA, K = V): every query head attends the
// same kv rows. Causal prefill over a batch of variable-length requests (cu_seqlens row offsets)
// and decode against a KV cache, optional sliding window, online (running-max) softmax. The query
// may hold any number of heads: an attn_tp shard passes just its own heads.
//
// Rows of float or double are computed in their own type. bf16 rows (q, kv and out all
// relayout::bf16; for attention_merge the partials and out) are computed in fp32 and every output
// element is rounded once, to nearest even. The call widens q (exactly) into an fp32 scratch view,
// and for prefill kv as well (decode reads a bf16 cache in place, widening each key vector as it
// loads it), runs the fp32 kernel into an fp32 scratch output, and rounds that into out. A bf16
// output is therefore bitwise bf16(x), x the output of the fp32 kernel over the widened inputs.
// The scratch (4 bytes per element of the widened rows and of out) is allocated in the execution
// space's memory space for the duration of the call; widening, kernel and rounding all run on the
// caller's exec instance. The argument checks see the caller's views, before any scratch exists.
#pragma once

#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "relayout/comm/scalar.hpp"
#include "relayout/kernels/convert.hpp"
#include "relayout/kernels/error.hpp"
#include "relayout/kernels/impl/attention_launch.hpp"
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

// fp32 rows on ExecSpace's memory space: the scratch of bf16 rows.
template <class ExecSpace>
using Fp32Rows = Kokkos::View<float**, Kokkos::LayoutRight, typename ExecSpace::memory_space>;

template <class V>
inline constexpr bool bf16_rows_v = std::is_same_v<scalar_of<V>, relayout::bf16>;

// rows x cols of uninitialised fp32 scratch, allocated on exec.
template <class ExecSpace>
Fp32Rows<ExecSpace> fp32_scratch(const ExecSpace& exec, std::size_t rows, std::size_t cols) {
  return Fp32Rows<ExecSpace>(Kokkos::view_alloc(exec, "relayout::attention_fp32_rows", Kokkos::WithoutInitializing),
                             rows, cols);
}

// An fp32 copy of bf16 rows (exact), on exec.
template <class ExecSpace, class V>
Fp32Rows<ExecSpace> widen_rows(const ExecSpace& exec, const V& v) {
  const Fp32Rows<ExecSpace> w = fp32_scratch(exec, v.extent(0), v.extent(1));
  convert_rows(exec, v, w);
  return w;
}

// Rows the fp32 core reads: bf16 rows widened into scratch, any other rows as they are.
template <class ExecSpace, class V>
auto compute_rows(const ExecSpace& exec, const V& v) {
  if constexpr (bf16_rows_v<V>) return widen_rows(exec, v);
  else return v;
}

// f(q, out) on rows the core computes in: the caller's own views, or for bf16 rows q widened into
// fp32 scratch and an fp32 scratch out that is then rounded into the caller's out (once per
// element). The arguments must have been checked: the scratch takes the views' shapes.
template <class ExecSpace, class Q, class O, class F>
void with_compute_rows(const ExecSpace& exec, const Q& q, const O& out, F&& f) {
  static_assert(!std::is_same_v<scalar_of<O>, relayout::fp16> && !std::is_same_v<scalar_of<Q>, relayout::fp16>,
                "relayout::kernels: attention takes rows of float, double or bf16; fp16 rows are not supported");
  if constexpr (bf16_rows_v<O>) {
    const auto q32 = compute_rows(exec, q);
    const Fp32Rows<ExecSpace> out32 = fp32_scratch(exec, out.extent(0), out.extent(1));
    f(q32, out32);
    convert_rows(exec, out32, out);  // rounded once, to nearest even
  } else {
    f(q, out);
  }
}

// The launch of a prefill (checked arguments, q rows >= 1) on rows of the core's scalar: query
// row i's own kv row is pos(i).
template <class ExecSpace, class Q, class KV, class Cu, class O, class Pos>
void prefill_launch(const ExecSpace& exec, const Q& q, const KV& kv, const Cu& cu_seqlens, const O& out,
                    const AttentionParams& params, int heads, const Pos& pos) {
  using T = scalar_of<O>;
  using Core = AttendCore<ExecSpace, T>;
  const int n_req = int(cu_seqlens.extent(0)) - 1;
  ContiguousKeys<KV, Cu> keys{kv, cu_seqlens};
  const TransposedKeys<ExecSpace, KV, Cu> kt(exec, kv, cu_seqlens, params.head_dim, heads);
  kt.attach(keys);
  Kokkos::TeamPolicy<ExecSpace> policy(exec, int(q.extent(0)), Kokkos::AUTO);
  Kokkos::parallel_for("relayout::kernels::attention_prefill",
                       policy.set_scratch_size(0, Kokkos::PerTeam(Core::scratch_bytes(heads))),
                       PrefillFunctor<ExecSpace, Q, KV, O, Cu, Pos>{
                           Core{heads, params.head_dim, chunk_keys<T>(params.head_dim, heads), T(params.scale)}, q,
                           out, keys, n_req, params.window, pos});
}

}  // namespace impl

// Decode reads the whole cache for a few query rows, so its cost is the bytes it reads: a bf16
// cache halves them. The arithmetic is fp32 either way: the core reads the bf16 cache in place and
// widens each key vector to fp32 as it loads it. q and out are float (the one mix of scalar types
// decode takes), or bf16 with the cache (q widened into an fp32 scratch copy, the fp32 output
// rounded into out: bitwise bf16 of what float q and out give over the same cache; the cache
// itself is never copied). Any other combination has q, the cache and out of one type.
template <class Q, class Kv, class O>
inline constexpr bool decode_scalars_v = (std::is_same_v<Q, O> && std::is_same_v<Kv, O>) ||
                                         (std::is_same_v<Kv, relayout::bf16> && std::is_same_v<Q, float> &&
                                          std::is_same_v<O, float>);

// Causal prefill. Request b owns rows [cu_seqlens[b], cu_seqlens[b+1]) of q (tokens x heads*head_dim)
// and kv (tokens x head_dim); the token at position p of its request attends that request's keys
// max(0, p - window + 1) .. p. out: tokens x heads*head_dim. q, kv and out share one scalar type:
// float, double, or bf16 (fp32 arithmetic over widened copies of q and kv, see the top of this file).
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
  impl::with_compute_rows(exec, q, out, [&](const auto& q_c, const auto& out_c) {
    impl::prefill_launch(exec, q_c, impl::compute_rows(exec, kv), cu_seqlens, out_c, params, heads, impl::SameRow{});
  });
}

// Causal prefill of query rows that are a subset of the kv rows (attention context parallelism:
// a CP rank holds some of each request's tokens and all of their keys). Query row i is the token
// whose own key is kv row positions[i]; it attends the keys of that token's request from
// max(start, positions[i] - window + 1) to positions[i], so causality and the window go by global
// position. kv and cu_seqlens cover the whole requests; q, out: positions.extent(0) rows. Scalar
// types as for the plain prefill (bf16 kv is widened whole, every request's rows).
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
  impl::with_compute_rows(exec, q, out, [&](const auto& q_c, const auto& out_c) {
    impl::prefill_launch(exec, q_c, impl::compute_rows(exec, kv), cu_seqlens, out_c, params, heads,
                         impl::RowAt<Pos>{positions});
  });
}


// Decode: one new query row per request (q: n_requests x heads*head_dim). Request b's cache is
// rows [cu_cache[b], cu_cache[b+1]) of kv_cache (rows x head_dim), its new token's kv already
// appended (so every request holds >= 1 row); it attends the last min(window, L) of them.
template <class ExecSpace, RowMatrixView Q, RowMatrixView KV, VectorView Cu, MutableRowMatrixView O>
void attention_decode(const ExecSpace& exec, const Q& q, const KV& kv_cache, const Cu& cu_cache,
                      const O& out, const AttentionParams& params) {
  static_assert(decode_scalars_v<scalar_of<Q>, scalar_of<KV>, scalar_of<O>>,
                "relayout::kernels::attention_decode: q, kv_cache and out must have the same scalar type, "
                "or kv_cache bf16 with q and out float");
  static_assert(std::is_same_v<scalar_of<Cu>, int>, "relayout::kernels: cu_cache must hold int");
  const int heads = impl::check_attention("attention_decode", q, kv_cache, out, params);
  impl::require(cu_cache.extent(0) == q.extent(0) + 1, "attention_decode", "cu_cache",
                "must hold n_requests + 1 = " + impl::str(q.extent(0) + 1) + " offsets, got " +
                    impl::str(cu_cache.extent(0)));
  const std::int64_t longest =
      impl::check_offsets("attention_decode", "cu_cache", cu_cache, std::int64_t(kv_cache.extent(0)), false, true);
  if (q.extent(0) == 0) return;
  const impl::ContiguousKeys<KV, Cu> keys{kv_cache, cu_cache};
  impl::with_compute_rows(exec, q, out, [&](const auto& q_c, const auto& out_c) {
    impl::decode_launch(exec, q_c, keys, out_c, params, heads, longest, impl::WindowStart{params.window},
                        impl::NoLse<std::decay_t<decltype(out_c)>>());
  });
}

// Decode through a paged cache (PagedKvCache::view): query row b attends the last min(window, L)
// rows of request slot kv.slots(b), read in place through its block table.
template <class ExecSpace, RowMatrixView Q, class T, class MemSpace, MutableRowMatrixView O>
void attention_decode(const ExecSpace& exec, const Q& q, const PagedKv<T, MemSpace>& kv, const O& out,
                      const AttentionParams& params) {
  static_assert(decode_scalars_v<scalar_of<Q>, T, scalar_of<O>>,
                "relayout::kernels::attention_decode: q, the cache and out must have the same scalar type, "
                "or the cache bf16 with q and out float");
  const int heads = impl::check_attention("attention_decode", q, kv.pool, out, params);
  const auto [slots, lengths] = impl::check_slots(q, kv, true);
  std::int64_t longest = 0;
  for (std::size_t b = 0; b < slots.extent(0); ++b) longest = lengths(slots(b)) > longest ? lengths(slots(b)) : longest;
  if (q.extent(0) == 0) return;
  const impl::PagedKeys<T, MemSpace> keys{kv};
  impl::with_compute_rows(exec, q, out, [&](const auto& q_c, const auto& out_c) {
    impl::decode_launch(exec, q_c, keys, out_c, params, heads, longest, impl::WindowStart{params.window},
                        impl::NoLse<std::decay_t<decltype(out_c)>>());
  });
}

// Partial decode over one shard of each request's keys (attention context parallelism: a CP rank
// holds some positions of every request, in order). Query row b attends rows [first(b), L) of
// request slot kv.slots(b), L its length in this cache, and gets its normalised output row in out
// and, per head, the log-sum-exp of its scaled scores in lse (rows x heads). first(b) is where
// the sliding window starts among this shard's rows (0: all of them), so params.window must be 0.
// A row with no key here (first(b) >= L) gets out = 0, lse = -inf. attention_merge combines the
// shards' partials into what attention_decode over all the keys gives. lse is compute_t of out's
// type: with bf16 q and out (and a bf16 cache) it stays float, written straight from the fp32
// kernel, since a bf16 lse would cost the merge its precision; only out is rounded.
template <class ExecSpace, RowMatrixView Q, class T, class MemSpace, VectorView First, MutableRowMatrixView O,
          MutableRowMatrixView L>
void attention_decode_partial(const ExecSpace& exec, const Q& q, const PagedKv<T, MemSpace>& kv, const First& first,
                              const O& out, const L& lse, const AttentionParams& params) {
  static_assert(decode_scalars_v<scalar_of<Q>, T, scalar_of<O>> &&
                    std::is_same_v<scalar_of<L>, relayout::compute_t<scalar_of<O>>>,
                "relayout::kernels::attention_decode_partial: q, the cache and out must have the same scalar type, "
                "or the cache bf16 with q and out float; lse must be compute_t of out's type (float for bf16 out)");
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
  const impl::PagedKeys<T, MemSpace> keys{kv};
  impl::with_compute_rows(exec, q, out, [&](const auto& q_c, const auto& out_c) {
    impl::decode_launch(exec, q_c, keys, out_c, params, heads, longest, impl::FirstKey<First>{first}, lse);
  });
}

// Merges the partials of n query rows from P shards (attention_decode_partial on each):
// partials ((P * n) x heads*head_dim) and lse ((P * n) x heads), shard p's row b at p * n + b (the
// order an all-gather or all-to-all over P ranks leaves). out(b) = sum_p e^(lse_p - M) partial_p /
// sum_p e^(lse_p - M), M the largest lse of the row and head; shards with lse = -inf add nothing,
// and a row no shard has a key for gets 0. partials and out share one scalar type, lse is
// compute_t of it: bf16 partials and out take a float lse, the partials widened into fp32 scratch,
// merged in fp32 and each out element rounded once.
template <class ExecSpace, RowMatrixView P, RowMatrixView L, MutableRowMatrixView O>
void attention_merge(const ExecSpace& exec, const P& partials, const L& lse, const O& out) {
  static_assert(std::is_same_v<scalar_of<P>, scalar_of<O>> &&
                    std::is_same_v<scalar_of<L>, relayout::compute_t<scalar_of<O>>>,
                "relayout::kernels::attention_merge: partials and out must have the same scalar type, lse "
                "compute_t of it (float for bf16 partials and out)");
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
  impl::with_compute_rows(exec, partials, out, [&](const auto& p_c, const auto& out_c) {
    using Pc = std::decay_t<decltype(p_c)>;
    using Oc = std::decay_t<decltype(out_c)>;
    Kokkos::parallel_for("relayout::kernels::attention_merge", Kokkos::RangePolicy<ExecSpace>(exec, 0, n * heads),
                         impl::DecodeMerge<Oc, impl::LseParts<Pc, L>, impl::NoLse<Oc>>{
                             out_c, {p_c, lse, n, head_dim, parts}, impl::NoLse<Oc>(), heads, head_dim, parts});
  });
}

}  // namespace relayout::kernels