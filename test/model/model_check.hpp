// Shared by the layer tests: run the distributed layers on this rank and compare every row it holds
// with the single-rank reference, matched by owner.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <relayout/comm.hpp>
#include <relayout/model.hpp>

namespace relayout::test {

struct Comparison {
  double max_abs_err = 0.0;
  std::int64_t rows = 0;     // rows compared on this rank
  bool owners_match = true;  // this rank holds exactly its DP group's rows, in order
};

inline Comparison compare_with_reference(const model::ModelDims& dims, const model::Workload& work,
                                         const model::ReferenceRows& ref, int attn_dp_rank,
                                         const model::Rows<>& got) {
  Comparison c;
  const auto expected = work.owners_of(attn_dp_rank);
  c.owners_match = got.owners == expected && std::int64_t(expected.size()) == got.count();
  std::map<std::int64_t, int> row_of;
  for (std::size_t i = 0; i < ref.owners.size(); ++i) row_of[ref.owners[i]] = int(i);
  const auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), got.values);
  for (std::int64_t i = 0; i < got.count() && i < std::int64_t(expected.size()); ++i) {
    const int r = row_of.at(expected[std::size_t(i)]);
    for (int f = 0; f < dims.hidden; ++f)
      c.max_abs_err = std::max(c.max_abs_err, std::abs(double(h(i, f)) - ref.rows(r, f)));
    ++c.rows;
  }
  return c;
}

}  // namespace relayout::test
