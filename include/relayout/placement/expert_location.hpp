// Where each routed expert's weights live when hot experts have replicas: a map from logical
// experts (the router's ids) to physical experts (weight copies; routed + redundant of them, split
// evenly over moe_ep, physical p on member p / per_rank), built statically or by an EPLB-style
// rebalancer from measured loads; the replica each token's expert goes to, computed alike on every
// rank; and the per-step loads. No communicator: the collectives over a map (the loads summed, the
// map agreed) are in expert_location_sync.hpp. See docs/bridge.md.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <queue>
#include <span>
#include <string>
#include <vector>

#include <Kokkos_Core.hpp>

#include "relayout/mesh/error.hpp"

namespace relayout {

// How a token's logical expert becomes one of its replicas (SGLang's --ep-dispatch-algorithm).
enum class ReplicaChoice : std::uint8_t {
  // "static": each source rank sends all its tokens of a logical expert to one replica: the one on
  // itself if it holds one, else the ranks without one are dealt over the replicas in turn.
  static_per_rank,
  // "dynamic", made deterministic: replica (global token index + logical id) mod replicas, so the
  // tokens of an expert spread evenly over its replicas and any rank can tell where a token went.
  by_token,
};

inline const char* to_string(ReplicaChoice c) { return c == ReplicaChoice::by_token ? "by_token" : "static_per_rank"; }

// The rebalancer's topology: with nodes > 1 and groups % nodes == 0 it is hierarchical (expert
// groups packed onto nodes first, then replicas within each node); otherwise global.
struct EplbOptions {
  int nodes = 1;   // moe_ep members split evenly into nodes (the faster links within one)
  int groups = 1;  // the router's expert groups (n_group), contiguous blocks of routed / groups
};

class ExpertLocation {
 public:
  // Static placement: physical p holds logical p mod routed (with no redundant experts, physical
  // p = logical p, the layout of a plain EP dispatch).
  static ExpertLocation identity(int routed, int redundant, int ep) {
    check_sizes(routed, redundant, ep);
    std::vector<int> map(static_cast<std::size_t>(routed + redundant));
    for (std::size_t p = 0; p < map.size(); ++p) map[p] = static_cast<int>(p % static_cast<std::size_t>(routed));
    return ExpertLocation(routed, ep, std::move(map));
  }

  // A given physical -> logical map (from a file, another planner, ...), checked to be one.
  static ExpertLocation from_map(int routed, int ep, std::vector<int> physical_to_logical) {
    const auto physical = static_cast<long long>(physical_to_logical.size());
    check_sizes(routed, static_cast<int>(std::min<long long>(physical - routed, 1 << 30)), ep);
    return ExpertLocation(routed, ep, std::move(physical_to_logical));
  }

  // Rebalanced for a measured load per logical expert (tokens routed to it over some steps); see
  // impl::eplb below and docs/bridge.md "Expert locations and rebalancing".
  static ExpertLocation rebalanced(std::span<const double> load, int redundant, int ep, const EplbOptions& opts = {});

  int routed() const { return routed_; }
  int physical() const { return static_cast<int>(phys_to_log_.size()); }
  int redundant() const { return physical() - routed_; }
  int ep() const { return ep_; }
  int per_rank() const { return physical() / ep_; }
  int rank_of(int physical) const { return physical / per_rank(); }
  int logical_of(int physical) const { return phys_to_log_.at(static_cast<std::size_t>(physical)); }
  int replicas(int logical) const { return static_cast<int>(log_to_phys_.at(static_cast<std::size_t>(logical)).size()); }
  // The physical ids of a logical expert's replicas, ascending.
  const std::vector<int>& replicas_of(int logical) const { return log_to_phys_.at(static_cast<std::size_t>(logical)); }
  int max_replicas() const {
    std::size_t m = 0;
    for (const auto& r : log_to_phys_) m = std::max(m, r.size());
    return static_cast<int>(m);
  }
  const std::vector<int>& physical_to_logical() const { return phys_to_log_; }

  // The physical expert that logical expert `logical` of token `global_token` (its index in the
  // step's global token order), routed on moe_ep member `source_rank`, goes to.
  int choose(int logical, std::int64_t global_token, int source_rank, ReplicaChoice c) const {
    const auto& r = replicas_of(logical);
    if (c == ReplicaChoice::static_per_rank) return static_choices(source_rank)[static_cast<std::size_t>(logical)];
    if (global_token < 0)
      throw LayoutError("global_token", "expert location: token index " + std::to_string(global_token) + " must be >= 0");
    return r[static_cast<std::size_t>((global_token + logical) % static_cast<std::int64_t>(r.size()))];
  }
  // Member source_rank's static choice for every logical expert.
  std::span<const int> static_choices(int source_rank) const {
    if (source_rank < 0 || source_rank >= ep_)
      throw LayoutError("source_rank", "expert location: source rank " + std::to_string(source_rank) +
                                           " outside [0, moe_ep = " + std::to_string(ep_) + ")");
    return std::span<const int>(static_).subspan(static_cast<std::size_t>(source_rank) * static_cast<std::size_t>(routed_),
                                                 static_cast<std::size_t>(routed_));
  }

  // A 64-bit digest of (routed, ep, the map): equal maps give equal digests on every machine.
  std::uint64_t fingerprint() const {
    std::uint64_t h = 0xcbf29ce484222325ull;
    const auto mix = [&h](std::uint64_t v) {
      for (int i = 0; i < 8; ++i) h = (h ^ ((v >> (8 * i)) & 0xffu)) * 0x100000001b3ull;
    };
    mix(static_cast<std::uint64_t>(routed_));
    mix(static_cast<std::uint64_t>(ep_));
    mix(phys_to_log_.size());
    for (int l : phys_to_log_) mix(static_cast<std::uint64_t>(static_cast<std::uint32_t>(l)));
    return h;
  }

  // "member 0: 0 1 2 | member 1: 3 0 4 | ..." (the logical expert of each physical slot).
  std::string describe() const {
    std::string out;
    for (int r = 0; r < ep_; ++r) {
      out += (r ? " | member " : "member ") + std::to_string(r) + ":";
      for (int p = r * per_rank(); p < (r + 1) * per_rank(); ++p) out += " " + std::to_string(logical_of(p));
    }
    return out;
  }

  friend bool operator==(const ExpertLocation& a, const ExpertLocation& b) {
    return a.routed_ == b.routed_ && a.ep_ == b.ep_ && a.phys_to_log_ == b.phys_to_log_;
  }

 private:
  ExpertLocation(int routed, int ep, std::vector<int> map) : routed_(routed), ep_(ep), phys_to_log_(std::move(map)) {
    log_to_phys_.resize(static_cast<std::size_t>(routed_));
    for (std::size_t p = 0; p < phys_to_log_.size(); ++p) {
      const int l = phys_to_log_[p];
      if (l < 0 || l >= routed_)
        throw LayoutError("expert_location", "expert location: physical expert " + std::to_string(p) +
                                                 " holds logical expert " + std::to_string(l) +
                                                 ", outside [0, routed = " + std::to_string(routed_) + ")");
      log_to_phys_[static_cast<std::size_t>(l)].push_back(static_cast<int>(p));
    }
    for (int l = 0; l < routed_; ++l)
      if (log_to_phys_[static_cast<std::size_t>(l)].empty())
        throw LayoutError("expert_location", "expert location: logical expert " + std::to_string(l) +
                                                 " has no physical replica; every logical expert needs at least one");
    build_static();
  }

  static void check_sizes(int routed, int redundant, int ep) {
    if (routed < 1) throw LayoutError("experts", "expert location: routed experts = " + std::to_string(routed) + "; need at least 1");
    if (ep < 1) throw LayoutError("moe_ep", "expert location: moe_ep = " + std::to_string(ep) + "; need at least 1");
    if (redundant < 0)
      throw LayoutError("redundant_experts", "expert location: " + std::to_string(redundant) +
                                                 " redundant experts (fewer physical than routed experts); need >= 0");
    if (redundant > 0 && ep == 1)
      throw LayoutError("redundant_experts", "expert location: " + std::to_string(redundant) +
                                                 " redundant experts with moe_ep = 1; replicas balance load across "
                                                 "moe_ep members, so they need moe_ep > 1");
    const long long physical = static_cast<long long>(routed) + redundant;
    if (physical % ep != 0)
      throw LayoutError("redundant_experts", "expert location: " + std::to_string(routed) + " routed + " +
                                                 std::to_string(redundant) + " redundant = " + std::to_string(physical) +
                                                 " physical experts cannot be split evenly over moe_ep = " +
                                                 std::to_string(ep));
  }

  // Static choice per (source member, logical): a replica on the source itself (the lowest), else
  // the members without one, in order, are dealt over the replicas starting at logical mod count.
  // Each member's static choice: its own replica (the lowest), else the replicas dealt in turn.
  // O(routed * ep + physical): first_on holds one expert's lowest replica on each member.
  void build_static() {
    static_.assign(static_cast<std::size_t>(ep_) * static_cast<std::size_t>(routed_), -1);
    std::vector<int> first_on(static_cast<std::size_t>(ep_), -1);
    for (int l = 0; l < routed_; ++l) {
      const auto& r = log_to_phys_[static_cast<std::size_t>(l)];
      for (int p : r)
        if (first_on[static_cast<std::size_t>(rank_of(p))] < 0) first_on[static_cast<std::size_t>(rank_of(p))] = p;
      int dealt = 0;
      for (int src = 0; src < ep_; ++src) {
        int pick = first_on[static_cast<std::size_t>(src)];
        if (pick < 0) pick = r[static_cast<std::size_t>((l + dealt++) % static_cast<int>(r.size()))];
        static_[static_cast<std::size_t>(src) * static_cast<std::size_t>(routed_) + static_cast<std::size_t>(l)] = pick;
      }
      for (int p : r) first_on[static_cast<std::size_t>(rank_of(p))] = -1;
    }
  }

  int routed_ = 0, ep_ = 1;
  std::vector<int> phys_to_log_;
  std::vector<std::vector<int>> log_to_phys_;
  std::vector<int> static_;  // ep x routed
};

namespace impl {

// Items of weight w into `packs` packs of exactly w.size() / packs items each: heaviest first, each
// into the lightest pack that still has room (lower pack on ties). Returns each item's pack and
// its slot within the pack.
struct Packing {
  std::vector<int> pack, slot;
};

inline Packing balanced_packing(std::span<const double> w, int packs) {
  const auto n = static_cast<int>(w.size()), per = n / packs;
  std::vector<int> order(w.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return w[static_cast<std::size_t>(a)] > w[static_cast<std::size_t>(b)]; });
  Packing out{std::vector<int>(w.size(), -1), std::vector<int>(w.size(), -1)};
  std::vector<double> load(static_cast<std::size_t>(packs), 0.0);
  std::vector<int> items(static_cast<std::size_t>(packs), 0);
  // The packs with room, lightest (then lowest) on top: O(n log packs) rather than a scan per item.
  const auto lighter_last = [&](int a, int b) {
    const double la = load[static_cast<std::size_t>(a)], lb = load[static_cast<std::size_t>(b)];
    return lb < la || (!(la < lb) && b < a);
  };
  std::priority_queue<int, std::vector<int>, decltype(lighter_last)> room(lighter_last);
  for (int p = 0; p < packs && per > 0; ++p) room.push(p);
  for (int i : order) {
    const int best = room.top();
    room.pop();
    out.pack[static_cast<std::size_t>(i)] = best;
    out.slot[static_cast<std::size_t>(i)] = items[static_cast<std::size_t>(best)]++;
    load[static_cast<std::size_t>(best)] += w[static_cast<std::size_t>(i)];
    if (items[static_cast<std::size_t>(best)] < per) room.push(best);
  }
  return out;
}

// Replica counts for `slots` >= w.size() physical experts: one each, then every extra one to the
// expert with the largest load per replica (lower id on ties), which minimises the largest load
// per replica.
inline std::vector<int> replica_counts(std::span<const double> w, int slots) {
  std::vector<int> count(w.size(), 1);
  if (w.empty()) return count;
  // The expert with the largest load per replica on top (w[a]/count[a] compared as w[a]*count[b]),
  // the lower id on ties: O(slots log experts) rather than a scan per extra replica.
  const auto worse = [&](std::size_t a, std::size_t b) {
    const double a_over_b = w[a] * count[b], b_over_a = w[b] * count[a];
    return b_over_a > a_over_b || (!(a_over_b > b_over_a) && b < a);
  };
  std::priority_queue<std::size_t, std::vector<std::size_t>, decltype(worse)> top(worse);
  for (std::size_t e = 0; e < w.size(); ++e) top.push(e);
  for (int extra = static_cast<int>(w.size()); extra < slots; ++extra) {
    const std::size_t best = top.top();
    top.pop();
    ++count[best];
    top.push(best);
  }
  return count;
}

// One node's share: its logical experts (ids) get `slots` physical experts (replicas by load),
// packed onto `gpus` members (per_rank each) starting at member first_gpu of the whole map.
inline void place_node(std::span<const double> load, const std::vector<int>& ids, int slots, int gpus, int first_gpu,
                       int per_rank, std::vector<int>& map) {
  std::vector<double> w;
  for (int l : ids) w.push_back(load[static_cast<std::size_t>(l)]);
  const std::vector<int> count = replica_counts(w, slots);
  std::vector<int> replica_of;  // node-local replica -> index into ids
  std::vector<double> replica_load;
  for (std::size_t i = 0; i < ids.size(); ++i)
    for (int c = 0; c < count[i]; ++c) {
      replica_of.push_back(static_cast<int>(i));
      replica_load.push_back(w[i] / count[i]);
    }
  const Packing packed = balanced_packing(replica_load, gpus);
  for (std::size_t r = 0; r < replica_of.size(); ++r) {
    const int p = (first_gpu + packed.pack[r]) * per_rank + packed.slot[r];
    map[static_cast<std::size_t>(p)] = ids[static_cast<std::size_t>(replica_of[r])];
  }
}

inline void check_rebalance_inputs(std::span<const double> load, int ep, const EplbOptions& o) {
  for (std::size_t e = 0; e < load.size(); ++e)
    if (!(load[e] >= 0) || !std::isfinite(load[e]))
      throw LayoutError("expert_load", "rebalance: the load of logical expert " + std::to_string(e) + " is " +
                                           std::to_string(load[e]) + "; loads must be finite and >= 0");
  if (o.nodes < 1 || ep % o.nodes != 0)
    throw LayoutError("nodes", "rebalance: moe_ep = " + std::to_string(ep) + " cannot be split evenly into " +
                                   std::to_string(o.nodes) + " nodes");
  if (o.groups < 1 || load.size() % static_cast<std::size_t>(o.groups) != 0)
    throw LayoutError("groups", "rebalance: " + std::to_string(load.size()) + " routed experts cannot be split into " +
                                    std::to_string(o.groups) + " expert groups");
}

}  // namespace impl

// Hierarchical when nodes > 1 and groups % nodes == 0 (else global: one node, one group):
//  1. expert groups, weighed by their total load, are packed onto nodes (groups / nodes each);
//  2. within each node its experts get physical / nodes slots: one replica each, then every extra
//     replica to the expert with the largest load per replica;
//  3. each node's replicas, weighed load / replicas, are packed onto its members (per_rank each).
inline ExpertLocation ExpertLocation::rebalanced(std::span<const double> load, int redundant, int ep, const EplbOptions& opts) {
  const int routed = static_cast<int>(load.size());
  check_sizes(routed, redundant, ep);
  impl::check_rebalance_inputs(load, ep, opts);
  const bool hierarchical = opts.nodes > 1 && opts.groups % opts.nodes == 0;
  const int nodes = hierarchical ? opts.nodes : 1, groups = hierarchical ? opts.groups : 1;
  const int group_size = routed / groups, physical = routed + redundant, per_rank = physical / ep;
  std::vector<double> group_load(static_cast<std::size_t>(groups), 0.0);
  for (int l = 0; l < routed; ++l) group_load[static_cast<std::size_t>(l / group_size)] += load[static_cast<std::size_t>(l)];
  const impl::Packing on_node = impl::balanced_packing(group_load, nodes);
  std::vector<std::vector<int>> node_ids(static_cast<std::size_t>(nodes));
  for (int n = 0; n < nodes; ++n)
    for (int slot = 0; slot < groups / nodes; ++slot)
      for (int g = 0; g < groups; ++g)
        if (on_node.pack[static_cast<std::size_t>(g)] == n && on_node.slot[static_cast<std::size_t>(g)] == slot)
          for (int l = g * group_size; l < (g + 1) * group_size; ++l) node_ids[static_cast<std::size_t>(n)].push_back(l);
  std::vector<int> map(static_cast<std::size_t>(physical), -1);
  for (int n = 0; n < nodes; ++n)
    impl::place_node(load, node_ids[static_cast<std::size_t>(n)], physical / nodes, ep / nodes, n * (ep / nodes), per_rank, map);
  return ExpertLocation(routed, ep, std::move(map));
}

// Max over mean of a per-member load (1 when every entry is 0): the balance figure.
template <class Range>
double max_over_mean(const Range& v) {
  if (std::empty(v)) return 1.0;
  double sum = 0, mx = 0;
  for (const auto& x : v) {
    sum += static_cast<double>(x);
    mx = std::max(mx, static_cast<double>(x));
  }
  return sum > 0 ? mx / (sum / static_cast<double>(std::size(v))) : 1.0;  // the mean first: no overflow near the largest double
}

// Per-member load a location is expected to see for a logical load, each expert's load split
// evenly over its replicas.
inline std::vector<double> expected_member_load(const ExpertLocation& loc, std::span<const double> logical_load) {
  if (logical_load.size() != static_cast<std::size_t>(loc.routed()))
    throw LayoutError("expert_load", "expected_member_load: " + std::to_string(logical_load.size()) +
                                         " loads for " + std::to_string(loc.routed()) + " routed experts");
  std::vector<double> out(static_cast<std::size_t>(loc.ep()), 0.0);
  for (int p = 0; p < loc.physical(); ++p) {
    const int l = loc.logical_of(p);
    out[static_cast<std::size_t>(loc.rank_of(p))] += logical_load[static_cast<std::size_t>(l)] / loc.replicas(l);
  }
  return out;
}

// Tokens (token, expert) pairs counted in one step, per physical expert, and what follows from it.
struct ExpertLoad {
  std::vector<std::int64_t> physical;  // per physical expert
  std::vector<std::int64_t> logical;   // per logical expert: the sum over its replicas
  std::vector<std::int64_t> members;   // per moe_ep member: the sum over its physical experts

  ExpertLoad() = default;
  ExpertLoad(const ExpertLocation& loc, std::vector<std::int64_t> per_physical) : physical(std::move(per_physical)) {
    if (physical.size() != static_cast<std::size_t>(loc.physical()))
      throw LayoutError("expert_load", "expert load: " + std::to_string(physical.size()) + " counts for " +
                                           std::to_string(loc.physical()) + " physical experts");
    logical.assign(static_cast<std::size_t>(loc.routed()), 0);
    members.assign(static_cast<std::size_t>(loc.ep()), 0);
    for (int p = 0; p < loc.physical(); ++p) {
      logical[static_cast<std::size_t>(loc.logical_of(p))] += physical[static_cast<std::size_t>(p)];
      members[static_cast<std::size_t>(loc.rank_of(p))] += physical[static_cast<std::size_t>(p)];
    }
  }
  double imbalance() const { return max_over_mean(members); }
  std::vector<double> logical_as_double() const { return {logical.begin(), logical.end()}; }
};

// A device copy of the map for the dispatch's kernels: the replicas of each logical expert and this
// source member's static choices.
template <class MemSpace>
struct ReplicaTable {
  Kokkos::View<int**, Kokkos::LayoutRight, MemSpace> replicas;  // routed x max_replicas, -1 padded
  Kokkos::View<int*, MemSpace> counts;                          // replicas per logical expert
  Kokkos::View<int*, MemSpace> static_choice;                   // routed: this member's static pick
  ReplicaChoice choice = ReplicaChoice::by_token;
  int routed = 0;

  // The same rule as ExpertLocation::choose (tested against it).
  KOKKOS_INLINE_FUNCTION int physical(int logical, std::int64_t global_token) const {
    if (choice == ReplicaChoice::static_per_rank) return static_choice(logical);
    return replicas(logical, static_cast<int>((global_token + logical) % counts(logical)));
  }
};

template <class ExecSpace>
ReplicaTable<typename ExecSpace::memory_space> replica_table(const ExecSpace& exec, const ExpertLocation& loc,
                                                             int source_rank, ReplicaChoice choice) {
  if (source_rank < 0 || source_rank >= loc.ep())
    throw LayoutError("source_rank", "replica_table: source_rank = " + std::to_string(source_rank) +
                                         " outside [0, moe_ep = " + std::to_string(loc.ep()) + ")");
  using Mem = typename ExecSpace::memory_space;
  ReplicaTable<Mem> t;
  t.choice = choice;
  t.routed = loc.routed();
  const auto R = static_cast<std::size_t>(loc.routed()), M = static_cast<std::size_t>(loc.max_replicas());
  t.replicas = decltype(t.replicas)(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("relayout::replicas")), R, M);
  t.counts = decltype(t.counts)(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("relayout::replica_counts")), R);
  t.static_choice = decltype(t.static_choice)(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("relayout::static_choice")), R);
  auto hr = Kokkos::create_mirror_view(t.replicas);
  auto hc = Kokkos::create_mirror_view(t.counts);
  auto hs = Kokkos::create_mirror_view(t.static_choice);
  const auto statics = loc.static_choices(source_rank);
  for (std::size_t l = 0; l < R; ++l) {
    const auto& r = loc.replicas_of(static_cast<int>(l));
    for (std::size_t i = 0; i < M; ++i) hr(l, i) = i < r.size() ? r[i] : -1;
    hc(l) = static_cast<int>(r.size());
    hs(l) = statics[l];
  }
  Kokkos::deep_copy(exec, t.replicas, hr);
  Kokkos::deep_copy(exec, t.counts, hc);
  Kokkos::deep_copy(exec, t.static_choice, hs);
  exec.fence();  // the host mirrors end with this call
  return t;
}

// physical(r, j) = the replica logical(r, j) of token first_token + r goes to, on exec. An id
// outside [0, routed) is a LayoutError naming it (the kernel writes -1 there and counts them).
template <class ExecSpace, class Ids, class Out>
void to_physical(const ExecSpace& exec, const ReplicaTable<typename ExecSpace::memory_space>& t, const Ids& logical,
                 std::int64_t first_token, const Out& physical) {
  static_assert(Kokkos::is_view<Ids>::value && Ids::rank == 2 && Kokkos::is_view<Out>::value && Out::rank == 2,
                "relayout::to_physical: logical and physical must be rank-2 Views of int");
  if (physical.extent(0) != logical.extent(0) || physical.extent(1) != logical.extent(1))
    throw LayoutError("physical", "to_physical: physical is " + std::to_string(physical.extent(0)) + " x " +
                                      std::to_string(physical.extent(1)) + ", logical is " +
                                      std::to_string(logical.extent(0)) + " x " + std::to_string(logical.extent(1)));
  if (first_token < 0)
    throw LayoutError("first_token", "to_physical: first_token = " + std::to_string(first_token) + " must be >= 0");
  const int k = static_cast<int>(logical.extent(1)), routed = t.routed;
  std::int64_t bad = 0;
  Kokkos::parallel_reduce(
      "relayout::to_physical", Kokkos::RangePolicy<ExecSpace>(exec, 0, static_cast<std::int64_t>(logical.extent(0))),
      KOKKOS_LAMBDA(const std::int64_t r, std::int64_t& n) {
        for (int j = 0; j < k; ++j) {
          const int l = logical(r, j);
          if (l < 0 || l >= routed) {
            physical(r, j) = -1;
            ++n;
          } else {
            physical(r, j) = t.physical(l, first_token + r);
          }
        }
      },
      bad);
  if (bad > 0)
    throw LayoutError("ids", "to_physical: " + std::to_string(bad) + " expert id(s) outside [0, routed = " +
                                 std::to_string(routed) + ")");
}

// Counts the (token, expert) pairs of physical ids (rows x k, on exec's memory) per physical expert;
// the counts come to the host (this fences exec). Ids of -1 (no expert) are skipped.
template <class ExecSpace, class Ids>
ExpertLoad count_expert_load(const ExecSpace& exec, const ExpertLocation& loc, const Ids& physical_ids) {
  static_assert(Kokkos::is_view<Ids>::value && Ids::rank == 2, "relayout::count_expert_load: ids must be a rank-2 View");
  using Mem = typename ExecSpace::memory_space;
  Kokkos::View<std::int64_t*, Mem> counts(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("relayout::expert_counts")),
                                          static_cast<std::size_t>(loc.physical()));
  Kokkos::deep_copy(exec, counts, std::int64_t(0));
  const int k = static_cast<int>(physical_ids.extent(1)), P = loc.physical();
  std::int64_t bad = 0;
  Kokkos::parallel_reduce(
      "relayout::count_expert_load", Kokkos::RangePolicy<ExecSpace>(exec, 0, static_cast<std::int64_t>(physical_ids.extent(0))),
      KOKKOS_LAMBDA(const std::int64_t r, std::int64_t& n) {
        for (int j = 0; j < k; ++j) {
          const int p = physical_ids(r, j);
          if (p >= 0 && p < P) Kokkos::atomic_add(&counts(p), std::int64_t(1));
          else if (p != -1) ++n;
        }
      },
      bad);
  if (bad > 0)
    throw LayoutError("ids", "count_expert_load: " + std::to_string(bad) + " physical id(s) outside [0, " +
                                 std::to_string(P) + ")");
  std::vector<std::int64_t> host(static_cast<std::size_t>(P));
  Kokkos::View<std::int64_t*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> h(host.data(), host.size());
  Kokkos::deep_copy(exec, h, counts);
  exec.fence();
  return ExpertLoad(loc, std::move(host));
}

}  // namespace relayout
