// The paged KV cache: rows read back in order across block boundaries, truncate-then-append equals
// never having appended (rollback), blocks returned to the pool, capacity and memory-limit errors
// naming the request and the capacity; decode attention through the block table (and split over
// key ranges merged by log-sum-exp) against the reference on long caches. Request ids to slots:
// test/attention/test_request_table.cpp.
#include <algorithm>

#include "support.hpp"

namespace {

using namespace kt;

template <class C>
using Cache = rk::PagedKvCache<typename C::scalar, typename C::mem>;

// Rows n x head_dim of deterministic values, as a view and as host doubles (rounded to T).
template <class C>
Tensor<C> rows_of(int n, int head_dim, std::uint32_t seed) {
  return random_tensor<C>(n, head_dim, seed);
}

template <class C>
void append(Cache<C>& cache, int layer, int slot, const Tensor<C>& rows) {
  cache.append(typename C::exec(), layer, slot, rows.view);
}

// The request's rows as read back, in doubles.
template <class C>
rr::Matrix read(const Cache<C>& cache, int layer, int slot) {
  return rr::to_matrix(cache.read(layer, slot));
}

rr::Matrix concat(const std::vector<rr::Matrix>& parts) {
  int rows = 0;
  for (const auto& p : parts) rows += p.rows;
  rr::Matrix m(rows, parts.empty() ? 0 : parts[0].cols);
  int r = 0;
  for (const auto& p : parts)
    for (int i = 0; i < p.rows; ++i, ++r)
      for (int j = 0; j < p.cols; ++j) m(r, j) = p(i, j);
  return m;
}

void check_equal(const rr::Matrix& got, const rr::Matrix& want) {
  REQUIRE(got.rows == want.rows);
  REQUIRE(got.cols == want.cols);
  int diffs = 0;
  for (std::size_t i = 0; i < got.data.size(); ++i) diffs += got.data[i] != want.data[i];
  CHECK(diffs == 0);
}

TEST_CASE_TEMPLATE_DEFINE("PagedKvCache reads appended rows back in order across block boundaries", C, kv_rows) {
  const int dim = 5, bs = 4;
  Cache<C> cache({2, dim, bs, 16, 3, 5});
  std::uint32_t seed = 40;
  std::vector<rr::Matrix> want[3];
  // Interleaved appends: the requests' blocks alternate in the pool; lengths hit 1, bs - 1, bs,
  // bs + 1 and a whole block at once.
  for (int n : {1, 2, 1, 1, 4, 3}) {
    for (int slot = 0; slot < 3; ++slot) {
      const int k = slot == 1 ? n + 1 : n;
      auto rows = rows_of<C>(k, dim, seed++);
      append<C>(cache, 0, slot, rows);
      want[slot].push_back(rows.matrix);
    }
  }
  for (int slot = 0; slot < 3; ++slot) {
    const rr::Matrix w = concat(want[slot]);
    CAPTURE(slot);
    CHECK(cache.length(0, slot) == w.rows);
    CHECK(cache.length(1, slot) == 0);
    CHECK(cache.blocks(slot) == (w.rows + bs - 1) / bs);
    check_equal(read<C>(cache, 0, slot), w);
  }
  CHECK(cache.free_blocks() == 16 - cache.blocks(0) - cache.blocks(1) - cache.blocks(2));
}
TEST_CASE_TEMPLATE_APPLY(kv_rows, Cases);

TEST_CASE_TEMPLATE_DEFINE("PagedKvCache: truncate then append equals never having appended", C, kv_rollback) {
  const int dim = 3, bs = 4;
  for (int kept : {0, 3, 4, 5, 8}) {  // inside a block, at a boundary, one past it, everything dropped
    CAPTURE(kept);
    Cache<C> a({2, dim, bs, 12, 2, 6}), b({2, dim, bs, 12, 2, 6});
    auto prefix = rows_of<C>(kept, dim, 7), spec = rows_of<C>(11 - kept, dim, 8), more = rows_of<C>(6, dim, 9);
    auto other = rows_of<C>(5, dim, 10);
    for (int layer = 0; layer < 2; ++layer) {
      append<C>(a, layer, 0, prefix);
      append<C>(a, layer, 0, spec);  // speculative rows, rejected below
      append<C>(b, layer, 0, prefix);
    }
    append<C>(a, 0, 1, other);
    append<C>(b, 0, 1, other);
    a.truncate(typename C::exec(), 0, kept);
    CHECK(a.length(0, 0) == kept);
    CHECK(a.length(1, 0) == kept);
    CHECK(a.blocks(0) == (kept + bs - 1) / bs);  // whole blocks go back to the pool
    CHECK(a.free_blocks() == b.free_blocks());
    for (int layer = 0; layer < 2; ++layer) {
      append<C>(a, layer, 0, more);
      append<C>(b, layer, 0, more);
      check_equal(read<C>(a, layer, 0), read<C>(b, layer, 0));
      check_equal(read<C>(a, layer, 0), concat({prefix.matrix, more.matrix}));
    }
    check_equal(read<C>(a, 0, 1), other.matrix);  // the other request is untouched
    // A layer shorter than the truncation point keeps its rows.
    a.truncate(typename C::exec(), 0, kept + 6);
    CHECK(a.length(0, 0) == kept + 6);
    a.release(typename C::exec(), 0);
    CHECK(a.length(0, 0) == 0);
    CHECK(a.blocks(0) == 0);
    CHECK(a.free_blocks() == 12 - a.blocks(1));
  }
}
TEST_CASE_TEMPLATE_APPLY(kv_rollback, Cases);

TEST_CASE_TEMPLATE_DEFINE("PagedKvCache: capacity and memory errors name the request and the capacity", C, kv_errors) {
  using T = typename C::scalar;
  const int dim = 2;
  Cache<C> cache({1, dim, 4, 5, 3, 2});  // 8 rows per request, 20 rows in the pool
  append<C>(cache, 0, 2, rows_of<C>(6, dim, 1));
  CHECK_THROWS_WITH_AS(append<C>(cache, 0, 2, rows_of<C>(3, dim, 2)),
                       doctest::Contains("request 2: 9 rows exceed the capacity of 8 rows per request (2 blocks of 4)"),
                       relayout::LayoutError);
  CHECK(cache.length(0, 2) == 6);  // nothing changed
  append<C>(cache, 0, 0, rows_of<C>(8, dim, 3));
  CHECK(cache.free_blocks() == 1);
  CHECK_THROWS_WITH_AS(append<C>(cache, 0, 1, rows_of<C>(5, dim, 4)),
                       doctest::Contains("request 1: 5 rows need 2 more blocks, the pool of 5 blocks has 1 free"),
                       relayout::LayoutError);
  CHECK(cache.length(0, 1) == 0);
  CHECK(cache.free_blocks() == 1);
  append<C>(cache, 0, 1, rows_of<C>(4, dim, 5));  // one block still fits
  CHECK(cache.free_blocks() == 0);
  CHECK_THROWS_WITH_AS(append<C>(cache, 0, 3, rows_of<C>(1, dim, 6)), doctest::Contains("request: must be a slot in [0, 3), got 3"),
                       relayout::LayoutError);
  CHECK_THROWS_WITH_AS(append<C>(cache, 1, 0, rows_of<C>(1, dim, 6)), doctest::Contains("layer: must be in [0, 1), got 1"),
                       relayout::LayoutError);
  CHECK_THROWS_WITH_AS(append<C>(cache, 0, 0, rows_of<C>(1, dim + 1, 6)), doctest::Contains("must have head_dim 2 columns"),
                       relayout::LayoutError);
  CHECK_THROWS_AS(cache.truncate(typename C::exec(), 0, -1), relayout::LayoutError);

  const rk::KvCacheShape big{4, 128, 16, 1000, 8, 64};
  CHECK(big.bytes(sizeof(T)) == std::size_t(4) * 1000 * 16 * 128 * sizeof(T) + 8 * 64 * 4 + 4 * 8 * 4);
  CHECK_THROWS_WITH_AS(Cache<C>(big, big.bytes(sizeof(T)) - 1),
                       doctest::Contains(("the cache needs " + std::to_string(big.bytes(sizeof(T))) + " bytes").c_str()),
                       relayout::LayoutError);
  CHECK_THROWS_WITH_AS(Cache<C>({1, 8, 0, 4, 1, 1}), doctest::Contains("block_size: must be >= 1"),
                       relayout::LayoutError);
}
TEST_CASE_TEMPLATE_APPLY(kv_errors, Cases);

// Paged decode on long caches against the reference over the gathered rows, with the requests'
// blocks interleaved in the pool and the keys split into 1, 3, 4, 7 or 8 ranges (or as many as the
// kernel picks: 0) merged by log-sum-exp. On the host a lone head reads 3 or 4 ranges side by side
// (4 of 8 in each of two work items), so every such path meets ranges of unequal length and
// ranges left empty by short requests.
TEST_CASE_TEMPLATE_DEFINE("paged attention_decode matches the reference on long caches", C, kv_decode) {
  using T = typename C::scalar;
  using Mem = typename C::mem;
  typename C::exec exec;
  const std::vector<int> lens = {1, 16, 17, 300, 1000};
  const int reqs = int(lens.size()), bs = 16;
  std::uint32_t seed = 70;
  for (int head_dim : {8, 128})
    for (int heads : {1, 5, 8}) {
      Cache<C> cache({1, head_dim, bs, 100, reqs + 1, 63});
      // Grow the requests round-robin in pieces of 9 rows so their blocks interleave.
      std::vector<rr::Matrix> parts[8];
      for (int done = 0; done < 1000; done += 9)
        for (int b = 0; b < reqs; ++b) {
          const int n = std::min(9, lens[std::size_t(b)] - done);
          if (n <= 0) continue;
          auto rows = rows_of<C>(n, head_dim, seed++);
          cache.append(exec, 0, b + 1, rows.view);  // slot b + 1: slot 0 stays empty
          parts[b].push_back(rows.matrix);
        }
      std::vector<rr::Matrix> all;
      std::vector<int> cu{0};
      for (int b = 0; b < reqs; ++b) {
        all.push_back(concat(parts[b]));
        cu.push_back(cu.back() + lens[std::size_t(b)]);
      }
      const rr::Matrix flat = concat(all);
      // Query rows in reverse slot order: row b reads slot reqs - b.
      std::vector<int> slots;
      std::vector<int> rcu{0};
      std::vector<rr::Matrix> rev;
      for (int b = reqs - 1; b >= 0; --b) {
        slots.push_back(b + 1);
        rev.push_back(all[std::size_t(b)]);
        rcu.push_back(rcu.back() + lens[std::size_t(b)]);
      }
      const rr::Matrix rflat = concat(rev);
      auto q = random_tensor<C>(reqs, heads * head_dim, seed++, -2.0, 2.0);
      const auto kv = cache.view(0, make_ints<C>(slots));
      for (int window : {0, 100})
        for (int splits : {0, 1, 3, 4, 7, 8}) {
          CAPTURE(head_dim);
          CAPTURE(heads);
          CAPTURE(window);
          CAPTURE(splits);
          auto out = relayout::RowsView<T, Mem>("out", reqs, heads * head_dim);
          const double scale = rk::default_softmax_scale(head_dim);
          rk::attention_decode(exec, q.view, kv, out, {head_dim, scale, window, splits});
          const rr::Matrix want = rr::attention_decode(q.matrix, rflat, rcu, head_dim, scale, window);
          const double tol = 4 * eps_of<T>() * (head_dim + 1000 + 8);
          check_close(rr::to_matrix(out), want, [&](int, int) { return tol; }, "paged decode");
          // The contiguous entry point with the same splits agrees.
          auto flat_t = make_tensor<C>(flat.rows, head_dim, flat.data);
          auto q_fwd = relayout::RowsView<T, Mem>("q_fwd", reqs, heads * head_dim);
          auto q_h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), q.view);
          auto q_fh = Kokkos::create_mirror_view(q_fwd);
          for (int b = 0; b < reqs; ++b)
            for (int j = 0; j < heads * head_dim; ++j) q_fh(b, j) = q_h(reqs - 1 - b, j);
          Kokkos::deep_copy(q_fwd, q_fh);
          auto out_c = relayout::RowsView<T, Mem>("out_c", reqs, heads * head_dim);
          rk::attention_decode(exec, q_fwd, flat_t.view, make_ints<C>(cu), out_c, {head_dim, scale, window, splits});
          const rr::Matrix oc = rr::to_matrix(out_c), op = rr::to_matrix(out);
          double worst = 0;
          for (int b = 0; b < reqs; ++b)
            for (int j = 0; j < heads * head_dim; ++j) worst = std::max(worst, std::abs(oc(b, j) - op(reqs - 1 - b, j)));
          CHECK(worst <= tol);
        }
    }
}
TEST_CASE_TEMPLATE_APPLY(kv_decode, Cases);

TEST_CASE_TEMPLATE_DEFINE("paged attention_decode rejects a slot without rows", C, kv_decode_errors) {
  using T = typename C::scalar;
  using Mem = typename C::mem;
  typename C::exec exec;
  Cache<C> cache({1, 4, 4, 4, 2, 2});
  cache.append(exec, 0, 0, rows_of<C>(3, 4, 1).view);
  auto q = relayout::RowsView<T, Mem>("q", 2, 8), out = relayout::RowsView<T, Mem>("out", 2, 8);
  const rk::AttentionParams p{4, 0.5, 0};
  CHECK_NOTHROW(rk::attention_decode(exec, q, cache.view(0, make_ints<C>({0, 0})), out, p));
  CHECK_THROWS_WITH_AS(rk::attention_decode(exec, q, cache.view(0, make_ints<C>({0, 1})), out, p),
                       doctest::Contains("request slot 1 holds no rows"), rk::KernelError);
  CHECK_THROWS_WITH_AS(rk::attention_decode(exec, q, cache.view(0, make_ints<C>({0, 2})), out, p),
                       doctest::Contains("entry 1 is 2, not a slot of the cache"), rk::KernelError);
  CHECK_THROWS_WITH_AS(rk::attention_decode(exec, q, cache.view(0, make_ints<C>({0})), out, p),
                       doctest::Contains("one request slot per query row (2)"), rk::KernelError);
}
TEST_CASE_TEMPLATE_APPLY(kv_decode_errors, Cases);

}  // namespace

// Attention context parallelism: each of P shards (CP ranks) caches some positions of every request
// (round-robin by position, or contiguous chunks), attention_decode_partial attends each shard's
// keys in the window, and attention_merge of the P partials equals decode over all the keys. Lengths
// 1 and 2 leave shards without a key of that request (lse -inf); each shard's lse is checked against
// log sum exp of the scores it holds, computed here in double.
TEST_CASE_TEMPLATE_DEFINE("decode partials over CP shards merged by log-sum-exp equal decode over all keys", C,
                          kv_decode_cp) {
  using T = typename C::scalar;
  using Mem = typename C::mem;
  typename C::exec exec;
  const std::vector<int> lens = {1, 2, 5, 37};
  const int n = int(lens.size()), head_dim = 8, heads = 3, HD = heads * head_dim;
  const double scale = rk::default_softmax_scale(head_dim);
  std::uint32_t seed = 90;
  std::vector<rr::Matrix> keys;
  std::vector<int> cu{0};
  for (int b = 0; b < n; ++b) {
    keys.push_back(rows_of<C>(lens[std::size_t(b)], head_dim, seed++).matrix);
    cu.push_back(cu.back() + lens[std::size_t(b)]);
  }
  const rr::Matrix all = concat(keys);
  auto q = random_tensor<C>(n, HD, seed++, -2.0, 2.0);
  for (int P : {2, 3})
    for (bool round_robin : {true, false})
      for (int window : {0, 4})
        for (int splits : {1, 3}) {
          CAPTURE(P);
          CAPTURE(round_robin);
          CAPTURE(window);
          CAPTURE(splits);
          auto shard_of = [&](int b, int p) {
            const int L = lens[std::size_t(b)], per = L / P, extra = L % P;
            if (round_robin) return p % P;
            for (int s = 0, begin = 0; s < P; ++s) {  // chunk s: per + (s < extra) positions
              begin += per + (s < extra ? 1 : 0);
              if (p < begin) return s;
            }
            return P - 1;
          };
          std::vector<double> parts(std::size_t(P) * n * HD), lses(std::size_t(P) * n * heads);
          for (int s = 0; s < P; ++s) {
            Cache<C> cache({1, head_dim, 4, 40, n, 10});
            std::vector<int> first(std::size_t(n), 0);
            std::vector<std::vector<int>> held(static_cast<std::size_t>(n));
            for (int b = 0; b < n; ++b) {
              const int L = lens[std::size_t(b)], start = window > 0 ? std::max(0, L - window) : 0;
              std::vector<double> rows;
              for (int p = 0; p < L; ++p) {
                if (shard_of(b, p) != s) continue;
                if (p < start) ++first[std::size_t(b)];
                held[std::size_t(b)].push_back(p);
                for (int d = 0; d < head_dim; ++d) rows.push_back(keys[std::size_t(b)](p, d));
              }
              if (!rows.empty()) cache.append(exec, 0, b, make_tensor<C>(int(rows.size()) / head_dim, head_dim, rows).view);
            }
            std::vector<int> slots(static_cast<std::size_t>(n));
            for (int b = 0; b < n; ++b) slots[std::size_t(b)] = b;
            auto out = relayout::RowsView<T, Mem>("out", n, HD);
            auto lse = relayout::RowsView<T, Mem>("lse", n, heads);
            rk::attention_decode_partial(exec, q.view, cache.view(0, make_ints<C>(slots)), make_ints<C>(first), out,
                                         lse, {head_dim, scale, 0, splits});
            const rr::Matrix o = rr::to_matrix(out), l = rr::to_matrix(lse);
            for (int b = 0; b < n; ++b) {
              const int L = lens[std::size_t(b)], start = window > 0 ? std::max(0, L - window) : 0;
              for (int h = 0; h < heads; ++h) {
                double m = -1e300, sum = 0;
                std::vector<double> sc;
                for (int p : held[std::size_t(b)]) {
                  if (p < start) continue;
                  double dot = 0;
                  for (int d = 0; d < head_dim; ++d) dot += q.matrix(b, h * head_dim + d) * keys[std::size_t(b)](p, d);
                  sc.push_back(dot * scale);
                  m = std::max(m, dot * scale);
                }
                for (double x : sc) sum += std::exp(x - m);
                if (sc.empty()) {
                  CHECK(std::isinf(l(b, h)));
                  CHECK(l(b, h) < 0);
                } else {
                  CHECK(std::abs(l(b, h) - (m + std::log(sum))) <= 64 * eps_of<T>() * (1 + std::abs(m)));
                }
                lses[(std::size_t(s) * n + b) * heads + h] = l(b, h);
              }
              for (int j = 0; j < HD; ++j) parts[(std::size_t(s) * n + b) * HD + j] = o(b, j);
            }
          }
          auto merged = relayout::RowsView<T, Mem>("merged", n, HD);
          rk::attention_merge(exec, make_tensor<C>(P * n, HD, parts).view, make_tensor<C>(P * n, heads, lses).view,
                              merged);
          const rr::Matrix want = rr::attention_decode(q.matrix, all, cu, head_dim, scale, window);
          const double tol = 8 * eps_of<T>() * (head_dim + 40 + 8);
          check_close(rr::to_matrix(merged), want, [&](int, int) { return tol; }, "merged CP decode");
        }
}
TEST_CASE_TEMPLATE_APPLY(kv_decode_cp, Cases);

TEST_CASE_TEMPLATE_DEFINE("attention_decode_partial and attention_merge reject bad shapes", C, kv_decode_cp_errors) {
  using T = typename C::scalar;
  using Mem = typename C::mem;
  typename C::exec exec;
  Cache<C> cache({1, 4, 4, 4, 2, 2});
  cache.append(exec, 0, 0, rows_of<C>(3, 4, 1).view);
  auto q = relayout::RowsView<T, Mem>("q", 2, 8), out = relayout::RowsView<T, Mem>("out", 2, 8);
  auto lse = relayout::RowsView<T, Mem>("lse", 2, 2);
  const auto kv = cache.view(0, make_ints<C>({0, 1}));  // slot 1 holds no rows: allowed in a shard
  CHECK_NOTHROW(rk::attention_decode_partial(exec, q, kv, make_ints<C>({0, 0}), out, lse, {4, 0.5, 0}));
  CHECK_THROWS_WITH_AS(rk::attention_decode_partial(exec, q, kv, make_ints<C>({0, 0}), out, lse, {4, 0.5, 2}),
                       doctest::Contains("window: must be 0: the window of a shard is given per query row by first"),
                       rk::KernelError);
  CHECK_THROWS_WITH_AS(rk::attention_decode_partial(exec, q, kv, make_ints<C>({0}), out, lse, {4, 0.5, 0}),
                       doctest::Contains("first: must hold one entry per query row (2), got 1"), rk::KernelError);
  CHECK_THROWS_WITH_AS(rk::attention_decode_partial(exec, q, kv, make_ints<C>({0, -1}), out, lse, {4, 0.5, 0}),
                       doctest::Contains("entry 1 is -1; must be >= 0"), rk::KernelError);
  CHECK_THROWS_WITH_AS(
      rk::attention_decode_partial(exec, q, kv, make_ints<C>({0, 0}), out, relayout::RowsView<T, Mem>("l", 2, 3), {4, 0.5, 0}),
      doctest::Contains("lse: must be 2 x 2 (query rows x heads), got 2 x 3"), rk::KernelError);
  auto parts = relayout::RowsView<T, Mem>("parts", 5, 8), lses = relayout::RowsView<T, Mem>("lses", 5, 2);
  CHECK_THROWS_WITH_AS(rk::attention_merge(exec, parts, lses, out), doctest::Contains("must hold P x 2 rows"),
                       rk::KernelError);
  CHECK_THROWS_WITH_AS(rk::attention_merge(exec, relayout::RowsView<T, Mem>("p", 4, 8), relayout::RowsView<T, Mem>("l", 4, 3), out),
                       doctest::Contains("lse: must have one column per head"), rk::KernelError);
}
TEST_CASE_TEMPLATE_APPLY(kv_decode_cp_errors, Cases);
