// The examples' size check: before anything is allocated, the memory a run needs per rank (weights,
// activations, attention K/V, buffers) is estimated from the flags and compared with what the
// ranks may use — the smallest of MemAvailable shared by the job's ranks on this host, the address
// space left under RLIMIT_AS (ulimit -v), and --max-memory — and a run that does not fit is refused
// (LayoutError, exit 2) naming the flags and the estimate, instead of being OOM-killed after a
// minute. The estimate is an upper bound of the model's largest terms, not an exact count.
#pragma once

#include <mpi.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <span>
#include <string>

#include "cli/numbers.hpp"
#include "relayout/comm.hpp"
#include "relayout/mesh.hpp"
#include "demo/model/config.hpp"

namespace relayout::cli {

struct MemoryEstimate {
  double weights = 0, activations = 0, kv = 0, buffers = 0;  // bytes per rank
  double flops = 0;                                          // per rank, whole run (for progress)
  double total() const { return weights + activations + kv + buffers; }
  MemoryEstimate& operator+=(const MemoryEstimate& o) {
    weights += o.weights;
    activations += o.activations;
    kv += o.kv;
    buffers += o.buffers;
    flops += o.flops;
    return *this;
  }
};

inline std::string bytes_text(double b) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (b >= 1024.0 && u < 6) {
    b /= 1024.0;
    ++u;
  }
  char s[48];
  std::snprintf(s, sizeof s, u == 0 ? "%.0f %s" : "%.1f %s", b, unit[u]);
  return s;
}

// --max-memory: bytes, with an optional K, M, G or T suffix (powers of 1024), e.g. 512M.
inline std::uint64_t parse_bytes(const std::string& flag, const std::string& text) {
  std::string digits = text;
  std::uint64_t scale = 1;
  if (!digits.empty()) {
    const char s = digits.back();
    const std::string units = "KMGT";
    if (const auto k = units.find(char(s & ~0x20)); k != std::string::npos) {
      scale = std::uint64_t(1) << (10 * (k + 1));
      digits.pop_back();
    }
  }
  const std::uint64_t max = std::numeric_limits<std::uint64_t>::max() / scale;
  try {
    return parse_int<std::uint64_t>(flag, digits, 1, max) * scale;
  } catch (const CLI::ConversionError&) {
    throw number_error(flag, text, "expected a number of bytes >= 1 with an optional K, M, G or T suffix, e.g. 512M");
  }
}

// One DistributedModel of dims `d` over `tokens` rows of the whole domain, longest request
// `longest`, per rank (the largest rank: its shards, and every row when the bridge gathers them).
inline MemoryEstimate estimate_model(const model::ModelDims& d, const Widths& w, double tokens, double longest) {
  const double H = d.hidden, Q = d.q_lora, D = d.head_dim, L = d.layers, E = d.experts, K = d.topk;
  const double heads = double(d.heads) / w.attn_tp, HD = heads * D;
  const double inter = double(d.moe_inter) / w.moe_tp, shared = double(d.shared_inter) / w.moe_tp;
  const double experts = E / w.moe_ep;
  const double per_layer = 2 * H + Q + D + Q * H + HD * Q + D * H + H * HD + E * H + experts * 3 * inter * H + 3 * shared * H;
  MemoryEstimate m;
  m.weights = 4 * L * per_layer;
  // One layer's views at a time (xn, qa, qn, q, o, attention output, residual, input), the bridge's
  // gathered, partial and restored rows (padded: twice the rows), the routed rows' expert work.
  m.activations = 4 * tokens * (5 * H + 2 * Q + 2 * HD + 6 * H + E) + 4 * tokens * K * (3 * inter + H);
  m.kv = 4 * tokens * 2 * D;                          // kv_raw, kv of the layer running
  m.buffers = 4 * per_layer + 8 * L * 8 * tokens;     // weights being packed; owners per boundary
  const double attention = 2.0 * 2.0 * HD * longest * tokens;  // causal: ~len^2 per request, bounded
  m.flops = 2 * L * tokens * (Q * H + HD * Q + D * H + H * HD + E * H + K * 3 * inter * H + 3 * shared * H) + L * attention;
  return m;
}

// --check's single-rank reference: one layer of the whole model in double at a time, and its rows.
inline double reference_bytes(const model::ModelDims& d, double tokens) {
  const double H = d.hidden, Q = d.q_lora, D = d.head_dim, HD = double(d.heads) * d.head_dim, E = d.experts;
  const double layer = Q * H + HD * Q + D * H + H * HD + E * H + E * 3 * d.moe_inter * H + 3.0 * d.shared_inter * H;
  return 8 * (layer + tokens * (8 * H + 2 * Q + 2 * HD + 2 * D + E + double(d.topk) * 3 * d.moe_inter));
}

struct MemoryLimit {
  double bytes = std::numeric_limits<double>::infinity();
  std::string source;  // which limit it is
};

// What one rank may use here: MemAvailable over the job's ranks on this host, the address space
// left under RLIMIT_AS, --max-memory (0: none). Collective (the ranks of this host are counted).
inline MemoryLimit memory_limit(std::uint64_t max_memory) {
  MemoryLimit lim;
  const auto take = [&](double b, const std::string& why) {
    if (b < lim.bytes) lim = {b, why};
  };
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int local = 1;
  MPI_Comm_size(node, &local);
  MPI_Comm_free(&node);
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kib = 0;
  while (meminfo >> key >> kib) {
    if (key == "MemAvailable:") {
      take(kib * 1024 / local, "MemAvailable " + bytes_text(kib * 1024) + " shared by " + std::to_string(local) +
                                   " rank" + (local > 1 ? "s" : "") + " on this host");
      break;
    }
    meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  rlimit as{};
  if (::getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) {
    double used = 0;  // this process's address space now (/proc/self/statm: pages)
    std::ifstream statm("/proc/self/statm");
    statm >> used;
    used *= double(::sysconf(_SC_PAGESIZE));
    take(std::max(0.0, double(as.rlim_cur) - used),
         "RLIMIT_AS (ulimit -v) " + bytes_text(double(as.rlim_cur)) + ", " + bytes_text(used) + " of it in use");
  }
  if (max_memory > 0) take(double(max_memory), "--max-memory " + bytes_text(double(max_memory)));
  return lim;
}

// Throws LayoutError on every rank (the ranks take the smallest limit among them) when the
// estimate does not fit. `flags` names the flags the estimate was made from.
inline void require_memory(const MpiCommunicator& world, const MemoryEstimate& need, std::uint64_t max_memory,
                           const std::string& flags) {
  MemoryLimit lim = memory_limit(max_memory);
  double mine = lim.bytes, least = lim.bytes;
  all_reduce_in_place(world, std::span<double>(&least, 1), ReduceOp::min);
  if (need.total() <= least) return;
  if (mine != least) lim.source = "the limit of another rank";
  throw LayoutError(flags.substr(0, flags.find(' ')),
                    flags + ": this run needs about " + bytes_text(need.total()) + " per rank (weights " +
                        bytes_text(need.weights) + ", activations " + bytes_text(need.activations) + ", attention K/V " +
                        bytes_text(need.kv) + ", buffers " + bytes_text(need.buffers) + "), more than the " +
                        bytes_text(least) + " a rank may use (" + lim.source + "); make the model or the batch smaller" +
                        (lim.source.rfind("--max-memory", 0) == 0 ? " or raise --max-memory" : ""));
}

// --max-memory BYTES (0, the default: no limit of its own).
inline CLI::Option* add_max_memory(CLI::App& app, std::uint64_t& target) {
  return app
      .add_option_function<std::string>(
          "--max-memory", [&target](const std::string& text) { target = parse_bytes("--max-memory", text); },
          "refuse a run whose estimated memory per rank exceeds BYTES (K, M, G, T suffixes); the memory "
          "available and ulimit -v are always limits")
      ->type_name("BYTES");
}

// The model flags an estimate is made from, as the user would write them.
inline std::string model_flags(const model::ModelDims& d, const char* layers_flag = "--layers") {
  return "--hidden " + std::to_string(d.hidden) + " " + layers_flag + " " + std::to_string(d.layers) + " --heads " +
         std::to_string(d.heads) + " --head-dim " + std::to_string(d.head_dim) + " --q-lora " + std::to_string(d.q_lora) +
         " --experts " + std::to_string(d.experts) + " --topk " + std::to_string(d.topk) + " --moe-inter " +
         std::to_string(d.moe_inter) + " --shared-inter " + std::to_string(d.shared_inter);
}

}  // namespace relayout::cli
