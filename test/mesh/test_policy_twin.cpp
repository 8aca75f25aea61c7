// The compile-time policy answers what the documented rules (docs/layout.md) and SGLang's rules say (the brute-force statement of
// spec_model.hpp), over a sweep of every valid layout with tp in {1, 2, 3, 4, 6, 8, 12, 16}
// (backends with and without their own DP rules, ascend_tp, prefill CP on and off), each also
// with one valid setting of the further flags (--dcp-size, --moe-dense-tp-size,
// --enable-tp-lm-head-all-to-all, --ep-num-redundant-experts, --pp-size, --nnodes), instantiated
// as Layout<...> types; RuntimeLayout is checked against the same statement in test_sweep.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <relayout/mesh.hpp>
#include <type_traits>
#include <utility>
#include <vector>

#include "spec_model.hpp"

using namespace relayout;
using namespace relayout::spec_model;

namespace {

constexpr int kTps[] = {1, 2, 3, 4, 6, 8, 12, 16};
constexpr Backend kBackends[] = {Backend::none, Backend::deepep, Backend::pplx, Backend::flashinfer,
                                 Backend::ascend_tp};

// One setting of the further flags; {1, 0, false, 0, 1, 1} leaves them all at their defaults.
struct Further {
  int dcp, dense;  // dense 0: --moe-dense-tp-size unset, -1: tp
  bool tp_a2a;
  int redundant, pp, nnodes;
};
constexpr Further kFurther[] = {
    {2, 0, false, 0, 1, 1}, {1, 1, false, 0, 2, 1}, {1, 0, true, 0, 1, 1},  {1, -1, false, 4, 1, 1},
    {1, 0, false, 0, 1, 2}, {3, 1, false, 0, 1, 1}, {2, -1, true, 0, 1, 2}, {1, 0, false, 4, 2, 2},
    {2, 1, false, 4, 1, 1}, {1, 0, true, 4, 1, 1},  {2, 0, false, 0, 2, 2}, {3, -1, false, 0, 1, 3}};
constexpr int kFurtherCount = int(std::size(kFurther));

constexpr LayoutConfig with_further(LayoutConfig c, const Further& f) {
  c.dcp = f.dcp;
  if (f.dense != 0) c.moe_dense_tp_size = f.dense < 0 ? c.tp : f.dense;
  c.enable_tp_lm_head_all_to_all = f.tp_a2a;
  c.ep_num_redundant_experts = f.redundant;
  c.pp = f.pp;
  c.nnodes = f.nnodes;
  return c;
}
constexpr Draft kDrafts[] = {Draft::none, Draft::moe};

constexpr bool accepted(const LayoutConfig& c) {
  const WidthsResult r = derive_widths(c);
  return r.rule == LayoutRule::ok && dspark_verdict(c, r.widths).allowed;
}

// Walks the candidate space and calls `f` on each config the rules accept (DSpark included, since
// a rejected MoE draft does not compile as a Layout), then on the same config with the first of
// the further-flag settings, taken in turn from a rotating start, that the rules accept too.
template <class F>
constexpr void for_each_valid(F&& f) {
  int turn = 0;
  for (int tp : kTps)
    for (bool dpa : {false, true})
      for (int dp = 1; dp <= (dpa ? tp : 2); ++dp)  // without DP attention dp only meets CP
        for (int cp = 1; cp <= 2; ++cp)
          for (Backend b : kBackends)
            // ep is ignored by the EP-spanning backends; ascend_tp honours it (two values suffice)
            for (int ep = 1; ep <= (b == Backend::none ? tp : b == Backend::ascend_tp ? 2 : 1); ++ep)
              for (int moe_dp = 1; moe_dp <= 2; ++moe_dp)
                for (Draft d : kDrafts)
                  for (bool prefill : {false, true}) {
                    LayoutConfig c{tp, dp, cp, ep, moe_dp, dpa, b, d};
                    c.enable_prefill_cp = prefill;
                    if (prefill) c.cp_strategy = CpStrategy::interleave;
                    // speculative_hook.py _handle_dspark: DSpark under DP attention needs the DP LM head.
                    c.enable_dp_lm_head = d != Draft::none && dpa && dp > 1;
                    if (!accepted(c)) continue;
                    f(c);
                    for (int k = 0; k < 4; ++k) {
                      const LayoutConfig x = with_further(c, kFurther[(turn + k) % kFurtherCount]);
                      if (accepted(x)) {
                        f(x);
                        break;
                      }
                    }
                    turn = (turn + 1) % kFurtherCount;
                  }
}

constexpr std::size_t count_valid() {
  std::size_t n = 0;
  for_each_valid([&](const LayoutConfig&) { ++n; });
  return n;
}

constexpr std::size_t kCount = count_valid();

constexpr std::array<LayoutConfig, kCount> make_configs() {
  std::array<LayoutConfig, kCount> out{};
  std::size_t i = 0;
  for_each_valid([&](const LayoutConfig& c) { out[i++] = c; });
  return out;
}

constexpr auto kConfigs = make_configs();

template <std::size_t I, class... Extra>
using PolicyWith = Layout<Tp<kConfigs[I].tp>, Dp<kConfigs[I].dp>, Cp<kConfigs[I].cp>,
                          Ep<kConfigs[I].ep>, MoeDp<kConfigs[I].moe_dp>,
                          DpAttention<kConfigs[I].enable_dp_attention>,
                          A2a<kConfigs[I].moe_a2a_backend>, DraftModel<kConfigs[I].draft>,
                          PrefillCp<kConfigs[I].enable_prefill_cp>, DpLmHead<kConfigs[I].enable_dp_lm_head>,
                          TpLmHeadAllToAll<kConfigs[I].enable_tp_lm_head_all_to_all>, Dcp<kConfigs[I].dcp>,
                          EpRedundantExperts<kConfigs[I].ep_num_redundant_experts>, Pp<kConfigs[I].pp>,
                          Nnodes<kConfigs[I].nnodes>, Extra...>;
// MoeDenseTp only where --moe-dense-tp-size is given (unset is not a value of the option).
template <std::size_t I>
using PolicyAt = std::conditional_t<kConfigs[I].moe_dense_tp_size.has_value(),
                                    PolicyWith<I, MoeDenseTp<kConfigs[I].moe_dense_tp_size.value_or(0)>>,
                                    PolicyWith<I>>;

// What a layout type answers, read out at run time so that the comparison below is compiled once.
struct Answers {
  Widths widths;
  BridgePath path;
  bool dspark_allowed;
  CpTokenSplit cp_split;
  LmHeadLayout lm_head;
  int pp, nnodes;
  std::vector<RankCoords> coords;
  std::vector<std::array<int, 3>> groups;  // per rank and kind: group index, group rank, group size
};

// The policy's answers against the documented rules and SGLang's rules written out in spec_model.hpp, not against
// RuntimeLayout: both forms share rank_coords() and group_geometry(), so comparing them with each
// other would pass whatever those shared rules compute.
int spec_mismatches(const LayoutConfig& c, const Answers& a) {
  const Expected e = spec_widths(c);
  constexpr std::size_t K = std::size(kWorldGroupKinds);
  int bad = 0;
  const Widths& w = a.widths;
  bad += !spec_valid(c);
  bad += w.tp != c.tp || w.attn_dp != e.attn_dp || w.attn_cp != e.attn_cp || w.attn_tp != e.attn_tp;
  bad += w.moe_dp != e.moe_dp || w.moe_ep != e.moe_ep || w.moe_tp != e.moe_tp;
  bad += w.dcp != e.dcp || w.dense_tp != (e.dense_tp > 0 ? e.dense_tp : c.tp);
  bad += a.pp != c.pp || a.nnodes != c.nnodes;
  // SGLang runs ascend_tp as the built-in TP MoE (moe_hook.py handle_a2a_moe).
  const Backend runs = c.moe_a2a_backend == Backend::ascend_tp ? Backend::none : c.moe_a2a_backend;
  bad += a.path != spec_path(e, runs);
  // docs/dspark.md: DP attention (prefill CP turns it on, --dp-size 1 turns it off; the sweep sets no
  // --attn-dp-size) + MoE draft needs attn_tp == 1; speculative_hook.py _handle_dspark with dp > 1
  // needs the DP LM head, backend none and attn_cp == 1. The sweep keeps what the library allows,
  // so a too permissive rule shows here.
  const bool dp_attention = (c.enable_dp_attention && c.dp > 1) || c.enable_prefill_cp;
  const bool launch_ok = !(dp_attention && c.dp > 1 && c.draft != Draft::none) ||
                         (c.enable_dp_lm_head && runs == Backend::none && e.attn_cp == 1);
  bad += a.dspark_allowed != (!(dp_attention && c.draft == Draft::moe && e.attn_tp > 1) && launch_ok);
  // docs/layout.md#what-is-checked: prefill CP deals token i to CP rank i mod cp; plain CP splits zigzag (SGLang's in-seq split).
  bad += a.cp_split != (c.enable_prefill_cp ? CpTokenSplit::round_robin : CpTokenSplit::zigzag);
  // The LM head: the vocabulary over attention TP with the DP LM head (dp > 1), over TP otherwise.
  const bool dp_head = c.enable_dp_lm_head && c.dp > 1;
  bad += a.lm_head.vocab_group != (dp_head ? GroupKind::attn_tp : GroupKind::tp);
  bad += a.lm_head.vocab_shards != (dp_head ? e.attn_tp : c.tp);
  bad += a.lm_head.dp_lm_head != dp_head || a.lm_head.tp_all_to_all != c.enable_tp_lm_head_all_to_all;
  for (int r = 0; r < c.tp; ++r) {
    bad += !(a.coords[std::size_t(r)] == spec_coords(e, c.tp, r));
    for (std::size_t gi = 0; gi < K; ++gi) {
      const GroupKind g = kWorldGroupKinds[gi];
      const auto members = spec_members(g, e, c.tp, r);
      const auto& mine = a.groups[std::size_t(r) * K + gi];
      bad += mine[2] != int(members.size()) || mine[2] != expected_group_size(g, e, c.tp);
      bad += mine[1] != int(std::find(members.begin(), members.end(), r) - members.begin());
      for (int q = 0; q < c.tp; ++q) {  // the same group index exactly for the members
        const bool member = std::find(members.begin(), members.end(), q) != members.end();
        bad += member != (a.groups[std::size_t(q) * K + gi][0] == mine[0]);
      }
    }
  }
  return bad;
}

template <std::size_t I>
int mismatches() {
  using L = PolicyAt<I>;
  static_assert(L::config() == kConfigs[I]);
  static_assert(L::tp == L::attn_dp * L::attn_cp * L::attn_tp);
  static_assert(L::tp == L::moe_dp * L::moe_ep * L::moe_tp);
  static_assert(L::dcp == L::widths().dcp && L::dense_tp == L::widths().dense_tp);
  Answers a{L::widths(), L::bridge_path(), L::dspark().allowed, L::cp_token_split(), L::lm_head(), L::pp,
            L::nnodes, {}, {}};
  for (int r = 0; r < L::tp; ++r) {
    a.coords.push_back(L::coords(r));
    for (GroupKind g : kWorldGroupKinds) a.groups.push_back({L::group_index(g, r), L::group_rank(g, r), L::group_size(g)});
  }
  return spec_mismatches(kConfigs[I], a);
}

template <std::size_t... I>
int all_mismatches(std::index_sequence<I...>) {
  return (mismatches<I>() + ...);
}

}  // namespace

static_assert(kCount > 500, "the twin sweep covers hundreds of layouts");

// How many swept layouts set each further flag and ascend_tp: each is reached by some type.
constexpr int count_if(bool (*pred)(const LayoutConfig&)) {
  int n = 0;
  for (const LayoutConfig& c : kConfigs) n += pred(c);
  return n;
}
static_assert(count_if([](const LayoutConfig& c) { return c.dcp > 1; }) > 20);
static_assert(count_if([](const LayoutConfig& c) { return c.moe_dense_tp_size == 1; }) > 20);
static_assert(count_if([](const LayoutConfig& c) { return c.moe_dense_tp_size && *c.moe_dense_tp_size > 1; }) > 20);
static_assert(count_if([](const LayoutConfig& c) { return c.enable_tp_lm_head_all_to_all; }) > 5);
static_assert(count_if([](const LayoutConfig& c) { return c.ep_num_redundant_experts > 0; }) > 20);
static_assert(count_if([](const LayoutConfig& c) { return c.pp > 1; }) > 20);
static_assert(count_if([](const LayoutConfig& c) { return c.nnodes > 1; }) > 20);
static_assert(count_if([](const LayoutConfig& c) { return c.moe_a2a_backend == Backend::ascend_tp; }) > 100);

TEST_CASE("twin: compile-time Layout<...> answers what the documented rules say over every swept layout") {
  CHECK(all_mismatches(std::make_index_sequence<kCount>{}) == 0);
  MESSAGE("compared " << kCount << " layouts instantiated as types ("
                      << count_if([](const LayoutConfig& c) { return c.dcp > 1 || c.moe_dense_tp_size ||
                                                                     c.enable_tp_lm_head_all_to_all ||
                                                                     c.ep_num_redundant_experts > 0 || c.pp > 1 ||
                                                                     c.nnodes > 1; })
                      << " with further flags)");
}

TEST_CASE("twin: Layout::runtime() round-trips and options may come in any order") {
  using A = Layout<Tp<8>, Dp<4>, DpAttention<true>, A2a<Backend::deepep>>;
  using B = Layout<A2a<Backend::deepep>, DpAttention<true>, Dp<4>, Tp<8>>;
  static_assert(A::config() == B::config());
  static_assert(A::attn_tp == 2 && A::moe_ep == 8 && A::path == BridgePath::a2a_split);
  CHECK(A::runtime().config() == A::config());
  CHECK(A::runtime().widths() == A::widths());
  CHECK_THROWS_AS(A::coords(8), LayoutError);
  CHECK_THROWS_AS(A::coords(-1), LayoutError);
  static_assert(RankLayout<A> && RankLayout<RuntimeLayout>);
}
