// What a collective accepts as a buffer: a contiguous range (std::span, std::vector, std::array)
// or a contiguous Kokkos::View of any rank. Before the communication library touches their memory,
// Views are fenced on their execution space (its default instance); a collective given an
// execution-space instance as its first argument fences that instance instead, and only it.
#pragma once

#include <cstddef>
#include <iterator>
#include <ranges>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include <Kokkos_Core.hpp>

#include "relayout/comm/scalar.hpp"
#include "relayout/mesh/error.hpp"

namespace relayout {

namespace impl {

template <class B>
inline constexpr bool is_kokkos_view = Kokkos::is_view<std::remove_cvref_t<B>>::value;

template <class B>
struct BufferElement {
  using type = std::remove_reference_t<std::ranges::range_reference_t<B>>;
};
template <class B>
  requires is_kokkos_view<B>
struct BufferElement<B> {
  using type = typename std::remove_cvref_t<B>::value_type;
};

}  // namespace impl

// The element type a buffer exposes, const-qualified when it can only be read.
template <class B>
using buffer_element_t = typename impl::BufferElement<B>::type;

template <class B>
concept CommBuffer =
    (impl::is_kokkos_view<B> ||
     (std::ranges::contiguous_range<B> && std::ranges::sized_range<B>)) &&
    CommScalar<std::remove_const_t<buffer_element_t<B>>>;

// A buffer the collective may write into.
template <class B>
concept WritableBuffer = CommBuffer<B> && !std::is_const_v<buffer_element_t<B>>;

// A Kokkos execution-space instance (Kokkos::DefaultExecutionSpace, an instance on an engine's own
// stream, ...), the optional first argument of every collective.
template <class E>
concept ExecutionSpaceInstance = Kokkos::is_execution_space<std::remove_cvref_t<E>>::value;

namespace impl {

// Kokkos::Serial runs every kernel to completion before returning, so its fence has nothing to
// wait for; skipping it keeps small collectives within a few percent of the raw MPI call.
template <class V>
void fence_before_communication() {
  using Space = typename std::remove_cvref_t<V>::execution_space;
#if defined(KOKKOS_ENABLE_SERIAL)
  if constexpr (std::is_same_v<Space, Kokkos::Serial>) return;
  else
#endif
    Space().fence();
}

template <class V>
void require_contiguous(const V& v, const char* what) {
  if (!v.span_is_contiguous())
    throw LayoutError(what, std::string(what) + " is a non-contiguous Kokkos::View (label '" +
                                v.label() + "'); collectives need contiguous memory: pass a "
                                "LayoutRight/LayoutLeft view or a contiguous subview");
}

// How a collective orders itself after the caller's kernels: ViewSpaces fences each View's
// execution space; an ExecutionSpaceInstance is fenced once, before any buffer is read.
struct ViewSpaces {};

template <class F>
void fence_instance(const F& f) {
  if constexpr (!std::is_same_v<F, ViewSpaces>) f.fence();
}

template <class B>
using memory_space_of = typename std::conditional_t<is_kokkos_view<B>, std::remove_cvref_t<B>,
                                                    Kokkos::View<int*, Kokkos::HostSpace>>::memory_space;

// The memory of a buffer as a span, after fencing the View's execution space.
template <CommBuffer B>
auto read_span(const B& b, const char* what) {
  using T = std::remove_const_t<buffer_element_t<B>>;
  if constexpr (is_kokkos_view<B>) {
    require_contiguous(b, what);
    fence_before_communication<B>();
    return std::span<const T>(b.data(), b.size());
  } else {
    return std::span<const T>(std::ranges::data(b), std::ranges::size(b));
  }
}

template <WritableBuffer B>
auto write_span(B&& b, const char* what) {
  using T = buffer_element_t<B>;
  if constexpr (is_kokkos_view<B>) {
    require_contiguous(b, what);
    fence_before_communication<B>();
    return std::span<T>(b.data(), b.size());
  } else {
    return std::span<T>(std::ranges::data(b), std::ranges::size(b));
  }
}

// The same, under a fence policy: with an instance (already fenced) the View is not fenced again.
template <class F, CommBuffer B>
auto read_span(const F&, const B& b, const char* what) {
  if constexpr (std::is_same_v<F, ViewSpaces> || !is_kokkos_view<B>) {
    return read_span(b, what);
  } else {
    using T = std::remove_const_t<buffer_element_t<B>>;
    require_contiguous(b, what);
    return std::span<const T>(b.data(), b.size());
  }
}

template <class F, WritableBuffer B>
auto write_span(const F&, B&& b, const char* what) {
  if constexpr (std::is_same_v<F, ViewSpaces> || !is_kokkos_view<B>) {
    return write_span(std::forward<B>(b), what);
  } else {
    using T = buffer_element_t<B>;
    require_contiguous(b, what);
    return std::span<T>(b.data(), b.size());
  }
}

}  // namespace impl
}  // namespace relayout
