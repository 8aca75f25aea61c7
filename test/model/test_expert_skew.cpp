// dsv4_layer --expert-skew with --ep-num-redundant-experts on MPI ranks (mpiexec): the tokens per
// moe_ep member it reports before rebalancing (static placement) and after (the rebalanced map, a
// second forward) equal those predicted here from the routing rule alone (each token's Zipf draw by
// its owner id, the replica of by_token by its index in its DP group), both forwards pass --check,
// the rebalanced balance is no worse than the static one, and the goal config (Zipf 1.2, 64
// experts, top-8, ep 8, 8 redundant) ends at max/mean <= 1.15.
#include <doctest/doctest.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "demo_model/workload.hpp"
#include "relayout/placement/expert_location.hpp"
#include "relayout/placement/zipf_routing.hpp"

#include "tolerance.hpp"

using relayout::test::within_abs;
using relayout::test::within_rel;

using namespace relayout;

namespace {

struct Case {
  int np, dp, experts, topk, redundant;
  double skew;
  std::string flags;  // the layout beside --tp np --dp dp --enable-dp-attention
  int requests, length;
};

nlohmann::json run(const Case& c) {
  std::string lengths;
  for (int i = 0; i < c.requests; ++i) lengths += (i ? "," : "") + std::to_string(c.length);
  const std::string command = std::string(RELAYOUT_MPIEXEC) + " -n " + std::to_string(c.np) + " " + RELAYOUT_DSV4_LAYER +
                              " --tp " + std::to_string(c.np) + " --dp " + std::to_string(c.dp) +
                              " --enable-dp-attention " + c.flags + " --experts " + std::to_string(c.experts) +
                              " --topk " + std::to_string(c.topk) + " --ep-num-redundant-experts " +
                              std::to_string(c.redundant) + " --expert-skew " + std::to_string(c.skew) +
                              " --hidden 16 --heads 2 --head-dim 4 --q-lora 8 --moe-inter 8 --shared-inter 8 "
                              "--layers 1 --check --format json --requests " + lengths;
  std::string out;
  FILE* f = popen((command + " 2>/dev/null").c_str(), "r");
  REQUIRE(f != nullptr);
  char buf[4096];
  while (std::size_t n = fread(buf, 1, sizeof buf, f)) out.append(buf, n);
  const int rc = pclose(f);
  INFO(command);
  INFO(out.substr(0, 2000));
  REQUIRE(rc == 0);
  return nlohmann::json::parse(out);
}

// Tokens per moe_ep member for the map: every DP group's rows in order, each token's top-k drawn by
// its owner id (seed 1234, the demo's default), each logical expert's replica chosen by_token with
// the row's index in its group.
std::vector<std::int64_t> predicted(const Case& c, const ExpertLocation& loc) {
  std::vector<int> lengths(static_cast<std::size_t>(c.requests), c.length);
  const model::Workload work = model::Workload::make(lengths, {}, c.dp);
  const ZipfRouting z{.experts = c.experts, .top_k = c.topk, .s = c.skew, .seed = 1234, .shuffle = true};
  std::vector<std::int64_t> members(static_cast<std::size_t>(loc.ep()), 0);
  for (int g = 0; g < c.dp; ++g) {
    const std::vector<std::int64_t> owners = work.owners_of(g);
    Kokkos::View<int**, Kokkos::LayoutRight, Kokkos::HostSpace> ids("ids", owners.size(), std::size_t(c.topk));
    Kokkos::View<const std::int64_t*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> tok(owners.data(),
                                                                                                     owners.size());
    zipf_topk_ids(Kokkos::DefaultHostExecutionSpace(), z, tok, ids);
    for (std::size_t i = 0; i < owners.size(); ++i)
      for (int j = 0; j < c.topk; ++j)
        ++members[std::size_t(loc.rank_of(loc.choose(ids(i, j), std::int64_t(i), 0, ReplicaChoice::by_token)))];
  }
  return members;
}

void check_case(const Case& c, double after_bound) {
  const nlohmann::json j = run(c);
  CHECK(j.at("passed").get<bool>());
  const nlohmann::json& b = j.at("expert_balance");
  CHECK(b.at("check").at("passed").get<bool>());
  CHECK(b.at("check").at("rows").get<std::int64_t>() == std::int64_t(c.requests) * c.length);
  const int ep = b.at("moe_ep").get<int>();
  const ExpertLocation statics = ExpertLocation::identity(c.experts, c.redundant, ep);
  const ExpertLocation rebalanced =
      ExpertLocation::from_map(c.experts, ep, b.at("rebalanced_map").get<std::vector<int>>());
  const auto before = b.at("before").at("tokens_per_rank").get<std::vector<std::int64_t>>();
  const auto after = b.at("after").at("tokens_per_rank").get<std::vector<std::int64_t>>();
  CHECK(before == predicted(c, statics));
  CHECK(after == predicted(c, rebalanced));
  const std::int64_t pairs = std::int64_t(c.requests) * c.length * c.topk;
  CHECK(std::accumulate(before.begin(), before.end(), std::int64_t(0)) == pairs);
  CHECK(std::accumulate(after.begin(), after.end(), std::int64_t(0)) == pairs);
  const double mb = b.at("before").at("max_over_mean").get<double>(), ma = b.at("after").at("max_over_mean").get<double>();
  CHECK(mb == within_rel(max_over_mean(before), 1e-9));
  CHECK(ma == within_rel(max_over_mean(after), 1e-9));
  CHECK(b.at("after").at("max").get<std::int64_t>() == *std::max_element(after.begin(), after.end()));
  CHECK(b.at("after").at("mean").get<double>() == within_rel(double(pairs) / ep, 1e-9));
  MESSAGE("max/mean tokens per member: static " << mb << ", rebalanced " << ma);
  CHECK(ma <= mb);
  CHECK(ma <= after_bound);
}

}  // namespace

// The goal: 8192 tokens (1024 per member), one forward to measure, one on the rebalanced map.
TEST_CASE("expert skew: Zipf 1.2, 64 experts, top-8, ep 8, 8 redundant: rebalanced max/mean <= 1.15") {
  check_case({.np = 8, .dp = 8, .experts = 64, .topk = 8, .redundant = 8, .skew = 1.2,
              .flags = "--moe-a2a-backend deepep", .requests = 64, .length = 128},
             1.15);
}

// Path a2a_split (attn_tp 2: a rank routes its chunk of its group's rows, by_token's index is the
// chunk's offset plus the row), 16 experts top-4 over ep 4 with 4 redundant, 2048 tokens. The
// rebalanced map is measured on the tokens it was fitted to, so only the split of each expert's
// tokens over its replicas by token index and the packing remain: 1.15 holds here too.
TEST_CASE("expert skew: a2a_split, 16 experts, top-4, ep 4, 4 redundant") {
  check_case({.np = 4, .dp = 2, .experts = 16, .topk = 4, .redundant = 4, .skew = 1.0,
              .flags = "--moe-a2a-backend deepep", .requests = 16, .length = 128},
             1.15);
}
