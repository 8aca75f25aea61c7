// The examples' trace sink: the --trace file (trace::JsonlSink) and, for a run predicted to take
// long, progress lines on stderr, both fed by the model's boundary records (a layer's output record
// marks the layer done), so the model needs no hook of its own. With progress on and no --trace the
// model still builds its records (row checksums: O(rows x hidden) per boundary, small next to the
// layer's work).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>

#include "relayout/trace/jsonl.hpp"

namespace relayout::cli {

// A run reports progress when it is estimated at this many flops per rank (tens of seconds on one
// core), or has this many layer forwards (each has its collectives: a small model's 200 DSpark
// rounds took 40 s here, far below the flops).
inline constexpr double kProgressFlops = 2e10;
inline constexpr long kProgressForwards = 400;
inline bool long_run(double flops, long forwards) { return flops > kProgressFlops || forwards >= kProgressForwards; }

// Seconds without a progress line after which one says where the run is (one layer forward, or one
// step of it, can take minutes).
inline constexpr double kProgressQuietS = 10;

class RunSink {
 public:
  static constexpr bool enabled = true;
  trace::JsonlSink file;    // open with --trace
  std::FILE* out = stderr;  // where progress goes
  double quiet_s = kProgressQuietS;
  double every_s = 1;  // at most one "done" line per second, and the first and the last

  RunSink() = default;
  RunSink(const RunSink&) = delete;
  RunSink& operator=(const RunSink&) = delete;
  ~RunSink() {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    if (beat_.joinable()) beat_.join();
  }

  bool active() const { return file.active() || total_ > 0; }
  // Progress needs the boundaries only; the rows' checksums are for the trace file.
  bool wants_sums() const { return file.active(); }
  void write(const trace::Record& r) {
    if (file.active()) file.write(r);
    if (total_ > 0) report(r);
  }
  // Report the layer forwards done of `total` on stderr (at most every every_s seconds), with the
  // time left estimated from the rate so far, and a line every quiet_s seconds without one (this rank: call it on rank 0 only, once).
  // `flops`: the estimate that made the run long.
  void show_progress(const std::string& what, long total, double flops) {
    const std::lock_guard<std::mutex> lock(mutex_);
    what_ = what;
    total_ = total;
    start_ = last_ = std::chrono::steady_clock::now();
    std::fprintf(out, "%s: a long run (%ld layer forwards); progress follows, about %.3g GFLOP per rank\n",
                 what_.c_str(), total_, flops / 1e9);
    std::fflush(out);
    // A thread of its own, so a step that takes minutes still gets its lines; it makes no MPI call.
    beat_ = std::thread([this] { heartbeat(); });
  }

 private:
  using Clock = std::chrono::steady_clock;
  static double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

  void report(const trace::Record& r) {
    const std::lock_guard<std::mutex> lock(mutex_);
    boundary_ = r.boundary;
    if (r.state != "layer_out" || ++done_ > total_) return;
    if (done_ > 1 && done_ < total_ && since(last_) < every_s) return;
    const double s = since(start_);
    char left[64] = "";
    if (done_ < total_) std::snprintf(left, sizeof left, ", about %.0f s left", s / double(done_) * double(total_ - done_));
    std::fprintf(out, "%s: layer %ld/%ld done, %.1f s%s\n", what_.c_str(), done_, total_, s, left);
    std::fflush(out);
    last_ = Clock::now();
  }

  void heartbeat() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      wake_.wait_for(lock, std::chrono::duration<double>(quiet_s));
      if (stop_ || done_ >= total_ || since(last_) < quiet_s) continue;
      std::fprintf(out, "%s: in layer %ld/%ld (%s), %.1f s\n", what_.c_str(), done_ + 1, total_,
                   boundary_.empty() ? "before its first boundary" : ("after boundary " + boundary_).c_str(),
                   since(start_));
      std::fflush(out);
      last_ = Clock::now();
    }
  }

  std::string what_, boundary_;
  long total_ = 0, done_ = 0;
  Clock::time_point start_, last_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread beat_;
};

static_assert(trace::TraceSink<RunSink>);

}  // namespace relayout::cli
