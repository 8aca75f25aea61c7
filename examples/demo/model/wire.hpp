// The collectives a decoder layer issues, on the groups of one TP domain, each counted in a
// TrafficLog. A group of one rank needs no communication, so nothing is sent (or counted) there.
// Each call passes its caller's source location on, so the collective agreement check names the
// line in the bridge, not this wrapper.
#pragma once

#include <algorithm>
#include <cstdint>
#include <source_location>
#include <span>
#include <vector>

#include "relayout/comm.hpp"
#include "demo/model/traffic.hpp"

namespace relayout::model {

template <class C>
struct Wire {
  using Site = std::source_location;
  const ProcessGroupsOf<C>& groups;
  TrafficLog* log;  // null: bookkeeping traffic (row owners), not counted

  // The same collectives, uncounted: for the row-owner bookkeeping that travels beside the rows.
  Wire bookkeeping() const { return {groups, nullptr}; }

  void count(Op op, GroupKind g, std::int64_t n_bytes) {
    if (log) log->add(op, g, n_bytes);
  }
  int size(GroupKind g) const { return groups.comm(g).size(); }
  int rank(GroupKind g) const { return groups.comm(g).rank(); }

  template <class T>
  void all_reduce(GroupKind g, std::span<T> buf, ReduceOp op = ReduceOp::sum, Site site = Site::current()) {
    if (size(g) == 1) return;
    count(Op::all_reduce, g, std::int64_t(buf.size_bytes()));
    relayout::all_reduce_in_place(groups.comm(g), buf, op, site);
  }
  // A one-rank group's gather, scatter or exchange is a copy.
  template <class T>
  static void copy(std::span<const T> send, std::span<T> recv) {
    std::copy(send.begin(), send.end(), recv.begin());
  }

  template <class T>
  void all_gather(GroupKind g, std::span<const T> send, std::span<T> recv, Op op = Op::all_gather,
                  Site site = Site::current()) {
    if (size(g) == 1) return copy(send, recv);
    count(op, g, std::int64_t(recv.size_bytes()));
    relayout::all_gather(groups.comm(g), send, recv, site);
  }
  // counts in elements, one per member of g.
  template <class T>
  void all_gatherv(GroupKind g, std::span<const T> send, std::span<T> recv, const std::vector<int>& counts,
                   Site site = Site::current()) {
    if (size(g) == 1) return copy(send, recv);
    count(Op::all_gatherv, g, std::int64_t(recv.size_bytes()));
    relayout::all_gatherv(groups.comm(g), send, recv, counts, site);
  }
  template <class T>
  void reduce_scatter(GroupKind g, std::span<const T> send, std::span<T> recv, Site site = Site::current()) {
    if (size(g) == 1) return copy(send, recv);
    count(Op::reduce_scatter, g, std::int64_t(send.size_bytes()));
    relayout::reduce_scatter(groups.comm(g), send, recv, ReduceOp::sum, site);
  }
  template <class T>
  void reduce_scatterv(GroupKind g, std::span<const T> send, std::span<T> recv, const std::vector<int>& counts,
                       Site site = Site::current()) {
    if (size(g) == 1) return copy(send, recv);
    count(Op::reduce_scatterv, g, std::int64_t(send.size_bytes()));
    relayout::reduce_scatterv(groups.comm(g), send, recv, counts, ReduceOp::sum, site);
  }
  template <class T>
  void all_to_all(GroupKind g, std::span<const T> send, std::span<T> recv, Site site = Site::current()) {
    if (size(g) == 1) return copy(send, recv);
    count(Op::all_to_all, g, std::int64_t(send.size_bytes()));
    relayout::all_to_all(groups.comm(g), send, recv, site);
  }
  template <class T>
  void all_to_allv(GroupKind g, std::span<const T> send, const std::vector<int>& send_counts,
                   std::span<T> recv, const std::vector<int>& recv_counts, Site site = Site::current()) {
    if (size(g) == 1) return copy(send, recv);
    count(Op::all_to_allv, g, std::int64_t(send.size_bytes()));
    relayout::all_to_allv(groups.comm(g), send, send_counts, recv, recv_counts, site);
  }
};

}  // namespace relayout::model
