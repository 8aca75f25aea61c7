// relayout: command-line tool. `relayout explain` prints a DeepSeek-V4 parallel layout: the widths,
// every rank's coordinates, the groups, the Attention->MoE bridge path and the DSpark verdict.
#include <iostream>

#include "cli/commands.hpp"

int main(int argc, char** argv) {
  return relayout::cli::relayout_command(argc, argv, std::cout, std::cerr);
}
