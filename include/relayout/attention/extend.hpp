// Extend attention over the paged KV cache: new rows (decode rows, prompt chunks, speculative
// verify rows, mixed in one batch) each attending its request's cached keys up to its own position,
// with the sliding window. ExtendRows is what an attention kernel gets for one layer (on the
// device); PagedAttention is ours, on kernels::PagedKvCache, and an engine may pass its own kernel
// of the same shape to CpAttention instead.
#pragma once

#include <Kokkos_Core.hpp>
#include <concepts>
#include <cstdint>
#include <string>
#include <vector>

#include "relayout/attention/kv_ledger.hpp"
#include "relayout/kernels/attention.hpp"
#include "relayout/kernels/kv_cache.hpp"
#include "relayout/placement/rows_view.hpp"

namespace relayout {

// The rows an attention kernel computes in one layer: query row b belongs to request slot
// slots(b) and attends the keys held here of that slot numbered [first(b), limits(b)) in position
// order. `whole`: every key of the requests is here (no CP), so first(b) is just the window start.
template <class MemSpace>
struct ExtendRows {
  Kokkos::View<const int*, MemSpace> slots, limits, first;
  bool whole = true;
  bool causal = false;  // some row sees fewer than all of its slot's keys here (limits matter)

  std::int64_t rows() const { return std::int64_t(slots.extent(0)); }
};

namespace impl {
// A host vector's copy on exec's memory, copied on exec (fenced: the vector may be a temporary).
template <class Exec>
Kokkos::View<int*, typename Exec::memory_space> to_device(const Exec& exec, const std::vector<int>& v, const char* label) {
  Kokkos::View<int*, typename Exec::memory_space> d(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)),
                                                    v.size());
  Kokkos::deep_copy(exec, d, Kokkos::View<const int*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(v.data(), v.size()));
  exec.fence();
  return d;
}
}  // namespace impl

// The device side of a step's plan: the rows attended here, copied on the caller's instance.
template <class Exec>
  requires Kokkos::is_execution_space<Exec>::value
ExtendRows<typename Exec::memory_space> extend_rows(const Exec& exec, const ExtendPlan& plan) {
  return {impl::to_device(exec, plan.attend_slot, "relayout::extend_slots"),
          impl::to_device(exec, plan.attend_limit, "relayout::extend_limits"),
          impl::to_device(exec, plan.attend_first, "relayout::extend_first"), plan.cp == 1, plan.causal};
}

// A kernel CpAttention can run: out(b) = softmax(q(b) K^T) K over the keys rows describes (K = V,
// one shared KV head), normalised, and per head the log-sum-exp of the scaled scores in lse
// (rows x heads, compute_t<T>: fp32 for bf16 rows; -inf for a row with no key). With rows.whole
// lse may be left unwritten.
template <class K, class T, class Exec>
concept ExtendKernel = requires(const K& k, const Exec& exec, const RowsView<T, Exec>& q,
                                const ExtendRows<typename Exec::memory_space>& rows, const RowsView<T, Exec>& out,
                                const RowsView<compute_t<T>, Exec>& lse) {
  { k(exec, q, rows, out, lse) };
};

// Our kernel: the rows through kernels::PagedKvCache's block tables, one layer. The cache holds
// KvT (T by default): the rows' own type, or bf16 under fp32 rows (a bf16 cache halves the bytes
// decode reads; each key is widened to fp32 as it is read, q, out, lse and the arithmetic stay
// fp32). Decode and extend rows, causal or not, under CP or not, all run on the decode kernels,
// which take both (kernels::decode_scalars_v); any other pair does not compile.
template <class T, class MemSpace, class KvT = T>
struct PagedAttention {
  static_assert(kernels::decode_scalars_v<T, KvT, T>,
                "relayout::PagedAttention: the cache must hold the rows' scalar type, or bf16 under float rows");
  const kernels::PagedKvCache<KvT, MemSpace>* cache = nullptr;
  int layer = 0;
  kernels::AttentionParams params;

  template <class Exec>
  void operator()(const Exec& exec, const RowsView<T, Exec>& q, const ExtendRows<MemSpace>& rows,
                  const RowsView<T, Exec>& out, const RowsView<compute_t<T>, Exec>& lse) const {
    const auto kv = rows.causal ? causal_view(exec, rows) : cache->view(layer, rows.slots);
    if (rows.whole) return kernels::attention_decode(exec, q, kv, out, params);
    kernels::AttentionParams p = params;
    p.window = 0;  // given per row by rows.first
    kernels::attention_decode_partial(exec, q, kv, rows.first, out, lse, p);
  }

  // Query row b reads slot slots(b) through a block table of its own (a copy of the slot's) with
  // length limits(b), so the decode kernel stops at the row's own position.
  template <class Exec>
  kernels::PagedKv<KvT, MemSpace> causal_view(const Exec& exec, const ExtendRows<MemSpace>& rows) const {
    const auto all = cache->view(layer, rows.slots);
    const std::int64_t n = rows.rows(), B = std::int64_t(all.block_table.extent(1));
    // Every entry is written below, on exec.
    Kokkos::View<int**, MemSpace> table(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("relayout::extend_table")), n, B);
    Kokkos::View<int*, MemSpace> own(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("relayout::extend_rows")), n);
    const auto src = all.block_table;
    const auto slots = rows.slots;
    Kokkos::parallel_for(
        "relayout::extend_table", Kokkos::RangePolicy<Exec>(exec, 0, n), KOKKOS_LAMBDA(const std::int64_t b) {
          own(b) = int(b);
          for (std::int64_t i = 0; i < B; ++i) table(b, i) = src(slots(b), i);
        });
    return {all.pool, table, rows.limits, own, all.block_size};
  }
};

// Extend attention on one rank (no CP): q holds the new rows of a step in plan order, their kv
// already appended (append_extend); out gets each row's attention over its request's keys up to
// its own position. The cache holds T, or bf16 under float rows (PagedAttention).
template <class Exec, class T, class KvT, class MemSpace>
void attention_extend(const Exec& exec, const kernels::PagedKvCache<KvT, MemSpace>& cache, int layer,
                      const ExtendRows<MemSpace>& rows, const RowsView<T, Exec>& q, const RowsView<T, Exec>& out,
                      const kernels::AttentionParams& params) {
  if (!rows.whole)
    throw LayoutError("rows", "attention_extend: the rows span several CP ranks; run them through CpAttention::extend");
  const RowsView<compute_t<T>, Exec> no_lse;
  PagedAttention<T, MemSpace, KvT>{&cache, layer, params}(exec, q, rows, out, no_lse);
}

// This rank's new kv rows (plan order) into its cache for `layer`: rows of the cache's scalar type,
// or float rows into a bf16 cache, each value rounded to the nearest bf16 (ties to even) as it is
// stored (PagedKvCache::append).
template <class Exec, class KvT, class MemSpace, class KvRows>
void append_extend(const Exec& exec, kernels::PagedKvCache<KvT, MemSpace>& cache, int layer, const ExtendPlan& plan,
                   const KvRows& kv) {
  if (std::int64_t(kv.extent(0)) != plan.rows())
    throw LayoutError("kv", "append_extend: " + std::to_string(kv.extent(0)) + " kv rows for the " +
                                std::to_string(plan.rows()) + " new rows held here");
  for (std::size_t i = 0; i < plan.append_slot.size(); ++i)
    cache.append(exec, layer, plan.append_slot[i],
                 Kokkos::subview(kv, std::pair<int, int>(plan.append_cu[i], plan.append_cu[i + 1]), Kokkos::ALL));
}

}  // namespace relayout
