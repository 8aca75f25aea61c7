// Expert locations: static and rebalanced maps against maps worked out by hand, the replica choices,
// a simulated dispatch in which every token's experts are each computed by exactly one replica, the
// balance goal on a Zipf(1.2) load (64 experts, top-8, moe_ep 8, 8 redundant), load counting, the
// JSON form, and the bad inputs.
#include <doctest/doctest.h>

#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdint>
#include <map>
#include <relayout/placement/expert_load_json.hpp>
#include <relayout/placement/expert_location.hpp>
#include <relayout/placement/zipf_routing.hpp>
#include <set>
#include <string>
#include <vector>

#include "tolerance.hpp"

using relayout::test::within_abs;
using relayout::test::within_rel;

using namespace relayout;

namespace {

using Host = Kokkos::DefaultHostExecutionSpace;
using HostIds = Kokkos::View<int**, Kokkos::LayoutRight, Host::memory_space>;

template <class F>
std::string error_input(F&& f) {
  try {
    f();
  } catch (const LayoutError& e) {
    return e.input() + ": " + e.what();
  }
  return "no error";
}

HostIds zipf_ids(const ZipfRouting& z, std::int64_t first, std::int64_t rows) {
  HostIds ids("ids", static_cast<std::size_t>(rows), static_cast<std::size_t>(z.top_k));
  zipf_topk_ids(Host(), z, first, ids);
  return ids;
}

std::vector<double> logical_counts(const HostIds& ids, int experts) {
  std::vector<double> c(static_cast<std::size_t>(experts), 0.0);
  for (std::size_t r = 0; r < ids.extent(0); ++r)
    for (std::size_t j = 0; j < ids.extent(1); ++j) c[static_cast<std::size_t>(ids(r, j))] += 1;
  return c;
}

// Tokens per moe_ep member when the tokens of ids (global indices first..) go to the replicas
// `choice` picks; tokens are spread over ep source members in equal consecutive blocks.
std::vector<std::int64_t> member_tokens(const ExpertLocation& loc, const HostIds& ids, ReplicaChoice choice) {
  std::vector<std::int64_t> m(static_cast<std::size_t>(loc.ep()), 0);
  const auto per_src = static_cast<std::int64_t>(ids.extent(0)) / loc.ep();
  for (std::int64_t t = 0; t < static_cast<std::int64_t>(ids.extent(0)); ++t)
    for (std::size_t j = 0; j < ids.extent(1); ++j)
      ++m[static_cast<std::size_t>(loc.rank_of(loc.choose(ids(t, j), t, static_cast<int>(t / per_src), choice)))];
  return m;
}

}  // namespace

TEST_CASE("expert location: the static placement") {
  const auto plain = ExpertLocation::identity(64, 0, 8);
  CHECK(plain.physical() == 64);
  CHECK(plain.per_rank() == 8);
  for (int p = 0; p < 64; ++p) {
    CHECK(plain.logical_of(p) == p);
    CHECK(plain.rank_of(p) == p / 8);
    CHECK(plain.replicas(p) == 1);
  }
  const auto extra = ExpertLocation::identity(64, 8, 8);
  CHECK(extra.physical() == 72);
  CHECK(extra.per_rank() == 9);
  CHECK(extra.redundant() == 8);
  CHECK(extra.logical_of(64) == 0);
  CHECK(extra.logical_of(71) == 7);
  CHECK(extra.replicas_of(3) == std::vector<int>{3, 67});
  CHECK(extra.replicas(8) == 1);
  CHECK(extra.rank_of(67) == 7);
  CHECK(extra.describe().substr(0, 30) == "member 0: 0 1 2 3 4 5 6 7 8 | ");
  CHECK(plain.fingerprint() != extra.fingerprint());
  CHECK(ExpertLocation::identity(64, 8, 8).fingerprint() == extra.fingerprint());
}

TEST_CASE("expert location: bad inputs name the input and the rule") {
  CHECK(error_input([] { ExpertLocation::identity(64, 8, 1); }) ==
        "redundant_experts: expert location: 8 redundant experts with moe_ep = 1; replicas balance load across "
        "moe_ep members, so they need moe_ep > 1");
  CHECK(error_input([] { ExpertLocation::identity(64, 5, 8); }) ==
        "redundant_experts: expert location: 64 routed + 5 redundant = 69 physical experts cannot be split evenly "
        "over moe_ep = 8");
  CHECK(error_input([] { ExpertLocation::identity(0, 0, 1); }).starts_with("experts: "));
  CHECK(error_input([] { ExpertLocation::identity(8, -1, 1); }).starts_with("redundant_experts: "));
  // A map that loses logical expert 2 (physical 2 holds a second copy of 1 instead).
  CHECK(error_input([] { ExpertLocation::from_map(4, 2, {0, 1, 1, 3}); }) ==
        "expert_location: expert location: logical expert 2 has no physical replica; every logical expert needs at "
        "least one");
  CHECK(error_input([] { ExpertLocation::from_map(4, 2, {0, 1, 2, 4}); }) ==
        "expert_location: expert location: physical expert 3 holds logical expert 4, outside [0, routed = 4)");
  CHECK(error_input([] { ExpertLocation::from_map(4, 2, {0, 1, 2}); }).starts_with("redundant_experts: "));
  CHECK(error_input([] { ExpertLocation::from_map(4, 1, {0, 1, 2, 3, 0, 1}); }).starts_with("redundant_experts: "));
  const std::vector<double> neg{1, -1, 2, 3};
  CHECK(error_input([&] { ExpertLocation::rebalanced(neg, 0, 2); }).starts_with("expert_load: rebalance: the load of logical expert 1"));
  const std::vector<double> four{1, 2, 3, 4};
  CHECK(error_input([&] { ExpertLocation::rebalanced(four, 0, 2, {.nodes = 3}); }).starts_with("nodes: "));
  CHECK(error_input([&] { ExpertLocation::rebalanced(four, 0, 2, {.groups = 3}); }).starts_with("groups: "));
  CHECK(error_input([&] { ExpertLocation::rebalanced(four, 2, 1); }).starts_with("redundant_experts: "));
  const auto loc = ExpertLocation::identity(4, 0, 2);
  CHECK(error_input([&] { loc.choose(0, 0, 2, ReplicaChoice::static_per_rank); }).starts_with("source_rank: "));
  CHECK(error_input([&] { loc.choose(0, -1, 0, ReplicaChoice::by_token); }).starts_with("global_token: "));
}

TEST_CASE("rebalance (global): replicas by load per replica, packed heaviest first into the lightest member") {
  // loads 10 6 3 1, 2 redundant, 3 members of 2 slots. Extra replicas: 10 -> 2 copies (5 each),
  // then 6 -> 2 copies (3 each). Replicas 5 5 3 3 3 1 by weight: 5 -> m0, 5 -> m1, 3 (expert 1)
  // -> m2, 3 (expert 1) -> m2 (lightest with room), 3 (expert 2) -> m0 (tie with m1), 1 -> m1.
  const std::vector<double> load{10, 6, 3, 1};
  const auto loc = ExpertLocation::rebalanced(load, 2, 3);
  CHECK(loc.physical_to_logical() == std::vector<int>{0, 2, 0, 3, 1, 1});
  CHECK(loc.replicas_of(0) == std::vector<int>{0, 2});
  CHECK(loc.replicas_of(1) == std::vector<int>{4, 5});
  CHECK(expected_member_load(loc, load) == std::vector<double>{8, 6, 6});
  CHECK(max_over_mean(expected_member_load(loc, load)) == within_rel(8.0 / (20.0 / 3.0), 1e-9));
  // The static placement of 6 slots holds 0 1 | 2 3 | 0 1: experts 0 and 1 split over members 0, 2.
  CHECK(expected_member_load(ExpertLocation::identity(4, 2, 3), load) == std::vector<double>{5 + 3, 3 + 1, 5 + 3});
  // groups % nodes != 0 falls back to the global policy.
  const std::vector<double> six{5, 1, 4, 2, 3, 0};
  CHECK(ExpertLocation::rebalanced(six, 2, 4, {.nodes = 2, .groups = 3}) == ExpertLocation::rebalanced(six, 2, 4));
}

TEST_CASE("rebalance (hierarchical): groups onto nodes, replicas within a node, then onto its members") {
  // 8 experts in 4 groups of 2, 2 nodes of 2 members, 4 redundant: 12 physical, 3 per member.
  // Group loads 10 4 8 6: g0 -> node 0, g2 -> node 1, g3 -> node 1, g1 -> node 0.
  // Node 0 (experts 0-3, loads 9 1 2 2, 6 slots): expert 0 gets 3 copies (3 each); replicas 3 3 3
  // (expert 0) 2 (2) 2 (3) 1 (1) -> member 0: 0 0 1, member 1: 0 2 3.
  // Node 1 (experts 4-7, loads 8 0 3 3): expert 4 gets 3 copies (8/3 each); replicas 3 (6) 3 (7)
  // 8/3 8/3 8/3 (4) 0 (5) -> member 2: 6 4 4, member 3: 7 4 5.
  const std::vector<double> load{9, 1, 2, 2, 8, 0, 3, 3};
  const auto loc = ExpertLocation::rebalanced(load, 4, 4, {.nodes = 2, .groups = 4});
  CHECK(loc.physical_to_logical() == std::vector<int>{0, 0, 1, 0, 2, 3, 6, 4, 4, 7, 4, 5});
  CHECK(loc.replicas(0) == 3);
  CHECK(loc.replicas(4) == 3);
  // Groups land on nodes whole: a node's members hold only that node's experts.
  for (int p = 0; p < 6; ++p) CHECK(loc.logical_of(p) < 4);
  for (int p = 6; p < 12; ++p) CHECK(loc.logical_of(p) >= 4);
}

TEST_CASE("replica choice: static per source member and by token, on the host and in the kernel") {
  const auto loc = ExpertLocation::from_map(4, 3, {0, 2, 0, 3, 1, 1});
  using C = ReplicaChoice;
  // Logical 0 has replicas 0 (member 0) and 2 (member 1); member 2 holds none: dealt replica 0.
  CHECK(loc.choose(0, 0, 0, C::static_per_rank) == 0);
  CHECK(loc.choose(0, 0, 1, C::static_per_rank) == 2);
  CHECK(loc.choose(0, 0, 2, C::static_per_rank) == 0);
  // Logical 1 lives twice on member 2; members 0 and 1 are dealt (1 + 0) % 2 and (1 + 1) % 2.
  CHECK(loc.choose(1, 0, 0, C::static_per_rank) == 5);
  CHECK(loc.choose(1, 0, 1, C::static_per_rank) == 4);
  CHECK(loc.choose(1, 0, 2, C::static_per_rank) == 4);
  CHECK(loc.choose(2, 9, 1, C::static_per_rank) == 1);
  // By token: replica (token + logical) % replicas.
  CHECK(loc.choose(0, 5, 0, C::by_token) == 2);
  CHECK(loc.choose(0, 6, 2, C::by_token) == 0);
  CHECK(loc.choose(1, 5, 1, C::by_token) == 4);
  CHECK(loc.choose(1, 6, 1, C::by_token) == 5);
  CHECK(loc.choose(3, 6, 1, C::by_token) == 3);

  using Space = Kokkos::DefaultExecutionSpace;
  const Space exec;
  const std::int64_t rows = 10, first = 100;
  Kokkos::View<int**, Kokkos::LayoutRight, Space::memory_space> ids("ids", rows, 4), phys("phys", rows, 4);
  auto hi = Kokkos::create_mirror_view(ids);
  for (std::int64_t r = 0; r < rows; ++r)
    for (int j = 0; j < 4; ++j) hi(r, j) = static_cast<int>((r + j) % 4);
  Kokkos::deep_copy(ids, hi);
  for (C c : {C::static_per_rank, C::by_token})
    for (int src = 0; src < 3; ++src) {
      const auto table = replica_table(exec, loc, src, c);
      to_physical(exec, table, ids, first, phys);
      auto hp = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), phys);
      int differ = 0;
      for (std::int64_t r = 0; r < rows; ++r)
        for (int j = 0; j < 4; ++j) differ += hp(r, j) != loc.choose(hi(r, j), first + r, src, c);
      CHECK_MESSAGE(differ == 0, std::string(to_string(c)), " source ", src);
    }
  hi(3, 1) = 4;
  hi(7, 0) = -2;
  Kokkos::deep_copy(ids, hi);
  CHECK_THROWS_WITH_AS(to_physical(exec, replica_table(exec, loc, 0, C::by_token), ids, first, phys),
                       "to_physical: 2 expert id(s) outside [0, routed = 4)", LayoutError);
}

TEST_CASE("simulated dispatch: every token's experts are each computed by exactly one replica") {
  const ZipfRouting z{.experts = 64, .top_k = 8, .s = 1.2, .seed = 3};
  const std::int64_t tokens = 2048;
  const HostIds ids = zipf_ids(z, 0, tokens);
  const auto loc = ExpertLocation::rebalanced(logical_counts(ids, 64), 8, 8);
  REQUIRE(loc.max_replicas() >= 2);
  for (ReplicaChoice c : {ReplicaChoice::static_per_rank, ReplicaChoice::by_token}) {
    // Each member's experts process what arrives at its physical slots: (token, physical) entries.
    std::vector<std::vector<std::pair<std::int64_t, int>>> arrived(8);
    for (std::int64_t t = 0; t < tokens; ++t)
      for (int j = 0; j < 8; ++j) {
        const int p = loc.choose(ids(t, j), t, static_cast<int>(t / (tokens / 8)), c);
        arrived[static_cast<std::size_t>(loc.rank_of(p))].push_back({t, p});
      }
    // The expert side: which logical experts each token was computed by, and how often.
    std::map<std::pair<std::int64_t, int>, int> computed;
    int wrong_member = 0;
    for (int m = 0; m < 8; ++m)
      for (const auto& [t, p] : arrived[static_cast<std::size_t>(m)]) {
        wrong_member += p / loc.per_rank() != m;
        ++computed[{t, loc.logical_of(p)}];
      }
    int missing = 0, twice = 0;
    for (std::int64_t t = 0; t < tokens; ++t)
      for (int j = 0; j < 8; ++j) {
        const auto it = computed.find({t, ids(t, j)});
        missing += it == computed.end();
        twice += it != computed.end() && it->second != 1;
      }
    std::size_t entries = 0;
    for (const auto& [key, n] : computed) entries += static_cast<std::size_t>(n);
    CHECK(wrong_member == 0);
    CHECK(missing == 0);
    CHECK(twice == 0);
    CHECK(entries == static_cast<std::size_t>(tokens * 8));  // nothing computed that was not routed
    // Every replica of a replicated expert gets tokens (the choice really spreads them).
    std::set<int> used;
    for (const auto& a : arrived)
      for (const auto& e : a) used.insert(e.second);
    CHECK(used.size() == static_cast<std::size_t>(loc.physical()));
  }
}

TEST_CASE("balance goal: Zipf(1.2) over 64 experts, top-8, moe_ep 8, 8 redundant: max/mean <= 1.15") {
  for (bool shuffle : {false, true}) {
    const ZipfRouting z{.experts = 64, .top_k = 8, .s = 1.2, .seed = 1, .shuffle = shuffle};
    const std::int64_t tokens = 8192;  // 1024 per member
    // Rebalanced on one step's tokens, measured on the next step's (tokens 8192..16383).
    const HostIds ids_a = zipf_ids(z, 0, tokens);
    const HostIds ids_b = zipf_ids(z, tokens, tokens);
    const std::vector<double> load = logical_counts(ids_a, 64);
    const auto before = ExpertLocation::identity(64, 0, 8);
    const auto after = ExpertLocation::rebalanced(load, 8, 8);
    const double b = max_over_mean(member_tokens(before, ids_b, ReplicaChoice::by_token));
    const double a = max_over_mean(member_tokens(after, ids_b, ReplicaChoice::by_token));
    const double a_static = max_over_mean(member_tokens(after, ids_b, ReplicaChoice::static_per_rank));
    const double a_expected = max_over_mean(expected_member_load(after, load));
    MESSAGE("hot experts ", std::string(shuffle ? "shuffled" : "contiguous"), ": max/mean tokens per member before ", b,
            ", after (by_token) ", a, ", after (static_per_rank) ", a_static, ", expected from the measured load ",
            a_expected);
    CHECK(b > 1.5);
    CHECK(a <= 1.15);
    CHECK(a_static <= 1.15);
    CHECK(a_expected <= 1.15);
  }
}

TEST_CASE("zipf routing: distinct experts, the Zipf law for top-1, the same tokens however split") {
  const ZipfRouting z{.experts = 16, .top_k = 4, .s = 1.2, .seed = 9};
  const HostIds whole = zipf_ids(z, 0, 300);
  const HostIds part = zipf_ids(z, 120, 180);
  int bad = 0;
  for (int t = 0; t < 300; ++t) {
    std::set<int> seen;
    for (int j = 0; j < 4; ++j) {
      bad += whole(t, j) < 0 || whole(t, j) >= 16;
      seen.insert(whole(t, j));
    }
    bad += seen.size() != 4;
    if (t >= 120)
      for (int j = 0; j < 4; ++j) bad += part(t - 120, j) != whole(t, j);
  }
  CHECK(bad == 0);
  // Top-1: expert e is chosen with probability (e+1)^-s / sum; within 5 sigma over 20000 tokens.
  const ZipfRouting one{.experts = 8, .top_k = 1, .s = 1.2, .seed = 4};
  const std::vector<double> freq = logical_counts(zipf_ids(one, 0, 20000), 8);
  double sum = 0;
  for (int e = 1; e <= 8; ++e) sum += std::pow(e, -1.2);
  for (int e = 0; e < 8; ++e) {
    const double p = std::pow(e + 1, -1.2) / sum, n = 20000;
    CHECK(std::fabs(freq[static_cast<std::size_t>(e)] - n * p) <= 5 * std::sqrt(n * p * (1 - p)));
  }
  // shuffle permutes which expert is hot, with the same weights.
  std::vector<double> w = zipf_expert_weights(one), ws = zipf_expert_weights({.experts = 8, .top_k = 1, .s = 1.2, .seed = 4, .shuffle = true});
  std::multiset<double> a(w.begin(), w.end()), b(ws.begin(), ws.end());
  CHECK(a == b);
  CHECK(w != ws);
  CHECK_THROWS_AS(zipf_expert_weights({.experts = 4, .top_k = 5}), LayoutError);
  CHECK_THROWS_AS(zipf_expert_weights({.experts = 4, .top_k = 1, .s = -1}), LayoutError);
}

TEST_CASE("expert load: counted per physical, logical expert and member on the execution space") {
  const auto loc = ExpertLocation::from_map(4, 3, {0, 2, 0, 3, 1, 1});
  using Space = Kokkos::DefaultExecutionSpace;
  Kokkos::View<int**, Kokkos::LayoutRight, Space::memory_space> ids("ids", 3, 2);
  auto h = Kokkos::create_mirror_view(ids);
  const int v[3][2] = {{0, 1}, {2, -1}, {0, 5}};
  for (int r = 0; r < 3; ++r)
    for (int j = 0; j < 2; ++j) h(r, j) = v[r][j];
  Kokkos::deep_copy(ids, h);
  const ExpertLoad load = count_expert_load(Space(), loc, ids);
  CHECK(load.physical == std::vector<std::int64_t>{2, 1, 1, 0, 0, 1});
  CHECK(load.logical == std::vector<std::int64_t>{3, 1, 1, 0});
  CHECK(load.members == std::vector<std::int64_t>{3, 1, 1});
  CHECK(load.imbalance() == within_rel(3.0 / (5.0 / 3.0), 1e-9));
  // Rebalanced from the step's logical load 3 1 1 0: expert 0 gets three copies, one per member.
  CHECK(ExpertLocation::rebalanced(load.logical_as_double(), 2, 3).physical_to_logical() ==
        std::vector<int>{0, 1, 0, 2, 0, 3});
  h(1, 1) = 6;
  Kokkos::deep_copy(ids, h);
  CHECK_THROWS_WITH_AS(count_expert_load(Space(), loc, ids), "count_expert_load: 1 physical id(s) outside [0, 6)", LayoutError);
  CHECK_THROWS_AS(ExpertLoad(loc, {1, 2, 3}), LayoutError);
}

TEST_CASE("expert load JSON: written, read back, and refused when it does not match") {
  const std::vector<std::int64_t> counts{10, 0, 3, 7};
  const std::string text = expert_load_json(counts);
  CHECK(text == "{\"experts\": 4, \"loads\": [10, 0, 3, 7]}\n");
  CHECK(parse_expert_load_json(text, 4) == std::vector<double>{10, 0, 3, 7});
  const std::vector<double> frac{0.1, 2.5e-7, 1e20};
  CHECK(parse_expert_load_json(expert_load_json(frac)) == frac);  // shortest round-trip text
  CHECK(parse_expert_load_json(" {\n \"loads\" : [ 1 , 2.5 ],\"experts\":2 } ", 2) == std::vector<double>{1, 2.5});
  CHECK(parse_expert_load_json("{\"experts\": 1, \"loads\": [1e3]}") == std::vector<double>{1000});
  const auto err = [](const char* t, int expected = -1) {
    return error_input([&] { parse_expert_load_json(t, expected, "loads.json"); });
  };
  CHECK(err("{\"experts\": 4, \"loads\": [1, 2, 3, 4]}", 64) ==
        "expert_load: loads.json: the loads are for 4 experts; the model has 64 routed experts");
  CHECK(err("{\"experts\": 3, \"loads\": [1, 2]}").starts_with(
      "expert_load: loads.json: \"loads\" holds 2 numbers for \"experts\": 3"));
  CHECK(err("{\"experts\": 2, \"loads\": [1, -2]}").find("a load must be a finite number >= 0") != std::string::npos);
  CHECK(err("{\"experts\": 2, \"loads\": [1, 2], \"extra\": 1}").find("unknown key \"extra\"") != std::string::npos);
  CHECK(err("{\"experts\": 2, \"loads\": [1, 2]} x").find("text after the closing brace") != std::string::npos);
  CHECK(err("{\"experts\": 2}").find("no \"loads\"") != std::string::npos);
  CHECK(err("{\"experts\": 2.5, \"loads\": [1, 2]}").find("whole number") != std::string::npos);
  CHECK(err("{\"experts\": 1, \"loads\": [1e999]}").find("expected a number") != std::string::npos);
  CHECK(err("{\"experts\": 1, \"loads\": [1,]}").find("expected a number") != std::string::npos);
  CHECK(err("").find("expected '{'") != std::string::npos);
  CHECK(err("{\"experts\": 1, \"experts\": 1, \"loads\": [1]}").find("appears twice") != std::string::npos);
  // A parsed load feeds the rebalancer directly.
  const auto loc = ExpertLocation::rebalanced(parse_expert_load_json("{\"experts\": 4, \"loads\": [10, 6, 3, 1]}", 4), 2, 3);
  CHECK(loc.physical_to_logical() == std::vector<int>{0, 2, 0, 3, 1, 1});
}
