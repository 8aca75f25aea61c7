// SingleRankCommunicator: a group of one process, no MPI needed. Every collective is a copy (or
// nothing, in place), so single-process engines and tests run the same code paths. The members
// below copy host memory; the free collectives copy Kokkos::Views themselves, with
// Kokkos::deep_copy on the caller's execution-space instance (impl::transfer in impl/args.hpp), so
// device memory is never touched from the host.
#pragma once

#include <algorithm>
#include <span>

#include "relayout/comm/scalar.hpp"

namespace relayout {

class SingleRankCommunicator {
 public:
  int size() const { return 1; }
  int rank() const { return 0; }
  SingleRankCommunicator dup() const { return {}; }
  SingleRankCommunicator split(int, int) const { return {}; }

  template <CommScalar T>
  void all_reduce(std::span<const T> in, std::span<T> out, ReduceOp) const { copy(in, out); }
  template <CommScalar T>
  void all_reduce_in_place(std::span<T>, ReduceOp) const {}
  template <CommScalar T>
  void all_gather(std::span<const T> in, std::span<T> out) const { copy(in, out); }
  template <CommScalar T>
  void all_gather_in_place(std::span<T>) const {}
  template <CommScalar T>
  void all_gatherv(std::span<const T> in, std::span<T> out, std::span<const int>,
                   std::span<const int>) const { copy(in, out); }
  template <CommScalar T>
  void all_gatherv_in_place(std::span<T>, std::span<const int>, std::span<const int>) const {}
  template <CommScalar T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, ReduceOp) const { copy(in, out); }
  template <CommScalar T>
  void reduce_scatter_in_place(std::span<T>, ReduceOp) const {}
  template <CommScalar T>
  void reduce_scatterv(std::span<const T> in, std::span<T> out, std::span<const int>,
                       ReduceOp) const { copy(in, out); }
  template <CommScalar T>
  void all_to_all(std::span<const T> in, std::span<T> out) const { copy(in, out); }
  template <CommScalar T>
  void all_to_all_in_place(std::span<T>) const {}
  template <CommScalar T>
  void all_to_allv(std::span<const T> in, std::span<const int>, std::span<const int>,
                   std::span<T> out, std::span<const int>, std::span<const int>) const {
    copy(in, out);
  }
  template <CommScalar T>
  void broadcast(std::span<T>, int) const {}
  void barrier() const {}

 private:
  template <class T>
  static void copy(std::span<const T> in, std::span<T> out) {
    std::copy(in.begin(), in.end(), out.begin());
  }
};

}  // namespace relayout
