// SGLang's launch rules for the flags beyond the widths, one by one, each with the SGLang file and
// function it comes from: --dp-size 1 turning DP attention off, --cp-strategy required, DSpark's
// launch hook, the LM-head flags, --moe-dense-tp-size, --dcp-size, --ep-num-redundant-experts,
// ascend_tp, --pp-size and --nnodes. Expected values are written out by hand.
#include <doctest/doctest.h>

#include <relayout/mesh.hpp>
#include <string>
#include <vector>

#include "spec_model.hpp"

#include "rejection.hpp"

using namespace relayout;
using relayout::test::contains;
using relayout::test::Rejection;
using relayout::test::rejection_of;

namespace {

void check_rejected(const LayoutConfig& c, const char* input, const char* details, const char* rule) {
  const Rejection r = rejection_of(c);
  CAPTURE(r.message);
  CHECK(r.input == input);
  CHECK(contains(r.message, details));
  CHECK(contains(r.message, rule));
}

LayoutConfig dpa(int tp, int dp, Backend b = Backend::none) {
  return {.tp = tp, .dp = dp, .enable_dp_attention = true, .moe_a2a_backend = b};
}

}  // namespace

// overrides.py _data_parallelism_defaults: dp_size == 1 sets enable_dp_attention (and
// enable_dp_lm_head) to False before any rule reads them.
TEST_CASE("--dp-size 1 turns --enable-dp-attention off, and every rule reads the resolved flag") {
  const LayoutConfig one = dpa(8, 1);
  CHECK_FALSE(dp_attention_on(one));
  CHECK(dp_attention_dropped(one));
  const RuntimeLayout l(one);
  CHECK(l.widths().attn_dp == 1);
  CHECK(l.widths().attn_tp == 8);
  // moe_hook.py handle_a2a_moe: flashinfer then lacks DP attention.
  for (Backend b : {Backend::flashinfer, Backend::flashinfer_megamoe})
    check_rejected(dpa(1, 1, b), "--moe-a2a-backend", "(DP attention off: --dp-size 1 turns --enable-dp-attention off)",
                   RELAYOUT_RULE_BACKEND_DP_EQ_TP);
  // The DSpark worker reads the resolved flag: a MoE draft at tp 8 with DP attention turned off runs.
  LayoutConfig draft = one;
  draft.draft = Draft::moe;
  CHECK(RuntimeLayout(draft).dspark().allowed);
  // pplx without DP attention.
  check_rejected(dpa(4, 1, Backend::pplx), "--moe-a2a-backend", "DP attention off", RELAYOUT_RULE_BACKEND_PPLX);
  // Prefill CP turns DP attention on (deepseek_v4_hook.py validate_deepseek_v4_cp) and this rule,
  // which runs after it, turns it off again at dp 1: SGLang's final value is off.
  LayoutConfig pf{.tp = 4};
  pf.enable_prefill_cp = true;
  pf.cp_strategy = CpStrategy::interleave;
  CHECK_FALSE(dp_attention_on(pf));
}

// parallel_hook.py handle_context_parallelism: "--cp-strategy must be set when --enable-prefill-cp
// is enabled"; deepseek_v4_hook.py validate_deepseek_v4_cp rejects anything but interleave.
TEST_CASE("--enable-prefill-cp without --cp-strategy is refused") {
  LayoutConfig c{.tp = 4};
  c.enable_prefill_cp = true;
  check_rejected(c, "--cp-strategy", "--enable-prefill-cp without --cp-strategy", RELAYOUT_RULE_PREFILL_CP_NO_STRATEGY);
  c.cp_strategy = CpStrategy::interleave;
  CHECK(rejection_of(c).message.empty());
  // Without prefill CP the strategy is not read.
  CHECK(rejection_of({.tp = 4}).message.empty());
}

// speculative_hook.py _handle_dspark: with DP attention and dp > 1, DSpark needs
// --enable-dp-lm-head, the built-in TP MoE and attn_cp == 1; with dp == 1 it checks none of them.
TEST_CASE("DSpark's launch hook under DP attention with dp > 1") {
  LayoutConfig c = dpa(8, 8);
  c.draft = Draft::dense;
  DsparkVerdict v = RuntimeLayout(c).dspark();
  CHECK(v.input == "--enable-dp-lm-head");
  CHECK(v.error == RELAYOUT_DSPARK_DP_LM_HEAD_MESSAGE);
  c.enable_dp_lm_head = true;
  CHECK(RuntimeLayout(c).dspark().allowed);
  c.moe_a2a_backend = Backend::deepep;
  v = RuntimeLayout(c).dspark();
  CHECK(v.input == "--moe-a2a-backend");
  CHECK(v.error == RELAYOUT_DSPARK_BACKEND_MESSAGE);
  // _handle_dspark also accepts megamoe when SGLANG_RAGGED_VERIFY_MODE=static; relayout reads no
  // environment, so it refuses megamoe and its message says that it is stricter than SGLang.
  CHECK(contains(std::string(v.error), "relayout is stricter than SGLang"));
  CHECK(contains(std::string(v.error), "megamoe"));
  CHECK(contains(std::string(v.error), "SGLANG_RAGGED_VERIFY_MODE=static"));
  c.moe_a2a_backend = Backend::megamoe;
  CHECK(RuntimeLayout(c).dspark().input == "--moe-a2a-backend");
  c.moe_a2a_backend = Backend::deepep;
  CHECK_THROWS_WITH_AS(RuntimeLayout(c).require_dspark_allowed(), RELAYOUT_DSPARK_BACKEND_MESSAGE, LayoutError);
  // ascend_tp runs as none, so it is the built-in TP MoE.
  c.moe_a2a_backend = Backend::ascend_tp;
  CHECK(RuntimeLayout(c).dspark().allowed);
  // Attention CP under DP attention: tp 8, dp 2, cp 2 (attn_tp 2, a dense draft).
  LayoutConfig cp = dpa(8, 2);
  cp.cp = 2;
  cp.draft = Draft::dense;
  cp.enable_dp_lm_head = true;
  v = RuntimeLayout(cp).dspark();
  CHECK(v.input == "--cp");
  CHECK(v.error == RELAYOUT_DSPARK_CP_MESSAGE);
  // The worker's MoE-draft rule is reported first: it is the layout that corrupts results.
  cp.draft = Draft::moe;
  CHECK(RuntimeLayout(cp).dspark().input == "--draft");
  // Without a draft nothing of DSpark applies; without DP attention neither.
  cp.draft = Draft::none;
  CHECK(RuntimeLayout(cp).dspark().allowed);
  LayoutConfig plain{.tp = 8, .cp = 2, .moe_a2a_backend = Backend::deepep, .draft = Draft::moe};
  CHECK(RuntimeLayout(plain).dspark().allowed);
}

// overrides.py _dp_lm_head_validation (after _data_parallelism_defaults).
TEST_CASE("--enable-dp-lm-head and --enable-tp-lm-head-all-to-all") {
  LayoutConfig head{.tp = 4, .dp = 2};
  head.enable_dp_lm_head = true;
  check_rejected(head, "--enable-dp-lm-head", "--enable-dp-lm-head with --dp-size 2 and DP attention off",
                 RELAYOUT_RULE_DP_LM_HEAD);
  head.enable_dp_attention = true;
  CHECK(rejection_of(head).message.empty());
  CHECK(dp_lm_head_on(head));
  // dp 1 turns it off silently, as SGLang does.
  LayoutConfig single{.tp = 4};
  single.enable_dp_lm_head = true;
  CHECK(rejection_of(single).message.empty());
  CHECK_FALSE(dp_lm_head_on(single));

  LayoutConfig a2a = dpa(4, 4);
  a2a.enable_tp_lm_head_all_to_all = true;
  CHECK(rejection_of(a2a).message.empty());
  const char* rule = RELAYOUT_RULE_TP_LM_HEAD_A2A;
  LayoutConfig off{.tp = 4, .dp = 4};
  off.enable_tp_lm_head_all_to_all = true;
  check_rejected(off, "--enable-tp-lm-head-all-to-all", "(DP attention is off)", rule);
  LayoutConfig both = a2a;
  both.enable_dp_lm_head = true;
  check_rejected(both, "--enable-tp-lm-head-all-to-all", "(--enable-dp-lm-head is set)", rule);
  LayoutConfig narrow = dpa(8, 4);
  narrow.enable_tp_lm_head_all_to_all = true;
  check_rejected(narrow, "--enable-tp-lm-head-all-to-all", "(tp = 8 != dp = 4)", rule);
  // Prefill CP at tp 1 (dp 1, attn_cp 1): _data_parallelism_defaults turns the DP attention prefill
  // CP set off again, so _dp_lm_head_validation refuses it, as SGLang does.
  LayoutConfig pf{.tp = 1};
  pf.enable_prefill_cp = true;
  pf.cp_strategy = CpStrategy::interleave;
  pf.enable_tp_lm_head_all_to_all = true;
  check_rejected(pf, "--enable-tp-lm-head-all-to-all", "(DP attention is off)", rule);
}

// The LM head's layout the two flags give (RuntimeLayout::lm_head): SGLang's
// VocabParallelEmbedding (layers/vocab_parallel_embedding.py) shards the vocabulary over the
// attention-TP group when enable_dp_lm_head is set, over the TP group otherwise; the TP LM-head
// all-to-all keeps the TP shards. Expected groups written out by hand.
TEST_CASE("the LM head's vocabulary group follows --enable-dp-lm-head and --enable-tp-lm-head-all-to-all") {
  // tp 8, dp 4, DP attention, DP LM head: attn_tp 2, so the vocabulary is cut in 2 inside each DP
  // group; rank 5 is the second rank of group [4 5] and holds slice 1.
  LayoutConfig head = dpa(8, 4);
  head.enable_dp_lm_head = true;
  const RuntimeLayout l(head);
  const LmHeadLayout h = l.lm_head();
  CHECK(h.vocab_group == GroupKind::attn_tp);
  CHECK(h.vocab_shards == 2);
  CHECK(h.dp_lm_head);
  CHECK_FALSE(h.tp_all_to_all);
  CHECK(l.group_members(h.vocab_group, 5) == std::vector<int>{4, 5});
  std::vector<int> shards;
  for (int r = 0; r < 8; ++r) shards.push_back(l.lm_head_vocab_shard(r));
  CHECK(shards == std::vector<int>{0, 1, 0, 1, 0, 1, 0, 1});
  // Without the flag the same widths shard the vocabulary over all 8 ranks.
  const RuntimeLayout plain(dpa(8, 4));
  CHECK(plain.lm_head() == LmHeadLayout{GroupKind::tp, 8, false, false});
  shards.clear();
  for (int r = 0; r < 8; ++r) shards.push_back(plain.lm_head_vocab_shard(r));
  CHECK(shards == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7});
  // --dp-size 1 turns the DP LM head off (_data_parallelism_defaults): over tp again.
  LayoutConfig one{.tp = 4};
  one.enable_dp_lm_head = true;
  CHECK(RuntimeLayout(one).lm_head() == LmHeadLayout{GroupKind::tp, 4, false, false});
  // The TP LM-head all-to-all: tp == dp == 4, one rank per DP group, the vocabulary over tp.
  LayoutConfig a2a = dpa(4, 4);
  a2a.enable_tp_lm_head_all_to_all = true;
  CHECK(RuntimeLayout(a2a).lm_head() == LmHeadLayout{GroupKind::tp, 4, false, true});
  // The compile-time form answers the same.
  using H = Layout<Tp<8>, Dp<4>, DpAttention<true>, DpLmHead<true>>;
  static_assert(H::lm_head().vocab_group == GroupKind::attn_tp && H::lm_head().vocab_shards == 2);
  using A = Layout<Tp<4>, Dp<4>, DpAttention<true>, TpLmHeadAllToAll<true>>;
  static_assert(A::lm_head() == LmHeadLayout{GroupKind::tp, 4, false, true});
}

// validation_hook.py check_server_args: moe_dense_tp_size in (None, 1, tp_size); prefill CP
// forces 1 (validate_deepseek_v4_cp).
TEST_CASE("--moe-dense-tp-size: the dense layers' TP group") {
  CHECK(RuntimeLayout({.tp = 4}).widths().dense_tp == 4);
  LayoutConfig c{.tp = 4};
  c.moe_dense_tp_size = 1;
  const RuntimeLayout one(c);
  CHECK(one.widths().dense_tp == 1);
  CHECK(one.groups(GroupKind::dense_tp) == std::vector<std::vector<int>>{{0}, {1}, {2}, {3}});
  CHECK(one.coords(3).dense_tp_rank == 0);
  c.moe_dense_tp_size = 4;
  const RuntimeLayout full(c);
  CHECK(full.groups(GroupKind::dense_tp) == std::vector<std::vector<int>>{{0, 1, 2, 3}});
  CHECK(full.coords(3).dense_tp_rank == 3);
  for (int bad : {2, 0, -1, 8}) {
    c.moe_dense_tp_size = bad;
    check_rejected(c, "--moe-dense-tp-size", ("--moe-dense-tp-size " + std::to_string(bad) + " with --tp 4").c_str(),
                   RELAYOUT_RULE_DENSE_TP);
  }
  LayoutConfig pf{.tp = 4};
  pf.enable_prefill_cp = true;
  pf.cp_strategy = CpStrategy::interleave;
  pf.moe_dense_tp_size = 4;
  CHECK(RuntimeLayout(pf).widths().dense_tp == 1);
  CHECK(dense_tp_overridden(pf));
}

// parallel_state.py initialize_model_parallel: DCP groups are consecutive blocks of dcp ranks of
// each TP group; tp must be divisible by dcp (parallel_hook.py handle_dcp_validation: dcp >= 1).
TEST_CASE("--dcp-size: decode-CP groups inside TP with their coordinates") {
  LayoutConfig c{.tp = 8, .dp = 2, .enable_dp_attention = true};
  c.dcp = 4;
  const RuntimeLayout l(c);
  CHECK(l.widths().dcp == 4);
  CHECK(l.groups(GroupKind::dcp) == std::vector<std::vector<int>>{{0, 1, 2, 3}, {4, 5, 6, 7}});
  std::vector<int> dcp_ranks;
  for (int r = 0; r < 8; ++r) dcp_ranks.push_back(l.coords(r).dcp_rank);
  CHECK(dcp_ranks == std::vector<int>{0, 1, 2, 3, 0, 1, 2, 3});
  CHECK(l.group_index(GroupKind::dcp, 6) == 1);
  CHECK(l.group_rank(GroupKind::dcp, 6) == 2);
  CHECK(RuntimeLayout({.tp = 8}).group_size(GroupKind::dcp) == 1);
  c.dcp = 3;
  check_rejected(c, "--dcp-size", "--dcp-size 3: tp = 8 is not divisible by dcp = 3", RELAYOUT_RULE_DCP_DIVIDES);
  c.dcp = 0;
  check_rejected(c, "--dcp-size", "--dcp-size = 0 is invalid", RELAYOUT_RULE_COUNT_RANGE);
}

// managers/expert_location.py ExpertLocationMetadata._init_common: the physical experts are the
// logical ones plus --ep-num-redundant-experts, laid out over ep_size ranks
// (num_physical_experts % ep_size == 0). SGLang has no launch rule tying the flag to EP
// (arg_groups/parallel_hook.py handle_eplb_and_dispatch asserts ep_size > 1 for --enable-eplb
// only), so this rule is relayout's own and its message says it is stricter than SGLang: with
// moe_ep == 1 the one EP rank would hold every copy, which places nothing.
TEST_CASE("--ep-num-redundant-experts needs expert parallelism") {
  LayoutConfig c{.tp = 4};
  c.ep_num_redundant_experts = 2;
  check_rejected(c, "--ep-num-redundant-experts", "--ep-num-redundant-experts 2 with moe_ep = 1",
                 RELAYOUT_RULE_REDUNDANT_NEEDS_EP);
  CHECK(contains(rejection_of(c).message, "relayout is stricter than SGLang"));
  c.ep = 2;
  CHECK(rejection_of(c).message.empty());
  CHECK(RuntimeLayout(c).config().ep_num_redundant_experts == 2);
  LayoutConfig backend{.tp = 4, .moe_a2a_backend = Backend::deepep};  // moe_ep forced to 4
  backend.ep_num_redundant_experts = 32;
  CHECK(rejection_of(backend).message.empty());
  c.ep_num_redundant_experts = -1;
  check_rejected(c, "--ep-num-redundant-experts", "= -1 is invalid", RELAYOUT_RULE_REDUNDANT_RANGE);
  CHECK(LayoutConfig{}.ep_num_redundant_experts == 0);
}

// moe_hook.py handle_a2a_moe: ascend_tp is declared as moe_a2a_backend none; it is not in
// overrides.py _A2A_EP_SPANNING_BACKENDS, so --ep-size is honoured.
TEST_CASE("ascend_tp runs as backend none") {
  CHECK(parse_backend("ascend_tp") == Backend::ascend_tp);
  CHECK(resolved_backend(Backend::ascend_tp) == Backend::none);
  const RuntimeLayout l({.tp = 8, .ep = 2, .moe_a2a_backend = Backend::ascend_tp});
  CHECK(l.backend() == Backend::none);
  CHECK(l.widths().moe_ep == 2);
  CHECK(l.widths().moe_tp == 4);
  CHECK(l.bridge_path() == BridgePath::tp_moe);
  CHECK(RuntimeLayout({.tp = 8, .dp = 8, .enable_dp_attention = true, .moe_a2a_backend = Backend::ascend_tp})
            .bridge_path() == BridgePath::dp_gather);
}

// validation_hook.py check_server_args (pp with speculative decoding; tp * pp divisible by nnodes;
// multi-node data parallel only with DP attention) and parallel_hook.py
// handle_context_parallelism (moe_dp_size > 1 needs pp_size == 1).
TEST_CASE("--pp-size and --nnodes rules") {
  LayoutConfig pp{.tp = 4, .draft = Draft::dense};
  pp.pp = 2;
  check_rejected(pp, "--pp-size", "--pp-size 2 with --draft dense", RELAYOUT_RULE_PP_SPECULATIVE);
  LayoutConfig moe{.tp = 4, .cp = 2, .moe_dp = 2};
  moe.pp = 2;
  check_rejected(moe, "--moe-dp-size", "--moe-dp-size 2 with --pp-size 2", RELAYOUT_RULE_PP_MOE_DP);
  LayoutConfig nodes{.tp = 4};
  nodes.pp = 3;
  nodes.nnodes = 8;
  check_rejected(nodes, "--nnodes", "tp * pp = 4 * 3 is not divisible by 8", RELAYOUT_RULE_NNODES_DIVIDES);
  nodes.nnodes = 6;
  CHECK(rejection_of(nodes).message.empty());
  LayoutConfig replicas{.tp = 4, .dp = 2};
  replicas.nnodes = 2;
  check_rejected(replicas, "--nnodes", "--nnodes 2 with 2 data-parallel replicas", RELAYOUT_RULE_NNODES_REPLICAS);
  replicas.enable_dp_attention = true;  // dp inside the domain: one world over two nodes
  CHECK(rejection_of(replicas).message.empty());
  for (int bad : {0, -3, (1 << 20) + 1}) {
    LayoutConfig c{.tp = 4};
    c.pp = bad;
    check_rejected(c, "--pp-size", "--pp-size = ", RELAYOUT_RULE_COUNT_RANGE);
    c.pp = 1;
    c.nnodes = bad;
    check_rejected(c, "--nnodes", "--nnodes = ", RELAYOUT_RULE_COUNT_RANGE);
  }
}

// Accept/reject over the further flags against spec_model.hpp's restatement of the same hooks
// (sglang_launch: our transcription of SGLang's argument hooks, which calls nothing of the layout
// engine; it shares only LayoutConfig and the enums), and the decode-CP, dense-TP and MoE-EP widths
// of every accepted layout. The grid is 8 * 3 * 2 * 2 * 3 * 2 * 4 * 3 * 4 * 2 * 2 * 3 * 2 * 2 =
// 1,327,104 configurations (with tp 1 and 2 the dense values {1, 2, tp} repeat one value, so a few
// are visited twice); the transcription accepts 63,674 of them and rejects 1,263,430, and the
// library must agree on every one: the counts pin the grid and the transcription, so a change to
// either shows here.
TEST_CASE("sweep: the further flags agree with the restated SGLang hooks") {
  long accepted = 0, rejected = 0;
  for (int tp : {1, 2, 3, 4, 6, 8, 12, 16})
    for (int dp : {1, 2, 4})
      for (bool dpa : {false, true})
        for (int cp : {1, 2})
          for (Backend b : {Backend::none, Backend::deepep, Backend::ascend_tp})
            for (int ep : {1, 2})
              for (int dense : {0, 1, 2, tp})
                for (int dcp : {1, 2, 3})
                  for (int lm = 0; lm < 4; ++lm)
                    for (int redundant : {0, 4})
                      for (int pp : {1, 2})
                        for (int nnodes : {1, 2, 3})
                          for (Draft d : {Draft::none, Draft::dense})
                            for (bool prefill : {false, true}) {
                              LayoutConfig c{.tp = tp, .dp = dp, .cp = cp, .ep = ep, .enable_dp_attention = dpa,
                                             .moe_a2a_backend = b, .draft = d};
                              if (dense > 0) c.moe_dense_tp_size = dense;
                              c.dcp = dcp;
                              c.enable_dp_lm_head = lm & 1;
                              c.enable_tp_lm_head_all_to_all = lm & 2;
                              c.ep_num_redundant_experts = redundant;
                              c.pp = pp;
                              c.nnodes = nnodes;
                              if (prefill) {
                                c.enable_prefill_cp = true;
                                c.cp_strategy = CpStrategy::interleave;
                              }
                              const spec_model::Sglang want = spec_model::sglang_launch(c);
                              const WidthsResult got = derive_widths(c);
                              if ((got.rule == LayoutRule::ok) != want.starts) {
                                CAPTURE(tp); CAPTURE(dp); CAPTURE(dpa); CAPTURE(cp); CAPTURE(to_string(b));
                                CAPTURE(ep); CAPTURE(dense); CAPTURE(dcp); CAPTURE(lm); CAPTURE(redundant);
                                CAPTURE(pp); CAPTURE(nnodes); CAPTURE(prefill); CAPTURE(int(got.rule));
                                REQUIRE((got.rule == LayoutRule::ok) == want.starts);
                              }
                              if (!want.starts) {
                                ++rejected;
                                continue;
                              }
                              ++accepted;
                              REQUIRE(got.widths.dcp == want.w.dcp);
                              REQUIRE(got.widths.dense_tp == want.w.dense_tp);
                              REQUIRE(got.widths.moe_ep == want.w.moe_ep);
                            }
  MESSAGE("further flags: " << accepted << " accepted, " << rejected << " rejected");
  CHECK(accepted + rejected == 8L * 3 * 2 * 2 * 3 * 2 * 4 * 3 * 4 * 2 * 2 * 3 * 2 * 2);
  // 70,810 accepted before SGLang's prefill-CP backend check read the backend as typed and DP
  // attention ended off under prefill CP: 6,752 prefill-CP layouts with ascend_tp and 384 at tp 1
  // with the TP LM-head all-to-all (and another backend) are refused now, 7,136 in all.
  CHECK(accepted == 70810 - 6752 - 384);
  CHECK(rejected == 1256294 + 6752 + 384);
}
