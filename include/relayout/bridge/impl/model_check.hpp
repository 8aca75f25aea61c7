// Compile-time checks of what an engine hands MoeBridge::run: a router, experts and rows of the
// bridge's element type. A mistake is one sentence naming both types, not pages of concept errors.
#pragma once

#include <type_traits>

#include "relayout/comm/scalar.hpp"
#include "relayout/placement/experts.hpp"

namespace relayout::impl {

// Instantiated with the bridge's T and the type given: the compiler prints both in its name.
template <class BridgeElement, class GivenElement>
struct element_type_mismatch {
  static_assert(std::is_same_v<BridgeElement, GivenElement>,
                "relayout: MoeBridge<C, T, Space>::run was given rows, a router or experts of another element type "
                "than the bridge's T (element_type_mismatch<the bridge's T, the given type> names both)");
  static constexpr bool value = true;
};
template <class T, class U>
constexpr void require_same_element() {
  static_assert(element_type_mismatch<T, U>::value);
}

// The element type among relayout's (float, double, bf16, fp16) that P accepts; void: none.
template <template <class, class, class> class Fits, class P, class Space>
using element_of_t = std::conditional_t<
    Fits<P, float, Space>::value, float,
    std::conditional_t<Fits<P, double, Space>::value, double,
                       std::conditional_t<Fits<P, bf16, Space>::value, bf16,
                                          std::conditional_t<Fits<P, fp16, Space>::value, fp16, void>>>>;
template <class R, class T, class Space>
struct router_fits : std::bool_constant<RouterFor<R, T, Space>> {};
template <class E, class T, class Space>
struct experts_fit : std::bool_constant<ExpertsFor<E, T, Space>> {};

template <class T, class Space, class R, class E>
inline constexpr bool model_fits = RouterFor<R, T, Space> && ExpertsFor<E, T, Space>;

// Fails to compile, with one sentence, unless the router and experts take the bridge's T.
template <class T, class Space, class R, class E>
constexpr void check_model() {
  if constexpr (!RouterFor<R, T, Space>) {
    using U = element_of_t<router_fits, R, Space>;
    if constexpr (!std::is_void_v<U>) require_same_element<T, U>();
    else
      static_assert(RouterFor<R, T, Space>,
                    "relayout: MoeBridge::run: the router needs top_k() and operator()(exec, RowsView<T, Space>, "
                    "TopK<T, Space>&) for the bridge's T and Space (RouterFor)");
  } else if constexpr (!ExpertsFor<E, T, Space>) {
    using U = element_of_t<experts_fit, E, Space>;
    if constexpr (!std::is_void_v<U>) require_same_element<T, U>();
    else
      static_assert(ExpertsFor<E, T, Space>,
                    "relayout: MoeBridge::run: the experts need operator()(exec, ExpertBatch<T, Space>, "
                    "RowsView<T, Space>) for the bridge's T and Space (ExpertsFor)");
  }
}

}  // namespace relayout::impl
