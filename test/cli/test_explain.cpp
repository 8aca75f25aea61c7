// `relayout explain` renderers: the JSON carries the layout engine's values, the text walks through
// them, the bridge steps follow the path.
#include <doctest/doctest.h>

#include "cli/explain.hpp"

using namespace relayout;
using nlohmann::json;

TEST_CASE("explain json: seed layout TP32/DP16 deepep") {
  const RuntimeLayout l({.tp = 32, .dp = 16, .enable_dp_attention = true,
                         .moe_a2a_backend = Backend::deepep});
  const json j = cli::explain_json(l, 11);
  CHECK(j["widths"]["attn_dp"] == 16);
  CHECK(j["widths"]["attn_cp"] == 1);
  CHECK(j["widths"]["attn_tp"] == 2);
  CHECK(j["widths"]["moe_dp"] == 1);
  CHECK(j["widths"]["moe_ep"] == 32);
  CHECK(j["widths"]["moe_tp"] == 1);
  REQUIRE(j["ranks"].size() == 32);
  CHECK(j["ranks"][10]["attn_dp_rank"] == 5);
  CHECK(j["ranks"][11]["attn_tp_rank"] == 1);
  CHECK(j["ranks"][11]["moe_ep_rank"] == 11);
  CHECK(j["groups"]["attn_tp"].size() == 16);
  CHECK(j["groups"]["attn_tp"][5] == json::array({10, 11}));
  CHECK(j["groups"]["moe_ep"][0].size() == 32);
  CHECK(j["groups"]["tp"][0][31] == 31);
  CHECK(j["bridge"]["path"] == "a2a_split");
  CHECK(j["dspark"]["allowed"] == true);
  CHECK(j["dspark"]["error"].is_null());
  CHECK(j["focus"]["groups"]["attn_tp"]["members"] == json::array({10, 11}));
  CHECK(j["focus"]["groups"]["attn_tp"]["group_rank"] == 1);
  // Path B: all-reduce, split, dispatch, experts, combine, all-gather.
  const json& steps = j["bridge"]["steps"];
  REQUIRE(steps.size() == 6);
  CHECK(steps[0]["op"] == "all_reduce");
  CHECK(steps[1]["op"] == "split_rows");
  CHECK(steps[5]["op"] == "all_gather + concat");
  CHECK(steps[5]["group"] == "attn_tp");
}

TEST_CASE("explain json: DSpark rejection carries the exact message") {
  const RuntimeLayout l({.tp = 32, .dp = 16, .enable_dp_attention = true, .draft = Draft::moe});
  const json j = cli::explain_json(l);
  CHECK(j["dspark"]["allowed"] == false);
  CHECK(j["dspark"]["error"] == std::string(RELAYOUT_DSPARK_MOE_DRAFT_MESSAGE));
  CHECK(j["bridge"]["path"] == "dp_gather");
  CHECK_FALSE(j.contains("focus"));
}

TEST_CASE("explain text: formulas filled in, rank grid, groups, verdict") {
  const RuntimeLayout l({.tp = 8, .dp = 4, .enable_dp_attention = true,
                         .moe_a2a_backend = Backend::deepep});
  const std::string t = cli::explain_text(l, 3);
  auto has = [&](const char* s) { return t.find(s) != std::string::npos; };
  CHECK(has("attn_tp = tp / attn_dp / attn_cp = 8 / 4 / 1 = 2"));
  CHECK(has("moe_ep  = tp (deepep spans EP over the TP width) = 8"));
  CHECK(has("check   8 = 4 x 1 x 2 (attention dp x cp x tp) = 1 x 8 x 1 (MoE dp x ep x tp)"));
  CHECK(has(">    3          1       0       1   |       0      3      0"));
  CHECK(has("attn_tp 4 groups of 2: [0 1] [2 3] [4 5] [6 7]"));
  CHECK(has("Rank 3: attention-DP group 1 (attn_tp_rank 1"));
  CHECK(has("Attention -> MoE bridge: a2a_split"));
  CHECK(has("DSpark start-up check (draft none): allowed (no draft; a MoE draft here would be rejected"));
}

TEST_CASE("bridge steps: path A restores with the sum decided once; tp_moe sums once over tp") {
  const RuntimeLayout a({.tp = 4, .dp = 2, .enable_dp_attention = true});
  const auto sa = cli::bridge_steps(a);
  REQUIRE(sa.size() == 5);
  CHECK(sa[2].op == "dp_gather_replicate");
  CHECK(sa[4].op == "reduce_scatterv | dp_reduce_scatter | dp_scatter");

  const RuntimeLayout t({.tp = 4, .ep = 2});
  const auto st = cli::bridge_steps(t);
  REQUIRE(st.size() == 3);
  CHECK(st[1].op == "moe");
  CHECK(st[2].op == "all_reduce");
  CHECK(st[2].group == "tp");
}

TEST_CASE("explain dot: one cluster per attention-TP group, MoE-EP edges") {
  const RuntimeLayout l({.tp = 4, .dp = 2, .enable_dp_attention = true,
                         .moe_a2a_backend = Backend::deepep});
  const std::string d = cli::explain_dot(l);
  CHECK(d.rfind("graph relayout {", 0) == 0);
  CHECK(d.find("subgraph cluster_attn_1") != std::string::npos);
  CHECK(d.find("subgraph cluster_attn_2") == std::string::npos);
  CHECK(d.find("r2 -- r3 [color=blue, label=\"moe_ep 0\"]") != std::string::npos);
  CHECK(d.back() == '\n');
}
