// One row-ownership trace record (docs/trace.md): what one rank holds right after one layout boundary of
// one layer — who it is, which communicator the boundary used, and for every row its owner and a
// checksum of its values — plus the sinks that receive records (none by default, JSON Lines on request).
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "relayout/placement/tags.hpp"

namespace relayout::trace {

// Row checksum, compared with a tolerance rather than bit for bit, because a wider layout sums in a
// different order (float noise) while a layout bug changes rows by O(1) (x2, x attn_tp, 1/ep, ...):
//   sum  = Σ_f v_f,   wsum = Σ_f (f+1)/H · v_f  (catches features moved within a row),   l2 = sqrt(Σ_f v_f²)
// accumulated in double. Two checksums agree when (checksums_agree):
//   |Δsum| and |Δwsum| <= atol + rtol · sqrt(H) · max(l2)   (sqrt(H)·l2 bounds |sum| and |wsum|)
//   |Δl2|              <= atol + rtol · max(l2)
// with rtol = 1e-3 and atol = 1e-5 by default: float32 reordering noise is ~1e-6 relative.
// sum and wsum are linear, so the partial rows of several ranks add up to the full row's; l2 is not
// (it is compared only for rows every holder holds whole; for partial rows the diff passes the sum
// of the holders' l2, a bound on the total's, as the tolerance scale).
struct RowSum {
  double sum = 0.0;
  double wsum = 0.0;
  double l2 = 0.0;
};

struct Tolerance {
  double rtol = 1e-3;
  double atol = 1e-5;
};

inline bool close_enough(double a, double b, double scale, const Tolerance& t) {
  if (!std::isfinite(a) || !std::isfinite(b)) return false;  // NaN/inf never agree
  return std::abs(a - b) <= t.atol + t.rtol * scale;
}

// compare_l2: false for partial rows (their l2 does not add up).
inline bool checksums_agree(const RowSum& a, const RowSum& b, int hidden, const Tolerance& t = {},
                            bool compare_l2 = true) {
  const double l2 = std::max(std::abs(a.l2), std::abs(b.l2));
  const double s = std::sqrt(double(std::max(hidden, 1))) * l2;
  return close_enough(a.sum, b.sum, s, t) && close_enough(a.wsum, b.wsum, s, t) &&
         (!compare_l2 || close_enough(a.l2, b.l2, l2, t));
}

// Checksum of one row of H contiguous values.
template <class T>
RowSum row_sum(const T* v, int hidden) {
  RowSum r;
  double sq = 0.0;
  for (int f = 0; f < hidden; ++f) {
    double x;
    if constexpr (std::is_arithmetic_v<T>) x = double(v[f]);
    else x = double(float(v[f]));  // 16-bit storage types (bf16, fp16) widen through float
    r.sum += x;
    r.wsum += double(f + 1) / double(hidden) * x;
    sq += x * x;
  }
  r.l2 = std::sqrt(sq);
  return r;
}

// How the holders of a row relate is a RowState (placement/tags.hpp): replicated, each holds the
// whole row (one holder, as after a row split, is the degenerate case), or partial, each holds a
// summand and the row is their total. The trace writes "replicated" or "partial".
inline const char* sharing_name(RowState s) { return s == RowState::partial ? "partial" : "replicated"; }

struct Row {
  int request = 0;
  int position = 0;
  int step = 0;          // speculative step (0 outside speculative decoding)
  bool has_sum = false;  // false where the boundary's values are not visible to the recorder
  RowSum sum;
};

struct Record {
  int layer = 0;
  std::string boundary;  // the step just taken ("dp_gather", "experts", ...)
  // What the values mean, so boundaries of different paths can be compared (trace_diff.hpp):
  // attn_out, moe_in, moe_partial, moe_out, dispatched, layer_out.
  std::string state;
  RowState sharing = RowState::replicated;  // replicated or partial
  int copies = 1;  // how many times each row must appear over all ranks here (row conservation)
  int global_rank = 0, attn_dp_rank = 0, attn_tp_rank = 0, moe_ep_rank = 0;
  int attn_cp_rank = 0;  // attention context parallelism: which CP share of its DP group's rows
  std::string group;  // the group the boundary's collective ran over; empty for a local step
  int handle = -1;    // that group's communicator handle id (ProcessGroups::handle_id), -1 if local
  std::int64_t row_count = 0;  // tensor rows, padding included
  std::int64_t pad_rows = 0;   // rows with no owner (not listed in `rows`)
  int hidden = 0;
  std::vector<std::int64_t> global_num_tokens;         // raw, per attention-DP group
  std::vector<std::int64_t> scaled_global_num_tokens;  // when the caller scales them (e.g. x steps)
  std::vector<Row> rows;
  std::string error;  // non-empty: a checked invariant failed here (e.g. row conservation)
};

// A sink receives records. `enabled` is a compile-time switch: the recorder skips everything —
// checksums included — for a sink whose `enabled` is false, so NullSink costs nothing.
// `active()` is the run-time switch of an enabled sink (e.g. a file is open).
template <class S>
concept TraceSink = requires(S& s, const S& cs, const Record& r) {
  { S::enabled } -> std::convertible_to<bool>;
  { cs.active() } -> std::convertible_to<bool>;
  s.write(r);
};

// A sink may also say, per record, whether it reads the rows' checksums: `bool wants_sums() const`.
// A sink that only follows the boundaries (a progress line) returns false and the recorder then
// neither copies the values to the host nor sums them (a sum per element of every row at every
// boundary, several percent of a forward). Without the member every record carries its sums.
template <class S>
bool sink_wants_sums(const S& s) {
  if constexpr (requires { { s.wants_sums() } -> std::convertible_to<bool>; })
    return s.wants_sums();
  else
    return true;
}

struct NullSink {
  static constexpr bool enabled = false;
  static constexpr bool active() { return false; }
  void write(const Record&) {}
};

// Keeps records in memory (tests, in-process comparison).
struct MemorySink {
  static constexpr bool enabled = true;
  std::vector<Record> records;
  bool active() const { return true; }
  void write(const Record& r) { records.push_back(r); }
};

static_assert(TraceSink<NullSink> && TraceSink<MemorySink>);

}  // namespace relayout::trace
