// The examples' --trace DIR flag. Collective over the job: rank 0 takes DIR's lock (a live run
// writing there, inside it or around it is refused, naming it) and makes the run id every rank's
// header carries, then each rank opens its JSON Lines file. A directory that cannot be created or a file that cannot be
// opened is a LayoutError naming --trace; a failed write ends the run at JsonlSink::close (exit 1).
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include "relayout/comm.hpp"
#include "relayout/mesh/error.hpp"
#include "relayout/trace/dir_lock.hpp"
#include "relayout/trace/jsonl.hpp"

namespace relayout::cli {

// Rank 0's text on every rank (a length, then the characters as int32).
inline std::string broadcast_text(const MpiCommunicator& world, const std::string& text) {
  std::int64_t n = static_cast<std::int64_t>(text.size());
  broadcast(world, std::span<std::int64_t>(&n, 1), 0);
  std::vector<std::int32_t> chars(text.begin(), text.end());
  chars.resize(static_cast<std::size_t>(n));
  if (n > 0) broadcast(world, std::span<std::int32_t>(chars), 0);
  return std::string(chars.begin(), chars.end());
}

// DIR's lock (trace::DirLock), taken by rank 0 while the run writes DIR: refused while a live run
// writes DIR, a directory inside it or one around it, naming that run.
class TraceDirLock {
 public:
  const std::string& run_id() const { return run_id_; }

  // Collective. Throws LayoutError("--trace", ...) on every rank when rank 0 cannot create DIR or
  // a live run holds DIR's lock or one of a directory inside or around it.
  void acquire(const MpiCommunicator& world, const std::string& dir) {
    std::string error, id;
    if (world.rank() == 0) {
      id = make_run_id();
      try {
        error = lock_.acquire(dir, id);
      } catch (const std::exception& e) {
        error = std::string("cannot write the trace there (") + e.what() + ")";
      }
      if (!error.empty()) error = "--trace " + dir + ": " + error;
    }
    error = broadcast_text(world, error);
    run_id_ = broadcast_text(world, id);
    if (!error.empty()) throw LayoutError("--trace", error);
  }

 private:
  static std::string make_run_id() {
    char host[64] = "host";
    ::gethostname(host, sizeof host - 1);
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
    char b[160];
    std::snprintf(b, sizeof b, "%s-%ld-%llx", host, static_cast<long>(::getpid()), static_cast<unsigned long long>(ns));
    return b;
  }

  trace::DirLock lock_;
  std::string run_id_;
};

inline void open_trace(trace::JsonlSink& sink, const std::string& dir, int rank, int world_size,
                       const std::string& program, const std::string& run_id) {
  try {
    sink.open(dir, rank, world_size, program, run_id);
  } catch (const std::exception& e) {
    throw LayoutError("--trace", "--trace " + dir + ": cannot write the trace there (" + e.what() + ")");
  }
}

}  // namespace relayout::cli
