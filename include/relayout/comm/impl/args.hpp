// Shared front of the free collectives: the element types of the send and receive buffers must
// match, and both are turned into spans (Views fenced, or the caller's instance) before any size
// check or call.
#pragma once

#include <algorithm>
#include <exception>
#include <source_location>
#include <span>
#include <type_traits>

#include "relayout/comm/agreement.hpp"
#include "relayout/comm/buffer.hpp"
#include "relayout/comm/communicator.hpp"
#include "relayout/comm/impl/checks.hpp"
#include "relayout/comm/single.hpp"

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

// Runs body(scope) after fencing the caller's instance (`fence`: an instance or ViewSpaces); a
// validation error before agree() goes through refuse() first, so with checks on every member
// throws alike (with checks off, or on one rank, the error leaves as thrown).
template <class F, class C, class Body>
void run_collective(const F& fence, const C& comm, CollectiveKind kind, const char* dtype,
                    std::source_location site, Body&& body) {
  fence_instance(fence);
  CollectiveScope<C> scope(comm, kind, dtype, site);
  try {
    body(scope);
  } catch (const std::exception& e) {
    scope.refuse(e.what());
    throw;
  }
}

// The data-moving call of a collective from send (S) to recv (R). A single-rank group copies: a
// View with Kokkos::deep_copy (on the caller's instance, fenced before returning, or blocking),
// so device memory is never read on the host; plain ranges with std::copy. Other backends: call().
template <class S, class R, class F, class C, class T, class Call>
void transfer(const F& fence, const C&, std::span<const T> in, std::span<T> out, Call&& call) {
  if constexpr (std::is_same_v<C, SingleRankCommunicator> && (is_kokkos_view<S> || is_kokkos_view<R>)) {
    const Kokkos::View<const T*, memory_space_of<S>, Kokkos::MemoryUnmanaged> src(in.data(), in.size());
    const Kokkos::View<T*, memory_space_of<R>, Kokkos::MemoryUnmanaged> dst(out.data(), out.size());
    if constexpr (std::is_same_v<F, ViewSpaces>) {
      Kokkos::deep_copy(dst, src);
    } else {
      Kokkos::deep_copy(fence, dst, src);
      fence.fence();  // complete on return, as every backend's collective is
    }
  } else {
    call();
  }
}

}  // namespace relayout::impl

#define RELAYOUT_SAME_ELEMENT_ASSERT(S, R)                                                      \
  static_assert(::relayout::impl::same_element<S, R>,                                          \
                "relayout: send and recv buffers must hold the same element type (convert first; " \
                "collectives never convert between float, bf16, fp16, ...)")
