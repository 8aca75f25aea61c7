// docs/dspark.md on MPI ranks: SpecTpSync broadcasts from the group's rank 0, an idle attention-DP group
// joins every collective of the draft and verify forwards, MoE and dense drafts on several layouts
// give the same accepted lengths and committed tokens as a single-rank run (the same code at tp = 1)
// and MoE drafts as a plain speculative loop over the reference model (no distributed code), sync
// off with per-rank sampling is detected, and the start-up check rejects DP attention + MoE draft +
// attn_tp > 1.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <relayout/comm.hpp>
#include <relayout/comm/single.hpp>
#include <demo/decoder.hpp>
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
  for (int g = 0; g < groups; ++g) r.push_back(g == 1 ? 0 : 1 + g % 3);
  return r;
}

SpecConfig small_config(std::vector<int> per_group) {
  SpecConfig c;
  c.requests_per_group = std::move(per_group);
  c.width = {3};
  c.rounds = 2;
  c.dense_inter = 16;
  c.draft_dims = small_dims(1, 99);
  c.target_dims = small_dims(2, 1234);
  return c;
}

// The same rounds on one rank: one group holding every request, ids in the same order.
std::map<int, RequestRecord> single_rank(Draft draft, SpecConfig cfg) {
  int total = 0;
  for (int n : cfg.requests_per_group) total += n;
  cfg.requests_per_group = {total};
  cfg.rank_local_rng = false;
  const ProcessGroupsOf<SingleRankCommunicator> groups(RuntimeLayout({.tp = 1, .draft = draft}), SingleRankCommunicator{});
  SpecDecoder<SingleRankCommunicator> dec(groups, cfg, SyncSites{});
  dec.run();
  std::map<int, RequestRecord> out;
  for (const RequestRecord& r : dec.requests()) out[r.id] = r;
  return out;
}


// Speculative decoding written as a plain loop on one process, with no relayout distributed code
// (no SpecDecoder, no DistributedModel, no communicator): the hidden rows come from the single-rank
// reference model, and only the vocabulary head (a bigram table of the previous token plus a
// projection of the normalised hidden row, part of the toy model's definition) is restated from
// decoder.hpp. Greedy draft, greedy verification: each round a request commits its longest prefix
// of draft tokens the target agrees with, then the target's own token at the first disagreement.
std::map<int, RequestRecord> plain_speculative_decoding(const SpecConfig& cfg, int requests) {
  const int T = cfg.width.value, V = cfg.vocab, H = cfg.target_dims.hidden;
  const auto head = [&](const model::ReferenceRows& h, int row, int prev, int which) {
    double ss = 0;
    for (int f = 0; f < H; ++f) ss += h.rows(row, f) * h.rows(row, f);
    const double inv = 1.0 / std::sqrt(ss / H + 1e-6);
    const auto bigram = model::tensor_key(cfg.seed, 1001, model::Tensor::embedding);
    const auto proj = model::tensor_key(cfg.seed, 1002, model::Tensor::router, which);
    int best = 0;
    double best_z = 0;
    for (int v = 0; v < V; ++v) {
      double dot = 0;
      for (int f = 0; f < H; ++f)
        dot += double(model::counter_uniform(proj, std::uint64_t(v * H + f), 1.0f)) * h.rows(row, f) * inv;
      const double z = 2.0 * double(model::counter_uniform(bigram, std::uint64_t(prev * V + v), 1.0f)) +
                       cfg.hidden_weight * dot / std::sqrt(double(H));
      if (v == 0 || z > best_z) best = v, best_z = z;
    }
    return best;
  };
  // Every request verifies T positions each round; the forwards see the model's inputs for
  // (request, position), the same every round.
  const model::Workload work = model::Workload::make(std::vector<int>(std::size_t(requests), T),
                                                     std::vector<int>(std::size_t(requests), 0), 1);
  const model::ReferenceRows draft_h = model::reference_forward(cfg.draft_dims, work);
  const model::ReferenceRows target_h = model::reference_forward(cfg.target_dims, work);
  std::map<int, RequestRecord> out;
  for (int id = 0; id < requests; ++id) {
    RequestRecord rec{id, {}, {int(model::mix64(cfg.seed ^ model::mix64(std::uint64_t(id) + 17)) % std::uint64_t(V))}};
    for (int round = 0; round < cfg.rounds; ++round) {
      std::vector<int> draft;
      for (int j = 0; j < T; ++j) draft.push_back(head(draft_h, id * T + j, j == 0 ? rec.committed.back() : draft.back(), 1));
      int a = 0;
      int correction = -1;
      for (; a < T; ++a) {
        const int want = head(target_h, id * T + a, a == 0 ? rec.committed.back() : draft[std::size_t(a - 1)], 2);
        if (want != draft[std::size_t(a)]) {
          correction = want;
          break;
        }
      }
      rec.accepted.push_back(a);
      rec.committed.insert(rec.committed.end(), draft.begin(), draft.begin() + a);
      if (correction >= 0) rec.committed.push_back(correction);
    }
    out[id] = rec;
  }
  return out;
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
  CHECK(dec.draft_forwards() == 1);
  CHECK(dec.target_forwards() == 1);
  CHECK(dec.meta().raw.size() == std::size_t(n));
  CHECK(dec.meta().scaled[1].value == 0);
  CHECK(dec.meta().scaled[0].value == 3);
  // Every rank, idle or busy, made the same number of calls of every collective on every group.
  const auto& calls = dec.target_traffic().calls;
  std::vector<std::int64_t> mine(calls.begin(), calls.end()), all(mine.size() * std::size_t(n));
  all_gather(world(), mine, all);
  for (int r = 0; r < n; ++r)
    CHECK(std::vector<std::int64_t>(all.begin() + std::ptrdiff_t(r) * std::ptrdiff_t(mine.size()),
                                    all.begin() + std::ptrdiff_t(r + 1) * std::ptrdiff_t(mine.size())) == mine);
}

TEST_CASE("distributed rounds equal a single-rank run: MoE and dense drafts, DP attention on and off") {
  const int n = world().size();
  struct Case {
    LayoutConfig layout;
    bool sample;
  };
  const std::vector<Case> cases{
      {{.tp = n, .dp = n, .enable_dp_attention = true, .draft = Draft::moe}, false},
      {{.tp = n, .dp = n / 2, .enable_dp_attention = true, .draft = Draft::dense}, false},
      {{.tp = n, .dp = n / 2, .enable_dp_attention = true, .draft = Draft::dense}, true},
      {{.tp = n, .draft = Draft::dense}, false},
      {{.tp = n, .draft = Draft::moe}, true},
  };
  for (const Case& c : cases) {
    const ProcessGroups groups(RuntimeLayout(c.layout), world());
    SpecConfig cfg = small_config(requests_for(groups.layout().widths().attn_dp));
    cfg.sample = c.sample;
    CAPTURE(c.layout.dp);
    CAPTURE(c.layout.enable_dp_attention);
    CAPTURE(to_string(c.layout.draft));
    CAPTURE(c.sample);
    SpecDecoder<MpiCommunicator> dec(groups, cfg, SyncSites{});
    dec.run();
    CHECK_FALSE(dec.disagreed());
    const auto ref = single_rank(c.layout.draft, cfg);
    for (const RequestRecord& r : dec.requests()) {
      CAPTURE(r.id);
      REQUIRE(ref.count(r.id) == 1);
      CHECK(r.accepted == ref.at(r.id).accepted);
      CHECK(r.committed == ref.at(r.id).committed);
    }
  }
}

TEST_CASE("distributed rounds commit what a plain speculative loop over the reference model commits") {
  const int n = world().size();
  const std::vector<LayoutConfig> layouts{
      {.tp = n, .dp = n, .enable_dp_attention = true, .draft = Draft::moe},
      {.tp = n, .draft = Draft::moe},
      {.tp = n, .dp = n, .enable_dp_attention = true, .moe_a2a_backend = Backend::deepep, .draft = Draft::moe},
  };
  for (const LayoutConfig& c : layouts) {
    const ProcessGroups groups(RuntimeLayout(c), world());
    SpecConfig cfg = small_config(requests_for(groups.layout().widths().attn_dp));
    cfg.rounds = 3;
    int total = 0;
    for (int r : cfg.requests_per_group) total += r;
    CAPTURE(c.dp);
    CAPTURE(c.enable_dp_attention);
    CAPTURE(to_string(c.moe_a2a_backend));
    SpecDecoder<MpiCommunicator> dec(groups, cfg, SyncSites{});
    dec.run();
    const auto plain = plain_speculative_decoding(cfg, total);
    int corrections = 0;
    for (const auto& [id, rec] : plain)
      for (int a : rec.accepted) corrections += a < cfg.width.value;
    CHECK(corrections > 0);  // the target disagrees sometimes: the correction path is exercised
    for (const RequestRecord& r : dec.requests()) {
      CAPTURE(r.id);
      REQUIRE(plain.count(r.id) == 1);
      CHECK(r.accepted == plain.at(r.id).accepted);
      CHECK(r.committed == plain.at(r.id).committed);
    }
  }
}

TEST_CASE("rank-local sampler: SpecTpSync makes the attention-TP group agree; RELAYOUT_SPEC_TP_SYNC=off does not") {
  const int n = world().size();
  const ProcessGroups groups(RuntimeLayout({.tp = n, .dp = n / 2, .enable_dp_attention = true, .draft = Draft::dense}),
                             world());
  SpecConfig cfg = small_config(std::vector<int>(std::size_t(n / 2), 2));
  cfg.width = {4};
  cfg.rank_local_rng = true;
  {
    ::setenv("RELAYOUT_SPEC_TP_SYNC", "all", 1);
    SpecDecoder<MpiCommunicator> dec(groups, cfg, SyncSites::from_env());
    dec.run();
    CHECK_FALSE(dec.disagreed());
    CHECK(dec.sync().counters().at("DRAFT_SAMPLE").broadcasts == 2);
  }
  {
    ::setenv("RELAYOUT_SPEC_TP_SYNC", "off", 1);
    SpecDecoder<MpiCommunicator> dec(groups, cfg, SyncSites::from_env());
    ::unsetenv("RELAYOUT_SPEC_TP_SYNC");
    dec.run();
    CHECK(dec.disagreed());
    CHECK(dec.sync().counters().at("DRAFT_SAMPLE").broadcasts == 0);
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
  CHECK(dec.draft_forwards() == 1);
}
