// A few helpers to write self-contained SVG (no Graphviz, no scripts, no external fonts or
// images): rectangles, text, a colour per index. Used by `relayout explain --format svg` and
// `relayout plan --format svg`.
#pragma once

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>

namespace relayout::cli::svg {

// Text content and attribute values with XML's five special characters escaped.
inline std::string escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += "&apos;"; break;
      default: o += c;
    }
  }
  return o;
}

inline std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", v);
  return b;
}

// A light colour for index i of n, evenly spread around the hue circle.
inline std::string colour(int i, int n, int lightness = 78) {
  const int hue = n > 0 ? int(360.0 * (i % n) / n) : 0;
  return "hsl(" + std::to_string(hue) + ",65%," + std::to_string(lightness) + "%)";
}

class Doc {
 public:
  Doc(double width, double height) : width_(width), height_(height) {}

  void rect(double x, double y, double w, double h, const std::string& fill, const std::string& cls = "",
            const std::string& title = "") {
    body_ << "<rect x=\"" << num(x) << "\" y=\"" << num(y) << "\" width=\"" << num(w) << "\" height=\"" << num(h)
          << "\" fill=\"" << fill << "\" stroke=\"#555\" stroke-width=\"0.5\"";
    if (!cls.empty()) body_ << " class=\"" << cls << "\"";
    if (title.empty()) {
      body_ << "/>\n";
    } else {
      body_ << "><title>" << escape(title) << "</title></rect>\n";
    }
  }
  // anchor: start, middle or end.
  void text(double x, double y, const std::string& s, int size = 11, const std::string& anchor = "start",
            const std::string& cls = "", const std::string& weight = "normal") {
    body_ << "<text x=\"" << num(x) << "\" y=\"" << num(y) << "\" font-size=\"" << size << "\" text-anchor=\"" << anchor
          << "\" font-weight=\"" << weight << "\"";
    if (!cls.empty()) body_ << " class=\"" << cls << "\"";
    body_ << ">" << escape(s) << "</text>\n";
  }
  void line(double x1, double y1, double x2, double y2, const std::string& stroke = "#999") {
    body_ << "<line x1=\"" << num(x1) << "\" y1=\"" << num(y1) << "\" x2=\"" << num(x2) << "\" y2=\"" << num(y2)
          << "\" stroke=\"" << stroke << "\" stroke-width=\"0.5\"/>\n";
  }
  void grow(double width, double height) {
    width_ = std::max(width_, width);
    height_ = std::max(height_, height);
  }
  std::string str() const {
    std::ostringstream o;
    o << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << num(width_) << "\" height=\"" << num(height_)
      << "\" viewBox=\"0 0 " << num(width_) << " " << num(height_)
      << "\" font-family=\"DejaVu Sans Mono, Menlo, Consolas, monospace\">\n"
      << "<rect x=\"0\" y=\"0\" width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      << body_.str() << "</svg>\n";
    return o.str();
  }

 private:
  double width_, height_;
  std::ostringstream body_;
};

}  // namespace relayout::cli::svg
