// MoeBridge: runs one layer's Attention -> MoE hand-over (bridge_plan) with the engine's own router
// and experts, on typed rows, on the engine's execution-space instance. Rows enter Replicated over
// attn_tp (the attention all-reduce's output, this DP group's rows) and leave the same way, every
// row's MoE output summed exactly once. Optional, off the hot path: a row-owner column moved with
// the rows (row conservation is checked), an observer called at every boundary (tracing), and
// deliberate faults that show a verification catches them. See docs/bridge.md.
#pragma once

#include <concepts>
#include <cstdint>
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
#include "relayout/placement/transitions.hpp"

namespace relayout {

// The engine's router: fills out.ids / out.weights (rows x top_k()) for the rows x.
template <class R, class T, class Space>
concept RouterFor = requires(R& r, const Space& exec, const impl::RowsView<T, Space>& x, TopK<T, Space>& out) {
  { r.top_k() } -> std::convertible_to<int>;
  r(exec, x, out);
};

// An engine's experts may have a shared expert: shared(exec, x, y) adds its output for rows x to y.
// On paths a2a_split and direct it is called on every rank with that rank's own rows (the whole
// shared expert); on dp_gather and tp_moe only on moe_ep rank 0 of each MoE replica, and the
// engine adds its moe_tp share there (the bridge sums the partials over tp).
template <class E, class T, class Space>
concept HasSharedExpert = requires(E& e, const Space& exec, const impl::RowsView<T, Space>& x,
                                   const impl::RowsView<T, Space>& y) { e.shared(exec, x, y); };

// Known bugs, wired on purpose so a verification can be shown to catch them. Never in production.
enum class BridgeFault : std::uint8_t {
  none,
  double_reduce,   // the MoE all-reduces and the restore sums again (output x tp)
  skip_reduce,     // nobody sums the partials (each row sees only some of its experts)
  gather_partial,  // complete rows gathered as if they were partial sums (x attn_tp)
  no_split,        // every attn_tp member dispatches every row (rows processed attn_tp times)
};

// The type the rows travel as in the EP dispatch (paths a2a_split and direct): the element type
// itself, or a 16-bit storage type (half the row bytes; the experts see the rows rounded to it).
// The router weights and the combine stay in the element type.
enum class DispatchDtype : std::uint8_t { compute, bf16, fp16 };

struct BridgeOptions {
  std::optional<PaddingMode> padding;  // forced; otherwise the layout's rule on global_num_tokens
  BridgeRestore restore = BridgeRestore::reduce;
  BridgeFault fault = BridgeFault::none;
  // Validate the router's output every layer (ids in range, weights finite: EpOptions::check_route).
  bool check_route = true;
  DispatchDtype dispatch_dtype = DispatchDtype::compute;
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

template <class O, class T, class Space>
concept BridgeObserverFor = requires(O& o, const BoundaryInfo& b, std::span<const std::int64_t> owners,
                                     const impl::RowsView<T, Space>& values, std::int64_t first) {
  { O::enabled } -> std::convertible_to<bool>;
  o(b, owners, values, first);
};
struct NoObserver {
  static constexpr bool enabled = false;
  template <class... A>
  void operator()(const A&...) {}
};

template <class C, class T, class Space = Kokkos::DefaultExecutionSpace>
class MoeBridge {
 public:
  using In = Rows<T, Replicated<AttnTp>, DpLocal, Space>;
  using Out = In;
  using view_type = impl::RowsView<T, Space>;

  // experts: the model's routed experts (global ids [0, experts)), split evenly over moe_ep.
  // Under attention context parallelism (attn_cp > 1) the constructor is collective over the
  // domain: it makes the groups of the CP shares (cp_share_layout).
  MoeBridge(const ProcessGroupsOf<C>& pg, int experts, BridgeOptions opts = {})
      : pg_(pg), experts_(experts), opts_(opts) {
    const Widths& w = pg.layout().widths();
    if (w.attn_cp > 1)
      shares_ = std::make_shared<const ProcessGroupsOf<C>>(cp_share_layout(pg.layout()), pg.tp());
    if (experts < 1 || experts % w.moe_ep != 0)
      throw LayoutError("experts", "MoeBridge: " + std::to_string(experts) + " experts cannot be split evenly over moe_ep = " +
                                       std::to_string(w.moe_ep));
    check_fault();
    if (opts_.dispatch_dtype != DispatchDtype::compute && path() != BridgePath::a2a_split && path() != BridgePath::direct)
      throw LayoutError("dispatch_dtype", "MoeBridge: a 16-bit dispatch dtype needs a path that dispatches rows "
                                          "(a2a_split or direct); this layout takes path " +
                                              std::string(to_string(path())));
  }

  BridgePath path() const { return pg_.layout().bridge_path(); }
  // The engine's own workspace for the EP buffers (it must outlive the bridge's runs); by default
  // the bridge keeps one. Either way, runs after the first allocate no EP buffer that fits.
  void use_workspace(EpWorkspace<T, Space>& ws) { external_ws_ = &ws; }
  EpWorkspace<T, Space>& workspace() { return external_ws_ ? *external_ws_ : own_ws_; }
  const BridgeOptions& options() const { return opts_; }
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
    return relayout::gather_num_tokens(dp_groups(), local_tokens);
  }
  // The groups path dp_gather's steps run on: the domain's own, or under CP those of
  // cp_share_layout, whose attention-DP groups are the CP shares.
  const ProcessGroupsOf<C>& dp_groups() const { return shares_ ? *shares_ : pg_; }

  // Ranks run (attn_dp, attn_cp, attn_tp), fastest last, so the ranks holding one CP share of one
  // DP group are attn_tp consecutive ranks, like an attention-DP group with attn_cp == 1: the same
  // domain with attn_dp * attn_cp DP groups and no CP moves every share as a group of its own.
  static RuntimeLayout cp_share_layout(const RuntimeLayout& l) {
    const Widths& w = l.widths();
    return RuntimeLayout(LayoutConfig{.tp = w.tp, .dp = w.attn_dp * w.attn_cp, .enable_dp_attention = true});
  }

  // One layer's hand-over. Collective over the TP domain: every rank calls it, also with zero rows.
  // `slots` (path dp_gather only; may be null otherwise) come from slots(global_num_tokens).
  // `owners`, when given, is the owner column of x's rows: moved with the rows, checked for
  // conservation and replaced by the owners of the output rows (which must equal them).
  template <RouterFor<T, Space> R, ExpertsFor<T, Space> E, class Obs = NoObserver>
  Out run(const Space& exec, const In& x, const DpSlotsPtr& slots, R& router, E& experts,
          std::vector<std::int64_t>* owners = nullptr, Obs&& obs = {}, TrafficLog* traffic = nullptr) {
    Exec<R, E, std::remove_cvref_t<Obs>> run{*this, workspace(), exec, router, experts, obs, traffic, owners};
    return run.go(x, slots);
  }

 private:
  void check_fault() const {
    const Widths& w = pg_.layout().widths();
    const auto refuse = [&](const std::string& rule) {
      throw LayoutError("fault", std::string("fault ") + fault_name(opts_.fault) + " " + rule + "; this layout takes path " +
                                     std::string(to_string(path())) + " with tp = " + std::to_string(w.tp) +
                                     ", attn_tp = " + std::to_string(w.attn_tp));
    };
    switch (opts_.fault) {
      case BridgeFault::none: return;
      case BridgeFault::double_reduce:
      case BridgeFault::skip_reduce:
        if ((path() != BridgePath::dp_gather && path() != BridgePath::tp_moe) || w.tp < 2)
          refuse("needs a layout whose MoE partials are summed over tp > 1 (path dp_gather or tp_moe)");
        return;
      case BridgeFault::gather_partial:
        if (path() != BridgePath::dp_gather || w.attn_tp < 2) refuse("needs path dp_gather with attn_tp > 1");
        return;
      case BridgeFault::no_split:
        if (path() != BridgePath::a2a_split) refuse("needs path a2a_split (attn_tp > 1 with an all-to-all backend)");
        return;
    }
  }
  static const char* fault_name(BridgeFault f) {
    constexpr const char* names[] = {"none", "double_reduce", "skip_reduce", "gather_partial", "no_split"};
    return names[static_cast<int>(f)];
  }

  // One run: the plan's steps in order, each checked against the plan as it is taken.
  template <class R, class E, class Obs>
  struct Exec {
    using OwnerSpace = Kokkos::DefaultHostExecutionSpace;
    template <class St, class Sc>
    using OwnerRows = Rows<std::int64_t, St, Sc, OwnerSpace>;
    using OwnerView = impl::RowsView<std::int64_t, OwnerSpace>;

    const MoeBridge& b;
    EpWorkspace<T, Space>& ws;
    const Space& exec;
    R& router;
    E& experts;
    Obs& obs;
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
      if constexpr (std::remove_cvref_t<Obs>::enabled)
        obs(BoundaryInfo{&s, sharing, copies, name.empty() ? s.name : name}, own, values, first);
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
      TopK<T, Space> r(static_cast<std::int64_t>(x.extent(0)), router.top_k());
      router(exec, x, r);
      return r;
    }

    Out go(const In& x, const DpSlotsPtr& slots) {
      const std::int64_t n = x.rows();
      if (owners && static_cast<std::int64_t>(owners->size()) != n)
        throw LayoutError("owners", "MoeBridge::run: " + std::to_string(owners->size()) + " owners for " +
                                        std::to_string(n) + " rows; the owner column must stay aligned with the rows");
      const std::vector<std::int64_t> in_owners = owners ? *owners : std::vector<std::int64_t>{};
      std::optional<Out> out;
      switch (b.path()) {
        case BridgePath::dp_gather: {
          if (!slots) throw LayoutError("slots", "MoeBridge::run: path dp_gather needs the step's DpSlots (MoeBridge::slots)");
          plan = bridge_plan(BridgePath::dp_gather, slots->mode(), b.opts_.restore, b.shares_ != nullptr);
          out.emplace(dp_gather(x, slots));
          break;
        }
        case BridgePath::tp_moe: plan = bridge_plan(BridgePath::tp_moe); out.emplace(tp_moe(x)); break;
        case BridgePath::a2a_split:
        case BridgePath::direct: plan = bridge_plan(b.path()); out.emplace(a2a(x)); break;
      }
      if (at != plan.size()) throw LayoutError("bridge", "MoeBridge: the executor stopped before the end of its plan");
      if (owners || fault() != BridgeFault::none) conserve(n, in_owners, out->rows());
      return std::move(*out);
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
      const RowRange mine = tensor_split_range(global.rows(), widths().moe_dp, pg().coords().moe_dp_rank);
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
      const RowRange mine = tensor_split_range(x.rows(), widths().moe_dp, pg().coords().moe_dp_rank);
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

    // Rows [mine) of x through route + this rank's experts (+ its shared share): Partial<tp> rows.
    view_type moe_partial(const view_type& x, RowRange mine) {
      auto partial = impl::alloc_rows<T, Space>("relayout::moe_partial", static_cast<std::int64_t>(x.extent(0)),
                                                impl::hidden_of(x.extent(1)));
      Kokkos::deep_copy(exec, partial, T(0));
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

      const TopK<T, Space> r = route(chunk.view());
      const PlanStep& d_step = step(BridgeStep::dispatch);
      const Dispatched<T, Space> d = dispatch(chunk, r, EpOptions{traffic, owners ? &c_owners : nullptr, b.opts_.check_route});
      static_cast<void>(d_step);
      const PlanStep& e_step = step(BridgeStep::experts);
      const auto y = ws.expert_outputs(d.batch.rows(), impl::hidden_of(chunk.view().extent(1)));
      experts(exec, d.batch, y);
      if constexpr (std::remove_cvref_t<Obs>::enabled) {
        // One owner per (row, local expert): over all ranks each row appears top_k times.
        std::vector<std::int64_t> batch_owners(static_cast<std::size_t>(d.batch.rows()));
        if (owners) {
          auto so = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), d.slot_of);
          for (std::size_t i = 0; i < so.extent(0); ++i)
            for (std::size_t j = 0; j < so.extent(1); ++j)
              if (so(i, j) >= 0) batch_owners[static_cast<std::size_t>(so(i, j))] = d.tags[i];
        }
        see(e_step, RowState::replicated, router.top_k(), owners ? span_of(batch_owners) : std::span<const std::int64_t>{}, view_type());
      }
      const PlanStep& c_step = step(BridgeStep::combine);
      Rows<T, RowShard<AttnTp>, DpLocal, Space> combined = ep_combine(exec, pg(), d, y, traffic);
      const PlanStep& h_step = step(BridgeStep::shared_expert);
      if constexpr (HasSharedExpert<E, T, Space>) experts.shared(exec, chunk.view(), combined.view());
      exec.fence();
      see(c_step, RowState::replicated, 1, span_of(c_owners), combined.view());
      static_cast<void>(h_step);
      const PlanStep& g_step = step(BridgeStep::all_gather);
      Out o = all_gather(exec, pg(), combined, traffic);
      if (owners) {
        const std::int64_t full = fault() == BridgeFault::no_split ? n * A : n;
        *owners = to_vector(all_gather(pg(), OwnerRows<RowShard<AttnTp>, DpLocal>(owner_view(c_owners), full)).view());
      }
      see(g_step, RowState::replicated, group_ranks(), owners ? span_of(*owners) : std::span<const std::int64_t>{}, o.view());
      return o;
    }

    // ep_dispatch with the rows travelling as BridgeOptions::dispatch_dtype.
    Dispatched<T, Space> dispatch(const Rows<T, RowShard<AttnTp>, DpLocal, Space>& chunk, const TopK<T, Space>& r,
                                  const EpOptions& o) {
      switch (b.opts_.dispatch_dtype) {
        case DispatchDtype::bf16: return ep_dispatch<relayout::bf16>(exec, pg(), chunk, r, b.experts_, ws, o);
        case DispatchDtype::fp16: return ep_dispatch<relayout::fp16>(exec, pg(), chunk, r, b.experts_, ws, o);
        case DispatchDtype::compute: break;
      }
      return ep_dispatch(exec, pg(), chunk, r, b.experts_, ws, o);
    }

    // Row conservation: every row that entered leaves exactly once, in order. A broken invariant
    // can be local, so the ranks agree before anyone throws: every rank throws together.
    void conserve(std::int64_t n_in, const std::vector<std::int64_t>& in_owners, std::int64_t n_out) {
      const bool ok = n_out == n_in && (!owners || in_owners == *owners);
      int first_bad = ok ? pg().layout().size() : pg().rank();
      all_reduce_in_place(pg().tp(), std::span<int>(&first_bad, 1), ReduceOp::min);
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
  EpWorkspace<T, Space>* external_ws_ = nullptr;
  std::shared_ptr<const ProcessGroupsOf<C>> shares_;  // attn_cp > 1: cp_share_layout's groups
};

}  // namespace relayout
