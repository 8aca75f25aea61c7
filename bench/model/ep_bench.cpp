// EP dispatch + combine alone (the experts copy their rows): an EpBuffer made for every call
// against one EpBuffer kept across calls, in one run. Rows and routing
// are path B's per-rank chunk of the demo configuration: 512 rows x 512 floats, top-4 of 16 experts.
// BM_EpVsFloor pairs the kept-workspace dispatch + combine with its floor in the same run.
// And decode-sized dispatches (1 to 128 rows per rank) in normal mode against low-latency mode,
// with a capacity of 128 rows (a deployment's largest decode batch) and of exactly the rows.
// BM_TwoBatchOverlap: the bridge (path direct) in one batch against two-batch overlap, alternating
// in every iteration on the same rows, with experts that compute (a small two-layer MLP per row).
#include <benchmark/benchmark.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <random>
#include <relayout/bridge.hpp>
#include <relayout/comm.hpp>
#include <relayout/placement.hpp>
#include <vector>

#include <mpi.h>

#include "support/mpi_bench.hpp"

using namespace relayout;

namespace {

using Space = Kokkos::DefaultExecutionSpace;
constexpr std::int64_t kRows = 512, kHidden = 512;
constexpr int kExperts = 16, kTopK = 4;

// Rows x kHidden values and top-k routes of distinct experts, uniform over the ranks.
struct Inputs {
  RowsView<float, Space> x;
  TopK<float, Space> route;
};
Inputs inputs(std::int64_t rows, int rank) {
  Inputs in{RowsView<float, Space>("x", rows, kHidden), TopK<float, Space>(rows, kTopK)};
  auto xh = Kokkos::create_mirror_view(in.x);
  auto ih = Kokkos::create_mirror_view(in.route.ids);
  auto wh = Kokkos::create_mirror_view(in.route.weights);
  std::mt19937 gen(7 + unsigned(rank));
  std::vector<int> e(kExperts);
  for (std::int64_t i = 0; i < rows; ++i) {
    for (std::int64_t f = 0; f < kHidden; ++f) xh(i, f) = float(i + f) * 1e-3f;
    std::iota(e.begin(), e.end(), 0);
    std::shuffle(e.begin(), e.end(), gen);
    for (int k = 0; k < kTopK; ++k) {
      ih(i, k) = e[std::size_t(k)];
      wh(i, k) = 1.0f / kTopK;
    }
  }
  Kokkos::deep_copy(in.x, xh);
  Kokkos::deep_copy(in.route.ids, ih);
  Kokkos::deep_copy(in.route.weights, wh);
  return in;
}

ProcessGroups direct_groups(const MpiCommunicator& world) {
  const int np = world.size();
  return ProcessGroups(RuntimeLayout(LayoutConfig{.tp = np, .dp = np, .enable_dp_attention = true,
                                                  .moe_a2a_backend = Backend::deepep}),
                       world);
}

void BM_EpDispatchCombine(benchmark::State& state) {
  const bool keep = state.range(0) != 0;
  const MpiCommunicator world = MpiCommunicator::world();
  const ProcessGroups pg = direct_groups(world);
  const Inputs in = inputs(kRows, world.rank());
  const auto& xv = in.x;
  const auto& route = in.route;
  const Rows<float, RowShard<AttnTp>, DpLocal, Space> x(xv, kRows);
  const Space exec;
  EpBuffer<MpiCommunicator, float, Space> kept(pg, kExperts);
  const auto layer = [&] {
    EpBuffer<MpiCommunicator, float, Space> fresh(pg, kExperts);
    EpBuffer<MpiCommunicator, float, Space>& use = keep ? kept : fresh;
    const auto h = use.dispatch(exec, x, route);
    const auto y = use.expert_outputs(h);
    Kokkos::deep_copy(exec, y, h.batch().x);
    benchmark::DoNotOptimize(use.combine(exec, h, y).view().data());
  };
  layer();  // warm-up
  bench::run_timed(state, world.native(), layer);
  state.SetLabel(keep ? "buffer kept" : "buffer per call");
}
BENCHMARK(BM_EpDispatchCombine)->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMillisecond);

// The floor of one dispatch + combine: the payload bytes they must move, moved the plainest way.
// Each row goes once to every rank holding one of its experts (as EpBuffer::dispatch sends it), so the
// floor is one copy of the rows into a send buffer ordered by destination, a raw MPI_Alltoallv of
// those rows, the same MPI_Alltoallv back (the experts' outputs) and one copy of the rows returned
// into the output. Routing metadata and the count exchange are left out: a lower bound.
struct EpFloor {
  std::vector<int> send_rows, recv_rows;             // rows per peer, this rank's view
  std::vector<int> sendcounts, sdispls, recvcounts, rdispls;  // in floats
  std::vector<std::int64_t> order;                   // source row of each send-buffer row
  std::vector<float> send, recv, back, out;

  EpFloor(MPI_Comm comm, const std::vector<int>& ids, std::int64_t rows, int hidden) {
    int np = 1;
    MPI_Comm_size(comm, &np);
    const int per_rank = kExperts / np;
    std::vector<std::vector<std::int64_t>> to(static_cast<std::size_t>(np));
    for (std::int64_t i = 0; i < rows; ++i) {
      std::vector<bool> seen(static_cast<std::size_t>(np), false);
      for (int k = 0; k < kTopK; ++k) {
        const int d = ids[std::size_t(i * kTopK + k)] / per_rank;
        if (!seen[std::size_t(d)]) seen[std::size_t(d)] = true, to[std::size_t(d)].push_back(i);
      }
    }
    send_rows.resize(std::size_t(np));
    recv_rows.resize(std::size_t(np));
    for (int d = 0; d < np; ++d) {
      send_rows[std::size_t(d)] = int(to[std::size_t(d)].size());
      order.insert(order.end(), to[std::size_t(d)].begin(), to[std::size_t(d)].end());
    }
    MPI_Alltoall(send_rows.data(), 1, MPI_INT, recv_rows.data(), 1, MPI_INT, comm);
    int s = 0, r = 0;
    for (int d = 0; d < np; ++d) {
      sendcounts.push_back(send_rows[std::size_t(d)] * hidden);
      recvcounts.push_back(recv_rows[std::size_t(d)] * hidden);
      sdispls.push_back(s);
      rdispls.push_back(r);
      s += sendcounts.back();
      r += recvcounts.back();
    }
    send.resize(std::size_t(s));
    back.resize(std::size_t(s));
    recv.resize(std::size_t(r));
    out.resize(std::size_t(rows) * std::size_t(hidden));
  }

  // Bytes one call moves per rank: rows out and back over MPI, and the two copies.
  std::int64_t bytes() const { return std::int64_t(send.size() + recv.size()) * 2 * std::int64_t(sizeof(float)); }

  void run(MPI_Comm comm, const float* x, int hidden) {
    const std::size_t h = std::size_t(hidden);
    for (std::size_t j = 0; j < order.size(); ++j)
      std::memcpy(&send[j * h], x + std::size_t(order[j]) * h, h * sizeof(float));
    MPI_Alltoallv(send.data(), sendcounts.data(), sdispls.data(), MPI_FLOAT, recv.data(), recvcounts.data(),
                  rdispls.data(), MPI_FLOAT, comm);
    MPI_Alltoallv(recv.data(), recvcounts.data(), rdispls.data(), MPI_FLOAT, back.data(), sendcounts.data(),
                  sdispls.data(), MPI_FLOAT, comm);
    for (std::size_t j = 0; j < order.size(); ++j)
      std::memcpy(&out[std::size_t(order[j]) * h], &back[j * h], h * sizeof(float));
  }
};

// Dispatch + combine with a kept workspace and the floor above, alternating in every iteration on
// the same rows and routing. The iteration time is dispatch + combine; floor_ms and vs_floor (the
// ratio of the totals) are reported beside it.
void BM_EpVsFloor(benchmark::State& state) {
  const MpiCommunicator world = MpiCommunicator::world();
  const int np = world.size();
  const ProcessGroups pg(RuntimeLayout(LayoutConfig{.tp = np, .dp = np, .enable_dp_attention = true,
                                                    .moe_a2a_backend = Backend::deepep}),
                         world);
  RowsView<float, Space> xv("x", kRows, kHidden);
  TopK<float, Space> route(kRows, kTopK);
  auto xh = Kokkos::create_mirror_view(xv);
  auto ih = Kokkos::create_mirror_view(route.ids);
  auto wh = Kokkos::create_mirror_view(route.weights);
  std::mt19937 gen(7 + unsigned(world.rank()));
  std::vector<int> e(kExperts), ids(std::size_t(kRows * kTopK));
  for (std::int64_t i = 0; i < kRows; ++i) {
    for (std::int64_t f = 0; f < kHidden; ++f) xh(i, f) = float(i + f) * 1e-3f;
    std::iota(e.begin(), e.end(), 0);
    std::shuffle(e.begin(), e.end(), gen);
    for (int k = 0; k < kTopK; ++k) {
      ih(i, k) = ids[std::size_t(i * kTopK + k)] = e[std::size_t(k)];
      wh(i, k) = 1.0f / kTopK;
    }
  }
  Kokkos::deep_copy(xv, xh);
  Kokkos::deep_copy(route.ids, ih);
  Kokkos::deep_copy(route.weights, wh);
  const Rows<float, RowShard<AttnTp>, DpLocal, Space> x(xv, kRows);
  const Space exec;
  EpBuffer<MpiCommunicator, float, Space> buf(pg, kExperts);
  // The experts are the identity (their outputs are the batch itself): the floor has no expert
  // stage either, so both sides time only the moving of rows.
  const auto layer = [&] {
    const auto h = buf.dispatch(exec, x, route);
    benchmark::DoNotOptimize(buf.combine(exec, h, h.batch().x).view().data());
  };
  EpFloor floor(world.native(), ids, kRows, int(kHidden));
  const auto raw = [&] {
    floor.run(world.native(), xh.data(), int(kHidden));
    benchmark::DoNotOptimize(floor.out.data());
  };
  layer();  // warm-up, both
  raw();
  double relayout_s = 0, floor_s = 0;
  for (auto _ : state) {
    const double t = bench::max_over_ranks(world.native(), layer);
    floor_s += bench::max_over_ranks(world.native(), raw);
    relayout_s += t;
    state.SetIterationTime(t);
  }
  state.counters["floor_ms"] = benchmark::Counter(floor_s * 1e3 / double(state.iterations()));
  state.counters["vs_floor"] = floor_s > 0 ? relayout_s / floor_s : 0.0;
  state.counters["floor_MiB"] = double(floor.bytes()) / (1024.0 * 1024.0);
  state.SetLabel("np " + std::to_string(np) + ", buffer kept");
}
BENCHMARK(BM_EpVsFloor)->UseManualTime()->Unit(benchmark::kMillisecond);
// One decode-sized dispatch: normal mode (counts, then rows) against low-latency mode (one
// exchange of fixed blocks of `capacity` rows per destination, the whole blocks sent).
void BM_EpDecodeDispatch(benchmark::State& state) {
  const std::int64_t rows = state.range(0), capacity = state.range(1);  // capacity 0: normal mode
  const MpiCommunicator world = MpiCommunicator::world();
  const ProcessGroups pg = direct_groups(world);
  const Inputs in = inputs(rows, world.rank());
  const Rows<float, RowShard<AttnTp>, DpLocal, Space> x(in.x, rows);
  const Space exec;
  EpBuffer<MpiCommunicator, float, Space> buf(pg, kExperts, {.num_max_dispatch_tokens_per_rank = capacity > 0 ? capacity : 128});
  TrafficLog log;
  const EpMode mode = capacity > 0 ? EpMode::low_latency : EpMode::normal;
  const auto dispatch = [&] {
    benchmark::DoNotOptimize(buf.dispatch(exec, x, in.route, {.mode = mode, .traffic = &log}).batch().x.data());
  };
  dispatch();  // warm-up
  log.clear();
  bench::run_timed(state, world.native(), dispatch);
  state.counters["bytes_per_call"] = double(log.bytes_of(TrafficOp::dispatch, GroupKind::moe_ep)) / double(log.calls_of(TrafficOp::dispatch, GroupKind::moe_ep));
  state.SetLabel(capacity > 0 ? "low_latency" : "normal");
}
BENCHMARK(BM_EpDecodeDispatch)
    ->ArgNames({"rows", "capacity"})
    ->ArgsProduct({{1, 8, 32, 128}, {0, 128}})
    ->Args({1, 1})
    ->Args({8, 8})
    ->Args({32, 32})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// Experts that compute: expert e maps a row through a two-layer MLP of `inter` units (the same
// weights for every expert, scaled by e + 1), on the host, so there is compute to overlap.
struct MlpExperts {
  int inter = 16;
  std::vector<float> w1, w2;  // inter x H, H x inter
  MlpExperts(int inter_units, std::int64_t hidden) : inter(inter_units) {
    w1.resize(std::size_t(inter) * std::size_t(hidden));
    w2.resize(w1.size());
    for (std::size_t i = 0; i < w1.size(); ++i) {
      w1[i] = float(int(i % 7) - 3) * 1e-2f;
      w2[i] = float(int(i % 5) - 2) * 1e-2f;
    }
  }
  void operator()(const Space& exec, const ExpertBatch<float, Space>& b, const RowsView<float, Space>& y) const {
    const std::int64_t H = std::int64_t(b.x.extent(1));
    std::vector<float> h(static_cast<std::size_t>(inter));
    for (int e = 0; e < b.experts(); ++e)
      for (std::int64_t r = b.offset(e); r < b.offset(e) + b.count(e); ++r) {
        for (int j = 0; j < inter; ++j) {
          float acc = 0;
          for (std::int64_t f = 0; f < H; ++f) acc += w1[std::size_t(j * H + f)] * b.x(r, f);
          h[std::size_t(j)] = acc > 0 ? acc : 0;
        }
        const float scale = float(b.first_expert + e + 1);
        for (std::int64_t f = 0; f < H; ++f) {
          float acc = 0;
          for (int j = 0; j < inter; ++j) acc += w2[std::size_t(f * inter + j)] * h[std::size_t(j)];
          y(r, f) = scale * acc;
        }
      }
    exec.fence();
  }
};
// The router of the inputs above: their fixed top-k, whatever the rows (each micro-batch's rows
// are located by their first value, which is the row's index).
struct IndexRouter {
  TopK<float, Space> route;
  int top_k() const { return kTopK; }
  void operator()(const Space& exec, const RowsView<float, Space>& x, TopK<float, Space>& out) const {
    const auto ids = route.ids, oi = out.ids;
    const auto w = route.weights, ow = out.weights;
    Kokkos::parallel_for(
        "bench::route", Kokkos::RangePolicy<Space>(exec, 0, std::int64_t(x.extent(0))), KOKKOS_LAMBDA(const std::int64_t i) {
          const std::int64_t row = std::int64_t(x(i, 0) * 1e3f + 0.5f);  // inputs(): x(i, 0) = i * 1e-3
          for (int k = 0; k < kTopK; ++k) {
            oi(i, k) = ids(row, k);
            ow(i, k) = w(row, k);
          }
        });
  }
};

// One batch against two-batch overlap on path direct, alternating in every iteration: the
// iteration time is the two-batch run's; one_batch_ms and tbo_vs_one (the ratio of the totals,
// below 1: the overlap gains) are reported beside it.
void BM_TwoBatchOverlap(benchmark::State& state) {
  const std::int64_t rows = state.range(0);
  const int inter = int(state.range(1));
  const MpiCommunicator world = MpiCommunicator::world();
  const ProcessGroups pg = direct_groups(world);
  const Inputs in = inputs(rows, world.rank());
  const Rows<float, Replicated<AttnTp>, DpLocal, Space> x(in.x);
  const Space exec;
  MoeBridge<MpiCommunicator, float, Space> one(pg, kExperts), two(pg, kExperts, {.two_batch_overlap = true});
  IndexRouter router{in.route};
  MlpExperts experts(inter, kHidden);
  const auto run_one = [&] { benchmark::DoNotOptimize(one.run(exec, x, router, experts).view().data()); };
  const auto run_two = [&] { benchmark::DoNotOptimize(two.run(exec, x, router, experts).view().data()); };
  run_one();  // warm-up, both
  run_two();
  double one_s = 0, two_s = 0;
  bool first = true;
  for (auto _ : state) {
    // Alternate which goes first, so neither always runs on a warmer cache.
    double t1 = 0, t2 = 0;
    if (first) {
      t1 = bench::max_over_ranks(world.native(), run_one);
      t2 = bench::max_over_ranks(world.native(), run_two);
    } else {
      t2 = bench::max_over_ranks(world.native(), run_two);
      t1 = bench::max_over_ranks(world.native(), run_one);
    }
    first = !first;
    one_s += t1;
    two_s += t2;
    state.SetIterationTime(t2);
  }
  state.counters["one_batch_ms"] = benchmark::Counter(one_s * 1e3 / double(state.iterations()));
  state.counters["tbo_vs_one"] = one_s > 0 ? two_s / one_s : 0.0;
  state.SetLabel("np " + std::to_string(world.size()) + ", path direct");
}
BENCHMARK(BM_TwoBatchOverlap)
    ->ArgNames({"rows", "inter"})
    ->Args({512, 0})
    ->Args({512, 16})
    ->Args({64, 16})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
