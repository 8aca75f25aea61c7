// Shared helpers of the kernel tests: the (execution space, scalar) cases every kernel test is
// instantiated for, deterministic random data, views built from host data, tolerance checks.
#pragma once

#include <doctest/doctest.h>

#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <relayout/kernels.hpp>
#include <string>
#include <tuple>
#include <vector>

namespace kt {

namespace rk = relayout::kernels;
namespace rr = relayout::reference;

template <class ExecSpace, class T>
struct Case {
  using exec = ExecSpace;
  using scalar = T;
  using mem = typename ExecSpace::memory_space;
};

template <class Spaces>
struct CasesOf;
template <class... S>
struct CasesOf<std::tuple<S...>> {
  using type = std::tuple<Case<S, float>..., Case<S, double>...>;
};
// Every enabled execution space x {float, double}.
using Cases = typename CasesOf<rk::EnabledExecutionSpaces>::type;

// Uniform values in [lo, hi); `step` > 0 quantises them (exact ties, well separated values).
inline std::vector<double> random_values(std::size_t n, std::uint32_t seed, double lo = -1.0,
                                         double hi = 1.0, double step = 0.0) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) {
    x = dist(gen);
    if (step > 0) x = std::round(x / step) * step;
  }
  return v;
}

// A rows x cols LayoutRight view on C's memory space holding `values` (rounded to T), and the
// same numbers as a reference Matrix (so the reference sees exactly what the kernel sees).
template <class C>
struct Tensor {
  using T = typename C::scalar;
  relayout::RowsView<T, typename C::mem> view;
  rr::Matrix matrix;
};
template <class C>
Tensor<C> make_tensor(int rows, int cols, const std::vector<double>& values) {
  using T = typename C::scalar;
  Tensor<C> t{relayout::RowsView<T, typename C::mem>("t", rows, cols), rr::Matrix(rows, cols)};
  auto h = Kokkos::create_mirror_view(t.view);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) {
      h(i, j) = T(values[std::size_t(i) * cols + j]);
      t.matrix(i, j) = double(h(i, j));
    }
  Kokkos::deep_copy(t.view, h);
  return t;
}
template <class C>
Tensor<C> random_tensor(int rows, int cols, std::uint32_t seed, double lo = -1.0, double hi = 1.0) {
  return make_tensor<C>(rows, cols, random_values(std::size_t(rows) * cols, seed, lo, hi));
}
template <class C>
rk::Vector<typename C::scalar, typename C::mem> make_vector(const std::vector<double>& values,
                                                            std::vector<double>* rounded = nullptr) {
  using T = typename C::scalar;
  rk::Vector<T, typename C::mem> v("v", values.size());
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < values.size(); ++i) h(i) = T(values[i]);
  Kokkos::deep_copy(v, h);
  if (rounded) {
    rounded->resize(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) (*rounded)[i] = double(h(i));
  }
  return v;
}
template <class C>
Kokkos::View<int*, typename C::mem> make_ints(const std::vector<int>& values) {
  Kokkos::View<int*, typename C::mem> v("ints", values.size());
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < values.size(); ++i) h(i) = values[i];
  Kokkos::deep_copy(v, h);
  return v;
}

template <class T>
constexpr double eps_of() {
  return double(std::numeric_limits<T>::epsilon());
}

// Checks |got - want| <= tol(i, j) elementwise; reports the worst element.
template <class Tol>
void check_close(const rr::Matrix& got, const rr::Matrix& want, Tol tol, const std::string& what) {
  REQUIRE(got.rows == want.rows);
  REQUIRE(got.cols == want.cols);
  double worst = 0;
  int wi = -1, wj = -1;
  for (int i = 0; i < got.rows; ++i)
    for (int j = 0; j < got.cols; ++j) {
      const double err = std::abs(got(i, j) - want(i, j));
      const double t = tol(i, j);
      if (!(err <= t) && (wi < 0 || err / t > worst)) {
        worst = err / t;
        wi = i;
        wj = j;
      }
    }
  INFO(what << ": worst element (" << wi << ", " << wj << ") off by " << worst << "x its tolerance");
  if (wi >= 0) INFO("got " << got(wi, wj) << " want " << want(wi, wj) << " tol " << tol(wi, wj));
  CHECK(wi < 0);
}

inline rr::Matrix abs_of(const rr::Matrix& m) {
  rr::Matrix a = m;
  for (auto& v : a.data) v = std::abs(v);
  return a;
}

}  // namespace kt
