// Number flags: decimal integers in range, finite floats, lists without empty items, byte sizes.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "common/huge_pages.hpp"
#include "common/memory.hpp"
#include "common/numbers.hpp"

#include "tolerance.hpp"

using relayout::test::within_abs;
using relayout::test::within_rel;

using namespace relayout::cli;

namespace {
std::string why(auto&& f) {
  try {
    f();
  } catch (const CLI::ConversionError& e) {
    return e.what();
  }
  return "accepted";
}
}  // namespace

TEST_CASE("integers are decimal, whole and in range") {
  CHECK(parse_int<int>("--tp", "010") == 10);  // not octal
  CHECK(parse_int<int>("--tp", "+7") == 7);
  CHECK(parse_int<int>("--dp", "-2") == -2);
  CHECK(parse_int<std::uint64_t>("--seed", "18446744073709551615") == std::numeric_limits<std::uint64_t>::max());
  CHECK(why([] { parse_int<int>("--tp", "0x10"); }) == "--tp = 0x10: expected a decimal integer in [-2147483648, 2147483647]");
  CHECK(why([] { parse_int<int>("--tp", ""); }) == "--tp: empty value; expected a decimal integer in [-2147483648, 2147483647]");
  CHECK(why([] { parse_int<int>("--tp", "+-5"); }) != "accepted");
  CHECK(why([] { parse_int<int>("--tp", "1e3"); }) != "accepted");
  CHECK(why([] { parse_int<int>("--tp", "-"); }) != "accepted");
  CHECK(why([] { parse_int<std::uint64_t>("--seed", "-1"); }) ==
        "--seed = -1: out of range: expected a decimal integer in [0, 18446744073709551615]");
  CHECK(why([] { parse_int<std::uint64_t>("--seed", "18446744073709551616"); }) ==
        "--seed = 18446744073709551616: out of range: expected a decimal integer in [0, 18446744073709551615]");
  CHECK(why([] { parse_int<int>("--tp", "2147483648"); }) != "accepted");
  CHECK(why([] { parse_int<int>("--tp", "-2147483649"); }) != "accepted");
  CHECK(why([] { parse_int<int>("--target-layers", "0", 1, 5); }) ==
        "--target-layers = 0: out of range: expected a decimal integer in [1, 5]");
}

TEST_CASE("floats are finite and in range") {
  CHECK(parse_finite("--tolerance", "1e-4", 0.0) == within_rel(1e-4, 1e-9));
  CHECK(parse_finite("--w", "-0.5") == -0.5);
  for (const char* bad : {"nan", "inf", "-inf", "1e309", "", " 1", "1x"})
    CHECK(why([&] { parse_finite("--w", bad); }) != "accepted");
  CHECK(why([] { parse_finite("--rtol", "1e300", 0.0, 1.0); }) == "--rtol = 1e300: expected a finite number in [0, 1]");
  CHECK(why([] { parse_finite("--tolerance", "-1", 0.0); }) == "--tolerance = -1: expected a finite number >= 0");
}

TEST_CASE("lists have no empty item") {
  CHECK(parse_int_list<int>("--requests", {"5,3", "4"}, 1, 9) == std::vector<int>{5, 3, 4});
  for (const char* bad : {"5,,3", ",5", "5,", ""})
    CHECK(why([&] { parse_int_list<int>("--requests", {bad}, 1, 9); }) != "accepted");
  CHECK(why([] { parse_int_list<int>("--requests", {"5,x"}, 1, 9); }) == "--requests = x: expected a decimal integer in [1, 9]");
}

TEST_CASE("byte sizes take K, M, G, T suffixes") {
  CHECK(parse_bytes("--max-memory", "512") == 512u);
  CHECK(parse_bytes("--max-memory", "100K") == 102400u);
  CHECK(parse_bytes("--max-memory", "2g") == (std::uint64_t(2) << 30));
  for (const char* bad : {"12X", "0", "K", "-1M", "99999999999T"})
    CHECK(why([&] { parse_bytes("--max-memory", bad); }) != "accepted");
}

TEST_CASE("huge pages: the kernel's THP mode and glibc's malloc tunable, as the programs report them") {
  CHECK(bracketed("always [madvise] never") == "madvise");
  CHECK(bracketed("[always] madvise never") == "always");
  CHECK(bracketed("always madvise [never]") == "never");
  CHECK(bracketed("") == "unknown");
  CHECK(malloc_hugetlb_of("glibc.malloc.hugetlb=1") == "1");
  CHECK(malloc_hugetlb_of("glibc.malloc.check=3:glibc.malloc.hugetlb=2") == "2");
  CHECK(malloc_hugetlb_of("glibc.malloc.hugetlb=1:glibc.malloc.hugetlb=0") == "0");  // the last one counts
  CHECK(malloc_hugetlb_of("glibc.malloc.check=3") == "");
  CHECK(malloc_hugetlb_of("xglibc.malloc.hugetlb=1") == "");
  CHECK(HugePages{"madvise", "1"}.heap() == "huge");
  CHECK(HugePages{"madvise", ""}.heap() == "4 KiB");
  CHECK(HugePages{"madvise", "0"}.heap() == "4 KiB");
  CHECK(HugePages{"always", ""}.heap() == "huge");
  CHECK(HugePages{"never", "1"}.heap() == "4 KiB");
  CHECK(HugePages{"unknown", "1"}.heap() == "4 KiB");
  CHECK(HugePages{"never", "2"}.heap() == "hugetlbfs");
  CHECK(HugePages{"madvise", ""}.describe() ==
        "THP madvise, glibc.malloc.hugetlb unset: large buffers on 4 KiB pages (GLIBC_TUNABLES=glibc.malloc.hugetlb=1 "
        "puts them on huge pages and makes MPI's large messages cheaper)");
  CHECK(HugePages{"madvise", "1"}.describe() == "THP madvise, glibc.malloc.hugetlb 1: large buffers on huge pages");
  CHECK(HugePages{"never", ""}.describe() == "THP never, glibc.malloc.hugetlb unset: large buffers on 4 KiB pages");
}

// The tests' tolerance helper (test/support/tolerance.hpp): DeepEP's EP16 dispatch, 1408 us in its
// table, against the planner's 1270 us and against the 2515 us of cross-node copies counted per rank.
TEST_CASE("within_rel and within_abs: the tolerance stated, relative or absolute") {
  CHECK(1270e-6 == within_rel(1408e-6, 0.25));
  CHECK_FALSE(2515e-6 == within_rel(1408e-6, 0.25));
  CHECK(2515e-6 == doctest::Approx(1408e-6).epsilon(0.25));  // why the helper: 0.25 * (1 + 2.5e-3) absolute
  CHECK(1e-13 == within_abs(0.0, 1e-12));
  CHECK_FALSE(2e-12 == within_abs(0.0, 1e-12));
  CHECK_FALSE(0.0 == within_rel(1e-300, 0.5));
  CHECK_FALSE(std::nan("") == within_abs(0.0, 1e300));
}
