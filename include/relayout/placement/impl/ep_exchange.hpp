// The exchange behind EpBuffer (placement/ep.hpp): the counting sorts, the verdicts that travel
// with the counts, the low-latency blocks and the tags; the messages themselves (packing, decoding
// into the experts' batch, summing the returns) are in ep_messages.hpp. Internal: engines use
// EpBuffer.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <source_location>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <Kokkos_Core.hpp>

#include "relayout/comm.hpp"
#include "relayout/placement/ep_message.hpp"
#include "relayout/placement/experts.hpp"
#include "relayout/placement/fp8.hpp"
#include "relayout/placement/traffic.hpp"

namespace relayout::impl {

// One dispatch's state, shared by its handle and its exchanges in flight. `mem` is the buffer
// memory it uses; it is reused by a later dispatch only once no handle points at it.
template <class T, class Space>
struct EpState {
  using Mem = typename Space::memory_space;
  std::shared_ptr<EpBuffers<T, Space>> mem;
  ExpertBatch<T, Space> batch;
  Kokkos::View<std::int64_t**, Kokkos::LayoutRight, Mem> send_pos;  // (row, rank) -> send row, -1 none
  Kokkos::View<std::int64_t**, Kokkos::LayoutRight, Mem> slot_of;   // (recv row, k) -> batch row, -1
  Kokkos::View<std::int32_t*, Mem> received_messages;               // received x message.words()
  EpMessage message;
  std::vector<int> send_rows, recv_rows;  // per moe_ep member
  std::vector<std::int64_t> tags;         // the received rows' tags, when the dispatch carried tags
  std::int64_t rows = 0, full_rows = 0, received = 0, sent = 0;
  int hidden = 0, k = 0, per_rank = 0, first_expert = 0;
  EpMode mode = EpMode::normal;
  DispatchDtype dtype = DispatchDtype::compute;
  TrafficLog* traffic = nullptr;
  std::uint32_t digest = 0;  // of the step's token counts, agreed with the other members
};

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

// Words ahead of each low-latency block: the rows in it, the sender's verdict, the sender's rows
// and the digest of the sender's token counts.
inline constexpr std::int64_t kLlHead = 4;

// A member's verdict on its own call, sent beside its counts so that every member refuses together.
enum Verdict : int { kFine = 0, kRouteRefused = 1, kOverCapacity = 2, kCallRefused = 3, kCountsRefused = 4 };

// What every member said about its own call: per member, the rows it sends here, its verdict, its
// rows and the digest of the token counts it was given.
struct Verdicts {
  std::vector<int> rows, verdict, total, digest;
  static Verdicts of(const std::vector<int>& words, std::size_t ep, std::size_t stride) {
    Verdicts v;
    for (std::size_t r = 0; r < ep; ++r) {
      v.rows.push_back(words[r * stride]);
      v.verdict.push_back(words[r * stride + 1]);
      v.total.push_back(words[r * stride + 2]);
      v.digest.push_back(words[r * stride + 3]);
    }
    return v;
  }
};

inline int clamp_int(std::int64_t v) {
  return v > std::numeric_limits<int>::max() ? std::numeric_limits<int>::max() : static_cast<int>(v);
}

// A 31-bit digest of a step's token counts (0 for none given): members compare it in the exchange.
inline std::uint32_t counts_digest(std::span<const std::int64_t> counts) {
  if (counts.empty()) return 0;
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::int64_t c : counts) h = (h ^ static_cast<std::uint64_t>(c)) * 0x100000001b3ull;
  return static_cast<std::uint32_t>((h ^ (h >> 32)) & 0x7fffffffu) | 1u;
}

// What this member puts beside its counts.
struct OwnVerdict {
  int verdict = kFine;
  std::int64_t rows = 0;
  std::uint32_t digest = 0;
};

// Normal mode's first exchange: the counts, each with the sender's verdict, in one all_to_all.
template <class Space, class C>
Verdicts exchange_counts(const Space& exec, const C& comm, const std::vector<int>& send_rows, const OwnVerdict& own,
                         std::source_location site) {
  const std::size_t ep = send_rows.size();
  std::vector<int> out(4 * ep), in(out.size());
  for (std::size_t r = 0; r < ep; ++r) {
    out[4 * r] = send_rows[r];
    out[4 * r + 1] = own.verdict;
    out[4 * r + 2] = clamp_int(own.rows);
    out[4 * r + 3] = static_cast<int>(own.digest);
  }
  all_to_all(exec, comm, std::span<const int>(out), std::span<int>(in), site);
  return Verdicts::of(in, ep, 4);
}

// Low-latency mode's one exchange: block r of `send` (a head, then up to capacity messages) goes
// to member r in one all_to_all of equal blocks of B words, started here (read_blocks reads the
// heads that arrived once it completes).
template <class Space, class C, class T>
CollectiveRequest post_blocks(const Space& exec, const C& comm, EpBuffers<T, Space>& buf,
                              const Kokkos::View<std::int32_t*, typename Space::memory_space>& send,
                              const Kokkos::View<std::int32_t*, typename Space::memory_space>& recv, std::int64_t B,
                              const std::vector<int>& send_rows, const OwnVerdict& own, std::source_location site) {
  const std::int64_t ep = static_cast<std::int64_t>(send_rows.size());
  const auto heads = buf.flat(buf.ll_heads, "relayout::ep_ll_heads", ep * kLlHead);
  auto hh = Kokkos::create_mirror_view(heads);
  for (std::int64_t r = 0; r < ep; ++r) {
    hh(r * kLlHead) = send_rows[static_cast<std::size_t>(r)];
    hh(r * kLlHead + 1) = own.verdict;
    hh(r * kLlHead + 2) = clamp_int(own.rows);
    hh(r * kLlHead + 3) = static_cast<int>(own.digest);
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

// Every member throws when any refused its call, or when the members were given different token
// counts, after the exchange, so none waits in the next. `call` names the engine's entry point and
// `at` its call site (" (called at file:line)"), which ends every message.
inline void throw_refused(const std::string& call, const std::string& problem, const OwnVerdict& own,
                          const Verdicts& v, std::int64_t capacity, const std::string& at = {}) {
  static const char* const kInput[] = {"rows", "route", "capacity", "rows", "global_num_tokens"};
  if (!problem.empty())
    throw LayoutError(own.verdict >= 0 && own.verdict <= kCountsRefused ? kInput[own.verdict] : "rows",
                      call + ": " + problem + at);
  for (std::size_t r = 0; r < v.verdict.size(); ++r) {
    const std::string who = call + ": moe_ep member " + std::to_string(r);
    if (v.verdict[r] == kRouteRefused)
      throw LayoutError("route", who + " refused its router output (its error says why); no rows were exchanged" + at);
    if (v.verdict[r] == kOverCapacity)
      throw LayoutError("capacity", who + " dispatches " + std::to_string(v.total[r]) +
                                        " rows, over the low-latency capacity of " + std::to_string(capacity) +
                                        " rows per rank; no rows were used" + at);
    if (v.verdict[r] == kCallRefused)
      throw LayoutError("rows", who + " refused its call (its error says why); no rows were exchanged" + at);
    if (v.verdict[r] == kCountsRefused)
      throw LayoutError("global_num_tokens", who + " holds rows that disagree with the step's token counts "
                                                   "(global_num_tokens; its error says how); no rows were exchanged" + at);
  }
  for (std::size_t r = 0; r < v.digest.size(); ++r)
    if (v.digest[r] != static_cast<int>(own.digest))
      throw LayoutError("global_num_tokens", call + ": moe_ep member " + std::to_string(r) +
                                                 " was given other token counts (global_num_tokens) than this member; "
                                                 "every rank of a step must pass the same counts" + at);
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
void send_layout(const Space& exec, EpBuffers<T, Space>& buf, EpState<T, Space>& d, const Ids& ids,
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
void exchange_tags(const Space& exec, const C& comm, EpState<T, Space>& d, const std::vector<std::int64_t>& tags,
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

}  // namespace relayout::impl
