// The demo model's glue to the library's bridge (relayout/bridge): its options (with the injected
// bugs of the verification demos) and its boundary recorder, which the bridge's executor calls at
// every boundary: the owners list (BridgeOptions::record_boundaries) and, for a trace sink, the
// full trace record with value checksums (relayout/trace).
#pragma once

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "relayout/bridge.hpp"
#include "relayout/mesh/layout.hpp"
#include "demo/model/traffic.hpp"
#include "demo/model/workload.hpp"
#include "relayout/trace/record.hpp"
#include "relayout/trace/tracked.hpp"

namespace relayout::model {

// A layer's rows on a rank: its DP group's rows (under CP its share), Replicated over attn_tp, with
// their owners when BridgeOptions::track_owners.
template <class ExecSpace = Kokkos::DefaultExecutionSpace>
using LayerRows = trace::Tracked<relayout::Rows<float, Replicated<AttnTp>, DpLocal, ExecSpace>>;

// Known bugs, wired on purpose so that verification can be shown to catch them (docs/bridge.md,
// "Why illegal transitions do not compile"): never use outside tests and demonstrations.
enum class Inject : std::uint8_t { none, double_reduce, skip_reduce, gather_partial, no_split };
inline constexpr relayout::impl::NameTable<Inject, 5> kInjectNames{{{{Inject::none, "none"},
                                                                     {Inject::double_reduce, "double_reduce"},
                                                                     {Inject::skip_reduce, "skip_reduce"},
                                                                     {Inject::gather_partial, "gather_partial"},
                                                                     {Inject::no_split, "no_split"}}}};
inline Inject parse_inject(std::string_view s) {
  return relayout::impl::parse_name(kInjectNames, s, "--inject", "injected bug");
}
constexpr std::string_view to_string(Inject i) { return kInjectNames.name(i); }

// Path A's restore: a collective that sums (reduce_scatterv / dp_reduce_scatter; the MoE then skips
// its all-reduce), or a copy (dp_scatter; the MoE all-reduces first).
enum class Restore : std::uint8_t { reduce, scatter };

struct BridgeOptions {
  std::optional<PaddingMode> padding;  // forced; otherwise the docs/bridge.md#padding rule
  Restore restore = Restore::reduce;
  Inject inject = Inject::none;
  DispatchDtype dispatch_dtype = DispatchDtype::compute;  // paths a2a_split and direct: the rows' type in the dispatch
  bool track_owners = true;        // move row owners with the rows and check conservation
  bool record_boundaries = false;  // keep the owners this rank holds after every boundary
};

// An injected bug must be able to show itself on the layout it is wired into.
inline void check_inject(Inject inject, BridgePath path, const Widths& w) {
  const auto refuse = [&](const std::string& rule) {
    throw LayoutError("--inject", "--inject " + std::string(to_string(inject)) + " " + rule +
                                      "; this layout takes path " + std::string(to_string(path)) +
                                      " with tp = " + std::to_string(w.tp) + ", attn_tp = " +
                                      std::to_string(w.attn_tp));
  };
  switch (inject) {
    case Inject::none: return;
    case Inject::double_reduce:
    case Inject::skip_reduce:
      if ((path != BridgePath::dp_gather && path != BridgePath::tp_moe) || w.tp < 2)
        refuse("needs a layout whose MoE partials are summed over tp > 1 (path dp_gather or tp_moe)");
      return;
    case Inject::gather_partial:
      if (path != BridgePath::dp_gather || w.attn_tp < 2) refuse("needs path dp_gather with attn_tp > 1");
      return;
    case Inject::no_split:
      if (path != BridgePath::a2a_split) refuse("needs path a2a_split (attn_tp > 1 with an all-to-all backend)");
      return;
  }
}

// What one boundary is, beside its owners: the meaning of the values (trace::Record::state), how
// their holders relate, how many times each row must appear over all ranks, and the group of the
// collective that produced it (none for a local step).
struct BoundaryPoint {
  std::string_view name;  // views of the plan's constants or of literals: no copy, no dangling pointer
  std::string_view state;
  RowState sharing = RowState::replicated;  // replicated or partial
  int copies = 1;
  std::optional<GroupKind> group;
  bool owners_list = true;  // also kept in the owners-only Boundary list (the example's picture)
};

// The one place a boundary is recorded. With a sink whose `enabled` is false (trace::NullSink) the
// trace branch is compiled out, checksums included.
template <class C, class ExecSpace, class Sink = trace::NullSink>
  requires trace::TraceSink<Sink>
class BoundaryRecorder {
 public:
  BoundaryRecorder(const ProcessGroupsOf<C>& groups, const BridgeOptions& opts, std::vector<Boundary>* boundaries,
                   Sink* sink, const std::vector<std::int64_t>* counts)
      : groups_(groups), opts_(opts), boundaries_(boundaries), sink_(sink), counts_(counts) {}

  void attach(Sink* sink) { sink_ = sink; }
  bool tracing() const {
    if constexpr (Sink::enabled) return sink_ != nullptr && sink_->active();
    return false;
  }

  // Rows [first, first + owners.size()) of `values` are the rows of `owners` (pads included).
  template <class V>
  void operator()(int layer, const BoundaryPoint& p, const std::vector<std::int64_t>& owners, const V& values,
                  std::int64_t first = 0) const {
    if (p.owners_list && boundaries_ && opts_.record_boundaries) boundaries_->push_back({layer, std::string(p.name), owners});
    if constexpr (Sink::enabled) {
      if (!tracing()) return;
      trace::Record r = base(layer, p);
      r.row_count = std::int64_t(owners.size());
      const int H = r.hidden = int(values.extent(1));
      const std::size_t have = values.extent(0);  // 0 for owners_only
      typename V::host_mirror_type h;
      if (have > 0) h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), values);
      for (std::size_t i = 0; i < owners.size(); ++i) {
        if (owners[i] == RowOwner::kPad) {
          ++r.pad_rows;
          continue;
        }
        trace::Row row{RowOwner::request(owners[i]), RowOwner::position(owners[i]), step, false, {}};
        if (have > std::size_t(first) + i) {
          row.has_sum = true;
          row.sum = trace::row_sum(&h(first + std::int64_t(i), 0), H);
        }
        r.rows.push_back(row);
      }
      sink_->write(r);
    }
  }
  // A boundary whose values this rank cannot see (the rows dispatched to its experts).
  void owners_only(int layer, const BoundaryPoint& p, const std::vector<std::int64_t>& owners) const {
    (*this)(layer, p, owners, RowsView<float, ExecSpace>());
  }
  // A checked invariant failed at this boundary: the trace shows it before the error is thrown.
  void fail(int layer, const BoundaryPoint& p, const std::string& error) const {
    if constexpr (Sink::enabled) {
      if (!tracing()) return;
      trace::Record r = base(layer, p);
      r.error = error;
      sink_->write(r);
    }
  }

  int step = 0;  // speculative step of the rows recorded now
  std::vector<std::int64_t> scaled_counts;  // global_num_tokens as scaled by the caller, if any

 private:
  trace::Record base(int layer, const BoundaryPoint& p) const {
    const RankCoords k = groups_.coords();
    trace::Record r;
    r.layer = layer;
    r.boundary = std::string(p.name);
    r.state = std::string(p.state);
    r.sharing = p.sharing;
    r.copies = p.copies;
    r.global_rank = groups_.rank();
    r.attn_dp_rank = k.attn_dp_rank;
    r.attn_tp_rank = k.attn_tp_rank;
    r.attn_cp_rank = k.attn_cp_rank;
    r.moe_ep_rank = k.moe_ep_rank;
    if (p.group) {
      r.group = std::string(to_string(*p.group));
      r.handle = groups_.handle_id(*p.group);
    }
    if (counts_) r.global_num_tokens = *counts_;
    r.scaled_global_num_tokens = scaled_counts;
    return r;
  }

  const ProcessGroupsOf<C>& groups_;
  BridgeOptions opts_;
  std::vector<Boundary>* boundaries_;
  Sink* sink_;
  const std::vector<std::int64_t>* counts_;
};

// The library's bridge options for these demo options.
inline relayout::BridgeOptions bridge_options(const BridgeOptions& o) {
  relayout::BridgeOptions b;
  b.padding = o.padding;
  b.restore = o.restore == Restore::scatter ? BridgeRestore::scatter : BridgeRestore::reduce;
  b.dispatch_dtype = o.dispatch_dtype;
  constexpr BridgeFault faults[] = {BridgeFault::none, BridgeFault::double_reduce, BridgeFault::skip_reduce,
                                    BridgeFault::gather_partial, BridgeFault::no_split};
  b.fault = faults[static_cast<int>(o.inject)];
  return b;
}

// The executor's boundaries, recorded through the demo's BoundaryRecorder (owners list and trace).
template <class Recorder>
struct RecordBoundaries {
  static constexpr bool enabled = true;
  const Recorder& record;
  int layer = 0;
  GroupKind attn_group_kind = GroupKind::attn_tp;

  template <class V>
  void operator()(const relayout::BoundaryInfo& b, std::span<const std::int64_t> owners, const V& values,
                  std::int64_t first) const {
    BoundaryPoint p;
    p.name = b.name;
    p.state = b.step->state;
    p.sharing = b.sharing;
    p.copies = b.copies;
    p.group = b.step->group;
    record(layer, p, std::vector<std::int64_t>(owners.begin(), owners.end()), values, first);
  }
};

}  // namespace relayout::model
