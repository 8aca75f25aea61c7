// libFuzzer target: arbitrary command lines through `relayout` (argument parsing, the layout engine,
// every renderer). Whatever the input, the command must return 0, 1 or 2 without crashing, hanging
// or tripping a sanitizer. Tokens are separated by spaces or newlines.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> tokens{"relayout"};
  std::string current;
  for (std::size_t i = 0; i < size; ++i) {
    const char c = static_cast<char>(data[i]);
    if (c == ' ' || c == '\n') {
      if (!current.empty()) tokens.push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  if (!current.empty()) tokens.push_back(current);
  // Layouts wider than 4096 ranks are valid but slow to render in full; the unit sweep covers them.
  for (const std::string& t : tokens)
    if (t.size() > 4 && t.find_first_not_of("0123456789") == std::string::npos) return 0;
  std::vector<const char*> argv;
  for (const std::string& t : tokens) argv.push_back(t.c_str());
  std::ostringstream out, err;
  const int rc = relayout::cli::relayout_command(static_cast<int>(argv.size()), argv.data(), out, err);
  if (rc != 0 && rc != 1 && rc != 2) __builtin_trap();
  if (rc == 2 && err.str().empty()) __builtin_trap();  // a rejection always says why
  return 0;
}
