// The nonblocking all-to-alls (all_to_all_start, all_to_allv_start): what arrives is what the
// test's own formula says each peer sent, two exchanges in flight at once on one communicator
// complete independently, and the checks of the blocking calls run when they start.
#include <doctest/doctest.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <relayout/comm.hpp>
#include <string>
#include <vector>

#include "mpi_world.hpp"

using namespace relayout;
using relayout::test::world;

namespace {
// What rank s sends rank d: (s + d + 1) elements (all_to_allv), valued 1000 s + 10 d + j.
int count_to(int s, int d) { return s + d + 1; }
double value_of(int s, int d, int j) { return 1000.0 * s + 10.0 * d + j; }
}  // namespace

TEST_CASE("all_to_allv_start: the rows every peer sent, two in flight at once, test() then wait()") {
  const int n = world().size(), me = world().rank();
  const Kokkos::DefaultExecutionSpace exec;
  std::vector<int> sc(static_cast<std::size_t>(n)), rc(static_cast<std::size_t>(n));
  std::vector<double> send;
  for (int d = 0; d < n; ++d) {
    sc[std::size_t(d)] = count_to(me, d);
    rc[std::size_t(d)] = count_to(d, me);
    for (int j = 0; j < count_to(me, d); ++j) send.push_back(value_of(me, d, j));
  }
  std::size_t total = 0;
  for (int c : rc) total += std::size_t(c);
  Kokkos::View<double*, Kokkos::HostSpace> send_v("send", send.size()), recv_a("a", total), recv_b("b", total);
  for (std::size_t i = 0; i < send.size(); ++i) send_v(i) = send[i];
  // Two exchanges of the same rows in flight; the second one finished first.
  CollectiveRequest a = all_to_allv_start(exec, world(), send_v, sc, recv_a, rc);
  CollectiveRequest b = all_to_allv_start(exec, world(), send_v, sc, recv_b, rc);
  b.wait();
  CHECK(b.done());
  while (!a.test()) {
  }
  CHECK(a.done());
  std::size_t at = 0;
  bool same = true;
  for (int s = 0; s < n; ++s)
    for (int j = 0; j < count_to(s, me); ++j, ++at) same = same && recv_a(at) == value_of(s, me, j) && recv_b(at) == value_of(s, me, j);
  CHECK(same);
  CHECK(at == total);
  // A request that goes out of scope in flight is completed first (its View stays alive in it).
  {
    Kokkos::View<double*, Kokkos::HostSpace> out("out", total);
    CollectiveRequest c = all_to_allv_start(exec, world(), send_v, sc, out, rc);
  }
  // A blocking collective may run while one is in flight (same order on every member).
  Kokkos::View<double*, Kokkos::HostSpace> recv_c("c", total);
  CollectiveRequest c = all_to_allv_start(exec, world(), send_v, sc, recv_c, rc);
  int one = 1, sum = 0;
  all_reduce(world(), std::span<const int>(&one, 1), std::span<int>(&sum, 1));
  CHECK(sum == n);
  c.wait();
  CHECK(recv_c(0) == value_of(0, me, 0));
}

TEST_CASE("all_to_all_start: equal blocks, from the caller's instance; one rank's communicator completes at start") {
  const int n = world().size(), me = world().rank();
  const Kokkos::DefaultExecutionSpace exec;
  Kokkos::View<int*, Kokkos::HostSpace> send("send", std::size_t(3 * n)), recv("recv", std::size_t(3 * n));
  for (int d = 0; d < n; ++d)
    for (int j = 0; j < 3; ++j) send(std::size_t(3 * d + j)) = 100 * me + 10 * d + j;
  CollectiveRequest r = all_to_all_start(exec, world(), send, recv);
  r.wait();
  bool same = true;
  for (int s = 0; s < n; ++s)
    for (int j = 0; j < 3; ++j) same = same && recv(std::size_t(3 * s + j)) == 100 * s + 10 * me + j;
  CHECK(same);
  // A backend without a nonblocking form runs the blocking call: complete when it returns.
  const SingleRankCommunicator single;
  Kokkos::View<int*, Kokkos::HostSpace> one("one", 3), back("back", 3);
  for (int j = 0; j < 3; ++j) one(std::size_t(j)) = 7 + j;
  CollectiveRequest s = all_to_all_start(exec, single, one, back);
  CHECK(s.done());
  CHECK(back(2) == 9);
  const std::vector<int> c1{3};
  CollectiveRequest sv = all_to_allv_start(exec, single, one, c1, back, c1);
  CHECK(sv.done());
}

TEST_CASE("all_to_allv_start: bad counts are refused when it starts, on every member alike") {
  const int n = world().size(), me = world().rank();
  const Kokkos::DefaultExecutionSpace exec;
  std::vector<int> counts(std::size_t(n), 1);
  std::vector<double> send(std::size_t(n), 1.0), recv(std::size_t(n), 0.0);
  // A local error: the send buffer is one element short of its counts.
  std::vector<double> short_send(std::size_t(n) - 1, 1.0);
  CHECK_THROWS_WITH_AS((void)all_to_allv_start(exec, world(), short_send, counts, recv, counts),
                       doctest::Contains("send"), LayoutError);
  if (n < 2 || !agreement_settings().check) return;
  // Member 0 sends member 1 two elements, which expects one: every member throws the pairwise verdict.
  std::vector<int> sc = counts;
  if (me == 0) sc[1] = 2;
  std::vector<double> send2(std::size_t(n + (me == 0 ? 1 : 0)), 1.0);
  std::string msg;
  try {
    CollectiveRequest r = all_to_allv_start(exec, world(), send2, sc, recv, counts);
    r.wait();
  } catch (const CollectiveMismatch& e) {
    msg = e.what();
  }
  CHECK(msg.find("all_to_allv counts disagree") != std::string::npos);
  CHECK(msg.find("member 0 sends 2 elements to member 1, which expects 1") != std::string::npos);
  barrier(world());
}
