// The whole world: (replica, pp, tp) coordinates of every world rank and every group, against the
// group loops of SGLang's parallel_state.py initialize_model_parallel restated plainly below (one
// replica's world is tp * pp ranks; replicas are separate worlds, numbered one after another as
// data_parallel_controller.py hands each a block of tp * pp GPUs).
#include <doctest/doctest.h>

#include <algorithm>
#include <relayout/mesh.hpp>
#include <vector>

using namespace relayout;

namespace {

using Groups = std::vector<std::vector<int>>;

// initialize_model_parallel's loops for one replica world of tp * pp ranks, shifted by `base`.
struct SglangGroups {
  Groups tp, pp, attn_tp, attn_cp, moe_ep, moe_tp, moe_dp, dcp;
};

SglangGroups sglang_groups(const Widths& w, int pp, int base) {
  const int world = w.tp * pp;
  const int n_tp = world / w.tp;
  SglangGroups g;
  const auto range = [&](int st, int en, int step) {
    std::vector<int> r;
    for (int i = st; i < en; i += step) r.push_back(base + i);
    return r;
  };
  for (int t = 0; t < n_tp; ++t) g.tp.push_back(range(t * w.tp, (t + 1) * w.tp, 1));
  const int n_pp = world / pp;
  for (int i = 0; i < n_pp; ++i) g.pp.push_back(range(i, world, n_pp));
  for (int t = 0; t < n_tp; ++t) {
    const int o = t * w.tp;
    for (int d = 0; d < w.attn_dp; ++d)
      for (int a = 0; a < w.attn_tp; ++a)
        g.attn_cp.push_back(range(o + d * w.attn_tp * w.attn_cp + a, o + (d + 1) * w.attn_tp * w.attn_cp + a, w.attn_tp));
    for (int i = 0; i < w.attn_cp * w.attn_dp; ++i)
      g.attn_tp.push_back(range(o + i * w.attn_tp, o + (i + 1) * w.attn_tp, 1));
    for (int d = 0; d < w.moe_dp; ++d)
      for (int m = 0; m < w.moe_tp; ++m) {
        const int st = o + d * w.moe_ep * w.moe_tp + m;
        g.moe_ep.push_back(range(st, st + w.moe_ep * w.moe_tp, w.moe_tp));
      }
    for (int i = 0; i < w.moe_ep * w.moe_dp; ++i)
      g.moe_tp.push_back(range(o + i * w.moe_tp, o + (i + 1) * w.moe_tp, 1));
    for (int i = 0; i < w.moe_tp * w.moe_ep; ++i)
      g.moe_dp.push_back(range(o + i, o + w.tp + i, w.moe_tp * w.moe_ep));
    for (int s = 0; s < w.tp; s += w.dcp) g.dcp.push_back(range(o + s, o + s + w.dcp, 1));
  }
  if (w.attn_cp > w.moe_dp) g.moe_dp = g.attn_cp;  // the MoE-DP group is the attention-CP group
  return g;
}

Groups sorted(Groups g) {
  std::sort(g.begin(), g.end());
  return g;
}

}  // namespace

TEST_CASE("world: tp 2 x pp 2 on 4 ranks") {
  LayoutConfig c{.tp = 2};
  c.pp = 2;
  const WorldLayout w(c);
  CHECK(w.size() == 4);
  CHECK(w.groups(GroupKind::pp) == Groups{{0, 2}, {1, 3}});
  CHECK(w.groups(GroupKind::tp) == Groups{{0, 1}, {2, 3}});
  const WorldCoords k = w.coords(3);
  CHECK(k.pp_rank == 1);
  CHECK(k.replica == 0);
  CHECK(k.domain.rank == 1);
  CHECK(w.group_index(GroupKind::pp, 3) == 1);
  CHECK(w.group_rank(GroupKind::pp, 3) == 1);
  CHECK(w.domain_index(2) == 1);
  CHECK_THROWS_AS(w.coords(4), LayoutError);
}

TEST_CASE("world: native DP replicas are the slowest axis, then pp, then tp") {
  LayoutConfig c{.tp = 2, .dp = 2};  // DP attention off: 2 replicas
  c.pp = 2;
  const WorldLayout w(c);
  CHECK(w.replicas() == 2);
  CHECK(w.size() == 8);
  std::vector<int> replica, stage, tp_rank;
  for (int r = 0; r < 8; ++r) {
    const WorldCoords k = w.coords(r);
    replica.push_back(k.replica);
    stage.push_back(k.pp_rank);
    tp_rank.push_back(k.domain.rank);
  }
  CHECK(replica == std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1});
  CHECK(stage == std::vector<int>{0, 0, 1, 1, 0, 0, 1, 1});
  CHECK(tp_rank == std::vector<int>{0, 1, 0, 1, 0, 1, 0, 1});
  // Pipeline groups never cross replicas.
  CHECK(w.groups(GroupKind::pp) == Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
  // With DP attention the same dp is inside the domain: one replica.
  LayoutConfig inside = c;
  inside.enable_dp_attention = true;
  CHECK(WorldLayout(inside).replicas() == 1);
  CHECK(WorldLayout(inside).size() == 4);
}

// What `relayout explain --tp 2 --dp 2 --pp-size 2 --rank 5` needs: world rank 5 is replica 1,
// stage 0, domain rank 1 (5 = (1 * 2 + 0) * 2 + 1), and back.
TEST_CASE("world: a world rank maps to (replica, pp, domain rank) and back") {
  LayoutConfig c{.tp = 2, .dp = 2};
  c.pp = 2;
  const WorldLayout w(c);
  const WorldCoords k = w.coords(5);
  CHECK(k.replica == 1);
  CHECK(k.pp_rank == 0);
  CHECK(k.domain.rank == 1);
  CHECK(w.domain_index(5) == 2);
  CHECK(w.world_rank(1, 0, 1) == 5);
  CHECK(w.world_rank(0, 1, 0) == 2);
  CHECK(w.world_rank(1, 1, 1) == 7);
  for (int r = 0; r < w.size(); ++r) {
    const WorldCoords q = w.coords(r);
    CHECK(w.world_rank(q.replica, q.pp_rank, q.domain.rank) == r);
  }
  CHECK_THROWS_WITH_AS(w.world_rank(2, 0, 0), "replica 2 is out of range [0, 2) (replicas = 2)", LayoutError);
  CHECK_THROWS_WITH_AS(w.world_rank(0, -1, 0), "pp_rank -1 is out of range [0, 2) (pp = 2)", LayoutError);
  CHECK_THROWS_WITH_AS(w.world_rank(0, 0, 2), "tp_rank 2 is out of range [0, 2) (tp = 2)", LayoutError);
  CHECK_THROWS_WITH_AS(w.coords(8), "world rank 8 is out of range [0, 8) (replicas x pp x tp = 2 x 2 x 2)",
                       LayoutError);
}

TEST_CASE("world: nodes hold consecutive blocks of tp * pp / nnodes ranks") {
  LayoutConfig c{.tp = 4};
  c.pp = 2;
  c.nnodes = 4;
  const WorldLayout w(c);
  CHECK(w.ranks_per_node() == 2);
  std::vector<int> nodes;
  for (int r = 0; r < w.size(); ++r) nodes.push_back(w.coords(r).node);
  CHECK(nodes == std::vector<int>{0, 0, 1, 1, 2, 2, 3, 3});
}

TEST_CASE("world: every group equals initialize_model_parallel's, member order included") {
  int worlds = 0;
  for (int tp : {1, 2, 4, 8})
    for (int pp : {1, 2, 3})
      for (int dp : {1, 2, 4})
        for (bool dpa : {false, true})
          for (Backend b : {Backend::none, Backend::deepep})
            for (int cp : {1, 2})
              for (int moe_dp : {1, 2})
                for (int dcp : {1, 2}) {
                  LayoutConfig c{.tp = tp, .dp = dp, .cp = cp, .moe_dp = moe_dp, .enable_dp_attention = dpa,
                                 .moe_a2a_backend = b};
                  c.pp = pp;
                  c.dcp = dcp;
                  if (derive_widths(c).rule != LayoutRule::ok) continue;
                  const WorldLayout w(c);
                  ++worlds;
                  CAPTURE(tp); CAPTURE(pp); CAPTURE(dp); CAPTURE(dpa); CAPTURE(cp); CAPTURE(moe_dp); CAPTURE(dcp);
                  SglangGroups want;
                  for (int replica = 0; replica < w.replicas(); ++replica) {
                    const SglangGroups one = sglang_groups(w.domain().widths(), pp, replica * tp * pp);
                    const auto add = [](Groups& to, const Groups& from) { to.insert(to.end(), from.begin(), from.end()); };
                    add(want.tp, one.tp), add(want.pp, one.pp), add(want.attn_tp, one.attn_tp);
                    add(want.attn_cp, one.attn_cp), add(want.moe_ep, one.moe_ep), add(want.moe_tp, one.moe_tp);
                    add(want.moe_dp, one.moe_dp), add(want.dcp, one.dcp);
                  }
                  CHECK(sorted(w.groups(GroupKind::tp)) == sorted(want.tp));
                  CHECK(sorted(w.groups(GroupKind::pp)) == sorted(want.pp));
                  CHECK(sorted(w.groups(GroupKind::attn_tp)) == sorted(want.attn_tp));
                  CHECK(sorted(w.groups(GroupKind::attn_cp)) == sorted(want.attn_cp));
                  CHECK(sorted(w.groups(GroupKind::moe_ep)) == sorted(want.moe_ep));
                  CHECK(sorted(w.groups(GroupKind::moe_tp)) == sorted(want.moe_tp));
                  CHECK(sorted(w.groups(GroupKind::moe_dp)) == sorted(want.moe_dp));
                  CHECK(sorted(w.groups(GroupKind::dcp)) == sorted(want.dcp));
                  // Index and position agree with the member lists, for every kind.
                  for (GroupKind g : kWorldGroupKinds) {
                    const Groups all = w.groups(g);
                    for (std::size_t id = 0; id < all.size(); ++id)
                      for (std::size_t pos = 0; pos < all[id].size(); ++pos) {
                        REQUIRE(w.group_index(g, all[id][pos]) == static_cast<int>(id));
                        REQUIRE(w.group_rank(g, all[id][pos]) == static_cast<int>(pos));
                      }
                  }
                }
  CHECK(worlds > 200);
}

TEST_CASE("world: a world over 2^24 ranks is refused; one domain stands alone") {
  LayoutConfig c{.tp = 1 << 12, .dp = 1 << 12};  // 4096 replicas of 4096 ranks
  c.pp = 2;
  CHECK_THROWS_WITH_AS(WorldLayout{c}, doctest::Contains("a world must have at most 2^24 ranks"), LayoutError);
  const WorldLayout one = WorldLayout::single_domain(RuntimeLayout({.tp = 4, .dp = 8}));
  CHECK(one.size() == 4);
  CHECK(one.replicas() == 1);
  CHECK(one.group_size(GroupKind::pp) == 1);
}

TEST_CASE("world: a layout's notes say when dp counts replicas outside the domain") {
  // tp 4, dp 8 without DP attention: 8 replicas of a 4-rank domain (SGLang's data-parallel
  // controller), one note, its text as `relayout explain` prints it.
  const RuntimeLayout replicas(LayoutConfig{.tp = 4, .dp = 8});
  REQUIRE(replicas.notes().size() == 1);
  CHECK(replicas.notes()[0].kind == LayoutNote::Kind::dp_replicas);
  CHECK(replicas.notes()[0].text == "dp = 8 without DP attention: replicas outside this domain; this domain has tp = 4 ranks");
  CHECK(LayoutNote::kind_name(replicas.notes()[0].kind) == "dp_replicas");
  // The same dp with DP attention splits this domain's attention instead: nothing to note.
  CHECK(RuntimeLayout(LayoutConfig{.tp = 8, .dp = 8, .enable_dp_attention = true}).notes().empty());
  // dp = 1 without DP attention: one replica, nothing to note.
  CHECK(RuntimeLayout(LayoutConfig{.tp = 8}).notes().empty());
}
