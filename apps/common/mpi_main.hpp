// The examples' run under MPI: MPI for the program's lifetime (the one place the programs call MPI
// itself; everything else goes through relayout's communicators), rank 0 prints (the other ranks'
// output goes to a quiet stream), every rank parses and runs `body`, and JobGuard ends the job, so a
// rank that fails alone still says why.
#pragma once

#include <mpi.h>

#include <Kokkos_Core.hpp>

#include <cstdio>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "common/layout_flags.hpp"
#include "relayout/comm/job.hpp"
#include "relayout/kernels/linear.hpp"

namespace relayout::cli {

// MPI_Init first, MPI_Finalize last: declare it first in main, before everything that uses MPI.
class MpiSession {
 public:
  MpiSession(int& argc, char**& argv) { MPI_Init(&argc, &argv); }
  ~MpiSession() { MPI_Finalize(); }
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
};

// Kokkos::initialize prints its 40-line option banner for --help, before the program's own usage.
// It gets the arguments without --help / -h, so --help shows the program's usage alone (its footer
// points to --kokkos-help, which Kokkos answers with the banner). Returns the arguments left for
// the program's parser (Kokkos removes its own --kokkos-* ones), --help included.
class KokkosArgs {
 public:
  KokkosArgs(int argc, char** argv) {
    std::vector<char*> help;
    for (int i = 0; i < argc; ++i) {
      const bool is_help = i > 0 && (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0);
      (is_help ? help : args_).push_back(argv[i]);
      kokkos_help_ = kokkos_help_ || std::strcmp(argv[i], "--kokkos-help") == 0;
    }
    int n = static_cast<int>(args_.size());
    args_.push_back(nullptr);
    Kokkos::initialize(n, args_.data());
    args_.resize(static_cast<std::size_t>(n));
    args_.insert(args_.end(), help.begin(), help.end());
  }
  ~KokkosArgs() { Kokkos::finalize(); }
  KokkosArgs(const KokkosArgs&) = delete;
  KokkosArgs& operator=(const KokkosArgs&) = delete;

  int argc() const { return static_cast<int>(args_.size()); }
  const char* const* argv() const { return args_.data(); }
  bool kokkos_help() const { return kokkos_help_; }  // Kokkos printed its options: nothing else to do

 private:
  std::vector<char*> args_;
  bool kokkos_help_ = false;
};

inline const char* kKokkosFooter = "Kokkos options (--kokkos-threads, --kokkos-device-id, ...): --kokkos-help";

template <class F>
int run_mpi_main(CLI::App& app, const KokkosArgs& args, JobGuard& job, F&& body) {
  if (args.kokkos_help()) return job.finish(0, "");
  if (const int bad = job.refuse_bad_settings()) return bad;  // a bad RELAYOUT_* value: exit 2 before any work
  try {
    kernels::check_kernel_settings();  // the same for the kernels' own (every rank sees the same environment)
  } catch (const LayoutError& e) {
    if (job.rank() == 0) std::fprintf(stderr, "error: %s\n", e.what());
    return job.finish(2, e.what());
  }
  std::ostringstream quiet;
  const bool root = job.rank() == 0;
  std::string error;
  app.footer(kKokkosFooter);
  const int rc = run_main(app, args.argc(), args.argv(), root ? std::cout : quiet, root ? std::cerr : quiet,
                          std::forward<F>(body), &error);
  return job.finish(rc, error);
}

}  // namespace relayout::cli
