// The Attention -> MoE hand-over: a constexpr plan of typed transitions per bridge path and the
// executor that runs it with the engine's own router and experts (docs/bridge.md).
#pragma once

#include "relayout/bridge/bridge.hpp"
#include "relayout/bridge/plan.hpp"
