// Kernel throughput paired with a baseline measured alternately in the same run, so the ratio is
// meaningful on a noisy shared machine: linear and the routed experts against OpenBLAS
// single-threaded sgemm on the same shapes (GFLOP/s), the expert grouping against a plain counting
// sort (million slots/s), decode attention against a STREAM-like copy
// of as many bytes as the KV cache (GB/s), contiguous and paged. The reported time is relayout's.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <relayout/kernels.hpp>
#include <type_traits>
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
  relayout::RowsView<float, Mem> x("x", m, k), w("w", n, k), y("y", m, n), y_blas("y_blas", m, n);
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

// ---- the GEMM dispatch: the packed kernel vs KokkosBlas::gemm, both through linear --------------

#if defined(RELAYOUT_HAVE_KOKKOS_KERNELS)
// The two sides of impl::gemm_dispatch on one shape, alternately: "relayout" is the packed kernel,
// "kokkosblas" the vendor GEMM (the host BLAS Kokkos Kernels links, one thread). ratio > 1: the
// packed kernel is faster. Shapes: a 512 x 512 layer and the experts' gate+up and down GEMMs.
void BM_GemmDispatch(benchmark::State& state) {
  openblas_set_num_threads(1);
  const int m = int(state.range(0)), n = int(state.range(1)), k = int(state.range(2));
  Exec exec;
  relayout::RowsView<float, Mem> x("x", m, k), w("w", n, k), y("y", m, n), y_vendor("y_vendor", m, n);
  fill(x, 1);
  fill(w, 2);
  const auto packed = rk::pack_weights(exec, w, rk::GemmBackend::packed);
  const auto vendor = rk::pack_weights(exec, w, rk::GemmBackend::vendor);
  paired(
      state, 2.0 * m * n * k, "GFLOPs", "kokkosblas",
      [&] {
        rk::linear(exec, x, packed, y);
        exec.fence();
      },
      [&] {
        rk::linear(exec, x, vendor, y_vendor);
        exec.fence();
      });
}
void gemm_dispatch_shapes(benchmark::internal::Benchmark* b) {
  const int shapes[][2] = {{512, 512}, {1024, 2048}, {2048, 512}};  // out x in
  for (const auto& s : shapes)
    for (const int rows : {1, 8, 64, 256, 1024}) b->Args({rows, s[0], s[1]});
  // One expert's GEMMs in the demo layer (hidden 512, intermediate 256, ~256 rows an expert):
  // gate/up fused and down at moe_tp 1, and each rank's halves at moe_tp 2.
  const int experts[][2] = {{512, 256}, {256, 512}, {512, 128}};
  for (const auto& s : experts) b->Args({256, s[0], s[1]});
}
BENCHMARK(BM_GemmDispatch)
    ->ArgNames({"rows", "out", "in"})
    ->Apply(gemm_dispatch_shapes)
    ->MinTime(0.3)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
#endif

// bf16 rows and weights (fp32 accumulation) against relayout's own fp32 linear, same shape: half
// the bytes of the weights. `kernel` 2: AMX-BF16 tiles, 1: AVX512-BF16 (each skipped where the CPU
// or the OS lacks it), 0: the portable kernel that widens to fp32 (what AVX2 machines run).
void BM_LinearBf16(benchmark::State& state) {
  const int m = int(state.range(0)), n = int(state.range(1)), k = int(state.range(2));
  const auto kernel = state.range(3) == 2   ? rk::impl::Bf16Kernel::amx_bf16
                      : state.range(3) == 1 ? rk::impl::Bf16Kernel::avx512_bf16
                                            : rk::impl::Bf16Kernel::widen_fp32;
  if (state.range(3) == 2 && !rk::impl::amx_bf16_runnable()) {
    state.SkipWithError("no AMX-BF16 on this CPU, or Linux did not grant its state");
    return;
  }
  if (state.range(3) == 1 && !(rk::isa::cpu_has("avx512f") && rk::isa::cpu_has("avx512_bf16"))) {
    state.SkipWithError("no AVX512-BF16 on this CPU");
    return;
  }
  Exec exec;
  relayout::RowsView<float, Mem> x("x", m, k), w("w", n, k), y("y", m, n);
  relayout::RowsView<relayout::bf16, Mem> xb("xb", m, k), wb("wb", n, k), yb("yb", m, n);
  fill(x, 1);
  fill(w, 2);
  for (std::size_t i = 0; i < x.span(); ++i) xb.data()[i] = relayout::bf16(x.data()[i]);
  for (std::size_t i = 0; i < w.span(); ++i) wb.data()[i] = relayout::bf16(w.data()[i]);
  const auto packed = rk::pack_weights(exec, w);
  const auto packed_b = rk::pack_weights(exec, wb);
  Kokkos::View<relayout::bf16*, Mem> a_pack("a_pack", std::size_t(rk::impl::gemm_a_pack_size_bf16<Exec>(m, k)));
  paired(
      state, 2.0 * m * n * k, "GFLOPs", "fp32",
      [&] {
        rk::impl::gemm_packed_bf16<Exec, relayout::bf16>(exec, xb.data(), k, nullptr, m, k, packed_b.matrix(0), n, yb.data(), n, nullptr,
                                   false, a_pack.data(), kernel);
        exec.fence();
      },
      [&] {
        rk::linear(exec, x, packed, y);
        exec.fence();
      });
  state.SetLabel(state.range(3) == 2 ? "amx_bf16" : state.range(3) ? "avx512_bf16" : "widened to fp32");
}
BENCHMARK(BM_LinearBf16)
    ->ArgNames({"rows", "out", "in", "kernel"})
    ->ArgsProduct({{1, 4, 16, 64, 256}, {2048}, {2048}, {2, 1, 0}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// ---- routed experts vs gather + sgemm + SwiGLU + sgemm per expert ------------------------------

void BM_ExpertFfn(benchmark::State& state) {
  openblas_set_num_threads(1);
  const int tokens = int(state.range(0)), experts = int(state.range(1)), top_k = int(state.range(2)),
            hidden = int(state.range(3)), inter = int(state.range(4));
  Exec exec;
  relayout::RowsView<float, Mem> x("x", tokens, hidden);
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
  const relayout::TopK<float, Exec> route(ids, relayout::RowsView<float, Mem>("w", tokens, top_k));
  const auto packed = rk::pack_experts(
      exec, Kokkos::subview(w13, Kokkos::ALL(), std::make_pair(0, inter), Kokkos::ALL()),
      Kokkos::subview(w13, Kokkos::ALL(), std::make_pair(inter, 2 * inter), Kokkos::ALL()), w2);
  relayout::MoeScratch<float, Exec> ws;
  const auto groups = relayout::group_by_expert(exec, x, route, 0, experts, ws);
  const std::vector<std::int64_t> offsets = groups.batch.offsets;
  const std::int64_t rows = groups.batch.rows();
  relayout::RowsView<float, Mem> y("y", rows, hidden), y_blas("y_blas", rows, hidden);

  // Ours groups the rows (the bridge's group_by_expert, row gather included) and runs the experts;
  // the baseline gathers each expert's rows with memcpy and runs sgemm, SwiGLU, sgemm.
  auto slot_of = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), groups.slot_of);
  std::vector<int> slot_token(static_cast<std::size_t>(rows));
  for (int t = 0; t < tokens; ++t)
    for (int j = 0; j < top_k; ++j)
      if (slot_of(t, j) >= 0) slot_token[std::size_t(slot_of(t, j))] = t;
  std::int64_t max_rows = 0;
  for (int e = 0; e < experts; ++e) max_rows = std::max(max_rows, offsets[e + 1] - offsets[e]);
  std::vector<float> xg(std::size_t(max_rows) * hidden), gu(std::size_t(max_rows) * 2 * inter),
      h(std::size_t(max_rows) * inter);
  const double flops = 2.0 * rows * (2.0 * inter * hidden + double(hidden) * inter);
  paired(
      state, flops, "GFLOPs", "openblas",
      [&] {
        const auto g = relayout::group_by_expert(exec, x, route, 0, experts, ws);
        rk::expert_ffn(exec, g.batch, packed, y);
        exec.fence();
      },
      [&] {
        for (int e = 0; e < experts; ++e) {
          const int begin = int(offsets[e]), m = int(offsets[e + 1] - offsets[e]);
          if (m == 0) continue;
          for (int i = 0; i < m; ++i)
            std::memcpy(&xg[std::size_t(i) * hidden], &x(slot_token[std::size_t(begin + i)], 0), sizeof(float) * hidden);
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
  state.counters["rows_per_expert"] = double(rows) / experts;
}

BENCHMARK(BM_ExpertFfn)
    ->ArgNames({"tokens", "experts", "top_k", "hidden", "inter"})
    ->Args({256, 8, 2, 2048, 512})    // 64 rows per expert
    ->Args({128, 8, 8, 1024, 512})    // every expert sees every token: 128 rows
    ->Args({64, 16, 2, 2048, 256})    // 8 rows per expert (decode-sized)
    ->Args({1024, 16, 4, 512, 256})   // the demo layer at np 1: 256 rows per expert
    ->Args({1024, 16, 4, 512, 128})   // its moe_tp 2 share
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// ---- expert grouping vs a plain counting sort -------------------------------------------------

// relayout::group_by_expert (the grouping local_experts, EpBuffer and the bridge run) against a
// host counting sort with memcpy row gathers, on DeepSeek-sized routing: many experts, top-8.
void BM_GroupByExpert(benchmark::State& state) {
  const int tokens = int(state.range(0)), experts = int(state.range(1)), top_k = int(state.range(2)),
            hidden = int(state.range(3));
  Exec exec;
  relayout::RowsView<float, Mem> x("x", tokens, hidden);
  fill(x, 6);
  const relayout::TopK<float, Exec> route(tokens, top_k);
  auto ids_h = Kokkos::create_mirror_view(route.ids);
  std::mt19937 gen(7);
  for (int t = 0; t < tokens; ++t)
    for (int j = 0; j < top_k; ++j) ids_h(t, j) = int((t * 37 + j * (experts / top_k) + gen() % 3) % experts);
  Kokkos::deep_copy(route.ids, ids_h);
  relayout::MoeScratch<float, Exec> ws;
  std::vector<std::int64_t> starts(std::size_t(experts) + 1), slot(std::size_t(tokens) * top_k);
  std::vector<float> gathered(std::size_t(tokens) * top_k * hidden);
  paired(
      state, double(tokens) * top_k * 1e3, "Mslots", "counting_sort",
      [&] {
        const auto g = relayout::group_by_expert(exec, x, route, 0, experts, ws);
        benchmark::DoNotOptimize(g.batch.x.data());
        exec.fence();
      },
      [&] {
        std::fill(starts.begin(), starts.end(), 0);
        for (int s = 0; s < tokens * top_k; ++s) ++starts[std::size_t(ids_h(s / top_k, s % top_k)) + 1];
        for (int e = 0; e < experts; ++e) starts[e + 1] += starts[e];
        for (int s = 0; s < tokens * top_k; ++s) {
          const std::int64_t p = starts[std::size_t(ids_h(s / top_k, s % top_k))]++;
          std::memcpy(&gathered[std::size_t(p) * hidden], &x(s / top_k, 0), sizeof(float) * hidden);
        }
        benchmark::DoNotOptimize(gathered.data());
      });
}
BENCHMARK(BM_GroupByExpert)
    ->ArgNames({"tokens", "experts", "top_k", "hidden"})
    ->Args({8192, 256, 8, 64})  // prefill-sized: the case a scan per expert made 60x slower
    ->Args({64, 256, 8, 64})    // decode-sized
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// ---- routing ----------------------------------------------------------------------------------

// route() (softmax, top-k, renormalised) against what an engine writes by hand: the row's softmax
// once, std::partial_sort of the expert ids by (score, lower id), renormalised. Mrows: million rows
// a second.
void BM_Route(benchmark::State& state) {
  const int tokens = int(state.range(0)), experts = int(state.range(1)), top_k = int(state.range(2));
  Exec exec;
  relayout::RowsView<float, Mem> logits("logits", tokens, experts);
  fill(logits, 11);
  const relayout::TopK<float, Exec> out(tokens, top_k);
  const rk::RouterConfig config{top_k, rk::Scoring::softmax, 1, 1, true, 1.0};
  std::vector<int> ids(static_cast<std::size_t>(tokens) * top_k), order(static_cast<std::size_t>(experts));
  std::vector<float> weights(static_cast<std::size_t>(tokens) * top_k), p(static_cast<std::size_t>(experts));
  paired(
      state, double(tokens) * 1e3, "Mrows", "partial_sort",
      [&] {
        rk::route(exec, logits, config, out.ids, out.weights);
        exec.fence();
        benchmark::DoNotOptimize(out.weights.data());
      },
      [&] {
        for (int t = 0; t < tokens; ++t) {
          float mx = logits(t, 0), sum = 0;
          for (int e = 1; e < experts; ++e) mx = std::max(mx, logits(t, e));
          for (int e = 0; e < experts; ++e) sum += p[std::size_t(e)] = std::exp(logits(t, e) - mx);
          for (int e = 0; e < experts; ++e) p[std::size_t(e)] /= sum, order[std::size_t(e)] = e;
          std::partial_sort(order.begin(), order.begin() + top_k, order.end(), [&](int a, int b) {
            return p[std::size_t(a)] > p[std::size_t(b)] || (p[std::size_t(a)] == p[std::size_t(b)] && a < b);
          });
          float total = 0;
          for (int j = 0; j < top_k; ++j) total += p[std::size_t(order[std::size_t(j)])];
          for (int j = 0; j < top_k; ++j) {
            ids[std::size_t(t) * top_k + j] = order[std::size_t(j)];
            weights[std::size_t(t) * top_k + j] = p[std::size_t(order[std::size_t(j)])] / total;
          }
        }
        benchmark::DoNotOptimize(weights.data());
      });
}
BENCHMARK(BM_Route)
    ->ArgNames({"tokens", "experts", "top_k"})
    ->Args({1024, 16, 4})   // the demo layer's router
    ->Args({1024, 256, 8})  // DeepSeek-V3-sized
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
// not by memory: fma_bound_ratio = fma_peak / (flops per byte) / copy. kv_bytes: bytes per cached
// element (4 fp32, 2 bf16); q and out are fp32 either way.
template <class Run>
void decode_vs_copy(benchmark::State& state, std::int64_t rows, int reqs, int heads, int head_dim, Run&& run,
                    double kv_bytes = 4.0) {
  // Bytes the kernel must move: the cache once, q and out. The copy moves its bytes twice (read +
  // write), so it copies half as many bytes as the cache holds: both sides move the same number.
  const double bytes = kv_bytes * double(rows) * head_dim + 4.0 * 2.0 * reqs * heads * head_dim;
  const double flops = 4.0 * double(rows) * head_dim * heads;
  std::vector<float> src(std::size_t(rows) * head_dim, 1.f), dst(src.size(), 0.f);
  const std::size_t copy_n = std::size_t(double(src.size()) * kv_bytes / 8.0);
  paired(state, bytes, "GBps", "copy", run, [&] {
    std::memcpy(dst.data(), src.data() + copy_n, copy_n * sizeof(float));
    benchmark::DoNotOptimize(dst.data());
  });
  const double gbps = state.counters["relayout_GBps"], copy = state.counters["copy_GBps"];
  const double peak = fma_peak_gflops();
  state.counters["relayout_GFLOPs"] = gbps * flops / bytes;
  state.counters["fma_peak_GFLOPs"] = peak;
  state.counters["fma_bound_ratio"] = peak * bytes / flops / copy;
  // The roofline of this kernel on this core, both bounds measured in this run: the bytes at copy
  // speed, or the flops at the FMA peak, whichever takes longer. 1.0 is the best it can do.
  state.counters["roofline_ratio"] = gbps / std::min(copy, peak * bytes / flops);
}

// A cache of KvT (float, or bf16: fp32 values rounded to nearest even) filled like fill().
template <class KvT, class V>
void fill_cache(const V& v, unsigned seed) {
  if constexpr (std::is_same_v<KvT, float>) {
    fill(v, seed);
  } else {
    relayout::RowsView<float, Mem> f("f", v.extent(0), v.extent(1));
    fill(f, seed);
    auto fh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), f);
    auto h = Kokkos::create_mirror_view(v);
    for (std::size_t i = 0; i < h.span(); ++i) h.data()[i] = KvT(fh.data()[i]);
    Kokkos::deep_copy(v, h);
  }
}

// The row offsets of `reqs` requests of `len` rows each: 0, len, 2 len, ...
Kokkos::View<int*, Mem> uniform_offsets(int reqs, int len) {
  Kokkos::View<int*, Mem> cu("cu", reqs + 1);
  auto cu_h = Kokkos::create_mirror_view(cu);
  for (int b = 0; b <= reqs; ++b) cu_h(b) = b * len;
  Kokkos::deep_copy(cu, cu_h);
  return cu;
}

template <class KvT>
void decode_attention(benchmark::State& state) {
  const int reqs = int(state.range(0)), len = int(state.range(1)), heads = int(state.range(2)),
            head_dim = int(state.range(3));
  Exec exec;
  const std::int64_t rows = std::int64_t(reqs) * len;
  relayout::RowsView<KvT, Mem> cache("cache", rows, head_dim);
  relayout::RowsView<float, Mem> q("q", reqs, heads * head_dim), out("out", reqs, heads * head_dim);
  fill_cache<KvT>(cache, 6);
  fill(q, 7);
  const Kokkos::View<int*, Mem> cu = uniform_offsets(reqs, len);
  const rk::AttentionParams p{head_dim, rk::default_softmax_scale(head_dim), 0};
  decode_vs_copy(
      state, rows, reqs, heads, head_dim,
      [&] {
        rk::attention_decode(exec, q, cache, cu, out, p);
        exec.fence();
      },
      double(sizeof(KvT)));
}
void BM_DecodeAttention(benchmark::State& state) { decode_attention<float>(state); }
BENCHMARK(BM_DecodeAttention)
    ->ArgNames({"reqs", "len", "heads", "head_dim"})
    ->Args({8, 4096, 1, 512})
    ->Args({8, 4096, 2, 512})
    ->Args({8, 4096, 8, 512})
    ->Args({8, 4096, 16, 128})
    ->Args({64, 1024, 1, 128})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);


// Causal prefill (attention_prefill) of `reqs` requests of `len` rows, heads sharing one KV head, as
// a layer's attention runs it (the heads of one attention-TP rank: 8 heads over attn_tp 2 leave 4).
// GFLOP/s counts 4 flops per (query, key, element, head) over the causal keys; fma_ratio is that
// rate over the FMA peak measured in the same run (prefill holds its keys in cache: the bound is
// the arithmetic).
void BM_PrefillAttention(benchmark::State& state) {
  const int reqs = int(state.range(0)), len = int(state.range(1)), heads = int(state.range(2)),
            head_dim = int(state.range(3));
  Exec exec;
  const std::int64_t rows = std::int64_t(reqs) * len;
  relayout::RowsView<float, Mem> kv("kv", rows, head_dim), q("q", rows, heads * head_dim),
      out("out", rows, heads * head_dim);
  fill(kv, 6);
  fill(q, 7);
  const Kokkos::View<int*, Mem> cu = uniform_offsets(reqs, len);
  const rk::AttentionParams p{head_dim, rk::default_softmax_scale(head_dim), 0};
  const double flops = 4.0 * reqs * (double(len) * (len + 1) / 2) * head_dim * heads;
  rk::attention_prefill(exec, q, kv, cu, out, p);
  exec.fence();
  double t = 0;
  for (auto _ : state) {
    const double s = seconds([&] {
      rk::attention_prefill(exec, q, kv, cu, out, p);
      exec.fence();
    });
    t += s;
    state.SetIterationTime(s);
  }
  const double gflops = flops * double(state.iterations()) / t * 1e-9, peak = fma_peak_gflops();
  state.counters["relayout_GFLOPs"] = gflops;
  state.counters["fma_peak_GFLOPs"] = peak;
  state.counters["fma_ratio"] = gflops / peak;
}
BENCHMARK(BM_PrefillAttention)
    ->ArgNames({"reqs", "len", "heads", "head_dim"})
    ->Args({2, 512, 1, 64})
    ->Args({2, 512, 2, 64})
    ->Args({2, 512, 4, 64})
    ->Args({2, 512, 8, 64})
    ->Args({2, 512, 16, 64})
    ->Args({2, 512, 4, 128})
    ->Args({2, 512, 16, 128})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// The same through a paged cache (blocks of 16 rows, the requests' blocks interleaved in the pool):
// the kernel reads through the block table, so it should match the contiguous row.
template <class KvT>
void decode_attention_paged(benchmark::State& state) {
  const int reqs = int(state.range(0)), len = int(state.range(1)), heads = int(state.range(2)),
            head_dim = int(state.range(3)), bs = 16;
  Exec exec;
  const int blocks = len / bs;
  rk::PagedKvCache<KvT, Mem> cache({1, head_dim, bs, reqs * blocks, reqs, blocks});
  relayout::RowsView<KvT, Mem> piece("piece", bs, head_dim);
  relayout::RowsView<float, Mem> q("q", reqs, heads * head_dim), out("out", reqs, heads * head_dim);
  fill(q, 7);
  for (int k = 0; k < blocks; ++k)
    for (int b = 0; b < reqs; ++b) {
      fill_cache<KvT>(piece, unsigned(100 + k * reqs + b));
      cache.append(exec, 0, b, piece);
    }
  Kokkos::View<int*, Mem> slots("slots", reqs);
  auto slots_h = Kokkos::create_mirror_view(slots);
  for (int b = 0; b < reqs; ++b) slots_h(b) = b;
  Kokkos::deep_copy(slots, slots_h);
  const auto kv = cache.view(0, slots);
  const std::int64_t rows = std::int64_t(reqs) * len;
  const rk::AttentionParams p{head_dim, rk::default_softmax_scale(head_dim), 0};
  decode_vs_copy(
      state, rows, reqs, heads, head_dim,
      [&] {
        rk::attention_decode(exec, q, kv, out, p);
        exec.fence();
      },
      double(sizeof(KvT)));
}
void BM_DecodeAttentionPaged(benchmark::State& state) { decode_attention_paged<float>(state); }
BENCHMARK(BM_DecodeAttentionPaged)
    ->ArgNames({"reqs", "len", "heads", "head_dim"})
    ->Args({8, 4096, 1, 512})
    ->Args({8, 4096, 8, 512})
    ->Args({8, 4096, 16, 128})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// The same decodes over a bf16 cache (fp32 q, out and arithmetic): half the bytes of the cache,
// counted as such, so roofline_ratio stays against the copy of those bytes or the FMA peak.
void BM_DecodeAttentionBf16(benchmark::State& state) { decode_attention<relayout::bf16>(state); }
BENCHMARK(BM_DecodeAttentionBf16)
    ->ArgNames({"reqs", "len", "heads", "head_dim"})
    ->Args({8, 4096, 1, 512})
    ->Args({8, 4096, 8, 512})
    ->Args({8, 4096, 16, 128})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
void BM_DecodeAttentionPagedBf16(benchmark::State& state) { decode_attention_paged<relayout::bf16>(state); }
BENCHMARK(BM_DecodeAttentionPagedBf16)
    ->ArgNames({"reqs", "len", "heads", "head_dim"})
    ->Args({8, 4096, 1, 512})
    ->Args({8, 4096, 8, 512})
    ->Args({8, 4096, 16, 128})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
