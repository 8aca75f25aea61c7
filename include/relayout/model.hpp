// The distributed DeepSeek-V4-like layer (attention, the Attention->MoE bridge, the MoE block), its
// workload and deterministic weights, and the single-rank reference it is verified against.
#pragma once

#include "relayout/model/bridge.hpp"
#include "relayout/model/config.hpp"
#include "relayout/model/layer.hpp"
#include "relayout/model/layer_weights.hpp"
#include "relayout/model/reference.hpp"
#include "relayout/model/rows.hpp"
#include "relayout/model/traffic.hpp"
#include "relayout/model/weights.hpp"
#include "relayout/model/workload.hpp"
#include "relayout/model/wire.hpp"
