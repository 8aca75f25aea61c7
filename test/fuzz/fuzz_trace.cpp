// libFuzzer target: arbitrary bytes as one rank's row-ownership trace file (rank<R>.jsonl, written
// by trace::JsonlSink) through the reader of `relayout trace diff` (trace::read_rank_trace). Beyond
// "no crash, no sanitizer report", the reader must
//  - return a trace or throw TraceInputError "FILE:LINE: why" naming the first bad line ("FILE: empty
//    file" when there is no line); no other exception leaves it;
//  - accept exactly the well-formed traces, judged here independently of the reader (the format of
//    jsonl.hpp): line 1 the header of this rank, then one record per line with every field of its
//    type (integers exact, non-negative and in range; no float, bool or string for them), no field
//    the format does not name, a known state and group, a record consistent with itself (row_count
//    = rows + pad_rows, checksums on all rows or none), then the end line, last, counting the
//    records — so a truncated or partial file is never accepted;
//  - give back exactly what the lines say (every field of every record compared);
//  - reject the same text read as another rank's file, without its end line, or cut inside a line;
//  - read back what JsonlSink writes of the trace it accepted (header_line, to_jsonl, end_line) as
//    the same trace, also when the checksums are NaN or infinite (such a row must not come back as
//    "not recorded", which the diff would skip);
// and `trace diff` of an accepted trace against itself must end in 0 (agree) or 1 (diverge).
// Violations trap (__builtin_trap) so libFuzzer keeps the input.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/trace_diff.hpp"
#include "relayout/trace/jsonl.hpp"
#include "relayout/trace/jsonl_reader.hpp"

using namespace relayout;
using nlohmann::json;

namespace {

const std::string kFile = "rank.jsonl";

[[noreturn]] void fail() { __builtin_trap(); }
void require(bool ok) {
  if (!ok) fail();
}

// The lines std::getline yields: a last '\n' ends the last line, it does not start an empty one.
std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::size_t start = 0;
  while (start < text.size()) {
    const std::size_t nl = text.find('\n', start);
    if (nl == std::string::npos) {
      lines.push_back(text.substr(start));
      break;
    }
    lines.push_back(text.substr(start, nl - start));
    start = nl + 1;
  }
  return lines;
}

// A non-negative JSON integer no larger than max.
std::optional<std::int64_t> count(const json& v, std::int64_t max) {
  if (v.is_number_unsigned()) {
    const std::uint64_t u = v.get<std::uint64_t>();
    if (u <= static_cast<std::uint64_t>(max)) return static_cast<std::int64_t>(u);
  } else if (v.is_number_integer()) {
    const std::int64_t s = v.get<std::int64_t>();
    if (s >= 0 && s <= max) return s;
  }
  return std::nullopt;
}
constexpr std::int64_t kInt = std::numeric_limits<int>::max();
constexpr std::int64_t kInt64 = std::numeric_limits<std::int64_t>::max();

std::optional<int> int_field(const json& j, const char* key) {
  if (!j.contains(key)) return std::nullopt;
  const auto v = count(j.at(key), kInt);
  if (!v) return std::nullopt;
  return static_cast<int>(*v);
}
std::optional<std::string> string_field(const json& j, const char* key) {
  if (!j.contains(key) || !j.at(key).is_string()) return std::nullopt;
  return j.at(key).get<std::string>();
}
std::optional<std::vector<std::int64_t>> counts_field(const json& j, const char* key) {
  if (!j.contains(key) || !j.at(key).is_array()) return std::nullopt;
  std::vector<std::int64_t> out;
  for (const json& e : j.at(key)) {
    const auto v = count(e, kInt64);
    if (!v) return std::nullopt;
    out.push_back(*v);
  }
  return out;
}
// A checksum entry: a number, "nan", "inf", "-inf", or null (not finite, as older files wrote it).
std::optional<double> checksum(const json& v) {
  if (v.is_null()) return std::nan("");
  if (v.is_number()) return v.get<double>();
  if (v.is_string()) {
    const auto& s = v.get_ref<const std::string&>();
    if (s == "nan") return std::nan("");
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
  }
  return std::nullopt;
}

// Only the fields the format names (jsonl.hpp), nothing else.
bool only_fields(const json& j, const std::vector<std::string>& known) {
  for (const auto& item : j.items())
    if (std::find(known.begin(), known.end(), item.key()) == known.end()) return false;
  return true;
}

// The record a well-formed line holds, or nullopt if the line is not one.
std::optional<trace::Record> expected_record(const json& j, int rank) {
  if (!j.is_object()) return std::nullopt;
  if (!only_fields(j, {"layer", "boundary", "state", "sharing", "copies", "global_rank", "attn_dp_rank", "attn_tp_rank",
                       "moe_ep_rank", "group", "handle", "row_count", "pad_rows", "hidden", "global_num_tokens",
                       "scaled_global_num_tokens", "error", "rows"}))
    return std::nullopt;
  trace::Record r;
  const auto layer = int_field(j, "layer"), copies = int_field(j, "copies"), grank = int_field(j, "global_rank"),
             dp = int_field(j, "attn_dp_rank"), tp = int_field(j, "attn_tp_rank"), ep = int_field(j, "moe_ep_rank"),
             hidden = int_field(j, "hidden");
  const auto boundary = string_field(j, "boundary"), state = string_field(j, "state"),
             sharing = string_field(j, "sharing");
  if (!layer || !copies || !grank || !dp || !tp || !ep || !hidden || !boundary || !state || !sharing) return std::nullopt;
  if (*sharing != "partial" && *sharing != "replicated") return std::nullopt;
  const std::vector<std::string> states{"attn_out", "moe_in", "moe_partial", "moe_out", "dispatched", "layer_out"};
  if (std::find(states.begin(), states.end(), *state) == states.end()) return std::nullopt;
  if (*copies < 1) return std::nullopt;
  if (*grank != rank) return std::nullopt;  // a record of another rank's file
  r.layer = *layer;
  r.copies = *copies;
  r.global_rank = *grank;
  r.attn_dp_rank = *dp;
  r.attn_tp_rank = *tp;
  r.moe_ep_rank = *ep;
  r.hidden = *hidden;
  r.boundary = *boundary;
  r.state = *state;
  r.sharing = *sharing == "partial" ? RowState::partial : RowState::replicated;
  if (!j.contains("group") || !j.contains("handle")) return std::nullopt;
  if (!j.at("group").is_null()) {
    if (!j.at("group").is_string()) return std::nullopt;
    r.group = j.at("group").get<std::string>();
  }
  if (!j.at("handle").is_null()) {
    const auto h = count(j.at("handle"), 5);  // one communicator per process group at most
    if (!h) return std::nullopt;
    r.handle = static_cast<int>(*h);
  }
  const std::vector<std::string> groups{"tp", "attn_tp", "attn_cp", "moe_tp", "moe_ep", "moe_dp"};
  if (!r.group.empty() && std::find(groups.begin(), groups.end(), r.group) == groups.end()) return std::nullopt;
  if (r.group.empty() != (r.handle < 0)) return std::nullopt;  // a collective's group and handle, or neither
  if (!j.contains("row_count") || !j.contains("pad_rows")) return std::nullopt;
  const auto rows = count(j.at("row_count"), kInt64), pad = count(j.at("pad_rows"), kInt64);
  const auto gnt = counts_field(j, "global_num_tokens");
  if (!rows || !pad || !gnt) return std::nullopt;
  r.row_count = *rows;
  r.pad_rows = *pad;
  r.global_num_tokens = *gnt;
  if (j.contains("scaled_global_num_tokens")) {
    const auto s = counts_field(j, "scaled_global_num_tokens");
    if (!s) return std::nullopt;
    r.scaled_global_num_tokens = *s;
  }
  if (j.contains("error")) {
    const auto e = string_field(j, "error");
    if (!e) return std::nullopt;
    r.error = *e;
  }
  if (!j.contains("rows") || !j.at("rows").is_array()) return std::nullopt;
  for (const json& row : j.at("rows")) {
    if (!row.is_array() || row.size() != 6) return std::nullopt;
    const auto req = count(row[0], kInt), pos = count(row[1], kInt), step = count(row[2], kInt);
    const auto s = checksum(row[3]), w = checksum(row[4]), l2 = checksum(row[5]);
    if (!req || !pos || !step || !s || !w || !l2) return std::nullopt;
    trace::Row x{static_cast<int>(*req), static_cast<int>(*pos), static_cast<int>(*step), false, {}};
    // All three null: not recorded. Otherwise recorded; a null entry was not finite.
    x.has_sum = !(row[3].is_null() && row[4].is_null() && row[5].is_null());
    if (x.has_sum) x.sum = {*s, *w, *l2};
    if (!r.rows.empty() && x.has_sum != r.rows.front().has_sum) return std::nullopt;  // all or none recorded
    r.rows.push_back(x);
  }
  if (r.hidden == 0 && !r.rows.empty() && r.rows.front().has_sum) return std::nullopt;
  if (r.pad_rows > r.row_count || static_cast<std::uint64_t>(r.row_count - r.pad_rows) != r.rows.size()) return std::nullopt;
  return r;
}

struct Expected {
  std::size_t bad_line = 0;  // 0: accepted; else the first line the reader must name (1-based)
  bool empty = false;        // no line at all
  int world_size = 0;
  std::string program;
  std::vector<trace::Record> records;
};

// The reader's contract, written independently of it.
Expected judge(const std::vector<std::string>& lines, int rank) {
  Expected e;
  if (lines.empty()) {
    e.empty = true;
    return e;
  }
  bool ended = false;
  for (std::size_t n = 1; n <= lines.size(); ++n) {
    const auto bad = [&] {
      e.bad_line = n;
      return e;
    };
    if (ended) return bad();
    const json j = json::parse(lines[n - 1], nullptr, false);
    if (j.is_discarded()) return bad();
    if (n == 1) {
      if (!j.is_object() || !j.contains("relayout_trace")) return bad();
      if (!only_fields(j, {"relayout_trace", "rank", "world_size", "program", "run"})) return bad();
      if (j.contains("run") && !j.at("run").is_string()) return bad();
      const auto version = count(j.at("relayout_trace"), kInt);
      const auto r = int_field(j, "rank"), w = int_field(j, "world_size");
      if (!version || *version != 1 || !r || !w || *r != rank || *w < 1 || *r >= *w) return bad();
      e.world_size = *w;
      if (j.contains("program")) {
        if (!j.at("program").is_string()) return bad();
        e.program = j.at("program").get<std::string>();
      }
    } else if (j.is_object() && j.contains("end")) {
      if (!only_fields(j, {"end", "records"})) return bad();
      const auto k = j.contains("records") ? count(j.at("records"), kInt64) : std::nullopt;
      if (j.at("end") != true || !k || static_cast<std::size_t>(*k) != e.records.size()) return bad();
      ended = true;
    } else {
      auto r = expected_record(j, rank);
      if (!r) return bad();
      e.records.push_back(std::move(*r));
    }
  }
  if (!ended) e.bad_line = lines.size();
  return e;
}

bool same(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) || (a == b && std::signbit(a) == std::signbit(b));
}
bool same(const trace::Record& a, const trace::Record& b) {
  if (a.layer != b.layer || a.boundary != b.boundary || a.state != b.state || a.sharing != b.sharing ||
      a.copies != b.copies || a.global_rank != b.global_rank || a.attn_dp_rank != b.attn_dp_rank ||
      a.attn_tp_rank != b.attn_tp_rank || a.moe_ep_rank != b.moe_ep_rank || a.group != b.group ||
      a.handle != b.handle || a.row_count != b.row_count || a.pad_rows != b.pad_rows || a.hidden != b.hidden ||
      a.global_num_tokens != b.global_num_tokens || a.scaled_global_num_tokens != b.scaled_global_num_tokens ||
      a.error != b.error || a.rows.size() != b.rows.size())
    return false;
  for (std::size_t i = 0; i < a.rows.size(); ++i) {
    const trace::Row &x = a.rows[i], &y = b.rows[i];
    if (x.request != y.request || x.position != y.position || x.step != y.step || x.has_sum != y.has_sum) return false;
    if (x.has_sum && !(same(x.sum.sum, y.sum.sum) && same(x.sum.wsum, y.sum.wsum) && same(x.sum.l2, y.sum.l2)))
      return false;
  }
  return true;
}

struct Read {
  std::optional<trace::RankTrace> trace;
  std::string error;
  int world_size = -1;
  std::string program = "unset";
};
Read read(const std::string& text, int rank) {
  Read r;
  std::istringstream in(text);
  try {
    r.trace = trace::read_rank_trace(in, kFile, rank, &r.world_size, &r.program);
  } catch (const trace::TraceInputError& e) {
    r.error = e.what();
  } catch (...) {
    fail();  // anything else escaping the reader is a bug
  }
  return r;
}

// "FILE:LINE: why" naming the expected line, or "FILE: empty file".
void check_rejection(const Read& r, const Expected& e) {
  require(!r.trace);
  if (e.empty) {
    require(r.error == kFile + ": empty file");
    return;
  }
  const std::string head = kFile + ":" + std::to_string(e.bad_line) + ": ";
  require(r.error.size() > head.size() && r.error.compare(0, head.size(), head) == 0);
}

std::string write(const std::vector<trace::Record>& records, int rank, int world_size, const std::string& program) {
  std::string s = trace::header_line(rank, world_size, program) + "\n";
  for (const trace::Record& r : records) s += trace::to_jsonl(r) + "\n";
  return s + trace::end_line(static_cast<std::int64_t>(records.size())) + "\n";
}

void check_round_trip(const std::vector<trace::Record>& records, int rank, int world_size, const std::string& program) {
  const Read back = read(write(records, rank, world_size, program), rank);
  require(back.trace.has_value());
  require(back.world_size == world_size && back.program == program);
  require(back.trace->records.size() == records.size());
  for (std::size_t i = 0; i < records.size(); ++i) require(same(back.trace->records[i], records[i]));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const std::vector<std::string> lines = split_lines(text);
  // Read the file as the rank its header names (when that is a small integer), else as rank 0.
  int rank = 0;
  if (!lines.empty()) {
    const json h = json::parse(lines[0], nullptr, false);
    if (h.is_object() && h.contains("rank"))
      if (const auto r = count(h.at("rank"), 1 << 20)) rank = static_cast<int>(*r);
  }
  const Expected want = judge(lines, rank);
  const Read got = read(text, rank);
  if (want.empty || want.bad_line != 0) {
    check_rejection(got, want);
    return 0;
  }
  // Accepted: exactly what the lines say.
  require(got.trace.has_value());
  const trace::RankTrace& t = *got.trace;
  require(t.rank == rank && t.file == kFile);
  require(got.world_size == want.world_size && got.program == want.program);
  require(t.records.size() == want.records.size() && t.records.size() + 2 == lines.size());
  for (std::size_t i = 0; i < t.records.size(); ++i) require(same(t.records[i], want.records[i]));

  // The same text as another rank's file, without its end line, with the end line cut, or with
  // the line before the end line (a record, or the header) cut short: every cut before a line's
  // closing brace leaves invalid JSON, even when the end line follows with the right count.
  require(!read(text, rank + 1).trace);
  std::size_t end = text.size();
  if (text.back() == '\n') --end;
  const std::size_t end_start = text.rfind('\n', end - 1) + 1;  // at least the header precedes it
  const std::string end_text = text.substr(end_start);
  require(!read(text.substr(0, end_start), rank).trace);
  require(!read(text.substr(0, text.rfind('}')), rank).trace);
  const std::size_t prev_start = end_start >= 2 ? text.rfind('\n', end_start - 2) : std::string::npos;
  const std::size_t line_start = prev_start == std::string::npos ? 0 : prev_start + 1;
  const std::size_t brace = text.rfind('}', end_start - 1);
  if (brace != std::string::npos && brace >= line_start) {
    const std::size_t mid = line_start + (brace - line_start) / 2;
    require(!read(text.substr(0, mid) + "\n" + end_text, rank).trace);
  }

  // Written back by the sink and read again: the same trace; also with non-finite checksums.
  check_round_trip(t.records, rank, got.world_size, got.program);
  std::vector<trace::Record> odd = t.records;
  const double nan = std::nan(""), inf = std::numeric_limits<double>::infinity();
  const trace::RowSum odd_sums[] = {{nan, nan, nan}, {inf, -inf, inf}, {nan, 1.0, 2.0}, {1.0, -inf, nan}};
  std::size_t k = size;
  for (trace::Record& r : odd)
    for (trace::Row& w : r.rows)
      if (w.has_sum) w.sum = odd_sums[k++ % 4];
  check_round_trip(odd, rank, got.world_size, got.program);

  // The diff of the trace against itself runs through: agree (0) or diverge (1, a trace whose rows
  // break its own counts, or NaN checksums), and says so.
  trace::TraceRun run;
  run.dir = "run";
  run.world_size = got.world_size;
  run.program = got.program;
  run.ranks.push_back(t);
  try {
    cli::check_run(run, trace::Tolerance{}, true);  // consistent with itself, or TraceInputError
  } catch (const trace::TraceInputError&) {
  }
  std::ostringstream out;
  const int rc = cli::trace_diff(run, run, cli::DiffOptions{}, out);
  require((rc == 0 || rc == 1) && !out.str().empty());
  return 0;
}
