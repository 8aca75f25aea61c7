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
#include "relayout/bridge/impl/run.hpp"
#include "relayout/bridge/options.hpp"
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
template <class C, class T, class Space>
BridgeFault injected_fault(const MoeBridge<C, T, Space>& bridge);
}  // namespace testing

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
  // Device buffers the runs have allocated so far (EP and expert grouping): none once sizes fit.
  std::int64_t allocations() const { return (ep_ ? ep_->allocations() : 0) + scratch_.allocations(); }
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
  // The same, and the engine's expert weights moved over moe_ep to match (EpBuffer's overload).
  template <class W>
    requires ExpertWeightsFor<W, Space>
  void set_expert_location(const Space& exec, std::shared_ptr<const ExpertLocation> loc, const W& weights,
                           std::source_location site = std::source_location::current()) {
    if (!ep_)
      throw LayoutError("expert_location", "MoeBridge::set_expert_location: an expert location needs a path that "
                                           "dispatches rows (a2a_split or direct); this layout takes path " +
                                               std::string(to_string(path())) + impl::called_at(site));
    ep_->set_expert_location(exec, std::move(loc), weights, site);
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
      impl::BridgeRun<C, T, Space> run(*this, exec, impl::RouterRef<T, Space>(router), impl::ExpertsRef<T, Space>(experts), opts, site);
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
      impl::BridgeRun<C, T, Space> run(*this, exec, impl::RouterRef<T, Space>(router), impl::ExpertsRef<T, Space>(experts), opts, site);
      return run.go_scattered(x);
    }
  }
  // The rows must be the attention's complete output for this DP group: a sentence, not "cannot
  // convert", for any other placement.
  template <RowsType X, class... Rest>
    requires(!std::same_as<std::remove_cvref_t<X>, In> && !std::same_as<std::remove_cvref_t<X>, ScatteredIn>)
  void run(const Space&, const X&, Rest&&...) {
    using St = typename std::remove_cvref_t<X>::state_type;
    using U = typename std::remove_cvref_t<X>::value_type;
    if constexpr (!std::is_same_v<U, T>) {
      impl::require_same_element<T, U>();
    } else {
      static_assert(St::state != RowState::partial,
                    "relayout: MoeBridge::run needs complete rows, Replicated<AttnTp>, and these are Partial sums (the "
                    "attention's wo_b output before its all-reduce): call all_reduce(exec, pg, rows) first");
      static_assert(St::state == RowState::partial,
                    "relayout: MoeBridge::run takes this DP group's complete rows as Rows<T, Replicated<AttnTp>, "
                    "DpLocal, Space> of the bridge's T and Space (the attention all-reduce's output), or this "
                    "member's chunk of them as Rows<T, RowShard<AttnTp>, DpLocal, Space> (paths a2a_split, "
                    "direct and tp_moe): dp_scatter DpGlobal rows first");
    }
  }

 private:

  const ProcessGroupsOf<C>& pg_;
  int experts_;
  BridgeOptions opts_;
  std::optional<EpBuffer<C, T, Space>> ep_;  // paths a2a_split and direct
  MoeScratch<T, Space> scratch_;              // paths dp_gather and tp_moe: local_experts' memory
  BridgeFault fault_ = BridgeFault::none;     // wired by testing::inject_fault only
  std::shared_ptr<const ProcessGroupsOf<C>> shares_;  // attn_cp > 1: cp_share_layout's groups
  template <class, class, class>
  friend class impl::BridgeRun;
  template <class C2, class T2, class S2>
  friend void testing::inject_fault(MoeBridge<C2, T2, S2>&, BridgeFault);
  template <class C2, class T2, class S2>
  friend BridgeFault testing::injected_fault(const MoeBridge<C2, T2, S2>&);
};

}  // namespace relayout

#include "relayout/bridge/impl/a2a.hpp"
#include "relayout/bridge/impl/dp_gather.hpp"
#include "relayout/bridge/impl/run_steps.hpp"
#include "relayout/bridge/impl/tp_moe.hpp"
#include "relayout/bridge/impl/two_batch.hpp"

#if defined(RELAYOUT_PREBUILT_INSTANCES)
#include "relayout/instances.hpp"  // linked relayout::instances: its types are compiled there
#endif
