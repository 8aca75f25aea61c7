// linear against the reference over a sweep of shapes (0 and 1 rows, sizes that are not multiples
// of the register tile), with bias and accumulation; the column- and row-parallel shards
// reassembled into the unsharded result; bad shapes rejected.
#include "support.hpp"

namespace {

using namespace kt;

// Tolerance: the kernel sums k products in T; a rounding error bounded by ~k*eps*sum|x_k w_k| in
// the worst case and ~sqrt(k)*eps*sum|x_k w_k| for random signs. 4*eps*(sqrt(k)+1)*sum|x w| (plus
// the bias and the accumulated value) covers the random case with margin while still catching any
// wrong term (one missing product of O(1) is ~1/k of sum|x w|, far above the bound for k <= 10^4).
template <class T>
auto gemm_tol(const rr::Matrix& abs_ref, int k) {
  return [&abs_ref, k](int i, int j) {
    return 4 * eps_of<T>() * (std::sqrt(double(k)) + 1) * abs_ref(i, j) + 1e-300;
  };
}

TEST_CASE_TEMPLATE_DEFINE("linear matches the reference over a shape sweep", C, linear_sweep) {
  using T = typename C::scalar;
  typename C::exec exec;
  const int ms[] = {0, 1, 5, 6, 7, 64, 67};
  const int ks[] = {1, 3, 17, 128, 301};
  const int ns[] = {1, 7, 16, 33, 96};
  std::uint32_t seed = 1;
  for (int m : ms)
    for (int k : ks)
      for (int n : ns) {
        CAPTURE(m);
        CAPTURE(k);
        CAPTURE(n);
        auto x = random_tensor<C>(m, k, seed++);
        auto w = random_tensor<C>(n, k, seed++);
        std::vector<double> bias_d;
        auto bias = make_vector<C>(random_values(n, seed++), &bias_d);
        auto y = relayout::RowsView<T, typename C::mem>("y", m, n);
        const auto packed = rk::pack_weights(exec, w.view);
        rk::linear(exec, x.view, packed, y, bias);
        const rr::Matrix want = rr::linear(x.matrix, w.matrix, bias_d);
        std::vector<double> abs_bias(bias_d);
        for (auto& b : abs_bias) b = std::abs(b);
        const rr::Matrix abs_ref = rr::linear(abs_of(x.matrix), abs_of(w.matrix), abs_bias);
        check_close(rr::to_matrix(y), want, gemm_tol<T>(abs_ref, k), "linear with bias");

        // Accumulate without bias on top of the previous result: y = 2 x W^T + bias.
        rk::linear(exec, x.view, packed, y, Kokkos::View<const T*, typename C::mem>(), true);
        rr::Matrix want2 = rr::linear(x.matrix, w.matrix);
        for (std::size_t i = 0; i < want2.data.size(); ++i) want2.data[i] += want.data[i];
        rr::Matrix abs2 = abs_ref;
        for (auto& v : abs2.data) v *= 2;
        check_close(rr::to_matrix(y), want2, gemm_tol<T>(abs2, k), "linear accumulate");
      }
}
TEST_CASE_TEMPLATE_APPLY(linear_sweep, Cases);

TEST_CASE_TEMPLATE_DEFINE("linear: k = 0 gives the bias; an unpacked W packs on the fly", C, linear_edges) {
  using T = typename C::scalar;
  typename C::exec exec;
  auto x = relayout::RowsView<T, typename C::mem>("x", 3, 0);
  auto w = relayout::RowsView<T, typename C::mem>("w", 4, 0);
  auto bias = make_vector<C>({1, 2, 3, 4});
  auto y = relayout::RowsView<T, typename C::mem>("y", 3, 4);
  rk::linear(exec, x, w, y, bias);
  const rr::Matrix got = rr::to_matrix(y);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) CHECK(got(i, j) == j + 1);

  auto x2 = random_tensor<C>(9, 20, 7);
  auto w2 = random_tensor<C>(11, 20, 8);
  auto y2 = relayout::RowsView<T, typename C::mem>("y2", 9, 11);
  rk::linear(exec, x2.view, w2.view, y2);
  check_close(rr::to_matrix(y2), rr::linear(x2.matrix, w2.matrix),
              gemm_tol<T>(rr::linear(abs_of(x2.matrix), abs_of(w2.matrix)), 20), "unpacked W");
}
TEST_CASE_TEMPLATE_APPLY(linear_edges, Cases);

TEST_CASE_TEMPLATE_DEFINE("column- and row-parallel shards reassemble the full layer", C, linear_shards) {
  using T = typename C::scalar;
  using Mem = typename C::mem;
  typename C::exec exec;
  const int rows = 13, hidden = 40, heads = 6, head_dim = 8;
  auto x = random_tensor<C>(rows, hidden, 11);
  auto wq = random_tensor<C>(heads * head_dim, hidden, 12);  // column-parallel, like wq_b
  std::vector<double> bias_d;
  auto bias = make_vector<C>(random_values(heads * head_dim, 13), &bias_d);
  const rr::Matrix full = rr::linear(x.matrix, wq.matrix, bias_d);
  const rr::Matrix abs_full = rr::linear(abs_of(x.matrix), abs_of(wq.matrix));

  for (int n : {1, 2, 3, 6}) {
    CAPTURE(n);
    rr::Matrix assembled(rows, heads * head_dim);
    for (int r = 0; r < n; ++r) {
      const relayout::Range s = rk::column_parallel_shard(heads * head_dim, head_dim, n, r);
      CHECK(s.count == heads / n * head_dim);
      CHECK(s.begin == r * s.count);
      auto y = relayout::RowsView<T, Mem>("y", rows, s.count);
      rk::linear(exec, x.view, rk::pack_weights(exec, rk::column_parallel_weight(wq.view, head_dim, n, r)),
                 y, rk::column_parallel_bias(bias, head_dim, n, r));
      const rr::Matrix part = rr::to_matrix(y);
      for (int i = 0; i < rows; ++i)
        for (int j = 0; j < s.count; ++j) assembled(i, int(s.begin) + j) = part(i, j);
    }
    check_close(assembled, full, gemm_tol<T>(abs_full, hidden), "column-parallel shards");
  }

  // Row-parallel (wo_b): rank r holds input features [begin, end); partial sums add up.
  auto attn = random_tensor<C>(rows, heads * head_dim, 14);
  auto wo = random_tensor<C>(hidden, heads * head_dim, 15);
  const rr::Matrix want = rr::linear(attn.matrix, wo.matrix);
  const rr::Matrix abs_want = rr::linear(abs_of(attn.matrix), abs_of(wo.matrix));
  for (int n : {1, 2, 3}) {
    CAPTURE(n);
    rr::Matrix sum(rows, hidden);
    for (int r = 0; r < n; ++r) {
      const relayout::Range s = rk::row_parallel_shard(heads * head_dim, head_dim, n, r);
      auto x_local = Kokkos::subview(attn.view, Kokkos::ALL(), s.pair());
      // The rank's own activations are contiguous (only its heads); copy the slice to model that.
      auto x_own = relayout::RowsView<T, Mem>("x_own", rows, s.count);
      Kokkos::deep_copy(x_own, x_local);
      auto y = relayout::RowsView<T, Mem>("y", rows, hidden);
      rk::linear(exec, x_own, rk::pack_weights(exec, rk::row_parallel_weight(wo.view, head_dim, n, r)), y);
      const rr::Matrix part = rr::to_matrix(y);
      for (std::size_t i = 0; i < sum.data.size(); ++i) sum.data[i] += part.data[i];
    }
    check_close(sum, want, gemm_tol<T>(abs_want, heads * head_dim), "row-parallel partial sums");
  }
}
TEST_CASE_TEMPLATE_APPLY(linear_shards, Cases);

TEST_CASE_TEMPLATE_DEFINE("linear and the shard helpers reject bad shapes", C, linear_errors) {
  using T = typename C::scalar;
  using Mem = typename C::mem;
  typename C::exec exec;
  auto x = relayout::RowsView<T, Mem>("x", 4, 8);
  auto w = relayout::RowsView<T, Mem>("w", 5, 8);
  const auto packed = rk::pack_weights(exec, w);
  auto y = relayout::RowsView<T, Mem>("y", 4, 5);
  auto x_bad = relayout::RowsView<T, Mem>("x", 4, 7);
  CHECK_THROWS_WITH_AS(rk::linear(exec, x_bad, packed, y),
                       doctest::Contains("x.extent(1) must equal in_features 8"), rk::KernelError);
  auto y_rows = relayout::RowsView<T, Mem>("y", 3, 5);
  CHECK_THROWS_WITH_AS(rk::linear(exec, x, packed, y_rows), doctest::Contains("y.extent(0)"),
                       rk::KernelError);
  auto y_cols = relayout::RowsView<T, Mem>("y", 4, 6);
  CHECK_THROWS_WITH_AS(rk::linear(exec, x, packed, y_cols), doctest::Contains("out_features 5"),
                       rk::KernelError);
  auto bias = rk::Vector<T, Mem>("b", 4);
  CHECK_THROWS_WITH_AS(rk::linear(exec, x, packed, y, bias), doctest::Contains("bias"),
                       relayout::LayoutError);
  try {
    rk::linear(exec, x_bad, packed, y);
  } catch (const rk::KernelError& e) {
    CHECK(e.input() == "x");
  }
  CHECK_THROWS_WITH_AS(rk::column_parallel_shard(48, 8, 4, 0),
                       doctest::Contains("must split evenly over the group size 4"), rk::KernelError);
  CHECK_THROWS_WITH_AS(rk::column_parallel_shard(50, 8, 2, 0), doctest::Contains("multiple of unit"),
                       rk::KernelError);
  CHECK_THROWS_WITH_AS(rk::row_parallel_shard(48, 8, 2, 2), doctest::Contains("group rank"),
                       rk::KernelError);
  CHECK_THROWS_WITH_AS(rk::row_parallel_shard(48, 8, 0, 0), doctest::Contains("group size"),
                       rk::KernelError);
}
TEST_CASE_TEMPLATE_APPLY(linear_errors, Cases);

}  // namespace
