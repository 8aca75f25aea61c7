// The distributed DeepSeek-V4-like decoder layers on the ranks of one TP domain: attention with
// query heads split over attn_tp (wq_b column-parallel, shared KV replicated, wo_b row-parallel and
// completed by the attention-TP all-reduce), then the bridge (bridge.hpp) into the MoE and back.
// Under attention context parallelism each CP rank holds its share of its DP group's rows and
// all-gathers the shared KV over attn_cp (docs/cp.md).
// With a KV cache (reserve_kv) the prefill keeps every layer's shared KV rows (under CP each CP rank
// those of the positions it holds) and decode_step runs one new row per live request against them
// (attention_decode through the block table; under CP partials merged by log-sum-exp, docs/kv_cache.md);
// extend appends several rows per request, each attending causally (a speculative verify).
// A trace sink (relayout/trace; none by default) receives a record after every boundary, including
// the attention all-reduce and each layer's output.
#pragma once

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "relayout/comm.hpp"
#include "relayout/kernels/attention.hpp"
#include "relayout/kernels/kv_cache.hpp"
#include "relayout/kernels/linear.hpp"
#include "relayout/kernels/moe.hpp"
#include "relayout/kernels/rms_norm.hpp"
#include "demo/model/bridge.hpp"
#include "demo/model/config.hpp"
#include "demo/model/layer_weights.hpp"
#include "demo/model/wire.hpp"
#include "demo/model/workload.hpp"

namespace relayout::model {

template <class C, class ExecSpace = Kokkos::DefaultExecutionSpace, class Sink = trace::NullSink>
  requires trace::TraceSink<Sink>
class DistributedModel {
 public:
  using View = RowsView<float, ExecSpace>;
  using Tracked = LayerRows<ExecSpace>;
  using Typed = typename Tracked::rows_type;
  using Recorder = BoundaryRecorder<C, ExecSpace, Sink>;

  DistributedModel(const ProcessGroupsOf<C>& groups, const ModelDims& dims, const BridgeOptions& opts = {},
                   ExecSpace exec = ExecSpace())
      : groups_(groups), dims_(dims), opts_(opts), exec_(exec) {
    const Widths& w = groups_.layout().widths();
    validate(dims_, w);
    check_inject(opts_.inject, groups_.layout().bridge_path(), w);
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
      throw LayoutError("trace", "tracing needs BridgeOptions::track_owners: the trace names every row by its owner");
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
    if (!opts_.track_owners) owners.clear();
    Tracked x(Typed(values), std::move(owners));
    gather_counts(mine);
    const KvRows kv_rows = kv_rows_of(work);
    if (cache_) {  // the prefill fills the cache: request j of the group is slot j, with the positions held here
      for (int slot = 0; slot < cache_->shape().max_requests; ++slot) cache_->release(exec_, slot);
      const std::vector<int> cu = work.cu_seqlens_of(k.attn_dp_rank);
      kv_held_.assign(cu.size() - 1, {});
      for (int row : work.positions_of(k.attn_dp_rank, CpShare::of(groups_.layout(), k.attn_cp_rank))) {
        const std::size_t j = std::size_t(std::upper_bound(cu.begin(), cu.end(), row) - cu.begin()) - 1;
        kv_held_[j].push_back(row - cu[j]);
      }
      kv_cu_ = {0};
      for (const auto& held : kv_held_) kv_cu_.push_back(kv_cu_.back() + int(held.size()));
      kv_slots_.resize(kv_held_.size());
      std::iota(kv_slots_.begin(), kv_slots_.end(), 0);
      kv_len_.clear();
      for (std::size_t j = 0; j + 1 < cu.size(); ++j) kv_len_.push_back(cu[j + 1] - cu[j]);
    }
    for (int layer = 0; layer < dims_.layers; ++layer) x = layer_forward(layer, x, kv_rows);
    return x;
  }

  // A paged KV cache for this rank's DP group's requests, each `rows_per_request` rows at most
  // (prompt + decode steps); allocated here, filled by the next forward.
  // Under CP a rank holds at most ceil(L / cp) of a request's L prompt rows and ceil(S / cp) of its
  // S decode rows, so at most ceil(rows_per_request / cp) + 1 rows of it.
  void reserve_kv(const Workload& work, int rows_per_request, int block_size = 16) {
    const int n = int(work.requests_of(groups_.coords().attn_dp_rank).size()), cp = groups_.layout().widths().attn_cp;
    const int rows = cp > 1 ? (rows_per_request + cp - 1) / cp + 1 : rows_per_request;
    const int blocks = (rows + block_size - 1) / block_size;
    cache_ = std::make_unique<Cache>(kernels::KvCacheShape{dims_.layers, dims_.head_dim, block_size, n * blocks, n, blocks});
    kv_held_.assign(std::size_t(n), {});
    kv_len_.assign(std::size_t(n), 0);
  }

  // Decode step `step` (1-based): every live request of this rank's DP group feeds one row,
  // next_input of its previous output row (the prefill's last row at step 1); the row is held by
  // CP rank p mod attn_cp, p its position, and `prev` holds the rows this rank returned last time.
  // Under CP the rank holding a previous row computes the next input and the inputs are shared over
  // attn_cp (an engine shares the sampled token). Returns this rank's rows in request order.
  // Collective like forward: a group or CP rank with no live row joins every collective with zero rows.
  Tracked decode_step(const Workload& work, const DecodePlan& plan, int step, const Tracked& prev) {
    if (!cache_) throw LayoutError("decode", "decode_step needs a KV cache: call reserve_kv before the prefill");
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
    wire_.all_gatherv(GroupKind::attn_cp, std::span<const float>(inputs), std::span<float>(all), elems);
    at.assign(reqs.size(), -1);
    for (std::size_t i = 0; i < order.size(); ++i) at[std::size_t(order[i])] = int(i);
    // This rank's rows, and every row of the group attended here (under CP, CP rank after CP rank).
    std::vector<float> rows;
    std::vector<std::int64_t> owners;
    kv_slots_.clear();
    kv_cu_ = {0};
    std::vector<int> attended, first;
    KvRows kr;
    kr.counts.assign(std::size_t(me.cp), 0);
    for (int c = 0; c < me.cp; ++c)
      for (int j = 0; j < int(reqs.size()); ++j) {
        const int r = reqs[std::size_t(j)], p = work.lengths[std::size_t(r)] + step - 1;
        if (!plan.live(r, step) || work.cp_rank_of(r, p, me) != c) continue;
        ++kr.counts[std::size_t(c)];
        attended.push_back(j);
        kv_len_[std::size_t(j)] = p + 1;
        if (c != me.rank) continue;
        rows.insert(rows.end(), all.begin() + std::ptrdiff_t(at[std::size_t(j)]) * H,
                    all.begin() + std::ptrdiff_t(at[std::size_t(j)] + 1) * H);
        owners.push_back(RowOwner::pack(r, p));
        kv_held_[std::size_t(j)].push_back(p);
        kv_slots_.push_back(j);
        kv_cu_.push_back(int(kv_slots_.size()));
      }
    for (int j : attended) {  // where the window starts among the keys held here
      const int start = W > 0 ? std::max(0, work.lengths[std::size_t(reqs[std::size_t(j)])] + step - W) : 0;
      const auto& held = kv_held_[std::size_t(j)];
      first.push_back(int(std::lower_bound(held.begin(), held.end(), start) - held.begin()));
    }
    const std::size_t n = kv_slots_.size();
    const View values("relayout::decode_input", n, std::size_t(H));
    Kokkos::deep_copy(values, Kokkos::View<const float**, Kokkos::LayoutRight, Kokkos::HostSpace,
                                           Kokkos::MemoryTraits<Kokkos::Unmanaged>>(rows.data(), n, std::size_t(H)));
    Tracked x(Typed(values), opts_.track_owners ? owners : std::vector<std::int64_t>{});
    gather_counts(std::int64_t(n));
    kr.cu = to_device(me.cp > 1 ? attended : kv_slots_, "relayout::decode_slots");
    kr.positions = to_device(first, "relayout::decode_first");
    for (int layer = 0; layer < dims_.layers; ++layer) x = layer_forward(layer, x, kr, true);
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
    if (!cache_) throw LayoutError("decode", "extend needs a KV cache: call reserve_kv first");
    const CpShare me = CpShare::of(groups_.layout(), groups_.coords().attn_cp_rank);
    if (counts.size() > kv_len_.size())
      throw LayoutError("decode", "extend: counts for " + std::to_string(counts.size()) + " requests; the cache holds " +
                                      std::to_string(kv_len_.size()));
    std::vector<int> row_slot;
    for (int j = 0; j < int(counts.size()); ++j) {
      if (counts[std::size_t(j)] < 0)
        throw LayoutError("decode", "extend: request " + std::to_string(j) + " has " +
                                        std::to_string(counts[std::size_t(j)]) + " new rows; a count must be >= 0");
      for (int p = kv_len_[std::size_t(j)]; p < kv_len_[std::size_t(j)] + counts[std::size_t(j)]; ++p)
        if (extend_cp_rank(p) == me.rank) row_slot.push_back(j);
    }
    if (inputs.extent(0) != row_slot.size() || owners.size() != row_slot.size())
      throw LayoutError("decode", "extend: " + std::to_string(inputs.extent(0)) + " input rows and " +
                                      std::to_string(owners.size()) + " owners for the " + std::to_string(row_slot.size()) +
                                      " new rows held here");
    // This rank's rows go into its cache: their positions held here, in order.
    kv_slots_.clear();
    kv_cu_ = {0};
    const std::vector<int> base(kv_len_.begin(), kv_len_.begin() + std::ptrdiff_t(counts.size()));
    for (int j = 0; j < int(counts.size()); ++j) {
      auto& held = kv_held_[std::size_t(j)];
      const std::size_t before = held.size();
      for (int p = base[std::size_t(j)]; p < base[std::size_t(j)] + counts[std::size_t(j)]; ++p)
        if (extend_cp_rank(p) == me.rank) held.push_back(p);
      kv_len_[std::size_t(j)] = base[std::size_t(j)] + counts[std::size_t(j)];
      const int n = int(held.size() - before);
      if (n == 0) continue;
      kv_slots_.push_back(j);
      kv_cu_.push_back(kv_cu_.back() + n);
    }
    // Every row of the group attended here, CP rank after CP rank (without CP: this rank's rows):
    // its slot, how many keys held here it sees (those at positions <= its own) and where its window
    // starts among them.
    const int W = dims_.window;
    std::vector<int> attended, limit, first;
    KvRows rows;
    rows.counts.assign(std::size_t(me.cp), 0);
    for (int c = 0; c < me.cp; ++c)
      for (int j = 0; j < int(counts.size()); ++j) {
        const auto& held = kv_held_[std::size_t(j)];
        for (int p = base[std::size_t(j)]; p < base[std::size_t(j)] + counts[std::size_t(j)]; ++p) {
          if (extend_cp_rank(p) != c) continue;
          ++rows.counts[std::size_t(c)];
          attended.push_back(j);
          limit.push_back(int(std::upper_bound(held.begin(), held.end(), p) - held.begin()));
          first.push_back(int(std::lower_bound(held.begin(), held.end(), W > 0 ? p - W + 1 : 0) - held.begin()));
        }
      }
    Tracked x(Typed(inputs), opts_.track_owners ? owners : std::vector<std::int64_t>{});
    gather_counts(std::int64_t(row_slot.size()));
    rows.cu = to_device(attended, "relayout::extend_slots");
    rows.limits = to_device(limit, "relayout::extend_limits");
    rows.positions = to_device(first, "relayout::extend_first");
    for (int layer = 0; layer < dims_.layers; ++layer) x = layer_forward(layer, x, rows, true);
    if (opts_.track_owners && x.owners != owners)
      throw LayoutError("bridge", "extend: rows came back in another order");
    return x;
  }
  // The CP rank that holds position p of a request in extend (decode places its rows after the prompt so).
  int extend_cp_rank(int p) const { return p % groups_.layout().widths().attn_cp; }
  // Keeps the first `length` positions of slot j in every layer: rolls back rejected speculative
  // rows. Under CP each CP rank keeps those of its held positions below `length`.
  void truncate_kv(int slot, std::int64_t length) {
    if (slot < 0 || std::size_t(slot) >= kv_held_.size())
      throw LayoutError("decode", "truncate_kv: slot " + std::to_string(slot) + " is not in [0, " +
                                      std::to_string(kv_held_.size()) + ")");
    if (length < 0)
      throw LayoutError("decode", "truncate_kv: length " + std::to_string(length) + " must be >= 0");
    auto& held = kv_held_[std::size_t(slot)];
    const auto keep = std::lower_bound(held.begin(), held.end(), length) - held.begin();
    cache_->truncate(exec_, slot, keep);
    held.resize(std::size_t(keep));
    kv_len_[std::size_t(slot)] = int(std::min<std::int64_t>(kv_len_[std::size_t(slot)], length));
  }
  // Positions of slot j cached over the DP group (under CP spread over the CP ranks).
  std::int64_t kv_length(int slot) const { return kv_len_.at(std::size_t(slot)); }
  // The kv rows of slot j this rank's cache holds (kv_length(j) without CP).
  std::int64_t kv_held(int slot) const { return cache_->length(0, slot); }

  const TrafficLog& traffic() const { return traffic_; }
  void clear_traffic() { traffic_.clear(); }
  const std::vector<Boundary>& boundaries() const { return boundaries_; }
  const std::vector<std::int64_t>& global_num_tokens() const { return counts_; }
  PaddingMode padding() const { return mode_; }
  const ModelDims& dims() const { return dims_; }

 private:
  using IntView = Kokkos::View<int*, typename ExecSpace::memory_space>;
  static IntView to_device(const std::vector<int>& v, const char* label) {
    IntView d(std::string(label), v.size());
    Kokkos::deep_copy(d, Kokkos::View<const int*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(v.data(), v.size()));
    return d;
  }

  // The keys this rank's queries attend: its DP group's requests (cu), the kv row of each of its
  // own rows (positions, by which causality and the window go) and, under CP, where the rows
  // all-gathered over attn_cp (CP rank after CP rank) belong in the group's order. In decode: cu
  // the cache slot of each query row attended here (under CP the group's rows, CP rank after CP
  // rank), positions where its window starts among the keys held here, counts rows per CP rank;
  // extend as decode, several rows per slot.
  struct KvRows {
    IntView cu, positions, order;
    std::vector<int> counts;  // kv rows held by each CP rank
    IntView limits;           // extend: query row b sees the first limits(b) rows held of slot cu(b)
  };
  KvRows kv_rows_of(const Workload& work) const {
    const RankCoords k = groups_.coords();
    KvRows r;
    r.cu = to_device(work.cu_seqlens_of(k.attn_dp_rank), "relayout::cu_seqlens");
    std::vector<int> order, mine;
    for (int c = 0; c < groups_.layout().widths().attn_cp; ++c) {
      const std::vector<int> pos = work.positions_of(k.attn_dp_rank, CpShare::of(groups_.layout(), c));
      r.counts.push_back(int(pos.size()));
      order.insert(order.end(), pos.begin(), pos.end());
      if (c == k.attn_cp_rank) mine = pos;
    }
    r.positions = to_device(mine, "relayout::positions");
    r.order = to_device(order, "relayout::kv_order");
    return r;
  }

  // CP: every CP rank's kv rows, all-gathered over attn_cp and put in the group's row order.
  View gather_kv(const View& kv, const KvRows& r) {
    const std::size_t D = kv.extent(1), total = r.order.extent(0);
    View cat("relayout::kv_cp", total, D), all("relayout::kv_group", total, D);
    std::vector<int> counts;
    for (int c : r.counts) counts.push_back(c * int(D));
    exec_.fence();
    wire_.all_gatherv(GroupKind::attn_cp, std::span<const float>(kv.data(), kv.size()),
                      std::span<float>(cat.data(), cat.size()), counts);
    const IntView order = r.order;
    Kokkos::parallel_for(
        "relayout::kv_order", Kokkos::RangePolicy<ExecSpace>(exec_, 0, std::int64_t(total)),
        KOKKOS_LAMBDA(const std::int64_t j) {
          for (std::size_t f = 0; f < D; ++f) all(order(j), f) = cat(j, f);
        });
    return all;
  }

  // CP decode and extend: every CP rank attends all the group's rows (queries all-gathered over
  // attn_cp) over the keys it holds; each row's partials (output and log-sum-exp per head) go back to the
  // row's CP rank (all_to_allv), which merges them.
  void cp_decode(int layer, const View& q, const KvRows& r, const View& o, kernels::AttentionParams params) {
    const std::size_t HD = q.extent(1), heads = HD / std::size_t(dims_.head_dim), N = r.cu.extent(0), n = q.extent(0);
    const int cp = int(r.counts.size());
    View all_q("relayout::q_cp", N, HD), part("relayout::attn_partial", N, HD), lse("relayout::attn_lse", N, heads),
        parts("relayout::attn_parts", std::size_t(cp) * n, HD), lses("relayout::attn_lses", std::size_t(cp) * n, heads);
    std::vector<int> q_counts, o_send, o_recv, l_send, l_recv;
    for (int c : r.counts) {
      q_counts.push_back(c * int(HD));
      o_send.push_back(c * int(HD));
      l_send.push_back(c * int(heads));
      o_recv.push_back(int(n * HD));
      l_recv.push_back(int(n * heads));
    }
    exec_.fence();
    wire_.all_gatherv(GroupKind::attn_cp, std::span<const float>(q.data(), q.size()),
                      std::span<float>(all_q.data(), all_q.size()), q_counts);
    params.window = 0;  // given per row by r.positions
    // Extend: each row sees only the keys held here at positions up to its own (r.limits).
    kernels::attention_decode_partial(exec_, all_q, r.limits.extent(0) > 0 ? causal_kv(layer, r) : cache_->view(layer, r.cu),
                                      r.positions, part, lse, params);
    exec_.fence();
    wire_.all_to_allv(GroupKind::attn_cp, std::span<const float>(part.data(), part.size()), o_send,
                      std::span<float>(parts.data(), parts.size()), o_recv);
    wire_.all_to_allv(GroupKind::attn_cp, std::span<const float>(lse.data(), lse.size()), l_send,
                      std::span<float>(lses.data(), lses.size()), l_recv);
    kernels::attention_merge(exec_, parts, lses, o);
  }

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

  // Every rank all-gathers its DP group's token count (relayout::gather_num_tokens, which checks
  // that the members of an attention-TP group agree); all pick the padding mode from the result.
  void gather_counts(std::int64_t mine) {
    counts_ = bridge_.gather_num_tokens(mine);
    if (groups_.layout().size() > 1)
      traffic_.add(Op::all_gather_counts, GroupKind::tp, std::int64_t(groups_.layout().size() * sizeof(std::int64_t)));
    mode_ = bridge_.padding(counts_);
    slots_ = groups_.layout().bridge_path() == BridgePath::dp_gather ? bridge_.slots(counts_) : nullptr;
  }

  // Extend: query row b reads slot cu(b) through a block table of its own (a copy of the slot's)
  // with length limits(b), so the decode kernel stops at the row's own position.
  kernels::PagedKv<float, typename ExecSpace::memory_space> causal_kv(int layer, const KvRows& r) const {
    const auto all = cache_->view(layer, r.cu);
    const std::int64_t n = std::int64_t(r.cu.extent(0)), B = std::int64_t(all.block_table.extent(1));
    Kokkos::View<int**, typename ExecSpace::memory_space> table("relayout::extend_table", n, B);
    const IntView rows("relayout::extend_rows", n), cu = r.cu;
    const auto src = all.block_table;
    Kokkos::parallel_for(
        "relayout::extend_table", Kokkos::RangePolicy<ExecSpace>(exec_, 0, n), KOKKOS_LAMBDA(const std::int64_t b) {
          rows(b) = int(b);
          for (std::int64_t i = 0; i < B; ++i) table(b, i) = src(cu(b), i);
        });
    return {all.pool, table, r.limits, rows, all.block_size};
  }

  // decode: kv_rows.cu holds the cache slot of each row and attention reads the cache.
  Tracked layer_forward(int layer, const Tracked& x, const KvRows& kv_rows, bool decode = false) {
    const LayerShard<ExecSpace>& w = shards_[std::size_t(layer)];
    const std::size_t n = x.view().extent(0), H = std::size_t(dims_.hidden), Q = std::size_t(dims_.q_lora),
                      D = std::size_t(dims_.head_dim), HD = std::size_t(w.spec.heads) * D;
    View xn("relayout::xn", n, H), qa("relayout::qa", n, Q), qn("relayout::qn", n, Q), q("relayout::q", n, HD),
        kvr("relayout::kv_raw", n, D), kv("relayout::kv", n, D), o("relayout::o", n, HD), a("relayout::attn_out", n, H);
    kernels::rms_norm(exec_, x.view(), w.attn_norm, dims_.rms_eps, xn);
    kernels::linear(exec_, xn, w.wq_a, qa);
    kernels::rms_norm(exec_, qa, w.q_norm, dims_.rms_eps, qn);
    kernels::linear(exec_, qn, w.wq_b, q);
    kernels::linear(exec_, xn, w.wkv, kvr);
    kernels::rms_norm(exec_, kvr, w.kv_norm, dims_.rms_eps, kv);
    kernels::AttentionParams params;
    params.head_dim = dims_.head_dim;
    params.scale = kernels::default_softmax_scale(dims_.head_dim);
    params.window = dims_.window;
    if (cache_)
      for (std::size_t i = 0; i < kv_slots_.size(); ++i)
        cache_->append(exec_, layer, kv_slots_[i], Kokkos::subview(kv, std::pair<int, int>(kv_cu_[i], kv_cu_[i + 1]), Kokkos::ALL));
    if (decode && groups_.layout().widths().attn_cp > 1) {
      cp_decode(layer, q, kv_rows, o, params);
    } else if (decode && kv_rows.limits.extent(0) > 0) {
      kernels::attention_decode(exec_, q, causal_kv(layer, kv_rows), o, params);
    } else if (decode) {
      kernels::attention_decode(exec_, q, cache_->view(layer, kv_rows.cu), o, params);
    } else {
      const View keys = groups_.layout().widths().attn_cp > 1 ? gather_kv(kv, kv_rows) : kv;
      kernels::attention_prefill(exec_, q, keys, kv_rows.cu, kv_rows.positions, o, params);
    }
    kernels::linear(exec_, o, w.wo_b, a);  // Partial over attn_tp
    exec_.fence();
    wire_.all_reduce(GroupKind::attn_tp, std::span<float>(a.data(), a.size()));  // now Replicated
    const int group_ranks = groups_.layout().widths().attn_tp;  // the holders of each row
    recorder_(layer, {"attention all_reduce", "attn_out", RowState::replicated, group_ranks, GroupKind::attn_tp},
              x.owners, a);

    View residual("relayout::residual", n, H);
    Kokkos::deep_copy(exec_, residual, x.view());
    kernels::add_rms_norm(exec_, a, residual, w.ffn_norm, dims_.rms_eps);  // residual = x + attn
    exec_.fence();
    const Tracked y = moe(layer, w, a, x.owners);
    if (y.view().extent(0) != n)
      throw LayoutError("bridge", "layer " + std::to_string(layer) + ": the bridge returned " +
                                      std::to_string(y.view().extent(0)) + " rows for " + std::to_string(n) +
                                      " (rows lost or duplicated)");
    const View yv = y.view();
    Kokkos::parallel_for(
        "relayout::residual_add", Kokkos::RangePolicy<ExecSpace>(exec_, 0, std::int64_t(n * H)),
        KOKKOS_LAMBDA(const std::int64_t i) { residual.data()[i] += yv.data()[i]; });
    exec_.fence();
    recorder_(layer, {"layer output", "layer_out", RowState::replicated, group_ranks, {}, false}, y.owners, residual);
    return Tracked(Typed(residual), y.owners);
  }

  // The hand-over through the library's bridge, with this model's router and SwiGLU experts.
  Tracked moe(int layer, const LayerShard<ExecSpace>& w, const View& a, const std::vector<std::int64_t>& owners) {
    const int group_ranks = groups_.layout().widths().attn_tp;
    recorder_(layer, {"bridge input", "moe_in", RowState::replicated, group_ranks, {}, false}, owners, a);
    const kernels::LinearTopkRouter<float, ExecSpace> router{w.router, dims_.router()};
    const kernels::SwigluExperts<float, ExecSpace> experts{w.experts, w.shared};
    std::vector<std::int64_t> out_owners = owners;
    try {
      Typed y = bridge_.run(exec_, Typed(a), slots_, router, experts, opts_.track_owners ? &out_owners : nullptr,
                            RecordBoundaries<Recorder>{recorder_, layer}, &traffic_);
      return Tracked(std::move(y), std::move(out_owners));
    } catch (const LayoutError& e) {
      if (e.input() == "bridge")
        recorder_.fail(layer, {"row conservation", "moe_out", RowState::replicated, group_ranks, {}, false}, e.what());
      throw LayoutError(e.input(), "layer " + std::to_string(layer) + ": " + e.what());
    }
  }

  const ProcessGroupsOf<C>& groups_;
  ModelDims dims_;
  BridgeOptions opts_;
  ExecSpace exec_;
  relayout::MoeBridge<C, float, ExecSpace> bridge_{groups_, dims_.experts, bridge_options(opts_)};
  DpSlotsPtr slots_;
  std::vector<LayerShard<ExecSpace>> shards_;
  TrafficLog traffic_;
  Wire<C> wire_{groups_, &traffic_};
  std::vector<Boundary> boundaries_;
  std::vector<std::int64_t> counts_;
  Recorder recorder_{groups_, opts_, &boundaries_, nullptr, &counts_};
  PaddingMode mode_ = PaddingMode::sum_len;
  using Cache = kernels::PagedKvCache<float, typename ExecSpace::memory_space>;
  std::unique_ptr<Cache> cache_;
  std::vector<int> kv_slots_, kv_cu_;  // this forward's rows [kv_cu_[i], kv_cu_[i + 1]) go to slot kv_slots_[i]
  std::vector<std::vector<int>> kv_held_;  // the positions of request slot j cached here, in order
  std::vector<int> kv_len_;                // the positions of request slot j cached over the DP group
};

}  // namespace relayout::model
