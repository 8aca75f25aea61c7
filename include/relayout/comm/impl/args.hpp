// Shared front of the free collectives: the element types of the send and receive buffers must
// match, and both are turned into spans (Views fenced) before any size check or call.
#pragma once

#include <exception>
#include <source_location>
#include <type_traits>

#include "relayout/comm/agreement.hpp"
#include "relayout/comm/buffer.hpp"
#include "relayout/comm/communicator.hpp"
#include "relayout/comm/impl/checks.hpp"

namespace relayout::impl {

template <class S, class R>
inline constexpr bool same_element =
    std::is_same_v<std::remove_const_t<buffer_element_t<S>>, buffer_element_t<R>>;

template <class B>
constexpr const char* dtype_of() {
  return scalar_name<std::remove_const_t<buffer_element_t<B>>>();
}

template <class C>
concept AgreeingCommunicator = requires(const C& c, const CollectiveCall& call) { c.agree(call); };

// One free collective in flight: the body validates its arguments, fills `call` and calls agree()
// right before the backend call. A backend without an agreement exchange skips it.
template <class C>
class CollectiveScope {
 public:
  CollectiveScope(const C& comm, CollectiveKind kind, const char* dtype, std::source_location site)
      : comm_(comm) {
    call.kind = kind;
    call.dtype = dtype;
    call.site = site;
  }
  void agree() {
    agreed_ = true;
    if constexpr (AgreeingCommunicator<C>) comm_.agree(call);
  }
  // This member's arguments failed validation: the others are told, so every member throws
  // CollectiveMismatch (naming this member and its error) instead of the others waiting forever.
  void refuse(const char* why) {
    if (agreed_) return;
    agreed_ = true;
    call.local_error = why;
    if constexpr (AgreeingCommunicator<C>) comm_.agree(call);
  }

  CollectiveCall call;

 private:
  const C& comm_;
  bool agreed_ = false;
};

// Runs body(scope); a validation error before agree() goes through refuse() first, so with checks
// on every member throws alike (with checks off, or on one rank, the error leaves as thrown).
template <class C, class Body>
void run_collective(const C& comm, CollectiveKind kind, const char* dtype, std::source_location site,
                    Body&& body) {
  CollectiveScope<C> scope(comm, kind, dtype, site);
  try {
    body(scope);
  } catch (const std::exception& e) {
    scope.refuse(e.what());
    throw;
  }
}

}  // namespace relayout::impl

#define RELAYOUT_SAME_ELEMENT_ASSERT(S, R)                                                      \
  static_assert(::relayout::impl::same_element<S, R>,                                          \
                "relayout: send and recv buffers must hold the same element type (convert first; " \
                "collectives never convert between float, bf16, fp16, ...)")
