// The planner's DP-tier gather predicate (docs/dspark.md): enabled only when all ten conditions hold.
// Each condition is a named input, and the result says which ones failed.
#pragma once

#include <string>
#include <vector>

namespace relayout::spec {

struct PlannerDpTierInputs {
  bool compact_ragged_verify = false;      // verify runs in compact ragged mode
  bool enable_dp_attention = false;
  int attn_tp = 1;
  int attn_cp = 1;
  bool mlp_needs_tp_gather = false;
  bool overlap_schedule = false;
  bool dp_mlp_sync_skipped = false;
  bool disaggregated = false;
  int pp = 1;
  bool scheduler_skips_all_gather = false;
};

struct PlannerDpTierDecision {
  bool enabled = false;
  std::vector<std::string> failed;  // names of the conditions that did not hold
};

inline PlannerDpTierDecision planner_dp_tier_gather(const PlannerDpTierInputs& in) {
  const std::pair<bool, const char*> conditions[] = {
      {in.compact_ragged_verify, "compact_ragged_verify"},
      {in.enable_dp_attention, "enable_dp_attention"},
      {in.attn_tp == 1, "attn_tp == 1"},
      {in.attn_cp == 1, "attn_cp == 1"},
      {in.mlp_needs_tp_gather, "mlp_needs_tp_gather"},
      {in.overlap_schedule, "overlap_schedule"},
      {!in.dp_mlp_sync_skipped, "!dp_mlp_sync_skipped"},
      {!in.disaggregated, "!disaggregated"},
      {in.pp == 1, "pp == 1"},
      {!in.scheduler_skips_all_gather, "!scheduler_skips_all_gather"},
  };
  PlannerDpTierDecision d;
  for (const auto& [holds, name] : conditions)
    if (!holds) d.failed.emplace_back(name);
  d.enabled = d.failed.empty();
  return d;
}

}  // namespace relayout::spec
