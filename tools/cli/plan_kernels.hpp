// Achieved kernel rates of the MLA presets' time model, from published microbenchmark tables (not
// from any deployment's throughput): DeepGEMM's FP8 GEMM tables on H800 (normal GEMMs at M = 64,
// 128, 4096; grouped GEMMs, masked layout at 256-1024 rows a group and contiguous layout at
// 4096-8192), read as shares of the H800's dense FP8 peak (1979 TFLOP/s) and interpolated in
// log2(M) for the shape nearest in (N, K); the kernels that are not GEMMs or attention, counted
// in bytes over HBM; and the kernels a layer launches, each paying a launch gap.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <iterator>

namespace relayout::cli {

// One row of a DeepGEMM table: N, K and the TFLOP/s measured at each M of `ms` (0: not measured).
struct GemmRow {
  double n, k;
  double tflops[7];
};

// The M values of the table below: normal GEMMs at 64 and 128, masked grouped GEMMs at 256, 512
// and 1024 rows a group, contiguous grouped GEMMs at 4096 and 8192 rows a group, normal GEMMs at 4096.
inline constexpr double kGemmMs[7] = {64, 128, 256, 512, 1024, 4096, 8192};
inline constexpr double kH800Fp8Tflops = 1979;  // the peak the table's shares are taken of

// DeepGEMM README (github.com/deepseek-ai/DeepGEMM, performance tables of February 2025, H800,
// NVCC 12.8), TFLOP/s: "Normal GEMMs for dense models" (M 64, 128, 4096), "Grouped GEMMs for MoE
// models (masked layout)" (M per group 1024, 512, 256) and "(contiguous layout)" (M per group
// 8192, 4096). The two expert shapes have all of them; the attention shapes the normal table only.
inline constexpr GemmRow kDeepGemmRows[] = {
    {2112, 7168, {206, 352, 0, 0, 0, 1058, 0}},      // q_a + kv_a
    {24576, 1536, {289, 535, 0, 0, 0, 990, 0}},      // q_b
    {32768, 512, {219, 358, 0, 0, 0, 590, 0}},       // kv_b
    {7168, 16384, {336, 645, 0, 0, 0, 1358, 0}},     // o_proj
    {4096, 7168, {287, 533, 932, 1040, 1233, 1288, 1297}},  // expert gate + up
    {7168, 2048, {295, 510, 815, 916, 925, 1093, 1099}},    // expert down
};

// The table row nearest to (n, k): the least |log(n / N)| + 2 |log(k / K)| (the reduction length
// weighs twice: a GEMM of the same K and another N is the closer kernel).
inline const GemmRow& nearest_gemm_row(double n, double k) {
  const GemmRow* best = &kDeepGemmRows[0];
  double dist = 1e300;
  for (const GemmRow& r : kDeepGemmRows) {
    const double d = std::fabs(std::log(n / r.n)) + 2 * std::fabs(std::log(k / r.k));
    if (d < dist) {
      dist = d;
      best = &r;
    }
  }
  return *best;
}

// Achieved share of the FP8 peak of an (m x k) by (k x n) GEMM: the nearest row's TFLOP/s over
// 1979, linear in log2(m) between measured points, the last point's beyond it; below the first
// (m < 64, bound by reading the weights) the time of m = 64, so the share falls as m / 64.
inline double deepgemm_share(double m, double n, double k) {
  const GemmRow& r = nearest_gemm_row(n, k);
  double lo_m = 0, lo_t = 0;
  for (std::size_t i = 0; i < std::size(kGemmMs); ++i) {
    if (r.tflops[i] <= 0) continue;
    const double mi = kGemmMs[i], ti = r.tflops[i];
    if (m <= mi) {
      if (lo_m == 0) return ti / kH800Fp8Tflops * std::max(m, 1.0) / mi;
      const double x = std::log2(m / lo_m) / std::log2(mi / lo_m);
      return (lo_t + x * (ti - lo_t)) / kH800Fp8Tflops;
    }
    lo_m = mi;
    lo_t = ti;
  }
  return lo_t / kH800Fp8Tflops;
}

// FlashAttention-3's BF16 forward, causal, head dim 128, on H100 SXM5 (Shah et al., "FlashAttention-3",
// arXiv 2407.08608, figure 5): TFLOP/s at sequence lengths 512 to 16k. SGLang's prefill runs MLA
// unabsorbed through it (heads of 192 / 128).
inline constexpr double kFa3Lengths[6] = {512, 1024, 2048, 4096, 8192, 16384};
inline constexpr double kFa3CausalTflops[6] = {292, 423, 521, 579, 602, 616};
inline constexpr double kH100Bf16Tflops = 989;

// Achieved share of the BF16 peak of causal prefill attention over `length` tokens: linear in
// log2(length) between the measured points, the end points' beyond them.
inline double fa3_share(double length) {
  if (length <= kFa3Lengths[0]) return kFa3CausalTflops[0] / kH100Bf16Tflops;
  for (std::size_t i = 1; i < std::size(kFa3Lengths); ++i)
    if (length <= kFa3Lengths[i]) {
      const double x = std::log2(length / kFa3Lengths[i - 1]);  // the points double
      return (kFa3CausalTflops[i - 1] + x * (kFa3CausalTflops[i] - kFa3CausalTflops[i - 1])) / kH100Bf16Tflops;
    }
  return kFa3CausalTflops[std::size(kFa3Lengths) - 1] / kH100Bf16Tflops;
}

// Bytes the kernels between the GEMMs and attention move over HBM, per token and layer (BF16
// activations, FP8 GEMM inputs with one fp32 scale per 128 values): the fused residual add +
// RMSNorm before attention and before the MLP (reads x and residual, writes both: 8 * hidden),
// the FP8 quantization before each GEMM whose input is new (hidden twice, q_lora, the heads'
// values: read 2 B, write 1 B), the q_a and kv_a RMSNorms (read and write), and in prefill the
// key assembled from kv_b's output and the rope key (write and read heads x 192 values).
inline double attention_side_bytes(double hidden, double q_lora, double kv_lora, double heads, double v_head,
                                   double qk_head, bool prefill) {
  const double norms = 2 * 8.0 * hidden + 2 * 2.0 * (q_lora + kv_lora);
  const double quant = 3.0 * (2 * hidden + q_lora + heads * v_head);
  const double keys = prefill ? 2 * 2.0 * heads * qk_head : 0.0;
  return norms + quant + keys;
}

// The same per (token, expert) pair the MoE kernels handle: in prefill the permutation into the
// contiguous layout (read and write the FP8 row); SwiGLU reading the gate and up outputs (BF16)
// and writing the FP8 input of down; the weighted sum reading each expert's BF16 output.
inline double moe_side_bytes(double hidden, double inter, bool prefill) {
  const double row = hidden * (1 + 4.0 / 128);
  return (prefill ? 2 * row : 0.0) + (2 * 2.0 * inter + inter * (1 + 4.0 / 128)) + 2.0 * hidden;
}

// Kernels a DeepSeek-V3 layer launches per micro-batch (SGLang's forward): attention 13 (input
// norm, q_a/kv_a GEMM, q_a and kv_a norms, quantization, q_b GEMM, rope, cache write, attention,
// its combine or the key assembly, quantization, o_proj, post-attention norm); a dense MLP 4
// (quantization, gate/up GEMM, SwiGLU, down GEMM); a MoE layer 11 (router GEMM, top-k, the
// shared expert's 3, dispatch, gate/up, SwiGLU, down, combine, residual add).
inline constexpr int kAttentionKernels = 13, kDenseMlpKernels = 4, kMoeKernels = 11;

}  // namespace relayout::cli
