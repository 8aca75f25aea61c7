// Shared front of the free collectives: the element types of the send and receive buffers must
// match, and both are turned into spans (Views fenced) before any size check or call.
#pragma once

#include <type_traits>

#include "relayout/comm/buffer.hpp"
#include "relayout/comm/communicator.hpp"
#include "relayout/comm/impl/checks.hpp"

namespace relayout::impl {

template <class S, class R>
inline constexpr bool same_element =
    std::is_same_v<std::remove_const_t<buffer_element_t<S>>, buffer_element_t<R>>;

}  // namespace relayout::impl

#define RELAYOUT_SAME_ELEMENT_ASSERT(S, R)                                                      \
  static_assert(::relayout::impl::same_element<S, R>,                                          \
                "relayout: send and recv buffers must hold the same element type (convert first; " \
                "collectives never convert between float, bf16, fp16, ...)")
