// RequestTable on one rank: request ids to slots (lowest free slot, refusals), every join, leave
// and rollback told to the store's hook with the right slot (also under attn_cp 2), and a slot
// reused after another request, with stale rows in the cache, giving the rows of a fresh run with
// only the new request and of plain attention written here.
#include <doctest/doctest.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <relayout/attention.hpp>
#include <relayout/kernels/kv_cache.hpp>

using namespace relayout;

namespace {

using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;
constexpr int kHeads = 2, kDim = 4;

// Every call the table makes, as "admit 0 70", "release 0", "truncate 1 3".
struct Recorder {
  std::vector<std::string>* log = nullptr;
  bool refuse_admit = false;
  void on_admit(int slot, std::int64_t id) {
    if (refuse_admit) throw std::runtime_error("store full");
    log->push_back("admit " + std::to_string(slot) + " " + std::to_string(id));
  }
  void on_release(int slot) { log->push_back("release " + std::to_string(slot)); }
  void on_truncate(int slot, std::int64_t rows) {
    log->push_back("truncate " + std::to_string(slot) + " " + std::to_string(rows));
  }
};
static_assert(KvStoreHook<Recorder>);
static_assert(KvStoreHook<kernels::PagedKvHook<float, Mem, Exec>>);

double q_val(std::int64_t id, int p, int h, int d) { return std::sin(0.3 * id + 0.17 * p + 0.5 * h + 0.11 * d); }
double kv_val(std::int64_t id, int p, int d) { return std::cos(0.23 * id + 0.31 * p + 0.7 * d); }

// Plain causal attention of (id, p), all heads, over kv_val(id, 0 .. p).
std::vector<double> reference(std::int64_t id, int p) {
  std::vector<double> out(std::size_t(kHeads * kDim), 0.0);
  for (int h = 0; h < kHeads; ++h) {
    std::vector<double> s;
    for (int k = 0; k <= p; ++k) {
      double dot = 0;
      for (int d = 0; d < kDim; ++d) dot += q_val(id, p, h, d) * kv_val(id, k, d);
      s.push_back(dot / std::sqrt(double(kDim)));
    }
    const double m = *std::max_element(s.begin(), s.end());
    double l = 0;
    for (double& v : s) l += (v = std::exp(v - m));
    for (int k = 0; k <= p; ++k)
      for (int d = 0; d < kDim; ++d) out[std::size_t(h * kDim + d)] += s[std::size_t(k)] / l * kv_val(id, k, d);
  }
  return out;
}

template <class T>
RowsView<T, Exec> device(const std::vector<double>& v, std::size_t rows, std::size_t cols) {
  RowsView<T, Exec> out("rows", rows, cols);
  auto h = Kokkos::create_mirror_view(out);
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < cols; ++j) h(i, j) = T(v[i * cols + j]);
  Kokkos::deep_copy(out, h);
  return out;
}

// One step through the table and the cache: kv appended, attention_extend. Returns each new row's
// output (plan order) and its position.
template <class T, class Table>
std::vector<std::pair<int, std::vector<double>>> run_step(Table& table, kernels::PagedKvCache<T, Mem>& cache,
                                                          std::vector<RequestRows> rows) {
  const ExtendPlan plan = table.extend(rows);
  std::vector<double> q, kv;
  for (int i = 0; i < plan.rows(); ++i) {
    const std::int64_t id = table.id_in(plan.slot[std::size_t(i)]);
    const int p = plan.position[std::size_t(i)];
    for (int h = 0; h < kHeads; ++h)
      for (int d = 0; d < kDim; ++d) q.push_back(q_val(id, p, h, d));
    for (int d = 0; d < kDim; ++d) kv.push_back(kv_val(id, p, d));
  }
  const std::size_t n = std::size_t(plan.rows()), HD = std::size_t(kHeads * kDim);
  const RowsView<T, Exec> qv = device<T>(q, n, HD), out("out", n, HD);
  Exec exec;
  append_extend(exec, cache, 0, plan, device<T>(kv, n, kDim));
  attention_extend(exec, cache, 0, extend_rows(exec, plan), qv, out, {kDim, 1.0 / std::sqrt(double(kDim)), 0});
  exec.fence();
  const auto oh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
  std::vector<std::pair<int, std::vector<double>>> got;
  for (std::size_t i = 0; i < n; ++i) {
    std::vector<double> o;
    for (std::size_t c = 0; c < HD; ++c) o.push_back(double(oh(i, c)));
    got.push_back({plan.position[i], o});
  }
  return got;
}

template <class T>
double tol() {
  return std::is_same_v<T, float> ? 2e-5 : 1e-12;
}

}  // namespace

TEST_CASE("RequestTable: request ids to the lowest free slot, and back; double admit, unknown id and full refused") {
  std::vector<std::string> log;
  RequestTable table(3, 1, 0, Recorder{&log});
  CHECK(table.admit(70) == 0);
  CHECK(table.admit(71) == 1);
  CHECK(table.admit(72) == 2);
  CHECK(table.live() == 3);
  CHECK_THROWS_WITH_AS(table.admit(73), doctest::Contains("request 73: all 3 slots are taken"), LayoutError);
  CHECK_THROWS_WITH_AS(table.admit(71), doctest::Contains("request 71 already holds slot 1 (admitted twice)"),
                       LayoutError);
  CHECK(table.finish(71) == 1);
  CHECK_THROWS_WITH_AS(table.finish(71), doctest::Contains("request 71 holds no slot (never admitted, or finished already)"),
                       LayoutError);
  CHECK_THROWS_WITH_AS(table.slot_of(5), doctest::Contains("request 5 holds no slot"), LayoutError);
  CHECK(table.finish(70) == 0);
  CHECK(table.admit(74) == 0);  // the lowest free slot, not the last freed
  CHECK(table.admit(75) == 1);
  CHECK(table.id_in(1) == 75);
  CHECK(table.slot_of(72) == 2);
  CHECK_FALSE(table.holds(71));
  CHECK_THROWS_WITH_AS(table.admit(-1), doctest::Contains("an id must be >= 0"), LayoutError);
  // Refused calls tell the store nothing.
  CHECK(log == std::vector<std::string>{"admit 0 70", "admit 1 71", "admit 2 72", "release 1", "release 0",
                                        "admit 0 74", "admit 1 75"});
}

TEST_CASE("RequestTable tells the store every join, leave and rollback with the request's slot") {
  std::vector<std::string> log;
  RequestTable table(2, 1, 0, Recorder{&log});
  table.admit(10);
  table.admit(11);
  table.extend({{10, 5}, {11, 2}});
  CHECK(table.truncate(10, 3) == 3);
  CHECK(table.length(10) == 3);
  table.finish(10);
  table.admit(12);               // into request 10's slot: the store drops what it left
  CHECK(table.length(12) == 0);  // and the table starts the request at position 0
  const ExtendPlan plan = table.extend({{12, 2}, {11, 1}});
  CHECK(plan.slot == std::vector<int>{0, 0, 1});
  CHECK(plan.position == std::vector<int>{0, 1, 2});
  CHECK(log == std::vector<std::string>{"admit 0 10", "admit 1 11", "truncate 0 3", "release 0", "admit 0 12"});

  // A step naming an unknown request, one twice, or a negative count changes nothing.
  CHECK_THROWS_WITH_AS(table.extend({{11, 1}, {99, 1}}), doctest::Contains("request 99 holds no slot"), LayoutError);
  CHECK_THROWS_WITH_AS(table.extend({{11, 1}, {11, 2}}), doctest::Contains("request 11 is listed twice"), LayoutError);
  CHECK_THROWS_WITH_AS(table.extend({{11, -1}}), doctest::Contains("a count must be >= 0"), LayoutError);
  CHECK(table.length(11) == 3);

  // A store that refuses the admit leaves the table as it was.
  RequestTable refusing(1, 1, 0, Recorder{&log, true});
  CHECK_THROWS_WITH_AS(refusing.admit(5), doctest::Contains("store full"), std::runtime_error);
  CHECK_FALSE(refusing.holds(5));
  CHECK(refusing.live() == 0);
}

TEST_CASE("RequestTable under attn_cp 2: this CP rank's positions, and a rollback keeps the rows held here") {
  std::vector<std::string> log;
  RequestTable table(2, 2, 1, Recorder{&log});  // CP rank 1 of 2: positions p with p mod 2 == 1
  table.admit(40);
  table.admit(41);
  const ExtendPlan plan = table.extend({{40, 7}, {41, 2}});
  CHECK(plan.position == std::vector<int>{1, 3, 5, 1});
  CHECK(table.held(40) == std::vector<int>{1, 3, 5});
  CHECK(table.truncate(40, 4) == 2);  // positions 1 and 3 stay below 4
  CHECK(table.held(40) == std::vector<int>{1, 3});
  table.finish(40);
  CHECK(table.admit(42) == 0);
  CHECK(table.held(42).empty());
  CHECK(table.extend({{42, 3}}).position == std::vector<int>{1});  // from position 0 again
  CHECK(log == std::vector<std::string>{"admit 0 40", "admit 1 41", "truncate 0 2", "release 0", "admit 0 42"});
}

TEST_CASE_TEMPLATE("RequestTable over a PagedKvCache: a reused slot with stale rows gives a fresh run's rows", T, float,
                   double) {
  Exec exec;
  const kernels::KvCacheShape shape{1, kDim, 4, 12, 2, 4};
  kernels::PagedKvCache<T, Mem> cache(shape);
  RequestTable table(2, 1, 0, cache.hook(exec));
  // Request 7 runs 9 rows in slot 0; request 8 holds slot 1 throughout.
  table.admit(7);
  table.admit(8);
  run_step(table, cache, {{7, 6}, {8, 2}});
  run_step(table, cache, {{7, 3}, {8, 1}});
  const int blocks_before = cache.free_blocks();
  table.finish(7);
  CHECK(cache.free_blocks() == blocks_before + 3);  // its 9 rows' blocks back
  // Stale rows written into the free slot by number (what a store forgetting a request leaves).
  cache.append(exec, 0, 0, device<T>(std::vector<double>(2 * kDim, 5.0), 2, kDim));
  CHECK(table.admit(9) == 0);
  CHECK(cache.length(0, 0) == 0);
  const auto prompt = run_step(table, cache, {{9, 3}, {8, 1}});
  const auto decode = run_step(table, cache, {{9, 1}});

  // The fresh run: a new table and cache holding request 9 alone.
  kernels::PagedKvCache<T, Mem> fresh_cache(shape);
  RequestTable fresh(2, 1, 0, fresh_cache.hook(exec));
  fresh.admit(9);
  const auto fresh_prompt = run_step(fresh, fresh_cache, {{9, 3}});
  const auto fresh_decode = run_step(fresh, fresh_cache, {{9, 1}});

  REQUIRE(prompt.size() == 4);
  REQUIRE(decode.size() == 1);
  double err = 0;
  for (int i = 0; i < 3; ++i) {
    CHECK(prompt[std::size_t(i)].first == i);  // positions 0, 1, 2: nothing of request 7 counted
    CHECK(prompt[std::size_t(i)].second == fresh_prompt[std::size_t(i)].second);
    const auto ref = reference(9, i);
    for (std::size_t c = 0; c < ref.size(); ++c) err = std::max(err, std::abs(prompt[std::size_t(i)].second[c] - ref[c]));
  }
  CHECK(decode[0].first == 3);
  CHECK(decode[0].second == fresh_decode[0].second);
  const auto ref = reference(9, 3);
  for (std::size_t c = 0; c < ref.size(); ++c) err = std::max(err, std::abs(decode[0].second[c] - ref[c]));
  CHECK(err < tol<T>());
  CHECK(cache.length(0, 0) == 4);
  CHECK(table.length(8) == 4);  // request 8 untouched: 2 + 1 + 1 rows
  CHECK(prompt[3].first == 3);
  const auto ref8 = reference(8, 3);
  for (std::size_t c = 0; c < ref8.size(); ++c) CHECK(std::abs(prompt[3].second[c] - ref8[c]) < tol<T>());
}

TEST_CASE("RequestTable over a PagedKvCache: a finished request's blocks and slot serve the next") {
  Exec exec;
  kernels::PagedKvCache<double, Mem> cache({1, 2, 4, 4, 2, 2});
  RequestTable table(2, 1, 0, cache.hook(exec));
  const auto rows = [](int n, double v) { return device<double>(std::vector<double>(std::size_t(2 * n), v), std::size_t(n), 2); };
  const int a = table.admit(10), b = table.admit(11);
  append_extend(exec, cache, 0, table.extend({{10, 8}}), rows(8, 1.0));
  append_extend(exec, cache, 0, table.extend({{11, 3}}), rows(3, 2.0));
  CHECK(cache.free_blocks() == 1);
  CHECK_THROWS_WITH_AS(table.admit(12), doctest::Contains("all 2 slots are taken"), LayoutError);
  table.finish(10);
  CHECK(cache.free_blocks() == 3);
  CHECK(table.admit(12) == a);
  CHECK(cache.length(0, a) == 0);
  append_extend(exec, cache, 0, table.extend({{12, 5}}), rows(5, 3.0));
  const auto back = cache.read(0, a);
  CHECK(back.extent(0) == 5);
  CHECK(back(4, 1) == 3.0);
  CHECK(cache.read(0, b)(2, 0) == 2.0);
  CHECK(table.truncate(12, 2) == 2);
  CHECK(cache.length(0, a) == 2);
  CHECK(cache.free_blocks() == 2);
}
