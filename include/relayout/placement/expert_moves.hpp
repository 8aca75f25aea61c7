// Moving expert weights when an expert location changes. expert_moves plans, from the two maps
// alone (no communicator), which moe_ep member sends which of its slots to which member's slot;
// ExpertWeightsFor is what an engine's weights must offer; move_expert_weights carries a plan out
// over moe_ep with the library's collectives, writing only the slots the plan says receive.
// Slots follow ExpertLocation: member r holds physical [r * per_rank, (r + 1) * per_rank), and its
// local slot s is physical r * per_rank + s.
#pragma once

#include <algorithm>
#include <bit>
#include <climits>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <exception>
#include <numeric>
#include <source_location>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <Kokkos_Core.hpp>

#include "relayout/comm/agreement.hpp"
#include "relayout/comm/all_gather.hpp"
#include "relayout/comm/all_to_allv.hpp"
#include "relayout/placement/expert_location.hpp"

namespace relayout {

// One slot's weights to copy: logical expert `logical`, held before the move by local slot
// src_slot of member src_rank, goes to local slot dst_slot of member dst_rank.
struct ExpertMove {
  int logical = 0, src_rank = 0, src_slot = 0, dst_rank = 0, dst_slot = 0;
  bool local() const { return src_rank == dst_rank; }  // a copy within one member, no communication
  friend bool operator==(const ExpertMove&, const ExpertMove&) = default;
};

// One member's part of a plan, in slots (one physical expert's weights each).
struct MemberMoves {
  int sent = 0;      // slots it sends to other members
  int received = 0;  // slots it receives from other members
  int local = 0;     // slots it fills from one of its own slots
  friend bool operator==(const MemberMoves&, const MemberMoves&) = default;
};

// Every slot whose logical expert changes, ascending by destination physical slot; slots that keep
// their expert move nothing. Made by expert_moves; the same maps give the same plan on every rank.
class ExpertMovePlan {
 public:
  int routed() const { return routed_; }
  int ep() const { return ep_; }
  int per_rank() const { return per_rank_; }
  const std::vector<ExpertMove>& moves() const { return moves_; }
  bool empty() const { return moves_.empty(); }

  std::vector<MemberMoves> per_member() const {
    std::vector<MemberMoves> out(static_cast<std::size_t>(ep_));
    for (const ExpertMove& m : moves_) {
      ++(m.local() ? out[static_cast<std::size_t>(m.dst_rank)].local : out[static_cast<std::size_t>(m.src_rank)].sent);
      if (!m.local()) ++out[static_cast<std::size_t>(m.dst_rank)].received;
    }
    return out;
  }
  // Slots that cross between members (local copies excluded).
  int remote() const { return static_cast<int>(std::ranges::count_if(moves_, [](const ExpertMove& m) { return !m.local(); })); }
  // The most slots one member sends or receives: times the bytes of a slot (expert_slot_bytes),
  // what the busiest member's link carries in one direction.
  int busiest() const {
    int most = 0;
    for (const MemberMoves& m : per_member()) most = std::max({most, m.sent, m.received});
    return most;
  }
  // A 64-bit digest of the plan: equal plans give equal digests on every machine.
  std::uint64_t fingerprint() const {
    std::uint64_t h = 0xcbf29ce484222325ull;
    const auto mix = [&h](int v) { h = (h ^ static_cast<std::uint32_t>(v)) * 0x100000001b3ull; };
    for (int v : {routed_, ep_, per_rank_, static_cast<int>(moves_.size())}) mix(v);
    for (const ExpertMove& m : moves_)
      for (int v : {m.logical, m.src_rank, m.src_slot, m.dst_rank, m.dst_slot}) mix(v);
    return h;
  }
  // "5 slots change (3 between members, 2 local copies; busiest member 2 slots = 4096 bytes): member 0
  // sends 1, receives 2, copies 0 | ..." (the bytes only when slot_bytes > 0).
  std::string describe(std::int64_t slot_bytes = 0) const {
    const int r = remote(), b = busiest();
    std::string out = std::to_string(moves_.size()) + " slots change (" + std::to_string(r) + " between members, " +
                      std::to_string(static_cast<int>(moves_.size()) - r) + " local copies; busiest member " +
                      std::to_string(b) + " slots" + (slot_bytes > 0 ? " = " + std::to_string(b * slot_bytes) + " bytes)" : ")");
    const auto pm = per_member();
    for (std::size_t m = 0; m < pm.size(); ++m)
      out += (m ? " | member " : ": member ") + std::to_string(m) + " sends " + std::to_string(pm[m].sent) +
             ", receives " + std::to_string(pm[m].received) + ", copies " + std::to_string(pm[m].local);
    return out;
  }

 private:
  friend ExpertMovePlan expert_moves(const ExpertLocation& from, const ExpertLocation& to);
  ExpertMovePlan(int routed, int ep, int per_rank, std::vector<ExpertMove> moves)
      : routed_(routed), ep_(ep), per_rank_(per_rank), moves_(std::move(moves)) {}
  int routed_ = 0, ep_ = 1, per_rank_ = 0;
  std::vector<ExpertMove> moves_;
};

namespace impl {

// The physical slot (in `from`) that sends `logical` to member dst: the lowest one on dst itself
// (a local copy); else one on the member that has sent the fewest slots so far, the lowest
// member and slot on ties, so the sends of a replicated expert are spread over its holders.
inline int move_source(const ExpertLocation& from, int logical, int dst, const std::vector<int>& sent) {
  int best = -1;
  for (int q : from.replicas_of(logical)) {  // ascending
    if (from.rank_of(q) == dst) return q;
    if (best < 0 || sent[static_cast<std::size_t>(from.rank_of(q))] < sent[static_cast<std::size_t>(from.rank_of(best))])
      best = q;
  }
  return best;
}

// A writable 1-D View of T that Space can reach (by value or reference).
template <class V, class T, class Space>
concept ExpertTensorView = Kokkos::is_view<std::remove_cvref_t<V>>::value && std::remove_cvref_t<V>::rank == 1 &&
                           std::same_as<typename std::remove_cvref_t<V>::value_type, T> &&
                           bool(Kokkos::SpaceAccessibility<Space, typename std::remove_cvref_t<V>::memory_space>::accessible);

// What each member says about its arguments before any weights move, all_gather-ed as int64
// words: the plan's fingerprint, the element type's name, the tensors per slot and their extents,
// then its own problem with them (text; empty when fine).
struct MoveRecord {
  static constexpr int kMaxTensors = 16, kProblemWords = 32, plan = 0, dtype = 1, tensors = 2, extents = 3;
  static constexpr int problem = extents + kMaxTensors, kWords = problem + kProblemWords;
};

inline std::string record_text(const std::int64_t* words, int n) {  // up to the first '\0'
  const std::string_view v(reinterpret_cast<const char*>(words), static_cast<std::size_t>(n) * 8);
  return std::string(v.substr(0, v.find('\0')));
}

// This member's own problem with its arguments ("" when none): plan and group sizes, slot count,
// tensors per slot, contiguity, each slot's extents against slot 0's.
template <class C, class W>
std::string local_move_problem(const C& comm, const ExpertMovePlan& plan, const W& w) {
  if (plan.ep() != comm.size())
    return "the plan is for moe_ep = " + std::to_string(plan.ep()) + " members, the communicator has " +
           std::to_string(comm.size()) + " (pass the moe_ep communicator)";
  if (w.slots() != plan.per_rank())
    return "the weights have " + std::to_string(w.slots()) + " local slots, the map has " +
           std::to_string(plan.per_rank()) + " per member";
  if (w.tensors() < 1 || w.tensors() > MoveRecord::kMaxTensors)
    return "the weights have " + std::to_string(w.tensors()) + " tensors per slot; 1 to " +
           std::to_string(MoveRecord::kMaxTensors) + " are supported";
  for (int t = 0; t < w.tensors(); ++t) {
    const auto n0 = w.tensor(0, t).extent(0);
    for (int s = 0; s < w.slots(); ++s) {
      const auto v = w.tensor(s, t);
      if (!v.span_is_contiguous())
        return "tensor " + std::to_string(t) + " of slot " + std::to_string(s) + " is not contiguous";
      if (v.extent(0) != n0)
        return "tensor " + std::to_string(t) + " of slot " + std::to_string(s) + " has " + std::to_string(v.extent(0)) +
               " elements, slot 0's has " + std::to_string(n0) + " (every slot's tensor t has the same extent)";
    }
  }
  return {};
}

template <class C, class W>
std::vector<std::int64_t> move_record(const C& comm, const ExpertMovePlan& plan, const W& w) {
  std::vector<std::int64_t> r(MoveRecord::kWords, 0);
  r[MoveRecord::plan] = std::bit_cast<std::int64_t>(plan.fingerprint());
  const std::string_view dtype = scalar_name<typename W::value_type>();
  std::memcpy(&r[MoveRecord::dtype], dtype.data(), std::min<std::size_t>(dtype.size(), 7));
  std::string problem;
  try {
    problem = local_move_problem(comm, plan, w);
    if (problem.empty()) {
      r[MoveRecord::tensors] = w.tensors();
      for (int t = 0; t < w.tensors(); ++t)
        r[static_cast<std::size_t>(MoveRecord::extents + t)] = static_cast<std::int64_t>(w.tensor(0, t).extent(0));
    }
  } catch (const std::exception& e) {
    problem = std::string("describing its weights threw: ") + e.what();
  }
  std::memcpy(&r[MoveRecord::problem], problem.data(), std::min<std::size_t>(problem.size(), MoveRecord::kProblemWords * 8 - 1));
  return r;
}

// "2 tensors of [5 3] bf16 elements"
inline std::string record_shape(const std::int64_t* r) {
  std::string out = std::to_string(r[MoveRecord::tensors]) + " tensors of [";
  for (std::int64_t t = 0; t < r[MoveRecord::tensors]; ++t) out += (t ? " " : "") + std::to_string(r[MoveRecord::extents + t]);
  return out + "] " + record_text(r + MoveRecord::dtype, 1) + " elements";
}

// The members whose record fields [first, last) differ from member 0's.
inline std::vector<int> differing(const std::vector<std::int64_t>& all, int first, int last) {
  std::vector<int> out;
  const auto at = [&all](std::size_t m, int f) { return all.begin() + static_cast<std::ptrdiff_t>(m * MoveRecord::kWords) + f; };
  for (std::size_t m = 1; m < all.size() / MoveRecord::kWords; ++m)
    if (!std::equal(at(0, first), at(0, last), at(m, first))) out.push_back(static_cast<int>(m));
  return out;
}

// The verdict over every member's record ("" when all agree); every member computes the same text.
inline std::string move_verdict(const std::vector<std::int64_t>& all) {
  const std::size_t n = all.size() / MoveRecord::kWords;
  std::string problems;
  for (std::size_t m = 0; m < n; ++m) {
    const std::string p = record_text(all.data() + m * MoveRecord::kWords + MoveRecord::problem, MoveRecord::kProblemWords);
    if (!p.empty()) problems += (problems.empty() ? "member " : "; member ") + std::to_string(m) + ": " + p;
  }
  if (!problems.empty()) return problems;
  if (const auto d = differing(all, MoveRecord::plan, MoveRecord::plan + 1); !d.empty())
    return "members " + member_list(d) +
           " pass another plan than member 0 (every member passes expert_moves of the same two maps)";
  if (const auto d = differing(all, MoveRecord::dtype, MoveRecord::problem); !d.empty())
    return "members " + member_list(d) + " describe a slot as " +
           record_shape(all.data() + static_cast<std::size_t>(d.front()) * MoveRecord::kWords) + ", member 0 as " +
           record_shape(all.data()) + " (every member's slots have the same tensors)";
  return {};
}

// Gathers every member's record over comm and throws the same LayoutError on every member unless
// all are fine and agree. Returns the elements of one slot (its tensors' extents summed).
template <class E, class C, class W>
std::int64_t agree_on_moves(const E& exec, const C& comm, const ExpertMovePlan& plan, const W& w, std::source_location site) {
  const std::vector<std::int64_t> mine = move_record(comm, plan, w);
  std::vector<std::int64_t> all(mine.size() * static_cast<std::size_t>(comm.size()));
  all_gather(exec, comm, std::span<const std::int64_t>(mine), std::span<std::int64_t>(all), site);
  const std::string verdict = move_verdict(all);
  if (!verdict.empty())
    throw LayoutError("expert_weights", "move_expert_weights (called at " + std::string(short_file(site.file_name())) +
                                            ":" + std::to_string(site.line()) + "): " + verdict +
                                            "; no member moved any weights");
  return std::accumulate(mine.begin() + MoveRecord::extents, mine.begin() + MoveRecord::problem, std::int64_t(0));
}

// This member's moves of one role laid out in a staging buffer, S elements per slot: peer by peer
// in rank order, each pair's moves in plan order, so both ends of a pair place each slot alike
// (local copies: this member is the peer).
enum class MoveRole { send, receive, local };
struct MoveSide {
  std::vector<std::pair<std::size_t, std::int64_t>> at;  // (index in plan.moves(), first element)
  std::vector<std::int64_t> first, count;                // per peer: first element, elements
  std::int64_t total() const { return first.back() + count.back(); }
};

inline MoveSide move_side(const ExpertMovePlan& plan, int me, MoveRole role, std::int64_t S) {
  const auto ep = static_cast<std::size_t>(plan.ep());
  MoveSide s{{}, std::vector<std::int64_t>(ep, 0), std::vector<std::int64_t>(ep, 0)};
  std::vector<std::vector<std::size_t>> by_peer(ep);
  for (std::size_t i = 0; i < plan.moves().size(); ++i) {
    const ExpertMove& m = plan.moves()[i];
    const int mine = role == MoveRole::send ? m.src_rank : m.dst_rank, peer = role == MoveRole::send ? m.dst_rank : m.src_rank;
    if (mine == me && m.local() == (role == MoveRole::local)) by_peer[static_cast<std::size_t>(peer)].push_back(i);
  }
  std::int64_t pos = 0;
  for (std::size_t j = 0; j < ep; ++j) {
    s.first[j] = pos;
    for (std::size_t i : by_peer[j]) s.at.emplace_back(i, std::exchange(pos, pos + S));
    s.count[j] = pos - s.first[j];
  }
  return s;
}

// The exchange of the packed slots, collective over comm: one all_to_allv when no member sends or
// receives more than `limit` elements in all (the collectives count and place elements with ints),
// else shift by shift (member i sends to i + d) in pieces of at most `limit` elements. Every member
// takes the same steps: they follow from the plan.
template <class E, class C, class Buf>
void exchange_moves(const E& exec, const C& comm, const ExpertMovePlan& plan, std::int64_t S, std::int64_t limit,
                    const MoveSide& out, const MoveSide& in, const Buf& send, const Buf& recv, std::source_location site) {
  const auto ep = static_cast<std::size_t>(plan.ep()), me = static_cast<std::size_t>(comm.rank());
  std::vector<std::int64_t> pair(ep * ep, 0), sent(ep, 0), received(ep, 0);
  for (const ExpertMove& m : plan.moves()) {
    const auto i = static_cast<std::size_t>(m.src_rank), j = static_cast<std::size_t>(m.dst_rank);
    if (!m.local()) pair[i * ep + j] += S, sent[i] += S, received[j] += S;
  }
  const std::int64_t most = std::max(std::ranges::max(sent), std::ranges::max(received));
  if (most == 0) return;  // nothing crosses between members
  if (most <= limit) return all_to_allv(exec, comm, send, out.count, recv, in.count, site);
  for (std::size_t d = 1; d < ep; ++d) {
    std::int64_t pieces = 0;
    for (std::size_t i = 0; i < ep; ++i) pieces = std::max(pieces, (pair[i * ep + (i + d) % ep] + limit - 1) / limit);
    const std::size_t to = (me + d) % ep, from = (me + ep - d) % ep;
    for (std::int64_t c = 0; c < pieces; ++c) {
      std::vector<std::int64_t> sc(ep, 0), rc(ep, 0);
      sc[to] = std::clamp<std::int64_t>(out.count[to] - c * limit, 0, limit);
      rc[from] = std::clamp<std::int64_t>(in.count[from] - c * limit, 0, limit);
      const std::int64_t s0 = out.first[to] + c * limit, r0 = in.first[from] + c * limit;
      all_to_allv(exec, comm, Kokkos::subview(send, Kokkos::make_pair(s0, s0 + sc[to])), sc,
                  Kokkos::subview(recv, Kokkos::make_pair(r0, r0 + rc[from])), rc, site);
    }
  }
}

// Copies slot `slot`'s tensors to (out = true) or from a staging buffer at element offset `at`, on exec.
template <class E, class W, class Buf>
void copy_slot(const E& exec, const W& w, int slot, const Buf& buf, std::int64_t at, bool out) {
  for (int t = 0; t < w.tensors(); ++t) {
    const auto v = w.tensor(slot, t);
    const auto n = static_cast<std::int64_t>(v.extent(0));
    const auto part = Kokkos::subview(buf, Kokkos::make_pair(at, at + n));
    if (out) Kokkos::deep_copy(exec, part, v);
    else Kokkos::deep_copy(exec, v, part);
    at += n;
  }
}

// The moves of an agreed plan, S elements per slot, in messages of at most `limit` elements: every
// slot sent or copied is packed into staging buffers on exec before any slot is written (the
// exchange fences exec before reading them), then the receiving slots are written. Fences exec.
template <class E, class C, class W>
void carry_out_moves(const E& exec, const C& comm, const ExpertMovePlan& plan, const W& weights, std::int64_t S,
                     std::int64_t limit, std::source_location site) {
  using Buf = Kokkos::View<typename W::value_type*, typename E::memory_space>;
  const int me = comm.rank();
  const MoveSide out = move_side(plan, me, MoveRole::send, S), in = move_side(plan, me, MoveRole::receive, S);
  const MoveSide local = move_side(plan, me, MoveRole::local, S);
  const auto alloc = [&](const char* label, const MoveSide& side) {
    return Buf(Kokkos::view_alloc(exec, Kokkos::WithoutInitializing, std::string(label)), static_cast<std::size_t>(side.total()));
  };
  const Buf send = alloc("relayout::expert_moves.send", out), recv = alloc("relayout::expert_moves.recv", in);
  const Buf copies = alloc("relayout::expert_moves.local", local);
  for (const auto& [i, at] : out.at) copy_slot(exec, weights, plan.moves()[i].src_slot, send, at, true);
  for (const auto& [i, at] : local.at) copy_slot(exec, weights, plan.moves()[i].src_slot, copies, at, true);
  exchange_moves(exec, comm, plan, S, limit, out, in, send, recv, site);
  for (const auto& [i, at] : in.at) copy_slot(exec, weights, plan.moves()[i].dst_slot, recv, at, false);
  for (const auto& [i, at] : local.at) copy_slot(exec, weights, plan.moves()[i].dst_slot, copies, at, false);
  exec.fence();  // the staging buffers end with this call
}

}  // namespace impl

// The moves that turn the weights laid out by `from` into those laid out by `to`. Pure host code;
// both maps must have the same routed experts, physical slots and moe_ep (a LayoutError otherwise).
inline ExpertMovePlan expert_moves(const ExpertLocation& from, const ExpertLocation& to) {
  if (from.routed() != to.routed() || from.ep() != to.ep() || from.physical() != to.physical()) {
    const auto shape = [](const ExpertLocation& l) {
      return std::to_string(l.routed()) + " routed experts onto " + std::to_string(l.physical()) +
             " physical slots over moe_ep = " + std::to_string(l.ep());
    };
    throw LayoutError("expert_location", "expert_moves: `from` maps " + shape(from) + ", `to` maps " + shape(to) +
                                             "; a rebalance keeps the routed experts, the physical slots and moe_ep "
                                             "(only the logical expert each slot holds changes)");
  }
  const int per = from.per_rank();
  std::vector<int> sent(static_cast<std::size_t>(from.ep()), 0);
  std::vector<ExpertMove> moves;
  for (int p = 0; p < to.physical(); ++p) {
    const int l = to.logical_of(p);
    if (from.logical_of(p) == l) continue;
    const int dst = to.rank_of(p), q = impl::move_source(from, l, dst, sent), src = from.rank_of(q);
    if (src != dst) ++sent[static_cast<std::size_t>(src)];
    moves.push_back(ExpertMove{l, src, q - src * per, dst, p - dst * per});
  }
  return ExpertMovePlan(from.routed(), from.ep(), per, std::move(moves));
}

// An engine's expert weights on one moe_ep member, for execution space Space: slots() local slots
// (the map's per_rank), each made of tensors() contiguous 1-D Views tensor(slot, t) of one element
// type, value_type; tensor t has the same extent in every slot. The engine owns the memory (an
// unmanaged View over it is fine); move_expert_weights writes only into receiving slots.
template <class W, class Space>
concept ExpertWeightsFor = Kokkos::is_execution_space<Space>::value && CommScalar<typename W::value_type> &&
                           requires(const W& w, int slot, int t) {
                             { w.slots() } -> std::convertible_to<int>;
                             { w.tensors() } -> std::convertible_to<int>;
                             { w.tensor(slot, t) } -> impl::ExpertTensorView<typename W::value_type, Space>;
                           };

// Bytes of one slot's weights (every tensor of slot 0): times MemberMoves counts, what a plan costs.
template <class W>
std::int64_t expert_slot_bytes(const W& w) {
  std::int64_t n = 0;
  for (int t = 0; w.slots() > 0 && t < w.tensors(); ++t) n += static_cast<std::int64_t>(w.tensor(0, t).extent(0));
  return n * static_cast<std::int64_t>(sizeof(typename W::value_type));
}

// Carries out `plan` on this member's weights; collective over comm, the moe_ep group (member r of
// comm is member r of the maps), called by every member, with nothing to move too. The members
// first agree on their arguments (one all_gather): a problem on any member (slot count, shapes,
// element type, another plan) is the same LayoutError on every member, and nothing is written.
// Every slot sent or copied is packed into staging buffers allocated in exec's memory before any
// slot is written, so swaps and cycles are safe; sends go by all_to_allv on exec (peer by peer, in
// pieces, past an int count), local copies without communication. Only receiving slots are written.
// Precondition: work on the weights is finished or ordered on exec. Returns with exec fenced.
template <ExecutionSpaceInstance E, Communicator C, class W>
  requires ExpertWeightsFor<W, E>
void move_expert_weights(const E& exec, const C& comm, const ExpertMovePlan& plan, const W& weights,
                         std::source_location site = std::source_location::current()) {
  const std::int64_t S = impl::agree_on_moves(exec, comm, plan, weights, site);
  if (plan.empty() || S == 0) return;
  impl::carry_out_moves(exec, comm, plan, weights, S, INT_MAX, site);
}

}  // namespace relayout
