// The whole world of an SGLang launch: native data-parallel replicas x pipeline stages x one TP
// domain each, in SGLang's rank order (docs/layout.md#the-world). Every world group is a domain
// group's factorization under the (replica, pp) prefix, or the pipeline group across the stages.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "relayout/mesh/layout.hpp"

namespace relayout {

// A world larger than this is refused (its rank numbers must fit an int with room to spare).
inline constexpr std::int64_t kMaxWorldRanks = std::int64_t{1} << 24;

struct WorldCoords {
  int rank = 0;         // world rank
  int replica = 0;      // native data-parallel replica (always 0 with DP attention)
  int pp_rank = 0;      // pipeline stage
  int node = 0;         // which of the --nnodes machines holds the rank
  RankCoords domain{};  // coordinates inside its stage's TP domain; domain.rank is the tp rank

  friend constexpr bool operator==(const WorldCoords&, const WorldCoords&) = default;
};

// World order (replica, pp, tp), tp fastest: rank = (replica * pp + pp_rank) * tp + tp_rank.
constexpr MixedRadix<3> world_radix(int replicas, int pp, int tp) { return {{replicas, pp, tp}}; }

struct WorldGroupGeometry {
  MixedRadix<5> radix;  // (replica, pp, the domain factorization's three axes)
  unsigned free;
};

// The domain geometry of `kind` behind the (replica, pp) axes; the pipeline group varies pp only.
constexpr WorldGroupGeometry world_group_geometry(int replicas, int pp, const Widths& w, GroupKind kind) {
  if (kind == GroupKind::pp) return {{{replicas, pp, 1, 1, w.tp}}, 0b00010u};
  const GroupGeometry g = group_geometry(w, kind);
  return {{{replicas, pp, g.radix.shape[0], g.radix.shape[1], g.radix.shape[2]}}, g.free << 2};
}

class WorldLayout {
 public:
  // The world the flags describe: replica_count(config) replicas, --pp-size stages, --nnodes nodes.
  explicit WorldLayout(const LayoutConfig& config)
      : WorldLayout(RuntimeLayout(config), replica_count(config), config.pp, config.nnodes) {}

  // One TP domain taken as the whole world (one stage of one replica), as ProcessGroups builds it
  // from a communicator of tp ranks.
  static WorldLayout single_domain(const RuntimeLayout& domain) { return WorldLayout(domain, 1, 1, 1); }

  const RuntimeLayout& domain() const { return domain_; }
  const LayoutConfig& config() const { return domain_.config(); }
  int replicas() const { return replicas_; }
  int pp() const { return pp_; }
  int nnodes() const { return nnodes_; }
  int tp() const { return domain_.size(); }
  int size() const { return replicas_ * pp_ * tp(); }
  int ranks_per_node() const { return size() / nnodes_; }

  WorldCoords coords(int rank) const {
    const auto c = world_radix(replicas_, pp_, tp()).coords(checked_rank(rank));
    return {rank, c[0], c[1], rank / ranks_per_node(), domain_.coords(c[2])};
  }
  // Which TP domain (replica * pp + pp_rank) a world rank is in.
  int domain_index(int rank) const { return checked_rank(rank) / tp(); }
  // The inverse of coords(): the world rank of domain rank `tp_rank` of stage `pp_rank` of
  // replica `replica`. Each coordinate out of range throws LayoutError naming it.
  int world_rank(int replica, int pp_rank, int tp_rank) const {
    check_coord("replica", replica, replicas_, "replicas");
    check_coord("pp_rank", pp_rank, pp_, "pp");
    check_coord("tp_rank", tp_rank, tp(), "tp");
    return world_radix(replicas_, pp_, tp()).index({replica, pp_rank, tp_rank});
  }

  int group_size(GroupKind kind) const { return geometry(kind).radix.group_size(geometry(kind).free); }
  int group_count(GroupKind kind) const { return geometry(kind).radix.group_count(geometry(kind).free); }
  int group_index(GroupKind kind, int rank) const {
    const auto g = geometry(kind);
    return g.radix.group_id(checked_rank(rank), g.free);
  }
  int group_rank(GroupKind kind, int rank) const {
    const auto g = geometry(kind);
    return g.radix.group_rank(checked_rank(rank), g.free);
  }
  // The member at position `pos` of group `id` (both in range).
  int group_member(GroupKind kind, int id, int pos) const {
    const auto g = geometry(kind);
    return g.radix.group_member(id, pos, g.free);
  }
  std::vector<int> group_members(GroupKind kind, int rank) const {
    return members_of(kind, group_index(kind, rank));
  }
  std::vector<std::vector<int>> groups(GroupKind kind) const {
    std::vector<std::vector<int>> all;
    for (int id = 0; id < group_count(kind); ++id) all.push_back(members_of(kind, id));
    return all;
  }

 private:
  WorldLayout(RuntimeLayout domain, int replicas, int pp, int nnodes)
      : domain_(std::move(domain)), replicas_(replicas), pp_(pp), nnodes_(nnodes) {
    const std::int64_t n = std::int64_t{replicas_} * pp_ * domain_.size();
    if (n > kMaxWorldRanks)
      throw LayoutError(replicas_ > 1 ? "--dp" : "--pp-size",
                        "the world has " + std::to_string(replicas_) + " replicas x pp " + std::to_string(pp_) +
                            " x tp " + std::to_string(domain_.size()) + " = " + std::to_string(n) +
                            " ranks: relayout: a world must have at most 2^24 ranks");
  }
  WorldGroupGeometry geometry(GroupKind kind) const {
    return world_group_geometry(replicas_, pp_, domain_.widths(), kind);
  }
  int checked_rank(int rank) const {
    if (rank < 0 || rank >= size())
      throw LayoutError("rank", "world rank " + std::to_string(rank) + " is out of range [0, " +
                                    std::to_string(size()) + ") (replicas x pp x tp = " + std::to_string(replicas_) +
                                    " x " + std::to_string(pp_) + " x " + std::to_string(tp()) + ")");
    return rank;
  }
  static void check_coord(const char* what, int value, int count, const char* bound) {
    if (value < 0 || value >= count)
      throw LayoutError(what, std::string(what) + " " + std::to_string(value) + " is out of range [0, " +
                                  std::to_string(count) + ") (" + bound + " = " + std::to_string(count) + ")");
  }
  std::vector<int> members_of(GroupKind kind, int id) const {
    std::vector<int> members(static_cast<std::size_t>(group_size(kind)));
    for (int pos = 0; pos < static_cast<int>(members.size()); ++pos)
      members[static_cast<std::size_t>(pos)] = group_member(kind, id, pos);
    return members;
  }

  RuntimeLayout domain_;
  int replicas_;
  int pp_;
  int nnodes_;
};

}  // namespace relayout
