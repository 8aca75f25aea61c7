// The engine's router and experts as the bridge's run sees them: references with their calls
// bound once (RouterRef, ExpertsRef), so a run is compiled once per (communicator, element type,
// execution space) and not again for every engine model. One indirect call per router or experts
// call: a layer makes a handful.
#pragma once

#include <concepts>
#include <type_traits>

#include "relayout/placement/experts.hpp"

namespace relayout::impl {

template <class T, class Space>
class RouterRef {
 public:
  template <RouterFor<T, Space> R>
    requires(!std::same_as<std::remove_const_t<R>, RouterRef>)  // a copy is a copy, not a wrapper
  explicit RouterRef(R& r)
      : obj_(const_cast<void*>(static_cast<const void*>(&r))), top_k_(static_cast<int>(r.top_k())), call_([](void* o, const Space& exec, const RowsView<T, Space>& x,
                                                                 TopK<T, Space>& out) { (*static_cast<R*>(o))(exec, x, out); }) {}
  int top_k() const { return top_k_; }
  void operator()(const Space& exec, const RowsView<T, Space>& x, TopK<T, Space>& out) const { call_(obj_, exec, x, out); }

 private:
  void* obj_;
  int top_k_;
  void (*call_)(void*, const Space&, const RowsView<T, Space>&, TopK<T, Space>&);
};

// The experts, their shared expert and in-place combine when they have them (null otherwise), and
// whether they read an indexed batch.
template <class T, class Space>
class ExpertsRef {
 public:
  using Rows = RowsView<T, Space>;
  template <ExpertsFor<T, Space> E>
    requires(!std::same_as<std::remove_const_t<E>, ExpertsRef>)  // a copy is a copy, not a wrapper
  explicit ExpertsRef(E& e)
      : obj_(const_cast<void*>(static_cast<const void*>(&e))), reads_indexed_(ReadsIndexedRows<E>),
        call_([](void* o, const Space& exec, const ExpertBatch<T, Space>& b, const Rows& y) { (*static_cast<E*>(o))(exec, b, y); }) {
    if constexpr (HasSharedExpert<E, T, Space>)
      shared_ = [](void* o, const Space& exec, const Rows& x, const Rows& y) { static_cast<E*>(o)->shared(exec, x, y); };
    if constexpr (CombinesIntoRows<E, T, Space>)
      combine_ = [](void* o, const Space& exec, const ExpertBatch<T, Space>& b, const ExpertDestinations<T, Space>& d,
                    const Rows& out) { static_cast<E*>(o)->combine_into(exec, b, d, out); };
  }
  void operator()(const Space& exec, const ExpertBatch<T, Space>& b, const Rows& y) const { call_(obj_, exec, b, y); }
  bool has_shared() const { return shared_ != nullptr; }
  void shared(const Space& exec, const Rows& x, const Rows& y) const { shared_(obj_, exec, x, y); }
  bool reads_indexed() const { return reads_indexed_; }
  // local_experts' in-place combine, taken only when the engine's experts have one.
  bool combines_into() const { return combine_ != nullptr; }
  void combine_into(const Space& exec, const ExpertBatch<T, Space>& b, const ExpertDestinations<T, Space>& d,
                    const Rows& out) const {
    combine_(obj_, exec, b, d, out);
  }

 private:
  void* obj_;
  bool reads_indexed_;
  void (*call_)(void*, const Space&, const ExpertBatch<T, Space>&, const Rows&);
  void (*shared_)(void*, const Space&, const Rows&, const Rows&) = nullptr;
  void (*combine_)(void*, const Space&, const ExpertBatch<T, Space>&, const ExpertDestinations<T, Space>&,
                   const Rows&) = nullptr;
};

}  // namespace relayout::impl
