// Shared by the layer tests: run the distributed layers on this rank and compare every row it holds
// with the single-rank reference, matched by owner.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <relayout/comm.hpp>
#include <demo/model.hpp>

namespace relayout::test {

struct Comparison {
  double max_abs_err = 0.0;     // +inf as soon as one value is not finite, so no tolerance accepts it
  std::int64_t non_finite = 0;  // NaN / inf values among the rows compared (std::max would drop a NaN)
  std::int64_t rows = 0;        // rows compared on this rank
  bool owners_match = true;     // this rank holds exactly its DP group's rows (its CP share), in order
};

inline Comparison compare_with_reference(const model::ModelDims& dims, const model::Workload& work,
                                         const model::ReferenceRows& ref, int attn_dp_rank,
                                         const model::LayerRows<>& got, const model::CpShare& share = {}) {
  Comparison c;
  const auto expected = work.owners_of(attn_dp_rank, share);
  c.owners_match = got.owners == expected && std::int64_t(expected.size()) == got.count();
  std::map<std::int64_t, int> row_of;
  for (std::size_t i = 0; i < ref.owners.size(); ++i) row_of[ref.owners[i]] = int(i);
  const auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), got.view());
  for (std::int64_t i = 0; i < got.count() && i < std::int64_t(expected.size()); ++i) {
    const int r = row_of.at(expected[std::size_t(i)]);
    for (int f = 0; f < dims.hidden; ++f) {
      const double v = double(h(i, f));
      if (!std::isfinite(v)) ++c.non_finite;
      c.max_abs_err = std::isfinite(v) ? std::max(c.max_abs_err, std::abs(v - ref.rows(r, f)))
                                       : std::numeric_limits<double>::infinity();
    }
    ++c.rows;
  }
  return c;
}

}  // namespace relayout::test
