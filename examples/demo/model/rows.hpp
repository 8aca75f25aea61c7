// Token rows on a rank: hidden states (rows x hidden, LayoutRight) and, when tracked, the owner
// (request, position) of each row, moved by the same collectives as the values.
#pragma once

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <vector>

namespace relayout::model {

template <class ExecSpace = Kokkos::DefaultExecutionSpace>
struct Rows {
  using View = Kokkos::View<float**, Kokkos::LayoutRight, typename ExecSpace::memory_space>;
  View values;
  std::vector<std::int64_t> owners;  // empty when owners are not tracked

  std::int64_t count() const { return std::int64_t(values.extent(0)); }
};

template <class ExecSpace>
typename Rows<ExecSpace>::View make_rows(std::int64_t n, int hidden, const char* label = "relayout::rows") {
  return typename Rows<ExecSpace>::View(label, std::size_t(n), std::size_t(hidden));
}

}  // namespace relayout::model
