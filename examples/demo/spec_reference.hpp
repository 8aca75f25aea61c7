// The plain single-rank loops the speculative decoder (decoder.hpp) is checked against: no
// SpecDecoder, no DistributedModel, no communicator, no KV cache. Every forward recomputes the whole
// sequence on the reference layers (reference.hpp, double accumulation).
//  - greedy_decode: the target's own greedy decode, one token per step, no draft at all;
//  - speculative_decode: a single-rank speculative-sampling run (the draft proposes k tokens, the
//    target scores k + 1 positions, spec::speculative_accept decides) with the same draws.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "demo/decoder.hpp"
#include "demo/model/reference.hpp"
#include "demo/spec_head.hpp"
#include "relayout/spec/sampling.hpp"

namespace relayout::spec::plain {

// A model of the loop: the target or the MoE draft (its reference layers), or the dense draft.
struct PlainModel {
  model::ModelDims dims;
  std::vector<model::LayerFull> layers;  // empty: the dense draft
  reference::Matrix w1, w2;              // dense draft: I x H and H x I
  std::vector<double> norm;

  static PlainModel layers_of(const model::ModelDims& d) {
    PlainModel m{d, {}, {}, {}, {}};
    for (int l = 0; l < d.layers; ++l) m.layers.push_back(model::LayerFull::make(d, l));
    return m;
  }
  // h = x + W2 silu(W1 rms_norm(x)) with the target's layer-0 shared-expert weights and norm.
  static PlainModel dense_of(const SpecConfig& cfg) {
    const int H = cfg.target_dims.hidden, I = cfg.dense_inter;
    const std::uint64_t s = cfg.target_dims.seed;
    PlainModel m{cfg.target_dims, {}, reference::Matrix(I, H), reference::Matrix(H, I), {}};
    const auto k1 = model::tensor_key(s, 0, model::Tensor::shared_w1), k2 = model::tensor_key(s, 0, model::Tensor::shared_w2),
               kn = model::tensor_key(s, 0, model::Tensor::attn_norm);
    for (int i = 0; i < I; ++i)
      for (int f = 0; f < H; ++f) {
        m.w1(i, f) = model::counter_uniform(k1, std::uint64_t(i) * H + f, 1.0f / std::sqrt(float(H)));
        m.w2(f, i) = model::counter_uniform(k2, std::uint64_t(f) * I + i, 1.0f / std::sqrt(float(I)));
      }
    for (int f = 0; f < H; ++f) m.norm.push_back(model::counter_norm_weight(kn, std::uint64_t(f)));
    return m;
  }

  // The output row of the last of `tokens` (the whole sequence, causal).
  std::vector<double> last_row(const SpecConfig& cfg, const std::vector<int>& tokens) const {
    const int H = dims.hidden, n = int(tokens.size());
    reference::Matrix x(n, H);
    for (int i = 0; i < n; ++i)
      for (int f = 0; f < H; ++f) x(i, f) = head::embed(cfg.seed, tokens[std::size_t(i)], f, H);
    if (layers.empty()) return dense(x, n - 1);
    for (const model::LayerFull& w : layers) x = model::reference_layer(dims, w, x, {0, n});
    return {x.row(n - 1), x.row(n - 1) + H};
  }

 private:
  std::vector<double> dense(const reference::Matrix& x, int r) const {
    const int H = dims.hidden, I = w1.rows;
    double ss = 0;
    for (int f = 0; f < H; ++f) ss += x(r, f) * x(r, f);
    const double inv = 1.0 / std::sqrt(ss / H + 1e-6);
    std::vector<double> u(std::size_t(I), 0.0), out(x.row(r), x.row(r) + H);
    for (int i = 0; i < I; ++i) {
      for (int f = 0; f < H; ++f) u[std::size_t(i)] += w1(i, f) * x(r, f) * inv * norm[std::size_t(f)];
      u[std::size_t(i)] /= 1.0 + std::exp(-u[std::size_t(i)]);
    }
    for (int f = 0; f < H; ++f)
      for (int i = 0; i < I; ++i) out[std::size_t(f)] += w2(f, i) * u[std::size_t(i)];
    return out;
  }
};

inline std::vector<double> next_logits(const SpecConfig& cfg, const PlainModel& m, const std::vector<int>& tokens) {
  const std::vector<double> h = m.last_row(cfg, tokens);
  return head::logits(cfg.seed, cfg.vocab, cfg.hidden_weight, h.data(), m.dims.hidden, tokens.back());
}

// The target's greedy decode of request `id`: its prompt, then argmax tokens until `length` tokens.
inline std::vector<int> greedy_decode(const SpecConfig& cfg, const PlainModel& target, int id, std::size_t length) {
  std::vector<int> t = prompt_tokens(cfg, id);
  while (t.size() < length) t.push_back(head::argmax(next_logits(cfg, target, t)));
  return t;
}

// A single-rank speculative-sampling run of request `id` over cfg.rounds rounds.
inline RequestRecord speculative_decode(const SpecConfig& cfg, const PlainModel& draft, const PlainModel& target, int id) {
  RequestRecord rec{id, {}, prompt_tokens(cfg, id)};
  const int k = cfg.draft_tokens();
  for (int r = 0; r < cfg.rounds; ++r) {
    std::vector<int> seq = rec.committed, proposed;
    std::vector<std::vector<double>> p, q;
    std::vector<double> u;
    for (int j = 0; j < k; ++j) {
      q.push_back(softmax(next_logits(cfg, draft, seq), cfg.temperature));
      seq.push_back(sample_index(q.back(), head::uniform(cfg.seed, id, r, j, head::Draw::draft)));
      proposed.push_back(seq.back());
      u.push_back(head::uniform(cfg.seed, id, r, j, head::Draw::accept));
    }
    for (int j = 0; j <= k; ++j)  // the target at the k + 1 positions (its prefixes)
      p.push_back(softmax(next_logits(cfg, target, std::vector<int>(seq.begin(), seq.end() - (k - j))), cfg.temperature));
    const AcceptOutcome o = speculative_accept(p, q, proposed, u, head::uniform(cfg.seed, id, r, k, head::Draw::final));
    rec.accepted.push_back(o.accepted);
    rec.committed.insert(rec.committed.end(), proposed.begin(), proposed.begin() + o.accepted);
    rec.committed.push_back(o.token);
  }
  return rec;
}

}  // namespace relayout::spec::plain
