// Expert-parallel dispatch and combine on typed rows, with the engine's own router output and its
// own experts. The protocol is DeepEP's: a row travels once per destination rank (not once per
// top-k slot), carrying the list of its experts there and their router weights; the expert rank
// runs its experts, applies the weights and sums them per row; combine returns one row per
// (row, destination rank), which the source sums. See docs/bridge.md.
//
//   RowShard<AttnTp> --ep_dispatch--> Dispatched (rows grouped by local expert: ExpertBatch)
//   engine's Experts(batch) --> expert outputs (one per grouped row)
//   ep_combine(dispatched, outputs) --> RowShard<AttnTp> complete rows, original order
//
// Routing stays on the execution space: only the per-rank and per-expert counts come to the host
// (MPI needs them as counts). Rows that are Partial, or Replicated over more than one rank, do not
// dispatch: each row must be held by exactly one rank, or it would be processed twice.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <Kokkos_Core.hpp>

#include "relayout/comm.hpp"
#include "relayout/placement/impl/moves.hpp"
#include "relayout/placement/rows.hpp"
#include "relayout/placement/traffic.hpp"

namespace relayout {

// The router's decision for each row: the top-k global expert ids and their weights.
template <class T, class Space = Kokkos::DefaultExecutionSpace>
struct TopK {
  using ids_view = Kokkos::View<int**, Kokkos::LayoutRight, typename Space::memory_space>;
  using weights_view = Kokkos::View<T**, Kokkos::LayoutRight, typename Space::memory_space>;
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
template <class T, class Space = Kokkos::DefaultExecutionSpace>
struct ExpertBatch {
  impl::RowsView<T, Space> x;
  std::vector<std::int64_t> offsets;  // on the host, experts() + 1 entries
  int first_expert = 0;

  int experts() const { return static_cast<int>(offsets.size()) - 1; }
  std::int64_t rows() const { return offsets.empty() ? 0 : offsets.back(); }
  std::int64_t offset(int e) const { return offsets[static_cast<std::size_t>(e)]; }
  std::int64_t count(int e) const { return offset(e + 1) - offset(e); }
  // The rows of local expert e (a view, no copy).
  impl::RowsView<T, Space> rows_of(int e) const { return impl::row_slice(x, offset(e), count(e)); }
};

// The engine's experts: y(i, :) = expert (first_expert + e)(x(i, :)) for every row i of group e,
// the whole expert's output or this rank's moe_tp share of it (its partials are then summed by the
// bridge's plan). Called on every rank, also with zero rows.
template <class E, class T, class Space>
concept ExpertsFor = requires(E& experts, const Space& exec, const ExpertBatch<T, Space>& batch,
                              const impl::RowsView<T, Space>& y) {
  experts(exec, batch, y);
};

// What ep_dispatch returns: the batch for the experts and what ep_combine needs to send the
// outputs back. Move it into ep_combine or keep it for another combine of the same routing.
template <class T, class Space = Kokkos::DefaultExecutionSpace>
struct Dispatched {
  using Mem = typename Space::memory_space;
  ExpertBatch<T, Space> batch;
  Kokkos::View<std::int64_t**, Kokkos::LayoutRight, Mem> send_pos;  // (row, rank) -> send row, -1 none
  Kokkos::View<std::int64_t**, Kokkos::LayoutRight, Mem> slot_of;   // (recv row, k) -> batch row, -1
  Kokkos::View<T**, Kokkos::LayoutRight, Mem> recv_weights;         // recv rows x k
  std::vector<int> send_rows, recv_rows;                            // per moe_ep member
  std::vector<std::int64_t> tags;  // the tags of the received rows, when dispatch was given tags
  std::int64_t rows = 0, full_rows = 0, received = 0, sent = 0;
  int hidden = 0;
};

namespace impl {

template <class T>
void require_ep(bool ok, const char* input, const std::string& rule) {
  if (!ok) throw LayoutError(input, "ep_dispatch: " + rule);
}

// Groups rows by local expert: lid(i, k) is row i's k-th local expert (-1: not here). Returns the
// batch (rows gathered) and slot_of(i, k), the batch row of (i, k). Deterministic: within a group,
// rows keep their order.
template <class T, class Space, class X, class Lid>
ExpertBatch<T, Space> group_by_expert(const Space& exec, const X& x, const Lid& lid, int experts, int first_expert,
                                      Kokkos::View<std::int64_t**, Kokkos::LayoutRight, typename Space::memory_space>& slot_of) {
  using Mem = typename Space::memory_space;
  const std::int64_t n = static_cast<std::int64_t>(lid.extent(0));
  const int K = static_cast<int>(lid.extent(1));
  const std::int64_t H = static_cast<std::int64_t>(x.extent(1));
  const std::int64_t slots = n * K;
  slot_of = Kokkos::View<std::int64_t**, Kokkos::LayoutRight, Mem>(
      Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("relayout::slot_of")), static_cast<std::size_t>(n),
      static_cast<std::size_t>(K));
  Kokkos::View<std::int64_t*, Mem> starts(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("relayout::expert_starts")), static_cast<std::size_t>(experts) + 1);
  Kokkos::deep_copy(exec, starts, std::int64_t(0));
  auto so = slot_of;
  // One scan over (expert, slot), expert-major: the running count is the batch row.
  if (slots > 0) {
    Kokkos::parallel_scan(
        "relayout::group_by_expert", Kokkos::RangePolicy<Space>(exec, 0, slots * experts),
        KOKKOS_LAMBDA(const std::int64_t idx, std::int64_t& upd, const bool final) {
          const int e = static_cast<int>(idx / slots);
          const std::int64_t s = idx % slots;
          const bool hit = lid(s / K, static_cast<int>(s % K)) == e;
          if (final) {
            if (s == 0) starts(e) = upd;
            if (hit) so(s / K, static_cast<int>(s % K)) = upd;
            if (idx == slots * experts - 1) starts(experts) = upd + (hit ? 1 : 0);
          }
          if (hit) ++upd;
        });
    Kokkos::parallel_for(
        "relayout::group_by_expert.unrouted", Kokkos::RangePolicy<Space>(exec, 0, slots),
        KOKKOS_LAMBDA(const std::int64_t s) {
          if (lid(s / K, static_cast<int>(s % K)) < 0) so(s / K, static_cast<int>(s % K)) = -1;
        });
  }
  auto host_starts = Kokkos::create_mirror_view(starts);
  Kokkos::deep_copy(exec, host_starts, starts);
  exec.fence();
  ExpertBatch<T, Space> b;
  b.first_expert = first_expert;
  b.offsets.assign(host_starts.data(), host_starts.data() + experts + 1);
  b.x = alloc_rows<T, Space>("relayout::expert_rows", b.rows(), H);
  auto bx = b.x;
  Kokkos::parallel_for(
      "relayout::group_by_expert.gather", Kokkos::RangePolicy<Space>(exec, 0, slots),
      KOKKOS_LAMBDA(const std::int64_t s) {
        const std::int64_t at = so(s / K, static_cast<int>(s % K));
        if (at >= 0)
          for (std::int64_t f = 0; f < H; ++f) bx(at, f) = x(s / K, f);
      });
  return b;
}

// y(i) = sum_k w(i, k) * expert_y(slot_of(i, k)) over this rank's experts of row i; rows with none
// are zero. The sum runs in k order, so it is deterministic.
template <class Space, class W, class S, class Y, class Out>
void weighted_sum(const Space& exec, const W& w, const S& slot_of, const Y& expert_y, const Out& out) {
  const std::int64_t n = static_cast<std::int64_t>(out.extent(0)), H = static_cast<std::int64_t>(out.extent(1));
  const int K = static_cast<int>(w.extent(1));
  using T = typename Out::non_const_value_type;
  Kokkos::parallel_for(
      "relayout::expert_weighted_sum", Kokkos::RangePolicy<Space>(exec, 0, n), KOKKOS_LAMBDA(const std::int64_t i) {
        for (std::int64_t f = 0; f < H; ++f) {
          T acc = T(0);
          for (int k = 0; k < K; ++k) {
            const std::int64_t s = slot_of(i, k);
            if (s >= 0) acc += w(i, k) * expert_y(s, f);
          }
          out(i, f) = acc;
        }
      });
}

template <class T, class Space>
void require_expert_outputs(const ExpertBatch<T, Space>& b, const RowsView<T, Space>& y, const char* call) {
  if (static_cast<std::int64_t>(y.extent(0)) != b.rows() || y.extent(1) != b.x.extent(1))
    throw LayoutError("expert_y", std::string(call) + ": the experts' outputs are " + std::to_string(y.extent(0)) +
                                      " x " + std::to_string(y.extent(1)) + " but the batch is " +
                                      std::to_string(b.rows()) + " x " + std::to_string(b.x.extent(1)) +
                                      " (one output row per batch row)");
}

inline std::vector<int> times(const std::vector<int>& c, std::int64_t f) {
  std::vector<int> out(c);
  for (int& v : out) v = static_cast<int>(v * f);
  return out;
}

template <class T, class Space>
void check_topk(const Space& exec, const TopK<T, Space>& route, std::int64_t rows, int experts, int ep,
                const char* call) {
  if (route.rows() != rows || static_cast<std::int64_t>(route.weights.extent(0)) != rows ||
      route.weights.extent(1) != route.ids.extent(1))
    throw LayoutError("route", std::string(call) + ": the router output has " + std::to_string(route.rows()) +
                                   " rows (ids " + std::to_string(route.ids.extent(0)) + " x " +
                                   std::to_string(route.ids.extent(1)) + ", weights " +
                                   std::to_string(route.weights.extent(0)) + " x " +
                                   std::to_string(route.weights.extent(1)) + ") for " + std::to_string(rows) +
                                   " rows; ids and weights must both be rows x k");
  if (experts < 1 || experts % ep != 0)
    throw LayoutError("experts", std::string(call) + ": " + std::to_string(experts) +
                                     " experts cannot be split evenly over moe_ep = " + std::to_string(ep));
  // One reduction finds an id out of range, so a bad router fails loudly instead of writing out of bounds.
  const auto ids = route.ids;
  const int K = route.k();
  std::int64_t bad = 0;
  Kokkos::parallel_reduce(
      "relayout::check_topk", Kokkos::RangePolicy<Space>(exec, 0, rows * K),
      KOKKOS_LAMBDA(const std::int64_t s, std::int64_t& b) {
        const int e = ids(s / K, static_cast<int>(s % K));
        if (e < 0 || e >= experts) ++b;
      },
      bad);
  exec.fence();
  if (bad > 0)
    throw LayoutError("route", std::string(call) + ": " + std::to_string(bad) + " expert id(s) outside [0, " +
                                   std::to_string(experts) + ")");
}

}  // namespace impl

// Sends each of this rank's rows once to every moe_ep member that holds one of its top-k experts
// (expert e lives on member e / (experts / moe_ep)). Collective over moe_ep: every member calls it,
// also with zero rows. `traffic`, when given, counts the bytes this rank sends.
template <class C, class T, class Space, class Scope>
  requires(std::same_as<Scope, DpLocal>)
Dispatched<T, Space> ep_dispatch(const Space& exec, const ProcessGroupsOf<C>& pg,
                                 const Rows<T, RowShard<AttnTp>, Scope, Space>& x, const TopK<T, Space>& route,
                                 int experts, TrafficLog* traffic = nullptr,
                                 const std::vector<std::int64_t>* tags = nullptr,
                                 std::source_location site = std::source_location::current()) {
  using Mem = typename Space::memory_space;
  const auto& comm = pg.moe_ep();
  const int ep = comm.size();
  const std::int64_t m = x.rows(), H = x.hidden();
  impl::check_topk(exec, route, m, experts, ep, "ep_dispatch");
  const int K = route.k(), per_rank = experts / ep, me = comm.rank();

  Dispatched<T, Space> d;
  d.rows = m;
  d.full_rows = x.full_rows();
  d.hidden = static_cast<int>(H);
  d.send_pos = Kokkos::View<std::int64_t**, Kokkos::LayoutRight, Mem>(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("relayout::send_pos")), static_cast<std::size_t>(m),
                                                                      static_cast<std::size_t>(ep));
  Kokkos::View<std::int64_t*, Mem> starts(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("relayout::send_starts")), static_cast<std::size_t>(ep) + 1);
  Kokkos::deep_copy(exec, starts, std::int64_t(0));
  const auto ids = route.ids;
  const auto pos = d.send_pos;
  // Send order is destination-major: one scan over (rank, row) gives each (row, rank) its send row.
  if (m > 0) {
    Kokkos::parallel_scan(
        "relayout::ep_dispatch.layout", Kokkos::RangePolicy<Space>(exec, 0, m * ep),
        KOKKOS_LAMBDA(const std::int64_t idx, std::int64_t& upd, const bool final) {
          const int r = static_cast<int>(idx / m);
          const std::int64_t i = idx % m;
          bool hit = false;
          for (int k = 0; k < K; ++k) hit = hit || ids(i, k) / per_rank == r;
          if (final) {
            if (i == 0) starts(r) = upd;
            pos(i, r) = hit ? upd : -1;
            if (idx == m * ep - 1) starts(ep) = upd + (hit ? 1 : 0);
          }
          if (hit) ++upd;
        });
  }
  auto host_starts = Kokkos::create_mirror_view(starts);
  Kokkos::deep_copy(exec, host_starts, starts);
  exec.fence();
  d.send_rows.assign(static_cast<std::size_t>(ep), 0);
  for (int r = 0; r < ep; ++r) d.send_rows[static_cast<std::size_t>(r)] = static_cast<int>(host_starts(r + 1) - host_starts(r));
  d.sent = host_starts(ep);

  // Pack: each sent row with its local expert ids at the destination (-1: none) and weights.
  auto send = impl::alloc_rows<T, Space>("relayout::ep_send", d.sent, H);
  Kokkos::View<int**, Kokkos::LayoutRight, Mem> send_ids(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("relayout::ep_send_ids")), static_cast<std::size_t>(d.sent),
                                                         static_cast<std::size_t>(K));
  Kokkos::View<T**, Kokkos::LayoutRight, Mem> send_w(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("relayout::ep_send_w")), static_cast<std::size_t>(d.sent),
                                                     static_cast<std::size_t>(K));
  const auto xv = x.view();
  const auto wv = route.weights;
  Kokkos::parallel_for(
      "relayout::ep_dispatch.pack", Kokkos::RangePolicy<Space>(exec, 0, m * ep), KOKKOS_LAMBDA(const std::int64_t idx) {
        const int r = static_cast<int>(idx / m);
        const std::int64_t i = idx % m, p = pos(i, r);
        if (p < 0) return;
        for (std::int64_t f = 0; f < H; ++f) send(p, f) = xv(i, f);
        for (int k = 0; k < K; ++k) {
          const int e = ids(i, k);
          const bool here = e / per_rank == r;
          send_ids(p, k) = here ? e - r * per_rank : -1;
          send_w(p, k) = here ? wv(i, k) : T(0);
        }
      });
  exec.fence();

  d.recv_rows.assign(static_cast<std::size_t>(ep), 0);
  all_to_all(comm, std::span<const int>(d.send_rows), std::span<int>(d.recv_rows), site);
  for (int c : d.recv_rows) d.received += c;
  auto recv = impl::alloc_rows<T, Space>("relayout::ep_recv", d.received, H);
  Kokkos::View<int**, Kokkos::LayoutRight, Mem> recv_ids(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("relayout::ep_recv_ids")), static_cast<std::size_t>(d.received),
                                                         static_cast<std::size_t>(K));
  d.recv_weights = Kokkos::View<T**, Kokkos::LayoutRight, Mem>(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("relayout::ep_recv_w")), static_cast<std::size_t>(d.received),
                                                               static_cast<std::size_t>(K));
  all_to_allv(comm, send, impl::times(d.send_rows, H), recv, impl::times(d.recv_rows, H), site);
  all_to_allv(comm, send_ids, impl::times(d.send_rows, K), recv_ids, impl::times(d.recv_rows, K), site);
  all_to_allv(comm, send_w, impl::times(d.send_rows, K), d.recv_weights, impl::times(d.recv_rows, K), site);
  if (traffic && ep > 1)
    traffic->add(TrafficOp::dispatch, GroupKind::moe_ep,
                 d.sent * (H * std::int64_t(sizeof(T)) + K * std::int64_t(sizeof(int) + sizeof(T))));
  if (tags) {
    // Host-side bookkeeping that travels with the rows (request ids, owners); not counted.
    if (static_cast<std::int64_t>(tags->size()) != m)
      throw LayoutError("tags", "ep_dispatch: " + std::to_string(tags->size()) + " tags for " + std::to_string(m) +
                                    " rows; tags must stay aligned with rows");
    auto pos_h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), d.send_pos);
    std::vector<std::int64_t> send_tags(static_cast<std::size_t>(d.sent));
    for (std::int64_t i = 0; i < m; ++i)
      for (int r = 0; r < ep; ++r)
        if (pos_h(i, r) >= 0) send_tags[static_cast<std::size_t>(pos_h(i, r))] = (*tags)[static_cast<std::size_t>(i)];
    d.tags.assign(static_cast<std::size_t>(d.received), 0);
    all_to_allv(comm, send_tags, d.send_rows, d.tags, d.recv_rows, site);
  }
  d.batch = impl::group_by_expert<T>(exec, recv, recv_ids, per_rank, me * per_rank, d.slot_of);
  exec.fence();
  return d;
}

// Applies the router weights to the experts' outputs, sums them per received row, sends each row
// back to where it came from and sums the returns of every destination rank: complete rows, in
// the original order. Collective over moe_ep.
template <class C, class T, class Space>
Rows<T, RowShard<AttnTp>, DpLocal, Space> ep_combine(const Space& exec, const ProcessGroupsOf<C>& pg,
                                                     const Dispatched<T, Space>& d,
                                                     const impl::RowsView<T, Space>& expert_y,
                                                     TrafficLog* traffic = nullptr,
                                                     std::source_location site = std::source_location::current()) {
  impl::require_expert_outputs(d.batch, expert_y, "ep_combine");
  const auto& comm = pg.moe_ep();
  const std::int64_t H = d.hidden;
  auto reduced = impl::alloc_rows<T, Space>("relayout::ep_reduced", d.received, H);
  impl::weighted_sum(exec, d.recv_weights, d.slot_of, expert_y, reduced);
  auto back = impl::alloc_rows<T, Space>("relayout::ep_back", d.sent, H);
  exec.fence();
  all_to_allv(comm, reduced, impl::times(d.recv_rows, H), back, impl::times(d.send_rows, H), site);
  if (traffic && comm.size() > 1) traffic->add(TrafficOp::combine, GroupKind::moe_ep, d.received * H * std::int64_t(sizeof(T)));
  auto out = impl::alloc_rows<T, Space>("relayout::ep_combined", d.rows, H);
  const auto pos = d.send_pos;
  const int ep = comm.size();
  Kokkos::parallel_for(
      "relayout::ep_combine.sum", Kokkos::RangePolicy<Space>(exec, 0, d.rows), KOKKOS_LAMBDA(const std::int64_t i) {
        for (std::int64_t f = 0; f < H; ++f) {
          T acc = T(0);
          for (int r = 0; r < ep; ++r) {
            const std::int64_t p = pos(i, r);
            if (p >= 0) acc += back(p, f);
          }
          out(i, f) = acc;
        }
      });
  exec.fence();
  return Rows<T, RowShard<AttnTp>, DpLocal, Space>(out, d.full_rows);
}

// Dispatch only complete rows each held by one rank.
template <class C, class Space, RowsType R, class... Rest>
  requires(!std::same_as<typename std::remove_cvref_t<R>::state_type, RowShard<AttnTp>>)
void ep_dispatch(const Space&, const ProcessGroupsOf<C>&, const R&, const Rest&...) {
  static_assert(std::same_as<typename std::remove_cvref_t<R>::state_type, RowShard<AttnTp>>,
                "relayout: ep_dispatch sends each row once, so it needs RowShard<AttnTp> rows (each row held by "
                "one rank): split Replicated<AttnTp> rows with split_rows first; Partial rows must be summed "
                "(all_reduce) before any expert sees them");
}

// The local half of a MoE on rows every rank of the MoE holds (paths dp_gather and tp_moe): this
// rank's experts (global ids [first_expert, first_expert + local) of experts_total) on the rows x
// routed to them, weighted and summed per row. The result
// is this rank's partial output for every row (zero outside [begin, end) and for rows none of its
// experts takes); summing the partials over the MoE group completes it. No communication.
template <class T, class Space, class X, ExpertsFor<T, Space> E>
void local_experts(const Space& exec, const X& x, const TopK<T, Space>& route, int first_expert, int local,
                   int experts_total, E& experts, const impl::RowsView<T, Space>& out) {
  using Mem = typename Space::memory_space;
  const std::int64_t n = static_cast<std::int64_t>(x.extent(0));
  impl::check_topk(exec, route, n, experts_total, 1, "local_experts");
  const int K = route.k();
  Kokkos::View<int**, Kokkos::LayoutRight, Mem> lid(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("relayout::local_ids")), static_cast<std::size_t>(n),
                                                    static_cast<std::size_t>(K));
  const auto ids = route.ids;
  Kokkos::parallel_for(
      "relayout::local_experts.ids", Kokkos::RangePolicy<Space>(exec, 0, n * K), KOKKOS_LAMBDA(const std::int64_t s) {
        const int e = ids(s / K, static_cast<int>(s % K)) - first_expert;
        lid(s / K, static_cast<int>(s % K)) = e >= 0 && e < local ? e : -1;
      });
  Kokkos::View<std::int64_t**, Kokkos::LayoutRight, Mem> slot_of;
  const ExpertBatch<T, Space> batch = impl::group_by_expert<T>(exec, x, lid, local, first_expert, slot_of);
  auto y = impl::alloc_rows<T, Space>("relayout::expert_out", batch.rows(), impl::hidden_of(x.extent(1)));
  experts(exec, batch, y);
  impl::weighted_sum(exec, route.weights, slot_of, y, out);
  exec.fence();
}

}  // namespace relayout
