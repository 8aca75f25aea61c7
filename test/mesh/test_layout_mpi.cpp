// On real MPI ranks (tp = world size): splitting MPI_COMM_WORLD by the layout engine's group index
// and group rank gives communicators whose actual members (MPI_Group_translate_ranks) are the ranks
// docs/layout.md#groups puts in each group, in group-rank order, for every group kind.
#include <doctest/doctest.h>
#include <mpi.h>

#include <relayout/mesh.hpp>
#include <vector>

#include "spec_model.hpp"

using namespace relayout;
using namespace relayout::spec_model;

namespace {

int world(int (*f)(MPI_Comm, int*)) {
  int v = 0;
  f(MPI_COMM_WORLD, &v);
  return v;
}

// Every valid layout of `np` ranks with DP attention on, backends none and deepep (cp = 1: every
// split costs a collective on oversubscribed ranks; test_sweep covers cp without MPI).
std::vector<LayoutConfig> layouts_of(int np) {
  std::vector<LayoutConfig> out;
  for (int dp = 1; dp <= np; ++dp)
    for (int ep = 1; ep <= np; ++ep)
      for (int moe_dp = 1; moe_dp <= np; ++moe_dp)
        for (Backend b : {Backend::none, Backend::deepep}) {
          const LayoutConfig c{.tp = np, .dp = dp, .ep = ep, .moe_dp = moe_dp,
                               .enable_dp_attention = true, .moe_a2a_backend = b};
          if (derive_widths(c).rule == LayoutRule::ok && (b == Backend::none || ep == 1))
            out.push_back(c);
        }
  return out;
}

}  // namespace

TEST_CASE("mpi: communicators split by group index have the members docs/layout.md#groups lists") {
  const int np = world(MPI_Comm_size);
  const int me = world(MPI_Comm_rank);
  const auto configs = layouts_of(np);
  REQUIRE(!configs.empty());
  MPI_Group world_group;
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  for (const LayoutConfig& c : configs) {
    const RuntimeLayout l(c);
    for (GroupKind g : kAllGroupKinds) {
      CAPTURE(c.dp);
      CAPTURE(c.ep);
      CAPTURE(c.moe_dp);
      CAPTURE(to_string(c.moe_a2a_backend));
      CAPTURE(to_string(g));
      MPI_Comm sub;
      MPI_Comm_split(MPI_COMM_WORLD, l.group_index(g, me), l.group_rank(g, me), &sub);
      // The communicator's actual members, in its rank order, as MPI_COMM_WORLD ranks.
      int size = 0;
      MPI_Comm_size(sub, &size);
      MPI_Group sub_group;
      MPI_Comm_group(sub, &sub_group);
      std::vector<int> pos(static_cast<std::size_t>(size)), members(pos.size());
      for (int i = 0; i < size; ++i) pos[static_cast<std::size_t>(i)] = i;
      MPI_Group_translate_ranks(sub_group, size, pos.data(), world_group, members.data());
      MPI_Group_free(&sub_group);
      CHECK(members == spec_members(g, spec_widths(c), np, me));
      CHECK(members == l.group_members(g, me));
      MPI_Comm_free(&sub);
    }
  }
  MPI_Group_free(&world_group);
}
