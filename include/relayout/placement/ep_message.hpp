// The EP dispatch's wire format as plain arithmetic with no communicator (EpMessage: one row's
// message in EpBuffer's dispatch), so tools that predict traffic (relayout plan) use the same
// formula; and the per-call choices of that format: the row's dtype and DeepEP's mode.
#pragma once

#include <cstdint>
#include <string_view>

#include "relayout/mesh/names.hpp"

namespace relayout {

// The type the rows travel as in the EP dispatch: the element type itself, a 16-bit storage type
// (half the row bytes; the experts see the rows rounded to it), or fp8: e4m3 values with one fp32 scale per 128 values (EpMessage::of_fp8; each value within its
// block's amax / 28 after the round trip). The router weights and the combine stay in the element type.
enum class DispatchDtype : std::uint8_t { compute, bf16, fp16, fp8 };
inline constexpr impl::NameTable<DispatchDtype, 4> kDispatchDtypeNames{{{{DispatchDtype::compute, "compute"},
                                                                         {DispatchDtype::bf16, "bf16"},
                                                                         {DispatchDtype::fp16, "fp16"},
                                                                         {DispatchDtype::fp8, "fp8"}}}};
constexpr std::string_view to_string(DispatchDtype d) { return kDispatchDtypeNames.name(d); }

// DeepEP's two dispatch modes, chosen per call. normal: the counts go first (one exchange), then
// the rows in buffers sized for this call. low_latency: blocks of a fixed capacity of rows per
// rank (EpBufferOptions::num_max_dispatch_tokens_per_rank) and one exchange per direction (each
// block carries its own count): one latency per call for decode-sized batches, at the price of
// sending whole blocks, used or not.
enum class EpMode : std::uint8_t { normal, low_latency };
inline constexpr impl::NameTable<EpMode, 2> kEpModeNames{
    {{{EpMode::normal, "normal"}, {EpMode::low_latency, "low_latency"}}}};
constexpr std::string_view to_string(EpMode m) { return kEpModeNames.name(m); }
// An EP mode by name ("normal", "low_latency"); `input` names the flag or field in the error.
inline EpMode parse_ep_mode(std::string_view text, const char* input = "ep_mode") {
  return impl::parse_name(kEpModeNames, text, input, "EP mode");
}


// One dispatched row's message (bytes): its k router weights (W: compute_t of the rows' scalar T,
// so fp32 for bf16 rows, as DeepEP sends topk_weights), its k local expert ids (int32, -1: not on
// this rank) and its row (stored as P: T, or a 16-bit type such as bf16), padded so the next
// message stays aligned for W. All of a row's data travel in one all_to_allv.
//
// FP8 rows (of_fp8): after the weights and ids, ceil(hidden / 128) fp32 block scales (one per 128
// consecutive values, 4-byte aligned), then hidden e4m3 values (1 byte each), padded as above.
// So a row costs hidden + ceil(hidden / 128) * 4 bytes plus the same k * (sizeof(W) + 4) of
// weights and ids: at hidden 7168, 7392 bytes against 14336 in bf16.
struct EpMessage {
  static constexpr std::int64_t kFp8Block = 128;  // values per fp32 scale

  std::int64_t weights = 0, ids = 0, row = 0, bytes = 0;
  std::int64_t scales = -1;  // offset of the fp32 block scales; -1: the row is not fp8

  template <class W, class P = W>
  static EpMessage of(int k, std::int64_t hidden) {
    return of(k, hidden, sizeof(W), alignof(W), sizeof(P), alignof(P));
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

  // Bytes of one row's e4m3 values and fp32 block scales.
  static constexpr std::int64_t fp8_row_bytes(std::int64_t hidden) {
    return hidden + (hidden + kFp8Block - 1) / kFp8Block * 4;
  }
  template <class W>
  static EpMessage of_fp8(int k, std::int64_t hidden) {
    return of_fp8(k, hidden, sizeof(W), alignof(W));
  }
  static constexpr EpMessage of_fp8(int k, std::int64_t hidden, std::int64_t t_size, std::int64_t t_align) {
    const std::int64_t align = t_align > 4 ? t_align : 4;
    EpMessage m;
    m.ids = k * t_size;
    m.scales = (m.ids + k * 4 + 3) / 4 * 4;
    m.row = m.scales + (hidden + kFp8Block - 1) / kFp8Block * 4;
    m.bytes = (m.row + hidden + align - 1) / align * align;
    return m;
  }
  std::int64_t words() const { return bytes / 4; }
};

}  // namespace relayout
