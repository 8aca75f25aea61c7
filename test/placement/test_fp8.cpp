// FP8 E4M3: every code against the format's definition, rounding against a nearest-value search
// written out here, hand-computed ties, saturation, subnormals, and the documented error bound of
// a block (|x^ - x| <= 2^-4 |x| + 2^-10 s per value, <= amax / 28 over a block) for the row kernels.
#include <doctest/doctest.h>

#include <Kokkos_Core.hpp>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <relayout/placement/fp8.hpp>
#include <vector>

using namespace relayout;

namespace {

std::uint8_t enc(float f) { return fp8_e4m3(f).bits; }
float dec(std::uint8_t b) { return static_cast<float>(fp8_e4m3::from_bits(b)); }

// The value of a code from the format's definition: (-1)^s * 2^(e-7) * (1 + m/8), subnormal
// (-1)^s * 2^-6 * m/8; S.1111.111 is NaN.
double definition(int code) {
  const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}

// Round to nearest by search over the finite codes, ties to the even code (even mantissa), and
// saturation at 448: the conversion written as its specification.
std::uint8_t nearest(float f) {
  if (std::isnan(f)) return 0x7f;
  const int sign = std::signbit(f) ? 0x80 : 0;
  const double a = std::fabs(static_cast<double>(f));
  int best = 0;
  for (int c = 1; c <= 0x7e; ++c) {
    const double d = std::fabs(definition(c) - a), db = std::fabs(definition(best) - a);
    if (d < db || (d == db && c % 2 == 0)) best = c;
  }
  return static_cast<std::uint8_t>(sign | best);
}

}  // namespace

TEST_CASE("fp8 e4m3: every code decodes as the format defines and encodes back to itself") {
  int finite = 0;
  for (int c = 0; c < 256; ++c) {
    const auto b = static_cast<std::uint8_t>(c);
    const float v = dec(b);
    const double want = definition(c);
    if (std::isnan(want)) {
      CHECK(std::isnan(v));
      CHECK(fp8_e4m3::from_bits(b).is_nan());
      CHECK((enc(v) & 0x7f) == 0x7f);  // NaN stays NaN
      continue;
    }
    ++finite;
    CHECK(static_cast<double>(v) == want);
    CHECK(std::signbit(v) == (c >= 0x80));  // -0 too
    CHECK(enc(v) == b);
    CHECK_FALSE(fp8_e4m3::from_bits(b).is_nan());
  }
  CHECK(finite == 254);
  CHECK(dec(0x7e) == 448.0f);
  CHECK(dec(0x08) == 0x1p-6f);
  CHECK(dec(0x01) == 0x1p-9f);
  CHECK(std::isnan(dec(0x7f)));
  CHECK(std::isnan(dec(0xff)));
  CHECK((enc(std::numeric_limits<float>::quiet_NaN()) & 0x7f) == 0x7f);
  CHECK(enc(-std::numeric_limits<float>::quiet_NaN()) == 0xff);
}

TEST_CASE("fp8 e4m3: ties round to the even mantissa (values worked out by hand)") {
  CHECK(enc(1.0625f) == 0x38);   // 1 + 1/16 lies between 1.0 (m 0) and 1.125 (m 1): 1.0
  CHECK(enc(1.1875f) == 0x3a);   // between 1.125 (m 1) and 1.25 (m 2): 1.25
  CHECK(enc(std::nextafter(1.0625f, 2.0f)) == 0x39);  // just past the tie: up
  CHECK(enc(std::nextafter(1.1875f, 0.0f)) == 0x39);  // just before the tie: down
  CHECK(enc(-1.0625f) == 0xb8);
  CHECK(enc(248.0f) == 0x78);    // between 240 (e 14, m 7) and 256 (e 15, m 0): 256
  CHECK(enc(400.0f) == 0x7c);    // between 384 (m 4) and 416 (m 5): 384
  CHECK(enc(432.0f) == 0x7e);    // between 416 (m 5) and 448 (m 6): 448
  CHECK(enc(0x1p-10f) == 0x00);  // half the smallest subnormal: to the even 0
  CHECK(enc(3 * 0x1p-10f) == 0x02);  // 1.5 * 2^-9: 2 * 2^-9
  CHECK(enc(5 * 0x1p-10f) == 0x02);  // 2.5 * 2^-9: 2 * 2^-9
  CHECK(enc(15 * 0x1p-10f) == 0x08); // 7.5 * 2^-9, between the largest subnormal and 2^-6: 2^-6
  CHECK(enc(0x1.1p-6f) == 0x08);     // 2^-6 * (1 + 1/16): tie down to m 0
}

TEST_CASE("fp8 e4m3: values beyond 448 saturate, infinities too") {
  CHECK(enc(448.0f) == 0x7e);
  CHECK(enc(449.0f) == 0x7e);
  CHECK(enc(464.0f) == 0x7e);  // the tie with 480, which would be the NaN code
  CHECK(enc(1e10f) == 0x7e);
  CHECK(enc(std::numeric_limits<float>::max()) == 0x7e);
  CHECK(enc(std::numeric_limits<float>::infinity()) == 0x7e);
  CHECK(enc(-500.0f) == 0xfe);
  CHECK(enc(-std::numeric_limits<float>::infinity()) == 0xfe);
}

TEST_CASE("fp8 e4m3: subnormals") {
  CHECK(enc(0x1p-9f) == 0x01);
  CHECK(enc(3 * 0x1p-9f) == 0x03);
  CHECK(enc(7 * 0x1p-9f) == 0x07);
  CHECK(enc(0.9f * 0x1p-10f) == 0x00);
  CHECK(enc(1.1f * 0x1p-10f) == 0x01);
  CHECK(enc(1e-45f) == 0x00);    // a float subnormal
  CHECK(enc(-1e-45f) == 0x80);   // keeps its sign
  CHECK(enc(0.0f) == 0x00);
  CHECK(enc(-0.0f) == 0x80);
}

TEST_CASE("fp8 e4m3: the conversion is the nearest code for random floats and every midpoint") {
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> expo(-13.0f, 10.0f), mant(1.0f, 2.0f);
  int mismatches = 0;
  for (int i = 0; i < 4000; ++i) {
    const float f = std::ldexp(mant(gen), static_cast<int>(std::floor(expo(gen)))) * (i % 2 ? -1.0f : 1.0f);
    mismatches += enc(f) != nearest(f);
  }
  for (int c = 0; c < 0x7e; ++c) {  // the midpoint between neighbours and the floats on either side
    const auto mid = static_cast<float>((definition(c) + definition(c + 1)) / 2);
    for (float f : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1000.0f)})
      mismatches += enc(f) != nearest(f);
  }
  CHECK(mismatches == 0);
}

namespace {

// The documented bound for one value of a block with scale s (docs/bridge.md, "FP8 dispatch").
double value_bound(double x, double s) { return (0x1p-4 + 0x1p-20) * std::fabs(x) + 0x1p-10 * s * (1 + 0x1p-20); }

}  // namespace

TEST_CASE("fp8 blocks: scale amax / 448, the per-value and per-block bounds, and the worst case") {
  // Values at the midpoints of the top binade's steps (q = 272, 304, ..., 432 before rounding) hit
  // the block's worst error, 16 s = amax / 28.
  std::vector<float> x(fp8_block);
  const float amax = 3.5f;
  for (int i = 0; i < fp8_block; ++i) x[i] = amax * static_cast<float>(256 + 16 + 32 * (i % 6)) / 448.0f;
  x[5] = -amax;
  std::vector<std::uint8_t> q(fp8_block);
  const float s = fp8_quantize_block(x.data(), fp8_block, q.data());
  CHECK(s == amax / 448.0f);
  std::vector<float> y(fp8_block);
  fp8_dequantize_block(q.data(), fp8_block, s, y.data());
  double worst = 0;
  for (int i = 0; i < fp8_block; ++i) {
    const double e = std::fabs(double(y[i]) - double(x[i]));
    CHECK(e <= value_bound(x[i], s));
    worst = std::max(worst, e);
  }
  CHECK(y[5] == -amax);
  CHECK(worst <= amax / 28.0 * (1 + 0x1p-20));
  CHECK(worst >= amax / 28.0 * (1 - 0x1p-20));  // the bound is reached

  // A block of zeros: a finite scale, zeros back, no NaN.
  std::vector<float> z(fp8_block, 0.0f);
  const float sz = fp8_quantize_block(z.data(), fp8_block, q.data());
  CHECK(std::isfinite(sz));
  CHECK(sz > 0);
  fp8_dequantize_block(q.data(), fp8_block, sz, y.data());
  for (float v : y) CHECK(v == 0.0f);

  // NaN stays NaN; infinity saturates to the block's amax; the scale comes from the finite values.
  std::vector<float> w = {1.0f, std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity(), 0.5f};
  std::vector<float> wy(4);
  const float sw = fp8_quantize_block(w.data(), 4, q.data());
  CHECK(sw == 1.0f / 448.0f);
  fp8_dequantize_block(q.data(), 4, sw, wy.data());
  CHECK(wy[0] == 1.0f);
  CHECK(std::isnan(wy[1]));
  CHECK(wy[2] == -1.0f);
  CHECK(wy[3] == 0.5f);
}

namespace {

template <class T>
std::string scalar_label() {
  if constexpr (std::is_same_v<T, float>) return "float";
  else if constexpr (std::is_same_v<T, double>) return "double";
  else return "bf16";
}

template <class T>
void round_trip_rows(double extra_rel) {
  using Space = Kokkos::DefaultExecutionSpace;
  const Space exec;
  const std::int64_t rows = 37, hidden = 300;  // blocks of 128, 128 and 44
  Kokkos::View<T**, Kokkos::LayoutRight, Space::memory_space> x("x", rows, hidden), y("y", rows, hidden);
  auto hx = Kokkos::create_mirror_view(x);
  std::mt19937 gen(11);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> decade(-3.0, 3.0);
  for (std::int64_t r = 0; r < rows; ++r) {
    const double row_scale = std::pow(10.0, decade(gen));  // rows of very different magnitudes
    for (std::int64_t c = 0; c < hidden; ++c)
      hx(r, c) = static_cast<T>(static_cast<float>(r == 3 ? 0.0 : normal(gen) * row_scale));  // row 3: zeros
  }
  Kokkos::deep_copy(x, hx);
  Fp8Rows<Space::memory_space> f(rows, hidden);
  quantize_fp8_rows(exec, x, f);
  dequantize_fp8_rows(exec, f, y);
  exec.fence();
  auto hy = Kokkos::create_mirror_view(y);
  auto hs = Kokkos::create_mirror_view(f.scales);
  Kokkos::deep_copy(hy, y);
  Kokkos::deep_copy(hs, f.scales);
  REQUIRE(f.scales.extent(1) == 3);
  int bad_scale = 0, over_value = 0, over_block = 0;
  double worst_rel_to_amax = 0;
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t b = 0; b < 3; ++b) {
      const std::int64_t c0 = b * fp8_block, c1 = std::min<std::int64_t>(hidden, c0 + fp8_block);
      double amax = 0;
      for (std::int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(static_cast<double>(static_cast<float>(hx(r, c)))));
      const double s = static_cast<double>(std::max(static_cast<float>(amax), fp8_amax_floor) / 448.0f);
      bad_scale += static_cast<double>(hs(r, b)) != s;
      for (std::int64_t c = c0; c < c1; ++c) {
        const double xv = static_cast<double>(static_cast<float>(hx(r, c))), yv = static_cast<double>(static_cast<float>(hy(r, c)));
        const double e = std::fabs(yv - xv);
        // T's own rounding of the dequantised value comes on top (bf16: up to 2^-8 relative).
        over_value += e > value_bound(xv, s) * (1 + extra_rel) + extra_rel * std::fabs(xv);
        over_block += e > (amax / 28.0) * (1 + 0x1p-20) * (1 + extra_rel) + extra_rel * std::fabs(xv);
        if (amax > 0) worst_rel_to_amax = std::max(worst_rel_to_amax, e / amax);
      }
    }
  MESSAGE(scalar_label<T>(), " rows: worst |x^ - x| / amax of a block ", worst_rel_to_amax, " (bound 1/28 = ", 1.0 / 28, ")");
  CHECK(bad_scale == 0);
  CHECK(over_value == 0);
  CHECK(over_block == 0);
  CHECK(worst_rel_to_amax > 0.02);  // the rows really went through 3-bit mantissas
  for (std::int64_t c = 0; c < hidden; ++c) CHECK(static_cast<float>(hy(3, c)) == 0.0f);
}

}  // namespace

TEST_CASE("fp8 rows: quantise and dequantise kernels stay within the bound (float, double, bf16)") {
  round_trip_rows<float>(0.0);
  round_trip_rows<double>(0x1p-23);  // the value goes through float first
  round_trip_rows<bf16>(0x1p-8);     // bf16 rounds the dequantised value again (2^-8)
}

TEST_CASE("fp8 rows: sizes and a mismatched output") {
  CHECK(fp8_blocks(128) == 1);
  CHECK(fp8_blocks(129) == 2);
  CHECK(fp8_blocks(7168) == 56);
  CHECK(EpMessage::fp8_row_bytes(7168) == 7168 + 56 * 4);  // DeepSeek-V3's hidden: 7392 bytes against 14336 in bf16
  using Space = Kokkos::DefaultExecutionSpace;
  Kokkos::View<float**, Kokkos::LayoutRight, Space::memory_space> x("x", 4, 256);
  Fp8Rows<Space::memory_space> wrong(4, 128);
  CHECK_THROWS_WITH_AS(quantize_fp8_rows(Space(), x, wrong),
                       doctest::Contains("quantize_fp8_rows: out holds 4 x 128 values"), LayoutError);
  CHECK_THROWS_AS(dequantize_fp8_rows(Space(), wrong, x), LayoutError);
}
