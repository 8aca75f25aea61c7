// ProcessGroups: the tp, attn_tp, attn_cp, moe_tp, moe_ep, moe_dp, dcp, dense_tp and pp
// communicators, made from a layout and a world communicator by one split scheme driven by the
// layout engine (color = group_index, key = group_rank): of one TP domain (a RuntimeLayout), or
// of the whole world of replicas x pipeline stages x domains (a WorldLayout). Which groups share a
// handle is a policy (docs/layout.md#groups), and a user can ask which handle each group uses.
#pragma once

#include <array>
#include <cstdint>
#include <source_location>
#include <string>
#include <string_view>
#include <vector>

#include "relayout/comm/communicator.hpp"
#include "relayout/comm/mpi.hpp"
#include "relayout/mesh/layout.hpp"
#include "relayout/mesh/world.hpp"

namespace relayout {

enum class HandlePolicy : std::uint8_t {
  // SGLang on GPUs: a group with the same members, in the same order, as the TP group (or as an
  // earlier group in kAllGroupKinds order) re-uses that handle; every group of size 1 shares one
  // single-rank handle. E.g. with a DeepEP backend moe_ep == tp, so MoE-EP runs on TP's handle.
  share_identical,
  // Ascend NPUs: as share_identical, but MoE-EP always gets its own handle (own buffers), even
  // when its members equal TP's or it has a single rank.
  distinct_moe_ep,
  // Every group kind gets its own handle.
  distinct_all,
};

constexpr std::string_view to_string(HandlePolicy p) {
  switch (p) {
    case HandlePolicy::share_identical: return "share_identical";
    case HandlePolicy::distinct_moe_ep: return "distinct_moe_ep";
    case HandlePolicy::distinct_all: return "distinct_all";
  }
  return "?";
}

template <SplittableCommunicator C>
class ProcessGroupsOf {
 public:
  // Collective over `world`, whose size must equal the layout's tp and whose rank is the tp rank.
  // `site` (the caller's line) is what the arrival check and the watchdog name for every split.
  ProcessGroupsOf(RuntimeLayout layout, const C& world,
                  HandlePolicy policy = HandlePolicy::share_identical,
                  std::source_location site = std::source_location::current())
      : ProcessGroupsOf(WorldLayout::single_domain(layout), world, policy, "the layout's tp",
                        "a TP domain needs exactly tp ranks (pass a WorldLayout to split a whole world)", site) {}

  // Collective over `world`, whose size must equal replicas x pp x tp and whose rank is the world
  // rank in SGLang's order (docs/layout.md#the-world).
  ProcessGroupsOf(WorldLayout world_layout, const C& world,
                  HandlePolicy policy = HandlePolicy::share_identical,
                  std::source_location site = std::source_location::current())
      : ProcessGroupsOf(std::move(world_layout), world, policy, "replicas x pp x tp",
                        "the world communicator must hold every rank of the world", site) {}

  const RuntimeLayout& layout() const { return world_.domain(); }
  const WorldLayout& world_layout() const { return world_; }
  HandlePolicy policy() const { return policy_; }
  // This process's rank in its domain (its tp rank) and its coordinates there.
  int rank() const { return world_rank_ % world_.tp(); }
  RankCoords coords() const { return layout().coords(rank()); }
  // This process's rank in the world and its (replica, pp, node, domain) coordinates.
  int world_rank() const { return world_rank_; }
  WorldCoords world_coords() const { return world_.coords(world_rank_); }

  const C& comm(GroupKind kind) const { return handles_[static_cast<std::size_t>(handle_id(kind))]; }
  const C& tp() const { return comm(GroupKind::tp); }
  const C& attn_tp() const { return comm(GroupKind::attn_tp); }
  const C& attn_cp() const { return comm(GroupKind::attn_cp); }
  const C& moe_tp() const { return comm(GroupKind::moe_tp); }
  const C& moe_ep() const { return comm(GroupKind::moe_ep); }
  const C& moe_dp() const { return comm(GroupKind::moe_dp); }
  const C& dcp() const { return comm(GroupKind::dcp); }
  const C& dense_tp() const { return comm(GroupKind::dense_tp); }
  const C& pp() const { return comm(GroupKind::pp); }

  // The handle a group uses: equal ids mean one communicator. Ids are the same on every rank.
  int handle_id(GroupKind kind) const { return handle_of_[index(kind)]; }
  bool shares_handle(GroupKind a, GroupKind b) const { return handle_id(a) == handle_id(b); }
  int handle_count() const { return static_cast<int>(handles_.size()); }

  // One line per group: "moe_ep: handle 0 (shared with tp), 4 ranks".
  std::string describe() const {
    std::string out = "policy " + std::string(to_string(policy_)) + "\n";
    for (GroupKind kind : kWorldGroupKinds) {
      out += std::string(to_string(kind)) + ": handle " + std::to_string(handle_id(kind));
      std::string with;
      for (GroupKind other : kWorldGroupKinds)
        if (other != kind && shares_handle(kind, other))
          with += (with.empty() ? "" : ", ") + std::string(to_string(other));
      if (!with.empty()) out += " (shared with " + with + ")";
      out += ", " + std::to_string(world_.group_size(kind)) + " ranks\n";
    }
    return out;
  }

 private:
  ProcessGroupsOf(WorldLayout world_layout, const C& world, HandlePolicy policy, const char* size_name,
                  const char* rule, std::source_location site)
      : world_(std::move(world_layout)), policy_(policy), world_rank_(world.rank()), site_(site) {
    if (world.size() != world_.size())
      throw LayoutError("world", "the world communicator has " + std::to_string(world.size()) +
                                     " ranks but " + size_name + " = " + std::to_string(world_.size()) + ": " + rule);
    // Handle 0 is TP's own duplicate, so our traffic never mixes with the engine's on `world`. A
    // world of several domains splits it into the TP groups first.
    handles_.push_back(world_.group_count(GroupKind::tp) == 1 ? dup(world) : split(world, GroupKind::tp));
    handle_of_[index(GroupKind::tp)] = 0;
    int single = -1;  // the shared single-rank handle, made on first need
    for (std::size_t k = 1; k < kWorldGroupKinds.size(); ++k) {
      const GroupKind kind = kWorldGroupKinds[k];
      int h = -1;
      if (!must_be_distinct(kind)) {
        if (world_.group_size(kind) == 1 && world_.size() > 1) {
          if (single < 0) {
            single = static_cast<int>(handles_.size());
            handles_.push_back(split(world, kind));
          }
          h = single;
        } else {
          for (std::size_t j = 0; j < k && h < 0; ++j)
            if (!must_be_distinct(kWorldGroupKinds[j]) && same_groups(kind, kWorldGroupKinds[j]))
              h = handle_of_[index(kWorldGroupKinds[j])];
        }
      }
      if (h < 0) {
        h = static_cast<int>(handles_.size());
        handles_.push_back(split(world, kind));
      }
      handle_of_[index(kind)] = h;
    }
    name_handles();
  }

  static std::size_t index(GroupKind kind) { return static_cast<std::size_t>(kind); }

  bool must_be_distinct(GroupKind kind) const {
    return policy_ == HandlePolicy::distinct_all ||
           (policy_ == HandlePolicy::distinct_moe_ep && kind == GroupKind::moe_ep);
  }
  // Same partition of the world and same order inside every group: one handle serves both.
  bool same_groups(GroupKind a, GroupKind b) const {
    if (world_.group_size(a) != world_.group_size(b)) return false;
    for (int r = 0; r < world_.size(); ++r)
      if (world_.group_rank(a, r) != world_.group_rank(b, r) ||
          world_.group_member(a, world_.group_index(a, r), 0) != world_.group_member(b, world_.group_index(b, r), 0))
        return false;
    return true;
  }
  // Names for diagnostics (the collective agreement check): the bridge kinds a handle serves (the
  // further kinds only when it serves none of those) and this rank's group index, e.g.
  // "attn_tp=moe_tp#5"; the shared one-rank handle is "single".
  void name_handles() {
    if constexpr (requires(C& c) { c.set_name(std::string_view{}); }) {
      for (std::size_t h = 0; h < handles_.size(); ++h) {
        std::string kinds;
        int index = 0;
        bool single = false;
        const auto add = [&](GroupKind kind) {
          if (handle_of_[this->index(kind)] != static_cast<int>(h)) return;
          if (world_.group_size(kind) == 1 && world_.size() > 1) single = true;
          if (kinds.empty()) index = world_.group_index(kind, world_rank_);
          if (!kinds.empty()) kinds += '=';
          kinds += to_string(kind);
        };
        for (GroupKind kind : kAllGroupKinds) add(kind);
        if (kinds.empty())
          for (GroupKind kind : {GroupKind::dcp, GroupKind::dense_tp, GroupKind::pp}) add(kind);
        handles_[h].set_name(single ? "single" : kinds + "#" + std::to_string(index));
      }
    }
  }
  // Every split but the TP one goes through handle 0, the TP group's own duplicate, except the
  // groups that span domains (pp), which split the world itself.
  C split(const C& world, GroupKind kind) const {
    const C& from = kind == GroupKind::tp || kind == GroupKind::pp || handles_.empty() ? world : handles_.front();
    const int color = world_.group_index(kind, world_rank_), key = world_.group_rank(kind, world_rank_);
    if constexpr (requires { from.split(color, key, site_); }) return from.split(color, key, site_);
    else return from.split(color, key);
  }
  C dup(const C& world) const {
    if constexpr (requires { world.dup(site_); }) return world.dup(site_);
    else return world.dup();
  }

  WorldLayout world_;
  HandlePolicy policy_;
  int world_rank_;
  std::source_location site_;
  std::vector<C> handles_;
  std::array<int, kWorldGroupKinds.size()> handle_of_{};
};

// The MPI process groups an engine builds at start-up.
using ProcessGroups = ProcessGroupsOf<MpiCommunicator>;

}  // namespace relayout
