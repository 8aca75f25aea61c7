// The experts contract: what the engine's router fills (TopK), what its experts receive
// (ExpertBatch: rows grouped by local expert), the concepts its router and experts satisfy, and
// the memory they are grouped in (MoeScratch). The grouping every MoE path runs is in
// local_experts.hpp, included below. No communication: the kernels, the EP dispatch and the
// bridge all speak it.
#pragma once

#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <Kokkos_Core.hpp>

#include "relayout/comm/scalar.hpp"
#include "relayout/mesh/error.hpp"
#include "relayout/mesh/names.hpp"
#include "relayout/placement/rows_view.hpp"

namespace relayout {

// The router's decision for each row: the top-k global expert ids and their weights. The weights
// are compute_t<T>: fp32 for bf16 or fp16 rows, as a bf16 model's router keeps them.
template <class T, class Space = Kokkos::DefaultExecutionSpace>
struct TopK {
  using weight_type = compute_t<T>;
  using ids_view = Kokkos::View<int**, Kokkos::LayoutRight, typename Space::memory_space>;
  using weights_view = Kokkos::View<weight_type**, Kokkos::LayoutRight, typename Space::memory_space>;
  ids_view ids;          // rows x k, global expert ids in [0, experts)
  weights_view weights;  // rows x k

  TopK() = default;
  TopK(ids_view i, weights_view w) : ids(std::move(i)), weights(std::move(w)) {}
  TopK(std::int64_t rows, int k)
      : ids(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("relayout::topk_ids")),
            static_cast<std::size_t>(rows), static_cast<std::size_t>(k)),
        weights(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("relayout::topk_weights")),
                static_cast<std::size_t>(rows), static_cast<std::size_t>(k)) {}
  std::int64_t rows() const { return static_cast<std::int64_t>(ids.extent(0)); }
  int k() const { return static_cast<int>(ids.extent(1)); }
};

// The rows one rank's experts must process, grouped by local expert: local expert e (global id
// first_expert + e) gets rows [offset(e), offset(e) + count(e)) of x. A row routed to two local
// experts appears in both groups. The outputs the engine writes are unweighted: relayout applies
// the router weights and sums per row.
//
// An indexed batch (indexed true; only handed to experts that declare reads_indexed_rows, below)
// leaves the rows where they were: batch row i is row index(i) of `source`, rows source_ld scalars
// apart, and x has no rows (0 x hidden: its columns still say the width). This is how a fused MoE
// kernel reads its tokens (a GEMM that reads its A rows through an index): no copy of each row
// once per expert that takes it.
template <class T, class Space = Kokkos::DefaultExecutionSpace>
struct ExpertBatch {
  RowsView<T, Space> x;
  std::vector<std::int64_t> offsets;  // on the host, experts() + 1 entries
  int first_expert = 0;
  bool indexed = false;
  const T* source = nullptr;
  std::int64_t source_ld = 0;
  Kokkos::View<const int*, typename Space::memory_space> index{};  // rows() entries when indexed
  // The logical expert of each group (redundant experts: physical first_expert + e holds logical
  // logical[e]); empty: group e is expert first_expert + e.
  std::vector<int> logical;

  int experts() const { return static_cast<int>(offsets.size()) - 1; }
  std::int64_t rows() const { return offsets.empty() ? 0 : offsets.back(); }
  std::int64_t offset(int e) const { return offsets[static_cast<std::size_t>(e)]; }
  std::int64_t count(int e) const { return offset(e + 1) - offset(e); }
  // The model's expert whose weights group e takes.
  int logical_expert(int e) const { return logical.empty() ? first_expert + e : logical[static_cast<std::size_t>(e)]; }
  // The rows of local expert e (a view, no copy); an indexed batch has none of its own.
  RowsView<T, Space> rows_of(int e) const {
    if (indexed)
      throw LayoutError("batch", "ExpertBatch::rows_of: an indexed batch holds no rows; local expert " +
                                     std::to_string(e) + "'s are rows index(offset(e) ..) of source");
    return Kokkos::subview(x, Kokkos::make_pair(offset(e), offset(e) + count(e)), Kokkos::ALL);
  }
};

// Experts that read an indexed ExpertBatch say so with `static constexpr bool reads_indexed_rows =
// true;`; local_experts and the bridge then group their rows by index instead of copying them.
template <class E>
concept ReadsIndexedRows = requires { requires std::remove_cvref_t<E>::reads_indexed_rows; };

// The engine's experts: y(i, :) = expert (first_expert + e)(x(i, :)) for every row i of group e,
// the whole expert's output or this rank's moe_tp share of it (its partials are then summed by the
// bridge's plan). Called on every rank, also with zero rows.
template <class E, class T, class Space>
concept ExpertsFor = requires(E& experts, const Space& exec, const ExpertBatch<T, Space>& batch,
                              const RowsView<T, Space>& y) {
  experts(exec, batch, y);
};

// The engine's router: fills out.ids / out.weights (rows x top_k()) for the rows x.
template <class R, class T, class Space>
concept RouterFor = requires(R& r, const Space& exec, const RowsView<T, Space>& x, TopK<T, Space>& out) {
  { r.top_k() } -> std::convertible_to<int>;
  r(exec, x, out);
};

// An engine's experts may have a shared expert: shared(exec, x, y) adds its output for rows x to y.
// On paths a2a_split and direct it is called on every rank with that rank's own rows (the whole
// shared expert); on dp_gather and tp_moe only on moe_ep rank 0 of each MoE replica, and the
// engine adds its moe_tp share there (the bridge sums the partials over tp).
template <class E, class T, class Space>
concept HasSharedExpert = requires(E& e, const Space& exec, const RowsView<T, Space>& x,
                                   const RowsView<T, Space>& y) { e.shared(exec, x, y); };

// Where local_experts wants each batch row's output: added to row row(s) of its out, weighted by
// weight(s) (the router's weight of that row for that expert). One entry per batch row.
template <class T, class Space = Kokkos::DefaultExecutionSpace>
struct ExpertDestinations {
  Kokkos::View<const std::int64_t*, typename Space::memory_space> row;
  Kokkos::View<const compute_t<T>*, typename Space::memory_space> weight;
};

// Experts that can add their weighted outputs straight into the rows they came from:
// combine_into(exec, batch, dest, out) does out(dest.row(s)) += dest.weight(s) * expert(x(s)) for
// every batch row s, one expert after the other. Each expert's output is then used while it is
// still in cache instead of written whole and read back: at 1024 rows, top-4 and hidden 512 the
// outputs are 8 MiB a layer. local_experts (paths dp_gather and tp_moe) uses it for float and double
// rows when no row names one of its experts twice; the sum then runs in expert order instead of k
// order (both deterministic). Experts without it get combine_experts.
template <class E, class T, class Space>
concept CombinesIntoRows = requires(E& e, const Space& exec, const ExpertBatch<T, Space>& batch,
                                    const ExpertDestinations<T, Space>& dest, const RowsView<T, Space>& out) {
  e.combine_into(exec, batch, dest, out);
};

namespace impl {

// The memory behind the expert grouping, local_experts and EpBuffer's dispatch and combine, kept between
// calls. Every buffer only grows: a call whose sizes fit what is there allocates nothing.
template <class T, class Space>
struct EpBuffers {
  using Mem = typename Space::memory_space;
  using Index2 = Kokkos::View<std::int64_t**, Kokkos::LayoutRight, Mem>;
  using Words = Kokkos::View<std::int32_t*, Mem>;
  Kokkos::View<std::int64_t*, Mem> starts;
  typename Kokkos::View<std::int64_t*, Mem>::HostMirror host_starts;
  Index2 send_pos, slot_of;
  Words send, recv, ll_send, ll_recv, ll_heads, batch_index;
  RowsView<T, Space> batch, outputs, reduced, back, combined;
  std::int64_t allocations = 0;

  // The first n0 rows of buf (n0 x n1), reallocated only when it is too small or n1 differs.
  template <class V>
  V rows(V& buf, const char* label, std::int64_t n0, std::int64_t n1) {
    if (static_cast<std::int64_t>(buf.extent(0)) < n0 || static_cast<std::int64_t>(buf.extent(1)) != n1) {
      buf = V(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)),
              static_cast<std::size_t>(n0 + n0 / 8), static_cast<std::size_t>(n1));
      ++allocations;
    }
    return Kokkos::subview(buf, Kokkos::make_pair(std::int64_t(0), n0), Kokkos::ALL);
  }
  template <class V>
  V flat(V& buf, const char* label, std::int64_t n) {
    if (static_cast<std::int64_t>(buf.extent(0)) < n) {
      buf = V(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), static_cast<std::size_t>(n + n / 8));
      ++allocations;
    }
    return Kokkos::subview(buf, Kokkos::make_pair(std::int64_t(0), n));
  }
  // Offsets of a bucket scan: on the execution space and its host copy (buckets + 1 entries).
  void bucket_starts(std::int64_t buckets) {
    if (static_cast<std::int64_t>(starts.extent(0)) < buckets + 1) {
      starts = Kokkos::View<std::int64_t*, Mem>(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("relayout::ep_starts")),
                                                static_cast<std::size_t>(buckets + 1));
      host_starts = Kokkos::create_mirror_view(starts);
      ++allocations;
    }
  }
};

}  // namespace impl

// Memory an engine keeps for local_experts and group_by_expert, so that calls after the first
// allocate nothing once their sizes fit (buffers grow, never shrink). The batch a call returns
// lives in it until the next call with the same scratch. One per concurrent caller.
template <class T, class Space = Kokkos::DefaultExecutionSpace>
class MoeScratch {
 public:
  // How many buffers it has allocated so far.
  std::int64_t allocations() const { return buffers_.allocations; }
  // A rows x hidden buffer for the experts' outputs, reused across calls.
  RowsView<T, Space> expert_outputs(std::int64_t rows, std::int64_t hidden) {
    return buffers_.rows(buffers_.outputs, "relayout::expert_out", rows, hidden);
  }
  impl::EpBuffers<T, Space>& buffers() { return buffers_; }

 private:
  impl::EpBuffers<T, Space> buffers_;
};

}  // namespace relayout

#include "relayout/placement/local_experts.hpp"  // the grouping and local_experts over this contract
