// The compute kernels of a DeepSeek-V4-like layer on Kokkos execution spaces: linear (+ tensor
// parallel shards), rms_norm, shared-KV attention (prefill, decode) and its paged KV cache, router,
// SwiGLU experts, and their single-rank reference (relayout::reference).
#pragma once

#include "relayout/kernels/attention.hpp"
#include "relayout/kernels/convert.hpp"
#include "relayout/kernels/error.hpp"
#include "relayout/kernels/kv_cache.hpp"
#include "relayout/kernels/linear.hpp"
#include "relayout/kernels/moe.hpp"
#include "relayout/kernels/reference.hpp"
#include "relayout/kernels/rms_norm.hpp"
#include "relayout/kernels/router.hpp"
#include "relayout/kernels/types.hpp"
