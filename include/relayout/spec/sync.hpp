// SpecTpSync (docs/dspark.md): one rank's speculative decision (draft tokens, plan, accepted lengths,
// target choices) broadcast from group rank 0 of the attention-TP group (DP attention on) or of the
// TP group (off), so every member of the group commits the same tokens. Decisions only.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "relayout/comm.hpp"
#include "relayout/spec/draft.hpp"
#include "relayout/spec/sync_sites.hpp"

namespace relayout::spec {

// What SpecTpSync may carry: token ids / lengths / plans (int32, int64) and sampling probabilities
// (float), as a one-dimensional tensor (span, vector, array or rank-1 View). A decision is a few
// values per request; hidden states, router activations, dispatch buffers, token geometry and KV
// pages are not decisions. Two rules keep them out at compile time: no double/bf16/byte payloads
// (KV pages and dispatch buffers are raw bytes or bf16), and no rank-2+ Views (hidden states and
// router logits are rows x features). A float vector could still be misused for a flattened hidden
// row; the name of the call (a site) and this comment are the remaining guard.
template <class T>
inline constexpr bool is_decision_scalar_v =
    std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::int64_t> || std::is_same_v<T, float>;

namespace impl {
template <class B>
constexpr bool decision_rank_ok() {
  if constexpr (relayout::impl::is_kokkos_view<B>) return std::remove_cvref_t<B>::rank == 1;
  else return true;
}
}  // namespace impl

template <class B>
concept DecisionTensor = WritableBuffer<B> && impl::decision_rank_ok<B>() &&
                         is_decision_scalar_v<std::remove_const_t<buffer_element_t<B>>>;

// Per site: how often it was asked to sync, how often it broadcast, and why it did not.
struct SyncCounters {
  std::int64_t calls = 0;
  std::int64_t broadcasts = 0;
  std::int64_t skipped_disabled = 0;     // the site is off in RELAYOUT_SPEC_TP_SYNC
  std::int64_t skipped_single_rank = 0;  // the group has one rank: nothing to agree on
};

template <SplittableCommunicator C>
class SpecTpSyncOf {
 public:
  // `sites` defaults to RELAYOUT_SPEC_TP_SYNC (all when unset).
  explicit SpecTpSyncOf(const ProcessGroupsOf<C>& groups, SyncSites sites = SyncSites::from_env())
      : groups_(groups), sites_(std::move(sites)), group_(draft_context(groups.layout()).sync_group) {}

  // Collective over the sync group when the site is enabled and the group has more than one rank;
  // otherwise a no-op on every member alike (the site configuration must be the same on all ranks,
  // as an environment variable of the job is). Returns whether it broadcast.
  template <class B>
    requires DecisionTensor<B>
  bool sync(std::string_view site, B&& decisions) {
    SyncCounters& c = counters_[std::string(site)];
    ++c.calls;
    if (!sites_.enabled(site)) {  // throws on an unknown site name
      ++c.skipped_disabled;
      return false;
    }
    const C& comm = groups_.comm(group_);
    if (comm.size() == 1) {
      ++c.skipped_single_rank;
      return false;
    }
    // Root 0 is the group's rank 0 (the communicator's ranks are group ranks), not world rank 0.
    broadcast(comm, std::forward<B>(decisions), 0);
    ++c.broadcasts;
    return true;
  }

  GroupKind group() const { return group_; }
  int group_size() const { return groups_.comm(group_).size(); }
  const SyncSites& sites() const { return sites_; }
  const std::map<std::string, SyncCounters>& counters() const { return counters_; }

  // Diagnostic, collective over the sync group: do all members hold the same decision? (Gathers
  // every member's copy; used to show what happens with a site switched off, not on the hot path.)
  template <class B>
    requires DecisionTensor<B>
  bool agrees(const B& decisions) const {
    using T = std::remove_const_t<buffer_element_t<B>>;
    const C& comm = groups_.comm(group_);
    if (comm.size() == 1) return true;
    const auto mine = relayout::impl::read_span(decisions, "decisions");
    std::int64_t n = std::int64_t(mine.size()), lo = n, hi = n;
    all_reduce_in_place(comm, std::span<std::int64_t>(&lo, 1), ReduceOp::min);
    all_reduce_in_place(comm, std::span<std::int64_t>(&hi, 1), ReduceOp::max);
    if (lo != hi) return false;
    std::vector<T> all(mine.size() * std::size_t(comm.size()));
    all_gather(comm, mine, all);
    for (std::size_t r = 1; r < std::size_t(comm.size()); ++r)
      for (std::size_t i = 0; i < mine.size(); ++i)
        if (all[r * mine.size() + i] != all[i]) return false;
    return true;
  }

 private:
  const ProcessGroupsOf<C>& groups_;
  SyncSites sites_;
  GroupKind group_;
  std::map<std::string, SyncCounters> counters_;
};

using SpecTpSync = SpecTpSyncOf<MpiCommunicator>;

}  // namespace relayout::spec
