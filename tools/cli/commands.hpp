// The `relayout` command line as a function of (argv, out, err) -> exit code, shared by main() and
// the fuzz target. Subcommands: explain, plan, trace diff.
#pragma once

#include <optional>
#include <ostream>
#include <string>

#include "cli/explain.hpp"
#include "cli/layout_flags.hpp"
#include "cli/plan.hpp"
#include "cli/trace_diff.hpp"

namespace relayout::cli {

// "unknown subcommand 'X' of relayout; expected one of: a, b" for the first word that should name a
// subcommand and does not (empty when the words are fine or the first word is an option).
inline std::string unknown_subcommand(const CLI::App& app, int argc, const char* const* argv) {
  const CLI::App* at = &app;
  std::string path = "relayout";
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    const auto subs = at->get_subcommands([](const CLI::App*) { return true; });
    if (subs.empty() || word.empty() || word[0] == '-') return "";
    const CLI::App* next = nullptr;
    std::string names;
    for (const CLI::App* s : subs) {
      if (s->check_name(word)) next = s;
      names += (names.empty() ? "" : ", ") + s->get_name();
    }
    if (!next) return "unknown subcommand '" + word + "' of " + path + "; expected one of: " + names;
    path += " " + next->get_name();
    at = next;
  }
  return "";
}

inline int relayout_command(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  CLI::App app{"relayout: parallel layouts for DP-attention / EP-MoE inference engines"};
  app.require_subcommand(1);

  LayoutFlags flags;
  std::string format = "text";
  int rank = -1;
  CLI::App* explain = app.add_subcommand("explain", "explain a layout given SGLang-style flags");
  flags.add_to(*explain);
  add_int(*explain, "--rank", rank, "focus one rank of the domain");
  explain->add_option("--format", format, "text, json or dot")
      ->check(CLI::IsMember({"text", "json", "dot"}));

  // plan: the collectives, rows and memory per rank of the demo layer (plan.hpp), from dsv4_layer's flags.
  LayoutFlags plan_flags;  // its own: LayoutFlags keeps a pointer to the option it registered
  PlanInput plan_in;
  std::string plan_format = "text";
  CLI::App* plan = app.add_subcommand("plan", "predicted collectives, rows and memory per rank of one forward of the demo layer");
  plan_flags.add_to(*plan);
  add_model_flags(*plan, plan_in.dims);
  add_int_list(*plan, "--requests", plan_in.requests, "prompt lengths, e.g. 5,3,4 (request i -> DP group i mod attn_dp)");
  add_int_list(*plan, "--placement", plan_in.placement, "the DP group of each request, e.g. 0,0,2");
  plan->add_option("--padding", plan_in.padding, "auto (docs/bridge.md#padding rule), max_len or sum_len");
  plan->add_option("--restore", plan_in.restore, "path A restore: reduce or scatter");
  plan->add_option("--format", plan_format, "text or json")->check(CLI::IsMember({"text", "json"}));

  // trace diff BASELINE CANDIDATE: first divergence of two row-ownership traces (trace_diff.hpp).
  CLI::App* trace = app.add_subcommand("trace", "row-ownership traces written with --trace DIR");
  trace->require_subcommand(1);
  CLI::App* diff = trace->add_subcommand(
      "diff", "first boundary where CANDIDATE's rows diverge from BASELINE's (exit 0 agree, 1 diverge, 2 unreadable)");
  std::string baseline, candidate;
  DiffOptions diff_opts;
  diff->add_option("BASELINE", baseline, "trace directory of the trusted run (e.g. one rank)")->required();
  diff->add_option("CANDIDATE", candidate, "trace directory of the layout under test")->required();
  // At most 1: the checksums of O(1) activations, which a layout bug changes by O(1), would agree
  // whatever the rows hold under a larger tolerance.
  add_float(*diff, "--rtol", diff_opts.tolerance.rtol, "relative checksum tolerance, in [0, 1] (see relayout/trace/record.hpp)", 0.0, 1.0);
  add_float(*diff, "--atol", diff_opts.tolerance.atol, "absolute checksum tolerance, in [0, 1]", 0.0, 1.0);

  // A misspelt subcommand is named (CLI11 would take it for a stray argument and ask for one).
  if (const std::string unknown = unknown_subcommand(app, argc, argv); !unknown.empty()) {
    err << "error: " << unknown << "\n";
    return 2;
  }

  return run_main(app, argc, argv, out, err, [&] {
    if (diff->parsed()) return trace_diff(baseline, candidate, diff_opts, out, err);
    const RuntimeLayout layout = plan->parsed() ? plan_flags.layout() : flags.layout();
    if (plan->parsed()) {
      const LayerPlan p = plan_layer(layout, plan_in);
      if (plan_format == "json")
        out << plan_json(p).dump(2) << "\n";
      else
        out << plan_text(p);
      return 0;
    }
    std::optional<int> focus;
    if (explain->count("--rank")) focus = layout.coords(rank).rank;  // throws when out of range
    if (format == "json")
      out << explain_json(layout, focus).dump(2) << "\n";
    else if (format == "dot")
      out << explain_dot(layout);
    else
      out << explain_text(layout, focus);
    return 0;
  });
}

}  // namespace relayout::cli
