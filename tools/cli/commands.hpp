// The `relayout` command line as a function of (argv, out, err) -> exit code, shared by main() and
// the fuzz target. Subcommands: explain, plan, trace diff.
#pragma once

#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "cli/explain.hpp"
#include "common/layout_flags.hpp"
#include "cli/plan_deploy.hpp"
#include "cli/plan_rank.hpp"
#include "cli/plan_svg.hpp"
#include "cli/plan_world.hpp"
#include "cli/trace_diff.hpp"

namespace relayout::cli {

// "unknown subcommand 'X' of relayout; expected one of: a, b" for the first word that should name a
// subcommand and does not (empty when the words are fine or the first word is an option).
inline std::string unknown_subcommand(const CLI::App& app, int argc, const char* const* argv) {
  const CLI::App* at = &app;
  std::string path = "relayout";
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    const auto subs = at->get_subcommands([](const CLI::App*) { return true; });
    if (subs.empty() || word.empty() || word[0] == '-') return "";
    const CLI::App* next = nullptr;
    std::string names;
    for (const CLI::App* s : subs) {
      if (s->check_name(word)) next = s;
      names += (names.empty() ? "" : ", ") + s->get_name();
    }
    if (!next) return "unknown subcommand '" + word + "' of " + path + "; expected one of: " + names;
    path += " " + next->get_name();
    at = next;
  }
  return "";
}

// The flags of `relayout plan` that only the MLA model (--preset deepseek-v3 / deepseek-r1) takes,
// and --expert-load, which the demo layer takes too.
struct DeployFlags {
  std::string phase = "prefill", deepep_mode = "auto", load_file;
  int kv_len = 0, requests_per_gpu = 0, redundant = 0;
  double imbalance = kEplbImbalance, attn_dp_imbalance = 1.0, batch_fill = 1.0, cache_hit = 0.0, mtp = 0.0;
  bool tbo = false, attn_scattered = false, explain = false;

  void add_to(CLI::App& app) {
    app.add_option("--phase", phase, "MLA presets: prefill (one forward of --batch-tokens) or decode (one step)");
    add_int(app, "--kv-len", kv_len, "decode: tokens already cached per request", 1, 1 << 30);
    add_int(app, "--requests-per-gpu", requests_per_gpu, "decode: requests each GPU steps (the decode batch per GPU)", 1, 1 << 20);
    app.add_option("--deepep-mode", deepep_mode, "DeepEP kernels: normal, low_latency or auto (low_latency for decode)");
    app.add_flag("--enable-two-batch-overlap", tbo, "two micro-batches, one's dispatch/combine behind the other's compute");
    app.add_flag("--enable-attn-tp-input-scattered", attn_scattered,
                 "path tp_moe (TP without DP attention or an all-to-all backend, as SGLang applies it): q_a and kv_a "
                 "on each attn_tp rank's chunk of the tokens, their outputs all-gathered");
    add_int(app, "--ep-num-redundant-experts", redundant, "extra physical experts (EPLB replicas) over moe_ep; needs ep > 1", 0, 1 << 16);
    add_float(app, "--expert-imbalance", imbalance,
              "busiest EP rank's tokens over the mean (>= 1; default 1.18 at moe_ep > 1: LMSYS, SGLang's EPLB against "
              "simulated perfect balance, 50,302 vs 59,337 tokens/s per node, lmsys.org/blog/2025-05-05-large-scale-ep; "
              "1 for perfect balance)", 1.0, 1e6);
    add_float(app, "--attn-dp-imbalance", attn_dp_imbalance,
              "busiest attention-DP group's attention work over the mean (>= 1; default 1: equal requests per group)", 1.0, 1e6);
    add_float(app, "--decode-batch-fill", batch_fill,
              "decode: share of the --requests-per-gpu slots that hold a request (default 1: a full batch)", 1e-6, 1.0);
    add_float(app, "--prefill-cache-hit", cache_hit,
              "prefill: share of each request's tokens found in the KV cache, not computed but counted in tokens/s "
              "(default 0; DeepSeek's inference system overview: 56.3% of its input tokens in a day)", 0.0, 0.999);
    add_float(app, "--mtp-acceptance", mtp,
              "decode: run DeepSeek-V3's MTP module, one draft token a step accepted at this rate (default 0: off; "
              "DeepSeek-V3 technical report: 85-90%)", 0.0, 1.0);
    app.add_flag("--explain", explain, "MLA presets: print how one MoE layer's time and the step were built");
    app.add_option("--expert-load", load_file,
                   "JSON of per-expert token counts ({\"experts\": E, \"loads\": [...]} or {\"experts\": E, \"layers\": [[...]]}, "
                   "e.g. dsv4_layer --expert-load-out): the imbalance, max over mean tokens per rank");
  }
  static constexpr const char* kNames[] = {"--phase", "--kv-len", "--requests-per-gpu", "--deepep-mode",
                                           "--enable-two-batch-overlap", "--ep-num-redundant-experts",
                                           "--expert-imbalance", "--enable-attn-tp-input-scattered",
                                           "--attn-dp-imbalance", "--decode-batch-fill", "--prefill-cache-hit",
                                           "--mtp-acceptance", "--explain"};
};

// The MLA model's input from the flags; throws LayoutError naming the flag that does not apply.
inline DeployInput deploy_input(const CLI::App& plan, const DeployFlags& f, const std::string& preset, const PlanInput& demo,
                                std::int64_t batch_tokens, int request_tokens) {
  DeployInput in;
  in.model = mla_preset(preset);
  for (const ModelFlag& mf : kModelFlags)
    if (plan.count(mf.name) > 0)
      throw LayoutError(mf.name, std::string(mf.name) + ": --preset " + preset +
                                     " is config.json's model; the model flags apply to the demo layer (--preset demo)");
  for (const char* name : {"--requests", "--placement", "--padding", "--restore", "--dispatch-dtype"})
    if (plan.count(name) > 0)
      throw LayoutError(name, std::string(name) + ": applies to the demo layer's plan, not to --preset " + preset +
                                  " (its dispatch is DeepEP's: FP8 out, BF16 back)");
  in.phase = parse_phase(f.phase);
  in.deepep_mode = parse_deepep_mode(f.deepep_mode);
  in.two_batch_overlap = f.tbo;
  in.attn_tp_input_scattered = f.attn_scattered;
  in.redundant_experts = f.redundant;
  in.imbalance = f.imbalance;
  in.attn_dp_imbalance = f.attn_dp_imbalance;
  in.batch_fill = f.batch_fill;
  in.cache_hit = f.cache_hit;
  in.mtp_acceptance = f.mtp;
  in.explain = f.explain;
  if (plan.count("--expert-load") > 0) {
    if (plan.count("--expert-imbalance") > 0)
      throw LayoutError("--expert-load", "--expert-load and --expert-imbalance both give the imbalance: give one of them");
    in.load = read_load_file(f.load_file);
  }
  if (plan.count("--element-bytes") > 0) in.act_bytes = in.kv_bytes = demo.elem;
  if (plan.count("--weight-bytes") > 0) in.weight_bytes = demo.weight_elem;
  in.request_tokens = request_tokens;
  if (in.phase == Phase::prefill) {
    for (const char* name : {"--kv-len", "--requests-per-gpu", "--decode-batch-fill", "--mtp-acceptance"})
      if (plan.count(name) > 0) throw LayoutError(name, std::string(name) + ": applies to --phase decode");
    if (batch_tokens == 0)
      throw LayoutError("--batch-tokens", "--batch-tokens: --preset " + preset + " --phase prefill needs the tokens of one forward");
    in.batch_tokens = batch_tokens;
  } else {
    if (batch_tokens > 0) throw LayoutError("--batch-tokens", "--batch-tokens: --phase decode takes --requests-per-gpu and --kv-len instead");
    if (plan.count("--prefill-cache-hit") > 0)
      throw LayoutError("--prefill-cache-hit", "--prefill-cache-hit: applies to --phase prefill");
    if (f.kv_len == 0) throw LayoutError("--kv-len", "--kv-len: --phase decode needs the tokens cached per request");
    if (f.requests_per_gpu == 0) throw LayoutError("--requests-per-gpu", "--requests-per-gpu: --phase decode needs the batch per GPU");
    in.kv_len = f.kv_len;
    in.requests_per_gpu = f.requests_per_gpu;
  }
  return in;
}

// Layout flags both plans check as SGLang checks them (exit 2 on a bad value) but do not model:
// decode CP, the dense layers' TP width, the LM-head flags and the draft leave the plan unchanged.
// A single layout's plan names them on stderr; the ranking refuses them.
inline constexpr const char* kUnmodelledLayoutFlags[] = {"--dcp-size", "--moe-dense-tp-size", "--enable-dp-lm-head",
                                                         "--enable-tp-lm-head-all-to-all", "--draft"};

inline void note_unmodelled(const CLI::App& plan, std::ostream& err) {
  std::string names;
  for (const char* name : kUnmodelledLayoutFlags)
    if (plan.count(name) > 0) names += (names.empty() ? "" : ", ") + std::string(name);
  if (!names.empty())
    err << "note: " << names << ": checked as SGLang checks them; relayout plan does not model them, the plan is the "
        << "same without them\n";
}

// The layout flags --gpus refuses: it ranks every layout itself.
inline constexpr const char* kRankedLayoutFlags[] = {"--tp", "--dp", "--cp", "--ep", "--moe-dp-size", "--enable-dp-attention",
                                                     "--attn-dp-size", "--enable-prefill-cp", "--cp-strategy",
                                                     "--moe-a2a-backend", "--pp-size", "--nnodes"};

// --gpus with a layout flag: the ranking chooses the layout (and models none of kUnmodelledLayoutFlags).
inline void refuse_ranked_flags(const CLI::App& plan, int gpus, const std::vector<const char*>& more = {}) {
  std::vector<const char*> names(std::begin(kRankedLayoutFlags), std::end(kRankedLayoutFlags));
  names.insert(names.end(), more.begin(), more.end());
  const std::string head = ": --gpus ranks every layout of " + std::to_string(gpus) + " GPUs";
  for (const char* name : names)
    if (plan.count(name) > 0)
      throw LayoutError(name, name + head + (more.empty() ? "; give no layout flags with it"
                                                         : " with automatic padding; give no layout, request or padding flags with it"));
  for (const char* name : kUnmodelledLayoutFlags)
    if (plan.count(name) > 0)
      throw LayoutError(name, name + head + " and does not model " + name +
                                  " (decode CP, the dense TP width, the LM-head flags and the draft leave its times "
                                  "unchanged); give no layout flags with it");
}

// Every number a plan prints must be finite. The first that is not is refused, naming the load file
// when one was read (its numbers are the plan's only input without a range); `where` names the field.
inline void require_finite(const nlohmann::json& j, const std::string& load_file, const std::string& where = "") {
  if (j.is_number_float() && !std::isfinite(j.get<double>())) {
    const std::string value = std::isnan(j.get<double>()) ? "nan" : "inf";
    if (!load_file.empty())
      throw LayoutError("--expert-load", "--expert-load '" + load_file + "': the plan's " + where + " comes out " + value +
                                             " from these loads; every number of a plan must be finite (give loads "
                                             "of the size of token counts)");
    throw LayoutError("relayout plan", "relayout plan: the plan's " + where + " comes out " + value +
                                           "; every number of a plan must be finite");
  }
  if (j.is_object())
    for (auto it = j.begin(); it != j.end(); ++it) require_finite(it.value(), load_file, where.empty() ? it.key() : where + "." + it.key());
  if (j.is_array())
    for (std::size_t i = 0; i < j.size(); ++i) require_finite(j[i], load_file, where + "[" + std::to_string(i) + "]");
}

// The placements of --expert-load a plan computes: every layer's physical experts, once for each
// expert-parallel width it tries (a ranking: each divisor >= 2 of the GPUs that divides the physical
// experts). Above kMaxLoadPlacements (about 12 s of one core) the plan is refused before any work.
inline constexpr double kMaxLoadPlacements = 1e8;
inline void check_load_work(const DeployInput& in, int gpus, const std::string& load_file) {
  if (!in.load) return;
  const int physical = in.model.experts + in.redundant_experts;
  int widths = 1;
  if (gpus > 0) {
    widths = 0;
    for (int d : divisors(gpus)) widths += d >= 2 && physical % d == 0;
  }
  const double work = double(in.load->size()) * physical * std::max(widths, 1);
  if (work <= kMaxLoadPlacements) return;
  char n[64];
  std::snprintf(n, sizeof n, "%.2g", work);
  throw LayoutError("--expert-load", "--expert-load '" + load_file + "': " +
                                         (gpus > 0 ? "ranking " + std::to_string(gpus) + " GPUs places " : "the plan places ") +
                                         std::to_string(in.load->size()) + " layers x " + std::to_string(physical) +
                                         " physical experts" +
                                         (gpus > 0 ? " for each of " + std::to_string(widths) + " expert-parallel widths" : "") +
                                         ": " + n + " expert placements, over the bound of 1e8 (about 12 s); give fewer "
                                         "layers or --ep-num-redundant-experts" + (gpus > 0 ? ", or plan one layout without --gpus" : ""));
}

// A single layout asked for by its flags: the plan is printed whole, and when its fullest rank does
// not fit in --gpu-memory the command says so on stderr and exits 2 (as the ranking does when no
// layout fits): the layout as given cannot run.
inline int misfit_exit(double need, double have, std::ostream& err) {
  if (need <= have) return 0;
  err << "error: --gpu-memory " << bytes_text(have) << ": this layout needs " << bytes_text(need)
      << " on its fullest rank; use more GPUs, a smaller batch or fewer cached tokens, or raise --gpu-memory\n";
  return 2;
}

// --deepep-mode picks DeepEP's kernels: on one layout it needs --moe-a2a-backend deepep (or
// deepep_v2). SGLang ignores the flag under another backend; the plan refuses a flag it would not
// use, so a mode the user meant for DeepEP is never dropped. (The ranking applies it to its DeepEP rows.)
inline void check_deepep_mode(const CLI::App& plan, const RuntimeLayout& layout) {
  const Backend b = layout.backend();
  if (plan.count("--deepep-mode") == 0 || b == Backend::deepep || b == Backend::deepep_v2) return;
  const std::string mode = plan.get_option("--deepep-mode")->as<std::string>();
  throw LayoutError("--deepep-mode", "--deepep-mode " + mode + " with --moe-a2a-backend " + std::string(to_string(layout.config().moe_a2a_backend)) +
                                         ": relayout plan: --deepep-mode chooses DeepEP's kernels and needs "
                                         "--moe-a2a-backend deepep (SGLang ignores it under another backend; the plan "
                                         "refuses a flag it would not use)");
}

// `relayout plan --preset deepseek-v3|deepseek-r1`: one deployment over the world, or with --gpus the ranking.
inline int deploy_command(const CLI::App& plan, LayoutFlags& flags, const DeployInput& in, int gpus, int top,
                          double gpu_memory, const Cluster& cluster, const std::string& format, std::ostream& out,
                          std::ostream& err, const std::string& load_file = "") {
  if (format == "svg") throw LayoutError("--format", "--format svg draws the demo layer's plan; use text or json with --preset " + in.model.name);
  if (in.explain && (gpus > 0 || format == "json"))
    throw LayoutError("--explain", gpus > 0 ? "--explain: explains one layout's step; give the layout's flags instead of --gpus"
                                            : "--explain: prints text; --format json already gives each component's "
                                              "time and efficiency (\"components\", \"efficiency\")");
  check_load_work(in, gpus, load_file);
  if (gpus > 0) {
    refuse_ranked_flags(plan, gpus);
    const DeployRanking r = rank_deployments(gpus, in, cluster, gpu_memory);
    const nlohmann::json j = deploy_ranking_json(r, in);
    require_finite(j, load_file);
    if (format == "json") {
      out << j.dump(2) << "\n";
    } else {
      std::string head = "ranking: " + std::to_string(gpus) + " GPUs, " + in.model.name + " " +
                         (in.phase == Phase::prefill ? "prefill, " + std::to_string(in.batch_tokens) + " tokens in requests of " +
                                                           std::to_string(in.request_tokens)
                                                     : "decode, " + std::to_string(in.requests_per_gpu) + " requests per GPU at " +
                                                           std::to_string(in.kv_len) + " cached tokens") +
                         "; GPU memory " + bytes_text(gpu_memory) + "\n" + cluster_text(cluster) +
                         "times per step, busiest rank; unit: replicas x (EP or TP width of one instance) and its attention DP, "
                         "PPn before it: n pipeline stages of that width\n\n";
      out << deploy_ranking_text(r, in, head, std::size_t(top));
    }
    double least = r.layouts.front().plan.memory.total();
    for (const RankedDeployment& l : r.layouts) least = std::min(least, l.plan.memory.total());
    if (least > gpu_memory) {
      err << "error: --gpus " << gpus << ": no layout fits in --gpu-memory " << bytes_text(gpu_memory) << " (the smallest needs "
          << bytes_text(least) << " per rank); use more GPUs or a smaller batch, or raise --gpu-memory\n";
      return 2;
    }
    return 0;
  }
  const WorldLayout world = flags.world();
  check_deepep_mode(plan, world.domain());
  note_unmodelled(plan, err);
  if (in.attn_tp_input_scattered && !attn_input_scattered(world.domain().bridge_path(), world.domain().widths()))
    err << "note: --enable-attn-tp-input-scattered: SGLang applies it on TP without DP attention, CP or an all-to-all "
           "backend (path tp_moe with attn_tp > 1); this layout takes path "
        << to_string(world.domain().bridge_path()) << " with attn_tp = " << world.domain().widths().attn_tp
        << ", so the plan is the same without it\n";
  const bool nnodes_given = plan.count("--nnodes") > 0;
  const Cluster timed = world_cluster(world, nnodes_given, cluster);
  const Deployment d = plan_deployment(world, in, timed, nnodes_given);
  const nlohmann::json j = deployment_json(d, in);
  require_finite(j, load_file);
  if (format == "json")
    out << j.dump(2) << "\n";
  else
    out << deployment_text(d, in) << cluster_text(timed) << (in.explain ? deployment_explain(d, in, timed) : "");
  return misfit_exit(d.memory.total(), gpu_memory, err);
}

// `relayout plan` after parsing: one layout's plan, or with --gpus the ranking of every layout.
inline int plan_command(const CLI::App& plan, LayoutFlags& flags, PlanInput in, const std::string& preset,
                        const DeployFlags& deploy, std::int64_t batch_tokens, int request_tokens, int gpus, int top,
                        double gpu_memory, Cluster cluster, const std::string& format, std::ostream& out, std::ostream& err) {
  cluster.resolve(&plan);
  if (plan.count("--gpu-memory") == 0) gpu_memory = cluster.memory;
  cluster.memory = gpu_memory;  // the memory a GPU has: every plan's fit verdict
  if (batch_tokens > 0 && plan.count("--requests") > 0)
    throw LayoutError("--batch-tokens", "--batch-tokens and --requests both give the batch: give one of them");
  if (is_mla_preset(preset))
    return deploy_command(plan, flags, deploy_input(plan, deploy, preset, in, batch_tokens, request_tokens), gpus, top,
                          gpu_memory, cluster, format, out, err, plan.count("--expert-load") > 0 ? deploy.load_file : "");
  if (!preset.empty() && preset != "demo") mla_preset(preset);  // names the presets
  for (const char* name : DeployFlags::kNames)
    if (plan.count(name) > 0)
      throw LayoutError(name, std::string(name) + ": applies to the MLA model (--preset deepseek-v3 or deepseek-r1), "
                                                  "not to the demo layer's plan");
  for (const char* name : kEfficiencyFlags)
    if (plan.count(name) > 0)
      throw LayoutError(name, std::string(name) + ": applies to the MLA model's roofline (--preset deepseek-v3 or "
                                                  "deepseek-r1); the demo layer's time model takes the peak flop rate");
  // --expert-load: the loads dsv4_layer measured (checked against --experts by plan_layer).
  if (plan.count("--expert-load") > 0) in.load = read_load_file(deploy.load_file);
  if (gpus > 0) {
    refuse_ranked_flags(plan, gpus, {"--requests", "--placement", "--padding"});
    if (batch_tokens == 0) throw LayoutError("--batch-tokens", "--gpus needs --batch-tokens (the tokens of one forward over all GPUs)");
    const Ranking r = rank_layouts(gpus, batch_tokens, request_tokens, in, cluster, gpu_memory);
    const nlohmann::json j = ranking_json(r);
    require_finite(j, in.load ? deploy.load_file : "");
    if (format == "json") {
      out << j.dump(2) << "\n";
    } else if (format == "svg") {
      out << ranking_svg(r, std::size_t(top));
    } else {
      char b[160];
      std::snprintf(b, sizeof b, "%.3g-byte values, %.3g-byte weights", in.elem, in.weight_elem > 0 ? in.weight_elem : in.elem);
      out << ranking_text(r, "ranking: " + std::to_string(gpus) + " GPUs, " + model_flags(in.dims) + ", " + b + "; batch " +
                                 std::to_string(batch_tokens) + " tokens in requests of " + std::to_string(request_tokens) +
                                 "; GPU memory " + bytes_text(gpu_memory) + "\n" + cluster_text(cluster) +
                                 "no overlap of communication and compute; dispatch/combine: " + kRoutingNote + "\n\n",
                          std::size_t(top));
    }
    double least = r.layouts.front().memory_per_rank;
    for (const RankedLayout& l : r.layouts) least = std::min(least, l.memory_per_rank);
    if (least > gpu_memory) {
      err << "error: --gpus " << gpus << ": no layout fits in --gpu-memory " << bytes_text(gpu_memory)
          << " (the smallest needs " << bytes_text(least) << " per rank); use more GPUs, a smaller model or batch, "
          << "smaller --weight-bytes / --element-bytes, or raise --gpu-memory\n";
      return 2;
    }
    return 0;
  }
  // The world: --requests are one micro-batch of a domain; --batch-tokens the world's, split evenly
  // over the replicas and into pp micro-batches.
  const WorldLayout world = flags.world();
  note_unmodelled(plan, err);
  if (format == "svg" && world.pp() > 1)
    throw LayoutError("--format", "--format svg draws one domain's plan; --pp-size " + std::to_string(world.pp()) +
                                      " plans " + std::to_string(world.pp()) + " stages: use text or json");
  check_stages(in.dims.layers, world.pp(), "--layers " + std::to_string(in.dims.layers));
  if (batch_tokens > 0) {
    const std::int64_t per_replica = (batch_tokens + world.replicas() - 1) / world.replicas();
    in.requests = batch_requests((per_replica + world.pp() - 1) / world.pp(), request_tokens);
  }
  const WorldPlan wp = plan_world(world, in, cluster, plan.count("--nnodes") > 0);
  const nlohmann::json j = world_plan_json(wp);
  require_finite(j, in.load ? deploy.load_file : "");
  if (format == "json")
    out << j.dump(2) << "\n";
  else if (format == "svg")
    out << plan_svg(wp.plans.front(), wp.cluster);
  else
    out << world_plan_text(wp);
  return misfit_exit(wp.memory_per_rank(), gpu_memory, err);
}

// `relayout plan [flags] -- python3 -m sglang.launch_server ...`: the SGLang flags the plan reads
// (the layout, DeepEP's mode, two-batch overlap, redundant experts, the disaggregation phase and
// the model path, as a preset when known) become plan flags; the plan's own flags before `--` win.
// Every other word is listed as ignored.
struct SglangWords {
  std::vector<std::string> flags, read, ignored;
  std::string model;  // --model-path / --model as given ("" when the command has none)
  bool model_known = false;  // it names a preset (DeepSeek-V3 or R1)
  std::string error;  // what SGLang's own argument parser refuses in the command ("" when nothing)
};

// The models of the presets, by repository name (the last part of --model-path, compared without
// regard to case, so a local copy in a directory of that name counts): the 671B DeepSeek-V3
// architecture only, never a distilled or another model whose name merely contains one of them.
inline constexpr std::pair<const char*, const char*> kPresetModels[] = {
    {"DeepSeek-V3", "deepseek-v3"},      {"DeepSeek-V3-Base", "deepseek-v3"},      {"DeepSeek-V3-0324", "deepseek-v3"},
    {"DeepSeek-V3.1", "deepseek-v3"},    {"DeepSeek-V3.1-Base", "deepseek-v3"},    {"DeepSeek-V3.1-Terminus", "deepseek-v3"},
    {"DeepSeek-R1", "deepseek-r1"},      {"DeepSeek-R1-0528", "deepseek-r1"},      {"DeepSeek-R1-Zero", "deepseek-r1"}};

// The preset of a --model-path ("" when none): its last path component, trailing slashes dropped.
inline std::string preset_of_model(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const std::string name = path.substr(path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/') + 1);
  const auto lower = [](std::string s) {
    for (char& ch : s) ch = char(std::tolower(static_cast<unsigned char>(ch)));
    return s;
  };
  for (const auto& [repo, preset] : kPresetModels)
    if (lower(name) == lower(repo)) return preset;
  return "";
}

// The SGLang flags the plan reads, as the direct flags of apps/common/layout_flags.hpp and
// DeployFlags spell them (each alias SGLang has): valued, and switches.
inline constexpr const char* kSglangValued[] = {
    "--tp", "--tp-size", "--dp", "--dp-size", "--ep", "--ep-size", "--moe-a2a-backend", "--deepep-mode",
    "--ep-num-redundant-experts", "--attn-cp-size", "--moe-dp-size", "--pp-size", "--pipeline-parallel-size", "--nnodes",
    "--dcp-size", "--decode-context-parallel-size", "--moe-dense-tp-size", "--cp-strategy", "--attn-dp-size",
    "--attention-data-parallel-size"};
inline constexpr const char* kSglangSwitches[] = {"--enable-dp-attention", "--enable-two-batch-overlap",
                                                  "--enable-dp-lm-head", "--enable-tp-lm-head-all-to-all",
                                                  "--enable-prefill-cp", "--enable-attn-tp-input-scattered"};

inline SglangWords sglang_flags(const std::vector<std::string>& words, const std::vector<std::string>& given) {
  const auto& kValued = kSglangValued;
  const auto& kSwitches = kSglangSwitches;
  const auto in = [](const auto& list, const std::string& w) {
    return std::find(std::begin(list), std::end(list), w) != std::end(list);
  };
  const auto user_gave = [&](const std::string& flag) { return std::find(given.begin(), given.end(), flag) != given.end(); };
  SglangWords out;
  std::size_t i = 0;
  while (i < words.size() && words[i].rfind("--", 0) != 0) ++i;  // the program: python3 -m sglang.launch_server
  for (; i < words.size(); ++i) {
    std::string flag = words[i], value;
    if (const auto eq = flag.find('='); eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    } else if (i + 1 < words.size() && words[i + 1].rfind("--", 0) != 0 && !in(kSwitches, flag)) {
      value = words[++i];
    }
    const std::string shown = flag + (value.empty() ? "" : " " + value);
    std::string mapped = flag;
    if (in(kSwitches, flag) && out.error.empty()) {
      // argparse's store_true: "--flag=value" is refused, and a word after the switch is a stray argument.
      if (words[i].find('=') != std::string::npos)
        out.error = flag + "=" + value + ": " + flag + " is a switch and takes no value; SGLang's argument parser " +
                    "refuses the command (argument " + flag + ": ignored explicit argument '" + value + "'): give " +
                    flag + " alone to turn it on, leave it out to keep it off";
      else if (i + 1 < words.size() && words[i + 1].rfind("--", 0) != 0)
        out.error = flag + " " + words[i + 1] + ": " + flag + " is a switch and takes no value; SGLang's argument " +
                    "parser refuses the command (unrecognized arguments: " + words[i + 1] + ")";
    }
    if (flag == "--model-path" || flag == "--model") {
      const std::string preset = preset_of_model(value);
      out.model = value;
      out.model_known = !preset.empty();
      if (preset.empty()) {
        out.ignored.push_back(shown + " (no preset for this model)");
        continue;
      }
      mapped = "--preset";
      value = preset;
    } else if (flag == "--disaggregation-mode" && (value == "prefill" || value == "decode")) {
      mapped = "--phase";
    } else if (!in(kValued, flag) && !in(kSwitches, flag)) {
      out.ignored.push_back(shown);
      continue;
    }
    if (user_gave(mapped)) {
      out.ignored.push_back(shown + " (given before --)");
      continue;
    }
    out.read.push_back(shown + (mapped != flag ? " (" + mapped + " " + value + ")" : ""));
    out.flags.push_back(mapped);
    if (!in(kSwitches, flag)) out.flags.push_back(value);
  }
  return out;
}

inline int relayout_command(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

// An SGLang command after `relayout plan ... --`: planned with the flags it gives (nullopt when
// argv has no such command).
inline std::optional<int> sglang_command(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  if (argc <= 2 || std::string(argv[1]) != "plan") return std::nullopt;
  for (int dash = 2; dash < argc; ++dash) {
    if (std::string(argv[dash]) != "--") continue;
    std::vector<std::string> words(argv + dash + 1, argv + argc), given(argv + 2, argv + dash);
    const SglangWords sg = sglang_flags(words, given);
    if (!sg.error.empty()) {
      err << "error: " << sg.error << "\n";
      return 2;
    }
    // The model: a preset the path names, or one given before `--`; never the demo layer by default.
    const bool preset_given = std::any_of(given.begin(), given.end(), [](const std::string& w) {
      return w == "--preset" || w.rfind("--preset=", 0) == 0;
    });
    if (!sg.model_known && !preset_given) {
      err << "error: --model-path" << (sg.model.empty() ? ": the SGLang command names no model"
                                                         : " " + sg.model + ": no preset for this model")
          << "; relayout plan knows deepseek-ai/DeepSeek-V3 and DeepSeek-R1 (--preset deepseek-v3, deepseek-r1) "
             "and the demo layer (--preset demo): give --preset before -- to plan another\n";
      if (!sg.model.empty())
        err << "note: a model is known by its repository name (the last part of --model-path):";
      for (std::size_t k = 0; !sg.model.empty() && k < std::size(kPresetModels); ++k)
        err << (k ? ", " : " ") << kPresetModels[k].first;
      if (!sg.model.empty()) err << "\n";
      return 2;
    }
    std::vector<std::string> args{argv[0], "plan"};
    args.insert(args.end(), given.begin(), given.end());
    args.insert(args.end(), sg.flags.begin(), sg.flags.end());
    const auto list = [](const std::vector<std::string>& v) {
      std::string t;
      for (const std::string& w : v) t += (t.empty() ? "" : ", ") + w;
      return t.empty() ? std::string("none") : t;
    };
    out << "sglang command: read " << list(sg.read) << "\nsglang command: ignored " << list(sg.ignored) << "\n\n";
    std::vector<const char*> ptrs;
    for (const std::string& a : args) ptrs.push_back(a.c_str());
    return relayout_command(int(ptrs.size()), ptrs.data(), out, err);
  }
  return std::nullopt;
}

// `relayout explain`: a layout's flags, --rank and --format. Not movable once added (LayoutFlags
// keeps pointers to the options it registered).
struct ExplainArgs {
  LayoutFlags flags;
  std::string format = "text";
  int rank = -1;
  bool scattered = false;  // --enable-attn-tp-input-scattered
  CLI::App* app = nullptr;

  void add_to(CLI::App& parent) {
    app = parent.add_subcommand("explain", "explain a layout given SGLang-style flags");
    flags.add_to(*app);
    app->add_flag("--enable-attn-tp-input-scattered", scattered,
                  "the projections every attention-TP member repeats run on each member's chunk of the rows, then "
                  "are all-gathered (SGLang applies it on path tp_moe with attn_tp > 1, attn_cp == 1)");
    add_int(*app, "--rank", rank, "focus one rank: of the world when --pp-size or replicas make it larger than one domain");
    app->add_option("--format", format, "text, json, dot or svg")->check(CLI::IsMember({"text", "json", "dot", "svg"}));
  }
  int run(std::ostream& out) {
    const RuntimeLayout layout = flags.layout();
    const WorldLayout world(layout.config());
    std::optional<int> focus;
    std::optional<WorldCoords> where;  // --rank of a world larger than the domain
    if (app->count("--rank")) {
      if (world.size() > world.tp()) {
        try {
          where = world.coords(rank);
        } catch (const LayoutError& e) {
          throw LayoutError("--rank", std::string("--rank: ") + e.what());
        }
        focus = where->domain.rank;
      } else {
        focus = layout.coords(rank).rank;  // throws when out of range
      }
    }
    const auto world_line = [&] {
      return "--rank " + std::to_string(where->rank) + " of the world (" + std::to_string(world.size()) +
             " ranks): replica " + std::to_string(where->replica) + ", pp stage " + std::to_string(where->pp_rank) +
             ", node " + std::to_string(where->node) + "; rank " + std::to_string(where->domain.rank) +
             " of its TP domain, focused below\n";
    };
    if (format == "json") {
      nlohmann::json j = explain_json(layout, focus, scattered);
      if (where)
        j["focus_world"] = {{"rank", where->rank}, {"replica", where->replica}, {"pp_rank", where->pp_rank},
                            {"node", where->node}, {"domain_rank", where->domain.rank}};
      out << j.dump(2) << "\n";
    } else if (format == "dot") {
      out << explain_dot(layout);
    } else if (format == "svg") {
      out << explain_svg(layout);
    } else {
      if (where) out << world_line();
      out << explain_text(layout, focus, scattered);
    }
    return 0;
  }
};

// `relayout plan`: the collectives, rows and memory per rank of the demo layer (plan.hpp), from
// dsv4_layer's flags, or of an MLA preset (plan_deploy.hpp), and the ranking of a cluster's layouts.
struct PlanArgs {
  LayoutFlags flags;
  PlanInput in;
  std::string format = "text", preset;
  DeployFlags deploy;
  std::int64_t batch_tokens = 0;
  int request_tokens = 2048, gpus = 0, top = 20;
  std::uint64_t gpu_memory = std::uint64_t(80) << 30;
  Cluster cluster;
  CLI::App* app = nullptr;

  void add_to(CLI::App& parent) {
    CLI::App* plan = app = parent.add_subcommand(
        "plan", "predicted collectives, rows, memory and time per rank of one forward over the world (replicas x pipeline stages x a domain)");
    flags.add_redundant_experts = false;  // DeployFlags reads --ep-num-redundant-experts
    flags.add_to(*plan);
    add_model_flags(*plan, in.dims);
    add_int_list(*plan, "--requests", in.requests, "prompt lengths, e.g. 5,3,4 (request i -> DP group i mod attn_dp)");
    add_int_list(*plan, "--placement", in.placement, "the DP group of each request, e.g. 0,0,2");
    plan->add_option("--padding", in.padding, "auto (docs/bridge.md#padding rule), max_len or sum_len");
    plan->add_option("--restore", in.restore, "path A restore: reduce or scatter");
    plan->add_option("--format", format, "text, json or svg")->check(CLI::IsMember({"text", "json", "svg"}));
    // Sizes of values and weights, the model preset, the batch, and the ranking of layouts.
    add_float(*plan, "--element-bytes", in.elem, "bytes of one activation value (default 4: the demo layer's float)", 1.0, 64.0);
    add_float(*plan, "--weight-bytes", in.weight_elem, "bytes of one weight (default: --element-bytes)", 0.125, 64.0);
    plan->add_option("--dispatch-dtype", in.dispatch_dtype,
                     "paths a2a_split and direct: dispatched rows as fp32 (the value type, default), bf16 (2 bytes a value) "
                     "or fp8 (e4m3 with a 4-byte scale per 128 values; with --gpus, the layouts that dispatch)");
    plan->add_option("--preset", preset,
                     "model: demo (the demo layer, default), deepseek-v3 or deepseek-r1 (config.json's MLA model, FP8 weights)");
    deploy.add_to(*plan);
    add_int<std::int64_t>(*plan, "--batch-tokens", batch_tokens, "tokens of one forward over all GPUs, as requests of --request-tokens (instead of --requests)", 1, std::int64_t(1) << 24);
    add_int(*plan, "--request-tokens", request_tokens, "prompt length of the --batch-tokens requests (default 2048)", 1, 1 << 20);
    add_int(*plan, "--gpus", gpus, "rank every valid layout of this many GPUs by predicted time per forward", 1, 4096);
    add_int(*plan, "--top", top, "ranking: rows of the text table (default 20; 0: all)", 0, 1 << 20);
    plan->add_option_function<std::string>(
            "--gpu-memory", [this](const std::string& text) { gpu_memory = parse_bytes("--gpu-memory", text); },
            "memory per GPU (K, M, G, T suffixes; default 80G): layouts needing more are marked")
        ->type_name("BYTES");
    cluster.add_to(*plan);
  }
  int run(std::ostream& out, std::ostream& err) {
    return plan_command(*app, flags, in, preset, deploy, batch_tokens, request_tokens, gpus, top, double(gpu_memory), cluster,
                        format, out, err);
  }
};

// `relayout trace diff BASELINE CANDIDATE`: first divergence of two row-ownership traces (trace_diff.hpp).
struct TraceArgs {
  std::string baseline, candidate;
  DiffOptions options;
  CLI::App* diff = nullptr;

  void add_to(CLI::App& parent) {
    CLI::App* trace = parent.add_subcommand("trace", "row-ownership traces written with --trace DIR");
    trace->require_subcommand(1);
    diff = trace->add_subcommand(
        "diff", "first boundary where CANDIDATE's rows diverge from BASELINE's (exit 0 agree, 1 diverge, 2 unreadable)");
    diff->add_option("BASELINE", baseline, "trace directory of the trusted run (e.g. one rank)")->required();
    diff->add_option("CANDIDATE", candidate, "trace directory of the layout under test")->required();
    // At most 1: the checksums of O(1) activations, which a layout bug changes by O(1), would agree
    // whatever the rows hold under a larger tolerance.
    add_float(*diff, "--rtol", options.tolerance.rtol, "relative checksum tolerance, in [0, 1] (see relayout/trace/record.hpp)", 0.0, 1.0);
    add_float(*diff, "--atol", options.tolerance.atol, "absolute checksum tolerance, in [0, 1]", 0.0, 1.0);
  }
};

inline int relayout_command(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  if (const std::optional<int> rc = sglang_command(argc, argv, out, err)) return *rc;
  CLI::App app{"relayout: parallel layouts for DP-attention / EP-MoE inference engines"};
  app.require_subcommand(1);
  ExplainArgs explain;
  explain.add_to(app);
  PlanArgs plan;  // its own LayoutFlags: LayoutFlags keeps a pointer to the option it registered
  plan.add_to(app);
  TraceArgs trace;
  trace.add_to(app);
  // A misspelt subcommand is named (CLI11 would take it for a stray argument and ask for one).
  if (const std::string unknown = unknown_subcommand(app, argc, argv); !unknown.empty()) {
    err << "error: " << unknown << "\n";
    return 2;
  }
  return run_main(app, argc, argv, out, err, [&] {
    if (trace.diff->parsed()) return trace_diff(trace.baseline, trace.candidate, trace.options, out, err);
    if (plan.app->parsed()) return plan.run(out, err);
    return explain.run(out);
  });
}

}  // namespace relayout::cli
