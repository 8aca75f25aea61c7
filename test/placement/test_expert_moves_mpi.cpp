// Expert weights moved on real ranks (moe_ep = the world): weights that differ per expert and per
// element, in bf16 (a table of Views) and double (unmanaged Views over one engine allocation),
// follow a chain of maps (static -> rebalanced for a skewed load -> rotated across members ->
// reversed -> static), and after each move every slot of every member holds its new logical
// expert's weights, checked against the formula; the same with messages cut peer by peer into
// pieces of a few elements. Members with nothing to move still take part; a member whose weights
// (shape, one slot, element type) or plan differ makes every member throw the same error, nothing
// is written, and the group stays usable.
#include <doctest/doctest.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdint>
#include <relayout/comm.hpp>
#include <relayout/placement/expert_moves.hpp>
#include <source_location>
#include <string>
#include <vector>

#include "mpi_world.hpp"

using namespace relayout;
using relayout::test::world;

namespace {

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
constexpr int kRouted = 8;

// Element i of tensor t of logical expert l. bf16 holds every integer up to 256 exactly, so its
// values stay below that: 32 l + 8 t + i with t < 2, i < 8.
double value_bf16(int l, int t, std::size_t i) { return 32.0 * l + 8.0 * t + double(i); }
double value_double(int l, int t, std::size_t i) { return 1000.0 * l + 100.0 * t + double(i); }

ExpertLocation static_map(int ep) { return ExpertLocation::identity(kRouted, ep > 1 ? ep : 0, ep); }

// The maps a run goes through, each from the one before.
std::vector<ExpertLocation> chain(int ep) {
  std::vector<ExpertLocation> maps{static_map(ep)};
  const std::vector<double> skewed{90, 2, 30, 1, 7, 40, 3, 5};
  maps.push_back(ExpertLocation::rebalanced(skewed, maps[0].redundant(), ep));
  std::vector<int> m = maps.back().physical_to_logical(), rotated(m.size()), reversed(m.size());
  const std::size_t P = m.size(), shift = static_cast<std::size_t>(maps[0].per_rank()) + 1;
  for (std::size_t p = 0; p < P; ++p) rotated[p] = m[(p + shift) % P];
  maps.push_back(ExpertLocation::from_map(kRouted, ep, rotated));
  for (std::size_t p = 0; p < P; ++p) reversed[p] = rotated[P - 1 - p];
  maps.push_back(ExpertLocation::from_map(kRouted, ep, reversed));
  maps.push_back(static_map(ep));
  return maps;
}

// An engine's weights as a table of Views: by_slot[s][t] is tensor t of local slot s.
template <class T>
struct WeightTable {
  using value_type = T;
  using Tensor = Kokkos::View<T*, Mem>;
  std::vector<std::vector<Tensor>> by_slot;
  int slots() const { return static_cast<int>(by_slot.size()); }
  int tensors() const { return by_slot.empty() ? 0 : static_cast<int>(by_slot.front().size()); }
  Tensor tensor(int slot, int t) const { return by_slot.at(static_cast<std::size_t>(slot)).at(static_cast<std::size_t>(t)); }
};

// bf16 weights as a table of Views, one per (slot, tensor).
WeightTable<bf16> bf16_weights(const ExpertLocation& loc, int member, std::vector<std::size_t> extents) {
  WeightTable<bf16> w;
  for (int s = 0; s < loc.per_rank(); ++s) {
    w.by_slot.emplace_back();
    const int l = loc.logical_of(member * loc.per_rank() + s);
    for (std::size_t t = 0; t < extents.size(); ++t) {
      Kokkos::View<bf16*, Mem> v("w", extents[t]);
      auto h = Kokkos::create_mirror_view(v);
      for (std::size_t i = 0; i < extents[t]; ++i) h(i) = bf16(float(value_bf16(l, int(t), i)));
      Kokkos::deep_copy(v, h);
      w.by_slot.back().push_back(v);
    }
  }
  return w;
}

// An engine's own layout: every slot's tensors back to back in one allocation, handed out as
// unmanaged Views.
struct EngineWeights {
  using value_type = double;
  using Tensor = Kokkos::View<double*, Mem, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  std::vector<std::size_t> extents;
  Kokkos::View<double**, Kokkos::LayoutRight, Mem> all;  // slots x (sum of extents)
  int slots() const { return static_cast<int>(all.extent(0)); }
  int tensors() const { return static_cast<int>(extents.size()); }
  Tensor tensor(int slot, int t) const {
    std::size_t at = 0;
    for (int u = 0; u < t; ++u) at += extents[static_cast<std::size_t>(u)];
    return Tensor(&all(static_cast<std::size_t>(slot), at), extents[static_cast<std::size_t>(t)]);
  }
};
static_assert(ExpertWeightsFor<EngineWeights, Space>);

EngineWeights double_weights(const ExpertLocation& loc, int member, std::vector<std::size_t> extents) {
  std::size_t total = 0;
  for (auto n : extents) total += n;
  EngineWeights w{extents, Kokkos::View<double**, Kokkos::LayoutRight, Mem>("engine", loc.per_rank(), total)};
  auto h = Kokkos::create_mirror_view(w.all);
  for (int s = 0; s < loc.per_rank(); ++s) {
    std::size_t at = 0;
    for (std::size_t t = 0; t < extents.size(); ++t)
      for (std::size_t i = 0; i < extents[t]; ++i)
        h(static_cast<std::size_t>(s), at++) = value_double(loc.logical_of(member * loc.per_rank() + s), int(t), i);
  }
  Kokkos::deep_copy(w.all, h);
  return w;
}

// Slots of this member that do not hold loc's expert (element by element against the formula).
template <class W>
int wrong_slots(const W& w, const ExpertLocation& loc, int member) {
  int wrong = 0;
  for (int s = 0; s < w.slots(); ++s) {
    const int l = loc.logical_of(member * loc.per_rank() + s);
    bool ok = true;
    for (int t = 0; t < w.tensors(); ++t) {
      const auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), w.tensor(s, t));
      for (std::size_t i = 0; i < h.extent(0); ++i) {
        if constexpr (std::is_same_v<typename W::value_type, bf16>)
          ok = ok && h(i).bits == bf16(float(value_bf16(l, t, i))).bits;
        else
          ok = ok && h(i) == value_double(l, t, i);
      }
    }
    wrong += ok ? 0 : 1;
  }
  return wrong;
}

template <class W>
void run_chain(const W& w, const std::vector<ExpertLocation>& maps) {
  const auto& comm = world();
  const Space exec;
  for (std::size_t k = 1; k < maps.size(); ++k) {
    const auto plan = expert_moves(maps[k - 1], maps[k]);
    move_expert_weights(exec, comm, plan, w);
    CHECK_MESSAGE(wrong_slots(w, maps[k], comm.rank()) == 0, "step " << k << ": " << plan.describe());
  }
}

}  // namespace

TEST_CASE("move_expert_weights: bf16 weights follow a chain of maps on every member") {
  const auto& comm = world();
  const auto maps = chain(comm.size());
  const auto w = bf16_weights(maps[0], comm.rank(), {5, 3});
  REQUIRE(wrong_slots(w, maps[0], comm.rank()) == 0);
  run_chain(w, maps);
}

TEST_CASE("move_expert_weights: double weights in the engine's own allocation follow the same chain") {
  const auto& comm = world();
  const auto maps = chain(comm.size());
  const auto w = double_weights(maps[0], comm.rank(), {37, 11, 1});
  REQUIRE(wrong_slots(w, maps[0], comm.rank()) == 0);
  run_chain(w, maps);
}

TEST_CASE("move_expert_weights: totals over the message limit go peer by peer in pieces, to the same weights") {
  const auto& comm = world();
  const Space exec;
  const auto maps = chain(comm.size());
  const auto w = double_weights(maps[0], comm.rank(), {6, 2});
  // The chain has a step where one member sends another two slots or more (16 elements or more).
  int most = 0;
  for (std::size_t k = 1; k < maps.size(); ++k) {
    const auto plan = expert_moves(maps[k - 1], maps[k]);
    for (const ExpertMove& a : plan.moves()) {
      int pair = 0;
      for (const ExpertMove& b : plan.moves())
        pair += !b.local() && b.src_rank == a.src_rank && b.dst_rank == a.dst_rank ? 1 : 0;
      most = std::max(most, pair);
    }
  }
  CHECK((comm.size() == 1 ? most == 0 : most >= 2));
  // Limits of 3, 5 and 8 elements cut slots of 8 (tensors of 6 and 2) at every place.
  for (std::int64_t limit : {3, 5, 8})
    for (std::size_t k = 1; k < maps.size(); ++k) {
      // What move_expert_weights does once the members agree, with a limit far below an int's.
      impl::carry_out_moves(exec, comm, expert_moves(maps[k - 1], maps[k]), w, 8, limit, std::source_location::current());
      CHECK_MESSAGE(wrong_slots(w, maps[k], comm.rank()) == 0, "step " << k << ", limit " << limit);
    }
}

TEST_CASE("move_expert_weights: members with nothing to move take part") {
  const auto& comm = world();
  const Space exec;
  const int ep = comm.size();
  const auto from = static_map(ep);
  // Only member 0's first two slots trade places (a swap with member ep - 1 when there is one).
  std::vector<int> m = from.physical_to_logical();
  const std::size_t other = ep > 1 ? static_cast<std::size_t>((ep - 1) * from.per_rank()) : 1;
  std::swap(m[0], m[other]);
  const auto to = ExpertLocation::from_map(kRouted, ep, m);
  const auto w = double_weights(from, comm.rank(), {4});
  move_expert_weights(exec, comm, expert_moves(from, to), w);
  CHECK(wrong_slots(w, to, comm.rank()) == 0);
  move_expert_weights(exec, comm, expert_moves(to, to), w);  // nobody moves anything
  CHECK(wrong_slots(w, to, comm.rank()) == 0);
}

TEST_CASE("move_expert_weights: one member's mistake is the same error on every member, nothing moves") {
  const auto& comm = world();
  const Space exec;
  const int ep = comm.size(), me = comm.rank(), bad = ep - 1;
  const auto maps = chain(ep);
  const auto plan = expert_moves(maps[0], maps[1]);
  const auto at = [](std::source_location s) {
    return "move_expert_weights (called at placement/test_expert_moves_mpi.cpp:" + std::to_string(s.line()) + "): ";
  };
  const auto tail = std::string("; no member moved any weights");
  SUBCASE("another shape of tensor 1 on the last member") {
    const auto w = bf16_weights(maps[0], me, {5, me == bad && ep > 1 ? 4u : 3u});
    const auto here = std::source_location::current();
    if (ep > 1) {
      CHECK_THROWS_WITH_AS(move_expert_weights(exec, comm, plan, w, here),
                           (at(here) + "members [" + std::to_string(bad) +
                            "] describe a slot as 2 tensors of [5 4] bf16 elements, member 0 as 2 tensors of [5 3] "
                            "bf16 elements (every member's slots have the same tensors)" + tail).c_str(),
                           LayoutError);
      CHECK(wrong_slots(w, maps[0], me) == 0);
    }
  }
  SUBCASE("one slot of the last member has another extent") {
    auto w = bf16_weights(maps[0], me, {5, 3});
    if (me == bad) w.by_slot.back()[0] = Kokkos::View<bf16*, Mem>("odd", 6);
    const int last = maps[0].per_rank() - 1;
    const auto here = std::source_location::current();
    CHECK_THROWS_WITH_AS(move_expert_weights(exec, comm, plan, w, here),
                         (at(here) + "member " + std::to_string(bad) + ": tensor 0 of slot " + std::to_string(last) +
                          " has 6 elements, slot 0's has 5 (every slot's tensor t has the same extent)" + tail).c_str(),
                         LayoutError);
    if (me != bad) CHECK(wrong_slots(w, maps[0], me) == 0);
  }
  SUBCASE("the last member passes another plan") {
    const auto w = bf16_weights(maps[0], me, {5, 3});
    const auto mine = me == bad && ep > 1 ? expert_moves(maps[0], maps[2]) : plan;
    const auto here = std::source_location::current();
    if (ep > 1) {
      CHECK_THROWS_WITH_AS(move_expert_weights(exec, comm, mine, w, here),
                           (at(here) + "members [" + std::to_string(bad) +
                            "] pass another plan than member 0 (every member passes expert_moves of the same two "
                            "maps)" + tail).c_str(),
                           LayoutError);
      CHECK(wrong_slots(w, maps[0], me) == 0);
    }
  }
  // The group is still usable: the right call moves the weights.
  const auto w = bf16_weights(maps[0], me, {5, 3});
  move_expert_weights(exec, comm, plan, w);
  CHECK(wrong_slots(w, maps[1], me) == 0);
}

TEST_CASE("move_expert_weights: a member whose weights have another element type is named on every member") {
  const auto& comm = world();
  const Space exec;
  const int ep = comm.size(), me = comm.rank(), bad = ep - 1;
  if (ep < 2) return;
  const auto maps = chain(ep);
  const auto plan = expert_moves(maps[0], maps[1]);
  const auto doubles = double_weights(maps[0], me, {5, 3});
  const auto halves = bf16_weights(maps[0], me, {5, 3});
  const auto here = std::source_location::current();
  const std::string want = "move_expert_weights (called at placement/test_expert_moves_mpi.cpp:" +
                           std::to_string(here.line()) + "): members [" + std::to_string(bad) +
                           "] describe a slot as 2 tensors of [5 3] double elements, member 0 as 2 tensors of [5 3] "
                           "bf16 elements (every member's slots have the same tensors); no member moved any weights";
  if (me == bad)
    CHECK_THROWS_WITH_AS(move_expert_weights(exec, comm, plan, doubles, here), want.c_str(), LayoutError);
  else
    CHECK_THROWS_WITH_AS(move_expert_weights(exec, comm, plan, halves, here), want.c_str(), LayoutError);
  CHECK(wrong_slots(doubles, maps[0], me) == 0);
  CHECK(wrong_slots(halves, maps[0], me) == 0);
}
