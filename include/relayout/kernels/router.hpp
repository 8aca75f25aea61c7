// MoE router: scores from the gate logits (softmax or sigmoid), optional score-correction bias
// (DeepSeek-V3 style: it steers the choice, not the weights), optional group-limited choice
// (n_group / topk_group), top-k with deterministic ties (lower id wins), renormalisation and the
// routed scaling factor.
#pragma once

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <string>

#include "relayout/comm/scalar.hpp"
#include "relayout/kernels/error.hpp"
#include "relayout/kernels/impl/simd.hpp"
#include "relayout/kernels/types.hpp"

namespace relayout::kernels {

enum class Scoring { softmax, sigmoid };

struct RouterConfig {
  int top_k = 1;
  Scoring scoring = Scoring::softmax;
  // Group-limited routing: experts split into n_group contiguous groups; only the topk_group best
  // groups are eligible. A group's score is its best expert score, or, with a correction bias, the
  // sum of its two best biased scores (as DeepSeek-V3). n_group = 1 disables it.
  int n_group = 1;
  int topk_group = 1;
  bool renormalize = true;             // weights /= sum of the chosen top_k weights
  double routed_scaling_factor = 1.0;  // applied after renormalisation
};

namespace impl {

// (value, id) ordering: higher value first, lower id on ties.
template <class T>
KOKKOS_FORCEINLINE_FUNCTION bool ranks_before(T v, int id, T w, int jd) {
  return v > w || (v == w && id < jd);
}

template <class L, class B, class I, class W>
struct Route {
  using T = typename W::non_const_value_type;
  L logits;
  B bias;  // extent 0: none
  I ids;
  W weights;
  int n_experts, top_k, n_group, topk_group;
  bool sigmoid, renormalize;
  T scaling;

  // Rows of up to kScored experts keep their scores in a local array: each exponential is taken once
  // (a row of 16 experts, top-4, took 84 before, over half of the routing time). Wider rows compute
  // a score again wherever it is read. Both give the same bits: a score is the same expression.
  static constexpr int kScored = 512;
  static constexpr int kTopLocal = 64;  // top-k lists up to this long are built in one pass

  // Score of expert e for token t; for softmax, mx and inv_sum are the row's max and 1/sum.
  KOKKOS_INLINE_FUNCTION T score(std::int64_t t, int e, T mx, T inv_sum) const {
    const T x = T(logits(t, e));
    return sigmoid ? T(1) / (T(1) + impl::exp(-x)) : impl::exp(x - mx) * inv_sum;
  }

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t t) const {
    const bool kept = n_experts <= kScored;
    T s[kScored];
    T mx = T(0), inv_sum = T(1);
    if (!sigmoid) {
      mx = T(logits(t, 0));
      for (int e = 1; e < n_experts; ++e) mx = impl::max(mx, T(logits(t, e)));
      T sum = T(0);
      for (int e = 0; e < n_experts; ++e) {
        const T x = impl::exp(T(logits(t, e)) - mx);
        if (kept) s[e] = x;
        sum += x;
      }
      inv_sum = T(1) / sum;
    }
    if (!kept) return select(t, [&](int e) { return score(t, e, mx, inv_sum); });
    for (int e = 0; e < n_experts; ++e) s[e] = sigmoid ? T(1) / (T(1) + impl::exp(-T(logits(t, e)))) : s[e] * inv_sum;
    select(t, [&](int e) { return s[e]; });
  }

  // The eligible groups, the top-k and the weights of row t from its scores (score_of(e)).
  template <class ScoreOf>
  KOKKOS_INLINE_FUNCTION void select(const std::int64_t t, const ScoreOf& score_of) const {
    const auto choice = [&](int e) {
      const T s = score_of(e);
      return bias.extent(0) ? T(s + T(bias(e))) : s;
    };
    // Eligible groups as a bit mask (n_group <= 64 is checked on the host); each group's score
    // (its best choice, or the sum of its two best with a bias) is computed once.
    std::uint64_t groups = ~std::uint64_t(0);
    const int per = n_experts / n_group;
    if (n_group > 1) {
      T group_v[64];
      for (int g = 0; g < n_group; ++g) {
        T first = impl::neg_inf<T>(), second = impl::neg_inf<T>();
        for (int e = g * per; e < (g + 1) * per; ++e) {
          const T c = choice(e);
          if (c > first) {
            second = first;
            first = c;
          } else if (c > second) {
            second = c;
          }
        }
        group_v[g] = (bias.extent(0) && per >= 2) ? T(first + second) : first;
      }
      groups = 0;
      T prev_v = T(0);
      int prev_g = -1;
      for (int pick = 0; pick < topk_group; ++pick) {
        int best_g = -1;
        T best_v = T(0);
        for (int g = 0; g < n_group; ++g) {
          const T gv = group_v[g];
          const bool after_prev = prev_g < 0 || ranks_before(prev_v, prev_g, gv, g);
          if (after_prev && (best_g < 0 || ranks_before(gv, g, best_v, best_g))) {
            best_g = g;
            best_v = gv;
          }
        }
        groups |= std::uint64_t(1) << best_g;
        prev_g = best_g;
        prev_v = best_v;
      }
    }

    T total = T(0);
    if (top_k <= kTopLocal) {
      // One pass over the eligible experts in id order, each inserted into the sorted top-k list
      // where it ranks (an equal value never passes an earlier, lower id). A NaN choice ranks
      // last; its weight stays NaN for the route check to refuse.
      int top_e[kTopLocal];
      T top_c[kTopLocal];
      int found = 0;
      for (int g = 0; g < n_group; ++g) {
        if (!((groups >> g) & 1u)) continue;
        for (int e = g * per; e < (g + 1) * per; ++e) {
          T c = choice(e);
          if (c != c) c = impl::neg_inf<T>();
          if (found == top_k && !(c > top_c[top_k - 1])) continue;
          int j = found < top_k ? found++ : top_k - 1;
          for (; j > 0 && c > top_c[j - 1]; --j) {
            top_c[j] = top_c[j - 1];
            top_e[j] = top_e[j - 1];
          }
          top_c[j] = c;
          top_e[j] = e;
        }
      }
      for (int pick = 0; pick < top_k; ++pick) {
        ids(t, pick) = top_e[pick];
        const T w = score_of(top_e[pick]);
        weights(t, pick) = w;
        total += w;
      }
    } else {
      // Top-k wider than the list: pick k times the best expert ranked after the previous pick.
      T prev_v = T(0);
      int prev_e = -1;
      for (int pick = 0; pick < top_k; ++pick) {
        int best_e = -1;
        T best_v = T(0);
        for (int e = 0; e < n_experts; ++e) {
          if (!((groups >> (e / per)) & 1u)) continue;
          const T c = choice(e);
          const bool after_prev = prev_e < 0 || ranks_before(prev_v, prev_e, c, e);
          if (after_prev && (best_e < 0 || ranks_before(c, e, best_v, best_e))) {
            best_e = e;
            best_v = c;
          }
        }
        // Only NaN choices leave no expert: the id -1 is refused by the route check.
        ids(t, pick) = best_e;
        const T w = best_e < 0 ? T(0) : score_of(best_e);
        weights(t, pick) = w;
        total += w;
        prev_e = best_e;
        prev_v = best_v;
      }
    }
    const T f = renormalize ? T(scaling / total) : scaling;
    for (int pick = 0; pick < top_k; ++pick) weights(t, pick) *= f;
  }
};

}  // namespace impl

// For each token row of `logits` (tokens x n_experts): topk_ids (tokens x top_k, int) in ranking
// order and topk_weights (tokens x top_k). correction_bias (n_experts, may be empty) is added to
// the scores for the choice only; the weights are the unbiased scores. The weights and the bias
// are compute_t of the logits' scalar (fp32 for bf16 logits), and so is the arithmetic.
template <class ExecSpace, RowMatrixView L, MutableRowMatrixView I, MutableRowMatrixView W,
          VectorView B = Kokkos::View<const scalar_of<L>*, typename ExecSpace::memory_space>>
void route(const ExecSpace& exec, const L& logits, const RouterConfig& config, const I& topk_ids,
           const W& topk_weights, const B& correction_bias = B()) {
  static_assert(std::is_same_v<scalar_of<I>, int>, "relayout::kernels::route: topk_ids must hold int");
  static_assert(std::is_same_v<compute_t<scalar_of<L>>, scalar_of<W>> &&
                    (std::is_same_v<scalar_of<B>, scalar_of<W>> || std::is_same_v<scalar_of<B>, scalar_of<L>>),
                "relayout::kernels::route: the weights must be compute_t of the logits' scalar (the logits' own for "
                "float and double), the bias the logits' or the weights' scalar");
  using impl::require;
  using impl::str;
  const std::int64_t tokens = logits.extent(0);
  const int experts = int(logits.extent(1));
  const auto& c = config;
  require(experts >= 1, "route", "logits", "must have at least one expert column");
  require(c.n_group >= 1 && c.n_group <= 64, "route", "n_group", "must be in [1, 64], got " + str(c.n_group));
  require(experts % c.n_group == 0, "route", "n_group",
          "must divide the number of experts " + str(experts) + ", got " + str(c.n_group));
  require(c.n_group == 1 || (c.topk_group >= 1 && c.topk_group <= c.n_group), "route", "topk_group",
          "must be in [1, n_group = " + str(c.n_group) + "], got " + str(c.topk_group));
  const int eligible = c.n_group == 1 ? experts : c.topk_group * (experts / c.n_group);
  require(c.top_k >= 1 && c.top_k <= eligible, "route", "top_k",
          "must be in [1, " + str(eligible) + "] (the experts of the eligible groups), got " + str(c.top_k));
  require(topk_ids.extent(0) == std::size_t(tokens) && int(topk_ids.extent(1)) == c.top_k, "route",
          "topk_ids", "must be tokens x top_k = " + str(tokens) + " x " + str(c.top_k));
  require(topk_weights.extent(0) == std::size_t(tokens) && int(topk_weights.extent(1)) == c.top_k,
          "route", "topk_weights", "must be tokens x top_k = " + str(tokens) + " x " + str(c.top_k));
  require(correction_bias.extent(0) == 0 || int(correction_bias.extent(0)) == experts, "route",
          "correction_bias", "must be empty or hold n_experts = " + str(experts) + " entries");
  using T = scalar_of<W>;
  Kokkos::parallel_for(
      "relayout::kernels::route", Kokkos::RangePolicy<ExecSpace>(exec, 0, tokens),
      impl::Route<L, B, I, W>{logits, correction_bias, topk_ids, topk_weights, experts, c.top_k,
                              c.n_group, c.n_group == 1 ? 1 : c.topk_group,
                              c.scoring == Scoring::sigmoid, c.renormalize, T(c.routed_scaling_factor)});
}

}  // namespace relayout::kernels
