// Expert move plans against moves worked out by hand (a rebalance from the static placement, a
// swap between members, a swap within one, a cycle of three, a replica added and removed, a
// replicated expert's sends spread over its holders), the properties of a plan for an EPLB map,
// the cost accounting, the refused map pairs, and move_expert_weights on one rank (local copies
// only) with its refusals.
#include <doctest/doctest.h>

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <relayout/comm/single.hpp>
#include <relayout/placement/expert_moves.hpp>
#include <source_location>
#include <string>
#include <vector>

using namespace relayout;

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using M = ExpertMove;

ExpertLocation map_of(int routed, int ep, std::vector<int> m) { return ExpertLocation::from_map(routed, ep, std::move(m)); }

}  // namespace

TEST_CASE("expert moves: from the static placement to a rebalanced map") {
  // identity(8, 4, 4):  member 0: 0 1 2 | member 1: 3 4 5 | member 2: 6 7 0 | member 3: 1 2 3
  const auto from = ExpertLocation::identity(8, 4, 4);
  const auto to = map_of(8, 4, {0, 5, 1, /**/ 3, 0, 6, /**/ 6, 7, 4, /**/ 1, 2, 0});
  const auto plan = expert_moves(from, to);
  // Slot 1 <- 5 (only on member 1, slot 2); slot 2 <- 1 (member 0 holds it: local copy from slot 1);
  // slot 4 <- 0 (members 0 and 2 hold it, neither has sent: member 0); slot 5 <- 6 (member 2 slot 0);
  // slot 8 <- 4 (member 1 slot 1); slot 11 <- 0 (members 0 and 2 have each sent one: member 0).
  const std::vector<M> want{{5, 1, 2, 0, 1}, {1, 0, 1, 0, 2}, {0, 0, 0, 1, 1},
                            {6, 2, 0, 1, 2}, {4, 1, 1, 2, 2}, {0, 0, 0, 3, 2}};
  CHECK(plan.moves() == want);
  CHECK(plan.routed() == 8);
  CHECK(plan.ep() == 4);
  CHECK(plan.per_rank() == 3);
  CHECK(plan.per_member() == std::vector<MemberMoves>{{2, 1, 1}, {2, 2, 0}, {1, 1, 0}, {0, 1, 0}});
  CHECK(plan.remote() == 5);
  CHECK(plan.busiest() == 2);
  CHECK(!plan.empty());
}

TEST_CASE("expert moves: swaps, a cycle, replicas added and removed, sends spread") {
  const auto plain = ExpertLocation::identity(4, 0, 2);  // 0 1 | 2 3
  SUBCASE("a swap between members") {
    const auto plan = expert_moves(plain, map_of(4, 2, {0, 2, 1, 3}));
    CHECK(plan.moves() == std::vector<M>{{2, 1, 0, 0, 1}, {1, 0, 1, 1, 0}});
    CHECK(plan.per_member() == std::vector<MemberMoves>{{1, 1, 0}, {1, 1, 0}});
    CHECK(plan.describe(64) ==
          "2 slots change (2 between members, 0 local copies; busiest member 1 slots = 64 bytes): member 0 sends 1, "
          "receives 1, copies 0 | member 1 sends 1, receives 1, copies 0");
  }
  SUBCASE("a swap within one member: local copies only") {
    const auto plan = expert_moves(plain, map_of(4, 2, {1, 0, 2, 3}));
    CHECK(plan.moves() == std::vector<M>{{1, 0, 1, 0, 0}, {0, 0, 0, 0, 1}});
    CHECK(plan.remote() == 0);
    CHECK(plan.busiest() == 0);
    CHECK(plan.per_member() == std::vector<MemberMoves>{{0, 0, 2}, {0, 0, 0}});
  }
  SUBCASE("a cycle of three members") {
    const auto plan = expert_moves(ExpertLocation::identity(6, 0, 3), map_of(6, 3, {0, 3, 2, 5, 4, 1}));
    CHECK(plan.moves() == std::vector<M>{{3, 1, 1, 0, 1}, {5, 2, 1, 1, 1}, {1, 0, 1, 2, 1}});
    CHECK(plan.per_member() == std::vector<MemberMoves>{{1, 1, 0}, {1, 1, 0}, {1, 1, 0}});
  }
  SUBCASE("a replica added and one removed, and back") {
    const auto from = ExpertLocation::identity(6, 2, 2);  // 0 1 2 3 | 4 5 0 1
    const auto to = map_of(6, 2, {0, 1, 2, 0, 4, 5, 0, 3});  // 0 gains a third replica, 1 loses one
    // Slot 3 <- 0 from member 0's own slot 0; slot 7 <- 3, held only by member 0 slot 3.
    CHECK(expert_moves(from, to).moves() == std::vector<M>{{0, 0, 0, 0, 3}, {3, 0, 3, 1, 3}});
    // Back: slot 3 <- 3 from member 1 slot 3; slot 7 <- 1 from member 0 slot 1.
    CHECK(expert_moves(to, from).moves() == std::vector<M>{{3, 1, 3, 0, 3}, {1, 0, 1, 1, 3}});
  }
  SUBCASE("a replicated expert's sends spread over the members holding it") {
    const auto from = ExpertLocation::identity(6, 2, 4);  // 0 1 | 2 3 | 4 5 | 0 1
    // Slot 2 <- 0: members 0 and 3 hold it, neither has sent: member 0. Slot 4 <- 0: member 0 has
    // sent one, member 3 none: member 3. Slot 6 (member 3's 0, which it just sent) <- 2 from member
    // 1; slot 7 <- 4 from member 2.
    const auto plan = expert_moves(from, map_of(6, 4, {0, 1, 0, 3, 0, 5, 2, 4}));
    CHECK(plan.moves() == std::vector<M>{{0, 0, 0, 1, 0}, {0, 3, 0, 2, 0}, {2, 1, 0, 3, 0}, {4, 2, 0, 3, 1}});
    CHECK(plan.busiest() == 2);
  }
  SUBCASE("the same map moves nothing") {
    const auto plan = expert_moves(plain, plain);
    CHECK(plan.empty());
    CHECK(plan.per_member() == std::vector<MemberMoves>(2));
    CHECK(plan.describe() ==
          "0 slots change (0 between members, 0 local copies; busiest member 0 slots): member 0 sends 0, receives 0, "
          "copies 0 | member 1 sends 0, receives 0, copies 0");
  }
}

TEST_CASE("expert moves: a plan for an EPLB map fills every changed slot from a holder, locally when it can") {
  std::vector<double> load(32);
  for (std::size_t e = 0; e < load.size(); ++e) load[e] = 1000.0 / double((e * 7) % 32 + 1);
  const auto from = ExpertLocation::identity(32, 8, 8);
  const auto to = ExpertLocation::rebalanced(load, 8, 8);
  const auto plan = expert_moves(from, to);
  int next = 0, sent = 0, received = 0;
  for (const M& m : plan.moves()) {
    const int p = m.dst_rank * 5 + m.dst_slot;
    // Every changed slot once, in order, and none that keeps its expert.
    for (; next < p; ++next) CHECK(from.logical_of(next) == to.logical_of(next));
    CHECK(next++ == p);
    CHECK(from.logical_of(p) != to.logical_of(p));
    CHECK(m.logical == to.logical_of(p));
    CHECK(from.logical_of(m.src_rank * 5 + m.src_slot) == m.logical);
    bool on_dst = false;
    for (int s = 0; s < 5; ++s) on_dst = on_dst || from.logical_of(m.dst_rank * 5 + s) == m.logical;
    CHECK(m.local() == on_dst);
    if (!m.local()) {
      ++sent;
      ++received;
    }
  }
  for (; next < 40; ++next) CHECK(from.logical_of(next) == to.logical_of(next));
  int sum_sent = 0, sum_received = 0;
  for (const MemberMoves& mm : plan.per_member()) {
    sum_sent += mm.sent;
    sum_received += mm.received;
  }
  CHECK(sum_sent == sent);
  CHECK(sum_received == received);
  CHECK(plan.remote() == sent);
  CHECK(expert_moves(from, to).fingerprint() == plan.fingerprint());
  CHECK(expert_moves(to, from).fingerprint() != plan.fingerprint());
}

TEST_CASE("expert moves: maps of different shapes are refused with the rule") {
  const auto a = ExpertLocation::identity(8, 4, 4);
  CHECK_THROWS_WITH_AS(expert_moves(a, ExpertLocation::identity(8, 0, 4)),
                       "expert_moves: `from` maps 8 routed experts onto 12 physical slots over moe_ep = 4, `to` maps 8 "
                       "routed experts onto 8 physical slots over moe_ep = 4; a rebalance keeps the routed experts, the "
                       "physical slots and moe_ep (only the logical expert each slot holds changes)",
                       LayoutError);
  CHECK_THROWS_AS(expert_moves(a, ExpertLocation::identity(4, 8, 4)), LayoutError);
  CHECK_THROWS_AS(expert_moves(a, ExpertLocation::identity(8, 4, 2)), LayoutError);
}

namespace {

// An engine's weights as a table of Views: by_slot[s][t] is tensor t of local slot s.
template <class T>
struct WeightTable {
  using value_type = T;
  using Tensor = Kokkos::View<T*, Space::memory_space>;
  std::vector<std::vector<Tensor>> by_slot;
  int slots() const { return static_cast<int>(by_slot.size()); }
  int tensors() const { return by_slot.empty() ? 0 : static_cast<int>(by_slot.front().size()); }
  Tensor tensor(int slot, int t) const { return by_slot.at(static_cast<std::size_t>(slot)).at(static_cast<std::size_t>(t)); }
};

// Tensor t of logical expert l, element i: distinct for every (l, t, i).
double value(int l, int t, std::size_t i) { return 1000.0 * l + 100.0 * t + double(i); }

WeightTable<double> table(const ExpertLocation& loc, std::vector<std::size_t> extents) {
  WeightTable<double> w;
  for (int s = 0; s < loc.per_rank(); ++s) {
    w.by_slot.emplace_back();
    for (std::size_t t = 0; t < extents.size(); ++t) {
      Kokkos::View<double*, Space::memory_space> v("w", extents[t]);
      auto h = Kokkos::create_mirror_view(v);
      for (std::size_t i = 0; i < extents[t]; ++i) h(i) = value(loc.logical_of(s), int(t), i);
      Kokkos::deep_copy(v, h);
      w.by_slot.back().push_back(v);
    }
  }
  return w;
}

// Whether every slot holds its expert under loc.
bool holds(const WeightTable<double>& w, const ExpertLocation& loc) {
  bool ok = true;
  for (int s = 0; s < w.slots(); ++s)
    for (int t = 0; t < w.tensors(); ++t) {
      const auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), w.tensor(s, t));
      for (std::size_t i = 0; i < h.extent(0); ++i) ok = ok && h(i) == value(loc.logical_of(s), t, i);
    }
  return ok;
}

// An engine whose last slot is not in memory: describing it throws.
struct Unloaded {
  using value_type = double;
  Kokkos::View<double*, Space::memory_space> v{"v", 3};
  int slots() const { return 4; }
  int tensors() const { return 1; }
  Kokkos::View<double*, Space::memory_space> tensor(int s, int) const {
    if (s == 3) throw LayoutError("slot", "slot 3 is not loaded");
    return v;
  }
};
static_assert(ExpertWeightsFor<Unloaded, Space>);
static_assert(ExpertWeightsFor<WeightTable<bf16>, Space>);
static_assert(!ExpertWeightsFor<int, Space>);

}  // namespace

TEST_CASE("move_expert_weights on one rank: a cycle within the member by local copies") {
  const Space exec;
  const SingleRankCommunicator comm;
  const auto from = ExpertLocation::identity(5, 0, 1);
  const auto to = map_of(5, 1, {2, 0, 3, 1, 4});  // slots 0..3 form a cycle of four, slot 4 stays
  const auto w = table(from, {7, 2});
  CHECK(expert_slot_bytes(w) == 9 * 8);
  REQUIRE(holds(w, from));
  move_expert_weights(exec, comm, expert_moves(from, to), w);
  CHECK(holds(w, to));
  move_expert_weights(exec, comm, expert_moves(to, to), w);  // nothing to move
  CHECK(holds(w, to));
  move_expert_weights(exec, comm, expert_moves(to, from), w);
  CHECK(holds(w, from));
}

TEST_CASE("move_expert_weights on one rank: its refusals name the rule and the call site") {
  const Space exec;
  const SingleRankCommunicator comm;
  const auto from = ExpertLocation::identity(4, 0, 1), to = map_of(4, 1, {3, 2, 1, 0});
  const auto plan = expert_moves(from, to);
  const auto site = [](std::source_location s) {
    return "move_expert_weights (called at placement/test_expert_moves.cpp:" + std::to_string(s.line()) + "): ";
  };
  auto w = table(from, {3, 2});
  w.by_slot.pop_back();
  auto here = std::source_location::current();
  CHECK_THROWS_WITH_AS(move_expert_weights(exec, comm, plan, w, here),
                       (site(here) + "member 0: the weights have 3 local slots, the map has 4 per member; no member "
                                     "moved any weights").c_str(),
                       LayoutError);
  w = table(from, {3, 2});
  w.by_slot[2][1] = Kokkos::View<double*, Space::memory_space>("short", 1);
  here = std::source_location::current();
  CHECK_THROWS_WITH_AS(move_expert_weights(exec, comm, plan, w, here),
                       (site(here) + "member 0: tensor 1 of slot 2 has 1 elements, slot 0's has 2 (every slot's "
                                     "tensor t has the same extent); no member moved any weights").c_str(),
                       LayoutError);
  here = std::source_location::current();
  CHECK_THROWS_WITH_AS(move_expert_weights(exec, comm, plan, Unloaded{}, here),
                       (site(here) + "member 0: describing its weights threw: slot 3 is not loaded; no member moved "
                                     "any weights").c_str(),
                       LayoutError);
  w = table(from, {3, 2});
  here = std::source_location::current();
  CHECK_THROWS_WITH_AS(move_expert_weights(exec, comm, expert_moves(ExpertLocation::identity(4, 0, 2), ExpertLocation::identity(4, 0, 2)), w, here),
                       (site(here) + "member 0: the plan is for moe_ep = 2 members, the communicator has 1 (pass the "
                                     "moe_ep communicator); no member moved any weights").c_str(),
                       LayoutError);
}
