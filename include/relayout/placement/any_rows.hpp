// AnyRows: the runtime twin of Rows for engines whose layout is known only at run time. The
// placement is a value; the same transitions check the same rules and throw PlacementError with
// the sentence the compile-time check prints.
#pragma once

#include <utility>

#include "relayout/placement/impl/moves.hpp"
#include "relayout/placement/rules.hpp"
#include "relayout/placement/transitions.hpp"

namespace relayout {

template <CommScalar T, class Space = Kokkos::DefaultExecutionSpace>
class AnyRows {
 public:
  using value_type = T;
  using execution_space = Space;
  using view_type = RowsView<T, Space>;

  // full_rows is required for RowShard placements, slots for DpGlobal ones.
  AnyRows(view_type rows, Placement placement, std::int64_t full_rows = -1, DpSlotsPtr slots = nullptr)
      : AnyRows(impl::RowsData<T, Space>{rows, full_rows, std::move(slots)}, placement) {}
  AnyRows(impl::RowsData<T, Space> data, Placement placement)
      : data_(std::move(data)), placement_(placement) {
    impl::check_meta(data_, placement_);
  }
  template <RowStateTag St, RowScopeTag Sc>
  AnyRows(const Rows<T, St, Sc, Space>& rows) : data_(rows.data()), placement_(rows.placement) {}

  Placement placement() const { return placement_; }
  const view_type& view() const { return data_.view; }
  std::int64_t rows() const { return static_cast<std::int64_t>(data_.view.extent(0)); }
  std::int64_t hidden() const { return static_cast<std::int64_t>(data_.view.extent(1)); }
  std::int64_t full_rows() const { return data_.full_rows; }
  const DpSlotsPtr& slots() const { return data_.slots; }
  const impl::RowsData<T, Space>& data() const { return data_; }

  // Back to a typed Rows; throws when the placement is not R's.
  template <RowsType R>
  R as() const {
    if (R::placement != placement_)
      throw PlacementError("relayout: rows are " + to_string(placement_) + ", not " + to_string(R::placement));
    return R(data_);
  }

 private:
  impl::RowsData<T, Space> data_;
  Placement placement_;
};

namespace impl {
inline Placement checked_transition(Transition t, Placement p) {
  if (const auto next = transition_result(t, p)) return *next;
  throw PlacementError(transition_error(t, p));
}
}  // namespace impl

template <class C, class T, class Sp>
AnyRows<T, Sp> all_reduce(const ProcessGroupsOf<C>& pg, const AnyRows<T, Sp>& x) {
  const Placement p = impl::checked_transition(Transition::all_reduce, x.placement());
  return {impl::all_reduce_rows(pg.comm(p.group), x.data()), p};
}
template <class C, class T, class Sp>
AnyRows<T, Sp> reduce_scatter(const ProcessGroupsOf<C>& pg, const AnyRows<T, Sp>& x) {
  const Placement p = impl::checked_transition(Transition::reduce_scatter, x.placement());
  return {impl::reduce_scatter_rows(pg.comm(p.group), x.data()), p};
}
template <class C, class T, class Sp>
AnyRows<T, Sp> all_gather(const ProcessGroupsOf<C>& pg, const AnyRows<T, Sp>& x) {
  const Placement p = impl::checked_transition(Transition::all_gather, x.placement());
  return {impl::all_gather_rows(pg.comm(p.group), x.data()), p};
}
template <class C, class T, class Sp>
AnyRows<T, Sp> split_rows(const ProcessGroupsOf<C>& pg, const AnyRows<T, Sp>& x) {
  const Placement p = impl::checked_transition(Transition::split_rows, x.placement());
  const auto& c = pg.comm(p.group);
  return {impl::split_rows_data(c.size(), c.rank(), x.data()), p};
}
template <class C, class T, class Sp, IdRange Ids>
SplitRows<AnyRows<T, Sp>, std::ranges::range_value_t<Ids>> split_rows(const ProcessGroupsOf<C>& pg,
                                                                      const AnyRows<T, Sp>& x, const Ids& ids) {
  const Placement p = impl::checked_transition(Transition::split_rows, x.placement());
  const auto& c = pg.comm(p.group);
  const std::span<const std::ranges::range_value_t<Ids>> all(std::ranges::data(ids), std::ranges::size(ids));
  if (static_cast<std::int64_t>(all.size()) != x.rows())
    throw LayoutError("ids", "split_rows: the id array has " + std::to_string(all.size()) +
                                 " entries but the rows have " + std::to_string(x.rows()) +
                                 "; ids must stay aligned with rows");
  const Range mine = tensor_split_range(x.rows(), c.size(), c.rank());
  return {AnyRows<T, Sp>(impl::split_rows_data(c.size(), c.rank(), x.data()), p),
          all.subspan(static_cast<std::size_t>(mine.begin), static_cast<std::size_t>(mine.count))};
}
template <class C, class T, class Sp>
AnyRows<T, Sp> dp_gather_replicate(const ProcessGroupsOf<C>& pg, const AnyRows<T, Sp>& x, DpSlotsPtr slots) {
  const Placement p = impl::checked_transition(Transition::dp_gather_replicate, x.placement());
  return {impl::dp_gather_replicate_rows(pg, x.data(), std::move(slots)), p};
}
template <class C, class T, class Sp>
AnyRows<T, Sp> dp_gather_partial(const ProcessGroupsOf<C>& pg, const AnyRows<T, Sp>& x, DpSlotsPtr slots) {
  const Placement p = impl::checked_transition(Transition::dp_gather_partial, x.placement());
  return {impl::dp_gather_partial_rows(pg, x.data(), std::move(slots)), p};
}
template <class C, class T, class Sp>
AnyRows<T, Sp> dp_scatter(const ProcessGroupsOf<C>& pg, const AnyRows<T, Sp>& x) {
  const Placement p = impl::checked_transition(Transition::dp_scatter, x.placement());
  return {impl::dp_scatter_rows(pg, x.data()), p};
}
template <class C, class T, class Sp>
AnyRows<T, Sp> reduce_scatterv(const ProcessGroupsOf<C>& pg, const AnyRows<T, Sp>& x) {
  const Placement p = impl::checked_transition(Transition::reduce_scatterv, x.placement());
  return {impl::reduce_scatterv_rows(pg, x.data()), p};
}
template <class C, class T, class Sp>
AnyRows<T, Sp> dp_reduce_scatter(const ProcessGroupsOf<C>& pg, const AnyRows<T, Sp>& x) {
  const Placement p = impl::checked_transition(Transition::dp_reduce_scatter, x.placement());
  return {impl::dp_reduce_scatter_rows(pg, x.data()), p};
}

}  // namespace relayout
