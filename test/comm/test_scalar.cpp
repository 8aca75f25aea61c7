// bf16 / fp16 storage conversions against bit patterns worked out by hand from IEEE-754 rules,
// and the single-rank backend.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <relayout/comm.hpp>
#include <vector>

using namespace relayout;

TEST_CASE("bf16: float conversion rounds to nearest even") {
  CHECK(bf16(1.0f).bits == 0x3F80);
  CHECK(bf16(-2.0f).bits == 0xC000);
  CHECK(bf16(0.1f).bits == 0x3DCD);                 // 0x3DCCCCCD rounds up
  CHECK(bf16(1.0f + 0x1p-8f).bits == 0x3F80);       // tie, even mantissa stays
  CHECK(bf16(1.0f + 3 * 0x1p-8f).bits == 0x3F82);   // tie, odd mantissa rounds up
  CHECK(bf16(std::numeric_limits<float>::infinity()).bits == 0x7F80);
  CHECK(std::isnan(static_cast<float>(bf16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(static_cast<float>(bf16::from_bits(0x4049)) == 3.140625f);
}

TEST_CASE("fp16: float conversion, subnormals, overflow and ties") {
  CHECK(fp16(1.0f).bits == 0x3C00);
  CHECK(fp16(-2.0f).bits == 0xC000);
  CHECK(fp16(0.1f).bits == 0x2E66);
  CHECK(fp16(65504.0f).bits == 0x7BFF);             // largest finite half
  CHECK(fp16(65519.0f).bits == 0x7BFF);             // below the halfway point
  CHECK(fp16(65520.0f).bits == 0x7C00);             // halfway to 2^16 rounds to even: infinity
  CHECK(fp16(0x1p-24f).bits == 0x0001);             // smallest subnormal
  CHECK(fp16(0x1p-25f).bits == 0x0000);             // tie between 0 and 2^-24: even is 0
  CHECK(fp16(0x1.8p-24f).bits == 0x0002);           // tie between 1 and 2 units: even is 2
  CHECK(fp16(0x1p-14f).bits == 0x0400);             // smallest normal
  CHECK(fp16(1.0f + 0x1p-11f).bits == 0x3C00);      // tie, even stays
  CHECK(fp16(1.0f + 3 * 0x1p-11f).bits == 0x3C02);  // tie, odd rounds up
  CHECK(static_cast<float>(fp16::from_bits(0x0001)) == 0x1p-24f);
  CHECK(static_cast<float>(fp16::from_bits(0x7BFF)) == 65504.0f);
  CHECK(static_cast<float>(fp16::from_bits(0xFC00)) == -std::numeric_limits<float>::infinity());
  CHECK(std::isnan(static_cast<float>(fp16(std::numeric_limits<float>::quiet_NaN()))));
  for (std::uint32_t b = 0; b < 0x7C00; ++b)  // every finite half survives a round trip
    REQUIRE(fp16(static_cast<float>(fp16::from_bits(static_cast<std::uint16_t>(b)))).bits == b);
}

TEST_CASE("single rank: collectives copy, size checks still apply") {
  const SingleRankCommunicator one;
  static_assert(SplittableCommunicator<SingleRankCommunicator>);
  std::vector<double> in{1, 2, 3}, out(3);
  all_reduce(one, in, out);
  CHECK(out == in);
  std::vector<double> gathered(3);
  all_gatherv(one, in, gathered, std::vector<int>{3});
  CHECK(gathered == in);
  std::vector<double> wrong(2);
  CHECK_THROWS_AS(all_gather(one, in, wrong), LayoutError);
  CHECK_THROWS_AS(all_gatherv(one, in, gathered, std::vector<int>{1, 2}), LayoutError);
  CHECK_THROWS_AS(broadcast(one, out, 1), LayoutError);
}
