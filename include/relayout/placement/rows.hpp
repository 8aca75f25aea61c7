// Rows<T, State, Scope, Space>: a token-row tensor (rows x hidden, LayoutRight) whose placement is
// part of its type. Constructing one is the producer's statement of what the rows are (the wo_b
// output is Partial<AttnTp>); from then on only the legal transitions (transitions.hpp) change it.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include <Kokkos_Core.hpp>

#include "relayout/comm/scalar.hpp"
#include "relayout/placement/dp_slots.hpp"
#include "relayout/placement/rows_view.hpp"
#include "relayout/placement/tags.hpp"

namespace relayout {

namespace impl {

// The untyped payload shared by Rows and AnyRows: the rows, the row count before a split
// (RowShard), and the DP slot table (DpGlobal).
template <class T, class Space>
struct RowsData {
  RowsView<T, Space> view;
  std::int64_t full_rows = -1;
  DpSlotsPtr slots;
};

template <class T, class Space>
void check_meta(const RowsData<T, Space>& d, Placement p) {
  const auto n = static_cast<std::int64_t>(d.view.extent(0));
  if (p.state == RowState::row_shard && (d.full_rows < n || d.full_rows < 0))
    throw LayoutError("full_rows", "RowShard rows hold " + std::to_string(n) +
                                       " rows of a tensor of full_rows = " + std::to_string(d.full_rows) +
                                       "; give the row count before the split (>= the rows held)");
  if (p.scope == RowScope::dp_global) {
    if (!d.slots)
      throw LayoutError("slots", "DpGlobal rows need the DpSlots of the step that gathered them");
    const std::int64_t expect = p.state == RowState::row_shard ? d.full_rows : n;
    if (expect != d.slots->total_rows())
      throw LayoutError("slots", "DpGlobal rows have " + std::to_string(expect) +
                                     " rows but their DpSlots describe " +
                                     std::to_string(d.slots->total_rows()));
  }
}

}  // namespace impl

template <CommScalar T, RowStateTag State, RowScopeTag Scope = DpLocal,
          class Space = Kokkos::DefaultExecutionSpace>
class Rows {
  static constexpr bool shard = State::state == RowState::row_shard;
  static constexpr bool global = Scope::scope == RowScope::dp_global;

 public:
  using value_type = T;
  using state_type = State;
  using scope_type = Scope;
  using execution_space = Space;
  using view_type = RowsView<T, Space>;
  static constexpr Placement placement = placement_of<State, Scope>;

  explicit Rows(view_type rows)
    requires(!shard && !global)
      : Rows(impl::RowsData<T, Space>{rows, -1, nullptr}) {}
  // This rank's chunk of a tensor of full_rows rows.
  Rows(view_type rows, std::int64_t full_rows)
    requires(shard && !global)
      : Rows(impl::RowsData<T, Space>{rows, full_rows, nullptr}) {}
  Rows(view_type rows, DpSlotsPtr slots)
    requires(!shard && global)
      : Rows(impl::RowsData<T, Space>{rows, -1, std::move(slots)}) {}
  Rows(view_type rows, std::int64_t full_rows, DpSlotsPtr slots)
    requires(shard && global)
      : Rows(impl::RowsData<T, Space>{rows, full_rows, std::move(slots)}) {}

  // For the transitions and the runtime twin; checks the metadata against the placement.
  explicit Rows(impl::RowsData<T, Space> data) : data_(std::move(data)) {
    impl::check_meta(data_, placement);
  }

  const view_type& view() const { return data_.view; }
  std::int64_t rows() const { return static_cast<std::int64_t>(data_.view.extent(0)); }
  std::int64_t hidden() const { return static_cast<std::int64_t>(data_.view.extent(1)); }
  // Rows of the whole tensor this shard belongs to (RowShard only).
  std::int64_t full_rows() const
    requires shard
  {
    return data_.full_rows;
  }
  // Where each DP group's rows are (DpGlobal only).
  const DpSlots& slots() const
    requires global
  {
    return *data_.slots;
  }
  const impl::RowsData<T, Space>& data() const& { return data_; }
  impl::RowsData<T, Space>&& data() && { return std::move(data_); }

 private:
  impl::RowsData<T, Space> data_;
};

namespace impl {
template <class R>
inline constexpr bool is_rows = false;
template <class T, class St, class Sc, class Sp>
inline constexpr bool is_rows<Rows<T, St, Sc, Sp>> = true;
}  // namespace impl

template <class R>
concept RowsType = impl::is_rows<std::remove_cvref_t<R>>;

}  // namespace relayout
