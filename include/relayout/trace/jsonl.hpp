// JsonlSink: one JSON Lines file per rank (DIR/rank<R>.jsonl) of trace records, written without a
// JSON library so the core stays dependency-free. Format (read back by `relayout trace diff`):
//   line 1: {"relayout_trace":1,"rank":R,"world_size":N,"program":"...","run":"..."} ("run": the id
//   every rank of one run shares, so files of two runs are told apart; absent when not given)
//   then one record per line (fields of trace::Record; "rows": [[request,position,step,sum,wsum,l2],...],
//   the three checksum entries null where not recorded, "nan"/"inf"/"-inf" where not finite),
//   last line: {"end":true,"records":K} — a file without it was cut short (every record is flushed
//   as it is written, so a killed run leaves the records it finished).
// The reader (jsonl_reader.hpp, fuzzed by test/fuzz/fuzz_trace.cpp) takes nothing else: every
// integer field exact and non-negative, every record of the file's rank, one header and one end line.
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "relayout/io/files.hpp"
#include "relayout/trace/record.hpp"

namespace relayout::trace {

inline std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          out += b;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// Text that reads back to the same double. JSON has no NaN or inf: those are the strings "nan",
// "inf", "-inf" (not null, which in a row would read as "no checksum recorded").
inline std::string json_number(double x) {
  if (std::isnan(x)) return "\"nan\"";
  if (std::isinf(x)) return x > 0 ? "\"inf\"" : "\"-inf\"";
  char b[32];
  std::snprintf(b, sizeof b, "%.17g", x);
  return b;
}

template <class T>
std::string json_array(const std::vector<T>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
  s += ']';
  return s;
}

inline std::string to_jsonl(const Record& r) {
  std::string s = "{\"layer\":" + std::to_string(r.layer) + ",\"boundary\":" + json_string(r.boundary) +
                  ",\"state\":" + json_string(r.state) + ",\"sharing\":\"" + sharing_name(r.sharing) +
                  "\",\"copies\":" + std::to_string(r.copies) + ",\"global_rank\":" + std::to_string(r.global_rank) +
                  ",\"attn_dp_rank\":" + std::to_string(r.attn_dp_rank) + ",\"attn_tp_rank\":" +
                  std::to_string(r.attn_tp_rank) +
                  // written only under CP, so traces without CP keep their format
                  (r.attn_cp_rank > 0 ? ",\"attn_cp_rank\":" + std::to_string(r.attn_cp_rank) : std::string()) +
                  ",\"moe_ep_rank\":" + std::to_string(r.moe_ep_rank) +
                  ",\"group\":" + (r.group.empty() ? "null" : json_string(r.group)) +
                  ",\"handle\":" + (r.handle < 0 ? "null" : std::to_string(r.handle)) +
                  ",\"row_count\":" + std::to_string(r.row_count) + ",\"pad_rows\":" + std::to_string(r.pad_rows) +
                  ",\"hidden\":" + std::to_string(r.hidden) + ",\"global_num_tokens\":" + json_array(r.global_num_tokens);
  if (!r.scaled_global_num_tokens.empty())
    s += ",\"scaled_global_num_tokens\":" + json_array(r.scaled_global_num_tokens);
  if (!r.error.empty()) s += ",\"error\":" + json_string(r.error);
  s += ",\"rows\":[";
  for (std::size_t i = 0; i < r.rows.size(); ++i) {
    const Row& w = r.rows[i];
    s += (i ? ",[" : "[") + std::to_string(w.request) + "," + std::to_string(w.position) + "," + std::to_string(w.step);
    if (w.has_sum)
      s += "," + json_number(w.sum.sum) + "," + json_number(w.sum.wsum) + "," + json_number(w.sum.l2) + "]";
    else
      s += ",null,null,null]";
  }
  return s + "]}";
}

// The first and the last line of a rank's file.
inline std::string header_line(int rank, int world_size, const std::string& program, const std::string& run = "") {
  return "{\"relayout_trace\":1,\"rank\":" + std::to_string(rank) + ",\"world_size\":" + std::to_string(world_size) +
         ",\"program\":" + json_string(program) + (run.empty() ? "" : ",\"run\":" + json_string(run)) + "}";
}
inline std::string end_line(std::int64_t records) {
  return "{\"end\":true,\"records\":" + std::to_string(records) + "}";
}

inline std::string trace_file(const std::string& dir, int rank) {
  return (std::filesystem::path(dir) / ("rank" + std::to_string(rank) + ".jsonl")).string();
}

class JsonlSink {
 public:
  static constexpr bool enabled = true;

  JsonlSink() = default;
  JsonlSink(const std::string& dir, int rank, int world_size, const std::string& program = "",
            const std::string& run = "") {
    open(dir, rank, world_size, program, run);
  }
  JsonlSink(const JsonlSink&) = delete;
  JsonlSink& operator=(const JsonlSink&) = delete;
  ~JsonlSink() {
    try {
      close();
    } catch (const std::exception&) {  // a destructor cannot report it; call close() to see it
    }
  }

  // Creates DIR if needed and this rank's file as a new file (io::create_new: an existing link or
  // non-regular file there is refused, never written through). `run` goes into the header. Throws
  // std::runtime_error naming the file.
  void open(const std::string& dir, int rank, int world_size, const std::string& program = "",
            const std::string& run = "") {
    close();
    std::filesystem::create_directories(dir);
    path_ = trace_file(dir, rank);
    error_.clear();
    try {
      fd_ = io::create_new(path_);
    } catch (const io::FileError& e) {
      throw std::runtime_error(std::string("trace: ") + e.what());
    }
    put(header_line(rank, world_size, program, run) + "\n");
    records_ = 0;
  }
  bool active() const { return fd_.get() >= 0; }
  // A failed write is kept and reported by close(): the run goes on, its trace is known incomplete.
  // Each record is one write(2), so a run that is killed or aborted leaves every record it
  // finished, and trace diff can name the last boundary each rank reached.
  void write(const Record& r) {
    if (!active()) return;
    put(to_jsonl(r) + "\n");
    ++records_;
  }
  // Writes the end line; only a closed file is complete. Throws std::runtime_error naming the file
  // when any write or the close failed (a full disk, /dev/full).
  void close() {
    if (!active()) return;
    put(end_line(records_) + "\n");
    if (::close(fd_.release()) != 0 && error_.empty()) error_ = std::strerror(errno);
    if (!error_.empty()) throw std::runtime_error("trace: cannot write " + path_ + " (" + error_ + "); the trace is incomplete");
  }
  // Closes without the end line and removes the file: for a run refused before it began.
  void abandon() {
    if (!active()) return;
    fd_.reset();
    ::unlink(path_.c_str());
  }
  const std::string& path() const { return path_; }

 private:
  // One write of `line`; after the first failure nothing more is written (the file is incomplete).
  void put(const std::string& line) {
    if (!error_.empty()) return;
    try {
      io::write_all(fd_.get(), line, path_);
    } catch (const io::FileError& e) {
      error_ = std::strerror(e.code());
    }
  }

  io::Fd fd_;
  std::string path_;
  std::string error_;  // the first write error
  std::int64_t records_ = 0;
};

static_assert(TraceSink<JsonlSink>);

}  // namespace relayout::trace
