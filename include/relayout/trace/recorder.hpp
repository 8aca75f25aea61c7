// trace::Recorder: turns a forward's layout boundaries into trace::Records for a sink — the bridge's
// (as its observer) and the engine's own (attention output, bridge input, layer output) — with the
// fields `relayout trace diff` requires (docs/trace.md, "Recording your own layer").
#pragma once

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "relayout/bridge/bridge.hpp"
#include "relayout/comm/process_groups.hpp"
#include "relayout/trace/owner.hpp"
#include "relayout/trace/record.hpp"

namespace relayout::trace {

// What one boundary is, beside its rows: the meaning of the values (Record::state), how their
// holders relate, how many times each row appears over all ranks, and the group of the collective
// that produced it (none for a local step).
struct Point {
  std::string_view name;  // views of constants or literals: the record copies them
  std::string_view state;
  RowState sharing = RowState::replicated;
  int copies = 1;
  std::optional<GroupKind> group;
  bool log_owners = true;  // also passed to the owners hook (false where it repeats another point's rows)
};

// Called with the owners this rank holds after each boundary (a picture of who holds what, kept
// without a sink). Pads are RowOwner::kPad.
using OwnersHook = std::function<void(int layer, std::string_view boundary, std::span<const std::int64_t> owners)>;

// With a sink whose `enabled` is false (NullSink) the record branch compiles out, checksums
// included; the owners hook still runs when set.
template <class C, class Sink = NullSink>
  requires TraceSink<Sink>
class Recorder {
 public:
  // `counts`: the step's global_num_tokens (per attention-DP group; under CP per CP share), read at
  // every record so the engine updates it each step; nullptr when the engine does not know them
  // (the field is then written empty and trace diff skips the checks that need it).
  explicit Recorder(const ProcessGroupsOf<C>& groups, Sink* sink = nullptr,
                    const std::vector<std::int64_t>* counts = nullptr, OwnersHook on_owners = {})
      : groups_(groups), sink_(sink), counts_(counts), on_owners_(std::move(on_owners)) {}

  void attach(Sink* sink) { sink_ = sink; }
  bool tracing() const {
    if constexpr (Sink::enabled) return sink_ != nullptr && sink_->active();
    return false;
  }

  // The rows of `owners` after boundary `p`: rows [first, first + owners.size()) of `values` (a 2-D
  // Kokkos view of any element type and memory space; empty where this rank cannot see them).
  template <class V>
  void operator()(int layer, const Point& p, std::span<const std::int64_t> owners, const V& values,
                  std::int64_t first = 0) const {
    if (p.log_owners && on_owners_) on_owners_(layer, p.name, owners);
    if constexpr (Sink::enabled) {
      if (!tracing()) return;
      Record r = base(layer, p);
      r.row_count = std::int64_t(owners.size());
      r.hidden = int(values.extent(1));
      const std::size_t have = sink_wants_sums(*sink_) ? values.extent(0) : 0;
      decltype(Kokkos::create_mirror_view(Kokkos::HostSpace(), values)) h;
      if (have > 0) {
        h = Kokkos::create_mirror_view(Kokkos::HostSpace(), values);
        Kokkos::deep_copy(h, values);
      }
      for (std::size_t i = 0; i < owners.size(); ++i) {
        if (owners[i] == RowOwner::kPad) {
          ++r.pad_rows;
          continue;
        }
        Row row{RowOwner::request(owners[i]), RowOwner::position(owners[i]), step, false, {}};
        if (have > std::size_t(first) + i) {
          row.has_sum = true;
          row.sum = row_sum(&h(first + std::int64_t(i), 0), r.hidden);
        }
        r.rows.push_back(row);
      }
      sink_->write(r);
    }
  }
  // A boundary whose values this rank cannot see (rows dispatched to its experts).
  void owners_only(int layer, const Point& p, std::span<const std::int64_t> owners) const {
    (*this)(layer, p, owners, Kokkos::View<const float**, Kokkos::HostSpace>());
  }
  // A checked invariant failed at this boundary: the trace shows it before the caller throws.
  void fail(int layer, const Point& p, const std::string& error) const {
    if constexpr (Sink::enabled) {
      if (!tracing()) return;
      Record r = base(layer, p);
      r.error = error;
      sink_->write(r);
    }
  }

  // An engine's own boundaries, with the state and copies trace diff compares them by: the
  // attention output after its attention-TP all-reduce (every rank of the group holds each of its
  // rows), the rows handed to the bridge, and the layer's output. split: the rows are split over
  // attn_tp instead, each member holding its chunk (a residual kept scattered between layers: the
  // attention output is a reduce_scatter's, boundary "attention reduce_scatter" by default).
  template <class V>
  void attention_output(int layer, std::span<const std::int64_t> owners, const V& values,
                        std::string_view name = {}, bool split = false) const {
    if (name.empty()) name = split ? "attention reduce_scatter" : "attention all_reduce";
    (*this)(layer, {name, "attn_out", sharing(split), copies(split), GroupKind::attn_tp}, owners, values);
  }
  template <class V>
  void bridge_input(int layer, std::span<const std::int64_t> owners, const V& values, bool split = false) const {
    (*this)(layer, {"bridge input", "moe_in", sharing(split), copies(split), {}, false}, owners, values);
  }
  template <class V>
  void layer_output(int layer, std::span<const std::int64_t> owners, const V& values, bool split = false) const {
    (*this)(layer, {"layer output", "layer_out", sharing(split), copies(split), {}, false}, owners, values);
  }
  // The bridge refused its own result (row conservation): recorded before the error propagates.
  void bridge_failed(int layer, const std::string& error) const {
    fail(layer, {"row conservation", "moe_out", RowState::replicated, attn_tp(), {}, false}, error);
  }

  // The bridge's observer for `layer` (MoeBridge::run): one record per plan step.
  struct Observer {
    const Recorder& record;
    int layer = 0;
    template <class V>
    void operator()(const BoundaryInfo& b, std::span<const std::int64_t> owners, const V& values,
                    std::int64_t first) const {
      record(layer, {b.name, b.step->state, b.sharing, b.copies, b.step->group}, owners, values, first);
    }
  };
  Observer observer(int layer) const { return Observer{*this, layer}; }

  int step = 0;                             // speculative step of the rows recorded now
  std::vector<std::int64_t> scaled_counts;  // global_num_tokens as scaled by the caller, if any

 private:
  int attn_tp() const { return groups_.layout().widths().attn_tp; }
  // Rows of an attention-TP group: on every member, or (split) each on one.
  static RowState sharing(bool split) { return split ? RowState::row_shard : RowState::replicated; }
  int copies(bool split) const { return split ? 1 : attn_tp(); }
  Record base(int layer, const Point& p) const {
    const RankCoords k = groups_.coords();
    Record r;
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
  Sink* sink_;
  const std::vector<std::int64_t>* counts_;
  OwnersHook on_owners_;
};

}  // namespace relayout::trace
