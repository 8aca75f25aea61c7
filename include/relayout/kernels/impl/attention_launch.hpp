// Internal: the work items of shared-KV attention (relayout/kernels/attention.hpp): prefill and
// decode functors over AttendCore, the log-sum-exp merge of key splits and CP shards, how many
// splits a decode takes, the launch of a decode, and the argument checks. Params is
// kernels::AttentionParams. Not public API.
#pragma once

#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "relayout/kernels/error.hpp"
#include "relayout/kernels/impl/attention_core.hpp"
#include "relayout/kernels/kv_cache.hpp"
#include "relayout/kernels/types.hpp"

namespace relayout::kernels::impl {

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

// The keys of a prefill again, transposed by chunks for the score pass (AttendCore::score_kt):
// request b's keys p .. p + kChunkMax (p a multiple of kChunkMax) as head_dim rows of kChunkMax
// values, zero past the request's end, chunk base(b) + p / kChunkMax. Built only where the core
// computes in vectors and a query row has several heads: one pass over the keys, after which every
// chunk's scores for a group of heads are whole vectors with no horizontal sums (the row tiles
// sum each MH x MK block of products with one transpose, about as many instructions again as
// their FMAs at head_dim 64).
template <class ExecSpace, class KV, class Cu>
struct TransposedKeys {
  using T = typename KV::non_const_value_type;
  using Mem = typename ExecSpace::memory_space;
  Kokkos::View<T*, Mem> kt;
  Kokkos::View<std::int64_t*, Mem> base;
  int head_dim = 0;

  static bool wanted(int heads) { return lanes_v<ExecSpace, T> > 1 && heads > 1; }

  TransposedKeys(const ExecSpace& exec, const KV& kv, const Cu& cu, int head_dim_, int heads) : head_dim(head_dim_) {
    if (!wanted(heads) || kv.extent(0) == 0) return;
    const auto ch = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), cu);
    const std::int64_t n_req = std::int64_t(ch.extent(0)) - 1;
    std::vector<std::int64_t> first(static_cast<std::size_t>(n_req));
    std::int64_t chunks = 0;
    for (std::int64_t b = 0; b < n_req; ++b) {
      first[static_cast<std::size_t>(b)] = chunks;
      chunks += (ch(b + 1) - ch(b) + kChunkMax - 1) / kChunkMax;
    }
    // Many short requests would pad most chunks (a 1-key request takes a whole chunk), each scored
    // by few query rows: no copy where it would take more than twice the keys' memory.
    if (chunks * kChunkMax > 2 * std::int64_t(kv.extent(0))) return;
    base = Kokkos::View<std::int64_t*, Mem>(Kokkos::view_alloc(exec, "relayout::attention_kt_base",
                                                               Kokkos::WithoutInitializing), n_req);
    auto bh = Kokkos::create_mirror_view(base);
    for (std::int64_t b = 0; b < n_req; ++b) bh(b) = first[static_cast<std::size_t>(b)];
    Kokkos::deep_copy(exec, base, bh);
    kt = Kokkos::View<T*, Mem>(Kokkos::view_alloc(exec, "relayout::attention_kt"),
                               chunks * std::int64_t(head_dim) * kChunkMax);
    const auto out = kt;
    const auto bs = base;
    const int D = head_dim;
    const int n = int(n_req);
    Kokkos::parallel_for(
        "relayout::kernels::attention_transpose_keys", Kokkos::RangePolicy<ExecSpace>(exec, 0, std::int64_t(kv.extent(0))),
        KOKKOS_LAMBDA(const std::int64_t i) {
          int lo = 0, hi = n;  // the request b with cu[b] <= i < cu[b+1]
          while (hi - lo > 1) {
            const int mid = (lo + hi) / 2;
            if (cu(mid) <= i) lo = mid; else hi = mid;
          }
          const std::int64_t p = i - cu(lo);
          T* dst = out.data() + (bs(lo) + p / kChunkMax) * std::int64_t(D) * kChunkMax + p % kChunkMax;
          for (int d = 0; d < D; ++d) dst[std::int64_t(d) * kChunkMax] = kv(i, d);
        });
  }

  // Points the keys at the transposed copy (none: left without one).
  void attach(ContiguousKeys<KV, Cu>& keys) const {
    if (kt.extent(0) == 0) return;
    keys.kt = kt.data();
    keys.kt_base = base.data();
    keys.kt_dim = head_dim;
  }
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
// partial row and its (m, l) for DecodeMerge. The keys are read as the cache stores them (a bf16
// cache's widened in registers by the core).
template <class ExecSpace, class Q, class O, class Keys, class Start>
struct DecodeFunctor {
  using T = typename O::non_const_value_type;
  AttendCore<ExecSpace, T, typename Keys::key_type> core;
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

template <class Q, class KV, class O, class Params>
int check_attention(const char* fn, const Q& q, const KV& kv, const O& out, const Params& p) {
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


// Decode of every query row over keys from start(b, len) (longest: the most keys a row attends),
// normalised into out; with lse rows (heads per query row), also each row's log-sum-exp per head,
// which makes every launch go through the partial rows and the merge.
template <class ExecSpace, class Q, class O, class Keys, class Start, class L, class Params>
void decode_launch(const ExecSpace& exec, const Q& q, const Keys& keys, const O& out, const Params& params,
                   int heads, std::int64_t longest, const Start& start, const L& lse) {
  using T = scalar_of<O>;
  using Mem = typename ExecSpace::memory_space;
  using Core = AttendCore<ExecSpace, T, typename Keys::key_type>;
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
  const std::size_t scratch = Core::scratch_bytes(heads, ranges);
  Kokkos::parallel_for("relayout::kernels::attention_decode",
                       policy.set_scratch_size(0, Kokkos::PerTeam(scratch)),
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

}  // namespace relayout::kernels::impl
