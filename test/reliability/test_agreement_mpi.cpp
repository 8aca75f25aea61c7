// The collective agreement check (comm/agreement.hpp) on real ranks: deliberate mismatches in
// operation, count, element type, root, counts, pairwise all_to_allv counts, call site and one
// member's own arguments. Each must throw CollectiveMismatch on every member with the same message,
// naming the call sites and the members that differ, and leave the communicator usable.
#include <doctest/doctest.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cstdlib>
#include <relayout/comm.hpp>
#include <relayout/placement.hpp>
#include <string>
#include <vector>

#include "tolerance.hpp"

using relayout::test::within_abs;
using relayout::test::within_rel;

using namespace relayout;

namespace {

MpiCommunicator fresh(const char* name) {
  MpiCommunicator c = MpiCommunicator::world().dup();
  c.set_name(name);
  return c;
}

std::string members_text(int first, int last) {
  std::string s = "members [";
  for (int r = first; r <= last; ++r) {
    if (r > first) s += ' ';
    s += std::to_string(r);
  }
  return s + "]";
}

std::string site(int line) { return "reliability/test_agreement_mpi.cpp:" + std::to_string(line); }

// Every member gathers every member's message: they must all be the same text.
bool same_on_every_member(const MpiCommunicator& c, const std::string& msg) {
  int len = static_cast<int>(msg.size()), max_len = 0;
  MPI_Allreduce(&len, &max_len, 1, MPI_INT, MPI_MAX, c.native());
  std::vector<char> mine(static_cast<std::size_t>(max_len), '\0'), all(mine.size() * static_cast<std::size_t>(c.size()));
  std::copy(msg.begin(), msg.end(), mine.begin());
  MPI_Allgather(mine.data(), max_len, MPI_CHAR, all.data(), max_len, MPI_CHAR, c.native());
  for (int r = 0; r < c.size(); ++r)
    if (!std::equal(mine.begin(), mine.end(), all.begin() + static_cast<std::ptrdiff_t>(r) * max_len)) return false;
  return true;
}

// Runs f (which must throw CollectiveMismatch on this member) and returns its message.
template <class F>
std::string mismatch_message(F&& f) {
  try {
    f();
  } catch (const CollectiveMismatch& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL("expected CollectiveMismatch, got: " << e.what());
  }
  FAIL("expected CollectiveMismatch, nothing was thrown");
  return {};
}

// After a mismatch the members are still in step: a correct call works.
void still_usable(const MpiCommunicator& c) {
  std::vector<std::int64_t> v{c.rank() + 1};
  all_reduce_in_place(c, v);
  const std::int64_t n = c.size();
  CHECK(v[0] == n * (n + 1) / 2);
}

}  // namespace

TEST_CASE("agreement: the check is on in test builds") {
  CHECK(agreement_settings().check);
  const char* t = std::getenv("RELAYOUT_COLLECTIVE_TIMEOUT");
  if (t) CHECK(agreement_settings().timeout_s == within_rel(std::atof(t), 1e-9));
}

TEST_CASE("agreement: different operations name both call sites and the members making each") {
  MpiCommunicator c = fresh("ops");
  if (c.size() < 2) return;
  const int last = c.size() - 1;
  std::vector<float> send(4, 1.0f), recv(4 * static_cast<std::size_t>(c.size()));
  const int reduce_line = __LINE__ + 3, gather_line = __LINE__ + 5;
  const std::string msg = mismatch_message([&] {
    if (c.rank() != last)
      all_reduce(c, std::span<const float>(send), std::span<float>(recv.data(), 4));
    else
      all_gather(c, std::span<const float>(send), std::span<float>(recv));
  });
  INFO(msg);
  CHECK(msg.find("collective mismatch on communicator \"ops\" (" + std::to_string(c.size()) + " members)") != std::string::npos);
  CHECK(msg.find(members_text(0, last - 1) + " (world " ) != std::string::npos);
  CHECK(msg.find(": all_reduce(float, 4 elements, sum) at " + site(reduce_line)) != std::string::npos);
  CHECK(msg.find(members_text(last, last) + " (world [" + std::to_string(last) + "]): all_gather(float, 4 elements) at " +
                 site(gather_line)) != std::string::npos);
  CHECK(same_on_every_member(c, msg));
  still_usable(c);
}

TEST_CASE("agreement: the forms on an execution-space instance name the caller's line too") {
  MpiCommunicator c = fresh("instance");
  if (c.size() < 2) return;
  const int last = c.size() - 1;
  const Kokkos::DefaultExecutionSpace space;
  Kokkos::View<float*> send("send", 2), recv("recv", 2 * static_cast<std::size_t>(c.size()));
  const int reduce_line = __LINE__ + 3, gather_line = __LINE__ + 5;
  const std::string msg = mismatch_message([&] {
    if (c.rank() != last)
      all_reduce(space, c, send, Kokkos::subview(recv, std::make_pair(0, 2)));
    else
      all_gather(space, c, send, recv);
  });
  INFO(msg);
  CHECK(msg.find(": all_reduce(float, 2 elements, sum) at " + site(reduce_line)) != std::string::npos);
  CHECK(msg.find(members_text(last, last) + " (world [" + std::to_string(last) + "]): all_gather(float, 2 elements) at " +
                 site(gather_line)) != std::string::npos);
  CHECK(same_on_every_member(c, msg));
  still_usable(c);
}

TEST_CASE("agreement: a different element count on one member") {
  MpiCommunicator c = fresh("count");
  if (c.size() < 2) return;
  const std::size_t n = c.rank() == 1 ? 3 : 5;
  std::vector<std::int32_t> buf(n, 1);
  const std::string msg = mismatch_message([&] { all_reduce_in_place(c, buf); });
  INFO(msg);
  CHECK(msg.find("members [1] (world [1]): all_reduce_in_place(int32, 3 elements, sum)") != std::string::npos);
  CHECK(msg.find("all_reduce_in_place(int32, 5 elements, sum)") != std::string::npos);
  CHECK(same_on_every_member(c, msg));
  still_usable(c);
}

TEST_CASE("agreement: a different element type from the same line") {
  MpiCommunicator c = fresh("dtype");
  if (c.size() < 2) return;
  std::vector<float> f(6, 1.0f);
  std::vector<double> d(6, 1.0);
  const int line = __LINE__ + 1;
  auto reduce = [&](auto& buf) { all_reduce_in_place(c, buf, ReduceOp::max); };
  const std::string msg = mismatch_message([&] {
    if (c.rank() == 0) reduce(d);
    else reduce(f);
  });
  INFO(msg);
  CHECK(msg.find("members [0] (world [0]): all_reduce_in_place(double, 6 elements, max) at " + site(line)) != std::string::npos);
  CHECK(msg.find(members_text(1, c.size() - 1) + " (world") != std::string::npos);
  CHECK(msg.find("all_reduce_in_place(float, 6 elements, max) at " + site(line)) != std::string::npos);
  still_usable(c);
}

TEST_CASE("agreement: broadcast roots that differ") {
  MpiCommunicator c = fresh("root");
  if (c.size() < 2) return;
  std::vector<float> buf(2, float(c.rank()));
  const int root = c.rank() == 0 ? 1 : 0;
  const std::string msg = mismatch_message([&] { broadcast(c, buf, root); });
  INFO(msg);
  CHECK(msg.find("members [0] (world [0]): broadcast(float, 2 elements, root 1)") != std::string::npos);
  CHECK(msg.find("broadcast(float, 2 elements, root 0)") != std::string::npos);
  CHECK(buf[0] == float(c.rank()));  // nothing was written
  still_usable(c);
}

TEST_CASE("agreement: all_gatherv counts that differ, each consistent with its own buffers") {
  MpiCommunicator c = fresh("gatherv");
  if (c.size() < 2) return;
  // Member 0 believes member 1 sends 3; member 1 sends 2. Unchecked, MPI would read past member 1's
  // message or leave rows unwritten.
  std::vector<int> counts(static_cast<std::size_t>(c.size()), 2);
  if (c.rank() == 0) counts[1] = 3;
  int total = 0;
  for (int k : counts) total += k;
  std::vector<float> send(static_cast<std::size_t>(counts[static_cast<std::size_t>(c.rank())]), 1.0f);
  std::vector<float> recv(static_cast<std::size_t>(total), -1.0f);
  const std::string msg = mismatch_message([&] { all_gatherv(c, send, recv, counts); });
  INFO(msg);
  CHECK(msg.find("members [0] (world [0]): all_gatherv(float, counts [2 3") != std::string::npos);
  CHECK(msg.find(members_text(1, c.size() - 1) + " (world") != std::string::npos);
  CHECK(msg.find("all_gatherv(float, counts [2 2") != std::string::npos);
  for (float x : recv) CHECK(x == -1.0f);
  still_usable(c);
}

TEST_CASE("agreement: all_to_allv counts that disagree pairwise") {
  MpiCommunicator c = fresh("a2av");
  if (c.size() < 2) return;
  const auto n = static_cast<std::size_t>(c.size());
  std::vector<int> sc(n, 1), rc(n, 1);
  if (c.rank() == 0) sc[1] = 2;  // member 1 still expects 1 element from member 0
  std::vector<float> send(static_cast<std::size_t>(n + (c.rank() == 0 ? 1 : 0)), 1.0f), recv(n, -1.0f);
  const int line = __LINE__ + 1;
  const std::string msg = mismatch_message([&] { all_to_allv(c, send, sc, recv, rc); });
  INFO(msg);
  CHECK(msg.find("all_to_allv counts disagree on communicator \"a2av\"") != std::string::npos);
  CHECK(msg.find(site(line)) != std::string::npos);
  CHECK(msg.find("member 0 sends 2 elements to member 1, which expects 1") != std::string::npos);
  CHECK(same_on_every_member(c, msg));
  still_usable(c);
}

TEST_CASE("agreement: the same call from two different lines") {
  MpiCommunicator c = fresh("site");
  if (c.size() < 2) return;
  std::vector<float> buf(3, 1.0f);
  const int line_a = __LINE__ + 3, line_b = __LINE__ + 5;
  const std::string msg = mismatch_message([&] {
    if (c.rank() == 0)
      all_reduce_in_place(c, buf);
    else
      all_reduce_in_place(c, buf);
  });
  INFO(msg);
  CHECK(msg.find("members [0] (world [0]): all_reduce_in_place(float, 3 elements, sum) at " + site(line_a)) != std::string::npos);
  CHECK(msg.find("all_reduce_in_place(float, 3 elements, sum) at " + site(line_b)) != std::string::npos);
  still_usable(c);
}

TEST_CASE("agreement: one member's bad arguments stop every member, with that member's error") {
  MpiCommunicator c = fresh("local");
  if (c.size() < 2) return;
  std::vector<float> send(4, 1.0f), recv(c.rank() == 1 ? 3 : 4, -1.0f);
  const std::string msg = mismatch_message([&] { all_reduce(c, send, recv); });
  INFO(msg);
  CHECK(msg.find("collective refused on communicator \"local\"") != std::string::npos);
  CHECK(msg.find("member 1 (all_reduce(float)") != std::string::npos);
  CHECK(msg.find("recv has 3 elements but must have 4 (all_reduce: recv.size() == send.size())") != std::string::npos);
  CHECK(msg.find("member 0 (") == std::string::npos);
  CHECK(same_on_every_member(c, msg));
  for (float x : recv) CHECK(x == -1.0f);
  still_usable(c);
}

TEST_CASE("agreement: the same bad arguments on every member give each its own error") {
  MpiCommunicator c = fresh("all_bad");
  std::vector<float> send(4, 1.0f), recv(3);
  const auto call = [&] { all_reduce(c, send, recv); }; const int line = __LINE__;
  // The error names this line, where the engine called, not the library's.
  CHECK_THROWS_WITH_AS(call(), ("recv has 3 elements but must have 4 (all_reduce: recv.size() == send.size()); "
                                "all_reduce called at " + site(line)).c_str(),
                       LayoutError);
  still_usable(c);
}

TEST_CASE("agreement: process groups name their communicators in the diagnostics") {
  const int n = MpiCommunicator::world().size();
  if (n < 4 || n % 2 != 0) return;
  // tp = n, dp = 2 with DP attention: attn_tp groups of n/2 ranks, group index = rank / (n/2).
  RuntimeLayout layout(LayoutConfig{.tp = n, .dp = 2, .enable_dp_attention = true});
  const MpiCommunicator world = MpiCommunicator::world();
  ProcessGroups groups(layout, world);
  const int g0 = world.rank() / (n / 2);
  // Each handle is named after the kinds it serves (moe_tp = tp here) and this rank's group index.
  CHECK(groups.tp().name() == "tp=moe_tp#0");
  CHECK(groups.attn_tp().name() == "attn_tp#" + std::to_string(g0));
  CHECK(groups.attn_cp().name() == "single");  // one-rank groups share one handle
  CHECK(groups.moe_ep().name() == "single");
  const MpiCommunicator& at = groups.attn_tp();
  std::vector<float> buf(at.rank() == 0 ? 1 : 2, 0.0f);
  const std::string msg = mismatch_message([&] { all_reduce_in_place(at, buf); });
  INFO(msg);
  const int g = world.rank() / (n / 2);
  CHECK(msg.find("communicator \"attn_tp") != std::string::npos);
  CHECK(msg.find("#" + std::to_string(g) + "\" (" + std::to_string(n / 2) + " members)") != std::string::npos);
  // world ranks of the members of this attention-TP group
  CHECK(msg.find("members [0] (world [" + std::to_string(g * (n / 2)) + "])") != std::string::npos);
}

TEST_CASE("agreement: a placement transition names its caller's line, not the library's") {
  const MpiCommunicator world = MpiCommunicator::world();
  if (world.size() < 2) return;
  const ProcessGroups pg(RuntimeLayout(LayoutConfig{.tp = world.size()}), world);
  using PartialRows = Rows<float, Partial<group::Tp>>;
  const PartialRows partial(PartialRows::view_type("partial", world.rank() == 0 ? 1 : 2, 4));
  const auto call = [&] { (void)all_reduce(pg, partial); }; const int line = __LINE__;
  const std::string msg = mismatch_message(call);
  INFO(msg);
  CHECK(msg.find("all_reduce(float, 4 elements, sum) at " + site(line) + " in ") != std::string::npos);
  CHECK(msg.find("all_reduce(float, 8 elements, sum) at " + site(line) + " in ") != std::string::npos);
  CHECK(msg.find("placement/") == std::string::npos);
}

TEST_CASE("agreement: settings from the environment are checked") {
  setenv("RELAYOUT_COLLECTIVE_TIMEOUT", "soon", 1);
  CHECK_THROWS_WITH_AS(impl::read_agreement_settings(),
                       "RELAYOUT_COLLECTIVE_TIMEOUT=soon: expected a number of seconds between 0 and 1e6 (0: no deadline)",
                       LayoutError);
  setenv("RELAYOUT_COLLECTIVE_TIMEOUT", "2.5", 1);
  setenv("RELAYOUT_CHECK_COLLECTIVES", "maybe", 1);
  CHECK_THROWS_WITH_AS(impl::read_agreement_settings(),
                       "RELAYOUT_CHECK_COLLECTIVES=maybe: expected 1|on|true or 0|off|false", LayoutError);
  setenv("RELAYOUT_CHECK_COLLECTIVES", "off", 1);
  const AgreementSettings s = impl::read_agreement_settings();
  CHECK_FALSE(s.check);
  CHECK(s.timeout_s == 2.5);
  CHECK(s.exit_grace_s == 1.25);  // half the deadline: a failed rank's own message comes first
  CHECK(s.active());              // the watchdog records each call, without the exchange
  unsetenv("RELAYOUT_CHECK_COLLECTIVES");
  unsetenv("RELAYOUT_COLLECTIVE_TIMEOUT");
}

TEST_CASE("agreement: the watchdog is on by default with a 300 s deadline; 0 turns it off") {
  const char* given = std::getenv("RELAYOUT_COLLECTIVE_TIMEOUT");  // ctest's deadline, put back below
  const std::string kept = given ? given : "";
  unsetenv("RELAYOUT_COLLECTIVE_TIMEOUT");
  unsetenv("RELAYOUT_CHECK_COLLECTIVES");
  AgreementSettings s = impl::read_agreement_settings();
  CHECK(s.timeout_s == 300);
  CHECK(s.timeout_s == kDefaultCollectiveTimeout);
  CHECK(s.check == (RELAYOUT_CHECK_COLLECTIVES != 0));  // the build's default, not turned on by it
  CHECK(s.exit_grace_s == 10);
  CHECK(s.active());
  setenv("RELAYOUT_CHECK_COLLECTIVES", "0", 1);
  CHECK(impl::read_agreement_settings().active());  // a default launch of a Release build is watched
  setenv("RELAYOUT_COLLECTIVE_TIMEOUT", "0", 1);
  s = impl::read_agreement_settings();
  CHECK(s.timeout_s == 0);
  CHECK_FALSE(s.active());
  CHECK(s.exit_grace_s == 10);
  unsetenv("RELAYOUT_CHECK_COLLECTIVES");
  setenv("RELAYOUT_COLLECTIVE_TIMEOUT", "2", 1);  // set on purpose: the check names who never came
  s = impl::read_agreement_settings();
  CHECK(s.check);
  CHECK(s.timeout_s == 2);
  CHECK(s.exit_grace_s == 1);
  setenv("RELAYOUT_COLLECTIVE_TIMEOUT", "600", 1);
  CHECK(impl::read_agreement_settings().exit_grace_s == 10);
  if (given) setenv("RELAYOUT_COLLECTIVE_TIMEOUT", kept.c_str(), 1);
  else unsetenv("RELAYOUT_COLLECTIVE_TIMEOUT");
}

TEST_CASE("agreement: only plain numbers of seconds in [0, 1e6] are settings") {
  const std::string rule = ": expected a number of seconds between 0 and 1e6 (0: no deadline)";
  for (const char* bad : {"abc", "-1", "nan", "inf", "-inf", "1e309", "5abc", " 5", "+5", "0x10", "1000001", "5 "}) {
    INFO(bad);
    setenv("RELAYOUT_COLLECTIVE_TIMEOUT", bad, 1);
    CHECK_THROWS_WITH_AS(impl::read_agreement_settings(), ("RELAYOUT_COLLECTIVE_TIMEOUT=" + std::string(bad) + rule).c_str(),
                         LayoutError);
  }
  setenv("RELAYOUT_COLLECTIVE_TIMEOUT", "", 1);
  CHECK_THROWS_WITH_AS(impl::read_agreement_settings(), ("RELAYOUT_COLLECTIVE_TIMEOUT is set but empty" + rule).c_str(),
                       LayoutError);
  for (const auto& [text, value] : std::vector<std::pair<const char*, double>>{{"0", 0}, {"2.5", 2.5}, {"1e6", 1e6}, {"1", 1}}) {
    setenv("RELAYOUT_COLLECTIVE_TIMEOUT", text, 1);
    CHECK(impl::read_agreement_settings().timeout_s == value);
  }
  // A deadline that every healthy job would miss is refused, naming the minimum.
  for (const char* short_deadline : {"0.001", "0.999", "1e-300"}) {
    INFO(short_deadline);
    setenv("RELAYOUT_COLLECTIVE_TIMEOUT", short_deadline, 1);
    CHECK_THROWS_WITH_AS(impl::read_agreement_settings(),
                         ("RELAYOUT_COLLECTIVE_TIMEOUT=" + std::string(short_deadline) +
                          ": a deadline below the minimum of 1 s cannot work (the ranks' start-up and one collective "
                          "on a loaded host take longer, so every job would be aborted); expected 0 (no deadline) or "
                          "at least 1 s").c_str(),
                         LayoutError);
  }
  unsetenv("RELAYOUT_COLLECTIVE_TIMEOUT");
  setenv("RELAYOUT_EXIT_GRACE", "1e309", 1);
  CHECK_THROWS_WITH_AS(impl::read_agreement_settings(),
                       "RELAYOUT_EXIT_GRACE=1e309: expected a number of seconds between 0 and 1e6 (0: a failed rank does not wait)",
                       LayoutError);
  setenv("RELAYOUT_EXIT_GRACE", "0", 1);
  CHECK(impl::read_agreement_settings().exit_grace_s == 0);
  unsetenv("RELAYOUT_EXIT_GRACE");
  setenv("RELAYOUT_CHECK_COLLECTIVES", "", 1);
  CHECK_THROWS_WITH_AS(impl::read_agreement_settings(),
                       "RELAYOUT_CHECK_COLLECTIVES is set but empty: expected 1|on|true or 0|off|false", LayoutError);
  unsetenv("RELAYOUT_CHECK_COLLECTIVES");
}
