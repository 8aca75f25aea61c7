// Shared front of the free collectives: the element types of the send and receive buffers must
// match, and both are turned into spans (Views fenced, or the caller's instance) before any size
// check or call.
#pragma once

#include <algorithm>
#include <concepts>
#include <exception>
#include <source_location>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <variant>

#include "relayout/comm/agreement.hpp"
#include "relayout/comm/buffer.hpp"
#include "relayout/comm/clock.hpp"
#include "relayout/comm/communicator.hpp"
#include "relayout/comm/impl/checks.hpp"
#include "relayout/comm/request.hpp"
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

// "recv has 3 elements ...; all_reduce called at model/engine.cpp:42": an argument error names the
// caller's line (`site`, taken at the public entry), not the library's.
[[noreturn]] inline void throw_at_site(const LayoutError& e, CollectiveKind kind, std::source_location site) {
  throw LayoutError(e.input(), std::string(e.what()) + "; " + to_string(kind) + " called at " +
                                   std::string(short_file(site.file_name())) + ":" + std::to_string(site.line()));
}

// Runs body(scope) after fencing the caller's instance (`fence`: an instance or ViewSpaces); a
// validation error before agree() goes through refuse() first, so with checks on every member
// throws alike (with checks off, or on one rank, the error leaves as thrown, naming `site`).
template <class F, class C, class Body>
void run_collective(const F& fence, const C& comm, CollectiveKind kind, const char* dtype,
                    std::source_location site, Body&& body) {
  fence_instance(fence);
  const CollectiveTimer timer;  // collective_seconds() (clock.hpp): the call, not the fence
  CollectiveScope<C> scope(comm, kind, dtype, site);
  try {
    body(scope);
  } catch (const std::exception& e) {
    scope.refuse(e.what());
    if (typeid(e) == typeid(LayoutError)) throw_at_site(static_cast<const LayoutError&>(e), kind, site);
    throw;
  }
}

// A backend with nonblocking forms of the all-to-alls (MpiCommunicator); the *_start functions run
// the blocking call on the others.
template <class C, class T>
concept NonblockingAllToAll = requires(const C& c, std::span<const T> in, std::span<T> out) {
  { c.start_all_to_all(in, out) } -> std::same_as<CollectiveRequest>;
};
template <class C, class T>
concept NonblockingAllToAllv = requires(const C& c, std::span<const T> in, std::span<T> out, std::span<const int> k) {
  { c.start_all_to_allv(in, k, k, out, k, k) } -> std::same_as<CollectiveRequest>;
};

// What a started collective keeps until it completes: its counts, and copies of the Views it was
// given (a plain range stays the caller's to keep).
template <class B>
using HeldBuffer = std::conditional_t<is_kokkos_view<B>, std::remove_cvref_t<B>, std::monostate>;
template <class Counts, class S, class R>
struct Held {
  Held(Counts&& s, Counts&& r, const S& send, const R& recv)
      : counts(std::move(s), std::move(r)), send_buffer(hold(send)), recv_buffer(hold(recv)) {}
  std::tuple<Counts, Counts> counts;
  HeldBuffer<S> send_buffer;
  HeldBuffer<R> recv_buffer;

 private:
  template <class B>
  static HeldBuffer<B> hold(const B& b) {
    if constexpr (is_kokkos_view<B>) return b;
    else return {};
  }
};

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
