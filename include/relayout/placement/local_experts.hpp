// The one grouping of the house and the local half of a MoE over the experts contract
// (placement/experts.hpp): rows grouped by local expert (group_by_expert), the weighted combine
// (combine_experts) and this rank's experts on rows every MoE rank holds (local_experts). No
// communication: EpBuffer's expert side and the bridge group with it.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include <Kokkos_Core.hpp>

#include "relayout/placement/experts.hpp"

namespace relayout {

namespace impl {

// Whether experts read an indexed batch, and take the in-place combine: by their type, or as a
// reference to the engine's experts says (the bridge's).
template <class E>
bool reads_indexed(const E& e) {
  if constexpr (requires { e.reads_indexed(); }) return e.reads_indexed();
  else return ReadsIndexedRows<E>;
}
template <class E>
bool combines_into(const E& e) {
  if constexpr (requires { e.combines_into(); }) return e.combines_into();
  else return true;
}

template <class T, class Space>
void require_expert_outputs(const ExpertBatch<T, Space>& b, const RowsView<T, Space>& y, const char* call) {
  if (static_cast<std::int64_t>(y.extent(0)) != b.rows() || y.extent(1) != b.x.extent(1))
    throw LayoutError("expert_y", std::string(call) + ": the experts' outputs are " + std::to_string(y.extent(0)) +
                                      " x " + std::to_string(y.extent(1)) + " but the batch is " +
                                      std::to_string(b.rows()) + " x " + std::to_string(b.x.extent(1)) +
                                      " (one output row per batch row)");
}

inline void require_experts(int experts, int ep, const char* call) {
  if (experts < 1 || experts % ep != 0)
    throw LayoutError("experts", std::string(call) + ": " + std::to_string(experts) +
                                     " experts cannot be split evenly over moe_ep = " + std::to_string(ep));
}

// What is wrong with the router output, or "" when nothing is: its shape, then (when `full`) ids
// outside [0, experts) and weights that are not finite.
template <class T, class Space>
std::string route_problem(const Space& exec, const TopK<T, Space>& route, std::int64_t rows, int experts,
                          bool full) {
  if (route.rows() != rows || static_cast<std::int64_t>(route.weights.extent(0)) != rows ||
      route.weights.extent(1) != route.ids.extent(1))
    return "the router output has " + std::to_string(route.rows()) + " rows (ids " +
           std::to_string(route.ids.extent(0)) + " x " + std::to_string(route.ids.extent(1)) + ", weights " +
           std::to_string(route.weights.extent(0)) + " x " + std::to_string(route.weights.extent(1)) + ") for " +
           std::to_string(rows) + " rows; ids and weights must both be rows x k";
  if (!full) return {};
  // One reduction finds ids out of range (low 32 bits) and weights that are NaN or infinite (high
  // bits), so a bad router fails loudly instead of writing out of bounds or spreading a NaN.
  const auto ids = route.ids;
  const auto w = route.weights;
  const int K = route.k();
  std::int64_t bad = 0;
  Kokkos::parallel_reduce(
      "relayout::check_topk", Kokkos::RangePolicy<Space>(exec, 0, rows * K),
      KOKKOS_LAMBDA(const std::int64_t s, std::int64_t& b) {
        const int e = ids(s / K, static_cast<int>(s % K));
        const auto d = w(s / K, static_cast<int>(s % K)) - w(s / K, static_cast<int>(s % K));  // NaN unless finite
        if (e < 0 || e >= experts) b += 1;
        if (!(d == d)) b += std::int64_t(1) << 32;
      },
      bad);
  exec.fence();
  const std::int64_t bad_ids = bad & 0xffffffff, bad_weights = bad >> 32;
  if (bad_ids > 0) return std::to_string(bad_ids) + " expert id(s) outside [0, " + std::to_string(experts) + ")";
  if (bad_weights > 0)
    return std::to_string(bad_weights) + " router weight(s) NaN or infinite; every weight must be finite";
  return {};
}

// Groups rows by local expert: lid(i, k) is row i's k-th local expert (outside [0, experts): not
// here), row(i, f) its values. Returns the batch (rows gathered, in ws) and fills slot_of(i, k),
// the batch row of (i, k), -1 where unrouted. Stable: within a group, rows keep their order. The
// counting sort is one sequential pass over the (row, k) items (items + experts work): a scan per
// expert costs items x experts (at 256 experts, 8192 rows top-8: 70 ms against 1.1 ms). With a
// `source` (row i of the rows at source + i * source_ld) the batch is indexed: each batch row gets
// the index of its row instead of a copy of it.
template <class T, class Space, class Row, class Lid>
ExpertBatch<T, Space> group_by_expert(const Space& exec, EpBuffers<T, Space>& ws, std::int64_t n, int K,
                                      std::int64_t H, const Row& row, const Lid& lid, int experts, int first_expert,
                                      typename EpBuffers<T, Space>::Index2& slot_of, const T* source = nullptr,
                                      std::int64_t source_ld = 0) {
  slot_of = ws.rows(ws.slot_of, "relayout::slot_of", n, K);
  ws.bucket_starts(experts);
  const auto so = slot_of;
  const auto starts = ws.starts;
  Kokkos::parallel_for(
      "relayout::group_by_expert", Kokkos::RangePolicy<Space>(exec, 0, 1), KOKKOS_LAMBDA(const int) {
        for (int e = 0; e <= experts; ++e) starts(e) = 0;
        for (std::int64_t s = 0; s < n * K; ++s) {
          const int e = lid(s / K, static_cast<int>(s % K));
          if (e >= 0 && e < experts) ++starts(e + 1);
        }
        for (int e = 0; e < experts; ++e) starts(e + 1) += starts(e);
        // starts(e) is expert e's fill cursor: afterwards it is where expert e + 1 begins.
        for (std::int64_t s = 0; s < n * K; ++s) {
          const int e = lid(s / K, static_cast<int>(s % K));
          so(s / K, static_cast<int>(s % K)) = e >= 0 && e < experts ? starts(e)++ : -1;
        }
        for (int e = experts; e > 0; --e) starts(e) = starts(e - 1);
        starts(0) = 0;
      });
  Kokkos::deep_copy(exec, ws.host_starts, starts);
  exec.fence();
  ExpertBatch<T, Space> b;
  b.first_expert = first_expert;
  b.offsets.assign(ws.host_starts.data(), ws.host_starts.data() + experts + 1);
  if (source) {
    b.indexed = true;
    b.source = source;
    b.source_ld = source_ld;
    b.x = ws.rows(ws.batch, "relayout::expert_rows", 0, H);
    const auto index = ws.flat(ws.batch_index, "relayout::expert_row_index", b.rows());
    b.index = index;
    Kokkos::parallel_for(
        "relayout::group_by_expert.index", Kokkos::RangePolicy<Space>(exec, 0, n * K),
        KOKKOS_LAMBDA(const std::int64_t s) {
          const std::int64_t at = so(s / K, static_cast<int>(s % K));
          if (at >= 0) index(at) = static_cast<std::int32_t>(s / K);
        });
    return b;
  }
  b.x = ws.rows(ws.batch, "relayout::expert_rows", b.rows(), H);
  const auto bx = b.x;
  Kokkos::parallel_for(
      "relayout::group_by_expert.gather", Kokkos::RangePolicy<Space>(exec, 0, n * K),
      KOKKOS_LAMBDA(const std::int64_t s) {
        const std::int64_t at = so(s / K, static_cast<int>(s % K));
        if (at >= 0)
          for (std::int64_t f = 0; f < H; ++f) bx(at, f) = row(s / K, f);
      });
  return b;
}

// out(i) = sum_k w(i, k) * expert_y(slot_of(i, k)) over this rank's experts of row i (accumulate:
// added to out); rows with none are zero (or unchanged). The sum runs in k order: deterministic.
// bf16 and fp16 rows sum in float and are rounded once per element.
template <class Space, class W, class S, class Y, class Out>
void weighted_sum(const Space& exec, int K, const W& w, const S& slot_of, const Y& expert_y, const Out& out,
                  bool accumulate = false) {
  const std::int64_t n = static_cast<std::int64_t>(out.extent(0)), H = static_cast<std::int64_t>(out.extent(1));
  using T = typename Out::non_const_value_type;
  using C = compute_t<T>;
  if constexpr (!std::is_same_v<T, C>) {
    Kokkos::parallel_for(
        "relayout::expert_weighted_sum", Kokkos::RangePolicy<Space>(exec, 0, n), KOKKOS_LAMBDA(const std::int64_t i) {
          // A chunk of the row at a time in fp32 accumulators, each term added in k order.
          constexpr std::int64_t kChunk = 32;
          for (std::int64_t f0 = 0; f0 < H; f0 += kChunk) {
            const std::int64_t width = H - f0 < kChunk ? H - f0 : kChunk;
            C acc[kChunk];
            for (std::int64_t j = 0; j < width; ++j) acc[j] = accumulate ? C(out(i, f0 + j)) : C(0);
            for (int k = 0; k < K; ++k) {
              const std::int64_t s = slot_of(i, k);
              if (s < 0) continue;
              const C wk = C(w(i, k));
              for (std::int64_t j = 0; j < width; ++j) acc[j] += wk * C(expert_y(s, f0 + j));
            }
            for (std::int64_t j = 0; j < width; ++j) out(i, f0 + j) = T(acc[j]);
          }
        });
  } else {
    Kokkos::parallel_for(
        "relayout::expert_weighted_sum", Kokkos::RangePolicy<Space>(exec, 0, n), KOKKOS_LAMBDA(const std::int64_t i) {
          // Row by row of expert_y, so the inner loop runs along the row (vectorised); each element
          // still sums its terms in k order.
          if (!accumulate)
            for (std::int64_t f = 0; f < H; ++f) out(i, f) = T(0);
          for (int k = 0; k < K; ++k) {
            const std::int64_t s = slot_of(i, k);
            if (s < 0) continue;
            const T wk = w(i, k);
            for (std::int64_t f = 0; f < H; ++f) out(i, f) += wk * expert_y(s, f);
          }
        });
  }
}

}  // namespace impl

namespace impl {

// Whether some row of route names one of experts [first, first + local) twice.
template <class T, class Space>
bool names_a_local_expert_twice(const Space& exec, const TopK<T, Space>& route, int first, int local) {
  const auto ids = route.ids;
  const int K = route.k();
  if (K < 2 || route.rows() == 0) return false;
  std::int64_t twice = 0;
  Kokkos::parallel_reduce(
      "relayout::local_expert_twice", Kokkos::RangePolicy<Space>(exec, 0, route.rows()),
      KOKKOS_LAMBDA(const std::int64_t i, std::int64_t& n) {
        for (int a = 0; a < K; ++a) {
          const int e = ids(i, a);
          if (e < first || e >= first + local) continue;
          for (int b = a + 1; b < K; ++b) n += ids(i, b) == e ? 1 : 0;
        }
      },
      twice);
  exec.fence();
  return twice > 0;
}

}  // namespace impl

// Rows grouped by this rank's experts, and where each (row, k) went.
template <class T, class Space = Kokkos::DefaultExecutionSpace>
struct ExpertGroups {
  ExpertBatch<T, Space> batch;  // in the workspace: the next grouping with it overwrites it
  Kokkos::View<std::int64_t**, Kokkos::LayoutRight, typename Space::memory_space> slot_of;  // (row, k) -> batch row, -1
};

namespace impl {

// Each batch row's destination: the row it came from and its router weight (the inverse of slot_of).
template <class T, class Space>
ExpertDestinations<T, Space> destinations(const Space& exec, const ExpertGroups<T, Space>& g, const TopK<T, Space>& route) {
  using Mem = typename Space::memory_space;
  const std::int64_t rows = g.batch.rows();
  Kokkos::View<std::int64_t*, Mem> row(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("relayout::dest_row")),
                                       static_cast<std::size_t>(rows));
  Kokkos::View<compute_t<T>*, Mem> weight(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("relayout::dest_weight")), static_cast<std::size_t>(rows));
  const auto slot_of = g.slot_of;
  const auto w = route.weights;
  const int K = route.k();
  Kokkos::parallel_for(
      "relayout::expert_destinations", Kokkos::RangePolicy<Space>(exec, 0, route.rows() * K),
      KOKKOS_LAMBDA(const std::int64_t s) {
        const std::int64_t i = s / K;
        const int k = static_cast<int>(s % K);
        const std::int64_t at = slot_of(i, k);
        if (at >= 0) {
          row(at) = i;
          weight(at) = w(i, k);
        }
      });
  return {row, weight};
}

}  // namespace impl

// The rows of x that route sends to experts [first_expert, first_expert + local), grouped by
// expert (ids of other experts, or -1, are skipped). The one grouping of the house: local_experts,
// EpBuffer's expert side and the bridge all group with it. No communication. by_index: an
// indexed batch over x's rows (x must then stay alive and unchanged while the batch is used).
template <class T, class Space, class X>
ExpertGroups<T, Space> group_by_expert(const Space& exec, const X& x, const TopK<T, Space>& route, int first_expert,
                                       int local, MoeScratch<T, Space>& ws, bool by_index = false) {
  const std::int64_t n = static_cast<std::int64_t>(x.extent(0)), H = static_cast<std::int64_t>(x.extent(1));
  if (local < 1 || first_expert < 0)
    throw LayoutError("local", "group_by_expert: needs local >= 1 experts from first_expert >= 0; got local = " +
                                   std::to_string(local) + ", first_expert = " + std::to_string(first_expert));
  if (route.rows() != n || route.weights.extent(0) != route.ids.extent(0))
    throw LayoutError("route", "group_by_expert: the router output has " + std::to_string(route.rows()) +
                                   " rows for " + std::to_string(n) + " rows of x");
  const int K = route.k();
  const auto ids = route.ids;
  // The index holds int rows and reads each row as H contiguous scalars: other x get the copy.
  const bool indexable = by_index && n > 0 && n <= std::int64_t(INT32_MAX) && (H <= 1 || x.stride(1) == 1);
  ExpertGroups<T, Space> g;
  g.batch = impl::group_by_expert<T>(
      exec, ws.buffers(), n, K, H, KOKKOS_LAMBDA(const std::int64_t i, const std::int64_t f) { return x(i, f); },
      KOKKOS_LAMBDA(const std::int64_t i, const int k) { return ids(i, k) - first_expert; }, local, first_expert,
      g.slot_of, indexable ? x.data() : static_cast<const T*>(nullptr), static_cast<std::int64_t>(x.stride(0)));
  return g;
}

// out(i) = sum_k route.weights(i, k) * y(slot_of(i, k)) over the (row, k) in the groups, in k order
// (deterministic, no atomics); accumulate: added to out (the shared expert's output, another
// moe_tp shard's partial sums). y holds the experts' outputs, one per batch row.
template <class T, class Space, class Out>
void combine_experts(const Space& exec, const ExpertGroups<T, Space>& g, const TopK<T, Space>& route,
                     const RowsView<T, Space>& y, const Out& out, bool accumulate = false) {
  impl::require_expert_outputs(g.batch, y, "combine_experts");
  if (route.rows() != static_cast<std::int64_t>(g.slot_of.extent(0)) || route.k() != static_cast<int>(g.slot_of.extent(1)) ||
      route.weights.extent(0) != route.ids.extent(0) || route.weights.extent(1) != route.ids.extent(1))
    throw LayoutError("route", "combine_experts: the router weights are " + std::to_string(route.weights.extent(0)) +
                                   " x " + std::to_string(route.weights.extent(1)) + " but the groups were made for " +
                                   std::to_string(g.slot_of.extent(0)) + " rows x " +
                                   std::to_string(g.slot_of.extent(1)));
  if (out.extent(0) != g.slot_of.extent(0) || (g.batch.rows() > 0 && out.extent(1) != y.extent(1)))
    throw LayoutError("out", "combine_experts: out is " + std::to_string(out.extent(0)) + " x " +
                                 std::to_string(out.extent(1)) + "; it must be rows x hidden = " +
                                 std::to_string(g.slot_of.extent(0)) + " x " + std::to_string(y.extent(1)));
  const auto w = route.weights;
  impl::weighted_sum(
      exec, route.k(), KOKKOS_LAMBDA(const std::int64_t i, const int k) { return w(i, k); }, g.slot_of, y, out,
      accumulate);
}

// The local half of a MoE on rows every rank of the MoE holds (paths dp_gather and tp_moe): this
// rank's experts (global ids [first_expert, first_expert + local) of experts_total) on the rows x
// routed to them, weighted and summed per row. The result is this rank's partial output for every
// row (zero for rows none of its experts takes); summing the partials over the MoE group completes
// it. No communication. Buffers come from `ws`; check_route: validate the router output (ids in
// range, weights finite) first.
template <class T, class Space, class X, ExpertsFor<T, Space> E>
void local_experts(const Space& exec, const X& x, const TopK<T, Space>& route, int first_expert, int local,
                   int experts_total, E& experts, const RowsView<T, Space>& out, MoeScratch<T, Space>& ws,
                   bool check_route = true) {
  const std::int64_t n = static_cast<std::int64_t>(x.extent(0)), H = static_cast<std::int64_t>(x.extent(1));
  impl::require_experts(experts_total, 1, "local_experts");
  if (const std::string problem = impl::route_problem(exec, route, n, experts_total, check_route); !problem.empty())
    throw LayoutError("route", "local_experts: " + problem);
  const ExpertGroups<T, Space> g = group_by_expert(exec, x, route, first_expert, local, ws, impl::reads_indexed(experts));
  if constexpr (CombinesIntoRows<E, T, Space> && std::is_same_v<T, compute_t<T>>) {
    // A row naming one local expert twice would be added twice by one expert's pass, which a
    // parallel backend may do at once: such a route takes the combine below.
    if (impl::combines_into(experts) && !impl::names_a_local_expert_twice(exec, route, first_expert, local)) {
      const ExpertDestinations<T, Space> dest = impl::destinations(exec, g, route);
      Kokkos::deep_copy(exec, out, T(0));
      experts.combine_into(exec, g.batch, dest, out);
      exec.fence();
      return;
    }
  }
  const auto y = ws.expert_outputs(g.batch.rows(), H);
  experts(exec, g.batch, y);
  combine_experts(exec, g, route, y, out);
  exec.fence();
}

template <class T, class Space, class X, ExpertsFor<T, Space> E>
void local_experts(const Space& exec, const X& x, const TopK<T, Space>& route, int first_expert, int local,
                   int experts_total, E& experts, const RowsView<T, Space>& out) {
  MoeScratch<T, Space> ws;
  local_experts(exec, x, route, first_expert, local, experts_total, experts, out, ws);
}

}  // namespace relayout
