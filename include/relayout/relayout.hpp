// relayout: parallel layouts, layout hand-over and kernels for DeepSeek-V4-style inference engines
// with DP attention and expert-parallel MoE. Include this header for everything.
#pragma once

#include "relayout/mesh.hpp"
#include "relayout/version.hpp"
#include "relayout/comm.hpp"
#include "relayout/kernels.hpp"
#include "relayout/placement.hpp"
#include "relayout/attention.hpp"
#include "relayout/bridge.hpp"
#include "relayout/trace.hpp"
#include "relayout/spec.hpp"
