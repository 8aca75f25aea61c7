// The `relayout` command line as a function of (argv, out, err) -> exit code, shared by main() and
// the fuzz target. Subcommands: explain, trace diff.
#pragma once

#include <optional>
#include <ostream>
#include <string>

#include "cli/explain.hpp"
#include "cli/layout_flags.hpp"
#include "cli/trace_diff.hpp"

namespace relayout::cli {

inline int relayout_command(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  CLI::App app{"relayout: parallel layouts for DP-attention / EP-MoE inference engines"};
  app.require_subcommand(1);

  LayoutFlags flags;
  std::string format = "text";
  int rank = -1;
  CLI::App* explain = app.add_subcommand("explain", "explain a layout given SGLang-style flags");
  flags.add_to(*explain);
  explain->add_option("--rank", rank, "focus one rank of the domain");
  explain->add_option("--format", format, "text, json or dot")
      ->check(CLI::IsMember({"text", "json", "dot"}));

  // trace diff BASELINE CANDIDATE: first divergence of two row-ownership traces (trace_diff.hpp).
  CLI::App* trace = app.add_subcommand("trace", "row-ownership traces written with --trace DIR");
  trace->require_subcommand(1);
  CLI::App* diff = trace->add_subcommand(
      "diff", "first boundary where CANDIDATE's rows diverge from BASELINE's (exit 0 agree, 1 diverge, 2 unreadable)");
  std::string baseline, candidate;
  DiffOptions diff_opts;
  diff->add_option("BASELINE", baseline, "trace directory of the trusted run (e.g. one rank)")->required();
  diff->add_option("CANDIDATE", candidate, "trace directory of the layout under test")->required();
  diff->add_option("--rtol", diff_opts.tolerance.rtol, "relative checksum tolerance (see relayout/trace/record.hpp)");
  diff->add_option("--atol", diff_opts.tolerance.atol, "absolute checksum tolerance");

  return run_main(app, argc, argv, out, err, [&] {
    if (diff->parsed()) return trace_diff(baseline, candidate, diff_opts, out, err);
    const RuntimeLayout layout = flags.layout();
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
