// MoeBridge: runs one layer's Attention -> MoE hand-over (bridge_plan) with the engine's own router
// and experts, on typed rows, on the engine's execution-space instance. Rows enter Replicated over
// attn_tp (the attention all-reduce's output, this DP group's rows) and leave the same way, every
// row's MoE output summed exactly once. Optional, off the hot path: a row-owner column moved with
// the rows (row conservation is checked), an observer called at every boundary (tracing), and
// deliberate faults that show a verification catches them. See docs/bridge.md.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <source_location>
#include <span>
#include <string>
#include <vector>

#include <Kokkos_Core.hpp>

#include "relayout/bridge/plan.hpp"
#include "relayout/comm.hpp"
#include "relayout/placement/ep.hpp"
#include "relayout/placement/expert_location.hpp"
#include "relayout/placement/expert_location_sync.hpp"
#include "relayout/placement/transitions.hpp"

namespace relayout {

// Known bugs, wired on purpose so a verification can be shown to catch them. Never in production.
enum class BridgeFault : std::uint8_t {
  none,
  double_reduce,   // the MoE all-reduces and the restore sums again (output x tp)
  skip_reduce,     // nobody sums the partials (each row sees only some of its experts)
  gather_partial,  // complete rows gathered as if they were partial sums (x attn_tp)
  no_split,        // every attn_tp member dispatches every row (rows processed attn_tp times)
};
inline constexpr impl::NameTable<BridgeFault, 5> kBridgeFaultNames{{{{BridgeFault::none, "none"},
                                                                   {BridgeFault::double_reduce, "double_reduce"},
                                                                   {BridgeFault::skip_reduce, "skip_reduce"},
                                                                   {BridgeFault::gather_partial, "gather_partial"},
                                                                   {BridgeFault::no_split, "no_split"}}}};
constexpr std::string_view to_string(BridgeFault f) { return kBridgeFaultNames.name(f); }
// A fault by name; `input` names the flag or field in the error.
inline BridgeFault parse_fault(std::string_view text, const char* input = "fault") {
  return impl::parse_name(kBridgeFaultNames, text, input, "injected bug");
}

// A wired fault must be able to show itself on the layout it is wired into: one that the path
// never reaches would make a verification "pass" without having been tested. MoeBridge checks it.
inline void check_fault(BridgeFault fault, const RuntimeLayout& layout, const char* input = "fault") {
  const Widths& w = layout.widths();
  const BridgePath path = layout.bridge_path();
  const auto refuse = [&](const std::string& rule) {
    throw LayoutError(input, std::string(input) + " " + std::string(to_string(fault)) + " " + rule +
                                 "; this layout takes path " + std::string(to_string(path)) + " with tp = " +
                                 std::to_string(w.tp) + ", attn_tp = " + std::to_string(w.attn_tp));
  };
  switch (fault) {
    case BridgeFault::none: return;
    case BridgeFault::double_reduce:
    case BridgeFault::skip_reduce:
      if ((path != BridgePath::dp_gather && path != BridgePath::tp_moe) || w.tp < 2)
        refuse("needs a layout whose MoE partials are summed over tp > 1 (path dp_gather or tp_moe)");
      return;
    case BridgeFault::gather_partial:
      if (path != BridgePath::dp_gather || w.attn_tp < 2) refuse("needs path dp_gather with attn_tp > 1");
      return;
    case BridgeFault::no_split:
      if (path != BridgePath::a2a_split) refuse("needs path a2a_split (attn_tp > 1 with an all-to-all backend)");
      return;
  }
}

// The rule for an EP mode: low_latency shapes the dispatch, so it needs a path that dispatches rows
// (elsewhere it would silently do nothing). MoeBridge and the programs' flag both check with it.
inline void check_ep_mode(EpMode mode, BridgePath path, const char* input = "ep_mode") {
  if (mode == EpMode::normal || dispatches_rows(path)) return;
  throw LayoutError(input, std::string(input) + " " + std::string(to_string(mode)) +
                               " needs a path that dispatches rows (a2a_split or direct: --moe-a2a-backend deepep); "
                               "this layout takes path " + std::string(to_string(path)));
}

// The rule for two-batch overlap: it overlaps one micro-batch's dispatch or combine with the other's
// compute, so it needs a path that dispatches rows. SGLang refuses --enable-two-batch-overlap with
// --moe-a2a-backend none (its paths dp_gather and tp_moe) the same way. MoeBridge and the programs'
// flag both check with it.
inline void check_two_batch_overlap(bool on, BridgePath path, const char* input = "two_batch_overlap") {
  if (!on || dispatches_rows(path)) return;
  throw LayoutError(input, std::string(input) +
                               " needs a path that dispatches rows (a2a_split or direct: --moe-a2a-backend deepep; "
                               "SGLang refuses it with moe_a2a_backend none); this layout takes path " +
                               std::string(to_string(path)));
}

// How two-batch overlap splits this rank's n rows (its attn_tp chunk): as SGLang splits a decode
// batch, the first micro-batch takes n / 2 rows and the second the rest. A rank with fewer than 2
// rows runs an empty first micro-batch (and with none, two empty ones): it still joins every
// exchange, and its rows are the one-batch run's.
inline Range two_batch_range(std::int64_t n, int micro_batch) {
  const std::int64_t first = n / 2;
  return micro_batch == 0 ? Range{0, first} : Range{first, n - first};
}

struct BridgeOptions {
  std::optional<PaddingMode> padding{};  // forced; otherwise the layout's rule on global_num_tokens
  BridgeRestore restore = BridgeRestore::reduce;
  BridgeFault fault = BridgeFault::none;
  // Validate the router's output every layer (ids in range, weights finite: EpOptions::check_route).
  bool check_route = true;
  DispatchDtype dispatch_dtype = DispatchDtype::compute;
  // Paths a2a_split and direct: the dispatch's EP mode and, for low_latency, the most rows one rank
  // dispatches per run (its attn_tp chunk), fixed for the bridge's life (its own workspace's).
  EpMode ep_mode = EpMode::normal;
  std::int64_t ep_capacity = 0;
  // Redundant experts (paths a2a_split and direct): the engine's logical -> physical map, the same
  // on every rank (checked over the TP domain at the first run, on its instance; the constructor
  // has none and is not collective). It stays the engine's; to rebalance, replace it between runs
  // with MoeBridge::set_expert_location (options() keeps the current one). The router's
  // logical ids become physical ones (to_physical, with replica_choice) before the dispatch, so
  // the experts' batch is grouped by physical expert: first_expert + e is a physical id, whose
  // weights are those of expert_location->logical_of(first_expert + e). Null: physical = logical.
  std::shared_ptr<const ExpertLocation> expert_location{};
  ReplicaChoice replica_choice = ReplicaChoice::by_token;
  // Two-batch overlap (SGLang's --enable-two-batch-overlap; paths a2a_split and direct): this
  // rank's rows run as two micro-batches (two_batch_range), the second's routing and dispatch
  // issued while the first's dispatch is in flight, the first's combine while the second's experts
  // run, the second's combine while the first's shared expert runs (nonblocking exchanges, tested
  // on the caller's instance between the steps). Same rows out as one batch; the router and the
  // experts are called once per micro-batch (see two_batch_expert_chunks), the second on a
  // workspace of the bridge's own. A rank with fewer than 2 rows runs an empty first micro-batch
  // (two_batch_range).
  bool two_batch_overlap = false;
  // Two-batch overlap: MPI progresses a nonblocking exchange only inside MPI calls (no progress
  // thread), so while one micro-batch's experts run the other's exchange moves only if it is
  // polled. 1: the experts (and the shared expert) are called once per micro-batch and nothing
  // polls while they run. N > 1: the experts run while an exchange is in flight are called N times
  // (contiguous groups of the local experts, at most one call per expert; an ExpertBatch with its
  // own first_expert each), and the first micro-batch's shared expert N times (row chunks), the
  // other exchange tested between calls, after a fence of the caller's instance (so the chunk
  // has run, on a device too). Every rank makes the same number of calls.
  int two_batch_expert_chunks = 1;
};

// What an observer sees at each boundary: the plan step, this rank's rows' owners (when an owner
// column is carried; pads are kPadRow) and values. `values` rows [first, first + owners.size())
// belong to `owners`; values may be empty when this rank cannot see them (dispatched rows).
inline constexpr std::int64_t kPadRow = -1;
struct BoundaryInfo {
  const PlanStep* step = nullptr;
  // partial: the values are summands (their sum over `copies` holders is the row); otherwise
  // replicated (every holder has the whole row).
  RowState sharing = RowState::replicated;
  int copies = 1;        // how many ranks hold each row (replicated) or a summand of it (partial)
  std::string_view name;
};

// An observer of a run's boundaries: called with the step, the owners of this rank's rows there
// (when an owner column is carried) and its values; rows [first, first + owners.size()) of
// `values` are the rows of `owners`.
template <class O, class T, class Space>
concept BridgeObserverFor = requires(O& o, const BoundaryInfo& b, std::span<const std::int64_t> owners,
                                     const RowsView<T, Space>& values, std::int64_t first) {
  o(b, owners, values, first);
};

// What a run takes beside the rows, router and experts; all of it optional.
template <class T, class Space = Kokkos::DefaultExecutionSpace>
struct BridgeRunOptions {
  using observer_type =
      std::function<void(const BoundaryInfo&, std::span<const std::int64_t>, const RowsView<T, Space>&, std::int64_t)>;
  // This step's token counts (gather_num_tokens; the same on every rank), used by path dp_gather
  // to lay out its gathered buffer. Empty: the bridge gathers them itself there (one all_gather
  // over tp). Layers of one step share the counts, so an engine gathers them once per step.
  std::span<const std::int64_t> global_num_tokens = {};
  // The owner column of the rows: moved with them, checked for conservation and replaced by the
  // owners of the output rows (which must equal them).
  std::vector<std::int64_t>* owners = nullptr;
  // Called at every boundary (tracing); empty: nothing is computed for it.
  observer_type observer = {};
  TrafficLog* traffic = nullptr;  // counts the bytes this rank sends
};

template <class C, class T, class Space = Kokkos::DefaultExecutionSpace>
class MoeBridge {
 public:
  using In = Rows<T, Replicated<AttnTp>, DpLocal, Space>;
  using Out = In;
  // Rows already split over attn_tp: this member's tensor_split chunk of its DP group's rows (what
  // reduce_scatter over attn_tp makes of the attention's wo_b partials). Paths a2a_split, direct and tp_moe.
  using ScatteredIn = Rows<T, RowShard<AttnTp>, DpLocal, Space>;
  using view_type = RowsView<T, Space>;

  // experts: the model's routed experts (global ids [0, experts)), split evenly over moe_ep.
  // Under attention context parallelism (attn_cp > 1) the constructor is collective over the
  // domain: it makes the groups of the CP shares (cp_share_layout).
  MoeBridge(const ProcessGroupsOf<C>& pg, int experts, BridgeOptions opts = {})
      : pg_(pg), experts_(experts), opts_(opts), own_ws_(opts.ep_mode, opts.ep_capacity),
        second_ws_(opts.two_batch_overlap ? opts.ep_mode : EpMode::normal, opts.two_batch_overlap ? opts.ep_capacity : 0) {
    const Widths& w = pg.layout().widths();
    if (w.attn_cp > 1)
      shares_ = std::make_shared<const ProcessGroupsOf<C>>(relayout::cp_share_layout(pg.layout()), pg.tp());
    if (experts < 1 || experts % w.moe_ep != 0)
      throw LayoutError("experts", "MoeBridge: " + std::to_string(experts) + " experts cannot be split evenly over moe_ep = " +
                                       std::to_string(w.moe_ep));
    check_fault(opts_.fault, pg.layout());
    check_dispatch_dtype(opts_.dispatch_dtype, path());
    if (opts_.expert_location) {
      const std::string problem = location_problem(*opts_.expert_location);
      if (!problem.empty()) throw LayoutError("expert_location", "MoeBridge: " + problem);
    }
    check_ep_mode(opts_.ep_mode, path());
    check_two_batch_overlap(opts_.two_batch_overlap, path());
    if (opts_.two_batch_expert_chunks < 1)
      throw LayoutError("two_batch_expert_chunks", "MoeBridge: two_batch_expert_chunks = " +
                                                       std::to_string(opts_.two_batch_expert_chunks) +
                                                       "; the experts are called in at least 1 chunk");
  }

  BridgePath path() const { return pg_.layout().bridge_path(); }
  // The engine's own workspace for the EP buffers (it must outlive the bridge's runs); by default
  // the bridge keeps one. Either way, runs after the first allocate no EP buffer that fits.
  void use_workspace(EpWorkspace<T, Space>& ws) { external_ws_ = &ws; }
  EpWorkspace<T, Space>& workspace() { return external_ws_ ? *external_ws_ : own_ws_; }
  // Two-batch overlap: the second micro-batch's EP buffers (always the bridge's own).
  EpWorkspace<T, Space>& second_workspace() { return second_ws_; }
  const BridgeOptions& options() const { return opts_; }
  // With an expert location: the (token, expert) pairs this rank routed in the last run, per
  // physical expert (count_expert_load; sum_expert_load over moe_ep gives the step's load, and
  // ExpertLoad::logical is what ExpertLocation::rebalanced and write_expert_load take). Empty
  // before the first run or without a location.
  const ExpertLoad& last_expert_load() const { return load_; }
  // Replaces the expert location between runs (rebalancing: ExpertLocation::rebalanced from
  // sum_expert_load of last_expert_load().logical), and rebuilds the dispatch's device table on
  // exec. Collective over the TP domain, like run: every rank passes the same map. It must map the
  // bridge's routed experts over moe_ep on a path that dispatches rows; a map refused on any rank
  // (or differing between ranks: require_same_expert_location) is a LayoutError on every rank, and
  // the bridge keeps its current map. From the next run physical expert first_expert + e of the
  // experts' batch is the new map's (the engine moves the weights to match); last_expert_load()
  // keeps the last run's, counted on the old map, until then.
  void set_expert_location(const Space& exec, std::shared_ptr<const ExpertLocation> loc) {
    const auto& tp = pg_.tp();
    const std::string problem =
        loc ? location_problem(*loc) : std::string("the expert location is null; pass a map (identity for no rebalancing)");
    int first_bad = problem.empty() ? tp.size() : tp.rank();
    all_reduce_in_place(exec, tp, std::span<int>(&first_bad, 1), ReduceOp::min);
    if (first_bad < tp.size())
      throw LayoutError("expert_location", "MoeBridge::set_expert_location: " +
                                               (problem.empty() ? "rank " + std::to_string(first_bad) +
                                                                      " of the TP domain refused its expert location"
                                                                : problem) +
                                               "; the bridge keeps its current map");
    require_same_expert_location(exec, tp, *loc);
    replicas_ = replica_table(exec, *loc, pg_.coords().moe_ep_rank, opts_.replica_choice);
    opts_.expert_location = std::move(loc);
  }
  void set_expert_location(const Space& exec, ExpertLocation loc) {
    set_expert_location(exec, std::make_shared<const ExpertLocation>(std::move(loc)));
  }
  // Physical experts the dispatch addresses: routed + redundant.
  int physical_experts() const { return opts_.expert_location ? opts_.expert_location->physical() : experts_; }
  // The plan this layout runs with these token counts.
  std::span<const PlanStep> plan(std::span<const std::int64_t> global_num_tokens = {}) const {
    return bridge_plan(path(), path() == BridgePath::dp_gather ? padding(global_num_tokens) : PaddingMode::sum_len,
                       opts_.restore, shares_ != nullptr);
  }
  PaddingMode padding(std::span<const std::int64_t> global_num_tokens) const {
    return opts_.padding ? *opts_.padding : dp_groups().layout().padding_mode(global_num_tokens);
  }
  // The slot table of path dp_gather for this step (collective-free: every rank passes the same
  // counts, e.g. from gather_num_tokens).
  DpSlotsPtr slots(std::span<const std::int64_t> global_num_tokens) const {
    return make_dp_slots(dp_groups().layout(), global_num_tokens, padding(global_num_tokens));
  }
  // global_num_tokens of this step: every rank passes how many rows it holds. One entry per
  // attention-DP group; under CP one per (DP group, CP rank) share, in rank order.
  std::vector<std::int64_t> gather_num_tokens(std::int64_t local_tokens) const {
    return relayout::gather_num_tokens(pg_, local_tokens);
  }
  // The groups path dp_gather's steps run on: the domain's own, or under CP those of
  // cp_share_layout, whose attention-DP groups are the CP shares.
  const ProcessGroupsOf<C>& dp_groups() const { return shares_ ? *shares_ : pg_; }

  using RunOptions = BridgeRunOptions<T, Space>;

  // One layer's hand-over. Collective over the TP domain: every rank calls it, also with zero rows.
  // Each path builds what it needs (path dp_gather its slot table from opts.global_num_tokens).
  template <RouterFor<T, Space> R, ExpertsFor<T, Space> E>
  Out run(const Space& exec, const In& x, R& router, E& experts, const RunOptions& opts = {}) {
    Exec<R, E> run{*this, workspace(), second_ws_, exec, router, experts, opts.observer, opts.traffic, opts.owners};
    DpSlotsPtr slots;
    if (path() == BridgePath::dp_gather)
      slots = opts.global_num_tokens.empty() ? this->slots(gather_num_tokens(x.rows())) : this->slots(opts.global_num_tokens);
    return run.go(x, slots);
  }
  // The hand-over of rows already split over attn_tp (SGLang's scattered mode): each attn_tp member
  // passes the chunk it holds and gets its chunk's MoE rows back, RowShard like the input
  // (bridge_plan(path, ..., scattered = true)). On the paths that dispatch rows each member
  // dispatches its chunk, without the split before the dispatch and the attention-TP all-gather
  // after the combine; on tp_moe the chunks are gathered for the experts and the partials summed
  // back into the chunks by one reduce_scatter, in place of the all-reduce. The engine keeps its
  // residual stream split the same way: reduce_scatter the attention's partials over attn_tp
  // instead of all-reducing them, and all_gather over attn_tp where every member needs every row.
  // opts.owners: the chunk's owners. Path dp_gather gathers whole DP groups: a LayoutError naming
  // the rule (all_gather the rows and pass them Replicated<AttnTp>).
  template <RouterFor<T, Space> R, ExpertsFor<T, Space> E>
  ScatteredIn run(const Space& exec, const ScatteredIn& x, R& router, E& experts, const RunOptions& opts = {}) {
    if (path() == BridgePath::dp_gather)
      throw LayoutError("rows", "MoeBridge::run: rows split over attn_tp (RowShard<AttnTp>) need path a2a_split, direct "
                                "or tp_moe; this layout takes path dp_gather: all_gather them over attn_tp and pass "
                                "them Replicated<AttnTp>");
    if (opts_.fault == BridgeFault::no_split)
      throw LayoutError("fault", "MoeBridge::run: fault no_split wires the split before the dispatch, which rows "
                                 "already split over attn_tp do not take");
    // This member's chunk as tensor_split gives it (what reduce_scatter and split_rows make): the
    // dispatch numbers the group's tokens by it, and another split would mislabel them.
    const Range mine = tensor_split_range(x.full_rows(), pg_.attn_tp().size(), pg_.attn_tp().rank());
    if (x.rows() != mine.count)
      throw LayoutError("rows", "MoeBridge::run: this attn_tp member holds " + std::to_string(x.rows()) + " of the " +
                                    std::to_string(x.full_rows()) + " rows split over attn_tp = " +
                                    std::to_string(pg_.attn_tp().size()) + "; tensor_split gives member " +
                                    std::to_string(pg_.attn_tp().rank()) + " " + std::to_string(mine.count) +
                                    " (reduce_scatter or split_rows the rows)");
    Exec<R, E> run{*this, workspace(), second_ws_, exec, router, experts, opts.observer, opts.traffic, opts.owners};
    return run.go_scattered(x);
  }
  // The rows must be the attention's complete output for this DP group: a sentence, not "cannot
  // convert", for any other placement.
  template <RowsType X, class... Rest>
    requires(!std::same_as<std::remove_cvref_t<X>, In> && !std::same_as<std::remove_cvref_t<X>, ScatteredIn>)
  void run(const Space&, const X&, Rest&&...) {
    using St = typename std::remove_cvref_t<X>::state_type;
    static_assert(St::state != RowState::partial,
                  "relayout: MoeBridge::run needs complete rows, Replicated<AttnTp>, and these are Partial sums (the "
                  "attention's wo_b output before its all-reduce): call all_reduce(exec, pg, rows) first");
    static_assert(St::state == RowState::partial,
                  "relayout: MoeBridge::run takes this DP group's complete rows as Rows<T, Replicated<AttnTp>, "
                  "DpLocal, Space> of the bridge's T and Space (the attention all-reduce's output), or this "
                  "member's chunk of them as Rows<T, RowShard<AttnTp>, DpLocal, Space> (paths a2a_split, "
                  "direct and tp_moe): dp_scatter DpGlobal rows first");
  }

 private:
  // What is wrong with an expert location for this bridge ("" when nothing is).
  std::string location_problem(const ExpertLocation& loc) const {
    if (!dispatches_rows(path()))
      return "an expert location (redundant experts) needs a path that dispatches rows (a2a_split or direct); "
             "this layout takes path " + std::string(to_string(path()));
    const int ep = pg_.layout().widths().moe_ep;
    if (loc.routed() != experts_ || loc.ep() != ep)
      return "the expert location maps " + std::to_string(loc.routed()) + " routed experts over moe_ep = " +
             std::to_string(loc.ep()) + "; the bridge routes " + std::to_string(experts_) + " experts over moe_ep = " +
             std::to_string(ep);
    return {};
  }

  // One run: the plan's steps in order, each checked against the plan as it is taken.
  template <class R, class E>
  struct Exec {
    using OwnerSpace = Kokkos::DefaultHostExecutionSpace;
    template <class St, class Sc>
    using OwnerRows = Rows<std::int64_t, St, Sc, OwnerSpace>;
    using OwnerView = RowsView<std::int64_t, OwnerSpace>;

    const MoeBridge& b;
    EpWorkspace<T, Space>& ws;
    EpWorkspace<T, Space>& ws2;  // two-batch overlap: the second micro-batch's
    const Space& exec;
    R& router;
    E& experts;
    const typename RunOptions::observer_type& obs;
    TrafficLog* traffic;
    std::vector<std::int64_t>* owners;
    std::span<const PlanStep> plan{};
    std::size_t at = 0;

    const ProcessGroupsOf<C>& pg() const { return b.pg_; }
    const ProcessGroupsOf<C>& dpg() const { return b.dp_groups(); }
    const Widths& widths() const { return pg().layout().widths(); }
    BridgeFault fault() const { return b.opts_.fault; }

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

    Out go(const In& x, const DpSlotsPtr& slots) {
      return checked(x.rows(), [&](const std::vector<std::int64_t>&) -> Out {
        switch (b.path()) {
          case BridgePath::dp_gather:
            if (!slots) throw LayoutError("slots", "MoeBridge::run: path dp_gather needs the step's DpSlots (MoeBridge::slots)");
            plan = bridge_plan(BridgePath::dp_gather, slots->mode(), b.opts_.restore, b.shares_ != nullptr);
            return dp_gather(x, slots);
          case BridgePath::tp_moe: plan = bridge_plan(BridgePath::tp_moe); return tp_moe(x);
          case BridgePath::a2a_split:
          case BridgePath::direct: break;
        }
        plan = bridge_plan(b.path());
        return a2a(x);
      });
    }

    // Path A: gather every DP group's rows, this rank's experts on its moe_dp slice, restore.
    Out dp_gather(const In& x, const DpSlotsPtr& slots) {
      const DpSlots& s = *slots;
      const PlanStep& g_step = step(BridgeStep::dp_gather);
      Rows<T, Replicated<group::Tp>, DpGlobal, Space> global = [&] {
        if (fault() == BridgeFault::gather_partial)  // complete rows summed as partials: x attn_tp
          return dp_gather_partial(exec, dpg(), Rows<T, Partial<AttnTp>, DpLocal, Space>(x.view()), slots, traffic);
        return dp_gather_replicate(exec, dpg(), x, slots, traffic);
      }();
      std::vector<std::int64_t> g_owners;
      if (owners) {
        g_owners = to_vector(dp_gather_replicate(dpg(), OwnerRows<Replicated<AttnTp>, DpLocal>(owner_view(*owners)), slots).view());
        if (s.mode() == PaddingMode::max_len)
          for (int grp = 0; grp < s.groups(); ++grp)
            for (std::int64_t r = s.count(grp); r < s.slot_rows(); ++r)
              g_owners[static_cast<std::size_t>(s.offset(grp) + r)] = kPadRow;
      }
      see(g_step, RowState::replicated, widths().tp, span_of(g_owners), global.view());

      // This rank's moe_dp slice of the global rows (tensor_split over moe_dp).
      const Range mine = tensor_split_range(global.rows(), widths().moe_dp, pg().coords().moe_dp_rank);
      auto partial = moe_partial(global.view(), mine);
      const PlanStep& e_step = step(BridgeStep::local_experts);
      see(e_step, RowState::partial, moe_holders(), span_of(g_owners, mine.begin, mine.count), partial, mine.begin);
      Rows<T, Partial<group::Tp>, DpGlobal, Space> p(partial, slots);
      if (fault() == BridgeFault::double_reduce)  // the MoE sums, and the restore sums again
        p = Rows<T, Partial<group::Tp>, DpGlobal, Space>(
            impl::all_reduce_rows_in_place(pg().tp(), std::move(p).data(), GroupKind::tp, impl::ctx(exec, traffic)));

      const int g = dpg().coords().attn_dp_rank;  // under CP: this rank's share
      const std::vector<std::int64_t> out_owners(g_owners.empty() ? g_owners.begin() : g_owners.begin() + s.offset(g),
                                                 g_owners.empty() ? g_owners.begin() : g_owners.begin() + s.offset(g) + s.count(g));
      Out out = [&]() -> Out {
        if (b.opts_.restore == BridgeRestore::scatter) {
          const PlanStep& r_step = step(BridgeStep::all_reduce);
          auto summed = fault() == BridgeFault::skip_reduce
                            ? Rows<T, Replicated<group::Tp>, DpGlobal, Space>(std::move(p).data())
                            : all_reduce(exec, dpg(), std::move(p), traffic);
          see(r_step, RowState::replicated, widths().tp, span_of(g_owners), summed.view());
          const PlanStep& s_step = step(BridgeStep::dp_scatter);
          Out o = dp_scatter(exec, dpg(), summed, traffic);
          see(s_step, RowState::replicated, group_ranks(), span_of(out_owners), o.view());
          return o;
        }
        if (fault() == BridgeFault::skip_reduce) {  // a copy where a sum was due
          const PlanStep& r_step = step(s.mode() == PaddingMode::sum_len ? BridgeStep::reduce_scatterv : BridgeStep::dp_reduce_scatter);
          Out o = dp_scatter(exec, dpg(), Rows<T, Replicated<group::Tp>, DpGlobal, Space>(std::move(p).data()), traffic);
          see(r_step, RowState::replicated, group_ranks(), span_of(out_owners), o.view(), 0, "dp_scatter");
          return o;
        }
        if (s.mode() == PaddingMode::sum_len) {
          const PlanStep& r_step = step(BridgeStep::reduce_scatterv);
          Out o = reduce_scatterv(exec, dpg(), p, traffic);
          see(r_step, RowState::replicated, group_ranks(), span_of(out_owners), o.view());
          return o;
        }
        const PlanStep& r_step = step(BridgeStep::dp_reduce_scatter);
        Out o = dp_reduce_scatter(exec, dpg(), p, traffic);
        see(r_step, RowState::replicated, group_ranks(), span_of(out_owners), o.view());
        return o;
      }();
      if (owners) *owners = out_owners;
      return out;
    }

    // No DP attention, no all-to-all backend: every rank holds every row; partials summed over tp.
    Out tp_moe(const In& x) {
      const Range mine = tensor_split_range(x.rows(), widths().moe_dp, pg().coords().moe_dp_rank);
      auto partial = moe_partial(x.view(), mine);
      const PlanStep& e_step = step(BridgeStep::local_experts);
      const std::vector<std::int64_t> own = owners ? *owners : std::vector<std::int64_t>{};
      see(e_step, RowState::partial, moe_holders(), span_of(own, mine.begin, mine.count), partial, mine.begin);
      Rows<T, Partial<group::Tp>, DpLocal, Space> p(partial);
      if (fault() == BridgeFault::double_reduce)
        p = Rows<T, Partial<group::Tp>, DpLocal, Space>(
            impl::all_reduce_rows_in_place(pg().tp(), std::move(p).data(), GroupKind::tp, impl::ctx(exec, traffic)));
      const PlanStep& r_step = step(BridgeStep::all_reduce);
      Out o = fault() == BridgeFault::skip_reduce ? Out(std::move(p).data())
                                                  : as_attn_tp(pg(), all_reduce(exec, pg(), std::move(p), traffic));
      see(r_step, RowState::replicated, widths().tp, span_of(own), o.view());
      return o;
    }

    // tp_moe on this member's chunk: the chunks gathered, the experts on every row, the partials
    // summed over attn_tp (== tp) into the chunks.
    ScatteredIn tp_moe_scattered(const ScatteredIn& x) {
      if (pg().attn_tp().size() != pg().tp().size())  // every rank alike: before any collective
        throw LayoutError("bridge", "MoeBridge: path tp_moe with attn_tp = " + std::to_string(pg().attn_tp().size()) +
                                        " != tp = " + std::to_string(pg().tp().size()));
      const PlanStep& g_step = step(BridgeStep::all_gather);
      const In all = all_gather(exec, pg(), x, traffic);
      std::vector<std::int64_t> g_owners;
      if (owners)
        g_owners = to_vector(all_gather(pg(), OwnerRows<RowShard<AttnTp>, DpLocal>(owner_view(*owners), x.full_rows())).view());
      see(g_step, RowState::replicated, group_ranks(), span_of(g_owners), all.view());
      const Range mine = tensor_split_range(all.rows(), widths().moe_dp, pg().coords().moe_dp_rank);
      auto partial = moe_partial(all.view(), mine);
      const PlanStep& e_step = step(BridgeStep::local_experts);
      see(e_step, RowState::partial, moe_holders(), span_of(g_owners, mine.begin, mine.count), partial, mine.begin);
      Rows<T, Partial<AttnTp>, DpLocal, Space> p(partial);
      if (fault() == BridgeFault::double_reduce)
        p = Rows<T, Partial<AttnTp>, DpLocal, Space>(
            impl::all_reduce_rows_in_place(pg().attn_tp(), std::move(p).data(), GroupKind::attn_tp, impl::ctx(exec, traffic)));
      const PlanStep& r_step = step(BridgeStep::reduce_scatter);
      ScatteredIn o = fault() == BridgeFault::skip_reduce
                          ? split_rows(pg(), Rows<T, Replicated<AttnTp>, DpLocal, Space>(std::move(p).data()))
                          : reduce_scatter(exec, pg(), std::move(p), traffic);
      see(r_step, RowState::replicated, 1, owners ? span_of(*owners) : std::span<const std::int64_t>{}, o.view());
      return o;
    }

    // Rows [mine) of x through route + this rank's experts (+ its shared share): Partial<tp> rows.
    view_type moe_partial(const view_type& x, Range mine) {
      const std::int64_t n = static_cast<std::int64_t>(x.extent(0));
      auto partial = impl::alloc_rows<T, Space>("relayout::moe_partial", n, impl::hidden_of(x.extent(1)));
      // Rows [mine) are written by local_experts (zero where none of this rank's experts took a
      // row); only the rows of the other moe_dp slices are zero-filled here.
      if (mine.begin > 0) Kokkos::deep_copy(exec, impl::row_slice(partial, 0, mine.begin), T(0));
      if (mine.begin + mine.count < n)
        Kokkos::deep_copy(exec, impl::row_slice(partial, mine.begin + mine.count, n - mine.begin - mine.count), T(0));
      const view_type xs = impl::row_slice(x, mine.begin, mine.count);
      const view_type ps = impl::row_slice(partial, mine.begin, mine.count);
      const TopK<T, Space> r = route(xs);
      const int local = b.experts_ / widths().moe_ep;
      local_experts(exec, xs, r, pg().coords().moe_ep_rank * local, local, b.experts_, experts, ps, ws,
                    b.opts_.check_route);
      if constexpr (HasSharedExpert<E, T, Space>)
        if (pg().coords().moe_ep_rank == 0) experts.shared(exec, xs, ps);
      exec.fence();
      return partial;
    }

    // Rows already split over attn_tp, on a path that dispatches rows: the chunk's hand-over.
    ScatteredIn go_scattered(const ScatteredIn& x) {
      return checked(x.rows(), [&](const std::vector<std::int64_t>& in_owners) -> ScatteredIn {
        plan = bridge_plan(b.path(), PaddingMode::sum_len, b.opts_.restore, false, true);
        return b.path() == BridgePath::tp_moe ? tp_moe_scattered(x) : a2a_chunk(x, in_owners, x.full_rows());
      });
    }

    // Path B and direct: split over attn_tp, dispatch this chunk, experts, combine, all-gather.
    Out a2a(const In& x) {
      const int A = widths().attn_tp;
      const std::int64_t n = x.rows();
      const PlanStep& s_step = step(BridgeStep::split_rows);
      // The no_split fault keeps every row on every member: dispatched attn_tp times.
      const Rows<T, RowShard<AttnTp>, DpLocal, Space> chunk =
          fault() == BridgeFault::no_split ? Rows<T, RowShard<AttnTp>, DpLocal, Space>(x.view(), n * A)
                                           : split_rows(pg(), x);
      std::vector<std::int64_t> c_owners;
      if (owners) {
        if (fault() == BridgeFault::no_split) c_owners = *owners;
        else c_owners = to_vector(split_rows(pg(), OwnerRows<Replicated<AttnTp>, DpLocal>(owner_view(*owners))).view());
      }
      see(s_step, RowState::replicated, 1, span_of(c_owners), chunk.view());
      const Rows<T, RowShard<AttnTp>, DpLocal, Space> combined = a2a_chunk(chunk, c_owners, n);
      const PlanStep& g_step = step(BridgeStep::all_gather);
      Out o = all_gather(exec, pg(), combined, traffic);
      if (owners) {
        const std::int64_t full = fault() == BridgeFault::no_split ? n * A : n;
        *owners = to_vector(all_gather(pg(), OwnerRows<RowShard<AttnTp>, DpLocal>(owner_view(c_owners), full)).view());
      }
      see(g_step, RowState::replicated, group_ranks(), owners ? span_of(*owners) : std::span<const std::int64_t>{}, o.view());
      return o;
    }

    // This member's chunk (c_owners: its rows' owners, when carried; group_rows: its DP group's
    // rows) through route, dispatch, experts, combine and the shared expert: the chunk's MoE rows.
    Rows<T, RowShard<AttnTp>, DpLocal, Space> a2a_chunk(const Rows<T, RowShard<AttnTp>, DpLocal, Space>& chunk,
                                                         const std::vector<std::int64_t>& c_owners,
                                                         std::int64_t group_rows) {
      // One batch, or two micro-batches whose exchanges overlap the other's compute.
      const bool two = b.opts_.two_batch_overlap;
      const std::int64_t m = chunk.rows(), H = impl::hidden_of(chunk.view().extent(1));
      Micro mb[2];
      for (int i = 0; i < (two ? 2 : 1); ++i) {
        Micro& u = mb[i];
        u.range = two ? two_batch_range(m, i) : Range{0, m};
        u.x = impl::row_slice(chunk.view(), u.range.begin, u.range.count);
        u.ws = i == 0 ? &ws : &ws2;
        if (owners)
          u.owners.assign(c_owners.begin() + u.range.begin, c_owners.begin() + u.range.begin + u.range.count);
      }
      step(BridgeStep::route);
      const PlanStep& d_step = step(BridgeStep::dispatch);
      static_cast<void>(d_step);
      begin_dispatch(mb[0], group_rows, chunk.full_rows(), false);
      if (two) {
        begin_dispatch(mb[1], group_rows, chunk.full_rows(), true);  // behind the first one's exchange
        mb[0].pd->test();
      }
      finish_dispatch(mb[0], two ? &mb[1] : nullptr);  // and its experts: behind the second one's exchange
      const PlanStep& e_step = step(BridgeStep::experts);
      if (two) {
        begin_combine(mb[0]);
        finish_dispatch(mb[1], &mb[0]);  // and its experts: behind the first one's combine
      }
      if (obs) {
        // One owner per (row, local expert): over all ranks each row appears top_k times.
        std::vector<std::int64_t> batch_owners;
        for (int i = 0; i < (two ? 2 : 1); ++i) {
          const Dispatched<T, Space>& d = *mb[i].d;
          const std::size_t at = batch_owners.size();
          batch_owners.resize(at + static_cast<std::size_t>(d.batch.rows()));
          if (!owners) continue;
          auto so = Kokkos::create_mirror_view(d.slot_of);
          Kokkos::deep_copy(exec, so, d.slot_of);
          exec.fence();
          for (std::size_t r = 0; r < so.extent(0); ++r)
            for (std::size_t j = 0; j < so.extent(1); ++j)
              if (so(r, j) >= 0) batch_owners[at + static_cast<std::size_t>(so(r, j))] = d.tags[r];
        }
        see(e_step, RowState::replicated, router.top_k(), owners ? span_of(batch_owners) : std::span<const std::int64_t>{}, view_type());
      }
      const PlanStep& c_step = step(BridgeStep::combine);
      const PlanStep& h_step = step(BridgeStep::shared_expert);
      static_cast<void>(h_step);
      view_type joined;
      if (two) {
        begin_combine(mb[1]);
        finish_combine(mb[0], &mb[1]);  // and its shared expert: behind the second one's combine
        finish_combine(mb[1]);
        joined = impl::alloc_rows<T, Space>("relayout::two_batch_combined", m, H);
        for (const Micro& u : mb)
          if (u.range.count > 0)
            Kokkos::deep_copy(exec, impl::row_slice(joined, u.range.begin, u.range.count), u.combined);
      } else {
        begin_combine(mb[0]);
        finish_combine(mb[0]);
        joined = mb[0].combined;
      }
      exec.fence();
      const Rows<T, RowShard<AttnTp>, DpLocal, Space> combined(joined, chunk.full_rows());
      see(c_step, RowState::replicated, 1, span_of(c_owners), combined.view());
      return combined;
    }

    // One micro-batch of this rank's chunk (the whole chunk without two-batch overlap) on its way
    // through route, dispatch, experts, combine and the shared expert. Not moved once started: a
    // combine in flight points at its Dispatched.
    struct Micro {
      Range range{};
      view_type x;
      std::vector<std::int64_t> owners;  // of its rows, when carried
      EpWorkspace<T, Space>* ws = nullptr;
      std::optional<PendingDispatch<T, Space>> pd;
      std::optional<Dispatched<T, Space>> d;
      view_type y;
      std::optional<PendingCombine<T, Space>> pc;
      view_type combined;
    };

    // Route, then start the dispatch (the rows' exchange left in flight).
    void begin_dispatch(Micro& u, std::int64_t group_rows, std::int64_t full_rows, bool accumulate_load) {
      const TopK<T, Space> r = to_physical_ids(route_rows(u.x), group_rows, u.range.begin, accumulate_load);
      const Rows<T, RowShard<AttnTp>, DpLocal, Space> rows(u.x, full_rows);
      u.pd.emplace(dispatch_start(rows, r, *u.ws,
                                  EpOptions{traffic, owners ? &u.owners : nullptr, b.opts_.check_route, ReadsIndexedRows<E>}));
    }
    // Wait for the rows, run the experts on them; `other`: the micro-batch whose exchange is in
    // flight meanwhile (polled between expert chunks).
    void finish_dispatch(Micro& u, Micro* other = nullptr) {
      u.d.emplace(ep_dispatch_finish(exec, pg(), std::move(*u.pd)));
      u.pd.reset();
      u.y = u.ws->expert_outputs(u.d->batch.rows(), impl::hidden_of(u.x.extent(1)));
      const ExpertBatch<T, Space>& batch = u.d->batch;
      const int groups = batch.experts(), n = other ? std::min(b.opts_.two_batch_expert_chunks, groups) : 1;
      if (n <= 1) {
        experts(exec, batch, u.y);
        return;
      }
      for (int c = 0; c < n; ++c) {
        const int e0 = c * groups / n, e1 = (c + 1) * groups / n;
        const std::int64_t r0 = batch.offset(e0), r1 = batch.offset(e1);
        ExpertBatch<T, Space> part;
        if (batch.indexed) {
          part.x = batch.x;  // no rows; the index's slice says which
          part.indexed = true;
          part.source = batch.source;
          part.source_ld = batch.source_ld;
          part.index = Kokkos::subview(batch.index, Kokkos::make_pair(r0, r1));
        } else {
          part.x = impl::row_slice(batch.x, r0, r1 - r0);
        }
        part.first_expert = batch.first_expert + e0;
        for (int e = e0; e <= e1; ++e) part.offsets.push_back(batch.offset(e) - r0);
        experts(exec, part, impl::row_slice(u.y, r0, r1 - r0));
        if (c + 1 < n) poll(*other);
      }
    }
    void begin_combine(Micro& u) { u.pc.emplace(ep_combine_start(exec, pg(), *u.d, u.y, traffic)); }
    // Wait for the outputs, sum them, add the shared expert's (in row chunks, polling `other`'s
    // combine between them, when it is in flight).
    void finish_combine(Micro& u, Micro* other = nullptr) {
      u.combined = ep_combine_finish(exec, std::move(*u.pc)).view();
      u.pc.reset();
      if constexpr (HasSharedExpert<E, T, Space>) {
        const int n = other ? b.opts_.two_batch_expert_chunks : 1;
        if (n <= 1) {
          experts.shared(exec, u.x, u.combined);
          return;
        }
        const std::int64_t rows = static_cast<std::int64_t>(u.x.extent(0));
        for (int c = 0; c < n; ++c) {
          const Range r = tensor_split_range(rows, n, c);
          experts.shared(exec, impl::row_slice(u.x, r.begin, r.count), impl::row_slice(u.combined, r.begin, r.count));
          if (c + 1 < n) poll(*other);
        }
      }
    }
    // One poll of the exchange `u` has in flight (it lets MPI progress it); the experts' work so
    // far is fenced first, so a host backend has finished it.
    void poll(Micro& u) {
      exec.fence();
      if (u.pd) u.pd->test();
      else if (u.pc) u.pc->test();
    }

    // With an expert location: the router's logical ids as physical ones (same weights), the
    // replica of by_token chosen by the row's index in its DP group (its chunk's offset plus the
    // row: the same on every rank), and this run's load counted.
    // offset: the rows' first row in this rank's chunk (a micro-batch's); accumulate: add this
    // load to the run's (the second micro-batch).
    TopK<T, Space> to_physical_ids(TopK<T, Space> r, std::int64_t group_rows, std::int64_t offset = 0,
                                   bool accumulate = false) {
      const auto& loc = b.opts_.expert_location;
      if (!loc) return r;
      if (!b.replicas_) {  // the first run: every rank of the domain holds the same map (throws on all alike)
        require_same_expert_location(exec, pg().tp(), *loc);
        b.replicas_ = replica_table(exec, *loc, pg().coords().moe_ep_rank, b.opts_.replica_choice);
      }
      const std::int64_t first =
          tensor_split_range(group_rows, widths().attn_tp, pg().coords().attn_tp_rank).begin + offset;
      TopK<T, Space> p(typename TopK<T, Space>::ids_view(
                           Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("relayout::physical_ids")),
                           r.ids.extent(0), r.ids.extent(1)),
                       r.weights);
      try {
        relayout::to_physical(exec, *b.replicas_, r.ids, first, p.ids);
      } catch (const LayoutError&) {
        // An id out of range is now -1: the dispatch's route check refuses it on every member
        // together (throwing here alone would leave the others waiting in the exchange).
        if (!b.opts_.check_route) throw;
      }
      ExpertLoad load = count_expert_load(exec, *loc, p.ids);
      if (accumulate && b.load_.physical.size() == load.physical.size()) {
        for (std::size_t e = 0; e < load.physical.size(); ++e) load.physical[e] += b.load_.physical[e];
        load = ExpertLoad(*loc, std::move(load.physical));
      }
      b.load_ = std::move(load);
      return p;
    }

    // ep_dispatch_start with the rows travelling as BridgeOptions::dispatch_dtype.
    PendingDispatch<T, Space> dispatch_start(const Rows<T, RowShard<AttnTp>, DpLocal, Space>& rows, const TopK<T, Space>& r,
                                             EpWorkspace<T, Space>& w, const EpOptions& o) {
      const int physical = b.physical_experts();
      switch (b.opts_.dispatch_dtype) {
        case DispatchDtype::bf16: return ep_dispatch_start<relayout::bf16>(exec, pg(), rows, r, physical, w, o);
        case DispatchDtype::fp16: return ep_dispatch_start<relayout::fp16>(exec, pg(), rows, r, physical, w, o);
        case DispatchDtype::fp8: return ep_dispatch_start<relayout::fp8_e4m3>(exec, pg(), rows, r, physical, w, o);
        case DispatchDtype::compute: break;
      }
      return ep_dispatch_start(exec, pg(), rows, r, physical, w, o);
    }

    // Row conservation: every row that entered leaves exactly once, in order. A broken invariant
    // can be local, so the ranks agree before anyone throws: every rank throws together.
    void conserve(std::int64_t n_in, const std::vector<std::int64_t>& in_owners, std::int64_t n_out) {
      const bool ok = n_out == n_in && (!owners || in_owners == *owners);
      int first_bad = ok ? pg().layout().size() : pg().rank();
      all_reduce_in_place(exec, pg().tp(), std::span<int>(&first_bad, 1), ReduceOp::min);
      if (first_bad >= pg().layout().size()) return;
      std::string what = "row conservation broken on rank " + std::to_string(first_bad);
      if (first_bad != pg().rank()) {
        what += " of the domain (this rank's rows are intact)";
      } else {
        what += ": " + std::to_string(n_in) + " rows entered the bridge and " + std::to_string(n_out) + " left";
        if (owners) {
          std::size_t i = 0;
          while (i < in_owners.size() && i < owners->size() && in_owners[i] == (*owners)[i]) ++i;
          what += "; first difference at row " + std::to_string(i);
        }
      }
      throw LayoutError("bridge", what);
    }
  };

  const ProcessGroupsOf<C>& pg_;
  int experts_;
  BridgeOptions opts_;
  EpWorkspace<T, Space> own_ws_;
  EpWorkspace<T, Space> second_ws_;  // two-batch overlap: the second micro-batch's
  EpWorkspace<T, Space>* external_ws_ = nullptr;
  std::shared_ptr<const ProcessGroupsOf<C>> shares_;  // attn_cp > 1: cp_share_layout's groups
  // The expert location's device table (built on the first run's instance, or by
  // set_expert_location) and the last run's load.
  mutable std::optional<ReplicaTable<typename Space::memory_space>> replicas_;
  mutable ExpertLoad load_;
};

}  // namespace relayout
