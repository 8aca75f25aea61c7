// MoeBridge: runs one layer's Attention -> MoE hand-over (bridge_plan) with the engine's own router
// and experts, on typed rows, on the engine's execution-space instance, prefill and decode alike
// (the EP mode is chosen per run). Rows enter Replicated over attn_tp (the attention all-reduce's
// output, this DP group's rows) and leave the same way, every row's MoE output summed exactly
// once. Optional, off the hot path: a row-owner column moved with the rows (row conservation is
// checked) and an observer called at every boundary (tracing). See docs/bridge.md.
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

#include "relayout/bridge/impl/fault.hpp"
#include "relayout/bridge/impl/model_check.hpp"
#include "relayout/bridge/plan.hpp"
#include "relayout/comm.hpp"
#include "relayout/placement/ep.hpp"
#include "relayout/placement/expert_location.hpp"
#include "relayout/placement/expert_location_sync.hpp"
#include "relayout/placement/transitions.hpp"

namespace relayout {

template <class C, class T, class Space>
class MoeBridge;
namespace testing {
template <class C, class T, class Space>
void inject_fault(MoeBridge<C, T, Space>& bridge, BridgeFault fault);
}  // namespace testing

// The rule for a forced EP mode: low_latency shapes the dispatch, so it needs a path that
// dispatches rows (elsewhere it would silently do nothing). MoeBridge and the programs' flag both
// check with it.
inline void check_ep_mode(EpMode mode, BridgePath path, const char* input = "ep_mode") {
  if (mode == EpMode::normal || dispatches_rows(path)) return;
  throw LayoutError(input, std::string(input) + " " + std::string(to_string(mode)) +
                               " needs a path that dispatches rows (a2a_split or direct: --moe-a2a-backend deepep); "
                               "this layout takes path " + std::string(to_string(path)));
}

// SGLang's --deepep-mode auto, decided from what every rank shares: low_latency when every rank's
// dispatch (its attn_tp chunk of its DP group's count) fits the capacity, normal otherwise.
inline EpMode auto_ep_mode(std::span<const std::int64_t> global_num_tokens, int attn_tp, std::int64_t capacity) {
  std::int64_t most = 0;
  for (std::int64_t n : global_num_tokens) most = std::max(most, (n + attn_tp - 1) / attn_tp);
  return most <= capacity ? EpMode::low_latency : EpMode::normal;
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
  // Validate the router's output every layer (ids in range, weights finite), agreed before the
  // dispatch so a bad router on one rank is the same error on every rank.
  bool check_route = true;
  DispatchDtype dispatch_dtype = DispatchDtype::compute;
  // Paths a2a_split and direct: the EP mode of every run (BridgeRunOptions::ep_mode overrides it
  // per run); unset: auto_ep_mode, SGLang's auto (low_latency for decode-sized steps).
  std::optional<EpMode> ep_mode{};
  // The low-latency capacity: the most rows one rank dispatches in a low_latency run (SGLang's
  // --num-max-dispatch-tokens-per-rank); auto picks low_latency only when every rank fits it.
  std::int64_t num_max_dispatch_tokens_per_rank = 128;
  // Redundant experts (paths a2a_split and direct): the logical -> physical map, the same on every
  // rank (agreed at the first run). The bridge's EpBuffer holds it and hands each group's logical
  // expert to the experts (ExpertBatch::logical_expert); replace it with set_expert_location.
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
  // Paths a2a_split and direct: this run's EP mode, over BridgeOptions::ep_mode and auto.
  std::optional<EpMode> ep_mode{};
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
  MoeBridge(const ProcessGroupsOf<C>& pg, int experts, BridgeOptions opts = {},
            std::source_location site = std::source_location::current())
      : pg_(pg), experts_(experts), opts_(opts) {
    const Widths& w = pg.layout().widths();
    if (w.attn_cp > 1)
      shares_ = std::make_shared<const ProcessGroupsOf<C>>(relayout::cp_share_layout(pg.layout()), pg.tp());
    impl::require_experts(experts, w.moe_ep, "MoeBridge");
    check_dispatch_dtype(opts_.dispatch_dtype, path());
    if (opts_.expert_location && !dispatches_rows(path()))
      throw LayoutError("expert_location", "MoeBridge: an expert location (redundant experts) needs a path that "
                                           "dispatches rows (a2a_split or direct); this layout takes path " +
                                               std::string(to_string(path())) + impl::called_at(site));
    if (opts_.ep_mode) check_ep_mode(*opts_.ep_mode, path());
    check_two_batch_overlap(opts_.two_batch_overlap, path());
    if (opts_.two_batch_expert_chunks < 1)
      throw LayoutError("two_batch_expert_chunks", "MoeBridge: two_batch_expert_chunks = " +
                                                       std::to_string(opts_.two_batch_expert_chunks) +
                                                       "; the experts are called in at least 1 chunk");
    if (dispatches_rows(path()))
      ep_.emplace(pg, experts, EpBufferOptions{opts_.num_max_dispatch_tokens_per_rank, opts_.expert_location,
                                               opts_.replica_choice}, site);
    opts_.expert_location.reset();  // the EpBuffer's is the one map
  }

  BridgePath path() const { return pg_.layout().bridge_path(); }
  const BridgeOptions& options() const { return opts_; }
  // Paths a2a_split and direct: the EP buffer the runs dispatch through (its memory, its expert
  // location, its low-latency capacity); null on the other paths.
  EpBuffer<C, T, Space>* ep_buffer() { return ep_ ? &*ep_ : nullptr; }
  const EpBuffer<C, T, Space>* ep_buffer() const { return ep_ ? &*ep_ : nullptr; }
  std::shared_ptr<const ExpertLocation> expert_location() const { return ep_ ? ep_->expert_location() : nullptr; }
  // With an expert location: the (token, expert) pairs this rank routed in the last run, per
  // physical expert (sum_expert_load over moe_ep gives the step's load; ExpertLoad::logical is
  // what ExpertLocation::rebalanced takes). Empty before the first run or without a location.
  const ExpertLoad& last_expert_load() const {
    static const ExpertLoad none;
    return ep_ ? ep_->expert_load() : none;
  }
  // Replaces the expert location between runs (EpBuffer::set_expert_location: collective over the
  // TP domain, the same map on every rank, refused on every rank alike). From the next run the
  // experts' batch names the new map's logical experts; their weights are moved by the engine
  // (move_expert_weights) or by the overload that takes them.
  void set_expert_location(const Space& exec, std::shared_ptr<const ExpertLocation> loc,
                           std::source_location site = std::source_location::current()) {
    if (!ep_)
      throw LayoutError("expert_location", "MoeBridge::set_expert_location: an expert location needs a path that "
                                           "dispatches rows (a2a_split or direct); this layout takes path " +
                                               std::string(to_string(path())) + impl::called_at(site));
    ep_->set_expert_location(exec, std::move(loc), site);
  }
  void set_expert_location(const Space& exec, ExpertLocation loc,
                           std::source_location site = std::source_location::current()) {
    set_expert_location(exec, std::make_shared<const ExpertLocation>(std::move(loc)), site);
  }
  // Physical experts the dispatch addresses: routed + redundant.
  int physical_experts() const { return ep_ ? ep_->physical_experts() : experts_; }
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
  // opts.global_num_tokens: this step's counts (gather_num_tokens; the same on every rank), checked
  // against the rows and across ranks inside the step's first exchange; empty: gathered here.
  template <class R, class E>
  Out run(const Space& exec, const In& x, R& router, E& experts, const RunOptions& opts = {},
          std::source_location site = std::source_location::current()) {
    if constexpr (!impl::model_fits<T, Space, R, E>) {
      impl::check_model<T, Space, R, E>();
      throw 0;  // not reached: check_model does not compile
    } else {
      Exec<R, E> run(*this, exec, router, experts, opts, site);
      return run.go(x);
    }
  }
  // The hand-over of rows already split over attn_tp (SGLang's scattered mode): each attn_tp member
  // passes the chunk it holds (tensor_split's) and gets its chunk's MoE rows back, RowShard like
  // the input (bridge_plan(path, ..., scattered = true)). Paths a2a_split, direct and tp_moe; on
  // dp_gather a LayoutError naming the rule (all_gather the rows and pass them Replicated<AttnTp>).
  template <class R, class E>
  ScatteredIn run(const Space& exec, const ScatteredIn& x, R& router, E& experts, const RunOptions& opts = {},
                  std::source_location site = std::source_location::current()) {
    if constexpr (!impl::model_fits<T, Space, R, E>) {
      impl::check_model<T, Space, R, E>();
      throw 0;  // not reached: check_model does not compile
    } else {
      if (path() == BridgePath::dp_gather)
        throw LayoutError("rows", "MoeBridge::run: rows split over attn_tp (RowShard<AttnTp>) need path a2a_split, direct "
                                  "or tp_moe; this layout takes path dp_gather: all_gather them over attn_tp and pass "
                                  "them Replicated<AttnTp>" + impl::called_at(site));
      if (fault_ == BridgeFault::no_split)
        throw LayoutError("fault", "MoeBridge::run: fault no_split wires the split before the dispatch, which rows "
                                   "already split over attn_tp do not take");
      Exec<R, E> run(*this, exec, router, experts, opts, site);
      return run.go_scattered(x);
    }
  }
  // The rows must be the attention's complete output for this DP group: a sentence, not "cannot
  // convert", for any other placement.
  template <RowsType X, class... Rest>
    requires(!std::same_as<std::remove_cvref_t<X>, In> && !std::same_as<std::remove_cvref_t<X>, ScatteredIn>)
  void run(const Space&, const X&, Rest&&...) {
    using St = typename std::remove_cvref_t<X>::state_type;
    impl::require_same_element<T, typename std::remove_cvref_t<X>::value_type>();
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
  // One run: the plan's steps in order, each checked against the plan as it is taken.
  template <class R, class E>
  struct Exec {
    using OwnerSpace = Kokkos::DefaultHostExecutionSpace;
    template <class St, class Sc>
    using OwnerRows = Rows<std::int64_t, St, Sc, OwnerSpace>;
    using OwnerView = RowsView<std::int64_t, OwnerSpace>;

    Exec(MoeBridge& bridge, const Space& e, R& r, E& x, const RunOptions& o, std::source_location s)
        : b(bridge), exec(e), router(r), experts(x), run_opts(o), site(s) {}
    MoeBridge& b;
    const Space& exec;
    R& router;
    E& experts;
    const RunOptions& run_opts;
    std::source_location site;
    const typename RunOptions::observer_type& obs = run_opts.observer;
    TrafficLog* traffic = run_opts.traffic;
    std::vector<std::int64_t>* owners = run_opts.owners;
    std::span<const PlanStep> plan{};
    std::size_t at = 0;
    std::vector<std::int64_t> gathered;  // the step's counts, when the engine gave none
    std::string refusal;                 // this rank's reason to refuse the run (agreed in the dispatch)
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
    std::span<const std::int64_t> counts(std::int64_t group_rows) {
      if (!run_opts.global_num_tokens.empty()) return run_opts.global_num_tokens;
      if (gathered.empty()) gathered = b.gather_num_tokens(group_rows);
      return gathered;
    }
    // Paths that dispatch: this run's EP mode and this rank's refusal of the counts it was given
    // (agreed in the dispatch, with the counts' digest, so no rank waits on another's mistake).
    void prepare_dispatch(std::int64_t group_rows) {
      const auto& forced = run_opts.ep_mode ? run_opts.ep_mode : b.opts_.ep_mode;
      const bool need = !forced || !run_opts.global_num_tokens.empty();
      const std::span<const std::int64_t> c = need ? counts(group_rows) : std::span<const std::int64_t>{};
      mode = forced ? *forced : auto_ep_mode(c, widths().attn_tp, b.ep_->low_latency_capacity());
      if (run_opts.global_num_tokens.empty()) return;
      const std::size_t g = static_cast<std::size_t>(dpg().coords().attn_dp_rank);
      if (c.size() != static_cast<std::size_t>(dpg().layout().widths().attn_dp))
        refusal = "global_num_tokens has " + std::to_string(c.size()) + " entries; the step has " +
                  std::to_string(dpg().layout().widths().attn_dp) + " attention-DP groups" + impl::called_at(site);
      else if (c[g] != group_rows)
        refusal = "this DP group holds " + std::to_string(group_rows) + " rows but global_num_tokens[" +
                  std::to_string(g) + "] = " + std::to_string(c[g]) + impl::called_at(site);
    }

    Out go(const In& x) {
      if (run_opts.ep_mode) check_ep_mode(*run_opts.ep_mode, b.path(), "BridgeRunOptions::ep_mode");
      return checked(x.rows(), [&](const std::vector<std::int64_t>&) -> Out {
        switch (b.path()) {
          case BridgePath::dp_gather: {
            const DpSlotsPtr slots = b.slots(agreed_counts(x.rows()));
            plan = bridge_plan(BridgePath::dp_gather, slots->mode(), b.opts_.restore, b.shares_ != nullptr);
            return dp_gather(x, slots);
          }
          case BridgePath::tp_moe: plan = bridge_plan(BridgePath::tp_moe); return tp_moe(x);
          case BridgePath::a2a_split:
          case BridgePath::direct: break;
        }
        plan = bridge_plan(b.path());
        prepare_dispatch(x.rows());
        return a2a(x);
      });
    }

    // Path dp_gather: the engine's counts checked against every rank's rows and against each
    // other in one all_gather over tp (or gathered there when it gave none): every rank throws
    // the same error before the gather of rows.
    std::vector<std::int64_t> agreed_counts(std::int64_t rows) {
      if (run_opts.global_num_tokens.empty()) return b.gather_num_tokens(rows);
      const std::span<const std::int64_t> c = run_opts.global_num_tokens;
      const int n = pg().tp().size(), A = widths().attn_tp;
      const std::int64_t digest = impl::counts_digest(c);
      std::vector<std::int64_t> mine{rows, digest}, all(2 * static_cast<std::size_t>(n));
      all_gather(exec, pg().tp(), mine, all, site);
      for (int r = 0; r < n; ++r) {
        const std::size_t g = static_cast<std::size_t>(r / A);
        const std::int64_t held = all[2 * static_cast<std::size_t>(r)];
        if (all[2 * static_cast<std::size_t>(r) + 1] != digest)
          throw LayoutError("global_num_tokens", "MoeBridge::run: rank " + std::to_string(r) +
                                                     " of the TP domain was given other token counts "
                                                     "(global_num_tokens) than this rank" + impl::called_at(site));
        if (g >= c.size() || c[g] != held)
          throw LayoutError("global_num_tokens", "MoeBridge::run: rank " + std::to_string(r) + " holds " +
                                                     std::to_string(held) + " rows, but global_num_tokens lists " +
                                                     (g < c.size() ? std::to_string(c[g]) : std::string("no entry")) +
                                                     " for its DP group " + std::to_string(g) + impl::called_at(site));
      }
      return {c.begin(), c.end()};
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
      local_experts(exec, xs, r, pg().coords().moe_ep_rank * local, local, b.experts_, experts, ps, b.scratch_,
                    b.opts_.check_route);
      if constexpr (HasSharedExpert<E, T, Space>)
        if (pg().coords().moe_ep_rank == 0) experts.shared(exec, xs, ps);
      exec.fence();
      return partial;
    }

    // Rows already split over attn_tp, on a path that dispatches rows: the chunk's hand-over.
    ScatteredIn go_scattered(const ScatteredIn& x) {
      // This member's chunk as tensor_split gives it (what reduce_scatter and split_rows make): the
      // dispatch numbers the group's tokens by it, and another split would mislabel them.
      const Range mine = tensor_split_range(x.full_rows(), pg().attn_tp().size(), pg().attn_tp().rank());
      if (x.rows() != mine.count)
        refusal = "this attn_tp member holds " + std::to_string(x.rows()) + " of the " + std::to_string(x.full_rows()) +
                  " rows split over attn_tp = " + std::to_string(pg().attn_tp().size()) + "; tensor_split gives member " +
                  std::to_string(pg().attn_tp().rank()) + " " + std::to_string(mine.count) +
                  " (reduce_scatter or split_rows the rows)" + impl::called_at(site);
      if (!refusal.empty() && b.path() == BridgePath::tp_moe) throw LayoutError("rows", "MoeBridge::run: " + refusal);
      return checked(x.rows(), [&](const std::vector<std::int64_t>& in_owners) -> ScatteredIn {
        plan = bridge_plan(b.path(), PaddingMode::sum_len, b.opts_.restore, false, true);
        if (b.path() == BridgePath::tp_moe) return tp_moe_scattered(x);
        const std::string chunk_refusal = std::move(refusal);
        prepare_dispatch(x.full_rows());
        if (!chunk_refusal.empty()) refusal = chunk_refusal;
        return a2a_chunk(x, in_owners, x.full_rows());
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
        if (owners)
          u.owners.assign(c_owners.begin() + u.range.begin, c_owners.begin() + u.range.begin + u.range.count);
      }
      step(BridgeStep::route);
      const PlanStep& d_step = step(BridgeStep::dispatch);
      static_cast<void>(d_step);
      b.ep_->reset_expert_load();
      begin_dispatch(mb[0], group_rows, chunk.full_rows());
      if (two) {
        begin_dispatch(mb[1], group_rows, chunk.full_rows());  // behind the first one's exchange
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
          const EpHandle<T, Space>& h = mb[i].h;
          if (!owners) {
            batch_owners.resize(batch_owners.size() + static_cast<std::size_t>(h.batch().rows()));
            continue;
          }
          const std::vector<std::int64_t> t = h.batch_tags(exec);
          batch_owners.insert(batch_owners.end(), t.begin(), t.end());
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
      std::optional<EpDispatchInFlight<T, Space>> pd;
      EpHandle<T, Space> h;
      view_type y;
      std::optional<EpCombineInFlight<T, Space>> pc;
      view_type combined;
    };

    // Route, then start the dispatch (the rows' exchange left in flight).
    // group_rows: the DP group's rows, whose index numbers each token for the replica choice.
    void begin_dispatch(Micro& u, std::int64_t group_rows, std::int64_t full_rows) {
      const TopK<T, Space> r = route_rows(u.x);
      const Rows<T, RowShard<AttnTp>, DpLocal, Space> rows(u.x, full_rows);
      EpDispatchOptions o{.mode = mode,
                          .dtype = b.opts_.dispatch_dtype,
                          .global_num_tokens = run_opts.global_num_tokens,
                          .first_token = tensor_split_range(group_rows, widths().attn_tp, pg().coords().attn_tp_rank).begin +
                                         u.range.begin,
                          .tags = owners ? &u.owners : nullptr,
                          .check_route = b.opts_.check_route,
                          .indexed_batch = ReadsIndexedRows<E>,
                          .traffic = traffic,
                          .refuse = refusal};
      u.pd.emplace(b.ep_->dispatch_start(exec, rows, r, o, site));
    }
    // Wait for the rows, run the experts on them; `other`: the micro-batch whose exchange is in
    // flight meanwhile (polled between expert chunks).
    void finish_dispatch(Micro& u, Micro* other = nullptr) {
      u.h = b.ep_->dispatch_finish(exec, std::move(*u.pd));
      u.pd.reset();
      u.y = b.ep_->expert_outputs(u.h);
      const ExpertBatch<T, Space>& batch = u.h.batch();
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
        if (!batch.logical.empty())
          part.logical.assign(batch.logical.begin() + e0, batch.logical.begin() + e1);
        for (int e = e0; e <= e1; ++e) part.offsets.push_back(batch.offset(e) - r0);
        experts(exec, part, impl::row_slice(u.y, r0, r1 - r0));
        if (c + 1 < n) poll(*other);
      }
    }
    void begin_combine(Micro& u) { u.pc.emplace(b.ep_->combine_start(exec, u.h, u.y, site)); }
    // Wait for the outputs, sum them, add the shared expert's (in row chunks, polling `other`'s
    // combine between them, when it is in flight).
    void finish_combine(Micro& u, Micro* other = nullptr) {
      u.combined = b.ep_->combine_finish(exec, std::move(*u.pc)).view();
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
  std::optional<EpBuffer<C, T, Space>> ep_;  // paths a2a_split and direct
  MoeScratch<T, Space> scratch_;              // paths dp_gather and tp_moe: local_experts' memory
  BridgeFault fault_ = BridgeFault::none;     // wired by testing::inject_fault only
  std::shared_ptr<const ProcessGroupsOf<C>> shares_;  // attn_cp > 1: cp_share_layout's groups
  template <class C2, class T2, class S2>
  friend void testing::inject_fault(MoeBridge<C2, T2, S2>&, BridgeFault);
};

}  // namespace relayout
