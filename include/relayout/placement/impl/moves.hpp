// The data movement behind every placement transition, on untyped RowsData. The typed functions
// (transitions.hpp) and the runtime twin (any_rows.hpp) check legality and then call these. None
// of them writes into its input: every result is a new buffer or a view of one, except
// all_reduce_rows_in_place, which the caller reaches only by handing its rows over (an rvalue).
#pragma once

#include <cstdint>
#include <source_location>
#include <string>
#include <utility>

#include <Kokkos_Core.hpp>

#include "relayout/comm.hpp"
#include "relayout/placement/dp_slots.hpp"
#include "relayout/placement/rows.hpp"
#include "relayout/placement/split.hpp"
#include "relayout/placement/traffic.hpp"

namespace relayout::impl {

// The caller's execution-space instance (fenced before memory goes to MPI, and the one every copy
// runs on) and the traffic log to count into (none: not counted).
template <class Space>
struct MoveCtx {
  Space exec{};
  TrafficLog* log = nullptr;
  std::source_location site = std::source_location::current();  // the caller's, for errors and the watchdog

  template <Communicator C>
  void count(TrafficOp op, const C& comm, GroupKind g, std::int64_t bytes) const {
    if (log && comm.size() > 1) log->add(op, g, bytes);
  }
  void ready() const { exec.fence(); }
};

template <class V>
std::int64_t bytes_of(const V& v) {
  return static_cast<std::int64_t>(v.size() * sizeof(typename V::value_type));
}

template <class T, class Space>
RowsView<T, Space> alloc_rows(const char* label, std::int64_t n, std::int64_t hidden) {
  return RowsView<T, Space>(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)),
                            static_cast<std::size_t>(n), static_cast<std::size_t>(hidden));
}

// Rows [begin, begin + count) of a LayoutRight rows view: still contiguous, no copy.
template <class V>
V row_slice(const V& v, std::int64_t begin, std::int64_t count) {
  return Kokkos::subview(v, Kokkos::make_pair(begin, begin + count), Kokkos::ALL);
}

inline std::int64_t hidden_of(std::size_t h) { return static_cast<std::int64_t>(h); }

// "; dp_scatter called at model/engine.cpp:42": the caller's line, for a transition's own checks.
inline std::string called_at(const char* call, std::source_location site) {
  return std::string("; ") + call + " called at " + std::string(short_file(site.file_name())) + ":" +
         std::to_string(site.line());
}

// Element counts of the tensor_split chunks of n rows over `parts` members.
inline IntCounts split_counts(std::int64_t n, int parts, std::int64_t hidden) {
  IntCounts c(static_cast<std::size_t>(parts));
  for (int i = 0; i < parts; ++i)
    c[static_cast<std::size_t>(i)] = static_cast<int>(tensor_split_range(n, parts, i).count * hidden);
  return c;
}

template <Communicator C, class T, class Space>
RowsData<T, Space> all_reduce_rows(const C& comm, const RowsData<T, Space>& in, GroupKind g = GroupKind::tp,
                                   const MoveCtx<Space>& cx = {}) {
  auto out = alloc_rows<T, Space>("relayout::all_reduce", static_cast<std::int64_t>(in.view.extent(0)),
                                  hidden_of(in.view.extent(1)));
  cx.ready();
  cx.count(TrafficOp::all_reduce, comm, g, bytes_of(in.view));
  all_reduce(cx.exec, comm, in.view, out, ReduceOp::sum, cx.site);
  return {out, in.full_rows, in.slots};
}

template <Communicator C, class T, class Space>
RowsData<T, Space> all_reduce_rows_in_place(const C& comm, RowsData<T, Space>&& in, GroupKind g = GroupKind::tp,
                                            const MoveCtx<Space>& cx = {}) {
  cx.ready();
  cx.count(TrafficOp::all_reduce, comm, g, bytes_of(in.view));
  all_reduce_in_place(cx.exec, comm, in.view, ReduceOp::sum, cx.site);
  return std::move(in);
}

template <Communicator C, class T, class Space>
RowsData<T, Space> reduce_scatter_rows(const C& comm, const RowsData<T, Space>& in, GroupKind g = GroupKind::tp,
                                       const MoveCtx<Space>& cx = {}) {
  const auto n = static_cast<std::int64_t>(in.view.extent(0));
  const auto h = hidden_of(in.view.extent(1));
  const Range mine = tensor_split_range(n, comm.size(), comm.rank());
  auto out = alloc_rows<T, Space>("relayout::reduce_scatter", mine.count, h);
  cx.ready();
  cx.count(n % comm.size() == 0 ? TrafficOp::reduce_scatter : TrafficOp::reduce_scatterv, comm, g, bytes_of(in.view));
  if (n % comm.size() == 0) reduce_scatter(cx.exec, comm, in.view, out, ReduceOp::sum, cx.site);
  else reduce_scatterv(cx.exec, comm, in.view, out, split_counts(n, comm.size(), h).span(), ReduceOp::sum, cx.site);
  return {out, n, in.slots};
}

template <Communicator C, class T, class Space>
RowsData<T, Space> all_gather_rows(const C& comm, const RowsData<T, Space>& in, GroupKind g = GroupKind::tp,
                                   const MoveCtx<Space>& cx = {}) {
  const std::int64_t n = in.full_rows;
  const auto h = hidden_of(in.view.extent(1));
  const Range mine = tensor_split_range(n, comm.size(), comm.rank());
  if (static_cast<std::int64_t>(in.view.extent(0)) != mine.count)
    throw LayoutError("rows", "this rank holds " + std::to_string(in.view.extent(0)) +
                                  " rows, but chunk " + std::to_string(comm.rank()) + " of " +
                                  std::to_string(n) + " rows split over " + std::to_string(comm.size()) +
                                  " members has " + std::to_string(mine.count) + " (tensor_split)" +
                                  called_at("all_gather", cx.site));
  auto out = alloc_rows<T, Space>("relayout::all_gather", n, h);
  cx.ready();
  cx.count(n % comm.size() == 0 ? TrafficOp::all_gather : TrafficOp::all_gatherv, comm, g, bytes_of(out));
  if (n % comm.size() == 0) all_gather(cx.exec, comm, in.view, out, cx.site);
  else all_gatherv(cx.exec, comm, in.view, out, split_counts(n, comm.size(), h).span(), cx.site);
  return {out, -1, in.slots};
}

// Local: a view of this member's tensor_split chunk, no copy and no communication.
template <class T, class Space>
RowsData<T, Space> split_rows_data(int parts, int index, const RowsData<T, Space>& in) {
  const auto n = static_cast<std::int64_t>(in.view.extent(0));
  const Range mine = tensor_split_range(n, parts, index);
  return {row_slice(in.view, mine.begin, mine.count), n, in.slots};
}

// ---- the DP bridge (docs/bridge.md path A, docs/bridge.md#padding). Rank r of the domain is (attn_dp_rank, attn_tp_rank)
// = (r / attn_tp, r % attn_tp) because these calls require attn_cp == 1.

template <class C>
void require_dp_bridge_layout(const ProcessGroupsOf<C>& pg, const char* call, std::source_location site) {
  if (pg.layout().widths().attn_cp != 1)
    throw LayoutError("attn_cp", std::string(call) + " needs attn_cp == 1 (the DP bridge does not "
                                 "run under prefill context parallelism, docs/bridge.md); attn_cp = " +
                                 std::to_string(pg.layout().widths().attn_cp) + called_at(call, site));
}

template <class C>
void require_slots(const ProcessGroupsOf<C>& pg, const DpSlots& slots, const char* call, std::source_location site) {
  if (slots.groups() != pg.layout().widths().attn_dp)
    throw LayoutError("global_num_tokens", std::string(call) + ": the DpSlots have " +
                                               std::to_string(slots.groups()) + " groups but attn_dp = " +
                                               std::to_string(pg.layout().widths().attn_dp) + called_at(call, site));
}

template <class C, class T, class Space>
void require_local_rows(const ProcessGroupsOf<C>& pg, const RowsData<T, Space>& in,
                        const DpSlots& slots, const char* call, std::source_location site) {
  require_dp_bridge_layout(pg, call, site);
  require_slots(pg, slots, call, site);
  const int g = pg.coords().attn_dp_rank;
  if (static_cast<std::int64_t>(in.view.extent(0)) != slots.count(g))
    throw LayoutError("global_num_tokens", std::string(call) + ": this DP group's rows (" +
                                               std::to_string(in.view.extent(0)) +
                                               ") differ from global_num_tokens[" + std::to_string(g) +
                                               "] = " + std::to_string(slots.count(g)) + called_at(call, site));
}

template <class C, class T, class Space>
void require_global_rows(const ProcessGroupsOf<C>& pg, const RowsData<T, Space>& in, const char* call,
                         PaddingMode mode, const char* other, std::source_location site) {
  require_dp_bridge_layout(pg, call, site);
  require_slots(pg, *in.slots, call, site);
  if (in.slots->mode() != mode)
    throw LayoutError("padding", std::string(call) + " needs rows gathered with " +
                                     std::string(to_string(mode)) + " padding; these were gathered with " +
                                     std::string(to_string(in.slots->mode())) + ": use " + other +
                                     called_at(call, site));
}

// Rows of this member's chunk copied into a new buffer of `chunk` rows, zero past the end.
template <class Space, class V>
V padded_copy(const Space& exec, const V& v, std::int64_t begin, std::int64_t chunk) {
  const auto n = static_cast<std::int64_t>(v.extent(0));
  V out(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("relayout::padded")),
        static_cast<std::size_t>(chunk), v.extent(1));
  const std::int64_t have = std::max<std::int64_t>(0, std::min(chunk, n - begin));
  if (have > 0) Kokkos::deep_copy(exec, row_slice(out, 0, have), row_slice(v, begin, have));
  if (have < chunk) Kokkos::deep_copy(exec, row_slice(out, have, chunk - have), typename V::value_type{});
  return out;
}

// Only attn_tp_rank 0 of each attention-TP group contributes: with sum_len its rows go whole into
// an all_gatherv over tp; with max_len each member sends its 1/attn_tp chunk of the zero-padded
// slot through one all_gather, so every row still comes from exactly one replica, never a sum.
template <class C, class T, class Space>
RowsData<T, Space> dp_gather_replicate_rows(const ProcessGroupsOf<C>& pg, const RowsData<T, Space>& in,
                                            DpSlotsPtr slots, const MoveCtx<Space>& cx = {}) {
  require_local_rows(pg, in, *slots, "dp_gather_replicate", cx.site);
  const int A = pg.layout().widths().attn_tp, t = pg.coords().attn_tp_rank, tp = pg.layout().size();
  const auto h = hidden_of(in.view.extent(1));
  auto out = alloc_rows<T, Space>("relayout::dp_gather_replicate", slots->total_rows(), h);
  if (slots->mode() == PaddingMode::sum_len) {
    IntCounts counts(static_cast<std::size_t>(tp));
    for (int r = 0; r < tp; ++r)
      counts[static_cast<std::size_t>(r)] = r % A == 0 ? static_cast<int>(slots->count(r / A) * h) : 0;
    cx.ready();
    cx.count(TrafficOp::all_gatherv, pg.tp(), GroupKind::tp, bytes_of(out));
    all_gatherv(cx.exec, pg.tp(), t == 0 ? in.view : row_slice(in.view, 0, 0), out, counts.span(), cx.site);
  } else {
    const std::int64_t chunk = slots->slot_rows() / A;
    const auto mine = padded_copy(cx.exec, in.view, t * chunk, chunk);
    cx.ready();
    cx.count(TrafficOp::all_gather, pg.tp(), GroupKind::tp, bytes_of(out));
    all_gather(cx.exec, pg.tp(), mine, out, cx.site);
  }
  return {out, -1, std::move(slots)};
}

// Each attention-TP member holds a summand: reduce-scatter over attn_tp completes this member's
// chunk, then all-gather(v) over tp assembles every DP group's complete rows.
template <class C, class T, class Space>
RowsData<T, Space> dp_gather_partial_rows(const ProcessGroupsOf<C>& pg, const RowsData<T, Space>& in,
                                          DpSlotsPtr slots, const MoveCtx<Space>& cx = {}) {
  require_local_rows(pg, in, *slots, "dp_gather_partial", cx.site);
  const int A = pg.layout().widths().attn_tp, t = pg.coords().attn_tp_rank, tp = pg.layout().size();
  const auto h = hidden_of(in.view.extent(1));
  const auto n = static_cast<std::int64_t>(in.view.extent(0));
  auto out = alloc_rows<T, Space>("relayout::dp_gather_partial", slots->total_rows(), h);
  if (slots->mode() == PaddingMode::sum_len) {
    auto part = alloc_rows<T, Space>("relayout::dp_gather_partial.chunk", tensor_split_range(n, A, t).count, h);
    cx.ready();
    cx.count(TrafficOp::reduce_scatterv, pg.attn_tp(), GroupKind::attn_tp, bytes_of(in.view));
    reduce_scatterv(cx.exec, pg.attn_tp(), in.view, part, split_counts(n, A, h).span(), ReduceOp::sum, cx.site);
    IntCounts counts(static_cast<std::size_t>(tp));
    for (int r = 0; r < tp; ++r)
      counts[static_cast<std::size_t>(r)] =
          static_cast<int>(tensor_split_range(slots->count(r / A), A, r % A).count * h);
    cx.count(TrafficOp::all_gatherv, pg.tp(), GroupKind::tp, bytes_of(out));
    all_gatherv(cx.exec, pg.tp(), part, out, counts.span(), cx.site);
  } else {
    const std::int64_t slot = slots->slot_rows();
    const auto padded = n == slot ? in.view : padded_copy(cx.exec, in.view, 0, slot);
    auto part = alloc_rows<T, Space>("relayout::dp_gather_partial.chunk", slot / A, h);
    cx.ready();
    cx.count(TrafficOp::reduce_scatter, pg.attn_tp(), GroupKind::attn_tp, bytes_of(padded));
    reduce_scatter(cx.exec, pg.attn_tp(), padded, part, ReduceOp::sum, cx.site);
    cx.count(TrafficOp::all_gather, pg.tp(), GroupKind::tp, bytes_of(out));
    all_gather(cx.exec, pg.tp(), part, out, cx.site);
  }
  return {out, -1, std::move(slots)};
}

// Copy only: this DP group's rows out of the global buffer.
template <class C, class T, class Space>
RowsData<T, Space> dp_scatter_rows(const ProcessGroupsOf<C>& pg, const RowsData<T, Space>& in,
                                   const MoveCtx<Space>& cx = {}) {
  require_dp_bridge_layout(pg, "dp_scatter", cx.site);
  require_slots(pg, *in.slots, "dp_scatter", cx.site);
  const int g = pg.coords().attn_dp_rank;
  auto out = alloc_rows<T, Space>("relayout::dp_scatter", in.slots->count(g), hidden_of(in.view.extent(1)));
  Kokkos::deep_copy(cx.exec, out, row_slice(in.view, in.slots->offset(g), in.slots->count(g)));
  return {out, -1, nullptr};
}

// Sums the expert partials over tp and returns this DP group's rows: one reduce_scatterv when
// attn_tp == 1; otherwise each member receives its tensor_split chunk and an all_gatherv over
// attn_tp rebuilds the group's rows.
template <class C, class T, class Space>
RowsData<T, Space> reduce_scatterv_rows(const ProcessGroupsOf<C>& pg, const RowsData<T, Space>& in,
                                        const MoveCtx<Space>& cx = {}) {
  require_global_rows(pg, in, "reduce_scatterv", PaddingMode::sum_len, "dp_reduce_scatter", cx.site);
  const DpSlots& s = *in.slots;
  const int A = pg.layout().widths().attn_tp, t = pg.coords().attn_tp_rank, tp = pg.layout().size();
  const int g = pg.coords().attn_dp_rank;
  const auto h = hidden_of(in.view.extent(1));
  IntCounts counts(static_cast<std::size_t>(tp));
  for (int r = 0; r < tp; ++r)
    counts[static_cast<std::size_t>(r)] = static_cast<int>(tensor_split_range(s.count(r / A), A, r % A).count * h);
  auto out = alloc_rows<T, Space>("relayout::reduce_scatterv", s.count(g), h);
  cx.ready();
  cx.count(TrafficOp::reduce_scatterv, pg.tp(), GroupKind::tp, bytes_of(in.view));
  if (A == 1) {
    reduce_scatterv(cx.exec, pg.tp(), in.view, out, counts.span(), ReduceOp::sum, cx.site);
  } else {
    auto part = alloc_rows<T, Space>("relayout::reduce_scatterv.chunk", tensor_split_range(s.count(g), A, t).count, h);
    reduce_scatterv(cx.exec, pg.tp(), in.view, part, counts.span(), ReduceOp::sum, cx.site);
    cx.count(TrafficOp::all_gatherv, pg.attn_tp(), GroupKind::attn_tp, bytes_of(out));
    all_gatherv(cx.exec, pg.attn_tp(), part, out, split_counts(s.count(g), A, h).span(), cx.site);
  }
  return {out, -1, nullptr};
}

// max_len: equal blocks, so reduce_scatter over tp, then all_gather over attn_tp and drop padding.
template <class C, class T, class Space>
RowsData<T, Space> dp_reduce_scatter_rows(const ProcessGroupsOf<C>& pg, const RowsData<T, Space>& in,
                                          const MoveCtx<Space>& cx = {}) {
  require_global_rows(pg, in, "dp_reduce_scatter", PaddingMode::max_len, "reduce_scatterv", cx.site);
  const DpSlots& s = *in.slots;
  const int A = pg.layout().widths().attn_tp, g = pg.coords().attn_dp_rank;
  const auto h = hidden_of(in.view.extent(1));
  auto part = alloc_rows<T, Space>("relayout::dp_reduce_scatter.chunk", s.slot_rows() / A, h);
  cx.ready();
  cx.count(TrafficOp::reduce_scatter, pg.tp(), GroupKind::tp, bytes_of(in.view));
  reduce_scatter(cx.exec, pg.tp(), in.view, part, ReduceOp::sum, cx.site);
  if (A == 1) return {row_slice(part, 0, s.count(g)), -1, nullptr};
  auto full = alloc_rows<T, Space>("relayout::dp_reduce_scatter", s.slot_rows(), h);
  cx.count(TrafficOp::all_gather, pg.attn_tp(), GroupKind::attn_tp, bytes_of(full));
  all_gather(cx.exec, pg.attn_tp(), part, full, cx.site);
  return {row_slice(full, 0, s.count(g)), -1, nullptr};
}

}  // namespace relayout::impl
