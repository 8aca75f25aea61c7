// Draft context selection and SpecTpSync site configuration.
#include <doctest/doctest.h>

#include <relayout/spec/draft.hpp>
#include <relayout/spec/sync_sites.hpp>

using namespace relayout;
using namespace relayout::spec;

TEST_CASE("dense draft under DP attention runs in the attention-TP group") {
  const DraftContext c = draft_context(RuntimeLayout({.tp = 8, .dp = 4, .enable_dp_attention = true,
                                                      .draft = Draft::dense}));
  CHECK(c.patched);
  CHECK(c.tp_group == GroupKind::attn_tp);
  CHECK_FALSE(c.dp_moe_sync);
  CHECK(c.sync_group == GroupKind::attn_tp);
}

TEST_CASE("MoE draft: no patch, dp_moe_sync = draft_is_moe && enable_dp_attention") {
  const DraftContext on = draft_context(RuntimeLayout({.tp = 8, .dp = 8, .enable_dp_attention = true,
                                                       .draft = Draft::moe}));
  CHECK_FALSE(on.patched);
  CHECK(on.tp_group == GroupKind::tp);
  CHECK(on.dp_moe_sync);
  CHECK(on.base_logits_group == GroupKind::attn_tp);
  const DraftContext off = draft_context(RuntimeLayout({.tp = 8, .draft = Draft::moe}));
  CHECK_FALSE(off.dp_moe_sync);
  CHECK(off.sync_group == GroupKind::tp);
}

TEST_CASE("sync sites: default all, off, a list, unknown names rejected, extensible") {
  SyncSites s;
  CHECK(s.enabled("DRAFT_GREEDY"));
  CHECK(s.enabled("TARGET"));
  s.configure("off");
  CHECK_FALSE(s.enabled("PLAN"));
  s.configure("PLAN,ACCEPT_SAMPLE");
  CHECK(s.enabled("PLAN"));
  CHECK(s.enabled("ACCEPT_SAMPLE"));
  CHECK_FALSE(s.enabled("DRAFT_SAMPLE"));
  CHECK_THROWS_AS(s.configure("PLAN,NOPE"), LayoutError);
  CHECK(s.enabled("PLAN"));  // a rejected spec leaves the previous one in place
  const std::size_t custom = s.add_site("MY_SITE");
  CHECK(s.names()[custom] == "MY_SITE");
  s.configure("all");
  CHECK(s.enabled("MY_SITE"));
  CHECK_THROWS_AS(s.enabled("UNKNOWN"), LayoutError);
}
