// The programs' files, through io/files.hpp: an input a flag names is read under its format's rule,
// an output a flag names is checked before the work and replaced whole after it. Every refusal or
// failure is a LayoutError naming the flag, the path and the rule (exit 2).
#pragma once

#include <string>
#include <string_view>

#include "relayout/io/files.hpp"
#include "relayout/mesh/error.hpp"

namespace relayout::cli {

// The whole of the file `flag` names, at most rule.max_bytes; throws LayoutError(flag).
inline std::string read_input_flag(const std::string& flag, const std::string& path, const io::InputRule& rule) {
  try {
    return io::read_input(path, rule);
  } catch (const io::FileError& e) {
    throw LayoutError(flag, flag + " " + e.what());
  }
}

// Whether the file `flag` names can take the output (io::check_output); throws LayoutError(flag).
inline void check_output_flag(const std::string& flag, const std::string& path) {
  try {
    io::check_output(path);
  } catch (const io::FileError& e) {
    throw LayoutError(flag, flag + " " + e.what());
  }
}

// Replaces the file `flag` names by `text` (io::write_output); throws LayoutError(flag), the file
// as it was.
inline void write_output_flag(const std::string& flag, const std::string& path, std::string_view text) {
  try {
    io::write_output(path, text);
  } catch (const io::FileError& e) {
    throw LayoutError(flag, flag + " " + e.what() + "; nothing was written");
  }
}

}  // namespace relayout::cli
