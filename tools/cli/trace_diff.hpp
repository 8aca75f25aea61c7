// `relayout trace diff BASELINE CANDIDATE`: reads two row-ownership traces (directories of
// rank<R>.jsonl, written by trace::JsonlSink) and reports the first boundary where the candidate
// layout's rows diverge from the trusted baseline's (docs/trace.md). Exit 0 agree, 1 diverge, 2 unreadable.
//
// Matching rule. Rows are matched by owner (request, position, speculative step), never by rank or
// index, because the two runs may use different layouts (1 rank vs TP8/DP4). Boundaries are visited
// layer by layer in the candidate's execution order. A candidate boundary is compared with the
// baseline boundary of the same layer and the same name when the baseline has one whose values mean
// the same (same `state`); otherwise with the baseline's last boundary of that layer in the same
// state (attn_out, moe_in, moe_partial, moe_out, layer_out): e.g. a dp_gather candidate's
// "reduce_scatterv" (moe_out) is compared with a single-rank baseline's "all_reduce" (moe_out), its
// "dp_gather" (moe_in) with the baseline's "bridge input". A boundary with no such counterpart
// (e.g. "dispatch+experts") still gets the row-conservation check. At each candidate boundary:
//   1. count: every row of the layer must appear exactly `copies` times over all ranks (the layout's
//      own expectation, recorded by the library: 1 after split_rows, attn group size when replicated...),
//      and no row the baseline does not know may appear. Only the rows of the steps that ran the
//      boundary count there: a step whose plan differs (automatic padding picks reduce_scatterv or
//      dp_reduce_scatter per step) is judged at its own boundary of the same state (see aggregate);
//   2. values: replicated rows — every holder's checksum must agree with the baseline row's;
//      partial rows (experts) — the holders' sum/wsum add up to the baseline row's (l2 is not compared);
//      tolerance: trace::checksums_agree (--rtol, --atol);
//   3. a checked invariant that failed there (record with "error", e.g. row conservation).
// The first boundary with a problem is reported with its first row in (request, position, step)
// order. The baseline's attention all_reduce and layer output (attn_out, layer_out) must exist in the
// candidate, so a candidate that stops early diverges. An injected bug therefore shows at the first
// boundary whose rows it changes, which is the boundary where it is wired.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <ostream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "relayout/mesh/names.hpp"
#include "relayout/trace/owner.hpp"
#include "relayout/trace/record.hpp"

namespace relayout::cli {

// Unreadable trace input (exit code 2): the message names the file and line.
struct TraceInputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct RankTrace {
  int rank = 0;
  std::string file;
  std::vector<trace::Record> records;
};

struct TraceRun {
  std::string dir;
  int world_size = 0;
  std::string program;
  std::string run;  // the header's run id ("" in files written without one)
  std::vector<RankTrace> ranks;
};

// A rank file larger than this is refused before it is read (a trace of 10^5 rows over a few
// layers is a few hundred MB).
inline constexpr std::uintmax_t kMaxTraceFile = std::uintmax_t(4) << 30;

namespace detail {

// Field readers of record_from_json: the value must be of the field's type as JSON has it, so that a
// damaged file is rejected rather than read as something else (a float or a bool truncated to an int,
// an unknown word read as the default). Integers are exact and non-negative (the writer writes no
// negative one; a handle or group that is absent is null).
inline std::int64_t nonneg_int(const nlohmann::json& v, std::int64_t max, const char* what) {
  if (v.is_number_unsigned() && v.get<std::uint64_t>() <= static_cast<std::uint64_t>(max))
    return static_cast<std::int64_t>(v.get<std::uint64_t>());
  if (v.is_number_integer() && v.get<std::int64_t>() >= 0 && v.get<std::int64_t>() <= max) return v.get<std::int64_t>();
  throw std::runtime_error(std::string(what) + " must be an integer in [0, " + std::to_string(max) + "], not " +
                           (v.is_number() ? v.dump() : std::string(v.type_name())));
}
inline int int_field(const nlohmann::json& j, const char* key) {
  return static_cast<int>(nonneg_int(j.at(key), std::numeric_limits<int>::max(), key));
}
inline std::int64_t int64_field(const nlohmann::json& j, const char* key) {
  return nonneg_int(j.at(key), std::numeric_limits<std::int64_t>::max(), key);
}
inline std::vector<std::int64_t> counts_field(const nlohmann::json& j, const char* key) {
  const nlohmann::json& a = j.at(key);
  if (!a.is_array()) throw std::runtime_error(std::string(key) + " must be an array");
  std::vector<std::int64_t> v;
  for (const nlohmann::json& e : a) v.push_back(nonneg_int(e, std::numeric_limits<std::int64_t>::max(), key));
  return v;
}
// A checksum entry: a number, or "nan", "inf", "-inf" (JSON has none of them); null, as older
// writers put for any of them, reads as NaN.
inline double checksum_entry(const nlohmann::json& v) {
  if (v.is_number()) return v.get<double>();
  if (v.is_null()) return std::numeric_limits<double>::quiet_NaN();
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
  }
  throw std::runtime_error("a checksum must be a number, \"nan\", \"inf\" or \"-inf\"");
}

}  // namespace detail

namespace detail {

// A field the reader does not know is refused: an edited or foreign file is not read half-way.
inline void known_fields(const nlohmann::json& j, std::initializer_list<const char*> known, const char* what) {
  for (const auto& item : j.items()) {
    bool ok = false;
    for (const char* k : known) ok = ok || item.key() == k;
    if (!ok) {
      std::string list;
      for (const char* k : known) list += (list.empty() ? "" : ", ") + std::string(k);
      throw std::runtime_error("field '" + item.key() + "' is not a field of " + what + " (known: " + list + ")");
    }
  }
}

inline constexpr const char* kStates[] = {"attn_out", "moe_in", "moe_partial", "moe_out", "dispatched", "layer_out"};

}  // namespace detail

// One record line (trace::to_jsonl). Throws on a missing field, one of the wrong type, a field or
// word the reader does not know, or a record inconsistent with itself.
inline trace::Record record_from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw std::runtime_error("a record must be a JSON object");
  detail::known_fields(j, {"layer", "boundary", "state", "sharing", "copies", "global_rank", "attn_dp_rank",
                           "attn_tp_rank", "attn_cp_rank", "moe_ep_rank", "group", "handle", "row_count", "pad_rows", "hidden",
                           "global_num_tokens", "scaled_global_num_tokens", "error", "rows"},
                       "a record");
  trace::Record r;
  r.layer = detail::int_field(j, "layer");
  r.boundary = j.at("boundary").get<std::string>();
  r.state = j.at("state").get<std::string>();
  if (std::find_if(std::begin(detail::kStates), std::end(detail::kStates), [&](const char* k) { return r.state == k; }) ==
      std::end(detail::kStates))
    throw std::runtime_error("field 'state': \"" + r.state +
                             "\" is not a state this reader knows (attn_out, moe_in, moe_partial, moe_out, dispatched, layer_out)");
  const std::string sharing = j.at("sharing").get<std::string>();
  if (sharing != "partial" && sharing != "replicated")
    throw std::runtime_error("sharing must be \"partial\" or \"replicated\", not \"" + sharing + "\"");
  r.sharing = sharing == "partial" ? RowState::partial : RowState::replicated;
  r.copies = detail::int_field(j, "copies");
  r.global_rank = detail::int_field(j, "global_rank");
  r.attn_dp_rank = detail::int_field(j, "attn_dp_rank");
  r.attn_tp_rank = detail::int_field(j, "attn_tp_rank");
  r.attn_cp_rank = j.contains("attn_cp_rank") ? detail::int_field(j, "attn_cp_rank") : 0;  // absent without CP
  r.moe_ep_rank = detail::int_field(j, "moe_ep_rank");
  r.group = j.at("group").is_null() ? "" : j.at("group").get<std::string>();
  if (!r.group.empty() && std::none_of(kAllGroupKinds.begin(), kAllGroupKinds.end(),
                                       [&](GroupKind g) { return to_string(g) == r.group; }))
    throw std::runtime_error("field 'group': \"" + r.group + "\" is not a process group (tp, attn_tp, moe_ep, ...)");
  r.handle = j.at("handle").is_null() ? -1 : detail::int_field(j, "handle");
  if (r.group.empty() != (r.handle < 0))
    throw std::runtime_error("fields 'group' and 'handle': both are null (a local step) or neither is");
  if (r.handle >= int(kAllGroupKinds.size()))
    throw std::runtime_error("field 'handle': " + std::to_string(r.handle) + " is not a communicator handle (one per group at most: [0, " +
                             std::to_string(kAllGroupKinds.size()) + "))");
  if (r.copies < 1) throw std::runtime_error("field 'copies': a row is held at least once, not 0 times");
  r.row_count = detail::int64_field(j, "row_count");
  r.pad_rows = detail::int64_field(j, "pad_rows");
  r.hidden = detail::int_field(j, "hidden");
  r.global_num_tokens = detail::counts_field(j, "global_num_tokens");
  if (j.contains("scaled_global_num_tokens")) r.scaled_global_num_tokens = detail::counts_field(j, "scaled_global_num_tokens");
  if (j.contains("error")) r.error = j.at("error").get<std::string>();
  const nlohmann::json& rows = j.at("rows");
  if (!rows.is_array()) throw std::runtime_error("rows must be an array");
  for (const nlohmann::json& row : rows) {
    if (!row.is_array() || row.size() != 6) throw std::runtime_error("a row must be [request,position,step,sum,wsum,l2]");
    trace::Row w{static_cast<int>(detail::nonneg_int(row[0], std::numeric_limits<int>::max(), "a row's request")),
                 static_cast<int>(detail::nonneg_int(row[1], std::numeric_limits<int>::max(), "a row's position")),
                 static_cast<int>(detail::nonneg_int(row[2], std::numeric_limits<int>::max(), "a row's step")), false, {}};
    // Three nulls: not recorded. Any other entry: recorded, and a null one was not finite.
    w.has_sum = !(row[3].is_null() && row[4].is_null() && row[5].is_null());
    const trace::RowSum sum{detail::checksum_entry(row[3]), detail::checksum_entry(row[4]), detail::checksum_entry(row[5])};
    if (w.has_sum) w.sum = sum;
    if (!r.rows.empty() && w.has_sum != r.rows.front().has_sum)
      throw std::runtime_error("rows: row " + std::to_string(r.rows.size()) +
                               (w.has_sum ? " has a checksum and row 0 none" : " has no checksum (null) and row 0 one") +
                               "; a record's rows all have checksums or none do");
    r.rows.push_back(w);
  }
  if (r.hidden < 1 && !r.rows.empty() && r.rows.front().has_sum)
    throw std::runtime_error("field 'hidden': 0, but the rows have checksums (0 only where the values are not recorded)");
  if (r.pad_rows > r.row_count || std::uint64_t(r.row_count - r.pad_rows) != r.rows.size())
    throw std::runtime_error("field 'row_count': " + std::to_string(r.row_count) + " rows, but the record lists " +
                             std::to_string(r.rows.size()) + " rows and pad_rows " + std::to_string(r.pad_rows) +
                             " (row_count = rows + pad_rows)");
  return r;
}

// One rank's trace from a stream; `file` names it in error messages. Throws TraceInputError
// ("FILE:LINE: why") unless the text is a complete trace: the header line (of this rank), records,
// and the end line counting them, last.
inline RankTrace read_rank_trace(std::istream& in, const std::string& file, int rank, int* world_size,
                                 std::string* program, std::string* run = nullptr) {
  RankTrace t{rank, file, {}};
  std::string line;
  int n = 0;
  bool ended = false;
  while (std::getline(in, line)) {
    ++n;
    const std::string at = file + ":" + std::to_string(n) + ": ";
    if (ended) throw TraceInputError(at + "text after the end line");
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw TraceInputError(at + "invalid JSON (truncated line?): " + e.what());
    }
    try {
      if (n == 1) {
        if (!j.is_object() || !j.contains("relayout_trace"))
          throw TraceInputError(at + "not a relayout trace (the first line must be the trace header)");
        detail::known_fields(j, {"relayout_trace", "rank", "world_size", "program", "run"}, "the header");
        const int version = detail::int_field(j, "relayout_trace");
        if (version != 1) throw TraceInputError(at + "trace format " + std::to_string(version) + ", this reader reads 1");
        const int header_rank = detail::int_field(j, "rank"), size = detail::int_field(j, "world_size");
        if (header_rank != rank) throw TraceInputError(at + "header says rank " + std::to_string(header_rank));
        if (size < 1 || rank >= size)
          throw TraceInputError(at + "world_size " + std::to_string(size) + " does not hold rank " + std::to_string(rank));
        if (world_size) *world_size = size;
        if (program) *program = j.value("program", "");
        if (run) *run = j.value("run", "");
      } else if (j.is_object() && j.contains("end")) {
        ended = true;
        detail::known_fields(j, {"end", "records"}, "the end line");
        if (j.at("end") != true) throw TraceInputError(at + "the end line must say \"end\":true");
        const std::int64_t k = detail::int64_field(j, "records");
        if (static_cast<std::uint64_t>(k) != t.records.size())
          throw TraceInputError(at + "end line counts " + std::to_string(k) + " records, the file has " +
                                std::to_string(t.records.size()));
      } else {
        t.records.push_back(record_from_json(j));
        if (t.records.back().global_rank != rank)
          throw TraceInputError(at + "a record of rank " + std::to_string(t.records.back().global_rank) +
                                " in the file of rank " + std::to_string(rank));
      }
    } catch (const TraceInputError&) {
      throw;
    } catch (const std::exception& e) {
      throw TraceInputError(at + (n == 1 ? "bad trace header: " : "bad trace record: ") + e.what());
    }
  }
  if (n == 0) throw TraceInputError(file + ": empty file");
  if (!ended) throw TraceInputError(file + ":" + std::to_string(n) + ": the trace ends without its end line (truncated?)");
  return t;
}

namespace detail {

// The file-system errors of a path (a symlink loop, a directory without permission) as unreadable
// input, naming the path.
template <class F>
auto fs_checked(const std::string& path, F&& f) {
  try {
    return f();
  } catch (const std::filesystem::filesystem_error& e) {
    throw TraceInputError(path + ": " + e.code().message() + " (" + e.what() + ")");
  }
}

}  // namespace detail

// A rank file must be a regular file of at most kMaxTraceFile bytes: a FIFO would block the reader,
// a directory or a device (/dev/zero) is not a trace, and neither is read.
inline RankTrace read_rank_trace(const std::string& file, int rank, int* world_size, std::string* program,
                                 std::string* run = nullptr) {
  namespace fs = std::filesystem;
  const fs::file_status st = detail::fs_checked(file, [&] { return fs::status(file); });
  if (st.type() == fs::file_type::not_found) throw TraceInputError(file + ": cannot open (missing rank file?)");
  if (st.type() != fs::file_type::regular) {
    const char* kind = st.type() == fs::file_type::directory ? "a directory"
                       : st.type() == fs::file_type::fifo    ? "a FIFO"
                       : st.type() == fs::file_type::character || st.type() == fs::file_type::block ? "a device"
                                                                                                    : "not a regular file";
    throw TraceInputError(file + ": " + kind + ", not a rank file (a rank file is a regular file written by --trace)");
  }
  const std::uintmax_t size = detail::fs_checked(file, [&] { return fs::file_size(file); });
  if (size > kMaxTraceFile)
    throw TraceInputError(file + ": " + std::to_string(size) + " bytes, more than a rank file may have (" +
                          std::to_string(kMaxTraceFile) + " bytes); not read");
  std::ifstream in(file);
  if (!in) throw TraceInputError(file + ": cannot open (" + std::strerror(errno) + ")");
  return read_rank_trace(in, file, rank, world_size, program, run);
}

// All rank files of one run: rank0.jsonl names the world size, every rank below it must be there,
// and every file's header must name the same world size and program (no file of another run).
inline TraceRun read_trace(const std::string& dir) {
  namespace fs = std::filesystem;
  if (!detail::fs_checked(dir, [&] { return fs::is_directory(dir); }))
    throw TraceInputError(dir + ": not a trace directory (missing?)");
  TraceRun run;
  run.dir = dir;
  const std::string first = (fs::path(dir) / "rank0.jsonl").string();
  if (detail::fs_checked(first, [&] { return fs::status(first); }).type() == fs::file_type::not_found)
    throw TraceInputError(dir + ": no rank0.jsonl (not a trace directory?)");
  run.ranks.push_back(read_rank_trace(first, 0, &run.world_size, &run.program, &run.run));
  if (run.world_size < 1) throw TraceInputError(first + ":1: world_size must be >= 1");
  for (int r = 1; r < run.world_size; ++r) {
    const std::string file = (fs::path(dir) / ("rank" + std::to_string(r) + ".jsonl")).string();
    int size = 0;
    std::string program, id;
    run.ranks.push_back(read_rank_trace(file, r, &size, &program, &id));
    if (id != run.run)
      throw TraceInputError(file + ":1: files from different runs: this file's header says run \"" + id +
                            "\", rank0.jsonl's run \"" + run.run + "\" (two jobs wrote into " + dir + "?)");
    if (size != run.world_size || program != run.program)
      throw TraceInputError(file + ":1: header says world_size " + std::to_string(size) + ", program \"" + program +
                            "\"; rank0.jsonl says " + std::to_string(run.world_size) + ", \"" + run.program +
                            "\" (a file of another run?)");
  }
  return run;
}

// One boundary of one layer, over all ranks of a run.
using RowKey = std::tuple<int, int, int>;  // request, position, step
struct Holding {
  int rank = 0;
  bool has_sum = false;
  trace::RowSum sum;
};
struct BoundaryAgg {
  std::string name, state;
  RowState sharing = RowState::replicated;
  int copies = 0, hidden = 0;
  std::map<RowKey, std::vector<Holding>> rows;
  std::map<int, const trace::Record*> records;  // by rank
  std::vector<const trace::Record*> errors;
};
struct LayerAgg {
  std::vector<std::string> order;  // execution order
  std::map<std::string, BoundaryAgg> by_name;
  std::set<RowKey> all_rows;
  // Per boundary, the steps that ran without it: a step may take another plan (automatic padding
  // picks max_len or sum_len from each step's counts, so a step's sum is "reduce_scatterv" or
  // "dp_reduce_scatter"), and that boundary holds none of the step's rows.
  std::map<std::string, std::set<int>> skipped_steps;
  // Whether boundary `name` is expected to hold row `k`: it is, unless k's step is known to have
  // run without it.
  bool expects(const std::string& name, const RowKey& k) const {
    const auto it = skipped_steps.find(name);
    return it == skipped_steps.end() || !it->second.count(std::get<2>(k));
  }
};

inline std::map<int, LayerAgg> aggregate(const TraceRun& run) {
  std::map<int, LayerAgg> layers;
  // Passes (forwards): a rank's records in file order, a new pass starting where a (layer, boundary)
  // recurs. Every rank writes every boundary of every pass, so pass p is the same forward on all
  // ranks; its steps are those of the rows any rank recorded in it (none in a pass without rows).
  std::vector<std::set<std::pair<int, std::string>>> pass_names;
  std::vector<std::set<int>> pass_steps;
  for (const RankTrace& t : run.ranks) {
    std::size_t pass = 0;
    std::set<std::pair<int, std::string>> current;
    for (const trace::Record& r : t.records) {
      if (!current.emplace(r.layer, r.boundary).second) {
        ++pass;
        current = {{r.layer, r.boundary}};
      }
      if (pass_names.size() <= pass) {
        pass_names.resize(pass + 1);
        pass_steps.resize(pass + 1);
      }
      pass_names[pass].emplace(r.layer, r.boundary);
      for (const trace::Row& w : r.rows) pass_steps[pass].insert(w.step);
    }
  }
  for (const RankTrace& t : run.ranks) {
    std::map<int, std::ptrdiff_t> last;  // this rank's previous boundary per layer, as an index in order
    for (const trace::Record& r : t.records) {
      LayerAgg& L = layers[r.layer];
      auto it = std::find(L.order.begin(), L.order.end(), r.boundary);
      auto& prev = last.try_emplace(r.layer, -1).first->second;
      if (it == L.order.end()) it = L.order.insert(L.order.begin() + (prev + 1), r.boundary);
      prev = it - L.order.begin();
      BoundaryAgg& b = L.by_name[r.boundary];
      b.name = r.boundary;
      b.state = r.state;
      b.sharing = r.sharing;
      b.copies = std::max(b.copies, r.copies);
      b.hidden = std::max(b.hidden, r.hidden);
      b.records.try_emplace(r.global_rank, &r);
      if (!r.error.empty()) b.errors.push_back(&r);
      for (const trace::Row& w : r.rows) {
        const RowKey k{w.request, w.position, w.step};
        b.rows[k].push_back({r.global_rank, w.has_sum, w.sum});
        L.all_rows.insert(k);
      }
    }
  }
  // A step skipped a boundary when no pass with rows of that step ran it but one ran another boundary
  // of that layer in the same state instead (the other plan's counterpart). A step that reached no
  // boundary of that state is not excused: its rows are expected there, so a run that stopped early
  // or lost a step's rows diverges.
  std::map<int, std::set<std::pair<int, std::string>>> step_names;
  for (std::size_t p = 0; p < pass_names.size(); ++p)
    for (int s : pass_steps[p]) step_names[s].insert(pass_names[p].begin(), pass_names[p].end());
  for (auto& entry : layers) {  // named, not bound: the lambda below captures them (clang 14)
    const int layer = entry.first;
    auto& L = entry.second;
    for (const std::string& name : L.order)
      for (const auto& [s, ran] : step_names) {
        const auto& names = ran;
        if (names.count({layer, name})) continue;
        const std::string& state = L.by_name.at(name).state;
        if (std::any_of(L.order.begin(), L.order.end(), [&](const std::string& other) {
              return names.count({layer, other}) && L.by_name.at(other).state == state;
            }))
          L.skipped_steps[name].insert(s);
      }
  }
  return layers;
}

struct DiffOptions {
  trace::Tolerance tolerance;
};

namespace detail {

inline std::string fmt(const trace::RowSum& s, bool l2 = true) {
  char b[128];
  if (l2)
    std::snprintf(b, sizeof b, "sum=%.6g wsum=%.6g l2=%.6g", s.sum, s.wsum, s.l2);
  else
    std::snprintf(b, sizeof b, "sum=%.6g wsum=%.6g", s.sum, s.wsum);
  return b;
}

inline std::string row_name(const RowKey& k) {
  return "request " + trace::RowOwner::request_name(std::get<0>(k)) + " (id " + std::to_string(std::get<0>(k)) +
         "), position " + std::to_string(std::get<1>(k)) + ", step " + std::to_string(std::get<2>(k));
}

inline std::string rank_info(const BoundaryAgg& b, int rank) {
  const auto it = b.records.find(rank);
  if (it == b.records.end()) return "rank " + std::to_string(rank);
  const trace::Record& r = *it->second;
  std::string s = "rank " + std::to_string(rank) + " (attn_dp " + std::to_string(r.attn_dp_rank) +
                  (r.attn_cp_rank > 0 ? ", attn_cp " + std::to_string(r.attn_cp_rank) : std::string()) + ", attn_tp " +
                  std::to_string(r.attn_tp_rank) + ", moe_ep " + std::to_string(r.moe_ep_rank) + ", " +
                  (r.group.empty() ? std::string("local step") : "group " + r.group + " handle " + std::to_string(r.handle)) +
                  ", " + std::to_string(r.row_count) + " rows, global_num_tokens [";
  for (std::size_t i = 0; i < r.global_num_tokens.size(); ++i) s += (i ? " " : "") + std::to_string(r.global_num_tokens[i]);
  return s + "])";
}

// The row as the baseline has it: a holder's checksum, or the partial holders' total. A total's l2
// is the holders' l2 summed: not the total's l2, but a bound on it (triangle inequality), used only
// as the tolerance scale.
inline std::optional<trace::RowSum> expected_sum(const BoundaryAgg& b, const RowKey& k) {
  const auto it = b.rows.find(k);
  if (it == b.rows.end() || it->second.empty() || !it->second.front().has_sum) return std::nullopt;
  if (b.sharing == RowState::replicated) return it->second.front().sum;
  trace::RowSum t;
  for (const Holding& h : it->second) {
    t.sum += h.sum.sum;
    t.wsum += h.sum.wsum;
    t.l2 += h.sum.l2;
  }
  return t;
}

// The baseline boundary row k is compared at: `b` (the candidate boundary's counterpart) when k's
// step ran it, else the baseline's last boundary of the layer in `state` that k's step ran (a
// baseline whose steps took different plans); nullptr when there is none.
inline const BoundaryAgg* baseline_for(const LayerAgg& B, const BoundaryAgg* b, const std::string& state, const RowKey& k) {
  if (!b || B.expects(b->name, k)) return b;
  for (auto it = B.order.rbegin(); it != B.order.rend(); ++it)
    if (B.by_name.at(*it).state == state && B.expects(*it, k)) return &B.by_name.at(*it);
  return nullptr;
}

// The model width a run's records were taken at (0: no records).
inline int run_hidden(const TraceRun& run) {
  for (const RankTrace& rank : run.ranks)
    for (const trace::Record& r : rank.records)
      if (r.hidden > 0) return r.hidden;
  return 0;
}

}  // namespace detail

// A run consistent with itself, or TraceInputError naming file, line, field and rule: every record of
// a rank has that rank's coordinates; one model width; a group always has the same communicator
// handle; the records of one boundary (layer, name, n-th occurrence) agree over the ranks on
// state, sharing, copies, group, handle and global_num_tokens; a file's records of one speculative
// step carry one global_num_tokens; an attention-TP group's ranks are numbered 0..n-1; attention
// and layer outputs are held `copies` = attention-TP group size times. A baseline must also hold every row
// of a layer `copies` times at each boundary, and the holders of a replicated row must agree with
// each other (within `tol`): the baseline is the reference, so it is refused rather than trusted.
// (In a baseline, too, the attention output of a rank holds global_num_tokens[its group] rows.)
inline void check_run(const TraceRun& run, const trace::Tolerance& tol, bool baseline) {
  const std::string role = baseline ? "baseline" : "candidate";
  const auto at = [](const RankTrace& t, std::size_t i) { return t.file + ":" + std::to_string(i + 2) + ": "; };
  const auto list = [](const std::vector<std::int64_t>& v) {
    std::string s;
    for (std::int64_t x : v) s += (s.empty() ? "" : " ") + std::to_string(x);
    return "[" + s + "]";
  };
  struct First {
    const RankTrace* t;
    std::size_t i;
  };
  std::optional<First> width;
  std::map<std::string, First> handle_of;
  std::map<std::tuple<int, std::string, int>, First> boundary;  // layer, name, occurrence
  std::map<std::pair<int, int>, std::vector<int>> tp_ranks;  // (attn_dp_rank, attn_cp_rank) -> attn_tp_ranks
  int cp = 1;  // attention CP width: global_num_tokens has one entry per CP share of each DP group
  for (const RankTrace& t : run.ranks)
    for (std::size_t i = 0; i < t.records.size(); ++i) {
      const int c = t.records[i].attn_cp_rank;
      if (c >= run.world_size)
        throw TraceInputError(at(t, i) + "field 'attn_cp_rank': " + std::to_string(c) + " in a run of " +
                              std::to_string(run.world_size) + " ranks (a CP rank is below the CP width)");
      cp = std::max(cp, c + 1);
    }
  for (const RankTrace& t : run.ranks) {
    std::map<std::pair<int, std::string>, int> seen;
    std::map<int, std::size_t> step_first;  // step -> first record of it in this file
    for (std::size_t i = 0; i < t.records.size(); ++i) {
      const trace::Record& r = t.records[i];
      const trace::Record& r0 = t.records.front();
      if (r.attn_dp_rank != r0.attn_dp_rank || r.attn_tp_rank != r0.attn_tp_rank || r.moe_ep_rank != r0.moe_ep_rank ||
          r.attn_cp_rank != r0.attn_cp_rank)
        throw TraceInputError(at(t, i) + "fields 'attn_dp_rank', 'attn_cp_rank', 'attn_tp_rank', 'moe_ep_rank' (" +
                              std::to_string(r.attn_dp_rank) + ", " + std::to_string(r.attn_cp_rank) + ", " +
                              std::to_string(r.attn_tp_rank) + ", " + std::to_string(r.moe_ep_rank) +
                              ") differ from the file's first record's (" + std::to_string(r0.attn_dp_rank) + ", " +
                              std::to_string(r0.attn_cp_rank) + ", " + std::to_string(r0.attn_tp_rank) + ", " +
                              std::to_string(r0.moe_ep_rank) +
                              "): a rank's coordinates do not change");
      if (r.copies > run.world_size)
        throw TraceInputError(at(t, i) + "field 'copies': " + std::to_string(r.copies) + " copies of a row in a run of " +
                              std::to_string(run.world_size) + " ranks");
      if (!width && r.hidden > 0) width = First{&t, i};
      const trace::Record& w = width ? width->t->records[width->i] : r;
      if (r.hidden > 0 && r.hidden != w.hidden)
        throw TraceInputError(at(t, i) + "field 'hidden': " + std::to_string(r.hidden) + ", but " + at(*width->t, width->i) +
                              "says " + std::to_string(w.hidden) + ": one run has one model width");
      if (!r.group.empty()) {
        const auto [it, fresh] = handle_of.try_emplace(r.group, First{&t, i});
        const trace::Record& h = it->second.t->records[it->second.i];
        if (!fresh && h.handle != r.handle)
          throw TraceInputError(at(t, i) + "field 'handle': group " + r.group + " has handle " + std::to_string(r.handle) +
                                " here and " + std::to_string(h.handle) + " at " + at(*it->second.t, it->second.i) +
                                "one group, one communicator");
      }
      if (!r.rows.empty()) {
        const auto [it, fresh] = step_first.try_emplace(r.rows.front().step, i);
        const trace::Record& f = t.records[it->second];
        if (!fresh && f.global_num_tokens != r.global_num_tokens)
          throw TraceInputError(at(t, i) + "field 'global_num_tokens': " + list(r.global_num_tokens) + ", but line " +
                                std::to_string(it->second + 2) + " of the same step says " + list(f.global_num_tokens));
      }
      if (baseline && r.state == "attn_out") {  // a candidate's rows are judged against the baseline's
        const std::size_t share = std::size_t(r.attn_dp_rank) * std::size_t(cp) + std::size_t(r.attn_cp_rank);
        if (share >= r.global_num_tokens.size() || r.global_num_tokens[share] != std::int64_t(r.rows.size()))
          throw TraceInputError(at(t, i) + "field 'global_num_tokens': " + list(r.global_num_tokens) + " for attention-DP group " +
                                std::to_string(r.attn_dp_rank) + (cp > 1 ? " CP rank " + std::to_string(r.attn_cp_rank) : "") +
                                ", whose attention output holds " +
                                std::to_string(r.rows.size()) + " rows here");
      }
      const int occurrence = seen[{r.layer, r.boundary}]++;
      const auto [it, fresh] = boundary.try_emplace({r.layer, r.boundary, occurrence}, First{&t, i});
      if (fresh) continue;
      const trace::Record& o = it->second.t->records[it->second.i];
      const char* field = o.state != r.state                           ? "state"
                          : o.sharing != r.sharing                     ? "sharing"
                          : o.copies != r.copies                       ? "copies"
                          : o.group != r.group                         ? "group"
                          : o.global_num_tokens != r.global_num_tokens ? "global_num_tokens"
                          : o.scaled_global_num_tokens != r.scaled_global_num_tokens ? "scaled_global_num_tokens"
                                                                                     : nullptr;
      if (field) {
        std::string where = at(*it->second.t, it->second.i);
        where.resize(where.size() - 2);  // "FILE:LINE", without the ": " of a message prefix
        throw TraceInputError(at(t, i) + "field '" + field + "' of layer " + std::to_string(r.layer) + " boundary \"" +
                              r.boundary + "\" differs from rank " + std::to_string(o.global_rank) + "'s record at " +
                              where + ": the ranks of one boundary agree on it");
      }
    }
    if (!t.records.empty())
      tp_ranks[{t.records.front().attn_dp_rank, t.records.front().attn_cp_rank}].push_back(t.records.front().attn_tp_rank);
  }
  for (auto& [group, ranks] : tp_ranks) {
    std::sort(ranks.begin(), ranks.end());
    for (std::size_t k = 0; k < ranks.size(); ++k)
      if (ranks[k] != int(k))
        throw TraceInputError(run.dir + ": field 'attn_tp_rank': attention-DP group " + std::to_string(group.first) +
                              (cp > 1 ? " CP rank " + std::to_string(group.second) : "") + " has " +
                              std::to_string(ranks.size()) + " ranks, so its attn_tp_ranks must be 0.." +
                              std::to_string(ranks.size() - 1) + ", not " + list(std::vector<std::int64_t>(ranks.begin(), ranks.end())));
  }
  for (const RankTrace& t : run.ranks)
    for (std::size_t i = 0; i < t.records.size(); ++i) {
      const trace::Record& r = t.records[i];
      const int group_size = int(tp_ranks[{r.attn_dp_rank, r.attn_cp_rank}].size());
      if ((r.state == "attn_out" || r.state == "layer_out") && r.copies != group_size)
        throw TraceInputError(at(t, i) + "field 'copies': " + std::to_string(r.copies) + ", but a " + r.state +
                              " row is held by every rank of its attention-TP group, which has " + std::to_string(group_size) +
                              " ranks here");
    }
  if (!baseline) return;

  // The baseline against itself: counts and replicated copies.
  for (const auto& [layer, L] : aggregate(run))
    for (const std::string& name : L.order) {
      const BoundaryAgg& b = L.by_name.at(name);
      const std::string where = run.dir + " (" + role + "): layer " + std::to_string(layer) + ", boundary \"" + name + "\": ";
      for (const RowKey& k : L.all_rows) {
        if (!L.expects(name, k)) continue;  // its step ran another plan's boundary instead
        const auto it = b.rows.find(k);
        const std::size_t held = it == b.rows.end() ? 0 : it->second.size();
        if (int(held) != b.copies)
          throw TraceInputError(where + detail::row_name(k) + " is held " + std::to_string(held) + " times, the record says copies " +
                                std::to_string(b.copies) + ": a baseline must keep its own row count");
        if (b.sharing != RowState::replicated || held < 2 || !it->second.front().has_sum) continue;
        const Holding& first = it->second.front();
        for (const Holding& h : it->second)
          if (!trace::checksums_agree(first.sum, h.sum, b.hidden, tol))
            throw TraceInputError(where + detail::row_name(k) + ": rank " + std::to_string(first.rank) + " holds " +
                                  detail::fmt(first.sum) + ", rank " + std::to_string(h.rank) + " holds " + detail::fmt(h.sum) +
                                  ": the replicated copies of a baseline row must agree with each other");
      }
    }
}

// Traces of different programs (dsv4_layer, the DSpark draft, the DSpark target) or of different
// model widths come from different models: any "divergence" between them would say nothing about
// the layout, so they are refused (exit 2) instead of compared.
inline void require_comparable(const TraceRun& base, const TraceRun& cand) {
  if (!base.program.empty() && !cand.program.empty() && base.program != cand.program)
    throw TraceInputError(cand.dir + ": a trace of \"" + cand.program + "\" cannot be compared with a baseline of \"" +
                          base.program + "\" (" + base.dir + "): they run different models");
  const int hb = detail::run_hidden(base), hc = detail::run_hidden(cand);
  if (hb > 0 && hc > 0 && hb != hc)
    throw TraceInputError(cand.dir + ": its records have hidden " + std::to_string(hc) + ", the baseline's (" + base.dir +
                          ") hidden " + std::to_string(hb) + ": traces of different model sizes cannot be compared");
}

inline int trace_diff(const TraceRun& base_run, const TraceRun& cand_run, const DiffOptions& opt, std::ostream& out) {
  require_comparable(base_run, cand_run);
  const auto base = aggregate(base_run);
  const auto cand = aggregate(cand_run);
  out << "trace diff: baseline " << base_run.dir << " (" << base_run.world_size << " rank" << (base_run.world_size > 1 ? "s" : "")
      << "), candidate " << cand_run.dir << " (" << cand_run.world_size << " rank" << (cand_run.world_size > 1 ? "s" : "") << ")\n";
  std::vector<std::string> agreed, not_compared;
  std::int64_t compared = 0, checks = 0;
  const auto diverge = [&](int layer, const std::string& boundary, const std::string& detail) {
    out << "first divergence: layer " << layer << ", boundary \"" << boundary << "\"" << detail;
    if (!agreed.empty()) {
      out << "  agreed before it:";
      for (const auto& a : agreed) out << " " << a << ";";
      out << "\n";
    }
    return 1;
  };

  std::set<int> layers;
  for (const auto& [l, _] : base) layers.insert(l);
  for (const auto& [l, _] : cand) layers.insert(l);
  for (int layer : layers) {
    const auto bl = base.find(layer);
    const auto cl = cand.find(layer);
    if (cl == cand.end())
      return diverge(layer, bl->second.order.front(), " (the candidate has no record of layer " + std::to_string(layer) +
                                                          "; it stopped early)\n");
    if (bl == base.end())
      return diverge(layer, cl->second.order.front(), " (the baseline has no layer " + std::to_string(layer) + ")\n");
    const LayerAgg& B = bl->second;
    const LayerAgg& C = cl->second;
    std::set<std::string> matched;  // baseline boundaries compared
    for (const std::string& name : C.order) {
      const BoundaryAgg& c = C.by_name.at(name);
      const BoundaryAgg* b = nullptr;
      if (auto it = B.by_name.find(name); it != B.by_name.end() && it->second.state == c.state) b = &it->second;
      for (auto it = B.order.rbegin(); !b && it != B.order.rend(); ++it)
        if (B.by_name.at(*it).state == c.state) b = &B.by_name.at(*it);
      if (b) matched.insert(b->state);
      const std::string against = b ? (b->name == name ? "" : ", compared with baseline \"" + b->name + "\"") : "";
      const std::string head = " (state " + c.state + against + ")\n";

      if (!c.errors.empty()) {
        std::string ranks;
        for (const trace::Record* r : c.errors) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r->global_rank);
        return diverge(layer, name, head + "  checked invariant failed on rank(s) " + ranks + ": " + c.errors.front()->error + "\n");
      }
      // The baseline's rows of the steps that ran this boundary (a step that took another plan's
      // counterpart is checked there), and whatever the candidate holds here.
      std::set<RowKey> keys;
      for (const RowKey& k : B.all_rows)
        if (C.expects(name, k)) keys.insert(k);
      for (const auto& [k, _] : c.rows) keys.insert(k);
      std::optional<RowKey> first;
      std::string first_detail;
      std::int64_t bad = 0;
      for (const RowKey& k : keys) {
        const auto it = c.rows.find(k);
        const std::vector<Holding> none;
        const std::vector<Holding>& held = it == c.rows.end() ? none : it->second;
        std::string holders;
        for (const Holding& h : held) holders += "\n    " + detail::rank_info(c, h.rank);
        if (holders.empty()) holders = " none";
        std::string problem;
        if (!B.all_rows.count(k)) {
          problem = "  held by:" + holders + "\n  expected: no such row (the baseline never holds it)\n  found:    count " +
                    std::to_string(held.size()) + "\n";
        } else if (int(held.size()) != c.copies) {
          problem = "  held by:" + holders + "\n  expected: count " + std::to_string(c.copies) +
                    " (each row held that many times over all ranks here)\n  found:    count " + std::to_string(held.size()) + "\n";
        } else if (const BoundaryAgg* bk = detail::baseline_for(B, b, c.state, k)) {
          const std::optional<trace::RowSum> want = detail::expected_sum(*bk, k);
          if (want && !held.empty() && held.front().has_sum) {
            ++checks;
            const bool l2 = bk->sharing == RowState::replicated && c.sharing == RowState::replicated;
            std::string found;
            bool ok = true;
            if (c.sharing == RowState::partial) {
              trace::RowSum t;
              for (const Holding& h : held) {
                t.sum += h.sum.sum;
                t.wsum += h.sum.wsum;
                t.l2 += h.sum.l2;  // tolerance scale only (see expected_sum)
              }
              ok = trace::checksums_agree(*want, t, bk->hidden, opt.tolerance, false);
              found = "total of " + std::to_string(held.size()) + " partial rows: " + detail::fmt(t, false);
            } else {
              found = "per holder:";
              for (const Holding& h : held) {
                const bool agree = trace::checksums_agree(*want, h.sum, bk->hidden, opt.tolerance, l2);
                ok = ok && agree;
                found += "\n    rank " + std::to_string(h.rank) + ": " + detail::fmt(h.sum, l2) + (agree ? "" : "   <- differs");
              }
            }
            if (!ok)
              problem = "  held by:" + holders + "\n  expected: count " + std::to_string(c.copies) + ", " +
                        detail::fmt(*want, l2) + " (baseline \"" + bk->name + "\"" +
                        (bk->sharing == RowState::partial ? ", partial rows added" : "") + ")\n  found:    count " +
                        std::to_string(held.size()) + ", " + found + "\n";
          }
        }
        if (!problem.empty()) {
          ++bad;
          if (!first) {
            first = k;
            first_detail = problem;
          }
        }
      }
      if (first) {
        char tol[96];
        std::snprintf(tol, sizeof tol, "(tolerance rtol %g, atol %g)", opt.tolerance.rtol, opt.tolerance.atol);
        return diverge(layer, name, head + "  row: " + detail::row_name(*first) + "\n" + first_detail + "  " +
                                        std::to_string(bad) + " of " + std::to_string(keys.size()) +
                                        " rows differ at this boundary " + tol + "\n");
      }
      if (b) {
        ++compared;
        agreed.push_back("layer " + std::to_string(layer) + " " + name);
      } else {
        not_compared.push_back("layer " + std::to_string(layer) + " " + name);
      }
    }
    // The candidate must reach the states every layout has: attention output and layer output.
    for (const std::string& name : B.order) {
      const BoundaryAgg& b = B.by_name.at(name);
      if ((b.state == "attn_out" || b.state == "layer_out") && !matched.count(b.state))
        return diverge(layer, name, " (state " + b.state + ")\n  expected: " + std::to_string(b.rows.size()) +
                                        " rows (baseline)\n  found:    no such boundary in the candidate (it stopped before it)\n");
    }
  }
  out << "traces agree: " << compared << " boundaries over " << layers.size() << " layer" << (layers.size() == 1 ? "" : "s")
      << " compared, " << checks << " row checksums\n";
  if (!not_compared.empty()) {
    out << "  not compared (no baseline counterpart; row counts checked):";
    for (const auto& n : not_compared) out << " " << n << ";";
    out << "\n";
  }
  return 0;
}

// The subcommand's body: exit 0 agree, 1 diverge, 2 unreadable input.
inline int trace_diff(const std::string& baseline, const std::string& candidate, const DiffOptions& opt,
                      std::ostream& out, std::ostream& err) {
  try {
    const TraceRun b = read_trace(baseline);
    const TraceRun c = read_trace(candidate);
    check_run(b, opt.tolerance, true);
    check_run(c, opt.tolerance, false);
    return trace_diff(b, c, opt, out);
  } catch (const TraceInputError& e) {
    err << "error: " << e.what() << "\n";
    return 2;
  }
}

}  // namespace relayout::cli
