// `relayout explain`: a layout as text for a human, as JSON for tools, and as a Graphviz picture.
// Everything shown is read from relayout::RuntimeLayout and the bridge plan; nothing here
// re-derives a formula.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "cli/plan_deploy.hpp"
#include "cli/svg.hpp"
#include "relayout/attention/plan.hpp"
#include "relayout/bridge/plan.hpp"
#include "relayout/mesh.hpp"
#include "relayout/placement/expert_location.hpp"

namespace relayout::cli {

// The groups of one domain: the bridge's six, decode CP and the dense layers' TP group.
inline constexpr std::array<GroupKind, 8> kDomainGroupKinds = {
    GroupKind::tp,     GroupKind::attn_tp, GroupKind::attn_cp, GroupKind::moe_tp,
    GroupKind::moe_ep, GroupKind::moe_dp,  GroupKind::dcp,     GroupKind::dense_tp};

struct ExplainStep {
  std::string op;     // the collective or local step
  std::string group;  // the group it runs on ("local" when no communication)
  std::string what;   // what it does to the rows
};

// The Attention->MoE hand-over of one decoder layer, in execution order: the attention all-reduce
// and the token-count gather around the bridge's own plan (relayout::bridge_plan, the steps
// MoeBridge runs), so explain and execution cannot drift apart. Path dp_gather's restore depends
// on the step's padding mode; both are listed.
// Whether --enable-attn-tp-input-scattered (`flag`) applies to this layout: where SGLang applies it
// (attn_input_scattered: path tp_moe, attn_tp > 1, attn_cp == 1).
inline bool scattered_applies(const RuntimeLayout& l, bool flag) {
  return flag && attn_input_scattered(l.bridge_path(), l.widths());
}

// The attention's steps, for the prefill or for decode / extend rows: those of
// relayout::attention_plan, after, with the input scattered over attn_tp (SGLang's
// --enable-attn-tp-input-scattered, as relayout plan and the demo layer take it), the all-gather of
// the projections each member ran for its chunk of the rows. wo_b's all-reduce stays.
inline std::vector<ExplainStep> attention_steps(const RuntimeLayout& l, AttentionPhase phase, bool scattered) {
  const Widths& w = l.widths();
  std::vector<ExplainStep> s;
  if (scattered)
    s.push_back({"all_gather", "attn_tp",
                 "the q_a and kv rows (q_lora + head_dim values a token) each member computed for its split_rows "
                 "chunk of the rows: the projections the members share run once, not on every member"});
  for (const AttentionPlanStep& p : attention_plan(phase, w.attn_cp > 1, w.attn_tp > 1))
    s.push_back({std::string(p.name), p.group ? std::string(to_string(*p.group)) : "local", std::string(p.what)});
  return s;
}

// Why --enable-attn-tp-input-scattered does not apply to l (empty when it does).
inline std::string scattered_not_applied(const RuntimeLayout& l) {
  const Widths& w = l.widths();
  if (attn_input_scattered(l.bridge_path(), w)) return {};
  return "--enable-attn-tp-input-scattered: not applied; SGLang applies it on path tp_moe (no DP attention, no "
         "all-to-all backend) with attn_tp > 1 and attn_cp == 1, and this layout has path " +
         std::string(to_string(l.bridge_path())) + ", attn_tp " + std::to_string(w.attn_tp) + ", attn_cp " +
         std::to_string(w.attn_cp);
}

// `scattered`: --enable-attn-tp-input-scattered was given (it changes the steps where it applies).
inline std::vector<ExplainStep> bridge_steps(const RuntimeLayout& l, bool scattered = false) {
  const Widths& w = l.widths();
  const bool split = scattered_applies(l, scattered);
  std::vector<ExplainStep> s;
  for (ExplainStep& a : attention_steps(l, AttentionPhase::prefill, split))
    if (a.group != "local") s.push_back(std::move(a));
  if (w.attn_tp == 1) s.push_back({"none", "local", "attn_tp == 1: wo_b output is already complete"});
  const bool cp = w.attn_cp > 1;
  if (l.bridge_path() == BridgePath::dp_gather)
    s.push_back({"all_gather", "tp", cp ? "token counts of every CP rank of every attention-DP group (global_num_tokens)"
                                        : "token counts of every attention-DP group (global_num_tokens)"});
  const auto plan = bridge_plan(l.bridge_path(), PaddingMode::sum_len, BridgeRestore::reduce, cp);
  for (const PlanStep& p : plan) {
    ExplainStep e{std::string(p.name), p.group ? std::string(to_string(*p.group)) : "local",
                  std::string(p.what) + (p.placement ? " -> " + to_string(*p.placement) : std::string())};
    if (p.step == relayout::BridgeStep::local_experts && w.moe_tp > 1)
      e.what += " (moe_tp shards of the intermediate: partial sums)";
    if (p.step == relayout::BridgeStep::reduce_scatterv) {
      const auto max_plan = bridge_plan(BridgePath::dp_gather, PaddingMode::max_len, BridgeRestore::reduce, cp);
      e.op += " | " + std::string(max_plan.back().name);
      e.what += "; with max_len padding: " + std::string(max_plan.back().what);
    }
    s.push_back(std::move(e));
  }
  return s;
}

// The further flags: the LM head, dense TP, decode CP, redundant experts, and the world around
// the domain (replicas, pipeline stages, nodes).
inline std::vector<std::string> further_steps(const RuntimeLayout& l) {
  const LayoutConfig& c = l.config();
  const Widths& w = l.widths();
  const auto s = [](std::int64_t v) { return std::to_string(v); };
  std::vector<std::string> out;
  if (c.enable_dp_lm_head)
    out.push_back(dp_lm_head_on(c) ? "--enable-dp-lm-head: the LM head's vocabulary is split over the attention-TP "
                                     "group (" + s(w.attn_tp) + (w.attn_tp == 1 ? " rank" : " ranks") + "), no gather across DP groups"
                                   : std::string("--enable-dp-lm-head with --dp-size 1: off (SGLang's "
                                                 "_data_parallelism_defaults turns it off when dp == 1)"));
  if (c.enable_tp_lm_head_all_to_all)
    out.push_back("--enable-tp-lm-head-all-to-all: TP-sharded LM head over tp, an all-to-all in place of the "
                  "gather and DP scatter; tp = dp = " + s(c.tp) + ", attn_cp = 1: holds");
  if (c.moe_dense_tp_size && !c.enable_prefill_cp)
    out.push_back("--moe-dense-tp-size " + s(*c.moe_dense_tp_size) + ": dense layers " +
                  (w.dense_tp == 1 ? std::string("replicated on every rank (TP width 1)")
                                   : "over the whole TP group (" + s(w.dense_tp) + " ranks)"));
  if (w.dcp > 1)
    out.push_back("--dcp-size " + s(w.dcp) + ": decode context parallelism, " + s(w.tp / w.dcp) +
                  (w.tp / w.dcp == 1 ? " block of " : " blocks of ") + s(w.dcp) +
                  " consecutive ranks inside the TP group");
  if (c.ep_num_redundant_experts > 0)
    out.push_back("--ep-num-redundant-experts " + s(c.ep_num_redundant_experts) + ": redundant expert replicas "
                  "over moe_ep = " + s(w.moe_ep) + " ranks (needs moe_ep > 1: holds)");
  const int replicas = replica_count(c);
  if (replicas > 1 || c.pp > 1 || c.nnodes > 1)
    out.push_back("world: " + s(replicas) + (replicas == 1 ? " replica" : " replicas") + " x pp " + s(c.pp) +
                  " x tp " + s(c.tp) + " = " + s(std::int64_t{replicas} * c.pp * c.tp) + " ranks on " +
                  s(c.nnodes) + (c.nnodes == 1 ? " node" : " nodes") + "; this domain is one stage of one replica");
  return out;
}

// --ep-num-redundant-experts N: the static placement (ExpertLocation::identity) of DeepSeek-V3's
// routed experts (the MLA preset's n_routed_experts) + N redundant over moe_ep: per member its
// physical slots and, as ranges of consecutive ids, the logical expert each holds. Empty without
// redundant experts; `error` says why the experts cannot be split (physical % moe_ep != 0).
struct ExpertMapRow {
  int member = 0, first_physical = 0, last_physical = 0;
  std::vector<std::pair<int, int>> logical;  // ranges [a, b] in slot order
  int replicas = 0;                          // slots holding a redundant copy (physical >= routed)
};
struct ExpertMap {
  int routed = 0, redundant = 0, physical = 0, per_rank = 0;
  std::string error;
  std::vector<ExpertMapRow> members;
};

inline ExpertMap expert_map(const RuntimeLayout& l) {
  ExpertMap m;
  m.redundant = l.config().ep_num_redundant_experts;
  if (m.redundant <= 0) return m;
  m.routed = MlaModel{}.experts;
  m.physical = m.routed + m.redundant;
  try {
    const ExpertLocation loc = ExpertLocation::identity(m.routed, m.redundant, l.widths().moe_ep);
    m.per_rank = loc.per_rank();
    for (int r = 0; r < loc.ep(); ++r) {
      ExpertMapRow row{r, r * m.per_rank, (r + 1) * m.per_rank - 1, {}, 0};
      for (int p = row.first_physical; p <= row.last_physical; ++p) {
        const int e = loc.logical_of(p);
        if (!row.logical.empty() && row.logical.back().second + 1 == e) ++row.logical.back().second;
        else row.logical.push_back({e, e});
        row.replicas += p >= m.routed;
      }
      m.members.push_back(std::move(row));
    }
  } catch (const LayoutError& e) {
    m.error = e.what();
  }
  return m;
}

inline std::string id_ranges(const std::vector<std::pair<int, int>>& ranges) {
  std::string s;
  for (const auto& [a, b] : ranges) s += (s.empty() ? "" : " ") + std::to_string(a) + (a == b ? "" : "-" + std::to_string(b));
  return s;
}

// How the flags resolve to the widths, step by step: --attn-dp-size, DeepSeek-V4 prefill CP, the
// per-backend and CP rules SGLang checks, and the MoE-DP group that is the attention-CP group.
inline std::vector<std::string> resolution_steps(const RuntimeLayout& l) {
  const LayoutConfig& c = l.config();
  const Widths& w = l.widths();
  const auto s = [](std::int64_t v) { return std::to_string(v); };
  const std::string backend(to_string(c.moe_a2a_backend));
  std::vector<std::string> out;
  if (dp_attention_dropped(c))
    out.push_back("--enable-dp-attention with --dp-size 1: DP attention off (SGLang's "
                  "_data_parallelism_defaults turns it off when dp == 1)");
  if (c.moe_a2a_backend != l.backend())
    out.push_back("--moe-a2a-backend " + backend + " runs as none (SGLang's handle_a2a_moe remaps it)");
  if (c.attn_dp_size) {
    const int n = *c.attn_dp_size;
    if (n > 1)
      out.push_back("--attn-dp-size " + s(n) + ": DP attention over " + s(n) +
                    " groups (the widths of --dp-size " + s(n) + " --enable-dp-attention)" +
                    (c.enable_dp_attention ? "; --enable-dp-attention next to it is redundant" : ""));
    else
      out.push_back("--attn-dp-size 1: no DP attention");  // dp > 1: the layout's note says what dp is
  }
  if (c.enable_prefill_cp) {
    out.push_back("--enable-prefill-cp --cp-strategy " + std::string(to_string(*c.cp_strategy)) +
                  ": DeepSeek-V4 prefill CP, SGLang's round-robin-split");
    out.push_back("prefill CP turns DP attention on; --dp-size 1, which it needs, turns it off again "
                  "(SGLang's _data_parallelism_defaults runs after it): DP attention off");
    out.push_back("prefill CP checks: dp = " + s(resolved_dp(c)) + " == 1, tp = " + s(c.tp) +
                  " <= 8 (one machine), --moe-a2a-backend " + backend +
                  " in {none, deepep, megamoe, mori}: all hold");
    out.push_back("attn_cp = tp / dp = " + s(c.tp) + " / " + s(resolved_dp(c)) + " = " + s(w.attn_cp) +
                  (cp_overridden(c) ? " (replaces --cp " + s(c.cp) + ")" : std::string()) +
                  "; attn_dp = 1, attn_tp = " + s(w.attn_tp));
    out.push_back("prefill CP sets the dense layers' TP width to 1" +
                  (dense_tp_overridden(c) ? " (replaces --moe-dense-tp-size " + s(*c.moe_dense_tp_size) + ")"
                                          : std::string()));
  }
  if (needs_dp_equal_tp(c.moe_a2a_backend))
    out.push_back("--moe-a2a-backend " + backend + " needs DP attention with dp == tp: dp = " +
                  s(resolved_dp(c)) + " == tp = " + s(c.tp) + " holds");
  if (needs_two_dp_groups(c.moe_a2a_backend))
    out.push_back("--moe-a2a-backend pplx needs DP attention with dp >= 2: dp = " +
                  s(resolved_dp(c)) + " holds");
  if (w.attn_cp > 1) {
    out.push_back("CP rule: tp % (dp * attn_cp) == 0 with dp = --dp-size even without DP attention: " +
                  s(c.tp) + " % (" + s(resolved_dp(c)) + " * " + s(w.attn_cp) + ") == 0 holds");
    if (l.cp_token_split() == CpTokenSplit::round_robin)
      out.push_back("tokens: token i of the batch goes to CP rank i mod " + s(w.attn_cp) +
                    " (round-robin)");
    else
      out.push_back("tokens: each request is cut into " + s(2 * w.attn_cp) +
                    " blocks (the first n % " + s(2 * w.attn_cp) + " one token longer), CP rank r holding blocks r and " +
                    s(2 * w.attn_cp - 1) + " - r (zigzag)");
  }
  if (moe_dp_group_is_attn_cp(w))
    out.push_back("MoE-DP group = attention-CP group: attn_cp = " + s(w.attn_cp) +
                  " > moe_dp = 1, so CP partners share their tokens before the MoE; moe_dp stays 1 "
                  "as a width, the MoE-DP group has " + s(w.attn_cp) + " ranks");
  else if (w.moe_dp > 1)
    out.push_back("moe_dp = attn_cp = " + s(w.moe_dp) + " (moe_dp > 1 needs attn_cp == moe_dp" +
                  (w.moe_ep > 1 ? ", and moe_ep * moe_dp == tp: " + s(w.moe_ep) + " * " +
                                      s(w.moe_dp) + " == " + s(w.tp)
                                : std::string()) +
                  ")");
  for (std::string& step : further_steps(l)) out.push_back(std::move(step));
  return out;
}


inline std::string bridge_reason(const RuntimeLayout& l) {
  const std::string b(to_string(l.backend()));
  switch (l.bridge_path()) {
    case BridgePath::dp_gather:
      return l.widths().attn_dp > 1 ? "attn_dp > 1 and moe_a2a_backend == none (path A)"
                                    : "attn_cp > 1 and moe_a2a_backend == none (path A: the CP partners share rows)";
    case BridgePath::a2a_split: return "attn_tp > 1 and moe_a2a_backend == " + b + " (path B)";
    case BridgePath::direct: return "attn_tp == 1 and moe_a2a_backend == " + b;
    case BridgePath::tp_moe: return "attn_dp == 1 and moe_a2a_backend == none";
  }
  return "";
}

// The world around the domain: replicas x pipeline stages x tp in SGLang's rank order, each
// world rank's coordinates (up to 4096 ranks) and the pipeline groups.
inline nlohmann::json world_json(const WorldLayout& world) {
  using nlohmann::json;
  constexpr int kMaxListedRanks = 4096;
  json j = {{"replicas", world.replicas()}, {"pp", world.pp()},      {"tp", world.tp()},
            {"nnodes", world.nnodes()},     {"size", world.size()}, {"ranks_per_node", world.ranks_per_node()},
            {"rank_order", "(replica, pp, tp), tp fastest: rank = (replica * pp + pp_rank) * tp + tp_rank"}};
  j["ranks"] = json::array();
  for (int r = 0; r < world.size() && r < kMaxListedRanks; ++r) {
    const WorldCoords k = world.coords(r);
    j["ranks"].push_back({{"rank", r}, {"replica", k.replica}, {"pp_rank", k.pp_rank}, {"node", k.node},
                          {"tp_rank", k.domain.rank}});
  }
  j["ranks_truncated"] = world.size() > kMaxListedRanks;
  j["pp_groups"] = world.size() <= kMaxListedRanks ? json(world.groups(GroupKind::pp)) : json(nullptr);
  return j;
}

// The attention side of one layer (relayout::attention_plan, the steps CpAttention runs): for
// the prefill and for decode / extend rows, each step with its group (null: local) and what it does.
inline nlohmann::json attention_json(const RuntimeLayout& l, bool scattered = false) {
  const bool split = scattered_applies(l, scattered);
  const auto steps = [&](AttentionPhase phase) {
    nlohmann::json a = nlohmann::json::array();
    for (const ExplainStep& p : attention_steps(l, phase, split))
      a.push_back({{"step", p.op},
                   {"group", p.group != "local" ? nlohmann::json(p.group) : nlohmann::json(nullptr)},
                   {"what", p.what}});
    return a;
  };
  return {{"component", "relayout::CpAttention"},
          {"prefill", steps(AttentionPhase::prefill)},
          {"decode_extend", steps(AttentionPhase::extend)}};
}

// `scattered`: --enable-attn-tp-input-scattered was given.
inline nlohmann::json explain_json(const RuntimeLayout& l, std::optional<int> focus = std::nullopt,
                                   bool scattered = false) {
  using nlohmann::json;
  const LayoutConfig& c = l.config();
  const Widths& w = l.widths();
  json j;
  j["config"] = {{"tp", c.tp}, {"dp", c.dp}, {"cp", c.cp}, {"ep", c.ep}, {"moe_dp", c.moe_dp},
                 {"enable_dp_attention", c.enable_dp_attention},
                 {"moe_a2a_backend", std::string(to_string(c.moe_a2a_backend))},
                 {"draft", std::string(to_string(c.draft))},
                 {"attn_dp_size", c.attn_dp_size ? json(*c.attn_dp_size) : json(nullptr)},
                 {"enable_prefill_cp", c.enable_prefill_cp},
                 {"cp_strategy", c.cp_strategy ? json(std::string(to_string(*c.cp_strategy))) : json(nullptr)},
                 {"enable_dp_lm_head", c.enable_dp_lm_head},
                 {"enable_tp_lm_head_all_to_all", c.enable_tp_lm_head_all_to_all},
                 {"moe_dense_tp_size", c.moe_dense_tp_size ? json(*c.moe_dense_tp_size) : json(nullptr)},
                 {"dcp", c.dcp}, {"ep_num_redundant_experts", c.ep_num_redundant_experts},
                 {"pp", c.pp}, {"nnodes", c.nnodes}, {"enable_attn_tp_input_scattered", scattered}};
  // Every flag as SGLang resolves it.
  j["dp_attention"] = dp_attention_on(c);
  j["moe_a2a_backend"] = std::string(to_string(l.backend()));
  const LmHeadLayout head = l.lm_head();
  j["lm_head"] = {{"dp_lm_head", head.dp_lm_head}, {"tp_all_to_all", head.tp_all_to_all},
                  {"vocab_group", to_string(head.vocab_group)}, {"vocab_shards", head.vocab_shards}};
  j["resolution"] = resolution_steps(l);
  j["widths"] = {{"tp", w.tp},         {"attn_dp", w.attn_dp}, {"attn_cp", w.attn_cp},
                 {"attn_tp", w.attn_tp}, {"moe_dp", w.moe_dp},   {"moe_ep", w.moe_ep},
                 {"moe_tp", w.moe_tp},   {"dcp", w.dcp},         {"dense_tp", w.dense_tp}};
  j["ep_overridden"] = ep_overridden(c);
  j["cp_overridden"] = cp_overridden(c);
  j["cp_token_split"] = cp_token_split_name(l.cp_token_split());
  j["moe_dp_group"] = {{"is_attn_cp_group", moe_dp_group_is_attn_cp(w)},
                       {"size", l.group_size(GroupKind::moe_dp)}};
  j["notes"] = json::array();
  for (const LayoutNote& n : l.notes())
    j["notes"].push_back({{"kind", std::string(LayoutNote::kind_name(n.kind))}, {"text", n.text}});
  j["ranks"] = json::array();
  for (int r = 0; r < l.size(); ++r) {
    const RankCoords k = l.coords(r);
    j["ranks"].push_back({{"rank", k.rank},
                          {"attn_dp_rank", k.attn_dp_rank},
                          {"attn_cp_rank", k.attn_cp_rank},
                          {"attn_tp_rank", k.attn_tp_rank},
                          {"moe_dp_rank", k.moe_dp_rank},
                          {"moe_ep_rank", k.moe_ep_rank},
                          {"moe_tp_rank", k.moe_tp_rank},
                          {"dcp_rank", k.dcp_rank},
                          {"dense_tp_rank", k.dense_tp_rank}});
  }
  for (GroupKind g : kDomainGroupKinds) j["groups"][std::string(to_string(g))] = l.groups(g);
  j["world"] = world_json(WorldLayout(c));
  if (const ExpertMap m = expert_map(l); m.redundant > 0) {
    json e = {{"placement", "static"}, {"routed", m.routed}, {"redundant", m.redundant}, {"physical", m.physical},
              {"per_rank", m.per_rank}, {"error", m.error.empty() ? json(nullptr) : json(m.error)},
              {"members", json::array()}};
    for (const ExpertMapRow& r : m.members) {
      json ranges = json::array();
      for (const auto& [a, b] : r.logical) ranges.push_back({a, b});
      e["members"].push_back({{"moe_ep_rank", r.member},
                              {"physical", {r.first_physical, r.last_physical}},
                              {"logical", ranges},
                              {"replicas", r.replicas}});
    }
    j["expert_map"] = e;
  }
  j["attention"] = attention_json(l, scattered);
  j["attn_tp_input_scattered"] = {{"applied", scattered_applies(l, scattered)},
                                  {"note", scattered && !scattered_applies(l, scattered) ? json(scattered_not_applied(l))
                                                                                          : json(nullptr)}};
  j["bridge"]["path"] = std::string(to_string(l.bridge_path()));
  j["bridge"]["reason"] = bridge_reason(l);
  j["bridge"]["steps"] = json::array();
  for (const ExplainStep& s : bridge_steps(l, scattered))
    j["bridge"]["steps"].push_back({{"op", s.op}, {"group", s.group}, {"what", s.what}});
  j["padding"]["rule"] = forces_max_len(c.moe_a2a_backend)
                             ? "max_len always (" + std::string(to_string(c.moe_a2a_backend)) + ")"
                             : "max_len if 2*sum(global_num_tokens) >= max*attn_dp else sum_len";
  const DsparkVerdict v = l.dspark();
  j["dspark"] = {{"allowed", v.allowed},
                 {"error", v.allowed ? json(nullptr) : json(std::string(v.error))},
                 {"flag", v.allowed ? json(nullptr) : json(std::string(v.input))}};
  if (focus) {
    json f = j["ranks"][static_cast<std::size_t>(l.coords(*focus).rank)];
    for (GroupKind g : kDomainGroupKinds)
      f["groups"][std::string(to_string(g))] = {{"index", l.group_index(g, *focus)},
                                                {"group_rank", l.group_rank(g, *focus)},
                                                {"members", l.group_members(g, *focus)}};
    j["focus"] = f;
  }
  return j;
}

namespace impl {

// A group name padded to the column of the Groups table (one space at least).
inline std::string pad_name(std::string_view name) {
  return std::string(name.size() < 8 ? 8 - name.size() : 1, ' ');
}

inline std::string rank_list(const std::vector<int>& members) {
  std::string out = "[";
  for (std::size_t i = 0; i < members.size(); ++i) {
    if (members.size() > 12 && i == 6) {
      out += " ...";
      i = members.size() - 3;
    }
    out += (i ? " " : "") + std::to_string(members[i]);
  }
  return out + "]";
}

}  // namespace impl

// The world section of the text form: only when the world is more than this domain.
inline std::string world_text(const WorldLayout& world) {
  if (world.size() == world.tp() && world.nnodes() == 1) return "";
  std::ostringstream o;
  o << "World: " << world.replicas() << (world.replicas() == 1 ? " replica" : " replicas") << " x pp "
    << world.pp() << " x tp " << world.tp() << " = " << world.size() << " ranks, " << world.nnodes()
    << (world.nnodes() == 1 ? " node" : " nodes") << " of " << world.ranks_per_node() << " ranks\n";
  o << "  rank order (replica, pp, tp), tp fastest: rank = (replica * pp + pp_rank) * tp + tp_rank\n";
  o << "  world rank   replica  pp_rank  node  tp_rank\n";
  constexpr int kMaxRows = 64;
  for (int r = 0; r < world.size() && r < kMaxRows; ++r) {
    const WorldCoords k = world.coords(r);
    char line[96];
    std::snprintf(line, sizeof line, "  %10d   %7d  %7d  %4d  %7d\n", r, k.replica, k.pp_rank, k.node, k.domain.rank);
    o << line;
  }
  if (world.size() > kMaxRows) o << "  ... " << world.size() - kMaxRows << " more ranks (--format json lists them)\n";
  const int count = world.group_count(GroupKind::pp);
  o << "  pp groups: " << count << (count == 1 ? " group of " : " groups of ") << world.group_size(GroupKind::pp)
    << ": ";
  for (int id = 0; id < count; ++id) {
    if (count > 8 && id == 6) {
      o << "... ";
      id = count - 2;
    }
    std::vector<int> members(static_cast<std::size_t>(world.group_size(GroupKind::pp)));
    for (int p = 0; p < static_cast<int>(members.size()); ++p)
      members[static_cast<std::size_t>(p)] = world.group_member(GroupKind::pp, id, p);
    o << impl::rank_list(members) << " ";
  }
  o << "\n  every domain group (tp, attn_tp, ...) repeats in each (replica, pp) domain, offset by its first "
       "world rank\n\n";
  return o.str();
}

namespace impl {

// The flags line and the resolution steps.
inline void explain_header(std::ostream& o, const RuntimeLayout& l) {
  const LayoutConfig& c = l.config();
  const std::string backend(to_string(c.moe_a2a_backend));
  o << "relayout explain: tp=" << c.tp << " dp=" << c.dp << " cp=" << c.cp << " ep=" << c.ep
    << " moe_dp=" << c.moe_dp << " dp_attention=" << (dp_attention_on(c) ? "on" : "off")
    << " moe_a2a_backend=" << backend << " draft=" << to_string(c.draft);
  if (c.attn_dp_size) o << " attn_dp_size=" << *c.attn_dp_size;
  if (c.enable_prefill_cp) o << " prefill_cp=" << to_string(*c.cp_strategy);
  if (c.dcp > 1) o << " dcp=" << c.dcp;
  if (c.moe_dense_tp_size) o << " moe_dense_tp=" << *c.moe_dense_tp_size;
  if (c.enable_dp_lm_head) o << " dp_lm_head=" << (dp_lm_head_on(c) ? "on" : "off");
  if (c.enable_tp_lm_head_all_to_all) o << " tp_lm_head_all_to_all=on";
  if (c.ep_num_redundant_experts > 0) o << " ep_redundant=" << c.ep_num_redundant_experts;
  if (c.pp > 1) o << " pp=" << c.pp;
  if (c.nnodes > 1) o << " nnodes=" << c.nnodes;
  o << "\n\n";

  if (const auto steps = resolution_steps(l); !steps.empty()) {
    o << "Resolution\n";
    for (std::size_t i = 0; i < steps.size(); ++i) o << "  " << i + 1 << ". " << steps[i] << "\n";
    o << "\n";
  }
}

// Each width with its formula, the check and the layout's notes.
inline void explain_widths(std::ostream& o, const RuntimeLayout& l) {
  const LayoutConfig& c = l.config();
  const Widths& w = l.widths();
  const std::string backend(to_string(c.moe_a2a_backend));
  o << "Widths\n";
  o << "  attn_dp = "
    << (c.attn_dp_size ? "--attn-dp-size"
        : c.enable_prefill_cp ? "1 (prefill CP: DP attention on, then off again at dp 1)"
        : !dp_attention_on(c) ? "1 (DP attention off)"
                              : "dp (DP attention on)")
    << " = " << w.attn_dp << "\n";
  if (c.enable_prefill_cp)
    o << "  attn_cp = tp / dp (--enable-prefill-cp) = " << w.attn_cp << "\n";
  else
    o << "  attn_cp = cp = " << w.attn_cp << "\n";
  o << "  attn_tp = tp / attn_dp / attn_cp = " << w.tp << " / " << w.attn_dp << " / " << w.attn_cp
    << " = " << w.attn_tp << "\n";
  if (spans_ep(c.moe_a2a_backend))
    o << "  moe_ep  = tp (" << backend << " spans EP over the TP width" << (ep_overridden(c) ? "; --ep " + std::to_string(c.ep) + " ignored" : "") << ") = " << w.moe_ep << "\n";
  else
    o << "  moe_ep  = ep (backend none) = " << w.moe_ep << "\n";
  o << "  moe_dp  = moe_dp = " << w.moe_dp;
  if (moe_dp_group_is_attn_cp(w))
    o << "   (its group is the attention-CP group, " << w.attn_cp << " ranks: attn_cp > moe_dp)";
  o << "\n";
  o << "  moe_tp  = tp / moe_ep / moe_dp = " << w.tp << " / " << w.moe_ep << " / " << w.moe_dp
    << " = " << w.moe_tp << "\n";
  o << "  dcp     = --dcp-size = " << w.dcp << (w.dcp > 1 ? " (blocks of consecutive ranks inside tp)" : "") << "\n";
  o << "  dense_tp = "
    << (c.enable_prefill_cp ? "1 (--enable-prefill-cp)" : c.moe_dense_tp_size ? "--moe-dense-tp-size" : "tp (default)")
    << " = " << w.dense_tp << "\n";
  o << "  check   " << w.tp << " = " << w.attn_dp << " x " << w.attn_cp << " x " << w.attn_tp
    << " (attention dp x cp x tp) = " << w.moe_dp << " x " << w.moe_ep << " x " << w.moe_tp
    << " (MoE dp x ep x tp)\n";
  for (const LayoutNote& n : l.notes()) o << "  note    " << n.text << "\n";
  o << "\n";
}

// The rank table (the first 128 ranks; `focus` marked).
inline void explain_ranks(std::ostream& o, const RuntimeLayout& l, std::optional<int> focus) {
  o << "Ranks            attention          |  MoE\n";
  o << "  rank    attn_dp attn_cp attn_tp   |  moe_dp moe_ep moe_tp\n";
  constexpr int kMaxRows = 128;
  for (int r = 0; r < l.size() && r < kMaxRows; ++r) {
    const RankCoords k = l.coords(r);
    char line[128];
    std::snprintf(line, sizeof line, "%s%4d    %7d %7d %7d   |  %6d %6d %6d\n",
                  focus && *focus == r ? "> " : "  ", r, k.attn_dp_rank, k.attn_cp_rank,
                  k.attn_tp_rank, k.moe_dp_rank, k.moe_ep_rank, k.moe_tp_rank);
    o << line;
  }
  if (l.size() > kMaxRows)
    o << "  ... " << l.size() - kMaxRows << " more ranks (use --rank R or --format json)\n";
  o << "\n";
}

// Every group kind with its members, and the focused rank's groups.
inline void explain_groups(std::ostream& o, const RuntimeLayout& l, std::optional<int> focus) {
  const Widths& w = l.widths();
  o << "Groups\n";
  for (GroupKind g : kDomainGroupKinds) {
    const auto groups = l.groups(g);
    o << "  " << to_string(g) << impl::pad_name(to_string(g)) << groups.size()
      << (groups.size() == 1 ? " group  of " : " groups of ") << l.group_size(g)
      << (g == GroupKind::moe_dp && moe_dp_group_is_attn_cp(w) ? " (= attn_cp groups)" : "") << ": ";
    for (std::size_t i = 0; i < groups.size(); ++i) {
      if (groups.size() > 8 && i == 6) {
        o << "... ";
        i = groups.size() - 2;
      }
      o << impl::rank_list(groups[i]) << " ";
    }
    o << "\n";
  }
  if (focus) {
    const RankCoords k = l.coords(*focus);
    o << "\nRank " << *focus << ": attention-DP group " << k.attn_dp_rank << " (attn_tp_rank "
      << k.attn_tp_rank << ", attn_cp_rank " << k.attn_cp_rank << "); MoE ep rank "
      << k.moe_ep_rank << ", moe_tp_rank " << k.moe_tp_rank << ", moe_dp_rank " << k.moe_dp_rank
      << "\n";
    for (GroupKind g : kDomainGroupKinds)
      o << "  " << to_string(g) << impl::pad_name(to_string(g)) << "group #"
        << l.group_index(g, *focus) << ", position " << l.group_rank(g, *focus) << " in "
        << impl::rank_list(l.group_members(g, *focus)) << "\n";
  }
  o << "\n";
}

// The bridge's steps with their groups, the decode / extend attention plan and the padding rule.
inline void explain_bridge(std::ostream& o, const RuntimeLayout& l, std::optional<int> focus, bool scattered) {
  const LayoutConfig& c = l.config();
  const Widths& w = l.widths();
  const std::string backend(to_string(c.moe_a2a_backend));
  o << "Attention -> MoE bridge: " << to_string(l.bridge_path()) << "   (" << bridge_reason(l)
    << ")\n";
  if (scattered_applies(l, scattered))
    o << "  --enable-attn-tp-input-scattered: q_a, kv and their norms run on each member's split_rows chunk "
         "and are all-gathered over attn_tp; the rows between layers stay replicated\n";
  else if (scattered)
    o << "  " << scattered_not_applied(l) << "\n";
  int n = 1;
  for (const ExplainStep& s : bridge_steps(l, scattered)) {
    o << "  " << n++ << ". " << s.op;
    if (s.group == "local") {
      o << " (local)";
    } else {
      o << " over " << s.group;
      const auto kind = relayout::impl::kGroupNames.find(s.group);
      if (focus && kind) o << " " << impl::rank_list(l.group_members(*kind, *focus));
    }
    o << ": " << s.what << "\n";
  }
  o << "  decode / extend rows (relayout::CpAttention):";
  for (const ExplainStep& p : attention_steps(l, AttentionPhase::extend, scattered_applies(l, scattered)))
    o << " " << p.op << (p.group != "local" ? "@" + p.group : std::string());
  o << "\n";
  o << "  padding: "
    << (forces_max_len(c.moe_a2a_backend)
            ? "max_len always (" + backend + ")"
            : std::string("max_len if 2*sum(global_num_tokens) >= max*attn_dp, else sum_len") +
                  (w.attn_cp > 1 ? " (under CP, one count per CP share: attn_dp * attn_cp in place of attn_dp)" : ""))
    << "\n\n";
}

// The expert map, with redundant experts.
inline void explain_expert_map(std::ostream& o, const RuntimeLayout& l) {
  if (const ExpertMap m = expert_map(l); m.redundant > 0) {
    o << "Expert map (static placement, physical p holds logical p mod " << m.routed << "; DeepSeek-V3's " << m.routed
      << " routed experts + " << m.redundant << " redundant = " << m.physical << " physical";
    if (!m.error.empty()) {
      o << ")\n  cannot place them: " << m.error << "\n\n";
    } else {
      o << ", " << m.per_rank << " per moe_ep rank)\n";
      constexpr std::size_t kHead = 8, kTail = 2;
      for (std::size_t i = 0; i < m.members.size(); ++i) {
        if (m.members.size() > kHead + kTail + 1 && i == kHead) {
          o << "  ... " << m.members.size() - kHead - kTail << " more moe_ep ranks (--format json lists them)\n";
          i = m.members.size() - kTail;
        }
        const ExpertMapRow& r = m.members[i];
        o << "  ep " << r.member << " (physical " << r.first_physical << "-" << r.last_physical
          << "): logical " << id_ranges(r.logical);
        if (r.replicas > 0) o << "   (" << r.replicas << (r.replicas == 1 ? " replica)" : " replicas)");
        o << "\n";
      }
      o << "\n";
    }
  }
}

// DSpark's start-up check.
inline void explain_dspark(std::ostream& o, const RuntimeLayout& l) {
  const LayoutConfig& c = l.config();
  const Widths& w = l.widths();
  const DsparkVerdict v = l.dspark();
  o << "DSpark start-up check (draft " << to_string(c.draft) << "): ";
  if (!v.allowed)
    o << "REJECTED\n  " << v.error << "\n  (flag: " << v.input << ")\n";
  else if (c.draft == Draft::none)
  {
    LayoutConfig moe = c;
    moe.draft = Draft::moe;
    const DsparkVerdict hypothetical = dspark_verdict(moe, w);
    o << "allowed (no draft; a MoE draft here would be "
      << (hypothetical.allowed ? std::string("allowed") : "rejected: " + std::string(hypothetical.input))
      << ")\n";
  }
  else
    o << "allowed\n";
}

}  // namespace impl

// `scattered`: --enable-attn-tp-input-scattered was given.
inline std::string explain_text(const RuntimeLayout& l, std::optional<int> focus = std::nullopt, bool scattered = false) {
  std::ostringstream o;
  impl::explain_header(o, l);
  impl::explain_widths(o, l);
  impl::explain_ranks(o, l, focus);
  impl::explain_groups(o, l, focus);
  impl::explain_bridge(o, l, focus, scattered);
  impl::explain_expert_map(o, l);
  o << world_text(WorldLayout(l.config()));
  impl::explain_dspark(o, l);
  return o.str();
}

inline std::string explain_dot(const RuntimeLayout& l) {
  const Widths& w = l.widths();
  std::ostringstream o;
  o << "graph relayout {\n  label=\"tp=" << w.tp << " attn dp x cp x tp = " << w.attn_dp << " x "
    << w.attn_cp << " x " << w.attn_tp << ", MoE dp x ep x tp = " << w.moe_dp << " x " << w.moe_ep
    << " x " << w.moe_tp << ", bridge " << to_string(l.bridge_path()) << "\";\n"
    << "  node [shape=box, fontname=monospace];\n";
  const auto attn = l.groups(GroupKind::attn_tp);
  for (std::size_t g = 0; g < attn.size(); ++g) {
    const RankCoords first = l.coords(attn[g].front());
    o << "  subgraph cluster_attn_" << g << " {\n    label=\"attention DP " << first.attn_dp_rank
      << ", CP " << first.attn_cp_rank << " (attn_tp group " << g << ")\";\n";
    for (int r : attn[g]) {
      const RankCoords k = l.coords(r);
      o << "    r" << r << " [label=\"rank " << r << "\\nattn tp " << k.attn_tp_rank << "\\nmoe ep "
        << k.moe_ep_rank << " tp " << k.moe_tp_rank << " dp " << k.moe_dp_rank << "\"];\n";
    }
    o << "  }\n";
  }
  const struct {
    GroupKind kind;
    const char* style;
  } edges[] = {{GroupKind::moe_ep, "color=blue"}, {GroupKind::moe_tp, "color=darkgreen, style=dashed"},
               {GroupKind::moe_dp, "color=gray, style=dotted"}};
  for (const auto& e : edges) {
    if (l.group_size(e.kind) < 2) continue;
    int id = 0;
    for (const auto& members : l.groups(e.kind)) {
      for (std::size_t i = 1; i < members.size(); ++i)
        o << "  r" << members[i - 1] << " -- r" << members[i] << " [" << e.style << ", label=\""
          << to_string(e.kind) << " " << id << "\"];\n";
      ++id;
    }
  }
  o << "}\n";
  return o.str();
}

// The collective a bridge step runs (sum_len padding on path dp_gather).
inline std::string step_collective(BridgeStep s) {
  switch (s) {
    case BridgeStep::dp_gather: return "all_gatherv";
    case BridgeStep::dispatch:
    case BridgeStep::combine: return "all_to_allv";
    case BridgeStep::dp_reduce_scatter:
    case BridgeStep::reduce_scatter: return "reduce_scatter";
    case BridgeStep::reduce_scatterv: return "reduce_scatterv";
    case BridgeStep::all_reduce: return "all_reduce";
    case BridgeStep::all_gather: return "all_gather";
    default: return "local";
  }
}

// What rank `r` holds after one bridge step, in words short enough for a cell, and the attention-DP
// group whose rows they are (-1: rows of every group, or none).
struct HeldRows {
  std::string text;
  int group = -1;
};

inline HeldRows held_after(const RuntimeLayout& l, const PlanStep& p, int r) {
  const RankCoords k = l.coords(r);
  const Widths& w = l.widths();
  // Its DP group's rows; under attention CP, its CP share of them.
  const std::string g = "g" + std::to_string(k.attn_dp_rank) +
                        (w.attn_cp > 1 ? " cp " + std::to_string(k.attn_cp_rank + 1) + "/" + std::to_string(w.attn_cp) : "");
  const std::string chunk = g + " " + std::to_string(k.attn_tp_rank + 1) + "/" + std::to_string(w.attn_tp);
  // From the step's placement: none between dispatch and combine (the experts' rows).
  if (p.step == BridgeStep::route) return {"", -1};  // the rows of the step before, routed
  if (!p.placement) return {"ep " + std::to_string(k.moe_ep_rank) + "'s experts", -1};
  const bool summed = p.step == BridgeStep::all_reduce;
  if (p.placement->state == RowState::partial)
    return {w.moe_dp > 1 ? "slice " + std::to_string(k.moe_dp_rank + 1) + "/" + std::to_string(w.moe_dp) + " partial"
                         : "all, partial",
            -1};
  if (p.placement->scope == RowScope::dp_global) return {summed ? "all, summed" : "all groups", -1};
  if (p.placement->state == RowState::row_shard) return {w.attn_tp > 1 ? chunk : g, k.attn_dp_rank};
  return {summed ? g + " summed" : g, k.attn_dp_rank};
}

// The layout as a picture: the ranks as a grid in attention order (dp, cp; tp across) and in MoE
// order (moe_dp, moe_ep; moe_tp across), both coloured by attention-DP group, and the bridge's
// steps as a strip of which rows each rank holds after each step (the first 16 ranks).
inline std::string explain_svg(const RuntimeLayout& l) {
  const Widths& w = l.widths();
  constexpr double cw = 64, ch = 24, left = 150, gap = 36;
  constexpr int kMaxGridRanks = 256, kMaxStripRanks = 16;
  svg::Doc d(800, 200);
  double y = 24;
  const std::string title = "relayout explain: tp " + std::to_string(w.tp) + "; attention dp x cp x tp = " + std::to_string(w.attn_dp) +
                    " x " + std::to_string(w.attn_cp) + " x " + std::to_string(w.attn_tp) + "; MoE dp x ep x tp = " +
                    std::to_string(w.moe_dp) + " x " + std::to_string(w.moe_ep) + " x " + std::to_string(w.moe_tp) +
                    "; backend " + std::string(to_string(l.backend())) + "; bridge " + std::string(to_string(l.bridge_path()));
  d.text(12, y, title, 13, "start", "title", "bold");
  d.grow(24 + 8.0 * double(title.size()), 0);  // monospace, about 8 px per character at 13 px
  y += 18;
  d.text(12, y, "colour: attention-DP group (the rows a rank's attention works on)", 11, "start", "note");
  y += gap;
  // A grid of `rows` x `cols` ranks in rank order (rank = row * cols + column). A single column
  // (tp width 1) is laid out across instead, 16 ranks a row, its axis named `row_axis`.
  const auto grid = [&](const std::string& title, int rows, int cols, const std::string& row_axis,
                        const std::string& col_name, auto row_label) {
    std::string axis = col_name;
    auto label = [&](int i) { return row_label(i); };
    const bool across = cols == 1 && rows > 1;
    const int per_row = std::min(rows, 16);
    if (across) {
      cols = per_row;
      rows = (rows + per_row - 1) / per_row;
      axis = row_axis;
    }
    d.text(12, y - 10, title, 12, "start", "section", "bold");
    d.text(left, y + 2, axis + " ->", 10, "start", "axis");
    y += 8;
    int shown = 0;
    for (int i = 0; i < rows && shown < kMaxGridRanks; ++i) {
      d.text(12, y + i * ch + 16,
             across ? "ranks " + std::to_string(i * cols) + "-" + std::to_string(std::min(l.size(), (i + 1) * cols) - 1)
                    : label(i),
             10, "start", "rowlabel");
      for (int j = 0; j < cols && shown < kMaxGridRanks; ++j, ++shown) {
        const int r = i * cols + j;
        if (r >= l.size()) break;
        const RankCoords k = l.coords(r);
        d.rect(left + j * cw, y + i * ch, cw - 2, ch - 2, svg::colour(k.attn_dp_rank, w.attn_dp), "rank",
               "rank " + std::to_string(r) + ": attn dp " + std::to_string(k.attn_dp_rank) + ", tp " +
                   std::to_string(k.attn_tp_rank) + "; moe ep " + std::to_string(k.moe_ep_rank) + ", tp " +
                   std::to_string(k.moe_tp_rank));
        d.text(left + j * cw + cw / 2 - 1, y + i * ch + 15, "r" + std::to_string(r), 11, "middle", "ranklabel");
      }
      d.grow(left + cols * cw + 20, 0);
    }
    const int drawn_rows = std::min(rows, (kMaxGridRanks + cols - 1) / cols);
    if (l.size() > kMaxGridRanks)
      d.text(12, y + drawn_rows * ch + 14, "... " + std::to_string(l.size() - kMaxGridRanks) + " more ranks", 10);
    y += drawn_rows * ch + (l.size() > kMaxGridRanks ? 20 : 0) + gap;
  };
  grid("Attention order (dp, cp, tp)", w.attn_dp * w.attn_cp, w.attn_tp, w.attn_cp > 1 ? "attn dp, cp" : "attn_dp",
       "attn_tp",
       [&](int i) { return "dp " + std::to_string(i / w.attn_cp) + (w.attn_cp > 1 ? " cp " + std::to_string(i % w.attn_cp) : ""); });
  grid("MoE order (moe_dp, moe_ep, moe_tp)", w.moe_dp * w.moe_ep, w.moe_tp, w.moe_dp > 1 ? "moe_dp, moe_ep" : "moe_ep",
       "moe_tp",
       [&](int i) { return (w.moe_dp > 1 ? "mdp " + std::to_string(i / w.moe_ep) + " " : std::string()) + "ep " + std::to_string(i % w.moe_ep); });

  // The strip: the attention all-reduce, then the bridge plan's steps.
  const auto plan = bridge_plan(l.bridge_path(), PaddingMode::sum_len, BridgeRestore::reduce, w.attn_cp > 1);
  d.text(12, y - 10, "Bridge steps: rows each rank holds after each step (path " + std::string(to_string(l.bridge_path())) + ")",
         12, "start", "section", "bold");
  const double sw = 112, top = y + 28;
  const int ranks = std::min(l.size(), kMaxStripRanks);
  const auto header = [&](int col, const std::string& name, const std::string& op) {
    d.text(left + col * sw + sw / 2, y + 4, name, 10, "middle", "step", "bold");
    d.text(left + col * sw + sw / 2, y + 17, op, 9, "middle", "collective");
  };
  header(0, "attention", w.attn_cp > 1 ? "all_gatherv@attn_cp (KV)" : w.attn_tp > 1 ? "all_reduce@attn_tp" : "local");
  for (std::size_t c = 0; c < plan.size(); ++c)
    header(int(c) + 1, std::string(plan[c].name),
           plan[c].group ? step_collective(plan[c].step) + "@" + std::string(to_string(*plan[c].group)) : "local");
  for (int r = 0; r < ranks; ++r) {
    const RankCoords k = l.coords(r);
    d.text(12, top + r * ch + 15, "r" + std::to_string(r) + " (g" + std::to_string(k.attn_dp_rank) + ")", 10, "start", "rowlabel");
    d.rect(left, top + r * ch, sw - 2, ch - 2, svg::colour(k.attn_dp_rank, w.attn_dp), "held");
    HeldRows h = held_after(l, PlanStep{BridgeStep::all_gather, std::nullopt, "", "", Placement{RowState::replicated, GroupKind::attn_tp, RowScope::dp_local}, ""}, r);  // its own rows
    d.text(left + sw / 2, top + r * ch + 15, h.text, 10, "middle");
    for (std::size_t c = 0; c < plan.size(); ++c) {
      if (plan[c].step != BridgeStep::route) h = held_after(l, plan[c], r);
      const double x = left + double(c + 1) * sw;
      d.rect(x, top + r * ch, sw - 2, ch - 2, h.group >= 0 ? svg::colour(h.group, w.attn_dp) : "#eeeeee", "held");
      d.text(x + sw / 2, top + r * ch + 15, h.text, 10, "middle");
    }
  }
  double bottom = top + ranks * ch + 16;
  if (l.size() > ranks) {
    d.text(12, bottom, "... " + std::to_string(l.size() - ranks) + " more ranks", 10);
    bottom += 16;
  }
  d.grow(left + double(plan.size() + 1) * sw + 20, bottom + 10);
  return d.str();
}

}  // namespace relayout::cli
