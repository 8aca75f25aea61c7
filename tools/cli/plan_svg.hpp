// `relayout plan --format svg`: one layout's bytes per rank per collective as stacked bars, and a
// ranking's predicted time per layout (communication and compute) as bars. Self-contained SVG.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "cli/plan_rank.hpp"
#include "cli/plan_time.hpp"
#include "cli/svg.hpp"

namespace relayout::cli {

inline std::string plan_svg(const LayerPlan& p, const Cluster& c) {
  constexpr int kMaxRanks = 64;
  constexpr double left = 70, bar_h = 18, chart_w = 640, legend_w = 330;
  const Widths& w = p.layout.widths();
  // The collectives any rank runs, in the JSON's order: one colour each.
  std::vector<std::size_t> slots;
  for (std::size_t s = 0; s < kPlanSlots; ++s)
    for (const RankPlan& r : p.ranks)
      if (r.calls[s] > 0) {
        slots.push_back(s);
        break;
      }
  double most = 1;
  for (const RankPlan& r : p.ranks) most = std::max(most, r.total_bytes());
  const int ranks = std::min(int(p.ranks.size()), kMaxRanks);
  svg::Doc d(left + chart_w + legend_w, 120 + ranks * bar_h + 60);
  d.text(12, 22, "relayout plan: bytes per rank per collective, one forward (" + std::to_string(p.dims.layers) + " layers)", 13,
         "start", "title", "bold");
  d.text(12, 40, "tp " + std::to_string(w.tp) + "; attention dp x tp = " + std::to_string(w.attn_dp) + " x " +
                     std::to_string(w.attn_tp) + "; MoE dp x ep x tp = " + std::to_string(w.moe_dp) + " x " +
                     std::to_string(w.moe_ep) + " x " + std::to_string(w.moe_tp) + "; bridge " +
                     std::string(to_string(p.path)) + "; predicted forward " + ms_text(forward_time(p, c).total()),
         11, "start", "note");
  const double top = 60;
  for (int i = 0; i < ranks; ++i) {
    const RankPlan& r = p.ranks[std::size_t(i)];
    const double y = top + i * bar_h;
    d.text(left - 8, y + 13, "rank " + std::to_string(i), 10, "end", "ranklabel");
    double x = left;
    for (std::size_t k = 0; k < slots.size(); ++k) {
      const std::size_t s = slots[k];
      if (r.bytes[s] <= 0) continue;
      const double width = chart_w * r.bytes[s] / most;
      const std::string name = std::string(kTrafficOpNames[s / TrafficLog::kGroups]) + "@" +
                               std::string(to_string(kAllGroupKinds[s % TrafficLog::kGroups]));
      d.rect(x, y, width, bar_h - 3, svg::colour(int(k), int(slots.size()), 65), "bar",
             "rank " + std::to_string(i) + ": " + name + " x" + std::to_string(r.calls[s]) + ", " + bytes_text(r.bytes[s]));
      x += width;
    }
    d.text(x + 4, y + 13, bytes_text(r.total_bytes()), 10, "start", "total");
  }
  double y = top + ranks * bar_h + 16;
  if (int(p.ranks.size()) > ranks) {
    d.text(12, y, "... " + std::to_string(p.ranks.size() - std::size_t(ranks)) + " more ranks", 10);
    y += 16;
  }
  d.line(left, top - 4, left, top + ranks * bar_h);
  // Legend: one swatch per collective.
  const double lx = left + chart_w + 90;
  d.text(lx, top + 4, "collective@group", 11, "start", "legendtitle", "bold");
  for (std::size_t k = 0; k < slots.size(); ++k) {
    const std::size_t op = slots[k] / TrafficLog::kGroups;
    const double ly = top + 12 + double(k) * 18;
    d.rect(lx, ly, 12, 12, svg::colour(int(k), int(slots.size()), 65), "swatch");
    d.text(lx + 18, ly + 10,
           std::string(kTrafficOpNames[op]) + "@" + std::string(to_string(kAllGroupKinds[slots[k] % TrafficLog::kGroups])) +
               (routing_dependent(TrafficOp(op)) ? " (expected)" : ""),
           10, "start", "legend");
    d.grow(0, ly + 30);
  }
  d.text(12, y + 4, "dispatch/combine: expected bytes under uniform routing; every other collective exact", 10, "start", "note");
  d.grow(0, y + 20);
  return d.str();
}

inline std::string ranking_svg(const Ranking& r, std::size_t top_n) {
  constexpr double bar_h = 20, chart_w = 420;
  const std::size_t n = top_n == 0 ? r.layouts.size() : std::min(top_n, r.layouts.size());
  // Each row's label: several all-to-all backends as the first named, the others counted (all in
  // the bars' titles); the bars start right of the longest (10 px monospace: about 6.1 px a character).
  std::vector<std::string> labels;
  std::size_t longest = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const RankedLayout& l = r.layouts[i];
    const std::string flags = l.backends.size() > 1 ? layout_flags(l.config, {l.backends.front()}) + " (or " +
                                                          std::to_string(l.backends.size() - 1) + " other backends)"
                                                    : l.flags;
    labels.push_back(std::to_string(i + 1) + ". " + flags +
                     (l.replicas > 1 ? " (" + std::to_string(l.replicas) + " replicas)" : ""));
    longest = std::max(longest, labels.back().size());
  }
  const double left = std::max(300.0, 24 + 6.1 * double(longest));
  double most = 0;
  for (std::size_t i = 0; i < n; ++i) most = std::max(most, r.layouts[i].time.total());
  if (most <= 0) most = 1;
  svg::Doc d(left + chart_w + 130, 100 + double(n) * bar_h + 40);
  d.text(12, 22, "relayout plan: predicted time per forward, layouts of " + std::to_string(r.gpus) + " GPUs", 13, "start",
         "title", "bold");
  d.text(12, 40, "bars: communication (blue) + compute (orange); pale: does not fit in --gpu-memory; "
                 "all-to-all backends of one layout share a bar (same bytes and time)", 11, "start", "note");
  const double top = 60;
  for (std::size_t i = 0; i < n; ++i) {
    const RankedLayout& l = r.layouts[i];
    const double y = top + double(i) * bar_h;
    d.text(left - 8, y + 14, labels[i], 10, "end", "layout");
    const double cw = chart_w * l.time.comm / most, pw = chart_w * l.time.compute / most;
    d.rect(left, y, cw, bar_h - 4, l.fits ? "hsl(210,60%,55%)" : "hsl(210,40%,85%)", "comm",
           l.flags + ": communication " + ms_text(l.time.comm));
    d.rect(left + cw, y, pw, bar_h - 4, l.fits ? "hsl(30,80%,60%)" : "hsl(30,50%,87%)", "compute",
           l.flags + ": compute " + ms_text(l.time.compute));
    d.text(left + cw + pw + 4, y + 13, ms_text(l.time.total()) + (l.fits ? "" : " (no fit)"), 10, "start", "time");
  }
  d.line(left, top - 4, left, top + double(n) * bar_h);
  double y = top + double(n) * bar_h + 16;
  if (n < r.layouts.size()) {
    d.text(12, y, "... " + std::to_string(r.layouts.size() - n) + " more layouts (--top 0 draws all)", 10);
    y += 16;
  }
  d.grow(0, y + 10);
  return d.str();
}

}  // namespace relayout::cli
