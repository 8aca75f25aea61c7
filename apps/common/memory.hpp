// The examples' size check: before anything is allocated, the memory a run needs per rank (weights,
// activations, attention K/V, buffers) is estimated from the flags and compared with what the
// ranks may use — the smallest of MemAvailable shared by the job's ranks on this host, the address
// space left under RLIMIT_AS (ulimit -v), and --max-memory — and a run that does not fit is refused
// (LayoutError, exit 2) naming the flags and the estimate, instead of being OOM-killed after a
// minute. The estimate is an upper bound of the model's largest terms, not an exact count.
#pragma once

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <span>
#include <string>

#include "common/memory_estimate.hpp"
#include "relayout/comm.hpp"
#include "relayout/mesh.hpp"

namespace relayout::cli {

struct MemoryLimit {
  double bytes = std::numeric_limits<double>::infinity();
  std::string source;  // which limit it is
};

// What one rank may use here: MemAvailable over the job's ranks on this host, the address space
// left under RLIMIT_AS, --max-memory (0: none). Collective over `world` (the ranks of this host are
// counted, by a split the watchdog covers).
inline MemoryLimit memory_limit(const MpiCommunicator& world, std::uint64_t max_memory) {
  MemoryLimit lim;
  const auto take = [&](double b, const std::string& why) {
    if (b < lim.bytes) lim = {b, why};
  };
  const int local = world.split_shared().size();
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
  MemoryLimit lim = memory_limit(world, max_memory);
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

}  // namespace relayout::cli
