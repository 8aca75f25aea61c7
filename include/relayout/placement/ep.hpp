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
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <Kokkos_Core.hpp>

#include "relayout/comm.hpp"
#include "relayout/placement/ep_message.hpp"
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

namespace impl {

// The memory behind ep_dispatch / ep_combine / local_experts, kept between calls. Every buffer
// only grows: a call whose sizes fit what is there allocates nothing.
template <class T, class Space>
struct EpBuffers {
  using Mem = typename Space::memory_space;
  using Index2 = Kokkos::View<std::int64_t**, Kokkos::LayoutRight, Mem>;
  using Words = Kokkos::View<std::int32_t*, Mem>;
  Kokkos::View<std::int64_t*, Mem> starts;
  typename Kokkos::View<std::int64_t*, Mem>::HostMirror host_starts;
  Index2 send_pos, slot_of;
  Kokkos::View<int**, Kokkos::LayoutRight, Mem> local_ids;
  Words send, recv;
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

// Memory an engine keeps for ep_dispatch, ep_combine, local_experts and MoeBridge, so that calls
// after the first allocate nothing once their sizes fit (buffers grow, never shrink). Results of a
// call (the batch, the combined rows) live in it: the next call with the same workspace overwrites
// them. One workspace per concurrent caller; it must outlive the Dispatched made with it.
template <class T, class Space = Kokkos::DefaultExecutionSpace>
class EpWorkspace {
 public:
  // How many buffers it has allocated so far.
  std::int64_t allocations() const { return buffers_.allocations; }
  // A rows x hidden buffer for the experts' outputs (ep_combine's expert_y), reused across calls.
  impl::RowsView<T, Space> expert_outputs(std::int64_t rows, std::int64_t hidden) {
    return buffers_.rows(buffers_.outputs, "relayout::expert_out", rows, hidden);
  }
  impl::EpBuffers<T, Space>& buffers() { return buffers_; }

 private:
  impl::EpBuffers<T, Space> buffers_;
};

// How ep_dispatch runs: what it counts and carries, and whether it validates the router output.
struct EpOptions {
  TrafficLog* traffic = nullptr;                    // counts the bytes this rank sends
  const std::vector<std::int64_t>* tags = nullptr;  // host-side per-row tags carried to the expert rank
  // Every router id in [0, experts) and every weight finite (one reduction over rows x k, and a
  // fence). Off: a bad id writes out of bounds and a NaN spreads into the rows, so only for a
  // router already validated.
  bool check_route = true;
};

// What ep_dispatch returns: the batch for the experts and what ep_combine needs to send the
// outputs back. Move it into ep_combine or keep it for another combine of the same routing.
template <class T, class Space = Kokkos::DefaultExecutionSpace>
struct Dispatched {
  using Mem = typename Space::memory_space;
  ExpertBatch<T, Space> batch;
  Kokkos::View<std::int64_t**, Kokkos::LayoutRight, Mem> send_pos;  // (row, rank) -> send row, -1 none
  Kokkos::View<std::int64_t**, Kokkos::LayoutRight, Mem> slot_of;   // (recv row, k) -> batch row, -1
  Kokkos::View<std::int32_t*, Mem> received_messages;               // received x message.words()
  EpMessage message;
  std::vector<int> send_rows, recv_rows;                            // per moe_ep member
  std::vector<std::int64_t> tags;  // the tags of the received rows, when dispatch was given tags
  std::int64_t rows = 0, full_rows = 0, received = 0, sent = 0;
  int hidden = 0, k = 0;
  std::shared_ptr<EpWorkspace<T, Space>> owned;  // the workspace, when ep_dispatch made its own
  EpWorkspace<T, Space>* workspace = nullptr;
};

namespace impl {

// A value converted between the compute type and the payload type (16-bit types go through float).
template <class To, class From>
KOKKOS_INLINE_FUNCTION To convert(const From& v) {
  if constexpr (Half16<To> || Half16<From>) return To(static_cast<float>(v));
  else return static_cast<To>(v);
}

// Stable counting sort of items into buckets (an item may go to several): one scan over (bucket,
// item), bucket-major, so the running count is the item's position in the bucket-ordered output.
// place(b, i, p) gets each hit's position; ws.host_starts receives the bucket offsets. The work is
// buckets x items, fine for the EP grouping's few buckets (ranks, local experts); kernels::
// bucket_by_expert, with up to hundreds of experts, keeps its one pass over the items.
template <class Space, class T, class Hit, class Place>
void bucket_scan(const Space& exec, EpBuffers<T, Space>& ws, int buckets, std::int64_t items, const Hit& hit,
                 const Place& place, const char* label) {
  ws.bucket_starts(buckets);
  const auto starts = ws.starts;
  Kokkos::deep_copy(exec, starts, std::int64_t(0));
  if (items > 0) {
    Kokkos::parallel_scan(
        label, Kokkos::RangePolicy<Space>(exec, 0, items * buckets),
        KOKKOS_LAMBDA(const std::int64_t idx, std::int64_t& upd, const bool final) {
          const int b = static_cast<int>(idx / items);
          const std::int64_t i = idx % items;
          const bool h = hit(b, i);
          if (final) {
            if (i == 0) starts(b) = upd;
            if (h) place(b, i, upd);
            if (idx == items * buckets - 1) starts(buckets) = upd + (h ? 1 : 0);
          }
          if (h) ++upd;
        });
  }
  Kokkos::deep_copy(exec, ws.host_starts, starts);
  exec.fence();
}

// Groups rows by local expert: lid(i, k) is row i's k-th local expert (-1: not here), row(i, f) its
// values. Returns the batch (rows gathered, in ws) and fills slot_of(i, k), the batch row of (i, k),
// -1 where unrouted. Deterministic: within a group, rows keep their order.
template <class T, class Space, class Row, class Lid>
ExpertBatch<T, Space> group_by_expert(const Space& exec, EpBuffers<T, Space>& ws, std::int64_t n, int K,
                                      std::int64_t H, const Row& row, const Lid& lid, int experts, int first_expert,
                                      typename EpBuffers<T, Space>::Index2& slot_of) {
  slot_of = ws.rows(ws.slot_of, "relayout::slot_of", n, K);
  Kokkos::deep_copy(exec, slot_of, std::int64_t(-1));
  const auto so = slot_of;
  bucket_scan(
      exec, ws, experts, n * K,
      KOKKOS_LAMBDA(const int e, const std::int64_t s) { return lid(s / K, static_cast<int>(s % K)) == e; },
      KOKKOS_LAMBDA(const int, const std::int64_t s, const std::int64_t p) { so(s / K, static_cast<int>(s % K)) = p; },
      "relayout::group_by_expert");
  ExpertBatch<T, Space> b;
  b.first_expert = first_expert;
  b.offsets.assign(ws.host_starts.data(), ws.host_starts.data() + experts + 1);
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

// out(i) = sum_k w(i, k) * expert_y(slot_of(i, k)) over this rank's experts of row i; rows with
// none are zero. The sum runs in k order, so it is deterministic.
template <class Space, class W, class S, class Y, class Out>
void weighted_sum(const Space& exec, int K, const W& w, const S& slot_of, const Y& expert_y, const Out& out) {
  const std::int64_t n = static_cast<std::int64_t>(out.extent(0)), H = static_cast<std::int64_t>(out.extent(1));
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

// Per-member counts of `words` each, as MPI's int counts; a message too large for them is refused.
inline std::vector<int> times(const std::vector<int>& c, std::int64_t words, const char* call) {
  std::vector<int> out(c.size());
  for (std::size_t i = 0; i < c.size(); ++i) {
    const std::int64_t v = std::int64_t(c[i]) * words;
    if (v > std::int64_t(std::numeric_limits<int>::max()))
      throw LayoutError("rows", std::string(call) + ": " + std::to_string(c[i]) + " rows of " + std::to_string(words) +
                                    " words for one member exceed MPI's int count; dispatch fewer rows per call");
    out[i] = static_cast<int>(v);
  }
  return out;
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
        const T d = w(s / K, static_cast<int>(s % K)) - w(s / K, static_cast<int>(s % K));  // NaN unless finite
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

}  // namespace impl

// Sends each of this rank's rows once to every moe_ep member that holds one of its top-k experts
// (expert e lives on member e / (experts / moe_ep)): the row, its local expert ids there and their
// weights as one message, in one all_to_allv. Collective over moe_ep: every member calls it, also
// with zero rows. Buffers come from `ws` (allocated only when they do not fit). The rows travel as
// Payload when one is named (ep_dispatch<bf16>(...): half the bytes of float rows, rounded to
// bf16, converted back to T for the experts); weights and the combine stay in T.
template <class Payload = void, class C, class T, class Space, class Scope>
  requires(std::same_as<Scope, DpLocal> &&
           (std::is_void_v<Payload> || std::is_floating_point_v<Payload> || Half16<Payload>))
Dispatched<T, Space> ep_dispatch(const Space& exec, const ProcessGroupsOf<C>& pg,
                                 const Rows<T, RowShard<AttnTp>, Scope, Space>& x, const TopK<T, Space>& route,
                                 int experts, EpWorkspace<T, Space>& ws, const EpOptions& opts = {},
                                 std::source_location site = std::source_location::current()) {
  const auto& comm = pg.moe_ep();
  const int ep = comm.size();
  const std::int64_t m = x.rows(), H = x.hidden();
  impl::require_experts(experts, ep, "ep_dispatch");
  // A refused router output on one member must not leave the others waiting in the exchange: it
  // sends nothing and says so with its counts, and every member throws after the count exchange.
  const std::string problem = impl::route_problem(exec, route, m, experts, opts.check_route);
  const int K = route.k(), per_rank = experts / ep, me = comm.rank();
  auto& buf = ws.buffers();

  Dispatched<T, Space> d;
  d.workspace = &ws;
  d.rows = m;
  d.full_rows = x.full_rows();
  d.hidden = static_cast<int>(H);
  d.k = K;
  using P = std::conditional_t<std::is_void_v<Payload>, T, Payload>;
  d.message = EpMessage::template of<T, P>(K, H);
  const EpMessage msg = d.message;
  const std::int64_t W = msg.words();

  // Send order is destination-major: (row i, rank r) gets its send row from one bucket scan.
  const std::int64_t mo = problem.empty() ? m : 0;  // a member that refused its router output sends nothing
  d.send_pos = buf.rows(buf.send_pos, "relayout::send_pos", mo, ep);
  const auto ids = route.ids;
  const auto pos = d.send_pos;
  Kokkos::deep_copy(exec, pos, std::int64_t(-1));
  impl::bucket_scan(
      exec, buf, ep, mo,
      KOKKOS_LAMBDA(const int r, const std::int64_t i) {
        bool hit = false;
        for (int k = 0; k < K; ++k) hit = hit || ids(i, k) / per_rank == r;
        return hit;
      },
      KOKKOS_LAMBDA(const int r, const std::int64_t i, const std::int64_t p) { pos(i, r) = p; },
      "relayout::ep_dispatch.layout");
  d.send_rows.assign(static_cast<std::size_t>(ep), 0);
  for (int r = 0; r < ep; ++r)
    d.send_rows[static_cast<std::size_t>(r)] = static_cast<int>(buf.host_starts(r + 1) - buf.host_starts(r));
  d.sent = buf.host_starts(ep);

  // Pack each sent row's message: weights, local expert ids at the destination (-1: none), row.
  const auto send = buf.flat(buf.send, "relayout::ep_send", d.sent * W);
  const auto xv = x.view();
  const auto wv = route.weights;
  Kokkos::parallel_for(
      "relayout::ep_dispatch.pack", Kokkos::RangePolicy<Space>(exec, 0, mo * ep), KOKKOS_LAMBDA(const std::int64_t idx) {
        const int r = static_cast<int>(idx / mo);
        const std::int64_t i = idx % mo, p = pos(i, r);
        if (p < 0) return;
        char* at = reinterpret_cast<char*>(send.data() + p * W);
        T* w = reinterpret_cast<T*>(at + msg.weights);
        std::int32_t* lid = reinterpret_cast<std::int32_t*>(at + msg.ids);
        P* row = reinterpret_cast<P*>(at + msg.row);
        for (int k = 0; k < K; ++k) {
          const int e = ids(i, k);
          const bool here = e / per_rank == r;
          lid[k] = here ? e - r * per_rank : -1;
          w[k] = here ? wv(i, k) : T(0);
        }
        for (std::int64_t f = 0; f < H; ++f) row[f] = impl::convert<P>(xv(i, f));
      });

  // The counts, each with this member's verdict on its router output (1: refused).
  std::vector<int> out(2 * static_cast<std::size_t>(ep)), in(out.size());
  for (std::size_t r = 0; r < d.send_rows.size(); ++r) {
    out[2 * r] = d.send_rows[r];
    out[2 * r + 1] = problem.empty() ? 0 : 1;
  }
  all_to_all(exec, comm, std::span<const int>(out), std::span<int>(in), site);
  if (!problem.empty()) throw LayoutError("route", "ep_dispatch: " + problem);
  for (int r = 0; r < ep; ++r)
    if (in[2 * static_cast<std::size_t>(r) + 1] != 0)
      throw LayoutError("route", "ep_dispatch: moe_ep member " + std::to_string(r) +
                                     " refused its router output (its error says why); no rows were exchanged");
  d.recv_rows.assign(static_cast<std::size_t>(ep), 0);
  for (std::size_t r = 0; r < d.recv_rows.size(); ++r) d.recv_rows[r] = in[2 * r];
  for (int c : d.recv_rows) d.received += c;
  d.received_messages = buf.flat(buf.recv, "relayout::ep_recv", d.received * W);
  all_to_allv(exec, comm, send, impl::times(d.send_rows, W, "ep_dispatch"), d.received_messages,
              impl::times(d.recv_rows, W, "ep_dispatch"), site);
  if (opts.traffic && ep > 1) opts.traffic->add(TrafficOp::dispatch, GroupKind::moe_ep, d.sent * msg.bytes);
  if (opts.tags) {
    // Host-side bookkeeping that travels with the rows (request ids, owners); not counted.
    const std::vector<std::int64_t>& tags = *opts.tags;
    if (static_cast<std::int64_t>(tags.size()) != m)
      throw LayoutError("tags", "ep_dispatch: " + std::to_string(tags.size()) + " tags for " + std::to_string(m) +
                                    " rows; tags must stay aligned with rows");
    auto pos_h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), d.send_pos);
    std::vector<std::int64_t> send_tags(static_cast<std::size_t>(d.sent));
    for (std::int64_t i = 0; i < m; ++i)
      for (int r = 0; r < ep; ++r)
        if (pos_h(i, r) >= 0) send_tags[static_cast<std::size_t>(pos_h(i, r))] = tags[static_cast<std::size_t>(i)];
    d.tags.assign(static_cast<std::size_t>(d.received), 0);
    all_to_allv(comm, send_tags, d.send_rows, d.tags, d.recv_rows, site);
  }
  const auto recv = d.received_messages;
  d.batch = impl::group_by_expert<T>(
      exec, buf, d.received, K, H,
      KOKKOS_LAMBDA(const std::int64_t i, const std::int64_t f) {
        return impl::convert<T>(reinterpret_cast<const P*>(reinterpret_cast<const char*>(recv.data() + i * W) + msg.row)[f]);
      },
      KOKKOS_LAMBDA(const std::int64_t i, const int k) {
        return reinterpret_cast<const std::int32_t*>(reinterpret_cast<const char*>(recv.data() + i * W) + msg.ids)[k];
      },
      per_rank, me * per_rank, d.slot_of);
  exec.fence();
  return d;
}

// The same with a workspace of its own (kept alive by the Dispatched), counting into `traffic`
// and carrying `tags` when given.
template <class Payload = void, class C, class T, class Space, class Scope>
  requires(std::same_as<Scope, DpLocal>)
Dispatched<T, Space> ep_dispatch(const Space& exec, const ProcessGroupsOf<C>& pg,
                                 const Rows<T, RowShard<AttnTp>, Scope, Space>& x, const TopK<T, Space>& route,
                                 int experts, TrafficLog* traffic = nullptr,
                                 const std::vector<std::int64_t>* tags = nullptr,
                                 std::source_location site = std::source_location::current()) {
  auto ws = std::make_shared<EpWorkspace<T, Space>>();
  Dispatched<T, Space> d = ep_dispatch<Payload>(exec, pg, x, route, experts, *ws, EpOptions{traffic, tags}, site);
  d.owned = std::move(ws);
  return d;
}

// Applies the router weights to the experts' outputs, sums them per received row, sends each row
// back to where it came from and sums the returns of every destination rank: complete rows, in
// the original order, in the dispatch's workspace. Collective over moe_ep.
template <class C, class T, class Space>
Rows<T, RowShard<AttnTp>, DpLocal, Space> ep_combine(const Space& exec, const ProcessGroupsOf<C>& pg,
                                                     const Dispatched<T, Space>& d,
                                                     const impl::RowsView<T, Space>& expert_y,
                                                     TrafficLog* traffic = nullptr,
                                                     std::source_location site = std::source_location::current()) {
  impl::require_expert_outputs(d.batch, expert_y, "ep_combine");
  if (!d.workspace)
    throw LayoutError("dispatched", "ep_combine: the Dispatched does not come from ep_dispatch (it has no workspace)");
  auto& buf = d.workspace->buffers();
  const auto& comm = pg.moe_ep();
  const std::int64_t H = d.hidden;
  const EpMessage msg = d.message;
  const std::int64_t W = msg.words();
  const auto recv = d.received_messages;
  const auto reduced = buf.rows(buf.reduced, "relayout::ep_reduced", d.received, H);
  impl::weighted_sum(
      exec, d.k,
      KOKKOS_LAMBDA(const std::int64_t i, const int k) {
        return reinterpret_cast<const T*>(reinterpret_cast<const char*>(recv.data() + i * W) + msg.weights)[k];
      },
      d.slot_of, expert_y, reduced);
  const auto back = buf.rows(buf.back, "relayout::ep_back", d.sent, H);
  all_to_allv(exec, comm, reduced, impl::times(d.recv_rows, H, "ep_combine"), back,
              impl::times(d.send_rows, H, "ep_combine"), site);
  if (traffic && comm.size() > 1) traffic->add(TrafficOp::combine, GroupKind::moe_ep, d.received * H * std::int64_t(sizeof(T)));
  const auto out = buf.rows(buf.combined, "relayout::ep_combined", d.rows, H);
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
// routed to them, weighted and summed per row. The result is this rank's partial output for every
// row (zero for rows none of its experts takes); summing the partials over the MoE group completes
// it. No communication. Buffers come from `ws`; check_route as in EpOptions.
template <class T, class Space, class X, ExpertsFor<T, Space> E>
void local_experts(const Space& exec, const X& x, const TopK<T, Space>& route, int first_expert, int local,
                   int experts_total, E& experts, const impl::RowsView<T, Space>& out, EpWorkspace<T, Space>& ws,
                   bool check_route = true) {
  const std::int64_t n = static_cast<std::int64_t>(x.extent(0)), H = impl::hidden_of(x.extent(1));
  impl::require_experts(experts_total, 1, "local_experts");
  if (const std::string problem = impl::route_problem(exec, route, n, experts_total, check_route); !problem.empty())
    throw LayoutError("route", "local_experts: " + problem);
  const int K = route.k();
  auto& buf = ws.buffers();
  const auto lid = buf.rows(buf.local_ids, "relayout::local_ids", n, K);
  const auto ids = route.ids;
  Kokkos::parallel_for(
      "relayout::local_experts.ids", Kokkos::RangePolicy<Space>(exec, 0, n * K), KOKKOS_LAMBDA(const std::int64_t s) {
        const int e = ids(s / K, static_cast<int>(s % K)) - first_expert;
        lid(s / K, static_cast<int>(s % K)) = e >= 0 && e < local ? e : -1;
      });
  typename impl::EpBuffers<T, Space>::Index2 slot_of;
  const ExpertBatch<T, Space> batch = impl::group_by_expert<T>(
      exec, buf, n, K, H, KOKKOS_LAMBDA(const std::int64_t i, const std::int64_t f) { return x(i, f); },
      KOKKOS_LAMBDA(const std::int64_t i, const int k) { return lid(i, k); }, local, first_expert, slot_of);
  const auto y = ws.expert_outputs(batch.rows(), H);
  experts(exec, batch, y);
  const auto w = route.weights;
  impl::weighted_sum(
      exec, K, KOKKOS_LAMBDA(const std::int64_t i, const int k) { return w(i, k); }, slot_of, y, out);
  exec.fence();
}

template <class T, class Space, class X, ExpertsFor<T, Space> E>
void local_experts(const Space& exec, const X& x, const TopK<T, Space>& route, int first_expert, int local,
                   int experts_total, E& experts, const impl::RowsView<T, Space>& out) {
  EpWorkspace<T, Space> ws;
  local_experts(exec, x, route, first_expert, local, experts_total, experts, out, ws);
}

}  // namespace relayout
