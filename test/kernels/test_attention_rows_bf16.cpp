// bf16 rows through the attention kernels: q, kv and out all relayout::bf16, fp32 arithmetic, each
// output element rounded once. Widening a bf16 to fp32 is exact, so every bf16 call is checked
// bitwise against bf16(x), x the output of the same kernel called with float views of the widened
// values (prefill, the CP positions prefill, decode over a contiguous and a paged bf16 cache, the
// partial decode and its lse), and against the double reference within what the one rounding of
// the output allows. attention_merge of bf16 partials (float lse) is checked against full decode,
// and the argument checks still name the caller's bf16 arguments.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <relayout/kernels.hpp>
#include <type_traits>
#include <vector>

#include "support.hpp"

namespace {

using namespace kt;
using relayout::bf16;
using Exec = Kokkos::DefaultHostExecutionSpace;
using Mem = Exec::memory_space;
using F = Case<Exec, float>;  // make_ints and the float views of support.hpp
template <class T>
using Rows = relayout::RowsView<T, Mem>;

std::vector<int> lengths_to_offsets(const std::vector<int>& lens) {
  std::vector<int> cu{0};
  for (int l : lens) cu.push_back(cu.back() + l);
  return cu;
}

// Random values in [-1, 1) rounded to bf16 (nearest even): the bf16 rows, the same values widened
// into float rows, and as a double matrix for the reference.
struct Bf16Rows {
  Rows<bf16> bf;
  Rows<float> f32;
  rr::Matrix matrix;
};
Bf16Rows bf16_rows(int rows, int cols, std::uint32_t seed) {
  const auto values = random_values(std::size_t(rows) * cols, seed);
  Bf16Rows r{Rows<bf16>("bf", rows, cols), Rows<float>("f32", rows, cols), rr::Matrix(rows, cols)};
  auto hb = Kokkos::create_mirror_view(r.bf);
  auto hf = Kokkos::create_mirror_view(r.f32);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) {
      hb(i, j) = bf16(float(values[std::size_t(i) * cols + j]));
      hf(i, j) = float(hb(i, j));
      r.matrix(i, j) = double(hf(i, j));
    }
  Kokkos::deep_copy(r.bf, hb);
  Kokkos::deep_copy(r.f32, hf);
  return r;
}

// bf16 rows as doubles (exact).
template <class V>
rr::Matrix widened(const V& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  rr::Matrix m(int(v.extent(0)), int(v.extent(1)));
  for (int i = 0; i < m.rows; ++i)
    for (int j = 0; j < m.cols; ++j) m(i, j) = double(float(h(i, j)));
  return m;
}

// Elements (i, j) of two views of one shape where differ(a(i, j), b(i, j)).
template <class A, class B, class Differ>
int count_differing(const A& a, const B& b, Differ differ) {
  REQUIRE(a.extent(0) == b.extent(0));
  REQUIRE(a.extent(1) == b.extent(1));
  auto ha = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), a);
  auto hb = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b);
  int diffs = 0;
  for (std::size_t i = 0; i < ha.extent(0); ++i)
    for (std::size_t j = 0; j < ha.extent(1); ++j) diffs += differ(ha(i, j), hb(i, j));
  return diffs;
}
// Elements of got (bf16) whose bits are not those of bf16(x(i, j)), x float of the same shape.
template <class G, class X>
int rounding_diffs(const G& got, const X& x) {
  return count_differing(got, x, [](bf16 g, float v) { return g.bits != bf16(v).bits; });
}
// Elements of two views of one scalar type whose bits differ.
template <class A, class B>
int bit_diffs(const A& a, const B& b) {
  return count_differing(a, b, [](const auto& p, const auto& q) { return std::memcmp(&p, &q, sizeof p) != 0; });
}

// Nonzero elements: a kernel that left out untouched (zero-initialised) would pass the bitwise
// comparisons against another untouched view; this catches it.
int nonzero(const rr::Matrix& m) {
  int n = 0;
  for (double v : m.data) n += v != 0.0;
  return n;
}

// The fp32 kernel against the double reference on inputs with |q|, |kv| <= 1 (outputs are convex
// combinations of kv rows, so |out| <= 1), as test_attention.cpp derives it: 4 eps (D + L + 8).
double fp32_tol(int head_dim, int keys) { return 4 * eps_of<float>() * (head_dim + keys + 8); }

// bf16 has 8 significant bits: rounding x to nearest even moves it by at most u |x|, u = 2^-8 (half
// a unit in the last place). A bf16 output is bf16(x), x the fp32 kernel's output over the same
// (exactly widened) inputs, and |x - want| <= fp32_tol; so |bf16(x) - want| <= u |x| + fp32_tol
// <= u |want| + (1 + u) fp32_tol, bounded here by u |want| + 2 fp32_tol.
double bf16_tol(double want, int head_dim, int keys) {
  return std::ldexp(1.0, -8) * std::abs(want) + 2 * fp32_tol(head_dim, keys);
}

TEST_CASE("attention_prefill with bf16 rows is bf16 of the fp32 kernel over the widened rows") {
  Exec exec;
  const std::vector<int> lens = {37, 64, 5};  // 37 and 5: not multiples of the 32-key chunk
  const std::vector<int> cu = lengths_to_offsets(lens);
  const int rows = cu.back(), head_dim = 64;
  std::uint32_t seed = 52000;
  for (int heads : {1, 4, 8})
    for (int window : {0, 9}) {
      CAPTURE(heads);
      CAPTURE(window);
      const auto q = bf16_rows(rows, heads * head_dim, seed++);
      const auto kv = bf16_rows(rows, head_dim, seed++);
      Rows<bf16> out("out", rows, heads * head_dim);
      Rows<float> out32("out32", rows, heads * head_dim);
      const double scale = rk::default_softmax_scale(head_dim);
      const rk::AttentionParams p{head_dim, scale, window};
      rk::attention_prefill(exec, q.bf, kv.bf, make_ints<F>(cu), out, p);
      rk::attention_prefill(exec, q.f32, kv.f32, make_ints<F>(cu), out32, p);
      // Widening is exact and the fp32 kernel is the same one: each element is bf16(x) exactly.
      CHECK(rounding_diffs(out, out32) == 0);
      const rr::Matrix got = widened(out);
      CHECK(nonzero(got) > got.rows * got.cols / 2);
      const rr::Matrix want = rr::attention_prefill(q.matrix, kv.matrix, cu, head_dim, scale, window);
      check_close(got, want, [&](int i, int j) { return bf16_tol(want(i, j), head_dim, 64); }, "bf16 prefill");
    }
}

// Attention context parallelism with bf16 rows: query rows at positions (every third token, and a
// run across the requests' boundaries) equal those rows of the full bf16 prefill, bit for bit.
TEST_CASE("attention_prefill at positions with bf16 rows equals those rows of the full prefill") {
  Exec exec;
  const std::vector<int> cu = lengths_to_offsets({37, 64, 5});
  const int rows = cu.back(), heads = 4, head_dim = 64, HD = heads * head_dim;
  const auto q = bf16_rows(rows, HD, 53000);
  const auto kv = bf16_rows(rows, head_dim, 53001);
  std::vector<int> strided, run;
  for (int i = 1; i < rows; i += 3) strided.push_back(i);
  for (int i = 30; i < 45; ++i) run.push_back(i);
  for (int window : {0, 9}) {
    CAPTURE(window);
    const rk::AttentionParams p{head_dim, rk::default_softmax_scale(head_dim), window};
    Rows<bf16> full("full", rows, HD);
    rk::attention_prefill(exec, q.bf, kv.bf, make_ints<F>(cu), full, p);
    const auto hfull = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), full);
    const auto hq = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), q.bf);
    for (const std::vector<int>& pos : {strided, run}) {
      const int n = int(pos.size());
      CAPTURE(n);
      Rows<bf16> q_mine("q_mine", n, HD);
      auto hm = Kokkos::create_mirror_view(q_mine);
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < HD; ++j) hm(i, j) = hq(pos[std::size_t(i)], j);
      Kokkos::deep_copy(q_mine, hm);
      Rows<bf16> out("out", n, HD);
      rk::attention_prefill(exec, q_mine, kv.bf, make_ints<F>(cu), make_ints<F>(pos), out, p);
      const auto ho = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
      int diffs = 0, zeros = 0;
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < HD; ++j) {
          diffs += ho(i, j).bits != hfull(pos[std::size_t(i)], j).bits;
          zeros += ho(i, j).bits == 0;
        }
      CHECK(diffs == 0);
      CHECK(zeros < n * HD / 2);
    }
  }
}

TEST_CASE("attention_decode with bf16 q and out over a bf16 cache is bf16 of the float-q decode") {
  Exec exec;
  const std::vector<int> lens = {37, 64, 5};
  const std::vector<int> cu = lengths_to_offsets(lens);
  const int reqs = int(lens.size()), head_dim = 64;
  const double scale = rk::default_softmax_scale(head_dim);
  std::uint32_t seed = 54000;
  for (int heads : {1, 4, 8}) {
    CAPTURE(heads);
    const int HD = heads * head_dim;
    const auto q = bf16_rows(reqs, HD, seed++);
    Rows<bf16> out("out", reqs, HD);
    Rows<float> out32("out32", reqs, HD);
    // Contiguous cache (3 spare rows after the last request).
    const auto cache = bf16_rows(cu.back() + 3, head_dim, seed++);
    for (int splits : {0, 1, 3})
      for (int window : {0, 9}) {
        CAPTURE(splits);
        CAPTURE(window);
        const rk::AttentionParams p{head_dim, scale, window, splits};
        rk::attention_decode(exec, q.bf, cache.bf, make_ints<F>(cu), out, p);
        rk::attention_decode(exec, q.f32, cache.bf, make_ints<F>(cu), out32, p);
        CHECK(rounding_diffs(out, out32) == 0);
        const rr::Matrix got = widened(out);
        CHECK(nonzero(got) > got.rows * got.cols / 2);
        const rr::Matrix want = rr::attention_decode(q.matrix, cache.matrix, cu, head_dim, scale, window);
        check_close(got, want, [&](int i, int j) { return bf16_tol(want(i, j), head_dim, 64); },
                    "bf16 decode, contiguous cache");
      }
    // Paged cache: blocks of 16, the requests filled in interleaved pieces of 11 rows (so their
    // blocks interleave in the pool), query rows reading the slots in another order.
    rk::PagedKvCache<bf16, Mem> paged({1, head_dim, 16, 16, reqs, 8});
    const auto kv = bf16_rows(cu.back(), head_dim, seed++);
    for (int start = 0; start < 64; start += 11)
      for (int b = 0; b < reqs; ++b) {
        const int n = std::min(11, lens[std::size_t(b)] - start);
        if (n <= 0) continue;
        const int first = cu[std::size_t(b)] + start;
        paged.append(exec, 0, b, Kokkos::subview(kv.bf, Kokkos::make_pair(first, first + n), Kokkos::ALL));
      }
    const std::vector<int> slots = {2, 0, 1};
    rr::Matrix kv_slots(cu.back(), head_dim);  // the rows in query-row order, for the reference
    std::vector<int> cu_slots{0};
    for (int s : slots) {
      for (int i = 0; i < lens[std::size_t(s)]; ++i)
        for (int d = 0; d < head_dim; ++d) kv_slots(cu_slots.back() + i, d) = kv.matrix(cu[std::size_t(s)] + i, d);
      cu_slots.push_back(cu_slots.back() + lens[std::size_t(s)]);
    }
    for (int splits : {0, 3})
      for (int window : {0, 9}) {
        CAPTURE(splits);
        CAPTURE(window);
        const rk::AttentionParams p{head_dim, scale, window, splits};
        rk::attention_decode(exec, q.bf, paged.view(0, make_ints<F>(slots)), out, p);
        rk::attention_decode(exec, q.f32, paged.view(0, make_ints<F>(slots)), out32, p);
        CHECK(rounding_diffs(out, out32) == 0);
        const rr::Matrix got = widened(out);
        CHECK(nonzero(got) > got.rows * got.cols / 2);
        const rr::Matrix want = rr::attention_decode(q.matrix, kv_slots, cu_slots, head_dim, scale, window);
        check_close(got, want, [&](int i, int j) { return bf16_tol(want(i, j), head_dim, 64); },
                    "bf16 decode, paged cache");
      }
  }
}

// Two CP shards of every request's keys (the first ceil(L/2) positions, the rest; request 2's lone
// key leaves shard 1 without one), partial decode with bf16 q and out and a float lse on each, the
// partials merged in bf16, against decode over all the keys.
TEST_CASE("attention_decode_partial and attention_merge with bf16 partials and a float lse") {
  Exec exec;
  const std::vector<int> lens = {37, 64, 1};
  const std::vector<int> cu = lengths_to_offsets(lens);
  const int n = int(lens.size()), P = 2, heads = 4, head_dim = 64, HD = heads * head_dim;
  const double scale = rk::default_softmax_scale(head_dim);
  const auto q = bf16_rows(n, HD, 55000);
  const auto kv = bf16_rows(cu.back(), head_dim, 55001);
  const std::vector<int> slots = {0, 1, 2};
  const rk::KvCacheShape shape{1, head_dim, 16, 16, n, 8};
  rk::PagedKvCache<bf16, Mem> all(shape);
  for (int b = 0; b < n; ++b)
    all.append(exec, 0, b, Kokkos::subview(kv.bf, Kokkos::make_pair(cu[std::size_t(b)], cu[std::size_t(b) + 1]), Kokkos::ALL));
  for (int splits : {1, 3}) {
    CAPTURE(splits);
    const rk::AttentionParams p{head_dim, scale, 0, splits};
    Rows<bf16> parts("parts", P * n, HD);
    Rows<float> lses("lses", P * n, heads);
    for (int s = 0; s < P; ++s) {
      CAPTURE(s);
      rk::PagedKvCache<bf16, Mem> shard(shape);
      for (int b = 0; b < n; ++b) {
        const int half = (lens[std::size_t(b)] + 1) / 2;
        const int lo = cu[std::size_t(b)] + (s == 0 ? 0 : half), hi = s == 0 ? cu[std::size_t(b)] + half : cu[std::size_t(b) + 1];
        if (hi > lo) shard.append(exec, 0, b, Kokkos::subview(kv.bf, Kokkos::make_pair(lo, hi), Kokkos::ALL));
      }
      const auto view = shard.view(0, make_ints<F>(slots));
      const auto first = make_ints<F>({0, 0, 0});
      Rows<bf16> out("out", n, HD);
      Rows<float> lse("lse", n, heads);
      Rows<float> out32("out32", n, HD), lse32("lse32", n, heads);
      static_assert(std::is_same_v<rk::scalar_of<decltype(lse)>, float>);  // bf16 out, float lse
      rk::attention_decode_partial(exec, q.bf, view, first, out, lse, p);
      rk::attention_decode_partial(exec, q.f32, view, first, out32, lse32, p);
      // The normalised partial rows are rounded once; the lse is written by the fp32 kernel as is.
      CHECK(rounding_diffs(out, out32) == 0);
      CHECK(bit_diffs(lse, lse32) == 0);
      const auto hl = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), lse);
      for (int b = 0; b < n; ++b)
        for (int h = 0; h < heads; ++h) {
          const bool has_keys = s == 0 || lens[std::size_t(b)] > 1;
          CHECK((has_keys ? std::isfinite(hl(b, h)) : (std::isinf(hl(b, h)) && hl(b, h) < 0)));
        }
      Kokkos::deep_copy(Kokkos::subview(parts, Kokkos::make_pair(s * n, (s + 1) * n), Kokkos::ALL), out);
      Kokkos::deep_copy(Kokkos::subview(lses, Kokkos::make_pair(s * n, (s + 1) * n), Kokkos::ALL), lse);
    }
    Rows<bf16> merged("merged", n, HD), full("full", n, HD);
    rk::attention_merge(exec, parts, lses, merged);
    rk::attention_decode(exec, q.bf, all.view(0, make_ints<F>(slots)), full, p);
    // The merge is fp32 over the widened partials, rounded once: bf16 of the fp32 merge of the
    // same float values.
    Rows<float> merged32("merged32", n, HD);
    Rows<float> parts32("parts32", P * n, HD);
    {
      auto hp = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), parts);
      auto h32 = Kokkos::create_mirror_view(parts32);
      for (int i = 0; i < P * n; ++i)
        for (int j = 0; j < HD; ++j) h32(i, j) = float(hp(i, j));
      Kokkos::deep_copy(parts32, h32);
    }
    rk::attention_merge(exec, parts32, lses, merged32);
    CHECK(rounding_diffs(merged, merged32) == 0);
    // merged against full decode. Let y_s be shard s's fp32 partial row and x the fp32 full decode;
    // the stored partials are bf16(y_s), each within u |y_s| (u = 2^-8, half a bf16 ulp) of y_s.
    // The merge weights w_s >= 0 sum to 1, so the fp32 merge z of the rounded partials lies within
    // u sum_s w_s |y_s| <= u max_s |y_s| of sum_s w_s y_s, which is x up to fp32 error. merged =
    // bf16(z) and full = bf16(x) add u |z| and u |x| more: |merged - full| <= u (max_s |y_s| + 2
    // |full|) + fp32 slack (|y_s| <= (1 + u) |bf16(y_s)|, folded into the slack) -- about 2 bf16
    // ulps where the partials do not cancel (|y_s| ~ |x|); more, relative to |full|, where they do.
    const rr::Matrix m = widened(merged), f = widened(full), pr = widened(parts);
    CHECK(nonzero(m) > m.rows * m.cols / 2);
    const double u = std::ldexp(1.0, -8);
    check_close(m, f,
                [&](int b, int j) {
                  double big = 0;
                  for (int s = 0; s < P; ++s) big = std::max(big, std::abs(pr(s * n + b, j)));
                  return u * (big + 2 * std::abs(f(b, j))) + 4 * fp32_tol(head_dim, 64);
                },
                "merged bf16 partials against full bf16 decode");
    // And against the double reference of decode over all the keys (one more u |want| on top).
    const rr::Matrix want = rr::attention_decode(q.matrix, kv.matrix, cu, head_dim, scale, 0);
    check_close(m, want,
                [&](int b, int j) {
                  double big = 0;
                  for (int s = 0; s < P; ++s) big = std::max(big, std::abs(pr(s * n + b, j)));
                  return u * (big + std::abs(want(b, j))) + 4 * fp32_tol(head_dim, 64);
                },
                "merged bf16 partials against the double reference");
  }
}

TEST_CASE("attention with bf16 rows checks the caller's arguments") {
  Exec exec;
  const int head_dim = 8, heads = 2, HD = heads * head_dim;
  const auto q = bf16_rows(2, HD, 56000);
  const auto kv = bf16_rows(6, head_dim, 56001);
  Rows<bf16> out("out", 2, HD), bad_out("bad_out", 2, HD / 2);
  const rk::AttentionParams p{head_dim, rk::default_softmax_scale(head_dim), 0};
  const auto q6 = bf16_rows(6, HD, 56002);
  Rows<bf16> out6("out6", 6, HD), bad_out6("bad_out6", 6, HD + 1);
  CHECK_NOTHROW(rk::attention_prefill(exec, q6.bf, kv.bf, make_ints<F>({0, 2, 6}), out6, p));
  CHECK_THROWS_WITH_AS(rk::attention_prefill(exec, q6.bf, kv.bf, make_ints<F>({0, 2, 6}), bad_out6, p),
                       doctest::Contains("attention_prefill: out: must have q's shape 6 x 16"), rk::KernelError);
  CHECK_THROWS_WITH_AS(
      rk::attention_prefill(exec, q.bf, kv.bf, make_ints<F>({0, 2, 6}), make_ints<F>({1, 5}), bad_out, p),
      doctest::Contains("attention_prefill: out: must have q's shape 2 x 16"), rk::KernelError);
  CHECK_THROWS_WITH_AS(rk::attention_prefill(exec, q6.bf, kv.bf, make_ints<F>({0, 2, 5}), out6, p),
                       doctest::Contains("cu_seqlens: last entry must equal the kv rows 6"), rk::KernelError);
  CHECK_NOTHROW(rk::attention_decode(exec, q.bf, kv.bf, make_ints<F>({0, 2, 6}), out, p));
  CHECK_THROWS_WITH_AS(rk::attention_decode(exec, q.bf, kv.bf, make_ints<F>({0, 2, 6}), bad_out, p),
                       doctest::Contains("attention_decode: out: must have q's shape 2 x 16"), rk::KernelError);
  rk::PagedKvCache<bf16, Mem> paged({1, head_dim, 4, 8, 2, 4});
  paged.append(exec, 0, 0, Kokkos::subview(kv.bf, Kokkos::make_pair(0, 3), Kokkos::ALL));
  paged.append(exec, 0, 1, Kokkos::subview(kv.bf, Kokkos::make_pair(3, 6), Kokkos::ALL));
  const auto view = paged.view(0, make_ints<F>({0, 1}));
  CHECK_NOTHROW(rk::attention_decode(exec, q.bf, view, out, p));
  CHECK_THROWS_WITH_AS(rk::attention_decode(exec, q.bf, view, bad_out, p),
                       doctest::Contains("attention_decode: out: must have q's shape 2 x 16"), rk::KernelError);
  Rows<float> lse("lse", 2, heads);
  CHECK_THROWS_WITH_AS(rk::attention_decode_partial(exec, q.bf, view, make_ints<F>({0, 0}), bad_out, lse, p),
                       doctest::Contains("attention_decode_partial: out: must have q's shape 2 x 16"),
                       rk::KernelError);
  CHECK_THROWS_WITH_AS(
      rk::attention_decode_partial(exec, q.bf, view, make_ints<F>({0, 0}), out, Rows<float>("l", 2, 3), p),
      doctest::Contains("lse: must be 2 x 2 (query rows x heads), got 2 x 3"), rk::KernelError);
  Rows<bf16> parts("parts", 4, HD);
  Rows<float> lses("lses", 4, heads);
  CHECK_NOTHROW(rk::attention_merge(exec, parts, lses, out));
  CHECK_THROWS_WITH_AS(rk::attention_merge(exec, parts, lses, bad_out),
                       doctest::Contains("attention_merge: partials: must have out's 8 columns, got 16"),
                       rk::KernelError);
  CHECK_THROWS_WITH_AS(rk::attention_merge(exec, Rows<bf16>("p", 5, HD), Rows<float>("l", 5, heads), out),
                       doctest::Contains("must hold P x 2 rows"), rk::KernelError);
}

}  // namespace
