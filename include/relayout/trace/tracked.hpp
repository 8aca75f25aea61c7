// Tracked<R>: typed rows (placement/rows.hpp) with their owner column, for an engine that traces.
// The owners are host-side bookkeeping beside the rows, not part of Rows: an engine that does not
// trace holds plain Rows and carries nothing. MoeBridge::run moves the column with the rows when
// given &tracked.owners (docs/trace.md).
#pragma once

#include <concepts>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "relayout/mesh/error.hpp"
#include "relayout/placement/rows.hpp"
#include "relayout/trace/owner.hpp"

namespace relayout::trace {

template <RowsType R>
struct Tracked {
  using rows_type = R;
  using view_type = typename R::view_type;

  R rows;
  // Owner of each row (RowOwner::pack; RowOwner::kPad for padding), in row order; empty when the
  // owners are not tracked.
  std::vector<std::int64_t> owners;

  // No rows (a placement that needs no metadata).
  Tracked()
    requires std::constructible_from<R, view_type>
      : rows(view_type()) {}
  explicit Tracked(R r, std::vector<std::int64_t> own = {}) : rows(std::move(r)), owners(std::move(own)) {
    if (!owners.empty() && static_cast<std::int64_t>(owners.size()) != rows.rows())
      throw LayoutError("owners", "trace::Tracked: " + std::to_string(owners.size()) + " owners for " +
                                      std::to_string(rows.rows()) + " rows; give one owner per row, or none");
  }

  const view_type& view() const { return rows.view(); }
  std::int64_t count() const { return rows.rows(); }
};

}  // namespace relayout::trace
