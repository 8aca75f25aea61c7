// One step's rows as the attention side sees them (ExtendPlan), and the position bookkeeping behind
// RequestTable (request_table.hpp): which positions of each slot this attention-CP rank caches and
// what a step's new rows (decode: one per request; extend: several, a speculative verify or a
// prompt chunk; both mixed in one step) mean to this rank: the rows it holds, where their KV goes,
// and every row it attends with the keys it may see (causal by position, the window's start).
// Host bookkeeping only; every rank of an attention-DP group builds the same plan from the same
// step description (docs/kv_cache.md). Engines use RequestTable, not impl::CpKvLedger.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "relayout/mesh/error.hpp"

namespace relayout {

// One step's rows on this rank (ExtendPlan::mine in the caller's input order, request after
// request in the order the step lists them, positions ascending).
struct ExtendPlan {
  int cp = 1;
  std::vector<int> slot, position;     // this rank's rows
  std::vector<int> append_slot;        // this rank's rows [append_cu[i], append_cu[i + 1]) go to
  std::vector<int> append_cu{0};       // the cache of append_slot[i]
  // The rows attended here: under CP every row of the group, CP rank after CP rank (the order the
  // query all-gather leaves them in); without CP this rank's rows. For each: its slot, how many of
  // the keys held here it sees (those at positions <= its own), where its window starts among them.
  std::vector<int> attend_slot, attend_limit, attend_first;
  std::vector<int> counts;  // rows of each CP rank
  // A request has several new rows: each row sees only part of its slot (attend_limit).
  bool causal = false;

  int rows() const { return int(slot.size()); }
};

namespace impl {

// `count` new rows of the request in `slot`, at its next positions.
struct SlotRows {
  int slot = 0;
  int count = 0;
};

// The positions of each slot cached on one CP rank. RequestTable owns one and keeps it in step with
// its slots and the engine's store; nothing else should hold one.
class CpKvLedger {
 public:
  CpKvLedger(int slots, int cp, int cp_rank) : cp_(cp), rank_(cp_rank) {
    if (slots < 0) throw LayoutError("slots", "RequestTable: slots must be >= 0, got " + std::to_string(slots));
    if (cp < 1 || cp_rank < 0 || cp_rank >= cp)
      throw LayoutError("cp_rank", "RequestTable: CP rank " + std::to_string(cp_rank) + " of attn_cp " +
                                       std::to_string(cp) + ": need attn_cp >= 1 and a rank in [0, attn_cp)");
    held_.resize(std::size_t(slots));
    length_.assign(std::size_t(slots), 0);
  }

  int slots() const { return int(length_.size()); }
  int cp() const { return cp_; }
  int cp_rank() const { return rank_; }
  // The CP rank holding position p of a request beyond what a prefill split placed: p mod attn_cp.
  int rank_of(std::int64_t p) const { return int(p % cp_); }

  // The request in `slot` was prefilled: `length` positions over the group, `held` (ascending) of
  // them cached here (CpBatch::positions_of).
  void prefilled(int slot, std::vector<int> held, int length) {
    check_slot("prefilled", slot);
    if (length < 0 || !std::is_sorted(held.begin(), held.end()) || (!held.empty() && (held.front() < 0 || held.back() >= length)))
      throw LayoutError("held", "RequestTable::prefilled: slot " + std::to_string(slot) +
                                    ": the held positions must be ascending, in [0, length = " + std::to_string(length) + ")");
    held_[std::size_t(slot)] = std::move(held);
    length_[std::size_t(slot)] = length;
  }
  // The request in `slot` left (or a new one starts there empty).
  void clear(int slot) {
    check_slot("clear", slot);
    held_[std::size_t(slot)].clear();
    length_[std::size_t(slot)] = 0;
  }

  // Plans one step and records its rows as cached (the caller appends them: ExtendPlan::append_*).
  // `window` > 0: a row at position p sees keys from p - window + 1 on. Throws before changing
  // anything when a slot is out of range, listed twice or a count is negative.
  ExtendPlan extend(std::span<const SlotRows> step, int window = 0) {
    for (std::size_t i = 0; i < step.size(); ++i) {
      check_slot("extend", step[i].slot);
      if (step[i].count < 0)
        throw LayoutError("count", "extend: slot " + std::to_string(step[i].slot) + " has " +
                                       std::to_string(step[i].count) + " new rows; a count must be >= 0");
      for (std::size_t k = 0; k < i; ++k)
        if (step[k].slot == step[i].slot)
          throw LayoutError("slot", "extend: slot " + std::to_string(step[i].slot) + " is listed twice in one step");
    }
    ExtendPlan plan;
    plan.cp = cp_;
    for (const SlotRows& e : step) {
      auto& held = held_[std::size_t(e.slot)];
      const int base = length_[std::size_t(e.slot)];
      const std::size_t before = held.size();
      for (int p = base; p < base + e.count; ++p)
        if (rank_of(p) == rank_) {
          held.push_back(p);
          plan.slot.push_back(e.slot);
          plan.position.push_back(p);
        }
      length_[std::size_t(e.slot)] = base + e.count;
      plan.causal = plan.causal || e.count > 1;
      if (held.size() == before) continue;
      plan.append_slot.push_back(e.slot);
      plan.append_cu.push_back(plan.append_cu.back() + int(held.size() - before));
    }
    plan.counts.assign(std::size_t(cp_), 0);
    for (int c = 0; c < cp_; ++c)
      for (const SlotRows& e : step) {
        if (cp_ == 1 && c != rank_) continue;
        const auto& held = held_[std::size_t(e.slot)];
        const int base = length_[std::size_t(e.slot)] - e.count;
        for (int p = base; p < length_[std::size_t(e.slot)]; ++p) {
          if (rank_of(p) != c) continue;
          ++plan.counts[std::size_t(c)];
          plan.attend_slot.push_back(e.slot);
          plan.attend_limit.push_back(int(std::upper_bound(held.begin(), held.end(), p) - held.begin()));
          plan.attend_first.push_back(
              int(std::lower_bound(held.begin(), held.end(), window > 0 ? p - window + 1 : 0) - held.begin()));
        }
      }
    return plan;
  }

  // How many of the slot's rows cached here lie below `length` (what truncate keeps).
  std::int64_t kept(int slot, std::int64_t length) const {
    check_slot("truncate", slot);
    if (length < 0) throw LayoutError("length", "truncate: length " + std::to_string(length) + " must be >= 0");
    const auto& held = held_[std::size_t(slot)];
    return std::lower_bound(held.begin(), held.end(), length) - held.begin();
  }
  // Keeps the positions below `length` of the request in `slot` (rolls back rejected speculative
  // rows); returns how many rows this rank's cache keeps of it.
  std::int64_t truncate(int slot, std::int64_t length) {
    const std::int64_t keep = kept(slot, length);
    auto& held = held_[std::size_t(slot)];
    held.resize(std::size_t(keep));
    length_[std::size_t(slot)] = int(std::min<std::int64_t>(length_[std::size_t(slot)], length));
    return keep;
  }

  // Positions of the request cached over the DP group, and those cached here.
  std::int64_t length(int slot) const {
    check_slot("length", slot);
    return length_[std::size_t(slot)];
  }
  const std::vector<int>& held(int slot) const {
    check_slot("held", slot);
    return held_[std::size_t(slot)];
  }

 private:
  void check_slot(const char* fn, int slot) const {
    if (slot < 0 || slot >= slots())
      throw LayoutError("slot", std::string("RequestTable::") + fn + ": slot " + std::to_string(slot) + " is not in [0, " +
                                    std::to_string(slots()) + ")");
  }

  int cp_, rank_;
  std::vector<std::vector<int>> held_;  // per slot, ascending
  std::vector<int> length_;             // per slot, over the group
};

}  // namespace impl
}  // namespace relayout
