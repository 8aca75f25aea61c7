// JobGuard: how an MPI job of relayout starts and ends, on every rank. A rank that failed (an
// exception, a non-zero exit code) must not leave the others waiting in a collective it will never join.
//
//   int main(int argc, char** argv) {
//     MPI_Init(&argc, &argv);
//     int rc = 0;
//     {
//       relayout::JobGuard job;                       // collective: right after MPI_Init
//       rc = job.run([&] { return engine_main(); });  // exceptions become exit codes
//     }
//     MPI_Finalize();
//     return rc;
//   }
//
// At the start every rank reads the RELAYOUT_* settings (agreement.hpp) and the ranks compare them:
// a bad value on any rank, or values that differ between ranks, is one error (the same text on every
// rank, printed by rank 0) and the job exits 2 without running its body (run(), or
// refuse_bad_settings() for a main that calls finish() itself).
//
// At the end every rank reports its exit code. A rank that succeeded waits for the others as long as
// it takes (or, with RELAYOUT_COLLECTIVE_TIMEOUT, that long; then it aborts the job, exit code 3). A
// rank that failed waits at most RELAYOUT_EXIT_GRACE seconds (10 s, or half of
// RELAYOUT_COLLECTIVE_TIMEOUT; 0: not at all): when every rank arrives (they all hit the same bad
// input, say), the job exits normally with the largest exit code on every rank, and each failed rank
// other than rank 0 prints its error when rank 0's output does not already say it. When some rank
// does not arrive, the failed rank prints its error and ends the job with MPI_Abort (exit code: its
// own).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "relayout/comm/agreement.hpp"
#include "relayout/comm/impl/mpi_agreement.hpp"
#include "relayout/comm/impl/mpi_types.hpp"
#include "relayout/mesh/error.hpp"

namespace relayout {

class JobGuard {
 public:
  // Collective over `world`: duplicates it, so the exit exchange never meets the engine's traffic.
  explicit JobGuard(MPI_Comm world = MPI_COMM_WORLD) {
    RELAYOUT_MPI_CHECK(MPI_Comm_dup(world, &comm_));
    RELAYOUT_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    RELAYOUT_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    RELAYOUT_MPI_CHECK(MPI_Comm_size(comm_, &size_));
    read_settings();
  }
  JobGuard(const JobGuard&) = delete;
  JobGuard& operator=(const JobGuard&) = delete;
  ~JobGuard() {
    int finalized = 0;
    if (comm_ != MPI_COMM_NULL && MPI_Finalized(&finalized) == MPI_SUCCESS && !finalized) MPI_Comm_free(&comm_);
  }

  int rank() const { return rank_; }

  // Empty when the settings are good and the same on every rank; else the error, the same on every rank.
  const std::string& settings_error() const { return settings_error_; }

  // For a main that calls finish() itself, before its body: 0 when the settings are good; else rank
  // 0 prints the error and the job finishes with exit code 2, which is returned (on every rank).
  int refuse_bad_settings() {
    if (settings_error_.empty()) return 0;
    if (rank_ == 0) {
      std::fprintf(stderr, "error: %s\n", settings_error_.c_str());
      std::fflush(stderr);
    }
    return finish(2, settings_error_);
  }

  // Runs body() (returning the exit code) and finishes: a LayoutError exits 2, any other exception
  // 1. Rank 0 prints the error of an exception; see finish() for the others.
  template <class F>
  int run(F&& body) {
    if (const int bad = refuse_bad_settings()) return bad;
    int rc = 0;
    std::string error;
    try {
      rc = body();
    } catch (const LayoutError& e) {
      rc = 2;
      error = e.what();
    } catch (const std::exception& e) {
      rc = 1;
      error = e.what();
    }
    if (!error.empty() && rank_ == 0) std::fprintf(stderr, "error: %s\n", error.c_str());
    return finish(rc, error);
  }

  // Every rank calls this once, with its exit code and (when it failed) its error text, which only
  // ranks other than 0 print (rank 0 is expected to have reported its own). Returns the job's exit
  // code, the same on every rank; or never returns (MPI_Abort).
  int finish(int rc, std::string_view error) {
    std::vector<int> all(static_cast<std::size_t>(size_), 0);
    MPI_Request req = MPI_REQUEST_NULL;
    RELAYOUT_MPI_CHECK(MPI_Iallgather(&rc, 1, MPI_INT, all.data(), 1, MPI_INT, comm_, &req));
    std::vector<MPI_Request> reqs{req};
    std::vector<char> done;
    if (rc == 0) {
      if (!impl::wait_with_deadline(reqs, done, impl::collective_deadline(settings_.timeout_s)))
        impl::abort_job("relayout watchdog: rank " + std::to_string(rank_) + " finished, but not every rank reached the "
                            "end of the job within " + impl::seconds_text(settings_.timeout_s) +
                            " s (RELAYOUT_COLLECTIVE_TIMEOUT). Aborting the job.",
                        impl::kWatchdogExitCode);
    } else if (!impl::wait_with_deadline(reqs, done, settings_.exit_grace_s)) {
      impl::abort_job("relayout: rank " + std::to_string(rank_) + " failed (exit code " + std::to_string(rc) +
                          "): " + std::string(error.empty() ? "no message" : error) +
                          "\nrelayout: not every rank reached the end of the job within " +
                          impl::seconds_text(settings_.exit_grace_s) +
                          " s (RELAYOUT_EXIT_GRACE); the others are waiting for this rank in a collective it "
                          "will not join. Aborting the job.",
                      rc);
    }
    const bool all_failed = std::all_of(all.begin(), all.end(), [](int r) { return r != 0; });
    if (rc != 0 && rank_ != 0 && !all_failed && !error.empty()) {
      std::fprintf(stderr, "error on rank %d: %.*s\n", rank_, static_cast<int>(error.size()), error.data());
      std::fflush(stderr);
    }
    return *std::max_element(all.begin(), all.end());
  }

 private:
  // Collective: each rank reads its own environment; the ranks then agree on one verdict.
  void read_settings() {
    std::string mine;
    AgreementSettings s;
    try {
      s = impl::read_agreement_settings();
    } catch (const LayoutError& e) {
      mine = e.what();
    }
    struct Seen {
      double timeout_s, exit_grace_s;
      int check, bad;
    };
    const Seen me{s.timeout_s, s.exit_grace_s, s.check ? 1 : 0, mine.empty() ? 0 : 1};
    std::vector<Seen> all(static_cast<std::size_t>(size_));
    RELAYOUT_MPI_CHECK(MPI_Allgather(&me, sizeof(Seen), MPI_BYTE, all.data(), sizeof(Seen), MPI_BYTE, comm_));
    const auto bad = std::find_if(all.begin(), all.end(), [](const Seen& x) { return x.bad != 0; });
    if (bad != all.end()) {
      const int from = static_cast<int>(bad - all.begin());
      char text[512] = {};
      if (rank_ == from) impl::copy_text(text, mine);
      RELAYOUT_MPI_CHECK(MPI_Bcast(text, sizeof text, MPI_CHAR, from, comm_));
      settings_error_ = std::string(text) + (from != 0 ? " (on rank " + std::to_string(from) + ")" : "");
      return;  // settings_ keeps the defaults, for finish()
    }
    for (std::size_t r = 1; r < all.size() && settings_error_.empty(); ++r) {
      const auto differs = [&](const char* name, double a, double b) {
        if (a != b && settings_error_.empty())
          settings_error_ = std::string(name) + " differs between ranks (rank 0: " + impl::seconds_text(a) +
                            ", rank " + std::to_string(r) + ": " + impl::seconds_text(b) +
                            "); every rank must see the same settings";
      };
      differs("RELAYOUT_CHECK_COLLECTIVES", all[0].check, all[r].check);
      differs("RELAYOUT_COLLECTIVE_TIMEOUT", all[0].timeout_s, all[r].timeout_s);
      differs("RELAYOUT_EXIT_GRACE", all[0].exit_grace_s, all[r].exit_grace_s);
    }
    if (settings_error_.empty()) settings_ = s;
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  AgreementSettings settings_;
  std::string settings_error_;
};

}  // namespace relayout
