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
// At the end every rank reports its exit code. A rank that succeeded waits for the others up to the
// deadline (RELAYOUT_COLLECTIVE_TIMEOUT, 300 s unless set; 0: as long as it takes), then aborts the
// job, exit code 3. A rank that failed waits at most RELAYOUT_EXIT_GRACE seconds (10 s, or half the
// deadline when shorter; 0: not at all): when every rank arrives (they all hit the same bad
// input, say), the job exits normally with the largest exit code on every rank, and each failed rank
// other than rank 0 prints its error when rank 0's output does not already say it. When some rank
// does not arrive, the failed rank prints its error and ends the job with MPI_Abort (exit code: its
// own).
#pragma once

#include <mpi.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "relayout/comm/agreement.hpp"
#include "relayout/comm/impl/mpi_agreement.hpp"
#include "relayout/comm/impl/mpi_types.hpp"
#include "relayout/mesh/error.hpp"

namespace relayout {

namespace impl {

// Every RELAYOUT_* variable of this process's environment, "NAME=VALUE" each, sorted.
inline std::vector<std::string> relayout_environment() {
  std::vector<std::string> out;
  for (char** e = ::environ; e && *e; ++e)
    if (std::strncmp(*e, "RELAYOUT_", 9) == 0) out.emplace_back(*e);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace impl

class JobGuard {
 public:
  // Collective over `world`: duplicates it, so the exit exchange never meets the engine's traffic.
  explicit JobGuard(MPI_Comm world = MPI_COMM_WORLD) {
    try {
      own_ = impl::read_agreement_settings();
    } catch (const LayoutError& e) {
      own_error_ = e.what();
      own_ = AgreementSettings{};
    }
    std::vector<MPI_Request> req(1);
    RELAYOUT_MPI_CHECK(MPI_Comm_rank(world, &rank_));
    RELAYOUT_MPI_CHECK(MPI_Comm_idup(world, &comm_, req.data()));
    wait_at_start(req, "for every rank to arrive");
    RELAYOUT_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    RELAYOUT_MPI_CHECK(MPI_Comm_size(comm_, &size_));
    read_settings();
    current_slot() = this;
  }
  JobGuard(const JobGuard&) = delete;
  JobGuard& operator=(const JobGuard&) = delete;
  ~JobGuard() {
    if (current_slot() == this) current_slot() = nullptr;
    int finalized = 0;
    if (comm_ != MPI_COMM_NULL && MPI_Finalized(&finalized) == MPI_SUCCESS && !finalized) MPI_Comm_free(&comm_);
  }

  int rank() const { return rank_; }

  // Empty when the settings are good and the same on every rank; else the error, the same on every rank.
  const std::string& settings_error() const { return settings_error_; }

  // This rank has made its last collective and now works on its own until it finishes (`what`:
  // e.g. "writing the report"). Local: the others, once they reach the end of the job, wait for it
  // without a deadline. A no-op without a JobGuard in this process.
  static void working_alone(std::string_view what) {
    if (JobGuard* job = current_slot()) job->announce(kAlone, 0, what);
  }

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
    announce(kExit, rc, "");
    const ExitWait w = wait_for_exits(rc == 0 ? impl::collective_deadline(settings_.timeout_s) : settings_.exit_grace_s);
    if (!w.missing.empty()) {
      const std::string who = " not heard from: ranks " + impl::member_list(w.missing) +
                              (w.alone.empty() ? "" : "; working alone: " + w.alone);
      if (rc == 0)
        impl::abort_job("relayout watchdog: rank " + std::to_string(rank_) + " finished, but not every rank reached the "
                            "end of the job within " + impl::seconds_text(settings_.timeout_s) +
                            " s (RELAYOUT_COLLECTIVE_TIMEOUT);" + who + ". Aborting the job.",
                        impl::kWatchdogExitCode);
      impl::abort_job("relayout: rank " + std::to_string(rank_) + " failed (exit code " + std::to_string(rc) +
                          "): " + std::string(error.empty() ? "no message" : error) +
                          "\nrelayout: not every rank reached the end of the job within " +
                          impl::seconds_text(settings_.exit_grace_s) +
                          " s (RELAYOUT_EXIT_GRACE); the others are waiting for this rank in a collective it "
                          "will not join;" + who + ". Aborting the job.",
                      rc);
    }
    std::vector<char> done;
    impl::wait_with_deadline(sends_, done, impl::kForever);  // every peer has posted its receives
    sends_.clear();
    const bool all_failed = std::all_of(w.codes.begin(), w.codes.end(), [](int r) { return r != 0; });
    if (rc != 0 && rank_ != 0 && !all_failed && !error.empty()) {
      std::fprintf(stderr, "error on rank %d: %.*s\n", rank_, static_cast<int>(error.size()), error.data());
      std::fflush(stderr);
    }
    return *std::max_element(w.codes.begin(), w.codes.end());
  }

 private:
  static constexpr int kStatusTag = 7420;
  static constexpr int kAlone = 1, kExit = 2;
  // What one rank tells every other at the end: working alone (what), then its exit code.
  struct Status {
    std::int32_t kind = 0;
    std::int32_t rc = 0;
    char what[120] = {};
  };
  struct ExitWait {
    std::vector<int> codes;    // every rank's exit code (when none is missing)
    std::vector<int> missing;  // the ranks not heard from when the wait gave up
    std::string alone;         // of those, the ones working alone: "rank 0 (writing the report)"
  };

  static JobGuard*& current_slot() {
    static JobGuard* job = nullptr;
    return job;
  }

  void announce(int kind, int rc, std::string_view what) {
    if (kind == kAlone && (alone_ || size_ == 1)) return;
    alone_ = alone_ || kind == kAlone;
    auto& st = out_[kind == kAlone ? 0 : 1];
    st.kind = kind;
    st.rc = rc;
    impl::copy_text(st.what, what);
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      sends_.emplace_back();
      RELAYOUT_MPI_CHECK(MPI_Isend(&st, sizeof(Status), MPI_BYTE, p, kStatusTag, comm_, &sends_.back()));
    }
  }

  // Every peer's status messages until its exit code arrives, or `limit_s` passes with some peer
  // neither exited nor working alone (a peer working alone is waited for as long as it takes).
  ExitWait wait_for_exits(double limit_s) {
    const auto n = static_cast<std::size_t>(size_);
    ExitWait w;
    w.codes.assign(n, 0);
    std::vector<Status> in(n);
    std::vector<MPI_Request> recv(n, MPI_REQUEST_NULL);
    std::vector<int> state(n, 0);  // 0 nothing yet, kAlone, kExit
    std::vector<std::string> alone_what(n);
    const auto post = [&](std::size_t p) {
      RELAYOUT_MPI_CHECK(MPI_Irecv(&in[p], sizeof(Status), MPI_BYTE, int(p), kStatusTag, comm_, &recv[p]));
    };
    for (std::size_t p = 0; p < n; ++p)
      if (int(p) != rank_) post(p);
    w.codes[std::size_t(rank_)] = out_[1].rc;
    state[std::size_t(rank_)] = kExit;
    const auto start = std::chrono::steady_clock::now();
    for (long spin = 0;; ++spin) {
      std::size_t exited = 0, waiting_alone = 0;
      for (std::size_t p = 0; p < n; ++p) {
        if (state[p] != kExit && recv[p] != MPI_REQUEST_NULL) {
          int flag = 0;
          RELAYOUT_MPI_CHECK(MPI_Test(&recv[p], &flag, MPI_STATUS_IGNORE));
          if (flag) {
            state[p] = in[p].kind;
            if (in[p].kind == kExit) {
              w.codes[p] = in[p].rc;
            } else {
              in[p].what[sizeof in[p].what - 1] = '\0';
              alone_what[p] = in[p].what;
              post(p);  // its exit code follows
            }
          }
        }
        exited += state[p] == kExit;
        waiting_alone += state[p] == kAlone;
      }
      if (exited == n) return w;
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (s >= limit_s && exited + waiting_alone < n) {
        for (std::size_t p = 0; p < n; ++p) {
          if (state[p] == kExit) continue;
          w.missing.push_back(int(p));
          if (state[p] == kAlone)
            w.alone += (w.alone.empty() ? "rank " : ", rank ") + std::to_string(p) + " (" + alone_what[p] + ")";
        }
        return w;  // the open receives go with the job
      }
      if (spin > 64) std::this_thread::yield();
    }
  }

  // A wait of the start (before the settings are agreed: under this rank's own deadline).
  void wait_at_start(std::vector<MPI_Request>& reqs, const char* what) {
    std::vector<char> done;
    if (impl::wait_with_deadline(reqs, done, impl::collective_deadline(own_.timeout_s))) return;
    std::vector<int> missing;
    for (std::size_t i = 0; i < missing_peer_.size() && i < done.size(); ++i)
      if (!done[i]) missing.push_back(missing_peer_[i]);
    impl::abort_job("relayout watchdog: rank " + std::to_string(rank_) + " waited " + impl::seconds_text(own_.timeout_s) +
                        " s (RELAYOUT_COLLECTIVE_TIMEOUT) at the start of the job " + what + "; " +
                        (missing.empty() ? std::string("which ranks are missing is not known yet")
                                         : "not arrived: ranks " + impl::member_list(missing)) +
                        ". Aborting the job.",
                    impl::kWatchdogExitCode);
  }

  // Every rank's record from every rank, point to point (so a rank that does not come is named).
  template <class T>
  std::vector<T> exchange(const T& mine, const char* what) {
    std::vector<T> all(static_cast<std::size_t>(size_));
    all[static_cast<std::size_t>(rank_)] = mine;
    std::vector<MPI_Request> reqs;
    missing_peer_.clear();
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      reqs.emplace_back();
      missing_peer_.push_back(p);
      RELAYOUT_MPI_CHECK(MPI_Irecv(&all[std::size_t(p)], sizeof(T), MPI_BYTE, p, kStatusTag + 1, comm_, &reqs.back()));
    }
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      reqs.emplace_back();
      RELAYOUT_MPI_CHECK(MPI_Isend(&mine, sizeof(T), MPI_BYTE, p, kStatusTag + 1, comm_, &reqs.back()));
    }
    wait_at_start(reqs, what);
    missing_peer_.clear();
    return all;
  }

  // Rank `from`'s text on every rank.
  std::string broadcast_text(const std::string& mine, int from) {
    char text[1024] = {};
    if (rank_ == from) impl::copy_text(text, mine);
    std::vector<MPI_Request> req(1);
    RELAYOUT_MPI_CHECK(MPI_Ibcast(text, sizeof text, MPI_CHAR, from, comm_, req.data()));
    wait_at_start(req, "for the settings");
    return text;
  }

  // Collective: each rank reads its own environment; the ranks then agree on one verdict.
  void read_settings() {
    struct Seen {
      double timeout_s, exit_grace_s;
      int check, bad;
      std::uint64_t env_hash;
    };
    const std::vector<std::string> env = impl::relayout_environment();
    std::string env_text;
    for (const std::string& e : env) env_text += e + '\n';
    std::uint64_t h = 1469598103934665603ull;
    for (unsigned char c : env_text) h = (h ^ c) * 1099511628211ull;
    const Seen me{own_.timeout_s, own_.exit_grace_s, own_.check ? 1 : 0, own_error_.empty() ? 0 : 1, h};
    const std::vector<Seen> all = exchange(me, "for the ranks' settings");
    const auto bad = std::find_if(all.begin(), all.end(), [](const Seen& x) { return x.bad != 0; });
    if (bad != all.end()) {
      const int from = static_cast<int>(bad - all.begin());
      settings_error_ = broadcast_text(own_error_, from) + (from != 0 ? " (on rank " + std::to_string(from) + ")" : "");
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
    if (settings_error_.empty())
      for (std::size_t r = 1; r < all.size(); ++r)
        if (all[r].env_hash != all[0].env_hash) {
          settings_error_ = environment_differs(env_text, int(r));
          break;
        }
    if (settings_error_.empty()) settings_ = own_;
  }

  // The first RELAYOUT_* variable whose text differs between rank 0 and rank r.
  std::string environment_differs(const std::string& mine, int r) {
    const std::string a = broadcast_text(mine, 0), b = broadcast_text(mine, r);
    const auto parse = [](const std::string& t) {
      std::vector<std::pair<std::string, std::string>> kv;
      std::size_t at = 0;
      while (at < t.size()) {
        const std::size_t nl = t.find('\n', at), eq = t.find('=', at);
        kv.emplace_back(t.substr(at, eq - at), t.substr(eq + 1, nl - eq - 1));
        at = nl + 1;
      }
      return kv;
    };
    const auto ka = parse(a), kb = parse(b);
    const auto value = [](const auto& kv, const std::string& name) {
      for (const auto& [k, v] : kv)
        if (k == name) return "'" + v + "'";
      return std::string("unset");
    };
    std::vector<std::string> names;
    for (const auto& [k, v] : ka) names.push_back(k);
    for (const auto& [k, v] : kb) names.push_back(k);
    std::sort(names.begin(), names.end());
    for (const std::string& name : names)
      if (value(ka, name) != value(kb, name))
        return name + " differs between ranks (rank 0: " + value(ka, name) + ", rank " + std::to_string(r) + ": " +
               value(kb, name) + "); every rank must see the same settings";
    return "the RELAYOUT_* settings differ between rank 0 and rank " + std::to_string(r) +
           " (longer than shown); every rank must see the same settings";
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  AgreementSettings own_;      // this rank's own reading
  std::string own_error_;
  AgreementSettings settings_;  // the job's, once every rank agrees
  std::string settings_error_;
  std::vector<int> missing_peer_;  // during a start-up exchange: the peer of each receive
  Status out_[2];                  // working alone, exit: what the sends below carry
  std::vector<MPI_Request> sends_;
  bool alone_ = false;
};

}  // namespace relayout
