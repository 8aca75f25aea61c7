// ProcessGroups: the tp, attn_tp, attn_cp, moe_tp, moe_ep and moe_dp communicators of one TP
// domain, made from a RuntimeLayout and a world communicator by one split scheme driven by the
// layout engine (color = group_index, key = group_rank). Which groups share a handle is a policy
// (docs/layout.md#groups), and a user can ask which handle each group uses.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "relayout/comm/communicator.hpp"
#include "relayout/comm/mpi.hpp"
#include "relayout/mesh/layout.hpp"

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
  ProcessGroupsOf(RuntimeLayout layout, const C& world,
                  HandlePolicy policy = HandlePolicy::share_identical)
      : layout_(std::move(layout)), policy_(policy), rank_(world.rank()) {
    if (world.size() != layout_.size())
      throw LayoutError("world", "the world communicator has " + std::to_string(world.size()) +
                                     " ranks but the layout's tp = " + std::to_string(layout_.size()) +
                                     ": a TP domain needs exactly tp ranks (split the world into "
                                     "domains first)");
    // Handle 0 is TP's own duplicate, so our traffic never mixes with the engine's on `world`.
    handles_.push_back(world.dup());
    handle_of_[index(GroupKind::tp)] = 0;
    int single = -1;  // the shared single-rank handle, made on first need
    for (std::size_t k = 1; k < kAllGroupKinds.size(); ++k) {
      const GroupKind kind = kAllGroupKinds[k];
      int h = -1;
      if (!must_be_distinct(kind)) {
        if (layout_.group_size(kind) == 1 && layout_.size() > 1) {
          if (single < 0) {
            single = static_cast<int>(handles_.size());
            handles_.push_back(split(kind));
          }
          h = single;
        } else {
          for (std::size_t j = 0; j < k && h < 0; ++j)
            if (!must_be_distinct(kAllGroupKinds[j]) && same_groups(kind, kAllGroupKinds[j]))
              h = handle_of_[j];
        }
      }
      if (h < 0) {
        h = static_cast<int>(handles_.size());
        handles_.push_back(split(kind));
      }
      handle_of_[k] = h;
    }
    name_handles();
  }

  const RuntimeLayout& layout() const { return layout_; }
  HandlePolicy policy() const { return policy_; }
  // This process's rank in the domain (its tp rank) and its coordinates.
  int rank() const { return rank_; }
  RankCoords coords() const { return layout_.coords(rank_); }

  const C& comm(GroupKind kind) const { return handles_[static_cast<std::size_t>(handle_id(kind))]; }
  const C& tp() const { return comm(GroupKind::tp); }
  const C& attn_tp() const { return comm(GroupKind::attn_tp); }
  const C& attn_cp() const { return comm(GroupKind::attn_cp); }
  const C& moe_tp() const { return comm(GroupKind::moe_tp); }
  const C& moe_ep() const { return comm(GroupKind::moe_ep); }
  const C& moe_dp() const { return comm(GroupKind::moe_dp); }

  // The handle a group uses: equal ids mean one communicator. Ids are the same on every rank.
  int handle_id(GroupKind kind) const { return handle_of_[index(kind)]; }
  bool shares_handle(GroupKind a, GroupKind b) const { return handle_id(a) == handle_id(b); }
  int handle_count() const { return static_cast<int>(handles_.size()); }

  // One line per group: "moe_ep: handle 0 (shared with tp), 4 ranks".
  std::string describe() const {
    std::string out = "policy " + std::string(to_string(policy_)) + "\n";
    for (GroupKind kind : kAllGroupKinds) {
      out += std::string(to_string(kind)) + ": handle " + std::to_string(handle_id(kind));
      std::string with;
      for (GroupKind other : kAllGroupKinds)
        if (other != kind && shares_handle(kind, other))
          with += (with.empty() ? "" : ", ") + std::string(to_string(other));
      if (!with.empty()) out += " (shared with " + with + ")";
      out += ", " + std::to_string(layout_.group_size(kind)) + " ranks\n";
    }
    return out;
  }

 private:
  static std::size_t index(GroupKind kind) { return static_cast<std::size_t>(kind); }

  bool must_be_distinct(GroupKind kind) const {
    return policy_ == HandlePolicy::distinct_all ||
           (policy_ == HandlePolicy::distinct_moe_ep && kind == GroupKind::moe_ep);
  }
  // Same partition of the domain and same order inside every group: one handle serves both.
  bool same_groups(GroupKind a, GroupKind b) const {
    if (layout_.group_size(a) != layout_.group_size(b)) return false;
    for (int r = 0; r < layout_.size(); ++r)
      if (layout_.group_rank(a, r) != layout_.group_rank(b, r) ||
          layout_.group_members(a, r).front() != layout_.group_members(b, r).front())
        return false;
    return true;
  }
  // Names for diagnostics (the collective agreement check): the kinds a handle serves and this
  // rank's group index, e.g. "attn_tp=moe_tp#5"; the shared one-rank handle is "single".
  void name_handles() {
    if constexpr (requires(C& c) { c.set_name(std::string_view{}); }) {
      for (std::size_t h = 0; h < handles_.size(); ++h) {
        std::string kinds;
        int index = 0;
        bool single = false;
        for (GroupKind kind : kAllGroupKinds) {
          if (handle_of_[this->index(kind)] != static_cast<int>(h)) continue;
          if (layout_.group_size(kind) == 1 && layout_.size() > 1) single = true;
          if (kinds.empty()) index = layout_.group_index(kind, rank_);
          if (!kinds.empty()) kinds += '=';
          kinds += to_string(kind);
        }
        handles_[h].set_name(single ? "single" : kinds + "#" + std::to_string(index));
      }
    }
  }
  C split(GroupKind kind) const {
    return handles_.front().split(layout_.group_index(kind, rank_), layout_.group_rank(kind, rank_));
  }

  RuntimeLayout layout_;
  HandlePolicy policy_;
  int rank_;
  std::vector<C> handles_;
  std::array<int, kAllGroupKinds.size()> handle_of_{};
};

// The MPI process groups an engine builds at start-up.
using ProcessGroups = ProcessGroupsOf<MpiCommunicator>;

}  // namespace relayout
