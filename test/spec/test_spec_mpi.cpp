// docs/dspark.md on MPI ranks: SpecTpSync broadcasts from the group's rank 0, an idle attention-DP group
// joins every collective of the prefill, draft and verify forwards, rounds on the KV caches give the
// same accepted lengths and committed tokens as a single-rank run (the same code at tp = 1) and as
// the plain loops over the reference model (no distributed code, no cache), greedy and sampled, with
// MoE and dense drafts, sync off with per-rank sampling is detected, and the start-up check rejects
// DP attention + MoE draft + attn_tp > 1.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <relayout/comm.hpp>
#include <demo/decoder.hpp>
#include <demo/spec_reference.hpp>
#include <demo/model.hpp>

#include "mpi_world.hpp"

using namespace relayout;
using namespace relayout::spec;

namespace {

// Owned by the shared test main, which frees it before MPI_Finalize.
using relayout::test::world;

model::ModelDims small_dims(int layers, std::uint64_t seed) {
  model::ModelDims d;
  d.hidden = 16;
  d.heads = 8;
  d.head_dim = 4;
  d.q_lora = 8;
  d.experts = 8;
  d.topk = 2;
  d.moe_inter = 8;
  d.shared_inter = 8;
  d.layers = layers;
  d.seed = seed;
  return d;
}

// Group 1 is idle whenever there are two groups or more.
std::vector<int> requests_for(int groups) {
  std::vector<int> r;
  for (int g = 0; g < groups; ++g) r.push_back(g == 1 ? 0 : 3 + g % 2);
  return r;
}

SpecConfig small_config(std::vector<int> per_group) {
  SpecConfig c;
  c.requests_per_group = std::move(per_group);
  c.width = {3};  // k = 2 draft tokens
  c.rounds = 2;
  c.prompt = 3;
  c.kv_capacity = 16;
  c.dense_inter = 16;
  c.draft_layers = 1;
  c.hidden_weight = 0.8;  // acceptance about 0.2-0.8 at these dims: rejections and rollbacks happen
  c.target_dims = small_dims(2, 1234);
  return c;
}

}  // namespace

TEST_CASE("SpecTpSync: broadcast from the attention-TP group's rank 0, not world rank 0; off leaves ranks apart") {
  const int n = world().size();
  const ProcessGroups groups(RuntimeLayout({.tp = n, .dp = n / 2, .enable_dp_attention = true, .draft = Draft::dense}),
                             world());
  const int root = groups.layout().group_members(GroupKind::attn_tp, world().rank()).front();
  SpecTpSync sync(groups, SyncSites{});
  CHECK(sync.group() == GroupKind::attn_tp);
  std::vector<std::int32_t> v{world().rank(), 100 + world().rank()};
  CHECK(sync.sync("DRAFT_SAMPLE", v));
  CHECK(v == std::vector<std::int32_t>{root, 100 + root});
  CHECK(sync.agrees(v));
  std::vector<float> p{float(world().rank()) * 0.5f};
  sync.sync("ACCEPT_SAMPLE", p);
  CHECK(p[0] == float(root) * 0.5f);

  SyncSites off;
  off.configure("off");
  SpecTpSync none(groups, off);
  std::vector<std::int64_t> mine{world().rank()};
  CHECK_FALSE(none.sync("DRAFT_SAMPLE", mine));
  CHECK(mine[0] == world().rank());
  CHECK_FALSE(none.agrees(mine));  // attn_tp = 2: the two members hold different values

  // DP attention off: the TP group, rooted at its rank 0.
  const ProcessGroups tp_groups(RuntimeLayout({.tp = n, .draft = Draft::dense}), world());
  SpecTpSync tp_sync(tp_groups, SyncSites{});
  CHECK(tp_sync.group() == GroupKind::tp);
  std::vector<std::int32_t> t{world().rank() + 7};
  tp_sync.sync("PLAN", t);
  CHECK(t[0] == 7);
}

TEST_CASE("idle participation: the idle group runs the draft and verify forwards and issues the same collectives") {
  const int n = world().size();
  const ProcessGroups groups(RuntimeLayout({.tp = n, .dp = n, .enable_dp_attention = true, .draft = Draft::moe}), world());
  SpecConfig cfg = small_config(requests_for(n));
  cfg.rounds = 1;
  SpecDecoder<MpiCommunicator> dec(groups, cfg, SyncSites{});
  dec.run();  // a missing collective on the idle rank would hang here
  CHECK(dec.idle() == (world().rank() == 1));
  CHECK(dec.draft_forwards() == 1 + 2);   // the prefill, then k = 2 decode steps
  CHECK(dec.target_forwards() == 1 + 1);  // the prefill, then one verify forward
  CHECK(dec.meta().raw.size() == std::size_t(n));
  CHECK(dec.meta().scaled[1].value == 0);
  CHECK(dec.meta().scaled[0].value == 9);  // 3 requests x 3 rows
  // Every rank, idle or busy, made the same number of calls of every collective on every group.
  const auto& calls = dec.target_traffic().calls;
  std::vector<std::int64_t> mine(calls.begin(), calls.end()), all(mine.size() * std::size_t(n));
  all_gather(world(), mine, all);
  for (int r = 0; r < n; ++r)
    CHECK(std::vector<std::int64_t>(all.begin() + std::ptrdiff_t(r) * std::ptrdiff_t(mine.size()),
                                    all.begin() + std::ptrdiff_t(r + 1) * std::ptrdiff_t(mine.size())) == mine);
}

// The plain loops (demo/spec_reference.hpp) recompute every forward from the whole sequence on the
// reference layers: no SpecDecoder, no DistributedModel, no communicator, no KV cache. Greedy: the
// target's own decode, no draft. Sampled: a single-rank speculative-sampling loop, same draws.
TEST_CASE("rounds on the KV cache commit what the plain loops commit; acceptance strictly between 0 and 1") {
  const int n = world().size();
  struct Case {
    LayoutConfig layout;
    bool sample;
  };
  const std::vector<Case> cases{
      {{.tp = n, .dp = n, .enable_dp_attention = true, .draft = Draft::moe}, false},
      {{.tp = n, .dp = n, .enable_dp_attention = true, .moe_a2a_backend = Backend::deepep, .draft = Draft::moe}, true},
      {{.tp = n, .draft = Draft::moe}, false},
      {{.tp = n, .dp = n / 2, .enable_dp_attention = true, .draft = Draft::dense}, true},
  };
  std::int64_t totals[2][2] = {};  // [greedy, sampled] x [accepted, proposed] over the domain
  for (const Case& c : cases) {
    const ProcessGroups groups(RuntimeLayout(c.layout), world());
    SpecConfig cfg = small_config(requests_for(groups.layout().widths().attn_dp));
    cfg.sample = c.sample;
    CAPTURE(c.layout.dp);
    CAPTURE(c.layout.enable_dp_attention);
    CAPTURE(to_string(c.layout.moe_a2a_backend));
    CAPTURE(to_string(c.layout.draft));
    CAPTURE(c.sample);
    SpecDecoder<MpiCommunicator> dec(groups, cfg, SyncSites{});
    dec.run();
    CHECK_FALSE(dec.disagreed());
    const plain::PlainModel target = plain::PlainModel::layers_of(cfg.target_dims);
    const plain::PlainModel draft = c.layout.draft == Draft::moe ? plain::PlainModel::layers_of(cfg.draft_dims())
                                                                 : plain::PlainModel::dense_of(cfg);
    const int k = cfg.draft_tokens();
    std::int64_t accepted = 0, proposed = 0;
    for (int j = 0; j < int(dec.requests().size()); ++j) {
      const RequestRecord& r = dec.requests()[std::size_t(j)];
      CAPTURE(r.id);
      REQUIRE(r.accepted.size() == std::size_t(cfg.rounds));
      for (int a : r.accepted) accepted += a;
      proposed += std::int64_t(k) * cfg.rounds;
      if (c.sample) {
        const RequestRecord want = plain::speculative_decode(cfg, draft, target, r.id);
        CHECK(r.accepted == want.accepted);
        CHECK(r.committed == want.committed);
      } else {
        CHECK(r.committed == plain::greedy_decode(cfg, target, r.id, r.committed.size()));
      }
      // Both caches hold the committed tokens but the newest: the rejected rows were rolled back.
      CHECK(dec.target_kv(j) == std::int64_t(r.committed.size()) - 1);
      if (c.layout.draft == Draft::moe) {
        CHECK(dec.draft_kv(j) <= std::int64_t(r.committed.size()) - 1);
        CHECK(dec.draft_kv(j) >= std::int64_t(r.committed.size()) - 2);
      }
    }
    // Over the whole domain: some draft tokens accepted, some rejected (rollback exercised).
    const bool first = groups.coords().attn_tp_rank == 0;  // one member of each group counts
    std::int64_t counts[2] = {first ? accepted : 0, first ? proposed : 0};
    all_reduce_in_place(world(), std::span<std::int64_t>(counts, 2));
    totals[c.sample][0] += counts[0];
    totals[c.sample][1] += counts[1];
  }
  for (int mode = 0; mode < 2; ++mode) {
    CAPTURE(mode);
    CHECK(totals[mode][0] > 0);
    CHECK(totals[mode][0] < totals[mode][1]);
  }
}

TEST_CASE("rank-local sampler: SpecTpSync makes the attention-TP group agree; RELAYOUT_SPEC_TP_SYNC=off does not") {
  const int n = world().size();
  const ProcessGroups groups(RuntimeLayout({.tp = n, .dp = n / 2, .enable_dp_attention = true, .draft = Draft::dense}),
                             world());
  SpecConfig cfg = small_config(std::vector<int>(std::size_t(n / 2), 2));
  cfg.rounds = 2;
  cfg.rank_local_rng = true;
  {
    ::setenv("RELAYOUT_SPEC_TP_SYNC", "all", 1);
    SpecDecoder<MpiCommunicator> dec(groups, cfg, SyncSites::from_env());
    dec.run();
    CHECK_FALSE(dec.disagreed());
    CHECK(dec.sync().counters().at("DRAFT_SAMPLE").broadcasts == 2 * 2);  // k = 2 draft steps per round
    CHECK(dec.sync().counters().at("ACCEPT_SAMPLE").broadcasts == 2);
  }
  {
    ::setenv("RELAYOUT_SPEC_TP_SYNC", "off", 1);
    SpecDecoder<MpiCommunicator> dec(groups, cfg, SyncSites::from_env());
    ::unsetenv("RELAYOUT_SPEC_TP_SYNC");
    dec.run();
    CHECK(dec.disagreed());
    CHECK(dec.sync().counters().at("DRAFT_SAMPLE").broadcasts == 0);
    CHECK(dec.rounds().size() == 1);  // every rank stops after the round that disagreed
  }
}

TEST_CASE("start-up check: DP attention + MoE draft + attn_tp > 1 is rejected with the documented message; bypass runs") {
  const int n = world().size();
  const ProcessGroups groups(RuntimeLayout({.tp = n, .dp = n / 2, .enable_dp_attention = true, .draft = Draft::moe}),
                             world());
  SpecConfig cfg = small_config(requests_for(n / 2));
  try {
    SpecDecoder<MpiCommunicator> dec(groups, cfg, SyncSites{});
    FAIL("the start-up check did not reject the layout");
  } catch (const LayoutError& e) {
    CHECK(std::string(e.what()) == RELAYOUT_DSPARK_MOE_DRAFT_MESSAGE);
  }
  cfg.bypass_guard = true;
  cfg.rounds = 1;
  SpecDecoder<MpiCommunicator> dec(groups, cfg, SyncSites{});
  dec.run();
  CHECK(dec.draft_forwards() == 1 + 2);  // the prefill, then k = 2 decode steps
}
