// EpMessage: the size of one dispatched row's message in ep_dispatch (placement/ep.hpp), as plain
// arithmetic with no communicator, so tools that predict traffic (relayout plan) use the same formula.
#pragma once

#include <cstdint>

namespace relayout {

// One dispatched row's message (bytes): its k router weights (T), its k local expert ids (int32,
// -1: not on this rank) and its row (stored as P: T, or a 16-bit type such as bf16), padded so the
// next message stays aligned for T. All of a row's data travel in one all_to_allv.
struct EpMessage {
  std::int64_t weights = 0, ids = 0, row = 0, bytes = 0;
  template <class T, class P = T>
  static EpMessage of(int k, std::int64_t hidden) {
    return of(k, hidden, sizeof(T), alignof(T), sizeof(P), alignof(P));
  }
  // The same from the types' sizes and alignments (what `relayout plan` predicts from).
  static constexpr EpMessage of(int k, std::int64_t hidden, std::int64_t t_size, std::int64_t t_align,
                                std::int64_t p_size, std::int64_t p_align) {
    const std::int64_t align = t_align > 4 ? t_align : 4;
    EpMessage m;
    m.ids = k * t_size;
    m.row = (m.ids + k * 4 + p_align - 1) / p_align * p_align;
    m.bytes = (m.row + hidden * p_size + align - 1) / align * align;
    return m;
  }
  std::int64_t words() const { return bytes / 4; }
};

}  // namespace relayout
