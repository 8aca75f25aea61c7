// JobGuard: how an MPI job of relayout ends, on every rank. A rank that failed (an exception, a
// non-zero exit code) must not leave the others waiting in a collective it will never join.
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
// At the end every rank reports its exit code. A rank that succeeded waits for the others as long as
// it takes. A rank that failed waits at most RELAYOUT_EXIT_GRACE seconds (agreement.hpp; 10 s, or
// half of RELAYOUT_COLLECTIVE_TIMEOUT): when every rank arrives (they all hit the same bad input,
// say), the job exits normally with the largest exit code on every rank, and each failed rank other
// than rank 0 prints its error when rank 0's output does not already say it. When some rank does not
// arrive, the failed rank prints its error and which ranks are missing, and ends the job with
// MPI_Abort (exit code: its own).
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
  }
  JobGuard(const JobGuard&) = delete;
  JobGuard& operator=(const JobGuard&) = delete;
  ~JobGuard() {
    int finalized = 0;
    if (comm_ != MPI_COMM_NULL && MPI_Finalized(&finalized) == MPI_SUCCESS && !finalized) MPI_Comm_free(&comm_);
  }

  int rank() const { return rank_; }

  // Runs body() (returning the exit code) and finishes: a LayoutError exits 2, any other exception
  // 1. Rank 0 prints the error of an exception; see finish() for the others.
  template <class F>
  int run(F&& body) {
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
    const double grace = rc == 0 ? 0.0 : agreement_settings().exit_grace_s;
    if (!impl::wait_with_deadline(reqs, done, grace)) {  // 0: as long as it takes
      impl::abort_job("relayout: rank " + std::to_string(rank_) + " failed (exit code " + std::to_string(rc) +
                          "): " + std::string(error.empty() ? "no message" : error) +
                          "\nrelayout: not every rank reached the end of the job within " + seconds(grace) +
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
  static std::string seconds(double s) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", s);
    return buf;
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace relayout
