// Draft-model context selection under DP attention (docs/dspark.md): which group is the draft's TP group,
// whether the draft joins the DP/MoE sync, and where proposal-side base logits may be computed.
#pragma once

#include "relayout/mesh/layout.hpp"

namespace relayout::spec {

struct DraftContext {
  bool patched = false;            // the draft runs inside a TP context patched to attn_tp
  GroupKind tp_group = GroupKind::tp;
  bool dp_moe_sync = false;        // draft_is_moe && enable_dp_attention
  GroupKind base_logits_group = GroupKind::tp;  // a MoE draft may use the attention-TP context here
  GroupKind sync_group = GroupKind::tp;         // SpecTpSync: attn_tp with DP attention, else tp
};

inline DraftContext draft_context(const RuntimeLayout& layout) {
  const LayoutConfig& c = layout.config();
  // DP attention as resolved: --attn-dp-size and prefill CP turn it on too.
  const bool dp_attention = dp_attention_on(c);
  DraftContext ctx;
  ctx.sync_group = dp_attention ? GroupKind::attn_tp : GroupKind::tp;
  if (c.draft == Draft::dense && dp_attention) {
    // "draft model doesn't use dp and has its own tp group"
    ctx.patched = true;
    ctx.tp_group = GroupKind::attn_tp;
    ctx.base_logits_group = GroupKind::attn_tp;
  }
  if (c.draft == Draft::moe) {
    ctx.dp_moe_sync = dp_attention;  // full DP/MoE participation, no patch
    if (dp_attention) ctx.base_logits_group = GroupKind::attn_tp;
  }
  return ctx;
}

}  // namespace relayout::spec
