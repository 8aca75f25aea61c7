// Layout flags with SGLang's server-argument names, shared by `relayout` and the examples, so every
// program reads a layout the same way. Bad values become relayout::LayoutError (exit code 2).
#pragma once

#include <CLI/CLI.hpp>
#include <ostream>
#include <string>

#include "cli/numbers.hpp"
#include "relayout/mesh.hpp"

namespace relayout::cli {

struct LayoutFlags {
  LayoutConfig config;
  std::string backend = "none";
  std::string draft = "none";
  std::string cp_strategy = "interleave";
  int attn_dp_size = 1;
  CLI::Option* attn_dp_size_flag = nullptr;  // the value counts only when given

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
    app.add_option("--cp-strategy", cp_strategy, "prefill CP token order: interleave (zigzag is NPU-only)");
    app.add_option("--moe-a2a-backend", backend, "MoE all-to-all backend: " + backend_names());
    app.add_option("--draft", draft, "speculative draft model: none, dense or moe");
  }

  // Call after parsing: resolves the names and checks the widths (throws LayoutError).
  RuntimeLayout layout() {
    config.moe_a2a_backend = parse_backend(backend);
    config.draft = parse_draft(draft);
    config.cp_strategy = parse_cp_strategy(cp_strategy);
    if (attn_dp_size_flag && attn_dp_size_flag->count() > 0) config.attn_dp_size = attn_dp_size;
    return RuntimeLayout(config);
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
// bf16 as 2-byte values, which only a path that dispatches rows has.
inline bool dispatch_bf16(const RuntimeLayout& layout, const std::string& dtype) {
  if (dtype != "fp32" && dtype != "bf16")
    throw LayoutError("--dispatch-dtype", "--dispatch-dtype must be fp32 or bf16, got '" + dtype + "'");
  const BridgePath path = layout.bridge_path();
  if (dtype == "bf16" && path != BridgePath::a2a_split && path != BridgePath::direct)
    throw LayoutError("--dispatch-dtype", "--dispatch-dtype bf16 needs a path that dispatches rows (a2a_split or direct: "
                                          "--moe-a2a-backend deepep); this layout takes path " +
                                              std::string(to_string(path)));
  return dtype == "bf16";
}

}  // namespace relayout::cli
