// Named choices of a layout: the MoE all-to-all backend (docs/layout.md#derived-widths), the speculative draft kind (docs/dspark.md),
// the prefill CP strategy, the Attention→MoE bridge path (docs/bridge.md), the padding mode (docs/bridge.md#padding) and the
// process-group kinds (docs/layout.md#groups).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "relayout/mesh/error.hpp"

namespace relayout {

enum class Backend : std::uint8_t {
  none,
  deepep,
  deepep_v2,
  mooncake,
  nixl,
  mori,
  ascend_fuseep,
  flashinfer,
  flashinfer_megamoe,
  megamoe,
  pplx,
  ascend_tp,  // SGLang remaps it to none before it reads the layout (resolved_backend)
};

enum class Draft : std::uint8_t { none, dense, moe };

// How prefill context parallelism orders tokens over the CP ranks (--cp-strategy).
enum class CpStrategy : std::uint8_t { interleave, zigzag };

enum class BridgePath : std::uint8_t { dp_gather, a2a_split, direct, tp_moe };

enum class PaddingMode : std::uint8_t { max_len, sum_len };

// The six groups of the Attention->MoE hand-over, then the decode-CP group inside TP, the dense
// layers' TP group (--moe-dense-tp-size) and the pipeline group (the same TP rank of every stage).
enum class GroupKind : std::uint8_t { tp, attn_tp, attn_cp, moe_tp, moe_ep, moe_dp, dcp, dense_tp, pp };

namespace impl {

template <class E, std::size_t N>
struct NameTable {
  std::array<std::pair<E, std::string_view>, N> entries;

  constexpr std::string_view name(E e) const {
    for (const auto& [value, text] : entries)
      if (value == e) return text;
    return "?";
  }
  constexpr std::optional<E> find(std::string_view text) const {
    for (const auto& [value, name] : entries)
      if (name == text) return value;
    return std::nullopt;
  }
  std::string joined() const {
    std::string out;
    for (const auto& entry : entries) {
      if (!out.empty()) out += ", ";
      out += entry.second;
    }
    return out;
  }
};

inline constexpr NameTable<Backend, 12> kBackendNames{{{
    {Backend::none, "none"},
    {Backend::deepep, "deepep"},
    {Backend::deepep_v2, "deepep_v2"},
    {Backend::mooncake, "mooncake"},
    {Backend::nixl, "nixl"},
    {Backend::mori, "mori"},
    {Backend::ascend_fuseep, "ascend_fuseep"},
    {Backend::flashinfer, "flashinfer"},
    {Backend::flashinfer_megamoe, "flashinfer_megamoe"},
    {Backend::megamoe, "megamoe"},
    {Backend::pplx, "pplx"},
    {Backend::ascend_tp, "ascend_tp"},
}}};

inline constexpr NameTable<Draft, 3> kDraftNames{
    {{{Draft::none, "none"}, {Draft::dense, "dense"}, {Draft::moe, "moe"}}}};

inline constexpr NameTable<CpStrategy, 2> kCpStrategyNames{
    {{{CpStrategy::interleave, "interleave"}, {CpStrategy::zigzag, "zigzag"}}}};

inline constexpr NameTable<BridgePath, 4> kBridgePathNames{{{{BridgePath::dp_gather, "dp_gather"},
                                                             {BridgePath::a2a_split, "a2a_split"},
                                                             {BridgePath::direct, "direct"},
                                                             {BridgePath::tp_moe, "tp_moe"}}}};

inline constexpr NameTable<PaddingMode, 2> kPaddingNames{
    {{{PaddingMode::max_len, "max_len"}, {PaddingMode::sum_len, "sum_len"}}}};

inline constexpr NameTable<GroupKind, 9> kGroupNames{{{{GroupKind::tp, "tp"},
                                                       {GroupKind::attn_tp, "attn_tp"},
                                                       {GroupKind::attn_cp, "attn_cp"},
                                                       {GroupKind::moe_tp, "moe_tp"},
                                                       {GroupKind::moe_ep, "moe_ep"},
                                                       {GroupKind::moe_dp, "moe_dp"},
                                                       {GroupKind::dcp, "dcp"},
                                                       {GroupKind::dense_tp, "dense_tp"},
                                                       {GroupKind::pp, "pp"}}}};

template <class E, std::size_t N>
E parse_name(const NameTable<E, N>& table, std::string_view text, const char* input,
             const char* what) {
  if (auto found = table.find(text)) return *found;
  throw LayoutError(input, std::string(input) + ": unknown " + what + " '" + std::string(text) +
                               "'; expected one of: " + table.joined());
}

}  // namespace impl

// The groups the Attention->MoE bridge runs on.
inline constexpr std::array<GroupKind, 6> kAllGroupKinds = {
    GroupKind::tp, GroupKind::attn_tp, GroupKind::attn_cp,
    GroupKind::moe_tp, GroupKind::moe_ep, GroupKind::moe_dp};
// Every group SGLang's initialize_model_parallel builds, plus the dense layers' TP group.
inline constexpr std::array<GroupKind, 9> kWorldGroupKinds = {
    GroupKind::tp,     GroupKind::attn_tp, GroupKind::attn_cp, GroupKind::moe_tp,  GroupKind::moe_ep,
    GroupKind::moe_dp, GroupKind::dcp,     GroupKind::dense_tp, GroupKind::pp};

constexpr std::string_view to_string(Backend b) { return impl::kBackendNames.name(b); }
constexpr std::string_view to_string(Draft d) { return impl::kDraftNames.name(d); }
constexpr std::string_view to_string(CpStrategy s) { return impl::kCpStrategyNames.name(s); }
constexpr std::string_view to_string(BridgePath p) { return impl::kBridgePathNames.name(p); }
constexpr std::string_view to_string(PaddingMode m) { return impl::kPaddingNames.name(m); }
constexpr std::string_view to_string(GroupKind g) { return impl::kGroupNames.name(g); }

// SGLang's moe_hook.py handle_a2a_moe runs ascend_tp as none (its own kernels lose accuracy).
constexpr Backend resolved_backend(Backend b) { return b == Backend::ascend_tp ? Backend::none : b; }
// Every backend except `none` (and ascend_tp, which is none) spans expert parallelism over the
// whole TP width (docs/layout.md#derived-widths).
constexpr bool spans_ep(Backend b) { return resolved_backend(b) != Backend::none; }
// pplx needs max-len padding whatever the token counts are (docs/layout.md#derived-widths, docs/bridge.md#padding).
constexpr bool forces_max_len(Backend b) { return b == Backend::pplx; }

inline Backend parse_backend(std::string_view text) {
  return impl::parse_name(impl::kBackendNames, text, "--moe-a2a-backend", "MoE all-to-all backend");
}
inline Draft parse_draft(std::string_view text) {
  return impl::parse_name(impl::kDraftNames, text, "--draft", "draft kind");
}
inline CpStrategy parse_cp_strategy(std::string_view text) {
  return impl::parse_name(impl::kCpStrategyNames, text, "--cp-strategy", "prefill CP strategy");
}
inline PaddingMode parse_padding(std::string_view text) {
  return impl::parse_name(impl::kPaddingNames, text, "--padding", "padding mode");
}
inline std::string backend_names() { return impl::kBackendNames.joined(); }

}  // namespace relayout
