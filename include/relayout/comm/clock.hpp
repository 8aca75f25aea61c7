// The time this process has spent inside relayout's collectives: every blocking free collective
// (all_reduce, all_gather, ..., barrier; from after the caller's instance is fenced to the return)
// and every CollectiveRequest::wait(), waiting for the other members included. A profiling aid: the
// difference over a step tells how much of the step went to communication and to waiting for the
// slowest member, on this rank. Calls on a communicator's own members (MpiCommunicator::all_reduce,
// ...) bypass it, as do polls (CollectiveRequest::test()). Two clock reads per call.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace relayout {

namespace impl {

inline std::atomic<std::int64_t> collective_ns{0};

// Adds its lifetime to collective_ns.
class CollectiveTimer {
 public:
  CollectiveTimer() : start_(std::chrono::steady_clock::now()) {}
  CollectiveTimer(const CollectiveTimer&) = delete;
  CollectiveTimer& operator=(const CollectiveTimer&) = delete;
  ~CollectiveTimer() {
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_);
    collective_ns.fetch_add(ns.count(), std::memory_order_relaxed);
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace impl

// Seconds this process has spent inside relayout's collectives since it started (see above).
inline double collective_seconds() { return double(impl::collective_ns.load(std::memory_order_relaxed)) * 1e-9; }

}  // namespace relayout
