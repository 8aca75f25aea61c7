// dsv4_layer: DeepSeek-V4-like decoder layers on real MPI ranks in any valid layout, taking the
// layout steps of docs/bridge.md-docs/bridge.md#padding, checked row by row against a single-rank reference (--check).
// Run with mpiexec -n <tp>. The text output shows, for one attention-DP group, which rows each of
// its ranks holds after every boundary of the first layer (the seeds' A B C D picture, real rows).
#include <nlohmann/json.hpp>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common/files_mpi.hpp"
#include "common/gather_all.hpp"
#include "common/huge_pages.hpp"
#include "common/layout_flags.hpp"
#include "common/memory.hpp"
#include "common/mpi_main.hpp"
#include "common/progress.hpp"
#include "common/trace_flag.hpp"
#include "relayout/comm.hpp"
#include "relayout/kernels/isa.hpp"
#include "relayout/placement/expert_load_json.hpp"
#include "relayout/placement/expert_location_sync.hpp"
#include "demo/model.hpp"
#include "relayout/trace.hpp"

using namespace relayout;

namespace {

struct Options {
  cli::LayoutFlags layout;
  std::vector<int> requests{5, 3, 4, 2, 6, 1, 3};
  std::vector<int> placement;
  model::ModelDims dims;
  std::string padding = "auto", restore = "reduce", inject = "none", format = "text";
  std::string dispatch_dtype = "fp32";
  std::string dtype = "fp32";  // --dtype: the element type of the weights and the activations
  std::string expert_load_out;  // --expert-load-out: the measured load per logical expert (JSON)
  std::string deepep_mode = "normal";  // --deepep-mode: the decode steps' EP dispatch
  std::string trace;  // directory for the per-rank row-ownership trace (empty: no trace)
  bool check = false;
  bool two_batch_overlap = false;  // --enable-two-batch-overlap
  bool attn_tp_input_scattered = false;  // --enable-attn-tp-input-scattered
  int show_group = -1;
  double tolerance = 1e-4;
  bool tolerance_given = false;  // --tolerance on the command line (else the --dtype's default)
  std::uint64_t max_memory = 0;  // --max-memory (0: the available memory is the limit)
  int repeat = 0;
  int decode_steps = 0;            // --decode-steps: decode steps after the prefill
  std::vector<int> decode_lengths;  // --decode-lengths: steps of request i (default: all)
  int kv_capacity = 4096;          // --kv-capacity: KV cache rows per request
  bool rebalance = false;          // --expert-skew given with --ep-num-redundant-experts: a rebalanced second forward
  int ll_capacity = 0;             // --num-max-dispatch-tokens-per-rank (low-latency decode dispatch)
  bool ll_capacity_given = false;  // else the requests: no rank dispatches more in a decode step

  bool fp8_dispatch() const { return dispatch_dtype == "fp8"; }
};

using Exec = Kokkos::DefaultExecutionSpace;
constexpr const char* kLlCapacityFlag = "--num-max-dispatch-tokens-per-rank";

std::string labels(const std::vector<std::int64_t>& owners, std::size_t max = 12) {
  std::string s = "[";
  for (std::size_t i = 0; i < owners.size(); ++i) {
    if (owners.size() > max && i == max - 2) {
      s += " ... (" + std::to_string(owners.size()) + " rows)";
      break;
    }
    s += (i ? " " : "") + model::RowOwner::label(owners[i]);
  }
  return s + "]";
}

std::string kib(std::int64_t bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f KiB", double(bytes) / 1024.0);
  return b;
}


// The EP buffers a run's flags add to the estimate, and the flag behind the largest of them: the
// low-latency blocks of --num-max-dispatch-tokens-per-rank rows (allocated whole, one set per
// micro-batch under two-batch overlap) and two-batch overlap's second micro-batch.
struct EpBuffers {
  double low_latency = 0, overlap = 0;
  std::string flag;
};

EpBuffers ep_buffers(const Options& o, const Widths& w, const model::Workload& work, const model::DecodePlan& plan) {
  EpBuffers b;
  const int sets = o.two_batch_overlap ? 2 : 1;
  if (o.deepep_mode == "low_latency" && plan.steps > 0) {
    const int capacity = o.ll_capacity_given ? o.ll_capacity : work.requests();
    b.low_latency = cli::low_latency_bytes(o.dims, w, capacity, o.dispatch_dtype, sets);
    b.flag = std::string(kLlCapacityFlag) + " " + std::to_string(capacity) + " (low-latency blocks of " +
             cli::bytes_text(b.low_latency) + (sets > 1 ? ", one set per micro-batch" : "") + ")";
  }
  if (o.two_batch_overlap) {
    b.overlap = cli::two_batch_overlap_bytes(o.dims, double(work.total_rows()), o.dispatch_dtype);
    if (b.overlap > b.low_latency)
      b.flag = "--enable-two-batch-overlap (a second micro-batch's buffers, " + cli::bytes_text(b.overlap) + ")";
  }
  return b;
}

// Refuses (exit 2) a run whose memory does not fit, before anything is allocated; returns the
// estimate (its flops decide whether the run reports progress).
cli::MemoryEstimate require_size(const Options& o, const Widths& w, const model::Workload& work,
                                 const model::DecodePlan& plan, const MpiCommunicator& world) {
  model::validate(o.dims, w);  // the dims' own rules first: the estimate reads sane values
  const double tokens = double(work.total_rows());
  const double longest = work.lengths.empty() ? 0.0 : double(*std::max_element(work.lengths.begin(), work.lengths.end()));
  // Redundant experts hold weight copies of their own: counted like the routed ones.
  cli::MemoryEstimate need = cli::estimate_model(o.dims, w, tokens, longest, o.layout.config.ep_num_redundant_experts);
  if (o.rebalance) need.weights *= 2;  // the rebalanced forward's model holds weights of its own
  double cache = 0, steps = 0;
  if (plan.steps > 0) {  // the KV cache of every request (a rank holds its group's, under CP its share), decode rows
    cache = cli::kv_cache_elem(o.dims) * o.dims.layers * o.dims.head_dim * double(work.requests()) *
            (double(o.kv_capacity + w.attn_cp - 1) / w.attn_cp + 17);
    steps = 8.0 * o.dims.hidden * double(work.requests()) * plan.steps;
    need.kv += cache;
    need.buffers += steps;
  }
  if (o.check) need.buffers += cli::reference_bytes(o.dims, tokens + double(work.requests()) * plan.steps);
  const EpBuffers ep = ep_buffers(o, w, work, plan);
  need.buffers += ep.low_latency + ep.overlap;
  // The flag behind the largest term comes first: the error names it as the input.
  std::string flags = cli::model_flags(o.dims) + " and " + std::to_string(work.total_rows()) + " tokens (--requests)";
  if (const int r = o.layout.config.ep_num_redundant_experts; r > 0)
    flags = "--ep-num-redundant-experts " + std::to_string(r) + " (weight copies of their own) with " + flags;
  const double largest = std::max({need.weights, need.activations, need.kv, need.buffers});
  if (cache > 0 && cache >= largest / 2)
    flags = "--kv-capacity " + std::to_string(o.kv_capacity) + " (KV rows per request, for " +
            std::to_string(work.requests()) + " requests) with " + flags;
  else if (steps > 0 && steps >= largest / 2)
    flags = "--decode-steps " + std::to_string(plan.steps) + " (the rows of every step) with " + flags;
  if (ep.low_latency + ep.overlap >= largest / 2) flags = ep.flag + " with " + flags;
  cli::require_memory(world, need, o.max_memory, flags);
  return need;
}

// Rows whose reference router margin (model::topk_margins) lies within model::router_tie_margin:
// their logits may order the experts otherwise than the reference's, and a different choice is
// outside every rounding bound. They are compared apart: counted, their largest error reported,
// not held to the tolerance.
struct NearTie {
  double margin = 0;  // the threshold: model::router_tie_margin of the check's tolerance
  std::int64_t rows = 0;
  double err = 0;
};

// One row against the reference's: its largest error into err (or into near, for a row near a
// router tie, counted there when `counted`: one rank per row); a NaN or inf value is counted in bad
// and makes err infinite.
template <class H>
void compare_row(const H& h, std::size_t i, const double* want, int hidden, double margin, bool counted,
                 double& err, NearTie& near, std::int64_t& bad) {
  double e = 0;
  bool finite = true;
  for (int f = 0; f < hidden; ++f) {
    const double v = double(h(i, f));
    if (!std::isfinite(v)) ++bad, finite = false;
    else e = std::max(e, std::abs(v - want[f]));
  }
  if (!finite) err = std::numeric_limits<double>::infinity();
  else if (margin < near.margin) near.rows += counted ? 1 : 0, near.err = std::max(near.err, e);
  else err = std::max(err, e);
}

void reduce_near(const MpiCommunicator& world, NearTie& near) {
  all_reduce_in_place(world, std::span<double>(&near.err, 1), ReduceOp::max);
  all_reduce_in_place(world, std::span<std::int64_t>(&near.rows, 1));
}

// Decode steps after the prefill: each step's rows per DP group (the gathered counts) and time (the
// slowest rank's); with check, every row of every step against the reference recomputed without
// a cache, matched by owner.
struct DecodeRun {
  std::vector<std::vector<std::int64_t>> counts;
  std::vector<double> seconds;
  double err = 0;
  std::int64_t rows = 0, expected = 0, non_finite = 0;
  int owners_ok = 1;
  NearTie near;
};

template <class Net>
DecodeRun decode(Net& net, const model::Workload& work, const model::DecodePlan& plan, model::LayerRows<> prev,
                 const MpiCommunicator& world, const RankCoords& me, const model::CpShare& share, bool check,
                 const model::ModelDims& dims, double tie_margin) {
  DecodeRun r;
  const std::vector<model::ReferenceRows> ref = check ? model::reference_decode(dims, work, plan) : std::vector<model::ReferenceRows>{};
  for (int s = 1; s <= plan.steps; ++s) {
    net.trace_step(s);
    barrier(world);
    const auto t0 = std::chrono::steady_clock::now();
    prev = net.decode_step(work, plan, s, prev);
    net.exec().fence();
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    all_reduce_in_place(world, std::span<double>(&dt, 1), ReduceOp::max);
    r.seconds.push_back(dt);
    r.counts.push_back(net.global_num_tokens());
    if (!check) continue;
    const model::ReferenceRows& want = ref[std::size_t(s - 1)];
    // Step s's rows hold (s + 1) times the prefill's errors (model::decode_check_tolerance), their
    // router inputs too: the margin grows with sqrt(1 + s) (reported: the last step's).
    r.near.margin = tie_margin * std::sqrt(1.0 + s);
    r.expected += std::int64_t(want.owners.size());
    std::map<std::int64_t, int> row_of;
    for (std::size_t i = 0; i < want.owners.size(); ++i) row_of[want.owners[i]] = int(i);
    const std::vector<std::int64_t> expected =
        plan.owners_of(work, me.attn_dp_rank, s, share);
    if (prev.owners != expected) r.owners_ok = 0;
    const auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), prev.view());
    for (std::size_t i = 0; i < expected.size() && r.owners_ok; ++i) {
      const int row = row_of.at(expected[i]);
      compare_row(h, i, want.rows.row(row), dims.hidden, want.router_margin[std::size_t(row)], me.attn_tp_rank == 0,
                  r.err, r.near, r.non_finite);
      if (me.attn_tp_rank == 0) ++r.rows;
    }
  }
  if (check) {
    all_reduce_in_place(world, std::span<double>(&r.err, 1), ReduceOp::max);
    all_reduce_in_place(world, std::span<std::int64_t>(&r.rows, 1));
    all_reduce_in_place(world, std::span<std::int64_t>(&r.non_finite, 1));
    all_reduce_in_place(world, std::span<int>(&r.owners_ok, 1), ReduceOp::min);
    reduce_near(world, r.near);
  }
  return r;
}

// The last layer's measured expert load over the domain: max / mean tokens per moe_ep member on
// rank 0, and the per-logical loads as the file `relayout plan --expert-load` reads (--expert-load-out,
// checked before the work by run(), replaced whole).
ExpertLoad report_expert_load(const Options& o, const Exec& exec, const MpiCommunicator& world, const ExpertLocation& loc,
                              const ExpertLoad& mine) {
  const ExpertLoad total = sum_expert_load(exec, world, loc, mine);
  if (world.rank() == 0) {
    std::int64_t pairs = 0;
    for (std::int64_t v : total.members) pairs += v;
    std::fprintf(stderr, "expert load (last layer, %d physical experts): max/mean tokens per moe_ep member %.3f over %lld (token, expert) pairs\n",
                 loc.physical(), total.imbalance(), static_cast<long long>(pairs));
  }
  if (!o.expert_load_out.empty())  // rank 0 writes; a failure ends every rank together
    cli::write_output_on_root(world, "--expert-load-out", o.expert_load_out,
                              world.rank() == 0 ? expert_load_json(total.logical) : std::string());
  return total;
}

// --expert-skew with --ep-num-redundant-experts: the tokens per moe_ep member under the static
// placement (the first forward) and under the library's rebalancer fed with that forward's load
// (a second forward of the same tokens on a model built with the rebalanced map), each checked.
struct Balance {
  bool on = false;
  ExpertLoad before, after;  // last layer, summed over the domain
  std::shared_ptr<const ExpertLocation> map;
  model::LayerRows<> out;  // the rebalanced forward's rows
  double err = 0;
  std::int64_t rows = 0, non_finite = 0;
  int owners_ok = 1;
  NearTie near;
};

// The rows a check compared apart (NearTie): how many, their largest error, the margin below which
// a row counts as near a tie.
nlohmann::json near_tie_json(const NearTie& n) {
  return {{"rows", n.rows}, {"max_abs_err", n.err}, {"margin", n.margin}};
}

// Why a comparison did not check (Verdict), null when it did.
nlohmann::json unchecked_json(const std::string& why) { return why.empty() ? nlohmann::json(nullptr) : nlohmann::json(why); }

nlohmann::json member_load_json(const ExpertLoad& l) {
  std::int64_t mx = 0, sum = 0;
  for (std::int64_t v : l.members) mx = std::max(mx, v), sum += v;
  const double mean = l.members.empty() ? 0.0 : double(sum) / double(l.members.size());
  return {{"tokens_per_rank", l.members}, {"max", mx}, {"mean", mean}, {"max_over_mean", l.imbalance()}};
}

std::string member_load_text(const char* what, const ExpertLoad& l) {
  const nlohmann::json j = member_load_json(l);
  char line[200];
  std::snprintf(line, sizeof line, "  %-34s max %lld, mean %.1f, max/mean %.3f\n", what,
                static_cast<long long>(j["max"].get<std::int64_t>()), j["mean"].get<double>(), j["max_over_mean"].get<double>());
  return line;
}

// --dtype: the element type of the weights and activations, and the --check tolerance it and --dispatch-dtype allow
// (model::check_tolerance: bf16 weights and fp8 dispatched rows need a looser one than fp32,
// derived from their rounding). Throws LayoutError naming the flag for a dtype other than
// fp32/bf16 and for a --tolerance tighter than the rule allows.
void apply_dtype(Options& o) {
  if (o.dtype != "fp32" && o.dtype != "bf16")
    throw LayoutError("--dtype", "--dtype must be fp32 or bf16 (the element type of the weights and the activations), got '" + o.dtype + "'");
  o.dims.weights = o.dtype == "bf16" ? model::WeightDtype::bf16 : model::WeightDtype::fp32;
  const bool bf16 = o.dims.weights == model::WeightDtype::bf16, fp8 = o.fp8_dispatch();
  if (!bf16 && !fp8) return;
  const double floor = model::check_tolerance(o.dims, fp8, o.layout.config.tp);
  if (!o.tolerance_given) {
    o.tolerance = floor;
  } else if (o.tolerance < floor) {
    const std::string what = bf16 && fp8 ? "--dtype bf16 with --dispatch-dtype fp8" : bf16 ? "--dtype bf16" : "--dispatch-dtype fp8";
    std::string rule;
    if (bf16) rule += std::string(model::kCheckToleranceRule) + "; ";
    if (fp8) rule += std::string(model::kFp8DispatchToleranceRule) + "; ";
    rule += bf16 && fp8 ? "docs/bridge.md#bf16-weights, docs/bridge.md#fp8-dispatch"
            : bf16      ? "docs/bridge.md#bf16-weights"
                        : "docs/bridge.md#fp8-dispatch";
    char m[160];
    std::snprintf(m, sizeof m, "--tolerance %g is tighter than %s allows: %.3g", o.tolerance, what.c_str(), floor);
    throw LayoutError("--tolerance", std::string(m) + " (" + rule + ")");
  }
}

// ---- setup: the layout against the job, the layer options and the workload the flags give

RuntimeLayout job_layout(const Options& o, const MpiCommunicator& world) {
  const RuntimeLayout layout = const_cast<cli::LayoutFlags&>(o.layout).layout();
  if (world.size() != layout.size())
    throw LayoutError("--tp", "--tp " + std::to_string(layout.size()) + " needs exactly tp MPI ranks; this job has " +
                                  std::to_string(world.size()) + " (run with mpiexec -n " +
                                  std::to_string(layout.size()) + ")");
  return layout;
}

// The expert location map: --ep-num-redundant-experts N (the static placement: physical p holds
// logical p mod experts; every rank builds the same map), or, for --expert-load-out alone, the
// map without replicas (physical = logical: the same dispatch, and the bridge counts the load).
std::shared_ptr<const ExpertLocation> expert_location(const Options& o, const RuntimeLayout& layout, const Exec& exec,
                                                      const MpiCommunicator& world) {
  const int redundant = layout.config().ep_num_redundant_experts;
  if (redundant == 0 && o.expert_load_out.empty()) return nullptr;
  if (redundant > 0 && !dispatches_rows(layout.bridge_path()))
    throw LayoutError("--ep-num-redundant-experts",
                      "--ep-num-redundant-experts " + std::to_string(redundant) +
                          " needs a path that dispatches rows (a2a_split or direct: --moe-a2a-backend deepep); this "
                          "layout takes path " + std::string(to_string(layout.bridge_path())));
  if (redundant == 0 && !dispatches_rows(layout.bridge_path()))
    throw LayoutError("--expert-load-out",
                      "--expert-load-out counts the load per expert in the EP dispatch, so it needs a path that "
                      "dispatches rows (a2a_split or direct: --moe-a2a-backend deepep); this layout takes path " +
                          std::string(to_string(layout.bridge_path())));
  std::shared_ptr<const ExpertLocation> loc;
  try {
    loc = std::make_shared<const ExpertLocation>(ExpertLocation::identity(o.dims.experts, redundant, layout.widths().moe_ep));
  } catch (const LayoutError& e) {
    throw LayoutError("--ep-num-redundant-experts", std::string("--ep-num-redundant-experts: ") + e.what());
  }
  require_same_expert_location(exec, world, *loc);
  return loc;
}

// The layer options of the flags, in the order their refusals come: padding, restore, --inject,
// the dispatch dtype, redundant experts, the decode steps' EP mode, two-batch overlap, the
// scattered attention-TP input.
model::LayerOptions layer_options(const Options& o, const RuntimeLayout& layout, const Exec& exec,
                                  const MpiCommunicator& world) {
  model::LayerOptions opts;
  if (o.padding != "auto") opts.padding = parse_padding(o.padding);
  opts.restore = parse_restore(o.restore, "--restore");
  opts.inject = parse_fault(o.inject, "--inject");
  check_fault(opts.inject, layout, "--inject");
  opts.dispatch_dtype = cli::dispatch_dtype_of(layout, o.dispatch_dtype);
  opts.expert_location = expert_location(o, layout, exec, world);
  opts.decode_ep_mode = parse_ep_mode(o.deepep_mode, "--deepep-mode");
  check_ep_mode(opts.decode_ep_mode, layout.bridge_path(), "--deepep-mode");
  if (o.ll_capacity_given && opts.decode_ep_mode != EpMode::low_latency)
    throw LayoutError(kLlCapacityFlag, std::string(kLlCapacityFlag) + " " + std::to_string(o.ll_capacity) +
                                           " is the low-latency dispatch's fixed capacity per rank; it applies to "
                                           "--deepep-mode low_latency (this run: --deepep-mode " + o.deepep_mode + ")");
  opts.two_batch_overlap = o.two_batch_overlap;
  check_two_batch_overlap(o.two_batch_overlap, layout.bridge_path(), "--enable-two-batch-overlap");
  if (o.attn_tp_input_scattered && layout.widths().attn_tp < 2)
    throw LayoutError("--enable-attn-tp-input-scattered",
                      "--enable-attn-tp-input-scattered splits the projections every attention-TP member repeats "
                      "by rows over attn_tp; it needs attn_tp > 1, and this layout has attn_tp = " +
                          std::to_string(layout.widths().attn_tp));
  opts.attn_tp_input_scattered = o.attn_tp_input_scattered;
  opts.record_boundaries = true;
  return opts;
}

// The requests (refusing --show-group outside the layout and a two-batch overlap of fewer than 2 rows).
model::Workload make_workload(const Options& o, const Widths& w) {
  if (o.show_group < -1 || o.show_group >= w.attn_dp)
    throw LayoutError("--show-group", "--show-group " + std::to_string(o.show_group) +
                                          ": an attention-DP group must be in [0, attn_dp = " + std::to_string(w.attn_dp) +
                                          ") (or -1: the first group with two rows)");
  model::Workload work = model::Workload::make(o.requests, o.placement, w.attn_dp);
  if (o.two_batch_overlap) {
    std::int64_t rows = 0;
    for (const int l : work.lengths) rows += l;
    if (rows < 2)
      throw LayoutError("--enable-two-batch-overlap", "--enable-two-batch-overlap splits the step's rows into two "
                                                      "micro-batches; --requests gives " + std::to_string(rows) +
                                                      " row(s), fewer than 2");
  }
  return work;
}

// The decode steps (each request's prompt and steps must fit --kv-capacity) and, in low-latency
// mode, the fixed capacity of the decode dispatch: --num-max-dispatch-tokens-per-rank, by default
// the requests (a decode step feeds one row per live request, so no rank dispatches more).
model::DecodePlan decode_plan(const Options& o, const model::Workload& work, model::LayerOptions& opts) {
  model::DecodePlan plan = model::DecodePlan::make(o.decode_steps, o.decode_lengths, work.requests());
  if (plan.steps > 0) {
    for (int i = 0; i < work.requests(); ++i)
      if (std::int64_t(work.lengths[std::size_t(i)]) + plan.lengths[std::size_t(i)] > o.kv_capacity)
        throw LayoutError("--decode-steps", "--decode-steps " + std::to_string(plan.steps) + ": request " +
                                                std::to_string(i) + " would hold " +
                                                std::to_string(std::int64_t(work.lengths[std::size_t(i)]) + plan.lengths[std::size_t(i)]) +
                                                " KV rows (prompt " + std::to_string(work.lengths[std::size_t(i)]) +
                                                " + " + std::to_string(plan.lengths[std::size_t(i)]) +
                                                " steps), more than the cache capacity of " + std::to_string(o.kv_capacity) +
                                                " rows per request (--kv-capacity)");
  }
  if (opts.decode_ep_mode == EpMode::low_latency) {
    if (plan.steps == 0)
      throw LayoutError("--deepep-mode", "--deepep-mode low_latency applies to decode steps; give --decode-steps");
    opts.num_max_dispatch_tokens_per_rank = o.ll_capacity_given ? o.ll_capacity : work.requests();
  }
  return plan;
}

// ---- the verified forward (the prefill), its decode steps and the rebalanced forward

// What the prefill left: its rows, boundaries, traffic, token counts and padding mode, the decode
// steps' results, and the bridge failure every rank met together (empty: none).
struct Prefill {
  model::LayerRows<> out;
  DecodeRun dec;
  std::size_t bounds = 0;
  model::TrafficLog traffic;
  std::vector<std::int64_t> counts;
  PaddingMode mode{};  // printed beside counts; decode steps may pick another mode
  std::string failure;
};

template <class Net>
void keep_prefill(Prefill& p, const Net& net) {
  p.bounds = net.boundaries().size();
  p.traffic = net.traffic();
  p.counts = net.global_num_tokens();
  p.mode = net.padding();
}

// A low-latency dispatch over its capacity (the library's LayoutError "capacity", thrown on every
// member together) is bad input: the flag that sets the capacity, named.
[[noreturn]] void refuse_capacity(const Options& o, const model::LayerOptions& opts, const LayoutError& e) {
  throw LayoutError(kLlCapacityFlag,
                    std::string(kLlCapacityFlag) + " " + std::to_string(opts.num_max_dispatch_tokens_per_rank) +
                        (o.ll_capacity_given ? "" : " (the default: one row per request)") +
                        ": a decode step dispatches more rows than the low-latency capacity per rank (" + e.what() +
                        "); give a capacity of at least the rows a rank dispatches");
}

template <class Net>
Prefill prefill_and_decode(Net& net, const Options& o, const model::LayerOptions& opts, const model::Workload& work,
                           const model::DecodePlan& plan, const MpiCommunicator& world, const RankCoords& me,
                           const model::CpShare& share, Balance& balance) {
  Prefill p;
  try {
    p.out = net.forward(work);
    keep_prefill(p, net);
    if (opts.expert_location) balance.before = report_expert_load(o, net.exec(), world, *opts.expert_location, net.expert_load());
    if (plan.steps > 0)
      p.dec = decode(net, work, plan, p.out, world, me, share, o.check, o.dims,  // decode rows read the cache too
                     model::router_tie_margin(o.dims, o.tolerance + model::kv_cache_tolerance(o.dims), o.fp8_dispatch()));
  } catch (const LayoutError& e) {
    if (e.input() == "capacity" && opts.decode_ep_mode == EpMode::low_latency) refuse_capacity(o, opts, e);
    if (e.input() != "bridge") throw;
    p.failure = e.what();  // every rank of the job takes the same broken path and stops here
    if (p.counts.empty()) keep_prefill(p, net);  // the prefill itself failed
  }
  return p;
}

// --expert-skew with --ep-num-redundant-experts: the rebalancer on the measured load, then the
// same tokens again on a model built with the rebalanced map.
void rebalance(Balance& balance, const Options& o, const RuntimeLayout& layout, const model::LayerOptions& opts,
               const ProcessGroups& groups, const model::Workload& work, const Exec& exec, const MpiCommunicator& world) {
  balance.on = true;
  const int redundant = layout.config().ep_num_redundant_experts;
  balance.map = std::make_shared<const ExpertLocation>(
      ExpertLocation::rebalanced(balance.before.logical_as_double(), redundant, layout.widths().moe_ep));
  require_same_expert_location(exec, world, *balance.map);
  model::LayerOptions again = opts;
  again.expert_location = balance.map;
  again.record_boundaries = false;
  model::DistributedModel<MpiCommunicator> rebalanced(groups, o.dims, again, exec);
  balance.out = rebalanced.forward(work);
  balance.after = sum_expert_load(exec, world, *balance.map, rebalanced.expert_load());
}

// ---- the check against the single-rank reference

// Matched by row owner. A NaN or inf value fails the check by itself (std::max would drop a NaN):
// it is counted and makes max_abs_err infinite.
struct Check {
  double err = 0.0;
  std::int64_t rows = 0, non_finite = 0;
  int owners_ok = 1;
  NearTie near;
  double ref_sum = 0.0, ref_sumsq = 0.0;  // of the reference's output: bench/peers/torch_layer.py --checksum
};

struct RowsCompare {
  const model::ReferenceRows& ref;
  std::map<std::int64_t, int> row_of;
  std::vector<std::int64_t> expected;
  const RankCoords& me;
  int hidden;
  const MpiCommunicator& world;

  void operator()(const model::LayerRows<>& got, double& e, std::int64_t& n, std::int64_t& bad, int& ok,
                  NearTie& near) const {
    ok = got.owners == expected ? 1 : 0;
    const auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), got.view());
    for (std::size_t i = 0; i < expected.size() && ok; ++i) {
      const int row = row_of.at(expected[i]);
      compare_row(h, i, ref.rows.row(row), hidden, ref.router_margin[std::size_t(row)], me.attn_tp_rank == 0, e, near,
                  bad);
      if (me.attn_tp_rank == 0) ++n;
    }
    all_reduce_in_place(world, std::span<double>(&e, 1), ReduceOp::max);
    all_reduce_in_place(world, std::span<std::int64_t>(&n, 1));
    all_reduce_in_place(world, std::span<std::int64_t>(&bad, 1));
    all_reduce_in_place(world, std::span<int>(&ok, 1), ReduceOp::min);
    reduce_near(world, near);
  }
};

Check verify(const Options& o, const RuntimeLayout& layout, const RankCoords& me, const model::Workload& work,
             const Prefill& p, Balance& balance, const MpiCommunicator& world) {
  Check c;
  c.owners_ok = p.failure.empty() ? 1 : 0;
  if (!o.check || !p.failure.empty()) return c;
  const auto ref = model::reference_forward(o.dims, work);
  for (double v : ref.rows.data) c.ref_sum += v, c.ref_sumsq += v * v;
  RowsCompare compare{ref, {}, work.owners_of(me.attn_dp_rank, model::CpShare::of(layout, me.attn_cp_rank)), me,
                      o.dims.hidden, world};
  for (std::size_t i = 0; i < ref.owners.size(); ++i) compare.row_of[ref.owners[i]] = int(i);
  c.near.margin = balance.near.margin = model::router_tie_margin(o.dims, o.tolerance, o.fp8_dispatch());
  compare(p.out, c.err, c.rows, c.non_finite, c.owners_ok, c.near);
  if (balance.on) compare(balance.out, balance.err, balance.rows, balance.non_finite, balance.owners_ok, balance.near);
  return c;
}

struct Verdict {
  double decode_tolerance = 0;
  bool prefill_ok = true, decode_ok = true, balance_ok = true, passed = true;
  // Why a comparison compared too little to say OK ("" when it checked): not_checked().
  std::string prefill_unchecked, decode_unchecked, balance_unchecked;
};

// --tolerance's cap: a looser bound passes layout bugs. A derived tolerance above it checks nothing.
constexpr double kToleranceCap = 0.1;

// Why a comparison of `rows` rows at `tolerance` says NOT CHECKED ("" when it checked): no row
// compared, a tolerance above kToleranceCap, or fewer than a tenth of the rows held to the
// tolerance (the rest set apart near a router tie).
std::string not_checked(std::int64_t rows, const NearTie& near, double tolerance) {
  char b[200];
  if (rows == 0) return "no row was compared";
  if (tolerance > kToleranceCap) {
    std::snprintf(b, sizeof b, "its tolerance %.3g exceeds the cap of %g that --tolerance enforces", tolerance, kToleranceCap);
    return b;
  }
  if (10 * (rows - near.rows) < rows) {
    std::snprintf(b, sizeof b, "%lld of %lld rows lie near a router tie: fewer than a tenth were held to the tolerance",
                  static_cast<long long>(near.rows), static_cast<long long>(rows));
    return b;
  }
  return "";
}

Verdict verdict(const Options& o, const model::Workload& work, const model::DecodePlan& plan, const Prefill& p,
                const Balance& balance, const Check& c) {
  Verdict v;
  const DecodeRun& dec = p.dec;
  // --dtype bf16, --dispatch-dtype fp8: grows with the steps
  v.decode_tolerance = model::decode_check_tolerance(o.dims, o.tolerance, plan.steps, o.fp8_dispatch());
  if (o.check) {
    v.prefill_unchecked = not_checked(c.rows, c.near, o.tolerance);
    if (plan.steps > 0) v.decode_unchecked = not_checked(dec.rows, dec.near, v.decode_tolerance);
    if (balance.on) v.balance_unchecked = not_checked(balance.rows, balance.near, o.tolerance);
  }
  v.decode_ok = !o.check || plan.steps == 0 ||
                (dec.non_finite == 0 && dec.owners_ok && dec.err <= v.decode_tolerance && dec.rows == dec.expected &&
                 v.decode_unchecked.empty());
  v.balance_ok = !o.check || !balance.on ||
                 (balance.owners_ok && balance.non_finite == 0 && balance.err <= o.tolerance &&
                  balance.rows == work.total_rows() && v.balance_unchecked.empty());
  v.prefill_ok = p.failure.empty() && c.owners_ok && c.non_finite == 0 && c.err <= o.tolerance &&
                 (!o.check || (c.rows == work.total_rows() && v.prefill_unchecked.empty()));
  v.passed = v.prefill_ok && v.decode_ok && v.balance_ok;
  return v;
}

// How a comparison's line ends: OK, MISMATCH (with what), or NOT CHECKED (why) when nothing
// mismatched but it compared too little (`within`: its error and row count were as required).
std::string check_status(bool ok, int owners_ok, std::int64_t non_finite, bool within, const std::string& unchecked) {
  if (ok) return "OK";
  if (!owners_ok) return "MISMATCH (rows held by the wrong ranks)";
  if (non_finite) return "MISMATCH (non-finite values: NaN or inf)";
  if (within && !unchecked.empty()) return "NOT CHECKED (" + unchecked + ")";
  return "MISMATCH";
}

// ---- what rank 0 reports: every rank's traffic and first-layer boundaries, and the timings

struct Gathered {
  std::vector<std::vector<std::int64_t>> traffic, bounds;
  std::vector<std::string> names;  // the first layer's boundaries
};

template <class Net>
Gathered gather_report(const Net& net, const Prefill& p, const MpiCommunicator& world) {
  Gathered g;
  const auto& log = p.traffic;
  std::vector<std::int64_t> traffic(log.calls.begin(), log.calls.end());
  traffic.insert(traffic.end(), log.bytes.begin(), log.bytes.end());
  g.traffic = cli::gather_all(world, traffic);
  std::vector<std::int64_t> bounds;
  for (std::size_t i = 0; i < p.bounds; ++i) {
    const model::Boundary& b = net.boundaries()[i];
    if (b.layer != 0) continue;
    g.names.push_back(b.name);
    bounds.push_back(std::int64_t(b.owners.size()));
    bounds.insert(bounds.end(), b.owners.begin(), b.owners.end());
  }
  g.bounds = cli::gather_all(world, bounds);
  return g;
}

struct Timing {
  double best = 0.0, tokens_per_s = 0.0, decode_s = 0.0;
  double collective = 0.0;  // of the best forward: the most any rank spent in collectives (collective_seconds)
  std::int64_t decode_rows = 0;
};

// --repeat: the verified forward was the warm-up; time N more, each as the slowest rank's time;
// with decode steps, prefill and decode again, the best time of each step (into dec.seconds).
template <class Net>
Timing time_repeats(Net& net, const Options& o, const model::Workload& work, const model::DecodePlan& plan,
                    const MpiCommunicator& world, const RankCoords& me, const model::CpShare& share, Prefill& p) {
  Timing t;
  DecodeRun& dec = p.dec;
  if (o.repeat > 0 && p.failure.empty()) {
    t.best = 1e300;
    for (int i = 0; i < o.repeat; ++i) {
      barrier(world);
      const auto t0 = std::chrono::steady_clock::now();
      const double c0 = collective_seconds();
      net.forward(work);
      double dt[2] = {std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                      collective_seconds() - c0};
      all_reduce_in_place(world, std::span<double>(dt, 2), ReduceOp::max);
      if (dt[0] < t.best) {
        t.best = dt[0];
        t.collective = dt[1];
      }
    }
  }
  t.tokens_per_s = t.best > 0 ? double(work.total_rows()) / t.best : 0.0;
  for (int i = 0; i < o.repeat && plan.steps > 0 && p.failure.empty(); ++i) {
    const DecodeRun again = decode(net, work, plan, net.forward(work), world, me, share, false, o.dims, 0);
    for (std::size_t s = 0; s < dec.seconds.size(); ++s) dec.seconds[s] = std::min(dec.seconds[s], again.seconds[s]);
  }
  for (std::size_t s = 0; s < dec.seconds.size(); ++s) {
    t.decode_s += dec.seconds[s];
    for (std::int64_t c : dec.counts[s]) t.decode_rows += c;
  }
  return t;
}

// Everything the report reads.
struct Report {
  const Options& o;
  const RuntimeLayout& layout;
  const model::Workload& work;
  const model::DecodePlan& plan;
  const cli::MemoryEstimate& need;
  const Prefill& p;
  const Balance& balance;
  const Check& c;
  const Verdict& v;
  const Gathered& g;
  const Timing& t;
};

constexpr std::size_t kTrafficSlots = model::TrafficLog::kOps * model::TrafficLog::kGroups;

nlohmann::json rank_json(const RuntimeLayout& layout, int r, const std::vector<std::int64_t>& t) {
  const RankCoords k = layout.coords(r);
  nlohmann::json rank{{"rank", r}, {"attn_dp_rank", k.attn_dp_rank}, {"attn_cp_rank", k.attn_cp_rank},
                      {"attn_tp_rank", k.attn_tp_rank},
                      {"moe_ep_rank", k.moe_ep_rank}, {"collectives", nlohmann::json::array()}};
  for (std::size_t op = 0; op < model::TrafficLog::kOps; ++op)
    for (std::size_t g = 0; g < model::TrafficLog::kGroups; ++g) {
      const std::size_t s = op * model::TrafficLog::kGroups + g;
      if (t[s] == 0) continue;
      rank["collectives"].push_back({{"op", std::string(model::kOpNames[op])},
                                     {"group", std::string(to_string(kAllGroupKinds[g]))},
                                     {"calls", t[s]},
                                     {"bytes", t[kTrafficSlots + s]}});
    }
  return rank;
}

void print_json(const Report& r) {
  const Options& o = r.o;
  const Balance& balance = r.balance;
  const DecodeRun& dec = r.p.dec;
  nlohmann::json j;
  j["path"] = std::string(to_string(r.layout.bridge_path()));
  j["padding"] = std::string(to_string(r.p.mode));
  j["global_num_tokens"] = r.p.counts;
  j["check"] = o.check;
  j["max_abs_err"] = r.c.err;  // null when infinite (JSON has no inf): see non_finite
  j["non_finite"] = r.c.non_finite;
  j["rows"] = r.c.rows;
  if (o.check) j["near_router_tie"] = near_tie_json(r.c.near);
  if (o.check) j["not_checked"] = unchecked_json(r.v.prefill_unchecked);
  j["passed"] = r.v.passed;
  j["failure"] = r.p.failure.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.p.failure);
  j["inject"] = o.inject;
  j["dispatch_dtype"] = o.dispatch_dtype;
  j["dtype"] = o.dtype;
  j["kv_cache_dtype"] = model::kv_cache_dtype(o.dims);  // the decode steps' cache (with --decode-steps)
  // The estimate --max-memory is checked against, bytes per rank (the largest rank's).
  j["memory_estimate"] = {{"weights", r.need.weights}, {"activations", r.need.activations}, {"kv", r.need.kv},
                          {"buffers", r.need.buffers}, {"total", r.need.total()}};
  j["tolerance"] = o.tolerance;
  j["isa"] = {{"compiled", RELAYOUT_ISA_COMPILED_STRING()}, {"cpu", kernels::isa::cpu_isa()}};
  {  // whether MPI's large messages come from huge pages (common/huge_pages.hpp)
    const cli::HugePages hp = cli::huge_pages();
    j["huge_pages"] = {{"thp", hp.thp}, {"malloc_hugetlb", hp.malloc_hugetlb}, {"heap_pages", hp.heap()}};
  }
  if (o.check) j["reference_checksum"] = {{"sum", r.c.ref_sum}, {"sumsq", r.c.ref_sumsq}};
  j["deepep_mode"] = o.deepep_mode;
  j["two_batch_overlap"] = o.two_batch_overlap;
  j["attn_tp_input_scattered"] = o.attn_tp_input_scattered;
  if (balance.on) {
    j["expert_balance"] = {{"expert_skew", o.dims.expert_skew},
                           {"redundant_experts", balance.map->redundant()},
                           {"moe_ep", balance.map->ep()},
                           {"before", member_load_json(balance.before)},
                           {"after", member_load_json(balance.after)},
                           {"rebalanced_map", balance.map->physical_to_logical()}};
    if (o.check)
      j["expert_balance"]["check"] = {{"rows", balance.rows}, {"max_abs_err", balance.err},
                                      {"non_finite", balance.non_finite}, {"passed", r.v.balance_ok},
                                      {"near_router_tie", near_tie_json(balance.near)},
                                      {"not_checked", unchecked_json(r.v.balance_unchecked)}};
  }
  if (o.repeat > 0)
    j["timing"] = {{"repeats", o.repeat}, {"best_forward_s", r.t.best}, {"tokens_per_s", r.t.tokens_per_s},
                   {"collective_s", r.t.collective}};
  if (r.plan.steps > 0) {
    j["decode"] = {{"steps", r.plan.steps}, {"kv_cache_dtype", model::kv_cache_dtype(o.dims)},
                   {"rows_per_group", dec.counts}, {"rows_checked", dec.rows},
                   {"max_abs_err", dec.err}, {"tolerance", r.v.decode_tolerance}, {"non_finite", dec.non_finite}};
    if (o.check) j["decode"]["near_router_tie"] = near_tie_json(dec.near);
    if (o.check) j["decode"]["not_checked"] = unchecked_json(r.v.decode_unchecked);
    if (o.repeat > 0)
      j["decode"]["timing"] = {{"best_step_s", dec.seconds},
                               {"tokens_per_s", r.t.decode_s > 0 ? double(r.t.decode_rows) / r.t.decode_s : 0.0}};
  }
  for (int k = 0; k < int(r.g.traffic.size()); ++k) j["ranks"].push_back(rank_json(r.layout, k, r.g.traffic[std::size_t(k)]));
  std::cout << j.dump(2) << "\n";
}

// The text report's head: the layout, the model, the requests and the prefill's token counts.
void text_header(std::ostringstream& s, const Report& r) {
  const Widths& w = r.layout.widths();
  const BridgePath path = r.layout.bridge_path();
  const auto& d = r.o.dims;
  s << "dsv4_layer: tp=" << w.tp << " attn dp x " << (w.attn_cp > 1 ? "cp x " : "") << "tp = " << w.attn_dp << " x "
    << (w.attn_cp > 1 ? std::to_string(w.attn_cp) + " x " : "") << w.attn_tp << ", moe dp x ep x tp = "
    << w.moe_dp << " x " << w.moe_ep << " x " << w.moe_tp << ", backend " << to_string(r.layout.backend())
    << " -> bridge " << to_string(path) << ", padding "
    << (path == BridgePath::dp_gather ? std::string(to_string(r.p.mode)) : "unused (no DP gather on this path)") << "\n";
  s << "model: hidden " << d.hidden << ", " << d.heads << " heads x " << d.head_dim << ", q_lora " << d.q_lora
    << ", " << d.experts << " experts top-" << d.topk << " (inter " << d.moe_inter << "), shared expert inter "
    << d.shared_inter << ", " << d.layers << " layers, seed " << d.seed << "\n";
  s << "requests:";
  for (int i = 0; i < r.work.requests(); ++i)
    s << " " << model::RowOwner::request_name(i) << "(" << r.work.lengths[std::size_t(i)] << ")->g"
      << r.work.placement[std::size_t(i)];
  s << "\nglobal_num_tokens: [";
  for (std::size_t g = 0; g < r.p.counts.size(); ++g)
    s << (g ? " " : "") << r.p.counts[g];
  s << "]" << (w.attn_cp > 1 ? " (one entry per CP share of each DP group)" : "")
    << (r.o.inject != "none" ? "   INJECTED BUG: " + r.o.inject : "") << "\n\n";
}

// The rows each rank of one attention-DP group holds after every boundary of layer 0.
void text_rows(std::ostringstream& s, const Report& r) {
  const Widths& w = r.layout.widths();
  int group = r.o.show_group;
  if (group < 0) {  // the first DP group with at least two rows
    group = 0;
    for (int g = 0; g < w.attn_dp; ++g)
      if (r.work.owners_of(g).size() >= 2) {
        group = g;
        break;
      }
  }
  std::vector<int> members;  // the DP group's ranks: every CP rank's attention-TP group
  for (int k = 0; k < w.tp; ++k)
    if (r.layout.coords(k).attn_dp_rank == group) members.push_back(k);
  s << "Rows held by the ranks of attention-DP group " << group << " after each boundary of layer 0:\n";
  std::vector<std::size_t> at(members.size(), 0);
  for (const std::string& name : r.g.names) {
    char head[40];
    std::snprintf(head, sizeof head, "  %-22s", name.c_str());
    s << head;
    for (std::size_t m = 0; m < members.size(); ++m) {
      const auto& b = r.g.bounds[std::size_t(members[m])];
      const std::size_t n = std::size_t(b[at[m]]);
      const std::vector<std::int64_t> owners(b.begin() + std::ptrdiff_t(at[m] + 1), b.begin() + std::ptrdiff_t(at[m] + 1 + n));
      at[m] += n + 1;
      s << " r" << members[m] << " " << labels(owners, members.size() > 2 ? 6 : 12);
    }
    s << "\n";
  }
}

void text_collectives(std::ostringstream& s, const Report& r) {
  s << "\nCollectives of rank 0 (all layers): ";
  const auto& t0 = r.g.traffic[0];
  bool any = false;
  for (std::size_t op = 0; op < model::TrafficLog::kOps; ++op)
    for (std::size_t g = 0; g < model::TrafficLog::kGroups; ++g) {
      const std::size_t i = op * model::TrafficLog::kGroups + g;
      if (t0[i] == 0) continue;
      s << (any ? "; " : "") << model::kOpNames[op] << "@" << to_string(kAllGroupKinds[g]) << " x" << t0[i] << " "
        << kib(t0[kTrafficSlots + i]);
      any = true;
    }
  s << "\n";
}

// The rows of every decode step per attention-DP group (under CP per CP rank).
void text_decode(std::ostringstream& s, const Report& r) {
  const Widths& w = r.layout.widths();
  const DecodeRun& dec = r.p.dec;
  s << "\nDecode: " << r.plan.steps << " steps after the prefill, KV cache " << model::kv_cache_dtype(r.o.dims)
    << " paged (blocks of 16 rows, " << r.o.kv_capacity << " rows per request); rows per attention-DP group (its ranks) per step"
    << (w.attn_cp > 1 ? ", under CP per CP rank (a decode row at position p on CP rank p mod cp)" : "") << ":\n";
  for (std::size_t st = 0; st < dec.counts.size(); ++st) {
    s << "  step " << st + 1 << ":";
    for (int g = 0; g < w.attn_dp; ++g) {
      s << (g ? "," : "") << " g" << g << (w.attn_cp > 1 ? " [" : "");
      for (int c = 0; c < w.attn_cp; ++c) {  // the counts: one per CP share of each DP group
        const std::size_t share = std::size_t(g * w.attn_cp + c);
        s << (c ? ", " : "") << (w.attn_cp > 1 ? "cp" + std::to_string(c) + " (" : " (");
        const std::vector<int> ranks = r.layout.groups(GroupKind::attn_tp).at(share);
        for (std::size_t m = 0; m < ranks.size(); ++m) s << (m ? " r" : "r") << ranks[m];
        const std::int64_t n = dec.counts[st][share];
        s << ") " << n << (n == 1 ? " row" : " rows") << (n == 0 ? " IDLE" : "");
      }
      s << (w.attn_cp > 1 ? "]" : "");
    }
    s << "\n";
  }
}

void text_timing(std::ostringstream& s, const Report& r) {
  if (r.o.repeat > 0) {
    char line[256];
    std::snprintf(line, sizeof line,
                  "\ntiming: best forward %.6f s of %d (after a warm-up), %.0f tokens/s; in collectives %.6f s (the "
                  "most of any rank, waits included)\n",
                  r.t.best, r.o.repeat, r.t.tokens_per_s, r.t.collective);
    s << line;
    s << "memory: " << cli::huge_pages().describe() << "\n";
  }
  if (r.o.repeat > 0 && r.plan.steps > 0) {
    char line[200];
    std::snprintf(line, sizeof line, "timing: decode %lld rows in %d steps, %.6f s (best of each step), %.0f tokens/s\n",
                  static_cast<long long>(r.t.decode_rows), r.plan.steps, r.t.decode_s,
                  r.t.decode_s > 0 ? double(r.t.decode_rows) / r.t.decode_s : 0.0);
    s << line;
  }
}

// Rows compared apart for a router near-tie, named only where there are some.
void text_near_tie(std::ostringstream& s, const char* what, const NearTie& n) {
  if (n.rows == 0) return;
  char line[320];
  std::snprintf(line, sizeof line,
                "check: %s%lld row%s near a router tie (the reference's k-th and (k+1)-th logits within %.3g at one of "
                "its layers, or at an earlier decode step of its request) compared apart, not held to the tolerance: max_abs_err %.3g\n",
                what, static_cast<long long>(n.rows), n.rows == 1 ? "" : "s", n.margin, n.err);
  s << line;
}

void text_check(std::ostringstream& s, const Report& r) {
  const DecodeRun& dec = r.p.dec;
  const Verdict& v = r.v;
  char line[256];
  std::snprintf(line, sizeof line, "\ncheck: %lld rows compared with the single-rank reference, max_abs_err %.3g (tolerance %.3g): ",
                static_cast<long long>(r.c.rows), r.c.err, r.o.tolerance);
  s << line << check_status(v.prefill_ok, r.c.owners_ok, r.c.non_finite,
                            r.c.err <= r.o.tolerance && r.c.rows == r.work.total_rows(), v.prefill_unchecked) << "\n";
  text_near_tie(s, "", r.c.near);
  if (r.balance.on) {
    std::snprintf(line, sizeof line, "check: rebalanced forward: %lld rows, max_abs_err %.3g: ",
                  static_cast<long long>(r.balance.rows), r.balance.err);
    s << line << check_status(v.balance_ok, r.balance.owners_ok, r.balance.non_finite,
                              r.balance.err <= r.o.tolerance && r.balance.rows == r.work.total_rows(), v.balance_unchecked)
      << "\n";
    text_near_tie(s, "rebalanced forward: ", r.balance.near);
  }
  if (r.plan.steps > 0) {
    char decode_tol[48] = "";
    if (v.decode_tolerance != r.o.tolerance)
      std::snprintf(decode_tol, sizeof decode_tol, " (tolerance %.3g)", v.decode_tolerance);
    std::snprintf(line, sizeof line, "check: decode: %lld rows over %d steps compared with the reference recomputed without a cache, max_abs_err %.3g%s: ",
                  static_cast<long long>(dec.rows), r.plan.steps, dec.err, decode_tol);
    s << line << check_status(v.decode_ok, dec.owners_ok, dec.non_finite,
                              dec.err <= v.decode_tolerance && dec.rows == dec.expected, v.decode_unchecked) << "\n";
    text_near_tie(s, "decode: ", dec.near);
  }
}

void print_text(const Report& r) {
  std::ostringstream s;
  const bool ok = r.p.failure.empty();
  text_header(s, r);
  text_rows(s, r);
  text_collectives(s, r);
  if (r.plan.steps > 0 && ok) text_decode(s, r);
  if (ok) text_timing(s, r);
  if (r.balance.on) {
    std::int64_t pairs = 0;
    for (std::int64_t v : r.balance.before.members) pairs += v;
    s << "\nExpert load (last layer, Zipf skew " << r.o.dims.expert_skew << ", " << r.balance.map->redundant()
      << " redundant experts, " << pairs << " (token, expert) pairs), tokens per EP rank:\n"
      << member_load_text("before (static placement):", r.balance.before)
      << member_load_text("after (rebalanced, second forward):", r.balance.after);
  }
  if (!ok) s << "\nFAILED: " << r.p.failure << "\n";
  if (r.o.check && ok) text_check(s, r);
  std::cout << s.str();
}

// ---- the program

// Collective over the job: every rank runs the steps; rank 0 writes the report.
int run(const Options& o, const MpiCommunicator& world) {
  const Exec exec;  // the one instance every kernel and collective of this run takes
  const RuntimeLayout layout = job_layout(o, world);
  model::LayerOptions opts = layer_options(o, layout, exec, world);
  const Widths& w = layout.widths();
  const model::Workload work = make_workload(o, w);
  const model::DecodePlan plan = decode_plan(o, work, opts);
  const cli::MemoryEstimate need = require_size(o, w, work, plan, world);
  // The files the run writes, checked on every rank before the model is built.
  cli::require_output(world, "--expert-load-out", o.expert_load_out);
  cli::TraceDirLock trace_lock;  // held until the sink below is closed
  cli::RunSink sink;             // its file stays closed without --trace
  if (!o.trace.empty()) {
    trace_lock.acquire(world, o.trace);
    cli::open_trace(world, sink.file, o.trace, "dsv4_layer", trace_lock.run_id());
  }
  const ProcessGroups groups(layout, world);
  model::DistributedModel<MpiCommunicator, Exec, cli::RunSink> net(groups, o.dims, opts, exec);
  {  // the prefill and each decode step (one row per request), then --repeat: forwards, and prefill + decode again
    const long L = o.dims.layers, S = plan.steps, R = o.repeat;
    const long forwards = L * (1 + S) + R * L + (S > 0 ? R * L * (1 + S) : 0);
    const double per_row = need.flops / std::max(1.0, double(work.total_rows()));
    const double flops = need.flops * (1.0 + R * (S > 0 ? 2 : 1)) + per_row * work.requests() * S * (1.0 + R);
    if (world.rank() == 0 && cli::long_run(flops, forwards)) sink.show_progress("dsv4_layer", forwards, flops);
  }
  net.trace_to(sink);
  const RankCoords me = groups.coords();
  const model::CpShare share = model::CpShare::of(layout, me.attn_cp_rank);
  if (plan.steps > 0) net.reserve_kv(work, o.kv_capacity);
  Balance balance;
  Prefill p = prefill_and_decode(net, o, opts, work, plan, world, me, share, balance);
  sink.file.close();  // the trace is complete
  if (o.rebalance && p.failure.empty()) rebalance(balance, o, layout, opts, groups, work, exec, world);
  const Check c = verify(o, layout, me, work, p, balance, world);
  const Verdict v = verdict(o, work, plan, p, balance, c);
  const Gathered g = gather_report(net, p, world);
  const Timing t = time_repeats(net, o, work, plan, world, me, share, p);
  if (world.rank() != 0) return v.passed ? 0 : 1;
  JobGuard::working_alone("writing the report");  // a slow reader of stdout must not look like a hang
  const Report r{o, layout, work, plan, need, p, balance, c, v, g, t};
  if (o.format == "json") print_json(r);
  else print_text(r);
  return v.passed ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const cli::MpiSession mpi(argc, argv);
  int rc = 0;
  {
    cli::KokkosArgs args(argc, argv);
    JobGuard job;  // a rank that fails alone ends the job instead of leaving the others waiting
    Options o;
    CLI::App app{"dsv4_layer: DeepSeek-V4-like layers on MPI ranks, verified against a single-rank reference"};
    o.layout.add_to(app);
    cli::add_int_list(app, "--requests", o.requests, "prompt lengths, e.g. 5,3,4 (request i -> DP group i mod attn_dp)");
    cli::add_int_list(app, "--placement", o.placement, "the DP group of each request, e.g. 0,0,2");
    cli::add_model_flags(app, o.dims);
    app.add_option("--padding", o.padding, "auto (docs/bridge.md#padding rule), max_len or sum_len");
    app.add_option("--restore", o.restore, "path A restore: reduce (reduce_scatterv sums) or scatter (MoE all-reduces, dp_scatter copies)");
    app.add_flag("--check", o.check, "compare every row with the single-rank reference; exit 1 on a mismatch, or NOT CHECKED when it compared too little (no row, a tolerance above 0.1, fewer than a tenth of the rows held to it)");
    CLI::Option* tolerance = cli::add_tolerance(
        app, "--tolerance", o.tolerance,
        "max abs error accepted by --check, in [0, 0.1]; default 1e-4, with --dtype bf16 the bound of bf16 weights "
        "and with --dispatch-dtype fp8 that of e4m3 rows (model::check_tolerance), and no tighter", kToleranceCap,
        "a larger tolerance passes layout bugs (--inject double_reduce differs by 0.88 at --tp 2)");
    app.add_option("--format", o.format, "text or json")->check(CLI::IsMember({"text", "json"}));
    cli::add_int(app, "--show-group", o.show_group, "attention-DP group whose rows the text output follows");
    cli::add_path(app, "--trace", o.trace, "write a row-ownership trace, DIR/rank<R>.jsonl per rank (compare with `relayout trace diff`)");
    cli::add_max_memory(app, o.max_memory);
    app.add_option("--repeat", o.repeat, "after the (verified) forward, time N more forwards; report the best and tokens/s")
        ->check(CLI::Range(0, 1000000));
    cli::add_int(app, "--decode-steps", o.decode_steps, "after the prefill, run N decode steps: each live request feeds one row");
    cli::add_int_list(app, "--decode-lengths", o.decode_lengths, "decode steps of request i, e.g. 3,1 (default: --decode-steps)");
    cli::add_int(app, "--kv-capacity", o.kv_capacity, "KV cache rows per request (prompt + decode steps)", 1, 1 << 24);
    app.add_option("--dispatch-dtype", o.dispatch_dtype,
                   "paths a2a_split and direct: the rows travel in the EP dispatch as fp32 (default), bf16 (half "
                   "the row bytes) or fp8 (e4m3, a scale per 128 values: about a quarter); the experts see the "
                   "rounded rows, so --check needs a looser --tolerance: bf16 about 1e-2, fp8 takes the bound "
                   "2^-4 sqrt(layers) + 1e-4 by default (docs/bridge.md#fp8-dispatch)");
    app.add_option("--dtype", o.dtype,
                   "the element type of the weights and the activations: fp32 (default) or bf16. bf16: the attention "
                   "projections (wq_a, wq_b, wkv, wo_b) and the routed and shared experts' w1, w3, w2 are stored as "
                   "bf16 and multiplied through the bf16 GEMM with fp32 accumulation (AMX-BF16 tiles, vdpbf16ps or "
                   "bf16 widened to fp32 FMAs, chosen at run time; RELAYOUT_BF16_KERNEL overrides); every activation "
                   "inside a layer is bf16 (norms, projections, attention, the attention-TP sums, the rows the bridge "
                   "moves, the experts and the combine: fp32 arithmetic, one rounding per stored value); the residual "
                   "stream between layers and the router's gate stay fp32; the KV cache holds bf16 "
                   "(docs/kv_cache.md)");
    app.add_option("--expert-load-out", o.expert_load_out,
                   "paths a2a_split and direct: write the prefill's measured load per logical expert (last layer) as "
                   "{\"experts\": E, \"loads\": [...]}, the file relayout plan --expert-load reads (with or "
                   "without --ep-num-redundant-experts)");
    app.add_option("--deepep-mode", o.deepep_mode,
                   "paths a2a_split and direct, decode steps: the EP dispatch in normal mode (counts first) or "
                   "low_latency (fixed blocks of --num-max-dispatch-tokens-per-rank rows per rank, one exchange "
                   "per direction)");
    CLI::Option* ll_capacity = cli::add_int(
        app, kLlCapacityFlag, o.ll_capacity,
        "with --deepep-mode low_latency: the decode dispatch's fixed capacity in rows per rank (DeepEP's "
        "num_max_dispatch_tokens_per_rank; default: the requests, one row each per step); a step that "
        "dispatches more is refused (exit 2)", 1, 1 << 24);
    app.add_flag("--enable-two-batch-overlap", o.two_batch_overlap,
                 "paths a2a_split and direct: each MoE hand-over as two micro-batches, one's dispatch/combine "
                 "in flight while the other's experts run (SGLang's flag; same rows as one batch)");
    app.add_flag("--enable-attn-tp-input-scattered", o.attn_tp_input_scattered,
                 "under attention TP (attn_tp > 1): each member computes the low-rank query and shared KV "
                 "projections for its chunk of the rows and the members all-gather them, instead of each "
                 "computing them for every row, and on a path that dispatches rows keeps the residual split over "
                 "attn_tp between layers (SGLang's flag, which SGLang applies on path tp_moe only; same values)");
    app.add_option("--inject", o.inject, "wire a known bug on purpose: double_reduce, skip_reduce, gather_partial, no_split");
    CLI::Option* skew = cli::add_float(app, "--expert-skew", o.dims.expert_skew,
                                       "the router draws each token's experts from a Zipf law of this exponent over a "
                                       "seed-fixed permutation of the experts (0: the gate's top-k; the reference "
                                       "routes alike); with --ep-num-redundant-experts, a second forward on the map "
                                       "rebalanced for the first one's load, both loads reported",
                                       0.0);
    rc = cli::run_mpi_main(app, args, job, [&] {
      o.rebalance = skew->count() > 0 && o.layout.config.ep_num_redundant_experts > 0;
      o.tolerance_given = tolerance->count() > 0;
      o.ll_capacity_given = ll_capacity->count() > 0;
      apply_dtype(o);
      return run(o, MpiCommunicator::world());
    });
  }
  return rc;
}
