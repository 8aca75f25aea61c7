// SpecTpSync on a single-rank domain, what it accepts as a decision, and the idle batch.
#include <doctest/doctest.h>

#include <Kokkos_Core.hpp>
#include <array>
#include <cstdint>
#include <vector>

#include <relayout/comm/single.hpp>
#include <relayout/spec/idle.hpp>
#include <relayout/spec/sync.hpp>

#include "demo/decoder.hpp"

using namespace relayout;
using namespace relayout::spec;

static_assert(DecisionTensor<std::vector<std::int32_t>&>);
static_assert(DecisionTensor<std::vector<std::int64_t>&>);
static_assert(DecisionTensor<std::span<float>>);
static_assert(DecisionTensor<Kokkos::View<std::int32_t*>>);
static_assert(!DecisionTensor<std::vector<double>&>);            // no double payloads
static_assert(!DecisionTensor<std::vector<std::uint8_t>&>);      // no raw bytes (KV pages, dispatch buffers)
static_assert(!DecisionTensor<Kokkos::View<float**>>);          // no hidden states / router logits
static_assert(!DecisionTensor<const std::vector<std::int32_t>&>);  // the broadcast writes into it

TEST_CASE("SpecTpSync: a single-rank group skips the broadcast; disabled sites skip too") {
  const ProcessGroupsOf<SingleRankCommunicator> groups(RuntimeLayout({.tp = 1, .draft = Draft::moe}),
                                                       SingleRankCommunicator{});
  SyncSites sites;
  sites.configure("PLAN,TARGET");
  SpecTpSyncOf<SingleRankCommunicator> sync(groups, sites);
  CHECK(sync.group() == GroupKind::tp);
  CHECK(sync.group_size() == 1);
  std::vector<std::int32_t> v{3, 1, 4};
  CHECK_FALSE(sync.sync("PLAN", v));
  CHECK_FALSE(sync.sync("DRAFT_GREEDY", v));
  CHECK(v == std::vector<std::int32_t>{3, 1, 4});
  CHECK(sync.counters().at("PLAN").skipped_single_rank == 1);
  CHECK(sync.counters().at("DRAFT_GREEDY").skipped_disabled == 1);
  CHECK(sync.agrees(v));
  CHECK_THROWS_AS(sync.sync("NOT_A_SITE", v), LayoutError);
}

TEST_CASE("SpecTpSync group: attention-TP with DP attention, TP without") {
  // One rank: --dp-size 1 turns --enable-dp-attention off (SGLang's _data_parallelism_defaults), and
  // turns off again the DP attention prefill CP set (validate_deepseek_v4_cp runs before it): TP.
  for (bool prefill : {false, true}) {
    LayoutConfig c{.tp = 1, .enable_dp_attention = true, .draft = Draft::dense};
    c.enable_prefill_cp = prefill;
    if (prefill) c.cp_strategy = CpStrategy::interleave;
    const ProcessGroupsOf<SingleRankCommunicator> groups(RuntimeLayout(c), SingleRankCommunicator{});
    CHECK(SpecTpSyncOf<SingleRankCommunicator>(groups, SyncSites{}).group() == GroupKind::tp);
  }
}

TEST_CASE("idle batch: same metadata, zero rows, and the round workload gives the group no request") {
  const DpSyncMetadata meta = DpSyncMetadata::from_requests({{1}, {3}, {0}, {2}}, {6});
  const SpecBatch idle = make_batch(meta, 2);
  CHECK(idle.idle());
  CHECK(idle.rows.value == 0);
  CHECK(idle.requests.empty());
  CHECK(idle.meta.scaled_values() == std::vector<std::int64_t>{6, 18, 0, 12});
  const SpecBatch busy = make_batch(meta, 1);
  CHECK_FALSE(busy.idle());
  CHECK(busy.requests == std::vector<int>{1, 2, 3});
  CHECK(busy.rows.value == 18);
  CHECK(make_batch(meta, 3).requests == std::vector<int>{4, 5});
  const model::Workload w = round_workload(meta, 4);
  CHECK(w.requests() == 6);
  CHECK(w.owners_of(2).empty());
  CHECK(w.owners_of(1).size() == 18);
  CHECK(w.total_rows() == 36);
}
