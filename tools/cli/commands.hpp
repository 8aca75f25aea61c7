// The `relayout` command line as a function of (argv, out, err) -> exit code, shared by main() and
// the fuzz target. Subcommands: explain.
#pragma once

#include <optional>
#include <ostream>
#include <string>

#include "cli/explain.hpp"
#include "cli/layout_flags.hpp"

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

  return run_main(app, argc, argv, out, err, [&] {
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
