// MpiCommunicator: RAII over an MPI_Comm. adopt() wraps an engine's communicator without owning it;
// dup() and split() return owning communicators that free theirs on destruction. Every MPI call is
// checked (MPI_ERRORS_RETURN is set on every communicator it wraps) and throws CommError on failure.
// agree() is the collective agreement check (agreement.hpp) the free collectives run first.
#pragma once

#include <mpi.h>

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "relayout/comm/agreement.hpp"
#include "relayout/comm/impl/mpi_agreement.hpp"
#include "relayout/comm/impl/mpi_types.hpp"
#include "relayout/comm/scalar.hpp"

namespace relayout {

class MpiCommunicator {
 public:
  // Wraps `comm` without owning it; the caller keeps it alive and frees it.
  static MpiCommunicator adopt(MPI_Comm comm) { return MpiCommunicator(comm, false); }
  static MpiCommunicator world() { return adopt(MPI_COMM_WORLD); }

  MpiCommunicator(MpiCommunicator&& other) noexcept
      : comm_(std::exchange(other.comm_, MPI_COMM_NULL)),
        owned_(std::exchange(other.owned_, false)), size_(other.size_), rank_(other.rank_),
        name_(std::move(other.name_)), agreement_(std::move(other.agreement_)) {}
  MpiCommunicator& operator=(MpiCommunicator&& other) noexcept {
    if (this != &other) {
      release();
      comm_ = std::exchange(other.comm_, MPI_COMM_NULL);
      owned_ = std::exchange(other.owned_, false);
      size_ = other.size_;
      rank_ = other.rank_;
      name_ = std::move(other.name_);
      agreement_ = std::move(other.agreement_);
    }
    return *this;
  }
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;
  ~MpiCommunicator() { release(); }

  MPI_Comm native() const { return comm_; }
  bool owns() const { return owned_; }
  int size() const { return size_; }
  int rank() const { return rank_; }

  // The name diagnostics use (ProcessGroups names its groups "attn_tp#5", ...). Local; MPI's own
  // name of the communicator (MPI_Comm_get_name) is used until one is set.
  void set_name(std::string_view name) { name_ = name; }
  std::string name() const {
    if (!name_.empty()) return name_;
    char buf[MPI_MAX_OBJECT_NAME] = {};
    int len = 0;
    if (comm_ != MPI_COMM_NULL && MPI_Comm_get_name(comm_, buf, &len) == MPI_SUCCESS && len > 0)
      return std::string(buf, static_cast<std::size_t>(len));
    return "unnamed";
  }

  // Collective agreement (agreement.hpp): a no-op unless checks or a deadline are on.
  void agree(const CollectiveCall& call) const {
    if (size_ == 1 || !agreement_settings().active()) return;
    if (!agreement_) agreement_ = std::make_unique<impl::MpiAgreement>();
    agreement_->agree(comm_, rank_, size_, name(), call);
  }

  MpiCommunicator dup() const {
    MPI_Comm out = MPI_COMM_NULL;
    RELAYOUT_MPI_CHECK(MPI_Comm_dup(comm_, &out));
    return MpiCommunicator(out, true).with_agreement_channel();
  }
  // Collective over this communicator: ranks with the same color form one new communicator,
  // ordered by key (then by rank here).
  MpiCommunicator split(int color, int key) const {
    MPI_Comm out = MPI_COMM_NULL;
    RELAYOUT_MPI_CHECK(MPI_Comm_split(comm_, color, key, &out));
    return MpiCommunicator(out, true).with_agreement_channel();
  }

  template <CommScalar T>
  void all_reduce(std::span<const T> in, std::span<T> out, ReduceOp op) const {
    RELAYOUT_MPI_CHECK(MPI_Allreduce(in.data(), out.data(), count(out), type<T>(), impl::mpi_op<T>(op), comm_));
  }
  template <CommScalar T>
  void all_reduce_in_place(std::span<T> buf, ReduceOp op) const {
    RELAYOUT_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf.data(), count(buf), type<T>(), impl::mpi_op<T>(op), comm_));
  }
  template <CommScalar T>
  void all_gather(std::span<const T> in, std::span<T> out) const {
    RELAYOUT_MPI_CHECK(MPI_Allgather(in.data(), count(in), type<T>(), out.data(), count(in), type<T>(), comm_));
  }
  template <CommScalar T>
  void all_gather_in_place(std::span<T> buf) const {
    const int block = static_cast<int>(buf.size() / static_cast<std::size_t>(size_));
    RELAYOUT_MPI_CHECK(MPI_Allgather(MPI_IN_PLACE, 0, type<T>(), buf.data(), block, type<T>(), comm_));
  }
  template <CommScalar T>
  void all_gatherv(std::span<const T> in, std::span<T> out, std::span<const int> counts,
                   std::span<const int> displs) const {
    RELAYOUT_MPI_CHECK(MPI_Allgatherv(in.data(), count(in), type<T>(), out.data(), counts.data(),
                                      displs.data(), type<T>(), comm_));
  }
  template <CommScalar T>
  void all_gatherv_in_place(std::span<T> buf, std::span<const int> counts,
                            std::span<const int> displs) const {
    RELAYOUT_MPI_CHECK(MPI_Allgatherv(MPI_IN_PLACE, 0, type<T>(), buf.data(), counts.data(),
                                      displs.data(), type<T>(), comm_));
  }
  template <CommScalar T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, ReduceOp op) const {
    RELAYOUT_MPI_CHECK(MPI_Reduce_scatter_block(in.data(), out.data(), count(out), type<T>(),
                                                impl::mpi_op<T>(op), comm_));
  }
  template <CommScalar T>
  void reduce_scatter_in_place(std::span<T> buf, ReduceOp op) const {
    const int block = static_cast<int>(buf.size() / static_cast<std::size_t>(size_));
    RELAYOUT_MPI_CHECK(MPI_Reduce_scatter_block(MPI_IN_PLACE, buf.data(), block, type<T>(),
                                                impl::mpi_op<T>(op), comm_));
  }
  template <CommScalar T>
  void reduce_scatterv(std::span<const T> in, std::span<T> out, std::span<const int> counts,
                       ReduceOp op) const {
    RELAYOUT_MPI_CHECK(MPI_Reduce_scatter(in.data(), out.data(), counts.data(), type<T>(),
                                          impl::mpi_op<T>(op), comm_));
  }
  template <CommScalar T>
  void all_to_all(std::span<const T> in, std::span<T> out) const {
    const int block = static_cast<int>(in.size() / static_cast<std::size_t>(size_));
    RELAYOUT_MPI_CHECK(MPI_Alltoall(in.data(), block, type<T>(), out.data(), block, type<T>(), comm_));
  }
  template <CommScalar T>
  void all_to_all_in_place(std::span<T> buf) const {
    const int block = static_cast<int>(buf.size() / static_cast<std::size_t>(size_));
    RELAYOUT_MPI_CHECK(MPI_Alltoall(MPI_IN_PLACE, 0, type<T>(), buf.data(), block, type<T>(), comm_));
  }
  template <CommScalar T>
  void all_to_allv(std::span<const T> in, std::span<const int> send_counts,
                   std::span<const int> send_displs, std::span<T> out,
                   std::span<const int> recv_counts, std::span<const int> recv_displs) const {
    RELAYOUT_MPI_CHECK(MPI_Alltoallv(in.data(), send_counts.data(), send_displs.data(), type<T>(),
                                     out.data(), recv_counts.data(), recv_displs.data(), type<T>(),
                                     comm_));
  }
  template <CommScalar T>
  void broadcast(std::span<T> buf, int root) const {
    RELAYOUT_MPI_CHECK(MPI_Bcast(buf.data(), count(buf), type<T>(), root, comm_));
  }
  void barrier() const { RELAYOUT_MPI_CHECK(MPI_Barrier(comm_)); }

 private:
  MpiCommunicator(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
    try {
      RELAYOUT_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
      RELAYOUT_MPI_CHECK(MPI_Comm_size(comm_, &size_));
      RELAYOUT_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    } catch (...) {
      release();
      throw;
    }
  }
  // A new communicator's members are all in the call that made it: open the agreement check's
  // channel there (an adopted one opens it at its first checked collective instead).
  MpiCommunicator&& with_agreement_channel() && {
    if (size_ > 1 && agreement_settings().active()) {
      agreement_ = std::make_unique<impl::MpiAgreement>();
      agreement_->open_now(comm_);
    }
    return std::move(*this);
  }
  void release() noexcept {
    agreement_.reset();  // its duplicate goes before the communicator it copies
    int finalized = 0;
    if (owned_ && comm_ != MPI_COMM_NULL && MPI_Finalized(&finalized) == MPI_SUCCESS && !finalized)
      MPI_Comm_free(&comm_);
    comm_ = MPI_COMM_NULL;
    owned_ = false;
  }
  template <class T>
  static MPI_Datatype type() {
    return impl::mpi_datatype<T>();
  }
  template <class T>
  static int count(std::span<T> s) {
    return static_cast<int>(s.size());
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  bool owned_ = false;
  int size_ = 1;
  int rank_ = 0;
  std::string name_;
  mutable std::unique_ptr<impl::MpiAgreement> agreement_;
};

}  // namespace relayout
