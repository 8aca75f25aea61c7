// Placement tags of a token-row tensor: over which group the rows are Partial sums, Replicated
// complete rows, or a RowShard (tensor_split chunks), and whether they are this DP group's rows
// (DpLocal) or every DP group's rows in one buffer (DpGlobal). SGLang's ScatterMode vocabulary:
//   SCATTERED    = RowShard<AttnTp>,  DpLocal
//   TP_ATTN_FULL = Replicated<AttnTp>, DpLocal
//   FULL         = Replicated<group::Tp>, DpGlobal
#pragma once

#include <concepts>
#include <cstdint>
#include <string>

#include "relayout/mesh/names.hpp"

namespace relayout {

// Group tags name a GroupKind in a type. Tp and MoeDp live only in relayout::group because
// relayout::Tp<N> and relayout::MoeDp<N> are layout options; the other four are also in relayout.
namespace group {
struct Tp { static constexpr GroupKind kind = GroupKind::tp; };
struct AttnTp { static constexpr GroupKind kind = GroupKind::attn_tp; };
struct AttnCp { static constexpr GroupKind kind = GroupKind::attn_cp; };
struct MoeTp { static constexpr GroupKind kind = GroupKind::moe_tp; };
struct MoeEp { static constexpr GroupKind kind = GroupKind::moe_ep; };
struct MoeDp { static constexpr GroupKind kind = GroupKind::moe_dp; };
}  // namespace group
using group::AttnCp;
using group::AttnTp;
using group::MoeEp;
using group::MoeTp;

template <class G>
concept GroupTag = requires {
  { G::kind } -> std::convertible_to<GroupKind>;
};

enum class RowState : std::uint8_t { partial, replicated, row_shard };
enum class RowScope : std::uint8_t { dp_local, dp_global };

// Summands of one result: the rows are complete only after a sum over G.
template <GroupTag G>
struct Partial {
  using group = G;
  static constexpr RowState state = RowState::partial;
};
// Identical, complete rows on every member of G.
template <GroupTag G>
struct Replicated {
  using group = G;
  static constexpr RowState state = RowState::replicated;
};
// Complete rows split across the members of G with tensor_split semantics (earlier chunks one row
// larger); member i holds chunk i.
template <GroupTag G>
struct RowShard {
  using group = G;
  static constexpr RowState state = RowState::row_shard;
};

struct DpLocal {
  static constexpr RowScope scope = RowScope::dp_local;
};
struct DpGlobal {
  static constexpr RowScope scope = RowScope::dp_global;
};

template <class S>
concept RowStateTag = GroupTag<typename S::group> && requires {
  { S::state } -> std::convertible_to<RowState>;
};
template <class S>
concept RowScopeTag = std::same_as<S, DpLocal> || std::same_as<S, DpGlobal>;

// The runtime form of a placement, for the runtime twin and for messages.
struct Placement {
  RowState state = RowState::replicated;
  GroupKind group = GroupKind::tp;
  RowScope scope = RowScope::dp_local;

  friend constexpr bool operator==(const Placement&, const Placement&) = default;
};

template <RowStateTag State, RowScopeTag Scope>
inline constexpr Placement placement_of{State::state, State::group::kind, Scope::scope};

constexpr std::string_view to_string(RowState s) {
  switch (s) {
    case RowState::partial: return "Partial";
    case RowState::replicated: return "Replicated";
    case RowState::row_shard: return "RowShard";
  }
  return "?";
}
constexpr std::string_view to_string(RowScope s) { return s == RowScope::dp_local ? "DpLocal" : "DpGlobal"; }

// "Replicated<attn_tp>, DpLocal"
inline std::string to_string(const Placement& p) {
  return std::string(to_string(p.state)) + "<" + std::string(to_string(p.group)) + ">, " +
         std::string(to_string(p.scope));
}

}  // namespace relayout
