// `relayout plan` over the whole world (relayout/mesh/world.hpp): native data-parallel replicas
// (--dp without DP attention) x --pp-size pipeline stages x one TP domain each, on --nnodes nodes.
//
// Each stage holds its share of the layers, split as SGLang splits them (get_pp_indices in
// sglang/srt/distributed/utils.py, without SGLANG_PP_LAYER_PARTITION): layers / pp each, the last
// layers % pp stages one layer more. A stage's domain runs the plan of plan.hpp with its layers,
// so weights, K/V and per-forward compute divide by stage. Between stages the micro-batch's
// activations travel point-to-point to the same tp rank of the next stage, as SGLang's
// pp_group.send_tensor_dict(..., all_gather_group=attn_tp_group) sends them: each attn_tp rank
// sends its 1/attn_tp slice of every tensor when the slice is whole, and the receiving stage
// all-gathers the slices over attn_tp. SGLang keeps pp micro-batches in flight, so in the steady
// state one micro-batch leaves the pipeline every (slowest stage) seconds; replicas run their own
// micro-batches and multiply the tokens per second, not the memory per rank.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "cli/plan.hpp"
#include "cli/plan_time.hpp"
#include "relayout/mesh.hpp"

namespace relayout::cli {

// The layers [first, first + count) of one stage.
struct StageLayers {
  int first = 0, count = 0;
  int end() const { return first + count; }
};

// SGLang's split: stage `stage` of `pp` over `layers` layers.
inline StageLayers stage_layers(int layers, int pp, int stage) {
  const int base = layers / pp, extra = layers % pp;
  if (stage >= pp - extra) return {stage * (base + 1) - (pp - extra), base + 1};
  return {stage * base, base};
}

inline constexpr const char* kLayerSplitNote =
    "layers / pp on each stage, the last layers % pp stages one more (SGLang's get_pp_indices)";

// Every stage needs a layer: --pp-size <= the model's layers (`what` names them).
inline void check_stages(int layers, int pp, const std::string& what) {
  if (pp > layers)
    throw LayoutError("--pp-size", "--pp-size " + std::to_string(pp) + " with " + what + ": " + std::to_string(pp) +
                                       " pipeline stages cannot each hold a layer of " + std::to_string(layers) +
                                       "; relayout plan: --pp-size must be <= the model's layers");
}

// What one rank hands to the next stage per micro-batch: `rows` rows of `tensors` tensors of
// `hidden` values of `elem` bytes. Sliced over attn_tp when every slice is whole: `sent` is the
// slice, `gathered` the assembled buffer the receiver all-gathers (0: sent whole, no gather).
struct Handover {
  double sent = 0, gathered = 0;
};

inline Handover handover(double rows, double hidden, double elem, int tensors, int attn_tp) {
  const double numel = rows * hidden, full = tensors * numel * elem;
  if (attn_tp > 1 && numel == std::floor(numel) && std::fmod(numel, double(attn_tp)) == 0) return {full / attn_tp, full};
  return {full, 0.0};
}

// The node size the time model uses: with --nnodes given, the world's ranks a node (which must fit
// in a node's GPUs); without it the cluster's --gpus-per-node, the ranks numbered node by node.
inline Cluster world_cluster(const WorldLayout& world, bool nnodes_given, Cluster c) {
  if (!nnodes_given) return c;
  const int per = world.ranks_per_node();
  if (per > c.gpus_per_node)
    throw LayoutError("--nnodes", "--nnodes " + std::to_string(world.nnodes()) + ": the world's " +
                                      std::to_string(world.size()) + " ranks are " + std::to_string(per) +
                                      " ranks a node, more than the " + std::to_string(c.gpus_per_node) +
                                      " GPUs of a node (--gpus-per-node / --hardware " + c.hardware +
                                      "); give more nodes");
  c.gpus_per_node = per;
  return c;
}

// Nodes the world spans: --nnodes when given, else as many as its ranks fill.
inline std::int64_t world_nodes(const WorldLayout& world, bool nnodes_given, const Cluster& c) {
  return nnodes_given ? world.nnodes() : (std::int64_t{world.size()} + c.gpus_per_node - 1) / c.gpus_per_node;
}

inline std::string world_line(const WorldLayout& world, bool nnodes_given, const Cluster& c) {
  const std::int64_t nodes = world_nodes(world, nnodes_given, c);
  const auto s = [](std::int64_t v) { return std::to_string(v); };
  return "world: " + s(world.replicas()) + (world.replicas() == 1 ? " replica" : " replicas") + " x pp " + s(world.pp()) +
         " x tp " + s(world.tp()) + " = " + s(world.size()) + " ranks on " + s(nodes) + (nodes == 1 ? " node" : " nodes") +
         " of " + s(c.gpus_per_node) + " ranks" + (nnodes_given ? " (--nnodes)" : " (ranks numbered node by node)") + "\n";
}

// The verdict line of a single layout's plan: whether its fullest rank, `need` bytes, fits in
// `have` (--gpu-memory, else the --hardware preset's HBM).
inline std::string fit_text(double need, double have) {
  if (need <= have)
    return "fits in --gpu-memory " + bytes_text(have) + ": yes, " + bytes_text(have - need) + " to spare on the fullest rank\n";
  return "fits in --gpu-memory " + bytes_text(have) + ": NO, the fullest rank needs " + bytes_text(need) + ", " +
         bytes_text(need - have) + " more than a GPU has\n";
}

// One rank's time in a stage: its domain's collectives and flops, its hand-over to the next stage
// (`sends`) and the all-gather of the slices it received (`receives`).
struct StageRankTime {
  RankTime time;  // comm includes the hand-over and the gather
  double send_s = 0, gather_s = 0;
};

inline std::size_t group_slot(GroupKind kind) {
  for (std::size_t g = 0; g < kAllGroupKinds.size(); ++g)
    if (kAllGroupKinds[g] == kind) return g;
  return 0;
}

inline StageRankTime stage_rank_time(const LayerPlan& p, const RankPlan& r, const Handover& h, bool sends, bool receives,
                                     std::int64_t first, const Cluster& c, const GroupNodes& nodes) {
  StageRankTime t;
  t.time = rank_time(p, r, c, nodes);
  const std::int64_t w = first + r.coords.rank, tp = p.layout.size();
  if (sends) t.send_s = p2p_seconds(h.sent, w / c.gpus_per_node == (w + tp) / c.gpus_per_node, c);
  if (receives && h.gathered > 0) {
    const GroupKind g = GroupKind::attn_tp;
    const bool one = nodes.one_node[group_slot(g)][std::size_t(p.layout.group_index(g, r.coords.rank))] != 0;
    t.gather_s = collective_seconds(TrafficOp::all_gather, double(p.layout.group_size(g)), one, 1, h.gathered, c);
  }
  t.time.comm += t.send_s + t.gather_s;
  return t;
}

struct WorldStage {
  int stage = 0;
  StageLayers layers;
  std::size_t plan = 0;  // WorldPlan::plans index
  bool sends = false, receives = false;
  StageRankTime time;  // its slowest rank over every replica's domain of this stage
  int slowest = 0;     // that rank (domain rank)
};

struct WorldPlan {
  explicit WorldPlan(const WorldLayout& w) : world(w) {}
  WorldLayout world;
  int layers = 0;            // the model's
  bool nnodes_given = false;
  Cluster cluster;           // the time model, its node size the world's
  double micro_tokens = 0;   // rows of one micro-batch over the domain
  std::vector<LayerPlan> plans;    // one per distinct stage layer count
  std::vector<Handover> handover;  // per domain rank, one micro-batch
  std::vector<WorldStage> stages;

  const LayerPlan& plan_of(const WorldStage& s) const { return plans[s.plan]; }
  // A micro-batch through every stage, and the steady state's interval: the slowest stage.
  double latency() const {
    double t = 0;
    for (const WorldStage& s : stages) t += s.time.time.total();
    return t;
  }
  // The most memory a rank of any stage holds, and whether it fits a GPU (cluster.memory).
  double memory_per_rank() const {
    double m = 0;
    for (const LayerPlan& p : plans)
      for (const RankPlan& r : p.ranks) m = std::max(m, r.memory.total());
    return m;
  }
  bool fits() const { return memory_per_rank() <= cluster.memory; }
  const WorldStage& slowest_stage() const {
    return *std::max_element(stages.begin(), stages.end(),
                             [](const WorldStage& a, const WorldStage& b) { return a.time.time.total() < b.time.time.total(); });
  }
  double interval() const { return slowest_stage().time.time.total(); }
  double tokens_per_s() const { return micro_tokens / interval(); }  // one pipeline (replica)
  double world_tokens_per_s() const { return world.replicas() * tokens_per_s(); }
};

// The plan of the world `world` for the demo layer, `in.requests` being one micro-batch of a domain.
// Throws LayoutError naming the flag (the layer's checks, and --pp-size > --layers).
inline WorldPlan plan_world(const WorldLayout& world, const PlanInput& in, const Cluster& cluster, bool nnodes_given = false) {
  model::validate(in.dims, world.domain().widths());
  const int L = in.dims.layers, pp = world.pp(), tp = world.tp();
  check_stages(L, pp, "--layers " + std::to_string(L));
  WorldPlan wp(world);
  wp.layers = L;
  wp.nnodes_given = nnodes_given;
  wp.cluster = world_cluster(world, nnodes_given, cluster);
  const Cluster& c = wp.cluster;
  std::map<int, std::size_t> plan_of;  // layer count -> plan
  for (int s = 0; s < pp; ++s) {
    WorldStage st;
    st.stage = s;
    st.layers = stage_layers(L, pp, s);
    st.sends = s + 1 < pp;
    st.receives = s > 0;
    if (const auto it = plan_of.find(st.layers.count); it != plan_of.end()) {
      st.plan = it->second;
    } else {
      PlanInput si = in;
      si.dims.layers = st.layers.count;
      st.plan = plan_of[st.layers.count] = wp.plans.size();
      wp.plans.push_back(plan_layer(world.domain(), si));
    }
    wp.stages.push_back(st);
  }
  const LayerPlan& first = wp.plans.front();
  for (std::int64_t g : first.group_rows) wp.micro_tokens += double(g);
  const int attn_tp = world.domain().widths().attn_tp;
  for (const RankPlan& r : first.ranks)
    wp.handover.push_back(handover(r.attention_rows, in.dims.hidden, first.elem, 1, attn_tp));
  // A stage's time over every replica's domain of it: the groups' nodes depend on the domain's
  // first world rank modulo the node size only, so each such offset is timed once.
  std::map<std::tuple<std::size_t, bool, bool, std::int64_t>, std::pair<StageRankTime, int>> timed;
  for (WorldStage& st : wp.stages) {
    bool any = false;
    for (int rep = 0; rep < world.replicas(); ++rep) {
      const std::int64_t offset = ((std::int64_t{rep} * pp + st.stage) * tp) % c.gpus_per_node;
      const auto key = std::make_tuple(st.plan, st.sends, st.receives, offset);
      auto it = timed.find(key);
      if (it == timed.end()) {
        const LayerPlan& p = wp.plans[st.plan];
        const GroupNodes nodes(p.layout, c, offset);
        std::pair<StageRankTime, int> worst{};
        for (const RankPlan& r : p.ranks) {
          const StageRankTime t =
              stage_rank_time(p, r, wp.handover[std::size_t(r.coords.rank)], st.sends, st.receives, offset, c, nodes);
          if (r.coords.rank == 0 || t.time.total() > worst.first.time.total()) worst = {t, r.coords.rank};
        }
        it = timed.emplace(key, worst).first;
      }
      if (!any || it->second.first.time.total() > st.time.time.total()) {
        st.time = it->second.first;
        st.slowest = it->second.second;
      }
      any = true;
    }
  }
  return wp;
}

// The pipeline's entries of a rank's collectives in a stage (TrafficLog's shape; names of their own).
inline nlohmann::json pipeline_collectives_json(const WorldStage& s, const Handover& h) {
  nlohmann::json out = nlohmann::json::array();
  if (s.sends) out.push_back({{"op", "pp_send"}, {"group", "pp"}, {"calls", 1}, {"bytes", std::llround(h.sent)}});
  if (s.receives) out.push_back({{"op", "pp_recv"}, {"group", "pp"}, {"calls", 1}, {"bytes", std::llround(h.sent)}});
  if (s.receives && h.gathered > 0)
    out.push_back({{"op", "pp_all_gather"}, {"group", "attn_tp"}, {"calls", 1}, {"bytes", std::llround(h.gathered)}});
  return out;
}

inline std::string pipeline_collectives_text(const WorldStage& s, const Handover& h) {
  std::string t;
  if (s.sends) t += " pp_send@pp x1 " + bytes_text(h.sent);
  if (s.receives) t += std::string(t.empty() ? "" : ";") + " pp_recv@pp x1 " + bytes_text(h.sent);
  if (s.receives && h.gathered > 0) t += "; pp_all_gather@attn_tp x1 " + bytes_text(h.gathered);
  return t;
}

inline nlohmann::json plan_world_json(const WorldPlan& wp) {
  const WorldLayout& w = wp.world;
  return {{"replicas", w.replicas()},
          {"pp", w.pp()},
          {"tp", w.tp()},
          {"size", w.size()},
          {"nnodes", world_nodes(w, wp.nnodes_given, wp.cluster)},
          {"ranks_per_node", wp.cluster.gpus_per_node},
          {"rank_order", "(replica, pp, tp), tp fastest: rank = (replica * pp + pp_rank) * tp + tp_rank"},
          {"layer_split", kLayerSplitNote},
          {"micro_batch_tokens", wp.micro_tokens},
          {"handover_tensors", 1},
          {"pipeline_latency_s", wp.latency()},
          {"stage_interval_s", wp.interval()},
          {"tokens_per_s", wp.tokens_per_s()},
          {"world_tokens_per_s", wp.world_tokens_per_s()},
          {"memory_per_rank", wp.memory_per_rank()},
          {"gpu_memory", wp.cluster.memory},
          {"fits", wp.fits()}};
}

// plan_json of the first stage (its ranks: the whole domain's when pp = 1), the model's layers, the
// world and every stage with its ranks. predicted_s: a micro-batch through every stage (pp = 1:
// the forward of the domain).
inline nlohmann::json world_plan_json(const WorldPlan& wp) {
  const WorldLayout& w = wp.world;
  const WorldStage& s0 = wp.stages.front();
  nlohmann::json j = plan_json(wp.plan_of(s0));
  j["layers"] = wp.layers;
  j["predicted_s"] = wp.latency();
  double comm = 0, compute = 0;
  for (const WorldStage& s : wp.stages) {
    comm += s.time.time.comm;
    compute += s.time.time.compute;
  }
  j["comm_s"] = comm;
  j["compute_s"] = compute;
  j["world"] = plan_world_json(wp);
  j["stages"] = nlohmann::json::array();
  const Cluster& c = wp.cluster;
  for (const WorldStage& s : wp.stages) {
    const LayerPlan& p = wp.plan_of(s);
    const std::int64_t first = std::int64_t{s.stage} * w.tp();
    const GroupNodes nodes(p.layout, c, first);
    nlohmann::json st = {{"stage", s.stage},
                         {"first_layer", s.layers.first},
                         {"layers", s.layers.count},
                         {"first_world_rank", first},
                         {"predicted_s", s.time.time.total()},
                         {"comm_s", s.time.time.comm},
                         {"compute_s", s.time.time.compute},
                         {"handover_s", s.time.send_s},
                         {"gather_s", s.time.gather_s},
                         {"slowest_rank", s.slowest},
                         {"ranks", nlohmann::json::array()}};
    for (const RankPlan& r : p.ranks) {
      const Handover& h = wp.handover[std::size_t(r.coords.rank)];
      nlohmann::json coll = collectives_json(r);
      for (const nlohmann::json& e : pipeline_collectives_json(s, h)) coll.push_back(e);
      const StageRankTime t = stage_rank_time(p, r, h, s.sends, s.receives, first, c, nodes);
      st["ranks"].push_back({{"rank", r.coords.rank},
                             {"world_rank", first + r.coords.rank},
                             {"collectives", coll},
                             {"memory", memory_json(r)},
                             {"flops", r.memory.flops},
                             {"predicted_s", t.time.total()}});
    }
    j["stages"].push_back(st);
  }
  // The first stage's ranks with their pipeline entries and times.
  const LayerPlan& p0 = wp.plan_of(s0);
  const GroupNodes nodes0(p0.layout, c, 0);
  for (std::size_t r = 0; r < p0.ranks.size(); ++r) {
    const Handover& h = wp.handover[r];
    for (const nlohmann::json& e : pipeline_collectives_json(s0, h)) j["ranks"][r]["collectives"].push_back(e);
    j["ranks"][r]["predicted_s"] = stage_rank_time(p0, p0.ranks[r], h, s0.sends, s0.receives, 0, c, nodes0).time.total();
  }
  return j;
}

// Consecutive stages alike (the same layer count and hand-overs), as [first, last] stage indices.
inline std::vector<std::pair<int, int>> stage_runs(const WorldPlan& wp) {
  std::vector<std::pair<int, int>> runs;
  for (const WorldStage& s : wp.stages) {
    if (!runs.empty()) {
      const WorldStage& prev = wp.stages[std::size_t(runs.back().second)];
      if (prev.layers.count == s.layers.count && prev.sends == s.sends && prev.receives == s.receives) {
        runs.back().second = s.stage;
        continue;
      }
    }
    runs.push_back({s.stage, s.stage});
  }
  return runs;
}

inline std::string layers_text(int n) { return std::to_string(n) + (n == 1 ? " layer" : " layers"); }

inline std::string stages_name(int a, int b) {
  return a == b ? "stage " + std::to_string(a) : "stages " + std::to_string(a) + "-" + std::to_string(b);
}

inline std::string world_plan_text(const WorldPlan& wp) {
  const WorldLayout& w = wp.world;
  const Cluster& c = wp.cluster;
  std::ostringstream s;
  s << plan_head_text(wp.plan_of(wp.stages.front()), wp.layers) << world_line(w, wp.nnodes_given, c);
  char b[400];
  if (w.pp() == 1) {
    const LayerPlan& p = wp.plans.front();
    s << "\nPer rank, one forward (" << wp.layers << " layers):\n";
    for (const RankPlan& r : p.ranks) s << rank_text(p, r);
    const RankTime f = wp.stages.front().time.time;
    std::snprintf(b, sizeof b, "\npredicted forward: %.6f s (slowest rank: communication %.6f s, compute %.6f s)\n", f.total(),
                  f.comm, f.compute);
    s << b;
    std::snprintf(b, sizeof b, "throughput: %.0f tokens a forward, %.0f tokens/s per domain", wp.micro_tokens, wp.tokens_per_s());
    s << b;
    if (w.replicas() > 1) {
      std::snprintf(b, sizeof b, "; %d replicas (each its own batch): %.0f tokens/s in all", w.replicas(), wp.world_tokens_per_s());
      s << b;
    }
    s << "\n";
  } else {
    s << "stages: " << kLayerSplitNote << ":";
    for (const auto& [a, z] : stage_runs(wp)) {
      const StageLayers la = wp.stages[std::size_t(a)].layers, lz = wp.stages[std::size_t(z)].layers;
      s << " " << stages_name(a, z) << ": " << layers_text(la.count) << (a == z ? "" : " each") << " [" << la.first << ", "
        << lz.end() << ")" << (z + 1 < w.pp() ? ";" : "");
    }
    s << "\npipeline: each stage hands one micro-batch's " << wp.micro_tokens
      << " rows of hidden states to the same tp rank of the next stage (sliced over attn_tp when whole, then all-gathered "
         "there); "
      << w.pp() << " micro-batches in flight\n";
    for (const auto& [a, z] : stage_runs(wp)) {
      const WorldStage& st = wp.stages[std::size_t(a)];
      const LayerPlan& p = wp.plan_of(st);
      s << "\nPer rank of " << stages_name(a, z) << " (" << layers_text(st.layers.count) << (a == z ? "" : " each")
        << "; world ranks " << std::int64_t{a} * w.tp() << "-" << (std::int64_t{z} + 1) * w.tp() - 1
        << " of replica 0), one micro-batch:\n";
      for (const RankPlan& r : p.ranks) s << rank_text(p, r, pipeline_collectives_text(st, wp.handover[std::size_t(r.coords.rank)]));
    }
    s << "\npredicted per stage, one micro-batch (slowest rank):";
    for (const auto& [a, z] : stage_runs(wp)) {
      const StageRankTime& t = wp.stages[std::size_t(a)].time;
      std::snprintf(b, sizeof b, " %s %.6f s (communication %.6f s of which hand-over %.6f s, gather %.6f s; compute %.6f s)%s",
                    stages_name(a, z).c_str(), t.time.total(), t.time.comm, t.send_s, t.gather_s, t.time.compute,
                    z + 1 < w.pp() ? ";" : "");
      s << b;
    }
    std::snprintf(b, sizeof b,
                  "\npipeline: a micro-batch crosses the %d stages in %.6f s; steady state: one every %.6f s (the slowest "
                  "stage), %.0f tokens/s per pipeline",
                  w.pp(), wp.latency(), wp.interval(), wp.tokens_per_s());
    s << b;
    if (w.replicas() > 1) {
      std::snprintf(b, sizeof b, "; %d replicas (each its own micro-batches): %.0f tokens/s in all", w.replicas(),
                    wp.world_tokens_per_s());
      s << b;
    }
    s << "\n";
  }
  s << fit_text(wp.memory_per_rank(), c.memory) << cluster_text(c) << "no overlap of communication and compute\n";
  return s.str();
}

}  // namespace relayout::cli
