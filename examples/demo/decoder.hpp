// A small, honest speculative decode loop on the ranks of one TP domain (docs/dspark.md), for the
// dspark_step example and the tests. The target (a DistributedModel) and the draft, derived from it
// (MoE draft: the target's first draft_layers layers, same weights, full DP/MoE participation; dense
// draft: the target's layer-0 shared-expert weights as a tensor-parallel MLP inside the draft
// context's TP group), keep per-request KV caches across rounds (the dense draft has no attention
// and needs none). The prompt is prefilled into both caches; each round the draft runs k decode
// steps (one row per request, plus the row it missed when the previous round accepted everything),
// the target verifies k + 1 rows per request in one extend forward against its cache, and the
// accepted prefix plus one target token is committed; the rejected positions are truncated in both
// caches. Committed tokens feed back through the embedding (spec_head.hpp). Greedy acceptance, or
// speculative sampling (spec/sampling.hpp). Every decision goes through SpecTpSync at its site; an
// idle attention-DP group runs every forward with zero rows.
#pragma once

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "relayout/attention.hpp"
#include "relayout/comm.hpp"
#include "relayout/kernels/linear.hpp"
#include "relayout/kernels/rms_norm.hpp"
#include "demo/model/layer.hpp"
#include "demo_model/weights.hpp"
#include "demo/spec_head.hpp"
#include "relayout/spec/draft.hpp"
#include "relayout/spec/idle.hpp"
#include "relayout/spec/sampling.hpp"
#include "relayout/spec/sync.hpp"
#include "relayout/spec/tokens.hpp"

namespace relayout::spec {

struct SpecConfig {
  std::vector<int> requests_per_group{1};  // requests per attention-DP group
  TokensPerRequest width{6};               // verify rows per request per round: k = width - 1 draft tokens + 1
  int rounds = 1;
  int vocab = 16;
  int prompt = 4;                          // prompt tokens per request
  int kv_capacity = 256;                   // kv rows per request in each cache
  bool sample = false;          // speculative sampling (DRAFT_SAMPLE, ACCEPT_SAMPLE) instead of greedy
  bool rank_local_rng = false;  // each rank seeds its sampler differently (implies sample)
  bool bypass_guard = false;    // developer experiment: skip the docs/dspark.md start-up check
  bool check_agreement = true;  // after each site, compare the decision across the sync group
  double temperature = 1.0;
  double hidden_weight = 0.4;   // weight of the hidden-row projection against the bigram table
  std::uint64_t seed = 7;       // embedding, vocabulary head, prompts and sampler
  int dense_inter = 32;         // dense draft MLP intermediate (split over the draft's TP group)
  int draft_layers = 1;         // MoE draft: the target's first draft_layers layers
  model::ModelDims target_dims = [] {
    model::ModelDims d;
    d.layers = 2;
    d.seed = 1234;
    return d;
  }();

  int draft_tokens() const { return width.value - 1; }
  // The MoE draft: the target's dims and seed (so the same weights) with fewer layers.
  model::ModelDims draft_dims() const {
    model::ModelDims d = target_dims;
    d.layers = draft_layers;
    return d;
  }
  // Rows a request's cache holds at most: the prompt (all but its last token), then k + 1 per round.
  std::int64_t kv_rows_needed() const { return std::int64_t(prompt) - 1 + std::int64_t(rounds) * width.value; }
  static std::string number(double v) {
    std::ostringstream o;
    o << v;
    return o.str();
  }
  // Throws LayoutError naming the flag for settings the loop cannot run.
  void validate() const {
    if (width.value < 2 || width.value > 64)
      throw LayoutError("--tokens-per-req", "--tokens-per-req (k draft tokens + 1 verify row) must be in [2, 64], got " +
                                                std::to_string(width.value));
    if (rounds < 1 || rounds > 1000) throw LayoutError("--rounds", "--rounds must be in [1, 1000]");
    if (vocab < 2 || vocab > 1 << 16) throw LayoutError("--vocab", "--vocab must be in [2, 65536]");
    if (prompt < 1 || prompt > 4096) throw LayoutError("--prompt", "--prompt must be in [1, 4096], got " + std::to_string(prompt));
    if (draft_layers < 1 || draft_layers > target_dims.layers)
      throw LayoutError("--draft-layers", "--draft-layers = " + std::to_string(draft_layers) +
                                              ": the MoE draft is the target's first layers, so it must be in [1, " +
                                              std::to_string(target_dims.layers) + "] (--target-layers)");
    if (sample && !(temperature > 0 && std::isfinite(temperature)))
      throw LayoutError("--temperature", "--temperature must be finite and > 0 with --sample, got " + number(temperature));
    if (kv_capacity < 1 || kv_rows_needed() > kv_capacity)
      throw LayoutError("--rounds", "--rounds " + std::to_string(rounds) + " x --tokens-per-req " +
                                        std::to_string(width.value) + " + --prompt " + std::to_string(prompt) +
                                        " - 1 = " + std::to_string(kv_rows_needed()) +
                                        " kv rows per request exceed --kv-capacity " + std::to_string(kv_capacity));
  }
};

// This group's view of one round.
struct RoundLog {
  std::map<std::string, std::vector<std::int64_t>> decisions;  // site -> values after the site (calls appended)
  std::vector<std::string> disagreed;                          // sites whose values differed in the group
};

struct RequestRecord {
  int id = 0;
  std::vector<int> accepted;   // accepted draft tokens per round
  std::vector<int> committed;  // prompt tokens, then every committed token
};

// The prompt of request `id`: `len` tokens from (seed, id), the same on every layout.
inline std::vector<int> prompt_tokens(const SpecConfig& cfg, int id) {
  std::vector<int> t;
  for (int p = 0; p < cfg.prompt; ++p)
    t.push_back(int(model::mix64(cfg.seed ^ model::mix64((std::uint64_t(id) << 20) + std::uint64_t(p) + 17)) %
                    std::uint64_t(cfg.vocab)));
  return t;
}

// One request per group member of `meta`, `width` rows each: sizes the caches (request j of the
// group is slot j).
inline model::Workload round_workload(const DpSyncMetadata& meta, int attn_dp) {
  std::vector<int> lengths, placement;
  for (std::size_t g = 0; g < meta.raw.size(); ++g)
    for (std::int64_t i = 0; i < meta.raw[g].value; ++i) {
      lengths.push_back(meta.width.value);
      placement.push_back(int(g));
    }
  return model::Workload::make(std::move(lengths), std::move(placement), attn_dp);
}

// Sink: the row-ownership trace sink of the draft and target models (trace::NullSink: no trace).
template <class C, class ExecSpace = Kokkos::DefaultExecutionSpace, class Sink = trace::NullSink>
class SpecDecoder {
 public:
  using View = typename model::LayerRows<ExecSpace>::view_type;

  // Collective over the domain. Runs the docs/dspark.md start-up check first (throws LayoutError with the
  // exact message) unless cfg.bypass_guard. Every kernel and collective of both models runs on `exec`.
  SpecDecoder(const ProcessGroupsOf<C>& groups, SpecConfig cfg, SyncSites sites = SyncSites::from_env(),
              ExecSpace exec = ExecSpace())
      : groups_(groups), cfg_(std::move(cfg)), sync_(groups, std::move(sites)), ctx_(draft_context(groups.layout())),
        exec_(exec) {
    const RuntimeLayout& layout = groups_.layout();
    if (!cfg_.bypass_guard) layout.require_dspark_allowed();
    if (layout.config().draft == Draft::none)
      throw LayoutError("--draft", "--draft none: a speculative round needs a draft model (--draft moe or --draft dense)");
    const int attn_dp = layout.widths().attn_dp;
    if (int(cfg_.requests_per_group.size()) != attn_dp)
      throw LayoutError("--requests-per-group", "--requests-per-group names " +
                                                    std::to_string(cfg_.requests_per_group.size()) +
                                                    " groups; the layout has attn_dp = " + std::to_string(attn_dp) +
                                                    " attention-DP groups: give one count per group");
    for (int n : cfg_.requests_per_group)
      if (n < 0 || n > 4096)
        throw LayoutError("--requests-per-group", "--requests-per-group: a count must be in [0, 4096], got " + std::to_string(n));
    if (cfg_.rank_local_rng) cfg_.sample = true;
    cfg_.validate();
    // The CP ranks of a DP group feed the same sequences; SpecTpSync over attn_tp would not make
    // their per-rank samplers agree (over tp it does: the CP ranks are in it).
    if (cfg_.rank_local_rng && layout.widths().attn_cp > 1 && ctx_.sync_group == GroupKind::attn_tp)
      throw LayoutError("--rank-local-rng", "--rank-local-rng with attn_cp = " + std::to_string(layout.widths().attn_cp) +
                                                " under DP attention: SpecTpSync syncs attn_tp only, so the CP ranks of a "
                                                "DP group would sample different tokens for the same requests");
    const RankCoords k = groups_.coords();
    const DpSyncMetadata meta = gather_sync_metadata(
        groups_, RequestCount{cfg_.requests_per_group[std::size_t(k.attn_dp_rank)]}, cfg_.width);
    batch_ = make_batch(meta, k.attn_dp_rank);
    for (int id : batch_.requests) records_.push_back({id, {}, prompt_tokens(cfg_, id)});
    const model::LayerOptions opts;
    const model::Workload work = round_workload(meta, attn_dp);
    if (layout.config().draft == Draft::moe) {
      draft_.emplace(groups_, cfg_.draft_dims(), opts, exec_);
      draft_->reserve_kv(work, cfg_.kv_capacity);
    } else {
      make_dense_draft();
    }
    target_.emplace(groups_, cfg_.target_dims, opts, exec_);
    target_->reserve_kv(work, cfg_.kv_capacity);
    draft_fed_.assign(records_.size(), 0);
  }

  // Trace the forwards: the MoE draft's into `draft` (a dense draft has no DistributedModel and
  // writes nothing), the target's into `target`. A record's speculative step names its forward:
  // 0 the prefill, r + 1 the target's verify of round r, 1 + r k + j the draft's decode step j of
  // round r. The verify records carry the scaled global_num_tokens.
  void trace_to(Sink& draft, Sink& target) {
    if (draft_) draft_->trace_to(draft);
    target_->trace_to(target);
  }

  // Collective: every rank runs the prefill and every round, an idle group with zero rows. Stops
  // after a round in which some sync group disagreed (check_agreement): its members would feed
  // different rows from then on.
  void run() {
    prefill();
    for (int r = 0; r < cfg_.rounds; ++r) {
      round(r);
      if (cfg_.check_agreement && any_disagreement()) break;
    }
  }

  const SpecBatch& batch() const { return batch_; }
  const DpSyncMetadata& meta() const { return batch_.meta; }
  bool idle() const { return batch_.idle(); }
  const std::vector<RequestRecord>& requests() const { return records_; }
  const std::vector<RoundLog>& rounds() const { return logs_; }
  const SpecTpSyncOf<C>& sync() const { return sync_; }
  const DraftContext& draft_context_used() const { return ctx_; }
  const SpecConfig& config() const { return cfg_; }
  bool disagreed() const {
    for (const RoundLog& l : logs_)
      if (!l.disagreed.empty()) return true;
    return false;
  }
  // Forward calls this rank made (draft, target), the prefill included: an idle rank makes as many
  // as a busy one.
  int draft_forwards() const { return draft_forwards_; }
  int target_forwards() const { return target_forwards_; }
  const model::TrafficLog& target_traffic() const { return target_->traffic(); }
  // Positions of request j of this group the target's and the draft's cache hold (0 for a dense
  // draft); under attention CP spread over the CP ranks, and the *_held figures count this rank's.
  std::int64_t target_kv(int j) const { return target_->kv_length(j); }
  std::int64_t draft_kv(int j) const { return draft_ ? draft_->kv_length(j) : 0; }
  std::int64_t target_kv_held(int j) const { return target_->kv_held(j); }
  std::int64_t draft_kv_held(int j) const { return draft_ ? draft_->kv_held(j) : 0; }

 private:
  template <class T>
  void site(RoundLog& log, const char* name, std::vector<T>& values) {
    sync_.sync(name, values);
    if (cfg_.check_agreement && !sync_.agrees(values)) {
      if (std::find(log.disagreed.begin(), log.disagreed.end(), name) == log.disagreed.end())
        log.disagreed.emplace_back(name);
    }
    auto& d = log.decisions[name];
    d.insert(d.end(), values.begin(), values.end());
  }

  // Collective over the domain: did any sync group disagree this round?
  bool any_disagreement() {
    float mine = !logs_.empty() && !logs_.back().disagreed.empty() ? 1.0f : 0.0f;
    all_reduce_in_place(groups_.comm(GroupKind::tp), std::span<float>(&mine, 1));
    return mine > 0;
  }

  // Input rows (embeddings) and owners of `tokens[j]` at `positions[j]` of request `ids[j]`.
  View embed_rows(const std::vector<int>& tokens) const {
    const int H = cfg_.target_dims.hidden;
    View x("relayout::spec::tokens_in", tokens.size(), std::size_t(H));
    const auto xh = Kokkos::create_mirror_view(x);
    for (std::size_t i = 0; i < tokens.size(); ++i)
      for (int f = 0; f < H; ++f) xh(i, std::size_t(f)) = head::embed(cfg_.seed, tokens[i], f, H);
    Kokkos::deep_copy(x, xh);
    return x;
  }

  // The rows [from_j, to_j) of each request's token sequence `seq[j]` (row p at position p) through
  // a model (extend on its cache; the dense draft row by row). Under attention CP each CP rank feeds
  // extend the rows it holds (DistributedModel::extend_cp_rank) and the outputs are all-gathered
  // over attn_cp into request order (CpAttention::gather_kv), so every rank reads every row, as
  // without CP (an engine shares the sampled tokens instead). Returns the host rows, request after
  // request.
  std::vector<double> feed(bool to_draft, const std::vector<std::vector<int>>& seq, const std::vector<int>& from,
                           const std::vector<int>& to) {
    ++(to_draft ? draft_forwards_ : target_forwards_);
    auto* m = to_draft ? (draft_ ? &*draft_ : nullptr) : &*target_;
    const int me = groups_.coords().attn_cp_rank;
    std::vector<int> counts, tokens;
    std::vector<std::int64_t> owners;
    for (std::size_t j = 0; j < seq.size(); ++j) {
      counts.push_back(to[j] - from[j]);
      for (int p = from[j]; p < to[j]; ++p)
        if (!m || m->extend_cp_rank(p) == me) {
          tokens.push_back(seq[j][std::size_t(p)]);
          owners.push_back(model::RowOwner::pack(records_[j].id, p));
        }
    }
    const View x = embed_rows(tokens);
    if (!m) return host_rows(dense_forward(x));
    const View mine = m->extend(counts, x, owners).view();
    if (groups_.layout().widths().attn_cp == 1) return host_rows(mine);
    return host_rows(attn_.gather_kv(exec_, cp_order(*m, seq, from, to), mine));
  }

  // Where the rows of feed's extend land once all-gathered over attn_cp: the gathered rows come CP
  // rank after CP rank (each its rows in request order), and order[i] is gathered row i's place in
  // request order (position p of request j on CP rank extend_cp_rank(p)).
  template <class Model>
  PrefillKeys<typename ExecSpace::memory_space> cp_order(const Model& m, const std::vector<std::vector<int>>& seq,
                                                         const std::vector<int>& from, const std::vector<int>& to) const {
    const int cp = groups_.layout().widths().attn_cp;
    PrefillKeys<typename ExecSpace::memory_space> keys;
    keys.counts.assign(std::size_t(cp), 0);
    std::vector<std::vector<int>> rows_of(static_cast<std::size_t>(cp));  // each CP rank's rows, by place in request order
    for (std::size_t j = 0, at = 0; j < seq.size(); ++j)
      for (int p = from[j]; p < to[j]; ++p, ++at) {
        const int c = m.extend_cp_rank(p);
        ++keys.counts[std::size_t(c)];
        rows_of[std::size_t(c)].push_back(int(at));
      }
    std::vector<int> order;
    for (const auto& r : rows_of) order.insert(order.end(), r.begin(), r.end());
    Kokkos::View<int*, typename ExecSpace::memory_space> dev("relayout::spec::cp_order", order.size());
    Kokkos::deep_copy(exec_, dev, Kokkos::View<const int*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(order.data(), order.size()));
    exec_.fence();
    keys.order = dev;
    return keys;
  }

  // Both caches take every prompt token but the last (which the first round feeds).
  void prefill() {
    std::vector<std::vector<int>> seq;
    std::vector<int> from(records_.size(), 0), to;
    for (const RequestRecord& r : records_) {
      seq.push_back(r.committed);
      to.push_back(cfg_.prompt - 1);
    }
    if (draft_) draft_->trace_step(0);
    target_->trace_step(0);
    feed(true, seq, from, to);
    feed(false, seq, from, to);
    draft_fed_ = to;
  }

  std::vector<double> logits(const std::vector<double>& h, std::size_t row, int prev) const {
    const int H = cfg_.target_dims.hidden;
    return head::logits(cfg_.seed, cfg_.vocab, cfg_.hidden_weight, &h[row * std::size_t(H)], H, prev);
  }
  double uniform(int id, int r, int j, head::Draw what) const {
    return head::uniform(cfg_.seed, id, r, j, what, cfg_.rank_local_rng ? groups_.rank() : -1);
  }

  void round(int r) {
    RoundLog log;
    const int k = cfg_.draft_tokens();
    const std::size_t n = records_.size();
    target_->trace_step(r + 1, batch_.meta.scaled_values());

    std::vector<std::int32_t> plan(n, k);  // draft tokens per request this round
    site(log, kSitePlan, plan);

    // Draft: k decode steps. seq[i] grows by each proposed token; q[i][j] is the draft's
    // distribution of token j (sampled mode).
    std::vector<std::vector<int>> seq;
    for (const RequestRecord& rec : records_) seq.push_back(rec.committed);
    std::vector<std::vector<std::vector<double>>> q(n);
    for (int j = 0; j < k; ++j) {
      if (draft_) draft_->trace_step(1 + r * k + j);
      std::vector<int> to;
      for (std::size_t i = 0; i < n; ++i) to.push_back(int(seq[i].size()));
      const std::vector<double> h = feed(true, seq, draft_fed_, to);
      std::vector<std::int32_t> tok(n);
      for (std::size_t i = 0, row = 0; i < n; ++i) {
        row += std::size_t(to[i] - draft_fed_[i]);
        const std::vector<double> z = logits(h, row - 1, seq[i].back());
        if (cfg_.sample) {
          q[i].push_back(softmax(z, cfg_.temperature));
          tok[i] = sample_index(q[i].back(), uniform(records_[i].id, r, j, head::Draw::draft));
        } else {
          tok[i] = head::argmax(z);
        }
      }
      draft_fed_ = to;
      site(log, cfg_.sample ? kSiteDraftSample : kSiteDraftGreedy, tok);
      for (std::size_t i = 0; i < n; ++i) seq[i].push_back(tok[i]);
    }

    // Verify: the last committed token and the k draft tokens, k + 1 rows per request, one forward.
    std::vector<int> from, to;
    for (std::size_t i = 0; i < n; ++i) {
      from.push_back(int(records_[i].committed.size()) - 1);
      to.push_back(int(seq[i].size()));
    }
    const std::vector<double> ht = feed(false, seq, from, to);
    const std::size_t rows = std::size_t(k) + 1;

    std::vector<std::int32_t> accepted(n, 0), next(n, 0);
    if (!cfg_.sample) {
      std::vector<std::int32_t> choice(n * rows);
      for (std::size_t i = 0; i < n; ++i)
        for (std::size_t j = 0; j < rows; ++j)
          choice[i * rows + j] = head::argmax(logits(ht, i * rows + j, seq[i][std::size_t(from[i]) + j]));
      site(log, kSiteTarget, choice);
      for (std::size_t i = 0; i < n; ++i) {
        int a = 0;
        while (a < k && choice[i * rows + std::size_t(a)] == seq[i][std::size_t(from[i] + 1 + a)]) ++a;
        accepted[i] = a;
      }
      site(log, kSiteAcceptGreedy, accepted);
      for (std::size_t i = 0; i < n; ++i) next[i] = choice[i * rows + std::size_t(accepted[i])];
    } else {
      // The acceptance draws are made, and the outcome broadcast, once per sync group.
      std::vector<std::int32_t> outcome(2 * n);
      for (std::size_t i = 0; i < n; ++i) {
        std::vector<std::vector<double>> p;
        for (std::size_t j = 0; j < rows; ++j)
          p.push_back(softmax(logits(ht, i * rows + j, seq[i][std::size_t(from[i]) + j]), cfg_.temperature));
        std::vector<double> u;
        for (int j = 0; j < k; ++j) u.push_back(uniform(records_[i].id, r, j, head::Draw::accept));
        const std::vector<int> draft(seq[i].begin() + from[i] + 1, seq[i].end());
        const AcceptOutcome o = speculative_accept(p, q[i], draft, u, uniform(records_[i].id, r, k, head::Draw::final));
        outcome[2 * i] = o.accepted;
        outcome[2 * i + 1] = o.token;
      }
      site(log, kSiteAcceptSample, outcome);
      for (std::size_t i = 0; i < n; ++i) {
        accepted[i] = outcome[2 * i];
        next[i] = outcome[2 * i + 1];
      }
    }

    // Commit the accepted prefix and the target's token; roll both caches back to the committed
    // tokens (all but the newest, which the next round feeds).
    for (std::size_t i = 0; i < n; ++i) {
      RequestRecord& rec = records_[i];
      const int a = accepted[i];
      rec.accepted.push_back(a);
      for (int j = 0; j < a; ++j) rec.committed.push_back(seq[i][std::size_t(from[i] + 1 + j)]);
      rec.committed.push_back(next[i]);
      const int keep = int(rec.committed.size()) - 1;
      target_->truncate_kv(int(i), keep);
      if (draft_) draft_->truncate_kv(int(i), std::min<std::int64_t>(draft_->kv_length(int(i)), keep));
      draft_fed_[i] = std::min(draft_fed_[i], keep);
    }
    logs_.push_back(std::move(log));
  }

  std::vector<double> host_rows(const View& v) const {
    const auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
    std::vector<double> out(h.extent(0) * h.extent(1));
    for (std::size_t i = 0; i < h.extent(0); ++i)
      for (std::size_t f = 0; f < h.extent(1); ++f) out[i * h.extent(1) + f] = double(h(i, f));
    return out;
  }

  // Dense draft: h = x + W2 silu(W1 rms_norm(x)), W1 column-parallel and W2 row-parallel over the
  // draft context's TP group (attn_tp under DP attention: the draft has its own TP group and no DP),
  // completed by one all-reduce there. An idle group's members all-reduce zero elements together.
  void make_dense_draft() {
    const C& comm = groups_.comm(ctx_.tp_group);
    const int H = cfg_.target_dims.hidden, I = cfg_.dense_inter, k = comm.size(), g = comm.rank();
    if (I < k || I % k != 0)
      throw LayoutError("--dense-inter", "--dense-inter = " + std::to_string(I) +
                                             " must be a positive multiple of the dense draft's TP group size " + std::to_string(k));
    const std::uint64_t s = cfg_.target_dims.seed;  // the target's layer-0 shared expert and norm
    dense_w1_ = View("relayout::spec::dense_w1", std::size_t(I / k), std::size_t(H));
    dense_w2_ = View("relayout::spec::dense_w2", std::size_t(H), std::size_t(I / k));
    dense_norm_ = Kokkos::View<float*, typename ExecSpace::memory_space>("relayout::spec::dense_norm", std::size_t(H));
    model::fill_block(dense_w1_, model::tensor_key(s, 0, model::Tensor::shared_w1), H, std::int64_t(g) * (I / k), 0,
                      1.0f / std::sqrt(float(H)));
    model::fill_block(dense_w2_, model::tensor_key(s, 0, model::Tensor::shared_w2), I, 0, std::int64_t(g) * (I / k),
                      1.0f / std::sqrt(float(I)));
    model::fill_norm(dense_norm_, model::tensor_key(s, 0, model::Tensor::attn_norm));
  }

  View dense_forward(const View& x) {
    const int H = cfg_.target_dims.hidden;
    const std::size_t n = x.extent(0), Ik = dense_w1_.extent(0);
    View xn("relayout::spec::dense_xn", n, std::size_t(H)), u("relayout::spec::dense_u", n, Ik),
        p("relayout::spec::dense_p", n, std::size_t(H));
    const ExecSpace& exec = exec_;
    if (n > 0) {
      kernels::rms_norm(exec, x, dense_norm_, 1e-6, xn);
      kernels::linear(exec, xn, dense_w1_, u);
      const View uu = u;
      Kokkos::parallel_for("relayout::spec::silu", Kokkos::RangePolicy<ExecSpace>(exec, 0, std::int64_t(uu.size())),
                           KOKKOS_LAMBDA(const std::int64_t i) {
                             const float v = uu.data()[i];
                             uu.data()[i] = v / (1.0f + kernels::impl::exp(-v));
                           });
      kernels::linear(exec, u, dense_w2_, p);
      exec.fence();
    }
    // Partial -> Replicated over the draft's TP group: the typed transition on exec.
    const View pp = ctx_.tp_group == GroupKind::attn_tp
                        ? relayout::all_reduce(exec, groups_, Rows<float, Partial<AttnTp>, DpLocal, ExecSpace>(p)).view()
                        : relayout::all_reduce(exec, groups_, Rows<float, Partial<group::Tp>, DpLocal, ExecSpace>(p)).view();
    const View xx = x;
    Kokkos::parallel_for("relayout::spec::dense_residual", Kokkos::RangePolicy<ExecSpace>(exec, 0, std::int64_t(pp.size())),
                         KOKKOS_LAMBDA(const std::int64_t i) { pp.data()[i] += xx.data()[i]; });
    exec.fence();
    return pp;
  }

  const ProcessGroupsOf<C>& groups_;
  SpecConfig cfg_;
  SpecTpSyncOf<C> sync_;
  DraftContext ctx_;
  ExecSpace exec_;
  CpAttention<C, float, ExecSpace> attn_{groups_};  // the rows of a forward gathered over attn_cp
  SpecBatch batch_;
  std::vector<RequestRecord> records_;
  std::vector<RoundLog> logs_;
  std::optional<model::DistributedModel<C, ExecSpace, Sink>> draft_, target_;
  View dense_w1_, dense_w2_;
  Kokkos::View<float*, typename ExecSpace::memory_space> dense_norm_;
  std::vector<int> draft_fed_;  // tokens of each request the draft has seen (its cache rows)
  int draft_forwards_ = 0, target_forwards_ = 0;
};

}  // namespace relayout::spec
