// The MPI exchange behind the collective agreement check (agreement.hpp). Each member sends its
// Signature to every other member over a private duplicate of the communicator and receives
// theirs, with nonblocking point-to-point calls; so it knows, at any moment, which members have
// arrived at the call. With a deadline, a member that waits past it prints which members are
// missing and aborts the job (MPI_Abort): a hang becomes a message.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "relayout/comm/agreement.hpp"
#include "relayout/comm/impl/mpi_types.hpp"

namespace relayout::impl {

// The exit code of a job the watchdog ends.
inline constexpr int kWatchdogExitCode = 3;

[[noreturn]] inline void abort_job(const std::string& message, int code) {
  std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
  std::abort();  // MPI_Abort does not return; this keeps the promise if it ever did
}

// Waits until every request completes, or the deadline passes (timeout_s > 0; 0: no deadline).
// Returns false on expiry; done[i] then says which requests completed.
// Polls (yielding the core between tests, which oversubscribed ranks need more than a busy wait)
// rather than blocking in MPI_Waitall, with or without a deadline.
inline bool wait_with_deadline(std::vector<MPI_Request>& reqs, std::vector<char>& done, double timeout_s) {
  done.assign(reqs.size(), 0);
  const auto deadline = timeout_s > 0
                            ? std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s)
                            : std::chrono::steady_clock::time_point::max();
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
    if (std::chrono::steady_clock::now() > deadline) return false;
    if (spin > 64) std::this_thread::yield();  // let oversubscribed peers run
  }
  return true;
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
    std::vector<char> done;
    if (!wait_with_deadline(reqs, done, s.timeout_s)) {
      std::vector<int> missing;
      for (std::size_t i = 0; i < n_recv; ++i)
        if (!done[i]) missing.push_back(peer[i]);
      const GroupText g = group_text(comm, name);
      abort_job("relayout watchdog: member " + std::to_string(rank) + " of " + g.header(n) +
                    " waited " + seconds(s.timeout_s) + " s (RELAYOUT_COLLECTIVE_TIMEOUT) at " +
                    describe(mine) + "; not arrived: " + g.members(missing) + ". Aborting the job.",
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
    const PairFinding f = pair_finding(got, call.recv_counts);
    std::vector<PairFinding> all(n);
    RELAYOUT_MPI_CHECK(MPI_Allgather(&f, sizeof(PairFinding), MPI_BYTE, all.data(),
                                     sizeof(PairFinding), MPI_BYTE, shadow_));
    if (std::string v = pair_verdict(all, mine, group_text(comm, name)); !v.empty())
      throw CollectiveMismatch(v);
  }

  // Makes the private duplicate now: for a communicator just made by a split or dup, whose members
  // are all here, so the watchdog can name missing members from the first call on.
  void open_now(MPI_Comm comm) {
    if (shadow_ == MPI_COMM_NULL) RELAYOUT_MPI_CHECK(MPI_Comm_dup(comm, &shadow_));
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

  static std::string seconds(double s) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", s);
    return buf;
  }

  // The private duplicate the signatures travel on, made at the first checked call (a collective
  // itself, so it runs under the same deadline).
  void open_channel(MPI_Comm comm, const std::string& name, const Signature& first, double timeout_s) {
    if (shadow_ != MPI_COMM_NULL) return;
    std::vector<MPI_Request> req(1);
    RELAYOUT_MPI_CHECK(MPI_Comm_idup(comm, &shadow_, req.data()));
    std::vector<char> done;
    if (!wait_with_deadline(req, done, timeout_s)) {
      int size = 0;
      MPI_Comm_size(comm, &size);
      abort_job("relayout watchdog: " + group_text(comm, name).header(static_cast<std::size_t>(size)) +
                    ": waited " + seconds(timeout_s) + " s (RELAYOUT_COLLECTIVE_TIMEOUT) for the members to reach " +
                    describe(first) + ", the first checked call on it; which members are missing is not known " +
                    "before the first call completes. Aborting the job.",
                kWatchdogExitCode);
    }
  }

  MPI_Comm shadow_ = MPI_COMM_NULL;
  std::uint64_t seq_ = 0;
};

}  // namespace relayout::impl
