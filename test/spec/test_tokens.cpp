// Token units: request counts scale to rows only explicitly; sync metadata keeps both.
#include <doctest/doctest.h>

#include <relayout/spec/tokens.hpp>
#include <type_traits>
#include <vector>

using namespace relayout;
using namespace relayout::spec;

static_assert(!std::is_convertible_v<RequestCount, TokenRows>);
static_assert(!std::is_convertible_v<TokenRows, RequestCount>);
static_assert(!std::equality_comparable_with<RequestCount, TokenRows>);

TEST_CASE("scale_global_num_tokens: [1,3,0,2] x 6 -> [6,18,0,12]") {
  const std::vector<RequestCount> raw{{1}, {3}, {0}, {2}};
  const auto rows = scale_global_num_tokens(raw, TokensPerRequest{6});
  REQUIRE(rows.size() == 4);
  CHECK(rows[0] == TokenRows{6});
  CHECK(rows[1] == TokenRows{18});
  CHECK(rows[2] == TokenRows{0});
  CHECK(rows[3] == TokenRows{12});
}

TEST_CASE("sync metadata keeps raw requests and scaled rows; idle groups are visible") {
  const auto m = DpSyncMetadata::from_requests({{1}, {3}, {0}, {2}}, TokensPerRequest{6});
  CHECK(m.raw[1] == RequestCount{3});
  CHECK(m.scaled[1] == TokenRows{18});
  CHECK(m.scaled_values() == std::vector<std::int64_t>{6, 18, 0, 12});
  CHECK(m.idle(2));
  CHECK_FALSE(m.idle(0));
  CHECK(m.any_work());
  CHECK_FALSE(DpSyncMetadata::from_requests({{0}, {0}}, TokensPerRequest{4}).any_work());
}

TEST_CASE("bad widths and counts are errors naming the input") {
  CHECK_THROWS_AS(scale(RequestCount{2}, TokensPerRequest{0}), LayoutError);
  CHECK_THROWS_AS(scale(RequestCount{-1}, TokensPerRequest{2}), LayoutError);
  try {
    scale(RequestCount{2}, TokensPerRequest{0});
  } catch (const LayoutError& e) {
    CHECK(e.input() == "num_tokens_per_req");
  }
}
