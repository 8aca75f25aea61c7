// The legal placement transitions on typed Rows. Each takes the ProcessGroups and the rows and
// returns new rows in the new placement; the caller's rows are never written (all_reduce on an
// rvalue reuses the storage it is handed). Every other combination does not compile: a rejecting
// overload's static_assert says why and which call to make instead (rules.hpp). The collectives'
// argument errors, the agreement check and the watchdog name the caller's line (`site`).
#pragma once

#include <concepts>
#include <cstdint>
#include <ranges>
#include <source_location>
#include <span>
#include <string>
#include <vector>

#include "relayout/placement/impl/moves.hpp"
#include "relayout/placement/rules.hpp"

namespace relayout {

namespace impl {
template <Transition Op, class R>
inline constexpr bool legal = transition_result(Op, std::remove_cvref_t<R>::placement).has_value();

// The move context of a transition without an instance: the default one, the caller's site.
template <class Sp>
MoveCtx<Sp> at(std::source_location site) {
  return MoveCtx<Sp>{.site = site};
}

template <Transition Op, class R>
std::remove_cvref_t<R> reject(const R& x) {
  using Rw = std::remove_cvref_t<R>;
  reject_transition<Op, typename Rw::state_type, typename Rw::scope_type>();
  return x;
}
}  // namespace impl

// Rows of this rank's chunk and the matching slice of an id array (input_ids, global ids, ...).
template <class R, class Id>
struct SplitRows {
  R rows;
  std::span<const Id> ids;
};

template <class Ids>
concept IdRange = std::ranges::contiguous_range<const Ids&> && std::ranges::sized_range<const Ids&> &&
                  std::integral<std::ranges::range_value_t<Ids>>;

// ---- all_reduce: Partial<G> -> Replicated<G>

template <class C, class T, GroupTag G, RowScopeTag Sc, class Sp>
Rows<T, Replicated<G>, Sc, Sp> all_reduce(const ProcessGroupsOf<C>& pg, const Rows<T, Partial<G>, Sc, Sp>& x,
                                          std::source_location site = std::source_location::current()) {
  return Rows<T, Replicated<G>, Sc, Sp>(impl::all_reduce_rows(pg.comm(G::kind), x.data(), G::kind, impl::at<Sp>(site)));
}
// Hands the partial rows over: the sum is written into their storage.
template <class C, class T, GroupTag G, RowScopeTag Sc, class Sp>
Rows<T, Replicated<G>, Sc, Sp> all_reduce(const ProcessGroupsOf<C>& pg, Rows<T, Partial<G>, Sc, Sp>&& x,
                                          std::source_location site = std::source_location::current()) {
  return Rows<T, Replicated<G>, Sc, Sp>(
      impl::all_reduce_rows_in_place(pg.comm(G::kind), std::move(x).data(), G::kind, impl::at<Sp>(site)));
}
template <class C, RowsType R>
  requires(!impl::legal<Transition::all_reduce, R>)
std::remove_cvref_t<R> all_reduce(const ProcessGroupsOf<C>&, const R& x) {
  return impl::reject<Transition::all_reduce>(x);
}

// ---- reduce_scatter: Partial<G> -> RowShard<G> (sum and tensor_split in one collective)

template <class C, class T, GroupTag G, RowScopeTag Sc, class Sp>
Rows<T, RowShard<G>, Sc, Sp> reduce_scatter(const ProcessGroupsOf<C>& pg, const Rows<T, Partial<G>, Sc, Sp>& x,
                                            std::source_location site = std::source_location::current()) {
  return Rows<T, RowShard<G>, Sc, Sp>(
      impl::reduce_scatter_rows(pg.comm(G::kind), x.data(), G::kind, impl::at<Sp>(site)));
}
template <class C, RowsType R>
  requires(!impl::legal<Transition::reduce_scatter, R>)
std::remove_cvref_t<R> reduce_scatter(const ProcessGroupsOf<C>&, const R& x) {
  return impl::reject<Transition::reduce_scatter>(x);
}

// ---- all_gather: RowShard<G> -> Replicated<G> (restores split rows; not a sum)

template <class C, class T, GroupTag G, RowScopeTag Sc, class Sp>
Rows<T, Replicated<G>, Sc, Sp> all_gather(const ProcessGroupsOf<C>& pg, const Rows<T, RowShard<G>, Sc, Sp>& x,
                                          std::source_location site = std::source_location::current()) {
  return Rows<T, Replicated<G>, Sc, Sp>(impl::all_gather_rows(pg.comm(G::kind), x.data(), G::kind, impl::at<Sp>(site)));
}
template <class C, RowsType R>
  requires(!impl::legal<Transition::all_gather, R>)
std::remove_cvref_t<R> all_gather(const ProcessGroupsOf<C>&, const R& x) {
  return impl::reject<Transition::all_gather>(x);
}

// ---- split_rows: Replicated<G> -> RowShard<G>, local (a view of this member's chunk)

template <class C, class T, GroupTag G, RowScopeTag Sc, class Sp>
Rows<T, RowShard<G>, Sc, Sp> split_rows(const ProcessGroupsOf<C>& pg, const Rows<T, Replicated<G>, Sc, Sp>& x) {
  const auto& c = pg.comm(G::kind);
  return Rows<T, RowShard<G>, Sc, Sp>(impl::split_rows_data(c.size(), c.rank(), x.data()));
}
// Also splits an id array aligned with the rows the same way; the ids returned are a slice of the
// ones given, never invented.
template <class C, class T, GroupTag G, RowScopeTag Sc, class Sp, IdRange Ids>
SplitRows<Rows<T, RowShard<G>, Sc, Sp>, std::ranges::range_value_t<Ids>> split_rows(
    const ProcessGroupsOf<C>& pg, const Rows<T, Replicated<G>, Sc, Sp>& x, const Ids& ids) {
  const auto& c = pg.comm(G::kind);
  const std::span<const std::ranges::range_value_t<Ids>> all(std::ranges::data(ids), std::ranges::size(ids));
  if (static_cast<std::int64_t>(all.size()) != x.rows())
    throw LayoutError("ids", "split_rows: the id array has " + std::to_string(all.size()) +
                                 " entries but the rows have " + std::to_string(x.rows()) +
                                 "; ids must stay aligned with rows");
  const Range mine = tensor_split_range(x.rows(), c.size(), c.rank());
  return {Rows<T, RowShard<G>, Sc, Sp>(impl::split_rows_data(c.size(), c.rank(), x.data())),
          all.subspan(static_cast<std::size_t>(mine.begin), static_cast<std::size_t>(mine.count))};
}
template <class C, RowsType R, class... Ids>
  requires(!impl::legal<Transition::split_rows, R>)
std::remove_cvref_t<R> split_rows(const ProcessGroupsOf<C>&, const R& x, const Ids&...) {
  return impl::reject<Transition::split_rows>(x);
}

// ---- the DP bridge

// Replicated<AttnTp>, DpLocal -> Replicated<Tp>, DpGlobal. One contributor per attention-TP group.
template <class C, class T, class Sp>
Rows<T, Replicated<group::Tp>, DpGlobal, Sp> dp_gather_replicate(const ProcessGroupsOf<C>& pg,
                                                                 const Rows<T, Replicated<AttnTp>, DpLocal, Sp>& x,
                                                                 DpSlotsPtr slots,
                                                                 std::source_location site = std::source_location::current()) {
  return Rows<T, Replicated<group::Tp>, DpGlobal, Sp>(
      impl::dp_gather_replicate_rows(pg, x.data(), std::move(slots), impl::at<Sp>(site)));
}
template <class C, RowsType R>
  requires(!impl::legal<Transition::dp_gather_replicate, R>)
std::remove_cvref_t<R> dp_gather_replicate(const ProcessGroupsOf<C>&, const R& x, const DpSlotsPtr&) {
  return impl::reject<Transition::dp_gather_replicate>(x);
}

// Partial<AttnTp>, DpLocal -> Replicated<Tp>, DpGlobal: completes the attention sum on the way.
template <class C, class T, class Sp>
Rows<T, Replicated<group::Tp>, DpGlobal, Sp> dp_gather_partial(const ProcessGroupsOf<C>& pg,
                                                               const Rows<T, Partial<AttnTp>, DpLocal, Sp>& x,
                                                               DpSlotsPtr slots,
                                                               std::source_location site = std::source_location::current()) {
  return Rows<T, Replicated<group::Tp>, DpGlobal, Sp>(
      impl::dp_gather_partial_rows(pg, x.data(), std::move(slots), impl::at<Sp>(site)));
}
template <class C, RowsType R>
  requires(!impl::legal<Transition::dp_gather_partial, R>)
std::remove_cvref_t<R> dp_gather_partial(const ProcessGroupsOf<C>&, const R& x, const DpSlotsPtr&) {
  return impl::reject<Transition::dp_gather_partial>(x);
}

// Replicated<Tp>, DpGlobal -> Replicated<AttnTp>, DpLocal: copy only (the MoE summed already).
template <class C, class T, class Sp>
Rows<T, Replicated<AttnTp>, DpLocal, Sp> dp_scatter(const ProcessGroupsOf<C>& pg,
                                                    const Rows<T, Replicated<group::Tp>, DpGlobal, Sp>& x,
                                                    std::source_location site = std::source_location::current()) {
  return Rows<T, Replicated<AttnTp>, DpLocal, Sp>(impl::dp_scatter_rows(pg, x.data(), impl::at<Sp>(site)));
}
template <class C, RowsType R>
  requires(!impl::legal<Transition::dp_scatter, R>)
std::remove_cvref_t<R> dp_scatter(const ProcessGroupsOf<C>&, const R& x) {
  return impl::reject<Transition::dp_scatter>(x);
}

// Partial<Tp>, DpGlobal -> Replicated<AttnTp>, DpLocal: sums the expert partials (sum_len rows).
template <class C, class T, class Sp>
Rows<T, Replicated<AttnTp>, DpLocal, Sp> reduce_scatterv(const ProcessGroupsOf<C>& pg,
                                                         const Rows<T, Partial<group::Tp>, DpGlobal, Sp>& x,
                                                         std::source_location site = std::source_location::current()) {
  return Rows<T, Replicated<AttnTp>, DpLocal, Sp>(impl::reduce_scatterv_rows(pg, x.data(), impl::at<Sp>(site)));
}
template <class C, RowsType R>
  requires(!impl::legal<Transition::reduce_scatterv, R>)
std::remove_cvref_t<R> reduce_scatterv(const ProcessGroupsOf<C>&, const R& x) {
  return impl::reject<Transition::reduce_scatterv>(x);
}

// Partial<Tp>, DpGlobal -> Replicated<AttnTp>, DpLocal: sums the expert partials (max_len rows).
template <class C, class T, class Sp>
Rows<T, Replicated<AttnTp>, DpLocal, Sp> dp_reduce_scatter(const ProcessGroupsOf<C>& pg,
                                                           const Rows<T, Partial<group::Tp>, DpGlobal, Sp>& x,
                                                           std::source_location site = std::source_location::current()) {
  return Rows<T, Replicated<AttnTp>, DpLocal, Sp>(impl::dp_reduce_scatter_rows(pg, x.data(), impl::at<Sp>(site)));
}
template <class C, RowsType R>
  requires(!impl::legal<Transition::dp_reduce_scatter, R>)
std::remove_cvref_t<R> dp_reduce_scatter(const ProcessGroupsOf<C>&, const R& x) {
  return impl::reject<Transition::dp_reduce_scatter>(x);
}

// ---- the same transitions on the caller's execution-space instance: it is fenced (only it)
// before memory goes to MPI and runs every copy; `log`, when given, counts the bytes moved.

namespace impl {
template <class Sp>
MoveCtx<Sp> ctx(const Sp& exec, TrafficLog* log, std::source_location site = std::source_location::current()) {
  return MoveCtx<Sp>{exec, log, site};
}
template <class Sp>
concept ExecInstance = Kokkos::is_execution_space<Sp>::value;
}  // namespace impl

template <impl::ExecInstance Sp, class C, class T, GroupTag G, RowScopeTag Sc>
Rows<T, Replicated<G>, Sc, Sp> all_reduce(const Sp& exec, const ProcessGroupsOf<C>& pg,
                                          const Rows<T, Partial<G>, Sc, Sp>& x, TrafficLog* log = nullptr,
                                          std::source_location site = std::source_location::current()) {
  return Rows<T, Replicated<G>, Sc, Sp>(
      impl::all_reduce_rows(pg.comm(G::kind), x.data(), G::kind, impl::ctx(exec, log, site)));
}
template <impl::ExecInstance Sp, class C, class T, GroupTag G, RowScopeTag Sc>
Rows<T, Replicated<G>, Sc, Sp> all_reduce(const Sp& exec, const ProcessGroupsOf<C>& pg,
                                          Rows<T, Partial<G>, Sc, Sp>&& x, TrafficLog* log = nullptr,
                                          std::source_location site = std::source_location::current()) {
  return Rows<T, Replicated<G>, Sc, Sp>(
      impl::all_reduce_rows_in_place(pg.comm(G::kind), std::move(x).data(), G::kind, impl::ctx(exec, log, site)));
}
template <impl::ExecInstance Sp, class C, RowsType R>
  requires(!impl::legal<Transition::all_reduce, R>)
std::remove_cvref_t<R> all_reduce(const Sp&, const ProcessGroupsOf<C>&, const R& x, TrafficLog* = nullptr) {
  return impl::reject<Transition::all_reduce>(x);
}

template <impl::ExecInstance Sp, class C, class T, GroupTag G, RowScopeTag Sc>
Rows<T, RowShard<G>, Sc, Sp> reduce_scatter(const Sp& exec, const ProcessGroupsOf<C>& pg,
                                            const Rows<T, Partial<G>, Sc, Sp>& x, TrafficLog* log = nullptr,
                                            std::source_location site = std::source_location::current()) {
  return Rows<T, RowShard<G>, Sc, Sp>(
      impl::reduce_scatter_rows(pg.comm(G::kind), x.data(), G::kind, impl::ctx(exec, log, site)));
}

template <impl::ExecInstance Sp, class C, class T, GroupTag G, RowScopeTag Sc>
Rows<T, Replicated<G>, Sc, Sp> all_gather(const Sp& exec, const ProcessGroupsOf<C>& pg,
                                          const Rows<T, RowShard<G>, Sc, Sp>& x, TrafficLog* log = nullptr,
                                          std::source_location site = std::source_location::current()) {
  return Rows<T, Replicated<G>, Sc, Sp>(
      impl::all_gather_rows(pg.comm(G::kind), x.data(), G::kind, impl::ctx(exec, log, site)));
}
template <impl::ExecInstance Sp, class C, RowsType R>
  requires(!impl::legal<Transition::all_gather, R>)
std::remove_cvref_t<R> all_gather(const Sp&, const ProcessGroupsOf<C>&, const R& x, TrafficLog* = nullptr) {
  return impl::reject<Transition::all_gather>(x);
}

template <impl::ExecInstance Sp, class C, class T, class Sc>
Rows<T, Replicated<group::Tp>, DpGlobal, Sp> dp_gather_replicate(const Sp& exec, const ProcessGroupsOf<C>& pg,
                                                                 const Rows<T, Replicated<AttnTp>, Sc, Sp>& x,
                                                                 DpSlotsPtr slots, TrafficLog* log = nullptr,
                                                                 std::source_location site = std::source_location::current()) {
  static_assert(std::same_as<Sc, DpLocal>, "relayout: dp_gather_replicate gathers DpLocal rows");
  return Rows<T, Replicated<group::Tp>, DpGlobal, Sp>(
      impl::dp_gather_replicate_rows(pg, x.data(), std::move(slots), impl::ctx(exec, log, site)));
}
template <impl::ExecInstance Sp, class C, RowsType R>
  requires(!impl::legal<Transition::dp_gather_replicate, R>)
std::remove_cvref_t<R> dp_gather_replicate(const Sp&, const ProcessGroupsOf<C>&, const R& x, const DpSlotsPtr&,
                                           TrafficLog* = nullptr) {
  return impl::reject<Transition::dp_gather_replicate>(x);
}

template <impl::ExecInstance Sp, class C, class T>
Rows<T, Replicated<group::Tp>, DpGlobal, Sp> dp_gather_partial(const Sp& exec, const ProcessGroupsOf<C>& pg,
                                                               const Rows<T, Partial<AttnTp>, DpLocal, Sp>& x,
                                                               DpSlotsPtr slots, TrafficLog* log = nullptr,
                                                               std::source_location site = std::source_location::current()) {
  return Rows<T, Replicated<group::Tp>, DpGlobal, Sp>(
      impl::dp_gather_partial_rows(pg, x.data(), std::move(slots), impl::ctx(exec, log, site)));
}

template <impl::ExecInstance Sp, class C, class T>
Rows<T, Replicated<AttnTp>, DpLocal, Sp> dp_scatter(const Sp& exec, const ProcessGroupsOf<C>& pg,
                                                    const Rows<T, Replicated<group::Tp>, DpGlobal, Sp>& x,
                                                    TrafficLog* log = nullptr,
                                                    std::source_location site = std::source_location::current()) {
  return Rows<T, Replicated<AttnTp>, DpLocal, Sp>(impl::dp_scatter_rows(pg, x.data(), impl::ctx(exec, log, site)));
}
template <impl::ExecInstance Sp, class C, RowsType R>
  requires(!impl::legal<Transition::dp_scatter, R>)
std::remove_cvref_t<R> dp_scatter(const Sp&, const ProcessGroupsOf<C>&, const R& x, TrafficLog* = nullptr) {
  return impl::reject<Transition::dp_scatter>(x);
}

template <impl::ExecInstance Sp, class C, class T>
Rows<T, Replicated<AttnTp>, DpLocal, Sp> reduce_scatterv(const Sp& exec, const ProcessGroupsOf<C>& pg,
                                                         const Rows<T, Partial<group::Tp>, DpGlobal, Sp>& x,
                                                         TrafficLog* log = nullptr,
                                                         std::source_location site = std::source_location::current()) {
  return Rows<T, Replicated<AttnTp>, DpLocal, Sp>(impl::reduce_scatterv_rows(pg, x.data(), impl::ctx(exec, log, site)));
}
template <impl::ExecInstance Sp, class C, RowsType R>
  requires(!impl::legal<Transition::reduce_scatterv, R>)
std::remove_cvref_t<R> reduce_scatterv(const Sp&, const ProcessGroupsOf<C>&, const R& x, TrafficLog* = nullptr) {
  return impl::reject<Transition::reduce_scatterv>(x);
}

template <impl::ExecInstance Sp, class C, class T>
Rows<T, Replicated<AttnTp>, DpLocal, Sp> dp_reduce_scatter(const Sp& exec, const ProcessGroupsOf<C>& pg,
                                                           const Rows<T, Partial<group::Tp>, DpGlobal, Sp>& x,
                                                           TrafficLog* log = nullptr,
                                                           std::source_location site = std::source_location::current()) {
  return Rows<T, Replicated<AttnTp>, DpLocal, Sp>(
      impl::dp_reduce_scatter_rows(pg, x.data(), impl::ctx(exec, log, site)));
}
template <impl::ExecInstance Sp, class C, RowsType R>
  requires(!impl::legal<Transition::dp_reduce_scatter, R>)
std::remove_cvref_t<R> dp_reduce_scatter(const Sp&, const ProcessGroupsOf<C>&, const R& x, TrafficLog* = nullptr) {
  return impl::reject<Transition::dp_reduce_scatter>(x);
}

// Rows Replicated over attn_tp are Replicated over tp when the two groups have the same members
// (attn_dp == attn_cp == 1): the no-DP-attention layouts, where the MoE runs on every rank's rows.
template <class C, class T, RowScopeTag Sc, class Sp>
Rows<T, Replicated<AttnTp>, Sc, Sp> as_attn_tp(const ProcessGroupsOf<C>& pg, Rows<T, Replicated<group::Tp>, Sc, Sp> x) {
  if (pg.attn_tp().size() != pg.tp().size())
    throw LayoutError("rows", "as_attn_tp: rows Replicated over tp are Replicated over attn_tp only when attn_tp == tp; "
                              "attn_tp = " + std::to_string(pg.attn_tp().size()) + ", tp = " + std::to_string(pg.tp().size()));
  return Rows<T, Replicated<AttnTp>, Sc, Sp>(std::move(x).data());
}

// The per-step token counts: every rank all-gathers its count over tp and keeps one entry per
// attention-DP group (that of attn_tp_rank 0), so no group is listed attn_tp times; under
// attention CP one per (DP group, CP rank) share, in rank order (ranks run (attn_dp, attn_cp,
// attn_tp), so each share is one block of attn_tp ranks). Members of an attention-TP group must
// report the same count; otherwise every rank throws the same error.
template <class C>
std::vector<std::int64_t> gather_num_tokens(const ProcessGroupsOf<C>& pg, std::int64_t local_tokens,
                                            std::source_location site = std::source_location::current()) {
  const int tp = pg.layout().size(), A = pg.layout().widths().attn_tp;
  std::vector<std::int64_t> mine{local_tokens}, all(static_cast<std::size_t>(tp));
  all_gather(pg.tp(), mine, all, site);
  std::vector<std::int64_t> out;
  for (int r = 0; r < tp; ++r) {
    const std::int64_t lead = all[static_cast<std::size_t>(r - r % A)];
    if (all[static_cast<std::size_t>(r)] != lead)
      throw LayoutError("local_tokens", "gather_num_tokens: rank " + std::to_string(r) + " reports " +
                                            std::to_string(all[static_cast<std::size_t>(r)]) +
                                            " tokens but its attention-TP group leader reports " +
                                            std::to_string(lead) + "; the members of an attention-TP group hold the same rows");
    if (r % A == 0) out.push_back(lead);
  }
  return out;
}

}  // namespace relayout
