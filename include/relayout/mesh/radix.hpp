// One mixed-radix rank layout (a shape:stride map, fastest axis last) that answers coordinates and
// group membership for any ordered factorization of a rank range. Both the attention (dp, cp, tp)
// and the MoE (moe_dp, moe_ep, moe_tp) orders are instances of it; nothing else indexes ranks.
#pragma once

#include <array>
#include <cstddef>

namespace relayout {

template <std::size_t N>
struct MixedRadix {
  std::array<int, N> shape{};  // slowest axis first

  constexpr int size() const {
    int n = 1;
    for (int s : shape) n *= s;
    return n;
  }
  constexpr int stride(std::size_t axis) const {
    int s = 1;
    for (std::size_t a = axis + 1; a < N; ++a) s *= shape[a];
    return s;
  }
  constexpr std::array<int, N> coords(int index) const {
    std::array<int, N> c{};
    for (std::size_t a = 0; a < N; ++a) c[a] = (index / stride(a)) % shape[a];
    return c;
  }
  constexpr int index(const std::array<int, N>& c) const {
    int r = 0;
    for (std::size_t a = 0; a < N; ++a) r += c[a] * stride(a);
    return r;
  }

  // A group is the set of indices that agree on every axis outside `free` (a bit mask of axes).
  // Members are ordered by the free axes in this layout's order (the "group rank").
  constexpr int group_size(unsigned free) const {
    int n = 1;
    for (std::size_t a = 0; a < N; ++a)
      if (free & (1u << a)) n *= shape[a];
    return n;
  }
  constexpr int group_count(unsigned free) const { return size() / group_size(free); }
  // Which group `index` belongs to: its fixed coordinates read as a mixed-radix number.
  constexpr int group_id(int index, unsigned free) const {
    const auto c = coords(index);
    int id = 0;
    for (std::size_t a = 0; a < N; ++a)
      if (!(free & (1u << a))) id = id * shape[a] + c[a];
    return id;
  }
  // Position of `index` inside its group: its free coordinates read as a mixed-radix number.
  constexpr int group_rank(int index, unsigned free) const {
    const auto c = coords(index);
    int pos = 0;
    for (std::size_t a = 0; a < N; ++a)
      if (free & (1u << a)) pos = pos * shape[a] + c[a];
    return pos;
  }
  // The member at position `pos` of group number `id`.
  constexpr int group_member(int id, int pos, unsigned free) const {
    std::array<int, N> c{};
    for (std::size_t a = N; a-- > 0;) {
      if (free & (1u << a)) {
        c[a] = pos % shape[a];
        pos /= shape[a];
      } else {
        c[a] = id % shape[a];
        id /= shape[a];
      }
    }
    return index(c);
  }
};

}  // namespace relayout
