// Size and count validation shared by every collective. Each check runs before any communication
// call, on every rank, so a mismatch is an exception naming the counts rather than a hang or an
// overrun.
#pragma once

#include <algorithm>
#include <climits>
#include <concepts>
#include <cstdint>
#include <memory>
#include <ranges>
#include <span>
#include <string>

#include "relayout/mesh/error.hpp"

namespace relayout {

// Per-rank element counts: any sized random-access range of integers (std::vector<int>,
// std::span<const std::int64_t>, ...).
template <class R>
concept CountRange = std::ranges::random_access_range<R> && std::ranges::sized_range<R> &&
                     std::integral<std::remove_cvref_t<std::ranges::range_reference_t<R>>>;

namespace impl {

// int counts for the communication libraries; inline storage for the usual group sizes so a
// v-collective does not allocate.
class IntCounts {
 public:
  explicit IntCounts(std::size_t n) : n_(n) {
    if (n > kInline) heap_ = std::make_unique<int[]>(n);
  }
  int* data() { return heap_ ? heap_.get() : inline_; }
  const int* data() const { return heap_ ? heap_.get() : inline_; }
  std::size_t size() const { return n_; }
  int& operator[](std::size_t i) { return data()[i]; }
  int operator[](std::size_t i) const { return data()[i]; }
  std::span<const int> span() const { return {data(), n_}; }

 private:
  static constexpr std::size_t kInline = 64;
  std::size_t n_;
  int inline_[kInline];
  std::unique_ptr<int[]> heap_;
};

inline std::string count_text(std::size_t n) { return std::to_string(n); }

inline void require_fits_int(std::size_t n, const char* what) {
  if (n > static_cast<std::size_t>(INT_MAX))
    throw LayoutError(what, std::string(what) + " has " + count_text(n) +
                                " elements; a single collective moves at most INT_MAX (" +
                                std::to_string(INT_MAX) + ") elements per rank");
}

// `rule` is a literal: nothing is built unless the check fails (this runs on every call).
inline void require_size(std::size_t actual, std::size_t expected, const char* what, const char* rule) {
  if (actual != expected)
    throw LayoutError(what, std::string(what) + " has " + count_text(actual) +
                                " elements but must have " + count_text(expected) + " (" + std::string(rule) + ")");
}

template <class T, class U>
void require_disjoint(std::span<T> a, std::span<U> b, const char* call) {
  const auto* a0 = reinterpret_cast<const std::byte*>(a.data());
  const auto* b0 = reinterpret_cast<const std::byte*>(b.data());
  if (a.empty() || b.empty()) return;
  if (a0 < b0 + b.size_bytes() && b0 < a0 + a.size_bytes())
    throw LayoutError("recv", std::string(call) + ": send and recv buffers overlap; use " + call +
                                  "_in_place to reuse one buffer");
}

inline void require_root(int root, int size) {
  if (root < 0 || root >= size)
    throw LayoutError("root", "broadcast root " + std::to_string(root) +
                                  " is not a rank of this group: it must be in [0, " +
                                  std::to_string(size) + ")");
}

// Checks `counts` (one entry per rank, none negative, each fitting an int) and returns them as
// ints together with their sum and packed displacements.
struct CheckedCounts {
  // Constructed in place and returned by NRVO: brace-initialising the two inline arrays from
  // temporaries cost ~10x more than the collective's own checks.
  explicit CheckedCounts(std::size_t n) : counts(n), displs(n) {}
  IntCounts counts;
  IntCounts displs;
  std::size_t total = 0;
};

template <CountRange R>
CheckedCounts checked_counts(const R& counts, int group_size, const char* what) {
  const std::size_t n = std::ranges::size(counts);
  if (n != static_cast<std::size_t>(group_size))
    throw LayoutError(what, std::string(what) + " has " + count_text(n) +
                                " entries but the group has " + std::to_string(group_size) +
                                " ranks: give one count per rank");
  CheckedCounts out(n);
  std::size_t i = 0;
  for (auto c : counts) {
    const auto v = static_cast<long long>(c);
    if (v < 0 || v > INT_MAX)
      throw LayoutError(what, std::string(what) + "[" + std::to_string(i) + "] = " +
                                  std::to_string(v) + ": a count must be in [0, INT_MAX]");
    out.displs[i] = static_cast<int>(out.total);
    out.counts[i] = static_cast<int>(v);
    out.total += static_cast<std::size_t>(v);
    ++i;
  }
  require_fits_int(out.total, what);
  return out;
}

}  // namespace impl
}  // namespace relayout
