// `relayout plan` against the real thing: dsv4_layer runs on MPI ranks (mpiexec) for every layout
// of the np <= 8 sweep, attention CP and prefill CP included (np 8: a few, one per bridge path, EP
// width and CP kind), and
// every rank's measured collectives (--format json, ranks[].collectives[]) are compared with the
// plan: the same (operation, group) entries, equal calls, equal bytes for every collective whose
// size does not depend on routing. Dispatch/combine are expected values under uniform routing:
// dispatch within 20% per rank; combine within 20% summed over each moe_ep group (a rank's
// combine follows the load of its own experts, which the demo's untrained router does not
// balance: single ranks measure up to about a third off). Every group has >= 512 tokens.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "cli/plan.hpp"

using namespace relayout;

namespace {

struct Case {
  LayoutConfig config;
  std::string padding = "auto", restore = "reduce";
};

// The sweep of test/model/test_layer_mpi.cpp (tp = np; DP attention off/on, every dp; attention CP
// off, every cp, prefill CP; backend none with every ep, deepep; every moe_dp), one entry per
// distinct widths, token split and backend.
std::vector<Case> sweep(int np) {
  std::vector<Case> out;
  std::set<std::string> seen;
  for (bool prefill : {false, true})
    for (int cp = 1; cp <= (prefill ? 1 : np); ++cp)
      for (bool dpa : {false, true})
        for (int dp = 1; dp <= (dpa ? np : 1); ++dp)
          for (Backend b : {Backend::none, Backend::deepep})
            for (int ep = 1; ep <= (b == Backend::none ? np : 1); ++ep)
              for (int moe_dp = 1; moe_dp <= np; ++moe_dp) {
                const LayoutConfig c{.tp = np, .dp = dp, .cp = cp, .ep = ep, .moe_dp = moe_dp,
                                     .enable_dp_attention = dpa, .moe_a2a_backend = b, .enable_prefill_cp = prefill};
                const WidthsResult r = derive_widths(c);
                if (r.rule != LayoutRule::ok) continue;
                const Widths& w = r.widths;
                // CP layouts (each mpiexec costs about a second): one per bridge path, token split and
                // whether attn_dp, moe_ep and moe_dp are > 1.
                const std::string key =
                    w.attn_cp == 1 ? std::to_string(w.attn_dp) + "/" + std::to_string(w.moe_ep) + "/" +
                                         std::to_string(w.moe_dp) + "/" + std::string(to_string(b))
                                   : "cp/" + std::string(to_string(bridge_path(w, b))) + "/" + std::to_string(prefill) +
                                         std::to_string(w.attn_dp > 1) + std::to_string(w.moe_ep > 1) +
                                         std::to_string(w.moe_dp > 1);
                if (!seen.insert(key).second) continue;
                const bool restores = w.attn_cp == 1 ? np <= 4 : np == 2 && !prefill && w.moe_ep == 1 && w.moe_dp == 1;
                if (w.attn_dp * w.attn_cp > 1 && b == Backend::none && restores) {
                  out.push_back({c, "sum_len"});  // path dp_gather: every restore
                  out.push_back({c, "max_len"});
                  out.push_back({c, "sum_len", "scatter"});
                } else {
                  out.push_back({c});
                }
              }
  return out;
}

std::string flags_of(const LayoutConfig& c) {
  std::string s = "--tp " + std::to_string(c.tp) + " --dp " + std::to_string(c.dp) + " --ep " + std::to_string(c.ep) +
                  " --moe-dp-size " + std::to_string(c.moe_dp) + " --moe-a2a-backend " +
                  std::string(to_string(c.moe_a2a_backend));
  if (c.cp > 1) s += " --cp " + std::to_string(c.cp);
  if (c.enable_prefill_cp) s += " --enable-prefill-cp --cp-strategy interleave";
  return c.enable_dp_attention ? s + " --enable-dp-attention" : s;
}

std::string run(const std::string& command) {
  std::string out;
  FILE* f = popen((command + " 2>&1").c_str(), "r");
  REQUIRE(f != nullptr);
  char buf[4096];
  while (std::size_t n = fread(buf, 1, sizeof buf, f)) out.append(buf, n);
  const int rc = pclose(f);
  INFO(command);
  INFO(out.substr(0, 2000));
  REQUIRE(rc == 0);
  return out;
}

using Table = std::map<std::pair<std::string, std::string>, std::pair<std::int64_t, std::int64_t>>;
Table table(const nlohmann::json& collectives) {
  Table t;
  for (const auto& c : collectives)
    t[{c.at("op").get<std::string>(), c.at("group").get<std::string>()}] = {c.at("calls").get<std::int64_t>(),
                                                                           c.at("bytes").get<std::int64_t>()};
  return t;
}

// Small dims that every layout of np <= 8 accepts; one layer keeps the runs short.
cli::PlanInput input(int attn_dp) {
  cli::PlanInput in;
  in.dims.hidden = 16;
  in.dims.heads = 8;
  in.dims.head_dim = 4;
  in.dims.q_lora = 8;
  in.dims.experts = 16;
  in.dims.topk = 2;
  in.dims.moe_inter = 8;
  in.dims.shared_inter = 8;
  in.dims.layers = 1;
  in.requests.clear();
  for (int g = 0; g < std::max(attn_dp, 2); ++g) in.requests.push_back(520 + 37 * g);  // uneven, >= 512 per group
  return in;
}

std::string model_args(const cli::PlanInput& in) {
  std::string r;
  for (int n : in.requests) r += (r.empty() ? "" : ",") + std::to_string(n);
  return cli::model_flags(in.dims) + " --requests " + r;
}

}  // namespace

TEST_CASE("plan: measured collectives of dsv4_layer equal the plan (dispatch/combine within 20%)") {
  int layouts = 0, cp_layouts = 0;
  double worst_dispatch = 0, worst_combine_group = 0, worst_combine_rank = 0;
  for (int np : {1, 2, 4, 8}) {
    std::vector<Case> cases = sweep(np);
    if (np == 8) {  // np 8 on an oversubscribed machine: one layout per bridge path and EP width
      std::vector<Case> few;
      std::set<std::string> kinds;
      for (const Case& c : cases) {
        const RuntimeLayout l(c.config);
        const std::string kind = std::string(to_string(l.bridge_path())) + std::to_string(l.widths().moe_ep > 1) +
                                 std::to_string(l.widths().attn_cp > 1) + std::to_string(c.config.enable_prefill_cp);
        if (kinds.insert(kind).second) few.push_back(c);
      }
      cases = few;
    }
    for (const Case& c : cases) {
      const RuntimeLayout layout(c.config);
      cli::PlanInput in = input(layout.widths().attn_dp);
      in.padding = c.padding;
      in.restore = c.restore;
      const std::string args = flags_of(c.config) + " " + model_args(in) + " --padding " + c.padding + " --restore " + c.restore;
      CAPTURE(args);
      const nlohmann::json measured = nlohmann::json::parse(
          run(std::string(RELAYOUT_MPIEXEC) + " -n " + std::to_string(np) + " " + RELAYOUT_DSV4_LAYER + " " + args + " --format json"));
      const cli::LayerPlan plan = cli::plan_layer(layout, in);
      const nlohmann::json planned = cli::plan_json(plan);
      REQUIRE(measured.at("ranks").size() == planned.at("ranks").size());
      CHECK(measured.at("path") == planned.at("path"));
      std::map<int, std::pair<double, double>> combine_of_group;  // moe_ep group -> (measured, planned)
      for (std::size_t r = 0; r < planned.at("ranks").size(); ++r) {
        CAPTURE(r);
        const Table m = table(measured["ranks"][r]["collectives"]), p = table(planned["ranks"][r]["collectives"]);
        std::set<std::pair<std::string, std::string>> keys;
        for (const auto& [k, v] : m) keys.insert(k);
        for (const auto& [k, v] : p) keys.insert(k);
        for (const auto& k : keys) {
          CAPTURE(k.first);
          CAPTURE(k.second);
          REQUIRE(m.count(k) == 1);
          REQUIRE(p.count(k) == 1);
          const auto [mc, mb] = m.at(k);
          const auto [pc, pb] = p.at(k);
          CHECK(mc == pc);
          if (k.first == "dispatch") {
            const double rel = std::abs(double(mb) / double(pb) - 1.0);
            worst_dispatch = std::max(worst_dispatch, rel);
            CHECK(rel <= 0.20);
          } else if (k.first == "combine") {
            const int g = layout.group_index(GroupKind::moe_ep, int(r));
            combine_of_group[g].first += double(mb);
            combine_of_group[g].second += double(pb);
            worst_combine_rank = std::max(worst_combine_rank, std::abs(double(mb) / double(pb) - 1.0));
          } else {
            CHECK(mb == pb);
          }
        }
      }
      for (const auto& [g, mp] : combine_of_group) {
        const double rel = std::abs(mp.first / mp.second - 1.0);
        worst_combine_group = std::max(worst_combine_group, rel);
        CHECK(rel <= 0.20);
      }
      ++layouts;
      cp_layouts += layout.widths().attn_cp > 1;
    }
  }
  MESSAGE("layouts compared: " << layouts << " (" << cp_layouts << " with attention CP); worst dispatch per rank " << worst_dispatch * 100
                               << "%, combine per moe_ep group " << worst_combine_group * 100 << "% (single rank "
                               << worst_combine_rank * 100 << "%)");
  CHECK(layouts >= 20);
  CHECK(cp_layouts >= 20);
}

TEST_CASE("plan --dispatch-dtype bf16 / fp8: the message the plan prices is the one dsv4_layer sends") {
  // One layer, so every dtype routes the same rows: the measured dispatch bytes of each rank,
  // divided by the plan's message bytes, must give the same row count for every dtype; and the
  // plan's expected dispatch bytes stay within 20% of the measured ones.
  for (const LayoutConfig c : {LayoutConfig{.tp = 2, .moe_a2a_backend = Backend::deepep},
                               LayoutConfig{.tp = 4, .dp = 4, .enable_dp_attention = true, .moe_a2a_backend = Backend::deepep}}) {
    const RuntimeLayout layout(c);
    const int np = layout.size();
    std::vector<std::int64_t> rows_sent;  // per rank, from the fp32 run
    for (const char* dtype : {"fp32", "bf16", "fp8"}) {
      cli::PlanInput in = input(layout.widths().attn_dp);
      in.dispatch_dtype = dtype;
      const std::string args = flags_of(c) + " " + model_args(in) + " --dispatch-dtype " + dtype;
      CAPTURE(args);
      const nlohmann::json measured = nlohmann::json::parse(
          run(std::string(RELAYOUT_MPIEXEC) + " -n " + std::to_string(np) + " " + RELAYOUT_DSV4_LAYER + " " + args + " --format json"));
      const cli::LayerPlan plan = cli::plan_layer(layout, in);
      const nlohmann::json planned = cli::plan_json(plan);
      // The row's bytes by hand: 2 float weights and 2 int32 ids, then the 16 values.
      const std::int64_t want = std::string(dtype) == "fp32" ? 16 + 16 * 4 : std::string(dtype) == "bf16" ? 16 + 16 * 2 : 16 + 4 + 16;
      CHECK(plan.message.bytes == want);
      for (int r = 0; r < np; ++r) {
        CAPTURE(r);
        const Table m = table(measured["ranks"][std::size_t(r)]["collectives"]),
                    p = table(planned["ranks"][std::size_t(r)]["collectives"]);
        const auto key = std::make_pair(std::string("dispatch"), std::string("moe_ep"));
        REQUIRE(m.count(key) == 1);
        const std::int64_t bytes = m.at(key).second;
        CHECK(bytes % plan.message.bytes == 0);
        if (std::string(dtype) == "fp32") rows_sent.push_back(bytes / plan.message.bytes);
        else CHECK(bytes / plan.message.bytes == rows_sent[std::size_t(r)]);
        CHECK(std::abs(double(bytes) / double(p.at(key).second) - 1.0) <= 0.20);
      }
    }
  }
}
