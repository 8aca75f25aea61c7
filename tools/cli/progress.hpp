// The examples' trace sink: the --trace file (trace::JsonlSink) and, for a run predicted to take
// long, progress lines on stderr, both fed by the model's boundary records (a layer's output record
// marks the layer done), so the model needs no hook of its own. With progress on and no --trace the
// model still builds its records (row checksums: O(rows x hidden) per boundary, small next to the
// layer's work).
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

#include "relayout/trace/jsonl.hpp"

namespace relayout::cli {

// Estimated flops per rank above which a run reports progress (tens of seconds on one core).
inline constexpr double kProgressFlops = 2e10;

class RunSink {
 public:
  static constexpr bool enabled = true;
  trace::JsonlSink file;  // open with --trace

  bool active() const { return file.active() || total_ > 0; }
  void write(const trace::Record& r) {
    if (file.active()) file.write(r);
    if (total_ > 0 && r.state == "layer_out") report();
  }
  // Report each of `total` layer outputs on stderr (this rank: call it on rank 0 only).
  void show_progress(const std::string& what, long total) {
    what_ = what;
    total_ = total;
    start_ = std::chrono::steady_clock::now();
    std::fprintf(stderr, "%s: a long run (%ld layer forwards); progress follows\n", what_.c_str(), total_);
  }

 private:
  void report() {
    ++done_;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    std::fprintf(stderr, "%s: layer %ld/%ld done, %.1f s\n", what_.c_str(), done_, total_, s);
  }

  std::string what_;
  long total_ = 0, done_ = 0;
  std::chrono::steady_clock::time_point start_;
};

static_assert(trace::TraceSink<RunSink>);

}  // namespace relayout::cli
