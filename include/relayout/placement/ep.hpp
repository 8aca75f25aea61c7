// Expert parallelism as DeepEP shapes it: one EpBuffer per moe_ep group owns the group, the expert
// layout (redundant experts included), the memory and the low-latency capacity; dispatch returns
// an opaque handle that combine reuses. A row travels once per destination member (not once per
// top-k slot), carrying its local expert ids there and their router weights.
//
//   EpHandle h = buf.dispatch(exec, rows, route, {.mode = EpMode::low_latency});
//   auto y = buf.expert_outputs(h);   experts(exec, h.batch(), y);
//   Rows out = buf.combine(exec, h, y);   // complete rows, the dispatched order
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <source_location>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <Kokkos_Core.hpp>

#include "relayout/comm.hpp"
#include "relayout/placement/expert_location.hpp"
#include "relayout/placement/expert_location_sync.hpp"
#include "relayout/placement/expert_moves.hpp"
#include "relayout/placement/impl/ep_exchange.hpp"
#include "relayout/placement/impl/ep_messages.hpp"
#include "relayout/placement/rows.hpp"

namespace relayout {

// What an EpBuffer is made with beside its group and its routed experts.
struct EpBufferOptions {
  // The most rows one member dispatches in a low_latency call (SGLang's
  // --num-max-dispatch-tokens-per-rank, default 128): the size of each low-latency block.
  std::int64_t num_max_dispatch_tokens_per_rank = 128;
  // Redundant experts: the logical -> physical map, the same on every rank (checked at the first
  // dispatch). Null: physical = logical.
  std::shared_ptr<const ExpertLocation> expert_location{};
  ReplicaChoice replica_choice = ReplicaChoice::by_token;
};

// One dispatch's choices; all optional.
struct EpDispatchOptions {
  EpMode mode = EpMode::normal;
  DispatchDtype dtype = DispatchDtype::compute;  // the rows on the wire (weights stay compute_t<T>)
  // The step's token counts (the same on every rank): compared across moe_ep inside the exchange.
  std::span<const std::int64_t> global_num_tokens = {};
  std::int64_t first_token = 0;  // the rows' first row in its DP group (replica choice by_token)
  const std::vector<std::int64_t>* tags = nullptr;  // host tags carried with the rows (owners)
  bool check_route = true;     // ids in [0, experts) and finite weights, agreed before the exchange
  bool indexed_batch = false;  // the batch indexes the received messages (ReadsIndexedRows experts)
  TrafficLog* traffic = nullptr;  // counts the bytes this rank sends, dispatch and combine
  // This member's own reason to refuse the call (a caller's check that failed here): it travels as
  // a verdict with the counts, so every member throws together and none waits in the exchange.
  std::string_view refuse = {};
  // The refusal is of rows that disagree with the step's token counts: every member's error then
  // names global_num_tokens (LayoutError input "global_num_tokens"), not the call.
  bool refuse_counts = false;
};

template <class C, class T, class Space>
class EpBuffer;

// What dispatch returns: the experts' batch and what combine needs to send their outputs back.
// Cheap to copy; the memory it points at is not reused by another dispatch while a copy lives.
template <class T, class Space = Kokkos::DefaultExecutionSpace>
class EpHandle {
 public:
  EpHandle() = default;
  bool valid() const { return s_ != nullptr; }
  const ExpertBatch<T, Space>& batch() const { return state().batch; }
  EpMode mode() const { return state().mode; }
  DispatchDtype dtype() const { return state().dtype; }
  std::int64_t rows() const { return state().rows; }          // rows this member dispatched
  std::int64_t received() const { return state().received; }  // messages it received
  std::span<const std::int64_t> tags() const { return state().tags; }  // of the received messages
  // The tag of each batch row (a message appears once per local expert it names).
  std::vector<std::int64_t> batch_tags(const Space& exec) const {
    const auto& d = state();
    std::vector<std::int64_t> out(static_cast<std::size_t>(d.batch.rows()), 0);
    auto so = Kokkos::create_mirror_view(d.slot_of);
    Kokkos::deep_copy(exec, so, d.slot_of);
    exec.fence();
    for (std::size_t r = 0; r < so.extent(0) && r < d.tags.size(); ++r)
      for (std::size_t j = 0; j < so.extent(1); ++j)
        if (so(r, j) >= 0) out[static_cast<std::size_t>(so(r, j))] = d.tags[r];
    return out;
  }

 private:
  template <class, class, class>
  friend class EpBuffer;
  explicit EpHandle(std::shared_ptr<impl::EpState<T, Space>> s) : s_(std::move(s)) {}
  const impl::EpState<T, Space>& state() const {
    if (!s_) throw LayoutError("handle", "EpHandle: empty (it does not come from EpBuffer::dispatch)");
    return *s_;
  }
  std::shared_ptr<impl::EpState<T, Space>> s_;
};

// A dispatch in flight (EpBuffer::dispatch_start): test() polls it and lets MPI progress it. The
// rows, route and tags given at start stay alive and untouched until dispatch_finish.
template <class T, class Space = Kokkos::DefaultExecutionSpace>
class EpDispatchInFlight {
 public:
  bool test() { return request_.test(); }

 private:
  template <class, class, class>
  friend class EpBuffer;
  std::shared_ptr<impl::EpState<T, Space>> s_;
  CollectiveRequest request_;
  Kokkos::View<std::int32_t*, typename Space::memory_space> ll_recv_;  // low_latency: the blocks
  std::int64_t block_words_ = 0;                                      // low_latency: one block
  std::string problem_;  // this member's refusal (it sent nothing), thrown with the others'
  impl::OwnVerdict own_;
  std::vector<std::int64_t> tags_;
  bool has_tags_ = false, indexed_ = false;
  std::source_location site_{};
};

// A combine in flight (EpBuffer::combine_start): the handle and the expert outputs stay alive and
// untouched until combine_finish.
template <class T, class Space = Kokkos::DefaultExecutionSpace>
class EpCombineInFlight {
 public:
  bool test() { return request_.test(); }

 private:
  template <class, class, class>
  friend class EpBuffer;
  std::shared_ptr<const impl::EpState<T, Space>> s_;
  RowsView<T, Space> back_;
  int ep_ = 1;
  CollectiveRequest request_;
};

namespace impl {
// A member's verdict on its own call and why (kFine: nothing wrong).
struct Refusal {
  int verdict = kFine;
  std::string text;
};
// " (called at file:line)": the engine's call site, for the errors of a public entry point.
inline std::string called_at(const std::source_location& site) {
  std::string f = site.file_name();
  if (const auto slash = f.rfind('/'); slash != std::string::npos) f = f.substr(slash + 1);
  return " (called at " + f + ":" + std::to_string(site.line()) + ")";
}
}  // namespace impl

// One moe_ep group's expert parallelism: experts (routed, logical) split evenly over moe_ep, plus
// the redundant ones of an expert location. Every member calls dispatch and combine in the same
// order, also with zero rows; a call refused on one member is the same LayoutError on every member
// (its verdict travels with the counts), so none waits in an exchange. Not thread-safe.
template <class C, class T, class Space = Kokkos::DefaultExecutionSpace>
class EpBuffer {
 public:
  using Handle = EpHandle<T, Space>;
  using RowsIn = Rows<T, RowShard<AttnTp>, DpLocal, Space>;

  // Not collective: checks the sizes only. The expert location, if any, is agreed at the first dispatch.
  EpBuffer(const ProcessGroupsOf<C>& pg, int experts, EpBufferOptions opts = {},
           std::source_location site = std::source_location::current())
      : pg_(pg), experts_(experts), opts_(std::move(opts)) {
    impl::require_experts(experts, pg.moe_ep().size(), "EpBuffer");
    if (opts_.num_max_dispatch_tokens_per_rank < 1)
      throw LayoutError("num_max_dispatch_tokens_per_rank",
                        "EpBuffer: num_max_dispatch_tokens_per_rank = " +
                            std::to_string(opts_.num_max_dispatch_tokens_per_rank) +
                            "; a low-latency block holds at least 1 row" + impl::called_at(site));
    if (opts_.expert_location)
      if (const std::string p = location_problem(*opts_.expert_location); !p.empty())
        throw LayoutError("expert_location", "EpBuffer: " + p + impl::called_at(site));
  }

  int experts() const { return experts_; }
  int physical_experts() const { return location() ? location()->physical() : experts_; }
  int local_experts() const { return physical_experts() / pg_.moe_ep().size(); }
  int first_expert() const { return pg_.moe_ep().rank() * local_experts(); }
  std::int64_t low_latency_capacity() const { return opts_.num_max_dispatch_tokens_per_rank; }
  const std::shared_ptr<const ExpertLocation>& expert_location() const { return opts_.expert_location; }
  ReplicaChoice replica_choice() const { return opts_.replica_choice; }
  // The (token, expert) pairs this member routed since reset_expert_load, per physical expert.
  const ExpertLoad& expert_load() const { return load_; }
  void reset_expert_load() { load_ = ExpertLoad{}; }
  // How many device buffers the dispatches have allocated so far (none once their sizes fit).
  std::int64_t allocations() const {
    std::int64_t n = 0;
    for (const auto& m : mem_) n += m->allocations;
    return n;
  }
  // Bytes one low-latency block set takes (send and receive) for rows of `hidden` and top-k `k`.
  std::int64_t low_latency_bytes(int k, std::int64_t hidden, DispatchDtype dtype = DispatchDtype::compute) const {
    const std::int64_t words = impl::kLlHead + low_latency_capacity() * message(dtype, k, hidden).words();
    return 2 * std::int64_t(pg_.moe_ep().size()) * words * 4;
  }

  // Replaces the expert location (rebalancing). Collective over the TP domain: every rank passes
  // the same map; a map refused on any rank, or differing between ranks, is the same LayoutError
  // on every rank and the buffer keeps its map. The experts read the new map from the batch
  // (ExpertBatch::logical_expert) from the next dispatch on. This overload leaves the weights to
  // the engine; the next one moves them.
  void set_expert_location(const Space& exec, std::shared_ptr<const ExpertLocation> loc,
                           std::source_location site = std::source_location::current()) {
    agree_location(exec, loc, site);
    replicas_ = replica_table(exec, *loc, pg_.moe_ep().rank(), opts_.replica_choice);
    opts_.expert_location = std::move(loc);
  }
  // The same, and the engine's expert weights moved to match over moe_ep (expert_moves from the
  // current map, move_expert_weights): slot s of this member then holds the weights of
  // loc->logical_of(first_expert() + s). Refused on every rank alike before anything moves.
  template <class W>
    requires ExpertWeightsFor<W, Space>
  void set_expert_location(const Space& exec, std::shared_ptr<const ExpertLocation> loc, const W& weights,
                           std::source_location site = std::source_location::current()) {
    agree_location(exec, loc, site);
    const ExpertLocation from =
        location() ? *location() : ExpertLocation::identity(experts_, 0, pg_.moe_ep().size());
    move_expert_weights(exec, pg_.moe_ep(), expert_moves(from, *loc), weights, site);
    replicas_ = replica_table(exec, *loc, pg_.moe_ep().rank(), opts_.replica_choice);
    opts_.expert_location = std::move(loc);
  }

  // Sends each row once to every moe_ep member holding one of its top-k experts (logical ids;
  // with an expert location, mapped to a replica first), in one all_to_allv after the counts
  // (normal) or one all_to_all of fixed blocks (low_latency: more rows than the capacity on any
  // member is refused on every member). Collective over moe_ep. dispatch_start / dispatch_finish
  // are the same call in two halves, for overlap; two dispatches may be in flight at once.
  Handle dispatch(const Space& exec, const RowsIn& x, const TopK<T, Space>& route, const EpDispatchOptions& o = {},
                  std::source_location site = std::source_location::current()) {
    return dispatch_finish(exec, dispatch_start(exec, x, route, o, site));
  }
  EpDispatchInFlight<T, Space> dispatch_start(const Space& exec, const RowsIn& x, const TopK<T, Space>& route,
                                              const EpDispatchOptions& o = {},
                                              std::source_location site = std::source_location::current());
  Handle dispatch_finish(const Space& exec, EpDispatchInFlight<T, Space>&& p);

  // A rows x hidden buffer for the experts' outputs of this handle's batch (in its memory).
  RowsView<T, Space> expert_outputs(const Handle& h) {
    const auto& d = h.state();
    return d.mem->rows(d.mem->outputs, "relayout::expert_out", d.batch.rows(), d.hidden);
  }

  // Applies the router weights to the experts' outputs y (one row per batch row), sums them per
  // received row, sends each back and sums the returns: complete rows in the dispatched order, in
  // the handle's memory (valid until a later dispatch reuses it). Collective over moe_ep.
  Rows<T, RowShard<AttnTp>, DpLocal, Space> combine(const Space& exec, const Handle& h, const RowsView<T, Space>& y,
                                                    std::source_location site = std::source_location::current()) {
    return combine_finish(exec, combine_start(exec, h, y, site));
  }
  EpCombineInFlight<T, Space> combine_start(const Space& exec, const Handle& h, const RowsView<T, Space>& y,
                                            std::source_location site = std::source_location::current());
  Rows<T, RowShard<AttnTp>, DpLocal, Space> combine_finish(const Space& exec, EpCombineInFlight<T, Space>&& p);

  // Only complete rows each held by one rank are dispatched: a sentence, not "no matching call".
  template <RowsType R, class... Rest>
    requires(!std::same_as<std::remove_cvref_t<R>, RowsIn>)
  void dispatch(const Space&, const R&, const Rest&...) {
    using St = typename std::remove_cvref_t<R>::state_type;
    static_assert(std::same_as<St, RowShard<AttnTp>>,
                  "relayout: EpBuffer::dispatch sends each row once, so it needs RowShard<AttnTp> rows (each row "
                  "held by one rank): split Replicated<AttnTp> rows with split_rows first; Partial rows must be "
                  "summed (all_reduce) before any expert sees them");
    static_assert(!std::same_as<St, RowShard<AttnTp>>,
                  "relayout: EpBuffer<C, T, Space>::dispatch takes rows of the buffer's own T and Space");
  }

 private:
  const ExpertLocation* location() const { return opts_.expert_location.get(); }
  // Every rank of the TP domain holds a map this buffer takes, the same one; else the same
  // LayoutError on every rank.
  void agree_location(const Space& exec, const std::shared_ptr<const ExpertLocation>& loc, std::source_location site) {
    const auto& tp = pg_.tp();
    const std::string problem = loc ? location_problem(*loc) : std::string("the expert location is null");
    int first_bad = problem.empty() ? tp.size() : tp.rank();
    all_reduce_in_place(exec, tp, std::span<int>(&first_bad, 1), ReduceOp::min, site);
    if (first_bad < tp.size())
      throw LayoutError("expert_location", "EpBuffer::set_expert_location: " +
                                               (problem.empty() ? "rank " + std::to_string(first_bad) +
                                                                      " of the TP domain refused its expert location"
                                                                : problem) +
                                               "; the buffer keeps its current map" + impl::called_at(site));
    require_same_expert_location(exec, tp, *loc);
  }
  static EpMessage message(DispatchDtype dtype, int k, std::int64_t hidden) {
    switch (dtype) {
      case DispatchDtype::bf16: return EpMessage::template of<compute_t<T>, relayout::bf16>(k, hidden);
      case DispatchDtype::fp16: return EpMessage::template of<compute_t<T>, relayout::fp16>(k, hidden);
      case DispatchDtype::fp8: return EpMessage::template of_fp8<compute_t<T>>(k, hidden);
      case DispatchDtype::compute: break;
    }
    return EpMessage::template of<compute_t<T>, T>(k, hidden);
  }
  std::string location_problem(const ExpertLocation& loc) const {
    const int ep = pg_.moe_ep().size();
    if (loc.routed() != experts_ || loc.ep() != ep)
      return "the expert location maps " + std::to_string(loc.routed()) + " routed experts over moe_ep = " +
             std::to_string(loc.ep()) + "; the buffer routes " + std::to_string(experts_) +
             " experts over moe_ep = " + std::to_string(ep);
    return {};
  }
  // Memory no live handle points at (a new one when every set is in use).
  std::shared_ptr<impl::EpBuffers<T, Space>> free_memory() {
    for (const auto& m : mem_)
      if (m.use_count() == 1) return m;
    mem_.push_back(std::make_shared<impl::EpBuffers<T, Space>>());
    return mem_.back();
  }
  TopK<T, Space> physical_route(const Space& exec, const TopK<T, Space>& route, const EpDispatchOptions& o,
                                impl::Refusal& refusal);
  std::shared_ptr<impl::EpState<T, Space>> new_state(const RowsIn& x, int k, const EpDispatchOptions& o,
                                                     std::uint32_t digest);
  impl::Refusal call_problem(const Space& exec, const RowsIn& x, const TopK<T, Space>& route,
                           const EpDispatchOptions& o) const;

  const ProcessGroupsOf<C>& pg_;
  int experts_;
  EpBufferOptions opts_;
  std::vector<std::shared_ptr<impl::EpBuffers<T, Space>>> mem_;
  std::optional<ReplicaTable<typename Space::memory_space>> replicas_;
  ExpertLoad load_;
};

}  // namespace relayout

#include "relayout/placement/impl/ep_buffer.hpp"
