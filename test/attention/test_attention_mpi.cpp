// CpAttention on real MPI ranks against plain single-rank loops written here: the prefill's KV
// all-gather and attention under both CP token splits, decode and extend rows under attn_cp
// (query all-gather, partials, merge) through the paged cache kept by a RequestTable, requests
// joining mid-run and leaving, a reused slot against a fresh run, a speculative rollback, the
// attention-TP all-reduce as the typed transition, the prefill with an engine's own kernel, and
// the one-rank attention_extend over the paged cache.
// At np 2 the layout is tp 2, cp 2 (attn_tp 1); at np 4 tp 4, cp 2 (attn_tp 2, heads split);
// every rank count also runs DP attention without CP. Float and double.
#include <doctest/doctest.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include <relayout/attention.hpp>
#include <relayout/comm.hpp>
#include <relayout/kernels/kv_cache.hpp>

#include "mpi_world.hpp"

using namespace relayout;

namespace {

using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;
constexpr int kHeads = 4, kDim = 4, kWindow = 5;

// Query and kv values of (request id, position); `salt` tells rows computed in different steps
// apart, so a rollback that kept a rejected row shows.
double q_val(std::int64_t id, int p, int h, int d) { return std::sin(0.3 * id + 0.17 * p + 0.5 * h + 0.11 * d); }
double kv_val(std::int64_t id, int p, int d, int salt) { return std::cos(0.23 * id + 0.31 * p + 0.7 * d + 0.9 * salt); }

// Plain attention of one query row (all heads) over keys[start .. p], keys[k] a head_dim row.
std::vector<double> reference(std::int64_t id, int p, const std::vector<std::vector<double>>& keys, int window) {
  std::vector<double> out(std::size_t(kHeads * kDim), 0.0);
  const int start = window > 0 ? std::max(0, p - window + 1) : 0;
  const double scale = 1.0 / std::sqrt(double(kDim));
  for (int h = 0; h < kHeads; ++h) {
    std::vector<double> s;
    double m = -1e300;
    for (int k = start; k <= p; ++k) {
      double dot = 0;
      for (int d = 0; d < kDim; ++d) dot += q_val(id, p, h, d) * keys[std::size_t(k)][std::size_t(d)];
      s.push_back(dot * scale);
      m = std::max(m, s.back());
    }
    double l = 0;
    for (double& v : s) l += (v = std::exp(v - m));
    for (int k = start; k <= p; ++k)
      for (int d = 0; d < kDim; ++d)
        out[std::size_t(h * kDim + d)] += s[std::size_t(k - start)] / l * keys[std::size_t(k)][std::size_t(d)];
  }
  return out;
}

struct Setup {
  const char* name;
  LayoutConfig config;
};
std::vector<Setup> setups(int np) {
  std::vector<Setup> s;
  if (np >= 2 && np % 2 == 0) s.push_back({"cp 2", {.tp = np, .cp = 2}});
  s.push_back({"dp attention, no cp", {.tp = np, .dp = np, .enable_dp_attention = np > 1}});
  return s;
}

template <class T>
using V = RowsView<T, Exec>;

template <class T>
V<T> device(const std::vector<double>& h, std::size_t rows, std::size_t cols) {
  V<T> v("v", rows, cols);
  auto m = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < cols; ++j) m(i, j) = T(h[i * cols + j]);
  Kokkos::deep_copy(v, m);
  return v;
}

template <class T>
constexpr double tol() {
  return std::is_same_v<T, float> ? 2e-5 : 1e-12;
}

}  // namespace

TEST_CASE_TEMPLATE("CpAttention prefill: the KV all-gather in group order and attention by position match one rank", T,
                   float, double) {
  for (const Setup& s : setups(test::world().size()))
    for (const CpTokenSplit split : {CpTokenSplit::zigzag, CpTokenSplit::contiguous, CpTokenSplit::round_robin}) {
    CAPTURE(s.name);
    CAPTURE(int(split));
    const RuntimeLayout layout(s.config);
    const ProcessGroups pg(layout, test::world());
    const RankCoords k = pg.coords();
    const int A = layout.widths().attn_tp, heads = kHeads / A, h0 = k.attn_tp_rank * heads;
    TrafficLog log;
    CpAttention<MpiCommunicator, T, Exec> attn(pg, &log);
    // The DP group's batch: ids 10 g + j, a request shorter than cp among them.
    const std::vector<int> lengths = k.attn_dp_rank % 2 == 0 ? std::vector<int>{5, 1, 4, 3} : std::vector<int>{2, 6};
    const CpBatch batch(lengths, split, layout.widths().attn_cp);
    const std::vector<int> mine = batch.rows_of(k.attn_cp_rank);
    std::vector<double> q, kv;
    std::vector<std::int64_t> id;
    std::vector<int> pos;
    for (int row : mine) {
      const int j = int(std::upper_bound(batch.cu_seqlens().begin(), batch.cu_seqlens().end(), row) - batch.cu_seqlens().begin()) - 1;
      id.push_back(10 * k.attn_dp_rank + j);
      pos.push_back(row - batch.cu_seqlens()[std::size_t(j)]);
      for (int h = h0; h < h0 + heads; ++h)
        for (int d = 0; d < kDim; ++d) q.push_back(q_val(id.back(), pos.back(), h, d));
      for (int d = 0; d < kDim; ++d) kv.push_back(kv_val(id.back(), pos.back(), d, 0));
    }
    const std::size_t n = mine.size(), HD = std::size_t(heads * kDim);
    const V<T> qv = device<T>(q, n, HD), kvv = device<T>(kv, n, kDim), out("out", n, HD);
    Exec exec;
    attn.prefill(exec, attn.prefill_keys(exec, batch), qv, kvv, out, {kDim, 1.0 / std::sqrt(double(kDim)), kWindow});
    exec.fence();
    const auto oh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
    double err = 0;
    for (std::size_t i = 0; i < n; ++i) {
      std::vector<std::vector<double>> keys;
      for (int p = 0; p <= pos[i]; ++p) keys.push_back({kv_val(id[i], p, 0, 0), kv_val(id[i], p, 1, 0), kv_val(id[i], p, 2, 0), kv_val(id[i], p, 3, 0)});
      const auto ref = reference(id[i], pos[i], keys, kWindow);
      for (std::size_t c = 0; c < HD; ++c) err = std::max(err, std::abs(double(oh(i, c)) - ref[std::size_t(h0 * kDim) + c]));
    }
    CHECK(err < tol<T>());
    // Each CP rank's share of the batch: every token once over the CP ranks.
    std::vector<int> all = batch.order();
    std::sort(all.begin(), all.end());
    for (int i = 0; i < batch.tokens(); ++i) CHECK(all[std::size_t(i)] == i);
    CHECK(log.calls_of(TrafficOp::all_gatherv, GroupKind::attn_cp) == (layout.widths().attn_cp > 1 ? 1 : 0));

    // The wo_b partials over attn_tp: each rank's heads' share of a feature sum, completed by the
    // typed all-reduce into what all heads give.
    V<T> part("part", n, 3);
    auto ph = Kokkos::create_mirror_view(part);
    for (std::size_t i = 0; i < n; ++i)
      for (int f = 0; f < 3; ++f) {
        double a = 0;
        for (std::size_t c = 0; c < HD; ++c) a += double(oh(i, c)) * (1.0 + 0.1 * f + 0.01 * double(h0 * kDim + int(c)));
        ph(i, f) = T(a);
      }
    Kokkos::deep_copy(part, ph);
    const auto full = attn.all_reduce(exec, Rows<T, Partial<AttnTp>, DpLocal, Exec>(part));
    const auto fh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), full.view());
    double ferr = 0;
    for (std::size_t i = 0; i < n; ++i) {
      std::vector<std::vector<double>> keys;
      for (int p = 0; p <= pos[i]; ++p) keys.push_back({kv_val(id[i], p, 0, 0), kv_val(id[i], p, 1, 0), kv_val(id[i], p, 2, 0), kv_val(id[i], p, 3, 0)});
      const auto ref = reference(id[i], pos[i], keys, kWindow);
      for (int f = 0; f < 3; ++f) {
        double a = 0;
        for (int c = 0; c < kHeads * kDim; ++c) a += ref[std::size_t(c)] * (1.0 + 0.1 * f + 0.01 * c);
        ferr = std::max(ferr, std::abs(double(fh(i, f)) - a));
      }
    }
    CHECK(ferr < 20 * tol<T>());
    CHECK(log.calls_of(TrafficOp::all_reduce, GroupKind::attn_tp) == (A > 1 ? 1 : 0));
    // The plan lists exactly the collectives that ran.
    std::int64_t listed = 0, ran = 0;
    for (const AttentionPlanStep& p : attn.plan(AttentionPhase::prefill)) listed += p.group.has_value();
    for (std::int64_t c : log.calls) ran += c;
    CHECK(listed == ran);
  }
}

namespace {

// A kv value as a cache of KvT holds it: rounded to nearest even into a bf16 cache.
template <class KvT>
double stored(double v) {
  if constexpr (std::is_same_v<KvT, bf16>) return double(float(bf16(float(v))));
  else return v;
}

// A request table's store that holds nothing (plans only).
struct NoStore {
  void on_admit(int, std::int64_t) {}
  void on_release(int) {}
  void on_truncate(int, std::int64_t) {}
};

// One rank's serving loop: a paged cache (of KvT: the rows' T, or bf16 under float rows) kept by
// a request table, and the reference's own copy of every request's kv rows (all positions, as one
// rank would hold them, as the cache stores them). `outs`: every output value of this rank in step
// order. Not copyable: the table's hook points at the cache.
template <class T, class KvT = T>
struct Server {
  const RuntimeLayout& layout;
  CpAttention<MpiCommunicator, T, Exec>& attn;
  kernels::PagedKvCache<KvT, Mem> cache;
  RequestTable<kernels::PagedKvHook<KvT, Mem, Exec>> requests;
  std::map<std::int64_t, std::vector<std::vector<double>>> keys;  // the reference's
  int heads, h0;
  double err = 0;
  std::int64_t rows_checked = 0;
  std::vector<double> outs;

  Server(const RuntimeLayout& l, CpAttention<MpiCommunicator, T, Exec>& a, int slots)
      : layout(l), attn(a), cache(kernels::KvCacheShape{1, kDim, 4, 64, slots, 8}),
        requests(a.request_table(slots, cache.hook(Exec()))) {
    heads = kHeads / l.widths().attn_tp;
    h0 = a.groups().coords().attn_tp_rank * heads;
  }
  Server(const Server&) = delete;

  // One step: (request id, new rows) in step order; ids not in the cache are admitted first.
  void step(const std::vector<std::pair<std::int64_t, int>>& rows, int salt) {
    std::vector<RequestRows> req;
    for (const auto& [id, count] : rows) {
      if (!requests.holds(id)) requests.admit(id);
      req.push_back({id, count});
    }
    const ExtendPlan plan = requests.extend(req, kWindow);
    std::vector<double> q, kv;
    std::vector<std::int64_t> ids;
    for (int i = 0; i < plan.rows(); ++i) {
      const std::int64_t id = requests.id_in(plan.slot[std::size_t(i)]);
      const int p = plan.position[std::size_t(i)];
      ids.push_back(id);
      for (int h = h0; h < h0 + heads; ++h)
        for (int d = 0; d < kDim; ++d) q.push_back(q_val(id, p, h, d));
      for (int d = 0; d < kDim; ++d) kv.push_back(kv_val(id, p, d, salt));
    }
    for (const auto& [id, count] : rows) {  // the reference keeps every row of the group
      auto& k = keys[id];
      for (int c = 0; c < count; ++c) {
        const int p = int(k.size());
        k.push_back({stored<KvT>(kv_val(id, p, 0, salt)), stored<KvT>(kv_val(id, p, 1, salt)),
                     stored<KvT>(kv_val(id, p, 2, salt)), stored<KvT>(kv_val(id, p, 3, salt))});
      }
    }
    const std::size_t n = std::size_t(plan.rows()), HD = std::size_t(heads * kDim);
    const V<T> qv = device<T>(q, n, HD), kvv = device<T>(kv, n, kDim), out("out", n, HD);
    Exec exec;
    append_extend(exec, cache, 0, plan, kvv);
    attn.extend(exec, plan, extend_rows(exec, plan), qv, out, cache, 0, {kDim, 1.0 / std::sqrt(double(kDim)), kWindow});
    exec.fence();
    const auto oh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
    for (std::size_t i = 0; i < n; ++i) {
      const auto ref = reference(ids[i], plan.position[i], keys[ids[i]], kWindow);
      for (std::size_t c = 0; c < HD; ++c) {
        err = std::max(err, std::abs(double(oh(i, c)) - ref[std::size_t(h0 * kDim) + c]));
        outs.push_back(double(oh(i, c)));
      }
      ++rows_checked;
    }
  }
  void rollback(std::int64_t id, int length) {
    requests.truncate(id, length);
    keys[id].resize(std::size_t(length));
  }
  void leave(std::int64_t id) {
    requests.finish(id);
    keys.erase(id);
  }
};

}  // namespace

TEST_CASE_TEMPLATE("CpAttention extend: decode, prompt chunks, verify rows, joins and leaves match one rank", T, float,
                   double) {
  for (const Setup& s : setups(test::world().size())) {
    CAPTURE(s.name);
    const RuntimeLayout layout(s.config);
    const ProcessGroups pg(layout, test::world());
    TrafficLog log;
    CpAttention<MpiCommunicator, T, Exec> attn(pg, &log);
    Server<T> srv(layout, attn, 3);
    const std::int64_t g = 100 * pg.coords().attn_dp_rank;
    // Step 1: two prompts of 6 and 1 rows into the cache (extend from empty).
    srv.step({{g + 1, 6}, {g + 2, 1}}, 1);
    // Steps 2-3: decode rows; a third request joins at step 3 with a 5-row prompt (mixed rows).
    srv.step({{g + 1, 1}, {g + 2, 1}}, 2);
    srv.step({{g + 1, 1}, {g + 3, 5}, {g + 2, 1}}, 3);
    // Step 4: verify rows of a speculative round (3 for g+1), then 1 of 3 accepted: roll back.
    srv.step({{g + 3, 1}, {g + 1, 3}}, 4);
    srv.rollback(g + 1, 9);
    // g+2 leaves; a fourth request takes its slot; decode continues over the rolled-back cache.
    srv.leave(g + 2);
    srv.step({{g + 4, 2}, {g + 1, 1}, {g + 3, 1}}, 5);
    srv.step({{g + 4, 1}, {g + 1, 1}}, 6);
    CHECK(srv.rows_checked > 0);
    CHECK(srv.err < tol<T>());
    CHECK(srv.requests.slot_of(g + 4) == 1);  // the slot g+2 left
    CHECK(srv.requests.length(g + 1) == 11);
    const int cp = layout.widths().attn_cp;
    CHECK(log.calls_of(TrafficOp::all_gatherv, GroupKind::attn_cp) == (cp > 1 ? 6 : 0));
    CHECK(log.calls_of(TrafficOp::all_to_allv, GroupKind::attn_cp) == (cp > 1 ? 12 : 0));
    // Every row checked once over the CP ranks of the group.
    std::int64_t rows = srv.rows_checked;
    all_reduce_in_place(pg.comm(GroupKind::attn_cp), std::span<std::int64_t>(&rows, 1));
    CHECK(rows == 6 + 1 + 2 + 7 + 4 + 4 + 2);
  }
}

TEST_CASE_TEMPLATE("RequestTable under CP: a request in a reused slot gets the rows of a fresh run with it alone", T,
                   float, double) {
  for (const Setup& s : setups(test::world().size())) {
    CAPTURE(s.name);
    const RuntimeLayout layout(s.config);
    const ProcessGroups pg(layout, test::world());
    CpAttention<MpiCommunicator, T, Exec> attn(pg), attn_fresh(pg);
    Server<T> srv(layout, attn, 2), fresh(layout, attn_fresh, 2);
    const std::int64_t g = 100 * pg.coords().attn_dp_rank;
    // g+1 caches 8 positions (spread over the CP ranks) in slot 0, then leaves; g+3 takes slot 0.
    srv.step({{g + 1, 7}, {g + 2, 2}}, 1);
    srv.step({{g + 1, 1}, {g + 2, 1}}, 2);
    srv.leave(g + 1);
    const std::size_t from = srv.outs.size();
    srv.step({{g + 3, 5}}, 3);
    srv.step({{g + 3, 1}, {g + 2, 1}}, 4);
    CHECK(srv.requests.slot_of(g + 3) == 0);
    CHECK(srv.requests.length(g + 3) == 6);
    fresh.step({{g + 3, 5}}, 3);
    fresh.step({{g + 3, 1}}, 4);
    // g+3's rows come first in each step: the same values as with g+3 alone.
    REQUIRE(srv.outs.size() - from >= fresh.outs.size());
    CHECK(std::vector<double>(srv.outs.begin() + std::ptrdiff_t(from),
                              srv.outs.begin() + std::ptrdiff_t(from + fresh.outs.size())) == fresh.outs);
    CHECK(srv.err < tol<T>());
    CHECK(fresh.err < tol<T>());
  }
}

namespace {
// The steps of the extend test above: prompts from empty, decode rows, a request joining with a
// prompt, verify rows and a rollback, a request leaving and another taking its slot.
template <class S>
void serve(S& srv, std::int64_t g) {
  srv.step({{g + 1, 6}, {g + 2, 1}}, 1);
  srv.step({{g + 1, 1}, {g + 2, 1}}, 2);
  srv.step({{g + 1, 1}, {g + 3, 5}, {g + 2, 1}}, 3);
  srv.step({{g + 3, 1}, {g + 1, 3}}, 4);
  srv.rollback(g + 1, 9);
  srv.leave(g + 2);
  srv.step({{g + 4, 2}, {g + 1, 1}, {g + 3, 1}}, 5);
  srv.step({{g + 4, 1}, {g + 1, 1}}, 6);
}

// How far attention over bf16-rounded keys may lie from attention over the fp32 keys, as
// test_attention_bf16.cpp derives it: rounding moves each value by at most u|k|, u = 2^-8, so with
// |q|, |k| <= 1 a score moves by at most d = scale D u, every softmax weight by a factor within
// e^(+-2d), and the output by (e^(2d) - 1) max|v| from the weights and u max|v| from the values;
// plus both sides' fp32 error.
double bf16_bound() {
  const double u = std::ldexp(1.0, -8), d = kDim * u / std::sqrt(double(kDim));
  return std::expm1(2 * d) + u + 2 * tol<float>();
}
}  // namespace

TEST_CASE("CpAttention extend over a bf16 cache under float rows: the fp32 cache's result within the bf16 bound, "
          "the reference on the rounded keys within fp32's") {
  for (const Setup& s : setups(test::world().size())) {
    CAPTURE(s.name);
    const RuntimeLayout layout(s.config);
    const ProcessGroups pg(layout, test::world());
    TrafficLog log32, log16;
    CpAttention<MpiCommunicator, float, Exec> attn32(pg, &log32), attn16(pg, &log16);
    Server<float> fp32(layout, attn32, 3);
    Server<float, bf16> half(layout, attn16, 3);
    const std::int64_t g = 100 * pg.coords().attn_dp_rank;
    serve(fp32, g);
    serve(half, g);
    REQUIRE(half.rows_checked > 0);
    REQUIRE(half.outs.size() == fp32.outs.size());
    CHECK(half.err < tol<float>());  // against the reference on the keys the cache holds
    double diff = 0, moved = 0;
    for (std::size_t i = 0; i < half.outs.size(); ++i) {
      diff = std::max(diff, std::abs(half.outs[i] - fp32.outs[i]));
      moved += half.outs[i] != fp32.outs[i];
    }
    CHECK(diff < bf16_bound());
    CHECK(moved > 0);  // the keys were rounded: the outputs differ from the fp32 cache's
    // The same collectives as with an fp32 cache: the partials and the lse stay float.
    CHECK(log16.calls == log32.calls);
    CHECK(log16.bytes == log32.bytes);
    CHECK(half.cache.shape().bytes(sizeof(bf16)) < fp32.cache.shape().bytes(sizeof(float)));
  }
}

TEST_CASE("attention_extend on one rank over a bf16 cache under float rows: append_extend rounds the kv rows") {
  kernels::PagedKvCache<bf16, Mem> half(kernels::KvCacheShape{1, kDim, 4, 32, 3, 6});
  kernels::PagedKvCache<float, Mem> full(kernels::KvCacheShape{1, kDim, 4, 32, 3, 6});
  Exec exec;
  struct BothCaches {  // one table, its requests' rows in both caches
    kernels::PagedKvHook<bf16, Mem, Exec> half;
    kernels::PagedKvHook<float, Mem, Exec> full;
    void on_admit(int s, std::int64_t id) const { half.on_admit(s, id), full.on_admit(s, id); }
    void on_release(int s) const { half.on_release(s), full.on_release(s); }
    void on_truncate(int s, std::int64_t n) const { half.on_truncate(s, n), full.on_truncate(s, n); }
  };
  RequestTable requests(3, 1, 0, BothCaches{half.hook(exec), full.hook(exec)});
  std::map<std::int64_t, std::vector<std::vector<double>>> keys;  // rounded, as the bf16 cache holds them
  const kernels::AttentionParams params{kDim, 1.0 / std::sqrt(double(kDim)), kWindow};
  double err = 0, diff = 0;
  std::int64_t checked = 0;
  const auto step = [&](const std::vector<std::pair<std::int64_t, int>>& rows, int salt) {
    std::vector<RequestRows> req;
    for (const auto& [id, count] : rows) {
      if (!requests.holds(id)) requests.admit(id);
      req.push_back({id, count});
    }
    const ExtendPlan plan = requests.extend(req, kWindow);
    std::vector<double> q, kv;
    std::vector<std::int64_t> ids;
    for (int i = 0; i < plan.rows(); ++i) {
      const std::int64_t id = requests.id_in(plan.slot[std::size_t(i)]);
      const int p = plan.position[std::size_t(i)];
      ids.push_back(id);
      for (int h = 0; h < kHeads; ++h)
        for (int d = 0; d < kDim; ++d) q.push_back(q_val(id, p, h, d));
      std::vector<double> k;
      for (int d = 0; d < kDim; ++d) {
        kv.push_back(kv_val(id, p, d, salt));
        k.push_back(stored<bf16>(kv.back()));
      }
      keys[id].push_back(k);
    }
    const std::size_t n = std::size_t(plan.rows()), HD = std::size_t(kHeads * kDim);
    const V<float> qv = device<float>(q, n, HD), kvv = device<float>(kv, n, kDim), out16("out16", n, HD),
                   out32("out32", n, HD);
    append_extend(exec, half, 0, plan, kvv);  // float rows, rounded into the bf16 cache
    append_extend(exec, full, 0, plan, kvv);
    const ExtendRows<Mem> ext = extend_rows(exec, plan);
    attention_extend(exec, half, 0, ext, qv, out16, params);
    attention_extend(exec, full, 0, ext, qv, out32, params);
    exec.fence();
    const auto o16 = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out16);
    const auto o32 = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out32);
    for (std::size_t i = 0; i < n; ++i) {
      const auto ref = reference(ids[i], plan.position[i], keys[ids[i]], kWindow);
      for (std::size_t c = 0; c < HD; ++c) {
        err = std::max(err, std::abs(double(o16(i, c)) - ref[c]));
        diff = std::max(diff, std::abs(double(o16(i, c)) - double(o32(i, c))));
      }
      ++checked;
    }
    return plan.causal;
  };
  CHECK(step({{1, 6}, {2, 1}}, 1));          // prompts from empty: causal rows over the bf16 cache
  CHECK_FALSE(step({{1, 1}, {2, 1}}, 2));    // decode rows
  CHECK(step({{1, 3}, {3, 4}, {2, 1}}, 3));  // verify rows, a request joining
  CHECK_FALSE(step({{3, 1}, {1, 1}}, 4));    // decode past the window
  CHECK(checked == 7 + 2 + 8 + 2);
  CHECK(err < tol<float>());
  CHECK(diff < bf16_bound());
  CHECK(diff > 0);
  // The cache holds the rounded values.
  const auto held = half.read(0, requests.slot_of(1));
  CHECK(float(held(0, 1)) == float(bf16(float(kv_val(1, 0, 1, 1)))));
}

TEST_CASE("CpAttention: a rank's rows must be the plan's; a plan for another CP width is refused") {
  const int np = test::world().size();
  if (np % 2 != 0) return;
  const RuntimeLayout layout({.tp = np, .cp = 2});
  const ProcessGroups pg(layout, test::world());
  CpAttention<MpiCommunicator, double, Exec> attn(pg);
  RequestTable other(2, 1, 0, NoStore{});
  other.admit(0);
  const ExtendPlan plan = other.extend({{0, 2}});
  V<double> q("q", 2, kDim), out("out", 2, kDim);
  kernels::PagedKvCache<double, Mem> cache(kernels::KvCacheShape{1, kDim, 4, 8, 2, 2});
  CHECK_THROWS_WITH_AS(attn.extend(Exec(), plan, extend_rows(Exec(), plan), q, out, cache, 0, {kDim, 0.5, 0}),
                       doctest::Contains("the plan is for attn_cp 1, the layout has 2"), LayoutError);
  CHECK_THROWS_WITH_AS(CpBatch({3, 2}, CpTokenSplit::contiguous, 3).rank_of(2, 0), doctest::Contains("request 2 is not in [0, 2)"),
                       LayoutError);
  auto mine = attn.request_table(2, NoStore{});
  mine.admit(0);
  mine.admit(1);
  CHECK_THROWS_WITH_AS(mine.extend({{1, 1}, {1, 2}}), doctest::Contains("request 1 is listed twice"), LayoutError);
  CHECK(mine.length(1) == 0);  // nothing changed
}

namespace {

KOKKOS_INLINE_FUNCTION double dexp(double x) {
#if KOKKOS_VERSION >= 40000
  return Kokkos::exp(x);
#else
  return Kokkos::Experimental::exp(x);
#endif
}

// An engine's own prefill kernel (not the library's): plain causal softmax attention, no window,
// every head over the one shared KV head, in a Kokkos loop of its own. It reads only what
// CpAttention::prefill hands it: the group's kv in batch order, cu_seqlens and each query row's
// own batch row.
struct EnginePrefill {
  int heads = 0;
  double scale = 0;
  int* calls = nullptr;
  template <class Ex, class Q, class KV, class Idx, class O>
  void operator()(const Ex& exec, const Q& q, const KV& kv, const Idx& cu, const Idx& pos, const O& out) const {
    ++*calls;
    const int H = heads;
    const double sc = scale;
    const std::int64_t n = std::int64_t(q.extent(0)), requests = std::int64_t(cu.extent(0)) - 1;
    Kokkos::parallel_for(
        "engine_prefill", Kokkos::RangePolicy<Ex>(exec, 0, n), KOKKOS_LAMBDA(const std::int64_t i) {
          const int p = pos(i);
          int start = 0;
          for (std::int64_t j = 0; j < requests; ++j)
            if (cu(j) <= p) start = cu(j);
          for (int h = 0; h < H; ++h) {
            double m = -1e300, l = 0, acc[kDim] = {};
            for (int k = start; k <= p; ++k) {
              double s = 0;
              for (int d = 0; d < kDim; ++d) s += double(q(i, h * kDim + d)) * double(kv(k, d));
              s *= sc;
              const double m2 = s > m ? s : m, a = dexp(m - m2), w = dexp(s - m2);
              l = l * a + w;
              for (int d = 0; d < kDim; ++d) acc[d] = acc[d] * a + w * double(kv(k, d));
              m = m2;
            }
            for (int d = 0; d < kDim; ++d) out(i, h * kDim + d) = typename O::value_type(acc[d] / l);
          }
        });
  }
};

// A DP group's prefill rows on this rank: request ids 10 g + j, positions, queries of this rank's
// heads and the rows' kv.
struct PrefillRows {
  std::vector<std::int64_t> id;
  std::vector<int> pos;
  std::vector<double> q, kv;
};
PrefillRows prefill_rows(const CpBatch& batch, const RankCoords& k, int heads, int h0) {
  PrefillRows r;
  for (int row : batch.rows_of(k.attn_cp_rank)) {
    const auto& cu = batch.cu_seqlens();
    const int j = int(std::upper_bound(cu.begin(), cu.end(), row) - cu.begin()) - 1;
    r.id.push_back(10 * k.attn_dp_rank + j);
    r.pos.push_back(row - cu[std::size_t(j)]);
    for (int h = h0; h < h0 + heads; ++h)
      for (int d = 0; d < kDim; ++d) r.q.push_back(q_val(r.id.back(), r.pos.back(), h, d));
    for (int d = 0; d < kDim; ++d) r.kv.push_back(kv_val(r.id.back(), r.pos.back(), d, 0));
  }
  return r;
}

}  // namespace

TEST_CASE_TEMPLATE("CpAttention prefill runs the engine's own PrefillKernel on the gathered keys: values match plain loops",
                   T, float, double) {
  static_assert(PrefillKernel<EnginePrefill, T, Exec>);
  for (const Setup& s : setups(test::world().size()))
    for (const CpTokenSplit split : {CpTokenSplit::zigzag, CpTokenSplit::contiguous, CpTokenSplit::round_robin}) {
      CAPTURE(s.name);
      CAPTURE(int(split));
      const RuntimeLayout layout(s.config);
      const ProcessGroups pg(layout, test::world());
      const RankCoords k = pg.coords();
      const int heads = kHeads / layout.widths().attn_tp, h0 = k.attn_tp_rank * heads;
      TrafficLog log;
      CpAttention<MpiCommunicator, T, Exec> attn(pg, &log);
      const std::vector<int> lengths = k.attn_dp_rank % 2 == 0 ? std::vector<int>{3, 7, 1} : std::vector<int>{4, 2, 5};
      const CpBatch batch(lengths, split, layout.widths().attn_cp);
      const PrefillRows in = prefill_rows(batch, k, heads, h0);
      const std::size_t n = in.id.size(), HD = std::size_t(heads * kDim);
      const V<T> qv = device<T>(in.q, n, HD), kvv = device<T>(in.kv, n, kDim), out("out", n, HD);
      Exec exec;
      int calls = 0;
      attn.prefill(exec, attn.prefill_keys(exec, batch), qv, kvv, out,
                   EnginePrefill{heads, 1.0 / std::sqrt(double(kDim)), &calls});
      exec.fence();
      CHECK(calls == 1);
      const auto oh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
      double err = 0;
      for (std::size_t i = 0; i < n; ++i) {
        std::vector<std::vector<double>> keys;
        for (int p = 0; p <= in.pos[i]; ++p)
          keys.push_back({kv_val(in.id[i], p, 0, 0), kv_val(in.id[i], p, 1, 0), kv_val(in.id[i], p, 2, 0), kv_val(in.id[i], p, 3, 0)});
        const auto ref = reference(in.id[i], in.pos[i], keys, 0);
        for (std::size_t c = 0; c < HD; ++c) err = std::max(err, std::abs(double(oh(i, c)) - ref[std::size_t(h0 * kDim) + c]));
      }
      CHECK(err < tol<T>());
      // Every row of the group attended once over its CP ranks.
      std::int64_t rows = std::int64_t(n);
      all_reduce_in_place(exec, pg.comm(GroupKind::attn_cp), std::span<std::int64_t>(&rows, 1));
      CHECK(rows == batch.tokens());
      CHECK(log.calls_of(TrafficOp::all_gatherv, GroupKind::attn_cp) == (layout.widths().attn_cp > 1 ? 1 : 0));
    }
}

TEST_CASE_TEMPLATE("attention_extend on one rank: prompt, decode and verify rows over the paged cache match plain loops", T,
                   float, double) {
  // No communication: every rank runs it alone, as an engine without CP would.
  kernels::PagedKvCache<T, Mem> cache(kernels::KvCacheShape{1, kDim, 4, 32, 3, 6});
  Exec exec;
  RequestTable requests(3, 1, 0, cache.hook(exec));
  std::map<std::int64_t, std::vector<std::vector<double>>> keys;  // the reference's copy
  const kernels::AttentionParams params{kDim, 1.0 / std::sqrt(double(kDim)), kWindow};
  double err = 0;
  std::int64_t checked = 0;
  const auto step = [&](const std::vector<std::pair<std::int64_t, int>>& rows, int salt) {
    std::vector<RequestRows> req;
    for (const auto& [id, count] : rows) {
      if (!requests.holds(id)) requests.admit(id);
      req.push_back({id, count});
    }
    const ExtendPlan plan = requests.extend(req, kWindow);
    std::vector<double> q, kv;
    std::vector<std::int64_t> ids;
    for (int i = 0; i < plan.rows(); ++i) {
      const std::int64_t id = requests.id_in(plan.slot[std::size_t(i)]);
      const int p = plan.position[std::size_t(i)];
      ids.push_back(id);
      for (int h = 0; h < kHeads; ++h)
        for (int d = 0; d < kDim; ++d) q.push_back(q_val(id, p, h, d));
      for (int d = 0; d < kDim; ++d) kv.push_back(kv_val(id, p, d, salt));
      auto& k = keys[id];
      k.push_back({kv_val(id, p, 0, salt), kv_val(id, p, 1, salt), kv_val(id, p, 2, salt), kv_val(id, p, 3, salt)});
    }
    const std::size_t n = std::size_t(plan.rows()), HD = std::size_t(kHeads * kDim);
    const V<T> qv = device<T>(q, n, HD), kvv = device<T>(kv, n, kDim), out("out", n, HD);
    append_extend(exec, cache, 0, plan, kvv);
    const ExtendRows<Mem> ext = extend_rows(exec, plan);
    CHECK(ext.whole);
    CHECK(ext.causal == plan.causal);
    attention_extend(exec, cache, 0, ext, qv, out, params);
    exec.fence();
    const auto oh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
    for (std::size_t i = 0; i < n; ++i) {
      const auto ref = reference(ids[i], plan.position[i], keys[ids[i]], kWindow);
      for (std::size_t c = 0; c < HD; ++c) err = std::max(err, std::abs(double(oh(i, c)) - ref[c]));
      ++checked;
    }
    return plan.causal;
  };
  CHECK(step({{1, 6}, {2, 1}}, 1));             // prompts from empty: each row causal by position
  CHECK_FALSE(step({{1, 1}, {2, 1}}, 2));       // one decode row per request: the whole slot
  CHECK(step({{1, 3}, {3, 4}, {2, 1}}, 3));     // verify rows, a request joining, a decode row
  CHECK_FALSE(step({{3, 1}, {1, 1}}, 4));       // decode past the window
  CHECK(checked == 7 + 2 + 8 + 2);
  CHECK(err < tol<T>());

  // Rows split over CP ranks are not for the one-rank call.
  RequestTable cp2(1, 2, 0, NoStore{});
  cp2.admit(0);
  const ExtendPlan split = cp2.extend({{0, 2}});
  V<T> q("q", std::size_t(split.rows()), kHeads * kDim), out("out", std::size_t(split.rows()), kHeads * kDim);
  CHECK_THROWS_WITH_AS(attention_extend(exec, cache, 0, extend_rows(exec, split), q, out, params),
                       doctest::Contains("the rows span several CP ranks; run them through CpAttention::extend"),
                       LayoutError);
}
