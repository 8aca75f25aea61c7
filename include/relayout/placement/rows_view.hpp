// RowsView<T, Space>: the storage of token rows (rows x features, LayoutRight) in Space's memory,
// where Space is an execution space or a memory space. The one row view every layer speaks: Rows,
// the experts contract and the kernels all take it.
#pragma once

#include <Kokkos_Core.hpp>

namespace relayout {

template <class T, class Space = Kokkos::DefaultExecutionSpace>
using RowsView = Kokkos::View<T**, Kokkos::LayoutRight, typename Space::memory_space>;

}  // namespace relayout
