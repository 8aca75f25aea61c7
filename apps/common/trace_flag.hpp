// The examples' --trace DIR flag. Collective over the job: rank 0 takes DIR's lock (a live run
// writing there, inside it or around it is refused, naming it) and makes the run id every rank's
// header carries, then each rank opens its JSON Lines file. A directory that cannot be created, a lock
// or rank file that is a link or not a regular file, or a file that cannot be opened is a LayoutError
// naming --trace on every rank; a failed write ends the run at JsonlSink::close (exit 1).
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include "common/files_mpi.hpp"
#include "relayout/comm.hpp"
#include "relayout/mesh/error.hpp"
#include "relayout/trace/dir_lock.hpp"
#include "relayout/trace/jsonl.hpp"

namespace relayout::cli {

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

// Collective: every rank opens its file DIR/rank<R>.jsonl (a link or non-regular file there is
// refused, never written through); when any rank cannot, every rank throws LayoutError("--trace")
// with the lowest such rank's reason, so none is left waiting.
inline void open_trace(const MpiCommunicator& world, trace::JsonlSink& sink, const std::string& dir,
                       const std::string& program, const std::string& run_id) {
  std::string error;
  try {
    sink.open(dir, world.rank(), world.size(), program, run_id);
  } catch (const std::exception& e) {
    error = "--trace " + dir + ": cannot write the trace there (" + e.what() + ")";
  }
  error = agree_error(world, error);
  if (error.empty()) return;
  sink.abandon();  // no file of a run that did not start
  throw LayoutError("--trace", error);
}

}  // namespace relayout::cli
