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

#include "cli/numbers.hpp"
#include "cli/plan.hpp"

namespace relayout::cli {

// Default assumptions, documented in docs/planning.md: an NVLink-class node (450 GB/s per GPU each
// way, as NVLink 4 on an 8-GPU H100 board) and a 400 Gb/s-class NIC per GPU (50 GB/s), a few
// microseconds of latency inside a node and ten across, and the dense BF16 peak of an H100 SXM.
struct Cluster {
  int gpus_per_node = 8;
  double intra_bw = 450e9;  // bytes/s per GPU
  double intra_latency = 3e-6;
  double inter_bw = 50e9;
  double inter_latency = 10e-6;
  double gpu_flops = 989e12;  // flop/s

  void add_to(CLI::App& app) {
    add_int(app, "--gpus-per-node", gpus_per_node, "GPUs per node (ranks are numbered node by node)", 1, 1 << 20);
    add_float(app, "--intra-bw", intra_gbs, "intra-node bandwidth per GPU, GB/s (default 450: NVLink-class)", 1e-6, 1e9);
    add_float(app, "--inter-bw", inter_gbs, "inter-node bandwidth per GPU, GB/s (default 50: a 400 Gb/s-class NIC)", 1e-6, 1e9);
    add_float(app, "--intra-latency", intra_us, "intra-node latency per step, microseconds (default 3)", 0.0, 1e9);
    add_float(app, "--inter-latency", inter_us, "inter-node latency per step, microseconds (default 10)", 0.0, 1e9);
    add_float(app, "--gpu-tflops", tflops, "flop rate per GPU, TFLOP/s (default 989: H100 SXM dense BF16 peak)", 1e-9, 1e9);
  }
  // After parsing: the flags' units to bytes/s, seconds and flop/s.
  void resolve() {
    intra_bw = intra_gbs * 1e9;
    inter_bw = inter_gbs * 1e9;
    intra_latency = intra_us * 1e-6;
    inter_latency = inter_us * 1e-6;
    gpu_flops = tflops * 1e12;
  }

 private:
  double intra_gbs = 450, inter_gbs = 50, intra_us = 3, inter_us = 10, tflops = 989;
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

// For each group kind and group index of a layout: whether the group lies on one node. One pass
// over the ranks, so a ranking of thousands of GPUs stays linear in them.
struct GroupNodes {
  std::array<std::vector<char>, TrafficLog::kGroups> one_node;
  GroupNodes(const RuntimeLayout& l, const Cluster& c) {
    for (std::size_t g = 0; g < TrafficLog::kGroups; ++g) {
      const GroupKind kind = kAllGroupKinds[g];
      std::vector<int> node(std::size_t(l.group_count(kind)), -1);
      one_node[g].assign(node.size(), 1);
      for (int r = 0; r < l.size(); ++r) {
        const std::size_t i = std::size_t(l.group_index(kind, r));
        if (node[i] < 0) node[i] = r / c.gpus_per_node;
        else if (node[i] != r / c.gpus_per_node) one_node[g][i] = 0;
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

// The forward of the domain: its slowest rank.
inline RankTime forward_time(const LayerPlan& p, const Cluster& c) {
  const GroupNodes nodes(p.layout, c);
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
                "time model: %d GPUs per node; intra-node %.0f GB/s, %.1f us; inter-node %.0f GB/s, %.1f us; %.0f TFLOP/s per GPU; "
                "no overlap of communication and compute\n",
                c.gpus_per_node, c.intra_bw / 1e9, c.intra_latency * 1e6, c.inter_bw / 1e9, c.inter_latency * 1e6,
                c.gpu_flops / 1e12);
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
  return plan_text(p) + b + cluster_text(c);
}

}  // namespace relayout::cli
