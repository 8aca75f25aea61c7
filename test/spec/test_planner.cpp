// The planner DP-tier gather predicate: exhaustive truth table over its ten conditions.
#include <doctest/doctest.h>

#include <relayout/spec/planner.hpp>

using namespace relayout::spec;

TEST_CASE("planner DP-tier gather: enabled exactly when all ten conditions hold") {
  int enabled = 0, total = 0;
  for (unsigned bits = 0; bits < (1u << 10); ++bits) {
    auto bit = [&](int i) { return (bits >> i) & 1u; };
    PlannerDpTierInputs in;
    in.compact_ragged_verify = bit(0);
    in.enable_dp_attention = bit(1);
    in.attn_tp = bit(2) ? 1 : 2;
    in.attn_cp = bit(3) ? 1 : 4;
    in.mlp_needs_tp_gather = bit(4);
    in.overlap_schedule = bit(5);
    in.dp_mlp_sync_skipped = !bit(6);
    in.disaggregated = !bit(7);
    in.pp = bit(8) ? 1 : 2;
    in.scheduler_skips_all_gather = !bit(9);
    const PlannerDpTierDecision d = planner_dp_tier_gather(in);
    // Each set bit is one condition holding: enabled iff all ten are set.
    CHECK(d.enabled == (bits == (1u << 10) - 1));
    CHECK(d.failed.size() == static_cast<std::size_t>(10 - __builtin_popcount(bits)));
    enabled += d.enabled;
    ++total;
  }
  CHECK(total == 1024);
  CHECK(enabled == 1);
}

TEST_CASE("planner DP-tier gather names the conditions that failed") {
  PlannerDpTierInputs in{true, true, 2, 1, true, true, false, true, 1, false};
  const auto d = planner_dp_tier_gather(in);
  CHECK_FALSE(d.enabled);
  REQUIRE(d.failed.size() == 2);
  CHECK(d.failed[0] == "attn_tp == 1");
  CHECK(d.failed[1] == "!disaggregated");
}
