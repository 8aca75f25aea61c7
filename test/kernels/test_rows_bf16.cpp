// bf16 rows through the kernels (compute_t<bf16> = float arithmetic, each stored value rounded
// once to nearest even): rms_norm and add_rms_norm, linear with fp32 outputs, SwiGLU experts (dense,
// grouped, indexed), the router and the weighted combine, each against a double reference of the
// same bf16 inputs within a bound derived from bf16 rounding (u = 2^-8, relative, per rounding).
#include <doctest/doctest.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <relayout/kernels.hpp>
#include <relayout/relayout.hpp>
#include <string>
#include <vector>

#include "tolerance.hpp"

using relayout::test::within_abs;
using relayout::test::within_rel;

namespace {

namespace rk = relayout::kernels;
using relayout::bf16;
using Exec = Kokkos::DefaultHostExecutionSpace;
using Mem = Exec::memory_space;
using Rows16 = relayout::RowsView<bf16, Exec>;
using RowsF = relayout::RowsView<float, Exec>;

constexpr double kU = 1.0 / 256;           // bf16 rounding, relative (2^-8)
constexpr double kEps32 = 1.0 / 16777216;  // fp32 rounding (2^-24)

double d(bf16 v) { return double(float(v)); }

Rows16 random_rows(int rows, int cols, std::uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  Rows16 m("m", std::size_t(rows), std::size_t(cols));
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) m(i, j) = bf16(dist(gen));
  return m;
}

template <class V>
V copy_of(const V& v) {
  V c(v.label() + "_copy", v.extent(0), v.extent(1));
  Kokkos::deep_copy(c, v);
  return c;
}

TEST_CASE("compute_t: float for the 16-bit storage types, the type itself otherwise") {
  static_assert(std::is_same_v<relayout::compute_t<bf16>, float>);
  static_assert(std::is_same_v<relayout::compute_t<relayout::fp16>, float>);
  static_assert(std::is_same_v<relayout::compute_t<float>, float>);
  static_assert(std::is_same_v<relayout::compute_t<double>, double>);
  static_assert(std::is_same_v<relayout::TopK<bf16, Exec>::weight_type, float>);
  CHECK(relayout::EpMessage::of<float, bf16>(8, 7168).weights == 0);
  CHECK(relayout::EpMessage::of<float, bf16>(8, 7168).ids == 32);  // 8 fp32 weights
}

// The vector forms of the conversions give the scalar rule's bits on every lane: ties to even,
// NaN kept quiet, infinities, signed zeros, subnormals, values that round up into the next binade.
TEST_CASE("load_key and store_bf16 in vectors give the scalar conversions' bits") {
  namespace ri = rk::impl;
  constexpr int L = ri::lanes_v<Exec, float>;
  using V = typename ri::Vec<float, L>::type;
  std::vector<std::uint32_t> bits = {0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x3f808001u, 0x7f800000u, 0xff800000u,
                                     0x7fc00001u, 0x7f800001u, 0xff812345u, 0x80000000u, 0x00000000u, 0x00008000u,
                                     0x00018000u, 0x807fffffu, 0x7f7fffffu, 0x3fffffffu, 0xbf7fffffu, 0x4049b6dbu};
  std::mt19937 gen(71u);
  while (bits.size() % std::size_t(L) != 0 || bits.size() < 64) bits.push_back(std::uint32_t(gen()));
  int bad_store = 0, bad_load = 0;
  for (std::size_t at = 0; at < bits.size(); at += std::size_t(L)) {
    float in[L];
    for (int l = 0; l < L; ++l) std::memcpy(&in[l], &bits[at + std::size_t(l)], sizeof(float));
    bf16 out[L];
    ri::store_bf16<L>(out, ri::load<V>(in));
    for (int l = 0; l < L; ++l) bad_store += out[l].bits != bf16(in[l]).bits;
    float back[L];
    ri::store<V>(back, ri::load_key<V>(out));
    for (int l = 0; l < L; ++l) {
      std::uint32_t b;
      std::memcpy(&b, &back[l], sizeof b);
      bad_load += b != std::uint32_t(out[l].bits) << 16;
    }
  }
  CHECK(bad_store == 0);
  CHECK(bad_load == 0);
}

// y = x / sqrt(mean(x^2) + eps) * w, every value rounded once: |y - ref| <= u |ref| plus the fp32
// arithmetic before it (a sum of n squares and three products: (n + 4) 2^-24 relative).
TEST_CASE("rms_norm on bf16 rows, with bf16 and with fp32 weights, matches the double reference") {
  Exec exec;
  for (const int n : {7, 64, 160}) {
    CAPTURE(n);
    const auto x = random_rows(9, n, 11u + n, -3.0f, 3.0f);
    const auto w16 = random_rows(1, n, 12u + n, 0.5f, 1.5f);
    Kokkos::View<bf16*, Mem> wb("wb", std::size_t(n));
    Kokkos::View<float*, Mem> wf("wf", std::size_t(n));
    for (int j = 0; j < n; ++j) {
      wb(j) = w16(0, j);
      wf(j) = float(w16(0, j)) * 1.0078125f;  // not a bf16 value: 1 + 2^-7 multiplies in 8 extra bits
    }
    Rows16 yb("yb", 9, std::size_t(n)), yf("yf", 9, std::size_t(n));
    rk::rms_norm(exec, x, wb, 1e-6, yb);
    rk::rms_norm(exec, x, wf, 1e-6, yf);
    exec.fence();
    int bad = 0;
    for (int i = 0; i < 9; ++i) {
      double ss = 0;
      for (int j = 0; j < n; ++j) ss += d(x(i, j)) * d(x(i, j));
      const double inv = 1.0 / std::sqrt(ss / n + 1e-6);
      for (int j = 0; j < n; ++j) {
        const double rb = d(x(i, j)) * inv * d(wb(j)), rf = d(x(i, j)) * inv * double(wf(j));
        const double slack = (n + 4) * kEps32;
        bad += std::abs(d(yb(i, j)) - rb) > (kU + slack) * std::abs(rb);
        bad += std::abs(d(yf(i, j)) - rf) > (kU + slack) * std::abs(rf);
      }
    }
    CHECK(bad == 0);
    // The fp32 weights are used as fp32: rounding them to bf16 first would move some outputs.
    int differ = 0;
    for (int i = 0; i < 9; ++i)
      for (int j = 0; j < n; ++j) differ += !(yb(i, j) == yf(i, j));
    CHECK(differ > 0);
  }
}

// fp32 rows normed straight into bf16 rows: one pass, and bitwise the bf16 rounding of the fp32
// norm (with bf16 or fp32 weights).
TEST_CASE("rms_norm of fp32 rows into bf16 rows is the fp32 norm rounded once") {
  Exec exec;
  for (const int n : {7, 64, 160}) {
    CAPTURE(n);
    RowsF x("x", 5, std::size_t(n));
    std::mt19937 gen(31u + unsigned(n));
    std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
    for (int i = 0; i < 5; ++i)
      for (int j = 0; j < n; ++j) x(i, j) = dist(gen);
    const auto w16 = random_rows(1, n, 32u + n, 0.5f, 1.5f);
    Kokkos::View<bf16*, Mem> wb("wb", std::size_t(n));
    Kokkos::View<float*, Mem> wf("wf", std::size_t(n));
    for (int j = 0; j < n; ++j) {
      wb(j) = w16(0, j);
      wf(j) = float(w16(0, j));
    }
    Rows16 yb("yb", 5, std::size_t(n)), yf16("yf16", 5, std::size_t(n));
    RowsF y32("y32", 5, std::size_t(n));
    rk::rms_norm(exec, x, wb, 1e-6, yb);
    rk::rms_norm(exec, x, wf, 1e-6, yf16);
    rk::rms_norm(exec, x, wf, 1e-6, y32);
    exec.fence();
    int differ = 0, unrounded = 0;
    for (int i = 0; i < 5; ++i)
      for (int j = 0; j < n; ++j) {
        differ += yb(i, j).bits != bf16(y32(i, j)).bits;
        differ += yf16(i, j).bits != bf16(y32(i, j)).bits;
        unrounded += float(yb(i, j)) != y32(i, j);
      }
    CHECK(differ == 0);
    CHECK(unrounded > 0);  // the outputs really are rounded values, not the fp32 ones
  }
}

// convert_rows: widening exact, float -> bf16 / fp16 rounded once to nearest even (the scalar rule,
// on the vector path and on the element path of a strided view alike), double <-> float the C++
// conversion, a shape mismatch refused naming dst.
TEST_CASE("convert_rows: exact widening, one rounding to nearest even, strides honoured") {
  Exec exec;
  const int rows = 6, cols = 37;  // not a multiple of any vector width: the tails run too
  RowsF f("f", rows, cols);
  std::mt19937 gen(5u);
  std::uniform_real_distribution<float> dist(-100.0f, 100.0f);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) f(i, j) = dist(gen);
  // Ties and specials on the first row: the rounding rule, not just "close".
  const std::uint32_t special[] = {0x3f808000u, 0x3f818000u, 0x7f800000u, 0x7fc00001u, 0x80000000u, 0x00018000u, 0x7f7fffffu};
  for (int j = 0; j < 7; ++j) std::memcpy(&f(0, j), &special[j], sizeof(float));

  Rows16 b("b", rows, cols);
  rk::convert_rows(exec, f, b);
  RowsF back("back", rows, cols);
  rk::convert_rows(exec, b, back);
  relayout::RowsView<relayout::fp16, Exec> h("h", rows, cols);
  rk::convert_rows(exec, f, h);
  relayout::RowsView<double, Exec> dd("dd", rows, cols);
  rk::convert_rows(exec, b, dd);
  RowsF f2("f2", rows, cols);
  rk::convert_rows(exec, dd, f2);
  exec.fence();
  int bad_round = 0, bad_widen = 0, bad_half = 0, bad_double = 0;
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) {
      bad_round += b(i, j).bits != bf16(f(i, j)).bits;
      std::uint32_t w;
      std::memcpy(&w, &back(i, j), sizeof w);
      bad_widen += w != std::uint32_t(b(i, j).bits) << 16;
      bad_half += h(i, j).bits != relayout::fp16(f(i, j)).bits;
      if (!std::isnan(back(i, j))) bad_double += dd(i, j) != double(back(i, j)) || f2(i, j) != back(i, j);
    }
  CHECK(bad_round == 0);
  CHECK(bad_widen == 0);
  CHECK(bad_half == 0);
  CHECK(bad_double == 0);
  CHECK(b(0, 0).bits == 0x3f80);  // a tie goes to the even neighbour: down here ...
  CHECK(b(0, 1).bits == 0x3f82);  // ... and up here

  // A column subview (stride(1) == 1, stride(0) == 37) and a transposed one (stride(1) != 1):
  // each element lands where its own indices say, the rest of dst untouched.
  const auto cols_in = Kokkos::subview(f, Kokkos::ALL, Kokkos::make_pair(3, 20));
  Rows16 part("part", rows, cols);
  const bf16 marker = bf16(-7.0f);
  Kokkos::deep_copy(part, marker);
  const auto cols_out = Kokkos::subview(part, Kokkos::ALL, Kokkos::make_pair(10, 27));
  rk::convert_rows(exec, cols_in, cols_out);
  Kokkos::View<float**, Kokkos::LayoutLeft, Mem> left("left", rows, cols);  // column-major
  Kokkos::deep_copy(left, f);
  Rows16 from_left("from_left", rows, cols);
  rk::convert_rows(exec, left, from_left);
  exec.fence();
  int misplaced = 0, touched = 0, bad_left = 0;
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) {
      if (j >= 10 && j < 27) misplaced += part(i, j).bits != bf16(f(i, j - 7)).bits;
      else touched += part(i, j).bits != marker.bits;
      bad_left += from_left(i, j).bits != b(i, j).bits;
    }
  CHECK(misplaced == 0);
  CHECK(touched == 0);
  CHECK(bad_left == 0);

  Rows16 wrong("wrong", rows, cols - 1);
  CHECK_THROWS_WITH_AS(rk::convert_rows(exec, f, wrong), doctest::Contains("dst: must have src's shape 6 x 37"),
                       rk::KernelError);
  static_assert(rk::convertible_rows_v<float, bf16> && rk::convertible_rows_v<bf16, double>);
  static_assert(!rk::convertible_rows_v<double, bf16>);  // would round twice
}

// residual += x is rounded once into the residual; x becomes rms_norm of the stored residual, so it
// is bitwise rms_norm applied to what the residual holds afterwards.
TEST_CASE("add_rms_norm on bf16 rows: the residual is the rounded sum, x the norm of the stored residual") {
  Exec exec;
  const int n = 96;
  const auto x0 = random_rows(6, n, 21u), r0 = random_rows(6, n, 22u, -4.0f, 4.0f);
  const auto w16 = random_rows(1, n, 23u, 0.5f, 1.5f);
  Kokkos::View<bf16*, Mem> w("w", std::size_t(n));
  for (int j = 0; j < n; ++j) w(j) = w16(0, j);
  auto x = copy_of(x0), r = copy_of(r0);
  rk::add_rms_norm(exec, x, r, w, 1e-6);
  Rows16 y("y", 6, std::size_t(n));
  rk::rms_norm(exec, r, w, 1e-6, y);
  exec.fence();
  int bad_sum = 0, bad_norm = 0;
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < n; ++j) {
      // Two bf16 values sum exactly in double; the stored residual is within u of that sum.
      const double s = d(x0(i, j)) + d(r0(i, j));
      bad_sum += std::abs(d(r(i, j)) - s) > kU * std::abs(s);
      bad_norm += !(x(i, j) == y(i, j));
    }
  CHECK(bad_sum == 0);
  CHECK(bad_norm == 0);
}

// bf16 rows and weights into fp32 outputs: no output rounding, only the fp32 sum
// (4 sqrt(k) 2^-24 of sum |x w|); and the bf16 output of the same call is that value rounded once.
TEST_CASE("linear of bf16 rows writes fp32 outputs unrounded, and bf16 outputs are those rounded once") {
  Exec exec;
  for (const int m : {1, 3, 17, 64}) {
    CAPTURE(m);
    const int k = 70, n = 40;
    const auto x = random_rows(m, k, 31u + m), w = random_rows(n, k, 32u);
    const auto bias16 = random_rows(1, n, 33u);
    Kokkos::View<float*, Mem> bias("bias", std::size_t(n));
    Kokkos::View<bf16*, Mem> bias_b("bias_b", std::size_t(n));
    for (int j = 0; j < n; ++j) bias(j) = float(bias16(0, j)), bias_b(j) = bias16(0, j);
    const auto packed = rk::pack_weights(exec, w);
    RowsF yf("yf", std::size_t(m), std::size_t(n));
    Rows16 yb("yb", std::size_t(m), std::size_t(n));
    rk::linear(exec, x, packed, yf, Kokkos::View<const float*, Mem>(bias));
    rk::linear(exec, x, packed, yb, Kokkos::View<const bf16*, Mem>(bias_b));
    exec.fence();
    int bad = 0, unrounded = 0, rounded_differ = 0;
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) {
        double ref = d(bias_b(j)), mag = std::abs(ref);
        for (int q = 0; q < k; ++q) {
          ref += d(x(i, q)) * d(w(j, q));
          mag += std::abs(d(x(i, q)) * d(w(j, q)));
        }
        bad += std::abs(double(yf(i, j)) - ref) > 4 * kEps32 * (std::sqrt(double(k)) + 1) * mag;
        unrounded += float(bf16(yf(i, j))) != yf(i, j);
        rounded_differ += !(bf16(yf(i, j)) == yb(i, j));
      }
    CHECK(bad == 0);
    CHECK(unrounded > 0);  // the fp32 outputs carry bits a bf16 cannot hold
    CHECK(rounded_differ == 0);
  }
}

// The SwiGLU FFN in the test's double arithmetic on the bf16 inputs, with the bound of the bf16
// path: gu rounded (|dg| <= u |g|, |du| <= u |u|), h = silu(g) u rounded, y rounded. With
// |silu'| <= 1.1: |dh| <= u (1.1 |g| |u| + 2 |h|) (+ the fp32 sums of the gate/up GEMM,
// 4 sqrt(hidden) 2^-24 of sum |x w|, absorbed: far below u); |dy| <= sum_c |w2| |dh_c| + u |y| +
// the fp32 down GEMM's 4 sqrt(I) 2^-24 sum |w2 h|.
struct FfnRef {
  std::vector<double> y, tol;
};
FfnRef swiglu_reference(const Rows16& x, const std::vector<int>& rows, const Kokkos::View<bf16***, Kokkos::LayoutRight, Mem>& w1,
                        const Kokkos::View<bf16***, Kokkos::LayoutRight, Mem>& w3,
                        const Kokkos::View<bf16***, Kokkos::LayoutRight, Mem>& w2, const std::vector<int>& expert_of) {
  const int H = int(x.extent(1)), I = int(w1.extent(1));
  FfnRef r;
  for (std::size_t b = 0; b < rows.size(); ++b) {
    const int e = expert_of[b], row = rows[b];
    std::vector<double> h(static_cast<std::size_t>(I)), dh(static_cast<std::size_t>(I));
    for (int c = 0; c < I; ++c) {
      double g = 0, u = 0;
      for (int f = 0; f < H; ++f) {
        g += d(x(row, f)) * d(w1(e, c, f));
        u += d(x(row, f)) * d(w3(e, c, f));
      }
      h[c] = g / (1 + std::exp(-g)) * u;
      dh[c] = kU * (1.1 * std::abs(g) * std::abs(u) + 2 * std::abs(h[c])) + 1e-7;
    }
    for (int f = 0; f < H; ++f) {
      double y = 0, t = 0, mag = 0;
      for (int c = 0; c < I; ++c) {
        y += d(w2(e, f, c)) * h[c];
        t += std::abs(d(w2(e, f, c))) * dh[c];
        mag += std::abs(d(w2(e, f, c)) * h[c]);
      }
      r.y.push_back(y);
      r.tol.push_back(t + kU * std::abs(y) + 4 * kEps32 * (std::sqrt(double(I)) + 1) * mag);
    }
  }
  return r;
}

Kokkos::View<bf16***, Kokkos::LayoutRight, Mem> random_stack(int e, int r, int c, std::uint32_t seed) {
  const auto flat = random_rows(e * r, c, seed, -0.5f, 0.5f);
  Kokkos::View<bf16***, Kokkos::LayoutRight, Mem> s("s", std::size_t(e), std::size_t(r), std::size_t(c));
  for (int a = 0; a < e; ++a)
    for (int i = 0; i < r; ++i)
      for (int j = 0; j < c; ++j) s(a, i, j) = flat(a * r + i, j);
  return s;
}

TEST_CASE("SwiGLU experts on bf16 rows: dense, grouped and indexed, within the bf16 bound, indexed == copied") {
  Exec exec;
  const int H = 48, I = 40, E = 4, N = 23, K = 2;
  const auto x = random_rows(N, H, 41u);
  const auto w1 = random_stack(E, I, H, 42u), w3 = random_stack(E, I, H, 43u), w2 = random_stack(E, H, I, 44u);
  const auto packed = rk::pack_experts(exec, w1, w3, w2);

  SUBCASE("swiglu_ffn, one expert on every row, also accumulating") {
    const auto one = rk::pack_experts(exec, Kokkos::subview(w1, 0, Kokkos::ALL(), Kokkos::ALL()),
                                      Kokkos::subview(w3, 0, Kokkos::ALL(), Kokkos::ALL()),
                                      Kokkos::subview(w2, 0, Kokkos::ALL(), Kokkos::ALL()));
    Rows16 y("y", std::size_t(N), std::size_t(H));
    rk::swiglu_ffn(exec, x, one, y);
    exec.fence();
    std::vector<int> rows(N), ex(N, 0);
    for (int i = 0; i < N; ++i) rows[i] = i;
    const FfnRef ref = swiglu_reference(x, rows, w1, w3, w2, ex);
    int bad = 0;
    for (int i = 0; i < N; ++i)
      for (int f = 0; f < H; ++f) bad += std::abs(d(y(i, f)) - ref.y[std::size_t(i) * H + f]) > ref.tol[std::size_t(i) * H + f];
    CHECK(bad == 0);
    // accumulate: y += FFN(x), the sum in fp32 rounded once: within u of the exact sum of the two
    // bf16 values.
    const auto y0 = copy_of(y);
    rk::swiglu_ffn(exec, x, one, y, true);
    exec.fence();
    int bad_acc = 0;
    for (int i = 0; i < N; ++i)
      for (int f = 0; f < H; ++f) {
        const double want = d(y0(i, f)) + ref.y[std::size_t(i) * H + f];
        bad_acc += std::abs(d(y(i, f)) - want) > ref.tol[std::size_t(i) * H + f] + kU * std::abs(want) + 1e-7;
      }
    CHECK(bad_acc == 0);
  }

  SUBCASE("local_experts: routed rows, weighted in fp32 and rounded once; indexed batch == copied batch") {
    relayout::TopK<bf16, Exec> route(N, K);
    for (int i = 0; i < N; ++i) {
      route.ids(i, 0) = i % E;
      route.ids(i, 1) = (i * 3 + 1) % E == i % E ? (i + 1) % E : (i * 3 + 1) % E;
      route.weights(i, 0) = 0.6f + 0.01f * float(i);  // fp32 weights: not bf16 values
      route.weights(i, 1) = 0.4f - 0.01f * float(i);
    }
    rk::SwigluExperts<bf16, Exec, bf16> experts{packed, {}};
    static_assert(relayout::ReadsIndexedRows<decltype(experts)>);
    struct Copied {  // the same experts, given the copied batch
      rk::SwigluExperts<bf16, Exec, bf16> inner;
      void operator()(const Exec& e, const relayout::ExpertBatch<bf16, Exec>& b, const Rows16& y) const { inner(e, b, y); }
      void shared(const Exec& e, const Rows16& xs, const Rows16& y) const { inner.shared(e, xs, y); }
    } copied{experts};
    Rows16 out("out", std::size_t(N), std::size_t(H)), out_copied("out_copied", std::size_t(N), std::size_t(H));
    relayout::local_experts(exec, x, route, 0, E, E, experts, out);
    relayout::local_experts(exec, x, route, 0, E, E, copied, out_copied);
    int differ = 0, bad = 0;
    for (int i = 0; i < N; ++i)
      for (int f = 0; f < H; ++f) differ += !(out(i, f) == out_copied(i, f));
    CHECK(differ == 0);
    // Each expert output is rounded to bf16 (within its FFN bound), then the weighted sum in fp32
    // is rounded once: |d| <= sum_k w_k (tol_k + u |y_k|) + u |sum|.
    for (int i = 0; i < N; ++i) {
      const FfnRef r0 = swiglu_reference(x, {i}, w1, w3, w2, {route.ids(i, 0)});
      const FfnRef r1 = swiglu_reference(x, {i}, w1, w3, w2, {route.ids(i, 1)});
      for (int f = 0; f < H; ++f) {
        const double w0 = route.weights(i, 0), wt1 = route.weights(i, 1);
        const double want = w0 * r0.y[f] + wt1 * r1.y[f];
        const double tol = w0 * (r0.tol[f] + kU * std::abs(r0.y[f])) + wt1 * (r1.tol[f] + kU * std::abs(r1.y[f])) +
                           kU * std::abs(want) + 1e-7;
        bad += std::abs(d(out(i, f)) - want) > tol;
      }
    }
    CHECK(bad == 0);
  }
}

// The router on bf16 rows: fp32 logits from the bf16 gate (unrounded), fp32 weights. Rows whose
// top-k is decided by less than the logits' error bound are not compared by id.
TEST_CASE("LinearTopkRouter on bf16 rows: fp32 logits and weights, the reference's top-k") {
  Exec exec;
  const int H = 64, E = 12, N = 40;
  const auto x = random_rows(N, H, 51u), gate = random_rows(E, H, 52u);
  rk::LinearTopkRouter<bf16, Exec, bf16> router{rk::pack_weights(exec, gate),
                                               rk::RouterConfig{.top_k = 3, .scoring = rk::Scoring::softmax}};
  relayout::TopK<bf16, Exec> out(N, 3);
  router(exec, x, out);
  exec.fence();
  int compared = 0, bad_ids = 0, bad_w = 0;
  for (int i = 0; i < N; ++i) {
    std::vector<double> logit(E);
    double bound = 0;
    for (int e = 0; e < E; ++e) {
      double mag = 0;
      for (int f = 0; f < H; ++f) {
        logit[e] += d(x(i, f)) * d(gate(e, f));
        mag += std::abs(d(x(i, f)) * d(gate(e, f)));
      }
      bound = std::max(bound, 4 * kEps32 * (std::sqrt(double(H)) + 1) * mag);
    }
    std::vector<int> order(E);
    for (int e = 0; e < E; ++e) order[e] = e;
    std::sort(order.begin(), order.end(), [&](int a, int b) { return logit[a] > logit[b]; });
    bool near_tie = false;
    for (int p = 0; p < 3; ++p) near_tie |= logit[order[p]] - logit[order[p + 1]] <= 2 * bound;
    if (near_tie) continue;
    ++compared;
    double mx = logit[order[0]], sum = 0, chosen = 0;
    for (int e = 0; e < E; ++e) sum += std::exp(logit[e] - mx);
    for (int p = 0; p < 3; ++p) chosen += std::exp(logit[order[p]] - mx) / sum;
    for (int p = 0; p < 3; ++p) {
      bad_ids += out.ids(i, p) != order[p];
      const double w = std::exp(logit[order[p]] - mx) / sum / chosen;  // renormalised
      bad_w += std::abs(double(out.weights(i, p)) - w) > 1e-5;
    }
  }
  CHECK(compared >= N / 2);
  CHECK(bad_ids == 0);
  CHECK(bad_w == 0);
}

// route() on bf16 logits computes on their exact fp32 widening: bitwise route() on those floats.
TEST_CASE("route on bf16 logits is route on their fp32 widening, bitwise") {
  Exec exec;
  const int E = 16, N = 20;
  const auto logits = random_rows(N, E, 61u, -2.0f, 2.0f);
  RowsF wide("wide", std::size_t(N), std::size_t(E));
  for (int i = 0; i < N; ++i)
    for (int e = 0; e < E; ++e) wide(i, e) = float(logits(i, e));
  Kokkos::View<float*, Mem> bias("bias", std::size_t(E));
  for (int e = 0; e < E; ++e) bias(e) = 0.01f * float(e % 5);
  const rk::RouterConfig cfg{.top_k = 4, .scoring = rk::Scoring::sigmoid, .n_group = 4, .topk_group = 2,
                             .renormalize = true, .routed_scaling_factor = 2.5};
  Kokkos::View<int**, Kokkos::LayoutRight, Mem> ids16("ids16", N, 4), ids32("ids32", N, 4);
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> w16("w16", N, 4), w32("w32", N, 4);
  rk::route(exec, logits, cfg, ids16, w16, Kokkos::View<const float*, Mem>(bias));
  rk::route(exec, wide, cfg, ids32, w32, Kokkos::View<const float*, Mem>(bias));
  exec.fence();
  int differ = 0;
  double total = 0;
  for (int i = 0; i < N; ++i)
    for (int p = 0; p < 4; ++p) {
      differ += ids16(i, p) != ids32(i, p) || w16(i, p) != w32(i, p);
      total += w16(i, p);
    }
  CHECK(differ == 0);
  CHECK(total == within_rel(2.5 * N, 1e-5));  // renormalised, then scaled
}

}  // namespace
