// The attention side of the layout beside MoeBridge: under attention context parallelism the KV
// all-gather of the prefill (into the group's order, with each query's position and cu_seqlens),
// decode / extend rows split by position over attn_cp (query all-gather, partial attention on each
// CP rank, partials back, log-sum-exp merge), and the attention-TP all-reduce as the typed
// transition. Generic over the element type and the attention kernel (ours, or the engine's);
// every collective runs on the caller's execution-space instance; the caller's rows are only read.
// Its steps are listed by attention_plan (plan.hpp), which `relayout explain` prints. See docs/cp.md.
#pragma once

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <source_location>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "relayout/attention/cp_share.hpp"
#include "relayout/attention/extend.hpp"
#include "relayout/attention/kv_ledger.hpp"
#include "relayout/attention/request_table.hpp"
#include "relayout/attention/plan.hpp"
#include "relayout/comm.hpp"
#include "relayout/kernels/attention.hpp"
#include "relayout/placement/rows.hpp"
#include "relayout/placement/traffic.hpp"
#include "relayout/placement/transitions.hpp"

namespace relayout {

// A prefill's keys on one rank: the group's cu_seqlens, the batch row of each of this rank's
// query rows (its own key: causality and the window go by it) and, under CP, where the rows the
// KV all-gather leaves (CP rank after CP rank) belong in the group's order.
template <class MemSpace>
struct PrefillKeys {
  Kokkos::View<const int*, MemSpace> cu_seqlens, positions, order;
  std::vector<int> counts;  // rows of each CP rank
};

// A prefill kernel: out = attention of q (this rank's rows) against the group's kv (group order),
// query row i being the token whose own key is kv row positions(i).
template <class K, class T, class Exec>
concept PrefillKernel = requires(const K& k, const Exec& exec, const RowsView<T, Exec>& q, const RowsView<T, Exec>& kv,
                                 const Kokkos::View<const int*, typename Exec::memory_space>& idx, const RowsView<T, Exec>& out) {
  { k(exec, q, kv, idx, idx, out) };
};

// Ours: kernels::attention_prefill with positions.
struct CausalPrefill {
  kernels::AttentionParams params;
  template <class Exec, class Q, class KV, class Cu, class Pos, class O>
  void operator()(const Exec& exec, const Q& q, const KV& kv, const Cu& cu, const Pos& pos, const O& out) const {
    kernels::attention_prefill(exec, q, kv, cu, pos, out, params);
  }
};

template <Communicator C, class T, class ExecSpace = Kokkos::DefaultExecutionSpace>
class CpAttention {
 public:
  using View = RowsView<T, ExecSpace>;
  using LseView = RowsView<compute_t<T>, ExecSpace>;  // per-head log-sum-exps: fp32 for bf16 rows
  using memory_space = typename ExecSpace::memory_space;
  using Site = std::source_location;

  // `log`, when given, counts the bytes of every collective (TrafficLog's convention).
  explicit CpAttention(const ProcessGroupsOf<C>& pg, TrafficLog* log = nullptr) : pg_(pg), log_(log) {}

  const ProcessGroupsOf<C>& groups() const { return pg_; }
  int cp() const { return pg_.layout().widths().attn_cp; }
  int cp_rank() const { return pg_.coords().attn_cp_rank; }
  CpShare share() const { return CpShare::of(pg_.layout(), cp_rank()); }
  std::span<const AttentionPlanStep> plan(AttentionPhase phase) const {
    return attention_plan(phase, cp() > 1, pg_.layout().widths().attn_tp > 1);
  }
  // An empty request table of `slots` slots for this CP rank, telling `hook` (the KV store) of
  // every join, leave and rollback (continuous batching).
  template <KvStoreHook Hook>
  RequestTable<Hook> request_table(int slots, Hook hook) const {
    return RequestTable<Hook>(slots, cp(), cp_rank(), std::move(hook));
  }

  // ---- prefill

  // This rank's keys for a prefill of `batch` (its DP group's requests), copied on exec.
  PrefillKeys<memory_space> prefill_keys(const ExecSpace& exec, const CpBatch& batch) const {
    if (batch.cp() != cp())
      throw LayoutError("batch", "CpAttention::prefill_keys: the batch is split over " + std::to_string(batch.cp()) +
                                     " CP ranks, the layout has attn_cp = " + std::to_string(cp()));
    return {impl::to_device(exec, batch.cu_seqlens(), "relayout::cu_seqlens"),
            impl::to_device(exec, batch.rows_of(cp_rank()), "relayout::positions"),
            impl::to_device(exec, batch.order(), "relayout::kv_order"), batch.counts()};
  }

  // The group's kv rows in batch order: under CP every CP rank's rows all-gathered over attn_cp
  // and put in place; without CP `kv` itself.
  View gather_kv(const ExecSpace& exec, const PrefillKeys<memory_space>& keys, const View& kv, Site site = Site::current()) {
    if (cp() == 1) return kv;
    const std::size_t D = kv.extent(1), total = keys.order.extent(0);
    if (kv.extent(0) != std::size_t(keys.counts[std::size_t(cp_rank())]))
      throw LayoutError("kv", "CpAttention::gather_kv: " + std::to_string(kv.extent(0)) + " kv rows; this CP rank holds " +
                                  std::to_string(keys.counts[std::size_t(cp_rank())]) + " tokens of the batch");
    const View cat = buffer("relayout::kv_cp", total, D), all = buffer("relayout::kv_group", total, D);
    std::vector<int> counts;
    for (int c : keys.counts) counts.push_back(c * int(D));
    gatherv(exec, kv, cat, counts, site);
    const auto order = keys.order;
    Kokkos::parallel_for(
        "relayout::kv_order", Kokkos::RangePolicy<ExecSpace>(exec, 0, std::int64_t(total)),
        KOKKOS_LAMBDA(const std::int64_t j) {
          for (std::size_t f = 0; f < D; ++f) all(order(j), f) = cat(j, f);
        });
    return all;
  }

  // The prefill's attention of this rank's rows: the KV all-gather (under CP), then `kernel`.
  template <class Kernel>
    requires PrefillKernel<Kernel, T, ExecSpace>
  void prefill(const ExecSpace& exec, const PrefillKeys<memory_space>& keys, const View& q, const View& kv,
               const View& out, const Kernel& kernel, Site site = Site::current()) {
    const View group = gather_kv(exec, keys, kv, site);
    kernel(exec, q, group, keys.cu_seqlens, keys.positions, out);
  }
  void prefill(const ExecSpace& exec, const PrefillKeys<memory_space>& keys, const View& q, const View& kv,
               const View& out, const kernels::AttentionParams& params, Site site = Site::current()) {
    prefill(exec, keys, q, kv, out, CausalPrefill{params}, site);
  }

  // ---- decode and extend

  // The attention of one step's new rows (plan: RequestTable::extend; q: this rank's rows' queries,
  // plan order; their kv already in the cache the kernel reads). Under CP every CP rank attends
  // every row of the group over the keys it holds and each row's partials are merged on its CP
  // rank. out: this rank's rows; q and out hold heads x head_dim columns (this rank's heads).
  template <class Kernel>
    requires ExtendKernel<Kernel, T, ExecSpace>
  void extend(const ExecSpace& exec, const ExtendPlan& plan, const ExtendRows<memory_space>& rows, const View& q,
              const View& out, int head_dim, const Kernel& kernel, Site site = Site::current()) {
    check_extend(plan, rows, q, out, head_dim);
    const std::size_t HD = q.extent(1), n = q.extent(0);
    if (plan.cp == 1) return kernel(exec, q, rows, out, LseView());
    const std::size_t heads = HD / std::size_t(head_dim), N = std::size_t(rows.rows());
    // Every buffer is written whole (the collectives, the kernel) before it is read.
    const View all_q = buffer("relayout::q_cp", N, HD), part = buffer("relayout::attn_partial", N, HD),
               parts = buffer("relayout::attn_parts", std::size_t(plan.cp) * n, HD);
    const LseView lse = buffer<LseView>("relayout::attn_lse", N, heads),
                  lses = buffer<LseView>("relayout::attn_lses", std::size_t(plan.cp) * n, heads);
    std::vector<int> q_counts, o_recv, l_send, l_recv;
    for (int c : plan.counts) {
      q_counts.push_back(c * int(HD));
      l_send.push_back(c * int(heads));
      o_recv.push_back(int(n * HD));
      l_recv.push_back(int(n * heads));
    }
    gatherv(exec, q, all_q, q_counts, site);
    kernel(exec, all_q, rows, part, lse);
    to_allv(exec, part, q_counts, parts, o_recv, site);
    to_allv(exec, lse, l_send, lses, l_recv, site);
    kernels::attention_merge(exec, parts, lses, out);
  }
  // With our kernel on a paged cache of T, or of bf16 under float rows (PagedAttention): the
  // partials stay T, the lse compute_t<T>.
  template <class KvT>
  void extend(const ExecSpace& exec, const ExtendPlan& plan, const ExtendRows<memory_space>& rows, const View& q,
              const View& out, const kernels::PagedKvCache<KvT, memory_space>& cache, int layer,
              const kernels::AttentionParams& params, Site site = Site::current()) {
    static_assert(kernels::decode_scalars_v<T, KvT, T>,
                  "relayout::CpAttention::extend: the cache must hold the rows' scalar type, or bf16 under float rows");
    extend(exec, plan, rows, q, out, params.head_dim, PagedAttention<T, memory_space, KvT>{&cache, layer, params}, site);
  }

  // ---- attention TP

  // The wo_b partial sums over attn_tp, completed: the typed transition, on `exec`. The rows are
  // handed over (the sum is written into their storage).
  template <class Sc>
  Rows<T, Replicated<AttnTp>, Sc, ExecSpace> all_reduce(const ExecSpace& exec, Rows<T, Partial<AttnTp>, Sc, ExecSpace>&& x) {
    return relayout::all_reduce(exec, pg_, std::move(x), log_);
  }

 private:
  // A buffer left uninitialised (no fill on a default instance): its users write it whole.
  template <class V = View>
  static V buffer(const char* label, std::size_t n, std::size_t cols) {
    return V(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), n, cols);
  }
  void check_extend(const ExtendPlan& plan, const ExtendRows<memory_space>& rows, const View& q, const View& out,
                    int head_dim) const {
    if (head_dim < 1 || q.extent(1) % std::size_t(head_dim) != 0 || out.extent(1) != q.extent(1))
      throw LayoutError("q", "CpAttention::extend: q (" + std::to_string(q.extent(1)) + " columns) and out (" +
                                 std::to_string(out.extent(1)) + ") must both hold heads x head_dim " +
                                 std::to_string(head_dim) + " columns");
    if (plan.cp != cp())
      throw LayoutError("plan", "CpAttention::extend: the plan is for attn_cp " + std::to_string(plan.cp) +
                                    ", the layout has " + std::to_string(cp()));
    if (std::int64_t(q.extent(0)) != plan.rows() || out.extent(0) != q.extent(0))
      throw LayoutError("q", "CpAttention::extend: " + std::to_string(q.extent(0)) + " query rows and " +
                                 std::to_string(out.extent(0)) + " output rows for the " + std::to_string(plan.rows()) +
                                 " new rows held here");
    if (rows.rows() != std::int64_t(plan.attend_slot.size()))
      throw LayoutError("rows", "CpAttention::extend: the device rows are not the plan's (" + std::to_string(rows.rows()) +
                                    " against " + std::to_string(plan.attend_slot.size()) + ")");
  }
  template <class S, class R>
  void gatherv(const ExecSpace& exec, const S& send, const R& recv, const std::vector<int>& counts, Site site) {
    const auto& comm = pg_.comm(GroupKind::attn_cp);
    if (log_)
      log_->add(TrafficOp::all_gatherv, GroupKind::attn_cp,
                std::int64_t(recv.size() * sizeof(typename R::non_const_value_type)));
    relayout::all_gatherv(exec, comm, send, recv, counts, site);
  }
  template <class S, class R>
  void to_allv(const ExecSpace& exec, const S& send, const std::vector<int>& sc, const R& recv, const std::vector<int>& rc,
               Site site) {
    const auto& comm = pg_.comm(GroupKind::attn_cp);
    if (log_)
      log_->add(TrafficOp::all_to_allv, GroupKind::attn_cp,
                std::int64_t(send.size() * sizeof(typename S::non_const_value_type)));
    relayout::all_to_allv(exec, comm, send, sc, recv, rc, site);
  }

  const ProcessGroupsOf<C>& pg_;
  TrafficLog* log_;
};

}  // namespace relayout
