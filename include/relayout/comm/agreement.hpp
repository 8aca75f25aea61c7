// Collective agreement: before a collective, the members of a group check that they are about to
// make the same call (operation, element type, count or counts, root, reduction and call site), and
// that every member's own arguments passed validation. On a mismatch every member throws the same
// CollectiveMismatch naming the call sites and the members that differ, instead of hanging in MPI or
// overrunning a buffer. Under the deadline (RELAYOUT_COLLECTIVE_TIMEOUT, on by default) the same
// exchange is a watchdog: a member that waits past it reports which members have not arrived and
// aborts the job. With the check off, each call's site is still recorded locally, so a wait that
// outlives the deadline names it.
//
// Settings (read once per process from the environment; every rank must see the same values):
//   RELAYOUT_CHECK_COLLECTIVES=1|0   on or off; unset: on when RELAYOUT_COLLECTIVE_TIMEOUT is set
//                                    above 0, else on unless NDEBUG is defined (define
//                                    RELAYOUT_CHECK_COLLECTIVES=0|1 at compile time to change it)
//   RELAYOUT_COLLECTIVE_TIMEOUT=S    seconds a member waits for the others (unset:
//                                    kDefaultCollectiveTimeout; 0: forever), at the arrival check
//                                    and inside the MPI collective itself (mpi.hpp), when a
//                                    communicator is made and at the end of the job (job.hpp).
//                                    At least kMinCollectiveTimeout: a shorter one aborts healthy jobs
//   RELAYOUT_EXIT_GRACE=S            seconds a failed rank waits for the others at exit (job.hpp;
//                                    unset: 10, or half the deadline when shorter; 0: it does not wait)
// A value that is empty, not a plain number, negative, not finite or above 1e6 is a LayoutError
// naming the variable; JobGuard (job.hpp) reads the settings on every rank when the job starts, so
// a bad value ends the whole job with exit code 2 before any work.
// The exchange is per backend: MpiCommunicator implements it; SingleRankCommunicator needs none;
// NcclCommunicator runs it on the host, over a duplicate of its MPI bootstrap communicator.
#pragma once

#include <algorithm>
#include <charconv>
#include <system_error>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <source_location>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "relayout/comm/collective_kind.hpp"
#include "relayout/comm/scalar.hpp"
#include "relayout/mesh/error.hpp"

#ifndef RELAYOUT_CHECK_COLLECTIVES
#ifdef NDEBUG
#define RELAYOUT_CHECK_COLLECTIVES 0
#else
#define RELAYOUT_CHECK_COLLECTIVES 1
#endif
#endif

namespace relayout {

template <class T>
constexpr const char* scalar_name() {
  if constexpr (std::is_same_v<T, float>) return "float";
  else if constexpr (std::is_same_v<T, double>) return "double";
  else if constexpr (std::is_same_v<T, std::int32_t>) return "int32";
  else if constexpr (std::is_same_v<T, std::int64_t>) return "int64";
  else if constexpr (std::is_same_v<T, bf16>) return "bf16";
  else if constexpr (std::is_same_v<T, fp16>) return "fp16";
  else return "?";
}

// What one member is about to call. Fields a collective does not use stay at their defaults.
struct CollectiveCall {
  CollectiveKind kind = CollectiveKind::barrier;
  const char* dtype = "";
  int reduce_op = -1;                // ReduceOp, for reductions
  int root = -1;                     // broadcast
  std::int64_t count = -1;           // elements every member passes alike (block or total)
  std::span<const int> counts{};     // per-member counts every member passes alike (v-collectives)
  std::span<const int> send_counts{};  // all_to_allv: checked pairwise against the peers'
  std::span<const int> recv_counts{};
  std::source_location site{};
  std::string_view local_error{};    // this member's own arguments failed validation
};

// Every member of the group throws this, with the same message, when the members disagree.
class CollectiveMismatch : public LayoutError {
 public:
  explicit CollectiveMismatch(const std::string& message) : LayoutError("collective", message) {}
};

// The shortest deadline accepted: below it the ranks' own start-up skew and one collective on a
// loaded host already take longer, so every job would be aborted at its first collective.
inline constexpr double kMinCollectiveTimeout = 1.0;

// The deadline of a launch that does not set RELAYOUT_COLLECTIVE_TIMEOUT: far above any healthy
// wait, so a stopped rank ends the job named within 5 minutes instead of hanging it.
inline constexpr double kDefaultCollectiveTimeout = 300.0;

struct AgreementSettings {
  bool check = RELAYOUT_CHECK_COLLECTIVES != 0;  // the exchange before every collective
  double timeout_s = kDefaultCollectiveTimeout;  // 0: wait forever
  double exit_grace_s = 10;
  // The exchange, or (check off, deadline on) the local record of each call for the watchdog.
  bool active() const { return check || timeout_s > 0; }
};

namespace impl {

// A number of seconds in [0, 1e6], written as a plain decimal (from_chars: no sign, spaces, hex or
// trailing text; "inf", "nan" and out-of-range values such as 1e309 fail the range check).
inline double env_seconds(const char* name, double fallback, const char* zero_means) {
  const char* v = std::getenv(name);
  if (!v) return fallback;
  const std::string rule = ": expected a number of seconds between 0 and 1e6 (0: " + std::string(zero_means) + ")";
  if (!*v) throw LayoutError(name, std::string(name) + " is set but empty" + rule);
  double s = -1;
  const char* end = v + std::strlen(v);
  const auto [ptr, ec] = std::from_chars(v, end, s);
  if (ec != std::errc() || ptr != end || !(s >= 0) || s > 1e6)
    throw LayoutError(name, std::string(name) + "=" + v + rule);
  return s;
}

inline AgreementSettings read_agreement_settings() {
  AgreementSettings s;
  s.timeout_s = env_seconds("RELAYOUT_COLLECTIVE_TIMEOUT", kDefaultCollectiveTimeout, "no deadline");
  // A deadline set on purpose turns the check on, so the watchdog names who never arrived.
  const bool set_deadline = std::getenv("RELAYOUT_COLLECTIVE_TIMEOUT") && s.timeout_s > 0;
  if (set_deadline) s.check = true;
  if (const char* v = std::getenv("RELAYOUT_CHECK_COLLECTIVES")) {
    const std::string_view t(v);
    if (t == "1" || t == "on" || t == "true") s.check = true;
    else if (t == "0" || t == "off" || t == "false") s.check = false;
    else
      throw LayoutError("RELAYOUT_CHECK_COLLECTIVES",
                        "RELAYOUT_CHECK_COLLECTIVES" + (t.empty() ? std::string(" is set but empty") : "=" + std::string(t)) +
                            ": expected 1|on|true or 0|off|false");
  }
  if (s.timeout_s > 0 && s.timeout_s < kMinCollectiveTimeout)
    throw LayoutError("RELAYOUT_COLLECTIVE_TIMEOUT",
                      "RELAYOUT_COLLECTIVE_TIMEOUT=" + std::string(std::getenv("RELAYOUT_COLLECTIVE_TIMEOUT")) +
                          ": a deadline below the minimum of 1 s cannot work (the ranks' start-up and one collective "
                          "on a loaded host take longer, so every job would be aborted); expected 0 (no deadline) or "
                          "at least 1 s");
  // A failed rank waits less than its peers' watchdog, so its own message comes first.
  s.exit_grace_s = env_seconds("RELAYOUT_EXIT_GRACE", s.timeout_s > 0 ? std::min(10.0, s.timeout_s / 2) : 10,
                               "a failed rank does not wait");
  return s;
}

}  // namespace impl

inline const AgreementSettings& agreement_settings() {
  static const AgreementSettings s = impl::read_agreement_settings();
  return s;
}

namespace impl {

// The fixed-size record one member sends each peer before a checked collective.
struct Signature {
  static constexpr std::uint32_t kMagic = 0x524c4147u;
  static constexpr int kShownCounts = 16;
  std::uint32_t magic = kMagic;
  std::uint8_t kind = 0;
  std::int8_t reduce_op = -1;
  std::int32_t root = -1;
  std::uint32_t line = 0;
  std::uint64_t seq = 0;
  std::int64_t count = -1;
  std::uint64_t counts_hash = 0;
  std::int32_t n_counts = 0;
  std::int32_t shown_counts[kShownCounts] = {};
  std::int64_t pair_send = -1;  // all_to_allv: what the sender sends to this receiver
  char dtype[8] = {};
  char file[72] = {};
  char function[40] = {};
  char error[256] = {};
};

template <std::size_t N>
void copy_text(char (&dst)[N], std::string_view s) {
  const std::size_t n = std::min(s.size(), N - 1);
  if (n > 0) std::memcpy(dst, s.data(), n);  // an empty view may have a null data()
  dst[n] = '\0';
}

// "model/bridge.hpp" rather than the whole path: the part after include/relayout/, else the last
// two path components; the tail if it is still too long.
inline std::string_view short_file(std::string_view f) {
  if (const auto p = f.rfind("include/relayout/"); p != std::string_view::npos)
    f = f.substr(p + 17);
  else if (const auto a = f.rfind('/'); a != std::string_view::npos && a > 0)
    if (const auto b = f.rfind('/', a - 1); b != std::string_view::npos) f = f.substr(b + 1);
  return f.size() > 71 ? f.substr(f.size() - 71) : f;
}

// "dp_gather" from "void relayout::model::Bridge<C, E, S>::dp_gather(...) [with ...]".
inline std::string_view short_function(std::string_view f) {
  f = f.substr(0, f.find('('));
  if (const auto p = f.rfind("::"); p != std::string_view::npos) f = f.substr(p + 2);
  if (const auto p = f.rfind(' '); p != std::string_view::npos) f = f.substr(p + 1);
  return f;
}

inline std::uint64_t hash_counts(std::span<const int> c) {
  std::uint64_t h = 1469598103934665603ull;
  for (int v : c) {
    h ^= static_cast<std::uint32_t>(v);
    h *= 1099511628211ull;
  }
  return h ^ c.size();
}

inline Signature make_signature(const CollectiveCall& call, std::uint64_t seq) {
  Signature s;
  s.kind = static_cast<std::uint8_t>(call.kind);
  s.reduce_op = static_cast<std::int8_t>(call.reduce_op);
  s.root = call.root;
  s.line = call.site.line();
  s.seq = seq;
  s.count = call.count;
  if (!call.counts.empty()) {
    s.counts_hash = hash_counts(call.counts);
    s.n_counts = static_cast<std::int32_t>(call.counts.size());
    for (int i = 0; i < Signature::kShownCounts && i < s.n_counts; ++i)
      s.shown_counts[i] = call.counts[static_cast<std::size_t>(i)];
  }
  copy_text(s.dtype, call.dtype);
  copy_text(s.file, short_file(call.site.file_name()));
  copy_text(s.function, short_function(call.site.function_name()));
  copy_text(s.error, call.local_error);
  return s;
}

// The same call, apart from what is checked pairwise (pair_send) and the error text.
inline bool same_call(const Signature& a, const Signature& b) {
  return a.seq == b.seq && a.kind == b.kind && a.reduce_op == b.reduce_op && a.root == b.root && a.line == b.line &&
         a.count == b.count && a.counts_hash == b.counts_hash &&
         std::strcmp(a.dtype, b.dtype) == 0 && std::strcmp(a.file, b.file) == 0;
}

inline const char* reduce_name(int op) {
  switch (op) {
    case 0: return "sum";
    case 1: return "prod";
    case 2: return "min";
    case 3: return "max";
    default: return "?";
  }
}

// "all_reduce(float, 24 elements, sum) at model/bridge.hpp:300 in dp_gather"
inline std::string describe(const Signature& s) {
  std::string out = to_string(static_cast<CollectiveKind>(s.kind));
  out += "(";
  out += s.dtype;
  if (s.count >= 0) out += ", " + std::to_string(s.count) + " elements";
  if (s.n_counts > 0) {
    out += ", counts [";
    for (int i = 0; i < s.n_counts && i < Signature::kShownCounts; ++i)
    {
      if (i) out += ' ';
      out += std::to_string(s.shown_counts[i]);
    }
    if (s.n_counts > Signature::kShownCounts) out += " ...";
    out += "]";
  }
  if (s.reduce_op >= 0) out += std::string(", ") + reduce_name(s.reduce_op);
  if (s.root >= 0) out += ", root " + std::to_string(s.root);
  out += ") at " + std::string(s.file) + ":" + std::to_string(s.line);
  if (s.function[0]) out += " in " + std::string(s.function);
  return out + ", call #" + std::to_string(s.seq) + " on this communicator";
}

inline std::string member_list(const std::vector<int>& m) {
  std::string out = "[";
  for (std::size_t i = 0; i < m.size(); ++i) {
    if (i) out += ' ';
    out += std::to_string(m[i]);
  }
  return out + "]";
}

// What the communicator knows about itself, for messages.
struct GroupText {
  std::string name;             // e.g. "attn_tp#1" (or "unnamed")
  std::vector<int> world_ranks;  // world rank of each member, when known
  std::string members(const std::vector<int>& m) const {
    std::string out = "members " + member_list(m);
    if (world_ranks.empty()) return out;
    std::vector<int> w;
    for (int r : m) w.push_back(r >= 0 && static_cast<std::size_t>(r) < world_ranks.size() ? world_ranks[static_cast<std::size_t>(r)] : -1);
    return out + " (world " + member_list(w) + ")";
  }
  std::string header(std::size_t size) const {
    return "communicator \"" + name + "\" (" + std::to_string(size) + " members)";
  }
};

// The verdict over every member's signature (index = member). Empty when they agree (or when every
// member's own arguments were invalid). Every member computes the same text from the same records.
inline std::string signature_verdict(const std::vector<Signature>& sigs, const GroupText& g) {
  std::string errors;
  std::size_t n_errors = 0;
  for (std::size_t i = 0; i < sigs.size(); ++i)
    if (sigs[i].error[0]) {
      ++n_errors;
      errors += "\n  member " + std::to_string(i) + " (" + describe(sigs[i]) + "): " + sigs[i].error;
    }
  // Every member refused: each throws its own error, as it would without the check.
  if (n_errors == sigs.size()) return {};
  if (n_errors > 0)
    return "relayout: collective refused on " + g.header(sigs.size()) +
           ": the arguments of some members are invalid, so no member communicates:" + errors;
  // Group the members by the call they make, in member order.
  std::vector<std::vector<int>> groups;
  std::vector<std::size_t> first;
  for (std::size_t i = 0; i < sigs.size(); ++i) {
    std::size_t k = 0;
    while (k < first.size() && !same_call(sigs[first[k]], sigs[i])) ++k;
    if (k == first.size()) {
      first.push_back(i);
      groups.emplace_back();
    }
    groups[k].push_back(static_cast<int>(i));
  }
  if (groups.size() == 1) return {};
  std::string out = "relayout: collective mismatch on " + g.header(sigs.size()) +
                    ": the members are not making the same call";
  for (std::size_t k = 0; k < groups.size(); ++k)
    out += "\n  " + g.members(groups[k]) + ": " + describe(sigs[first[k]]);
  return out;
}

// all_to_allv: one member's finding about what its peers send it (sender -1: all consistent).
struct PairFinding {
  std::int32_t sender = -1;
  std::int32_t pad = 0;
  std::int64_t sent = 0;
  std::int64_t expected = 0;
};

inline PairFinding pair_finding(const std::vector<Signature>& sigs, std::span<const int> recv_counts) {
  for (std::size_t p = 0; p < sigs.size() && p < recv_counts.size(); ++p)
    if (sigs[p].pair_send != recv_counts[p])
      return {static_cast<std::int32_t>(p), 0, sigs[p].pair_send, recv_counts[p]};
  return {};
}

inline std::string pair_verdict(const std::vector<PairFinding>& f, const Signature& any, const GroupText& g) {
  std::string out;
  for (std::size_t r = 0; r < f.size(); ++r)
    if (f[r].sender >= 0)
      out += "\n  member " + std::to_string(f[r].sender) + " sends " + std::to_string(f[r].sent) +
             " elements to member " + std::to_string(r) + ", which expects " + std::to_string(f[r].expected);
  if (out.empty()) return {};
  return "relayout: all_to_allv counts disagree on " + g.header(f.size()) + " at " +
         std::string(any.file) + ":" + std::to_string(any.line) + ", call #" + std::to_string(any.seq) +
         " (send_counts[j] on member i must equal recv_counts[i] on member j):" + out;
}

}  // namespace impl
}  // namespace relayout
