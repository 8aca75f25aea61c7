// A small, honest speculative decode loop on the ranks of one TP domain (docs/dspark.md), for the
// dspark_step example and the tests: a draft (MoE: a DistributedModel with full DP/MoE
// participation; dense: a tensor-parallel MLP inside the draft context's TP group) proposes `width`
// tokens per request, the target (a deeper DistributedModel) verifies them in one forward, greedy
// acceptance commits the longest agreeing prefix plus the target's correction. Every decision goes
// through SpecTpSync at its site; an idle attention-DP group runs both forwards with zero rows.
//
// What is modelled and what is not: the forwards see the model's deterministic inputs for (request,
// position); the committed tokens enter through the vocabulary head (a bigram table of the
// previous token plus a projection of the normalised hidden row), not through a KV cache.
#pragma once

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "relayout/comm.hpp"
#include "relayout/kernels/linear.hpp"
#include "relayout/kernels/rms_norm.hpp"
#include "demo/model/layer.hpp"
#include "demo/model/weights.hpp"
#include "relayout/spec/draft.hpp"
#include "relayout/spec/idle.hpp"
#include "relayout/spec/sync.hpp"
#include "relayout/spec/tokens.hpp"

namespace relayout::spec {

struct SpecConfig {
  std::vector<int> requests_per_group{1};  // requests per attention-DP group
  TokensPerRequest width{6};               // draft tokens verified per request per round
  int rounds = 1;
  int vocab = 16;
  bool sample = false;          // draft samples (site DRAFT_SAMPLE) instead of argmax (DRAFT_GREEDY)
  bool rank_local_rng = false;  // each rank seeds its sampler differently (implies sample)
  bool bypass_guard = false;    // developer experiment: skip the docs/dspark.md start-up check
  bool check_agreement = true;  // after each site, compare the decision across the sync group
  double temperature = 1.0;
  double hidden_weight = 0.3;   // weight of the hidden-row projection against the bigram table
  std::uint64_t seed = 7;       // vocabulary head, prompts and sampler
  int dense_inter = 32;         // dense draft MLP intermediate (split over the draft's TP group)
  model::ModelDims draft_dims = [] {
    model::ModelDims d;
    d.layers = 1;
    d.seed = 99;
    return d;
  }();
  model::ModelDims target_dims = [] {
    model::ModelDims d;
    d.layers = 2;
    d.seed = 1234;
    return d;
  }();
};

// This group's view of one round.
struct RoundLog {
  std::map<std::string, std::vector<std::int64_t>> decisions;  // site -> values after the site
  std::vector<std::string> disagreed;                          // sites whose values differed in the group
};

struct RequestRecord {
  int id = 0;
  std::vector<int> accepted;   // accepted draft tokens per round
  std::vector<int> committed;  // prompt token, then every committed token
};


// The whole round as a model::Workload over `attn_dp` groups: every request has `width` rows
// (draft tokens), placed on its group. An idle group simply owns no request, so the model's
// forward runs it with zero rows and it joins every collective (docs/bridge.md#padding IDLE forward).
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
  // exact message) unless cfg.bypass_guard.
  SpecDecoder(const ProcessGroupsOf<C>& groups, SpecConfig cfg, SyncSites sites = SyncSites::from_env())
      : groups_(groups), cfg_(std::move(cfg)), sync_(groups, std::move(sites)), ctx_(draft_context(groups.layout())) {
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
    if (cfg_.rounds < 1 || cfg_.rounds > 1000) throw LayoutError("--rounds", "--rounds must be in [1, 1000]");
    if (cfg_.vocab < 2 || cfg_.vocab > 1 << 16) throw LayoutError("--vocab", "--vocab must be in [2, 65536]");
    if (cfg_.rank_local_rng) cfg_.sample = true;
    const RankCoords k = groups_.coords();
    const DpSyncMetadata meta = gather_sync_metadata(
        groups_, RequestCount{cfg_.requests_per_group[std::size_t(k.attn_dp_rank)]}, cfg_.width);
    batch_ = make_batch(meta, k.attn_dp_rank);
    for (int id : batch_.requests) records_.push_back({id, {}, {prompt_token(id)}});
    const model::BridgeOptions opts;
    if (layout.config().draft == Draft::moe) draft_.emplace(groups_, cfg_.draft_dims, opts);
    else make_dense_draft();
    target_.emplace(groups_, cfg_.target_dims, opts);
  }

  // Trace the forwards of every round: the MoE draft's into `draft` (a dense draft has no
  // DistributedModel and writes nothing), the target's into `target`. Each record carries the round
  // as its speculative step and the scaled global_num_tokens.
  void trace_to(Sink& draft, Sink& target) {
    if (draft_) draft_->trace_to(draft);
    target_->trace_to(target);
  }

  // Collective: every rank runs every round, an idle group with zero rows.
  void run() {
    for (int r = 0; r < cfg_.rounds; ++r) round(r);
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
  // Forward calls this rank made (draft, target): an idle rank makes as many as a busy one.
  int draft_forwards() const { return draft_forwards_; }
  int target_forwards() const { return target_forwards_; }
  const model::TrafficLog& target_traffic() const { return target_->traffic(); }

 private:
  int prompt_token(int id) const {
    return int(model::mix64(cfg_.seed ^ model::mix64(std::uint64_t(id) + 17)) % std::uint64_t(cfg_.vocab));
  }

  template <class T>
  void site(RoundLog& log, const char* name, std::vector<T>& values) {
    sync_.sync(name, values);
    if (cfg_.check_agreement && !sync_.agrees(values)) log.disagreed.emplace_back(name);
    log.decisions[name].assign(values.begin(), values.end());
  }

  void round(int r) {
    RoundLog log;
    const int T = cfg_.width.value;
    const std::size_t n = records_.size();
    const model::Workload work = round_workload(batch_.meta, groups_.layout().widths().attn_dp);

    std::vector<std::int32_t> plan(n, T);  // draft tokens per request this round
    site(log, kSitePlan, plan);

    if (draft_) draft_->trace_step(r, batch_.meta.scaled_values());
    target_->trace_step(r, batch_.meta.scaled_values());
    const std::vector<double> hd = draft_hidden(work);
    ++draft_forwards_;
    std::vector<std::int32_t> draft(n * std::size_t(T));
    for (std::size_t i = 0; i < n; ++i) {
      int prev = records_[i].committed.back();
      for (int j = 0; j < T; ++j) {
        const std::vector<double> z = logits(hd, i * std::size_t(T) + std::size_t(j), prev, 1);
        const int tok = cfg_.sample ? sample(z, records_[i].id, r, j) : argmax(z);
        draft[i * std::size_t(T) + std::size_t(j)] = tok;
        prev = tok;
      }
    }
    site(log, cfg_.sample ? kSiteDraftSample : kSiteDraftGreedy, draft);

    const model::LayerRows<ExecSpace> out = target_->forward(work);
    ++target_forwards_;
    const std::vector<double> ht = host_rows(out.view());
    std::vector<std::int32_t> choice(n * std::size_t(T));
    for (std::size_t i = 0; i < n; ++i)
      for (int j = 0; j < T; ++j) {
        const std::size_t row = i * std::size_t(T) + std::size_t(j);
        const int prev = j == 0 ? records_[i].committed.back() : draft[row - 1];
        choice[row] = argmax(logits(ht, row, prev, 2));
      }
    site(log, kSiteTarget, choice);

    std::vector<std::int32_t> accepted(n, 0);
    for (std::size_t i = 0; i < n; ++i) {
      int a = 0;
      while (a < T && choice[i * std::size_t(T) + std::size_t(a)] == draft[i * std::size_t(T) + std::size_t(a)]) ++a;
      accepted[i] = a;
    }
    site(log, kSiteAcceptGreedy, accepted);
    for (std::size_t i = 0; i < n; ++i) {
      const int a = accepted[i];
      RequestRecord& rec = records_[i];
      rec.accepted.push_back(a);
      for (int j = 0; j < a; ++j) rec.committed.push_back(draft[i * std::size_t(T) + std::size_t(j)]);
      if (a < T) rec.committed.push_back(choice[i * std::size_t(T) + std::size_t(a)]);  // target's correction
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

  // logits[v] = bigram(prev, v) + w * proj_head(v) . rms_normalised(h_row); head 1: draft, 2: target.
  std::vector<double> logits(const std::vector<double>& h, std::size_t row, int prev, int head) const {
    const int H = cfg_.target_dims.hidden;
    const int V = cfg_.vocab;
    double ss = 0;
    for (int f = 0; f < H; ++f) ss += h[row * std::size_t(H) + std::size_t(f)] * h[row * std::size_t(H) + std::size_t(f)];
    const double inv = 1.0 / std::sqrt(ss / H + 1e-6);
    const auto bigram = model::tensor_key(cfg_.seed, 1001, model::Tensor::embedding);
    const auto proj = model::tensor_key(cfg_.seed, 1002, model::Tensor::router, head);
    std::vector<double> z(static_cast<std::size_t>(V), 0.0);
    for (int v = 0; v < V; ++v) {
      double dot = 0;
      for (int f = 0; f < H; ++f)
        dot += double(model::counter_uniform(proj, std::uint64_t(v) * std::uint64_t(H) + std::uint64_t(f), 1.0f)) *
               h[row * std::size_t(H) + std::size_t(f)] * inv;
      z[std::size_t(v)] = 2.0 * double(model::counter_uniform(bigram, std::uint64_t(prev) * std::uint64_t(V) + std::uint64_t(v), 1.0f)) +
                          cfg_.hidden_weight * dot / std::sqrt(double(H));
    }
    return z;
  }
  static int argmax(const std::vector<double>& z) {
    int best = 0;
    for (std::size_t v = 1; v < z.size(); ++v)
      if (z[v] > z[std::size_t(best)]) best = int(v);
    return best;
  }
  // Softmax sampling with a counter-based uniform keyed by (request, round, position), and, with
  // rank_local_rng, by this rank too: then only SpecTpSync makes the group's choices agree.
  int sample(const std::vector<double>& z, int id, int r, int j) const {
    std::uint64_t key = cfg_.seed * 0x9E3779B97F4A7C15ull + 5;
    if (cfg_.rank_local_rng) key ^= model::mix64(std::uint64_t(groups_.rank()) + 0x51ull);
    const double u = 0.5 + 0.5 * double(model::counter_uniform(model::TensorKey{model::mix64(key)},
                                                                (std::uint64_t(id) << 32) ^ (std::uint64_t(r) << 16) ^ std::uint64_t(j), 1.0f));
    const double mx = *std::max_element(z.begin(), z.end());
    double total = 0;
    std::vector<double> p(z.size());
    for (std::size_t v = 0; v < z.size(); ++v) total += p[v] = std::exp((z[v] - mx) / cfg_.temperature);
    double acc = 0;
    for (std::size_t v = 0; v < z.size(); ++v) {
      acc += p[v] / total;
      if (u < acc) return int(v);
    }
    return int(z.size()) - 1;
  }

  std::vector<double> draft_hidden(const model::Workload& work) {
    if (draft_) return host_rows(draft_->forward(work).view());
    return host_rows(dense_forward(work));
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
    const std::uint64_t s = cfg_.draft_dims.seed;
    dense_w1_ = View("relayout::spec::dense_w1", std::size_t(I / k), std::size_t(H));
    dense_w2_ = View("relayout::spec::dense_w2", std::size_t(H), std::size_t(I / k));
    dense_norm_ = Kokkos::View<float*, typename ExecSpace::memory_space>("relayout::spec::dense_norm", std::size_t(H));
    model::fill_block(dense_w1_, model::tensor_key(s, 0, model::Tensor::shared_w1), H, std::int64_t(g) * (I / k), 0,
                      1.0f / std::sqrt(float(H)));
    model::fill_block(dense_w2_, model::tensor_key(s, 0, model::Tensor::shared_w2), I, 0, std::int64_t(g) * (I / k),
                      1.0f / std::sqrt(float(I)));
    model::fill_norm(dense_norm_, model::tensor_key(s, 0, model::Tensor::attn_norm));
  }

  View dense_forward(const model::Workload& work) {
    const C& comm = groups_.comm(ctx_.tp_group);
    const int H = cfg_.target_dims.hidden;
    const std::vector<std::int64_t> owners = work.owners_of(groups_.coords().attn_dp_rank);
    const std::size_t n = owners.size(), Ik = dense_w1_.extent(0);
    View x("relayout::spec::dense_x", n, std::size_t(H)), xn("relayout::spec::dense_xn", n, std::size_t(H)),
        u("relayout::spec::dense_u", n, Ik), p("relayout::spec::dense_p", n, std::size_t(H));
    const auto xh = Kokkos::create_mirror_view(x);
    for (std::size_t i = 0; i < n; ++i)
      for (int f = 0; f < H; ++f) xh(i, std::size_t(f)) = model::input_value(cfg_.draft_dims.seed, owners[i], f, H);
    Kokkos::deep_copy(x, xh);
    const ExecSpace exec;
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
    all_reduce_in_place(comm, std::span<float>(p.data(), p.size()));  // Partial -> Replicated
    const View xx = x, pp = p;
    Kokkos::parallel_for("relayout::spec::dense_residual", Kokkos::RangePolicy<ExecSpace>(exec, 0, std::int64_t(pp.size())),
                         KOKKOS_LAMBDA(const std::int64_t i) { pp.data()[i] += xx.data()[i]; });
    exec.fence();
    return p;
  }

  const ProcessGroupsOf<C>& groups_;
  SpecConfig cfg_;
  SpecTpSyncOf<C> sync_;
  DraftContext ctx_;
  SpecBatch batch_;
  std::vector<RequestRecord> records_;
  std::vector<RoundLog> logs_;
  std::optional<model::DistributedModel<C, ExecSpace, Sink>> draft_, target_;
  View dense_w1_, dense_w2_;
  Kokkos::View<float*, typename ExecSpace::memory_space> dense_norm_;
  int draft_forwards_ = 0, target_forwards_ = 0;
};

}  // namespace relayout::spec
