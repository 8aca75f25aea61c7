// Layout flags with SGLang's server-argument names, shared by `relayout` and the examples, so every
// program reads a layout the same way. Bad values become relayout::LayoutError (exit code 2).
#pragma once

#include <CLI/CLI.hpp>
#include <ostream>
#include <string>

#include "common/numbers.hpp"
#include "relayout/bridge/plan.hpp"
#include "relayout/mesh.hpp"

namespace relayout::cli {

struct LayoutFlags {
  LayoutConfig config;
  std::string backend = "none";
  std::string draft = "none";
  std::string cp_strategy;  // empty: not given (SGLang has no default)
  int attn_dp_size = 1;
  CLI::Option* attn_dp_size_flag = nullptr;  // the value counts only when given
  int moe_dense_tp_size = 0;
  CLI::Option* moe_dense_tp_size_flag = nullptr;
  // Off where the program reads --ep-num-redundant-experts itself (relayout plan's MLA model).
  bool add_redundant_experts = true;

  void add_to(CLI::App& app) {
    // Any int: the layout engine names the flag and the rule of a width out of its range.
    add_int(app, "--tp,--tp-size", config.tp, "tensor-parallel width of the domain (ranks)");
    add_int(app, "--dp,--dp-size", config.dp, "data-parallel size (attention DP with --enable-dp-attention)");
    add_int(app, "--cp,--attn-cp-size", config.cp, "attention context-parallel width");
    add_int(app, "--ep,--ep-size", config.ep, "expert-parallel width (only honoured with backend none)");
    add_int(app, "--moe-dp-size", config.moe_dp, "MoE data-parallel width");
    app.add_flag("--enable-dp-attention", config.enable_dp_attention, "re-divide the tp ranks into dp attention groups");
    attn_dp_size_flag = add_int(app, "--attn-dp-size,--attention-data-parallel-size", attn_dp_size,
                                "attention-DP width (same as --dp-size N --enable-dp-attention)");
    app.add_flag("--enable-prefill-cp", config.enable_prefill_cp,
                 "DeepSeek-V4 prefill context parallelism: DP attention on, attn_cp = tp / dp");
    app.add_option("--cp-strategy", cp_strategy,
                   "prefill CP token order, required with --enable-prefill-cp: interleave (zigzag is NPU-only)");
    app.add_option("--moe-a2a-backend", backend, "MoE all-to-all backend: " + backend_names());
    app.add_option("--draft", draft, "speculative draft model: none, dense or moe");
    app.add_flag("--enable-dp-lm-head", config.enable_dp_lm_head,
                 "split the LM head's vocabulary over the attention-TP group (needs DP attention)");
    app.add_flag("--enable-tp-lm-head-all-to-all", config.enable_tp_lm_head_all_to_all,
                 "TP-sharded LM head with an all-to-all (needs DP attention, tp == dp, attn_cp == 1)");
    moe_dense_tp_size_flag = add_int(app, "--moe-dense-tp-size", moe_dense_tp_size,
                                     "TP width of the dense (non-MoE) layers: 1 or tp (default tp)");
    add_int(app, "--dcp-size,--decode-context-parallel-size", config.dcp,
            "decode context-parallel width: blocks of dcp ranks inside the TP group");
    if (add_redundant_experts)
      add_int(app, "--ep-num-redundant-experts", config.ep_num_redundant_experts,
              "redundant expert replicas (needs expert parallelism)");
    add_int(app, "--pp-size,--pipeline-parallel-size", config.pp, "pipeline stages of the world");
    add_int(app, "--nnodes", config.nnodes, "machines the world runs on");
  }

  // Call after parsing: resolves the names and checks the widths (throws LayoutError).
  RuntimeLayout layout() {
    config.moe_a2a_backend = parse_backend(backend);
    config.draft = parse_draft(draft);
    if (!cp_strategy.empty()) config.cp_strategy = parse_cp_strategy(cp_strategy);
    if (attn_dp_size_flag && attn_dp_size_flag->count() > 0) config.attn_dp_size = attn_dp_size;
    if (moe_dense_tp_size_flag && moe_dense_tp_size_flag->count() > 0) config.moe_dense_tp_size = moe_dense_tp_size;
    return RuntimeLayout(config);
  }
  // The whole world the flags describe (replicas x pp x tp); throws LayoutError.
  WorldLayout world() {
    layout();
    return WorldLayout(config);
  }
};

// Parses, runs `body` and maps failures to exit codes: 0 ok, 2 bad input (CLI or layout), 1 any
// other error. Messages go to `out`/`err`, so the same code serves main() and the fuzzer; `error`,
// when given, receives the error text (for JobGuard::finish on the ranks whose `err` is silent).
template <class F>
int run_main(CLI::App& app, int argc, const char* const* argv, std::ostream& out, std::ostream& err,
             F&& body, std::string* error = nullptr) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e, out, err);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e, out, err);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e, out, err);
  } catch (const CLI::ParseError& e) {
    app.exit(e, out, err);
    return 2;
  }
  try {
    return body();
  } catch (const LayoutError& e) {
    err << "error: " << e.what() << "\n";
    if (error) *error = e.what();
    return 2;
  } catch (const std::exception& e) {
    err << "error: " << e.what() << "\n";
    if (error) *error = e.what();
    return 1;
  }
}

// --dispatch-dtype (dsv4_layer and relayout plan): fp32 sends dispatched rows in the value type,
// bf16 as 2-byte values, fp8 as e4m3 with a scale per 128 values; the last two only on a path that
// dispatches rows (the bridge's own rule).
inline DispatchDtype dispatch_dtype_of(const RuntimeLayout& layout, const std::string& dtype) {
  if (dtype != "fp32" && dtype != "bf16" && dtype != "fp8")
    throw LayoutError("--dispatch-dtype", "--dispatch-dtype must be fp32, bf16 or fp8, got '" + dtype + "'");
  const DispatchDtype d = dtype == "fp32" ? DispatchDtype::compute : dtype == "bf16" ? DispatchDtype::bf16 : DispatchDtype::fp8;
  check_dispatch_dtype(d, layout.bridge_path(), "--dispatch-dtype");
  return d;
}

}  // namespace relayout::cli
