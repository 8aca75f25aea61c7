// On real MPI ranks: every rank derives the same layout, and splitting MPI_COMM_WORLD by the layout
// engine's group index reproduces its membership for every group kind (tp = world size).
#include <doctest/doctest.h>
#include <mpi.h>

#include <relayout/mesh.hpp>
#include <vector>

using namespace relayout;

namespace {

int world(int (*f)(MPI_Comm, int*)) {
  int v = 0;
  f(MPI_COMM_WORLD, &v);
  return v;
}

// Every valid layout of `np` ranks with DP attention on, backends none and deepep.
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

TEST_CASE("mpi: communicators split by group index have the layout's members") {
  const int np = world(MPI_Comm_size);
  const int me = world(MPI_Comm_rank);
  const auto configs = layouts_of(np);
  REQUIRE(!configs.empty());
  for (const LayoutConfig& c : configs) {
    const RuntimeLayout l(c);
    for (GroupKind g : kAllGroupKinds) {
      MPI_Comm sub;
      MPI_Comm_split(MPI_COMM_WORLD, l.group_index(g, me), l.group_rank(g, me), &sub);
      int size = 0, rank = 0;
      MPI_Comm_size(sub, &size);
      MPI_Comm_rank(sub, &rank);
      std::vector<int> members(static_cast<std::size_t>(size));
      MPI_Allgather(&me, 1, MPI_INT, members.data(), 1, MPI_INT, sub);
      CHECK(members == l.group_members(g, me));
      CHECK(rank == l.group_rank(g, me));
      MPI_Comm_free(&sub);
    }
  }
}

TEST_CASE("mpi: every rank computes the same coordinates for every rank") {
  const int np = world(MPI_Comm_size);
  const RuntimeLayout l({.tp = np, .dp = np, .enable_dp_attention = true,
                         .moe_a2a_backend = Backend::deepep});
  std::vector<int> mine;
  for (int r = 0; r < np; ++r) {
    const RankCoords k = l.coords(r);
    mine.insert(mine.end(), {k.attn_dp_rank, k.attn_tp_rank, k.moe_ep_rank});
  }
  std::vector<int> root = mine;
  MPI_Bcast(root.data(), static_cast<int>(root.size()), MPI_INT, 0, MPI_COMM_WORLD);
  CHECK(root == mine);
  CHECK(l.coords(world(MPI_Comm_rank)).attn_dp_rank == world(MPI_Comm_rank));
}
