// The compile-time policy and the runtime layout give identical answers, over a sweep of every
// valid layout with tp in {1, 2, 3, 4, 6, 8, 12, 16} (backends with and without their own DP rules,
// prefill CP on and off), instantiated as Layout<...> types.
#include <doctest/doctest.h>

#include <array>
#include <relayout/mesh.hpp>
#include <utility>

using namespace relayout;

namespace {

constexpr int kTps[] = {1, 2, 3, 4, 6, 8, 12, 16};
constexpr Backend kBackends[] = {Backend::none, Backend::deepep, Backend::pplx, Backend::flashinfer};
constexpr Draft kDrafts[] = {Draft::none, Draft::moe};

// Walks the candidate space and calls `f` on each config the rules accept (DSpark included, since
// a rejected MoE draft does not compile as a Layout).
template <class F>
constexpr void for_each_valid(F&& f) {
  for (int tp : kTps)
    for (bool dpa : {false, true})
      for (int dp = 1; dp <= (dpa ? tp : 2); ++dp)  // without DP attention dp only meets CP
        for (int cp = 1; cp <= 2; ++cp)
          for (Backend b : kBackends)
            for (int ep = 1; ep <= (b == Backend::none ? tp : 1); ++ep)  // ep ignored otherwise
              for (int moe_dp = 1; moe_dp <= 2; ++moe_dp)
                for (Draft d : kDrafts)
                  for (bool prefill : {false, true}) {
                    LayoutConfig c{tp, dp, cp, ep, moe_dp, dpa, b, d};
                    c.enable_prefill_cp = prefill;
                    const WidthsResult r = derive_widths(c);
                    if (r.rule == LayoutRule::ok && dspark_verdict(c, r.widths).allowed) f(c);
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

template <std::size_t I>
using PolicyAt = Layout<Tp<kConfigs[I].tp>, Dp<kConfigs[I].dp>, Cp<kConfigs[I].cp>,
                        Ep<kConfigs[I].ep>, MoeDp<kConfigs[I].moe_dp>,
                        DpAttention<kConfigs[I].enable_dp_attention>,
                        A2a<kConfigs[I].moe_a2a_backend>, DraftModel<kConfigs[I].draft>,
                        PrefillCp<kConfigs[I].enable_prefill_cp>>;

template <std::size_t I>
int mismatches() {
  using L = PolicyAt<I>;
  static_assert(L::config() == kConfigs[I]);
  static_assert(L::tp == L::attn_dp * L::attn_cp * L::attn_tp);
  static_assert(L::tp == L::moe_dp * L::moe_ep * L::moe_tp);
  const RuntimeLayout rt(kConfigs[I]);
  int bad = 0;
  bad += !(L::widths() == rt.widths());
  bad += L::bridge_path() != rt.bridge_path();
  bad += L::dspark().allowed != rt.dspark().allowed;
  bad += L::cp_token_split() != rt.cp_token_split();
  for (int r = 0; r < L::tp; ++r) {
    bad += !(L::coords(r) == rt.coords(r));
    for (GroupKind g : kAllGroupKinds) {
      bad += L::group_index(g, r) != rt.group_index(g, r);
      bad += L::group_rank(g, r) != rt.group_rank(g, r);
      bad += L::group_size(g) != rt.group_size(g);
    }
  }
  return bad;
}

template <std::size_t... I>
int all_mismatches(std::index_sequence<I...>) {
  return (mismatches<I>() + ...);
}

}  // namespace

static_assert(kCount > 500, "the twin sweep covers hundreds of layouts");

TEST_CASE("twin: compile-time Layout<...> equals RuntimeLayout over every swept layout") {
  CHECK(all_mismatches(std::make_index_sequence<kCount>{}) == 0);
  MESSAGE("compared " << kCount << " layouts instantiated as types");
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
