// SGLang's further launch rules one by one: the layouts each rule rejects (flag and sentence in the
// error), the ones it still lets through, --attn-dp-size, DeepSeek-V4 prefill CP, the MoE-DP group
// that is the attention-CP group, and which CP rank holds which token.
#include <doctest/doctest.h>

#include <cmath>

#include <relayout/mesh.hpp>
#include <relayout/spec/draft.hpp>
#include <string>
#include <vector>

#include "rejection.hpp"

using namespace relayout;
using relayout::test::contains;
using relayout::test::Rejection;
using relayout::test::rejection_of;

namespace {

LayoutConfig prefill(int tp, Backend b = Backend::none) {
  LayoutConfig c{.tp = tp, .moe_a2a_backend = b};
  c.enable_prefill_cp = true;
  c.cp_strategy = CpStrategy::interleave;
  return c;
}

LayoutConfig with_attn_dp(LayoutConfig c, int n) {
  c.attn_dp_size = n;
  return c;
}

}  // namespace

TEST_CASE("each rule rejects its layouts with the flag and its sentence") {
  struct Case {
    LayoutConfig config;
    const char* input;
    const char* details;
    const char* rule;
  };
  LayoutConfig zigzag = prefill(4);
  zigzag.cp_strategy = CpStrategy::zigzag;
  LayoutConfig prefill_dp2 = prefill(4);
  prefill_dp2.dp = 2;
  const Case cases[] = {
      // handle_context_parallelism: CP against the raw --dp-size, DP attention off.
      {{.tp = 8, .dp = 4, .cp = 4}, "--cp", "--cp 4 with --dp-size 4: tp = 8 is not divisible by dp * attn_cp = 4 * 4",
       RELAYOUT_RULE_CP_DP_DIVIDES},
      // moe_dp > 1 with moe_ep > 1 must fill tp.
      {{.tp = 8, .cp = 2, .ep = 2, .moe_dp = 2}, "--moe-dp-size",
       "--moe-dp-size 2 with moe_ep = 2 (--ep 2): moe_ep * moe_dp = 4 != tp = 8", RELAYOUT_RULE_MOE_DP_FILLS_TP},
      // attn_cp != moe_dp only with moe_dp == 1.
      {{.tp = 8, .moe_dp = 2}, "--moe-dp-size", "--moe-dp-size 2 with attn_cp = 1 (--cp)", RELAYOUT_RULE_CP_MOE_DP},
      {{.tp = 8, .cp = 4, .moe_dp = 2}, "--moe-dp-size", "with attn_cp = 4 (--cp)", RELAYOUT_RULE_CP_MOE_DP},
      // handle_a2a_moe: per-backend DP-attention requirements.
      {{.tp = 8, .dp = 4, .enable_dp_attention = true, .moe_a2a_backend = Backend::flashinfer},
       "--moe-a2a-backend", "--moe-a2a-backend flashinfer with --tp 8, --dp-size 4 with --enable-dp-attention (dp = 4 != tp)",
       RELAYOUT_RULE_BACKEND_DP_EQ_TP},
      {{.tp = 8, .dp = 8, .moe_a2a_backend = Backend::flashinfer_megamoe}, "--moe-a2a-backend",
       "(DP attention off)", RELAYOUT_RULE_BACKEND_DP_EQ_TP},
      {{.tp = 8, .moe_a2a_backend = Backend::pplx}, "--moe-a2a-backend",
       "--moe-a2a-backend pplx with --dp-size 1 without --enable-dp-attention (DP attention off)",
       RELAYOUT_RULE_BACKEND_PPLX},
      // overrides.py _data_parallelism_defaults: --dp-size 1 turns DP attention off first.
      {{.tp = 8, .enable_dp_attention = true, .moe_a2a_backend = Backend::pplx}, "--moe-a2a-backend",
       "(DP attention off: --dp-size 1 turns --enable-dp-attention off)", RELAYOUT_RULE_BACKEND_PPLX},
      {with_attn_dp({.tp = 8, .moe_a2a_backend = Backend::pplx}, 1), "--moe-a2a-backend", "(DP attention off)",
       RELAYOUT_RULE_BACKEND_PPLX},
      // --attn-dp-size.
      {with_attn_dp({.tp = 4, .dp = 2}, 2), "--attn-dp-size", "--attn-dp-size 2 with --dp-size 2",
       RELAYOUT_RULE_ATTN_DP_REPLICAS},
      {with_attn_dp({.tp = 4, .dp = 2, .enable_dp_attention = true}, 2), "--attn-dp-size",
       "--attn-dp-size 2 with --dp-size 2", RELAYOUT_RULE_ATTN_DP_REPLICAS},
      {with_attn_dp({.tp = 4, .dp = 4, .enable_dp_attention = true}, 1), "--attn-dp-size",
       "--attn-dp-size 1 with --dp-size 4 --enable-dp-attention", RELAYOUT_RULE_ATTN_DP_CONFLICT},
      {with_attn_dp({.tp = 4}, 0), "--attn-dp-size", "--attn-dp-size = 0 is invalid", RELAYOUT_RULE_ATTN_DP_SIZE_RANGE},
      {with_attn_dp({.tp = 8}, 3), "--attn-dp-size", "tp = 8 is not divisible by attn_dp * attn_cp = 3 * 1",
       RELAYOUT_RULE_ATTN_DIVIDES},
      // validate_deepseek_v4_cp.
      {zigzag, "--cp-strategy", "--cp-strategy zigzag", RELAYOUT_RULE_PREFILL_CP_STRATEGY},
      {prefill_dp2, "--dp", "--enable-prefill-cp with --dp-size 2 without --enable-dp-attention (dp = 2)",
       RELAYOUT_RULE_PREFILL_CP_DP},
      {with_attn_dp(prefill(4), 2), "--attn-dp-size", "(dp = 2)", RELAYOUT_RULE_PREFILL_CP_DP},
      {prefill(16), "--tp", "--enable-prefill-cp with tp = 16 > 8", RELAYOUT_RULE_PREFILL_CP_TP},
      {prefill(8, Backend::pplx), "--moe-a2a-backend", "--moe-a2a-backend pplx", RELAYOUT_RULE_PREFILL_CP_BACKEND},
      {prefill(8, Backend::deepep_v2), "--moe-a2a-backend", "--moe-a2a-backend deepep_v2",
       RELAYOUT_RULE_PREFILL_CP_BACKEND},
      // The backend as typed: validate_deepseek_v4_cp runs before handle_a2a_moe makes ascend_tp none.
      {prefill(4, Backend::ascend_tp), "--moe-a2a-backend",
       "--moe-a2a-backend ascend_tp (checked as typed, before SGLang runs ascend_tp as none)",
       RELAYOUT_RULE_PREFILL_CP_BACKEND},
      {prefill(1, Backend::ascend_tp), "--moe-a2a-backend", "--moe-a2a-backend ascend_tp",
       RELAYOUT_RULE_PREFILL_CP_BACKEND},
      // _data_parallelism_defaults turns the DP attention prefill CP set off again at dp 1, then
      // _dp_lm_head_validation refuses the TP LM-head all-to-all (attn_cp is 1 at tp 1).
      {[] { LayoutConfig c = prefill(1); c.enable_tp_lm_head_all_to_all = true; return c; }(),
       "--enable-tp-lm-head-all-to-all", "--enable-tp-lm-head-all-to-all (DP attention is off)",
       RELAYOUT_RULE_TP_LM_HEAD_A2A},
      {[] { LayoutConfig c = prefill(4, Backend::deepep); c.enable_tp_lm_head_all_to_all = true; return c; }(),
       "--enable-tp-lm-head-all-to-all", "(DP attention is off)", RELAYOUT_RULE_TP_LM_HEAD_A2A},
      // Prefill CP makes attn_cp = tp, so moe_dp must be 1 or tp.
      {[] { LayoutConfig c = prefill(8); c.moe_dp = 2; return c; }(), "--moe-dp-size",
       "with attn_cp = 8 (set by --enable-prefill-cp)", RELAYOUT_RULE_CP_MOE_DP},
  };
  for (const Case& c : cases) {
    const Rejection r = rejection_of(c.config);
    CAPTURE(r.message);
    CHECK(r.input == c.input);
    CHECK(contains(r.message, c.details));
    CHECK(contains(r.message, c.rule));
  }
}

TEST_CASE("what the rules still allow") {
  // attn_cp == moe_dp: MoE DP over the CP partners.
  CHECK(rejection_of({.tp = 8, .cp = 2, .moe_dp = 2}).message.empty());
  CHECK(rejection_of({.tp = 8, .cp = 2, .ep = 4, .moe_dp = 2}).message.empty());
  // CP with dp replicas that fit: tp % (dp * cp) == 0 without DP attention.
  CHECK(rejection_of({.tp = 8, .dp = 2, .cp = 4}).message.empty());
  // dp replicas alone are not checked against tp (DP attention off, no CP).
  CHECK(rejection_of({.tp = 4, .dp = 8}).message.empty());
  // flashinfer with dp == tp, pplx with two groups.
  CHECK(rejection_of({.tp = 4, .dp = 4, .enable_dp_attention = true,
                      .moe_a2a_backend = Backend::flashinfer}).message.empty());
  CHECK(rejection_of({.tp = 4, .dp = 2, .enable_dp_attention = true,
                      .moe_a2a_backend = Backend::pplx}).message.empty());
  // --attn-dp-size next to the redundant --enable-dp-attention, and width 1 next to replicas.
  CHECK(rejection_of(with_attn_dp({.tp = 4, .enable_dp_attention = true}, 2)).message.empty());
  CHECK(rejection_of(with_attn_dp({.tp = 4, .dp = 2}, 1)).message.empty());
  // Prefill CP with each backend it supports, and at tp 8 with moe_dp == tp.
  for (Backend b : {Backend::none, Backend::deepep, Backend::megamoe, Backend::mori})
    CHECK(rejection_of(prefill(8, b)).message.empty());
  LayoutConfig full = prefill(8);
  full.moe_dp = 8;
  CHECK(rejection_of(full).message.empty());
}

TEST_CASE("--attn-dp-size N resolves to the widths of --dp-size N --enable-dp-attention") {
  for (int tp : {2, 4, 8, 16})
    for (int n = 1; n <= tp; n *= 2)
      for (Backend b : {Backend::none, Backend::deepep, Backend::pplx}) {
        if (b == Backend::pplx && n < 2) continue;
        CAPTURE(tp);
        CAPTURE(n);
        const RuntimeLayout old_spelling({.tp = tp, .dp = n, .enable_dp_attention = n > 1,
                                          .moe_a2a_backend = b});
        const RuntimeLayout new_spelling(with_attn_dp({.tp = tp, .moe_a2a_backend = b}, n));
        CHECK(new_spelling.widths() == old_spelling.widths());
        CHECK(new_spelling.widths().attn_dp == n);
        CHECK(new_spelling.bridge_path() == old_spelling.bridge_path());
        for (GroupKind g : kAllGroupKinds) CHECK(new_spelling.groups(g) == old_spelling.groups(g));
      }
  // The DSpark check sees DP attention through --attn-dp-size too.
  LayoutConfig c = with_attn_dp({.tp = 8, .draft = Draft::moe}, 4);
  CHECK(RuntimeLayout(c).dspark().input == "--draft");
  c.attn_dp_size = 8;
  CHECK(RuntimeLayout(c).dspark().input == "--enable-dp-lm-head");
  c.enable_dp_lm_head = true;
  CHECK(RuntimeLayout(c).dspark().allowed);
}

TEST_CASE("--attn-dp-size gives the DSpark draft context of the old spelling") {
  for (Draft d : {Draft::dense, Draft::moe}) {
    LayoutConfig old_config{.tp = 8, .dp = 8, .enable_dp_attention = true, .draft = d};
    old_config.enable_dp_lm_head = true;
    LayoutConfig new_config = with_attn_dp({.tp = 8, .draft = d}, 8);
    new_config.enable_dp_lm_head = true;
    const auto old_spelling = spec::draft_context(RuntimeLayout(old_config));
    const auto new_spelling = spec::draft_context(RuntimeLayout(new_config));
    CHECK(new_spelling.sync_group == GroupKind::attn_tp);
    CHECK(new_spelling.sync_group == old_spelling.sync_group);
    CHECK(new_spelling.patched == old_spelling.patched);
    CHECK(new_spelling.dp_moe_sync == old_spelling.dp_moe_sync);
    CHECK(new_spelling.base_logits_group == old_spelling.base_logits_group);
  }
}

// validate_deepseek_v4_cp turns DP attention on; _data_parallelism_defaults, after it, turns it off
// again at dp 1, which prefill CP needs: SGLang's final enable_dp_attention is false.
TEST_CASE("prefill CP: DP attention off in the end, attn_cp = tp / dp, every rank one CP rank") {
  LayoutConfig c = prefill(4, Backend::deepep);
  c.cp = 2;  // replaced, as SGLang replaces --attn-cp-size
  const RuntimeLayout l(c);
  CHECK_FALSE(dp_attention_on(c));
  CHECK(cp_overridden(c));
  CHECK(l.widths() == Widths{.tp = 4, .attn_dp = 1, .attn_cp = 4, .attn_tp = 1, .moe_dp = 1,
                             .moe_ep = 4, .moe_tp = 1, .dcp = 1, .dense_tp = 1});
  CHECK(l.groups(GroupKind::attn_cp) == std::vector<std::vector<int>>{{0, 1, 2, 3}});
  for (int r = 0; r < 4; ++r) CHECK(l.coords(r).attn_cp_rank == r);
  CHECK(l.cp_token_split() == CpTokenSplit::round_robin);
  CHECK_FALSE(cp_overridden(prefill(4)));
}

TEST_CASE("MoE-DP group is the attention-CP group when attn_cp > moe_dp; the width stays 1") {
  const RuntimeLayout l({.tp = 8, .dp = 2, .cp = 2, .enable_dp_attention = true});
  CHECK(l.widths().moe_dp == 1);
  CHECK(l.coords(6).moe_dp_rank == 0);
  CHECK(l.group_size(GroupKind::moe_dp) == 2);
  CHECK(l.groups(GroupKind::moe_dp) == l.groups(GroupKind::attn_cp));
  CHECK(l.groups(GroupKind::moe_dp) ==
        std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
  CHECK(l.group_members(GroupKind::moe_dp, 5) == std::vector<int>{5, 7});
  CHECK(l.group_rank(GroupKind::moe_dp, 7) == 1);
  // attn_cp == moe_dp: SGLang's own MoE-DP group (stride moe_ep * moe_tp), here the same ranks.
  const RuntimeLayout eq({.tp = 8, .cp = 2, .ep = 4, .moe_dp = 2});
  CHECK(eq.groups(GroupKind::moe_dp) ==
        std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
  // Without CP the MoE-DP group has one rank.
  CHECK(RuntimeLayout({.tp = 8}).group_size(GroupKind::moe_dp) == 1);
}

// flashinfer_megamoe spans EP over tp: SGLang's newest code takes it as --moe-runner-backend and
// resolves moe_a2a_backend to megamoe (mega_moe hook handle_flashinfer_megamoe), one of
// overrides.py's _A2A_EP_SPANNING_BACKENDS; --ep is then not read.
TEST_CASE("flashinfer_megamoe spans EP over tp, as the megamoe all-to-all it resolves to") {
  const RuntimeLayout fm({.tp = 8, .dp = 8, .ep = 2, .enable_dp_attention = true,
                          .moe_a2a_backend = Backend::flashinfer_megamoe});
  CHECK(fm.widths().moe_ep == 8);
  CHECK(fm.widths().moe_tp == 1);
  CHECK(RuntimeLayout({.tp = 4, .moe_a2a_backend = Backend::megamoe}).widths().moe_ep == 4);
}

TEST_CASE("which CP rank holds which token") {
  // Prefill CP: round-robin, token i on rank i mod cp.
  const RuntimeLayout p(prefill(4));
  std::vector<int> ranks;
  for (int i = 0; i < 10; ++i) ranks.push_back(p.cp_rank_of_token(i, 10));
  CHECK(ranks == std::vector<int>{0, 1, 2, 3, 0, 1, 2, 3, 0, 1});
  CHECK(prefill_cp_rank_of_token(1'000'000'007, 8) == 7);
  // Plain CP (SGLang's in-seq split): 2 * cp blocks, the first n % (2 * cp) one token longer, CP
  // rank r holding blocks r and 2 * cp - 1 - r. 10 over 4 ranks -> 8 blocks 2 2 1 1 1 1 1 1:
  // tokens 0-1 block 0, 2-3 block 1, 4 .. 9 blocks 2 .. 7.
  const RuntimeLayout c({.tp = 4, .cp = 4});
  CHECK(c.cp_token_split() == CpTokenSplit::zigzag);
  ranks.clear();
  for (int i = 0; i < 10; ++i) ranks.push_back(c.cp_rank_of_token(i, 10));
  CHECK(ranks == std::vector<int>{0, 0, 1, 1, 2, 3, 3, 2, 1, 0});
  CHECK(cp_token_count(10, 4, 0, CpTokenSplit::zigzag) == 3);
  CHECK(cp_token_count(10, 4, 1, CpTokenSplit::zigzag) == 3);
  CHECK(cp_token_count(10, 4, 2, CpTokenSplit::zigzag) == 2);
  CHECK(cp_token_count(10, 4, 3, CpTokenSplit::zigzag) == 2);
  CHECK(cp_zigzag_blocks(10, 4, 1).early == Range{2, 2});
  CHECK(cp_zigzag_blocks(10, 4, 1).late == Range{8, 1});
  // 3 tokens over 2 ranks -> blocks 1 1 1 0: rank 0 holds token 0, rank 1 tokens 1 and 2 (SGLang's
  // split_list [1, 1, 1, 0], rank 0 blocks 0 and 3).
  CHECK(cp_token_count(3, 2, 0, CpTokenSplit::zigzag) == 1);
  CHECK(cp_rank_of_token(CpTokenSplit::zigzag, 2, 3, 2) == 1);
  // A request shorter than cp: ranks past its length hold nothing.
  CHECK(cp_chunk(2, 4, 3) == Range{2, 0});
  CHECK(c.cp_rank_of_token(1, 2) == 1);
  // The contiguous split an engine may still pick: 10 over 4 -> 3 3 2 2.
  CHECK(cp_chunk(10, 4, 0) == Range{0, 3});
  CHECK(cp_chunk(10, 4, 2) == Range{6, 2});
  CHECK(cp_chunk(10, 4, 3) == Range{8, 2});
  CHECK(cp_rank_of_token(CpTokenSplit::contiguous, 3, 10, 4) == 1);
  // Every token lands on the rank whose share holds it, and the counts agree, for every split.
  for (std::int64_t n = 0; n <= 40; ++n)
    for (int cp : {1, 2, 3, 5, 8}) {
      std::int64_t covered = 0, zigzag_total = 0;
      for (int r = 0; r < cp; ++r) {
        const Range t = cp_chunk(n, cp, r);
        CHECK(t.begin == covered);
        covered = t.end();
        CHECK(t.count == cp_token_count(n, cp, r, CpTokenSplit::contiguous));
        const ZigzagBlocks z = cp_zigzag_blocks(n, cp, r);
        // Block b of 2 * cp holds ceil((n - b) / (2 * cp)) tokens.
        CHECK(z.early.count == (n - r + 2 * cp - 1) / (2 * cp));
        CHECK(z.late.count == (n - (2 * cp - 1 - r) + 2 * cp - 1) / (2 * cp));
        zigzag_total += z.count();
        std::int64_t dealt = 0, zigzag = 0;
        for (std::int64_t i = 0; i < n; ++i) {
          if (t.contains(i)) CHECK(cp_chunk_rank_of_token(i, n, cp) == r);
          dealt += prefill_cp_rank_of_token(i, cp) == r;
          const bool held = z.early.contains(i) || z.late.contains(i);
          CHECK(held == (cp_zigzag_rank_of_token(i, n, cp) == r));
          zigzag += held;
        }
        CHECK(dealt == cp_token_count(n, cp, r, CpTokenSplit::round_robin));
        CHECK(zigzag == cp_token_count(n, cp, r, CpTokenSplit::zigzag));
        // Causal work (the keys a rank's queries see, summed) differs between ranks by at most 2n,
        // where the contiguous split's last rank sees n^2 (cp - 1) / cp^2 more than its first.
        if (n >= 8 * cp) {
          std::int64_t keys = 0, first = 0;
          for (std::int64_t i = 0; i < n; ++i) {
            keys += cp_zigzag_rank_of_token(i, n, cp) == r ? i + 1 : 0;
            first += cp_zigzag_rank_of_token(i, n, cp) == 0 ? i + 1 : 0;
          }
          CHECK(std::abs(double(keys - first)) <= 2.0 * double(n));
        }
      }
      CHECK(covered == n);
      CHECK(zigzag_total == n);
    }
  CHECK_THROWS_AS(c.cp_rank_of_token(10, 10), LayoutError);
  CHECK_THROWS_AS(c.cp_rank_of_token(-1, 10), LayoutError);
  CHECK_THROWS_AS(c.cp_rank_of_token(0, -1), LayoutError);
}

TEST_CASE("static policy: the new options and rules at compile time") {
  using P = Layout<Tp<8>, PrefillCp<true>, A2a<Backend::mori>>;
  static_assert(P::attn_cp == 8 && P::attn_dp == 1 && P::attn_tp == 1 && P::moe_ep == 8);
  static_assert(P::cp_token_split() == CpTokenSplit::round_robin);
  static_assert(P::group_size(GroupKind::moe_dp) == 8);  // the attention-CP group
  using A = Layout<Tp<8>, AttnDp<4>, A2a<Backend::deepep>>;
  static_assert(A::attn_dp == 4 && A::attn_tp == 2 && A::path == BridgePath::a2a_split);
  using F = Layout<Tp<4>, Dp<4>, DpAttention<true>, A2a<Backend::flashinfer>>;
  static_assert(F::attn_tp == 1);
  using M = Layout<Tp<8>, Cp<2>, MoeDp<2>, Ep<4>>;
  static_assert(M::moe_tp == 1 && M::group_size(GroupKind::moe_dp) == 2);
  CHECK(P::runtime().widths() == P::widths());
  CHECK(A::runtime().groups(GroupKind::attn_tp) ==
        std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}});
}
