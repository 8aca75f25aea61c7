// Idle participation in a speculative round (docs/dspark.md): every attention-DP group, including one with
// no requests, builds its batch from the same DpSyncMetadata and runs the draft and verify forwards,
// so the DP/MoE collectives inside them complete. An idle group's batch has zero rows, not no batch.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "relayout/comm.hpp"
#include "relayout/spec/tokens.hpp"

namespace relayout::spec {

enum class BatchKind : std::uint8_t { decode, idle };

// One attention-DP group's share of a speculative round.
struct SpecBatch {
  BatchKind kind = BatchKind::idle;
  int group = 0;
  std::vector<int> requests;  // global request ids (group 0's first, then group 1's, ...)
  RequestCount request_count;
  TokenRows rows;             // request_count x width
  DpSyncMetadata meta;        // identical on every rank, busy or idle

  bool idle() const { return kind == BatchKind::idle; }
};

// Request ids are numbered group after group, so the same request has the same id (and the same
// inputs) whether the round runs on many groups or on one.
inline std::vector<int> request_ids_of(const DpSyncMetadata& meta, int group) {
  std::vector<int> ids;
  std::int64_t first = 0;
  for (int g = 0; g < group; ++g) first += meta.raw.at(std::size_t(g)).value;
  for (std::int64_t i = 0; i < meta.raw.at(std::size_t(group)).value; ++i) ids.push_back(int(first + i));
  return ids;
}

inline SpecBatch make_batch(const DpSyncMetadata& meta, int group) {
  SpecBatch b;
  b.group = group;
  b.meta = meta;
  b.request_count = meta.raw.at(std::size_t(group));
  b.rows = meta.scaled.at(std::size_t(group));
  b.kind = meta.idle(std::size_t(group)) ? BatchKind::idle : BatchKind::decode;
  b.requests = request_ids_of(meta, group);
  return b;
}


// Every rank contributes its group's request count; the all-gather over the TP group yields one
// raw entry per attention-DP group (taken from each group's attention-TP rank 0), scaled by width.
template <class C>
DpSyncMetadata gather_sync_metadata(const ProcessGroupsOf<C>& groups, RequestCount mine, TokensPerRequest width) {
  const RuntimeLayout& layout = groups.layout();
  std::vector<std::int64_t> all(std::size_t(layout.size()));
  const std::int64_t v = mine.value;
  all_gather(groups.tp(), std::span<const std::int64_t>(&v, 1), all);
  std::vector<RequestCount> raw(std::size_t(layout.widths().attn_dp));
  for (int r = 0; r < layout.size(); ++r) {
    const RankCoords k = layout.coords(r);
    if (k.attn_tp_rank == 0 && k.attn_cp_rank == 0) raw[std::size_t(k.attn_dp_rank)] = {all[std::size_t(r)]};
  }
  return DpSyncMetadata::from_requests(std::move(raw), width);
}

}  // namespace relayout::spec
