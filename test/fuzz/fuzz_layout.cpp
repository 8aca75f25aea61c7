// libFuzzer target: arbitrary LayoutConfigs through the layout engine. A config is either rejected
// with a LayoutError or satisfies every invariant of docs/layout.md#widths–docs/layout.md#groups and SGLang's further launch rules
// (checked here independently).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "relayout/mesh.hpp"

using namespace relayout;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::int32_t v[5] = {1, 1, 1, 1, 1};
  std::uint8_t flags[3] = {0, 0, 0};
  std::memcpy(v, data, size < sizeof v ? size : sizeof v);
  if (size > sizeof v) std::memcpy(flags, data + sizeof v, size - sizeof v < 3 ? size - sizeof v : 3);
  LayoutConfig c{v[0], v[1], v[2], v[3], v[4], (flags[0] & 1) != 0,
                 static_cast<Backend>(flags[1] % 11), static_cast<Draft>(flags[2] % 3)};
  // Further bits: prefill CP, its strategy, --attn-dp-size (= the dp value, dp itself then 1).
  c.enable_prefill_cp = (flags[0] & 2) != 0;
  c.cp_strategy = (flags[0] & 4) != 0 ? CpStrategy::zigzag : CpStrategy::interleave;
  if (flags[0] & 8) {
    c.attn_dp_size = v[1];
    if (flags[0] & 16) c.dp = 1;
  }
  try {
    const RuntimeLayout l(c);
    const Widths& w = l.widths();
    if (w.tp != w.attn_dp * w.attn_cp * w.attn_tp) __builtin_trap();
    if (w.tp != w.moe_dp * w.moe_ep * w.moe_tp) __builtin_trap();
    // moe_dp is 1 or attn_cp, and the MoE-DP group is then the attention-CP group's size.
    if (l.group_size(GroupKind::moe_dp) != w.attn_cp) __builtin_trap();
    if (c.enable_prefill_cp && (w.attn_cp != w.tp || c.tp > 8)) __builtin_trap();
    if (w.tp > 4096) return 0;  // enumerating a million ranks is valid but slow
    for (GroupKind g : kAllGroupKinds) {
      std::vector<int> seen(static_cast<std::size_t>(w.tp), 0);
      for (const auto& members : l.groups(g))
        for (int m : members) ++seen[static_cast<std::size_t>(m)];
      for (int n : seen)
        if (n != 1) __builtin_trap();
    }
    for (int r = 0; r < w.tp; r += 1 + w.tp / 16) {
      const RankCoords k = l.coords(r);
      if (r != (k.attn_dp_rank * w.attn_cp + k.attn_cp_rank) * w.attn_tp + k.attn_tp_rank) __builtin_trap();
      if (r != (k.moe_dp_rank * w.moe_ep + k.moe_ep_rank) * w.moe_tp + k.moe_tp_rank) __builtin_trap();
    }
    (void)l.dspark();
  } catch (const LayoutError&) {
  }
  return 0;
}
