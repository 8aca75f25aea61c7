// The demo model's glue to the library's bridge (relayout/bridge): its layer options (the bridge's
// own, with the injected faults of the verification demos, and its bookkeeping) and the owners list
// it keeps at every boundary (LayerOptions::record_boundaries) beside the library's trace recorder
// (relayout/trace/recorder.hpp).
#pragma once

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "relayout/bridge.hpp"
#include "relayout/bridge/testing.hpp"
#include "relayout/mesh/layout.hpp"
#include "demo/model/traffic.hpp"
#include "demo_model/workload.hpp"
#include "relayout/trace/recorder.hpp"
#include "relayout/trace/tracked.hpp"

namespace relayout::model {

// A layer's rows on a rank: its DP group's rows (under CP its share), Replicated over attn_tp, with
// their owners when LayerOptions::track_owners.
template <class ExecSpace = Kokkos::DefaultExecutionSpace>
using LayerRows = trace::Tracked<relayout::Rows<float, Replicated<AttnTp>, DpLocal, ExecSpace>>;

// The demo layer's options: the library's bridge options (padding, restore, the dispatch dtype,
// the EP capacity) and the demo's own: an injected fault, the decode EP mode, bookkeeping.
struct LayerOptions : relayout::BridgeOptions {
  bool track_owners = true;        // move row owners with the rows and check conservation
  bool record_boundaries = false;  // keep the owners this rank holds after every boundary
  // Decode steps' EP mode (the prefill dispatches in normal mode); for low_latency the most rows a
  // rank dispatches in one step is BridgeOptions::num_max_dispatch_tokens_per_rank.
  EpMode decode_ep_mode = EpMode::normal;
  // A known bug wired into the bridge (relayout::testing::inject_fault), for the verification demos.
  BridgeFault inject = BridgeFault::none;
  // SGLang's --enable-attn-tp-input-scattered: under attn_tp > 1 each attention-TP member computes
  // the replicated low-rank projections (attn norm, wq_a, wkv, q and kv norms) for its chunk of the
  // rows and the members all-gather the results (n x (q_lora + head_dim) values), instead of every
  // member computing them for every row; on a path that dispatches rows the residual also stays
  // split over attn_tp between layers (reduce_scatter after wo_b, the bridge on each member's
  // chunk). Same values; no effect at attn_tp 1. (SGLang applies its flag on TP without DP
  // attention, CP or an all-to-all backend only; here any attn_tp > 1.)
  bool attn_tp_input_scattered = false;
};

// The owners this rank holds after each boundary, kept for the example's picture
// (LayerOptions::record_boundaries); the trace itself is the library's (trace::Recorder).
inline trace::OwnersHook keep_boundaries(const LayerOptions& o, std::vector<Boundary>* out) {
  if (!o.record_boundaries) return {};
  return [out](int layer, std::string_view name, std::span<const std::int64_t> owners) {
    out->push_back({layer, std::string(name), std::vector<std::int64_t>(owners.begin(), owners.end())});
  };
}

}  // namespace relayout::model
