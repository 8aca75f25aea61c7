// The Attention -> MoE hand-over of one decoder layer (SPEC §5, §6), written once: the path comes
// from the layout engine, and who sums the expert/TP partials is decided once per layer
// (SumDecision) and read by both the MoE and the restore step. Rows enter Replicated over attn_tp
// (DP-local) and leave the same way; with owners tracked, every row that enters leaves exactly
// once, or the bridge throws (row conservation). Every boundary is recorded once, through
// BoundaryRecorder: the owners list (BridgeOptions::record_boundaries) and, for a trace sink, the
// full trace record with value checksums (relayout/trace).
#pragma once

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "relayout/mesh/layout.hpp"
#include "relayout/model/rows.hpp"
#include "relayout/model/traffic.hpp"
#include "relayout/model/workload.hpp"
#include "relayout/moe/moe_block.hpp"
#include "relayout/trace/record.hpp"

namespace relayout::model {

// Known bugs, wired on purpose so that verification can be shown to catch them (SPEC "Known failure
// modes"): never use outside tests and demonstrations.
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
  std::optional<PaddingMode> padding;  // forced; otherwise the SPEC §6 rule
  Restore restore = Restore::reduce;
  Inject inject = Inject::none;
  bool track_owners = true;        // move row owners with the rows and check conservation
  bool record_boundaries = false;  // keep the owners this rank holds after every boundary
};

// Who sums the partial MoE outputs, decided once per layer. Correct layouts sum exactly once.
struct SumDecision {
  int moe_all_reduces = 0;    // all-reduces over tp the MoE issues itself
  bool restore_sums = false;  // the restore collective sums (reduce_scatterv / reduce_scatter)
  int sums() const { return moe_all_reduces + (restore_sums ? 1 : 0); }
};

inline SumDecision decide_sum(BridgePath path, const BridgeOptions& o) {
  SumDecision s;
  if (path == BridgePath::dp_gather) {
    s.restore_sums = o.restore == Restore::reduce;
    s.moe_all_reduces = s.restore_sums ? 0 : 1;
  } else if (path == BridgePath::tp_moe) {
    s.moe_all_reduces = 1;
  }
  if (o.inject == Inject::double_reduce) s.moe_all_reduces += 1;                  // failure mode 1
  if (o.inject == Inject::skip_reduce) s = {0, false};                             // failure mode 2
  return s;
}

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
  const char* name = "";
  const char* state = "";
  trace::Sharing sharing = trace::Sharing::replicated;
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
    if (p.owners_list && boundaries_ && opts_.record_boundaries) boundaries_->push_back({layer, p.name, owners});
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
    (*this)(layer, p, owners, typename Rows<ExecSpace>::View());
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
    r.boundary = p.name;
    r.state = p.state;
    r.sharing = p.sharing;
    r.copies = p.copies;
    r.global_rank = groups_.rank();
    r.attn_dp_rank = k.attn_dp_rank;
    r.attn_tp_rank = k.attn_tp_rank;
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

// tensor_split semantics: n rows over k parts, earlier parts one row larger.
inline std::pair<std::int64_t, std::int64_t> split_range(std::int64_t n, int k, int i) {
  const std::int64_t q = n / k, r = n % k;
  const std::int64_t begin = i * q + std::min<std::int64_t>(i, r);
  return {begin, begin + q + (i < r ? 1 : 0)};
}

template <class C, class ExecSpace, class Sink = trace::NullSink>
class Bridge {
 public:
  using View = typename Rows<ExecSpace>::View;
  using Recorder = BoundaryRecorder<C, ExecSpace, Sink>;

  Bridge(const ProcessGroupsOf<C>& groups, moe::Wire<C>& wire, const ModelDims& dims,
         const BridgeOptions& opts, ExecSpace exec, const Recorder& record)
      : groups_(groups), wire_(wire), dims_(dims), opts_(opts), exec_(exec), record_(record) {}

  // counts: raw token rows of every attention-DP group this step; mode: the padding mode all ranks picked.
  Rows<ExecSpace> run(int layer, const LayerShard<ExecSpace>& w, const Rows<ExecSpace>& in,
                      const std::vector<std::int64_t>& counts, PaddingMode mode) {
    layer_ = layer;
    record({"bridge input", "moe_in", trace::Sharing::replicated, attn_group(), {}, false}, in.owners, in.values);
    Rows<ExecSpace> out;
    switch (groups_.layout().bridge_path()) {
      case BridgePath::dp_gather: out = dp_gather(w, in, counts, mode); break;
      case BridgePath::tp_moe: out = tp_moe(w, in); break;
      case BridgePath::a2a_split:
      case BridgePath::direct: out = a2a(w, in); break;
    }
    // Row conservation. A broken invariant can be local (an idle rank sees nothing wrong), so the
    // ranks agree before anyone throws: every rank throws together, none waits in a collective.
    if (opts_.track_owners || opts_.inject != Inject::none) {
      const bool ok = out.count() == in.count() && (!opts_.track_owners || in.owners == out.owners);
      int first_bad = ok ? groups_.layout().size() : groups_.rank();
      wire_.bookkeeping().all_reduce(GroupKind::tp, std::span<int>(&first_bad, 1), ReduceOp::min);
      if (first_bad < groups_.layout().size()) fail_conservation(in, out, first_bad);
    }
    return out;
  }

 private:
  template <class T>
  static std::span<T> span(const Kokkos::View<T**, Kokkos::LayoutRight, typename ExecSpace::memory_space>& v) {
    return {v.data(), v.size()};
  }
  template <class V>
  void record(const BoundaryPoint& p, const std::vector<std::int64_t>& owners, const V& values, std::int64_t first = 0) {
    record_(layer_, p, owners, values, first);
  }
  // Ranks of one attention-DP group: each holds every row of its group (attn_cp = 1).
  int attn_group() const { return groups_.layout().widths().tp / groups_.layout().widths().attn_dp; }
  int moe_holders() const { return groups_.layout().widths().tp / groups_.layout().widths().moe_dp; }
  static std::vector<std::int64_t> slice(const std::vector<std::int64_t>& v, std::int64_t b, std::int64_t e) {
    if (v.empty()) return {};
    return {v.begin() + b, v.begin() + e};
  }
  View copy_rows(const View& from, std::int64_t begin, std::int64_t end, std::int64_t rows_out) {
    View to("relayout::rows", std::size_t(rows_out), from.extent(1));
    Kokkos::deep_copy(exec_, Kokkos::subview(to, Kokkos::make_pair(std::int64_t(0), end - begin), Kokkos::ALL()),
                      Kokkos::subview(from, Kokkos::make_pair(begin, end), Kokkos::ALL()));
    exec_.fence();
    return to;
  }

  // Path A: gather every DP group's rows (one contributor per row), MoE on all of them, restore.
  Rows<ExecSpace> dp_gather(const LayerShard<ExecSpace>& w, const Rows<ExecSpace>& in,
                            const std::vector<std::int64_t>& counts, PaddingMode mode) {
    const Widths& wd = groups_.layout().widths();
    const RankCoords k = groups_.coords();
    const int T = wd.attn_tp, H = dims_.hidden, dp = wd.attn_dp, g = k.attn_dp_rank, t = k.attn_tp_rank;
    const bool track = opts_.track_owners;
    // Geometry of the global buffer: each group's segment (its rows rounded up to attn_tp), packed
    // (sum_len) or padded to the longest (max_len).
    std::vector<std::int64_t> seg(static_cast<std::size_t>(dp)), offset(static_cast<std::size_t>(dp) + 1, 0);
    std::int64_t longest = 0;
    for (int i = 0; i < dp; ++i) longest = std::max(longest, round_up_tokens(counts[std::size_t(i)], T));
    for (int i = 0; i < dp; ++i) {
      seg[std::size_t(i)] = mode == PaddingMode::sum_len ? round_up_tokens(counts[std::size_t(i)], T) : longest;
      offset[std::size_t(i) + 1] = offset[std::size_t(i)] + seg[std::size_t(i)];
    }
    const std::int64_t G = offset[std::size_t(dp)], mine = seg[std::size_t(g)], share = mine / T,
                       n = in.count();
    // Elements each tp rank contributes: its share of its group's segment.
    std::vector<int> counts_h(static_cast<std::size_t>(wd.tp)), counts_1(static_cast<std::size_t>(wd.tp));
    for (int r = 0; r < wd.tp; ++r) {
      const std::int64_t s = seg[std::size_t(groups_.layout().coords(r).attn_dp_rank)] / T;
      counts_1[std::size_t(r)] = int(s);
      counts_h[std::size_t(r)] = int(s * H);
    }

    const View local = copy_rows(in.values, 0, n, mine);  // zero rows pad the segment
    std::vector<std::int64_t> local_owners;
    if (track) {
      local_owners = in.owners;
      local_owners.resize(std::size_t(mine), RowOwner::kPad);
    }
    View global("relayout::dp_global", std::size_t(G), std::size_t(H));
    std::vector<std::int64_t> global_owners(track ? std::size_t(G) : 0);
    if (opts_.inject == Inject::gather_partial) {
      // Failure mode 3: every attention-TP member adds its (already complete) rows: x attn_tp.
      Kokkos::deep_copy(exec_, Kokkos::subview(global, Kokkos::make_pair(offset[std::size_t(g)], offset[std::size_t(g)] + mine), Kokkos::ALL()), local);
      exec_.fence();
      wire_.all_reduce(GroupKind::tp, span(global));
    } else {
      const auto my_share = Kokkos::subview(local, Kokkos::make_pair(t * share, (t + 1) * share), Kokkos::ALL());
      const std::span<const float> send(my_share.data(), std::size_t(share * H));
      if (mode == PaddingMode::sum_len)
        wire_.all_gatherv(GroupKind::tp, send, span(global), counts_h);
      else
        wire_.all_gather(GroupKind::tp, send, span(global));
    }
    if (track) {
      const std::span<const std::int64_t> send(local_owners.data() + t * share, std::size_t(share));
      auto books = wire_.bookkeeping();
      if (mode == PaddingMode::sum_len)
        books.all_gatherv(GroupKind::tp, send, std::span<std::int64_t>(global_owners), counts_1);
      else
        books.all_gather(GroupKind::tp, send, std::span<std::int64_t>(global_owners));
    }
    record({"dp_gather", "moe_in", trace::Sharing::replicated, wd.tp, GroupKind::tp}, global_owners, global);

    // MoE on the global rows: this rank's moe_dp slice, its experts and intermediate shard.
    const auto [b, e] = split_range(G, wd.moe_dp, k.moe_dp_rank);
    View partial("relayout::moe_partial", std::size_t(G), std::size_t(H));
    moe::moe_partial(exec_, dims_, w, global, b, e, partial);
    exec_.fence();
    record({"experts", "moe_partial", trace::Sharing::partial, moe_holders(), {}}, slice(global_owners, b, e), partial, b);
    const SumDecision sum = decide_sum(BridgePath::dp_gather, opts_);
    for (int i = 0; i < sum.moe_all_reduces; ++i) wire_.all_reduce(GroupKind::tp, span(partial));

    Rows<ExecSpace> out;
    const std::int64_t at = offset[std::size_t(g)];
    if (sum.restore_sums) {
      View part("relayout::restore_share", std::size_t(share), std::size_t(H));
      if (mode == PaddingMode::sum_len)
        wire_.reduce_scatterv(GroupKind::tp, std::span<const float>(span(partial)), span(part), counts_h);
      else
        wire_.reduce_scatter(GroupKind::tp, std::span<const float>(span(partial)), span(part));
      record({mode == PaddingMode::sum_len ? "reduce_scatterv" : "dp_reduce_scatter", "moe_out",
              trace::Sharing::replicated, 1, GroupKind::tp},
             slice(global_owners, at + t * share, at + (t + 1) * share), part);
      View full("relayout::restored", std::size_t(mine), std::size_t(H));
      wire_.all_gather(GroupKind::attn_tp, std::span<const float>(span(part)), span(full));
      out.values = copy_rows(full, 0, n, n);
      record({"all_gather", "moe_out", trace::Sharing::replicated, attn_group(), GroupKind::attn_tp},
             slice(global_owners, at, at + n), out.values);
    } else {
      out.values = copy_rows(partial, at, at + n, n);
      record({"dp_scatter", "moe_out", trace::Sharing::replicated, attn_group(), {}}, slice(global_owners, at, at + n),
             out.values);
    }
    out.owners = slice(global_owners, at, at + n);
    return out;
  }

  // No DP attention, no backend: every rank holds every row; MoE partials summed once over tp.
  Rows<ExecSpace> tp_moe(const LayerShard<ExecSpace>& w, const Rows<ExecSpace>& in) {
    const Widths& wd = groups_.layout().widths();
    const std::int64_t n = in.count();
    const auto [b, e] = split_range(n, wd.moe_dp, groups_.coords().moe_dp_rank);
    View partial("relayout::moe_partial", std::size_t(n), std::size_t(dims_.hidden));
    moe::moe_partial(exec_, dims_, w, in.values, b, e, partial);
    exec_.fence();
    record({"experts", "moe_partial", trace::Sharing::partial, moe_holders(), {}}, slice(in.owners, b, e), partial, b);
    const SumDecision sum = decide_sum(BridgePath::tp_moe, opts_);
    for (int i = 0; i < sum.moe_all_reduces; ++i) wire_.all_reduce(GroupKind::tp, span(partial));
    record({"all_reduce", "moe_out", trace::Sharing::replicated, wd.tp, GroupKind::tp}, in.owners, partial);
    return {partial, in.owners};
  }

  // Path B (and direct): split the replicated rows over attn_tp, dispatch only the local chunk over
  // moe_ep, combine, and all-gather the chunks back over attn_tp (a concatenation, not a sum).
  Rows<ExecSpace> a2a(const LayerShard<ExecSpace>& w, const Rows<ExecSpace>& in) {
    const int T = groups_.layout().widths().attn_tp, t = groups_.coords().attn_tp_rank, H = dims_.hidden;
    const std::int64_t n = in.count();
    const bool no_split = opts_.inject == Inject::no_split;  // dispatches every row attn_tp times
    std::vector<int> chunk(static_cast<std::size_t>(T));
    for (int i = 0; i < T; ++i) {
      const auto [b, e] = split_range(n, T, i);
      chunk[std::size_t(i)] = int(no_split ? n : e - b);
    }
    const auto [b, e] = no_split ? std::pair<std::int64_t, std::int64_t>{0, n} : split_range(n, T, t);
    const View x = copy_rows(in.values, b, e, e - b);
    const std::vector<std::int64_t> x_owners = slice(in.owners, b, e);
    record({"split_rows", "moe_in", trace::Sharing::replicated, 1, {}}, x_owners, x);

    std::vector<std::int64_t> dispatched;
    const View y = moe::ep_moe(wire_, exec_, dims_, w, x, x_owners, opts_.track_owners ? &dispatched : nullptr);
    exec_.fence();
    record_.owners_only(layer_, {"dispatch+experts", "dispatched", trace::Sharing::replicated, dims_.topk, GroupKind::moe_ep},
                        dispatched);
    record({"combine", "moe_out", trace::Sharing::replicated, 1, GroupKind::moe_ep}, x_owners, y);

    std::int64_t total = 0;
    std::vector<int> counts_h(chunk);
    for (int& c : counts_h) {
      total += c;
      c *= H;
    }
    Rows<ExecSpace> out;
    out.values = View("relayout::gathered", std::size_t(total), std::size_t(H));
    wire_.all_gatherv(GroupKind::attn_tp, std::span<const float>(span(y)), span(out.values), counts_h);
    if (opts_.track_owners) {
      out.owners.resize(std::size_t(total));
      wire_.bookkeeping().all_gatherv(GroupKind::attn_tp, std::span<const std::int64_t>(x_owners),
                        std::span<std::int64_t>(out.owners), chunk);
    }
    record({"all_gather", "moe_out", trace::Sharing::replicated, attn_group(), GroupKind::attn_tp}, out.owners, out.values);
    return out;
  }

  // Throws on every rank once the ranks agreed that `first_bad` is the first rank that lost rows.
  [[noreturn]] void fail_conservation(const Rows<ExecSpace>& in, const Rows<ExecSpace>& out, int first_bad) const {
    std::string what = "row conservation broken in layer " + std::to_string(layer_) + " on rank " +
                       std::to_string(first_bad);
    if (first_bad != groups_.rank()) {
      what += " of the domain (this rank's rows are intact)";
    } else {
      const auto& a = in.owners;
      const auto& b = out.owners;
      std::size_t i = 0;
      while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
      what += ": " + std::to_string(in.count()) + " rows entered the bridge and " + std::to_string(out.count()) + " left";
      if (opts_.track_owners)
        what += "; first difference at row " + std::to_string(i) + ": expected " +
                (i < a.size() ? RowOwner::label(a[i]) : "none") + ", found " + (i < b.size() ? RowOwner::label(b[i]) : "none");
    }
    record_.fail(layer_, {"row conservation", "moe_out", trace::Sharing::replicated, attn_group(), {}, false}, what);
    throw LayoutError("bridge", what);
  }

  const ProcessGroupsOf<C>& groups_;
  moe::Wire<C>& wire_;
  ModelDims dims_;
  BridgeOptions opts_;
  ExecSpace exec_;
  const Recorder& record_;
  int layer_ = 0;
};

}  // namespace relayout::model
