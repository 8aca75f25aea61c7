// Every collective on every element type over MPI_COMM_WORLD, with expected values written out
// from the rank formulas (never taken from the code under test); uneven and zero counts; size
// errors thrown on every rank before any MPI call; MPI failures reported with the call.
#include <doctest/doctest.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <chrono>
#include <numeric>
#include <thread>
#include <relayout/comm.hpp>
#include <string>
#include <vector>

#include "mpi_world.hpp"

using namespace relayout;

namespace {

template <class T>
T make(double x) {
  if constexpr (Half16<T>) return T(static_cast<float>(x));
  else return static_cast<T>(x);
}
template <class T>
double value(T x) {
  if constexpr (Half16<T>) return static_cast<double>(static_cast<float>(x));
  else return static_cast<double>(x);
}
template <class T>
std::vector<double> values(const std::vector<T>& v) {
  std::vector<double> out;
  for (const T& x : v) out.push_back(value(x));
  return out;
}

// Owned by the shared test main, which frees it before MPI_Finalize.
using relayout::test::world;

// All values below are small integers or quarters, exact in every element type (even bf16).
#define ELEMENT_TYPES float, double, std::int32_t, std::int64_t, relayout::bf16, relayout::fp16

}  // namespace

TEST_CASE_TEMPLATE("mpi: all_reduce sum/max and in place", T, ELEMENT_TYPES) {
  const auto& w = world();
  const int n = w.size(), r = w.rank();
  std::vector<T> send{make<T>(r + 1), make<T>(2 * r), make<T>(-r)}, recv(3);
  all_reduce(w, send, recv);
  CHECK(values(recv) == std::vector<double>{n * (n + 1) / 2.0, n * (n - 1.0), -n * (n - 1) / 2.0});
  all_reduce(w, send, recv, ReduceOp::max);
  CHECK(values(recv) == std::vector<double>{double(n), 2.0 * (n - 1), 0.0});
  all_reduce(w, send, recv, ReduceOp::min);
  CHECK(values(recv) == std::vector<double>{1.0, 0.0, -(n - 1.0)});
  all_reduce_in_place(w, send);
  CHECK(values(send) == std::vector<double>{n * (n + 1) / 2.0, n * (n - 1.0), -n * (n - 1) / 2.0});
}

TEST_CASE_TEMPLATE("mpi: all_gather and all_gatherv with uneven and zero counts", T, ELEMENT_TYPES) {
  const auto& w = world();
  const int n = w.size(), r = w.rank();
  std::vector<T> send{make<T>(10 * r), make<T>(10 * r + 1)};
  std::vector<T> recv(2 * static_cast<std::size_t>(n));
  all_gather(w, send, recv);
  std::vector<double> expect;
  for (int i = 0; i < n; ++i) expect.insert(expect.end(), {10.0 * i, 10.0 * i + 1});
  CHECK(values(recv) == expect);

  std::vector<T> inplace(2 * static_cast<std::size_t>(n), make<T>(-1));
  inplace[2 * r] = make<T>(10 * r);
  inplace[2 * r + 1] = make<T>(10 * r + 1);
  all_gather_in_place(w, inplace);
  CHECK(values(inplace) == expect);

  // rank i contributes i % 3 elements (rank 0 none) with values 10 i + j.
  std::vector<std::int64_t> counts;
  std::vector<double> expect_v;
  for (int i = 0; i < n; ++i) {
    counts.push_back(i % 3);
    for (int j = 0; j < i % 3; ++j) expect_v.push_back(10.0 * i + j);
  }
  std::vector<T> mine;
  for (int j = 0; j < r % 3; ++j) mine.push_back(make<T>(10 * r + j));
  std::vector<T> gathered(expect_v.size());
  all_gatherv(w, mine, gathered, counts);
  CHECK(values(gathered) == expect_v);

  std::vector<T> gathered_in_place(expect_v.size(), make<T>(-1));
  const auto offset = std::accumulate(counts.begin(), counts.begin() + r, std::int64_t{0});
  std::copy(mine.begin(), mine.end(), gathered_in_place.begin() + offset);
  all_gatherv_in_place(w, gathered_in_place, counts);
  CHECK(values(gathered_in_place) == expect_v);
}

TEST_CASE_TEMPLATE("mpi: reduce_scatter and reduce_scatterv with zero counts", T, ELEMENT_TYPES) {
  const auto& w = world();
  const int n = w.size(), r = w.rank();
  // send[k] = k + rank: the sum over ranks of element k is n*k + n(n-1)/2.
  const auto sum_at = [n](int k) { return n * double(k) + n * (n - 1) / 2.0; };
  std::vector<T> send(2 * static_cast<std::size_t>(n));
  for (int k = 0; k < 2 * n; ++k) send[static_cast<std::size_t>(k)] = make<T>(k + r);
  std::vector<T> recv(2);
  reduce_scatter(w, send, recv);
  CHECK(values(recv) == std::vector<double>{sum_at(2 * r), sum_at(2 * r + 1)});

  std::vector<T> inplace = send;
  reduce_scatter_in_place(w, inplace);
  CHECK(value(inplace[0]) == sum_at(2 * r));
  CHECK(value(inplace[1]) == sum_at(2 * r + 1));

  // rank i keeps (i + 1) % 3 elements; the last rank of an np=2 run keeps 2, rank 2 keeps none.
  std::vector<int> counts;
  for (int i = 0; i < n; ++i) counts.push_back((i + 1) % 3);
  const int total = std::accumulate(counts.begin(), counts.end(), 0);
  const int offset = std::accumulate(counts.begin(), counts.begin() + r, 0);
  std::vector<T> vsend(static_cast<std::size_t>(total));
  for (int k = 0; k < total; ++k) vsend[static_cast<std::size_t>(k)] = make<T>(k + r);
  std::vector<T> vrecv(static_cast<std::size_t>(counts[static_cast<std::size_t>(r)]));
  reduce_scatterv(w, vsend, vrecv, counts);
  std::vector<double> expect;
  for (int k = offset; k < offset + counts[static_cast<std::size_t>(r)]; ++k) expect.push_back(sum_at(k));
  CHECK(values(vrecv) == expect);
}

TEST_CASE_TEMPLATE("mpi: all_to_all, all_to_allv and broadcast from a group-local root", T, ELEMENT_TYPES) {
  const auto& w = world();
  const int n = w.size(), r = w.rank();
  // Block j of rank i holds 10*i + j; after the exchange block i of rank j holds 10*i + j.
  std::vector<T> send, recv(static_cast<std::size_t>(n));
  for (int j = 0; j < n; ++j) send.push_back(make<T>(10 * r + j));
  all_to_all(w, send, recv);
  std::vector<double> expect;
  for (int i = 0; i < n; ++i) expect.push_back(10.0 * i + r);
  CHECK(values(recv) == expect);
  all_to_all_in_place(w, send);
  CHECK(values(send) == expect);

  // Rank i sends (i + j) % 2 copies of 10*i + j to rank j.
  std::vector<int> sc, rc;
  std::vector<T> vsend;
  std::vector<double> vexpect;
  for (int j = 0; j < n; ++j) {
    sc.push_back((r + j) % 2);
    rc.push_back((j + r) % 2);
    for (int c = 0; c < (r + j) % 2; ++c) vsend.push_back(make<T>(10 * r + j));
    for (int c = 0; c < (j + r) % 2; ++c) vexpect.push_back(10.0 * j + r);
  }
  std::vector<T> vrecv(vexpect.size());
  all_to_allv(w, vsend, sc, vrecv, rc);
  CHECK(values(vrecv) == vexpect);

  std::vector<T> b(3, make<T>(r));
  broadcast(w, b, n - 1);
  CHECK(values(b) == std::vector<double>(3, n - 1.0));
}

TEST_CASE_TEMPLATE("mpi: a 16-bit float sum is a float sum, not a sum of bit patterns", H,
                   relayout::bf16, relayout::fp16) {
  const auto& w = world();
  const int n = w.size(), r = w.rank();
  // (r + 1) / 4 and 1.5 are exact in both formats, and so is every partial sum.
  std::vector<H> send{H((r + 1) * 0.25f), H(1.5f)}, recv(2);
  all_reduce(w, send, recv);
  CHECK(static_cast<float>(recv[0]) == n * (n + 1) / 8.0f);
  CHECK(static_cast<float>(recv[1]) == 1.5f * n);
  if (n > 1) {  // adding the raw 16-bit patterns would give something else entirely
    std::uint32_t bit_sum = 0;
    for (int i = 0; i < n; ++i) bit_sum += H(1.5f).bits;
    CHECK(recv[1].bits != static_cast<std::uint16_t>(bit_sum));
  }
}

TEST_CASE("mpi: contiguous Kokkos Views are buffers; strided views are refused") {
  const auto& w = world();
  const int n = w.size(), r = w.rank();
  Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::HostSpace> rows("rows", 2, 3);
  Kokkos::deep_copy(rows, float(r + 1));
  Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::HostSpace> sum("sum", 2, 3);
  all_reduce(w, rows, sum);
  CHECK(sum(1, 2) == n * (n + 1) / 2.0f);
  Kokkos::View<const float**, Kokkos::LayoutRight, Kokkos::HostSpace> readonly = rows;
  Kokkos::View<float*, Kokkos::HostSpace> all("all", 6 * static_cast<std::size_t>(n));
  all_gather(w, readonly, all);
  for (int i = 0; i < n; ++i) CHECK(all(6 * i + 5) == float(i + 1));
  auto column = Kokkos::subview(rows, Kokkos::ALL, 1);  // stride 3: not contiguous
  Kokkos::View<float*, Kokkos::HostSpace> out("out", 2);
  CHECK_THROWS_WITH_AS(all_reduce(w, column, out), doctest::Contains("non-contiguous"), LayoutError);
}

TEST_CASE("mpi: size and count mismatches throw on every rank before any MPI call") {
  const auto& w = world();
  const int n = w.size();
  std::vector<float> send(4), small(3), big(4 * static_cast<std::size_t>(n) + 1);
  const std::string nstr = std::to_string(n);
  // Every rank passes the same bad arguments: each throws its own error, naming this line.
  const auto reduce = [&] { all_reduce(w, send, small); }; const int reduce_line = __LINE__;
  CHECK_THROWS_WITH_AS(reduce(), ("recv has 3 elements but must have 4 (all_reduce: recv.size() == send.size()); "
                                  "all_reduce called at comm/test_collectives_mpi.cpp:" + std::to_string(reduce_line)).c_str(),
                       LayoutError);
  CHECK_THROWS_WITH_AS(all_gather(w, send, big),
                       doctest::Contains(("recv has " + std::to_string(4 * n + 1) + " elements but must have " +
                                          std::to_string(4 * n)).c_str()), LayoutError);
  CHECK_THROWS_WITH_AS(all_gatherv(w, send, big, std::vector<int>(static_cast<std::size_t>(n) + 1, 4)),
                       doctest::Contains(("counts has " + std::to_string(n + 1) + " entries but the group has " + nstr).c_str()),
                       LayoutError);
  CHECK_THROWS_WITH_AS(all_gatherv(w, send, big, std::vector<int>(static_cast<std::size_t>(n), 4)),
                       doctest::Contains("all_gatherv: recv.size() == sum(counts)"), LayoutError);
  CHECK_THROWS_WITH_AS(all_gatherv(w, send, big, std::vector<int>(static_cast<std::size_t>(n), -1)),
                       doctest::Contains("counts[0] = -1"), LayoutError);
  CHECK_THROWS_WITH_AS(reduce_scatterv(w, send, small, std::vector<int>(static_cast<std::size_t>(n), 1)),
                       doctest::Contains("reduce_scatterv"), LayoutError);
  CHECK_THROWS_AS(reduce_scatter(w, small, send), LayoutError);
  CHECK_THROWS_AS(all_to_all(w, send, small), LayoutError);
  CHECK_THROWS_AS(all_to_allv(w, send, std::vector<int>(static_cast<std::size_t>(n), 0), small,
                              std::vector<int>(static_cast<std::size_t>(n), 0)), LayoutError);
  CHECK_THROWS_WITH_AS(broadcast(w, send, n), doctest::Contains(("broadcast root " + nstr).c_str()), LayoutError);
  CHECK_THROWS_WITH_AS(all_reduce(w, std::span<const float>(send), std::span<float>(send)),
                       doctest::Contains("overlap; use all_reduce_in_place"), LayoutError);
  // Nobody entered a collective, so the ranks are still in step.
  std::vector<int> one{1}, total(1);
  all_reduce(w, one, total);
  CHECK(total[0] == n);
}

TEST_CASE("mpi: an MPI failure throws CommError naming the call, file and line") {
  const auto& w = world();
  std::vector<float> buf(2);
  // The member is the unchecked primitive: a bad root reaches MPI_Bcast, which returns an error.
  // With the check and a deadline (ctest sets both) the call is the nonblocking MPI_Ibcast (comm/mpi.hpp).
  const AgreementSettings& s = agreement_settings();
  const std::string call = s.check && s.timeout_s > 0 && w.size() > 1 ? "MPI_Ibcast(" : "MPI_Bcast(";
  try {
    w.broadcast(std::span<float>(buf), -7);
    FAIL("MPI_Bcast accepted root -7");
  } catch (const CommError& e) {
    CHECK(std::string(e.what()).find(call) != std::string::npos);
    CHECK(std::string(e.what()).find("mpi.hpp:") != std::string::npos);
    CHECK(e.call().find(call) == 0);
  }
}

namespace {

int custom_handler_calls = 0;
void count_errors(MPI_Comm*, int*, ...) { ++custom_handler_calls; }

// The handle of c's error handler (get_errhandler's extra reference is dropped; c keeps its own).
MPI_Errhandler handler_of(MPI_Comm c) {
  MPI_Errhandler h = MPI_ERRHANDLER_NULL;
  REQUIRE(MPI_Comm_get_errhandler(c, &h) == MPI_SUCCESS);
  const MPI_Errhandler handle = h;
  MPI_Errhandler_free(&h);
  return handle;
}

// Every collective of an adopted communicator, once.
void use_every_collective(const MpiCommunicator& c) {
  const auto n = static_cast<std::size_t>(c.size());
  std::vector<float> one{1.0f}, out(1), many(n, 1.0f), gathered(n);
  std::vector<int> ones(n, 1);
  const float fn = static_cast<float>(n);
  all_reduce(c, one, out);
  CHECK(out[0] == fn);
  all_reduce_in_place(c, out);
  CHECK(out[0] == fn * fn);
  all_gather(c, one, gathered);
  all_gatherv(c, one, gathered, ones);
  CHECK(gathered == many);
  reduce_scatter(c, many, out);
  CHECK(out[0] == fn);
  reduce_scatterv(c, many, out, ones);
  all_to_all(c, many, gathered);
  all_to_allv(c, many, ones, gathered, ones);
  CHECK(gathered == many);
  out[0] = static_cast<float>(c.rank());
  broadcast(c, out, 0);
  CHECK(out[0] == 0.0f);
  barrier(c);
}

}  // namespace

namespace {

// A Serial instance that counts its fences (Serial's own fence has nothing to wait for).
struct CountingSerial : Kokkos::Serial {
  static inline int fences = 0;
  void fence() const { ++fences; }
};

}  // namespace

TEST_CASE("mpi: every collective on an execution-space instance fences it once, and agrees with the plain form") {
  const auto& w = world();
  const int n = w.size(), r = w.rank();
  const auto un = static_cast<std::size_t>(n);
  const CountingSerial space;
  CountingSerial::fences = 0;
  Kokkos::View<double*> mine("mine", 2), all("all", 2 * un), one("one", 2);
  mine(0) = r;
  mine(1) = 10.0 * r;
  all_reduce(space, w, mine, one);
  CHECK(one(0) == n * (n - 1) / 2.0);
  CHECK(one(1) == 10.0 * n * (n - 1) / 2.0);
  all_reduce_in_place(space, w, one, ReduceOp::max);
  all_gather(space, w, mine, all);
  for (int i = 0; i < n; ++i) CHECK(all(2 * static_cast<std::size_t>(i) + 1) == 10.0 * i);
  all_gather_in_place(space, w, all);
  const std::vector<int> twos(un, 2);
  all_gatherv(space, w, mine, all, twos);
  all_gatherv_in_place(space, w, all, twos);
  Kokkos::deep_copy(all, 1.0);
  reduce_scatter(space, w, all, one);
  CHECK(one(1) == double(n));
  reduce_scatterv(space, w, all, one, twos);
  reduce_scatter_in_place(space, w, all);
  CHECK(all(0) == double(n));
  Kokkos::View<double*> blocks("blocks", 2 * un), got("got", 2 * un);
  for (std::size_t j = 0; j < 2 * un; ++j) blocks(j) = 100.0 * r + double(j / 2);  // block j for rank j
  all_to_all(space, w, blocks, got);
  for (int i = 0; i < n; ++i) CHECK(got(2 * static_cast<std::size_t>(i)) == 100.0 * i + r);
  all_to_allv(space, w, blocks, twos, got, twos);
  all_to_all_in_place(space, w, blocks);
  CHECK(blocks(0) == double(r));  // block 0 of rank 0 is 100 * 0 + r
  one(0) = r;
  broadcast(space, w, one, n - 1);
  CHECK(one(0) == n - 1.0);
  barrier(space, w);
  CHECK(CountingSerial::fences == 14);
  all_reduce(w, mine, one);  // without an instance: nothing of the caller's is fenced
  CHECK(CountingSerial::fences == 14);
}

TEST_CASE("mpi: adopt leaves the communicator's error handler as it found it") {
  MPI_Comm fatal = MPI_COMM_NULL, custom = MPI_COMM_NULL;
  REQUIRE(MPI_Comm_dup(MPI_COMM_WORLD, &fatal) == MPI_SUCCESS);
  REQUIRE(MPI_Comm_dup(MPI_COMM_WORLD, &custom) == MPI_SUCCESS);
  REQUIRE(MPI_Comm_set_errhandler(fatal, MPI_ERRORS_ARE_FATAL) == MPI_SUCCESS);
  MPI_Errhandler counting = MPI_ERRHANDLER_NULL;
  REQUIRE(MPI_Comm_create_errhandler(count_errors, &counting) == MPI_SUCCESS);
  REQUIRE(MPI_Comm_set_errhandler(custom, counting) == MPI_SUCCESS);
  const MPI_Errhandler world_before = handler_of(MPI_COMM_WORLD);
  custom_handler_calls = 0;
  {
    const MpiCommunicator a = MpiCommunicator::adopt(fatal);
    const MpiCommunicator b = MpiCommunicator::adopt(custom);
    const MpiCommunicator w = MpiCommunicator::world();
    CHECK(handler_of(fatal) == MPI_ERRORS_ARE_FATAL);  // adopting changes nothing
    CHECK(handler_of(custom) == counting);
    use_every_collective(a);
    use_every_collective(b);
    use_every_collective(w);
    MpiCommunicator d = b.dup();  // an owned copy: relayout's own handler, the original untouched
    use_every_collective(d);
    // Between calls the engine's handlers are in force, while the wrappers live.
    CHECK(handler_of(fatal) == MPI_ERRORS_ARE_FATAL);
    CHECK(handler_of(custom) == counting);
    CHECK(handler_of(MPI_COMM_WORLD) == world_before);
    // An MPI error inside a relayout call comes back as CommError, not through the engine's handler...
    std::vector<float> buf(1);
    CHECK_THROWS_AS(b.broadcast(std::span<float>(buf), -7), CommError);
    CHECK(custom_handler_calls == 0);
    CHECK(handler_of(custom) == counting);
    // ...and the engine's own failing call still reaches its handler.
    CHECK(MPI_Bcast(buf.data(), 1, MPI_FLOAT, -7, custom) != MPI_SUCCESS);
    CHECK(custom_handler_calls == 1);
  }
  CHECK(handler_of(fatal) == MPI_ERRORS_ARE_FATAL);
  CHECK(handler_of(custom) == counting);
  CHECK(handler_of(MPI_COMM_WORLD) == world_before);
  MPI_Errhandler_free(&counting);
  MPI_Comm_free(&fatal);
  MPI_Comm_free(&custom);
}

TEST_CASE("mpi: adopt does not own, dup and split do; communicators are move-only") {
  static_assert(!std::is_copy_constructible_v<MpiCommunicator>);
  static_assert(std::is_nothrow_move_constructible_v<MpiCommunicator>);
  const int n = world().size(), r = world().rank();
  {
    MpiCommunicator adopted = MpiCommunicator::adopt(MPI_COMM_WORLD);
    CHECK_FALSE(adopted.owns());
    CHECK(adopted.native() == MPI_COMM_WORLD);
  }
  int still = 0;
  CHECK(MPI_Comm_size(MPI_COMM_WORLD, &still) == MPI_SUCCESS);  // not freed by the wrapper
  MpiCommunicator d = world().dup();
  CHECK(d.owns());
  int cmp = 0;
  MPI_Comm_compare(d.native(), MPI_COMM_WORLD, &cmp);
  CHECK(cmp == MPI_CONGRUENT);
  MpiCommunicator halves = d.split(r % 2, -r);  // reversed order inside each half
  CHECK(halves.size() == (r % 2 == 0 ? (n + 1) / 2 : n / 2));
  CHECK(halves.rank() == halves.size() - 1 - r / 2);
  MpiCommunicator moved = std::move(halves);
  CHECK(moved.owns());
  CHECK_FALSE(halves.owns());
  std::vector<int> me{r}, members(static_cast<std::size_t>(moved.size()));
  all_gather(moved, me, members);
  for (std::size_t i = 0; i + 1 < members.size(); ++i) CHECK(members[i] == members[i + 1] + 2);
  barrier(moved);
}

TEST_CASE("mpi: split_shared groups the ranks of one host; making a communicator passes the arrival check") {
  const int n = world().size();
  // Every rank of these tests runs on this one host: the shared-memory split holds all of them, in order.
  const MpiCommunicator host = world().split_shared();
  CHECK(host.owns());
  CHECK(host.size() == n);
  CHECK(host.rank() == world().rank());
  // A split from two different lines on different members is a mismatch, not a hang (making a
  // communicator is checked whenever the check or the deadline is on).
  if (n > 1 && agreement_settings().active()) {
    MpiCommunicator d = world().dup();
    d.set_name("making");
    std::string msg;
    try {
      if (d.rank() == 0)
        (void)d.split(0, 0);
      else
        (void)d.split(0, 0);
    } catch (const CollectiveMismatch& e) {
      msg = e.what();
    }
    CHECK(msg.find("collective mismatch on communicator \"making\"") != std::string::npos);
    CHECK(msg.find("comm_split() at comm/test_collectives_mpi.cpp:") != std::string::npos);
    barrier(d);  // still usable
  }
}

// collective_seconds(): the time inside the collectives, waits for the other members included;
// nothing while a rank computes on its own.
TEST_CASE("mpi: collective_seconds counts the waits inside a collective and nothing outside one") {
  const MpiCommunicator& w = world();
  barrier(w);
  const double before_local = collective_seconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(30));  // local work: not counted
  CHECK(collective_seconds() == before_local);
  // Rank 0 arrives 200 ms late: every other rank waits inside the barrier for most of that (the
  // margin covers ranks leaving the first barrier late on an oversubscribed machine).
  if (w.rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const double c0 = collective_seconds();
  barrier(w);
  const double waited = collective_seconds() - c0;
  if (w.rank() != 0) CHECK(waited >= 0.05);
}
