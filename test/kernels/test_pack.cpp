// The GEMM reading A's rows through a row index (out of order, some repeated; full row blocks and
// partial ones, whose missing rows repeat the last) against the reference product of the gathered
// rows, and bitwise against the same GEMM on the rows gathered first.
#include <relayout/kernels/impl/gemm.hpp>

#include "support.hpp"

namespace {

using namespace kt;
namespace ri = relayout::kernels::impl;

TEST_CASE_TEMPLATE_DEFINE("gemm_packed gathers A's rows through a row index", C, gemm_rows) {
  using T = typename C::scalar;
  using Mem = typename C::mem;
  typename C::exec exec;
  std::uint32_t seed = 7100;
  for (int m : {1, 3, 8, 13, 64}) {
    for (int k : {5, 16, 33, 128}) {
      const int n = 40, src_rows = 2 * m + 3;
      CAPTURE(m);
      CAPTURE(k);
      auto a = random_tensor<C>(src_rows, k, seed++);
      auto w = random_tensor<C>(n, k, seed++);
      std::vector<int> idx(static_cast<std::size_t>(m));
      for (int i = 0; i < m; ++i) idx[std::size_t(i)] = (7 * i + 2) % src_rows;  // out of order, some repeated
      const auto rows = make_ints<C>(idx);
      const auto packed = rk::pack_weights(exec, w.view, rk::GemmBackend::packed);
      auto y = relayout::RowsView<T, Mem>("y", m, n);
      ri::gemm_packed(exec, a.view.data(), std::int64_t(a.view.stride(0)), rows.data(), m, k, packed.matrix(0), n,
                      y.data(), std::int64_t(y.stride(0)), static_cast<const T*>(nullptr), false);
      rr::Matrix gathered(m, k);
      for (int i = 0; i < m; ++i)
        for (int j = 0; j < k; ++j) gathered(i, j) = a.matrix(idx[std::size_t(i)], j);
      // The same rows gathered first and multiplied in order: the same products in the same order.
      auto g = make_tensor<C>(m, k, gathered.data);
      auto y_gathered = relayout::RowsView<T, Mem>("y_gathered", m, n);
      ri::gemm_packed(exec, g.view.data(), std::int64_t(g.view.stride(0)), static_cast<const int*>(nullptr), m, k,
                      packed.matrix(0), n, y_gathered.data(), std::int64_t(y_gathered.stride(0)),
                      static_cast<const T*>(nullptr), false);
      const rr::Matrix yi = rr::to_matrix(y), yg = rr::to_matrix(y_gathered);
      int diffs = 0;
      for (std::size_t i = 0; i < yi.data.size(); ++i) diffs += yi.data[i] != yg.data[i];
      CHECK(diffs == 0);
      const rr::Matrix want = rr::linear(gathered, w.matrix);
      const rr::Matrix abs_ref = rr::linear(abs_of(gathered), abs_of(w.matrix));
      check_close(rr::to_matrix(y), want,
                  [&](int i, int j) { return 4 * eps_of<T>() * (std::sqrt(double(k)) + 1) * abs_ref(i, j) + 1e-300; },
                  "gathered rows");
    }
  }
}
TEST_CASE_TEMPLATE_APPLY(gemm_rows, Cases);

}  // namespace
