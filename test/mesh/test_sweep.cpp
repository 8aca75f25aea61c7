// Property sweeps: every valid layout with tp <= 64 against a brute-force enumeration of widths,
// coordinates and groups, and accept/reject plus MoE-DP group membership over every flag the layout
// engine reads against SGLang's launch rules restated independently below.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <relayout/mesh.hpp>
#include <string>
#include <set>
#include <tuple>
#include <vector>

#include "spec_model.hpp"

using namespace relayout;
using namespace relayout::spec_model;

namespace {

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

// Every valid config with tp <= max_tp (both DP-attention settings, backends none/deepep/pplx).
std::vector<LayoutConfig> all_valid_configs(int max_tp) {
  std::vector<LayoutConfig> out;
  for (int tp = 1; tp <= max_tp; ++tp)
    for (bool dpa : {false, true})
      for (int dp : dpa ? divisors(tp) : std::vector<int>{1})  // dp has an effect only with DP attention
        for (int cp : divisors(tp))
          for (Backend b : {Backend::none, Backend::deepep, Backend::pplx})
            for (int ep : divisors(tp))
              for (int moe_dp : divisors(tp)) {
                if (b != Backend::none && ep != 1) continue;  // ep ignored: one representative
                const LayoutConfig c{.tp = tp, .dp = dp, .cp = cp, .ep = ep, .moe_dp = moe_dp,
                                     .enable_dp_attention = dpa, .moe_a2a_backend = b};
                if (spec_valid(c)) out.push_back(c);
              }
  return out;
}

}  // namespace

TEST_CASE("sweep: every valid layout with tp <= 64 matches the brute-force enumeration") {
  const auto configs = all_valid_configs(64);
  REQUIRE(configs.size() > 5000);  // the sweep is real, not a handful
  std::size_t ranks_checked = 0;
  // Distinct layouts: DP attention on with dp = 1 has the widths (and path) of DP attention off.
  std::set<std::tuple<int, int, int, int, int, int, Backend>> distinct;
  for (const LayoutConfig& c : configs) {
    const RuntimeLayout l(c);
    const Expected e = spec_widths(c);
    distinct.insert({c.tp, e.attn_dp, e.attn_cp, e.moe_dp, e.moe_ep, e.moe_tp, c.moe_a2a_backend});
    const Widths& w = l.widths();
    REQUIRE(w.attn_dp == e.attn_dp);
    REQUIRE(w.attn_cp == e.attn_cp);
    REQUIRE(w.attn_tp == e.attn_tp);
    REQUIRE(w.moe_dp == e.moe_dp);
    REQUIRE(w.moe_ep == e.moe_ep);
    REQUIRE(w.moe_tp == e.moe_tp);
    REQUIRE(w.dcp == 1);
    REQUIRE(w.dense_tp == c.tp);
    REQUIRE(w.tp == w.attn_dp * w.attn_cp * w.attn_tp);
    REQUIRE(w.tp == w.moe_dp * w.moe_ep * w.moe_tp);

    for (int r = 0; r < c.tp; ++r) {
      const RankCoords k = l.coords(r);
      REQUIRE(k == spec_coords(e, c.tp, r));
      // Coordinates invert (docs/layout.md#rank-coordinates).
      REQUIRE(r == (k.attn_dp_rank * e.attn_cp + k.attn_cp_rank) * e.attn_tp + k.attn_tp_rank);
      REQUIRE(r == (k.moe_dp_rank * e.moe_ep + k.moe_ep_rank) * e.moe_tp + k.moe_tp_rank);
      ++ranks_checked;
    }

    for (GroupKind g : kAllGroupKinds) {
      // Brute force: partition ranks by the coordinates the group shares.
      std::map<std::tuple<int, int, int>, std::vector<int>> by_key;
      for (int r = 0; r < c.tp; ++r) by_key[group_key(g, spec_coords(e, c.tp, r), e)].push_back(r);
      std::vector<std::vector<int>> expected;
      for (auto& [key, members] : by_key) expected.push_back(members);
      std::sort(expected.begin(), expected.end());

      auto groups = l.groups(g);
      // Every rank in exactly one group of this kind.
      std::vector<int> seen(static_cast<std::size_t>(c.tp), 0);
      for (const auto& members : groups) {
        REQUIRE(static_cast<int>(members.size()) == expected_group_size(g, e, c.tp));
        for (int m : members) ++seen[static_cast<std::size_t>(m)];
      }
      REQUIRE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
      // Group ranks and indices agree with the member lists.
      for (std::size_t id = 0; id < groups.size(); ++id)
        for (std::size_t pos = 0; pos < groups[id].size(); ++pos) {
          REQUIRE(l.group_index(g, groups[id][pos]) == static_cast<int>(id));
          REQUIRE(l.group_rank(g, groups[id][pos]) == static_cast<int>(pos));
        }
      auto sorted = groups;
      std::sort(sorted.begin(), sorted.end());
      REQUIRE(sorted == expected);
    }
  }
  MESSAGE("checked " << configs.size() << " configs (" << distinct.size() << " distinct layouts), " << ranks_checked
                      << " ranks");
}

TEST_CASE("sweep: a config is accepted exactly when SGLang's launch rules say it starts") {
  int accepted = 0, rejected = 0;
  for (int tp = 0; tp <= 64; ++tp)
    for (int dp = 0; dp <= 66; dp += (dp < 20 ? 1 : 7))
      for (int cp : {0, 1, 2, 3, 4})
        for (bool dpa : {false, true})
          for (int ep : {1, 2, 3, 5, 8, 64})
            for (int moe_dp : {1, 2, 3})
              for (Backend b : {Backend::none, Backend::deepep}) {
                const LayoutConfig c{.tp = tp, .dp = dp, .cp = cp, .ep = ep, .moe_dp = moe_dp,
                                     .enable_dp_attention = dpa, .moe_a2a_backend = b};
                const bool valid = spec_valid(c);
                const WidthsResult r = derive_widths(c);
                REQUIRE((r.rule == LayoutRule::ok) == valid);
                if (valid) {
                  ++accepted;
                } else {
                  ++rejected;
                  REQUIRE_THROWS_AS(RuntimeLayout{c}, LayoutError);
                }
              }
  CHECK(accepted > 1000);
  CHECK(rejected > 1000);
}

// Every flag the layout engine reads, every backend, prefill CP off/unset/interleave/zigzag and
// --attn-dp-size absent or given: accept/reject, widths and the MoE-DP group of every rank equal the
// restatement above. The counts are the README's figures.
TEST_CASE("sweep: SGLang's launch rules over tp <= 32, every backend, prefill CP and --attn-dp-size") {
  constexpr int kDps[] = {1, 2, 3, 4, 8, 16, 32};
  constexpr int kCps[] = {1, 2, 3, 4, 8};
  constexpr int kEps[] = {1, 2, 4, 8};
  constexpr int kMoeDps[] = {1, 2, 4, 8};
  const std::optional<int> kAttnDps[] = {std::nullopt, 1, 2, 4, 0};
  struct Prefill {
    bool on;
    std::optional<CpStrategy> strategy;
  };
  // parallel_hook.py handle_context_parallelism: prefill CP without a strategy does not start.
  const Prefill kPrefill[] = {{false, std::nullopt}, {true, std::nullopt}, {true, CpStrategy::interleave},
                              {true, CpStrategy::zigzag}};
  long accepted = 0, rejected = 0, aliased = 0, prefill_accepted = 0, throws_checked = 0;
  for (int tp = 1; tp <= 32; ++tp)
    for (int dp : kDps)
      for (int cp : kCps)
        for (int ep : kEps)
          for (int moe_dp : kMoeDps)
            for (bool dpa : {false, true})
              for (const auto& [backend, name] : impl::kBackendNames.entries)
                for (const Prefill& pf : kPrefill)
                  for (const std::optional<int>& attn_dp : kAttnDps) {
                    LayoutConfig c{.tp = tp, .dp = dp, .cp = cp, .ep = ep, .moe_dp = moe_dp,
                                   .enable_dp_attention = dpa, .moe_a2a_backend = backend};
                    c.attn_dp_size = attn_dp;
                    c.enable_prefill_cp = pf.on;
                    c.cp_strategy = pf.strategy;
                    const Sglang want = sglang_launch(c);
                    const WidthsResult got = derive_widths(c);
                    if ((got.rule == LayoutRule::ok) != want.starts) {
                      CAPTURE(tp); CAPTURE(dp); CAPTURE(cp); CAPTURE(ep); CAPTURE(moe_dp);
                      CAPTURE(dpa); CAPTURE(name); CAPTURE(pf.on); CAPTURE(attn_dp.value_or(-1));
                      CAPTURE(int(got.rule));
                      REQUIRE((got.rule == LayoutRule::ok) == want.starts);
                    }
                    if (!want.starts) {
                      ++rejected;
                      REQUIRE(std::string(got.input).rfind("--", 0) == 0);  // names a flag
                      if (rejected % 101 == 0) {  // throwing is slow; a sample proves the path
                        CHECK_THROWS_AS(RuntimeLayout{c}, LayoutError);
                        ++throws_checked;
                      }
                      continue;
                    }
                    ++accepted;
                    prefill_accepted += pf.on;
                    const Expected& e = want.w;
                    const Widths& w = got.widths;
                    REQUIRE((w.attn_dp == e.attn_dp && w.attn_cp == e.attn_cp &&
                             w.attn_tp == e.attn_tp && w.moe_dp == e.moe_dp &&
                             w.moe_ep == e.moe_ep && w.moe_tp == e.moe_tp));
                    if (e.attn_cp == 1 && e.moe_dp == 1) continue;  // MoE-DP groups are single ranks
                    aliased += e.attn_cp > e.moe_dp;
                    const RuntimeLayout l(c);
                    std::map<std::tuple<int, int, int>, std::vector<int>> by_key;
                    for (int r = 0; r < tp; ++r)
                      by_key[group_key(GroupKind::moe_dp, spec_coords(e, tp, r), e)].push_back(r);
                    for (int r = 0; r < tp; ++r) {
                      auto members = l.group_members(GroupKind::moe_dp, r);
                      std::sort(members.begin(), members.end());
                      REQUIRE(members == by_key[group_key(GroupKind::moe_dp, spec_coords(e, tp, r), e)]);
                    }
                  }
  MESSAGE("SGLang rules sweep: " << accepted + rejected << " configurations, " << accepted
                                 << " accepted (" << prefill_accepted << " with prefill CP, "
                                 << aliased << " with the MoE-DP group = attention-CP group), "
                                 << rejected << " rejected (" << throws_checked
                                 << " re-checked to throw LayoutError)");
  CHECK(accepted > 10000);
  CHECK(prefill_accepted > 100);
  CHECK(aliased > 1000);
}
