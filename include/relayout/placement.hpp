// Placements: token-row tensors whose layout state (Partial, Replicated, RowShard over a named
// group; DpLocal or DpGlobal) is part of their type, the legal transitions between them as
// functions, and AnyRows, the runtime twin. Illegal transitions do not compile (or throw, at run
// time) with a sentence naming the legal call.
#pragma once

#include "relayout/placement/any_rows.hpp"
#include "relayout/placement/dp_slots.hpp"
#include "relayout/placement/ep.hpp"
#include "relayout/placement/expert_load_json.hpp"
#include "relayout/placement/expert_location.hpp"
#include "relayout/placement/expert_location_sync.hpp"
#include "relayout/placement/expert_moves.hpp"
#include "relayout/placement/fp8.hpp"
#include "relayout/placement/rows.hpp"
#include "relayout/placement/rules.hpp"
#include "relayout/placement/split.hpp"
#include "relayout/placement/tags.hpp"
#include "relayout/placement/traffic.hpp"
#include "relayout/placement/transitions.hpp"
#include "relayout/placement/zipf_routing.hpp"
