// docs/dspark.md on MPI ranks: SpecTpSync broadcasts from the group's rank 0, an idle attention-DP group
// joins every collective of the prefill, draft and verify forwards, rounds on the KV caches give the
// same accepted lengths and committed tokens as a single-rank run (the same code at tp = 1) and as
// the plain loops over the reference model (no distributed code, no cache), greedy and sampled, with
// MoE and dense drafts, sync off with per-rank sampling is detected, and the start-up check rejects
// DP attention + MoE draft + attn_tp > 1.
#include <doctest/doctest.h>

#include <algorithm>
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

// Request r's rounds against the plain single-rank loops: with sampling, the plain speculative
// run with the same draws; greedy, the target's own greedy decode.
void check_against_plain(const SpecConfig& cfg, const plain::PlainModel& draft, const plain::PlainModel& target,
                         const RequestRecord& r) {
  if (cfg.sample) {
    const RequestRecord want = plain::speculative_decode(cfg, draft, target, r.id);
    CHECK(r.accepted == want.accepted);
    CHECK(r.committed == want.committed);
  } else {
    CHECK(r.committed == plain::greedy_decode(cfg, target, r.id, r.committed.size()));
  }
}

}  // namespace

TEST_CASE("SpecTpSync: broadcast from the attention-TP group's rank 0, not world rank 0; off leaves ranks apart") {
  const int n = world().size();
  const ProcessGroups groups(RuntimeLayout({.tp = n, .dp = n / 2, .enable_dp_attention = true, .draft = Draft::dense,
                                            .enable_dp_lm_head = true}),
                             world());
  const int root = groups.layout().group_members(GroupKind::attn_tp, world().rank()).front();
  SpecTpSync sync(groups, SyncSites{});
  // --dp-size 1 (np 2) turns DP attention off (SGLang's _data_parallelism_defaults): the TP group,
  // the same two ranks.
  CHECK(sync.group() == (n / 2 > 1 ? GroupKind::attn_tp : GroupKind::tp));
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
  const ProcessGroups groups(
      RuntimeLayout({.tp = n, .dp = n, .enable_dp_attention = true, .draft = Draft::moe, .enable_dp_lm_head = true}),
      world());
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
      {{.tp = n, .dp = n, .enable_dp_attention = true, .draft = Draft::moe, .enable_dp_lm_head = true}, false},
      {{.tp = n, .dp = n, .enable_dp_attention = true, .moe_a2a_backend = Backend::deepep, .draft = Draft::moe,
        .enable_dp_lm_head = true},
       true},
      {{.tp = n, .draft = Draft::moe}, false},
      {{.tp = n, .dp = n / 2, .enable_dp_attention = true, .draft = Draft::dense, .enable_dp_lm_head = true}, true},
  };
  std::int64_t totals[2][2] = {};  // [greedy, sampled] x [accepted, proposed] over the domain
  for (const Case& c : cases) {
    const ProcessGroups groups(RuntimeLayout(c.layout), world());
    SpecConfig cfg = small_config(requests_for(groups.layout().widths().attn_dp));
    cfg.sample = c.sample;
    // SGLang's _handle_dspark runs DSpark under DP attention (dp > 1) on the built-in TP MoE only;
    // the DeepEP case checks relayout's own rounds.
    cfg.bypass_guard = c.layout.moe_a2a_backend != Backend::none && dp_attention_on(c.layout) && c.layout.dp > 1;
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
      check_against_plain(cfg, draft, target, r);
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

// Attention CP (cp = 2): the row at position p is held by CP rank p mod 2 in both caches; a round
// commits what the plain loops commit (with a sliding window of 3 keys too: each row's window starts
// per CP rank), and after every rollback each CP rank's cache holds exactly its share of the kept
// positions.
TEST_CASE("attention CP: rounds on the CP-split caches commit what the plain loops commit; rollback keeps each CP rank's share") {
  const int n = world().size();
  struct Case {
    Draft draft;
    bool sample;
    int window;
  };
  for (const Case c : {Case{Draft::moe, false, 0}, Case{Draft::dense, true, 0}, Case{Draft::moe, true, 3}}) {
    const ProcessGroups groups(
        RuntimeLayout({.tp = n, .dp = n / 2, .cp = 2, .enable_dp_attention = n > 2, .draft = c.draft}), world());
    REQUIRE(groups.layout().widths().attn_cp == 2);
    const int me = groups.coords().attn_cp_rank;
    SpecConfig cfg = small_config(requests_for(groups.layout().widths().attn_dp));
    cfg.sample = c.sample;
    cfg.target_dims.window = c.window;
    // SGLang's _handle_dspark refuses DSpark under DP attention (dp > 1) with attention CP; these
    // rounds check relayout's own CP caches.
    cfg.bypass_guard = true;
    CAPTURE(to_string(c.draft));
    CAPTURE(c.sample);
    CAPTURE(c.window);
    SpecDecoder<MpiCommunicator> dec(groups, cfg, SyncSites{});
    dec.run();
    CHECK_FALSE(dec.disagreed());
    const plain::PlainModel target = plain::PlainModel::layers_of(cfg.target_dims);
    const plain::PlainModel draft = c.draft == Draft::moe ? plain::PlainModel::layers_of(cfg.draft_dims())
                                                          : plain::PlainModel::dense_of(cfg);
    // Positions [0, length) of a request, those CP rank `me` holds.
    const auto share = [&](std::int64_t length) { return (length + 1 - me) / 2; };
    int rejected = 0;
    for (int j = 0; j < int(dec.requests().size()); ++j) {
      const RequestRecord& r = dec.requests()[std::size_t(j)];
      CAPTURE(r.id);
      for (int a : r.accepted) rejected += cfg.draft_tokens() - a;
      check_against_plain(cfg, draft, target, r);
      CHECK(dec.target_kv(j) == std::int64_t(r.committed.size()) - 1);
      CHECK(dec.target_kv_held(j) == share(std::int64_t(r.committed.size()) - 1));
      if (c.draft == Draft::moe) CHECK(dec.draft_kv_held(j) == share(dec.draft_kv(j)));
    }
    all_reduce_in_place(world(), std::span<int>(&rejected, 1));
    CHECK(rejected > 0);  // rollbacks happened
  }
}

// Rolling back under CP equals never having appended: extend 5 + 3 rows, truncate to 2 + 1, extend
// 2 + 4 more; against extending 2 + 1 then the same 2 + 4. Each CP rank's cache lengths and the last
// outputs agree.
TEST_CASE("attention CP: DistributedModel::truncate_kv leaves each CP rank as if the rejected rows never came") {
  const int n = world().size();
  const ProcessGroups groups(RuntimeLayout({.tp = n, .dp = n / 2, .cp = 2, .enable_dp_attention = n > 2}), world());
  const RankCoords k = groups.coords();
  const int H = 16;
  std::vector<int> lengths, placement;
  for (int g = 0; g < groups.layout().widths().attn_dp; ++g)
    for (int i = 0; i < 2; ++i) {
      lengths.push_back(8);
      placement.push_back(g);
    }
  const model::Workload work = model::Workload::make(lengths, placement, groups.layout().widths().attn_dp);
  using Model = model::DistributedModel<MpiCommunicator>;
  // This CP rank's rows of counts[j] new rows from position from[j] of slot j.
  const auto rows = [&](Model& m, const std::vector<int>& from, const std::vector<int>& counts) {
    std::vector<std::int64_t> owners;
    for (int j = 0; j < 2; ++j)
      for (int p = from[std::size_t(j)]; p < from[std::size_t(j)] + counts[std::size_t(j)]; ++p)
        if (m.extend_cp_rank(p) == k.attn_cp_rank) owners.push_back(model::RowOwner::pack(10 * k.attn_dp_rank + j, p));
    Model::View x("x", owners.size(), std::size_t(H));
    const auto xh = Kokkos::create_mirror_view(x);
    for (std::size_t i = 0; i < owners.size(); ++i)
      for (int f = 0; f < H; ++f) xh(i, std::size_t(f)) = float(std::sin(double(owners[i] % 977) + 0.37 * f));
    Kokkos::deep_copy(x, xh);
    return m.extend(counts, x, owners);
  };
  Model rolled(groups, small_dims(2, 99)), clean(groups, small_dims(2, 99));
  rolled.reserve_kv(work, 8, 4);
  clean.reserve_kv(work, 8, 4);
  rows(rolled, {0, 0}, {5, 3});
  rolled.truncate_kv(0, 2);
  rolled.truncate_kv(1, 1);
  rows(clean, {0, 0}, {2, 1});
  for (int j = 0; j < 2; ++j) {
    CHECK(rolled.kv_length(j) == clean.kv_length(j));
    CHECK(rolled.kv_held(j) == clean.kv_held(j));
  }
  CHECK(rolled.kv_held(0) == 1);  // positions 0, 1: one each
  CHECK(rolled.kv_held(1) == 1 - k.attn_cp_rank);
  const auto a = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), rows(rolled, {2, 1}, {2, 4}).view());
  const auto b = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), rows(clean, {2, 1}, {2, 4}).view());
  REQUIRE(a.extent(0) == 3);  // positions 2, 3 of slot 0 and 1..4 of slot 1: three each
  REQUIRE(b.extent(0) == a.extent(0));
  double diff = 0, size = 0;
  for (std::size_t i = 0; i < a.extent(0); ++i)
    for (std::size_t f = 0; f < a.extent(1); ++f) {
      diff = std::max(diff, std::abs(double(a(i, f)) - double(b(i, f))));
      size = std::max(size, std::abs(double(b(i, f))));
    }
  CHECK(diff == 0);
  CHECK(size > 0.1);
  for (int j = 0; j < 2; ++j) CHECK(rolled.kv_held(j) == clean.kv_held(j));
  // Bad lengths and counts are refused on every rank alike, before any collective, and change nothing.
  CHECK_THROWS_WITH_AS(rolled.truncate_kv(0, -1), doctest::Contains("length -1 must be >= 0"), LayoutError);
  CHECK_THROWS_WITH_AS(rows(rolled, {4, 5}, {-1, 0}), doctest::Contains("-1 new rows"), LayoutError);
  CHECK(rolled.kv_length(0) == 4);
  CHECK(rolled.kv_length(1) == 5);
}

TEST_CASE("rank-local sampler: SpecTpSync makes the attention-TP group agree; RELAYOUT_SPEC_TP_SYNC=off does not") {
  const int n = world().size();
  const ProcessGroups groups(RuntimeLayout({.tp = n, .dp = n / 2, .enable_dp_attention = true, .draft = Draft::dense,
                                            .enable_dp_lm_head = true}),
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
  if (n < 4) return;  // --dp-size 1 turns DP attention off, so attn_tp > 1 under it needs dp >= 2, tp >= 4
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
