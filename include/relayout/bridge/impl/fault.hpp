// Known bugs a test or demo can wire into a MoeBridge (bridge/testing.hpp) to show that a
// verification catches them. Not part of the options an engine sets.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "relayout/bridge/plan.hpp"
#include "relayout/mesh/layout.hpp"
#include "relayout/mesh/names.hpp"

namespace relayout {

// Known bugs, wired on purpose so a verification can be shown to catch them. Never in production.
enum class BridgeFault : std::uint8_t {
  none,
  double_reduce,   // the MoE all-reduces and the restore sums again (output x tp)
  skip_reduce,     // nobody sums the partials (each row sees only some of its experts)
  gather_partial,  // complete rows gathered as if they were partial sums (x attn_tp)
  no_split,        // every attn_tp member dispatches every row (rows processed attn_tp times)
};
inline constexpr impl::NameTable<BridgeFault, 5> kBridgeFaultNames{{{{BridgeFault::none, "none"},
                                                                   {BridgeFault::double_reduce, "double_reduce"},
                                                                   {BridgeFault::skip_reduce, "skip_reduce"},
                                                                   {BridgeFault::gather_partial, "gather_partial"},
                                                                   {BridgeFault::no_split, "no_split"}}}};
constexpr std::string_view to_string(BridgeFault f) { return kBridgeFaultNames.name(f); }
// A fault by name; `input` names the flag or field in the error.
inline BridgeFault parse_fault(std::string_view text, const char* input = "fault") {
  return impl::parse_name(kBridgeFaultNames, text, input, "injected bug");
}

// A wired fault must be able to show itself on the layout it is wired into: one that the path
// never reaches would make a verification "pass" without having been tested. MoeBridge checks it.
inline void check_fault(BridgeFault fault, const RuntimeLayout& layout, const char* input = "fault") {
  const Widths& w = layout.widths();
  const BridgePath path = layout.bridge_path();
  const auto refuse = [&](const std::string& rule) {
    throw LayoutError(input, std::string(input) + " " + std::string(to_string(fault)) + " " + rule +
                                 "; this layout takes path " + std::string(to_string(path)) + " with tp = " +
                                 std::to_string(w.tp) + ", attn_tp = " + std::to_string(w.attn_tp));
  };
  switch (fault) {
    case BridgeFault::none: return;
    case BridgeFault::double_reduce:
    case BridgeFault::skip_reduce:
      if ((path != BridgePath::dp_gather && path != BridgePath::tp_moe) || w.tp < 2)
        refuse("needs a layout whose MoE partials are summed over tp > 1 (path dp_gather or tp_moe)");
      return;
    case BridgeFault::gather_partial:
      if (path != BridgePath::dp_gather || w.attn_tp < 2) refuse("needs path dp_gather with attn_tp > 1");
      return;
    case BridgeFault::no_split:
      if (path != BridgePath::a2a_split) refuse("needs path a2a_split (attn_tp > 1 with an all-to-all backend)");
      return;
  }
}

}  // namespace relayout
