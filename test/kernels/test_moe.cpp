// Expert grouping (relayout::group_by_expert, the one the bridge runs), the per-expert SwiGLU pass
// and the weighted combine against the token-by-token reference: no tokens, one token, every token on one expert, experts with no tokens, ids owned by
// another EP rank, moe_tp shards of the intermediate dimension summing to the full result, and the
// shared expert; bad shapes rejected.
#include <algorithm>
#include <numeric>

#include "support.hpp"

namespace {

using namespace kt;

// Random top-k ids: distinct experts per token drawn from [0, pool).
std::vector<int> random_ids(int tokens, int top_k, int pool, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int> ids;
  std::vector<int> all(pool);
  for (int t = 0; t < tokens; ++t) {
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), gen);
    ids.insert(ids.end(), all.begin(), all.begin() + top_k);
  }
  return ids;
}

template <class C>
Kokkos::View<int**, Kokkos::LayoutRight, typename C::mem> ids_view(const std::vector<int>& ids, int tokens,
                                                                  int top_k) {
  Kokkos::View<int**, Kokkos::LayoutRight, typename C::mem> v("ids", tokens, top_k);
  auto h = Kokkos::create_mirror_view(v);
  for (int t = 0; t < tokens; ++t)
    for (int j = 0; j < top_k; ++j) h(t, j) = ids[std::size_t(t) * top_k + j];
  Kokkos::deep_copy(v, h);
  return v;
}

rr::Matrix slice(const std::vector<double>& v, int e, int rows, int cols) {
  rr::Matrix m(rows, cols);
  std::copy(v.begin() + std::size_t(e) * rows * cols, v.begin() + std::size_t(e + 1) * rows * cols, m.data.begin());
  return m;
}

struct Experts {
  std::vector<rr::Matrix> w1, w3, w2, a1, a3, a2;  // a*: elementwise |w|
};

// Tolerance: g = x.w1^T and u = x.w3^T sum H products, y = h.w2^T sums I; each GEMM's error is
// ~sqrt(len)*eps of the absolute-value product (see test_linear), silu is 1-Lipschitz-ish in
// relative terms, and the combine adds top_k terms. Bound with the absolute-value chain
// |y| <= (|x|.|w1|^T * |x|.|w3|^T).|w2|^T weighted by |w|: 8*eps*(sqrt(H)+sqrt(I)+top_k+2) of it.
template <class T>
double moe_tol_factor(int hidden, int inter, int top_k) {
  return 8 * eps_of<T>() * (std::sqrt(double(hidden)) + std::sqrt(double(inter)) + top_k + 2);
}

rr::Matrix abs_moe(const rr::Matrix& x, const std::vector<int>& ids, const rr::Matrix& weights,
                   const Experts& ex, int first_expert) {
  // |silu(g) * u| <= |g| * |u|: the reference MoE with silu replaced by |g| on absolute values.
  const int top_k = weights.cols;
  rr::Matrix out(x.rows, x.cols);
  const rr::Matrix ax = abs_of(x);
  for (int t = 0; t < x.rows; ++t) {
    rr::Matrix xt(1, x.cols);
    std::copy(ax.row(t), ax.row(t) + x.cols, xt.data.begin());
    for (int j = 0; j < top_k; ++j) {
      const int e = ids[std::size_t(t) * top_k + j] - first_expert;
      if (e < 0 || e >= int(ex.w1.size())) continue;
      const rr::Matrix g = rr::linear(xt, ex.a1[e]), u = rr::linear(xt, ex.a3[e]);
      rr::Matrix h(1, g.cols);
      for (int c = 0; c < g.cols; ++c) h(0, c) = g(0, c) * u(0, c) + g(0, c) + u(0, c);
      const rr::Matrix y = rr::linear(h, ex.a2[e]);
      for (int c = 0; c < x.cols; ++c) out(t, c) += std::abs(weights(t, j)) * y(0, c);
    }
  }
  return out;
}

template <class C>
void run_moe_case(int tokens, int n_experts, int first_expert, int pool, int top_k, int hidden, int inter,
                  std::uint32_t seed, const std::vector<int>* forced_ids = nullptr) {
  using T = typename C::scalar;
  using Mem = typename C::mem;
  typename C::exec exec;
  auto x = random_tensor<C>(tokens, hidden, seed);
  const std::vector<int> ids = forced_ids ? *forced_ids : random_ids(tokens, top_k, pool, seed + 1);
  auto ids_v = ids_view<C>(ids, tokens, top_k);
  auto weights = random_tensor<C>(tokens, top_k, seed + 2, 0, 1);
  auto w1 = random_values(std::size_t(n_experts) * inter * hidden, seed + 3);
  auto w3 = random_values(std::size_t(n_experts) * inter * hidden, seed + 4);
  auto w2 = random_values(std::size_t(n_experts) * hidden * inter, seed + 5);
  Kokkos::View<T***, Kokkos::LayoutRight, Mem> w1v("w1", n_experts, inter, hidden), w3v("w3", n_experts, inter, hidden),
      w2v("w2", n_experts, hidden, inter);
  Experts ex;
  {
    auto h1 = Kokkos::create_mirror_view(w1v);
    auto h3 = Kokkos::create_mirror_view(w3v);
    auto h2 = Kokkos::create_mirror_view(w2v);
    for (std::size_t i = 0; i < w1.size(); ++i) {
      h1.data()[i] = T(w1[i]);
      w1[i] = double(h1.data()[i]);
      h3.data()[i] = T(w3[i]);
      w3[i] = double(h3.data()[i]);
      h2.data()[i] = T(w2[i]);
      w2[i] = double(h2.data()[i]);
    }
    Kokkos::deep_copy(w1v, h1);
    Kokkos::deep_copy(w3v, h3);
    Kokkos::deep_copy(w2v, h2);
    for (int e = 0; e < n_experts; ++e) {
      ex.w1.push_back(slice(w1, e, inter, hidden));
      ex.w3.push_back(slice(w3, e, inter, hidden));
      ex.w2.push_back(slice(w2, e, hidden, inter));
      ex.a1.push_back(abs_of(ex.w1.back()));
      ex.a3.push_back(abs_of(ex.w3.back()));
      ex.a2.push_back(abs_of(ex.w2.back()));
    }
  }

  // Groups: exactly the reference's stable counting sort, each batch row a copy of its token's row.
  const relayout::TopK<T, typename C::exec> route(ids_v, weights.view);
  relayout::MoeScratch<T, typename C::exec> ws;
  const auto groups = relayout::group_by_expert(exec, x.view, route, first_expert, n_experts, ws);
  const rr::Buckets want_b = rr::bucket(ids, top_k, n_experts, first_expert);
  REQUIRE(groups.batch.rows() == want_b.offsets.back());
  CHECK(std::vector<int>(groups.batch.offsets.begin(), groups.batch.offsets.end()) == want_b.offsets);
  {
    auto so = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), groups.slot_of);
    std::vector<int> got(std::size_t(tokens) * top_k);
    for (int t = 0; t < tokens; ++t)
      for (int j = 0; j < top_k; ++j) got[std::size_t(t) * top_k + j] = int(so(t, j));
    CHECK(got == want_b.slot_of);
    const rr::Matrix bx = rr::to_matrix(groups.batch.x);
    bool copied = true;
    for (int p = 0; p < groups.batch.rows(); ++p)
      for (int c = 0; c < hidden; ++c) copied = copied && bx(p, c) == x.matrix(want_b.slot_token[std::size_t(p)], c);
    CHECK(copied);
  }
  {
    // The same grouping by index: the reference's slot order, each batch row the index of its
    // token's row, no rows of its own.
    relayout::MoeScratch<T, typename C::exec> wsi;
    const auto gi = relayout::group_by_expert(exec, x.view, route, first_expert, n_experts, wsi, true);
    CHECK(gi.batch.offsets == groups.batch.offsets);
    CHECK(gi.batch.x.extent(0) == 0);
    CHECK(int(gi.batch.x.extent(1)) == hidden);
    if (tokens > 0) {
      CHECK(gi.batch.indexed);
      CHECK(gi.batch.source == x.view.data());
      CHECK(gi.batch.source_ld == std::int64_t(x.view.stride(0)));
      auto index = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), gi.batch.index);
      std::vector<int> got(std::size_t(gi.batch.rows()));
      for (std::size_t p = 0; p < got.size(); ++p) got[p] = index(p);
      CHECK(got == std::vector<int>(want_b.slot_token.begin(), want_b.slot_token.begin() + std::ptrdiff_t(got.size())));
      CHECK_THROWS_WITH_AS(gi.batch.rows_of(0), doctest::Contains("an indexed batch holds no rows"), relayout::LayoutError);
    }
  }

  const rr::Matrix want = rr::moe(x.matrix, ids, weights.matrix, ex.w1, ex.w3, ex.w2, first_expert);
  const rr::Matrix scale = abs_moe(x.matrix, ids, weights.matrix, ex, first_expert);
  const double f = moe_tol_factor<T>(hidden, inter, top_k);

  const auto packed = rk::pack_experts(exec, w1v, w3v, w2v);
  auto y = relayout::RowsView<T, Mem>("y", groups.batch.rows(), hidden);
  rk::expert_ffn(exec, groups.batch, packed, y);
  auto out = relayout::RowsView<T, Mem>("out", tokens, hidden);
  relayout::combine_experts(exec, groups, route, y, out);
  check_close(rr::to_matrix(out), want, [&](int i, int j) { return f * scale(i, j) + 1e-300; }, "moe");

  // moe_tp: shards of the intermediate dimension give partial sums that add up to the same result.
  for (int n : {2, 3}) {
    if (inter % n) continue;
    CAPTURE(n);
    auto sum = relayout::RowsView<T, Mem>("sum", tokens, hidden);
    for (int r = 0; r < n; ++r) {
      const auto s = rk::intermediate_shard(inter, n, r).pair();
      const auto part = rk::pack_experts(exec, Kokkos::subview(w1v, Kokkos::ALL(), s, Kokkos::ALL()),
                                         Kokkos::subview(w3v, Kokkos::ALL(), s, Kokkos::ALL()),
                                         Kokkos::subview(w2v, Kokkos::ALL(), Kokkos::ALL(), s));
      CHECK(part.intermediate() == inter / n);
      rk::expert_ffn(exec, groups.batch, part, y);
      relayout::combine_experts(exec, groups, route, y, sum, true);
    }
    check_close(rr::to_matrix(sum), want, [&](int i, int j) { return f * scale(i, j) + 1e-300; },
                "moe_tp partial sums");
  }

  // local_experts (the bridge's dp_gather and tp_moe half) runs the same pipeline in one call.
  rk::SwigluExperts<T, typename C::exec> swiglu{packed, {}};
  auto local = relayout::RowsView<T, Mem>("local", tokens, hidden);
  Kokkos::deep_copy(local, T(7));  // rows no expert takes must come back zero
  relayout::local_experts(exec, x.view, route, first_expert, n_experts, std::max(pool, first_expert + n_experts), swiglu,
                          local, ws, /*check_route=*/forced_ids == nullptr);  // forced ids hold -1
  check_close(rr::to_matrix(local), want, [&](int i, int j) { return f * scale(i, j) + 1e-300; }, "local_experts");

  // SwigluExperts reads an indexed batch (the rows packed through the index); the same experts
  // behind a wrapper that does not say so get the rows copied. Bitwise the same: the GEMM packs
  // the same values either way.
  struct Copied {
    rk::SwigluExperts<T, typename C::exec> e;
    void operator()(const typename C::exec& ex, const relayout::ExpertBatch<T, typename C::exec>& b,
                    const relayout::RowsView<T, Mem>& out) const {
      CHECK(!b.indexed);
      e(ex, b, out);
    }
    void combine_into(const typename C::exec& ex, const relayout::ExpertBatch<T, typename C::exec>& b,
                      const relayout::ExpertDestinations<T, typename C::exec>& dest, const relayout::RowsView<T, Mem>& out) const {
      CHECK(!b.indexed);
      e.combine_into(ex, b, dest, out);
    }
  };
  static_assert(relayout::ReadsIndexedRows<rk::SwigluExperts<T, typename C::exec>> &&
                !relayout::ReadsIndexedRows<Copied>);
  static_assert(relayout::CombinesIntoRows<rk::SwigluExperts<T, typename C::exec>, T, typename C::exec>);

  // Experts without combine_into: their unweighted outputs go through combine_experts (k order),
  // where SwigluExperts adds each expert's weighted outputs as it finishes (expert order). Both
  // match the reference; they differ only in the order of the sums.
  struct Unfused {
    rk::SwigluExperts<T, typename C::exec> e;
    void operator()(const typename C::exec& ex, const relayout::ExpertBatch<T, typename C::exec>& b,
                    const relayout::RowsView<T, Mem>& out) const {
      e(ex, b, out);
    }
  };
  static_assert(!relayout::CombinesIntoRows<Unfused, T, typename C::exec>);

  // expert_ffn_into refuses a destination outside out before it writes anything.
  if (tokens > 0 && groups.batch.rows() > 0) {
    Kokkos::View<std::int64_t*, Mem> bad_row("bad_row", std::size_t(groups.batch.rows()));
    Kokkos::View<T*, Mem> unit("unit", std::size_t(groups.batch.rows()));
    Kokkos::deep_copy(bad_row, std::int64_t(tokens));  // one past the last row
    auto target = relayout::RowsView<T, Mem>("target", tokens, hidden);
    CHECK_THROWS_WITH_AS(rk::expert_ffn_into(exec, groups.batch, packed,
                                             relayout::ExpertDestinations<T, typename C::exec>{bad_row, unit}, target),
                         doctest::Contains("dest: rows must name rows of out"), rk::KernelError);
  }
  Unfused unfused_experts{swiglu};
  auto unfused = relayout::RowsView<T, Mem>("unfused", tokens, hidden);
  Kokkos::deep_copy(unfused, T(7));  // every row is written, those no expert takes with zeros
  relayout::local_experts(exec, x.view, route, first_expert, n_experts, std::max(pool, first_expert + n_experts),
                          unfused_experts, unfused, ws, forced_ids == nullptr);
  check_close(rr::to_matrix(unfused), want, [&](int i, int j) { return f * scale(i, j) + 1e-300; },
              "local_experts through combine_experts");
  Copied copied_experts{swiglu};
  auto copied = relayout::RowsView<T, Mem>("copied", tokens, hidden);
  relayout::local_experts(exec, x.view, route, first_expert, n_experts, std::max(pool, first_expert + n_experts),
                          copied_experts, copied, ws, forced_ids == nullptr);
  const rr::Matrix a = rr::to_matrix(local), b = rr::to_matrix(copied);
  int diffs = 0;
  for (std::size_t i = 0; i < a.data.size(); ++i) diffs += a.data[i] != b.data[i];
  CHECK(diffs == 0);
}

TEST_CASE_TEMPLATE_DEFINE("routed experts match the token-by-token reference", C, moe_sweep) {
  std::uint32_t seed = 2000;
  for (int tokens : {0, 1, 7, 40})
    for (int top_k : {1, 2, 3})
      for (auto [hidden, inter] : {std::pair{8, 6}, std::pair{33, 20}}) {
        CAPTURE(tokens);
        CAPTURE(top_k);
        CAPTURE(hidden);
        CAPTURE(inter);
        run_moe_case<C>(tokens, 4, 0, 4, top_k, hidden, inter, seed += 7);    // all experts in use
        run_moe_case<C>(tokens, 8, 0, 3, top_k, hidden, inter, seed += 7);    // experts 3..7 get nothing
        run_moe_case<C>(tokens, 4, 4, 8, top_k, hidden, inter, seed += 7);    // EP rank 1 of 2: ids 4..7
      }
}
TEST_CASE_TEMPLATE_APPLY(moe_sweep, Cases);

TEST_CASE_TEMPLATE_DEFINE("one expert receives every token; -1 ids are skipped", C, moe_skewed) {
  const int tokens = 70, top_k = 2;
  std::vector<int> ids;
  for (int t = 0; t < tokens; ++t) {
    ids.push_back(2);
    ids.push_back(t % 5 == 0 ? -1 : 2 + 1 + t % 2);
  }
  run_moe_case<C>(tokens, 5, 0, 5, top_k, 24, 12, 77, &ids);
  // Rows naming one expert twice (both terms count): local_experts takes combine_experts for them.
  std::vector<int> twice;
  for (int t = 0; t < tokens; ++t) {
    twice.push_back(t % 3);
    twice.push_back(t % 4 == 0 ? t % 3 : 4);
  }
  run_moe_case<C>(tokens, 5, 0, 5, top_k, 24, 12, 79, &twice);
  std::vector<int> all_one(tokens, 0);  // top_k = 1, every token on expert 0 of 1
  run_moe_case<C>(tokens, 1, 0, 1, 1, 16, 8, 78, &all_one);
}
TEST_CASE_TEMPLATE_APPLY(moe_skewed, Cases);

TEST_CASE_TEMPLATE_DEFINE("shared expert: swiglu_ffn equals the reference and accumulates", C, shared_expert) {
  using T = typename C::scalar;
  using Mem = typename C::mem;
  typename C::exec exec;
  for (int rows : {0, 1, 13, 64}) {
    CAPTURE(rows);
    const int hidden = 40, inter = 24;
    auto x = random_tensor<C>(rows, hidden, 31 + rows);
    auto w1 = random_tensor<C>(inter, hidden, 32);
    auto w3 = random_tensor<C>(inter, hidden, 33);
    auto w2 = random_tensor<C>(hidden, inter, 34);
    const auto packed = rk::pack_experts(exec, w1.view, w3.view, w2.view);
    auto y = relayout::RowsView<T, Mem>("y", rows, hidden);
    rk::swiglu_ffn(exec, x.view, packed, y);
    const rr::Matrix want = rr::swiglu_ffn(x.matrix, w1.matrix, w3.matrix, w2.matrix);
    const double f = moe_tol_factor<T>(hidden, inter, 1);
    // Scale: sum over the absolute chain, as in abs_moe.
    const rr::Matrix g = rr::linear(abs_of(x.matrix), abs_of(w1.matrix)), u = rr::linear(abs_of(x.matrix), abs_of(w3.matrix));
    rr::Matrix h(rows, inter);
    for (std::size_t i = 0; i < h.data.size(); ++i) h.data[i] = g.data[i] * u.data[i] + g.data[i] + u.data[i];
    const rr::Matrix scale = rr::linear(h, abs_of(w2.matrix));
    check_close(rr::to_matrix(y), want, [&](int i, int j) { return f * scale(i, j) + 1e-300; }, "shared expert");
    rk::swiglu_ffn(exec, x.view, packed, y, true);
    rr::Matrix twice = want;
    for (auto& v : twice.data) v *= 2;
    check_close(rr::to_matrix(y), twice, [&](int i, int j) { return 2 * f * scale(i, j) + 1e-300; },
                "shared expert accumulate");
  }
}
TEST_CASE_TEMPLATE_APPLY(shared_expert, Cases);

TEST_CASE_TEMPLATE_DEFINE("experts reject bad shapes", C, moe_errors) {
  using T = typename C::scalar;
  using Mem = typename C::mem;
  typename C::exec exec;
  Kokkos::View<T***, Kokkos::LayoutRight, Mem> w1("w1", 4, 6, 8), w3("w3", 4, 6, 8), w2("w2", 4, 8, 6);
  Kokkos::View<T***, Kokkos::LayoutRight, Mem> w2_bad("w2", 4, 6, 8), w3_bad("w3", 3, 6, 8);
  CHECK_THROWS_WITH_AS(rk::pack_experts(exec, w1, w3, w2_bad), doctest::Contains("w2: must be hidden x intermediate"),
                       rk::KernelError);
  CHECK_THROWS_WITH_AS(rk::pack_experts(exec, w1, w3_bad, w2), doctest::Contains("same number of experts"),
                       rk::KernelError);
  const auto packed = rk::pack_experts(exec, w1, w3, w2);
  auto ids = ids_view<C>({0, 1, 2, 3}, 2, 2);
  auto x = relayout::RowsView<T, Mem>("x", 2, 8);
  const relayout::TopK<T, typename C::exec> route(ids, relayout::RowsView<T, Mem>("w", 2, 2));
  relayout::MoeScratch<T, typename C::exec> ws;
  const auto groups = relayout::group_by_expert(exec, x, route, 0, 4, ws);
  auto y = relayout::RowsView<T, Mem>("y", 4, 8);
  CHECK_NOTHROW(rk::expert_ffn(exec, groups.batch, packed, y));
  auto y_bad = relayout::RowsView<T, Mem>("y", 3, 8);
  CHECK_THROWS_WITH_AS(rk::expert_ffn(exec, groups.batch, packed, y_bad), doctest::Contains("batch.rows() x hidden"),
                       rk::KernelError);
  relayout::MoeScratch<T, typename C::exec> ws8;
  const auto groups8 = relayout::group_by_expert(exec, x, route, 0, 8, ws8);
  CHECK_THROWS_WITH_AS(rk::expert_ffn(exec, groups8.batch, packed, y), doctest::Contains("8 local experts"),
                       rk::KernelError);
  auto x_bad = relayout::RowsView<T, Mem>("x", 2, 7);
  relayout::MoeScratch<T, typename C::exec> ws7;
  CHECK_THROWS_WITH_AS(rk::expert_ffn(exec, relayout::group_by_expert(exec, x_bad, route, 0, 4, ws7).batch, packed, y),
                       doctest::Contains("hidden 8"), rk::KernelError);
  auto out = relayout::RowsView<T, Mem>("out", 2, 8);
  const relayout::TopK<T, typename C::exec> route3(ids_view<C>({0, 1, 2, 0, 1, 2}, 2, 3),
                                                   relayout::RowsView<T, Mem>("w", 2, 3));
  CHECK_THROWS_WITH_AS(relayout::combine_experts(exec, groups, route3, y, out), doctest::Contains("router weights"),
                       relayout::LayoutError);
  auto out_bad = relayout::RowsView<T, Mem>("out", 3, 8);
  CHECK_THROWS_WITH_AS(relayout::combine_experts(exec, groups, route, y, out_bad), doctest::Contains("rows x hidden"),
                       relayout::LayoutError);
  CHECK_THROWS_WITH_AS(relayout::group_by_expert(exec, x, route, 0, 0, ws), doctest::Contains("local >= 1"),
                       relayout::LayoutError);
  CHECK_THROWS_WITH_AS(rk::intermediate_shard(10, 4, 0), doctest::Contains("split evenly"), rk::KernelError);
  CHECK_THROWS_WITH_AS(rk::swiglu_ffn(exec, x, packed, out), doctest::Contains("one expert"), rk::KernelError);
}
TEST_CASE_TEMPLATE_APPLY(moe_errors, Cases);

}  // namespace

// The vectorised SwiGLU (a polynomial exp per lane) against silu(g) * u in double, over the range an
// activation may take: |g| up to 100 (exp saturating both ways), a row of 37 (two vectors of 16
// floats and a scalar tail), float and double.
TEST_CASE_TEMPLATE("SwiGLU rows: silu(g) * u to the scalar's precision, saturating exp included", T, float, double) {
  using Exec = Kokkos::DefaultHostExecutionSpace;
  const int inter = 37, rows = 3;
  std::vector<T> gu(std::size_t(rows) * 2 * inter), h(std::size_t(rows) * inter, T(-7));
  for (int i = 0; i < rows; ++i)
    for (int c = 0; c < inter; ++c) {
      gu[std::size_t(i) * 2 * inter + c] = T(-100 + 200.0 * (i * inter + c) / (rows * inter - 1));
      gu[std::size_t(i) * 2 * inter + inter + c] = T(0.5 + 0.01 * c);
    }
  gu[5] = T(0);
  Kokkos::parallel_for(Kokkos::RangePolicy<Exec>(Exec(), 0, rows),
                       rk::impl::SwiGluRows<Exec, T>{gu.data(), h.data(), inter});
  Exec().fence();
  const double eps = std::is_same_v<T, float> ? 1e-6 : 1e-14;
  for (int i = 0; i < rows; ++i)
    for (int c = 0; c < inter; ++c) {
      const double g = double(gu[std::size_t(i) * 2 * inter + c]), u = double(gu[std::size_t(i) * 2 * inter + inter + c]);
      const double want = g / (1 + std::exp(-g)) * u;
      CAPTURE(g);
      CHECK(std::abs(double(h[std::size_t(i) * inter + c]) - want) <= eps * (std::abs(want) + std::abs(g * u)) + 1e-300);
    }
}
