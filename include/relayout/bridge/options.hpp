// What a MoeBridge is made with (BridgeOptions) and what one run takes beside its rows, router
// and experts (BridgeRunOptions), with the rules the programs' flags share.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <Kokkos_Core.hpp>

#include "relayout/bridge/plan.hpp"
#include "relayout/mesh/range.hpp"
#include "relayout/placement/ep_message.hpp"
#include "relayout/placement/expert_location.hpp"
#include "relayout/placement/rows_view.hpp"
#include "relayout/placement/traffic.hpp"

namespace relayout {

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

}  // namespace relayout
