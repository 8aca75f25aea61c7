// The watch over blocking MPI calls: with the deadline on and the agreement check off (a default
// launch of a Release build), collectives stay the blocking MPI calls, and one thread per process
// ends the job when a call outlives the deadline. The calling thread only publishes a pointer to
// the call (no clock, lock, string or MPI call); the watch thread times it, builds the report and
// calls MPI_Abort (exit code kWatchdogExitCode), which MPICH accepts from any thread. It also
// watches the calls MPI has no nonblocking form of (MPI_Comm_split), whatever the check. One
// calling thread (MPI's collectives are not called concurrently on one process here).
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "relayout/comm/agreement.hpp"
#include "relayout/comm/impl/mpi_agreement.hpp"

namespace relayout::impl {

// One blocking call in flight: this record and its pointers stay valid until the call returns.
struct WatchedCall {
  const CollectiveCall* call = nullptr;
  std::uint64_t seq = 0;        // 0: not recorded (a direct MpiCommunicator call)
  const char* mpi_call = "";    // as written, e.g. "MPI_Allreduce(in.data(), ...)": named up to '('
  MPI_Comm comm = MPI_COMM_NULL;
  const std::string* name = nullptr;
  int rank = 0, size = 1;
  bool arrived = false;         // a call MPI has no nonblocking form of, after its arrival check
};

inline std::string watched_report(const WatchedCall& w, double timeout_s) {
  const std::string_view text(w.mpi_call);
  GroupText g;
  g.name = w.name && !w.name->empty() ? *w.name : "unnamed";
  char mpi_name[MPI_MAX_OBJECT_NAME] = {};
  int len = 0;  // a local query; the job ends right after
  if ((!w.name || w.name->empty()) && MPI_Comm_get_name(w.comm, mpi_name, &len) == MPI_SUCCESS && len > 0)
    g.name.assign(mpi_name, static_cast<std::size_t>(len));
  return "relayout watchdog: member " + std::to_string(w.rank) + " of " + g.header(static_cast<std::size_t>(w.size)) +
         " waited " + seconds_text(timeout_s) + " s (RELAYOUT_COLLECTIVE_TIMEOUT) inside " +
         std::string(text.substr(0, text.find('('))) + " at " +
         (w.call && w.seq ? describe(make_signature(*w.call, w.seq)) : std::string("a direct MpiCommunicator call (call site unknown)")) +
         (w.arrived ? "; every member had arrived at the call (MPI has no nonblocking form of it: which member is "
                      "holding it up is not known)"
                    : "; which member is holding it up is not known (RELAYOUT_CHECK_COLLECTIVES=1 makes the "
                      "watchdog name it)") +
         ". Aborting the job.";
}

class CallWatch {
 public:
  // The process's watch; its thread starts at the first call watched and lives with the process.
  static CallWatch& process() {
    static CallWatch* const watch = new CallWatch;  // never destroyed: the thread may outlive main
    return *watch;
  }

  // Records `w` (which must stay valid until leave()) as in flight, with a deadline of `timeout_s`.
  // A few plain stores: the watch thread measures the time itself.
  void enter(const WatchedCall& w, double timeout_s) {
    if (!started_.load(std::memory_order_relaxed)) start();
    call_.store(&w, std::memory_order_relaxed);
    timeout_s_.store(timeout_s, std::memory_order_relaxed);
    calls_ += 2;
    state_.store(calls_ + 1, std::memory_order_release);  // odd: in flight
  }
  void leave() { state_.store(calls_, std::memory_order_release); }

 private:
  CallWatch() = default;

  void start() {
    const std::lock_guard<std::mutex> lock(start_mutex_);
    if (started_.load(std::memory_order_relaxed)) return;
    std::thread([this] { run(); }).detach();
    started_.store(true, std::memory_order_relaxed);
  }
  // Samples every 50 ms; a call seen in flight since then for the deadline ends the job. The report
  // is built from the caller's records and dropped if the call returned meanwhile.
  [[noreturn]] void run() {
    std::uint64_t seen = 0;
    auto since = std::chrono::steady_clock::now();
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      const std::uint64_t now_state = state_.load(std::memory_order_acquire);
      const auto now = std::chrono::steady_clock::now();
      if (now_state != seen) {
        seen = now_state;
        since = now;
        continue;
      }
      const double timeout_s = timeout_s_.load(std::memory_order_relaxed);
      if (seen % 2 == 0 || std::chrono::duration<double>(now - since).count() < timeout_s) continue;
      const std::string report = watched_report(*call_.load(std::memory_order_relaxed), timeout_s);
      if (state_.load(std::memory_order_acquire) == seen) abort_job(report, kWatchdogExitCode);
    }
  }

  std::atomic<bool> started_{false};
  std::mutex start_mutex_;
  std::atomic<std::uint64_t> state_{0};  // odd: a call in flight; changes with every call
  std::uint64_t calls_ = 0;              // the calling thread's own count
  std::atomic<const WatchedCall*> call_{nullptr};
  std::atomic<double> timeout_s_{0};
};

// Watches one blocking call for its lifetime (no deadline: nothing is watched).
class WatchScope {
 public:
  WatchScope(const WatchedCall& w, double timeout_s) : call_(w), on_(timeout_s > 0) {
    if (on_) CallWatch::process().enter(call_, timeout_s);
  }
  WatchScope(const WatchScope&) = delete;
  WatchScope& operator=(const WatchScope&) = delete;
  ~WatchScope() {
    if (on_) CallWatch::process().leave();
  }

 private:
  WatchedCall call_;
  bool on_;
};

}  // namespace relayout::impl
