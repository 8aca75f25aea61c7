// The distributed layer equals the single-rank reference on real MPI ranks, for every valid layout
// with tp = np (DP attention on/off, backend none/deepep, every dp, cp, ep, moe_dp, and DeepSeek-V4
// prefill CP), with uneven token counts, an idle DP group, requests shorter than cp, both padding
// modes, a sliding window under CP and two stacked layers; and each injected bug is caught.
#include <doctest/doctest.h>

#include <relayout/comm.hpp>
#include <demo/model.hpp>
#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "model_check.hpp"

using namespace relayout;

namespace {

// Float layers against a double reference: each output is a chain of ~10 normalised products with
// accumulation lengths <= 32 (hidden, q_lora, heads*head_dim), so float rounding (6e-8 relative)
// stays near 1e-6 on values of order 1 (measured: under 5e-7 at np = 1..8). A real layout error
// (a lost or doubled partial, a misplaced row) changes rows by order 0.1-1.
constexpr double kTolerance = 1e-5;

model::ModelDims tiny_dims() {
  model::ModelDims d;
  d.hidden = 16;
  d.heads = 8;
  d.head_dim = 4;
  d.q_lora = 8;
  d.experts = 8;
  d.topk = 2;
  d.moe_inter = 8;
  d.shared_inter = 8;
  d.layers = 2;
  d.seed = 7;
  return d;
}

// Uneven prompt lengths; DP group 1 gets no request (an IDLE forward) when there are several groups.
model::Workload workload(int attn_dp) {
  const std::vector<int> lengths{3, 1, 5, 2, 4};
  std::vector<int> placement;
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    const int g = int(i) % attn_dp;
    placement.push_back(attn_dp > 1 && g == 1 ? 0 : g);
  }
  return model::Workload::make(lengths, placement, attn_dp);
}

std::vector<LayoutConfig> layouts(int np) {
  std::vector<LayoutConfig> out;
  for (bool dpa : {false, true})
    for (int dp = 1; dp <= (dpa ? np : 1); ++dp)
      for (int cp = 1; cp <= np; ++cp)
        for (Backend b : {Backend::none, Backend::deepep})
          for (int ep = 1; ep <= (b == Backend::none ? np : 1); ++ep)
            for (int moe_dp = 1; moe_dp <= np; ++moe_dp) {
              // CP layouts: --dp 1 with DP attention has the widths of --dp 1 without; np 8 (slow
              // oversubscribed) keeps ep 1 only (np 4 covers ep > 1 under CP).
              if (cp > 1 && ((dpa && dp == 1) || (np >= 8 && ep != 1))) continue;
              const LayoutConfig c{.tp = np, .dp = dp, .cp = cp, .ep = ep, .moe_dp = moe_dp,
                                   .enable_dp_attention = dpa, .moe_a2a_backend = b};
              if (derive_widths(c).rule == LayoutRule::ok) out.push_back(c);
            }
  for (Backend b : {Backend::none, Backend::deepep})  // DeepSeek-V4 prefill CP: attn_cp = tp
    if (np > 1 && np <= kMaxPrefillCpTp) out.push_back({.tp = np, .moe_a2a_backend = b, .enable_prefill_cp = true, .cp_strategy = CpStrategy::interleave});
  return out;
}

// Which rows of DP group g's batch CP rank r holds, stated independently of the library: plain CP
// (SGLang's in-seq split) cuts each request into 2 * cp blocks, block b holding
// ceil((length - b) / (2 * cp)) tokens, and CP rank r holds blocks r and 2 * cp - 1 - r; prefill
// CP deals the group's tokens round-robin, token i to CP rank i mod cp.
std::vector<std::int64_t> cp_share(const model::Workload& work, int g, int cp, int r, bool round_robin) {
  std::vector<std::int64_t> out;
  int i = 0;
  for (int req : work.requests_of(g)) {
    const int n = work.lengths[std::size_t(req)];
    std::vector<int> block_of(static_cast<std::size_t>(n));
    for (int b = 0, p = 0; b < 2 * cp; ++b)
      for (int k = 0; k < (n - b + 2 * cp - 1) / (2 * cp); ++k) block_of[std::size_t(p++)] = b;
    for (int p = 0; p < n; ++p, ++i) {
      const int b = block_of[std::size_t(p)];
      if (round_robin ? i % cp == r : (b == r || b == 2 * cp - 1 - r)) out.push_back(model::RowOwner::pack(req, p));
    }
  }
  return out;
}

// SGLang's tensor_split, stated independently of the library: n rows in `parts` contiguous chunks,
// chunk i holding ceil((n - i) / parts) rows, so the first n % parts chunks hold one row more.
std::vector<std::int64_t> tensor_split_chunk(const std::vector<std::int64_t>& rows, int parts, int i) {
  const std::int64_t n = std::int64_t(rows.size());
  std::int64_t begin = 0;
  for (int j = 0; j < i; ++j) begin += (n - j + parts - 1) / parts;
  const std::int64_t size = (n - i + parts - 1) / parts;
  return {rows.begin() + begin, rows.begin() + begin + size};
}

struct Outcome {
  double max_abs_err = 0;
  std::int64_t non_finite = 0;
  std::int64_t rows = 0;
  bool owners_match = true;
  std::int64_t splits = 0;  // split_rows boundaries seen, over all ranks
  bool splits_match = true;  // each holds this rank's tensor_split chunk of its DP group's rows
};

Outcome run(const MpiCommunicator& world, const LayoutConfig& c, const BridgeOptions& bridge,
            BridgeFault inject = BridgeFault::none) {
  const RuntimeLayout layout(c);
  const ProcessGroups groups(layout, world);
  const Widths& w = layout.widths();
  model::ModelDims dims = tiny_dims();
  if (w.attn_cp > 1 && !c.enable_prefill_cp) dims.window = 2;  // masks by global position across CP ranks
  const model::Workload work = workload(w.attn_dp);
  model::LayerOptions opts{bridge};
  opts.inject = inject;
  opts.record_boundaries = true;
  model::DistributedModel<MpiCommunicator> net(groups, dims, opts);
  const model::LayerRows<> out = net.forward(work);
  const auto ref = model::reference_forward(dims, work);
  const RankCoords k = groups.coords();
  const auto mine = cp_share(work, k.attn_dp_rank, w.attn_cp, k.attn_cp_rank, c.enable_prefill_cp);
  const auto cmp = test::compare_with_reference(dims, work, ref, k.attn_dp_rank, out, model::CpShare::of(layout, k.attn_cp_rank));
  const bool share_ok = out.owners == mine;
  // Which rows this rank holds after the row split over attn_tp (docs/bridge.md path B) is part of the
  // contract, not only the all-gathered result: check the owners recorded at every split_rows.
  const auto chunk = tensor_split_chunk(mine, w.attn_tp, k.attn_tp_rank);
  std::int64_t splits = 0;
  int split_ok = 1;
  for (const model::Boundary& b : net.boundaries()) {
    if (b.name != "split_rows") continue;
    ++splits;
    if (b.owners != chunk) split_ok = 0;
  }
  double err = cmp.max_abs_err;
  all_reduce_in_place(world, std::span<double>(&err, 1), ReduceOp::max);
  std::int64_t counts[] = {cmp.non_finite, k.attn_tp_rank == 0 ? cmp.rows : 0, splits};
  all_reduce_in_place(world, std::span<std::int64_t>(counts));
  int ok[] = {cmp.owners_match && share_ok ? 1 : 0, split_ok};
  all_reduce_in_place(world, std::span<int>(ok), ReduceOp::min);
  return {err, counts[0], counts[1], ok[0] == 1, counts[2], ok[1] == 1};
}

}  // namespace

TEST_CASE("layer: every valid layout with tp = np matches the single-rank reference") {
  const MpiCommunicator world = MpiCommunicator::world();
  int checked = 0;
  std::int64_t split_checks = 0;
  double worst = 0;
  for (const LayoutConfig& c : layouts(world.size())) {
    const BridgePath path = RuntimeLayout(c).bridge_path();
    std::vector<BridgeOptions> variants{{}};
    if (path == BridgePath::dp_gather) {
      variants = {{.padding = PaddingMode::sum_len}, {.padding = PaddingMode::max_len},
                  {.padding = PaddingMode::sum_len, .restore = BridgeRestore::scatter}};
      if (RuntimeLayout(c).widths().attn_cp > 1 && world.size() >= 8)  // one padding each, both over the sweep
        variants = {{.padding = checked % 2 ? PaddingMode::max_len : PaddingMode::sum_len}};
    }
    for (const BridgeOptions& opts : variants) {
      CAPTURE(c.tp);
      CAPTURE(c.dp);
      CAPTURE(c.ep);
      CAPTURE(c.cp);
      CAPTURE(c.enable_prefill_cp);
      CAPTURE(c.moe_dp);
      CAPTURE(c.enable_dp_attention);
      CAPTURE(to_string(c.moe_a2a_backend));
      CAPTURE(opts.padding ? to_string(*opts.padding) : "auto");
      const Outcome o = run(world, c, opts);
      CHECK(o.owners_match);
      CHECK(o.rows == 15);  // every token row of the workload, once
      CHECK(o.non_finite == 0);
      CHECK(o.max_abs_err < kTolerance);
      if (RuntimeLayout(c).bridge_path() == BridgePath::a2a_split)  // every rank, every layer
        CHECK(o.splits == std::int64_t(world.size()) * tiny_dims().layers);
      CHECK(o.splits_match);
      split_checks += o.splits;
      worst = std::max(worst, o.max_abs_err);
      ++checked;
    }
  }
  MESSAGE("checked " << checked << " layout variants at np = " << world.size() << ", worst max_abs_err "
                      << worst << ", " << split_checks << " split_rows boundaries");
}

TEST_CASE("layer: a NaN or inf row never passes the reference comparison") {
  const model::ModelDims dims = tiny_dims();
  const model::Workload work = workload(1);
  const auto ref = model::reference_forward(dims, work);
  const std::vector<std::int64_t> owners = work.owners_of(0);
  const model::LayerRows<>::view_type values("got", owners.size(), std::size_t(dims.hidden));
  const model::LayerRows<> got(model::LayerRows<>::rows_type(values), owners);
  const auto h = Kokkos::create_mirror_view(values);
  for (std::size_t i = 0; i < got.owners.size(); ++i)
    for (int f = 0; f < dims.hidden; ++f) h(i, std::size_t(f)) = float(ref.rows(int(i), f));
  Kokkos::deep_copy(values, h);
  const auto exact = test::compare_with_reference(dims, work, ref, 0, got);
  CHECK(exact.max_abs_err < kTolerance);
  CHECK(exact.non_finite == 0);
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    CAPTURE(bad);
    for (std::size_t i = 0; i < got.owners.size(); ++i)  // every row, as a layer that outputs NaN rows would
      for (int f = 0; f < dims.hidden; ++f) h(i, std::size_t(f)) = bad;
    Kokkos::deep_copy(values, h);
    const auto c = test::compare_with_reference(dims, work, ref, 0, got);
    CHECK_FALSE(c.max_abs_err < kTolerance);
    CHECK(c.non_finite == std::int64_t(got.owners.size()) * dims.hidden);
  }
}

TEST_CASE("layer: each injected bug is caught (wrong rows, or broken row conservation)") {
  const MpiCommunicator world = MpiCommunicator::world();
  const int np = world.size();
  if (np < 2) return;  // every injected bug needs tp > 1 to show itself
  struct Case {
    BridgeFault inject;
    LayoutConfig layout;
  };
  const Case cases[] = {
      {BridgeFault::double_reduce, {.tp = np, .dp = np, .enable_dp_attention = true}},      // path A
      {BridgeFault::skip_reduce, {.tp = np, .dp = np, .enable_dp_attention = true}},        // path A
      {BridgeFault::double_reduce, {.tp = np, .ep = np}},                                    // tp_moe
      {BridgeFault::skip_reduce, {.tp = np, .ep = np}},                                      // tp_moe
      {BridgeFault::gather_partial, {.tp = np, .dp = np / 2, .enable_dp_attention = true}},  // attn_tp 2
      {BridgeFault::no_split, {.tp = np, .dp = np / 2, .enable_dp_attention = true,
                                 .moe_a2a_backend = Backend::deepep}},
  };
  for (const Case& c : cases) {
    if (c.inject == BridgeFault::gather_partial && np < 4) continue;  // needs attn_dp, attn_tp >= 2
    CAPTURE(to_string(c.inject));
    bool caught = false;
    try {
      const Outcome o = run(world, c.layout, BridgeOptions{}, c.inject);
      caught = o.max_abs_err > 100 * kTolerance || !o.owners_match;
    } catch (const LayoutError& e) {
      caught = std::string(e.what()).find("row conservation broken") != std::string::npos;
    }
    CHECK(caught);
  }
}

TEST_CASE("layer: an injected bug on a layout where it cannot show itself is refused") {
  const MpiCommunicator world = MpiCommunicator::world();
  const RuntimeLayout layout({.tp = world.size()});
  const ProcessGroups groups(layout, world);
  model::LayerOptions opts;
  opts.inject = BridgeFault::no_split;  // tp_moe never splits rows
  CHECK_THROWS_WITH_AS(model::DistributedModel<MpiCommunicator>(groups, tiny_dims(), opts),
                       doctest::Contains("fault no_split needs path a2a_split"), LayoutError);
}

TEST_CASE("layer: decode steps in DeepEP's low-latency mode give the normal mode's rows; over the capacity they stop") {
  const MpiCommunicator world = MpiCommunicator::world();
  const int np = world.size();
  if (np < 2) return;
  const RuntimeLayout layout(LayoutConfig{.tp = np, .moe_a2a_backend = Backend::deepep});  // attn_tp = np
  REQUIRE(layout.bridge_path() == BridgePath::a2a_split);
  const ProcessGroups groups(layout, world);
  const model::Workload work = workload(1);  // 5 requests: one decode row each per step
  const model::DecodePlan plan = model::DecodePlan::make(2, {}, work.requests());
  const auto decode = [&](EpMode mode, std::int64_t capacity) {
    model::LayerOptions opts;
    opts.decode_ep_mode = mode;
    opts.num_max_dispatch_tokens_per_rank = capacity;
    model::DistributedModel<MpiCommunicator> net(groups, tiny_dims(), opts);
    net.reserve_kv(work, 16);
    model::LayerRows<> x = net.forward(work);  // the prefill dispatches in normal mode either way
    for (int s = 1; s <= plan.steps; ++s) x = net.decode_step(work, plan, s, x);
    return Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x.view());
  };
  const auto normal = decode(EpMode::normal, 128);
  const auto low = decode(EpMode::low_latency, work.requests());
  REQUIRE(normal.extent(0) == 5);
  REQUIRE(low.extent(0) == normal.extent(0));
  bool same = true;
  for (std::size_t i = 0; i < normal.extent(0); ++i)
    for (std::size_t f = 0; f < normal.extent(1); ++f) same = same && low(i, f) == normal(i, f);
  CHECK(same);
  if (np < work.requests())  // attn_tp rank 0's chunk of the 5 decode rows holds 2 or more
    CHECK_THROWS_WITH_AS(decode(EpMode::low_latency, 1), doctest::Contains("over the low-latency capacity of 1 rows per rank"),
                         LayoutError);
}
