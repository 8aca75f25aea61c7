// CollectiveRequest: a collective started by one of the *_start free functions (all_to_all_start,
// all_to_allv_start) and not yet known to be complete. test() polls it once (and lets the backend
// progress it); wait() returns when it is complete. Until then the buffers it was given must stay
// alive and untouched: a Kokkos::View is kept alive by the request itself, a plain range is the
// caller's to keep.
//
// The checks are the blocking collective's: the arguments are validated and the members agree on
// the call (agreement.hpp) when it starts, so a mismatch throws there on every member. The deadline
// (RELAYOUT_COLLECTIVE_TIMEOUT) covers wait(): a member that waits past it inside the collective is
// reported the way a blocking call's member is, and the job is aborted. Time spent between start
// and wait (the caller's own work) is not waiting and does not count.
//
// Members must start and finish collectives on one communicator in the same order, as MPI requires
// of nonblocking collectives; blocking collectives may be called in between (in the same order on
// every member). A backend without a nonblocking form runs the blocking call at start and returns
// a request that is already complete.
//
// Destroying a request that is still in flight waits for it first (a destructor cannot throw, so
// an error there is not reported): the backend must not write into memory that has been freed.
#pragma once

#include <memory>
#include <utility>

#include "relayout/comm/clock.hpp"

namespace relayout {

class CollectiveRequest {
 public:
  // What a backend keeps for one collective in flight.
  struct Pending {
    virtual ~Pending() = default;
    virtual bool test() = 0;  // one poll: true once complete
    virtual void wait() = 0;  // until complete (under the deadline); throws CommError on failure
  };

  CollectiveRequest() = default;  // complete
  explicit CollectiveRequest(std::unique_ptr<Pending> pending) : pending_(std::move(pending)) {}
  CollectiveRequest(CollectiveRequest&& o) noexcept
      : pending_(std::move(o.pending_)), keep_(std::move(o.keep_)) {}
  CollectiveRequest& operator=(CollectiveRequest&& o) noexcept {
    if (this != &o) {
      finish_quietly();
      pending_ = std::move(o.pending_);
      keep_ = std::move(o.keep_);
    }
    return *this;
  }
  CollectiveRequest(const CollectiveRequest&) = delete;
  CollectiveRequest& operator=(const CollectiveRequest&) = delete;
  ~CollectiveRequest() { finish_quietly(); }

  bool done() const { return !pending_; }
  // One poll; true when the collective is complete (its output may be read).
  bool test() {
    if (!pending_) return true;
    if (!pending_->test()) return false;
    release();
    return true;
  }
  // Returns when the collective is complete.
  void wait() {
    if (!pending_) return;
    {
      const impl::CollectiveTimer timer;  // collective_seconds() (clock.hpp)
      pending_->wait();
    }
    release();
  }

  // Memory the collective reads or writes, held until it completes (the free functions give it
  // their checked counts and copies of the Views they were passed).
  void keep(std::shared_ptr<const void> what) { keep_ = std::move(what); }

 private:
  void release() {
    pending_.reset();
    keep_.reset();
  }
  void finish_quietly() noexcept {
    if (pending_) {
      try {
        pending_->wait();
      } catch (...) {  // nothing can be reported from a destructor
      }
    }
    release();
  }

  std::unique_ptr<Pending> pending_;
  std::shared_ptr<const void> keep_;
};

}  // namespace relayout
