// A user's program built against the installed package: layout policy, runtime layout, Kokkos, MPI.
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cstdio>
#include <relayout/relayout.hpp>

using Seed = relayout::Layout<relayout::Tp<32>, relayout::Dp<16>, relayout::DpAttention<true>,
                              relayout::A2a<relayout::Backend::deepep>>;

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Kokkos::initialize(argc, argv);
  {
    const relayout::RuntimeLayout layout = Seed::runtime();
    const relayout::RankCoords r10 = layout.coords(10);
    Kokkos::View<int*> widths("widths", 2);
    Kokkos::deep_copy(widths, Seed::attn_tp);
    std::printf("downstream: attn_tp=%d moe_ep=%d rank10=dp%d/tp%d\n", widths(0),
                layout.widths().moe_ep, r10.attn_dp_rank, r10.attn_tp_rank);
  }
  Kokkos::finalize();
  MPI_Finalize();
  return 0;
}
