// What a large MPI message costs when its pages must be pinned: MPI_Alltoall of 1 and 4 MiB per
// rank (half of it to the other rank at np 2), median of 40 calls after a barrier, with the send
// buffer (a) untouched between calls, (b) rewritten before each call, as a layer's rows are, and
// (c) rewritten and the caches then swept by 32 MiB of other work. Buffers are 2 MiB aligned and,
// with --huge, advised for transparent huge pages (MADV_HUGEPAGE) before their first touch.
// Run it with and without --huge: MPICH over UCX moves these messages by cross-memory attach,
// which pins every page it reads, so on 4 KiB pages case (c) pays for the page walk as much as
// for the copy (docs/benchmarks.md).
#include <mpi.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

float* alloc_floats(std::size_t n, bool huge) {
  constexpr std::size_t kAlign = std::size_t{2} << 20;
  const std::size_t bytes = (n * sizeof(float) + kAlign - 1) / kAlign * kAlign;
  auto* p = static_cast<float*>(std::aligned_alloc(kAlign, bytes));
  if (!p) {
    std::fprintf(stderr, "error: cannot allocate %zu bytes\n", bytes);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  if (huge) madvise(p, bytes, MADV_HUGEPAGE);  // before the first touch, so faults take huge pages
  for (std::size_t i = 0; i < n; ++i) p[i] = 1.0f;
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  bool huge = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--huge") == 0) {
      huge = true;
    } else {
      if (rank == 0) std::fprintf(stderr, "error: unknown argument '%s' (expected: --huge)\n", argv[i]);
      MPI_Finalize();
      return 2;
    }
  }
  std::vector<float> sweep(std::size_t{8} << 20);
  const char* mode_name[3] = {"untouched", "rewritten", "rewritten, caches swept"};
  for (int mib : {1, 4}) {
    const std::size_t n = std::size_t(mib) << 18;  // floats per rank
    float* send = alloc_floats(n, huge);
    float* recv = alloc_floats(n, huge);
    for (int mode = 0; mode < 3; ++mode) {
      std::vector<double> t;
      for (int it = 0; it < 40; ++it) {
        if (mode >= 1)
          for (std::size_t i = 0; i < n; ++i) send[i] = float(i + std::size_t(it));
        if (mode == 2) {
          for (float& x : sweep) x += 1.0f;
          recv[0] += sweep[std::size_t(it)];
        }
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = MPI_Wtime();
        MPI_Alltoall(send, int(n / std::size_t(size)), MPI_FLOAT, recv, int(n / std::size_t(size)), MPI_FLOAT,
                     MPI_COMM_WORLD);
        t.push_back(MPI_Wtime() - t0);
      }
      std::sort(t.begin(), t.end());
      double median = t[t.size() / 2];
      MPI_Allreduce(MPI_IN_PLACE, &median, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (rank == 0)
        std::printf("np %d, %d MiB a rank, %s pages, send buffer %s: MPI_Alltoall median %.1f us\n", size, mib,
                    huge ? "huge" : "4 KiB", mode_name[mode], median * 1e6);
    }
    std::free(send);
    std::free(recv);
  }
  MPI_Finalize();
  return 0;
}
