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
#include "relayout/placement/experts.hpp"
#include "relayout/placement/fp8.hpp"
#include "relayout/placement/impl/moves.hpp"
#include "relayout/placement/rows.hpp"
#include "relayout/placement/traffic.hpp"

namespace relayout {

// How ep_dispatch runs: what it counts and carries, and whether it validates the router output.
struct EpOptions {
  TrafficLog* traffic = nullptr;                    // counts the bytes this rank sends
  const std::vector<std::int64_t>* tags = nullptr;  // host-side per-row tags carried to the expert rank
  // Every router id in [0, experts) and every weight finite (one reduction over rows x k, and a
  // fence). Off: a bad id writes out of bounds and a NaN spreads into the rows, so only for a
  // router already validated.
  bool check_route = true;
  // The experts' batch indexed into the received messages (ExpertBatch::indexed) instead of
  // copied out of them, where the rows travel as T (no dispatch payload type): for experts that
  // read an indexed batch (ReadsIndexedRows). The messages stay in the workspace until its next
  // dispatch.
  bool indexed_batch = false;
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
  int per_rank = 0, first_expert = 0;  // experts per member; this member's first
  std::shared_ptr<EpWorkspace<T, Space>> owned;  // the workspace, when ep_dispatch made its own
  EpWorkspace<T, Space>* workspace = nullptr;
};

namespace impl {

// Whether the rows travel as e4m3 with fp32 block scales (EpMessage::of_fp8) rather than one type.
template <class P>
inline constexpr bool is_fp8_payload_v = std::is_same_v<P, fp8_e4m3>;

// A value converted between the compute type and the payload type (16-bit types go through float).
template <class To, class From>
KOKKOS_INLINE_FUNCTION To convert(const From& v) {
  if constexpr (Half16<To> || Half16<From>) return To(static_cast<float>(v));
  else return static_cast<To>(v);
}

// Stable counting sort of items into buckets (an item may go to several): one scan over (bucket,
// item), bucket-major, so the running count is the item's position in the bucket-ordered output.
// place(b, i, p) gets each hit's position; ws.host_starts receives the bucket offsets. The work is
// buckets x items, fine for the dispatch's few buckets (moe_ep members); the expert grouping, with
// up to hundreds of experts, sorts in one pass over the items instead (group_by_expert).
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

// Words ahead of each low-latency block: the rows in it, the sender's verdict, the sender's rows.
inline constexpr std::int64_t kLlHead = 4;

// What every member said about its own call: per member, the rows it sends here, its verdict
// (0: fine, 1: its router output refused, 2: over the low-latency capacity) and its rows.
struct Verdicts {
  std::vector<int> rows, verdict, total;
  static Verdicts of(const std::vector<int>& words, std::size_t ep, std::size_t stride) {
    Verdicts v;
    for (std::size_t r = 0; r < ep; ++r) {
      v.rows.push_back(words[r * stride]);
      v.verdict.push_back(words[r * stride + 1]);
      v.total.push_back(words[r * stride + 2]);
    }
    return v;
  }
};

inline int clamp_int(std::int64_t v) {
  return v > std::numeric_limits<int>::max() ? std::numeric_limits<int>::max() : static_cast<int>(v);
}

// Normal mode's first exchange: the counts, each with the sender's verdict, in one all_to_all.
template <class Space, class C>
Verdicts exchange_counts(const Space& exec, const C& comm, const std::vector<int>& send_rows, int verdict,
                         std::int64_t rows, std::source_location site) {
  const std::size_t ep = send_rows.size();
  std::vector<int> out(3 * ep), in(out.size());
  for (std::size_t r = 0; r < ep; ++r) {
    out[3 * r] = send_rows[r];
    out[3 * r + 1] = verdict;
    out[3 * r + 2] = clamp_int(rows);
  }
  all_to_all(exec, comm, std::span<const int>(out), std::span<int>(in), site);
  return Verdicts::of(in, ep, 3);
}

// Low-latency mode's one exchange: block r of `send` (a head, then up to capacity messages) goes
// to member r in one all_to_all of equal blocks of B words, started here (read_blocks reads the
// heads that arrived once it completes).
template <class Space, class C, class T>
CollectiveRequest post_blocks(const Space& exec, const C& comm, EpBuffers<T, Space>& buf,
                              const Kokkos::View<std::int32_t*, typename Space::memory_space>& send,
                              const Kokkos::View<std::int32_t*, typename Space::memory_space>& recv, std::int64_t B,
                              const std::vector<int>& send_rows, int verdict, std::int64_t rows, std::source_location site) {
  const std::int64_t ep = static_cast<std::int64_t>(send_rows.size());
  const auto heads = buf.flat(buf.ll_heads, "relayout::ep_ll_heads", ep * kLlHead);
  auto hh = Kokkos::create_mirror_view(heads);
  for (std::int64_t r = 0; r < ep; ++r) {
    hh(r * kLlHead) = send_rows[static_cast<std::size_t>(r)];
    hh(r * kLlHead + 1) = verdict;
    hh(r * kLlHead + 2) = clamp_int(rows);
    hh(r * kLlHead + 3) = 0;
  }
  Kokkos::deep_copy(exec, heads, hh);
  Kokkos::parallel_for(
      "relayout::ep_dispatch.heads", Kokkos::RangePolicy<Space>(exec, 0, ep * kLlHead),
      KOKKOS_LAMBDA(const std::int64_t j) { send((j / kLlHead) * B + j % kLlHead) = heads(j); });
  return all_to_all_start(exec, comm, send, recv, site);
}
template <class Space, class T>
Verdicts read_blocks(const Space& exec, EpBuffers<T, Space>& buf,
                     const Kokkos::View<std::int32_t*, typename Space::memory_space>& recv, std::int64_t B, std::int64_t ep) {
  const auto heads = buf.flat(buf.ll_heads, "relayout::ep_ll_heads", ep * kLlHead);
  Kokkos::parallel_for(
      "relayout::ep_dispatch.read_heads", Kokkos::RangePolicy<Space>(exec, 0, ep * kLlHead),
      KOKKOS_LAMBDA(const std::int64_t j) { heads(j) = recv((j / kLlHead) * B + j % kLlHead); });
  auto hh = Kokkos::create_mirror_view(heads);
  Kokkos::deep_copy(exec, hh, heads);
  exec.fence();
  return Verdicts::of(std::vector<int>(hh.data(), hh.data() + ep * kLlHead), static_cast<std::size_t>(ep),
                      static_cast<std::size_t>(kLlHead));
}

// Every member throws when any refused its call, after the exchange, so none waits in the next.
inline void throw_refused(const std::string& problem, int verdict, const Verdicts& v, std::int64_t capacity) {
  if (!problem.empty()) throw LayoutError(verdict == 2 ? "capacity" : "route", "ep_dispatch: " + problem);
  for (std::size_t r = 0; r < v.verdict.size(); ++r) {
    if (v.verdict[r] == 1)
      throw LayoutError("route", "ep_dispatch: moe_ep member " + std::to_string(r) +
                                     " refused its router output (its error says why); no rows were exchanged");
    if (v.verdict[r] == 2)
      throw LayoutError("capacity", "ep_dispatch: moe_ep member " + std::to_string(r) + " dispatches " +
                                        std::to_string(v.total[r]) + " rows, over the low-latency capacity of " +
                                        std::to_string(capacity) + " rows per rank; no rows were used");
  }
}

// The messages of each low-latency block, source after source: the order normal mode receives.
template <class Space, class W>
void unpack_blocks(const Space& exec, const W& recv, std::int64_t B, std::int64_t words, const std::vector<int>& rows,
                   const W& out) {
  std::int64_t at = 0;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const std::int64_t n = std::int64_t(rows[r]) * words, from = std::int64_t(r) * B + kLlHead;
    if (n > 0)
      Kokkos::deep_copy(exec, Kokkos::subview(out, Kokkos::make_pair(at, at + n)),
                        Kokkos::subview(recv, Kokkos::make_pair(from, from + n)));
    at += n;
  }
}

// Send order is destination-major: (row i, member r) gets its send row from one bucket scan, and
// d.send_rows / d.sent the counts.
template <class Space, class T, class Ids>
void send_layout(const Space& exec, EpBuffers<T, Space>& buf, Dispatched<T, Space>& d, const Ids& ids,
                 std::int64_t rows, int ep, int per_rank) {
  d.send_pos = buf.rows(buf.send_pos, "relayout::send_pos", rows, ep);
  const auto pos = d.send_pos;
  const int K = static_cast<int>(ids.extent(1));
  Kokkos::deep_copy(exec, pos, std::int64_t(-1));
  bucket_scan(
      exec, buf, ep, rows,
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
}

// Tags that travel with the rows (request ids, owners): host-side bookkeeping, not counted.
template <class C, class T, class Space>
void exchange_tags(const Space& exec, const C& comm, Dispatched<T, Space>& d, const std::vector<std::int64_t>& tags,
                   std::source_location site) {
  const int ep = comm.size();
  if (static_cast<std::int64_t>(tags.size()) != d.rows)
    throw LayoutError("tags", "ep_dispatch: " + std::to_string(tags.size()) + " tags for " + std::to_string(d.rows) +
                                  " rows; tags must stay aligned with rows");
  auto pos_h = Kokkos::create_mirror_view(d.send_pos);
  Kokkos::deep_copy(exec, pos_h, d.send_pos);
  exec.fence();
  std::vector<std::int64_t> send_tags(static_cast<std::size_t>(d.sent));
  for (std::size_t i = 0; i < pos_h.extent(0); ++i)
    for (int r = 0; r < ep; ++r)
      if (pos_h(i, r) >= 0) send_tags[static_cast<std::size_t>(pos_h(i, r))] = tags[i];
  d.tags.assign(static_cast<std::size_t>(d.received), 0);
  all_to_allv(exec, comm, send_tags, d.send_rows, d.tags, d.recv_rows, site);
}

}  // namespace impl

namespace impl {

// The received messages grouped by local expert into the experts' batch, decoded from payload P.
template <class P, class T, class Space>
void group_received(const Space& exec, Dispatched<T, Space>& d, bool indexed) {
  constexpr bool fp8 = is_fp8_payload_v<P>;
  auto& buf = d.workspace->buffers();
  const EpMessage msg = d.message;
  const std::int64_t W = msg.words(), H = d.hidden;
  const int per_rank = d.per_rank;
  const auto recv = d.received_messages;
  // Indexed: the rows are read where they arrived, message i's row at source + i * ld.
  const T* source = nullptr;
  std::int64_t ld = 0;
  if constexpr (!fp8 && std::is_same_v<P, T>)
    if (indexed && d.received > 0 && msg.bytes % std::int64_t(sizeof(T)) == 0 && msg.row % std::int64_t(sizeof(T)) == 0) {
      source = reinterpret_cast<const T*>(reinterpret_cast<const char*>(recv.data()) + msg.row);
      ld = msg.bytes / std::int64_t(sizeof(T));
    }
  d.batch = group_by_expert<T>(
      exec, buf, d.received, d.k, H,
      KOKKOS_LAMBDA(const std::int64_t i, const std::int64_t f) {
        const char* at = reinterpret_cast<const char*>(recv.data() + i * W);
        if constexpr (fp8) {
          const float s = reinterpret_cast<const float*>(at + msg.scales)[f / fp8_block];
          return static_cast<T>(e4m3_bits_to_float(reinterpret_cast<const std::uint8_t*>(at + msg.row)[f]) * s);
        } else {
          return convert<T>(reinterpret_cast<const P*>(at + msg.row)[f]);
        }
      },
      KOKKOS_LAMBDA(const std::int64_t i, const int k) {
        return reinterpret_cast<const std::int32_t*>(reinterpret_cast<const char*>(recv.data() + i * W) + msg.ids)[k];
      },
      per_rank, d.first_expert, d.slot_of, source, ld);
}

}  // namespace impl

// A dispatch in flight (ep_dispatch_start): the rows' exchange has started; test() polls it (and
// lets MPI progress it), ep_dispatch_finish waits for it and groups the batch. The workspace and
// the rows, routes and tags passed at start must stay alive and untouched until then.
template <class T, class Space = Kokkos::DefaultExecutionSpace>
struct PendingDispatch {
  using Mem = typename Space::memory_space;
  Dispatched<T, Space> d;
  CollectiveRequest request;
  bool test() { return request.test(); }

  // What the finish needs.
  Kokkos::View<std::int32_t*, Mem> ll_recv;  // low-latency mode: the blocks as they arrive
  std::int64_t block_words = 0;              // low-latency mode: words of one block
  std::int64_t capacity = 0;
  std::string problem;  // this member's refusal (it sent nothing), thrown with the others'
  int verdict = 0;
  TrafficLog* traffic = nullptr;
  std::vector<std::int64_t> tags;
  bool has_tags = false;
  std::source_location site{};
  void (*group)(const Space&, Dispatched<T, Space>&, bool) = nullptr;
  bool indexed_batch = false;
};

// Sends each of this rank's rows once to every moe_ep member that holds one of its top-k experts
// (expert e lives on member e / (experts / moe_ep)): the row, its local expert ids there and their
// weights as one message, in one all_to_allv after the counts (ws in EpMode::normal), or in one
// all_to_all of fixed blocks of ws.capacity() rows (EpMode::low_latency; more rows on any member is
// a LayoutError on every member). Collective over moe_ep: every member calls it, also with zero
// rows. Buffers come from `ws` (allocated only when they do not fit). The rows travel as
// Payload when one is named (ep_dispatch<bf16>(...): half the bytes of float rows, rounded to
// bf16, converted back to T for the experts; ep_dispatch<fp8_e4m3>(...): e4m3 values with one
// fp32 scale per 128 values, quantised as they are packed and dequantised into T as the experts'
// batch is grouped); weights and the combine stay in T.
//
// ep_dispatch_start / ep_dispatch_finish are the same call in two halves, for overlapping the
// exchange with other work (two-batch overlap): start routes, packs and (normal mode) exchanges the
// counts, then starts the rows' exchange; finish waits for it and groups the batch. Every member
// starts and finishes its dispatches in the same order; two dispatches in flight at once need
// two workspaces.
template <class Payload = void, class C, class T, class Space, class Scope>
  requires(std::same_as<Scope, DpLocal> && (std::is_void_v<Payload> || std::is_floating_point_v<Payload> ||
                                            Half16<Payload> || impl::is_fp8_payload_v<Payload>))
PendingDispatch<T, Space> ep_dispatch_start(const Space& exec, const ProcessGroupsOf<C>& pg,
                                            const Rows<T, RowShard<AttnTp>, Scope, Space>& x,
                                            const TopK<T, Space>& route, int experts, EpWorkspace<T, Space>& ws,
                                            const EpOptions& opts = {},
                                            std::source_location site = std::source_location::current()) {
  const auto& comm = pg.moe_ep();
  const int ep = comm.size();
  const std::int64_t m = x.rows(), H = x.hidden();
  impl::require_experts(experts, ep, "ep_dispatch");
  // A refused call on one member must not leave the others waiting in the exchange: it sends
  // nothing and says so beside its counts, and every member throws after the exchange.
  std::string problem = impl::route_problem(exec, route, m, experts, opts.check_route);
  const bool ll = ws.mode() == EpMode::low_latency;
  int verdict = problem.empty() ? 0 : 1;
  if (ll && verdict == 0 && m > ws.capacity()) {
    verdict = 2;
    problem = "this member dispatches " + std::to_string(m) + " rows, over the low-latency capacity of " +
              std::to_string(ws.capacity()) + " rows per rank (its EpWorkspace's)";
  }
  const int K = route.k(), per_rank = experts / ep, me = comm.rank();
  auto& buf = ws.buffers();

  PendingDispatch<T, Space> p;
  p.site = site;
  p.traffic = opts.traffic;
  p.capacity = ws.capacity();
  if (opts.tags) {
    p.tags = *opts.tags;
    p.has_tags = true;
  }
  Dispatched<T, Space>& d = p.d;
  d.workspace = &ws;
  d.rows = m;
  d.full_rows = x.full_rows();
  d.hidden = static_cast<int>(H);
  d.k = K;
  d.per_rank = per_rank;
  d.first_expert = me * per_rank;
  using P = std::conditional_t<std::is_void_v<Payload>, T, Payload>;
  constexpr bool fp8 = impl::is_fp8_payload_v<P>;
  p.group = &impl::group_received<P, T, Space>;
  p.indexed_batch = opts.indexed_batch;
  if constexpr (fp8) d.message = EpMessage::template of_fp8<compute_t<T>>(K, H);
  else d.message = EpMessage::template of<compute_t<T>, P>(K, H);
  const EpMessage msg = d.message;
  const std::int64_t W = msg.words();
  const std::int64_t B = ll ? impl::kLlHead + ws.capacity() * W : 0;  // words of one low-latency block
  if (B > std::int64_t(std::numeric_limits<int>::max()))
    throw LayoutError("capacity", "ep_dispatch: a low-latency block of " + std::to_string(ws.capacity()) + " rows of " +
                                      std::to_string(W) + " words exceeds MPI's int count; use a smaller capacity");
  p.block_words = B;

  const std::int64_t mo = verdict == 0 ? m : 0;  // a member that refused its call sends nothing
  impl::send_layout(exec, buf, d, route.ids, mo, ep, per_rank);
  const auto ids = route.ids;
  const auto pos = d.send_pos;

  // Pack each sent row's message: weights, local expert ids at the destination (-1: none), row;
  // in low-latency mode each destination's messages follow its block's head.
  const auto send = ll ? buf.flat(buf.ll_send, "relayout::ep_ll_send", ep * B)
                       : buf.flat(buf.send, "relayout::ep_send", d.sent * W);
  const auto xv = x.view();
  const auto wv = route.weights;
  const auto starts = buf.starts;
  Kokkos::parallel_for(
      "relayout::ep_dispatch.pack", Kokkos::RangePolicy<Space>(exec, 0, mo * ep), KOKKOS_LAMBDA(const std::int64_t idx) {
        const int r = static_cast<int>(idx / mo);
        const std::int64_t i = idx % mo, q = pos(i, r);
        if (q < 0) return;
        const std::int64_t word = ll ? r * B + impl::kLlHead + (q - starts(r)) * W : q * W;
        char* at = reinterpret_cast<char*>(send.data() + word);
        compute_t<T>* w = reinterpret_cast<compute_t<T>*>(at + msg.weights);
        std::int32_t* lid = reinterpret_cast<std::int32_t*>(at + msg.ids);
        for (int k = 0; k < K; ++k) {
          const int e = ids(i, k);
          const bool here = e / per_rank == r;
          lid[k] = here ? e - r * per_rank : -1;
          w[k] = here ? wv(i, k) : compute_t<T>(0);
        }
        if constexpr (fp8) {
          float* scale = reinterpret_cast<float*>(at + msg.scales);
          std::uint8_t* q8 = reinterpret_cast<std::uint8_t*>(at + msg.row);
          for (std::int64_t c = 0, b = 0; c < H; c += fp8_block, ++b)
            scale[b] = fp8_quantize_block(&xv(i, c), static_cast<int>(H - c < fp8_block ? H - c : fp8_block), q8 + c);
        } else {
          P* row = reinterpret_cast<P*>(at + msg.row);
          for (std::int64_t f = 0; f < H; ++f) row[f] = impl::convert<P>(xv(i, f));
        }
      });

  if (ll) {
    // The heads travel with the rows: the verdicts are read, and thrown, at finish.
    p.ll_recv = buf.flat(buf.ll_recv, "relayout::ep_ll_recv", ep * B);
    p.problem = std::move(problem);
    p.verdict = verdict;
    p.request = impl::post_blocks(exec, comm, buf, send, p.ll_recv, B, d.send_rows, verdict, m, site);
    return p;
  }
  const impl::Verdicts v = impl::exchange_counts(exec, comm, d.send_rows, verdict, m, site);
  impl::throw_refused(problem, verdict, v, ws.capacity());
  d.recv_rows = v.rows;
  for (int c : d.recv_rows) d.received += c;
  if (ep == 1) {
    // One member sends everything to itself: the messages it packed are the ones it receives
    // (the exchange would be a copy of them).
    d.received_messages = send;
    return p;
  }
  d.received_messages = buf.flat(buf.recv, "relayout::ep_recv", d.received * W);
  p.request = all_to_allv_start(exec, comm, send, impl::times(d.send_rows, W, "ep_dispatch"), d.received_messages,
                                impl::times(d.recv_rows, W, "ep_dispatch"), site);
  return p;
}

// The second half of ep_dispatch_start: waits for the rows, groups the experts' batch. Collective
// over moe_ep (with tags, their exchange; in low-latency mode a refusal throws here on every member).
template <class C, class T, class Space>
Dispatched<T, Space> ep_dispatch_finish(const Space& exec, const ProcessGroupsOf<C>& pg, PendingDispatch<T, Space>&& p) {
  if (!p.group || !p.d.workspace)
    throw LayoutError("pending", "ep_dispatch_finish: the PendingDispatch does not come from ep_dispatch_start (or was "
                                 "finished already)");
  const auto& comm = pg.moe_ep();
  const int ep = comm.size();
  p.request.wait();
  Dispatched<T, Space> d = std::move(p.d);
  auto& buf = d.workspace->buffers();
  const std::int64_t W = d.message.words(), B = p.block_words;
  const bool ll = B > 0;
  if (ll) {
    const impl::Verdicts v = impl::read_blocks(exec, buf, p.ll_recv, B, ep);
    impl::throw_refused(p.problem, p.verdict, v, p.capacity);
    d.recv_rows = v.rows;
    for (int c : d.recv_rows) d.received += c;
    d.received_messages = buf.flat(buf.recv, "relayout::ep_recv", d.received * W);
    impl::unpack_blocks(exec, p.ll_recv, B, W, d.recv_rows, d.received_messages);
  }
  // Low-latency mode sends its whole blocks, used or not.
  if (p.traffic && ep > 1) p.traffic->add(TrafficOp::dispatch, GroupKind::moe_ep, ll ? ep * B * 4 : d.sent * d.message.bytes);
  if (p.has_tags) impl::exchange_tags(exec, comm, d, p.tags, p.site);
  p.group(exec, d, p.indexed_batch);
  p.group = nullptr;
  exec.fence();
  return d;
}

// The whole dispatch in one call.
template <class Payload = void, class C, class T, class Space, class Scope>
  requires(std::same_as<Scope, DpLocal> && (std::is_void_v<Payload> || std::is_floating_point_v<Payload> ||
                                            Half16<Payload> || impl::is_fp8_payload_v<Payload>))
Dispatched<T, Space> ep_dispatch(const Space& exec, const ProcessGroupsOf<C>& pg,
                                 const Rows<T, RowShard<AttnTp>, Scope, Space>& x, const TopK<T, Space>& route,
                                 int experts, EpWorkspace<T, Space>& ws, const EpOptions& opts = {},
                                 std::source_location site = std::source_location::current()) {
  return ep_dispatch_finish(exec, pg, ep_dispatch_start<Payload>(exec, pg, x, route, experts, ws, opts, site));
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

// A combine in flight (ep_combine_start): the outputs' way back has started; test() polls it,
// ep_combine_finish waits for it and sums the returns. The Dispatched and the expert outputs must
// stay alive and untouched until then.
template <class T, class Space = Kokkos::DefaultExecutionSpace>
struct PendingCombine {
  const Dispatched<T, Space>* d = nullptr;
  RowsView<T, Space> back;
  int ep = 1;
  CollectiveRequest request;
  bool test() { return request.test(); }
};

// Applies the router weights to the experts' outputs, sums them per received row, sends each row
// back to where it came from and sums the returns of every destination rank: complete rows, in
// the original order, in the dispatch's workspace. Collective over moe_ep. ep_combine_start /
// ep_combine_finish are the same in two halves (see ep_dispatch_start).
template <class C, class T, class Space>
PendingCombine<T, Space> ep_combine_start(const Space& exec, const ProcessGroupsOf<C>& pg, const Dispatched<T, Space>& d,
                                          const RowsView<T, Space>& expert_y, TrafficLog* traffic = nullptr,
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
        return reinterpret_cast<const compute_t<T>*>(reinterpret_cast<const char*>(recv.data() + i * W) +
                                                     msg.weights)[k];
      },
      d.slot_of, expert_y, reduced);
  PendingCombine<T, Space> p;
  p.d = &d;
  p.ep = comm.size();
  if (comm.size() == 1) {
    p.back = reduced;  // returned to itself, in the order it was sent
    return p;
  }
  p.back = buf.rows(buf.back, "relayout::ep_back", d.sent, H);
  p.request = all_to_allv_start(exec, comm, reduced, impl::times(d.recv_rows, H, "ep_combine"), p.back,
                                impl::times(d.send_rows, H, "ep_combine"), site);
  if (traffic && comm.size() > 1) traffic->add(TrafficOp::combine, GroupKind::moe_ep, d.received * H * std::int64_t(sizeof(T)));
  return p;
}

template <class T, class Space>
Rows<T, RowShard<AttnTp>, DpLocal, Space> ep_combine_finish(const Space& exec, PendingCombine<T, Space>&& p) {
  if (!p.d) throw LayoutError("pending", "ep_combine_finish: the PendingCombine does not come from ep_combine_start");
  p.request.wait();
  const Dispatched<T, Space>& d = *p.d;
  p.d = nullptr;
  // One member that sent every row to itself: the weighted sums are its rows, in their order (the
  // send order of one destination is the row order), so they are the result as they stand.
  if (p.ep == 1 && d.sent == d.rows) {
    exec.fence();
    return Rows<T, RowShard<AttnTp>, DpLocal, Space>(p.back, d.full_rows);
  }
  auto& buf = d.workspace->buffers();
  const std::int64_t H = d.hidden;
  const auto out = buf.rows(buf.combined, "relayout::ep_combined", d.rows, H);
  const auto pos = d.send_pos;
  const auto back = p.back;
  const int ep = p.ep;
  Kokkos::parallel_for(
      "relayout::ep_combine.sum", Kokkos::RangePolicy<Space>(exec, 0, d.rows), KOKKOS_LAMBDA(const std::int64_t i) {
        using C = compute_t<T>;
        if constexpr (!std::is_same_v<T, C>) {  // bf16 / fp16 rows: a float sum, rounded once
          constexpr std::int64_t kChunk = 32;  // a chunk of the row in fp32 accumulators
          for (std::int64_t f0 = 0; f0 < H; f0 += kChunk) {
            const std::int64_t width = H - f0 < kChunk ? H - f0 : kChunk;
            C acc[kChunk] = {};
            for (int r = 0; r < ep; ++r) {
              const std::int64_t q = pos(i, r);
              if (q < 0) continue;
              for (std::int64_t j = 0; j < width; ++j) acc[j] += C(back(q, f0 + j));
            }
            for (std::int64_t j = 0; j < width; ++j) out(i, f0 + j) = T(acc[j]);
          }
        } else {
          // Return by return, each along its row; every element sums the returns in member order.
          for (std::int64_t f = 0; f < H; ++f) out(i, f) = T(0);
          for (int r = 0; r < ep; ++r) {
            const std::int64_t q = pos(i, r);
            if (q < 0) continue;
            for (std::int64_t f = 0; f < H; ++f) out(i, f) += back(q, f);
          }
        }
      });
  exec.fence();
  return Rows<T, RowShard<AttnTp>, DpLocal, Space>(out, d.full_rows);
}

// The whole combine in one call.
template <class C, class T, class Space>
Rows<T, RowShard<AttnTp>, DpLocal, Space> ep_combine(const Space& exec, const ProcessGroupsOf<C>& pg,
                                                     const Dispatched<T, Space>& d,
                                                     const RowsView<T, Space>& expert_y,
                                                     TrafficLog* traffic = nullptr,
                                                     std::source_location site = std::source_location::current()) {
  return ep_combine_finish(exec, ep_combine_start(exec, pg, d, expert_y, traffic, site));
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

}  // namespace relayout
