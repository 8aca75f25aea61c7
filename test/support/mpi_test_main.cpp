// doctest main shared by every MPI test: MPI and Kokkos around the run, a report from rank 0 only,
// and a failure on any rank fails the test on every rank. After each test case the ranks compare
// results, so rank 0 names the test case and the ranks where it failed; a failing rank's own report
// follows, printed in rank order.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cstdio>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "mpi_world.hpp"

namespace {

std::optional<relayout::MpiCommunicator> the_world;  // relayout::test::world(), reset before MPI_Finalize

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// Collective per test case: every rank runs the same test cases in the same order.
struct MpiAgreement : doctest::IReporter {
  explicit MpiAgreement(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData& data) override { name_ = data.m_name; }
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats& stats) override {
    const int failed = stats.testCaseSuccess ? 0 : 1;
    std::vector<int> all(static_cast<std::size_t>(world_size()));
    MPI_Gather(&failed, 1, MPI_INT, all.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (world_rank() != 0) return;
    std::string ranks;
    for (std::size_t r = 0; r < all.size(); ++r)
      if (all[r]) ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
    if (!ranks.empty())
      std::fprintf(stdout, "[mpi] test case \"%s\" failed on rank(s) %s of %d\n", name_.c_str(),
                   ranks.c_str(), world_size());
  }
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}

 private:
  std::string name_;
};

}  // namespace

REGISTER_LISTENER("mpi_agreement", 1, MpiAgreement);

const relayout::MpiCommunicator& relayout::test::world() {
  if (!the_world) the_world.emplace(relayout::MpiCommunicator::world());
  return *the_world;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Kokkos::initialize(argc, argv);
  const int rank = world_rank();
  int any_failed = 0;
  {
    doctest::Context context;
    context.applyCommandLine(argc, argv);
    std::ostringstream captured;
    if (rank != 0) context.setCout(&captured);
    const int failed = context.run() != 0 ? 1 : 0;
    MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    for (int r = 1; r < world_size(); ++r) {
      if (r == rank && failed) {
        std::fprintf(stdout, "---- report of rank %d ----\n%s", rank, captured.str().c_str());
        std::fflush(stdout);
      }
      MPI_Barrier(MPI_COMM_WORLD);
    }
  }
  the_world.reset();  // frees its agreement channel while MPI is up
  Kokkos::finalize();
  MPI_Finalize();
  return any_failed;
}
