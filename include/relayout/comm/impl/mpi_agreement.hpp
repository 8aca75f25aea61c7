// The MPI exchange behind the collective agreement check (agreement.hpp). Each member sends its
// Signature to every other member over a private duplicate of the communicator and receives
// theirs, with nonblocking point-to-point calls; so it knows, at any moment, which members have
// arrived at the call. With a deadline, a member that waits past it prints which members are
// missing and aborts the job (MPI_Abort): a hang becomes a message.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <cstdio>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "relayout/comm/agreement.hpp"
#include "relayout/comm/impl/mpi_types.hpp"

namespace relayout::impl {

// The exit code of a job the watchdog ends.
inline constexpr int kWatchdogExitCode = 3;

[[noreturn]] inline void abort_job(const std::string& message, int code) {
  std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
  // The launcher forwards stderr through a pipe it stops reading once the abort reaches it: give it
  // a moment to pass the message on first, or the job can end without saying why.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  MPI_Abort(MPI_COMM_WORLD, code);
  std::abort();  // MPI_Abort does not return; this keeps the promise if it ever did
}

// No deadline: wait as long as it takes.
inline constexpr double kForever = std::numeric_limits<double>::infinity();

// RELAYOUT_COLLECTIVE_TIMEOUT's convention (0: no deadline) as a wait limit.
inline double collective_deadline(double timeout_s) { return timeout_s > 0 ? timeout_s : kForever; }

// How long a member whose deadline passed waits before it aborts the job: inside a collective it
// asks the others meanwhile. A member that started waiting earlier (e.g. for a member that stopped,
// while this one waits for that member in its next collective) then reaches its abort first, and
// the message that ends the job names the member at the root of the wait, not one held up by it.
inline double inquiry_window(double timeout_s) { return std::clamp(timeout_s / 4, 0.5, 2.0); }

// Waits until every request completes, or `limit_s` seconds pass (kForever: no limit; 0: test once).
// Returns false on expiry; done[i] then says which requests completed.
// Polls (yielding the core between tests, which oversubscribed ranks need more than a busy wait)
// rather than blocking in MPI_Waitall, with or without a limit.
inline bool wait_with_deadline(std::vector<MPI_Request>& reqs, std::vector<char>& done, double limit_s) {
  done.assign(reqs.size(), 0);
  const auto start = std::chrono::steady_clock::now();
  std::vector<int> idx(reqs.size());
  std::size_t left = reqs.size();
  for (long spin = 0; left > 0; ++spin) {
    int n = 0;
    RELAYOUT_MPI_CHECK(MPI_Testsome(static_cast<int>(reqs.size()), reqs.data(), &n, idx.data(),
                                    MPI_STATUSES_IGNORE));
    if (n == MPI_UNDEFINED) break;  // nothing active is left
    for (int i = 0; i < n; ++i) done[static_cast<std::size_t>(idx[static_cast<std::size_t>(i)])] = 1;
    left -= static_cast<std::size_t>(n);
    if (left == 0) break;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >= limit_s) return false;
    if (spin > 64) std::this_thread::yield();  // let oversubscribed peers run
  }
  return true;
}

// One request (a nonblocking collective), the same way without allocating. MPI_Test's error is
// returned, not thrown, so the caller names the collective.
inline int wait_one(MPI_Request& req, double limit_s, bool& expired) {
  expired = false;
  const auto start = std::chrono::steady_clock::now();
  for (long spin = 0;; ++spin) {
    int flag = 0;
    if (const int rc = MPI_Test(&req, &flag, MPI_STATUS_IGNORE); rc != MPI_SUCCESS || flag) return rc;
    if (spin > 64) {
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >= limit_s) {
        expired = true;
        return MPI_SUCCESS;
      }
      std::this_thread::yield();
    }
  }
}

inline std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

class MpiAgreement {
 public:
  MpiAgreement() = default;
  MpiAgreement(const MpiAgreement&) = delete;
  MpiAgreement& operator=(const MpiAgreement&) = delete;
  ~MpiAgreement() {
    int finalized = 0;
    if (shadow_ != MPI_COMM_NULL && MPI_Finalized(&finalized) == MPI_SUCCESS && !finalized)
      MPI_Comm_free(&shadow_);
  }

  // Throws CollectiveMismatch on every member when the members disagree; aborts the job when the
  // deadline passes before every member arrived.
  void agree(MPI_Comm comm, int rank, int size, const std::string& name, const CollectiveCall& call) {
    const AgreementSettings& s = agreement_settings();
    const std::uint64_t seq = ++seq_;
    const Signature mine = make_signature(call, seq);
    open_channel(comm, name, mine, s.timeout_s);

    const auto n = static_cast<std::size_t>(size), me = static_cast<std::size_t>(rank);
    const bool pairwise = call.kind == CollectiveKind::all_to_allv;
    std::vector<Signature> got(n), sent(n, mine);
    std::vector<MPI_Request> reqs;  // receives first (index p' of peer p), then sends
    std::vector<int> peer;
    reqs.reserve(2 * n);
    for (std::size_t p = 0; p < n; ++p) {
      if (pairwise) sent[p].pair_send = p < call.send_counts.size() ? call.send_counts[p] : -1;
      if (p == me) continue;
      reqs.emplace_back();
      peer.push_back(static_cast<int>(p));
      RELAYOUT_MPI_CHECK(MPI_Irecv(&got[p], sizeof(Signature), MPI_BYTE, static_cast<int>(p), kTag, shadow_, &reqs.back()));
    }
    const std::size_t n_recv = reqs.size();
    for (std::size_t p = 0; p < n; ++p) {
      if (p == me) continue;
      reqs.emplace_back();
      RELAYOUT_MPI_CHECK(MPI_Isend(&sent[p], sizeof(Signature), MPI_BYTE, static_cast<int>(p), kTag, shadow_, &reqs.back()));
    }
    got[me] = sent[me];
    pending_ = mine;  // the collective that follows reports its stall against this call
    has_pending_ = true;
    // Past the deadline (and the inquiry window), the receives still open name the members missing.
    std::vector<char> done;
    const auto expired = [&] {
      return !wait_with_deadline(reqs, done, collective_deadline(s.timeout_s)) &&
             !wait_with_deadline(reqs, done, inquiry_window(s.timeout_s));
    };
    const auto missing = [&] {
      std::vector<int> m;
      for (std::size_t i = 0; i < n_recv; ++i)
        if (reqs[i] != MPI_REQUEST_NULL) m.push_back(peer[i]);
      return m;
    };
    if (expired()) {
      const GroupText g = group_text(comm, name);
      abort_job("relayout watchdog: member " + std::to_string(rank) + " of " + g.header(n) +
                    " waited " + seconds_text(s.timeout_s) + " s (RELAYOUT_COLLECTIVE_TIMEOUT) at " +
                    describe(mine) + "; not arrived: " + g.members(missing()) + ". Aborting the job.",
                kWatchdogExitCode);
    }
    for (std::size_t p = 0; p < n; ++p)
      if (got[p].magic != Signature::kMagic)
        throw CollectiveMismatch("relayout: member " + std::to_string(p) + " of communicator \"" + name +
                                 "\" sent a malformed agreement record (is every rank running the same relayout?)");
    if (std::string v = signature_verdict(got, group_text(comm, name)); !v.empty())
      throw CollectiveMismatch(v);
    if (!pairwise) return;
    // Each member knows only what its peers send it; share the findings so all members agree.
    // Point to point under the same deadline: a member that stops (or loses its link) between the
    // two exchanges must not leave the others blocked in an MPI_Allgather.
    std::vector<PairFinding> all(n);
    all[me] = pair_finding(got, call.recv_counts);
    reqs.clear();
    for (std::size_t i = 0; i < n_recv; ++i) {
      reqs.emplace_back();
      RELAYOUT_MPI_CHECK(MPI_Irecv(&all[static_cast<std::size_t>(peer[i])], sizeof(PairFinding), MPI_BYTE, peer[i],
                                   kPairTag, shadow_, &reqs.back()));
    }
    for (std::size_t i = 0; i < n_recv; ++i) {
      reqs.emplace_back();
      RELAYOUT_MPI_CHECK(MPI_Isend(&all[me], sizeof(PairFinding), MPI_BYTE, peer[i], kPairTag, shadow_, &reqs.back()));
    }
    if (expired()) {
      const GroupText g = group_text(comm, name);
      abort_job("relayout watchdog: member " + std::to_string(rank) + " of " + g.header(n) +
                    " waited " + seconds_text(s.timeout_s) + " s (RELAYOUT_COLLECTIVE_TIMEOUT) for the all_to_allv count findings at " +
                    describe(mine) + "; not arrived: " + g.members(missing()) + ". Aborting the job.",
                kWatchdogExitCode);
    }
    if (std::string v = pair_verdict(all, mine, group_text(comm, name)); !v.empty())
      throw CollectiveMismatch(v);
  }

  // With the check off but a deadline on: this call is recorded, not exchanged, so the watch
  // over the collective that follows can name it (watchdog.hpp). Its spans stay the caller's.
  void note(const CollectiveCall& call) {
    noted_ = call;
    noted_seq_ = ++seq_;
  }
  // The call note() recorded and its number, once (0: none, e.g. a direct MpiCommunicator call).
  const CollectiveCall& noted() const { return noted_; }
  std::uint64_t take_noted() { return std::exchange(noted_seq_, 0); }

  // Makes the private duplicate now: for a communicator just made by a split or dup, whose members
  // are all here, so the watchdog can name missing members from the first call on.
  // Nonblocking under the deadline: a member can stop right after the call that made `comm`.
  void open_now(MPI_Comm comm, const std::string& name) {
    if (shadow_ != MPI_COMM_NULL) return;
    std::vector<MPI_Request> req(1);
    RELAYOUT_MPI_CHECK(MPI_Comm_idup(comm, &shadow_, req.data()));
    const double timeout_s = agreement_settings().timeout_s;
    std::vector<char> done;
    if (!wait_with_deadline(req, done, collective_deadline(timeout_s))) {
      int size = 0;
      MPI_Comm_size(comm, &size);
      abort_job("relayout watchdog: " + group_text(comm, name).header(static_cast<std::size_t>(size)) +
                    ": waited " + seconds_text(timeout_s) + " s (RELAYOUT_COLLECTIVE_TIMEOUT) for the members to " +
                    "open its agreement channel, right after the call that made it; which members are missing is " +
                    "not known before that completes. Aborting the job.",
                kWatchdogExitCode);
    }
    RELAYOUT_MPI_CHECK(MPI_Comm_set_errhandler(shadow_, MPI_ERRORS_RETURN));  // a copy inherits comm's
  }

  // The call the last agree() was for, once: the backend collective right after it names it when
  // it stalls. Null when the collective was called directly (no agree() before it).
  const Signature* take_pending() {
    if (!has_pending_) return nullptr;
    has_pending_ = false;
    return &pending_;
  }

  // Inside a collective every member had arrived at, the deadline passed. MPI does not say which
  // member is holding it up, so the members ask each other: each member whose own deadline passed
  // at call `seq` tells every peer so, on the private duplicate, and listens for `window_s`. The
  // members heard from are waiting too; the others have stopped, hang elsewhere, or already left
  // the call. Empty `silent` means unknown (no channel). Returns the members heard from.
  std::vector<int> ask_who_is_waiting(int rank, int size, std::uint64_t seq, double window_s,
                                      std::vector<int>& silent) const {
    std::vector<int> heard;
    silent.clear();
    if (shadow_ == MPI_COMM_NULL) return heard;
    std::vector<std::uint64_t> got(static_cast<std::size_t>(size), 0);
    std::vector<MPI_Request> reqs;
    std::vector<int> peer;
    for (int p = 0; p < size; ++p) {
      if (p == rank) continue;
      reqs.emplace_back();
      peer.push_back(p);
      if (MPI_Irecv(&got[static_cast<std::size_t>(p)], 1, MPI_UINT64_T, p, kStallTag, shadow_, &reqs.back()) != MPI_SUCCESS)
        return heard;
    }
    for (int p = 0; p < size; ++p) {
      if (p == rank) continue;
      reqs.emplace_back();
      if (MPI_Isend(&seq, 1, MPI_UINT64_T, p, kStallTag, shadow_, &reqs.back()) != MPI_SUCCESS) return heard;
    }
    std::vector<char> done;
    try {
      wait_with_deadline(reqs, done, window_s);
    } catch (const CommError&) {
      return heard;
    }
    for (std::size_t i = 0; i < peer.size(); ++i)
      (done[i] && got[static_cast<std::size_t>(peer[i])] == seq ? heard : silent).push_back(peer[i]);
    return heard;  // the requests still open go with the job
  }

  static GroupText group_text(MPI_Comm comm, const std::string& name) {
    GroupText g;
    g.name = name;
    int size = 0;
    MPI_Group mine = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
    if (MPI_Comm_size(comm, &size) != MPI_SUCCESS || MPI_Comm_group(comm, &mine) != MPI_SUCCESS) return g;
    if (MPI_Comm_group(MPI_COMM_WORLD, &world) == MPI_SUCCESS) {
      std::vector<int> local(static_cast<std::size_t>(size));
      for (int i = 0; i < size; ++i) local[static_cast<std::size_t>(i)] = i;
      g.world_ranks.resize(local.size());
      if (MPI_Group_translate_ranks(mine, size, local.data(), world, g.world_ranks.data()) != MPI_SUCCESS)
        g.world_ranks.clear();
      MPI_Group_free(&world);
    }
    MPI_Group_free(&mine);
    return g;
  }

 private:
  static constexpr int kTag = 7411;
  static constexpr int kStallTag = 7412;
  static constexpr int kPairTag = 7413;

  // The private duplicate the signatures travel on, made at the first checked call (a collective
  // itself, so it runs under the same deadline).
  void open_channel(MPI_Comm comm, const std::string& name, const Signature& first, double timeout_s) {
    if (shadow_ != MPI_COMM_NULL) return;
    std::vector<MPI_Request> req(1);
    RELAYOUT_MPI_CHECK(MPI_Comm_idup(comm, &shadow_, req.data()));
    std::vector<char> done;
    if (!wait_with_deadline(req, done, collective_deadline(timeout_s))) {
      int size = 0;
      MPI_Comm_size(comm, &size);
      abort_job("relayout watchdog: " + group_text(comm, name).header(static_cast<std::size_t>(size)) +
                    ": waited " + seconds_text(timeout_s) + " s (RELAYOUT_COLLECTIVE_TIMEOUT) for the members to reach " +
                    describe(first) + ", the first checked call on it; which members are missing is not known " +
                    "before the first call completes. Aborting the job.",
                kWatchdogExitCode);
    }
    RELAYOUT_MPI_CHECK(MPI_Comm_set_errhandler(shadow_, MPI_ERRORS_RETURN));  // a copy inherits comm's
  }

  MPI_Comm shadow_ = MPI_COMM_NULL;
  std::uint64_t seq_ = 0;
  Signature pending_;
  bool has_pending_ = false;
  CollectiveCall noted_{};
  std::uint64_t noted_seq_ = 0;
};

}  // namespace relayout::impl
