// Property sweep: every valid layout with tp <= 64 against a brute-force enumeration written
// straight from SPEC §1–§3, and every invalid one rejected.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <relayout/mesh.hpp>
#include <tuple>
#include <vector>

using namespace relayout;

namespace {

struct Expected {
  int attn_dp, attn_cp, attn_tp, moe_dp, moe_ep, moe_tp;
};

// SPEC §1 and §4 as written, independent of derive_widths().
bool spec_valid(const LayoutConfig& c) {
  if (c.tp < 1 || c.dp < 1 || c.cp < 1 || c.ep < 1 || c.moe_dp < 1) return false;
  const int attn_dp = c.enable_dp_attention ? c.dp : 1;
  const int moe_ep = c.moe_a2a_backend == Backend::none ? c.ep : c.tp;
  return c.tp % (attn_dp * c.cp) == 0 && c.tp % (moe_ep * c.moe_dp) == 0;
}

Expected spec_widths(const LayoutConfig& c) {
  Expected e{};
  e.attn_dp = c.enable_dp_attention ? c.dp : 1;
  e.attn_cp = c.cp;
  e.attn_tp = c.tp / e.attn_dp / e.attn_cp;
  e.moe_ep = c.moe_a2a_backend == Backend::none ? c.ep : c.tp;
  e.moe_dp = c.moe_dp;
  e.moe_tp = c.tp / e.moe_ep / e.moe_dp;
  return e;
}

// SPEC §2 formulas verbatim.
RankCoords spec_coords(const Expected& e, int tp, int r) {
  RankCoords k;
  k.rank = r;
  k.attn_tp_rank = r % e.attn_tp;
  k.attn_cp_rank = (r / e.attn_tp) % e.attn_cp;
  k.attn_dp_rank = r / (e.attn_tp * e.attn_cp);
  k.moe_dp_rank = r / (tp / e.moe_dp);
  k.moe_ep_rank = (r % (tp / e.moe_dp)) / e.moe_tp;
  k.moe_tp_rank = r % e.moe_tp;
  return k;
}

// SPEC §3: a group is the set of ranks sharing the coordinates named here.
std::tuple<int, int, int> group_key(GroupKind g, const RankCoords& k) {
  switch (g) {
    case GroupKind::tp: return {0, 0, 0};
    case GroupKind::attn_tp: return {k.attn_dp_rank, k.attn_cp_rank, 0};
    case GroupKind::attn_cp: return {k.attn_dp_rank, k.attn_tp_rank, 0};
    case GroupKind::moe_tp: return {k.moe_dp_rank, k.moe_ep_rank, 0};
    case GroupKind::moe_ep: return {k.moe_dp_rank, k.moe_tp_rank, 0};
    case GroupKind::moe_dp: return {k.moe_ep_rank, k.moe_tp_rank, 0};
  }
  return {};
}

int expected_group_size(GroupKind g, const Expected& e, int tp) {
  switch (g) {
    case GroupKind::tp: return tp;
    case GroupKind::attn_tp: return e.attn_tp;
    case GroupKind::attn_cp: return e.attn_cp;
    case GroupKind::moe_tp: return e.moe_tp;
    case GroupKind::moe_ep: return e.moe_ep;
    case GroupKind::moe_dp: return e.moe_dp;
  }
  return 0;
}

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
      for (int dp : divisors(tp))
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
  REQUIRE(configs.size() > 10000);  // the sweep is real, not a handful
  std::size_t ranks_checked = 0;
  for (const LayoutConfig& c : configs) {
    const RuntimeLayout l(c);
    const Expected e = spec_widths(c);
    const Widths& w = l.widths();
    REQUIRE(w.attn_dp == e.attn_dp);
    REQUIRE(w.attn_cp == e.attn_cp);
    REQUIRE(w.attn_tp == e.attn_tp);
    REQUIRE(w.moe_dp == e.moe_dp);
    REQUIRE(w.moe_ep == e.moe_ep);
    REQUIRE(w.moe_tp == e.moe_tp);
    REQUIRE(w.tp == w.attn_dp * w.attn_cp * w.attn_tp);
    REQUIRE(w.tp == w.moe_dp * w.moe_ep * w.moe_tp);

    for (int r = 0; r < c.tp; ++r) {
      const RankCoords k = l.coords(r);
      REQUIRE(k == spec_coords(e, c.tp, r));
      // Coordinates invert (SPEC §2).
      REQUIRE(r == (k.attn_dp_rank * e.attn_cp + k.attn_cp_rank) * e.attn_tp + k.attn_tp_rank);
      REQUIRE(r == (k.moe_dp_rank * e.moe_ep + k.moe_ep_rank) * e.moe_tp + k.moe_tp_rank);
      ++ranks_checked;
    }

    for (GroupKind g : kAllGroupKinds) {
      // Brute force: partition ranks by the coordinates the group shares.
      std::map<std::tuple<int, int, int>, std::vector<int>> by_key;
      for (int r = 0; r < c.tp; ++r) by_key[group_key(g, spec_coords(e, c.tp, r))].push_back(r);
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
  MESSAGE("checked " << configs.size() << " layouts, " << ranks_checked << " ranks");
}

TEST_CASE("sweep: a config is accepted exactly when SPEC §1 says it is valid") {
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
