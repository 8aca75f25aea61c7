// relayout: command-line tool. `relayout explain` prints a DeepSeek-V4 parallel layout: the widths,
// every rank's coordinates, the groups, the Attention->MoE bridge path and the DSpark verdict.
#include <cstdio>
#include <iostream>
#include <optional>

#include "cli/explain.hpp"
#include "cli/layout_flags.hpp"

int main(int argc, char** argv) {
  CLI::App app{"relayout: parallel layouts for DP-attention / EP-MoE inference engines"};
  app.require_subcommand(1);

  relayout::cli::LayoutFlags flags;
  std::string format = "text";
  int rank = -1;
  CLI::App* explain = app.add_subcommand("explain", "explain a layout given SGLang-style flags");
  flags.add_to(*explain);
  explain->add_option("--rank", rank, "focus one rank of the domain");
  explain->add_option("--format", format, "text, json or dot")
      ->check(CLI::IsMember({"text", "json", "dot"}));

  return relayout::cli::run_main(app, argc, argv, [&] {
    const relayout::RuntimeLayout layout = flags.layout();
    std::optional<int> focus;
    if (explain->count("--rank")) focus = layout.coords(rank).rank;  // throws when out of range
    if (format == "json")
      std::cout << relayout::cli::explain_json(layout, focus).dump(2) << "\n";
    else if (format == "dot")
      std::cout << relayout::cli::explain_dot(layout);
    else
      std::cout << relayout::cli::explain_text(layout, focus);
    return 0;
  });
}
