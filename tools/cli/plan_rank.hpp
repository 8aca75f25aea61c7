// `relayout plan --gpus N`: every valid layout of N GPUs for a model and a batch, each planned
// and timed over its world (plan_world.hpp: replicas x pipeline stages x a domain), sorted by
// predicted time per forward (those that fit in the GPU's memory first). Validity is the layout engine's (relayout::derive_widths) and the demo
// layer's (model::validate). The all-to-all backends a layout accepts share one row: each spans EP
// over tp and takes the same bridge path, so the plan's rows, bytes and time are the same for all.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli/plan.hpp"
#include "cli/plan_time.hpp"
#include "cli/plan_world.hpp"

namespace relayout::cli {

// The batch as requests of `request_tokens` (the last one shorter), placed round-robin; at most
// kMaxBatchRequests of them, so a ranking stays quick.
inline constexpr std::int64_t kMaxBatchRequests = 1 << 16;
inline std::vector<int> batch_requests(std::int64_t tokens, int request_tokens) {
  if ((tokens + request_tokens - 1) / request_tokens > kMaxBatchRequests)
    throw LayoutError("--request-tokens", "--batch-tokens " + std::to_string(tokens) + " in requests of " +
                                              std::to_string(request_tokens) + " tokens makes more than " +
                                              std::to_string(kMaxBatchRequests) + " requests; raise --request-tokens");
  std::vector<int> r;
  for (std::int64_t left = tokens; left > 0; left -= request_tokens)
    r.push_back(int(std::min<std::int64_t>(left, request_tokens)));
  return r;
}

struct RankedLayout {
  std::string flags;
  LayoutConfig config;
  std::vector<Backend> backends;  // the backends of this row: none, or every all-to-all backend it accepts
  int replicas = 1;  // pipelines of gpus / replicas ranks (--dp without DP attention)
  int pp = 1;        // pipeline stages of a replica, each a domain of tp = gpus / replicas / pp
  BridgePath path = BridgePath::tp_moe;
  double bytes_per_rank = 0, memory_per_rank = 0;
  RankTime time;
  bool fits = true;
};

struct Ranking {
  int gpus = 0;
  std::vector<RankedLayout> layouts;           // fastest first
  std::map<std::string, int> skipped;          // reason -> layouts
};

// The flags of a row; several backends are written a|b|c (any one of them).
inline std::string layout_flags(const LayoutConfig& c, const std::vector<Backend>& backends) {
  std::string s = "--tp " + std::to_string(c.tp);
  if (c.pp > 1) s += " --pp-size " + std::to_string(c.pp);
  if (c.dp > 1) s += " --dp " + std::to_string(c.dp);
  if (c.enable_dp_attention) s += " --enable-dp-attention";
  if (c.enable_prefill_cp) s += " --enable-prefill-cp --cp-strategy interleave";
  if (c.cp > 1) s += " --cp " + std::to_string(c.cp);
  if (c.ep > 1) s += " --ep " + std::to_string(c.ep);
  if (c.moe_dp > 1) s += " --moe-dp-size " + std::to_string(c.moe_dp);
  if (c.moe_a2a_backend != Backend::none) {
    s += " --moe-a2a-backend ";
    for (std::size_t i = 0; i < backends.size(); ++i) s += (i ? "|" : "") + std::string(to_string(backends[i]));
  }
  return s;
}

inline constexpr const char* kBackendsNote =
    "a row naming several all-to-all backends (a|b|c) stands for each of them: every one spans EP over tp and "
    "takes the same bridge path, so the plan's rows, bytes and time are the same";

inline std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

// Every layout of `gpus` GPUs: replicas of a smaller pipeline (DP without DP attention), pipeline
// stages up to the model's layers (each a domain), DP attention of every width, attention CP of
// every width and DeepSeek-V4 prefill CP, backend none with every ep, every all-to-all backend
// (one row per layout for those it accepts), every moe_dp. The batch is split evenly over the
// replicas and, in a pipeline, into pp micro-batches; a layout's time per forward is then pp
// times its slowest stage's (the steady state: one micro-batch leaves every slowest stage).
// Throws LayoutError naming --gpus when none is valid.
inline Ranking rank_layouts(int gpus, std::int64_t batch_tokens, int request_tokens, PlanInput base,
                            const Cluster& cluster, double gpu_memory) {
  Ranking out;
  out.gpus = gpus;
  batch_requests(batch_tokens, request_tokens);  // checks the request count before any layout
  std::map<std::string, std::size_t> row_of;     // layout key -> its row in out.layouts
  std::map<std::string, std::pair<int, std::string>> dims_rule;
  std::set<std::string> refused;  // layouts the model's dims rule out, counted once
  for (int replicas : divisors(gpus))
    for (int pp : divisors(gpus / replicas)) {
    if (pp > base.dims.layers) break;  // every stage needs a layer
    const int tp = gpus / replicas / pp;
    const std::int64_t tokens = ((batch_tokens + replicas - 1) / replicas + pp - 1) / pp;
    for (bool dpa : {false, true}) {
      if (dpa && replicas > 1) continue;  // SGLang: attention DP inside replicas of the domain is not supported
      for (int dp : dpa ? divisors(tp) : std::vector<int>{replicas}) {
        if (dpa && dp == 1) continue;  // the widths of DP attention off
        for (bool prefill : {false, true})
          for (int cp : prefill ? std::vector<int>{1} : divisors(tp))
            for (const auto& backend : relayout::impl::kBackendNames.entries)
              for (const Backend b = backend.first; int ep : b == Backend::none ? divisors(tp) : std::vector<int>{1})
                if (b != Backend::ascend_tp)  // runs as backend none: its rows are none's
                for (int moe_dp : divisors(tp)) {
                  LayoutConfig c{.tp = tp, .dp = dp, .cp = cp, .ep = ep, .moe_dp = moe_dp,
                                 .enable_dp_attention = dpa, .moe_a2a_backend = b,
                                 .enable_prefill_cp = prefill, .pp = pp};
                  if (prefill) c.cp_strategy = CpStrategy::interleave;  // the one strategy CUDA runs
                  const WidthsResult wr = derive_widths(c);
                  if (wr.rule != LayoutRule::ok) continue;
                  const Widths& w = wr.widths;
                  const std::string key = std::to_string(replicas) + "/" + std::to_string(pp) + "/" + std::to_string(w.attn_dp) + "/" +
                                          std::to_string(w.attn_cp) + "/" + std::to_string(prefill) + "/" +
                                          std::to_string(w.moe_ep) + "/" + std::to_string(w.moe_dp) + "/" +
                                          std::to_string(b != Backend::none);
                  if (const auto it = row_of.find(key); it != row_of.end()) {
                    RankedLayout& r = out.layouts[it->second];
                    if (b != Backend::none && r.backends.back() != b) {
                      r.backends.push_back(b);
                      r.flags = layout_flags(r.config, r.backends);
                    }
                    continue;
                  }
                  if (refused.count(key)) continue;
                  PlanInput in = base;
                  in.requests = batch_requests(tokens, request_tokens);
                  in.placement.clear();
                  try {
                    model::validate(in.dims, w);
                  } catch (const LayoutError& e) {  // one line per flag, with its first message
                    auto& [n, first] = dims_rule[e.input()];
                    if (n++ == 0) first = e.what();
                    refused.insert(key);
                    continue;
                  }
                  // --dispatch-dtype bf16 applies to the layouts that dispatch rows.
                  const RuntimeLayout layout(c);
                  if (layout.bridge_path() != BridgePath::a2a_split && layout.bridge_path() != BridgePath::direct)
                    in.dispatch_dtype = "fp32";
                  const WorldPlan wp = plan_world(WorldLayout(c), in, cluster);
                  RankedLayout r;
                  r.config = c;
                  r.backends = {b};
                  r.flags = layout_flags(c, r.backends);
                  r.replicas = replicas;
                  r.pp = pp;
                  r.path = wp.plans.front().path;
                  for (const WorldStage& st : wp.stages)
                    for (const RankPlan& rp : wp.plan_of(st).ranks) {
                      const Handover& h = wp.handover[std::size_t(rp.coords.rank)];
                      const double piped = (st.sends ? h.sent : 0.0) + (st.receives ? h.gathered : 0.0);
                      r.bytes_per_rank = std::max(r.bytes_per_rank, pp * (rp.total_bytes() + piped));
                      r.memory_per_rank = std::max(r.memory_per_rank, rp.memory.total());
                    }
                  const RankTime slowest = wp.slowest_stage().time.time;
                  r.time = {pp * slowest.comm, pp * slowest.compute};
                  r.fits = r.memory_per_rank <= gpu_memory;
                  row_of[key] = out.layouts.size();
                  out.layouts.push_back(r);
                }
      }
    }
  }
  for (const auto& [flag, rule] : dims_rule)
    out.skipped["the model's dims (" + flag + ", e.g. " + rule.second + ")"] = rule.first;
  if (out.layouts.empty()) {
    std::string why;
    for (const auto& [reason, n] : out.skipped) why += "; " + std::to_string(n) + " skipped for " + reason;
    throw LayoutError("--gpus", "--gpus " + std::to_string(gpus) + ": no layout of " + std::to_string(gpus) +
                                    " GPUs runs this model" + (why.empty() ? "" : why));
  }
  // The layouts that fit in memory first, each part by predicted time.
  std::stable_sort(out.layouts.begin(), out.layouts.end(), [](const RankedLayout& a, const RankedLayout& b) {
    return a.fits != b.fits ? a.fits : a.time.total() < b.time.total();
  });
  return out;
}

inline nlohmann::json backends_json(const std::vector<Backend>& backends) {
  nlohmann::json j = nlohmann::json::array();
  for (Backend b : backends) j.push_back(std::string(to_string(b)));
  return j;
}

inline nlohmann::json ranking_json(const Ranking& r) {
  nlohmann::json j;
  j["gpus"] = r.gpus;
  j["routing"] = kRoutingNote;
  j["backends"] = kBackendsNote;
  j["layouts"] = nlohmann::json::array();
  for (const RankedLayout& l : r.layouts)
    j["layouts"].push_back({{"flags", l.flags},
                            {"backends", backends_json(l.backends)},
                            {"replicas", l.replicas},
                            {"pp", l.pp},
                            {"path", std::string(to_string(l.path))},
                            {"bytes_per_rank", l.bytes_per_rank},
                            {"memory_per_rank", l.memory_per_rank},
                            {"predicted_s", l.time.total()},
                            {"comm_s", l.time.comm},
                            {"compute_s", l.time.compute},
                            {"fits", l.fits}});
  j["skipped"] = nlohmann::json::object();
  for (const auto& [reason, n] : r.skipped) j["skipped"][reason] = n;
  return j;
}

inline std::string ms_text(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3f ms", s * 1e3);
  return b;
}

inline std::string ranking_text(const Ranking& r, const std::string& header, std::size_t top = 0) {
  std::ostringstream s;
  s << header;
  char line[400];
  std::snprintf(line, sizeof line, "%4s  %12s  %12s  %12s  %11s  %11s  %-4s  %-9s  %s\n", "#", "predicted", "comm",
                "compute", "bytes/rank", "memory/rank", "fits", "path", "flags");
  s << line;
  std::size_t i = 0;
  for (const RankedLayout& l : r.layouts) {
    if (top > 0 && i >= top) break;
    std::snprintf(line, sizeof line, "%4zu  %12s  %12s  %12s  %11s  %11s  %-4s  %-9s  %s%s\n", ++i,
                  ms_text(l.time.total()).c_str(), ms_text(l.time.comm).c_str(), ms_text(l.time.compute).c_str(),
                  bytes_text(l.bytes_per_rank).c_str(), bytes_text(l.memory_per_rank).c_str(), l.fits ? "yes" : "NO",
                  std::string(to_string(l.path)).c_str(), l.flags.c_str(),
                  l.replicas > 1 ? (" (" + std::to_string(l.replicas) + " replicas)").c_str() : "");
    s << line;
  }
  if (top > 0 && r.layouts.size() > top) s << "  ... " << r.layouts.size() - top << " more (--top 0 lists all)\n";
  s << "note: " << kBackendsNote << "\n";
  for (const auto& [reason, n] : r.skipped) s << "skipped: " << n << " layout" << (n > 1 ? "s" : "") << ", " << reason << "\n";
  return s.str();
}

}  // namespace relayout::cli
