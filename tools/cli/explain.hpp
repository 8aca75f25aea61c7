// `relayout explain`: a layout as text for a human, as JSON for tools, and as a Graphviz picture.
// Everything shown is read from relayout::RuntimeLayout and the bridge plan; nothing here
// re-derives a formula.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cli/svg.hpp"
#include "relayout/bridge/plan.hpp"
#include "relayout/mesh.hpp"

namespace relayout::cli {

struct ExplainStep {
  std::string op;     // the collective or local step
  std::string group;  // the group it runs on ("local" when no communication)
  std::string what;   // what it does to the rows
};

// The Attention->MoE hand-over of one decoder layer, in execution order: the attention all-reduce
// and the token-count gather around the bridge's own plan (relayout::bridge_plan, the steps
// MoeBridge runs), so explain and execution cannot drift apart. Path dp_gather's restore depends
// on the step's padding mode; both are listed.
inline std::vector<ExplainStep> bridge_steps(const RuntimeLayout& l) {
  const Widths& w = l.widths();
  std::vector<ExplainStep> s;
  if (w.attn_cp > 1)  // docs/cp.md: the attention's own collective under CP
    s.push_back({"all_gatherv", "attn_cp", "every CP rank's kv rows (head_dim floats per token): the shared KV of its "
                                           "DP group, attended by global position"});
  if (w.attn_tp > 1)
    s.push_back({"all_reduce", "attn_tp", "wo_b partial sums -> identical complete rows (Replicated)"});
  else
    s.push_back({"none", "local", "attn_tp == 1: wo_b output is already complete"});
  const bool cp = w.attn_cp > 1;
  if (l.bridge_path() == BridgePath::dp_gather)
    s.push_back({"all_gather", "tp", cp ? "token counts of every CP rank of every attention-DP group (global_num_tokens)"
                                        : "token counts of every attention-DP group (global_num_tokens)"});
  const auto plan = bridge_plan(l.bridge_path(), PaddingMode::sum_len, BridgeRestore::reduce, cp);
  for (const PlanStep& p : plan) {
    ExplainStep e{std::string(p.name), p.group ? std::string(to_string(*p.group)) : "local",
                  std::string(p.what) + (p.placement.empty() ? "" : " -> " + std::string(p.placement))};
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

// How the flags resolve to the widths, step by step: --attn-dp-size, DeepSeek-V4 prefill CP, the
// per-backend and CP rules SGLang checks, and the MoE-DP group that is the attention-CP group.
inline std::vector<std::string> resolution_steps(const RuntimeLayout& l) {
  const LayoutConfig& c = l.config();
  const Widths& w = l.widths();
  const auto s = [](std::int64_t v) { return std::to_string(v); };
  const std::string backend(to_string(c.moe_a2a_backend));
  std::vector<std::string> out;
  if (c.attn_dp_size) {
    const int n = *c.attn_dp_size;
    if (n > 1)
      out.push_back("--attn-dp-size " + s(n) + ": DP attention over " + s(n) +
                    " groups (the widths of --dp-size " + s(n) + " --enable-dp-attention)" +
                    (c.enable_dp_attention ? "; --enable-dp-attention next to it is redundant" : ""));
    else
      out.push_back("--attn-dp-size 1: no DP attention" +
                    (c.dp > 1 ? "; --dp-size " + s(c.dp) + " are replicas outside this domain"
                              : std::string()));
  }
  if (c.enable_prefill_cp) {
    out.push_back("--enable-prefill-cp --cp-strategy " + std::string(to_string(c.cp_strategy)) +
                  ": DeepSeek-V4 prefill CP, SGLang's round-robin-split");
    out.push_back("prefill CP turns DP attention on");
    out.push_back("prefill CP checks: dp = " + s(resolved_dp(c)) + " == 1, tp = " + s(c.tp) +
                  " <= 8 (one machine), --moe-a2a-backend " + backend +
                  " in {none, deepep, megamoe, mori}: all hold");
    out.push_back("attn_cp = tp / dp = " + s(c.tp) + " / " + s(resolved_dp(c)) + " = " + s(w.attn_cp) +
                  (cp_overridden(c) ? " (replaces --cp " + s(c.cp) + ")" : std::string()) +
                  "; attn_dp = 1, attn_tp = " + s(w.attn_tp));
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
      out.push_back("tokens: each request is cut into " + s(w.attn_cp) +
                    " contiguous chunks, CP rank r holding chunk r (the first n % " +
                    s(w.attn_cp) + " chunks one token longer)");
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

inline nlohmann::json explain_json(const RuntimeLayout& l, std::optional<int> focus = std::nullopt) {
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
                 {"cp_strategy", std::string(to_string(c.cp_strategy))}};
  j["dp_attention"] = dp_attention_on(c);
  j["resolution"] = resolution_steps(l);
  j["widths"] = {{"tp", w.tp},         {"attn_dp", w.attn_dp}, {"attn_cp", w.attn_cp},
                 {"attn_tp", w.attn_tp}, {"moe_dp", w.moe_dp},   {"moe_ep", w.moe_ep},
                 {"moe_tp", w.moe_tp}};
  j["ep_overridden"] = ep_overridden(c);
  j["cp_overridden"] = cp_overridden(c);
  j["cp_token_split"] = l.cp_token_split() == CpTokenSplit::round_robin ? "round_robin" : "contiguous";
  j["moe_dp_group"] = {{"is_attn_cp_group", moe_dp_group_is_attn_cp(w)},
                       {"size", l.group_size(GroupKind::moe_dp)}};
  j["ranks"] = json::array();
  for (int r = 0; r < l.size(); ++r) {
    const RankCoords k = l.coords(r);
    j["ranks"].push_back({{"rank", k.rank},
                          {"attn_dp_rank", k.attn_dp_rank},
                          {"attn_cp_rank", k.attn_cp_rank},
                          {"attn_tp_rank", k.attn_tp_rank},
                          {"moe_dp_rank", k.moe_dp_rank},
                          {"moe_ep_rank", k.moe_ep_rank},
                          {"moe_tp_rank", k.moe_tp_rank}});
  }
  for (GroupKind g : kAllGroupKinds) j["groups"][std::string(to_string(g))] = l.groups(g);
  j["bridge"]["path"] = std::string(to_string(l.bridge_path()));
  j["bridge"]["reason"] = bridge_reason(l);
  j["bridge"]["steps"] = json::array();
  for (const ExplainStep& s : bridge_steps(l))
    j["bridge"]["steps"].push_back({{"op", s.op}, {"group", s.group}, {"what", s.what}});
  j["padding"]["rule"] = forces_max_len(c.moe_a2a_backend)
                             ? "max_len always (" + std::string(to_string(c.moe_a2a_backend)) + ")"
                             : "max_len if 2*sum(global_num_tokens) >= max*attn_dp else sum_len";
  const DsparkVerdict v = l.dspark();
  j["dspark"] = {{"allowed", v.allowed},
                 {"error", v.allowed ? json(nullptr) : json(std::string(v.error))}};
  if (focus) {
    json f = j["ranks"][static_cast<std::size_t>(l.coords(*focus).rank)];
    for (GroupKind g : kAllGroupKinds)
      f["groups"][std::string(to_string(g))] = {{"index", l.group_index(g, *focus)},
                                                {"group_rank", l.group_rank(g, *focus)},
                                                {"members", l.group_members(g, *focus)}};
    j["focus"] = f;
  }
  return j;
}

namespace impl {

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

inline std::string explain_text(const RuntimeLayout& l, std::optional<int> focus = std::nullopt) {
  const LayoutConfig& c = l.config();
  const Widths& w = l.widths();
  const std::string backend(to_string(c.moe_a2a_backend));
  std::ostringstream o;
  o << "relayout explain: tp=" << c.tp << " dp=" << c.dp << " cp=" << c.cp << " ep=" << c.ep
    << " moe_dp=" << c.moe_dp << " dp_attention=" << (dp_attention_on(c) ? "on" : "off")
    << " moe_a2a_backend=" << backend << " draft=" << to_string(c.draft);
  if (c.attn_dp_size) o << " attn_dp_size=" << *c.attn_dp_size;
  if (c.enable_prefill_cp) o << " prefill_cp=" << to_string(c.cp_strategy);
  o << "\n\n";

  if (const auto steps = resolution_steps(l); !steps.empty()) {
    o << "Resolution\n";
    for (std::size_t i = 0; i < steps.size(); ++i) o << "  " << i + 1 << ". " << steps[i] << "\n";
    o << "\n";
  }

  o << "Widths\n";
  o << "  attn_dp = "
    << (c.attn_dp_size ? "--attn-dp-size"
        : !dp_attention_on(c) ? "1 (DP attention off)"
        : c.enable_prefill_cp ? "dp (DP attention on by --enable-prefill-cp)"
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
  o << "  check   " << w.tp << " = " << w.attn_dp << " x " << w.attn_cp << " x " << w.attn_tp
    << " (attention dp x cp x tp) = " << w.moe_dp << " x " << w.moe_ep << " x " << w.moe_tp
    << " (MoE dp x ep x tp)\n";
  if (!dp_attention_on(c) && c.dp > 1)
    o << "  note    dp = " << c.dp << " without DP attention: replicas outside this domain; this "
      << "domain has tp = " << w.tp << " ranks\n";
  o << "\n";

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

  o << "Groups\n";
  for (GroupKind g : kAllGroupKinds) {
    const auto groups = l.groups(g);
    o << "  " << to_string(g) << std::string(8 - to_string(g).size(), ' ') << groups.size()
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
    for (GroupKind g : kAllGroupKinds)
      o << "  " << to_string(g) << std::string(8 - to_string(g).size(), ' ') << "group #"
        << l.group_index(g, *focus) << ", position " << l.group_rank(g, *focus) << " in "
        << impl::rank_list(l.group_members(g, *focus)) << "\n";
  }
  o << "\n";

  o << "Attention -> MoE bridge: " << to_string(l.bridge_path()) << "   (" << bridge_reason(l)
    << ")\n";
  int n = 1;
  for (const ExplainStep& s : bridge_steps(l)) {
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
  o << "  padding: "
    << (forces_max_len(c.moe_a2a_backend)
            ? "max_len always (" + backend + ")"
            : std::string("max_len if 2*sum(global_num_tokens) >= max*attn_dp, else sum_len") +
                  (w.attn_cp > 1 ? " (under CP, one count per CP share: attn_dp * attn_cp in place of attn_dp)" : ""))
    << "\n\n";

  const DsparkVerdict v = l.dspark();
  o << "DSpark start-up check (draft " << to_string(c.draft) << "): ";
  if (!v.allowed)
    o << "REJECTED\n  " << v.error << "\n";
  else if (c.draft == Draft::none)
    o << "allowed (no draft; a MoE draft here would be "
      << (dp_attention_on(c) && w.attn_tp > 1 ? "rejected: attn_tp > 1" : "allowed") << ")\n";
  else
    o << "allowed\n";
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
    case BridgeStep::dp_reduce_scatter: return "reduce_scatter";
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
  switch (p.step) {
    case BridgeStep::dp_gather: return {"all groups", -1};
    case BridgeStep::local_experts:
      return {w.moe_dp > 1 ? "slice " + std::to_string(k.moe_dp_rank + 1) + "/" + std::to_string(w.moe_dp) + " partial"
                           : "all, partial",
              -1};
    case BridgeStep::all_reduce:
      return l.bridge_path() == BridgePath::dp_gather ? HeldRows{"all, summed", -1} : HeldRows{g + " summed", k.attn_dp_rank};
    case BridgeStep::split_rows:
    case BridgeStep::combine:
    case BridgeStep::shared_expert: return {w.attn_tp > 1 ? chunk : g, k.attn_dp_rank};
    case BridgeStep::route: return {"", -1};  // the rows of the step before, routed (explain_svg)
    case BridgeStep::dispatch:
    case BridgeStep::experts: return {"ep " + std::to_string(k.moe_ep_rank) + "'s experts", -1};
    case BridgeStep::reduce_scatterv:
    case BridgeStep::dp_reduce_scatter:
    case BridgeStep::dp_scatter:
    case BridgeStep::all_gather: return {g, k.attn_dp_rank};
  }
  return {"", -1};
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
    HeldRows h = held_after(l, PlanStep{BridgeStep::all_gather, std::nullopt, "", "", "", ""}, r);  // its own rows
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
