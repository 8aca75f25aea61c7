// One MoeBridge run: the plan's steps in order, each checked as it is taken, with the engine's
// router and experts. The steps of each path live beside it (run_steps.hpp: entry, counts and
// conservation; dp_gather.hpp; tp_moe.hpp; a2a.hpp; two_batch.hpp). Internal to MoeBridge.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <Kokkos_Core.hpp>

#include "relayout/bridge/impl/fault.hpp"
#include "relayout/bridge/impl/model_ref.hpp"
#include "relayout/bridge/options.hpp"
#include "relayout/bridge/plan.hpp"
#include "relayout/placement/ep.hpp"
#include "relayout/placement/transitions.hpp"

namespace relayout {
template <class C, class T, class Space>
class MoeBridge;
}  // namespace relayout

namespace relayout::impl {

template <class C, class T, class Space>
class BridgeRun {
 public:
  using Bridge = MoeBridge<C, T, Space>;
  using In = Rows<T, Replicated<AttnTp>, DpLocal, Space>;
  using Out = In;
  using ScatteredIn = Rows<T, RowShard<AttnTp>, DpLocal, Space>;
  using view_type = RowsView<T, Space>;
  using RunOptions = BridgeRunOptions<T, Space>;
  using OwnerSpace = Kokkos::DefaultHostExecutionSpace;
  template <class St, class Sc>
  using OwnerRows = Rows<std::int64_t, St, Sc, OwnerSpace>;
  using OwnerView = RowsView<std::int64_t, OwnerSpace>;

  BridgeRun(Bridge& bridge, const Space& e, RouterRef<T, Space> r, ExpertsRef<T, Space> x, const RunOptions& o,
            std::source_location s)
      : b(bridge), exec(e), router(r), experts(x), run_opts(o), site(s) {}
  Bridge& b;
  const Space& exec;
  RouterRef<T, Space> router;
  ExpertsRef<T, Space> experts;
  const RunOptions& run_opts;
  std::source_location site;
  const typename RunOptions::observer_type& obs = run_opts.observer;
  TrafficLog* traffic = run_opts.traffic;
  std::vector<std::int64_t>* owners = run_opts.owners;
  std::span<const PlanStep> plan{};
  std::size_t at = 0;
  std::vector<std::int64_t> gathered;  // the step's counts, when the engine gave none
  std::string refusal;                 // this rank's reason to refuse the run (agreed in the dispatch)
  bool refusal_counts = false;         // the refusal is of rows that disagree with global_num_tokens
  EpMode mode = EpMode::normal;

  const ProcessGroupsOf<C>& pg() const { return b.pg_; }
  const ProcessGroupsOf<C>& dpg() const { return b.dp_groups(); }
  const Widths& widths() const { return pg().layout().widths(); }
  BridgeFault fault() const { return b.fault_; }

  const PlanStep& step(BridgeStep s) {
    if (at >= plan.size() || plan[at].step != s)
      throw LayoutError("bridge", "MoeBridge: the executor left its plan at step " + std::to_string(at));
    return plan[at++];
  }
  template <class V>
  void see(const PlanStep& s, RowState sharing, int copies, std::span<const std::int64_t> own, const V& values,
           std::int64_t first = 0, std::string_view name = {}) {
    if (obs) obs(BoundaryInfo{&s, sharing, copies, name.empty() ? s.name : name}, own, values, first);
  }
  int group_ranks() const { return widths().attn_tp; }  // holders of a row outside the MoE
  int moe_holders() const { return widths().tp / widths().moe_dp; }

  static OwnerView owner_view(const std::vector<std::int64_t>& v) {
    OwnerView o(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("relayout::owners")), v.size(), 1);
    for (std::size_t i = 0; i < v.size(); ++i) o(i, 0) = v[i];
    return o;
  }
  static std::vector<std::int64_t> to_vector(const OwnerView& o) {
    std::vector<std::int64_t> v(o.extent(0));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = o(i, 0);
    return v;
  }
  static std::span<const std::int64_t> span_of(const std::vector<std::int64_t>& v, std::int64_t b0 = 0,
                                               std::int64_t n = -1) {
    if (v.empty()) return {};
    return std::span<const std::int64_t>(v).subspan(static_cast<std::size_t>(b0),
                                                     n < 0 ? std::dynamic_extent : static_cast<std::size_t>(n));
  }

  TopK<T, Space> route(const view_type& x) {
    step(BridgeStep::route);
    return route_rows(x);
  }
  TopK<T, Space> route_rows(const view_type& x) {
    TopK<T, Space> r(static_cast<std::int64_t>(x.extent(0)), router.top_k());
    router(exec, x, r);
    return r;
  }

  // One run around `body` (which sets the plan and takes its steps): the owner column checked
  // against the n rows that enter, the plan checked as finished, the rows' conservation.
  template <class F>
  auto checked(std::int64_t n, F&& body) {
    if (owners && static_cast<std::int64_t>(owners->size()) != n)
      throw LayoutError("owners", "MoeBridge::run: " + std::to_string(owners->size()) + " owners for " +
                                      std::to_string(n) + " rows; the owner column must stay aligned with the rows");
    const std::vector<std::int64_t> in_owners = owners ? *owners : std::vector<std::int64_t>{};
    auto out = body(in_owners);
    if (at != plan.size()) throw LayoutError("bridge", "MoeBridge: the executor stopped before the end of its plan");
    if (owners || fault() != BridgeFault::none) conserve(n, in_owners, out.rows());
    return out;
  }

  // The step's token counts: the engine's, or gathered here (one all_gather over tp).
  std::span<const std::int64_t> counts(std::int64_t group_rows);
  // Paths that dispatch: this run's EP mode and this rank's refusal of the counts it was given
  // (agreed in the dispatch, with the counts' digest, so no rank waits on another's mistake).
  void prepare_dispatch(std::int64_t group_rows);

  Out go(const In& x);

  // Path dp_gather: the engine's counts checked against every rank's rows and against each
  // other in one all_gather over tp (or gathered there when it gave none): every rank throws
  // the same error before the gather of rows.
  std::vector<std::int64_t> agreed_counts(std::int64_t rows);

  // Path A: gather every DP group's rows, this rank's experts on its moe_dp slice, restore.
  Out dp_gather(const In& x, const DpSlotsPtr& slots);
  Out dp_restore(Rows<T, Partial<group::Tp>, DpGlobal, Space> p, const DpSlots& s,
                 const std::vector<std::int64_t>& g_owners, const std::vector<std::int64_t>& out_owners);

  // No DP attention, no all-to-all backend: every rank holds every row; partials summed over tp.
  Out tp_moe(const In& x);

  // tp_moe on this member's chunk: the chunks gathered, the experts on every row, the partials
  // summed over attn_tp (== tp) into the chunks.
  ScatteredIn tp_moe_scattered(const ScatteredIn& x);

  // Rows [mine) of x through route + this rank's experts (+ its shared share): Partial<tp> rows.
  view_type moe_partial(const view_type& x, Range mine);

  // Rows already split over attn_tp, on a path that dispatches rows: the chunk's hand-over.
  ScatteredIn go_scattered(const ScatteredIn& x);

  // Path B and direct: split over attn_tp, dispatch this chunk, experts, combine, all-gather.
  Out a2a(const In& x);

  // This member's chunk (c_owners: its rows' owners, when carried; group_rows: its DP group's
  // rows) through route, dispatch, experts, combine and the shared expert: the chunk's MoE rows.
  ScatteredIn a2a_chunk(const ScatteredIn& chunk, const std::vector<std::int64_t>& c_owners, std::int64_t group_rows);

  // One micro-batch of this rank's chunk (the whole chunk without two-batch overlap) on its way
  // through route, dispatch, experts, combine and the shared expert. Not moved once started: a
  // combine in flight points at its handle.
  struct Micro {
    Range range{};
    view_type x;
    std::vector<std::int64_t> owners;  // of its rows, when carried
    std::optional<EpDispatchInFlight<T, Space>> pd;
    EpHandle<T, Space> h;
    view_type y;
    std::optional<EpCombineInFlight<T, Space>> pc;
    view_type combined;
  };
  void see_experts(const PlanStep& s, const Micro* mb, int count);


  // Route, then start the dispatch (the rows' exchange left in flight).
  // group_rows: the DP group's rows, whose index numbers each token for the replica choice.
  void begin_dispatch(Micro& u, std::int64_t group_rows, std::int64_t full_rows);
  // Wait for the rows, run the experts on them; `other`: the micro-batch whose exchange is in
  // flight meanwhile (polled between expert chunks).
  void finish_dispatch(Micro& u, Micro* other = nullptr);
  void begin_combine(Micro& u) { u.pc.emplace(b.ep_->combine_start(exec, u.h, u.y, site)); }
  // Wait for the outputs, sum them, add the shared expert's (in row chunks, polling `other`'s
  // combine between them, when it is in flight).
  void finish_combine(Micro& u, Micro* other = nullptr);
  // One poll of the exchange `u` has in flight (it lets MPI progress it); the experts' work so
  // far is fenced first, so a host backend has finished it.
  void poll(Micro& u);

  // Row conservation: every row that entered leaves exactly once, in order. A broken invariant
  // can be local, so the ranks agree before anyone throws: every rank throws together.
  void conserve(std::int64_t n_in, const std::vector<std::int64_t>& in_owners, std::int64_t n_out);
};

}  // namespace relayout::impl
