// A skewed top-k routing for tests and demos: every token picks top_k distinct experts with
// probability proportional to a Zipf law over them (weight of the i-th most popular: i^-s), drawn
// without replacement from counter-based random numbers of (seed, token), so each rank generates
// its own tokens and the union is the same routing however the tokens are split over ranks. A token
// is any index >= 0: a range of them (first_token + r) or one per row (the engine's token ids).
#pragma once

#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

#include <Kokkos_Core.hpp>

#include "relayout/mesh/error.hpp"

namespace relayout {

struct ZipfRouting {
  int experts = 1;
  int top_k = 1;
  double s = 1.0;           // 0: uniform
  std::uint64_t seed = 0;
  bool shuffle = false;     // false: expert e is the (e + 1)-th most popular; true: a permutation from seed
};

namespace impl {

KOKKOS_INLINE_FUNCTION constexpr std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A uniform double in [0, 1) for draw j of token t.
KOKKOS_INLINE_FUNCTION constexpr double uniform01(std::uint64_t seed, std::int64_t t, int j) {
  const std::uint64_t h = splitmix64(splitmix64(seed ^ splitmix64(static_cast<std::uint64_t>(t))) + static_cast<std::uint64_t>(j));
  return static_cast<double>(h >> 11) * 0x1p-53;
}

inline void check_zipf(const ZipfRouting& z) {
  if (z.experts < 1) throw LayoutError("experts", "zipf routing: experts = " + std::to_string(z.experts) + "; need at least 1");
  if (z.top_k < 1 || z.top_k > z.experts)
    throw LayoutError("top_k", "zipf routing: top_k = " + std::to_string(z.top_k) + " must lie in [1, experts = " +
                                   std::to_string(z.experts) + "]");
  if (!(z.s >= 0) || !std::isfinite(z.s))
    throw LayoutError("s", "zipf routing: the exponent s = " + std::to_string(z.s) + " must be finite and >= 0");
}

// The token of row r: first + r, or tokens(r).
struct TokenRange {
  std::int64_t first;
  KOKKOS_INLINE_FUNCTION std::int64_t operator()(std::int64_t r) const { return first + r; }
};
template <class V>
struct TokenList {
  V tokens;
  KOKKOS_INLINE_FUNCTION std::int64_t operator()(std::int64_t r) const { return tokens(r); }
};

template <class W, class Ids, class Token>
struct ZipfDraw {
  W weight;  // per expert, summing to 1
  Ids ids;
  std::uint64_t seed;
  Token token;
  int experts, top_k;
  // Successive draws from the experts not yet chosen (the same law as Gumbel top-k): draw j picks
  // the expert where u * (mass left) falls in the cumulative weights of the remaining experts.
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t r) const {
    const std::int64_t t = token(r);
    double left = 1.0;
    for (int j = 0; j < top_k; ++j) {
      const double target = uniform01(seed, t, j) * left;
      double acc = 0;
      int pick = -1, last_free = -1;
      for (int e = 0; e < experts && pick < 0; ++e) {
        bool taken = false;
        for (int i = 0; i < j; ++i) taken = taken || ids(r, i) == e;
        if (taken) continue;
        last_free = e;
        acc += weight(e);
        if (target < acc) pick = e;
      }
      if (pick < 0) pick = last_free;  // rounding left target just past the last free expert
      ids(r, j) = pick;
      left -= weight(pick);
    }
  }
};

}  // namespace impl

// Weight of each expert (summing to 1): the (i + 1)-th most popular gets (i + 1)^-s / sum.
inline std::vector<double> zipf_expert_weights(const ZipfRouting& z) {
  impl::check_zipf(z);
  std::vector<int> order(static_cast<std::size_t>(z.experts));  // popularity rank -> expert
  std::iota(order.begin(), order.end(), 0);
  if (z.shuffle)
    for (int i = z.experts - 1; i > 0; --i) {  // Fisher-Yates from the seed
      const auto j = static_cast<int>(impl::splitmix64(z.seed + 0x5eedull + static_cast<std::uint64_t>(i)) %
                                      static_cast<std::uint64_t>(i + 1));
      std::swap(order[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(j)]);
    }
  std::vector<double> w(order.size());
  double sum = 0;
  for (std::size_t i = 0; i < order.size(); ++i) sum += std::pow(static_cast<double>(i + 1), -z.s);
  for (std::size_t i = 0; i < order.size(); ++i)
    w[static_cast<std::size_t>(order[i])] = std::pow(static_cast<double>(i + 1), -z.s) / sum;
  return w;
}

namespace impl {

template <class ExecSpace, class Ids, class Token>
void zipf_draw(const ExecSpace& exec, const ZipfRouting& z, const Token& token, const Ids& ids) {
  static_assert(Kokkos::is_view<Ids>::value && Ids::rank == 2 && std::is_same_v<typename Ids::value_type, int>,
                "relayout::zipf_topk_ids: ids must be a writable rank-2 View of int");
  const std::vector<double> w = zipf_expert_weights(z);
  if (ids.extent(1) != static_cast<std::size_t>(z.top_k))
    throw LayoutError("ids", "zipf_topk_ids: ids has " + std::to_string(ids.extent(1)) + " columns; top_k is " +
                                 std::to_string(z.top_k));
  using Mem = typename Ids::memory_space;
  Kokkos::View<double*, Mem> weight(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("relayout::zipf_weights")),
                                    w.size());
  Kokkos::View<const double*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> hw(w.data(), w.size());
  Kokkos::deep_copy(exec, weight, hw);
  Kokkos::parallel_for("relayout::zipf_topk_ids",
                       Kokkos::RangePolicy<ExecSpace>(exec, 0, static_cast<std::int64_t>(ids.extent(0))),
                       ZipfDraw<decltype(weight), Ids, Token>{weight, ids, z.seed, token, z.experts, z.top_k});
  exec.fence();  // w, the host source of the copy, ends with this call
}

}  // namespace impl

// ids(r, j) for r in [0, ids.extent(0)): the j-th expert of token first_token + r, on exec
// (asynchronous). ids is a rank-2 int View rows x top_k accessible from exec.
template <class ExecSpace, class Ids>
void zipf_topk_ids(const ExecSpace& exec, const ZipfRouting& z, std::int64_t first_token, const Ids& ids) {
  if (first_token < 0)
    throw LayoutError("first_token", "zipf_topk_ids: first_token = " + std::to_string(first_token) + " must be >= 0");
  impl::zipf_draw(exec, z, impl::TokenRange{first_token}, ids);
}

// ids(r, j): the j-th expert of token tokens(r), for rows whose tokens are not a range (an engine's
// token ids in any order). tokens is a rank-1 View of int64 accessible from exec, one per row of
// ids; a token's experts are those the range overload gives it.
template <class ExecSpace, class Tokens, class Ids>
  requires(Kokkos::is_view<Tokens>::value)
void zipf_topk_ids(const ExecSpace& exec, const ZipfRouting& z, const Tokens& tokens, const Ids& ids) {
  static_assert(Tokens::rank == 1 && std::is_same_v<typename Tokens::non_const_value_type, std::int64_t>,
                "relayout::zipf_topk_ids: tokens must be a rank-1 View of std::int64_t");
  if (tokens.extent(0) != ids.extent(0))
    throw LayoutError("tokens", "zipf_topk_ids: " + std::to_string(tokens.extent(0)) + " tokens for " +
                                    std::to_string(ids.extent(0)) + " rows of ids");
  std::int64_t negative = 0;
  Kokkos::parallel_reduce(
      "relayout::zipf_tokens_check", Kokkos::RangePolicy<ExecSpace>(exec, 0, static_cast<std::int64_t>(tokens.extent(0))),
      KOKKOS_LAMBDA(const std::int64_t r, std::int64_t& n) { n += tokens(r) < 0 ? 1 : 0; }, negative);
  if (negative > 0)
    throw LayoutError("tokens", "zipf_topk_ids: " + std::to_string(negative) + " token id(s) < 0; token ids must be >= 0");
  impl::zipf_draw(exec, z, impl::TokenList<Tokens>{tokens}, ids);
}

}  // namespace relayout
