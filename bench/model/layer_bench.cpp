// One decoder layer forward on np ranks for each bridge path with the same model and workload:
// time (max over ranks), rows that enter the MoE on a rank, and bytes per rank per collective.
// Path A gathers every DP group's rows onto every rank; path B dispatches 1/attn_tp of its group's.
// BM_LayerCp: one request batch on the same np ranks as attention TP (heads split over np) or as
// attention CP (tokens split over np, the shared KV all-gathered over attn_cp; docs/cp.md).
#include <benchmark/benchmark.h>

#include <relayout/comm.hpp>
#include <demo/model.hpp>
#include <string>

#include "support/mpi_bench.hpp"

using namespace relayout;

namespace {

model::ModelDims bench_dims() {
  model::ModelDims d;
  d.hidden = 256;
  d.heads = 8;
  d.head_dim = 32;
  d.q_lora = 128;
  d.experts = 8;
  d.topk = 2;
  d.moe_inter = 256;
  d.shared_inter = 256;
  d.layers = 1;
  return d;
}

// The layout of each path for the job's np ranks.
LayoutConfig layout_for(BridgePath path, int np) {
  switch (path) {
    case BridgePath::dp_gather: return {.tp = np, .dp = np >= 4 ? np / 2 : np, .enable_dp_attention = true};
    case BridgePath::a2a_split: return {.tp = np, .dp = np / 2, .enable_dp_attention = true, .moe_a2a_backend = Backend::deepep};
    case BridgePath::direct: return {.tp = np, .dp = np, .enable_dp_attention = true, .moe_a2a_backend = Backend::deepep};
    case BridgePath::tp_moe: return {.tp = np, .ep = np};
  }
  return {};
}

// Two requests per attention-DP group, tokens_per_group rows in all.
model::Workload two_requests_per_group(const Widths& w, int tokens_per_group) {
  std::vector<int> lengths, placement;
  for (int g = 0; g < w.attn_dp; ++g) {
    lengths.insert(lengths.end(), {tokens_per_group / 2, tokens_per_group - tokens_per_group / 2});
    placement.insert(placement.end(), {g, g});
  }
  return model::Workload::make(lengths, placement, w.attn_dp);
}

// Times forwards of `work` on `layout` and sets the traffic counters (bytes per rank per collective).
void time_forward(benchmark::State& state, const RuntimeLayout& layout, const model::Workload& work) {
  const MpiCommunicator world = MpiCommunicator::world();
  const ProcessGroups groups(layout, world);
  model::LayerOptions opts;
  opts.track_owners = false;  // what an engine runs: no bookkeeping
  model::DistributedModel<MpiCommunicator> net(groups, bench_dims(), opts);
  net.forward(work);  // warm-up
  net.clear_traffic();
  bench::run_timed(state, world.native(), [&] { net.forward(work); });

  const model::TrafficLog& log = net.traffic();
  const double iters = double(state.iterations());
  std::int64_t total = 0;
  for (std::size_t op = 0; op < model::TrafficLog::kOps; ++op)
    for (std::size_t g = 0; g < model::TrafficLog::kGroups; ++g) {
      const std::int64_t b = log.bytes[op * model::TrafficLog::kGroups + g];
      if (b == 0 || model::Op(op) == model::Op::all_gather_counts) continue;
      total += b;
      state.counters[std::string(model::kOpNames[op]) + "@" + std::string(to_string(kAllGroupKinds[g])) + "_KiB"] =
          double(b) / iters / 1024.0;
    }
  state.counters["KiB_per_rank"] = double(total) / iters / 1024.0;
  state.counters["attn_tp"] = layout.widths().attn_tp;
}

void BM_LayerForward(benchmark::State& state) {
  const auto path = static_cast<BridgePath>(state.range(0));
  const int tokens_per_group = static_cast<int>(state.range(1));
  const RuntimeLayout layout(layout_for(path, MpiCommunicator::world().size()));
  const Widths& w = layout.widths();
  time_forward(state, layout, two_requests_per_group(w, tokens_per_group));
  const std::int64_t group_rows = tokens_per_group;
  const bool gathers = path == BridgePath::dp_gather;
  const bool dispatches = path == BridgePath::a2a_split || path == BridgePath::direct;
  // Rows that enter this rank's MoE: the global buffer (A), its own chunk (B, direct), all rows (tp_moe).
  state.counters["moe_rows"] = double(gathers ? group_rows * w.attn_dp : dispatches ? (group_rows + w.attn_tp - 1) / w.attn_tp : group_rows);
  state.SetLabel(std::string(to_string(path)));
}

void paths(benchmark::internal::Benchmark* b) {
  for (BridgePath p : {BridgePath::dp_gather, BridgePath::a2a_split, BridgePath::direct, BridgePath::tp_moe})
    b->Args({static_cast<int>(p), 64});
}
BENCHMARK(BM_LayerForward)->Apply(paths)->UseManualTime()->Unit(benchmark::kMillisecond);

// The same ranks and tokens as attention TP (attn_tp = np) or CP (attn_cp = np: plain --cp, or
// DeepSeek-V4 prefill CP), with backend none or deepep.
enum class Split : int { tp, cp, prefill_cp };
void BM_LayerCp(benchmark::State& state) {
  const auto split = static_cast<Split>(state.range(0));
  const Backend backend = state.range(1) ? Backend::deepep : Backend::none;
  const int tokens = static_cast<int>(state.range(2));
  const int np = MpiCommunicator::world().size();
  const RuntimeLayout layout(split == Split::tp   ? LayoutConfig{.tp = np, .moe_a2a_backend = backend}
                             : split == Split::cp ? LayoutConfig{.tp = np, .cp = np, .moe_a2a_backend = backend}
                                                  : LayoutConfig{.tp = np, .moe_a2a_backend = backend, .enable_prefill_cp = true, .cp_strategy = CpStrategy::interleave});
  time_forward(state, layout, two_requests_per_group(layout.widths(), tokens));
  state.counters["attn_cp"] = layout.widths().attn_cp;
  state.SetLabel(std::string(split == Split::tp ? "tp" : split == Split::cp ? "cp" : "prefill_cp") + ", " +
                 std::string(to_string(backend)) + " -> " + std::string(to_string(layout.bridge_path())));
}
void cp_vs_tp(benchmark::internal::Benchmark* b) {
  for (int backend : {0, 1})
    for (Split s : {Split::tp, Split::cp, Split::prefill_cp}) b->Args({static_cast<int>(s), backend, 256});
}
BENCHMARK(BM_LayerCp)->Apply(cp_vs_tp)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
