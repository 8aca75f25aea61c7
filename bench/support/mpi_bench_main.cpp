// main() of every benchmark: MPI and Kokkos around Google Benchmark; only rank 0 reports.
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>

#include "common/huge_pages.hpp"
#include "relayout/kernels/isa.hpp"

namespace {
// Swallows the reports of ranks other than 0; they still run every benchmark in lock-step.
class SilentReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};
}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Kokkos::initialize(argc, argv);
  benchmark::Initialize(&argc, argv);
  // In the report's context (console header, JSON "context"): what the kernels were compiled for
  // beside what the CPU offers.
  benchmark::AddCustomContext("isa_compiled", RELAYOUT_ISA_COMPILED_STRING());
  benchmark::AddCustomContext("isa_cpu", relayout::kernels::isa::cpu_isa());
  // Whether large buffers (MPI's messages among them) get huge pages: the kernel's THP mode and
  // glibc.malloc.hugetlb (bench/run.sh sets it; docs/benchmarks.md).
  benchmark::AddCustomContext("huge_pages", relayout::cli::huge_pages().describe());
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    SilentReporter silent;
    benchmark::RunSpecifiedBenchmarks(&silent);
  }
  benchmark::Shutdown();
  Kokkos::finalize();
  MPI_Finalize();
  return 0;
}
