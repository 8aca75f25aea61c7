// The distributed DeepSeek-V4-like layer (attention, the Attention->MoE bridge, the MoE block), its
// workload and deterministic weights, and the single-rank reference it is verified against.
#pragma once

#include "demo/model/bridge.hpp"
#include "demo_model/config.hpp"
#include "demo/model/layer.hpp"
#include "demo/model/layer_weights.hpp"
#include "demo/model/reference.hpp"
#include "demo/model/traffic.hpp"
#include "demo_model/weights.hpp"
#include "demo_model/workload.hpp"
