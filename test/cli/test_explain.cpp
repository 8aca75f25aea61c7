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
  // Path B: all-reduce, split, route, dispatch, experts, combine, shared expert, all-gather.
  const json& steps = j["bridge"]["steps"];
  REQUIRE(steps.size() == 8);
  CHECK(steps[0]["op"] == "all_reduce");
  CHECK(steps[1]["op"] == "split_rows");
  CHECK(steps[3]["op"] == "dispatch");
  CHECK(steps[3]["group"] == "moe_ep");
  CHECK(steps[7]["op"] == "all_gather");
  CHECK(steps[7]["group"] == "attn_tp");
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

TEST_CASE("bridge steps: explain lists the bridge's own plan around the attention all-reduce") {
  const RuntimeLayout a({.tp = 4, .dp = 2, .enable_dp_attention = true});
  const auto sa = cli::bridge_steps(a);
  REQUIRE(sa.size() == 6);  // attention all_reduce, counts, then the 4 plan steps
  CHECK(sa[2].op == "dp_gather");
  CHECK(sa[2].group == "tp");
  CHECK(sa[3].op == "route");
  CHECK(sa[4].op == "experts");
  CHECK(sa[5].op == "reduce_scatterv | dp_reduce_scatter");

  const RuntimeLayout t({.tp = 4, .ep = 2});
  const auto st = cli::bridge_steps(t);
  REQUIRE(st.size() == 4);
  CHECK(st[2].op == "experts");
  CHECK(st[3].op == "all_reduce");
  CHECK(st[3].group == "tp");

  const RuntimeLayout b({.tp = 4, .dp = 2, .enable_dp_attention = true, .moe_a2a_backend = Backend::deepep});
  const auto sb = cli::bridge_steps(b);
  const auto plan = bridge_plan(BridgePath::a2a_split);
  REQUIRE(sb.size() == plan.size() + 1);
  for (std::size_t i = 0; i < plan.size(); ++i) CHECK(sb[i + 1].op == plan[i].name);
  CHECK(sb[3].op == "dispatch");
  CHECK(sb[3].group == "moe_ep");
  CHECK(sb.back().op == "all_gather");
  CHECK(sb.back().group == "attn_tp");
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

TEST_CASE("explain: prefill CP resolution step by step, round-robin tokens, MoE-DP = CP group") {
  LayoutConfig c{.tp = 4, .cp = 2, .moe_a2a_backend = Backend::deepep};
  c.enable_prefill_cp = true;
  c.cp_strategy = CpStrategy::interleave;
  const RuntimeLayout l(c);
  const std::string t = cli::explain_text(l);
  auto has = [&](const char* s) { return t.find(s) != std::string::npos; };
  CHECK(has("dp_attention=off"));
  CHECK(has("Resolution\n  1. --enable-prefill-cp --cp-strategy interleave: DeepSeek-V4 prefill CP"));
  CHECK(has("  2. prefill CP turns DP attention on; --dp-size 1, which it needs, turns it off again (SGLang's "
            "_data_parallelism_defaults runs after it): DP attention off\n"));
  CHECK(has("  3. prefill CP checks: dp = 1 == 1, tp = 4 <= 8 (one machine), --moe-a2a-backend deepep in {none, deepep, megamoe, mori}: all hold"));
  CHECK(has("  4. attn_cp = tp / dp = 4 / 1 = 4 (replaces --cp 2); attn_dp = 1, attn_tp = 1"));
  CHECK(has("tokens: token i of the batch goes to CP rank i mod 4 (round-robin)"));
  CHECK(has("MoE-DP group = attention-CP group: attn_cp = 4 > moe_dp = 1"));
  CHECK(has("attn_dp = 1 (prefill CP: DP attention on, then off again at dp 1) = 1"));
  CHECK(has("attn_cp = tp / dp (--enable-prefill-cp) = 4"));
  CHECK(has("moe_dp  = moe_dp = 1   (its group is the attention-CP group, 4 ranks: attn_cp > moe_dp)"));
  CHECK(has("moe_dp  1 group  of 4 (= attn_cp groups): [0 1 2 3]"));

  const json j = cli::explain_json(l, 2);
  CHECK(j["config"]["enable_prefill_cp"] == true);
  CHECK(j["config"]["cp_strategy"] == "interleave");
  CHECK(j["config"]["attn_dp_size"].is_null());
  CHECK(j["dp_attention"] == false);  // SGLang's final enable_dp_attention
  CHECK(j["cp_overridden"] == true);
  CHECK(j["cp_token_split"] == "round_robin");
  CHECK(j["widths"]["attn_cp"] == 4);
  CHECK(j["widths"]["moe_dp"] == 1);
  CHECK(j["moe_dp_group"]["is_attn_cp_group"] == true);
  CHECK(j["moe_dp_group"]["size"] == 4);
  CHECK(j["groups"]["moe_dp"] == json::array({json::array({0, 1, 2, 3})}));
  CHECK(j["focus"]["groups"]["moe_dp"]["group_rank"] == 2);
  REQUIRE(j["resolution"].size() == 8);
  CHECK(j["resolution"][1] == "prefill CP turns DP attention on; --dp-size 1, which it needs, turns it off again "
                              "(SGLang's _data_parallelism_defaults runs after it): DP attention off");
  CHECK(j["resolution"][4] == "prefill CP sets the dense layers' TP width to 1");
  CHECK(j["widths"]["dense_tp"] == 1);
}

TEST_CASE("explain: plain CP with DP attention shows the zigzag blocks and the MoE-DP aliasing") {
  const RuntimeLayout l({.tp = 8, .dp = 2, .cp = 2, .enable_dp_attention = true});
  const json j = cli::explain_json(l);
  CHECK(j["cp_token_split"] == "zigzag");
  CHECK(j["moe_dp_group"]["is_attn_cp_group"] == true);
  CHECK(j["groups"]["moe_dp"] == j["groups"]["attn_cp"]);
  CHECK(j["groups"]["moe_dp"][3] == json::array({5, 7}));
  const std::string t = cli::explain_text(l);
  CHECK(t.find("CP rule: tp % (dp * attn_cp) == 0 with dp = --dp-size even without DP attention: 8 % (2 * 2) == 0 holds") != std::string::npos);
  CHECK(t.find("tokens: each request is cut into 4 blocks (the first n % 4 one token longer), CP rank r holding blocks r and 3 - r (zigzag)") != std::string::npos);
  CHECK(t.find("moe_dp  4 groups of 2 (= attn_cp groups): [0 2] [1 3] [4 6] [5 7]") != std::string::npos);
  // Without CP there is nothing to resolve and no aliasing.
  const RuntimeLayout plain({.tp = 4, .dp = 2, .enable_dp_attention = true});
  CHECK(cli::explain_text(plain).find("Resolution") == std::string::npos);
  CHECK(cli::explain_json(plain)["moe_dp_group"]["is_attn_cp_group"] == false);
  CHECK(cli::explain_json(plain)["resolution"].empty());
}

TEST_CASE("explain: under CP the KV is all-gathered over attn_cp and the CP partners share rows in dp_gather") {
  const json j = cli::explain_json(RuntimeLayout({.tp = 4, .cp = 2}));
  CHECK(j["bridge"]["path"] == "dp_gather");  // attn_dp == 1, but the CP ranks hold different rows
  const json& steps = j["bridge"]["steps"];
  REQUIRE(steps.size() == 7);
  CHECK(steps[0]["op"] == "all_gatherv");
  CHECK(steps[0]["group"] == "attn_cp");
  CHECK(steps[1]["op"] == "all_reduce");
  CHECK(steps[1]["group"] == "attn_tp");
  CHECK(steps[3]["op"] == "dp_gather");
  CHECK(steps[3]["what"].get<std::string>().find("the CP partners share their rows") != std::string::npos);
  CHECK(steps[6]["what"].get<std::string>().find("returns each CP rank its own share") != std::string::npos);
  // With an all-to-all backend each CP rank dispatches its own rows.
  const json a2a = cli::explain_json(RuntimeLayout({.tp = 4, .cp = 4, .moe_a2a_backend = Backend::deepep}));
  CHECK(a2a["bridge"]["path"] == "direct");
  CHECK(a2a["bridge"]["steps"][0]["group"] == "attn_cp");
}

TEST_CASE("explain: --attn-dp-size and the backends' own DP rules") {
  LayoutConfig c{.tp = 4, .enable_dp_attention = true, .moe_a2a_backend = Backend::flashinfer};
  c.attn_dp_size = 4;
  const RuntimeLayout l(c);
  const json j = cli::explain_json(l);
  CHECK(j["config"]["attn_dp_size"] == 4);
  CHECK(j["widths"]["attn_dp"] == 4);
  CHECK(j["resolution"][0] == "--attn-dp-size 4: DP attention over 4 groups (the widths of --dp-size 4 --enable-dp-attention); --enable-dp-attention next to it is redundant");
  CHECK(j["resolution"][1] == "--moe-a2a-backend flashinfer needs DP attention with dp == tp: dp = 4 == tp = 4 holds");
  CHECK(cli::explain_text(l).find("attn_dp = --attn-dp-size = 4") != std::string::npos);
}

// overrides.py _data_parallelism_defaults: the JSON carries the resolved flag, not the given one.
TEST_CASE("explain: --dp-size 1 with --enable-dp-attention is DP attention off, in text and JSON") {
  const RuntimeLayout l({.tp = 8, .enable_dp_attention = true, .draft = Draft::moe});
  const json j = cli::explain_json(l);
  CHECK(j["config"]["enable_dp_attention"] == true);
  CHECK(j["dp_attention"] == false);
  CHECK(j["widths"]["attn_tp"] == 8);
  CHECK(j["dspark"]["allowed"] == true);
  CHECK(j["resolution"][0] == "--enable-dp-attention with --dp-size 1: DP attention off (SGLang's "
                              "_data_parallelism_defaults turns it off when dp == 1)");
  CHECK(cli::explain_text(l).find("dp_attention=off") != std::string::npos);
}

TEST_CASE("explain: the further flags in JSON and text") {
  LayoutConfig c{.tp = 8, .dp = 8, .ep = 1, .enable_dp_attention = true, .moe_a2a_backend = Backend::ascend_tp,
                 .draft = Draft::dense};
  c.enable_dp_lm_head = true;
  c.moe_dense_tp_size = 1;
  c.dcp = 2;
  const RuntimeLayout l(c);
  const json j = cli::explain_json(l, 5);
  CHECK(j["config"]["moe_a2a_backend"] == "ascend_tp");
  CHECK(j["moe_a2a_backend"] == "none");
  CHECK(j["config"]["moe_dense_tp_size"] == 1);
  CHECK(j["config"]["dcp"] == 2);
  CHECK(j["config"]["cp_strategy"].is_null());
  CHECK(j["lm_head"]["dp_lm_head"] == true);
  CHECK(j["lm_head"]["vocab_group"] == "attn_tp");
  CHECK(j["lm_head"]["vocab_shards"] == 1);  // attn_tp = tp / attn_dp = 8 / 8
  CHECK(j["widths"]["dcp"] == 2);
  CHECK(j["widths"]["dense_tp"] == 1);
  CHECK(j["groups"]["dcp"][2] == json::array({4, 5}));
  CHECK(j["groups"]["dense_tp"].size() == 8);
  CHECK(j["ranks"][5]["dcp_rank"] == 1);
  CHECK(j["focus"]["groups"]["dcp"]["members"] == json::array({4, 5}));
  CHECK(j["dspark"]["allowed"] == true);
  CHECK(j["bridge"]["path"] == "dp_gather");  // ascend_tp runs as none
  const std::string t = cli::explain_text(l);
  CHECK(t.find("--moe-a2a-backend ascend_tp runs as none (SGLang's handle_a2a_moe remaps it)") != std::string::npos);
  CHECK(t.find("--dcp-size 2: decode context parallelism, 4 blocks of 2 consecutive ranks inside the TP group") !=
        std::string::npos);
  CHECK(t.find("dense_tp 8 groups of 1: [0] [1]") != std::string::npos);
  // The DSpark verdict names the flag to change.
  c.enable_dp_lm_head = false;
  const json rejected = cli::explain_json(RuntimeLayout(c));
  CHECK(rejected["dspark"]["allowed"] == false);
  CHECK(rejected["dspark"]["flag"] == "--enable-dp-lm-head");
}

// parallel_state.py initialize_model_parallel: PP groups take rank i of every stage (stride tp).
TEST_CASE("explain: the world of replicas and pipeline stages") {
  LayoutConfig c{.tp = 2, .dp = 2};
  c.pp = 2;
  const RuntimeLayout l(c);
  const json w = cli::explain_json(l)["world"];
  CHECK(w["replicas"] == 2);
  CHECK(w["pp"] == 2);
  CHECK(w["size"] == 8);
  REQUIRE(w["ranks"].size() == 8);
  CHECK(w["ranks"][6] == json({{"rank", 6}, {"replica", 1}, {"pp_rank", 1}, {"node", 0}, {"tp_rank", 0}}));
  CHECK(w["pp_groups"] == json::array({json::array({0, 2}), json::array({1, 3}), json::array({4, 6}), json::array({5, 7})}));
  const std::string t = cli::explain_text(l);
  CHECK(t.find("World: 2 replicas x pp 2 x tp 2 = 8 ranks, 1 node of 8 ranks") != std::string::npos);
  CHECK(t.find("pp groups: 4 groups of 2: [0 2] [1 3] [4 6] [5 7]") != std::string::npos);
  // One domain alone prints no world section.
  CHECK(cli::explain_text(RuntimeLayout({.tp = 4})).find("World:") == std::string::npos);
}

TEST_CASE("explain: the layout's notes under the widths, in text and JSON") {
  const RuntimeLayout l({.tp = 4, .dp = 8});
  const std::string t = cli::explain_text(l);
  const std::string line = "  note    dp = 8 without DP attention: replicas outside this domain; this domain has tp = 4 ranks\n";
  CHECK(t.find(line) != std::string::npos);
  CHECK(t.find(line) < t.find("Ranks "));  // in the widths section
  const json n = cli::explain_json(l)["notes"];
  CHECK(n == json::array({{{"kind", "dp_replicas"},
                           {"text", "dp = 8 without DP attention: replicas outside this domain; this domain has tp = 4 ranks"}}}));
  // DP attention on: no note in either.
  const RuntimeLayout on({.tp = 8, .dp = 8, .enable_dp_attention = true});
  CHECK(cli::explain_text(on).find("note ") == std::string::npos);
  CHECK(cli::explain_json(on)["notes"] == json::array());
}

TEST_CASE("explain: the attention plan of prefill and decode / extend rows, in JSON and text") {
  // tp 4, cp 2: attn_cp 2, attn_tp 2. Decode / extend under CP: append the new rows' kv, gather the
  // group's queries over attn_cp, partial attention over the keys held here, the partials back to
  // each row's CP rank, the log-sum-exp merge, then wo_b's all-reduce over attn_tp.
  const RuntimeLayout cp({.tp = 4, .cp = 2});
  const json a = cli::explain_json(cp)["attention"];
  CHECK(a["component"] == "relayout::CpAttention");
  std::vector<std::pair<std::string, json>> got;
  for (const json& s : a["decode_extend"]) got.push_back({s["step"].get<std::string>(), s["group"]});
  CHECK(got == std::vector<std::pair<std::string, json>>{{"kv_append", nullptr}, {"all_gatherv", "attn_cp"},
                                                         {"partial", nullptr},   {"all_to_allv", "attn_cp"},
                                                         {"merge", nullptr},     {"all_reduce", "attn_tp"}});
  // Prefill under CP: the kv rows gathered over attn_cp, the kernel, the all-reduce.
  REQUIRE(a["prefill"].size() == 3);
  CHECK(a["prefill"][0]["group"] == "attn_cp");
  CHECK(a["prefill"][2]["step"] == "all_reduce");
  CHECK(cli::explain_text(cp).find("  decode / extend rows (relayout::CpAttention): kv_append all_gatherv@attn_cp partial "
                                   "all_to_allv@attn_cp merge all_reduce@attn_tp\n") != std::string::npos);
  // tp 8 dp 8 with DP attention: attn_tp 1, no CP: only local steps, no all-reduce.
  const RuntimeLayout dpa({.tp = 8, .dp = 8, .enable_dp_attention = true});
  CHECK(cli::explain_json(dpa)["attention"]["decode_extend"].size() == 2);
  CHECK(cli::explain_text(dpa).find("  decode / extend rows (relayout::CpAttention): kv_append attention\n") != std::string::npos);
}

TEST_CASE("explain: --attn-dp-size 1 with --dp-size N: the replicas are the layout's note, said once") {
  const std::string t = cli::explain_text(RuntimeLayout({.tp = 4, .dp = 8, .attn_dp_size = 1}));
  CHECK(t.find("--attn-dp-size 1: no DP attention\n") != std::string::npos);
  const std::string note = "replicas outside this domain";
  REQUIRE(t.find(note) != std::string::npos);
  CHECK(t.find(note, t.find(note) + 1) == std::string::npos);
}

TEST_CASE("explain: --enable-attn-tp-input-scattered on tp_moe, and where it does not apply") {
  // tp 4, no DP attention, backend none: path tp_moe, attn_tp 4. Scattered, as relayout plan and
  // the demo layer take it: the projections' all-gather over attn_tp comes first; wo_b's all-reduce
  // and the tp_moe plan (experts, all-reduce) stay.
  const RuntimeLayout t({.tp = 4});
  std::vector<std::pair<std::string, std::string>> got;
  for (const cli::ExplainStep& s : cli::bridge_steps(t, true)) got.emplace_back(s.op, s.group);
  CHECK(got == std::vector<std::pair<std::string, std::string>>{{"all_gather", "attn_tp"},
                                                                {"all_reduce", "attn_tp"},
                                                                {"route", "local"},
                                                                {"experts", "local"},
                                                                {"all_reduce", "tp"}});
  // Without the flag: the same minus the all-gather.
  CHECK(cli::bridge_steps(t).size() == got.size() - 1);
  CHECK(cli::bridge_steps(t).front().op == "all_reduce");

  const json j = cli::explain_json(t, std::nullopt, true);
  CHECK(j["config"]["enable_attn_tp_input_scattered"] == true);
  CHECK(j["attn_tp_input_scattered"]["applied"] == true);
  CHECK(j["attn_tp_input_scattered"]["note"].is_null());
  CHECK(j["attention"]["prefill"].front()["step"] == "all_gather");
  CHECK(j["attention"]["prefill"].back()["step"] == "all_reduce");
  CHECK(j["attention"]["decode_extend"].front()["group"] == "attn_tp");
  CHECK(j["bridge"]["steps"].size() == 5);
  const std::string text = cli::explain_text(t, std::nullopt, true);
  CHECK(text.find("run on each member's split_rows chunk and are all-gathered over attn_tp") != std::string::npos);
  CHECK(text.find("  decode / extend rows (relayout::CpAttention): all_gather@attn_tp kv_append attention "
                  "all_reduce@attn_tp\n") != std::string::npos);

  // DP attention (path dp_gather): SGLang does not apply it; the steps are the plain ones, and the
  // text and JSON say why.
  const RuntimeLayout d({.tp = 4, .dp = 2, .enable_dp_attention = true});
  CHECK(cli::bridge_steps(d, true).size() == cli::bridge_steps(d).size());
  const json jd = cli::explain_json(d, std::nullopt, true);
  CHECK(jd["attn_tp_input_scattered"]["applied"] == false);
  CHECK(jd["attn_tp_input_scattered"]["note"].get<std::string>().find("this layout has path dp_gather, attn_tp 2") !=
        std::string::npos);
  CHECK(cli::explain_text(d, std::nullopt, true).find("--enable-attn-tp-input-scattered: not applied") !=
        std::string::npos);
  // Not given: no note.
  CHECK(cli::explain_json(d)["attn_tp_input_scattered"]["note"].is_null());
  CHECK(cli::explain_text(d).find("input-scattered") == std::string::npos);
}
