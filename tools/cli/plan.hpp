// `relayout plan`: what one forward of the demo DeepSeek-V4-like layer sends and holds on every
// rank of a layout, on paper. The collectives come from the bridge's own plan
// (relayout::bridge_plan, the steps MoeBridge runs) plus the layer's attention all-reduce and the
// token-count all-gather, with the byte counts the library's TrafficLog records for each (see
// relayout/placement/impl/moves.hpp and ep.hpp: bytes a rank hands to the collective; for
// gathers, the assembled receive buffer). Every size is exact except EP dispatch/combine, whose
// bytes depend on the router: those are expected values under uniform routing (each row's top-k
// experts a uniformly random k-subset of the experts). dsv4_layer measures the same quantities
// (`--format json`, ranks[].collectives[]); test/cli compares the two.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <span>
#include <string>
#include <vector>

#include "common/files.hpp"
#include "common/layout_flags.hpp"
#include "common/memory_estimate.hpp"
#include "demo_model/config.hpp"
#include "demo_model/workload.hpp"
#include "relayout/bridge/plan.hpp"
#include "relayout/mesh.hpp"
#include "relayout/placement/dp_slots.hpp"
#include "relayout/placement/ep_message.hpp"
#include "relayout/placement/expert_load_json.hpp"
#include "relayout/placement/expert_location.hpp"
#include "relayout/placement/split.hpp"
#include "relayout/placement/traffic.hpp"

namespace relayout::cli {

// What the plan is made from: the flags of dsv4_layer.
struct PlanInput {
  model::ModelDims dims;
  std::vector<int> requests{5, 3, 4, 2, 6, 1, 3};  // dsv4_layer's default workload
  std::vector<int> placement;
  std::string padding = "auto";
  std::string restore = "reduce";
  double elem = 4;         // bytes of one value: the demo layer computes in float
  double weight_elem = 0;  // bytes of one weight (0: elem)
  std::string dispatch_dtype = "fp32";  // bf16 / fp8: dispatched rows travel as 2-byte values / e4m3 (dsv4_layer --dispatch-dtype)
  // --expert-load: per layer, per logical expert (the file dsv4_layer --expert-load-out writes);
  // empty: uniform routing.
  std::optional<std::vector<std::vector<double>>> load;
};

// The per-expert loads of a load file: the library's format {"experts": E, "loads": [E numbers]}
// (relayout/placement/expert_load_json.hpp, what an engine exports), or one list per layer,
// {"experts": E, "layers": [[E numbers], ...]}; both parsed by the library's strict parser.
inline std::vector<std::vector<double>> parse_load_layers(const std::string& text, const std::string& source) {
  try {
    return parse_expert_load_layers_json(text, -1, source);
  } catch (const LayoutError& e) {
    throw LayoutError("--expert-load", e.what());
  }
}

// An expert-load file (cli::read_input_flag): a regular file, not a link, of at most 64 MiB (61
// layers of 65536 experts at 16 characters a load).
inline const io::InputRule kLoadFileRule{"an expert-load file", "a regular JSON file, as dsv4_layer --expert-load-out writes",
                                         std::uintmax_t(64) << 20};

inline std::vector<std::vector<double>> read_load_file(const std::string& path) {
  return parse_load_layers(read_input_flag("--expert-load", path, kLoadFileRule), "--expert-load '" + path + "'");
}

// The expert-load factors of both plans (the demo layer's and the MLA presets'), from logical
// per-expert loads, one list per layer: each layer's experts placed by `place` (a function of the
// layer's loads returning the library's ExpertLocation), each expert's load split evenly over its
// replicas (expected_member_load), each moe_ep rank's load over the layer's mean. `per_rank` is
// the mean over the layers of each rank's factor (its expected pairs); `imbalance` the mean over
// the layers of the layer's busiest rank (max_over_mean): every layer waits for its own busiest
// rank, whichever it is, so a rank hot in one layer and cold in the next still costs both layers.
struct ExpertLoadFactors {
  std::vector<double> per_rank;
  double imbalance = 1.0;
};

template <class Place>
ExpertLoadFactors expert_load_factors(const std::vector<std::vector<double>>& layers, int ep, Place&& place) {
  ExpertLoadFactors f;
  f.per_rank.assign(static_cast<std::size_t>(ep), 0.0);
  double busiest = 0;
  for (const std::vector<double>& load : layers) {
    const ExpertLocation loc = place(load);
    const std::vector<double> member = expected_member_load(loc, load);
    double sum = 0;
    for (double x : member) sum += x;
    for (std::size_t r = 0; r < f.per_rank.size(); ++r) f.per_rank[r] += sum > 0 ? member[r] / sum * ep : 1.0;
    busiest += max_over_mean(member);
  }
  for (double& x : f.per_rank) x /= double(layers.size());
  f.imbalance = busiest / double(layers.size());
  return f;
}

// The demo layer's placement: contiguous over moe_ep (ExpertLocation::identity: expert e on moe_ep
// rank e / (experts / moe_ep)), no redundant experts.
inline ExpertLoadFactors load_factors(const std::vector<std::vector<double>>& layers, int ep) {
  return expert_load_factors(layers, ep, [ep](const std::vector<double>& load) {
    return ExpertLocation::identity(int(load.size()), 0, ep);
  });
}

inline constexpr std::size_t kPlanSlots = TrafficLog::kOps * TrafficLog::kGroups;

struct RankPlan {
  RankCoords coords;
  std::array<std::int64_t, kPlanSlots> calls{};  // [op][group], as TrafficLog
  std::array<double, kPlanSlots> bytes{};
  double attention_rows = 0;  // rows of its attention-DP group
  double moe_rows = 0;        // rows its router routes (entering its MoE step)
  double expert_rows = 0;     // rows its experts receive (dispatch: expected under uniform routing)
  double expert_pairs = 0;    // (row, local expert) pairs its experts compute (expected)
  WeightShards weights;       // bytes
  MemoryEstimate memory;      // bytes; flops of the forward
  double kv_per_token = 0;    // bytes of attention K/V per token (all layers) this rank keeps

  void add(TrafficOp op, GroupKind g, double b, std::int64_t n = 1) {
    const std::size_t s = TrafficLog::slot(op, g);
    calls[s] += n;
    bytes[s] += b * double(n);
  }
  double total_bytes() const {
    double t = 0;
    for (double b : bytes) t += b;
    return t;
  }
};

struct LayerPlan {
  explicit LayerPlan(const RuntimeLayout& l) : layout(l) {}
  RuntimeLayout layout;
  model::ModelDims dims;
  double elem = 4, weight_elem = 4;
  BridgePath path = BridgePath::tp_moe;
  PaddingMode padding = PaddingMode::sum_len;
  BridgeRestore restore = BridgeRestore::reduce;
  std::vector<std::int64_t> global_num_tokens;  // one entry per CP share of each DP group
  std::vector<std::int64_t> group_rows;         // rows of each attention-DP group
  std::span<const PlanStep> steps;
  std::string dispatch_dtype = "fp32";
  EpMessage message;  // one dispatched row (EpBuffer's message, with elem-byte values)
  double destinations_per_row = 0;  // expected moe_ep ranks a row is dispatched to (uniform routing)
  std::vector<double> load_factors;  // per moe_ep rank: its (row, expert) pairs over the mean (1: uniform)
  double load_imbalance = 1.0;       // expert_load_factors' imbalance: the busiest rank of each layer
  bool measured_load = false;        // the factors come from --expert-load
  std::vector<RankPlan> ranks;
  double imbalance() const { return load_imbalance; }
};

// Expected number of moe_ep ranks holding at least one of a row's top-k experts when the k
// experts are a uniformly random k-subset of `experts` spread evenly over `ep` ranks:
// ep * (1 - C(experts - per_rank, k) / C(experts, k)).
inline double expected_destinations(int experts, int k, int ep) {
  const int per_rank = experts / ep;
  double miss = 1.0;  // P(none of the k experts on a given rank)
  for (int i = 0; i < k; ++i) miss *= std::max(0.0, double(experts - per_rank - i) / double(experts - i));
  return ep * (1.0 - miss);
}

namespace impl {

// --element-bytes: the bytes of one value type.
inline void check_element_bytes(double elem) {
  if (elem != 1 && elem != 2 && elem != 4 && elem != 8) {
    char got[32];
    std::snprintf(got, sizeof got, "%g", elem);
    throw LayoutError("--element-bytes", std::string("--element-bytes must be 1, 2, 4 or 8 (the bytes of one value type), got ") + got);
  }
}

// The rows of every DP group and of every CP share of it (p.group_rows, p.global_num_tokens);
// returns each DP group's longest request.
inline std::vector<double> plan_shares(LayerPlan& p, const RuntimeLayout& layout, const model::Workload& work) {
  const Widths& w = layout.widths();
  // Under attention CP (attn_cp > 1) each rank holds its CP share of its DP group's rows, and the
  // bridge moves every (DP group, CP rank) share as a DP group of its own (cp_share_layout:
  // the same domain with attn_dp * attn_cp groups and no CP); global_num_tokens has one entry per
  // share, in rank order. Each share's rows: plain CP gives each CP rank two blocks of every request
  // (the zigzag split), prefill CP deals the group's tokens round-robin (docs/cp.md).
  const int C = w.attn_cp;
  const CpTokenSplit split = layout.cp_token_split();
  const bool round_robin = split == CpTokenSplit::round_robin;
  p.global_num_tokens.assign(std::size_t(w.attn_dp * C), 0);
  p.group_rows.assign(std::size_t(w.attn_dp), 0);
  std::vector<double> longest_of(std::size_t(w.attn_dp), 0.0);
  for (int q = 0; q < work.requests(); ++q) {
    const int g = work.placement[std::size_t(q)];
    const std::int64_t len = work.lengths[std::size_t(q)];
    p.group_rows[std::size_t(g)] += len;
    longest_of[std::size_t(g)] = std::max(longest_of[std::size_t(g)], double(len));
    if (!round_robin)
      for (int c = 0; c < C; ++c) p.global_num_tokens[std::size_t(g * C + c)] += cp_token_count(len, C, c, split);
  }
  if (round_robin)
    for (int g = 0; g < w.attn_dp; ++g)
      for (int c = 0; c < C; ++c)
        p.global_num_tokens[std::size_t(g * C + c)] = cp_token_count(p.group_rows[std::size_t(g)], C, c, split);
  return longest_of;
}

// The dispatched row (EpBuffer's message), its expected destinations and the experts' load
// factors (--expert-load).
inline void plan_routing(LayerPlan& p, const RuntimeLayout& layout, const PlanInput& in, DispatchDtype rows_as) {
  const model::ModelDims& d = in.dims;
  const int ep = layout.widths().moe_ep;
  const double e = in.elem;
  // The payload is the value type (DispatchDtype::compute) unless the rows are dispatched as bf16
  // (DispatchDtype::bf16) or fp8 (DispatchDtype::fp8: EpMessage::of_fp8); scalars are
  // aligned to their size. The router weights are compute_t<T>: fp32 for 16-bit (and 8-bit) values.
  const std::int64_t payload = rows_as == DispatchDtype::bf16 ? 2 : std::int64_t(e);
  const std::int64_t weight = e < 4 ? 4 : std::int64_t(e);
  p.message = rows_as == DispatchDtype::fp8
                  ? EpMessage::of_fp8(d.topk, d.hidden, weight, weight)
                  : EpMessage::of(d.topk, d.hidden, weight, weight, payload, payload);
  p.destinations_per_row = ep > 1 ? expected_destinations(d.experts, d.topk, ep) : 1.0;
  // --expert-load: the file's experts must be the layer's; each moe_ep rank's pairs (and the rows
  // it receives, at most every arriving row) scale by its load over the mean.
  p.load_factors.assign(std::size_t(ep), 1.0);
  if (in.load) {
    const std::size_t experts = in.load->front().size();
    if (experts != std::size_t(d.experts))
      throw LayoutError("--expert-load", "--expert-load: the file holds the loads of " + std::to_string(experts) +
                                             " experts; the demo layer routes over --experts " + std::to_string(d.experts) +
                                             ": the file must come from a run with the same --experts");
    const ExpertLoadFactors f = load_factors(*in.load, ep);
    p.load_factors = f.per_rank;
    p.load_imbalance = f.imbalance;
    p.measured_load = true;
  }
}

// What every rank's plan reads: the DP slots' rows, each rank's tensor_split chunk of its group's
// rows (the all-to-all paths) and their sum over each moe_ep group (the rows that may come to its
// members), and each DP group's longest request.
struct RankInputs {
  double total = 0;
  std::int64_t slot_rows = 0;
  std::vector<double> chunk, ep_rows, longest_of;
};

inline std::size_t share_of(const RankCoords& k, int attn_cp) { return std::size_t(k.attn_dp_rank * attn_cp + k.attn_cp_rank); }

// One rank's plan: its rows, one layer's collectives (every layer is the same) times the layers,
// its weights, memory and flops.
inline RankPlan plan_rank(const LayerPlan& p, const PlanInput& in, const RankInputs& ri, int r) {
  const RuntimeLayout& layout = p.layout;
  const Widths& w = layout.widths();
  const model::ModelDims& d = in.dims;
  const double H = d.hidden, K = d.topk, e = in.elem, L = d.layers, total = ri.total;
  const int A = w.attn_tp, ep = w.moe_ep, C = w.attn_cp;
  const double hit = p.destinations_per_row / ep;  // P(a row goes to a given moe_ep rank)
  const auto multi = [&](GroupKind g) { return layout.group_size(g) > 1; };
  RankPlan rp;
  rp.coords = layout.coords(r);
  const RankCoords& k = rp.coords;
  const std::int64_t n_rows = p.global_num_tokens[share_of(k, C)];
  const double n = double(n_rows);
  rp.attention_rows = n;
  // The token counts of every DP group, once per forward (gather_num_tokens).
  if (layout.size() > 1) rp.add(TrafficOp::all_gather_counts, GroupKind::tp, double(layout.size()) * 8.0);
  double buffer_rows = n;  // rows the bridge holds at once on this rank
  bool shared_here = true;
  // One layer; every layer is the same.
  RankPlan layer;
  // CP: the shared K/V rows of every CP rank, all-gathered over attn_cp (the demo layer's
  // gather_kv): the assembled buffer is the whole DP group's rows.
  const double kv_rows = double(p.group_rows[std::size_t(k.attn_dp_rank)]);
  if (C > 1) layer.add(TrafficOp::all_gatherv, GroupKind::attn_cp, kv_rows * d.head_dim * e);
  if (multi(GroupKind::attn_tp)) layer.add(TrafficOp::all_reduce, GroupKind::attn_tp, n * H * e);
  for (const PlanStep& s : p.steps) {
    switch (s.step) {
      case BridgeStep::dp_gather:
        layer.add(p.padding == PaddingMode::sum_len ? TrafficOp::all_gatherv : TrafficOp::all_gather, *s.group,
                  total * H * e);
        break;
      case BridgeStep::local_experts: {
        const double rows = p.path == BridgePath::dp_gather ? total : n;
        rp.moe_rows = double(tensor_split_range(std::int64_t(rows), w.moe_dp, k.moe_dp_rank).count);
        rp.expert_rows = rp.moe_rows;
        rp.expert_pairs = rp.moe_rows * K / ep * p.load_factors[std::size_t(k.moe_ep_rank)];
        buffer_rows = rows;
        shared_here = d.shared_inter > 0 && k.moe_ep_rank == 0;
        break;
      }
      case BridgeStep::reduce_scatterv:
        layer.add(TrafficOp::reduce_scatterv, *s.group, total * H * e);
        if (multi(GroupKind::attn_tp)) layer.add(TrafficOp::all_gatherv, GroupKind::attn_tp, n * H * e);
        break;
      case BridgeStep::dp_reduce_scatter:
        layer.add(TrafficOp::reduce_scatter, *s.group, total * H * e);
        if (multi(GroupKind::attn_tp))
          layer.add(TrafficOp::all_gather, GroupKind::attn_tp, double(ri.slot_rows) * H * e);
        break;
      case BridgeStep::all_reduce:
        if (multi(*s.group)) layer.add(TrafficOp::all_reduce, *s.group, (p.path == BridgePath::dp_gather ? total : n) * H * e);
        break;
      case BridgeStep::split_rows: rp.moe_rows = ri.chunk[std::size_t(r)]; break;
      case BridgeStep::dispatch: {
        // Each routed row once per destination rank, in one message with its k expert ids and weights.
        if (multi(*s.group))
          layer.add(TrafficOp::dispatch, *s.group, rp.moe_rows * p.destinations_per_row * double(p.message.bytes));
        // rows of every member of this rank's moe_ep group, each here with P(hit)
        const double arriving = ri.ep_rows[std::size_t(layout.group_index(GroupKind::moe_ep, r))];
        const double f = p.load_factors[std::size_t(k.moe_ep_rank)];
        rp.expert_rows = arriving * std::min(1.0, hit * f);
        rp.expert_pairs = arriving * K / ep * f;
        buffer_rows = n + rp.moe_rows + rp.expert_rows;
        break;
      }
      case BridgeStep::combine:
        if (multi(*s.group)) layer.add(TrafficOp::combine, *s.group, rp.expert_rows * H * e);
        break;
      case BridgeStep::all_gather:
        if (multi(*s.group))
          layer.add(n_rows % A == 0 ? TrafficOp::all_gather : TrafficOp::all_gatherv, *s.group, n * H * e);
        break;
      case BridgeStep::reduce_scatter:  // the scattered plans: not planned here (bridge_plan without scattered)
        if (multi(*s.group)) layer.add(TrafficOp::reduce_scatter, *s.group, n * H * e);
        break;
      case BridgeStep::route:
      case BridgeStep::experts:
      case BridgeStep::shared_expert:
      case BridgeStep::dp_scatter: break;
    }
  }
  for (std::size_t i = 0; i < kPlanSlots; ++i) {
    rp.calls[i] += layer.calls[i] * std::int64_t(L);
    rp.bytes[i] += layer.bytes[i] * L;
  }
  const double longest = ri.longest_of[std::size_t(k.attn_dp_rank)];
  const WeightShards ws = weight_shards(d, w, shared_here);
  const double we = p.weight_elem;
  rp.weights = {ws.attention * we, ws.router * we, ws.experts * we, ws.shared * we};
  const double gathered = C > 1 ? kv_rows : 0.0;
  rp.memory = estimate_rank(d, w, {n, buffer_rows, rp.expert_pairs, gathered}, longest, shared_here, e, we);
  rp.memory.flops = estimate_rank(d, w, {n, rp.moe_rows, rp.expert_pairs, gathered}, longest, shared_here, e, we).flops;
  rp.kv_per_token = L * d.head_dim * e;  // the shared K/V row of every layer
  return rp;
}

}  // namespace impl

// The plan of one forward (all layers) of the demo layer on `layout`. Throws LayoutError naming
// the flag when the dims, requests or placement do not fit the layout (the layer's own checks).
inline LayerPlan plan_layer(const RuntimeLayout& layout, const PlanInput& in) {
  const Widths& w = layout.widths();
  model::validate(in.dims, w);
  impl::check_element_bytes(in.elem);
  const DispatchDtype rows_as = dispatch_dtype_of(layout, in.dispatch_dtype);
  const model::Workload work = model::Workload::make(in.requests, in.placement, w.attn_dp);
  LayerPlan p(layout);
  p.dims = in.dims;
  p.elem = in.elem;
  p.weight_elem = in.weight_elem > 0 ? in.weight_elem : in.elem;
  p.dispatch_dtype = in.dispatch_dtype;
  p.path = layout.bridge_path();
  p.restore = relayout::parse_restore(in.restore, "--restore");
  const int C = w.attn_cp, A = w.attn_tp;
  impl::RankInputs ri;
  ri.longest_of = impl::plan_shares(p, layout, work);
  const RuntimeLayout shares = cp_share_layout(layout);
  p.padding = in.padding == "auto" ? shares.padding_mode(p.global_num_tokens) : parse_padding(in.padding);
  p.steps = bridge_plan(p.path, p.padding, p.restore, C > 1);
  impl::plan_routing(p, layout, in, rows_as);
  const DpSlots slots(shares, p.global_num_tokens, p.padding);
  ri.total = double(slots.total_rows());
  ri.slot_rows = slots.slot_rows();
  ri.chunk.assign(std::size_t(layout.size()), 0.0);
  ri.ep_rows.assign(std::size_t(layout.group_count(GroupKind::moe_ep)), 0.0);
  for (int r = 0; r < layout.size(); ++r) {
    const RankCoords k = layout.coords(r);
    ri.chunk[std::size_t(r)] = double(tensor_split_range(p.global_num_tokens[impl::share_of(k, C)], A, k.attn_tp_rank).count);
    ri.ep_rows[std::size_t(layout.group_index(GroupKind::moe_ep, r))] += ri.chunk[std::size_t(r)];
  }
  for (int r = 0; r < layout.size(); ++r) p.ranks.push_back(impl::plan_rank(p, in, ri, r));
  return p;
}

inline constexpr const char* kRoutingNote =
    "dispatch and combine bytes are expected values under uniform routing (each row's top-k experts a "
    "uniformly random k-subset of the experts); every other collective is exact";

inline bool routing_dependent(TrafficOp op) { return op == TrafficOp::dispatch || op == TrafficOp::combine; }

// ranks[].collectives[] in dsv4_layer's JSON shape and order ([op][group], calls > 0 only).
inline nlohmann::json collectives_json(const RankPlan& r) {
  nlohmann::json out = nlohmann::json::array();
  for (std::size_t op = 0; op < TrafficLog::kOps; ++op)
    for (std::size_t g = 0; g < TrafficLog::kGroups; ++g) {
      const std::size_t s = op * TrafficLog::kGroups + g;
      if (r.calls[s] == 0) continue;
      out.push_back({{"op", std::string(kTrafficOpNames[op])},
                     {"group", std::string(to_string(kAllGroupKinds[g]))},
                     {"calls", r.calls[s]},
                     {"bytes", std::llround(r.bytes[s])}});
    }
  return out;
}

inline nlohmann::json memory_json(const RankPlan& r) {
  return {{"weights",
           {{"attention", r.weights.attention},
            {"router", r.weights.router},
            {"experts", r.weights.experts},
            {"shared_expert", r.weights.shared},
            {"total", r.weights.total()}}},
          {"activations", r.memory.activations},
          {"kv", r.memory.kv},
          {"buffers", r.memory.buffers},
          {"total", r.memory.total()},
          {"kv_per_token", r.kv_per_token}};
}

inline nlohmann::json plan_json(const LayerPlan& p) {
  nlohmann::json j;
  j["path"] = std::string(to_string(p.path));
  j["padding"] = p.path == BridgePath::dp_gather ? nlohmann::json(std::string(to_string(p.padding))) : nlohmann::json(nullptr);
  j["restore"] = p.path == BridgePath::dp_gather ? nlohmann::json(std::string(to_string(p.restore)))
                                                 : nlohmann::json(nullptr);
  j["global_num_tokens"] = p.global_num_tokens;
  j["layers"] = p.dims.layers;
  j["element_bytes"] = p.elem;
  j["dispatch_dtype"] = p.dispatch_dtype;
  j["weight_bytes"] = p.weight_elem;
  j["routing"] = kRoutingNote;
  j["uniform_routing_ops"] = {"dispatch", "combine"};
  j["destinations_per_row"] = p.destinations_per_row;
  if (p.measured_load) {
    j["imbalance"] = p.imbalance();
    j["expert_load_factors"] = p.load_factors;
  }
  nlohmann::json steps = nlohmann::json::array();
  for (const PlanStep& s : p.steps)
    steps.push_back({{"step", std::string(s.name)}, {"group", s.group ? nlohmann::json(std::string(to_string(*s.group))) : nlohmann::json(nullptr)}});
  j["bridge_steps"] = steps;
  j["ranks"] = nlohmann::json::array();
  for (const RankPlan& r : p.ranks) {
    const RankCoords& k = r.coords;
    j["ranks"].push_back({{"rank", k.rank},
                          {"attn_dp_rank", k.attn_dp_rank},
                          {"attn_cp_rank", k.attn_cp_rank},
                          {"attn_tp_rank", k.attn_tp_rank},
                          {"moe_ep_rank", k.moe_ep_rank},
                          {"collectives", collectives_json(r)},
                          {"attention_rows", r.attention_rows},
                          {"moe_rows", r.moe_rows},
                          {"expert_rows", r.expert_rows},
                          {"memory", memory_json(r)},
                          {"flops", r.memory.flops}});
  }
  return j;
}

// The head of the text form: the layout, the model (`layers` of them: the model's, which a
// pipeline stage holds a share of), the DP groups' tokens and the bridge's steps.
inline std::string plan_head_text(const LayerPlan& p, int layers) {
  const Widths& w = p.layout.widths();
  model::ModelDims d = p.dims;
  d.layers = layers;
  std::ostringstream s;
  s << "plan: tp=" << w.tp << " attn dp x " << (w.attn_cp > 1 ? "cp x " : "") << "tp = " << w.attn_dp << " x "
    << (w.attn_cp > 1 ? std::to_string(w.attn_cp) + " x " : "") << w.attn_tp << ", moe dp x ep x tp = " << w.moe_dp
    << " x " << w.moe_ep << " x " << w.moe_tp << ", backend " << to_string(p.layout.backend()) << " -> bridge "
    << to_string(p.path);
  if (p.path == BridgePath::dp_gather)
    s << ", padding " << to_string(p.padding) << ", restore " << to_string(p.restore);
  s << "\nmodel: " << model_flags(d) << " (" << p.elem << "-byte values, " << p.weight_elem << "-byte weights)\n";
  s << "global_num_tokens: [";
  for (std::size_t g = 0; g < p.global_num_tokens.size(); ++g) s << (g ? " " : "") << p.global_num_tokens[g];
  s << "]" << (w.attn_cp > 1 ? " (one entry per CP share of each DP group)" : "") << "\nbridge steps per layer:";
  for (const PlanStep& st : p.steps)
    s << " " << st.name << (st.group ? "@" + std::string(to_string(*st.group)) : std::string());
  s << "\n";
  if (w.moe_ep > 1 && (p.path == BridgePath::a2a_split || p.path == BridgePath::direct)) {
    char line[200];
    std::snprintf(line, sizeof line, "%.3f", p.destinations_per_row);
    s << "note: " << kRoutingNote << ": a row goes to " << line << " of " << w.moe_ep << " moe_ep ranks on average\n";
  }
  if (p.measured_load) {
    char line[200];
    std::snprintf(line, sizeof line, "%.3f", p.imbalance());
    s << "expert load: from --expert-load, experts placed contiguously over moe_ep; the busiest moe_ep rank computes "
      << line << "x the mean (row, expert) pairs (each layer's busiest, averaged over the layers)\n";
  }
  return s.str();
}

// One rank's lines: its rows, its collectives (and `extra` ones, e.g. the pipeline's) and memory.
inline std::string rank_text(const LayerPlan& p, const RankPlan& r, const std::string& extra = "") {
  const Widths& w = p.layout.widths();
  const RankCoords& k = r.coords;
  std::ostringstream s;
  char head[200];
  std::snprintf(head, sizeof head, "rank %d (attn dp %d%s tp %d, moe ep %d): rows attention %.0f, moe %.0f, experts %.1f%s\n",
                k.rank, k.attn_dp_rank, w.attn_cp > 1 ? (" cp " + std::to_string(k.attn_cp_rank)).c_str() : "",
                k.attn_tp_rank, k.moe_ep_rank, r.attention_rows, r.moe_rows, r.expert_rows,
                p.path == BridgePath::a2a_split || p.path == BridgePath::direct ? " (expected)" : "");
  s << head << "  collectives:";
  bool any = false;
  for (std::size_t op = 0; op < TrafficLog::kOps; ++op)
    for (std::size_t g = 0; g < TrafficLog::kGroups; ++g) {
      const std::size_t i = op * TrafficLog::kGroups + g;
      if (r.calls[i] == 0) continue;
      s << (any ? ";" : "") << " " << kTrafficOpNames[op] << "@" << to_string(kAllGroupKinds[g]) << " x" << r.calls[i]
        << " " << bytes_text(r.bytes[i]) << (routing_dependent(TrafficOp(op)) ? " (expected, uniform routing)" : "");
      any = true;
    }
  if (!extra.empty()) {
    s << (any ? ";" : "") << extra;
    any = true;
  }
  s << (any ? "" : " none") << "\n";
  s << "  memory " << bytes_text(r.memory.total()) << ": weights " << bytes_text(r.weights.total()) << " (attention "
    << bytes_text(r.weights.attention) << ", router " << bytes_text(r.weights.router) << ", experts "
    << bytes_text(r.weights.experts) << ", shared expert " << bytes_text(r.weights.shared) << "), activations "
    << bytes_text(r.memory.activations) << ", K/V " << bytes_text(r.memory.kv) << ", buffers "
    << bytes_text(r.memory.buffers) << "; K/V per token " << bytes_text(r.kv_per_token) << "\n";
  return s.str();
}

inline std::string plan_text(const LayerPlan& p) {
  std::string s = plan_head_text(p, p.dims.layers) + "\nPer rank, one forward (" + std::to_string(p.dims.layers) + " layers):\n";
  for (const RankPlan& r : p.ranks) s += rank_text(p, r);
  return s;
}

}  // namespace relayout::cli
