// Number flags read strictly, the same way in every program: integers are decimal ("010" is 10, as
// SGLang's argparse reads it; "0x10", "1e3", "" and out-of-range values are errors naming the flag
// and the range), floating-point values must be finite (nan, inf and 1e309 are errors), and a list
// like "5,3" has no empty item. CLI11's own conversion would read "010" as octal, wrap "-1" into an
// unsigned, read "" as 0 and drop the empty item of "5,,3".
#pragma once

#include <CLI/CLI.hpp>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

namespace relayout::cli {

// A number flag's value that breaks its rule: a CLI11 parse error, so it is reported like the other
// flag errors (exit 2, "Run with --help").
inline CLI::ConversionError number_error(const std::string& flag, const std::string& text, const std::string& rule) {
  return CLI::ConversionError(text.empty() ? flag + ": empty value; " + rule
                                           : flag + " = " + text + ": " + rule);
}

template <class T>
std::string int_range(T lo, T hi) {
  return "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
}

// Decimal integer in [lo, hi]; an optional sign, then digits only.
template <class T>
T parse_int(const std::string& flag, const std::string& text, T lo = std::numeric_limits<T>::min(),
            T hi = std::numeric_limits<T>::max()) {
  const std::string rule = "expected a decimal integer in " + int_range(lo, hi);
  const char* b = text.data();
  const char* e = b + text.size();
  const bool plus = b != e && *b == '+';
  if (plus) ++b;
  const bool negative = !plus && b != e && *b == '-';
  if (b == e || (negative && b + 1 == e)) throw number_error(flag, text, rule);
  for (const char* p = negative ? b + 1 : b; p != e; ++p)
    if (*p < '0' || *p > '9') throw number_error(flag, text, rule);
  // Wide enough for any T: a value that does not fit in 128 bits is out of range anyway.
  if (negative) {
    std::int64_t v = 0;
    const auto r = std::from_chars(b, e, v, 10);
    if (r.ec != std::errc() || r.ptr != e || std::numeric_limits<T>::min() == 0 || v < std::int64_t(lo))
      throw number_error(flag, text, "out of range: " + rule);
    return static_cast<T>(v);
  }
  std::uint64_t v = 0;
  const auto r = std::from_chars(b, e, v, 10);
  if (r.ec != std::errc() || r.ptr != e || v > static_cast<std::uint64_t>(hi) ||
      (lo > 0 && v < static_cast<std::uint64_t>(lo)))
    throw number_error(flag, text, "out of range: " + rule);
  return static_cast<T>(v);
}

// A finite double in [lo, hi] (infinite bounds: no bound on that side).
inline double parse_finite(const std::string& flag, const std::string& text,
                           double lo = -std::numeric_limits<double>::infinity(),
                           double hi = std::numeric_limits<double>::infinity()) {
  char low[32], high[32];
  std::snprintf(low, sizeof low, "%g", lo);
  std::snprintf(high, sizeof high, "%g", hi);
  const std::string rule = std::isinf(lo) && std::isinf(hi) ? "expected a finite number"
                           : std::isinf(hi) ? "expected a finite number >= " + std::string(low)
                                            : "expected a finite number in [" + std::string(low) + ", " + high + "]";
  if (text.empty() || std::isspace(static_cast<unsigned char>(text.front()))) throw number_error(flag, text, rule);
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size()) throw number_error(flag, text, rule);
  if (!std::isfinite(v) || errno == ERANGE) throw number_error(flag, text, "not finite or out of range: " + rule);
  if (v < lo || v > hi) throw number_error(flag, text, rule);
  return v;
}

// "5,3,4": decimal integers in [lo, hi], no empty item. Several words ("5 3") are items too.
template <class T>
std::vector<T> parse_int_list(const std::string& flag, const std::vector<std::string>& words, T lo, T hi) {
  std::vector<T> out;
  for (const std::string& w : words) {
    std::size_t start = 0;
    while (true) {
      const std::size_t comma = w.find(',', start);
      const std::string item = w.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      if (item.empty())
        throw CLI::ConversionError(flag + " = " + w + ": empty item in the list; expected decimal integers separated by commas, e.g. 5,3,4");
      out.push_back(parse_int<T>(flag, item, lo, hi));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  return out;
}

// Registration helpers: the option takes a string and the rule above fills `target`.
template <class T>
CLI::Option* add_int(CLI::App& app, const std::string& names, T& target, const std::string& help,
                     T lo = std::numeric_limits<T>::min(), T hi = std::numeric_limits<T>::max()) {
  CLI::Option* opt = app.add_option_function<std::string>(
      names, [&target, names, lo, hi](const std::string& text) {
        target = parse_int<T>(names.substr(0, names.find(',')), text, lo, hi);
      },
      help);
  return opt->type_name("INT");
}

inline CLI::Option* add_float(CLI::App& app, const std::string& names, double& target, const std::string& help,
                              double lo = -std::numeric_limits<double>::infinity(),
                              double hi = std::numeric_limits<double>::infinity()) {
  CLI::Option* opt = app.add_option_function<std::string>(
      names, [&target, names, lo, hi](const std::string& text) {
        target = parse_finite(names.substr(0, names.find(',')), text, lo, hi);
      },
      help);
  return opt->type_name("FLOAT");
}

// A tolerance a check accepts: a finite number >= 0 (the rule add_float states) and at most `max`,
// since a larger one makes the check pass whatever it compares (`why` says so in the error).
inline CLI::Option* add_tolerance(CLI::App& app, const std::string& names, double& target, const std::string& help,
                                  double max, const std::string& why) {
  CLI::Option* opt = app.add_option_function<std::string>(
      names, [&target, names, max, why](const std::string& text) {
        const std::string flag = names.substr(0, names.find(','));
        const double v = parse_finite(flag, text, 0.0);
        if (v > max) {
          char m[32];
          std::snprintf(m, sizeof m, "%g", max);
          throw number_error(flag, text, "above " + std::string(m) + ": " + why + "; expected a finite number in [0, " + m + "]");
        }
        target = v;
      },
      help);
  return opt->type_name("FLOAT");
}

template <class T>
CLI::Option* add_int_list(CLI::App& app, const std::string& names, std::vector<T>& target, const std::string& help,
                          T lo = std::numeric_limits<T>::min(), T hi = std::numeric_limits<T>::max()) {
  CLI::Option* opt = app.add_option_function<std::vector<std::string>>(
      names, [&target, names, lo, hi](const std::vector<std::string>& words) {
        target = parse_int_list<T>(names.substr(0, names.find(',')), words, lo, hi);
      },
      help);
  return opt->type_name("INT,...");
}

// A path flag (--trace DIR): an empty value is an error, not "no path" (it would silently do nothing).
inline CLI::Option* add_path(CLI::App& app, const std::string& names, std::string& target, const std::string& help,
                             const char* what = "DIR") {
  CLI::Option* opt = app.add_option_function<std::string>(
      names, [&target, names, what](const std::string& text) {
        if (text.empty())
          throw CLI::ConversionError(names.substr(0, names.find(',')) + ": empty value; expected a " +
                                     (std::string(what) == "DIR" ? "directory" : what) + " (leave the flag out for none)");
        target = text;
      },
      help);
  return opt->type_name(what);
}

}  // namespace relayout::cli
