// NcclCommunicator: the Communicator concept over an ncclComm_t and a CUDA stream, for buffers in
// GPU memory. Built only when RELAYOUT_HAVE_NCCL is defined (CMake target relayout::nccl). Every
// call is enqueued on the communicator's stream and the stream is synchronised before returning,
// so it has the same blocking semantics as the MPI backend. NCCL, CUDA and MPI return codes are
// all checked and throw CommError naming the call, file and line. The collective agreement check
// (agreement.hpp) runs on the host, over a duplicate of the MPI bootstrap communicator that this
// communicator keeps (and splits alongside), before each call is enqueued.
//
// Nonblocking forms: none yet. all_to_all_start / all_to_allv_start on this backend run the
// blocking call (enqueue, then synchronise the stream) and return a request that is already
// complete, so two-batch overlap runs correctly but without overlapping its exchanges here. NCCL
// itself could: the calls are enqueued asynchronously, and a request would be a cudaEvent recorded
// on the stream (cudaEventQuery to test it); the deadline would then need the same treatment.
#pragma once

#if defined(RELAYOUT_HAVE_NCCL)

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>

#include "relayout/comm/error.hpp"
#include "relayout/comm/mpi.hpp"
#include "relayout/comm/scalar.hpp"

#define RELAYOUT_NCCL_CHECK(call) ::relayout::impl::nccl_check((call), #call, __FILE__, __LINE__)
#define RELAYOUT_CUDA_CHECK(call) ::relayout::impl::cuda_check((call), #call, __FILE__, __LINE__)

namespace relayout {

namespace impl {

inline void nccl_check(ncclResult_t rc, const char* call, const char* file, int line) {
  if (rc != ncclSuccess) throw CommError(call, file, line, ncclGetErrorString(rc));
}
inline void cuda_check(cudaError_t rc, const char* call, const char* file, int line) {
  if (rc != cudaSuccess) throw CommError(call, file, line, cudaGetErrorString(rc));
}

template <CommScalar T>
ncclDataType_t nccl_datatype() {
  if constexpr (std::is_same_v<T, float>) return ncclFloat32;
  else if constexpr (std::is_same_v<T, double>) return ncclFloat64;
  else if constexpr (std::is_same_v<T, std::int32_t>) return ncclInt32;
  else if constexpr (std::is_same_v<T, std::int64_t>) return ncclInt64;
  else if constexpr (std::is_same_v<T, bf16>) return ncclBfloat16;
  else return ncclFloat16;
}

inline ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::prod: return ncclProd;
    case ReduceOp::min: return ncclMin;
    case ReduceOp::max: return ncclMax;
  }
  return ncclSum;
}

// RAII for ncclGroupStart/End around the point-to-point calls of one v-collective.
struct NcclGroup {
  NcclGroup() { RELAYOUT_NCCL_CHECK(ncclGroupStart()); }
  ~NcclGroup() noexcept(false) { RELAYOUT_NCCL_CHECK(ncclGroupEnd()); }
};

}  // namespace impl

class NcclCommunicator {
 public:
  // Collective over `bootstrap`: rank 0 makes the NCCL id, MPI broadcasts it, every rank joins on
  // the current CUDA device with its bootstrap rank.
  static NcclCommunicator create(const MpiCommunicator& bootstrap) {
    ncclUniqueId id{};
    if (bootstrap.rank() == 0) RELAYOUT_NCCL_CHECK(ncclGetUniqueId(&id));
    RELAYOUT_MPI_CHECK(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, bootstrap.native()));
    ncclComm_t comm = nullptr;
    RELAYOUT_NCCL_CHECK(ncclCommInitRank(&comm, bootstrap.size(), id, bootstrap.rank()));
    NcclCommunicator out(comm);
    out.host_ = std::make_unique<MpiCommunicator>(bootstrap.dup());
    return out;
  }

  NcclCommunicator(NcclCommunicator&& o) noexcept
      : comm_(std::exchange(o.comm_, nullptr)), stream_(std::exchange(o.stream_, nullptr)),
        size_(o.size_), rank_(o.rank_), host_(std::move(o.host_)) {}
  NcclCommunicator& operator=(NcclCommunicator&& o) noexcept {
    if (this != &o) {
      release();
      comm_ = std::exchange(o.comm_, nullptr);
      stream_ = std::exchange(o.stream_, nullptr);
      size_ = o.size_;
      rank_ = o.rank_;
      host_ = std::move(o.host_);
    }
    return *this;
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;
  ~NcclCommunicator() { release(); }

  ncclComm_t native() const { return comm_; }
  cudaStream_t stream() const { return stream_; }
  int size() const { return size_; }
  int rank() const { return rank_; }

  NcclCommunicator dup() const { return split(0, rank_); }
  NcclCommunicator split(int color, int key) const {
    ncclComm_t out = nullptr;
    RELAYOUT_NCCL_CHECK(ncclCommSplit(comm_, color, key, &out, nullptr));
    NcclCommunicator c(out);
    if (host_) c.host_ = std::make_unique<MpiCommunicator>(host_->split(color, key));
    return c;
  }

  // The agreement check over the host communicator (none for a communicator made from a raw
  // ncclComm_t without one).
  void agree(const CollectiveCall& call) const {
    if (host_) host_->agree(call);
  }
  void set_name(std::string_view name) {
    if (host_) host_->set_name(name);
  }

  template <CommScalar T>
  void all_reduce(std::span<const T> in, std::span<T> out, ReduceOp op) const {
    RELAYOUT_NCCL_CHECK(ncclAllReduce(in.data(), out.data(), out.size(), impl::nccl_datatype<T>(),
                                      impl::nccl_op(op), comm_, stream_));
    sync();
  }
  template <CommScalar T>
  void all_reduce_in_place(std::span<T> buf, ReduceOp op) const {
    RELAYOUT_NCCL_CHECK(ncclAllReduce(buf.data(), buf.data(), buf.size(), impl::nccl_datatype<T>(),
                                      impl::nccl_op(op), comm_, stream_));
    sync();
  }
  template <CommScalar T>
  void all_gather(std::span<const T> in, std::span<T> out) const {
    RELAYOUT_NCCL_CHECK(ncclAllGather(in.data(), out.data(), in.size(), impl::nccl_datatype<T>(), comm_, stream_));
    sync();
  }
  template <CommScalar T>
  void all_gather_in_place(std::span<T> buf) const {
    const std::size_t block = buf.size() / static_cast<std::size_t>(size_);
    RELAYOUT_NCCL_CHECK(ncclAllGather(buf.data() + block * static_cast<std::size_t>(rank_), buf.data(),
                                      block, impl::nccl_datatype<T>(), comm_, stream_));
    sync();
  }
  // v-collectives as grouped broadcasts / reduces: NCCL has no native v-variants.
  template <CommScalar T>
  void all_gatherv(std::span<const T> in, std::span<T> out, std::span<const int> counts,
                   std::span<const int> displs) const {
    {
      impl::NcclGroup group;
      for (int r = 0; r < size_; ++r)
        RELAYOUT_NCCL_CHECK(ncclBroadcast(r == rank_ ? static_cast<const void*>(in.data()) : nullptr,
                                          out.data() + displs[at(r)], counts[at(r)],
                                          impl::nccl_datatype<T>(), r, comm_, stream_));
    }
    sync();
  }
  template <CommScalar T>
  void all_gatherv_in_place(std::span<T> buf, std::span<const int> counts,
                            std::span<const int> displs) const {
    {
      impl::NcclGroup group;
      for (int r = 0; r < size_; ++r)
        RELAYOUT_NCCL_CHECK(ncclBroadcast(buf.data() + displs[at(r)], buf.data() + displs[at(r)],
                                          counts[at(r)], impl::nccl_datatype<T>(), r, comm_, stream_));
    }
    sync();
  }
  template <CommScalar T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, ReduceOp op) const {
    RELAYOUT_NCCL_CHECK(ncclReduceScatter(in.data(), out.data(), out.size(), impl::nccl_datatype<T>(),
                                          impl::nccl_op(op), comm_, stream_));
    sync();
  }
  // Result at the start of buf, as with MPI_IN_PLACE (NCCL's in-place form writes it at block rank).
  template <CommScalar T>
  void reduce_scatter_in_place(std::span<T> buf, ReduceOp op) const {
    const std::size_t block = buf.size() / static_cast<std::size_t>(size_);
    T* mine = buf.data() + block * static_cast<std::size_t>(rank_);
    RELAYOUT_NCCL_CHECK(ncclReduceScatter(buf.data(), mine, block, impl::nccl_datatype<T>(),
                                          impl::nccl_op(op), comm_, stream_));
    if (rank_ != 0)
      RELAYOUT_CUDA_CHECK(cudaMemcpyAsync(buf.data(), mine, block * sizeof(T), cudaMemcpyDeviceToDevice, stream_));
    sync();
  }
  template <CommScalar T>
  void reduce_scatterv(std::span<const T> in, std::span<T> out, std::span<const int> counts,
                       ReduceOp op) const {
    {
      impl::NcclGroup group;
      std::size_t offset = 0;
      for (int r = 0; r < size_; ++r) {
        RELAYOUT_NCCL_CHECK(ncclReduce(in.data() + offset, r == rank_ ? out.data() : nullptr,
                                       counts[at(r)], impl::nccl_datatype<T>(), impl::nccl_op(op), r,
                                       comm_, stream_));
        offset += static_cast<std::size_t>(counts[at(r)]);
      }
    }
    sync();
  }
  template <CommScalar T>
  void all_to_all(std::span<const T> in, std::span<T> out) const {
    const int block = static_cast<int>(in.size() / static_cast<std::size_t>(size_));
    {
      impl::NcclGroup group;
      for (int r = 0; r < size_; ++r) {
        const std::size_t off = static_cast<std::size_t>(block) * static_cast<std::size_t>(r);
        RELAYOUT_NCCL_CHECK(ncclSend(in.data() + off, block, impl::nccl_datatype<T>(), r, comm_, stream_));
        RELAYOUT_NCCL_CHECK(ncclRecv(out.data() + off, block, impl::nccl_datatype<T>(), r, comm_, stream_));
      }
    }
    sync();
  }
  // NCCL has no in-place all-to-all: stage the input in a temporary device buffer.
  template <CommScalar T>
  void all_to_all_in_place(std::span<T> buf) const {
    T* staged = nullptr;
    RELAYOUT_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&staged), buf.size_bytes(), stream_));
    RELAYOUT_CUDA_CHECK(cudaMemcpyAsync(staged, buf.data(), buf.size_bytes(), cudaMemcpyDeviceToDevice, stream_));
    all_to_all(std::span<const T>(staged, buf.size()), buf);
    RELAYOUT_CUDA_CHECK(cudaFreeAsync(staged, stream_));
    sync();
  }
  template <CommScalar T>
  void all_to_allv(std::span<const T> in, std::span<const int> send_counts,
                   std::span<const int> send_displs, std::span<T> out,
                   std::span<const int> recv_counts, std::span<const int> recv_displs) const {
    {
      impl::NcclGroup group;
      for (int r = 0; r < size_; ++r) {
        RELAYOUT_NCCL_CHECK(ncclSend(in.data() + send_displs[at(r)], send_counts[at(r)],
                                     impl::nccl_datatype<T>(), r, comm_, stream_));
        RELAYOUT_NCCL_CHECK(ncclRecv(out.data() + recv_displs[at(r)], recv_counts[at(r)],
                                     impl::nccl_datatype<T>(), r, comm_, stream_));
      }
    }
    sync();
  }
  template <CommScalar T>
  void broadcast(std::span<T> buf, int root) const {
    RELAYOUT_NCCL_CHECK(ncclBroadcast(buf.data(), buf.data(), buf.size(), impl::nccl_datatype<T>(), root,
                                      comm_, stream_));
    sync();
  }
  // NCCL has no barrier: an all-reduce of one element on the stream orders every rank.
  void barrier() const {
    int* one = nullptr;
    RELAYOUT_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&one), sizeof(int), stream_));
    RELAYOUT_CUDA_CHECK(cudaMemsetAsync(one, 0, sizeof(int), stream_));
    RELAYOUT_NCCL_CHECK(ncclAllReduce(one, one, 1, ncclInt32, ncclSum, comm_, stream_));
    RELAYOUT_CUDA_CHECK(cudaFreeAsync(one, stream_));
    sync();
  }

 private:
  explicit NcclCommunicator(ncclComm_t comm) : comm_(comm) {
    try {
      RELAYOUT_NCCL_CHECK(ncclCommCount(comm_, &size_));
      RELAYOUT_NCCL_CHECK(ncclCommUserRank(comm_, &rank_));
      RELAYOUT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    } catch (...) {
      release();
      throw;
    }
  }
  void release() noexcept {
    if (stream_) cudaStreamDestroy(stream_);
    if (comm_) ncclCommDestroy(comm_);
    stream_ = nullptr;
    comm_ = nullptr;
  }
  void sync() const { RELAYOUT_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  static std::size_t at(int r) { return static_cast<std::size_t>(r); }

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  int size_ = 1;
  int rank_ = 0;
  std::unique_ptr<MpiCommunicator> host_;  // the bootstrap's duplicate, for the agreement check
};

}  // namespace relayout

#endif  // RELAYOUT_HAVE_NCCL
