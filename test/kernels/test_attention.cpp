// Shared-KV attention (prefill and decode) against the two-pass reference over head counts, head
// sizes, request lengths around the key block (32), empty requests, and windows from 1 to larger
// than the sequence; bad shapes and offsets rejected.
#include "support.hpp"

namespace {

using namespace kt;

// Tolerance (outputs are convex combinations of kv rows, |kv| <= 1): a score sums D products, so
// its absolute error is ~D*eps*scale*max|q.k| <= D*eps; exp turns that into a relative error of the
// weight; the normaliser and the output each sum L terms (L*eps). 4*eps*(D + L + 8) absolute.
template <class T>
double attn_tol(int head_dim, int keys) {
  return 4 * eps_of<T>() * (head_dim + keys + 8);
}

std::vector<int> offsets_of(const std::vector<int>& lens) {
  std::vector<int> cu{0};
  for (int l : lens) cu.push_back(cu.back() + l);
  return cu;
}

TEST_CASE_TEMPLATE_DEFINE("attention_prefill matches the reference", C, prefill_sweep) {
  using T = typename C::scalar;
  using Mem = typename C::mem;
  typename C::exec exec;
  const std::vector<std::vector<int>> batches = {{}, {1}, {5}, {33, 1, 0, 70}, {32, 64}};
  std::uint32_t seed = 900;
  for (const auto& lens : batches)
    for (int heads : {1, 3, 8})
      for (int head_dim : {1, 5, 16, 64})
        for (int window : {0, 1, 4, 1000}) {
          const std::vector<int> cu = offsets_of(lens);
          const int rows = cu.back();
          CAPTURE(rows);
          CAPTURE(heads);
          CAPTURE(head_dim);
          CAPTURE(window);
          auto q = random_tensor<C>(rows, heads * head_dim, seed++);
          auto kv = random_tensor<C>(rows, head_dim, seed++);
          auto out = relayout::RowsView<T, Mem>("out", rows, heads * head_dim);
          const double scale = rk::default_softmax_scale(head_dim);
          rk::attention_prefill(exec, q.view, kv.view, make_ints<C>(cu), out, {head_dim, scale, window});
          const rr::Matrix want = rr::attention_prefill(q.matrix, kv.matrix, cu, head_dim, scale, window);
          int longest = 0;
          for (int l : lens) longest = std::max(longest, l);
          const double tol = attn_tol<T>(head_dim, longest);
          check_close(rr::to_matrix(out), want, [&](int, int) { return tol; }, "prefill");
        }
}
TEST_CASE_TEMPLATE_APPLY(prefill_sweep, Cases);

TEST_CASE_TEMPLATE_DEFINE("attention_decode matches the reference", C, decode_sweep) {
  using T = typename C::scalar;
  using Mem = typename C::mem;
  typename C::exec exec;
  const std::vector<std::vector<int>> batches = {{}, {1}, {31, 32, 33}, {100, 1, 65}};
  std::uint32_t seed = 1300;
  for (const auto& lens : batches)
    for (int heads : {1, 4, 16})
      for (int head_dim : {3, 32, 128})
        for (int window : {0, 1, 7, 1000}) {
          const std::vector<int> cu = offsets_of(lens);
          const int reqs = int(lens.size());
          CAPTURE(reqs);
          CAPTURE(heads);
          CAPTURE(head_dim);
          CAPTURE(window);
          // A cache with spare rows after the last request (capacity > used).
          auto cache = random_tensor<C>(cu.back() + 3, head_dim, seed++);
          auto q = random_tensor<C>(reqs, heads * head_dim, seed++);
          auto out = relayout::RowsView<T, Mem>("out", reqs, heads * head_dim);
          const double scale = 0.5 * rk::default_softmax_scale(head_dim);
          rk::attention_decode(exec, q.view, cache.view, make_ints<C>(cu), out, {head_dim, scale, window});
          const rr::Matrix want = rr::attention_decode(q.matrix, cache.matrix, cu, head_dim, scale, window);
          int longest = 0;
          for (int l : lens) longest = std::max(longest, l);
          const double tol = attn_tol<T>(head_dim, longest);
          check_close(rr::to_matrix(out), want, [&](int, int) { return tol; }, "decode");
        }
}
TEST_CASE_TEMPLATE_APPLY(decode_sweep, Cases);

TEST_CASE_TEMPLATE_DEFINE("attention: a head shard equals the same heads of the full layer", C, attn_heads) {
  using T = typename C::scalar;
  using Mem = typename C::mem;
  typename C::exec exec;
  const int heads = 8, head_dim = 16, n = 4;
  const std::vector<int> cu = {0, 40, 77};
  auto q = random_tensor<C>(77, heads * head_dim, 21);
  auto kv = random_tensor<C>(77, head_dim, 22);
  auto full = relayout::RowsView<T, Mem>("full", 77, heads * head_dim);
  const rk::AttentionParams p{head_dim, rk::default_softmax_scale(head_dim), 0};
  rk::attention_prefill(exec, q.view, kv.view, make_ints<C>(cu), full, p);
  const rr::Matrix f = rr::to_matrix(full);
  for (int r = 0; r < n; ++r) {
    const relayout::Range s = rk::column_parallel_shard(heads * head_dim, head_dim, n, r);
    auto q_local = relayout::RowsView<T, Mem>("q_local", 77, s.count);
    Kokkos::deep_copy(q_local, Kokkos::subview(q.view, Kokkos::ALL(), s.pair()));
    auto out = relayout::RowsView<T, Mem>("out", 77, s.count);
    rk::attention_prefill(exec, q_local, kv.view, make_ints<C>(cu), out, p);
    const rr::Matrix o = rr::to_matrix(out);
    int diffs = 0;
    for (int i = 0; i < 77; ++i)
      for (int j = 0; j < s.count; ++j) diffs += o(i, j) != f(i, int(s.begin) + j);
    CHECK(diffs == 0);  // same arithmetic per head: bitwise equal
  }
}
TEST_CASE_TEMPLATE_APPLY(attn_heads, Cases);

// The register tiles' edges: head counts that leave a partial head group (groups are 8 heads wide
// on AVX-512, 4 elsewhere), head sizes that are not a multiple of the vector width, and requests
// whose last chunk of keys is partial, odd or a single key; decode and prefill against the
// reference.
TEST_CASE_TEMPLATE_DEFINE("attention: partial head groups, head tails and chunk remainders", C, attn_tiles) {
  using T = typename C::scalar;
  using Mem = typename C::mem;
  typename C::exec exec;
  const std::vector<int> lens = {33, 47, 64, 95, 2};
  const std::vector<int> cu = offsets_of(lens);
  const int reqs = int(lens.size()), rows = cu.back();
  std::uint32_t seed = 4100;
  for (int heads : {2, 5, 7, 9, 12, 13, 16})
    for (int head_dim : {8, 24, 40, 130}) {
      CAPTURE(heads);
      CAPTURE(head_dim);
      auto cache = random_tensor<C>(rows, head_dim, seed++);
      const double scale = rk::default_softmax_scale(head_dim);
      for (int splits : {1, 3}) {
        CAPTURE(splits);
        auto q = random_tensor<C>(reqs, heads * head_dim, seed++, -2.0, 2.0);
        auto out = relayout::RowsView<T, Mem>("out", reqs, heads * head_dim);
        rk::attention_decode(exec, q.view, cache.view, make_ints<C>(cu), out, {head_dim, scale, 0, splits});
        const rr::Matrix want = rr::attention_decode(q.matrix, cache.matrix, cu, head_dim, scale, 0);
        const double tol = attn_tol<T>(head_dim, 95);
        check_close(rr::to_matrix(out), want, [&](int, int) { return tol; }, "decode");
      }
      auto q = random_tensor<C>(rows, heads * head_dim, seed++);
      auto out = relayout::RowsView<T, Mem>("out", rows, heads * head_dim);
      rk::attention_prefill(exec, q.view, cache.view, make_ints<C>(cu), out, {head_dim, scale, 0});
      const rr::Matrix want = rr::attention_prefill(q.matrix, cache.matrix, cu, head_dim, scale, 0);
      check_close(rr::to_matrix(out), want, [&](int, int) { return attn_tol<T>(head_dim, 95); }, "prefill");
    }
}
TEST_CASE_TEMPLATE_APPLY(attn_tiles, Cases);

// A head's result does not depend on the heads beside it: 15 heads (a full group and a partial one
// on AVX-512) against shards of 5 and of 3 heads, whose groups take other register tiles, bitwise.
TEST_CASE_TEMPLATE_DEFINE("attention: a head's result does not depend on its register tile", C, attn_tile_free) {
  using T = typename C::scalar;
  using Mem = typename C::mem;
  typename C::exec exec;
  const int heads = 15;
  const std::vector<int> cu = {0, 45, 77};
  for (int head_dim : {16, 40}) {
    CAPTURE(head_dim);
    auto q = random_tensor<C>(77, heads * head_dim, 51);
    auto kv = random_tensor<C>(77, head_dim, 52);
    const rk::AttentionParams p{head_dim, rk::default_softmax_scale(head_dim), 0};
    auto full = relayout::RowsView<T, Mem>("full", 77, heads * head_dim);
    rk::attention_prefill(exec, q.view, kv.view, make_ints<C>(cu), full, p);
    const rr::Matrix f = rr::to_matrix(full);
    for (int n : {3, 5}) {
      CAPTURE(n);
      for (int r = 0; r < n; ++r) {
        const relayout::Range s = rk::column_parallel_shard(heads * head_dim, head_dim, n, r);
        auto q_local = relayout::RowsView<T, Mem>("q_local", 77, s.count);
        Kokkos::deep_copy(q_local, Kokkos::subview(q.view, Kokkos::ALL(), s.pair()));
        auto out = relayout::RowsView<T, Mem>("out", 77, s.count);
        rk::attention_prefill(exec, q_local, kv.view, make_ints<C>(cu), out, p);
        const rr::Matrix o = rr::to_matrix(out);
        int diffs = 0;
        for (int i = 0; i < 77; ++i)
          for (int j = 0; j < s.count; ++j) diffs += o(i, j) != f(i, int(s.begin) + j);
        CHECK(diffs == 0);
      }
    }
  }
}
TEST_CASE_TEMPLATE_APPLY(attn_tile_free, Cases);

// Attention context parallelism: a rank holding some of each request's tokens (every third one
// here, and one contiguous chunk) with all of their keys computes exactly those rows of the full
// prefill, causal mask and window going by each query's own kv row.
TEST_CASE_TEMPLATE_DEFINE("attention: query rows at positions equal those rows of the full prefill", C, attn_positions) {
  using T = typename C::scalar;
  using Mem = typename C::mem;
  typename C::exec exec;
  const int heads = 3, head_dim = 8;
  const std::vector<int> cu = {0, 40, 41, 77};
  auto q = random_tensor<C>(77, heads * head_dim, 31);
  auto kv = random_tensor<C>(77, head_dim, 32);
  for (int window : {0, 5}) {
    CAPTURE(window);
    const rk::AttentionParams p{head_dim, rk::default_softmax_scale(head_dim), window};
    auto full = relayout::RowsView<T, Mem>("full", 77, heads * head_dim);
    rk::attention_prefill(exec, q.view, kv.view, make_ints<C>(cu), full, p);
    const rr::Matrix f = rr::to_matrix(full);
    std::vector<int> strided, chunk;
    for (int i = 1; i < 77; i += 3) strided.push_back(i);
    for (int i = 30; i < 45; ++i) chunk.push_back(i);  // across the requests' boundaries
    for (const std::vector<int>& pos : {strided, chunk}) {
      const int n = int(pos.size());
      auto q_mine = relayout::RowsView<T, Mem>("q_mine", n, heads * head_dim);
      auto hq = Kokkos::create_mirror_view(q_mine);
      const auto qh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), q.view);
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < heads * head_dim; ++j) hq(i, j) = qh(pos[std::size_t(i)], j);
      Kokkos::deep_copy(q_mine, hq);
      auto out = relayout::RowsView<T, Mem>("out", n, heads * head_dim);
      rk::attention_prefill(exec, q_mine, kv.view, make_ints<C>(cu), make_ints<C>(pos), out, p);
      const rr::Matrix o = rr::to_matrix(out);
      int diffs = 0;
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < heads * head_dim; ++j) diffs += o(i, j) != f(pos[std::size_t(i)], j);
      CHECK(diffs == 0);  // the same keys in the same order: bitwise equal
    }
  }
  auto q2 = relayout::RowsView<T, Mem>("q2", 2, heads * head_dim);
  auto out2 = relayout::RowsView<T, Mem>("out2", 2, heads * head_dim);
  const rk::AttentionParams p{head_dim, rk::default_softmax_scale(head_dim), 0};
  CHECK_THROWS_WITH_AS(rk::attention_prefill(exec, q2, kv.view, make_ints<C>(cu), make_ints<C>({3, 77}), out2, p),
                       doctest::Contains("positions: entry 1 is 77; a kv row must be in [0, 77)"), rk::KernelError);
  CHECK_THROWS_WITH_AS(rk::attention_prefill(exec, q2, kv.view, make_ints<C>(cu), make_ints<C>({3}), out2, p),
                       doctest::Contains("positions: must hold one kv row per query row (2), got 1"), rk::KernelError);
}
TEST_CASE_TEMPLATE_APPLY(attn_positions, Cases);

TEST_CASE_TEMPLATE_DEFINE("attention rejects bad shapes and offsets", C, attn_errors) {
  using T = typename C::scalar;
  using Mem = typename C::mem;
  typename C::exec exec;
  auto q = relayout::RowsView<T, Mem>("q", 6, 32);
  auto kv = relayout::RowsView<T, Mem>("kv", 6, 8);
  auto out = relayout::RowsView<T, Mem>("out", 6, 32);
  const rk::AttentionParams p{8, 0.35, 0};
  CHECK_NOTHROW(rk::attention_prefill(exec, q, kv, make_ints<C>({0, 2, 6}), out, p));
  CHECK_THROWS_WITH_AS(rk::attention_prefill(exec, q, kv, make_ints<C>({0, 2, 5}), out, p),
                       doctest::Contains("cu_seqlens: last entry must equal the kv rows 6"), rk::KernelError);
  CHECK_THROWS_WITH_AS(rk::attention_prefill(exec, q, kv, make_ints<C>({0, 4, 3, 6}), out, p),
                       doctest::Contains("non-decreasing"), rk::KernelError);
  CHECK_THROWS_WITH_AS(rk::attention_prefill(exec, q, kv, make_ints<C>({1, 6}), out, p),
                       doctest::Contains("must start at 0"), rk::KernelError);
  CHECK_THROWS_WITH_AS(rk::attention_prefill(exec, q, kv, make_ints<C>({0, 6}), out, {16, 0.35, 0}),
                       doctest::Contains("kv.extent(1) must equal head_dim 16"), rk::KernelError);
  CHECK_THROWS_WITH_AS(rk::attention_prefill(exec, q, kv, make_ints<C>({0, 6}), out, {8, 0.35, -1}),
                       doctest::Contains("window"), rk::KernelError);
  CHECK_THROWS_WITH_AS(rk::attention_prefill(exec, q, kv, make_ints<C>({0, 6}), out, {8, 0.0, 0}),
                       doctest::Contains("scale"), rk::KernelError);
  auto q_bad = relayout::RowsView<T, Mem>("q", 6, 30);
  CHECK_THROWS_WITH_AS(rk::attention_prefill(exec, q_bad, kv, make_ints<C>({0, 6}), out, p),
                       doctest::Contains("multiple of head_dim"), rk::KernelError);
  auto out_bad = relayout::RowsView<T, Mem>("out", 5, 32);
  CHECK_THROWS_WITH_AS(rk::attention_prefill(exec, q, kv, make_ints<C>({0, 6}), out_bad, p),
                       doctest::Contains("out"), rk::KernelError);

  auto qd = relayout::RowsView<T, Mem>("qd", 2, 32);
  auto od = relayout::RowsView<T, Mem>("od", 2, 32);
  CHECK_NOTHROW(rk::attention_decode(exec, qd, kv, make_ints<C>({0, 1, 4}), od, p));
  CHECK_THROWS_WITH_AS(rk::attention_decode(exec, qd, kv, make_ints<C>({0, 4}), od, p),
                       doctest::Contains("n_requests + 1 = 3"), rk::KernelError);
  CHECK_THROWS_WITH_AS(rk::attention_decode(exec, qd, kv, make_ints<C>({0, 0, 4}), od, p),
                       doctest::Contains("strictly increasing"), rk::KernelError);
  CHECK_THROWS_WITH_AS(rk::attention_decode(exec, qd, kv, make_ints<C>({0, 3, 7}), od, p),
                       doctest::Contains("must not exceed the kv rows 6"), rk::KernelError);
}
TEST_CASE_TEMPLATE_APPLY(attn_errors, Cases);

}  // namespace
