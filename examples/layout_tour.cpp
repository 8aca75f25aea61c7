// The README's API tour: a DeepSeek-V4 layout as a compile-time policy and as its runtime twin.
#include <cstdio>
#include <string_view>

#include <relayout/relayout.hpp>

using namespace relayout;

// TP32 / DP16 with DP attention and DeepEP: the seed example.
using Seed = Layout<Tp<32>, Dp<16>, DpAttention<true>, A2a<Backend::deepep>>;
static_assert(Seed::attn_tp == 2);                       // 32 / 16 / 1
static_assert(Seed::moe_ep == 32);                       // deepep spans EP over tp
static_assert(Seed::coords<10>().attn_dp_rank == 5);     // ranks 10, 11 form attention-DP group 5
static_assert(Seed::coords<11>().attn_tp_rank == 1);
static_assert(Seed::path == BridgePath::a2a_split);      // split rows, dispatch, all-gather
// Layout<Tp<32>, Dp<16>, DpAttention<true>, DraftModel<Draft::moe>> would not compile:
// "DSpark + dp attention with a DeepSeek-V4 (MoE) draft requires attn_tp == 1 ..."

int main(int argc, char** argv) try {
  const std::string_view arg = argc > 1 ? argv[1] : "deepep";
  if (arg == "--help" || arg == "-h") {
    std::printf("layout_tour: the seed layout (tp 32, dp 16, DP attention) with a MoE all-to-all backend\n"
                "Usage: %s [BACKEND]   (default deepep; none, deepep, mori, ... as relayout explain takes them)\n",
                argv[0]);
    return 0;
  }
  // The same layout from runtime flags; an invalid one throws relayout::LayoutError.
  LayoutConfig config{.tp = 32, .dp = 16, .enable_dp_attention = true, .moe_a2a_backend = parse_backend(arg)};
  const RuntimeLayout layout(config);
  const RankCoords r10 = layout.coords(10);
  std::printf("attn_tp=%d moe_ep=%d bridge=%s\n", layout.widths().attn_tp, layout.widths().moe_ep,
              to_string(layout.bridge_path()).data());
  std::printf("rank 10: attention-DP group %d, attn_tp_rank %d, attn_tp group [", r10.attn_dp_rank,
              r10.attn_tp_rank);
  for (int m : layout.group_members(GroupKind::attn_tp, 10)) std::printf(" %d", m);
  std::printf(" ]\n");

  config.draft = Draft::moe;
  const DsparkVerdict verdict = RuntimeLayout(config).dspark();
  std::printf("MoE draft: %s\n", verdict.allowed ? "allowed" : verdict.error.data());
  return 0;
} catch (const LayoutError& e) {  // bad input: a message and exit 2, as every program here
  std::fprintf(stderr, "error: %s\n", e.what());
  return 2;
}
