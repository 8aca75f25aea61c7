// An inference engine's MoE hand-over built on the installed relayout package, the way an engine
// team would write it: its own communicator (split from MPI_COMM_WORLD), its own router, its own
// double-precision experts (a two-layer tanh MLP per expert, not SwiGLU, with a shared expert),
// its own execution-space instance. For every bridge path 4 ranks allow it runs the hand-over on
// uneven per-DP-group batches (one group idle) and compares every row with a serial computation
// of its own. Then the same engine with an fp32 residual stream and a bf16 MoE: its rows converted
// with kernels::convert_rows, MoeBridge<C, bf16> moving 2-byte rows, its experts rounding their
// outputs to bf16, checked within a bound derived from the bf16 roundings. Last, the EP layer alone
// (EpBuffer: dispatch in low-latency mode, the handle, combine), as a DeepEP user would call it.
// Prints one line per path with the max error and the element type; exits 1 on any mismatch.
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <string>
#include <vector>

#include <relayout/relayout.hpp>

namespace {

using Exec = Kokkos::DefaultExecutionSpace;
using Scalar = double;
using View = relayout::RowsView<Scalar, Exec>;

constexpr int kHidden = 12, kExperts = 8, kTopK = 3, kInter = 8, kSharedInter = 4;

// Deterministic parameters: any rank computes the same value for the same index.
Scalar param(int tensor, int i, int j) {
  const std::uint64_t h = (std::uint64_t(tensor) * 1000003u + std::uint64_t(i) * 7919u + std::uint64_t(j) * 104729u) % 2003u;
  return (Scalar(h) / 2003.0 - 0.5) * 0.6;
}
Scalar input(std::int64_t token, int f) { return std::sin(0.37 * Scalar(token) + 0.11 * f) + 0.05 * f; }

// The engine's router: a gate projection, softmax, top-k (ties to the lower id), renormalised.
struct Router {
  int top_k() const { return kTopK; }
  static void route_row(const Scalar* x, int* ids, Scalar* w) {
    Scalar logit[kExperts];
    for (int e = 0; e < kExperts; ++e) {
      logit[e] = 0;
      for (int f = 0; f < kHidden; ++f) logit[e] += param(1, e, f) * x[f];
    }
    bool taken[kExperts] = {};
    Scalar sum = 0;
    for (int k = 0; k < kTopK; ++k) {
      int best = -1;
      for (int e = 0; e < kExperts; ++e)
        if (!taken[e] && (best < 0 || logit[e] > logit[best])) best = e;
      taken[best] = true;
      ids[k] = best;
      w[k] = std::exp(logit[best]);
      sum += w[k];
    }
    for (int k = 0; k < kTopK; ++k) w[k] /= sum;
  }
  void operator()(const Exec& exec, const View& x, relayout::TopK<Scalar, Exec>& out) const {
    auto xh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x);
    auto ih = Kokkos::create_mirror_view(out.ids);
    auto wh = Kokkos::create_mirror_view(out.weights);
    for (std::size_t i = 0; i < x.extent(0); ++i) route_row(&xh(i, 0), &ih(i, 0), &wh(i, 0));
    Kokkos::deep_copy(exec, out.ids, ih);
    Kokkos::deep_copy(exec, out.weights, wh);
    exec.fence();
  }
};

// Expert e: y = A_e tanh(B_e x) with an intermediate of kInter; a moe_tp member holds a slice of the
// intermediate and returns its partial sum. The shared expert has its own tensors (e = kExperts).
Scalar mlp(int e, const Scalar* x, int f_out, int i_begin, int i_end, int inter) {
  Scalar y = 0;
  for (int i = i_begin; i < i_end; ++i) {
    Scalar h = 0;
    for (int f = 0; f < kHidden; ++f) h += param(10 + 2 * e, i, f) * x[f];
    y += param(11 + 2 * e, f_out, i) * std::tanh(h);
  }
  static_cast<void>(inter);
  return y;
}

struct Experts {
  int moe_tp = 1, moe_tp_rank = 0;
  std::pair<int, int> slice(int inter) const { return {inter * moe_tp_rank / moe_tp, inter * (moe_tp_rank + 1) / moe_tp}; }
  void operator()(const Exec& exec, const relayout::ExpertBatch<Scalar, Exec>& b, const View& y) const {
    auto xh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b.x);
    auto yh = Kokkos::create_mirror_view(y);
    const auto [i0, i1] = slice(kInter);
    for (int e = 0; e < b.experts(); ++e)
      for (std::int64_t r = b.offset(e); r < b.offset(e) + b.count(e); ++r)
        for (int f = 0; f < kHidden; ++f) yh(r, f) = mlp(b.first_expert + e, &xh(r, 0), f, i0, i1, kInter);
    Kokkos::deep_copy(exec, y, yh);
    exec.fence();
  }
  void shared(const Exec& exec, const View& x, const View& y) const {
    auto xh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x);
    auto yh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y);
    const auto [i0, i1] = slice(kSharedInter);
    for (std::size_t r = 0; r < x.extent(0); ++r)
      for (int f = 0; f < kHidden; ++f) yh(r, f) += mlp(kExperts, &xh(r, 0), f, i0, i1, kSharedInter);
    Kokkos::deep_copy(exec, y, yh);
    exec.fence();
  }
};

// The serial answer for one row: the weighted top-k experts plus the shared expert, unsharded.
void serial_moe(const Scalar* x, Scalar* y) {
  int ids[kTopK];
  Scalar w[kTopK];
  Router::route_row(x, ids, w);
  for (int f = 0; f < kHidden; ++f) {
    y[f] = mlp(kExperts, x, f, 0, kSharedInter, kSharedInter);
    for (int k = 0; k < kTopK; ++k) y[f] += w[k] * mlp(ids[k], x, f, 0, kInter, kInter);
  }
}

// The same engine with bf16 rows in its MoE (an fp32 residual stream around it): the router reads
// the rows widened (exactly) and keeps fp32 weights (TopK<bf16>::weights are compute_t<bf16>);
// the experts compute in double from the widened rows and round each output to bf16.
using View16 = relayout::RowsView<relayout::bf16, Exec>;
using View32 = relayout::RowsView<float, Exec>;
double widen(relayout::bf16 v) { return double(float(v)); }

struct Router16 {
  int top_k() const { return kTopK; }
  void operator()(const Exec& exec, const View16& x, relayout::TopK<relayout::bf16, Exec>& out) const {
    auto xh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x);
    auto ih = Kokkos::create_mirror_view(out.ids);
    auto wh = Kokkos::create_mirror_view(out.weights);
    Scalar row[kHidden], w[kTopK];
    for (std::size_t i = 0; i < x.extent(0); ++i) {
      for (int f = 0; f < kHidden; ++f) row[f] = widen(xh(i, f));
      Router::route_row(row, &ih(i, 0), w);
      for (int k = 0; k < kTopK; ++k) wh(i, k) = float(w[k]);
    }
    Kokkos::deep_copy(exec, out.ids, ih);
    Kokkos::deep_copy(exec, out.weights, wh);
    exec.fence();
  }
};

struct Experts16 {
  Experts base;  // the moe_tp slice
  void operator()(const Exec& exec, const relayout::ExpertBatch<relayout::bf16, Exec>& b, const View16& y) const {
    auto xh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b.x);
    auto yh = Kokkos::create_mirror_view(y);
    const auto [i0, i1] = base.slice(kInter);
    Scalar row[kHidden];
    for (int e = 0; e < b.experts(); ++e)
      for (std::int64_t r = b.offset(e); r < b.offset(e) + b.count(e); ++r) {
        for (int f = 0; f < kHidden; ++f) row[f] = widen(xh(r, f));
        for (int f = 0; f < kHidden; ++f) yh(r, f) = relayout::bf16(float(mlp(b.first_expert + e, row, f, i0, i1, kInter)));
      }
    Kokkos::deep_copy(exec, y, yh);
    exec.fence();
  }
  void shared(const Exec& exec, const View16& x, const View16& y) const {
    auto xh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x);
    auto yh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y);
    const auto [i0, i1] = base.slice(kSharedInter);
    Scalar row[kHidden];
    for (std::size_t r = 0; r < x.extent(0); ++r) {
      for (int f = 0; f < kHidden; ++f) row[f] = widen(xh(r, f));
      for (int f = 0; f < kHidden; ++f)
        yh(r, f) = relayout::bf16(float(widen(yh(r, f)) + mlp(kExperts, row, f, i0, i1, kSharedInter)));
    }
    Kokkos::deep_copy(exec, y, yh);
    exec.fence();
  }
};

struct Case {
  const char* name;
  relayout::BridgePath path;  // the path the case is about; skipped where np does not give it
  relayout::LayoutConfig config;
  relayout::BridgeOptions options;
};

// One case's groups on the engine's communicator and this rank's batch: DP group g has 5 + 3g
// tokens, except the last group, which is idle this step; this rank's tokens are [first, first + n).
struct CaseRanks {
  relayout::MpiCommunicator world;
  relayout::ProcessGroups pg;  // refers to world: CaseRanks is neither copied nor moved
  std::int64_t first = 0, n = 0;
  CaseRanks(MPI_Comm comm, const Case& c)
      : world(relayout::MpiCommunicator::adopt(comm)), pg(relayout::RuntimeLayout(c.config), world) {
    const relayout::Widths& w = pg.layout().widths();
    const auto tokens_of = [&](int g) { return g == w.attn_dp - 1 && w.attn_dp > 1 ? 0 : 5 + 3 * g; };
    for (int g = 0; g < pg.coords().attn_dp_rank; ++g) first += tokens_of(g);
    n = tokens_of(pg.coords().attn_dp_rank);
  }
  CaseRanks(const CaseRanks&) = delete;
  CaseRanks& operator=(const CaseRanks&) = delete;
  std::string path() const { return std::string(relayout::to_string(pg.layout().bridge_path())); }
};

// Runs one layout; returns the max error over every rank's rows (every rank gets the same value).
double run_case(MPI_Comm comm, const Case& c, std::string& path) {
  using namespace relayout;
  const CaseRanks cr(comm, c);
  const ProcessGroups& pg = cr.pg;
  const MpiCommunicator& world = cr.world;
  const RankCoords k = pg.coords();
  const Widths& w = pg.layout().widths();
  path = cr.path();
  const std::int64_t first = cr.first, n = cr.n;

  Exec exec;  // the engine's instance; relayout fences only this one
  View x("x", std::size_t(n), kHidden);
  auto xh = Kokkos::create_mirror_view(x);
  for (std::int64_t i = 0; i < n; ++i)
    for (int f = 0; f < kHidden; ++f) xh(i, f) = input(first + i, f);
  Kokkos::deep_copy(exec, x, xh);
  exec.fence();

  MoeBridge<MpiCommunicator, Scalar, Exec> bridge(pg, kExperts, c.options);
  const std::vector<std::int64_t> counts = gather_num_tokens(pg, n);  // once per step, for every layer
  Router router;
  Experts experts{w.moe_tp, k.moe_tp_rank};
  // Two layers on the same rows: the second must find every buffer it needs in the bridge's memory.
  double err = 0.0;
  std::int64_t allocs_after_first = 0;
  for (int layer = 0; layer < 2; ++layer) {
    const auto y = bridge.run(exec, Rows<Scalar, Replicated<AttnTp>, DpLocal, Exec>(x), router, experts,
                              {.global_num_tokens = counts});
    if (layer == 0) allocs_after_first = bridge.allocations();
    if (y.rows() != n) {
      err = 1e30;
      continue;
    }
    auto yh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y.view());
    Scalar ref[kHidden];
    for (std::int64_t i = 0; i < n; ++i) {
      serial_moe(&xh(i, 0), ref);
      for (int f = 0; f < kHidden; ++f) {
        const double d = std::abs(double(yh(i, f) - ref[f]));
        err = std::isfinite(d) ? std::max(err, d) : 1e30;
      }
    }
  }
  if (bridge.allocations() != allocs_after_first) {
    std::fprintf(stderr, "engine: rank %d: the second layer allocated %lld EP buffer(s) the workspace already had\n",
                 k.rank, static_cast<long long>(bridge.allocations() - allocs_after_first));
    err = 1e30;
  }
  all_reduce_in_place(world, std::span<double>(&err, 1), ReduceOp::max);
  return err;
}

// The bf16 MoE of one layout: fp32 rows -> bf16 (convert_rows), the hand-over, bf16 -> fp32. Each
// output element is held to bound = 8 u S + 1e-6, u = 2^-8 and S = sum_k w_k |y_k| + |shared| of
// the serial computation on the same bf16 inputs: the experts' outputs, the shared expert's sum
// into y, the weighted combine and at most np - 1 sums of partials over ranks each round once by
// u relative to a value within S, under 8 roundings in all on 4 ranks. Returns the largest
// error / bound over every rank's rows (<= 1 passes).
double run_bf16_case(MPI_Comm comm, const Case& c, std::string& path) {
  using namespace relayout;
  const CaseRanks cr(comm, c);
  const ProcessGroups& pg = cr.pg;
  const RankCoords k = pg.coords();
  const Widths& w = pg.layout().widths();
  path = cr.path();
  const std::int64_t first = cr.first, n = cr.n;

  Exec exec;
  View32 residual("residual", std::size_t(n), kHidden);  // the engine's fp32 stream
  auto rh = Kokkos::create_mirror_view(residual);
  for (std::int64_t i = 0; i < n; ++i)
    for (int f = 0; f < kHidden; ++f) rh(i, f) = float(input(first + i, f));
  Kokkos::deep_copy(exec, residual, rh);
  View16 x("x16", std::size_t(n), kHidden);
  kernels::convert_rows(exec, residual, x);  // rounded once, to nearest even
  MoeBridge<MpiCommunicator, bf16, Exec> bridge(pg, kExperts, c.options);
  const std::vector<std::int64_t> counts = gather_num_tokens(pg, n);
  Router16 router;
  Experts16 experts{{w.moe_tp, k.moe_tp_rank}};
  const auto y = bridge.run(exec, Rows<bf16, Replicated<AttnTp>, DpLocal, Exec>(x), router, experts,
                            {.global_num_tokens = counts});
  double worst = 0.0;
  if (y.rows() != n) worst = 1e30;
  else {
    View32 y32("y32", std::size_t(n), kHidden);
    kernels::convert_rows(exec, y.view(), y32);  // widened exactly
    exec.fence();
    auto yh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y32);
    auto xh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x);
    Scalar row[kHidden], ref[kHidden];
    for (std::int64_t i = 0; i < n; ++i) {
      for (int f = 0; f < kHidden; ++f) row[f] = widen(xh(i, f));
      serial_moe(row, ref);
      int ids[kTopK];
      Scalar wt[kTopK];
      Router::route_row(row, ids, wt);
      for (int f = 0; f < kHidden; ++f) {
        double sum_abs = std::abs(mlp(kExperts, row, f, 0, kSharedInter, kSharedInter));
        for (int j = 0; j < kTopK; ++j) sum_abs += wt[j] * std::abs(mlp(ids[j], row, f, 0, kInter, kInter));
        const double bound = 8.0 * std::ldexp(1.0, -8) * sum_abs + 1e-6;
        const double d = std::abs(double(yh(i, f)) - ref[f]) / bound;
        worst = std::isfinite(d) ? std::max(worst, d) : 1e30;
      }
    }
  }
  all_reduce_in_place(cr.world, std::span<double>(&worst, 1), ReduceOp::max);
  return worst;
}

}  // namespace

// The EP layer used directly, as a DeepEP user would: one EpBuffer on the direct layout (every rank
// its own DP group), a decode-sized step dispatched in low-latency mode, the engine's experts on the
// handle's batch, the combine, the shared expert added by the engine. Returns the max error.
double run_ep_buffer_case(MPI_Comm comm, std::string& path) {
  using namespace relayout;
  int np = 1;
  MPI_Comm_size(comm, &np);
  const Case c{"EpBuffer", BridgePath::direct,
               {.tp = np, .dp = np, .enable_dp_attention = true, .moe_a2a_backend = Backend::deepep}, {}};
  const CaseRanks cr(comm, c);
  path = "direct";
  const std::int64_t first = cr.first, n = cr.n;
  Exec exec;
  View x("x", std::size_t(n), kHidden);
  auto xh = Kokkos::create_mirror_view(x);
  for (std::int64_t i = 0; i < n; ++i)
    for (int f = 0; f < kHidden; ++f) xh(i, f) = input(first + i, f);
  Kokkos::deep_copy(exec, x, xh);
  EpBuffer<MpiCommunicator, Scalar, Exec> buffer(cr.pg, kExperts, {.num_max_dispatch_tokens_per_rank = 32});
  Router router;
  TopK<Scalar, Exec> route(n, kTopK);
  router(exec, x, route);
  const auto handle = buffer.dispatch(exec, Rows<Scalar, RowShard<AttnTp>, DpLocal, Exec>(x, n), route,
                                      {.mode = EpMode::low_latency});
  const auto y = buffer.expert_outputs(handle);
  Experts{}(exec, handle.batch(), y);
  const auto out = buffer.combine(exec, handle, y);
  Experts{}.shared(exec, x, out.view());  // the whole shared expert on this rank's own rows
  auto oh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out.view());
  double err = 0.0;
  Scalar ref[kHidden];
  for (std::int64_t i = 0; i < n; ++i) {
    serial_moe(&xh(i, 0), ref);
    for (int f = 0; f < kHidden; ++f) err = std::max(err, std::abs(double(oh(i, f) - ref[f])));
  }
  all_reduce_in_place(exec, cr.world, std::span<double>(&err, 1), ReduceOp::max);  // the same on every rank
  return err;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  // Its own usage before Kokkos sees the arguments (Kokkos prints its option banner for --help).
  if (argc > 1 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h")) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0)
      std::printf("engine_bridge: an engine's MoE hand-over on the installed relayout, every bridge path the rank "
                  "count allows, checked row by row\nUsage: mpiexec -n N %s   (no options of its own; Kokkos' "
                  "options: --kokkos-help)\n",
                  argv[0]);
    MPI_Finalize();
    return 0;
  }
  int failures = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    int size = 0, rank = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm engine;  // the engine's own communicator
    MPI_Comm_split(MPI_COMM_WORLD, 0, rank, &engine);
    using relayout::Backend;
    using relayout::BridgeRestore;
    using relayout::PaddingMode;
    const int np = size, half = std::max(1, size / 2);
    const Case cases[] = {
        {"path A, sum_len", relayout::BridgePath::dp_gather, {.tp = np, .dp = half, .enable_dp_attention = true}, {.padding = PaddingMode::sum_len}},
        {"path A, max_len", relayout::BridgePath::dp_gather, {.tp = np, .dp = half, .enable_dp_attention = true}, {.padding = PaddingMode::max_len}},
        {"path A, all_reduce + dp_scatter", relayout::BridgePath::dp_gather, {.tp = np, .dp = np, .enable_dp_attention = true},
         {.padding = std::nullopt, .restore = BridgeRestore::scatter}},
        {"path B", relayout::BridgePath::a2a_split, {.tp = np, .dp = half, .enable_dp_attention = true, .moe_a2a_backend = Backend::deepep}, {}},
        {"direct", relayout::BridgePath::direct, {.tp = np, .dp = np, .enable_dp_attention = true, .moe_a2a_backend = Backend::deepep}, {}},
        {"tp_moe, ep = tp / 2", relayout::BridgePath::tp_moe, {.tp = np, .ep = half}, {}},
        {"tp_moe, ep = tp", relayout::BridgePath::tp_moe, {.tp = np, .ep = np}, {}},
    };
    // One case: run(path) returns its measure (held to <= limit), printed as a line on rank 0; a
    // throw on any rank counts as a failure there.
    const auto attempt = [&](const std::string& label, const char* type, const char* measure, double limit,
                             const auto& run) {
      try {
        std::string path;
        const double v = run(path);
        const bool ok = v <= limit;
        failures += ok ? 0 : 1;
        if (rank == 0)
          std::printf("engine: %-32s path %-9s %-6s  %s %.3g  %s\n", label.c_str(), path.c_str(), type, measure, v,
                      ok ? "OK" : "MISMATCH");
      } catch (const std::exception& e) {
        ++failures;
        std::fprintf(stderr, "engine: %s: rank %d: %s\n", label.c_str(), rank, e.what());
      }
    };
    for (const Case& c : cases) {
      if (relayout::RuntimeLayout(c.config).bridge_path() != c.path) {
        if (rank == 0) std::printf("engine: %-32s skipped: %d ranks do not give this path\n", c.name, np);
        continue;
      }
      attempt(c.name, "double", "max_err", 1e-12, [&](std::string& path) { return run_case(engine, c, path); });
    }
    // The bf16 MoE on the paths that move rows differently: gathered (A), split and dispatched (B),
    // and tp_moe with moe_tp shards summed over ranks.
    for (const Case& c : {cases[0], cases[3], cases[5]})
      if (relayout::RuntimeLayout(c.config).bridge_path() == c.path)
        attempt(std::string("bf16 rows, ") + c.name, "bf16", "err/bound", 1.0,
                [&](std::string& path) { return run_bf16_case(engine, c, path); });
    attempt("EpBuffer, low-latency decode step", "double", "max_err", 1e-12,
            [&](std::string& path) { return run_ep_buffer_case(engine, path); });
    MPI_Comm_free(&engine);
  }
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}
