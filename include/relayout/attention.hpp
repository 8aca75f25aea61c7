// The attention side of the layout: CP token shares, the prefill KV all-gather, decode and extend
// under attention CP (query all-gather, partial attention, log-sum-exp merge), extend attention
// over the paged cache, the request table of continuous batching, and their plan.
#pragma once

#include "relayout/attention/cp_attention.hpp"
#include "relayout/attention/cp_share.hpp"
#include "relayout/attention/extend.hpp"
#include "relayout/attention/kv_ledger.hpp"
#include "relayout/attention/plan.hpp"
#include "relayout/attention/request_table.hpp"
