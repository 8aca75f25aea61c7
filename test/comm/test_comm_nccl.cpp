// The NCCL backend on GPU buffers: built whenever CUDA and NCCL are found, run only where a CUDA
// device exists. Without one the program prints why and exits 77, which ctest reports as skipped.
#define DOCTEST_CONFIG_IMPLEMENT
#include <cuda_runtime_api.h>
#include <doctest/doctest.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cstdio>
#include <relayout/comm.hpp>
#include <vector>

using namespace relayout;

namespace {

template <class T>
struct DeviceBuffer {
  explicit DeviceBuffer(std::size_t n) : n(n) { RELAYOUT_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T))); }
  DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    RELAYOUT_CUDA_CHECK(cudaMemcpy(p, host.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~DeviceBuffer() { cudaFree(p); }
  std::span<T> span() { return {p, n}; }
  std::vector<T> host() const {
    std::vector<T> out(n);
    RELAYOUT_CUDA_CHECK(cudaMemcpy(out.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return out;
  }
  T* p = nullptr;
  std::size_t n;
};

}  // namespace

TEST_CASE("nccl: collectives on device memory match the rank formulas") {
  const MpiCommunicator world = MpiCommunicator::world();
  int devices = 0;
  RELAYOUT_CUDA_CHECK(cudaGetDeviceCount(&devices));
  RELAYOUT_CUDA_CHECK(cudaSetDevice(world.rank() % devices));
  const NcclCommunicator nccl = NcclCommunicator::create(world);
  static_assert(SplittableCommunicator<NcclCommunicator>);
  const int n = nccl.size(), r = nccl.rank();

  DeviceBuffer<float> send(std::vector<float>{float(r + 1), float(2 * r)}), recv(2);
  all_reduce(nccl, send.span(), recv.span());
  CHECK(recv.host() == std::vector<float>{n * (n + 1) / 2.0f, n * (n - 1.0f)});

  DeviceBuffer<bf16> half(std::vector<bf16>{bf16(1.5f)}), half_sum(1);
  all_reduce(nccl, half.span(), half_sum.span());
  CHECK(static_cast<float>(half_sum.host()[0]) == 1.5f * n);

  std::vector<int> counts;
  std::vector<float> expect;
  for (int i = 0; i < n; ++i) {
    counts.push_back(i % 2 + 1);
    for (int j = 0; j < i % 2 + 1; ++j) expect.push_back(float(10 * i + j));
  }
  std::vector<float> mine;
  for (int j = 0; j < r % 2 + 1; ++j) mine.push_back(float(10 * r + j));
  DeviceBuffer<float> part(mine), gathered(expect.size());
  all_gatherv(nccl, part.span(), gathered.span(), counts);
  CHECK(gathered.host() == expect);

  DeviceBuffer<float> b(std::vector<float>(3, float(r)));
  broadcast(nccl, b.span(), n - 1);
  CHECK(b.host() == std::vector<float>(3, float(n - 1)));

  const NcclCommunicator copy = nccl.dup();
  CHECK(copy.size() == n);
  barrier(copy);
  std::vector<float> small(1);
  CHECK_THROWS_AS(all_reduce(nccl, send.span(), std::span<float>(small)), LayoutError);
}

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: the NCCL test is skipped (it compiled and linked)\n");
    return 77;
  }
  MPI_Init(&argc, &argv);
  int result = 0;
  {
    doctest::Context context;
    context.applyCommandLine(argc, argv);
    result = context.run();
  }
  MPI_Finalize();
  return result;
}
