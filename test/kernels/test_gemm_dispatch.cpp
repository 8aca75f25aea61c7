// The GEMM dispatch point: both sides (the packed kernel and, in builds with Kokkos Kernels, the
// vendor GEMM) against the double reference for ragged shapes, through linear, expert_ffn and a
// row-strided C; the rule's choice per execution space, scalar and shape; a forced side honoured.
#include "support.hpp"

namespace {

using namespace kt;

// The backends this build can run for T.
template <class T>
std::vector<rk::GemmBackend> runnable_backends() {
  std::vector<rk::GemmBackend> b{rk::GemmBackend::packed};
  if constexpr (rk::impl::vendor_gemm_available_v<T>) b.push_back(rk::GemmBackend::vendor);
  return b;
}

const char* name_of(rk::GemmBackend b) { return b == rk::GemmBackend::vendor ? "vendor" : "packed"; }

// Same bound as test_linear: 4*eps*(sqrt(k)+1)*sum|x w| (+ the bias and the accumulated value).
template <class T>
auto gemm_tol(const rr::Matrix& abs_ref, int k) {
  return [&abs_ref, k](int i, int j) {
    return 4 * eps_of<T>() * (std::sqrt(double(k)) + 1) * abs_ref(i, j) + 1e-300;
  };
}

TEST_CASE_TEMPLATE_DEFINE("gemm dispatch: both sides of linear match the reference", C, dispatch_linear) {
  using T = typename C::scalar;
  typename C::exec exec;
  struct Shape {
    int m, k, n;
  };
  const Shape shapes[] = {{0, 5, 3}, {1, 1, 1}, {1, 512, 512}, {7, 33, 17}, {8, 301, 96}, {67, 128, 257}, {3, 0, 9}};
  std::uint32_t seed = 100;
  for (const auto backend : runnable_backends<T>())
    for (const Shape s : shapes) {
      CAPTURE(name_of(backend));
      CAPTURE(s.m);
      CAPTURE(s.k);
      CAPTURE(s.n);
      auto x = random_tensor<C>(s.m, s.k, seed++);
      auto w = random_tensor<C>(s.n, s.k, seed++);
      std::vector<double> bias_d;
      auto bias = make_vector<C>(random_values(s.n, seed++), &bias_d);
      const auto packed = rk::pack_weights(exec, w.view, backend);
      CHECK(packed.backend == backend);
      auto y = relayout::RowsView<T, typename C::mem>("y", s.m, s.n);
      rk::linear(exec, x.view, packed, y, bias);
      const rr::Matrix want = rr::linear(x.matrix, w.matrix, bias_d);
      std::vector<double> abs_bias(bias_d);
      for (auto& b : abs_bias) b = std::abs(b);
      const rr::Matrix abs_ref = rr::linear(abs_of(x.matrix), abs_of(w.matrix), abs_bias);
      check_close(rr::to_matrix(y), want, gemm_tol<T>(abs_ref, s.k), "linear with bias");

      // Accumulate, no bias: y = 2 x W^T + bias.
      rk::linear(exec, x.view, packed, y, Kokkos::View<const T*, typename C::mem>(), true);
      rr::Matrix want2 = rr::linear(x.matrix, w.matrix);
      for (std::size_t i = 0; i < want2.data.size(); ++i) want2.data[i] += want.data[i];
      rr::Matrix abs2 = abs_ref;
      for (auto& v : abs2.data) v *= 2;
      check_close(rr::to_matrix(y), want2, gemm_tol<T>(abs2, s.k), "linear accumulate");
    }
}
TEST_CASE_TEMPLATE_APPLY(dispatch_linear, Cases);

TEST_CASE_TEMPLATE_DEFINE("gemm dispatch: gathered rows, strided A and C", C, dispatch_strided) {
  using T = typename C::scalar;
  using Mem = typename C::mem;
  typename C::exec exec;
  const int m = 5, k = 19, n = 23, lda = 24, ldc = 31, src_rows = 9;
  const std::vector<int> rows_h{8, 0, 3, 3, 6};  // a repeated row, out of order
  auto a = random_tensor<C>(src_rows, lda, 7);
  auto w = random_tensor<C>(n, k, 8);
  Kokkos::View<int*, Mem> rows("rows", m);
  auto rows_m = Kokkos::create_mirror_view(rows);
  for (int i = 0; i < m; ++i) rows_m(i) = rows_h[std::size_t(i)];
  Kokkos::deep_copy(rows, rows_m);
  rr::Matrix ag(m, k), abs_ag(m, k);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < k; ++j) {
      ag(i, j) = a.matrix(rows_h[std::size_t(i)], j);
      abs_ag(i, j) = std::abs(ag(i, j));
    }
  const rr::Matrix want = rr::linear(ag, w.matrix);
  const rr::Matrix abs_ref = rr::linear(abs_ag, abs_of(w.matrix));
  for (const auto backend : runnable_backends<T>()) {
    CAPTURE(name_of(backend));
    const auto packed = rk::pack_weights(exec, w.view, backend);
    Kokkos::View<T**, Kokkos::LayoutRight, Mem> c("c", m, ldc);
    Kokkos::View<T*, Mem> ws("ws", rk::impl::gemm_workspace_size<typename C::exec, T>(m, k));
    rk::impl::gemm_dispatch(exec, a.view.data(), lda, rows.data(), m, packed, 0, c.data(), ldc,
                            static_cast<const T*>(nullptr), false, ws.data());
    exec.fence();
    const rr::Matrix got = rr::to_matrix(c);
    rr::Matrix got_n(m, n);
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) got_n(i, j) = got(i, j);
    check_close(got_n, want, gemm_tol<T>(abs_ref, k), "rows through an index, lda and ldc past the row");
    for (int i = 0; i < m; ++i)
      for (int j = n; j < ldc; ++j) CHECK(got(i, j) == 0.0);  // the columns past n are untouched
  }
}
TEST_CASE_TEMPLATE_APPLY(dispatch_strided, Cases);

TEST_CASE_TEMPLATE_DEFINE("gemm dispatch: the experts' GEMMs on both sides match the reference", C, dispatch_experts) {
  using T = typename C::scalar;
  using Mem = typename C::mem;
  typename C::exec exec;
  const int rows = 11, hidden = 24, inter = 13, experts = 3;
  std::vector<rr::Matrix> w1, w3, w2;
  using W3 = Kokkos::View<T***, Kokkos::LayoutRight, Mem>;
  W3 v1("w1", experts, inter, hidden), v3("w3", experts, inter, hidden), v2("w2", experts, hidden, inter);
  auto h1 = Kokkos::create_mirror_view(v1), h3 = Kokkos::create_mirror_view(v3), h2 = Kokkos::create_mirror_view(v2);
  for (int e = 0; e < experts; ++e) {
    const std::size_t size = std::size_t(inter) * hidden;
    const auto r1 = random_values(size, 40 + e), r3 = random_values(size, 50 + e), r2 = random_values(size, 60 + e);
    w1.emplace_back(inter, hidden);
    w3.emplace_back(inter, hidden);
    w2.emplace_back(hidden, inter);
    for (int i = 0; i < inter; ++i)
      for (int j = 0; j < hidden; ++j) {
        h1(e, i, j) = T(r1[std::size_t(i) * hidden + j]);
        h3(e, i, j) = T(r3[std::size_t(i) * hidden + j]);
        w1[e](i, j) = double(h1(e, i, j));
        w3[e](i, j) = double(h3(e, i, j));
        h2(e, j, i) = T(r2[std::size_t(j) * inter + i]);
        w2[e](j, i) = double(h2(e, j, i));
      }
  }
  Kokkos::deep_copy(v1, h1);
  Kokkos::deep_copy(v3, h3);
  Kokkos::deep_copy(v2, h2);
  auto x = random_tensor<C>(rows, hidden, 70);
  // Rows grouped by expert, ragged: 4, none (an empty GEMM), 7.
  const relayout::ExpertBatch<T, typename C::exec> batch{x.view, {0, 4, 4, rows}, 0};
  for (const auto backend : runnable_backends<T>()) {
    CAPTURE(name_of(backend));
    const rk::ExpertWeights<T, typename C::exec> w{rk::pack_weights_stacked(exec, v1, v3, backend),
                                                  rk::pack_weights(exec, v2, backend)};
    CHECK(w.w13.backend == backend);
    CHECK(w.w2.backend == backend);
    relayout::RowsView<T, Mem> y("y", rows, hidden);
    rk::expert_ffn(exec, batch, w, y);
    const rr::Matrix got = rr::to_matrix(y);
    for (int p = 0; p < rows; ++p) {
      int e = 0;
      while (batch.offset(e + 1) <= p) ++e;
      CAPTURE(p);
      rr::Matrix xt(1, hidden);
      for (int c = 0; c < hidden; ++c) xt(0, c) = x.matrix(p, c);
      const rr::Matrix want = rr::swiglu_ffn(xt, w1[std::size_t(e)], w3[std::size_t(e)], w2[std::size_t(e)]);
      // Two GEMMs and the activation in T: a bound relative to the row's largest output.
      double scale = 0;
      for (int c = 0; c < hidden; ++c) scale = std::max(scale, std::abs(want(0, c)));
      for (int c = 0; c < hidden; ++c)
        CHECK(std::abs(got(p, c) - want(0, c)) <= 64 * eps_of<T>() * (std::sqrt(double(hidden)) + 1) * (scale + 1));
    }
  }
}
TEST_CASE_TEMPLATE_APPLY(dispatch_experts, Cases);

TEST_CASE("gemm dispatch: the rule per execution space, scalar and shape class") {
  using Serial = Kokkos::Serial;
  using rk::GemmBackend;
  struct Shape {
    int n, k;
  };
  // A 512 x 512 layer, the demo's gate+up and down expert GEMMs, a ragged one, a vector.
  const Shape shapes[] = {{512, 512}, {2 * 256, 512}, {512, 256}, {257, 301}, {1, 1}};
  for (const Shape s : shapes) {
    CAPTURE(s.n);
    CAPTURE(s.k);
    // The host keeps the packed kernel (docs/benchmarks.md, "GEMM dispatch").
    CHECK(rk::impl::choose_gemm_backend<Serial, float>(s.n, s.k) == GemmBackend::packed);
    CHECK(rk::impl::choose_gemm_backend<Serial, double>(s.n, s.k) == GemmBackend::packed);
    CHECK(rk::impl::choose_gemm_backend<Serial, relayout::bf16>(s.n, s.k) == GemmBackend::packed);
    CHECK(rk::impl::choose_gemm_backend<Serial, float>(s.n, s.k, GemmBackend::packed) == GemmBackend::packed);
    const auto force_vendor_float = [&] {
      return rk::impl::choose_gemm_backend<Serial, float>(s.n, s.k, GemmBackend::vendor);
    };
    const auto force_vendor_bf16 = [&] {
      return rk::impl::choose_gemm_backend<Serial, relayout::bf16>(s.n, s.k, GemmBackend::vendor);
    };
    if constexpr (rk::impl::vendor_gemm_available_v<float>) {
      CHECK(force_vendor_float() == GemmBackend::vendor);
      CHECK(rk::impl::choose_gemm_backend<Serial, double>(s.n, s.k, GemmBackend::vendor) == GemmBackend::vendor);
    } else {
      CHECK_THROWS_AS(force_vendor_float(), relayout::LayoutError);
    }
    // No vendor GEMM for bf16: forcing it is the caller's error, named.
    CHECK_THROWS_WITH_AS(force_vendor_bf16(), doctest::Contains("backend"), relayout::LayoutError);
  }
  // Automatic weights carry the choice; forced ones what was forced.
  Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::HostSpace> w("w", 40, 24);
  CHECK(rk::pack_weights(Serial(), w).backend == GemmBackend::packed);
  CHECK(rk::pack_weights(Serial(), w, GemmBackend::packed).backend == GemmBackend::packed);
}

}  // namespace
