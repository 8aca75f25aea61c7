// Decode attention over a bf16 KV cache with fp32 queries and outputs, contiguous and paged:
// against the double reference over the same bf16-rounded keys (the kernel's arithmetic is fp32),
// against the fp32-cache decode within what rounding the keys to bf16 allows, a paged cache filled
// with fp32 rows rounded on append, bitwise against decode over a fp32 cache of the widened keys
// (contiguous, paged, partial; one head and several), and the argument checks with a bf16 cache.
#include <cmath>
#include <cstring>

#include "support.hpp"

namespace {

using namespace kt;
using relayout::bf16;

template <class Spaces>
struct FloatCasesOf;
template <class... S>
struct FloatCasesOf<std::tuple<S...>> {
  using type = std::tuple<Case<S, float>...>;
};
using FloatCases = typename FloatCasesOf<rk::EnabledExecutionSpaces>::type;

std::vector<int> offsets_of(const std::vector<int>& lens) {
  std::vector<int> cu{0};
  for (int l : lens) cu.push_back(cu.back() + l);
  return cu;
}

// A bf16 tensor of values rounded to nearest even, and the rounded values as a reference matrix.
template <class Mem>
struct Bf16Tensor {
  relayout::RowsView<bf16, Mem> view;
  rr::Matrix matrix;
};
template <class Mem>
Bf16Tensor<Mem> bf16_tensor(int rows, int cols, const std::vector<double>& values) {
  Bf16Tensor<Mem> t{relayout::RowsView<bf16, Mem>("bf16", rows, cols), rr::Matrix(rows, cols)};
  auto h = Kokkos::create_mirror_view(t.view);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) {
      h(i, j) = bf16(float(values[std::size_t(i) * cols + j]));
      t.matrix(i, j) = double(float(h(i, j)));
    }
  Kokkos::deep_copy(t.view, h);
  return t;
}

// The fp32 tolerance of the kernel against the reference on the keys it reads (|q|, |kv| <= 1),
// as test_attention.cpp derives it: 4 eps (D + L + 8).
double fp32_tol(int head_dim, int keys) { return 4 * eps_of<float>() * (head_dim + keys + 8); }

// How far decode over bf16-rounded keys may lie from decode over the fp32 keys. Rounding to bf16
// moves each value by at most u|k|, u = 2^-8 (8 significant bits, nearest even), so with |q|,
// |k| <= 1 a score scale q.k moves by at most d = scale D u. Every softmax weight then changes by
// a factor within e^(+-2d), so |dp_j| <= (e^(2d) - 1) p_j, and the output sum_j p_j v_j moves by
// at most (e^(2d) - 1) max|v| from the weights and u max|v| from the values themselves. Both sides
// carry their own fp32 error on top.
double bf16_bound(int head_dim, double scale, int keys) {
  const double u = std::ldexp(1.0, -8);
  const double d = scale * head_dim * u;
  return std::expm1(2 * d) + u + 2 * fp32_tol(head_dim, keys);
}

TEST_CASE_TEMPLATE_DEFINE("attention_decode over a bf16 cache matches the reference", C, bf16_decode_sweep) {
  using Mem = typename C::mem;
  typename C::exec exec;
  // Lengths around the chunk (32 keys; a lone head of 512 takes chunks of 8) and its remainders.
  const std::vector<std::vector<int>> batches = {{1}, {31, 32, 33}, {100, 1, 65}, {301}};
  std::uint32_t seed = 7100;
  for (const auto& lens : batches)
    for (int heads : {1, 3, 8, 16})
      for (int head_dim : {64, 72, 128, 512})
        for (int window : {0, 7, 1000}) {
          const std::vector<int> cu = offsets_of(lens);
          const int reqs = int(lens.size());
          CAPTURE(cu.back());
          CAPTURE(heads);
          CAPTURE(head_dim);
          CAPTURE(window);
          const int rows = cu.back() + 3;  // spare rows after the last request
          const auto values = random_values(std::size_t(rows) * head_dim, seed++);
          const auto cache = bf16_tensor<Mem>(rows, head_dim, values);
          const auto cache32 = make_tensor<C>(rows, head_dim, values);
          auto q = random_tensor<C>(reqs, heads * head_dim, seed++);
          auto out = relayout::RowsView<float, Mem>("out", reqs, heads * head_dim);
          auto out32 = relayout::RowsView<float, Mem>("out32", reqs, heads * head_dim);
          const double scale = rk::default_softmax_scale(head_dim);
          const rk::AttentionParams p{head_dim, scale, window};
          rk::attention_decode(exec, q.view, cache.view, make_ints<C>(cu), out, p);
          rk::attention_decode(exec, q.view, cache32.view, make_ints<C>(cu), out32, p);
          const rr::Matrix want = rr::attention_decode(q.matrix, cache.matrix, cu, head_dim, scale, window);
          int longest = 0;
          for (int l : lens) longest = std::max(longest, l);
          const double tol = fp32_tol(head_dim, longest);
          const rr::Matrix got = rr::to_matrix(out);
          check_close(got, want, [&](int, int) { return tol; }, "bf16 decode");
          const double bound = bf16_bound(head_dim, scale, longest);
          check_close(got, rr::to_matrix(out32), [&](int, int) { return bound; }, "bf16 against fp32 cache");
          // Key splits merged by log-sum-exp give the same rows.
          rk::AttentionParams split = p;
          split.splits = 3;
          rk::attention_decode(exec, q.view, cache.view, make_ints<C>(cu), out, split);
          check_close(rr::to_matrix(out), want, [&](int, int) { return tol; }, "bf16 decode, 3 splits");
        }
}
TEST_CASE_TEMPLATE_APPLY(bf16_decode_sweep, FloatCases);

TEST_CASE_TEMPLATE_DEFINE("a paged bf16 cache: fp32 rows rounded on append, decode through it", C, bf16_paged) {
  using Mem = typename C::mem;
  typename C::exec exec;
  std::uint32_t seed = 7900;
  for (int block_size : {5, 16})
    for (int heads : {1, 3, 8, 16})
      for (int head_dim : {64, 72, 128, 512})
        for (int window : {0, 9}) {
          CAPTURE(block_size);
          CAPTURE(heads);
          CAPTURE(head_dim);
          CAPTURE(window);
          const std::vector<int> lens = {37, 1, 70};
          const int reqs = int(lens.size());
          rk::KvCacheShape shape{1, head_dim, block_size, 64, reqs, 16};
          rk::PagedKvCache<bf16, Mem> cache(shape);
          // Requests filled in pieces, interleaved, so their blocks interleave in the pool; request
          // 1's row comes as bf16, the others as fp32 rows rounded by append.
          std::vector<std::vector<double>> rows(static_cast<std::size_t>(reqs));
          for (int start = 0; start < 70; start += 11)
            for (int b = 0; b < reqs; ++b) {
              const int n = std::min(11, lens[std::size_t(b)] - start);
              if (n <= 0) continue;
              const auto v = random_values(std::size_t(n) * head_dim, seed++);
              rows[std::size_t(b)].insert(rows[std::size_t(b)].end(), v.begin(), v.end());
              if (b == 1)
                cache.append(exec, 0, b, bf16_tensor<Mem>(n, head_dim, v).view);
              else
                cache.append(exec, 0, b, make_tensor<C>(n, head_dim, v).view);
            }
          // The stored rows are the values rounded to nearest even, in order.
          rr::Matrix kv(lens[0] + lens[1] + lens[2], head_dim);
          std::vector<int> cu = offsets_of(lens);
          for (int b = 0; b < reqs; ++b) {
            const auto stored = cache.read(0, b);
            REQUIRE(int(stored.extent(0)) == lens[std::size_t(b)]);
            for (int i = 0; i < lens[std::size_t(b)]; ++i)
              for (int d = 0; d < head_dim; ++d) {
                const float want = float(bf16(float(rows[std::size_t(b)][std::size_t(i) * head_dim + d])));
                REQUIRE(float(stored(i, d)) == want);
                kv(cu[std::size_t(b)] + i, d) = want;
              }
          }
          auto q = random_tensor<C>(reqs, heads * head_dim, seed++);
          auto out = relayout::RowsView<float, Mem>("out", reqs, heads * head_dim);
          const double scale = rk::default_softmax_scale(head_dim);
          const rk::AttentionParams p{head_dim, scale, window};
          rk::attention_decode(exec, q.view, cache.view(0, make_ints<C>({0, 1, 2})), out, p);
          const rr::Matrix want = rr::attention_decode(q.matrix, kv, cu, head_dim, scale, window);
          const double tol = fp32_tol(head_dim, 70);
          check_close(rr::to_matrix(out), want, [&](int, int) { return tol; }, "paged bf16 decode");

          // Partial decode over the whole of each request with first = 0 is the normalised row.
          if (window == 0) {
            auto lse = relayout::RowsView<float, Mem>("lse", reqs, heads);
            rk::attention_decode_partial(exec, q.view, cache.view(0, make_ints<C>({0, 1, 2})),
                                         make_ints<C>({0, 0, 0}), out, lse, p);
            check_close(rr::to_matrix(out), want, [&](int, int) { return tol; }, "paged bf16 partial decode");
          }
        }
}
TEST_CASE_TEMPLATE_APPLY(bf16_paged, FloatCases);

// Elements of two float views (same shape) whose bits differ.
template <class A, class B>
int bit_diffs(const A& a, const B& b) {
  auto ha = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), a);
  auto hb = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b);
  int diffs = 0;
  for (std::size_t i = 0; i < ha.extent(0); ++i)
    for (std::size_t j = 0; j < ha.extent(1); ++j)
      diffs += std::memcmp(&ha(i, j), &hb(i, j), sizeof(float)) != 0;
  return diffs;
}

// The core widens bf16 keys exactly where it loads them, so decode over a bf16 cache is decode
// over a fp32 cache of the widened keys, bit for bit: contiguous rows, key splits, a paged cache
// (blocks shorter than a chunk and of 16 rows) and the partial decode, for a lone head (key ranges
// read side by side) and head groups of every tile.
TEST_CASE_TEMPLATE_DEFINE("decode over a bf16 cache is bitwise decode over its widened keys", C, bf16_bitwise) {
  using Mem = typename C::mem;
  typename C::exec exec;
  std::uint32_t seed = 9100;
  const std::vector<int> lens = {300, 1, 77, 33};
  const std::vector<int> cu = offsets_of(lens);
  const int reqs = int(lens.size());
  for (int heads : {1, 3, 8, 16})
    for (int head_dim : {40, 64, 72, 128, 512}) {
      CAPTURE(heads);
      CAPTURE(head_dim);
      const int rows = cu.back();
      auto values = random_values(std::size_t(rows) * head_dim, seed++);
      const auto cache = bf16_tensor<Mem>(rows, head_dim, values);
      for (std::size_t i = 0; i < values.size(); ++i) values[i] = double(float(bf16(float(values[i]))));
      const auto cache32 = make_tensor<C>(rows, head_dim, values);
      auto q = random_tensor<C>(reqs, heads * head_dim, seed++);
      auto out = relayout::RowsView<float, Mem>("out", reqs, heads * head_dim);
      auto out32 = relayout::RowsView<float, Mem>("out32", reqs, heads * head_dim);
      const double scale = rk::default_softmax_scale(head_dim);
      for (int splits : {0, 1, 3, 4})
        for (int window : {0, 45}) {
          CAPTURE(splits);
          CAPTURE(window);
          const rk::AttentionParams p{head_dim, scale, window, splits};
          rk::attention_decode(exec, q.view, cache.view, make_ints<C>(cu), out, p);
          rk::attention_decode(exec, q.view, cache32.view, make_ints<C>(cu), out32, p);
          CHECK(bit_diffs(out, out32) == 0);
        }
      for (int block_size : {5, 16}) {
        CAPTURE(block_size);
        rk::KvCacheShape shape{1, head_dim, block_size, rows / block_size + reqs + 1, reqs, (300 + block_size - 1) / block_size};
        rk::PagedKvCache<bf16, Mem> paged(shape);
        rk::PagedKvCache<float, Mem> paged32(shape);
        // Filled in pieces, interleaved, so the requests' blocks interleave in the pool.
        for (int start = 0; start < 300; start += 64)
          for (int b = 0; b < reqs; ++b) {
            const int n = std::min(64, lens[std::size_t(b)] - start);
            if (n <= 0) continue;
            const auto first = values.begin() + std::ptrdiff_t(cu[std::size_t(b)] + start) * head_dim;
            const std::vector<double> v(first, first + std::ptrdiff_t(n) * head_dim);
            paged.append(exec, 0, b, bf16_tensor<Mem>(n, head_dim, v).view);
            paged32.append(exec, 0, b, make_tensor<C>(n, head_dim, v).view);
          }
        const auto slots = make_ints<C>({3, 0, 2, 1});
        auto qs = random_tensor<C>(reqs, heads * head_dim, seed++);
        for (int splits : {0, 3}) {
          CAPTURE(splits);
          const rk::AttentionParams p{head_dim, scale, 0, splits};
          rk::attention_decode(exec, qs.view, paged.view(0, slots), out, p);
          rk::attention_decode(exec, qs.view, paged32.view(0, slots), out32, p);
          CHECK(bit_diffs(out, out32) == 0);
        }
        auto lse = relayout::RowsView<float, Mem>("lse", reqs, heads);
        auto lse32 = relayout::RowsView<float, Mem>("lse32", reqs, heads);
        const auto first = make_ints<C>({10, 0, 70, 1});
        const rk::AttentionParams p{head_dim, scale, 0};
        rk::attention_decode_partial(exec, qs.view, paged.view(0, slots), first, out, lse, p);
        rk::attention_decode_partial(exec, qs.view, paged32.view(0, slots), first, out32, lse32, p);
        CHECK(bit_diffs(out, out32) == 0);
        CHECK(bit_diffs(lse, lse32) == 0);
      }
    }
}
TEST_CASE_TEMPLATE_APPLY(bf16_bitwise, FloatCases);

TEST_CASE_TEMPLATE_DEFINE("attention_decode over a bf16 cache checks its arguments", C, bf16_checks) {
  using Mem = typename C::mem;
  typename C::exec exec;
  const int head_dim = 8;
  const auto cache = bf16_tensor<Mem>(6, head_dim, random_values(6 * head_dim, 8800));
  auto q = random_tensor<C>(2, 2 * head_dim, 8801);
  auto out = relayout::RowsView<float, Mem>("out", 2, 2 * head_dim);
  const rk::AttentionParams p{head_dim, rk::default_softmax_scale(head_dim), 0};
  CHECK_NOTHROW(rk::attention_decode(exec, q.view, cache.view, make_ints<C>({0, 2, 6}), out, p));
  CHECK_THROWS_WITH_AS(rk::attention_decode(exec, q.view, cache.view, make_ints<C>({0, 2, 7}), out, p),
                       doctest::Contains("cu_cache: last entry must not exceed the kv rows 6"), rk::KernelError);
  CHECK_THROWS_WITH_AS(rk::attention_decode(exec, q.view, cache.view, make_ints<C>({0, 6}), out, p),
                       doctest::Contains("cu_cache: must hold n_requests + 1 = 3 offsets"), rk::KernelError);
  CHECK_THROWS_WITH_AS(rk::attention_decode(exec, q.view, cache.view, make_ints<C>({0, 2, 2}), out, p),
                       doctest::Contains("strictly increasing"), rk::KernelError);
  CHECK_THROWS_WITH_AS(
      rk::attention_decode(exec, q.view, cache.view, make_ints<C>({0, 2, 6}), out, {4, p.scale, 0}),
      doctest::Contains("kv.extent(1) must equal head_dim 4"), rk::KernelError);
  auto bad_out = relayout::RowsView<float, Mem>("bad", 1, 2 * head_dim);
  CHECK_THROWS_WITH_AS(rk::attention_decode(exec, q.view, cache.view, make_ints<C>({0, 2, 6}), bad_out, p),
                       doctest::Contains("out: must have q's shape 2 x 16"), rk::KernelError);

  rk::PagedKvCache<bf16, Mem> paged({1, head_dim, 4, 8, 2, 4});
  paged.append(exec, 0, 0, make_tensor<C>(3, head_dim, random_values(3 * head_dim, 8802)).view);
  CHECK_THROWS_WITH_AS(rk::attention_decode(exec, q.view, paged.view(0, make_ints<C>({0, 1})), out, p),
                       doctest::Contains("request slot 1 holds no rows"), rk::KernelError);
  CHECK_THROWS_WITH_AS(rk::attention_decode(exec, q.view, paged.view(0, make_ints<C>({0, 5})), out, p),
                       doctest::Contains("entry 1 is 5, not a slot of the cache"), rk::KernelError);
  CHECK_THROWS_WITH_AS(paged.append(exec, 0, 1, make_tensor<C>(17, head_dim, random_values(17 * head_dim, 8803)).view),
                       doctest::Contains("17 rows exceed the capacity of 16 rows per request"), rk::KernelError);
  CHECK_THROWS_WITH_AS(paged.append(exec, 0, 1, make_tensor<C>(1, 4, random_values(4, 8804)).view),
                       doctest::Contains("must have head_dim 8 columns, got 4"), rk::KernelError);
}
TEST_CASE_TEMPLATE_APPLY(bf16_checks, FloatCases);

}  // namespace
