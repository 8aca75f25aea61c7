// Deterministic model values from a counter-based generator keyed by (seed, tensor, element index).
// A rank materialises only its shard and the single-rank reference the whole tensor, and both read
// identical values for the same element: no weights are stored, downloaded or broadcast.
#pragma once

#include <Kokkos_Core.hpp>
#include <cstdint>

namespace relayout::model {

// SplitMix64 finaliser: a bijective 64-bit mix, good enough to decorrelate neighbouring counters.
KOKKOS_INLINE_FUNCTION constexpr std::uint64_t mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Which tensor a value belongs to. Expert tensors also carry the expert index in their key.
enum class Tensor : std::uint32_t {
  embedding = 1,  // input hidden rows, keyed by (request id, position)
  attn_norm,
  wq_a,
  q_norm,
  wq_b,
  wkv,
  kv_norm,
  wo_b,
  ffn_norm,
  router,
  expert_w1,  // gate
  expert_w3,  // up
  expert_w2,  // down
  shared_w1,
  shared_w3,
  shared_w2,
};

struct TensorKey {
  std::uint64_t value;
};

KOKKOS_INLINE_FUNCTION constexpr TensorKey tensor_key(std::uint64_t seed, int layer, Tensor t,
                                                      int expert = 0) {
  return {mix64(seed ^ mix64((std::uint64_t(layer) << 40) ^ (std::uint64_t(t) << 32) ^
                             std::uint64_t(std::uint32_t(expert))))};
}

// Uniform in [-scale, scale) from the top 24 bits, exact in float, for element `index` of a tensor.
KOKKOS_INLINE_FUNCTION constexpr float counter_uniform(TensorKey key, std::uint64_t index, float scale) {
  const std::uint64_t bits = mix64(key.value ^ mix64(index)) >> 40;  // 24 bits
  return scale * (static_cast<float>(bits) * (2.0f / 16777216.0f) - 1.0f);
}

// Norm weights sit around 1 so activations keep their scale.
KOKKOS_INLINE_FUNCTION constexpr float counter_norm_weight(TensorKey key, std::uint64_t index) {
  return 1.0f + counter_uniform(key, index, 0.25f);
}

// Fills `out` (rows x cols) with the block of a logical (.. x full_cols) tensor that starts at
// (row0, col0): out(i, j) = value(row0 + i, col0 + j). Runs on out's execution space.
template <class View>
void fill_block(const View& out, TensorKey key, std::int64_t full_cols, std::int64_t row0,
                std::int64_t col0, float scale) {
  using Exec = typename View::execution_space;
  const std::int64_t cols = static_cast<std::int64_t>(out.extent(1));
  Kokkos::parallel_for(
      "relayout::fill_block",
      Kokkos::RangePolicy<Exec>(0, static_cast<std::int64_t>(out.extent(0)) * cols),
      KOKKOS_LAMBDA(const std::int64_t n) {
        const std::int64_t i = n / cols, j = n % cols;
        out(i, j) = static_cast<typename View::value_type>(
            counter_uniform(key, static_cast<std::uint64_t>((row0 + i) * full_cols + col0 + j), scale));
      });
}

// Fills a vector of norm weights (around 1).
template <class View>
void fill_norm(const View& out, TensorKey key) {
  using Exec = typename View::execution_space;
  Kokkos::parallel_for(
      "relayout::fill_norm", Kokkos::RangePolicy<Exec>(0, out.extent(0)),
      KOKKOS_LAMBDA(const std::int64_t i) {
        out(i) = static_cast<typename View::value_type>(
            counter_norm_weight(key, static_cast<std::uint64_t>(i)));
      });
}

}  // namespace relayout::model
