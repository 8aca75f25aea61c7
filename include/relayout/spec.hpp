// DSpark speculative decoding under DP attention: token units, sync metadata, SpecTpSync and its
// sites, the draft context, idle batches and the planner's DP-tier gate (docs/dspark.md).
#pragma once

#include "relayout/spec/draft.hpp"
#include "relayout/spec/idle.hpp"
#include "relayout/spec/planner.hpp"
#include "relayout/spec/sampling.hpp"
#include "relayout/spec/sync.hpp"
#include "relayout/spec/sync_sites.hpp"
#include "relayout/spec/tokens.hpp"
