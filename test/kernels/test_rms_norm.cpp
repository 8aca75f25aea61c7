// rms_norm and the fused residual add against the reference, including 0 and 1 rows, odd widths,
// in-place use; bad shapes rejected.
#include "support.hpp"

namespace {

using namespace kt;

// Tolerance: the sum of n squares (all positive) is accurate to ~n*eps relative in the worst case
// and the result is x * weight * (mean + eps)^(-1/2), so relative error <= (n/2 + 4) eps of
// |x * w| / rms; we use 4*(sqrt(n)+4)*eps (the lane-split sum has short chains) of that scale.
TEST_CASE_TEMPLATE_DEFINE("rms_norm and add_rms_norm match the reference", C, rms_sweep) {
  using T = typename C::scalar;
  using Mem = typename C::mem;
  typename C::exec exec;
  const double eps_norm = 1e-6;
  std::uint32_t seed = 100;
  for (int rows : {0, 1, 3, 17})
    for (int n : {1, 7, 16, 63, 700}) {
      CAPTURE(rows);
      CAPTURE(n);
      auto x = random_tensor<C>(rows, n, seed++, -2, 2);
      auto res = random_tensor<C>(rows, n, seed++, -2, 2);
      std::vector<double> w_d;
      auto w = make_vector<C>(random_values(n, seed++, 0.5, 1.5), &w_d);
      const double tol_rel = 4 * (std::sqrt(double(n)) + 4) * eps_of<T>();

      auto y = relayout::RowsView<T, Mem>("y", rows, n);
      rk::rms_norm(exec, x.view, w, eps_norm, y);
      const rr::Matrix want = rr::rms_norm(x.matrix, w_d, eps_norm);
      check_close(rr::to_matrix(y), want, [&](int i, int j) { return tol_rel * (std::abs(want(i, j)) + 1e-3); },
                  "rms_norm");

      rk::rms_norm(exec, x.view, w, eps_norm, x.view);  // in place
      check_close(rr::to_matrix(x.view), want, [&](int i, int j) { return tol_rel * (std::abs(want(i, j)) + 1e-3); },
                  "rms_norm in place");

      auto x2 = random_tensor<C>(rows, n, seed++, -2, 2);
      const auto fused = rr::add_rms_norm(x2.matrix, res.matrix, w_d, eps_norm);
      rk::add_rms_norm(exec, x2.view, res.view, w, eps_norm);
      check_close(rr::to_matrix(res.view), fused.residual,
                  [&](int i, int j) { return eps_of<T>() * (std::abs(fused.residual(i, j)) + 1e-30); },
                  "residual += x");
      check_close(rr::to_matrix(x2.view), fused.out,
                  [&](int i, int j) { return tol_rel * (std::abs(fused.out(i, j)) + 1e-3); },
                  "add_rms_norm output");
    }
}
TEST_CASE_TEMPLATE_APPLY(rms_sweep, Cases);

TEST_CASE_TEMPLATE_DEFINE("rms_norm rejects bad shapes", C, rms_errors) {
  using T = typename C::scalar;
  using Mem = typename C::mem;
  typename C::exec exec;
  auto x = relayout::RowsView<T, Mem>("x", 2, 8);
  auto w = rk::Vector<T, Mem>("w", 7);
  auto w8 = rk::Vector<T, Mem>("w", 8);
  CHECK_THROWS_WITH_AS(rk::rms_norm(exec, x, w, 1e-6, x), doctest::Contains("weight"), rk::KernelError);
  auto y = relayout::RowsView<T, Mem>("y", 3, 8);
  CHECK_THROWS_WITH_AS(rk::rms_norm(exec, x, w8, 1e-6, y), doctest::Contains("must have x's shape"),
                       rk::KernelError);
  CHECK_THROWS_WITH_AS(rk::rms_norm(exec, x, w8, 0.0, x), doctest::Contains("eps"), rk::KernelError);
  CHECK_THROWS_WITH_AS(rk::add_rms_norm(exec, x, y, w8, 1e-6), doctest::Contains("residual"),
                       rk::KernelError);
}
TEST_CASE_TEMPLATE_APPLY(rms_errors, Cases);

}  // namespace
