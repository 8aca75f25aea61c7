// The pictures of `relayout explain --format svg` and `relayout plan --format svg`, parsed: each is
// well-formed XML (every tag closed in order, attributes quoted, text escaped) with one <svg> root,
// and holds the elements a layout implies, counted by hand from the layout.
#include <doctest/doctest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "cli/explain.hpp"
#include "cli/plan_svg.hpp"

using namespace relayout;

namespace {

struct Element {
  std::string name;
  std::map<std::string, std::string> attrs;
  std::string text;  // the text directly inside it
};

std::string unescape(std::string t) {
  for (const auto& [ent, c] : std::vector<std::pair<std::string, std::string>>{
           {"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""}, {"&apos;", "'"}, {"&amp;", "&"}})
    for (std::size_t a = t.find(ent); a != std::string::npos; a = t.find(ent, a + 1)) t.replace(a, ent.size(), c);
  return t;
}

// A strict little XML reader for what our SVG writer emits; fails the test on anything malformed.
std::vector<Element> parse(const std::string& s) {
  std::vector<Element> all;
  std::vector<std::size_t> open;  // indices into all
  std::size_t i = 0;
  if (s.rfind("<?xml", 0) == 0) i = s.find("?>") + 2;
  int roots = 0;
  while (i < s.size()) {
    if (s[i] != '<') {
      const std::size_t end = s.find('<', i);
      const std::string text = s.substr(i, end == std::string::npos ? std::string::npos : end - i);
      for (std::size_t a = text.find('&'); a != std::string::npos; a = text.find('&', a + 1)) {
        const std::string ent = text.substr(a, text.find(';', a) - a + 1);
        REQUIRE((ent == "&amp;" || ent == "&lt;" || ent == "&gt;" || ent == "&quot;" || ent == "&apos;"));
      }
      if (!open.empty()) all[open.back()].text += unescape(text);
      else REQUIRE(text.find_first_not_of(" \n") == std::string::npos);
      i = end == std::string::npos ? s.size() : end;
      continue;
    }
    const std::size_t close = s.find('>', i);
    REQUIRE(close != std::string::npos);
    std::string tag = s.substr(i + 1, close - i - 1);
    i = close + 1;
    if (tag[0] == '/') {
      REQUIRE(!open.empty());
      REQUIRE(all[open.back()].name == tag.substr(1));
      open.pop_back();
      continue;
    }
    const bool self = tag.back() == '/';
    if (self) tag.pop_back();
    Element e;
    std::size_t p = tag.find_first_of(" \n");
    e.name = tag.substr(0, p);
    while (p != std::string::npos && p < tag.size()) {
      p = tag.find_first_not_of(" \n", p);
      if (p == std::string::npos) break;
      const std::size_t eq = tag.find('=', p);
      REQUIRE(eq != std::string::npos);
      REQUIRE(tag[eq + 1] == '"');
      const std::size_t q = tag.find('"', eq + 2);
      REQUIRE(q != std::string::npos);
      const std::string key = tag.substr(p, eq - p);
      REQUIRE(e.attrs.count(key) == 0);
      e.attrs[key] = tag.substr(eq + 2, q - eq - 2);
      p = q + 1;
    }
    if (open.empty()) {
      ++roots;
      REQUIRE(e.name == "svg");
    }
    all.push_back(e);
    if (!self) open.push_back(all.size() - 1);
  }
  REQUIRE(open.empty());
  REQUIRE(roots == 1);
  return all;
}

std::size_t count_class(const std::vector<Element>& els, const std::string& cls) {
  std::size_t n = 0;
  for (const Element& e : els) n += e.attrs.count("class") && e.attrs.at("class") == cls;
  return n;
}

std::set<std::string> texts(const std::vector<Element>& els) {
  std::set<std::string> t;
  for (const Element& e : els)
    if (e.name == "text") t.insert(e.text);
  return t;
}

}  // namespace

TEST_CASE("svg: explain draws both rank grids and the bridge strip of path a2a_split") {
  // tp 8, 4 attention-DP groups of 2, deepep: moe_ep = 8. Path a2a_split has 7 plan steps.
  const RuntimeLayout l({.tp = 8, .dp = 4, .enable_dp_attention = true, .moe_a2a_backend = Backend::deepep});
  const auto els = parse(cli::explain_svg(l));
  CHECK(count_class(els, "rank") == 16);         // 8 ranks in attention order, 8 in MoE order
  CHECK(count_class(els, "held") == 8 * (1 + 7));  // the attention column and 7 steps per rank
  std::set<std::string> fills;
  for (const Element& e : els)
    if (e.attrs.count("class") && e.attrs.at("class") == "rank") fills.insert(e.attrs.at("fill"));
  CHECK(fills.size() == 4);  // coloured by attention-DP group
  const auto t = texts(els);
  for (const char* s : {"r0", "r7", "split_rows", "dispatch", "combine", "all_gather", "all_to_allv@moe_ep",
                        "all_gather@attn_tp", "all_reduce@attn_tp", "g3 2/2", "ep 5's experts"})
    CHECK_MESSAGE(t.count(s) == 1, std::string(s));
}

TEST_CASE("svg: explain of path dp_gather names its collectives") {
  const RuntimeLayout l({.tp = 4, .dp = 2, .enable_dp_attention = true});
  const auto els = parse(cli::explain_svg(l));
  CHECK(count_class(els, "rank") == 8);
  CHECK(count_class(els, "held") == 4 * (1 + 4));  // dp_gather, route, experts, reduce_scatterv
  const auto t = texts(els);
  CHECK(t.count("all_gatherv@tp") == 1);
  CHECK(t.count("reduce_scatterv@tp") == 1);
  CHECK(t.count("all groups") == 1);
}

TEST_CASE("svg: explain under attention CP names each rank's CP share and the KV all-gather") {
  // tp 8 = 2 DP groups x 2 CP ranks x 2 TP ranks: rank 2 is group 0, CP rank 1, TP rank 0.
  const RuntimeLayout l({.tp = 8, .dp = 2, .cp = 2, .enable_dp_attention = true, .moe_a2a_backend = Backend::deepep});
  const auto t = texts(parse(cli::explain_svg(l)));
  CHECK(t.count("all_gatherv@attn_cp (KV)") == 1);
  CHECK(t.count("g0 cp 2/2 1/2") == 1);
  CHECK(t.count("dp 1 cp 1") == 1);
}

TEST_CASE("svg: plan's bars, one per rank and collective; the ranking's, one per layout") {
  // tp_moe at tp 4 with ep 2: every rank runs the counts all-gather over tp, the attention
  // all-reduce over attn_tp and the MoE all-reduce over tp: 3 bars per rank, 3 legend entries.
  cli::PlanInput in;
  const cli::LayerPlan p = cli::plan_layer(RuntimeLayout({.tp = 4, .ep = 2}), in);
  const auto els = parse(cli::plan_svg(p, cli::Cluster{}));
  CHECK(count_class(els, "bar") == 12);
  CHECK(count_class(els, "swatch") == 3);
  const auto t = texts(els);
  CHECK(t.count("all_reduce@tp") == 1);
  CHECK(t.count("all_gather(counts)@tp") == 1);
  // The 53 layouts of 4 GPUs (test_plan: 39 of one stage, 14 of two): one communication and one
  // compute bar each.
  const cli::Ranking r = cli::rank_layouts(4, 512, 128, in, cli::Cluster{}, 1e12);
  const auto rels = parse(cli::ranking_svg(r, 0));
  CHECK(count_class(rels, "comm") == 53);
  CHECK(count_class(rels, "compute") == 53);
  CHECK(count_class(rels, "layout") == 53);
  // A row of all-to-all backends names the first and counts the others (10 at dp 4 = tp).
  int shared_rows = 0;
  for (const Element& e : rels)
    shared_rows += e.text.find("--tp 4 --dp 4 --enable-dp-attention --moe-a2a-backend deepep (or 9 other backends)") !=
                   std::string::npos;
  CHECK(shared_rows == 1);
  CHECK(parse(cli::ranking_svg(r, 5)).size() < rels.size());
}

TEST_CASE("svg: text is escaped") {
  CHECK(cli::svg::escape("a<b & \"c\"") == "a&lt;b &amp; &quot;c&quot;");
}
