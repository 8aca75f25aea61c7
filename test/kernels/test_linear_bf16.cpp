// linear on bf16 rows and weights (fp32 accumulation) against a double reference computed from the
// same bf16 values, through the three micro-kernels (AMX-BF16 tiles and AVX512-BF16 where the CPU
// has them, and the portable one that widens to fp32), with bias and accumulation over shapes that
// are not multiples of the tile; and the run-time dispatch, every way (RELAYOUT_ISA_HIDE forces the
// other branches).
#include <doctest/doctest.h>

#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <relayout/kernels.hpp>
#include <string>
#include <type_traits>
#include <vector>

#include "tolerance.hpp"

using relayout::test::within_abs;
using relayout::test::within_rel;

namespace {

namespace rk = relayout::kernels;
using relayout::bf16;
using Exec = Kokkos::DefaultHostExecutionSpace;
using Mem = Exec::memory_space;

std::vector<bf16> random_bf16(std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<bf16> v(n);
  for (auto& x : v) x = bf16(dist(gen));
  return v;
}

Kokkos::View<bf16**, Kokkos::LayoutRight, Mem> matrix(int rows, int cols, const std::vector<bf16>& v) {
  Kokkos::View<bf16**, Kokkos::LayoutRight, Mem> m("m", std::size_t(rows), std::size_t(cols));
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) m(i, j) = v[std::size_t(i) * cols + j];
  return m;
}

struct Shape {
  int m, k, n;
};

// Runs y (+)= x W^T + bias with `kernel` (or through linear() when dispatch is true) and checks
// every entry against the double reference of the bf16 inputs. The result is rounded to bf16
// once (8 significant bits: relative error <= 2^-8) after an fp32 sum of k exact products (4 eps sqrt(k) sum|x w| covers it).
void check(const Shape& s, rk::impl::Bf16Kernel kernel, bool dispatch, bool with_bias, bool accumulate,
           std::uint32_t seed) {
  CAPTURE(s.m);
  CAPTURE(s.k);
  CAPTURE(s.n);
  const auto xv = random_bf16(std::size_t(s.m) * s.k, seed), wv = random_bf16(std::size_t(s.n) * s.k, seed + 1),
             bv = random_bf16(std::size_t(s.n), seed + 2), y0 = random_bf16(std::size_t(s.m) * s.n, seed + 3);
  const auto x = matrix(s.m, s.k, xv), w = matrix(s.n, s.k, wv);
  auto y = matrix(s.m, s.n, y0);
  Kokkos::View<bf16*, Mem> bias("bias", with_bias ? std::size_t(s.n) : 0);
  for (std::size_t j = 0; j < bias.extent(0); ++j) bias(j) = bv[j];
  Exec exec;
  const auto packed = rk::pack_weights(exec, w);
  CHECK(packed.k_padded() == s.k + (s.k & 1));
  if (dispatch) {
    rk::linear(exec, x, packed, y, Kokkos::View<const bf16*, Mem>(bias), accumulate);
  } else {
    Kokkos::View<bf16*, Mem> a_pack("a_pack", std::size_t(rk::impl::gemm_a_pack_size_bf16<Exec>(s.m, s.k)));
    rk::impl::gemm_packed_bf16(exec, x.data(), s.k, nullptr, s.m, s.k, packed.matrix(0), s.n, y.data(), s.n,
                               with_bias ? bias.data() : nullptr, accumulate, a_pack.data(), kernel);
  }
  exec.fence();
  int bad = 0;
  for (int i = 0; i < s.m; ++i)
    for (int j = 0; j < s.n; ++j) {
      double ref = 0, mag = 0;
      for (int kk = 0; kk < s.k; ++kk) {
        const double p = double(float(xv[std::size_t(i) * s.k + kk])) * double(float(wv[std::size_t(j) * s.k + kk]));
        ref += p;
        mag += std::abs(p);
      }
      if (with_bias) ref += double(float(bv[std::size_t(j)])), mag += std::abs(double(float(bv[std::size_t(j)])));
      if (accumulate) ref += double(float(y0[std::size_t(i) * s.n + j])), mag += std::abs(double(float(y0[std::size_t(i) * s.n + j])));
      const double sum_err = 4 * std::ldexp(1.0, -24) * (std::sqrt(double(s.k)) + 1) * mag;
      const double tol = std::ldexp(1.0, -8) * (std::abs(ref) + sum_err) + sum_err + 1e-30;
      const double got = double(float(y(i, j)));
      if (!(std::abs(got - ref) <= tol) && ++bad <= 3) {
        CAPTURE(i);
        CAPTURE(j);
        CHECK(got == within_rel(ref, 0));
      }
    }
  CHECK(bad == 0);
}

const Shape kShapes[] = {{0, 4, 5}, {1, 1, 1},    {1, 3, 7},     {5, 17, 33},  {8, 128, 32},
                         {9, 64, 96}, {13, 129, 40}, {67, 301, 16}, {64, 256, 64}};

// Shapes around the AMX blocks: 16 and 32 rows, k at, below and past a 32-step, n past a panel.
const Shape kAmxShapes[] = {{16, 32, 32}, {17, 33, 33}, {32, 64, 31}, {33, 96, 64}, {40, 97, 50}, {3, 200, 70}};

bool cpu_has_bf16() { return rk::isa::cpu_has("avx512f") && rk::isa::cpu_has("avx512_bf16"); }

}  // namespace

TEST_CASE("bf16 linear, portable kernel (widened to fp32), matches the reference") {
  std::uint32_t seed = 11;
  for (const Shape& s : kShapes) {
    check(s, rk::impl::Bf16Kernel::widen_fp32, false, false, false, seed += 7);
    check(s, rk::impl::Bf16Kernel::widen_fp32, false, true, true, seed += 7);
  }
}

TEST_CASE("bf16 linear, AVX512-BF16 kernel, matches the reference") {
#if defined(RELAYOUT_KERNELS_DPBF16)
  if (!cpu_has_bf16()) {
    MESSAGE("this CPU has no AVX512-BF16: its kernel is compiled but not run here");
    return;
  }
  std::uint32_t seed = 101;
  for (const Shape& s : kShapes) {
    check(s, rk::impl::Bf16Kernel::avx512_bf16, false, false, false, seed += 7);
    check(s, rk::impl::Bf16Kernel::avx512_bf16, false, true, true, seed += 7);
  }
#else
  MESSAGE("this build has no AVX512-BF16 kernel (not an x86-64 GCC >= 10 / Clang host build)");
#endif
}

TEST_CASE("bf16 linear, AMX-BF16 kernel, matches the reference") {
#if defined(RELAYOUT_KERNELS_AMX)
  if (!rk::impl::amx_bf16_runnable()) {
    MESSAGE("this CPU has no AMX-BF16, or Linux did not grant its tile state: its kernel is compiled but not run here");
    return;
  }
  std::uint32_t seed = 301;
  for (const Shape& s : kShapes) {
    check(s, rk::impl::Bf16Kernel::amx_bf16, false, false, false, seed += 7);
    check(s, rk::impl::Bf16Kernel::amx_bf16, false, true, true, seed += 7);
  }
  for (const Shape& s : kAmxShapes) {
    check(s, rk::impl::Bf16Kernel::amx_bf16, false, false, false, seed += 7);
    check(s, rk::impl::Bf16Kernel::amx_bf16, false, true, true, seed += 7);
  }
#else
  MESSAGE("this build has no AMX kernel (not a Linux x86-64 GCC >= 11 / Clang >= 12 host build)");
#endif
}

TEST_CASE("bf16 linear dispatches at run time, and RELAYOUT_ISA_HIDE takes the other branches") {
#if defined(RELAYOUT_KERNELS_DPBF16)
  const bool can_dp = cpu_has_bf16();
#else
  const bool can_dp = false;
#endif
  const bool can_amx = rk::impl::amx_bf16_runnable();
  using K = rk::impl::Bf16Kernel;
  // The rule: AMX tiles where the CPU and Linux allow them; else vdpbf16ps where the CPU has it and
  // it pays (AMD); else the widening kernel. RELAYOUT_BF16_KERNEL overrides it.
  const bool amd = std::strcmp(rk::isa::cpu_vendor(), "AuthenticAMD") == 0;
  MESSAGE("cpu vendor " << rk::isa::cpu_vendor() << ", AVX512-BF16 kernel " << (can_dp ? "runnable" : "not runnable")
                        << ", AMX-BF16 kernel " << (can_amx ? "runnable" : "not runnable"));
  const K rule = can_amx ? K::amx_bf16 : (can_dp && amd ? K::avx512_bf16 : K::widen_fp32);
  CHECK(rk::impl::bf16_kernel<Exec>() == rule);
  setenv(rk::impl::kBf16KernelEnv, "dpbf16", 1);
  CHECK(rk::impl::bf16_kernel<Exec>() == (can_dp ? K::avx512_bf16 : rule));
  setenv(rk::impl::kBf16KernelEnv, "widen", 1);
  CHECK(rk::impl::bf16_kernel<Exec>() == K::widen_fp32);
  // "amx" is taken (the rule where the CPU or Linux refuses the tiles); any other text is refused,
  // naming the variable and its values, by the GEMM's dispatch and by check_kernel_settings alike.
  setenv(rk::impl::kBf16KernelEnv, "amx", 1);
  CHECK(rk::impl::bf16_kernel<Exec>() == rule);
  CHECK_NOTHROW(rk::check_kernel_settings());
  for (const char* bad : {"fast", "", "AMX", "widen "}) {
    CAPTURE(bad);
    setenv(rk::impl::kBf16KernelEnv, bad, 1);
    const std::string expect = *bad ? "RELAYOUT_BF16_KERNEL=" + std::string(bad) + ": expected amx, dpbf16 or widen"
                                    : std::string("RELAYOUT_BF16_KERNEL is set but empty: expected amx, dpbf16 or widen");
    CHECK_THROWS_WITH_AS(rk::impl::bf16_kernel<Exec>(), doctest::Contains(expect.c_str()), rk::KernelError);
    CHECK_THROWS_WITH_AS(rk::check_kernel_settings(), doctest::Contains(expect.c_str()), rk::KernelError);
  }
  unsetenv(rk::impl::kBf16KernelEnv);
  CHECK_NOTHROW(rk::check_kernel_settings());
  check({13, 129, 40}, K::widen_fp32, true, true, false, 5);
  // Hiding AMX leaves the vendor rule between vdpbf16ps and widening; hiding both leaves widening.
  setenv(rk::isa::kHideEnv, "amx_bf16", 1);
  CHECK(rk::impl::bf16_kernel<Exec>() == (can_dp && amd ? K::avx512_bf16 : K::widen_fp32));
  check({33, 129, 40}, K::widen_fp32, true, true, false, 7);
  setenv(rk::isa::kHideEnv, "amx_bf16 avx512_bf16", 1);
  CHECK(rk::impl::bf16_kernel<Exec>() == K::widen_fp32);
  check({13, 129, 40}, K::widen_fp32, true, true, true, 6);
  unsetenv(rk::isa::kHideEnv);
}

// fp32 rows with bf16 weights (the demo layer's --dtype bf16): y = x W^T (+ bias, + y) in fp32, the
// portable kernel on every CPU, row counts 1-4 through their own short tiles. The reference sums the
// same products (fp32 x, the bf16 weights' values) in double; each product is exact in fp32, so only
// the fp32 sum errs: within 4 eps (sqrt(k) + 1) sum |x w|.
TEST_CASE("linear with bf16 weights on fp32 rows matches the reference of the bf16 weights") {
  const Shape shapes[] = {{1, 1, 1}, {1, 65, 17}, {2, 64, 33}, {3, 129, 40}, {4, 7, 96}, {5, 33, 16}, {13, 301, 50}};
  std::uint32_t seed = 301;
  for (const Shape& s : shapes)
    for (const bool extra : {false, true}) {
      CAPTURE(s.m);
      CAPTURE(s.k);
      CAPTURE(s.n);
      std::mt19937 gen(seed += 3);
      std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
      Kokkos::View<float**, Kokkos::LayoutRight, Mem> x("x", s.m, s.k), y("y", s.m, s.n);
      Kokkos::View<float*, Mem> bias("bias", extra ? s.n : 0);
      for (int i = 0; i < s.m; ++i)
        for (int kk = 0; kk < s.k; ++kk) x(i, kk) = dist(gen);
      for (int i = 0; i < s.m; ++i)
        for (int j = 0; j < s.n; ++j) y(i, j) = dist(gen);
      for (std::size_t j = 0; j < bias.extent(0); ++j) bias(j) = dist(gen);
      const auto y0 = Kokkos::create_mirror(y);
      Kokkos::deep_copy(y0, y);
      const auto wv = random_bf16(std::size_t(s.n) * s.k, seed + 1);
      Exec exec;
      const auto packed = rk::pack_weights(exec, matrix(s.n, s.k, wv));
      static_assert(std::is_same_v<decltype(packed)::tile, rk::impl::GemmTile<Exec, bf16>>);
      rk::linear(exec, x, packed, y, Kokkos::View<const float*, Mem>(bias), extra);
      exec.fence();
      int bad = 0;
      for (int i = 0; i < s.m; ++i)
        for (int j = 0; j < s.n; ++j) {
          double ref = 0, mag = 0;
          for (int kk = 0; kk < s.k; ++kk) {
            const double p = double(x(i, kk)) * double(float(wv[std::size_t(j) * s.k + kk]));
            ref += p;
            mag += std::abs(p);
          }
          if (extra) {
            ref += double(bias(std::size_t(j))) + double(y0(i, j));
            mag += std::abs(double(bias(std::size_t(j)))) + std::abs(double(y0(i, j)));
          }
          const double tol = 4 * std::ldexp(1.0, -24) * (std::sqrt(double(s.k)) + 2) * mag + 1e-30;
          if (!(std::abs(double(y(i, j)) - ref) <= tol) && ++bad <= 3) CHECK(double(y(i, j)) == within_rel(ref, 0));
        }
      CHECK(bad == 0);
    }
}

// bf16 weights with round_rows: fp32 rows are rounded to bf16 before they are multiplied (bf16
// activations, fp32 accumulation and output), through vdpbf16ps where the CPU has it and the
// portable kernel elsewhere (RELAYOUT_ISA_HIDE takes it here), 1-4 rows always through the portable
// kernel's short tiles. The reference rounds x here (nearest even, written out below, not
// relayout::bf16) and sums in double; products of two bf16 values are exact in fp32, so only the
// fp32 sum errs. A second check shows the rounding happened: the result is off the reference of the
// unrounded rows by more than the sum's error.
namespace {
float round_to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
}  // namespace

TEST_CASE("linear with bf16 weights and round_rows multiplies fp32 rows rounded to bf16, on both kernels") {
  const Shape shapes[] = {{1, 65, 17}, {4, 7, 96}, {5, 33, 16}, {8, 128, 32}, {13, 301, 50}, {40, 97, 50}, {64, 256, 64}};
  for (const int branch : {0, 1, 2}) {
    CAPTURE(branch);
    // 0: vdpbf16ps forced where the CPU has it (whatever the vendor rule); 1: the rule with AMX
    // (AMX tiles where the CPU and Linux allow them); 2: the portable kernel, both hidden.
    if (branch == 2) setenv(rk::isa::kHideEnv, "amx_bf16 avx512_bf16", 1);
    else if (branch == 0) setenv(rk::impl::kBf16KernelEnv, "dpbf16", 1);
    std::uint32_t seed = 501 + 200 * branch;
    int off_exact = 0, outputs = 0;
    for (const Shape& s : shapes) {
      CAPTURE(s.m);
      CAPTURE(s.k);
      CAPTURE(s.n);
      std::mt19937 gen(seed += 3);
      std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
      Kokkos::View<float**, Kokkos::LayoutRight, Mem> x("x", s.m, s.k), y("y", s.m, s.n);
      for (int i = 0; i < s.m; ++i)
        for (int kk = 0; kk < s.k; ++kk) x(i, kk) = dist(gen);
      const auto wv = random_bf16(std::size_t(s.n) * s.k, seed + 1);
      Exec exec;
      auto packed = rk::pack_weights(exec, matrix(s.n, s.k, wv));
      packed.round_rows = true;
      rk::linear(exec, x, packed, y);
      exec.fence();
      int bad = 0;
      for (int i = 0; i < s.m; ++i)
        for (int j = 0; j < s.n; ++j) {
          double ref = 0, exact = 0, mag = 0;
          for (int kk = 0; kk < s.k; ++kk) {
            const double w = double(float(wv[std::size_t(j) * s.k + kk]));
            ref += double(round_to_bf16(x(i, kk))) * w;
            exact += double(x(i, kk)) * w;
            mag += std::abs(double(x(i, kk)) * w);
          }
          const double tol = 4 * std::ldexp(1.0, -24) * (std::sqrt(double(s.k)) + 2) * mag + 1e-30;
          if (!(std::abs(double(y(i, j)) - ref) <= tol) && ++bad <= 3) CHECK(double(y(i, j)) == within_rel(ref, 0));
          off_exact += std::abs(double(y(i, j)) - exact) > tol;
          ++outputs;
        }
      CHECK(bad == 0);
    }
    CHECK(off_exact > outputs / 2);  // the rows were rounded: most outputs leave the exact-row sum
    unsetenv(rk::isa::kHideEnv);
    unsetenv(rk::impl::kBf16KernelEnv);
  }
}
