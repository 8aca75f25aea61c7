// `relayout plan --gpus N`: every valid layout of N GPUs for a model and a batch, each planned
// (plan.hpp) and timed (plan_time.hpp), sorted by predicted time per forward (those that fit in
// the GPU's memory first). Validity is the layout engine's (relayout::derive_widths) and the demo
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

namespace relayout::cli {

// Published model configurations. DeepSeek-V3: config.json of the deepseek-ai/DeepSeek-V3 model
// repository (hidden_size 7168, num_hidden_layers 61, n_routed_experts 256, num_experts_per_tok 8,
// n_shared_experts 1, moe_intermediate_size 2048, num_attention_heads 128, q_lora_rank 1536,
// kv_lora_rank 512). The demo layer has one shared K/V row per token: kv_lora_rank is its width,
// as MLA's latent in its absorbed form; the one shared expert has moe_intermediate_size. Every
// layer is an MoE layer here (DeepSeek-V3's first 3 are dense).
inline model::ModelDims preset_dims(const std::string& name) {
  if (name != "deepseek-v3") throw LayoutError("--preset", "--preset: unknown model '" + name + "'; expected one of: deepseek-v3");
  model::ModelDims d;
  d.hidden = 7168;       // hidden_size
  d.layers = 61;         // num_hidden_layers
  d.experts = 256;       // n_routed_experts
  d.topk = 8;            // num_experts_per_tok
  d.moe_inter = 2048;    // moe_intermediate_size
  d.shared_inter = 2048; // n_shared_experts (1) x moe_intermediate_size
  d.heads = 128;         // num_attention_heads
  d.q_lora = 1536;       // q_lora_rank
  d.head_dim = 512;      // kv_lora_rank
  return d;
}

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
  int replicas = 1;  // domains of tp = gpus / replicas (--dp without DP attention)
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
  if (c.dp > 1) s += " --dp " + std::to_string(c.dp);
  if (c.enable_dp_attention) s += " --enable-dp-attention";
  if (c.enable_prefill_cp) s += " --enable-prefill-cp";
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

// Every layout of `gpus` GPUs: replicas of a smaller domain (DP without DP attention), DP
// attention of every width, attention CP of every width and DeepSeek-V4 prefill CP, backend none
// with every ep, every all-to-all backend (one row per layout for those it accepts), every moe_dp.
// Throws LayoutError naming --gpus when none is valid.
inline Ranking rank_layouts(int gpus, std::int64_t batch_tokens, int request_tokens, PlanInput base,
                            const Cluster& cluster, double gpu_memory) {
  Ranking out;
  out.gpus = gpus;
  batch_requests(batch_tokens, request_tokens);  // checks the request count before any layout
  std::map<std::string, std::size_t> row_of;     // layout key -> its row in out.layouts
  std::map<std::string, std::pair<int, std::string>> dims_rule;
  std::set<std::string> refused;  // layouts the model's dims rule out, counted once
  for (int replicas : divisors(gpus)) {
    const int tp = gpus / replicas;
    const std::int64_t tokens = (batch_tokens + replicas - 1) / replicas;
    for (bool dpa : {false, true}) {
      if (dpa && replicas > 1) continue;  // SGLang: attention DP inside replicas of the domain is not supported
      for (int dp : dpa ? divisors(tp) : std::vector<int>{replicas}) {
        if (dpa && dp == 1) continue;  // the widths of DP attention off
        for (bool prefill : {false, true})
          for (int cp : prefill ? std::vector<int>{1} : divisors(tp))
            for (const auto& backend : relayout::impl::kBackendNames.entries)
              for (const Backend b = backend.first; int ep : b == Backend::none ? divisors(tp) : std::vector<int>{1})
                for (int moe_dp : divisors(tp)) {
                  const LayoutConfig c{.tp = tp, .dp = dp, .cp = cp, .ep = ep, .moe_dp = moe_dp,
                                       .enable_dp_attention = dpa, .moe_a2a_backend = b,
                                       .enable_prefill_cp = prefill};
                  const WidthsResult wr = derive_widths(c);
                  if (wr.rule != LayoutRule::ok) continue;
                  const Widths& w = wr.widths;
                  const std::string key = std::to_string(replicas) + "/" + std::to_string(w.attn_dp) + "/" +
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
                  const LayerPlan p = plan_layer(layout, in);
                  RankedLayout r;
                  r.config = c;
                  r.backends = {b};
                  r.flags = layout_flags(c, r.backends);
                  r.replicas = replicas;
                  r.path = p.path;
                  for (const RankPlan& rp : p.ranks) {
                    r.bytes_per_rank = std::max(r.bytes_per_rank, rp.total_bytes());
                    r.memory_per_rank = std::max(r.memory_per_rank, rp.memory.total());
                  }
                  r.time = forward_time(p, cluster);
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
