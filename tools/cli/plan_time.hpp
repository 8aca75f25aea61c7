// The time model of `relayout plan`: alpha-beta per link tier from a rank plan's bytes and flops.
// A rank's forward = the sum of its collectives' times + its flops / the GPU's flop rate (no
// overlap); the forward of the domain = its slowest rank (every collective waits for its group).
//
// Collective costs follow the ring and all-to-all figures NCCL's performance notes state (nccl-tests
// doc/PERFORMANCE.md, "bus bandwidth"): for n ranks and an operation of size S (S = the buffer
// each rank holds: the all-reduce buffer, the all-gather's assembled output, the reduce-scatter's
// input, the all-to-all's send buffer), a ring all-reduce moves 2(n-1)/n * S over each rank's
// link in 2(n-1) steps; an all-gather or reduce-scatter moves (n-1)/n * S in n-1 steps; an
// all-to-all sends (n-1)/n of S to the other ranks. So t = steps * alpha + factor * S / beta, with
// alpha the latency and beta the bandwidth of the slowest link the group crosses: intra-node when
// every member is on one node (ranks are numbered node by node), inter-node otherwise.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/numbers.hpp"
#include "cli/plan.hpp"

namespace relayout::cli {

// GPU presets (--hardware), dense peaks without sparsity, each number cited in docs/planning.md:
// NVLink bandwidth is per GPU and direction (half the datasheet's bidirectional figure), the NIC
// the 400 Gb/s-class RDMA card each GPU has in these systems, gpus_per_node the NVLink domain.
struct Hardware {
  const char* name;
  double bf16_tflops, fp8_tflops, hbm_gbs, memory_gib, nvlink_gbs, nic_gbs;
  int gpus_per_node;
  int sms;  // streaming multiprocessors (H100/H800/H200 SXM: 132; B200: 148)
};
inline constexpr Hardware kHardware[] = {
    {"h100", 989, 1979, 3350, 80, 450, 50, 8, 132},
    {"h800", 989, 1979, 3350, 80, 200, 50, 8, 132},
    {"h200", 989, 1979, 4800, 141, 450, 50, 8, 132},
    {"b200", 2250, 4500, 7700, 180, 900, 50, 8, 148},
    {"gb200", 2500, 5000, 8000, 186, 900, 50, 72, 148},
};

inline const Hardware& hardware_preset(const std::string& name) {
  std::string names;
  for (const Hardware& h : kHardware) {
    if (name == h.name) return h;
    names += (names.empty() ? "" : ", ") + std::string(h.name);
  }
  throw LayoutError("--hardware", "--hardware: unknown GPU '" + name + "'; expected one of: " + names);
}

// Achieved shares of the peaks, from public microbenchmarks only (docs/planning.md, "Hardware and
// constants"): GEMMs per shape from DeepGEMM's tables (plan_kernels.hpp; gemm_table false: one
// share for every GEMM, --gemm-efficiency), MLA attention (FlashMLA: 660 of 989 TFLOP/s
// compute-bound, 3000 of 3350 GB/s memory-bound), DeepEP's kernels, fitted to its README's tables
// (test_plan reproduces them within 25%), the SMs DeepEP's normal kernels take from the other
// micro-batch's compute (DeepSeek-V3 report: 20 of 132) and the gap between two kernels (Hazy
// Research, "Look Ma, No Bubbles", H100: 1.3 us in a CUDA graph, 2.1 us launched one by one).
// Each has a flag (kEfficiencyFlags); the MLA presets' model reads them, the demo layer's does not.
struct Efficiency {
  double gemm = 0.7, attention = 0.6, hbm = 0.85;
  bool gemm_table = true;  // DeepGEMM's tables per shape; false after --gemm-efficiency
  bool prefill_table = true;  // prefill attention from FlashAttention-3's table; false after --attention-efficiency
  double normal_nvlink = 0.7, normal_rdma = 0.8, normal_latency = 25e-6;  // DeepEP normal kernels
  double ll_nvlink = 0.8, ll_rdma = 0.88, ll_latency = 30e-6;              // DeepEP low-latency kernels
  double normal_sms = 20, ll_sms = 0;        // SMs DeepEP's kernels hold while the other micro-batch computes
  double gap_graph = 1.3e-6, gap_eager = 2.1e-6;  // seconds between two kernels: decode (CUDA graph), prefill
};

// The flags of the achieved shares and DeepEP's latencies (Efficiency), which only the MLA
// presets' time model reads.
inline constexpr const char* kEfficiencyFlags[] = {
    "--gemm-efficiency",    "--attention-efficiency", "--hbm-efficiency",     "--deepep-normal-nvlink",
    "--deepep-normal-rdma", "--deepep-normal-latency", "--deepep-ll-nvlink",  "--deepep-ll-rdma",
    "--deepep-ll-latency",  "--deepep-normal-sms",     "--deepep-ll-sms",     "--gpu-sms",
    "--kernel-gap-graph",   "--kernel-gap-eager"};

// The machine a plan is timed on: an --hardware preset (default h100), each number overridable by
// its flag. The collective latencies (3 us a step inside a node, 10 across) are an assumption, not
// a measurement: the order of NCCL's per-step latency over NVLink and InfiniBand (docs/planning.md).
struct Cluster {
  int gpus_per_node = 8;
  double intra_bw = 450e9;  // bytes/s per GPU and direction
  double intra_latency = 3e-6;
  double inter_bw = 50e9;
  double inter_latency = 10e-6;
  double gpu_flops = 989e12;  // flop/s, dense BF16
  double fp8_flops = 1979e12;
  double hbm_bw = 3350e9;     // bytes/s
  double memory = 80.0 * double(std::uint64_t(1) << 30);  // bytes per GPU
  double sms = 132;  // streaming multiprocessors per GPU
  std::string hardware = "h100";
  Efficiency eff;

  void add_to(CLI::App& app) {
    app.add_option("--hardware", hardware, "GPU preset: h100 (default), h800, h200, b200 or gb200; the flags below override it");
    add_int(app, "--gpus-per-node", gpus_per_node, "GPUs per node / NVLink domain (ranks are numbered node by node)", 1, 1 << 20);
    add_float(app, "--intra-bw", intra_gbs, "NVLink bandwidth per GPU and direction, GB/s (h100: 450)", 1e-6, 1e9);
    add_float(app, "--inter-bw", inter_gbs, "inter-node (NIC) bandwidth per GPU, GB/s (h100: 50, a 400 Gb/s NIC)", 1e-6, 1e9);
    add_float(app, "--intra-latency", intra_us, "intra-node latency per step, microseconds (default 3: an assumption of the order of NCCL's per-hop latency "
              "over NVLink, not a measurement)", 0.0, 1e9);
    add_float(app, "--inter-latency", inter_us, "inter-node latency per step, microseconds (default 10: the same assumption over InfiniBand)", 0.0, 1e9);
    add_float(app, "--gpu-tflops", tflops, "dense BF16 flop rate per GPU, TFLOP/s (h100: 989)", 1e-9, 1e9);
    add_float(app, "--fp8-tflops", fp8_tflops_, "dense FP8 flop rate per GPU, TFLOP/s (h100: 1979)", 1e-9, 1e9);
    add_float(app, "--hbm-bw", hbm_gbs, "HBM bandwidth per GPU, GB/s (h100: 3350)", 1e-6, 1e9);
    // Achieved shares (0, 1] and DeepEP's per-call latencies, for the MLA presets.
    add_float(app, "--gemm-efficiency", eff.gemm,
              "MLA presets: one achieved share of the GEMM flop rate for every GEMM (default: per shape from DeepGEMM's "
              "README tables on H800, github.com/deepseek-ai/DeepGEMM, interpolated in M)", 1e-6, 1.0);
    add_float(app, "--attention-efficiency", eff.attention,
              "MLA presets: achieved share of the BF16 rate in core attention (default: decode 0.6, FlashMLA's 660 of "
              "989 TFLOP/s on H800; prefill per length from FlashAttention-3's causal table, arXiv 2407.08608; given, "
              "both phases)", 1e-6, 1.0);
    add_float(app, "--hbm-efficiency", eff.hbm, "MLA presets: achieved share of the HBM bandwidth (default 0.85, FlashMLA's README: 3000 of 3350 GB/s "
              "memory-bound on H800, github.com/deepseek-ai/FlashMLA)", 1e-6, 1.0);
    add_float(app, "--deepep-normal-nvlink", eff.normal_nvlink, "DeepEP normal kernels: NVLink share (default 0.7, fitted to DeepEP's README normal-kernel table, "
              "github.com/deepseek-ai/DeepEP)", 1e-6, 1.0);
    add_float(app, "--deepep-normal-rdma", eff.normal_rdma, "DeepEP normal kernels: RDMA share (default 0.8, the same table)", 1e-6, 1.0);
    add_float(app, "--deepep-normal-latency", normal_us, "DeepEP normal kernels: latency per call, microseconds (default 25, the same table)", 0.0, 1e9);
    add_float(app, "--deepep-ll-nvlink", eff.ll_nvlink, "DeepEP low-latency kernels: NVLink share (default 0.8, fitted to DeepEP's README low-latency table)", 1e-6, 1.0);
    add_float(app, "--deepep-ll-rdma", eff.ll_rdma, "DeepEP low-latency kernels: RDMA share (default 0.88, the same table)", 1e-6, 1.0);
    add_float(app, "--deepep-ll-latency", ll_us, "DeepEP low-latency kernels: latency per call, microseconds (default 30, the same table)", 0.0, 1e9);
    add_float(app, "--deepep-normal-sms", eff.normal_sms,
              "MLA presets, two-batch overlap: SMs DeepEP's normal kernels hold while the other micro-batch computes "
              "(default 20, DeepSeek-V3 technical report, arXiv 2412.19437: 20 of the H800's 132 SMs)", 0.0, 1e4);
    add_float(app, "--deepep-ll-sms", eff.ll_sms,
              "MLA presets, two-batch overlap: the same for the low-latency kernels (default 0, DeepEP README: their "
              "hook-based overlap occupies no SM)", 0.0, 1e4);
    add_float(app, "--gpu-sms", sms_, "SMs per GPU (h100, h800, h200: 132; b200, gb200: 148)", 1.0, 1e4);
    add_float(app, "--kernel-gap-graph", gap_graph_us,
              "MLA presets: microseconds between two kernels of a decode step replayed as a CUDA graph (default 1.3, "
              "Hazy Research, 'Look Ma, No Bubbles', H100)", 0.0, 1e6);
    add_float(app, "--kernel-gap-eager", gap_eager_us,
              "MLA presets: microseconds between two kernels launched one by one, prefill (default 2.1, the same source)", 0.0, 1e6);
  }
  // After parsing: the preset under the flags given, in bytes/s, seconds and flop/s.
  void resolve(const CLI::App* app = nullptr) {
    const Hardware& h = hardware_preset(hardware);
    const auto given = [&](const char* flag) { return app && app->count(flag) > 0; };
    if (!given("--gpus-per-node")) gpus_per_node = h.gpus_per_node;
    if (!given("--intra-bw")) intra_gbs = h.nvlink_gbs;
    if (!given("--inter-bw")) inter_gbs = h.nic_gbs;
    if (!given("--gpu-tflops")) tflops = h.bf16_tflops;
    if (!given("--fp8-tflops")) fp8_tflops_ = h.fp8_tflops;
    if (!given("--hbm-bw")) hbm_gbs = h.hbm_gbs;
    if (!given("--gpu-sms")) sms_ = h.sms;
    if (given("--gemm-efficiency")) eff.gemm_table = false;
    if (given("--attention-efficiency")) eff.prefill_table = false;
    sms = sms_;
    eff.gap_graph = gap_graph_us * 1e-6;
    eff.gap_eager = gap_eager_us * 1e-6;
    memory = h.memory_gib * double(std::uint64_t(1) << 30);
    intra_bw = intra_gbs * 1e9;
    inter_bw = inter_gbs * 1e9;
    intra_latency = intra_us * 1e-6;
    inter_latency = inter_us * 1e-6;
    gpu_flops = tflops * 1e12;
    fp8_flops = fp8_tflops_ * 1e12;
    hbm_bw = hbm_gbs * 1e9;
    eff.normal_latency = normal_us * 1e-6;
    eff.ll_latency = ll_us * 1e-6;
  }
  static Cluster preset(const std::string& name) {
    Cluster c;
    c.hardware = name;
    c.resolve();
    return c;
  }

 private:
  double intra_gbs = 450, inter_gbs = 50, intra_us = 3, inter_us = 10, tflops = 989, fp8_tflops_ = 1979, hbm_gbs = 3350;
  double normal_us = Efficiency{}.normal_latency * 1e6, ll_us = Efficiency{}.ll_latency * 1e6;
  double sms_ = 132, gap_graph_us = Efficiency{}.gap_graph * 1e6, gap_eager_us = Efficiency{}.gap_eager * 1e6;
};

struct RankTime {
  double comm = 0, compute = 0;
  double total() const { return comm + compute; }
};

// Seconds of `calls` collectives `op` over a group of `n` ranks, all on one node or not, moving
// `bytes` in all.
inline double collective_seconds(TrafficOp op, double n, bool one_node, std::int64_t calls, double bytes,
                                 const Cluster& c) {
  if (n < 2 || calls == 0) return 0.0;
  const double alpha = one_node ? c.intra_latency : c.inter_latency;
  const double beta = one_node ? c.intra_bw : c.inter_bw;
  const double per_call = bytes / double(calls);
  double steps = n - 1, factor = (n - 1) / n;  // all-gather, reduce-scatter, all-to-all
  if (op == TrafficOp::all_reduce) {
    steps = 2 * (n - 1);
    factor = 2 * (n - 1) / n;
  }
  return double(calls) * (steps * alpha + factor * per_call / beta);
}

inline bool on_one_node(const std::vector<int>& members, const Cluster& c) {
  return std::all_of(members.begin(), members.end(),
                     [&](int r) { return r / c.gpus_per_node == members.front() / c.gpus_per_node; });
}

// The same over the group of `members`.
inline double collective_seconds(TrafficOp op, const std::vector<int>& members, std::int64_t calls, double bytes,
                                 const Cluster& c) {
  return collective_seconds(op, double(members.size()), on_one_node(members, c), calls, bytes, c);
}

// One point-to-point send of `bytes` (a pipeline stage's hand-over): one latency and the bytes
// over the link between the two ranks.
inline double p2p_seconds(double bytes, bool one_node, const Cluster& c) {
  if (bytes <= 0) return 0.0;
  return one_node ? c.intra_latency + bytes / c.intra_bw : c.inter_latency + bytes / c.inter_bw;
}

// For each group kind and group index of a layout: whether the group lies on one node, the
// domain's rank 0 being world rank `first` (ranks are numbered node by node). One pass over the
// ranks, so a ranking of thousands of GPUs stays linear in them.
struct GroupNodes {
  std::array<std::vector<char>, TrafficLog::kGroups> one_node;
  GroupNodes(const RuntimeLayout& l, const Cluster& c, std::int64_t first = 0) {
    for (std::size_t g = 0; g < TrafficLog::kGroups; ++g) {
      const GroupKind kind = kAllGroupKinds[g];
      std::vector<std::int64_t> node64(std::size_t(l.group_count(kind)), -1);
      one_node[g].assign(node64.size(), 1);
      for (int r = 0; r < l.size(); ++r) {
        const std::size_t i = std::size_t(l.group_index(kind, r));
        const std::int64_t n = (first + r) / c.gpus_per_node;
        if (node64[i] < 0) node64[i] = n;
        else if (node64[i] != n) one_node[g][i] = 0;
      }
    }
  }
};

inline RankTime rank_time(const LayerPlan& p, const RankPlan& r, const Cluster& c, const GroupNodes& nodes) {
  RankTime t;
  for (std::size_t op = 0; op < TrafficLog::kOps; ++op)
    for (std::size_t g = 0; g < TrafficLog::kGroups; ++g) {
      const std::size_t s = op * TrafficLog::kGroups + g;
      if (r.calls[s] == 0) continue;
      const GroupKind kind = kAllGroupKinds[g];
      const bool one_node = nodes.one_node[g][std::size_t(p.layout.group_index(kind, r.coords.rank))] != 0;
      t.comm += collective_seconds(TrafficOp(op), double(p.layout.group_size(kind)), one_node, r.calls[s], r.bytes[s], c);
    }
  t.compute = r.memory.flops / c.gpu_flops;
  return t;
}

// The forward of the domain: its slowest rank (the domain's rank 0 at world rank `first`).
inline RankTime forward_time(const LayerPlan& p, const Cluster& c, std::int64_t first = 0) {
  const GroupNodes nodes(p.layout, c, first);
  RankTime worst;
  for (const RankPlan& r : p.ranks) {
    const RankTime t = rank_time(p, r, c, nodes);
    if (t.total() > worst.total()) worst = t;
  }
  return worst;
}

inline std::string cluster_text(const Cluster& c) {
  char b[300];
  std::snprintf(b, sizeof b,
                "time model (%s): %d GPUs per node; intra-node %.0f GB/s, %.1f us; inter-node %.0f GB/s, %.1f us; %.0f TFLOP/s "
                "BF16, %.0f FP8, HBM %.0f GB/s per GPU\n",
                c.hardware.c_str(), c.gpus_per_node, c.intra_bw / 1e9, c.intra_latency * 1e6, c.inter_bw / 1e9,
                c.inter_latency * 1e6, c.gpu_flops / 1e12, c.fp8_flops / 1e12, c.hbm_bw / 1e9);
  return b;
}

// The plan with its predicted times: per rank and the forward (the slowest rank).
inline nlohmann::json timed_plan_json(const LayerPlan& p, const Cluster& c) {
  nlohmann::json j = plan_json(p);
  const RankTime f = forward_time(p, c);
  j["predicted_s"] = f.total();
  j["comm_s"] = f.comm;
  j["compute_s"] = f.compute;
  const GroupNodes nodes(p.layout, c);
  for (std::size_t r = 0; r < p.ranks.size(); ++r) j["ranks"][r]["predicted_s"] = rank_time(p, p.ranks[r], c, nodes).total();
  return j;
}

inline std::string timed_plan_text(const LayerPlan& p, const Cluster& c) {
  const RankTime f = forward_time(p, c);
  char b[200];
  std::snprintf(b, sizeof b, "\npredicted forward: %.6f s (slowest rank: communication %.6f s, compute %.6f s)\n", f.total(),
                f.comm, f.compute);
  return plan_text(p) + b + cluster_text(c) + "no overlap of communication and compute\n";
}

}  // namespace relayout::cli
