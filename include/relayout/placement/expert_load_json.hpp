// Expert loads as JSON text, {"experts": E, "loads": [E numbers]}: what an engine exports after a
// step (or summed over steps) and what the rebalancer and `relayout plan` read back; or one list per
// layer, {"experts": E, "layers": [[E numbers], ...]}. Written and parsed here, small and strict
// (each key once, no other key, one of "loads" and "layers"), so the library needs no JSON
// dependency; a malformed text is a LayoutError naming the source and the offset.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "relayout/mesh/error.hpp"

namespace relayout {

namespace impl {

inline std::string json_number(double v) {
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);  // shortest text that reads back as v
  return ec == std::errc() ? std::string(buf, end) : std::string("0");
}

class LoadJsonParser {
 public:
  LoadJsonParser(std::string_view text, std::string_view source) : s_(text), source_(source) {}

  // {"experts": E, "loads": [...]} only; expected_experts >= 0 also requires E == expected_experts.
  std::vector<double> parse(int expected_experts) {
    std::vector<std::vector<double>> layers = parse_object(false);
    check_experts(expected_experts);
    return std::move(layers.front());
  }
  // Either form: one list per layer ("loads" is one layer).
  std::vector<std::vector<double>> parse_layers(int expected_experts) {
    std::vector<std::vector<double>> layers = parse_object(true);
    check_experts(expected_experts);
    return layers;
  }

 private:
  // The object's keys, each once; returns the loads (one entry) or the layers' lists.
  std::vector<std::vector<double>> parse_object(bool layered) {
    layered_ = layered;
    bool have_loads = false, have_layers = false;
    std::vector<std::vector<double>> lists;
    expect('{');
    for (bool first = true;; first = false) {
      ws();
      if (first && peek() == '}') break;
      const std::string key = string();
      expect(':');
      if (key == "experts") {
        if (experts_ >= 0) fail("\"experts\" appears twice");
        const double v = number();
        if (v < 1 || v != std::floor(v) || v > (1 << 30)) fail("\"experts\" must be a whole number >= 1");
        experts_ = static_cast<long long>(v);
      } else if (key == "loads" || (layered && key == "layers")) {
        bool& seen = key == "loads" ? have_loads : have_layers;
        if (seen) fail("\"" + key + "\" appears twice");
        seen = true;
        if (have_loads && have_layers) fail("both \"loads\" and \"layers\": give one of them");
        if (key == "loads") lists = {array()};
        else lists = layer_arrays();
      } else {
        fail("unknown key \"" + key + "\" (expected \"experts\" and " +
             (layered ? "one of \"loads\" and \"layers\")" : "\"loads\")"));
      }
      ws();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect('}');
      break;
    }
    ws();
    if (pos_ != s_.size()) fail("text after the closing brace");
    if (experts_ < 0) fail("no \"experts\"");
    if (!have_loads && !have_layers) fail(layered ? "no \"loads\" or \"layers\"" : "no \"loads\"");
    check_lists(lists, have_layers);
    return lists;
  }

  // Every list holds "experts" numbers whose sum is finite (so every ratio of them is).
  void check_lists(const std::vector<std::vector<double>>& lists, bool layers) const {
    for (std::size_t l = 0; l < lists.size(); ++l) {
      const std::string which = layers ? "\"layers\"[" + std::to_string(l) + "]" : std::string("\"loads\"");
      if (static_cast<long long>(lists[l].size()) != experts_)
        fail(which + " holds " + std::to_string(lists[l].size()) + " numbers for \"experts\": " + std::to_string(experts_));
      double sum = 0;
      for (double x : lists[l]) sum += x;
      if (!std::isfinite(sum))
        fail(which + ": the loads sum to more than the largest finite number (1.8e308); a list's loads must have "
                     "a finite sum");
    }
  }

  void check_experts(int expected_experts) const {
    if (expected_experts >= 0 && experts_ != expected_experts)
      throw LayoutError("expert_load", std::string(source_) + ": the loads are for " + std::to_string(experts_) +
                                           " experts; the model has " + std::to_string(expected_experts) +
                                           " routed experts");
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw LayoutError("expert_load", std::string(source_) + ": " + what + " (at offset " + std::to_string(pos_) +
                                         "); expected {\"experts\": E, \"loads\": [E numbers >= 0]}" +
                                         (layered_ ? " or {\"experts\": E, \"layers\": [[E numbers >= 0], ...]}" : ""));
  }
  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  void ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  void expect(char c) {
    ws();
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  std::string string() {
    expect('"');
    const std::size_t start = pos_;
    while (pos_ < s_.size() && s_[pos_] != '"') {
      if (s_[pos_] == '\\') fail("escapes are not used in this format");
      ++pos_;
    }
    if (pos_ == s_.size()) fail("unterminated string");
    return std::string(s_.substr(start, pos_++ - start));
  }
  double number() {
    ws();
    std::size_t end = pos_;
    while (end < s_.size() && std::string_view("0123456789+-.eE").find(s_[end]) != std::string_view::npos) ++end;
    double v = 0;
    const auto [ptr, ec] = std::from_chars(s_.data() + pos_, s_.data() + end, v);
    if (end == pos_ || ec != std::errc() || ptr != s_.data() + end) fail("expected a number");
    if (!(v >= 0) || !std::isfinite(v)) fail("a load must be a finite number >= 0");
    pos_ = end;
    return v;
  }
  std::vector<double> array() {
    std::vector<double> out;
    expect('[');
    ws();
    if (peek() == ']') {
      ++pos_;
      return out;
    }
    for (;;) {
      out.push_back(number());
      ws();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect(']');
      return out;
    }
  }

  std::vector<std::vector<double>> layer_arrays() {
    std::vector<std::vector<double>> out;
    expect('[');
    ws();
    if (peek() == ']') fail("\"layers\" must hold at least one list");
    for (;;) {
      out.push_back(array());
      ws();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect(']');
      return out;
    }
  }

  std::string_view s_, source_;
  std::size_t pos_ = 0;
  long long experts_ = -1;
  bool layered_ = false;
};

}  // namespace impl

// {"experts": 4, "loads": [10, 3, 0, 7]}
template <class T>
std::string expert_load_json(std::span<const T> loads) {
  std::string out = "{\"experts\": " + std::to_string(loads.size()) + ", \"loads\": [";
  for (std::size_t e = 0; e < loads.size(); ++e) out += (e ? ", " : "") + impl::json_number(static_cast<double>(loads[e]));
  return out + "]}\n";
}
inline std::string expert_load_json(const std::vector<double>& loads) { return expert_load_json(std::span<const double>(loads)); }
inline std::string expert_load_json(const std::vector<std::int64_t>& loads) {
  return expert_load_json(std::span<const std::int64_t>(loads));
}

// The loads of a text written as above; expected_experts >= 0 also requires that many experts.
// source names the text in errors (a file name, a flag).
inline std::vector<double> parse_expert_load_json(std::string_view text, int expected_experts = -1,
                                                  std::string_view source = "expert load") {
  return impl::LoadJsonParser(text, source).parse(expected_experts);
}

// The loads of either form, one list per layer ({"experts", "loads"} is one layer).
inline std::vector<std::vector<double>> parse_expert_load_layers_json(std::string_view text, int expected_experts = -1,
                                                                      std::string_view source = "expert load") {
  return impl::LoadJsonParser(text, source).parse_layers(expected_experts);
}

}  // namespace relayout
