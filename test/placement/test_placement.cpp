// Placement rules, tensor_split ranges, DP slots, and the transitions on a single rank.
#include <doctest/doctest.h>

#include <Kokkos_Core.hpp>
#include <relayout/comm.hpp>
#include <relayout/placement.hpp>
#include <vector>

using namespace relayout;

TEST_CASE("tensor_split ranges: earlier chunks are one row larger") {
  // torch.tensor_split(torch.arange(7), 3) -> [0,1,2] [3,4] [5,6]
  CHECK(tensor_split_range(7, 3, 0) == Range{0, 3});
  CHECK(tensor_split_range(7, 3, 1) == Range{3, 2});
  CHECK(tensor_split_range(7, 3, 2) == Range{5, 2});
  // More parts than rows: trailing chunks are empty.
  CHECK(tensor_split_range(2, 4, 1) == Range{1, 1});
  CHECK(tensor_split_range(2, 4, 3) == Range{2, 0});
  CHECK(tensor_split_range(0, 2, 1) == Range{0, 0});
  CHECK_THROWS_AS(tensor_split_range(4, 2, 2), LayoutError);
}

TEST_CASE("the legal transitions and their results") {
  using G = GroupKind;
  const Placement rep_attn{RowState::replicated, G::attn_tp, RowScope::dp_local};
  const Placement part_attn{RowState::partial, G::attn_tp, RowScope::dp_local};
  const Placement full{RowState::replicated, G::tp, RowScope::dp_global};
  const Placement moe_partial{RowState::partial, G::tp, RowScope::dp_global};
  CHECK(transition_result(Transition::all_reduce, part_attn) == rep_attn);
  CHECK(transition_result(Transition::dp_gather_replicate, rep_attn) == full);
  CHECK(transition_result(Transition::dp_gather_partial, part_attn) == full);
  CHECK(transition_result(Transition::dp_scatter, full) == rep_attn);
  CHECK(transition_result(Transition::reduce_scatterv, moe_partial) == rep_attn);
  CHECK_FALSE(transition_result(Transition::all_reduce, rep_attn).has_value());
  CHECK_FALSE(transition_result(Transition::dp_gather_partial, rep_attn).has_value());
  CHECK_FALSE(transition_result(Transition::reduce_scatterv, full).has_value());
  CHECK_FALSE(transition_result(Transition::dp_scatter, moe_partial).has_value());
  CHECK(transition_error(Transition::all_reduce, rep_attn) ==
        "relayout: rows are already Replicated over attn_tp: all_reduce would double-count them; use "
        "split_rows or dp_gather_replicate");
  CHECK(transition_error(Transition::all_gather, part_attn) ==
        "relayout: rows are Partial sums over attn_tp: all_gather would concatenate summands instead of "
        "adding them; use all_reduce (or reduce_scatter)");
  CHECK(transition_error(Transition::reduce_scatterv, full).find("would sum them again (output x tp); use dp_scatter") !=
        std::string::npos);
  CHECK(transition_error(Transition::all_reduce, part_attn).empty());
  CHECK(to_string(full) == "Replicated<tp>, DpGlobal");
}

TEST_CASE("DP slots: packed for sum_len, padded to round_up(max, attn_tp) for max_len") {
  const RuntimeLayout l({.tp = 8, .dp = 4, .enable_dp_attention = true});  // attn_tp = 2
  const std::vector<std::int64_t> counts{0, 3, 1, 4};
  const DpSlots sum(l, counts, PaddingMode::sum_len);
  CHECK(sum.offset(0) == 0);
  CHECK(sum.offset(2) == 3);
  CHECK(sum.offset(3) == 4);
  CHECK(sum.total_rows() == 8);
  const DpSlots max(l, counts, PaddingMode::max_len);
  CHECK(max.slot_rows() == 4);
  CHECK(max.offset(3) == 12);
  CHECK(max.total_rows() == 16);
  // The mesh layer's rule picks the mode: 2*8 >= 4*4 -> max_len.
  CHECK(DpSlots(l, counts).mode() == PaddingMode::max_len);
  const std::vector<std::int64_t> skewed{0, 0, 0, 9};  // 2*9 < 9*4 -> sum_len
  CHECK(DpSlots(l, skewed).mode() == PaddingMode::sum_len);
  CHECK_THROWS_AS(DpSlots(l, std::vector<std::int64_t>{1, 2}), LayoutError);
}

TEST_CASE("single rank: every legal transition runs and the caller's rows stay as they were") {
  using View = Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::DefaultExecutionSpace::memory_space>;
  const ProcessGroupsOf<SingleRankCommunicator> pg(RuntimeLayout({.tp = 1}), SingleRankCommunicator{});
  View v("v", 3, 2);
  auto h = Kokkos::create_mirror_view(v);
  for (int j = 0; j < 3; ++j)
    for (int c = 0; c < 2; ++c) h(j, c) = float(10 * j + c);
  Kokkos::deep_copy(v, h);
  const Rows<float, Partial<AttnTp>> partial(v);
  const auto rep = all_reduce(pg, partial);
  const auto shard = split_rows(pg, rep);
  CHECK(shard.rows() == 3);
  const auto back = all_gather(pg, shard);
  const std::vector<std::int64_t> counts{3};
  const auto slots = make_dp_slots(pg.layout(), counts);
  const auto global = dp_gather_replicate(pg, back, slots);
  const auto local = dp_scatter(pg, global);
  auto out = Kokkos::create_mirror_view(local.view());
  Kokkos::deep_copy(out, local.view());
  CHECK(out(2, 1) == 21.0f);
  CHECK(v.data() != local.view().data());
  const Rows<float, Partial<group::Tp>, DpGlobal> experts(global.view(), slots);
  CHECK(dp_reduce_scatter(pg, experts).rows() == 3);  // one rank: max_len
  // Metadata the placement needs is checked at construction.
  CHECK_THROWS_AS((Rows<float, Partial<group::Tp>, DpGlobal>(View("x", 2, 2), slots)), LayoutError);
  CHECK_THROWS_AS((Rows<float, RowShard<AttnTp>>(v, 2)), LayoutError);
  const AnyRows<float> any(rep);
  CHECK_THROWS_WITH_AS((any.as<Rows<float, Partial<AttnTp>>>()),
                       "relayout: rows are Replicated<attn_tp>, DpLocal, not Partial<attn_tp>, DpLocal", PlacementError);
  CHECK(any.as<Rows<float, Replicated<AttnTp>>>().view().data() == rep.view().data());
}
