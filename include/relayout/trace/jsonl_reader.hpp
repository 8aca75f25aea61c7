// The reader of the JSON Lines traces that JsonlSink (jsonl.hpp) writes: one rank file or a run's
// directory back into trace::Records, strict (every field of its type, nothing the format does not
// name, every rank's file of one run), each refusal naming the file and line. Used by `relayout trace
// diff` and fuzzed by test/fuzz/fuzz_trace.cpp. Needs nlohmann_json (header-only; Debian
// nlohmann-json3-dev), which the rest of the library does not.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <istream>
#include <iterator>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "relayout/io/files.hpp"
#include "relayout/mesh/names.hpp"
#include "relayout/trace/jsonl.hpp"
#include "relayout/trace/record.hpp"

namespace relayout::trace {

// Unreadable trace input (exit code 2): the message names the file and line.
struct TraceInputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct RankTrace {
  int rank = 0;
  std::string file;
  std::vector<Record> records;
  // Read with partial_ok, a file that ends before its end line (its run was killed or aborted):
  // why it is incomplete ("FILE:LINE: ..."); the records are those before the cut. Empty when complete.
  std::string stopped;
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

namespace impl {

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

}  // namespace impl

// One record line (trace::to_jsonl). Throws on a missing field, one of the wrong type, a field or
// word the reader does not know, or a record inconsistent with itself.
inline Record record_from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw std::runtime_error("a record must be a JSON object");
  impl::known_fields(j, {"layer", "boundary", "state", "sharing", "copies", "global_rank", "attn_dp_rank",
                           "attn_tp_rank", "attn_cp_rank", "moe_ep_rank", "group", "handle", "row_count", "pad_rows", "hidden",
                           "global_num_tokens", "scaled_global_num_tokens", "error", "rows"},
                       "a record");
  Record r;
  r.layer = impl::int_field(j, "layer");
  r.boundary = j.at("boundary").get<std::string>();
  r.state = j.at("state").get<std::string>();
  if (std::find_if(std::begin(impl::kStates), std::end(impl::kStates), [&](const char* k) { return r.state == k; }) ==
      std::end(impl::kStates))
    throw std::runtime_error("field 'state': \"" + r.state +
                             "\" is not a state this reader knows (attn_out, moe_in, moe_partial, moe_out, dispatched, layer_out)");
  const std::string sharing = j.at("sharing").get<std::string>();
  if (sharing != "partial" && sharing != "replicated")
    throw std::runtime_error("sharing must be \"partial\" or \"replicated\", not \"" + sharing + "\"");
  r.sharing = sharing == "partial" ? RowState::partial : RowState::replicated;
  r.copies = impl::int_field(j, "copies");
  r.global_rank = impl::int_field(j, "global_rank");
  r.attn_dp_rank = impl::int_field(j, "attn_dp_rank");
  r.attn_tp_rank = impl::int_field(j, "attn_tp_rank");
  r.attn_cp_rank = j.contains("attn_cp_rank") ? impl::int_field(j, "attn_cp_rank") : 0;  // absent without CP
  r.moe_ep_rank = impl::int_field(j, "moe_ep_rank");
  r.group = j.at("group").is_null() ? "" : j.at("group").get<std::string>();
  if (!r.group.empty() && std::none_of(kAllGroupKinds.begin(), kAllGroupKinds.end(),
                                       [&](GroupKind g) { return to_string(g) == r.group; }))
    throw std::runtime_error("field 'group': \"" + r.group + "\" is not a process group (tp, attn_tp, moe_ep, ...)");
  r.handle = j.at("handle").is_null() ? -1 : impl::int_field(j, "handle");
  if (r.group.empty() != (r.handle < 0))
    throw std::runtime_error("fields 'group' and 'handle': both are null (a local step) or neither is");
  if (r.handle >= int(kAllGroupKinds.size()))
    throw std::runtime_error("field 'handle': " + std::to_string(r.handle) + " is not a communicator handle (one per group at most: [0, " +
                             std::to_string(kAllGroupKinds.size()) + "))");
  if (r.copies < 1) throw std::runtime_error("field 'copies': a row is held at least once, not 0 times");
  r.row_count = impl::int64_field(j, "row_count");
  r.pad_rows = impl::int64_field(j, "pad_rows");
  r.hidden = impl::int_field(j, "hidden");
  r.global_num_tokens = impl::counts_field(j, "global_num_tokens");
  if (j.contains("scaled_global_num_tokens")) r.scaled_global_num_tokens = impl::counts_field(j, "scaled_global_num_tokens");
  if (j.contains("error")) r.error = j.at("error").get<std::string>();
  const nlohmann::json& rows = j.at("rows");
  if (!rows.is_array()) throw std::runtime_error("rows must be an array");
  r.rows.reserve(rows.size());  // exactly: a large trace is mostly its rows
  for (const nlohmann::json& row : rows) {
    if (!row.is_array() || row.size() != 6) throw std::runtime_error("a row must be [request,position,step,sum,wsum,l2]");
    Row w{static_cast<int>(impl::nonneg_int(row[0], std::numeric_limits<int>::max(), "a row's request")),
                 static_cast<int>(impl::nonneg_int(row[1], std::numeric_limits<int>::max(), "a row's position")),
                 static_cast<int>(impl::nonneg_int(row[2], std::numeric_limits<int>::max(), "a row's step")), false, {}};
    // Three nulls: not recorded. Any other entry: recorded, and a null one was not finite.
    w.has_sum = !(row[3].is_null() && row[4].is_null() && row[5].is_null());
    const RowSum sum{impl::checksum_entry(row[3]), impl::checksum_entry(row[4]), impl::checksum_entry(row[5])};
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
// and the end line counting them, last. With partial_ok a trace cut short (no end line, or a last
// line cut inside) is returned with `stopped` set instead; every other fault still throws.
inline RankTrace read_rank_trace(std::istream& in, const std::string& file, int rank, int* world_size,
                                 std::string* program, std::string* run = nullptr, bool partial_ok = false) {
  RankTrace t{rank, file, {}, {}};
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
      const std::string why = at + "invalid JSON (truncated line?): " + e.what();
      // The last line, cut where its run stopped writing: a partial trace, when the caller reads one.
      if (partial_ok && n > 1 && in.peek() == std::char_traits<char>::eof()) {
        t.stopped = why;
        return t;
      }
      throw TraceInputError(why);
    }
    try {
      if (n == 1) {
        if (!j.is_object() || !j.contains("relayout_trace"))
          throw TraceInputError(at + "not a relayout trace (the first line must be the trace header)");
        impl::known_fields(j, {"relayout_trace", "rank", "world_size", "program", "run"}, "the header");
        const int version = impl::int_field(j, "relayout_trace");
        if (version != 1) throw TraceInputError(at + "trace format " + std::to_string(version) + ", this reader reads 1");
        const int header_rank = impl::int_field(j, "rank"), size = impl::int_field(j, "world_size");
        if (header_rank != rank) throw TraceInputError(at + "header says rank " + std::to_string(header_rank));
        if (size < 1 || rank >= size)
          throw TraceInputError(at + "world_size " + std::to_string(size) + " does not hold rank " + std::to_string(rank));
        if (world_size) *world_size = size;
        if (program) *program = j.value("program", "");
        if (run) *run = j.value("run", "");
      } else if (j.is_object() && j.contains("end")) {
        ended = true;
        impl::known_fields(j, {"end", "records"}, "the end line");
        if (j.at("end") != true) throw TraceInputError(at + "the end line must say \"end\":true");
        const std::int64_t k = impl::int64_field(j, "records");
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
  if (!ended) {
    const std::string why = file + ":" + std::to_string(n) + ": the trace ends without its end line (truncated?)";
    if (!partial_ok) throw TraceInputError(why);
    t.stopped = why;
  }
  return t;
}

namespace impl {

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

}  // namespace impl

// What a rank file must be (io::InputRule): a regular file of at most kMaxTraceFile bytes, read
// without following a link; a FIFO is refused, not waited on; a directory or a device is not a trace.
inline io::InputRule rank_file_rule() { return {"a rank file", "a regular file written by --trace", kMaxTraceFile}; }

inline RankTrace read_rank_trace(const std::string& file, int rank, int* world_size, std::string* program,
                                 std::string* run = nullptr, bool partial_ok = false) {
  std::optional<io::InputFile> buf;
  try {
    buf.emplace(file, rank_file_rule());
  } catch (const io::FileError& e) {
    if (e.code() == ENOENT) throw TraceInputError(file + ": cannot open (missing rank file?)");
    throw TraceInputError(e.what());
  }
  std::istream in(&*buf);
  RankTrace t = read_rank_trace(in, file, rank, world_size, program, run, partial_ok);
  try {
    buf->check();
  } catch (const io::FileError& e) {
    throw TraceInputError(e.what());
  }
  return t;
}

// All rank files of one run: rank0.jsonl names the world size, every rank below it must be there,
// and every file's header must name the same world size and program (no file of another run).
// partial_ok: as read_rank_trace's (files cut short come back with `stopped` set).
inline TraceRun read_trace(const std::string& dir, bool partial_ok = false) {
  namespace fs = std::filesystem;
  if (!impl::fs_checked(dir, [&] { return fs::is_directory(dir); }))
    throw TraceInputError(dir + ": not a trace directory (missing?)");
  TraceRun run;
  run.dir = dir;
  const std::string first = (fs::path(dir) / "rank0.jsonl").string();
  if (impl::fs_checked(first, [&] { return fs::symlink_status(first); }).type() == fs::file_type::not_found)
    throw TraceInputError(dir + ": no rank0.jsonl (not a trace directory?)");
  run.ranks.push_back(read_rank_trace(first, 0, &run.world_size, &run.program, &run.run, partial_ok));
  if (run.world_size < 1) throw TraceInputError(first + ":1: world_size must be >= 1");
  for (int r = 1; r < run.world_size; ++r) {
    const std::string file = (fs::path(dir) / ("rank" + std::to_string(r) + ".jsonl")).string();
    int size = 0;
    std::string program, id;
    run.ranks.push_back(read_rank_trace(file, r, &size, &program, &id, partial_ok));
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

}  // namespace relayout::trace
