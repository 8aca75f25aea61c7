// bf16 / fp16 storage conversions against bit patterns worked out by hand from IEEE-754 rules,
// and the single-rank backend, with and without an execution-space instance.
#include <doctest/doctest.h>

#include <Kokkos_Core.hpp>
#include <cmath>
#include <limits>
#include <relayout/comm.hpp>
#include <string>
#include <vector>

using namespace relayout;

TEST_CASE("bf16: float conversion rounds to nearest even") {
  CHECK(bf16(1.0f).bits == 0x3F80);
  CHECK(bf16(-2.0f).bits == 0xC000);
  CHECK(bf16(0.1f).bits == 0x3DCD);                 // 0x3DCCCCCD rounds up
  CHECK(bf16(1.0f + 0x1p-8f).bits == 0x3F80);       // tie, even mantissa stays
  CHECK(bf16(1.0f + 3 * 0x1p-8f).bits == 0x3F82);   // tie, odd mantissa rounds up
  CHECK(bf16(std::numeric_limits<float>::infinity()).bits == 0x7F80);
  CHECK(std::isnan(static_cast<float>(bf16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(static_cast<float>(bf16::from_bits(0x4049)) == 3.140625f);
}

TEST_CASE("fp16: float conversion, subnormals, overflow and ties") {
  CHECK(fp16(1.0f).bits == 0x3C00);
  CHECK(fp16(-2.0f).bits == 0xC000);
  CHECK(fp16(0.1f).bits == 0x2E66);
  CHECK(fp16(65504.0f).bits == 0x7BFF);             // largest finite half
  CHECK(fp16(65519.0f).bits == 0x7BFF);             // below the halfway point
  CHECK(fp16(65520.0f).bits == 0x7C00);             // halfway to 2^16 rounds to even: infinity
  CHECK(fp16(0x1p-24f).bits == 0x0001);             // smallest subnormal
  CHECK(fp16(0x1p-25f).bits == 0x0000);             // tie between 0 and 2^-24: even is 0
  CHECK(fp16(0x1.8p-24f).bits == 0x0002);           // tie between 1 and 2 units: even is 2
  CHECK(fp16(0x1p-14f).bits == 0x0400);             // smallest normal
  CHECK(fp16(1.0f + 0x1p-11f).bits == 0x3C00);      // tie, even stays
  CHECK(fp16(1.0f + 3 * 0x1p-11f).bits == 0x3C02);  // tie, odd rounds up
  CHECK(static_cast<float>(fp16::from_bits(0x0001)) == 0x1p-24f);
  CHECK(static_cast<float>(fp16::from_bits(0x7BFF)) == 65504.0f);
  CHECK(static_cast<float>(fp16::from_bits(0xFC00)) == -std::numeric_limits<float>::infinity());
  CHECK(std::isnan(static_cast<float>(fp16(std::numeric_limits<float>::quiet_NaN()))));
  for (std::uint32_t b = 0; b < 0x7C00; ++b)  // every finite half survives a round trip
    REQUIRE(fp16(static_cast<float>(fp16::from_bits(static_cast<std::uint16_t>(b)))).bits == b);
}

TEST_CASE("single rank: collectives copy, size checks still apply") {
  const SingleRankCommunicator one;
  static_assert(SplittableCommunicator<SingleRankCommunicator>);
  std::vector<double> in{1, 2, 3}, out(3);
  all_reduce(one, in, out);
  CHECK(out == in);
  std::vector<double> gathered(3);
  all_gatherv(one, in, gathered, std::vector<int>{3});
  CHECK(gathered == in);
  std::vector<double> wrong(2);
  CHECK_THROWS_AS(all_gather(one, in, wrong), LayoutError);
  CHECK_THROWS_AS(all_gatherv(one, in, gathered, std::vector<int>{1, 2}), LayoutError);
  CHECK_THROWS_AS(broadcast(one, out, 1), LayoutError);
}

namespace {

// Kokkos Tools' deep-copy hook: the destinations of every Kokkos::deep_copy while installed.
std::vector<const void*> deep_copies;
void record_deep_copy(Kokkos_Profiling_SpaceHandle, const char*, const void* dst, Kokkos_Profiling_SpaceHandle,
                      const char*, const void*, uint64_t) {
  deep_copies.push_back(dst);
}
struct DeepCopyLog {
  DeepCopyLog() {
    deep_copies.clear();
    Kokkos::Tools::Experimental::set_begin_deep_copy_callback(record_deep_copy);
  }
  ~DeepCopyLog() { Kokkos::Tools::Experimental::set_begin_deep_copy_callback(nullptr); }
};

// A Serial instance that counts its fences (Serial's own fence has nothing to wait for).
struct CountingSerial : Kokkos::Serial {
  static inline int fences = 0;
  void fence() const { ++fences; }
};

std::vector<float> host(const Kokkos::View<float*>& v) {
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = v(i);
  return out;
}

}  // namespace

TEST_CASE("single rank: every collective on an execution-space instance copies Views with deep_copy") {
  const SingleRankCommunicator one;
  const Kokkos::Serial space;  // a second instance, constructed normally
  static_assert(ExecutionSpaceInstance<Kokkos::Serial> && !ExecutionSpaceInstance<SingleRankCommunicator>);
  Kokkos::View<float*> in("in", 4), out("out", 4);
  Kokkos::parallel_for(Kokkos::RangePolicy<Kokkos::Serial>(space, 0, 4), [=](int i) { in(i) = 1.5f * float(i) + 1; });
  const std::vector<float> expect{1.0f, 2.5f, 4.0f, 5.5f};
  const std::vector<int> all{4};
  const auto each = [&](auto&& collective) {
    Kokkos::deep_copy(out, -1.0f);
    const DeepCopyLog log;
    collective();
    CHECK(host(out) == expect);
    REQUIRE(deep_copies.size() == 1);  // one copy, into recv: not std::copy over View memory
    CHECK(deep_copies[0] == out.data());
  };
  each([&] { all_reduce(space, one, in, out); });
  each([&] { all_reduce(space, one, in, out, ReduceOp::max); });
  each([&] { all_gather(space, one, in, out); });
  each([&] { all_gatherv(space, one, in, out, all); });
  each([&] { reduce_scatter(space, one, in, out); });
  each([&] { reduce_scatterv(space, one, in, out, all); });
  each([&] { all_to_all(space, one, in, out); });
  each([&] { all_to_allv(space, one, in, all, out, all); });
  // The forms without an instance copy Views the same way.
  each([&] { all_reduce(one, in, out); });
  each([&] { all_to_allv(one, in, all, out, all); });
  // A 2-d send and a 1-d recv of the same size: copied as the contiguous memory they are.
  Kokkos::View<float**> square("square", 2, 2);
  for (int i = 0; i < 4; ++i) square(i / 2, i % 2) = expect[static_cast<std::size_t>(i)];
  each([&] { all_gather(space, one, square, out); });
  // In place and broadcast leave the buffer as it is; barrier returns.
  Kokkos::deep_copy(out, in);
  all_reduce_in_place(space, one, out);
  all_gather_in_place(space, one, out);
  all_gatherv_in_place(space, one, out, all);
  reduce_scatter_in_place(space, one, out);
  all_to_all_in_place(space, one, out);
  broadcast(space, one, out, 0);
  barrier(space, one);
  space.fence();
  CHECK(host(out) == expect);
  // The same checks as without an instance, with the same messages, each naming the caller's line.
  Kokkos::View<float*> small("small", 3);
  const auto at = [](const char* call, int line) {
    return "; " + std::string(call) + " called at comm/test_scalar.cpp:" + std::to_string(line);
  };
  const auto reduce = [&] { all_reduce(space, one, in, small); }; const int reduce_line = __LINE__;
  CHECK_THROWS_WITH_AS(reduce(), ("recv has 3 elements but must have 4 (all_reduce: recv.size() == send.size())" +
                                  at("all_reduce", reduce_line)).c_str(), LayoutError);
  const auto bcast = [&] { broadcast(space, one, out, 1); }; const int bcast_line = __LINE__;
  CHECK_THROWS_WITH_AS(bcast(), ("broadcast root 1 is not a rank of this group: it must be in [0, 1)" +
                                 at("broadcast", bcast_line)).c_str(), LayoutError);
  // A rank that is its own peer receives what it sends: unequal counts would overrun recv.
  const auto a2av = [&] { all_to_allv(space, one, in, all, small, std::vector<int>{3}); }; const int a2av_line = __LINE__;
  CHECK_THROWS_WITH_AS(a2av(), ("all_to_allv on one rank: recv_counts[0] = 3 but send_counts[0] = 4; a rank that is its "
                                "own peer receives what it sends" + at("all_to_allv", a2av_line)).c_str(),
                       LayoutError);
  // Plain host ranges are copied without Kokkos.
  std::vector<float> a{1, 2}, b(2);
  const DeepCopyLog log;
  all_reduce(space, one, a, b);
  CHECK(b == a);
  CHECK(deep_copies.empty());
}

TEST_CASE("single rank: a collective fences the instance it is given, once") {
  const SingleRankCommunicator one;
  const CountingSerial space;
  std::vector<double> in{1, 2}, out(2);
  CountingSerial::fences = 0;
  all_reduce(space, one, in, out);
  CHECK(CountingSerial::fences == 1);
  all_gatherv_in_place(space, one, out, std::vector<int>{2});
  barrier(space, one);
  CHECK(CountingSerial::fences == 3);
  all_reduce(one, in, out);  // without an instance: nothing of the caller's is fenced
  CHECK(CountingSerial::fences == 3);
}
