// The examples' run under MPI: rank 0 prints (the other ranks' output goes to a quiet stream), every
// rank parses and runs `body`, and JobGuard ends the job, so a rank that fails alone still says why.
#pragma once

#include <iostream>
#include <sstream>
#include <string>

#include "cli/layout_flags.hpp"
#include "relayout/comm/job.hpp"

namespace relayout::cli {

template <class F>
int run_mpi_main(CLI::App& app, int argc, const char* const* argv, JobGuard& job, F&& body) {
  if (const int bad = job.refuse_bad_settings()) return bad;  // a bad RELAYOUT_* value: exit 2 before any work
  std::ostringstream quiet;
  const bool root = job.rank() == 0;
  std::string error;
  const int rc = run_main(app, argc, argv, root ? std::cout : quiet, root ? std::cerr : quiet,
                          std::forward<F>(body), &error);
  return job.finish(rc, error);
}

}  // namespace relayout::cli
