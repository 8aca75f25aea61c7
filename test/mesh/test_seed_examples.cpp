// The seed document's numbers and SGLang's documented 8-rank layouts.
#include <doctest/doctest.h>

#include <relayout/relayout.hpp>
#include <string>
#include <vector>

using namespace relayout;

TEST_CASE("seed: TP32/DP16 with DP attention gives attn_tp 2; off gives 32") {
  const RuntimeLayout on({.tp = 32, .dp = 16, .enable_dp_attention = true});
  CHECK(on.widths().attn_dp == 16);
  CHECK(on.widths().attn_tp == 2);
  const RuntimeLayout off({.tp = 32, .dp = 16, .enable_dp_attention = false});
  CHECK(off.widths().attn_dp == 1);
  CHECK(off.widths().attn_tp == 32);
}

TEST_CASE("seed: ranks 10 and 11 form attention-DP group 5 with attn_tp_rank 0 and 1") {
  const RuntimeLayout l({.tp = 32, .dp = 16, .enable_dp_attention = true,
                         .moe_a2a_backend = Backend::deepep});
  CHECK(l.coords(10).attn_dp_rank == 5);
  CHECK(l.coords(11).attn_dp_rank == 5);
  CHECK(l.coords(10).attn_tp_rank == 0);
  CHECK(l.coords(11).attn_tp_rank == 1);
  CHECK(l.group_members(GroupKind::attn_tp, 10) == std::vector<int>{10, 11});
  CHECK(l.group_index(GroupKind::attn_tp, 11) == 5);
}

TEST_CASE("seed: deepep forces EP to 32, MoE TP 1, path B; user --ep ignored") {
  const RuntimeLayout l({.tp = 32, .dp = 16, .ep = 4, .enable_dp_attention = true,
                         .moe_a2a_backend = Backend::deepep});
  CHECK(l.widths().moe_ep == 32);
  CHECK(l.widths().moe_tp == 1);
  CHECK(l.widths().moe_dp == 1);
  CHECK(ep_overridden(l.config()));
  CHECK(l.bridge_path() == BridgePath::a2a_split);
  CHECK(l.group_members(GroupKind::moe_ep, 10).size() == 32);
}

TEST_CASE("seed: DSpark MoE draft rejected at TP32/DP16, allowed at TP32/DP32, dense allowed") {
  const LayoutConfig dp16{.tp = 32, .dp = 16, .enable_dp_attention = true,
                          .moe_a2a_backend = Backend::deepep, .draft = Draft::moe};
  const DsparkVerdict rejected = RuntimeLayout(dp16).dspark();
  CHECK_FALSE(rejected.allowed);
  CHECK(rejected.error ==
        "DSpark + dp attention with a DeepSeek-V4 (MoE) draft requires attn_tp == 1 (set "
        "--dp-size == --tp). attn_tp > 1 corrupts the MoE-under-DP all-reduce.");
  CHECK_THROWS_AS(RuntimeLayout(dp16).require_dspark_allowed(), LayoutError);

  // attn_tp == 1 passes the worker's rule; speculative_hook.py _handle_dspark then needs the DP
  // LM head and the built-in TP MoE.
  LayoutConfig dp32 = dp16;
  dp32.dp = 32;
  CHECK(RuntimeLayout(dp32).dspark().input == "--enable-dp-lm-head");
  dp32.enable_dp_lm_head = true;
  CHECK(RuntimeLayout(dp32).dspark().input == "--moe-a2a-backend");
  dp32.moe_a2a_backend = Backend::none;
  CHECK(RuntimeLayout(dp32).dspark().allowed);
  CHECK(RuntimeLayout(dp32).dspark().error.empty());

  // The MoE-draft rule leaves a dense draft alone; the launch hook's rules still apply.
  LayoutConfig dense = dp16;
  dense.draft = Draft::dense;
  dense.enable_dp_lm_head = true;
  dense.moe_a2a_backend = Backend::none;
  CHECK(RuntimeLayout(dense).dspark().allowed);

  LayoutConfig no_dp_attention = dp16;
  no_dp_attention.enable_dp_attention = false;
  CHECK(RuntimeLayout(no_dp_attention).dspark().allowed);
}

TEST_CASE("SGLang deployment example: --tp 8 --dp 8 --enable-dp-attention --moe-a2a-backend deepep") {
  const RuntimeLayout l({.tp = 8, .dp = 8, .enable_dp_attention = true,
                         .moe_a2a_backend = Backend::deepep});
  CHECK(l.widths().attn_tp == 1);
  CHECK(l.widths().attn_dp == 8);
  CHECK(l.widths().moe_ep == 8);
  CHECK(l.bridge_path() == BridgePath::direct);
  for (int r = 0; r < 8; ++r) {
    CHECK(l.coords(r).attn_dp_rank == r);
    CHECK(l.coords(r).moe_ep_rank == r);
  }
  CHECK(l.group_count(GroupKind::attn_tp) == 8);
}

TEST_CASE("SGLang: TP8 with CP2, MoE DP2 and EP4 gives MoE TP 1 in two MoE-DP blocks") {
  // SGLang allows moe_dp > 1 only with attn_cp == moe_dp.
  const RuntimeLayout l({.tp = 8, .cp = 2, .ep = 4, .moe_dp = 2});
  CHECK(l.widths().moe_tp == 1);
  CHECK(l.groups(GroupKind::moe_ep) == std::vector<std::vector<int>>{{0, 1, 2, 3}, {4, 5, 6, 7}});
  CHECK(l.groups(GroupKind::moe_dp) ==
        std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
  CHECK(l.bridge_path() == BridgePath::dp_gather);  // the CP partners share their rows before the MoE
}

TEST_CASE("SGLang ScatterMode example: TP4 DP2 gives attention-TP pairs, path A without a backend") {
  const RuntimeLayout l({.tp = 4, .dp = 2, .enable_dp_attention = true});
  CHECK(l.widths().attn_tp == 2);
  CHECK(l.groups(GroupKind::attn_tp) == std::vector<std::vector<int>>{{0, 1}, {2, 3}});
  CHECK(l.bridge_path() == BridgePath::dp_gather);
}

TEST_CASE("TP8 EP2 with moe_tp 4: moe_ep strides by moe_tp inside its block") {
  const RuntimeLayout l({.tp = 8, .ep = 2});
  CHECK(l.widths().moe_tp == 4);
  CHECK(l.groups(GroupKind::moe_tp) == std::vector<std::vector<int>>{{0, 1, 2, 3}, {4, 5, 6, 7}});
  CHECK(l.groups(GroupKind::moe_ep) ==
        std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
}

TEST_CASE("attention CP: cp groups share (dp, tp) coordinates with stride attn_tp") {
  const RuntimeLayout l({.tp = 8, .dp = 2, .cp = 2, .enable_dp_attention = true});
  CHECK(l.widths().attn_tp == 2);
  CHECK(l.groups(GroupKind::attn_cp) ==
        std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
  const RankCoords c = l.coords(6);
  CHECK(c.attn_dp_rank == 1);
  CHECK(c.attn_cp_rank == 1);
  CHECK(c.attn_tp_rank == 0);
}

TEST_CASE("bridge path: each (attn_dp, attn_tp, backend) case of docs/bridge.md") {
  CHECK(RuntimeLayout({.tp = 8, .dp = 4, .enable_dp_attention = true}).bridge_path() ==
        BridgePath::dp_gather);
  CHECK(RuntimeLayout({.tp = 8, .dp = 4, .enable_dp_attention = true,
                       .moe_a2a_backend = Backend::mooncake}).bridge_path() == BridgePath::a2a_split);
  CHECK(RuntimeLayout({.tp = 8, .dp = 8, .enable_dp_attention = true,
                       .moe_a2a_backend = Backend::pplx}).bridge_path() == BridgePath::direct);
  CHECK(RuntimeLayout({.tp = 8}).bridge_path() == BridgePath::tp_moe);
  CHECK(RuntimeLayout({.tp = 8, .moe_a2a_backend = Backend::deepep}).bridge_path() ==
        BridgePath::a2a_split);
  CHECK(RuntimeLayout({.tp = 1, .moe_a2a_backend = Backend::deepep}).bridge_path() ==
        BridgePath::direct);
}

TEST_CASE("every backend but none (and ascend_tp) spans EP over tp (docs/layout.md#derived-widths)") {
  for (const auto& [backend, name] : impl::kBackendNames.entries) {
    CAPTURE(name);
    CHECK(parse_backend(name) == backend);
    // dp == tp with DP attention satisfies every backend's own rule (flashinfer, pplx).
    const RuntimeLayout l({.tp = 8, .dp = 8, .ep = 2, .enable_dp_attention = true,
                           .moe_a2a_backend = backend});
    // ascend_tp runs as none (moe_hook.py handle_a2a_moe), so --ep 2 is honoured.
    CHECK(l.widths().moe_ep == (backend == Backend::none || backend == Backend::ascend_tp ? 2 : 8));
  }
}

TEST_CASE("version header equals the CMake project version") {
  CHECK(std::string(RELAYOUT_VERSION_STRING) == RELAYOUT_PROJECT_VERSION);
}
