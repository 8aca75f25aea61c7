// The router against the reference: softmax and sigmoid scoring, group-limited choice, correction
// bias, renormalisation and scaling, exact ties (lower id wins); bad configurations rejected.
//
// Choices must match exactly, so the data avoid near-ties that float and double could order
// differently: logits are multiples of 1/16 (equal logits tie exactly in both precisions, distinct
// ones differ by >= ~1e-3 in score) and correction biases are whole numbers (scores lie in (0, 1),
// so a bias step always dominates). For group-limited choice with a bias, the bias is constant per
// group and steps by 2 (a top-2 sum lies in (0, 2)), so the group order is the bias order.
#include <algorithm>
#include <numeric>

#include "support.hpp"

#include "tolerance.hpp"

using relayout::test::within_abs;
using relayout::test::within_rel;

namespace {

using namespace kt;

struct RouterCase {
  rk::RouterConfig config;
  int experts;
  int bias_kind;  // 0 none, 1 per expert, 2 per group
};

template <class C>
void run_router_case(const RouterCase& rc, int tokens, std::uint32_t seed) {
  using T = typename C::scalar;
  using Mem = typename C::mem;
  typename C::exec exec;
  const auto& cfg = rc.config;
  auto logits = make_tensor<C>(tokens, rc.experts,
                               random_values(std::size_t(tokens) * rc.experts, seed, -2, 2, 1.0 / 16));
  std::vector<double> bias_d;
  rk::Vector<T, Mem> bias;
  if (rc.bias_kind == 1) {
    bias = make_vector<C>(random_values(rc.experts, seed + 1, 0, 2.99, 1.0), &bias_d);
  } else if (rc.bias_kind == 2) {
    std::vector<int> order(cfg.n_group);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(seed + 2));
    std::vector<double> b(rc.experts);
    for (int e = 0; e < rc.experts; ++e) b[e] = 2.0 * order[e / (rc.experts / cfg.n_group)];
    bias = make_vector<C>(b, &bias_d);
  }
  Kokkos::View<int**, Kokkos::LayoutRight, Mem> ids("ids", tokens, cfg.top_k);
  relayout::RowsView<T, Mem> weights("weights", tokens, cfg.top_k);
  rk::route(exec, logits.view, cfg, ids, weights, bias);
  const rr::Routing want = rr::route(logits.matrix, cfg, bias_d);

  auto ids_h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), ids);
  int mismatches = 0;
  for (int t = 0; t < tokens; ++t)
    for (int j = 0; j < cfg.top_k; ++j)
      if (ids_h(t, j) != want.ids[std::size_t(t) * cfg.top_k + j]) ++mismatches;
  CHECK(mismatches == 0);
  // Softmax sums E exponentials (relative error <= E*eps); renormalisation sums k weights.
  const double tol_rel = (rc.experts + cfg.top_k + 16) * eps_of<T>();
  check_close(rr::to_matrix(weights), want.weights,
              [&](int i, int j) { return tol_rel * std::abs(want.weights(i, j)); }, "router weights");
}

TEST_CASE_TEMPLATE_DEFINE("route matches the reference", C, router_sweep) {
  using S = rk::Scoring;
  const RouterCase cases[] = {
      {{1, S::softmax, 1, 1, false, 1.0}, 1, 0},
      {{2, S::softmax, 1, 1, true, 1.0}, 8, 0},
      {{6, S::softmax, 1, 1, false, 2.5}, 64, 0},
      {{8, S::sigmoid, 1, 1, true, 2.5}, 64, 0},
      {{8, S::sigmoid, 1, 1, true, 2.5}, 64, 1},
      {{4, S::softmax, 4, 2, true, 1.0}, 32, 0},
      {{8, S::sigmoid, 8, 4, true, 2.5}, 64, 2},
      {{6, S::sigmoid, 8, 3, false, 1.0}, 48, 2},
      {{3, S::sigmoid, 3, 1, true, 1.0}, 9, 0},  // top_k = the only eligible group's size
      {{5, S::softmax, 1, 1, true, 1.0}, 5, 0},  // top_k = every expert
      // Wider than the scores' local array (512): each score is computed where it is read.
      {{8, S::softmax, 1, 1, true, 1.0}, 640, 0},
      {{8, S::sigmoid, 8, 2, true, 2.5}, 640, 2},
      {{6, S::sigmoid, 1, 1, true, 1.0}, 512, 1},  // the widest row with local scores
      {{70, S::softmax, 1, 1, true, 1.0}, 80, 0},  // top-k longer than the one-pass list (64)
      {{66, S::sigmoid, 4, 3, true, 1.0}, 96, 2},
  };
  std::uint32_t seed = 500;
  for (const auto& rc : cases)
    for (int tokens : {0, 1, 37}) {
      CAPTURE(rc.experts);
      CAPTURE(rc.config.top_k);
      CAPTURE(rc.config.n_group);
      CAPTURE(rc.bias_kind);
      CAPTURE(tokens);
      run_router_case<C>(rc, tokens, seed += 3);
    }
}
TEST_CASE_TEMPLATE_APPLY(router_sweep, Cases);

TEST_CASE_TEMPLATE_DEFINE("route breaks ties toward the lower expert id", C, router_ties) {
  using T = typename C::scalar;
  using Mem = typename C::mem;
  typename C::exec exec;
  // Token 0: all equal. Token 1: experts 5 and 2 tie for best, 7 and 1 for next.
  std::vector<double> l(2 * 8, 0.0);
  l[8 + 5] = l[8 + 2] = 1.0;
  l[8 + 7] = l[8 + 1] = 0.5;
  auto logits = make_tensor<C>(2, 8, l);
  Kokkos::View<int**, Kokkos::LayoutRight, Mem> ids("ids", 2, 4);
  relayout::RowsView<T, Mem> weights("w", 2, 4);
  for (auto scoring : {rk::Scoring::softmax, rk::Scoring::sigmoid}) {
    rk::route(exec, logits.view, {4, scoring, 1, 1, true, 1.0}, ids, weights);
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), ids);
    CHECK(h(0, 0) == 0);
    CHECK(h(0, 1) == 1);
    CHECK(h(0, 2) == 2);
    CHECK(h(0, 3) == 3);
    CHECK(h(1, 0) == 2);
    CHECK(h(1, 1) == 5);
    CHECK(h(1, 2) == 1);
    CHECK(h(1, 3) == 7);
    const rr::Matrix w = rr::to_matrix(weights);
    CHECK(w(0, 0) == within_rel(0.25, 1e-6));  // float weights: a few roundings of 2^-24
  }
  // Groups tie too: 4 groups of 2, all equal -> groups 0 and 1, experts 0..3.
  std::vector<double> flat(8, 0.25);
  auto logits2 = make_tensor<C>(1, 8, flat);
  Kokkos::View<int**, Kokkos::LayoutRight, Mem> ids2("ids", 1, 3);
  relayout::RowsView<T, Mem> w2("w", 1, 3);
  rk::route(exec, logits2.view, {3, rk::Scoring::sigmoid, 4, 2, true, 1.0}, ids2, w2);
  auto h2 = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), ids2);
  CHECK(h2(0, 0) == 0);
  CHECK(h2(0, 1) == 1);
  CHECK(h2(0, 2) == 2);
}
TEST_CASE_TEMPLATE_APPLY(router_ties, Cases);

TEST_CASE_TEMPLATE_DEFINE("route ranks a NaN score last and keeps every id in range", C, router_nan) {
  using T = typename C::scalar;
  using Mem = typename C::mem;
  typename C::exec exec;
  // Sigmoid: expert 0's logit is NaN, the others distinct; the best four of 1..7 are chosen.
  std::vector<double> l = {std::nan(""), 0.5, -1.0, 2.0, 1.5, -0.5, 1.0, 0.25};
  auto logits = make_tensor<C>(1, 8, l);
  Kokkos::View<int**, Kokkos::LayoutRight, Mem> ids("ids", 1, 4);
  relayout::RowsView<T, Mem> w("w", 1, 4);
  rk::route(exec, logits.view, {4, rk::Scoring::sigmoid, 1, 1, true, 1.0}, ids, w);
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), ids);
  auto wh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), w);
  CHECK(h(0, 0) == 3);
  CHECK(h(0, 1) == 4);
  CHECK(h(0, 2) == 6);
  CHECK(h(0, 3) == 1);
  for (int j = 0; j < 4; ++j) CHECK(std::isfinite(double(wh(0, j))));
  // Top-7 must take the NaN expert last; its weight (and the renormalised ones) are NaN, which
  // the bridge's route check refuses.
  Kokkos::View<int**, Kokkos::LayoutRight, Mem> ids8("ids", 1, 8);
  relayout::RowsView<T, Mem> w8("w", 1, 8);
  rk::route(exec, logits.view, {8, rk::Scoring::sigmoid, 1, 1, true, 1.0}, ids8, w8);
  auto h8 = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), ids8);
  auto w8h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), w8);
  CHECK(h8(0, 7) == 0);
  CHECK(h8(0, 6) == 2);
  CHECK(std::isnan(double(w8h(0, 7))));
}
TEST_CASE_TEMPLATE_APPLY(router_nan, Cases);

TEST_CASE_TEMPLATE_DEFINE("route rejects bad configurations", C, router_errors) {
  using T = typename C::scalar;
  using Mem = typename C::mem;
  typename C::exec exec;
  relayout::RowsView<T, Mem> logits("l", 3, 16);
  Kokkos::View<int**, Kokkos::LayoutRight, Mem> ids("ids", 3, 4);
  relayout::RowsView<T, Mem> w("w", 3, 4);
  using S = rk::Scoring;
  CHECK_THROWS_WITH_AS(rk::route(exec, logits, {4, S::softmax, 3, 1, true, 1.0}, ids, w),
                       doctest::Contains("n_group: must divide the number of experts 16"), rk::KernelError);
  CHECK_THROWS_WITH_AS(rk::route(exec, logits, {4, S::softmax, 4, 5, true, 1.0}, ids, w),
                       doctest::Contains("topk_group"), rk::KernelError);
  CHECK_THROWS_WITH_AS(rk::route(exec, logits, {5, S::softmax, 4, 1, true, 1.0}, ids, w),
                       doctest::Contains("top_k: must be in [1, 4]"), rk::KernelError);
  CHECK_THROWS_WITH_AS(rk::route(exec, logits, {5, S::softmax, 1, 1, true, 1.0}, ids, w),
                       doctest::Contains("topk_ids"), rk::KernelError);
  rk::Vector<T, Mem> bias("b", 15);
  CHECK_THROWS_WITH_AS(rk::route(exec, logits, {4, S::softmax, 1, 1, true, 1.0}, ids, w, bias),
                       doctest::Contains("correction_bias"), rk::KernelError);
  relayout::RowsView<T, Mem> none("l", 3, 0);
  CHECK_THROWS_WITH_AS(rk::route(exec, none, {4, S::softmax, 1, 1, true, 1.0}, ids, w),
                       doctest::Contains("at least one expert"), rk::KernelError);
}
TEST_CASE_TEMPLATE_APPLY(router_errors, Cases);

}  // namespace
