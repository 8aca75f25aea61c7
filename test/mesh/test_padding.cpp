// docs/bridge.md#padding: the padding-mode rule and token-count rounding.
#include <doctest/doctest.h>

#include <cstdint>
#include <relayout/mesh.hpp>
#include <vector>

using namespace relayout;

TEST_CASE("padding: MAX_LEN iff 2*sum >= max*attn_dp; pplx always MAX_LEN") {
  using V = std::vector<std::int64_t>;
  // Balanced: 2*16 >= 4*4.
  CHECK(padding_mode(V{4, 4, 4, 4}, 4, Backend::none) == PaddingMode::max_len);
  // Skewed: 2*(10+0+0+1) = 22 < 10*4 = 40.
  CHECK(padding_mode(V{10, 0, 0, 1}, 4, Backend::none) == PaddingMode::sum_len);
  // Boundary: 2*sum == max*attn_dp picks MAX_LEN: 2*(4+0) = 8 == 4*2.
  CHECK(padding_mode(V{4, 0}, 2, Backend::none) == PaddingMode::max_len);
  CHECK(padding_mode(V{5, 0, 0}, 3, Backend::none) == PaddingMode::sum_len);
  CHECK(padding_mode(V{10, 0, 0, 1}, 4, Backend::pplx) == PaddingMode::max_len);
  // All idle: 0 >= 0 -> MAX_LEN, every rank agrees.
  CHECK(padding_mode(V{0, 0}, 2, Backend::none) == PaddingMode::max_len);

  const RuntimeLayout l({.tp = 8, .dp = 4, .enable_dp_attention = true});
  CHECK(l.padding_mode(V{10, 0, 0, 1}) == PaddingMode::sum_len);
}

TEST_CASE("padding: wrong number of counts or negative counts are errors") {
  using V = std::vector<std::int64_t>;
  CHECK_THROWS_AS(padding_mode(V{1, 2, 3}, 4, Backend::none), LayoutError);
  CHECK_THROWS_AS(padding_mode(V{1, -2}, 2, Backend::none), LayoutError);
  CHECK_THROWS_AS(padding_mode(V{1, std::int64_t{1} << 50}, 2, Backend::none), LayoutError);
}

TEST_CASE("token counts round up to a multiple of attn_tp") {
  CHECK(round_up_tokens(0, 2) == 0);
  CHECK(round_up_tokens(1, 2) == 2);
  CHECK(round_up_tokens(4, 2) == 4);
  CHECK(round_up_tokens(5, 4) == 8);
  CHECK(round_up_tokens(7, 1) == 7);
}
