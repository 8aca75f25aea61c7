// Speculative sampling (docs/dspark.md#sampled-acceptance): the acceptance rule that makes the
// committed tokens distributed exactly as the target's own samples, whatever the draft proposes.
// Host-side decision code on plain probability vectors; the uniforms come from the caller, so a sync
// group can draw them once and broadcast the outcome (SpecTpSync, site ACCEPT_SAMPLE).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "relayout/mesh/error.hpp"

namespace relayout::spec {

// softmax(logits / temperature). Throws LayoutError (input "--temperature") unless the temperature
// is finite and > 0.
inline std::vector<double> softmax(std::span<const double> logits, double temperature) {
  if (!(temperature > 0) || !std::isfinite(temperature)) {
    std::ostringstream o;
    o << "--temperature must be finite and > 0, got " << temperature;
    throw LayoutError("--temperature", o.str());
  }
  std::vector<double> p(logits.begin(), logits.end());
  if (p.empty()) return p;
  const double mx = *std::max_element(p.begin(), p.end());
  double total = 0;
  for (double& v : p) total += v = std::exp((v - mx) / temperature);
  for (double& v : p) v /= total;
  return p;
}

// The index whose cumulative probability first exceeds u (u in [0, 1)); p need not be normalised.
inline int sample_index(std::span<const double> p, double u) {
  double total = 0;
  for (double v : p) total += v;
  double acc = 0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    acc += p[i];
    if (u * total < acc) return int(i);
  }
  for (std::size_t i = p.size(); i-- > 0;)  // rounding left u * total at the end: the last non-zero
    if (p[i] > 0) return int(i);
  return 0;
}

struct AcceptOutcome {
  int accepted = 0;  // draft tokens kept
  int token = 0;     // the token committed after them: the resampled correction, or the bonus
};

// The standard rule over k draft tokens: draft token d[j] (drawn from q[j]) is accepted when
// u_accept[j] < min(1, p[j][d[j]] / q[j][d[j]]); at the first rejection the next token is drawn
// from normalize(max(0, p[j] - q[j])) with u_final; if all k are accepted, the bonus token is drawn
// from p[k]. p holds k + 1 target distributions, q the k draft distributions.
inline AcceptOutcome speculative_accept(const std::vector<std::vector<double>>& p, const std::vector<std::vector<double>>& q,
                                        std::span<const int> draft, std::span<const double> u_accept, double u_final) {
  const std::size_t k = draft.size();
  if (p.size() != k + 1 || q.size() != k || u_accept.size() != k)
    throw LayoutError("draft", "speculative_accept: " + std::to_string(k) + " draft tokens need " +
                                   std::to_string(k + 1) + " target and " + std::to_string(k) +
                                   " draft distributions and uniforms, got " + std::to_string(p.size()) + ", " +
                                   std::to_string(q.size()) + " and " + std::to_string(u_accept.size()));
  for (std::size_t j = 0; j < k; ++j) {
    const std::size_t x = std::size_t(draft[j]);
    if (x >= p[j].size() || p[j].size() != q[j].size())
      throw LayoutError("draft", "speculative_accept: draft token " + std::to_string(draft[j]) +
                                     " is not in a vocabulary of " + std::to_string(p[j].size()));
    if (q[j][x] > 0 && u_accept[j] < std::min(1.0, p[j][x] / q[j][x])) continue;
    std::vector<double> residual(p[j].size());
    double mass = 0;
    for (std::size_t v = 0; v < residual.size(); ++v) mass += residual[v] = std::max(0.0, p[j][v] - q[j][v]);
    // p == q leaves no residual (and rejects only by rounding): draw from p itself.
    return {int(j), mass > 0 ? sample_index(residual, u_final) : sample_index(p[j], u_final)};
  }
  return {int(k), sample_index(p[k], u_final)};
}

}  // namespace relayout::spec
