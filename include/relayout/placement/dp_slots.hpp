// Where each attention-DP group's rows sit in a DpGlobal buffer, decided once per step from the
// all-gathered token counts (docs/bridge.md#padding): sum_len packs the groups back to back (exact total);
// max_len gives each group a slot of round_up_tokens(max, attn_tp) rows, padded with zeros.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "relayout/mesh/layout.hpp"

namespace relayout {

class DpSlots {
 public:
  // The padding mode comes from relayout::padding_mode on the same counts, so every rank that
  // holds the same global_num_tokens picks the same mode.
  DpSlots(const RuntimeLayout& layout, std::span<const std::int64_t> global_num_tokens)
      : DpSlots(layout, global_num_tokens, layout.padding_mode(global_num_tokens)) {}
  // With a mode the engine decided itself (every rank must pass the same one); the counts are
  // still checked by relayout::padding_mode.
  DpSlots(const RuntimeLayout& layout, std::span<const std::int64_t> global_num_tokens, PaddingMode mode)
      : mode_(validated(layout, global_num_tokens, mode)),
        counts_(global_num_tokens.begin(), global_num_tokens.end()),
        offsets_(counts_.size() + 1, 0) {
    const int attn_tp = layout.widths().attn_tp;
    const std::int64_t max = counts_.empty() ? 0 : *std::max_element(counts_.begin(), counts_.end());
    slot_rows_ = round_up_tokens(max, attn_tp);
    for (std::size_t g = 0; g < counts_.size(); ++g)
      offsets_[g + 1] = offsets_[g] + (mode_ == PaddingMode::max_len ? slot_rows_ : counts_[g]);
  }

  PaddingMode mode() const { return mode_; }
  std::span<const std::int64_t> counts() const { return counts_; }
  int groups() const { return static_cast<int>(counts_.size()); }
  std::int64_t count(int g) const { return counts_[at(g)]; }
  // First row of group g's rows in the DpGlobal buffer.
  std::int64_t offset(int g) const { return offsets_[at(g)]; }
  // Rows of one max_len slot: round_up_tokens(max(global_num_tokens), attn_tp).
  std::int64_t slot_rows() const { return slot_rows_; }
  std::int64_t total_rows() const { return offsets_.back(); }

 private:
  static std::size_t at(int g) { return static_cast<std::size_t>(g); }
  static PaddingMode validated(const RuntimeLayout& layout, std::span<const std::int64_t> counts, PaddingMode mode) {
    static_cast<void>(layout.padding_mode(counts));  // one count per DP group, each in range
    return mode;
  }

  PaddingMode mode_;
  std::vector<std::int64_t> counts_;
  std::vector<std::int64_t> offsets_;
  std::int64_t slot_rows_ = 0;
};

using DpSlotsPtr = std::shared_ptr<const DpSlots>;

inline DpSlotsPtr make_dp_slots(const RuntimeLayout& layout, std::span<const std::int64_t> global_num_tokens) {
  return std::make_shared<const DpSlots>(layout, global_num_tokens);
}
inline DpSlotsPtr make_dp_slots(const RuntimeLayout& layout, std::span<const std::int64_t> global_num_tokens,
                                PaddingMode mode) {
  return std::make_shared<const DpSlots>(layout, global_num_tokens, mode);
}

}  // namespace relayout
