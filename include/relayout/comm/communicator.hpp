// The Communicator concept: what a backend (MPI, NCCL, single rank) provides. Its members are the
// backend primitives and trust their arguments; user code calls the free functions
// (all_reduce.hpp, ...), which validate sizes and counts first and then call these members.
#pragma once

#include <concepts>
#include <span>

#include "relayout/comm/scalar.hpp"

namespace relayout {

template <class C>
concept Communicator = requires(const C& c, std::span<const float> in, std::span<float> out,
                                std::span<const int> counts, std::span<const int> displs,
                                ReduceOp op, int root) {
  { c.size() } -> std::convertible_to<int>;
  { c.rank() } -> std::convertible_to<int>;
  c.all_reduce(in, out, op);
  c.all_reduce_in_place(out, op);
  c.all_gather(in, out);
  c.all_gather_in_place(out);
  c.all_gatherv(in, out, counts, displs);
  c.all_gatherv_in_place(out, counts, displs);
  c.reduce_scatter(in, out, op);
  c.reduce_scatter_in_place(out, op);
  c.reduce_scatterv(in, out, counts, op);
  c.all_to_all(in, out);
  c.all_to_all_in_place(out);
  c.all_to_allv(in, counts, displs, out, counts, displs);
  c.broadcast(out, root);
  c.barrier();
};

// A communicator that can make new ones: an owning duplicate, and a split by (color, key).
template <class C>
concept SplittableCommunicator = Communicator<C> && std::movable<C> && requires(const C& c, int v) {
  { c.dup() } -> std::same_as<C>;
  { c.split(v, v) } -> std::same_as<C>;
};

}  // namespace relayout
