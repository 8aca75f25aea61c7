// The `relayout` command line as a function of (argv, out, err) -> exit code, shared by main() and
// the fuzz target. Subcommands: explain, plan, trace diff.
#pragma once

#include <optional>
#include <ostream>
#include <string>

#include "cli/explain.hpp"
#include "cli/layout_flags.hpp"
#include "cli/plan_rank.hpp"
#include "cli/plan_svg.hpp"
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

// `relayout plan` after parsing: one layout's plan, or with --gpus the ranking of every layout.
inline int plan_command(const CLI::App& plan, LayoutFlags& flags, PlanInput in, const std::string& preset,
                        std::int64_t batch_tokens, int request_tokens, int gpus, int top, double gpu_memory,
                        Cluster cluster, const std::string& format, std::ostream& out, std::ostream& err) {
  cluster.resolve();
  if (!preset.empty()) {  // the preset's dims under the model flags given explicitly
    const model::ModelDims p = preset_dims(preset);
    for (const ModelFlag& f : kModelFlags)
      if (plan.count(f.name) == 0) in.dims.*f.member = p.*f.member;
  }
  if (batch_tokens > 0 && plan.count("--requests") > 0)
    throw LayoutError("--batch-tokens", "--batch-tokens and --requests both give the batch: give one of them");
  if (gpus > 0) {
    for (const char* name : {"--tp", "--dp", "--cp", "--ep", "--moe-dp-size", "--enable-dp-attention", "--attn-dp-size",
                             "--enable-prefill-cp", "--moe-a2a-backend", "--requests", "--placement", "--padding"})
      if (plan.count(name) > 0)
        throw LayoutError(name, std::string(name) + ": --gpus ranks every layout of " + std::to_string(gpus) +
                                    " GPUs with automatic padding; give no layout, request or padding flags with it");
    if (batch_tokens == 0) throw LayoutError("--batch-tokens", "--gpus needs --batch-tokens (the tokens of one forward over all GPUs)");
    const Ranking r = rank_layouts(gpus, batch_tokens, request_tokens, in, cluster, gpu_memory);
    if (format == "json") {
      out << ranking_json(r).dump(2) << "\n";
    } else if (format == "svg") {
      out << ranking_svg(r, std::size_t(top));
    } else {
      char b[160];
      std::snprintf(b, sizeof b, "%.3g-byte values, %.3g-byte weights", in.elem, in.weight_elem > 0 ? in.weight_elem : in.elem);
      out << ranking_text(r, "ranking: " + std::to_string(gpus) + " GPUs, " + model_flags(in.dims) + ", " + b + "; batch " +
                                 std::to_string(batch_tokens) + " tokens in requests of " + std::to_string(request_tokens) +
                                 "; GPU memory " + bytes_text(gpu_memory) + "\n" + cluster_text(cluster) +
                                 "dispatch/combine: " + kRoutingNote + "\n\n",
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
  if (batch_tokens > 0) in.requests = batch_requests(batch_tokens, request_tokens);
  const LayerPlan p = plan_layer(flags.layout(), in);
  if (format == "json")
    out << timed_plan_json(p, cluster).dump(2) << "\n";
  else if (format == "svg")
    out << plan_svg(p, cluster);
  else
    out << timed_plan_text(p, cluster);
  return 0;
}

inline int relayout_command(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  CLI::App app{"relayout: parallel layouts for DP-attention / EP-MoE inference engines"};
  app.require_subcommand(1);

  LayoutFlags flags;
  std::string format = "text";
  int rank = -1;
  CLI::App* explain = app.add_subcommand("explain", "explain a layout given SGLang-style flags");
  flags.add_to(*explain);
  add_int(*explain, "--rank", rank, "focus one rank of the domain");
  explain->add_option("--format", format, "text, json, dot or svg")
      ->check(CLI::IsMember({"text", "json", "dot", "svg"}));

  // plan: the collectives, rows and memory per rank of the demo layer (plan.hpp), from dsv4_layer's flags.
  LayoutFlags plan_flags;  // its own: LayoutFlags keeps a pointer to the option it registered
  PlanInput plan_in;
  std::string plan_format = "text";
  CLI::App* plan = app.add_subcommand("plan", "predicted collectives, rows and memory per rank of one forward of the demo layer");
  plan_flags.add_to(*plan);
  add_model_flags(*plan, plan_in.dims);
  add_int_list(*plan, "--requests", plan_in.requests, "prompt lengths, e.g. 5,3,4 (request i -> DP group i mod attn_dp)");
  add_int_list(*plan, "--placement", plan_in.placement, "the DP group of each request, e.g. 0,0,2");
  plan->add_option("--padding", plan_in.padding, "auto (docs/bridge.md#padding rule), max_len or sum_len");
  plan->add_option("--restore", plan_in.restore, "path A restore: reduce or scatter");
  plan->add_option("--format", plan_format, "text, json or svg")->check(CLI::IsMember({"text", "json", "svg"}));
  // Sizes of values and weights, the model preset, the batch, and the ranking of layouts.
  add_float(*plan, "--element-bytes", plan_in.elem, "bytes of one activation value (default 4: the demo layer's float)", 1.0, 64.0);
  add_float(*plan, "--weight-bytes", plan_in.weight_elem, "bytes of one weight (default: --element-bytes)", 0.125, 64.0);
  plan->add_option("--dispatch-dtype", plan_in.dispatch_dtype,
                   "paths a2a_split and direct: dispatched rows as fp32 (the value type, default) or bf16 (2 bytes a value; "
                   "with --gpus, the layouts that dispatch)");
  std::string preset;
  plan->add_option("--preset", preset, "a published model configuration: deepseek-v3 (explicit model flags override it)");
  std::int64_t batch_tokens = 0;
  int request_tokens = 2048, gpus = 0, top = 20;
  add_int<std::int64_t>(*plan, "--batch-tokens", batch_tokens, "tokens of one forward over all GPUs, as requests of --request-tokens (instead of --requests)", 1, std::int64_t(1) << 24);
  add_int(*plan, "--request-tokens", request_tokens, "prompt length of the --batch-tokens requests (default 2048)", 1, 1 << 20);
  add_int(*plan, "--gpus", gpus, "rank every valid layout of this many GPUs by predicted time per forward", 1, 4096);
  add_int(*plan, "--top", top, "ranking: rows of the text table (default 20; 0: all)", 0, 1 << 20);
  std::uint64_t gpu_memory = std::uint64_t(80) << 30;
  plan->add_option_function<std::string>(
          "--gpu-memory", [&gpu_memory](const std::string& text) { gpu_memory = parse_bytes("--gpu-memory", text); },
          "memory per GPU (K, M, G, T suffixes; default 80G): layouts needing more are marked")
      ->type_name("BYTES");
  Cluster cluster;
  cluster.add_to(*plan);


  // trace diff BASELINE CANDIDATE: first divergence of two row-ownership traces (trace_diff.hpp).
  CLI::App* trace = app.add_subcommand("trace", "row-ownership traces written with --trace DIR");
  trace->require_subcommand(1);
  CLI::App* diff = trace->add_subcommand(
      "diff", "first boundary where CANDIDATE's rows diverge from BASELINE's (exit 0 agree, 1 diverge, 2 unreadable)");
  std::string baseline, candidate;
  DiffOptions diff_opts;
  diff->add_option("BASELINE", baseline, "trace directory of the trusted run (e.g. one rank)")->required();
  diff->add_option("CANDIDATE", candidate, "trace directory of the layout under test")->required();
  // At most 1: the checksums of O(1) activations, which a layout bug changes by O(1), would agree
  // whatever the rows hold under a larger tolerance.
  add_float(*diff, "--rtol", diff_opts.tolerance.rtol, "relative checksum tolerance, in [0, 1] (see relayout/trace/record.hpp)", 0.0, 1.0);
  add_float(*diff, "--atol", diff_opts.tolerance.atol, "absolute checksum tolerance, in [0, 1]", 0.0, 1.0);

  // A misspelt subcommand is named (CLI11 would take it for a stray argument and ask for one).
  if (const std::string unknown = unknown_subcommand(app, argc, argv); !unknown.empty()) {
    err << "error: " << unknown << "\n";
    return 2;
  }

  return run_main(app, argc, argv, out, err, [&] {
    if (diff->parsed()) return trace_diff(baseline, candidate, diff_opts, out, err);
    if (plan->parsed()) return plan_command(*plan, plan_flags, plan_in, preset, batch_tokens, request_tokens, gpus,
                                            top, double(gpu_memory), cluster, plan_format, out, err);
    const RuntimeLayout layout = flags.layout();
    std::optional<int> focus;
    if (explain->count("--rank")) focus = layout.coords(rank).rank;  // throws when out of range
    if (format == "json")
      out << explain_json(layout, focus).dump(2) << "\n";
    else if (format == "dot")
      out << explain_dot(layout);
    else if (format == "svg")
      out << explain_svg(layout);
    else
      out << explain_text(layout, focus);
    return 0;
  });
}

}  // namespace relayout::cli
