// The one request table of an attention-CP rank: request ids <-> slots, the positions of each
// request cached on this rank, and the engine's KV store told of every change through a hook.
// Admitting a request into a slot another request used empties the slot here and, through the
// hook, in the store: no stale KV survives a reused slot. Host bookkeeping only; every rank of an
// attention-DP group makes the same calls in the same order (docs/kv_cache.md).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "relayout/attention/kv_ledger.hpp"
#include "relayout/mesh/error.hpp"

namespace relayout {

// What a KV store is told, per slot (the table never reads the store):
//   on_admit(slot, request): `request` now holds `slot`; the store drops whatever it still holds there.
//   on_release(slot): the slot's request finished; its rows may go.
//   on_truncate(slot, rows): keep the first `rows` rows of the slot cached on this rank.
// A hook is held by value: a handle onto the store (PagedKvCache::hook, or an engine's own).
template <class H>
concept KvStoreHook = requires(H& h, int slot, std::int64_t n) {
  h.on_admit(slot, n);
  h.on_release(slot);
  h.on_truncate(slot, n);
};

// `count` new rows of `request`, at its next positions.
struct RequestRows {
  std::int64_t request = 0;
  int count = 0;
};

namespace impl {

// Request ids <-> slots: a request admitted takes the lowest free slot until it finishes.
class SlotAllocator {
 public:
  explicit SlotAllocator(int slots) {
    if (slots < 0) throw LayoutError("slots", "RequestTable: slots must be >= 0, got " + std::to_string(slots));
    ids_.assign(std::size_t(slots), kFree);
    for (int s = slots - 1; s >= 0; --s) free_.push_back(s);
  }
  int capacity() const { return int(ids_.size()); }
  int live() const { return capacity() - int(free_.size()); }
  bool holds(std::int64_t id) const { return slot_.count(id) != 0; }

  // Throws before changing anything when the id is negative, holds a slot already, or none is free.
  int admit(std::int64_t id) {
    const std::string at = "RequestTable::admit: request " + std::to_string(id);
    if (id < 0) throw LayoutError("request", at + ": an id must be >= 0");
    if (const auto it = slot_.find(id); it != slot_.end())
      throw LayoutError("request", at + " already holds slot " + std::to_string(it->second) + " (admitted twice)");
    if (free_.empty())
      throw LayoutError("request", at + ": all " + std::to_string(capacity()) +
                                       " slots are taken (finish a request first, or reserve more slots)");
    const int s = free_.back();
    free_.pop_back();
    ids_[std::size_t(s)] = id;
    slot_[id] = s;
    return s;
  }
  void finish(std::int64_t id) {
    const int s = slot_of("finish", id);
    slot_.erase(id);
    ids_[std::size_t(s)] = kFree;
    free_.push_back(s);
    std::sort(free_.begin(), free_.end(), std::greater<>());  // the lowest free slot next
  }
  int slot_of(const char* fn, std::int64_t id) const {
    const auto it = slot_.find(id);
    if (it == slot_.end())
      throw LayoutError("request", std::string("RequestTable::") + fn + ": request " + std::to_string(id) +
                                       " holds no slot (never admitted, or finished already)");
    return it->second;
  }
  std::int64_t id_in(int s) const {
    if (s < 0 || s >= capacity())
      throw LayoutError("slot", "RequestTable::id_in: slot " + std::to_string(s) + " is not in [0, " +
                                    std::to_string(capacity()) + ")");
    return ids_[std::size_t(s)];
  }

 private:
  static constexpr std::int64_t kFree = -1;
  std::vector<std::int64_t> ids_;  // per slot
  std::vector<int> free_;          // descending: back() is the lowest
  std::unordered_map<std::int64_t, int> slot_;
};

}  // namespace impl

template <KvStoreHook Hook>
class RequestTable {
 public:
  // `slots` request slots on CP rank `cp_rank` of `cp` (CpAttention::request_table fills both in).
  RequestTable(int slots, int cp, int cp_rank, Hook hook)
      : slots_(slots), ledger_(slots, cp, cp_rank), hook_(std::move(hook)) {}

  int capacity() const { return slots_.capacity(); }
  int live() const { return slots_.live(); }
  bool holds(std::int64_t request) const { return slots_.holds(request); }
  int slot_of(std::int64_t request) const { return slots_.slot_of("slot_of", request); }
  // The request in slot s (ExtendPlan names slots), or -1 when it is free.
  std::int64_t id_in(int slot) const { return slots_.id_in(slot); }
  int cp() const { return ledger_.cp(); }
  int cp_rank() const { return ledger_.cp_rank(); }
  // The CP rank holding position p of a request beyond what a prefill placed: p mod attn_cp.
  int rank_of(std::int64_t p) const { return ledger_.rank_of(p); }

  // `request` joins: it takes the lowest free slot, empty here and in the store (hook.on_admit).
  // Throws before changing anything when the id is < 0, holds a slot already or none is free.
  int admit(std::int64_t request) {
    const int s = slots_.admit(request);
    try {
      hook_.on_admit(s, request);
    } catch (...) {
      slots_.finish(request);
      throw;
    }
    ledger_.clear(s);
    return s;
  }
  // `request` leaves: the store is told (hook.on_release), its slot is free and empty. Returns the slot.
  int finish(std::int64_t request) {
    const int s = slots_.slot_of("finish", request);
    hook_.on_release(s);
    ledger_.clear(s);
    slots_.finish(request);
    return s;
  }

  // The request's prompt was cached by a prefill: `length` positions over the DP group, `held`
  // (ascending; CpBatch::positions_of) of them on this rank, their rows appended by the caller.
  void prefilled(std::int64_t request, std::vector<int> held, int length) {
    ledger_.prefilled(slots_.slot_of("prefilled", request), std::move(held), length);
  }

  // Plans one step (new rows per request, in step order) and records them as cached; the caller
  // appends this rank's rows to its store (ExtendPlan::append_*, append_extend). `window` > 0: a row
  // at p sees keys from p - window + 1 on. Throws before changing anything when a request holds no
  // slot, is listed twice or has a negative count.
  ExtendPlan extend(std::span<const RequestRows> step, int window = 0) {
    std::vector<impl::SlotRows> rows;
    for (std::size_t i = 0; i < step.size(); ++i) {
      const std::string at = "RequestTable::extend: request " + std::to_string(step[i].request);
      if (step[i].count < 0)
        throw LayoutError("count", at + " has " + std::to_string(step[i].count) + " new rows; a count must be >= 0");
      for (std::size_t k = 0; k < i; ++k)
        if (step[k].request == step[i].request) throw LayoutError("request", at + " is listed twice in one step");
      rows.push_back({slots_.slot_of("extend", step[i].request), step[i].count});
    }
    return ledger_.extend(rows, window);
  }
  ExtendPlan extend(std::initializer_list<RequestRows> step, int window = 0) {
    return extend(std::span<const RequestRows>(step.begin(), step.size()), window);
  }

  // Rolls the request back to its first `length` positions (rejected speculative rows): the store
  // keeps the rows this rank holds of them (hook.on_truncate). Returns that row count.
  std::int64_t truncate(std::int64_t request, std::int64_t length) {
    const int s = slots_.slot_of("truncate", request);
    const std::int64_t keep = ledger_.kept(s, length);
    hook_.on_truncate(s, keep);
    ledger_.truncate(s, length);
    return keep;
  }

  // Positions of the request cached over the DP group, and those cached here (ascending).
  std::int64_t length(std::int64_t request) const { return ledger_.length(slots_.slot_of("length", request)); }
  const std::vector<int>& held(std::int64_t request) const { return ledger_.held(slots_.slot_of("held", request)); }

  const Hook& hook() const { return hook_; }

 private:
  impl::SlotAllocator slots_;
  impl::CpKvLedger ledger_;
  Hook hook_;
};

}  // namespace relayout
