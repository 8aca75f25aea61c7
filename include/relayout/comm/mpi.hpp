// MpiCommunicator: RAII over an MPI_Comm. adopt() wraps an engine's communicator without owning it;
// dup() and split() return owning communicators that free theirs on destruction. Every MPI call is
// checked and throws CommError on failure. agree() is the collective agreement check
// (agreement.hpp) the free collectives run first.
//
// Error handlers. A communicator it owns gets MPI_ERRORS_RETURN once. An adopted one (adopt(),
// world()) is left as the engine set it: each call sets MPI_ERRORS_RETURN for its own duration and
// puts the previous handler back before returning (or throwing), so the engine's own MPI calls keep
// its handler (MPI_ERRORS_ARE_FATAL by default). The swap costs two local MPI calls per collective
// and is skipped when the handler already is MPI_ERRORS_RETURN; it means an engine must not call
// MPI on the same communicator from another thread while a relayout collective runs on it (which
// MPI forbids for collectives anyway). A private duplicate was the alternative; it would make
// adopt() collective, which an engine calling world() on some ranks only cannot afford.
//
// Deadline (agreement.hpp: on by default, RELAYOUT_COLLECTIVE_TIMEOUT=0 turns it off). With the
// agreement check on, each collective is the nonblocking call (MPI_Iallreduce, ...) tested until it
// completes or the deadline passes: a member that stopped inside the collective (after the arrival
// check) then does not hang the others; the first member whose deadline passes asks the others
// which of them are still waiting, prints the communicator, the call site and the members not
// heard from, and aborts the job (exit code 3). With the check off (a Release build's default) the
// collective stays the blocking call, at its speed, and a watch thread (impl/watchdog.hpp) aborts
// the job past the deadline naming the call site, not the member. Without a deadline: blocking.
//
// Nonblocking forms (start_all_to_all, start_all_to_allv; the free all_to_all_start and
// all_to_allv_start in all_to_all.hpp / all_to_allv.hpp): always the nonblocking MPI call, returned
// as a CollectiveRequest whose wait() tests it until it completes or the deadline passes (the same
// report and abort as above); with the deadline off it waits as long as it takes. The communicator
// must outlive its requests.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <memory>
#include <source_location>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "relayout/comm/agreement.hpp"
#include "relayout/comm/impl/mpi_agreement.hpp"
#include "relayout/comm/impl/mpi_types.hpp"
#include "relayout/comm/impl/watchdog.hpp"
#include "relayout/comm/request.hpp"
#include "relayout/comm/scalar.hpp"

// The blocking call B and its nonblocking twin NB with the same arguments, on comm_.
#define RELAYOUT_MPI_COLLECTIVE(B, NB, ...)                                                          \
  collective(#B "(" #__VA_ARGS__ ", comm_)", #NB, #NB "(" #__VA_ARGS__ ", comm_, &request)", __LINE__, \
             [&] { return B(__VA_ARGS__, comm_); },                                                  \
             [&](MPI_Request* request) { return NB(__VA_ARGS__, comm_, request); })

namespace relayout {

class MpiCommunicator {
 public:
  // Wraps `comm` without owning it; the caller keeps it alive and frees it. Local (not collective);
  // `comm`'s error handler is the caller's before and after every call (see above).
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

  // Collective agreement (agreement.hpp): the exchange with the check on; with only the deadline
  // on, the call is recorded for the watchdog (no communication); else a no-op. Making a
  // communicator is always exchanged under a deadline (rare, and the only way to name who is missing).
  void agree(const CollectiveCall& call) const {
    const AgreementSettings& s = agreement_settings();
    if (size_ == 1 || !s.active()) return;
    if (!agreement_) agreement_ = std::make_unique<impl::MpiAgreement>();
    if (!s.check && !makes_communicator(call.kind)) return agreement_->note(call);
    const ErrorsReturn scope(*this);
    agreement_->agree(comm_, rank_, size_, name(), call);
  }

  // Collective over this communicator, like the collectives: with checks or a deadline on, the
  // members first pass the arrival check (a member that never comes is named when the deadline
  // passes), then make the new communicator (dup: nonblocking, under the deadline too).
  MpiCommunicator dup(std::source_location site = std::source_location::current()) const {
    MPI_Comm out = MPI_COMM_NULL;
    {
      const ErrorsReturn scope(*this);
      agree(CollectiveCall{.kind = CollectiveKind::comm_dup, .site = site});
      const double timeout_s = agreement_settings().timeout_s;
      if (timeout_s <= 0 || size_ == 1) {
        RELAYOUT_MPI_CHECK(MPI_Comm_dup(comm_, &out));
      } else {
        MPI_Request request = MPI_REQUEST_NULL;
        RELAYOUT_MPI_CHECK(MPI_Comm_idup(comm_, &out, &request));
        bool expired = false;
        impl::mpi_check(impl::wait_one(request, timeout_s, expired), "MPI_Comm_idup(comm_, &out, &request)",
                        __FILE__, __LINE__);
        if (expired) stalled("MPI_Comm_idup", agreement_ ? agreement_->take_pending() : nullptr, timeout_s);
      }
    }
    return MpiCommunicator(out, true).with_agreement_channel();
  }
  // Collective over this communicator: ranks with the same color form one new communicator,
  // ordered by key (then by rank here). MPI has no nonblocking split: the arrival check names a
  // member that never comes, and the watch thread (impl/watchdog.hpp) ends the job when the split
  // itself outlives the deadline.
  MpiCommunicator split(int color, int key, std::source_location site = std::source_location::current()) const {
    MPI_Comm out = MPI_COMM_NULL;
    {
      const ErrorsReturn scope(*this);
      const CollectiveCall what{.kind = CollectiveKind::comm_split, .site = site};
      agree(what);
      const impl::WatchScope watch(watched_after_arrival("MPI_Comm_split", what), watch_limit());
      RELAYOUT_MPI_CHECK(MPI_Comm_split(comm_, color, key, &out));
    }
    return MpiCommunicator(out, true).with_agreement_channel();
  }
  // Collective: the members that share memory with this one (MPI_COMM_TYPE_SHARED: one host).
  MpiCommunicator split_shared(std::source_location site = std::source_location::current()) const {
    MPI_Comm out = MPI_COMM_NULL;
    {
      const ErrorsReturn scope(*this);
      const CollectiveCall what{.kind = CollectiveKind::comm_split_shared, .site = site};
      agree(what);
      const impl::WatchScope watch(watched_after_arrival("MPI_Comm_split_type", what), watch_limit());
      RELAYOUT_MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &out));
    }
    return MpiCommunicator(out, true).with_agreement_channel();
  }

  template <CommScalar T>
  void all_reduce(std::span<const T> in, std::span<T> out, ReduceOp op) const {
    RELAYOUT_MPI_COLLECTIVE(MPI_Allreduce, MPI_Iallreduce, in.data(), out.data(), count(out), type<T>(), impl::mpi_op<T>(op));
  }
  template <CommScalar T>
  void all_reduce_in_place(std::span<T> buf, ReduceOp op) const {
    RELAYOUT_MPI_COLLECTIVE(MPI_Allreduce, MPI_Iallreduce, MPI_IN_PLACE, buf.data(), count(buf), type<T>(), impl::mpi_op<T>(op));
  }
  template <CommScalar T>
  void all_gather(std::span<const T> in, std::span<T> out) const {
    RELAYOUT_MPI_COLLECTIVE(MPI_Allgather, MPI_Iallgather, in.data(), count(in), type<T>(), out.data(), count(in), type<T>());
  }
  template <CommScalar T>
  void all_gather_in_place(std::span<T> buf) const {
    const int block = static_cast<int>(buf.size() / static_cast<std::size_t>(size_));
    RELAYOUT_MPI_COLLECTIVE(MPI_Allgather, MPI_Iallgather, MPI_IN_PLACE, 0, type<T>(), buf.data(), block, type<T>());
  }
  template <CommScalar T>
  void all_gatherv(std::span<const T> in, std::span<T> out, std::span<const int> counts,
                   std::span<const int> displs) const {
    RELAYOUT_MPI_COLLECTIVE(MPI_Allgatherv, MPI_Iallgatherv, in.data(), count(in), type<T>(), out.data(), counts.data(),
                            displs.data(), type<T>());
  }
  template <CommScalar T>
  void all_gatherv_in_place(std::span<T> buf, std::span<const int> counts,
                            std::span<const int> displs) const {
    RELAYOUT_MPI_COLLECTIVE(MPI_Allgatherv, MPI_Iallgatherv, MPI_IN_PLACE, 0, type<T>(), buf.data(), counts.data(),
                            displs.data(), type<T>());
  }
  template <CommScalar T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, ReduceOp op) const {
    RELAYOUT_MPI_COLLECTIVE(MPI_Reduce_scatter_block, MPI_Ireduce_scatter_block, in.data(), out.data(), count(out),
                            type<T>(), impl::mpi_op<T>(op));
  }
  template <CommScalar T>
  void reduce_scatter_in_place(std::span<T> buf, ReduceOp op) const {
    const int block = static_cast<int>(buf.size() / static_cast<std::size_t>(size_));
    RELAYOUT_MPI_COLLECTIVE(MPI_Reduce_scatter_block, MPI_Ireduce_scatter_block, MPI_IN_PLACE, buf.data(), block,
                            type<T>(), impl::mpi_op<T>(op));
  }
  template <CommScalar T>
  void reduce_scatterv(std::span<const T> in, std::span<T> out, std::span<const int> counts,
                       ReduceOp op) const {
    RELAYOUT_MPI_COLLECTIVE(MPI_Reduce_scatter, MPI_Ireduce_scatter, in.data(), out.data(), counts.data(), type<T>(),
                            impl::mpi_op<T>(op));
  }
  template <CommScalar T>
  void all_to_all(std::span<const T> in, std::span<T> out) const {
    const int block = static_cast<int>(in.size() / static_cast<std::size_t>(size_));
    RELAYOUT_MPI_COLLECTIVE(MPI_Alltoall, MPI_Ialltoall, in.data(), block, type<T>(), out.data(), block, type<T>());
  }
  template <CommScalar T>
  void all_to_all_in_place(std::span<T> buf) const {
    const int block = static_cast<int>(buf.size() / static_cast<std::size_t>(size_));
    RELAYOUT_MPI_COLLECTIVE(MPI_Alltoall, MPI_Ialltoall, MPI_IN_PLACE, 0, type<T>(), buf.data(), block, type<T>());
  }
  template <CommScalar T>
  void all_to_allv(std::span<const T> in, std::span<const int> send_counts,
                   std::span<const int> send_displs, std::span<T> out,
                   std::span<const int> recv_counts, std::span<const int> recv_displs) const {
    RELAYOUT_MPI_COLLECTIVE(MPI_Alltoallv, MPI_Ialltoallv, in.data(), send_counts.data(), send_displs.data(), type<T>(),
                            out.data(), recv_counts.data(), recv_displs.data(), type<T>());
  }
  // The nonblocking forms: the arrays of counts and displacements, and the buffers, must stay
  // valid until the request completes (the free *_start functions see to it).
  template <CommScalar T>
  CollectiveRequest start_all_to_all(std::span<const T> in, std::span<T> out) const {
    const int block = static_cast<int>(in.size() / static_cast<std::size_t>(size_));
    return start("MPI_Ialltoall", "MPI_Ialltoall(in.data(), block, type, out.data(), block, type, comm_, &request)",
                 __LINE__, [&](MPI_Request* request) {
                   return MPI_Ialltoall(in.data(), block, type<T>(), out.data(), block, type<T>(), comm_, request);
                 });
  }
  template <CommScalar T>
  CollectiveRequest start_all_to_allv(std::span<const T> in, std::span<const int> send_counts,
                                      std::span<const int> send_displs, std::span<T> out,
                                      std::span<const int> recv_counts, std::span<const int> recv_displs) const {
    return start("MPI_Ialltoallv",
                 "MPI_Ialltoallv(in.data(), send_counts, send_displs, type, out.data(), recv_counts, recv_displs, "
                 "type, comm_, &request)",
                 __LINE__, [&](MPI_Request* request) {
                   return MPI_Ialltoallv(in.data(), send_counts.data(), send_displs.data(), type<T>(), out.data(),
                                         recv_counts.data(), recv_displs.data(), type<T>(), comm_, request);
                 });
  }
  template <CommScalar T>
  void broadcast(std::span<T> buf, int root) const {
    RELAYOUT_MPI_COLLECTIVE(MPI_Bcast, MPI_Ibcast, buf.data(), count(buf), type<T>(), root);
  }
  void barrier() const {
    collective("MPI_Barrier(comm_)", "MPI_Ibarrier", "MPI_Ibarrier(comm_, &request)", __LINE__,
               [&] { return MPI_Barrier(comm_); }, [&](MPI_Request* r) { return MPI_Ibarrier(comm_, r); });
  }

 private:
  // For one call on an adopted communicator: MPI_ERRORS_RETURN, then the caller's handler again.
  class ErrorsReturn {
   public:
    explicit ErrorsReturn(const MpiCommunicator& c) {
      if (c.owned_ || c.comm_ == MPI_COMM_NULL) return;
      RELAYOUT_MPI_CHECK(MPI_Comm_get_errhandler(c.comm_, &saved_));
      if (saved_ == MPI_ERRORS_RETURN) {
        MPI_Errhandler_free(&saved_);
        return;
      }
      comm_ = c.comm_;
      MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    }
    ErrorsReturn(const ErrorsReturn&) = delete;
    ErrorsReturn& operator=(const ErrorsReturn&) = delete;
    ~ErrorsReturn() {
      if (comm_ == MPI_COMM_NULL) return;
      MPI_Comm_set_errhandler(comm_, saved_);
      MPI_Errhandler_free(&saved_);  // drops get_errhandler's reference; comm_ keeps its own
    }

   private:
    MPI_Comm comm_ = MPI_COMM_NULL;
    MPI_Errhandler saved_ = MPI_ERRHANDLER_NULL;
  };

  MpiCommunicator(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
    try {
      if (owned_) RELAYOUT_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
      const ErrorsReturn scope(*this);
      RELAYOUT_MPI_CHECK(MPI_Comm_size(comm_, &size_));
      RELAYOUT_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    } catch (...) {
      release();
      throw;
    }
  }

  // One collective: the blocking call (no deadline; or with the check off, under the process's
  // watch), or with the check and a deadline the nonblocking one tested until it completes or the
  // deadline passes. `text`/`itext` are the calls as written, for CommError.
  template <class Blocking, class Nonblocking>
  void collective(const char* text, const char* iname, const char* itext, int line, Blocking&& blocking,
                  Nonblocking&& nonblocking) const {
    const ErrorsReturn scope(*this);
    const AgreementSettings& s = agreement_settings();
    const double timeout_s = s.timeout_s;
    const impl::Signature* call = agreement_ ? agreement_->take_pending() : nullptr;
    const std::uint64_t noted = agreement_ ? agreement_->take_noted() : 0;
    if (timeout_s <= 0 || size_ == 1) {
      impl::mpi_check(blocking(), text, __FILE__, line);
      return;
    }
    if (!s.check) {
      const impl::WatchScope watch(watched(text, noted ? &agreement_->noted() : nullptr, noted, false), timeout_s);
      impl::mpi_check(blocking(), text, __FILE__, line);
      return;
    }
    MPI_Request request = MPI_REQUEST_NULL;
    impl::mpi_check(nonblocking(&request), itext, __FILE__, line);
    bool expired = false;
    impl::mpi_check(impl::wait_one(request, timeout_s, expired), itext, __FILE__, line);
    if (expired) stalled(iname, call, timeout_s);
  }

  // One started collective: its request, tested (test) or tested until complete or past the
  // deadline (wait), with the communicator's error handler swapped as for a blocking call.
  class MpiPending final : public CollectiveRequest::Pending {
   public:
    MpiPending(const MpiCommunicator& comm, const char* iname, const char* itext, int line,
               const impl::Signature* call, const CollectiveCall* noted, std::uint64_t noted_seq)
        : comm_(comm), iname_(iname), itext_(itext), line_(line), has_call_(call != nullptr), noted_seq_(noted_seq) {
      if (call) call_ = *call;  // the agreement's record is overwritten by the next call
      if (noted_seq) {          // the check off: the call as recorded, its counts left out (not kept)
        noted_ = *noted;
        noted_.counts = noted_.send_counts = noted_.recv_counts = {};
      }
    }
    ~MpiPending() override = default;
    MPI_Request request = MPI_REQUEST_NULL;

    bool test() override {
      const ErrorsReturn scope(comm_);
      int flag = 0;
      impl::mpi_check(MPI_Test(&request, &flag, MPI_STATUS_IGNORE), itext_, __FILE__, line_);
      return flag != 0;
    }
    void wait() override {
      const ErrorsReturn scope(comm_);
      const double timeout_s = agreement_settings().timeout_s;
      bool expired = false;
      impl::mpi_check(impl::wait_one(request, impl::collective_deadline(timeout_s), expired), itext_, __FILE__, line_);
      if (!expired) return;
      if (!has_call_ && noted_seq_) call_ = impl::make_signature(noted_, noted_seq_);
      comm_.stalled(iname_, has_call_ || noted_seq_ ? &call_ : nullptr, timeout_s, has_call_);
    }

   private:
    const MpiCommunicator& comm_;
    const char* iname_;
    const char* itext_;
    int line_;
    impl::Signature call_{};
    bool has_call_;
    CollectiveCall noted_{};
    std::uint64_t noted_seq_;
  };

  template <class Nonblocking>
  CollectiveRequest start(const char* iname, const char* itext, int line, Nonblocking&& nonblocking) const {
    const ErrorsReturn scope(*this);
    const impl::Signature* call = agreement_ ? agreement_->take_pending() : nullptr;
    const std::uint64_t noted = agreement_ ? agreement_->take_noted() : 0;
    auto pending = std::make_unique<MpiPending>(*this, iname, itext, line, call,
                                                noted ? &agreement_->noted() : nullptr, noted);
    impl::mpi_check(nonblocking(&pending->request), itext, __FILE__, line);
    return CollectiveRequest(std::move(pending));
  }

  // `arrived`: the check's exchange saw every member arrive at `call` (else a member not heard
  // from may never have come).
  [[noreturn]] void stalled(const char* iname, const impl::Signature* call, double timeout_s, bool arrived = true) const {
    const impl::GroupText g = impl::MpiAgreement::group_text(comm_, name());
    std::string msg = "relayout watchdog: member " + std::to_string(rank_) + " of " +
                      g.header(static_cast<std::size_t>(size_)) + " waited " + impl::seconds_text(timeout_s) +
                      " s (RELAYOUT_COLLECTIVE_TIMEOUT) inside " + iname + " at " +
                      (call ? impl::describe(*call) : std::string("a direct MpiCommunicator call (call site unknown)"));
    std::vector<int> silent;
    std::vector<int> waiting;
    if (call && agreement_)  // live peers pass their own deadlines within moments of this one
      waiting = agreement_->ask_who_is_waiting(rank_, size_, call->seq, impl::inquiry_window(timeout_s), silent);
    if (!silent.empty() || !waiting.empty()) {
      waiting.insert(std::lower_bound(waiting.begin(), waiting.end(), rank_), rank_);
      msg += std::string(arrived ? "; every member had arrived at the call" : "") +
             "; still waiting inside it: " + g.members(waiting) +
             "; not heard from (stopped or stuck, or already past this call): " + g.members(silent);
    } else {
      msg += "; which member is holding it up is not known";
    }
    impl::abort_job(msg + ". Aborting the job.", impl::kWatchdogExitCode);
  }
  static bool makes_communicator(CollectiveKind k) {
    return k == CollectiveKind::comm_dup || k == CollectiveKind::comm_split || k == CollectiveKind::comm_split_shared;
  }
  // What the watch thread reports for a blocking call (watchdog.hpp).
  impl::WatchedCall watched(const char* mpi_call, const CollectiveCall* call, std::uint64_t seq, bool arrived) const {
    return impl::WatchedCall{call, seq, mpi_call, comm_, &name_, rank_, size_, arrived};
  }
  // A call that makes a communicator, after agree() passed its arrival check (when one ran).
  impl::WatchedCall watched_after_arrival(const char* mpi_call, const CollectiveCall& what) const {
    const impl::Signature* arrived = agreement_ ? agreement_->take_pending() : nullptr;
    return watched(mpi_call, &what, arrived ? arrived->seq : 0, arrived != nullptr);
  }
  double watch_limit() const { return size_ == 1 ? 0 : agreement_settings().timeout_s; }
  // A new communicator's members are all in the call that made it: open the agreement check's
  // channel there (an adopted one opens it at its first checked collective instead).
  MpiCommunicator&& with_agreement_channel() && {
    if (size_ > 1 && agreement_settings().active()) {
      agreement_ = std::make_unique<impl::MpiAgreement>();
      agreement_->open_now(comm_, name());
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

#undef RELAYOUT_MPI_COLLECTIVE
