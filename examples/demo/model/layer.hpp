// The distributed DeepSeek-V4-like decoder layers on the ranks of one TP domain: attention with
// query heads split over attn_tp (wq_b column-parallel, shared KV replicated, wo_b row-parallel and
// completed by the attention-TP all-reduce), then the bridge (bridge.hpp) into the MoE and back.
// The attention side (CP shares, the KV all-gather, decode and extend under attn_cp, the
// attention-TP all-reduce) is the library's relayout::CpAttention (docs/cp.md).
// With a KV cache (reserve_kv) the prefill keeps every layer's shared KV rows (under CP each CP rank
// those of the positions it holds) and decode_step runs one new row per live request against them;
// extend appends several rows per request, each attending causally (a speculative verify); the
// slots, the positions each rank caches and the cache are kept by one RequestTable (docs/kv_cache.md).
// A trace sink (relayout/trace; none by default) receives a record after every boundary, including
// the attention all-reduce and each layer's output.
#pragma once

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "relayout/attention.hpp"
#include "relayout/comm.hpp"
#include "relayout/kernels/attention.hpp"
#include "relayout/kernels/kv_cache.hpp"
#include "relayout/kernels/linear.hpp"
#include "relayout/kernels/moe.hpp"
#include "relayout/kernels/rms_norm.hpp"
#include "demo/model/bridge.hpp"
#include "demo_model/config.hpp"
#include "demo/model/layer_weights.hpp"
#include "demo/model/router.hpp"
#include "demo/model/traffic.hpp"
#include "demo_model/workload.hpp"

namespace relayout::model {

template <class C, class ExecSpace = Kokkos::DefaultExecutionSpace, class Sink = trace::NullSink>
  requires trace::TraceSink<Sink>
class DistributedModel {
 public:
  using View = RowsView<float, ExecSpace>;
  using Tracked = LayerRows<ExecSpace>;
  using Typed = typename Tracked::rows_type;
  using Recorder = trace::Recorder<C, Sink>;

  DistributedModel(const ProcessGroupsOf<C>& groups, const ModelDims& dims, const LayerOptions& opts = {},
                   ExecSpace exec = ExecSpace())
      : groups_(groups), dims_(dims), opts_(opts), exec_(exec) {
    const Widths& w = groups_.layout().widths();
    validate(dims_, w);
    if (bf16_rows()) bridge16_.emplace(groups_, dims_.experts, opts_);
    if (opts_.inject != BridgeFault::none) {
      if (bridge16_) testing::inject_fault(*bridge16_, opts_.inject);
      testing::inject_fault(bridge_, opts_.inject);
    }
    for (int layer = 0; layer < dims_.layers; ++layer)
      shards_.push_back(LayerShard<ExecSpace>::make(exec_, dims_, layer, shard_spec()));
  }

  // What this rank holds of every layer (docs/bridge.md): heads over attn_tp, experts over moe_ep, the
  // intermediate over moe_tp; the shared expert with the experts of moe_ep rank 0 when the MoE runs
  // on replicated rows, on every rank (whole) when each rank dispatches its own rows.
  ShardSpec shard_spec() const {
    const Widths& w = groups_.layout().widths();
    const RankCoords k = groups_.coords();
    ShardSpec s;
    s.heads = dims_.heads / w.attn_tp;
    s.head_begin = k.attn_tp_rank * s.heads;
    s.experts = dims_.experts / w.moe_ep;
    s.expert_begin = k.moe_ep_rank * s.experts;
    if (const auto& loc = opts_.expert_location) {  // this member's physical experts, by logical id
      s.experts = loc->per_rank();
      s.expert_begin = k.moe_ep_rank * s.experts;
      for (int p = s.expert_begin; p < s.expert_begin + s.experts; ++p) s.expert_ids.push_back(loc->logical_of(p));
    }
    s.inter = dims_.moe_inter / w.moe_tp;
    s.inter_begin = k.moe_tp_rank * s.inter;
    const BridgePath path = groups_.layout().bridge_path();
    const bool replicated_moe = path == BridgePath::dp_gather || path == BridgePath::tp_moe;
    if (dims_.shared_inter > 0 && (!replicated_moe || k.moe_ep_rank == 0)) {
      s.shared = dims_.shared_inter / w.moe_tp;
      s.shared_begin = k.moe_tp_rank * s.shared;
    }
    return s;
  }

  // Send a trace record to `sink` after every boundary of the next forward passes. The trace names
  // rows by owner, so owners must be tracked.
  void trace_to(Sink& sink) {
    if (!opts_.track_owners)
      throw LayoutError("trace", "tracing needs LayerOptions::track_owners: the trace names every row by its owner");
    recorder_.attach(&sink);
  }
  // Speculative step and scaled global_num_tokens stamped on the records of the next forward.
  void trace_step(int step, std::vector<std::int64_t> scaled_counts = {}) {
    recorder_.step = step;
    recorder_.scaled_counts = std::move(scaled_counts);
  }

  // Every layer on this rank's rows: its attention-DP group's requests, under CP its CP share of
  // them. Collective over the domain: every rank calls it, a rank with no rows too (an IDLE forward).
  Tracked forward(const Workload& work) {
    const RankCoords k = groups_.coords();
    std::vector<std::int64_t> owners = work.owners_of(k.attn_dp_rank, CpShare::of(groups_.layout(), k.attn_cp_rank));
    const View values = input(owners);
    const std::int64_t mine = std::int64_t(owners.size());
    new_rows(owners);
    if (!opts_.track_owners) owners.clear();
    Tracked x(Typed(values), std::move(owners));
    gather_counts(mine);
    const CpBatch batch = work.batch_of(k.attn_dp_rank, groups_.layout());
    keys_ = attn_.prefill_keys(exec_, batch);
    step_ = ExtendPlan{};
    if (has_cache()) {  // the prefill fills the cache: request j of the group is slot j, with the positions held here
      for (int j = 0; j < batch.requests(); ++j) {
        requests_.finish(j);  // every other slot is held: admit gives slot j back, emptied
        requests_.admit(j);
        std::vector<int> held = batch.positions_of(k.attn_cp_rank, j);
        for (int p : held) {
          step_.slot.push_back(j);
          step_.position.push_back(p);
        }
        step_.append_slot.push_back(j);
        step_.append_cu.push_back(step_.append_cu.back() + int(held.size()));
        requests_.prefilled(j, std::move(held), batch.lengths()[std::size_t(j)]);
      }
    }
    x = run_layers(x, false);
    return x;
  }

  // A paged KV cache for this rank's DP group's requests, each `rows_per_request` rows at most
  // (prompt + decode steps); allocated here, filled by the next forward.
  // Under CP a rank holds at most ceil(L / cp) of a request's L prompt rows and ceil(S / cp) of its
  // S decode rows, so at most ceil(rows_per_request / cp) + 1 rows of it.
  // The cache holds bf16 with bf16 weights (kv_cache_bf16: the fp32 kv rows rounded as they are
  // appended, the attention's q, out and arithmetic fp32), else fp32.
  void reserve_kv(const Workload& work, int rows_per_request, int block_size = 16) {
    const int n = int(work.requests_of(groups_.coords().attn_dp_rank).size()), cp = groups_.layout().widths().attn_cp;
    const int rows = cp > 1 ? (rows_per_request + cp - 1) / cp + 1 : rows_per_request;
    const int blocks = (rows + block_size - 1) / block_size;
    const kernels::KvCacheShape shape{dims_.layers, dims_.head_dim, block_size, n * blocks, n, blocks};
    cache_.reset();
    cache16_.reset();
    if (kv_cache_bf16(dims_)) cache16_ = std::make_unique<CacheBf16>(shape);
    else cache_ = std::make_unique<Cache>(shape);
    requests_ = attn_.request_table(n, KvHook{cache_.get(), cache16_.get(), exec_});
    for (int j = 0; j < n; ++j) requests_.admit(j);  // request j of the group holds slot j
  }
  // The KV cache's element type ("fp32", "bf16"), and its device bytes (0 before reserve_kv).
  const char* kv_dtype() const { return kv_cache_dtype(dims_); }
  std::size_t kv_bytes() const {
    if (cache16_) return cache16_->shape().bytes(sizeof(relayout::bf16));
    return cache_ ? cache_->shape().bytes(sizeof(float)) : 0;
  }

  // Decode step `step` (1-based): every live request of this rank's DP group feeds one row,
  // next_input of its previous output row (the prefill's last row at step 1); the row is held by
  // CP rank p mod attn_cp, p its position, and `prev` holds the rows this rank returned last time.
  // Under CP the rank holding a previous row computes the next input and the inputs are shared over
  // attn_cp (an engine shares the sampled token). Returns this rank's rows in request order.
  // Collective like forward: a group or CP rank with no live row joins every collective with zero rows.
  Tracked decode_step(const Workload& work, const DecodePlan& plan, int step, const Tracked& prev) {
    if (!has_cache()) throw LayoutError("decode", "decode_step needs a KV cache: call reserve_kv before the prefill");
    const RankCoords k = groups_.coords();
    const CpShare me = CpShare::of(groups_.layout(), k.attn_cp_rank);
    const std::vector<int> reqs = work.requests_of(k.attn_dp_rank);
    const std::vector<std::int64_t> had = plan.owners_of(work, k.attn_dp_rank, step - 1, me);  // prev's rows
    const auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), prev.view());
    const int H = dims_.hidden, W = dims_.window;
    // The inputs, CP rank after CP rank (each computes those of the previous rows it holds).
    std::vector<float> inputs;
    std::vector<int> at, counts(std::size_t(me.cp), 0);  // live request j's input: inputs row at[j]
    std::vector<int> order;                              // requests in that order
    for (int c = 0; c < me.cp; ++c)
      for (int j = 0; j < int(reqs.size()); ++j) {
        const int r = reqs[std::size_t(j)], p = work.lengths[std::size_t(r)] + step - 1;
        if (!plan.live(r, step) || work.cp_rank_of(r, p - 1, me) != c) continue;
        ++counts[std::size_t(c)];
        order.push_back(j);
        if (c != me.rank) continue;
        const auto from = std::find(had.begin(), had.end(), RowOwner::pack(r, p - 1)) - had.begin();
        inputs.resize(inputs.size() + std::size_t(H));
        next_input(&h(from, 0), inputs.data() + inputs.size() - std::size_t(H), H);
      }
    std::vector<float> all(order.size() * std::size_t(H));
    std::vector<int> elems;
    for (int c : counts) elems.push_back(c * H);
    if (me.cp > 1) {
      traffic_.add(Op::all_gatherv, GroupKind::attn_cp, std::int64_t(all.size() * sizeof(float)));
      relayout::all_gatherv(groups_.comm(GroupKind::attn_cp), std::span<const float>(inputs), std::span<float>(all), elems);
    } else {
      all = inputs;
    }
    at.assign(reqs.size(), -1);
    for (std::size_t i = 0; i < order.size(); ++i) at[std::size_t(order[i])] = int(i);
    // One new row per live request, at position p on CP rank p mod attn_cp (the request table's rule).
    std::vector<RequestRows> live;
    for (int j = 0; j < int(reqs.size()); ++j)
      if (plan.live(reqs[std::size_t(j)], step)) live.push_back({j, 1});
    step_ = requests_.extend(live, W);
    std::vector<float> rows;
    std::vector<std::int64_t> owners;
    for (int i = 0; i < step_.rows(); ++i) {
      const int j = step_.slot[std::size_t(i)];
      rows.insert(rows.end(), all.begin() + std::ptrdiff_t(at[std::size_t(j)]) * H,
                  all.begin() + std::ptrdiff_t(at[std::size_t(j)] + 1) * H);
      owners.push_back(RowOwner::pack(reqs[std::size_t(j)], step_.position[std::size_t(i)]));
    }
    const std::size_t n = std::size_t(step_.rows());
    const View values("relayout::decode_input", n, std::size_t(H));
    Kokkos::deep_copy(values, Kokkos::View<const float**, Kokkos::LayoutRight, Kokkos::HostSpace,
                                           Kokkos::MemoryTraits<Kokkos::Unmanaged>>(rows.data(), n, std::size_t(H)));
    Tracked x(Typed(values), opts_.track_owners ? owners : std::vector<std::int64_t>{});
    new_rows(owners);
    gather_counts(std::int64_t(n));
    rows_ = extend_rows(exec_, step_);
    decoding_ = true;  // these layers dispatch in the decode EP mode
    struct Reset {
      bool& flag;
      ~Reset() { flag = false; }
    } reset{decoding_};
    x = run_layers(x, true);
    if (opts_.track_owners && x.owners != owners)
      throw LayoutError("bridge", "decode step " + std::to_string(step) + ": rows came back in another order");
    return x;
  }

  // Extend (a speculative verify forward, or a prefill into the cache): counts[j] new rows for slot j
  // of this rank's DP group (request j of the group), at positions kv_length(j) .. kv_length(j) +
  // counts[j] - 1. Under CP the row at position p is held by CP rank extend_cp_rank(p) (p mod attn_cp,
  // as in decode) and each rank passes only the rows it holds; `inputs` holds them request after
  // request, `owners` naming each. Every layer appends their kv after the slot's cached rows, and each
  // row attends the cached rows and the earlier new rows of its request: causal by position, as one
  // decode step per row would (under CP every CP rank attends every row over the keys it holds and
  // the partials are merged on the row's CP rank). Returns the output rows in input order. Collective
  // like forward: a group or CP rank with no rows joins every collective with zero rows.
  Tracked extend(const std::vector<int>& counts, const View& inputs, const std::vector<std::int64_t>& owners) {
    if (!has_cache()) throw LayoutError("decode", "extend needs a KV cache: call reserve_kv first");
    if (int(counts.size()) > requests_.capacity())
      throw LayoutError("decode", "extend: counts for " + std::to_string(counts.size()) + " requests; the cache holds " +
                                      std::to_string(requests_.capacity()));
    std::vector<RequestRows> step;
    std::size_t held = 0;  // the new rows this rank holds
    for (int j = 0; j < int(counts.size()); ++j) {
      if (counts[std::size_t(j)] < 0)
        throw LayoutError("decode", "extend: request " + std::to_string(j) + " has " +
                                        std::to_string(counts[std::size_t(j)]) + " new rows; a count must be >= 0");
      step.push_back({j, counts[std::size_t(j)]});
      for (std::int64_t p = requests_.length(j); p < requests_.length(j) + counts[std::size_t(j)]; ++p)
        held += requests_.rank_of(p) == requests_.cp_rank();
    }
    if (inputs.extent(0) != held || owners.size() != held)
      throw LayoutError("decode", "extend: " + std::to_string(inputs.extent(0)) + " input rows and " +
                                      std::to_string(owners.size()) + " owners for the " + std::to_string(held) +
                                      " new rows held here");
    step_ = requests_.extend(step, dims_.window);
    Tracked x(Typed(inputs), opts_.track_owners ? owners : std::vector<std::int64_t>{});
    new_rows(owners);
    gather_counts(std::int64_t(held));
    rows_ = extend_rows(exec_, step_);
    x = run_layers(x, true);
    if (opts_.track_owners && x.owners != owners)
      throw LayoutError("bridge", "extend: rows came back in another order");
    return x;
  }
  // The CP rank that holds position p of a request in extend (decode places its rows after the prompt so).
  int extend_cp_rank(int p) const { return requests_.rank_of(p); }
  // Keeps the first `length` positions of slot j in every layer: rolls back rejected speculative
  // rows. Under CP each CP rank keeps those of its held positions below `length`.
  void truncate_kv(int slot, std::int64_t length) {
    if (slot < 0 || slot >= requests_.capacity())
      throw LayoutError("decode", "truncate_kv: slot " + std::to_string(slot) + " is not in [0, " +
                                      std::to_string(requests_.capacity()) + ")");
    requests_.truncate(slot, length);  // the cache too, through the table's hook
  }
  // Positions of slot j cached over the DP group (under CP spread over the CP ranks).
  std::int64_t kv_length(int slot) const { return requests_.length(slot); }
  // The kv rows of slot j this rank's cache holds (kv_length(j) without CP).
  std::int64_t kv_held(int slot) const {
    return with_cache([&](const auto& cache) { return cache.length(0, slot); });
  }

  const TrafficLog& traffic() const { return traffic_; }
  // With redundant experts: this rank's (token, expert) pairs per physical expert, last layer run.
  const ExpertLoad& expert_load() const { return bridge16_ ? bridge16_->last_expert_load() : bridge_.last_expert_load(); }
  void clear_traffic() { traffic_.clear(); }
  const std::vector<Boundary>& boundaries() const { return boundaries_; }
  const std::vector<std::int64_t>& global_num_tokens() const { return counts_; }
  PaddingMode padding() const { return mode_; }
  const ModelDims& dims() const { return dims_; }
  // The execution-space instance every kernel and collective of this model runs on.
  const ExecSpace& exec() const { return exec_; }

 private:
  View input(const std::vector<std::int64_t>& owners) const {
    const int H = dims_.hidden;
    const std::uint64_t seed = dims_.seed;
    View x("relayout::input", owners.size(), std::size_t(H));
    Kokkos::View<std::int64_t*, typename ExecSpace::memory_space> ids("relayout::owners", owners.size());
    Kokkos::deep_copy(ids, Kokkos::View<const std::int64_t*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(owners.data(), owners.size()));
    Kokkos::parallel_for(
        "relayout::input_rows", Kokkos::RangePolicy<ExecSpace>(exec_, 0, std::int64_t(owners.size())),
        KOKKOS_LAMBDA(const std::int64_t i) {
          for (int f = 0; f < H; ++f) x(i, f) = input_value(seed, ids(i), f, H);
        });
    exec_.fence();
    return x;
  }

  // The skewed router keys its draws by owner: this forward's rows' owners, and (at its first layer)
  // those of the rows the bridge will route here.
  void new_rows(const std::vector<std::int64_t>& owners) {
    if (dims_.expert_skew <= 0) return;
    row_owners_ = owners;
    routed_owners_ = {};
  }

  // Every rank all-gathers its DP group's token count (relayout::gather_num_tokens, which checks
  // that the members of an attention-TP group agree); all pick the padding mode from the result.
  void gather_counts(std::int64_t mine) {
    counts_ = bridge_.gather_num_tokens(mine);
    if (groups_.layout().size() > 1)
      traffic_.add(Op::all_gather_counts, GroupKind::tp, std::int64_t(groups_.layout().size() * sizeof(std::int64_t)));
    mode_ = bridge_.padding(counts_);
  }

  // Rows between layers: this DP group's (CP share's) rows, or under split_residual() this
  // member's chunk of them.
  struct Held {
    View rows;
    std::vector<std::int64_t> owners;  // when owners are tracked
  };
  // Whether the residual stream stays split over attn_tp between layers (attn_tp_input_scattered on
  // a path that dispatches rows, as SGLang keeps it under DeepEP): the attention's partials are
  // reduce-scattered, the bridge takes and returns this member's chunk, and the rows are gathered
  // once after the last layer. On tp_moe the bridge takes such rows too, but there it gathers them
  // again for the experts, and the layer measured slower split than replicated (benchmarks.md).
  bool split_residual() const {
    return opts_.attn_tp_input_scattered && groups_.layout().widths().attn_tp > 1 &&
           dispatches_rows(groups_.layout().bridge_path());
  }

  // Every layer on x; `decode`: the rows of step_ attend the cache.
  Tracked run_layers(const Tracked& x, bool decode) {
    const std::int64_t n = x.count();
    Held h{x.view(), x.owners};
    const bool split = split_residual();
    if (split) {
      using Replica = Rows<float, Replicated<AttnTp>, DpLocal, ExecSpace>;
      h.rows = split_rows(groups_, Replica(x.view())).view();
      if (!h.owners.empty()) {
        const Range mine = tensor_split_range(n, groups_.layout().widths().attn_tp, groups_.coords().attn_tp_rank);
        h.owners.assign(x.owners.begin() + mine.begin, x.owners.begin() + mine.begin + mine.count);
      }
    }
    const std::vector<std::int64_t> entered = h.owners;
    for (int layer = 0; layer < dims_.layers; ++layer) h = layer_forward(layer, h, n, decode);
    if (!split) return Tracked(Typed(h.rows), std::move(h.owners));
    if (h.owners != entered)  // the bridge checks every layer; the gather below assumes it
      throw LayoutError("bridge", "the layers returned this member's rows in another order");
    using Shard = Rows<float, RowShard<AttnTp>, DpLocal, ExecSpace>;
    return Tracked(Typed(all_gather(exec_, groups_, Shard(h.rows, n), &traffic_).view()), x.owners);
  }

  // One layer on x (n_rows: the rows of this DP group or CP share, which x holds all or, split, a
  // chunk of). decode: the rows of step_ (decode_step, extend) attend the cache; else a prefill (keys_).
  // The residual stream (x, the rows between layers) is fp32; inside the layer the activations are
  // fp32, or bf16 with bf16 weights (bf16_rows): every kernel reads and writes bf16 rows (fp32
  // arithmetic), the collectives and the EP dispatch move bf16, and the layer's two outputs (the
  // attention's and the MoE's) are added to the fp32 residual.
  Held layer_forward(int layer, const Held& x, std::int64_t n_rows, bool decode) {
    if (bf16_rows()) return layer_forward_as<relayout::bf16>(layer, x, n_rows, decode);
    return layer_forward_as<float>(layer, x, n_rows, decode);
  }

  // Whether the layer's activations are bf16 (ModelDims::weights bf16).
  bool bf16_rows() const { return dims_.weights == WeightDtype::bf16; }

  // rows x cols of V, not initialised: every buffer below is written whole before it is read.
  template <class V>
  static V fresh(const char* label, std::size_t rows, std::size_t cols) {
    return V(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), rows, cols);
  }
  // residual += y, elementwise in fp32 (y: rows of fp32 or bf16), row by row.
  template <class Y>
  void add_into(const View& residual, const Y& y) const {
    const int cols = int(residual.extent(1));
    Kokkos::parallel_for(
        "relayout::residual_add", Kokkos::RangePolicy<ExecSpace>(exec_, 0, std::int64_t(residual.extent(0))),
        KOKKOS_LAMBDA(const std::int64_t i) {
          for (int j = 0; j < cols; ++j) residual(i, j) += float(y(i, j));
        });
  }
  template <class A>
  auto& attention_for() {
    if constexpr (std::is_same_v<A, float>) return attn_;
    else return attn16_;
  }

  template <class A>
  Held layer_forward_as(int layer, const Held& x, std::int64_t n_rows, bool decode) {
    using VA = RowsView<A, ExecSpace>;
    const LayerShard<ExecSpace>& w = shards_[std::size_t(layer)];
    const bool split = split_residual();
    const std::size_t n = std::size_t(n_rows), m = x.rows.extent(0), H = std::size_t(dims_.hidden),
                      Q = std::size_t(dims_.q_lora), D = std::size_t(dims_.head_dim), HD = std::size_t(w.spec.heads) * D;
    VA q = fresh<VA>("relayout::q", n, HD), o = fresh<VA>("relayout::o", n, HD), a = fresh<VA>("relayout::attn_out", n, H);
    // The low-rank query and the shared KV row (wq_a, wkv and their norms) are the same on every
    // attention-TP member. With LayerOptions::attn_tp_input_scattered each member computes them
    // for its chunk of the rows (split_rows) and the members all-gather them; otherwise each
    // computes them for every row.
    const bool scattered = opts_.attn_tp_input_scattered && groups_.layout().widths().attn_tp > 1;
    VA qn, kv;
    {
      using Replica = Rows<float, Replicated<AttnTp>, DpLocal, ExecSpace>;
      const View xr = scattered && !split ? split_rows(groups_, Replica(x.rows)).view() : x.rows;
      const std::size_t mr = xr.extent(0);
      const VA xn = fresh<VA>("relayout::xn", mr, H), qa = fresh<VA>("relayout::qa", mr, Q),
               qr = fresh<VA>("relayout::qn", mr, Q), kvr = fresh<VA>("relayout::kv_raw", mr, D),
               kvn = fresh<VA>("relayout::kv", mr, D);
      kernels::rms_norm(exec_, xr, w.attn_norm, dims_.rms_eps, xn);  // reads the fp32 residual; bf16: rounded once
      w.wq_a(exec_, xn, qa);
      kernels::rms_norm(exec_, qa, w.q_norm, dims_.rms_eps, qr);
      w.wkv(exec_, xn, kvr);
      kernels::rms_norm(exec_, kvr, w.kv_norm, dims_.rms_eps, kvn);
      if (scattered) {
        using Shard = Rows<A, RowShard<AttnTp>, DpLocal, ExecSpace>;
        qn = all_gather(exec_, groups_, Shard(qr, std::int64_t(n)), &traffic_).view();
        kv = all_gather(exec_, groups_, Shard(kvn, std::int64_t(n)), &traffic_).view();
      } else {
        qn = qr;
        kv = kvn;
      }
    }
    w.wq_b(exec_, qn, q);
    kernels::AttentionParams params;
    params.head_dim = dims_.head_dim;
    params.scale = kernels::default_softmax_scale(dims_.head_dim);
    params.window = dims_.window;
    auto& attn = attention_for<A>();
    // The cache is bf16 exactly when the rows may be (both follow the weights); the other pairing
    // is not compiled.
    if (has_cache())  // into a bf16 cache fp32 rows are rounded to nearest even
      with_cache([&](auto& cache) {
        if constexpr (kernels::decode_scalars_v<A, typename std::decay_t<decltype(cache)>::value_type, A>)
          append_extend(exec_, cache, layer, step_, kv);
      });
    if (decode)
      with_cache([&](const auto& cache) {
        if constexpr (kernels::decode_scalars_v<A, typename std::decay_t<decltype(cache)>::value_type, A>)
          attn.extend(exec_, step_, rows_, q, o, cache, layer, params);
      });
    else attn.prefill(exec_, keys_, q, kv, o, params);
    w.wo_b(exec_, o, a);  // Partial over attn_tp
    using Partials = Rows<A, Partial<AttnTp>, DpLocal, ExecSpace>;
    // Summed: this member's chunk of the rows (split), or all of them.
    a = split ? reduce_scatter(exec_, groups_, Partials(a), &traffic_).view() : attn.all_reduce(exec_, Partials(a)).view();
    recorder_.attention_output(layer, x.owners, a, {}, split);

    const View residual = fresh<View>("relayout::residual", m, H);
    Kokkos::deep_copy(exec_, residual, x.rows);
    VA moe_in = a;
    if constexpr (std::is_same_v<A, float>) {
      kernels::add_rms_norm(exec_, a, residual, w.ffn_norm, dims_.rms_eps);  // residual = x + attn
    } else {  // residual = x + attn in fp32; the MoE input is its norm, rounded once to bf16
      add_into(residual, a);
      moe_in = fresh<VA>("relayout::moe_in", m, H);
      kernels::rms_norm(exec_, residual, w.ffn_norm, dims_.rms_eps, moe_in);
    }
    exec_.fence();
    const auto y = moe<A>(layer, w, moe_in, x.owners, n_rows);
    if (y.first.extent(0) != m)
      throw LayoutError("bridge", "layer " + std::to_string(layer) + ": the bridge returned " +
                                      std::to_string(y.first.extent(0)) + " rows for " + std::to_string(m) +
                                      " (rows lost or duplicated)");
    add_into(residual, y.first);
    exec_.fence();
    recorder_.layer_output(layer, y.second, residual, split);
    return {residual, y.second};
  }

  // The hand-over through the library's bridge, with this model's router and SwiGLU experts, on
  // rows of A (fp32, or bf16: MoeBridge<C, bf16> moves and sums bf16 rows).
  // a: this DP group's rows, or under split_residual this member's chunk of its n rows.
  template <class A>
  std::pair<RowsView<A, ExecSpace>, std::vector<std::int64_t>> moe(int layer, const LayerShard<ExecSpace>& w,
                                                                   const RowsView<A, ExecSpace>& a,
                                                                   const std::vector<std::int64_t>& owners,
                                                                   std::int64_t n) {
    recorder_.bridge_input(layer, owners, a, split_residual());
    DemoRouter<ExecSpace> router{{w.router, dims_.router()}, skew_routing(dims_), dims_.expert_skew > 0, routed_owners_};
    if (router.skewed && layer == 0) {  // once per forward: every layer routes these rows
      const std::vector<std::int64_t> ids = routed_owners(bridge_, groups_, counts_, row_owners_);
      routed_owners_ = Kokkos::View<std::int64_t*, typename ExecSpace::memory_space>("relayout::routed_owners", ids.size());
      Kokkos::deep_copy(routed_owners_, Kokkos::View<const std::int64_t*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(ids.data(), ids.size()));
      router.tokens = routed_owners_;
    }
    const auto& experts = w.experts();  // fp32 or bf16 weights (ModelDims::weights)
    std::vector<std::int64_t> out_owners = owners;
    try {
      auto& bridge = bridge_for<A>();
      const typename relayout::MoeBridge<C, A, ExecSpace>::RunOptions run{
          .global_num_tokens = counts_,
          .owners = opts_.track_owners ? &out_owners : nullptr,
          .observer = recorder_.observer(layer),
          .traffic = &traffic_,
          .ep_mode = dispatches_rows(groups_.layout().bridge_path())
                         ? std::optional<EpMode>(decoding_ ? opts_.decode_ep_mode : EpMode::normal)
                         : std::nullopt};
      if (split_residual()) {
        using Shard = Rows<A, RowShard<AttnTp>, DpLocal, ExecSpace>;
        return {bridge.run(exec_, Shard(a, n), router, experts, run).view(), std::move(out_owners)};
      }
      return {bridge.run(exec_, Rows<A, Replicated<AttnTp>, DpLocal, ExecSpace>(a), router, experts, run).view(),
              std::move(out_owners)};
    } catch (const LayoutError& e) {
      if (e.input() == "bridge")
        recorder_.bridge_failed(layer, e.what());
      throw LayoutError(e.input(), "layer " + std::to_string(layer) + ": " + e.what());
    }
  }
  // The bridge of rows of A (one for prefill and decode: the EP mode is chosen per run).
  template <class A>
  auto& bridge_for() {
    if constexpr (std::is_same_v<A, float>) return bridge_;
    else return *bridge16_;
  }

  const ProcessGroupsOf<C>& groups_;
  ModelDims dims_;
  LayerOptions opts_;
  ExecSpace exec_;
  relayout::MoeBridge<C, float, ExecSpace> bridge_{groups_, dims_.experts, opts_};
  std::optional<relayout::MoeBridge<C, relayout::bf16, ExecSpace>> bridge16_;  // bf16_rows()
  bool decoding_ = false;
  std::vector<LayerShard<ExecSpace>> shards_;
  TrafficLog traffic_;
  std::vector<Boundary> boundaries_;
  std::vector<std::int64_t> counts_;
  std::vector<std::int64_t> row_owners_;  // ModelDims::expert_skew > 0: this forward's rows' owners (new_rows)
  Kokkos::View<std::int64_t*, typename ExecSpace::memory_space> routed_owners_;  // those the bridge routes here
  Recorder recorder_{groups_, nullptr, &counts_, keep_boundaries(opts_, &boundaries_)};
  PaddingMode mode_ = PaddingMode::sum_len;
  using Cache = kernels::PagedKvCache<float, typename ExecSpace::memory_space>;
  using CacheBf16 = kernels::PagedKvCache<relayout::bf16, typename ExecSpace::memory_space>;
  std::unique_ptr<Cache> cache_;       // fp32 weights
  std::unique_ptr<CacheBf16> cache16_;  // bf16 weights (kv_cache_bf16)
  bool has_cache() const { return cache_ || cache16_; }
  // f on the cache reserve_kv made (one of the two).
  template <class F>
  decltype(auto) with_cache(F&& f) {
    return cache16_ ? f(*cache16_) : f(*cache_);
  }
  template <class F>
  decltype(auto) with_cache(F&& f) const {
    return cache16_ ? f(std::as_const(*cache16_)) : f(std::as_const(*cache_));
  }
  CpAttention<C, float, ExecSpace> attn_{groups_, &traffic_};
  CpAttention<C, relayout::bf16, ExecSpace> attn16_{groups_, &traffic_};  // bf16_rows()
  // The table's store: the cache reserve_kv made (heap objects, stable while the model lives).
  struct KvHook {
    Cache* f32 = nullptr;
    CacheBf16* b16 = nullptr;
    ExecSpace exec{};
    template <class F>
    void each(F&& f) const {
      if (f32) f(*f32);
      if (b16) f(*b16);
    }
    void on_admit(int slot, std::int64_t) const { each([&](auto& c) { c.release(exec, slot); }); }
    void on_release(int slot) const { each([&](auto& c) { c.release(exec, slot); }); }
    void on_truncate(int slot, std::int64_t rows) const { each([&](auto& c) { c.truncate(exec, slot, rows); }); }
  };
  RequestTable<KvHook> requests_{0, 1, 0, KvHook{}};  // request j of the group in slot j (reserve_kv)
  PrefillKeys<typename ExecSpace::memory_space> keys_;  // this prefill's keys
  ExtendPlan step_;                                   // this forward's new rows (the prefill's: to cache)
  ExtendRows<typename ExecSpace::memory_space> rows_;  // decode / extend: the rows attended here
};

}  // namespace relayout::model
