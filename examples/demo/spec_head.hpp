// The toy language-model ends shared by the speculative decoder (decoder.hpp) and its plain
// single-rank reference (spec_reference.hpp): the token embedding (the row a token feeds in), the
// vocabulary head (logits of a hidden row) and the counter-based uniforms the samplers draw, keyed
// by what they decide, never by the layout, so any layout and the reference draw the same numbers.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "demo_model/weights.hpp"
#include "demo_model/workload.hpp"

namespace relayout::spec::head {

// Feature f of the input row of token `token` (an embedding table, hidden wide).
inline float embed(std::uint64_t seed, int token, int f, int hidden) {
  return model::input_value(seed ^ 0xE3BEDull, std::int64_t(token), f, hidden);
}

// logits[v] = 2 bigram(prev, v) + w * proj(v) . rms_normalised(h) / sqrt(H): prev is the token the
// row fed in, h its output row (hidden wide). The draft and the target share the head.
inline std::vector<double> logits(std::uint64_t seed, int vocab, double w, const double* h, int hidden, int prev) {
  double ss = 0;
  for (int f = 0; f < hidden; ++f) ss += h[f] * h[f];
  const double inv = 1.0 / std::sqrt(ss / hidden + 1e-6);
  const auto bigram = model::tensor_key(seed, 1001, model::Tensor::embedding);
  const auto proj = model::tensor_key(seed, 1002, model::Tensor::router, 2);
  std::vector<double> z(std::size_t(vocab), 0.0);
  for (int v = 0; v < vocab; ++v) {
    double dot = 0;
    for (int f = 0; f < hidden; ++f)
      dot += double(model::counter_uniform(proj, std::uint64_t(v) * std::uint64_t(hidden) + std::uint64_t(f), 1.0f)) *
             h[f] * inv;
    z[std::size_t(v)] =
        2.0 * double(model::counter_uniform(bigram, std::uint64_t(prev) * std::uint64_t(vocab) + std::uint64_t(v), 1.0f)) +
        w * dot / std::sqrt(double(hidden));
  }
  return z;
}

inline int argmax(const std::vector<double>& z) {
  int best = 0;
  for (std::size_t v = 1; v < z.size(); ++v)
    if (z[v] > z[std::size_t(best)]) best = int(v);
  return best;
}

// What a uniform decides: a draft token, the acceptance of draft token j, the round's final token
// (the resampled correction or the bonus).
enum class Draw : std::uint64_t { draft = 1, accept = 2, final = 3 };

// Uniform in [0, 1) for draw `what` of request `id` at (round, j). rank >= 0 (--rank-local-rng)
// keys it by that rank too: then only SpecTpSync makes a group's decisions agree.
inline double uniform(std::uint64_t seed, int id, int round, int j, Draw what, int rank = -1) {
  std::uint64_t key = seed * 0x9E3779B97F4A7C15ull + 5 + std::uint64_t(what) * 0x100000001B3ull;
  if (rank >= 0) key ^= model::mix64(std::uint64_t(rank) + 0x51ull);
  const std::uint64_t at = (std::uint64_t(id) << 32) ^ (std::uint64_t(round) << 12) ^ std::uint64_t(j);
  return 0.5 + 0.5 * double(model::counter_uniform(model::TensorKey{model::mix64(key)}, at, 1.0f));
}

}  // namespace relayout::spec::head
