// The GEMM's A packing: transpose_rows (R vectors of L lanes read back column-major) against
// the element-by-element definition, and gemm_packed gathering A's rows through a row index
// (full row blocks, which take the vector transpose, and partial ones, which do not) against the
// reference product of the gathered rows.
#include <relayout/kernels/impl/gemm.hpp>

#include "support.hpp"

namespace {

using namespace kt;
namespace ri = relayout::kernels::impl;

// Vectors up to the width this build computes in (wider ones would pass in memory, another ABI).
template <class T, int R, int L>
void check_transpose() {
  if constexpr (L > 1 && L * int(sizeof(T)) <= ri::kHostVectorBytes) {
    using V = typename ri::Vec<T, L>::type;
    V v[R];
    for (int i = 0; i < R; ++i)
      for (int c = 0; c < L; ++c) v[i][c] = T(100 * i + c);
    ri::transpose_rows<R, L>(v);
    T flat[R * L];
    __builtin_memcpy(flat, v, sizeof(flat));
    int wrong = 0;
    for (int i = 0; i < R; ++i)
      for (int c = 0; c < L; ++c) wrong += flat[c * R + i] != T(100 * i + c);
    CHECK(wrong == 0);
  }
}

TEST_CASE("transpose_rows: R rows of L lanes come back with each column's R rows contiguous") {
#if defined(RELAYOUT_KERNELS_HOST_SIMD)
  check_transpose<float, 2, 4>();
  check_transpose<float, 4, 4>();
  check_transpose<float, 2, 8>();
  check_transpose<float, 4, 8>();
  check_transpose<float, 8, 8>();
  check_transpose<float, 8, 16>();
  check_transpose<float, 16, 16>();
  check_transpose<double, 2, 2>();
  check_transpose<double, 4, 4>();
  check_transpose<double, 8, 8>();
  check_transpose<double, 8, 4>();  // more rows than lanes
#else
  MESSAGE("no host vector extensions in this build: transpose_rows is not used");
#endif
}

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
      Kokkos::View<T*, Mem> a_pack("a_pack", std::size_t(ri::gemm_a_pack_size<typename C::exec, T>(m, k)));
      auto y = relayout::RowsView<T, Mem>("y", m, n);
      ri::gemm_packed(exec, a.view.data(), std::int64_t(a.view.stride(0)), rows.data(), m, k, packed.matrix(0), n,
                      y.data(), std::int64_t(y.stride(0)), static_cast<const T*>(nullptr), false, a_pack.data());
      rr::Matrix gathered(m, k);
      for (int i = 0; i < m; ++i)
        for (int j = 0; j < k; ++j) gathered(i, j) = a.matrix(idx[std::size_t(i)], j);
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
