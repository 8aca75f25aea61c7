// Bad input gets a LayoutError naming the input and the rule, never undefined behaviour.
#include <doctest/doctest.h>

#include <climits>
#include <relayout/mesh.hpp>
#include <string>

using namespace relayout;

namespace {

// The error a config raises, as (input, message); empty input if it was accepted.
std::pair<std::string, std::string> error_of(const LayoutConfig& c) {
  try {
    RuntimeLayout l(c);
  } catch (const LayoutError& e) {
    return {e.input(), e.what()};
  }
  return {};
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("bad widths name the flag and the rule") {
  struct Case {
    LayoutConfig config;
    const char* input;
    const char* rule;
  };
  const Case cases[] = {
      {{.tp = 0}, "--tp", "must be >= 1"},
      {{.tp = -8}, "--tp", "must be >= 1"},
      {{.tp = 8, .dp = 0}, "--dp", "must be >= 1"},
      {{.tp = 8, .cp = -1}, "--cp", "must be >= 1"},
      {{.tp = 8, .ep = 0}, "--ep", "must be >= 1"},
      {{.tp = 8, .moe_dp = 0}, "--moe-dp-size", "must be >= 1"},
      {{.tp = INT_MAX}, "--tp", "must be <= 1048576"},
      {{.tp = 8, .dp = INT_MAX, .enable_dp_attention = true}, "--dp", "must be <= 1048576"},
      {{.tp = 8, .dp = 3, .enable_dp_attention = true}, "--dp", "attn_tp = tp / attn_dp / attn_cp must divide exactly"},
      {{.tp = 8, .dp = 4, .cp = 4, .enable_dp_attention = true}, "--dp", "attn_tp = tp / attn_dp / attn_cp"},
      {{.tp = 8, .cp = 3}, "--cp", "must divide exactly"},
      {{.tp = 8, .ep = 3}, "--ep", "moe_tp = tp / moe_ep / moe_dp must divide exactly"},
      {{.tp = 8, .moe_dp = 3}, "--moe-dp-size", "moe_tp = tp / moe_ep / moe_dp"},
      {{.tp = 8, .moe_dp = 2, .moe_a2a_backend = Backend::deepep}, "--moe-dp-size", "forced to tp by --moe-a2a-backend deepep"},
  };
  for (const Case& c : cases) {
    const auto [input, message] = error_of(c.config);
    CAPTURE(message);
    CHECK(input == c.input);
    CHECK(contains(message, c.rule));
    CHECK(contains(message, c.input));
  }
}

TEST_CASE("a width of 2^20 is accepted, products never overflow") {
  CHECK(error_of({.tp = 1 << 20, .dp = 1 << 20, .enable_dp_attention = true}).first.empty());
  // dp * cp would overflow 32 bits; the rule still reports non-divisibility, not garbage.
  const auto [input, message] = error_of({.tp = 1 << 20, .dp = 1 << 20, .cp = 1 << 20,
                                          .enable_dp_attention = true});
  CHECK(input == "--dp");
  CHECK(contains(message, "is not divisible by attn_dp * attn_cp = 1048576 * 1048576"));
}

TEST_CASE("unknown names list the known ones") {
  try {
    parse_backend("deep-ep");
    FAIL("accepted an unknown backend");
  } catch (const LayoutError& e) {
    CHECK(e.input() == "--moe-a2a-backend");
    CHECK(contains(e.what(), "unknown MoE all-to-all backend 'deep-ep'"));
    CHECK(contains(e.what(), "deepep, deepep_v2, mooncake"));
  }
  CHECK_THROWS_AS(parse_draft("eagle"), LayoutError);
  CHECK_THROWS_AS(parse_padding("auto"), LayoutError);
  CHECK(parse_padding("sum_len") == PaddingMode::sum_len);
}

TEST_CASE("ranks out of range are rejected by every lookup") {
  const RuntimeLayout l({.tp = 4});
  for (int bad : {-1, 4, INT_MAX, INT_MIN}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(l.coords(bad), LayoutError);
    CHECK_THROWS_AS(l.group_members(GroupKind::attn_tp, bad), LayoutError);
    CHECK_THROWS_AS(l.group_rank(GroupKind::moe_ep, bad), LayoutError);
  }
  try {
    l.coords(4);
  } catch (const LayoutError& e) {
    CHECK(e.input() == "rank");
    CHECK(contains(e.what(), "[0, 4)"));
  }
}
