// Vocabulary of the kernels: token-row tensors (rows x features, LayoutRight), the view concepts the
// kernel templates accept, the list of execution spaces this Kokkos build enables (token rows are relayout::RowsView, ranges relayout::Range).
#pragma once

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

#include "relayout/kernels/error.hpp"
#include "relayout/mesh/range.hpp"
#include "relayout/placement/rows_view.hpp"

namespace relayout::kernels {

// Token rows are relayout::RowsView<T, Space> (placement/rows_view.hpp): one row per token,
// features contiguous; Space is an execution space or a memory space.
template <class T, class MemSpace = Kokkos::DefaultExecutionSpace::memory_space>
using Vector = Kokkos::View<T*, MemSpace>;

// Every execution space this Kokkos build enables; tests are instantiated once per entry.
using EnabledExecutionSpaces = decltype(std::tuple_cat(
#if defined(KOKKOS_ENABLE_SERIAL)
    std::declval<std::tuple<Kokkos::Serial>>(),
#endif
#if defined(KOKKOS_ENABLE_OPENMP)
    std::declval<std::tuple<Kokkos::OpenMP>>(),
#endif
#if defined(KOKKOS_ENABLE_THREADS)
    std::declval<std::tuple<Kokkos::Threads>>(),
#endif
#if defined(KOKKOS_ENABLE_CUDA)
    std::declval<std::tuple<Kokkos::Cuda>>(),
#endif
#if defined(KOKKOS_ENABLE_HIP)
    std::declval<std::tuple<Kokkos::Experimental::HIP>>(),
#endif
    std::declval<std::tuple<>>()));

template <class V>
concept KokkosView = Kokkos::is_view<V>::value;

// rows x features, features contiguous (LayoutRight), any memory space.
template <class V>
concept RowMatrixView = KokkosView<V> && (static_cast<int>(V::rank) == 2) &&
                        std::is_same_v<typename V::array_layout, Kokkos::LayoutRight>;
template <class V>
concept MutableRowMatrixView = RowMatrixView<V> && !std::is_const_v<typename V::value_type>;
template <class V>
concept VectorView = KokkosView<V> && (static_cast<int>(V::rank) == 1);
template <class V>
concept MatrixView = KokkosView<V> && (static_cast<int>(V::rank) == 2);  // any layout
template <class V>
concept Matrix3View = KokkosView<V> && (static_cast<int>(V::rank) == 3);  // any layout

template <class V>
using scalar_of = typename V::non_const_value_type;

// True when kernels launched on ExecSpace may read views of V's memory space.
template <class ExecSpace, class V>
inline constexpr bool accessible_from =
    Kokkos::SpaceAccessibility<ExecSpace, typename V::memory_space>::accessible;

}  // namespace relayout::kernels
