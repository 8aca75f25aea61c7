// Kernel throughput paired with a baseline measured alternately in the same run, so the ratio is
// meaningful on a noisy shared machine: linear and the routed experts against OpenBLAS
// single-threaded sgemm on the same shapes (GFLOP/s), decode attention against a STREAM-like copy
// of as many bytes as the KV cache (GB/s), contiguous and paged. The reported time is relayout's.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <relayout/kernels.hpp>
#include <vector>

extern "C" void openblas_set_num_threads(int);

namespace {

namespace rk = relayout::kernels;
using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;
using Clock = std::chrono::steady_clock;

template <class F>
double seconds(F&& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

template <class V>
void fill(const V& v, unsigned seed, float lo = -1.f, float hi = 1.f) {
  auto h = Kokkos::create_mirror_view(v);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  for (std::size_t i = 0; i < h.span(); ++i) h.data()[i] = d(gen);
  Kokkos::deep_copy(v, h);
}

// Times `ours` and `theirs` alternately; reports ours as the iteration time and both rates.
template <class Ours, class Theirs>
void paired(benchmark::State& state, double work, const char* unit, const char* baseline, Ours&& ours,
            Theirs&& theirs) {
  ours();  // warm up both (first-touch, OpenBLAS buffers)
  theirs();
  double t_ours = 0, t_theirs = 0;
  for (auto _ : state) {
    const double a = seconds(ours);
    t_theirs += seconds(theirs);
    t_ours += a;
    state.SetIterationTime(a);
  }
  const double n = double(state.iterations());
  const double ours_rate = work * n / t_ours * 1e-9, theirs_rate = work * n / t_theirs * 1e-9;
  state.counters[std::string("relayout_") + unit] = ours_rate;
  state.counters[std::string(baseline) + "_" + unit] = theirs_rate;
  state.counters["ratio"] = ours_rate / theirs_rate;
}

// ---- linear vs sgemm -------------------------------------------------------------------------

void BM_Linear(benchmark::State& state) {
  openblas_set_num_threads(1);
  const int m = int(state.range(0)), n = int(state.range(1)), k = int(state.range(2));
  Exec exec;
  rk::RowTensor<float, Mem> x("x", m, k), w("w", n, k), y("y", m, n), y_blas("y_blas", m, n);
  fill(x, 1);
  fill(w, 2);
  const auto packed = rk::pack_weights(exec, w);
  paired(
      state, 2.0 * m * n * k, "GFLOPs", "openblas",
      [&] {
        rk::linear(exec, x, packed, y);
        exec.fence();
      },
      [&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.f, x.data(), k, w.data(), k, 0.f,
                    y_blas.data(), n);
      });
}
BENCHMARK(BM_Linear)
    ->ArgNames({"rows", "out", "in"})
    ->Args({1, 2048, 2048})
    ->Args({16, 2048, 2048})
    ->Args({64, 2048, 2048})
    ->Args({67, 1000, 1000})
    ->Args({256, 2048, 2048})
    ->Args({256, 1536, 4096})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// ---- routed experts vs gather + sgemm + SwiGLU + sgemm per expert ------------------------------

void BM_ExpertFfn(benchmark::State& state) {
  openblas_set_num_threads(1);
  const int tokens = int(state.range(0)), experts = int(state.range(1)), top_k = int(state.range(2)),
            hidden = int(state.range(3)), inter = int(state.range(4));
  Exec exec;
  rk::RowTensor<float, Mem> x("x", tokens, hidden);
  fill(x, 3);
  Kokkos::View<float***, Kokkos::LayoutRight, Mem> w13("w13", experts, 2 * inter, hidden), w2("w2", experts, hidden, inter);
  fill(w13, 4, -0.05f, 0.05f);
  fill(w2, 5, -0.05f, 0.05f);
  // Balanced routing: token t picks experts (t + j * experts / top_k) % experts.
  Kokkos::View<int**, Kokkos::LayoutRight, Mem> ids("ids", tokens, top_k);
  auto ids_h = Kokkos::create_mirror_view(ids);
  for (int t = 0; t < tokens; ++t)
    for (int j = 0; j < top_k; ++j) ids_h(t, j) = (t + j * (experts / top_k)) % experts;
  Kokkos::deep_copy(ids, ids_h);
  const auto buckets = rk::bucket_by_expert(exec, ids, experts);
  const auto packed = rk::pack_experts(
      exec, Kokkos::subview(w13, Kokkos::ALL(), std::make_pair(0, inter), Kokkos::ALL()),
      Kokkos::subview(w13, Kokkos::ALL(), std::make_pair(inter, 2 * inter), Kokkos::ALL()), w2);
  rk::RowTensor<float, Mem> y("y", buckets.rows(), hidden), y_blas("y_blas", buckets.rows(), hidden);

  auto slot_token = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), buckets.slot_token);
  int max_rows = 0;
  for (int e = 0; e < experts; ++e)
    max_rows = std::max(max_rows, buckets.host_offsets(e + 1) - buckets.host_offsets(e));
  std::vector<float> xg(std::size_t(max_rows) * hidden), gu(std::size_t(max_rows) * 2 * inter),
      h(std::size_t(max_rows) * inter);
  const double flops = 2.0 * buckets.rows() * (2.0 * inter * hidden + double(hidden) * inter);
  paired(
      state, flops, "GFLOPs", "openblas",
      [&] {
        rk::expert_ffn(exec, x, buckets, packed, y);
        exec.fence();
      },
      [&] {
        for (int e = 0; e < experts; ++e) {
          const int begin = buckets.host_offsets(e), m = buckets.host_offsets(e + 1) - begin;
          if (m == 0) continue;
          for (int i = 0; i < m; ++i)
            std::memcpy(&xg[std::size_t(i) * hidden], &x(slot_token(begin + i), 0), sizeof(float) * hidden);
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, 2 * inter, hidden, 1.f, xg.data(), hidden,
                      &w13(e, 0, 0), hidden, 0.f, gu.data(), 2 * inter);
          for (int i = 0; i < m; ++i)
            for (int c = 0; c < inter; ++c) {
              const float g = gu[std::size_t(i) * 2 * inter + c];
              h[std::size_t(i) * inter + c] = g / (1.f + std::exp(-g)) * gu[std::size_t(i) * 2 * inter + inter + c];
            }
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, hidden, inter, 1.f, h.data(), inter,
                      &w2(e, 0, 0), inter, 0.f, &y_blas(begin, 0), hidden);
        }
      });
  state.counters["rows_per_expert"] = double(buckets.rows()) / experts;
}
BENCHMARK(BM_ExpertFfn)
    ->ArgNames({"tokens", "experts", "top_k", "hidden", "inter"})
    ->Args({256, 8, 2, 2048, 512})    // 64 rows per expert
    ->Args({128, 8, 8, 1024, 512})    // every expert sees every token: 128 rows
    ->Args({64, 16, 2, 2048, 256})    // 8 rows per expert (decode-sized)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// ---- decode attention vs copy ------------------------------------------------------------------

// What one core can compute, measured: independent vector FMA chains on registers (no memory), as
// wide as the vectors the kernels use, enough chains to cover the FMA latency. GFLOP/s, best of 3.
double fma_peak_gflops() {
  constexpr int lanes = rk::impl::kHostVectorBytes > 0 ? rk::impl::kHostVectorBytes / int(sizeof(float)) : 1;
  typedef float V __attribute__((vector_size(sizeof(float) * lanes)));
  constexpr int chains = 12;
  constexpr long iters = 2'000'000;
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    V acc[chains];
    for (int c = 0; c < chains; ++c) acc[c] = V{} + float(c) * 1e-3f;
    V a = V{} + 0.999999f, b = V{} + 1e-7f;
    benchmark::DoNotOptimize(a);
    benchmark::DoNotOptimize(b);
    const double t = seconds([&] {
      for (long i = 0; i < iters; ++i)
        for (int c = 0; c < chains; ++c) acc[c] = acc[c] * a + b;
    });
    for (int c = 0; c < chains; ++c) benchmark::DoNotOptimize(acc[c]);
    best = std::max(best, 2.0 * lanes * chains * double(iters) / t * 1e-9);
  }
  return best;
}

// Times one decode (`run`) over a cache of `rows` x head_dim against a copy of as many bytes, and
// reports next to the ratio the best ratio the FMA peak allows: decode attention does 2 FMAs per
// cached element and head (the score and p . V), so with many heads it is bound by the FMA rate,
// not by memory: fma_bound_ratio = fma_peak / (flops per byte) / copy.
template <class Run>
void decode_vs_copy(benchmark::State& state, std::int64_t rows, int reqs, int heads, int head_dim, Run&& run) {
  // Bytes the kernel must move: the cache once, q and out. The copy moves its bytes twice (read +
  // write), so it copies half as many elements: both sides move the same number of bytes.
  const double bytes = 4.0 * (double(rows) * head_dim + 2.0 * reqs * heads * head_dim);
  const double flops = 4.0 * double(rows) * head_dim * heads;
  std::vector<float> src(std::size_t(rows) * head_dim, 1.f), dst(src.size(), 0.f);
  const std::size_t copy_n = src.size() / 2;
  paired(state, bytes, "GBps", "copy", run, [&] {
    std::memcpy(dst.data(), src.data() + copy_n, copy_n * sizeof(float));
    benchmark::DoNotOptimize(dst.data());
  });
  const double gbps = state.counters["relayout_GBps"], copy = state.counters["copy_GBps"];
  const double peak = fma_peak_gflops();
  state.counters["relayout_GFLOPs"] = gbps * flops / bytes;
  state.counters["fma_peak_GFLOPs"] = peak;
  state.counters["fma_bound_ratio"] = peak * bytes / flops / copy;
}

void BM_DecodeAttention(benchmark::State& state) {
  const int reqs = int(state.range(0)), len = int(state.range(1)), heads = int(state.range(2)),
            head_dim = int(state.range(3));
  Exec exec;
  const std::int64_t rows = std::int64_t(reqs) * len;
  rk::RowTensor<float, Mem> cache("cache", rows, head_dim), q("q", reqs, heads * head_dim),
      out("out", reqs, heads * head_dim);
  fill(cache, 6);
  fill(q, 7);
  Kokkos::View<int*, Mem> cu("cu", reqs + 1);
  auto cu_h = Kokkos::create_mirror_view(cu);
  for (int b = 0; b <= reqs; ++b) cu_h(b) = b * len;
  Kokkos::deep_copy(cu, cu_h);
  const rk::AttentionParams p{head_dim, rk::default_softmax_scale(head_dim), 0};
  decode_vs_copy(state, rows, reqs, heads, head_dim, [&] {
    rk::attention_decode(exec, q, cache, cu, out, p);
    exec.fence();
  });
}
BENCHMARK(BM_DecodeAttention)
    ->ArgNames({"reqs", "len", "heads", "head_dim"})
    ->Args({8, 4096, 1, 512})
    ->Args({8, 4096, 2, 512})
    ->Args({8, 4096, 8, 512})
    ->Args({8, 4096, 16, 128})
    ->Args({64, 1024, 1, 128})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);


// The same through a paged cache (blocks of 16 rows, the requests' blocks interleaved in the pool):
// the kernel reads through the block table, so it should match the contiguous row.
void BM_DecodeAttentionPaged(benchmark::State& state) {
  const int reqs = int(state.range(0)), len = int(state.range(1)), heads = int(state.range(2)),
            head_dim = int(state.range(3)), bs = 16;
  Exec exec;
  const int blocks = len / bs;
  rk::PagedKvCache<float, Mem> cache({1, head_dim, bs, reqs * blocks, reqs, blocks});
  rk::RowTensor<float, Mem> piece("piece", bs, head_dim), q("q", reqs, heads * head_dim),
      out("out", reqs, heads * head_dim);
  fill(q, 7);
  for (int k = 0; k < blocks; ++k)
    for (int b = 0; b < reqs; ++b) {
      fill(piece, unsigned(100 + k * reqs + b));
      cache.append(exec, 0, b, piece);
    }
  Kokkos::View<int*, Mem> slots("slots", reqs);
  auto slots_h = Kokkos::create_mirror_view(slots);
  for (int b = 0; b < reqs; ++b) slots_h(b) = b;
  Kokkos::deep_copy(slots, slots_h);
  const auto kv = cache.view(0, slots);
  const std::int64_t rows = std::int64_t(reqs) * len;
  const rk::AttentionParams p{head_dim, rk::default_softmax_scale(head_dim), 0};
  decode_vs_copy(state, rows, reqs, heads, head_dim, [&] {
    rk::attention_decode(exec, q, kv, out, p);
    exec.fence();
  });
}
BENCHMARK(BM_DecodeAttentionPaged)
    ->ArgNames({"reqs", "len", "heads", "head_dim"})
    ->Args({8, 4096, 1, 512})
    ->Args({8, 4096, 8, 512})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
