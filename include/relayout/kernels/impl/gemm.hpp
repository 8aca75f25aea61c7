// Internal: the blocked GEMM behind linear and the experts, C[m x n] (+)= A[m x k] . B^T (+ bias),
// with B given as packed weights. Not public API.
//
// Layout (BLIS-like): B is packed once into panels of NR output features, k-major, so the NR
// outputs of one k are contiguous; A is packed per call into blocks of MR rows, k-major (the
// packing also gathers rows through an optional row index, which is how the experts read their
// tokens without a separate gather). One work item computes one MR x NR register tile over the full
// k: per k it loads NR/L vectors of B, broadcasts MR values of A and issues MR*NR/L FMAs. Work
// items are ordered panel-major so a B panel stays in L1/L2 while every row block streams past it.
#pragma once

#include <Kokkos_Core.hpp>
#include <cstddef>
#include <cstdint>

#include "relayout/kernels/impl/simd.hpp"

namespace relayout::kernels::impl {

// Register tile of the GEMM work item on ExecSpace for scalar T: mr rows x (nv vectors of lanes).
template <class ExecSpace, class T>
struct GemmTile {
  static constexpr int lanes = lanes_v<ExecSpace, T>;
  static constexpr int vector_bytes = lanes * int(sizeof(T));
  static constexpr int nv = lanes == 1 ? 8 : (vector_bytes == 16 ? 4 : 2);
  static constexpr int nr = nv * lanes;
  static constexpr int mr = lanes == 1 ? 4 : (vector_bytes == 16 ? 3 : (vector_bytes == 32 ? 6 : 8));
  static constexpr int k_step = 1;  // packed B holds k in groups of k_step (bf16: pairs)
};

inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// Packs A rows (through `rows` when non-null) into [m/MR blocks][k][MR], zero-padding the last block.
// One work item packs KS columns of one block: on the host with MR a power of two, KS is the
// vector width and a whole item is MR vector loads, one MR x KS transpose (transpose_rows) and MR
// vector stores. Element by element (2 x MR scalar moves per column) the packing took about a
// tenth of the GEMM's time in the demo layer; with the transpose a 512 x 512 GEMM of 64-1024 rows
// went from 104-107 to 111-113 GFLOP/s on AVX-512 (Zen 4). A partial block or the last columns
// go element by element.
template <class ExecSpace, class T, int MR = GemmTile<ExecSpace, T>::mr>
struct PackA {
  static constexpr int L = lanes_v<ExecSpace, T>;
  static constexpr int KS = (L > 1 && MR >= 2 && (MR & (MR - 1)) == 0) ? L : 1;
  using V = typename Vec<T, L>::type;
  const T* a;
  std::int64_t lda;
  const int* rows;
  int m, k;
  T* out;

  static std::int64_t items(std::int64_t row_blocks, int k) { return row_blocks * ceil_div(k, KS); }

  KOKKOS_INLINE_FUNCTION std::int64_t row(std::int64_t r) const { return rows ? std::int64_t(rows[r]) : r; }

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t idx) const {
    const std::int64_t chunks = (k + KS - 1) / KS;
    const std::int64_t block = idx / chunks;
    const int k0 = static_cast<int>(idx % chunks) * KS;
    T* dst = out + (block * k + k0) * MR;
    if constexpr (KS > 1) {
      if ((block + 1) * MR <= m && k0 + KS <= k) {
        V v[MR];
        for (int i = 0; i < MR; ++i) v[i] = load<V>(a + row(block * MR + i) * lda + k0);
        transpose_rows<MR, L>(v);
        for (int i = 0; i < MR; ++i) store<V>(dst + i * L, v[i]);
        return;
      }
    }
    const int k1 = k0 + KS < k ? k0 + KS : k;
    for (int kk = k0; kk < k1; ++kk)
      for (int i = 0; i < MR; ++i) {
        const std::int64_t r = block * MR + i;
        dst[(kk - k0) * MR + i] = r < m ? a[row(r) * lda + kk] : T(0);
      }
  }
};

// One MR x NR tile of C from packed A (k x MR) and packed B (k x NR); MR_: the tile height, or fewer
// rows for a short A.
template <class ExecSpace, class T, int MR_ = GemmTile<ExecSpace, T>::mr>
struct GemmPacked {
  using Tile = GemmTile<ExecSpace, T>;
  static constexpr int MR = MR_, NR = Tile::nr, NV = Tile::nv, L = Tile::lanes;
  using V = typename Vec<T, L>::type;

  const T* a_packed;  // [row blocks][k][MR]
  const T* b_packed;  // [panels][k][NR]
  T* c;
  std::int64_t ldc;
  const T* bias;  // n entries or null
  int m, n, k;
  std::int64_t row_blocks;
  bool accumulate;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t idx) const {
    const std::int64_t panel = idx / row_blocks;
    const std::int64_t block = idx % row_blocks;
    const T* a = a_packed + block * k * MR;
    const T* b = b_packed + panel * k * NR;

    V acc[MR][NV];
    for (int i = 0; i < MR; ++i)
      for (int v = 0; v < NV; ++v) acc[i][v] = V{};
    for (int kk = 0; kk < k; ++kk) {
      V bv[NV];
      for (int v = 0; v < NV; ++v) bv[v] = load<V>(b + kk * NR + v * L);
      for (int i = 0; i < MR; ++i) {
        const T ai = a[kk * MR + i];
        for (int v = 0; v < NV; ++v) acc[i][v] += ai * bv[v];
      }
    }

    const std::int64_t row0 = block * MR;
    const std::int64_t col0 = panel * NR;
    T* c0 = c + row0 * ldc + col0;
    const int m_valid = m - row0 < MR ? int(m - row0) : MR;
    const int n_valid = n - col0 < NR ? int(n - col0) : NR;
    if (m_valid == MR && n_valid == NR) {
      for (int i = 0; i < MR; ++i)
        for (int v = 0; v < NV; ++v) {
          V r = acc[i][v];
          if (bias) r += load<V>(bias + col0 + v * L);
          if (accumulate) r += load<V>(c0 + i * ldc + v * L);
          store<V>(c0 + i * ldc + v * L, r);
        }
    } else {
      for (int i = 0; i < m_valid; ++i)
        for (int v = 0; v < NV; ++v)
          for (int l = 0; l < L; ++l) {
            const int j = v * L + l;
            if (j >= n_valid) break;
            T r = lane<L>(acc[i][v], l);
            if (bias) r += bias[col0 + j];
            T& dst = c0[i * ldc + j];
            dst = accumulate ? T(dst + r) : r;
          }
    }
  }
};

// Packs A in blocks of MR rows and runs one work item per MR x NR tile (k >= 1).
template <int MR, class ExecSpace, class T>
void gemm_packed_rows(const ExecSpace& exec, const T* a, std::int64_t lda, const int* rows, int m, int k,
                      const T* b_packed, int n, T* c, std::int64_t ldc, const T* bias, bool accumulate, T* a_pack) {
  using Tile = GemmTile<ExecSpace, T>;
  const std::int64_t row_blocks = ceil_div(m, MR), panels = ceil_div(n, Tile::nr);
  using Pack = PackA<ExecSpace, T, MR>;
  Kokkos::parallel_for("relayout::kernels::pack_a", Kokkos::RangePolicy<ExecSpace>(exec, 0, Pack::items(row_blocks, k)),
                       Pack{a, lda, rows, m, k, a_pack});
  Kokkos::parallel_for("relayout::kernels::gemm", Kokkos::RangePolicy<ExecSpace>(exec, 0, panels * row_blocks),
                       GemmPacked<ExecSpace, T, MR>{a_pack, b_packed, c, ldc, bias, m, n, k, row_blocks, accumulate});
}

// C[m x n] (+)= rows of A . B^T (+ bias). a_pack must hold ceil(m/MR)*MR*k scalars.
template <class ExecSpace, class T>
void gemm_packed(const ExecSpace& exec, const T* a, std::int64_t lda, const int* rows, int m, int k,
                 const T* b_packed, int n, T* c, std::int64_t ldc, const T* bias, bool accumulate,
                 T* a_pack) {
  using Tile = GemmTile<ExecSpace, T>;
  if (m == 0 || n == 0) return;
  if (k == 0) {
    // No reduction: C = bias (or unchanged when accumulating), through a tile with nothing to add.
    Kokkos::parallel_for(
        "relayout::kernels::gemm_k0", Kokkos::RangePolicy<ExecSpace>(exec, 0, std::int64_t(m) * n),
        KOKKOS_LAMBDA(const std::int64_t idx) {
          const std::int64_t i = idx / n, j = idx % n;
          const T add = bias ? bias[j] : T(0);
          c[i * ldc + j] = accumulate ? T(c[i * ldc + j] + add) : add;
        });
    return;
  }
  // A short A (a decode step's rows for one expert) runs a tile of its own height: the FMAs of
  // rows that do not exist would cost as much as those of real ones.
  if constexpr (Tile::mr > 4) {
    switch (m) {
      case 1: return gemm_packed_rows<1>(exec, a, lda, rows, m, k, b_packed, n, c, ldc, bias, accumulate, a_pack);
      case 2: return gemm_packed_rows<2>(exec, a, lda, rows, m, k, b_packed, n, c, ldc, bias, accumulate, a_pack);
      case 3: return gemm_packed_rows<3>(exec, a, lda, rows, m, k, b_packed, n, c, ldc, bias, accumulate, a_pack);
      case 4: return gemm_packed_rows<4>(exec, a, lda, rows, m, k, b_packed, n, c, ldc, bias, accumulate, a_pack);
      default: break;
    }
  }
  gemm_packed_rows<Tile::mr>(exec, a, lda, rows, m, k, b_packed, n, c, ldc, bias, accumulate, a_pack);
}

template <class ExecSpace, class T>
std::int64_t gemm_a_pack_size(std::int64_t m, std::int64_t k) {
  using Tile = GemmTile<ExecSpace, T>;
  return ceil_div(m, Tile::mr) * Tile::mr * k;
}

}  // namespace relayout::kernels::impl
