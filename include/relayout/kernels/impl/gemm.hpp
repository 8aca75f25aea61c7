// Internal: the blocked GEMM behind linear and the experts, C[m x n] (+)= A[m x k] . B^T (+ bias),
// with B given as packed weights. Not public API.
//
// Layout: B is packed once into panels of NR output features, k-major, so the NR outputs of one k
// are contiguous; A's rows are read where they are, through an optional row index (which is how the
// experts read their tokens without a gather). One work item computes one MR x NR register tile
// over the full k: per k it loads NR/L vectors of B, broadcasts MR values of A (one from each of its
// MR rows) and issues MR*NR/L FMAs. Work items are ordered panel-major so a B panel stays in L1/L2
// while every row block streams past it.
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

// One MR x NR tile of C from A's rows and packed B (k x NR); MR_: the tile height, or fewer rows for
// a short A. A is read where its rows are (row r at a + row(r) * lda, through `rows` when non-null):
// MR row pointers a tile, one broadcast from each per k.
//
// A used to be packed first (per call, into k-major blocks of MR rows, gathering through the index).
// Reading the rows in place measured faster on the AMD EPYC (Zen 4): the experts' GEMMs of the demo
// layer at 1024 rows, top-4 of 16, hidden 512, 103 -> 107 GFLOP/s at intermediate 256 and 98 -> 103
// at its moe_tp half (bench_kernels BM_ExpertFfn), the dense shapes of BM_Linear even or 1-2% up;
// the packing's copy of every A row was all the difference (the same products in the same order:
// the same bits).
template <class ExecSpace, class T, int MR_ = GemmTile<ExecSpace, T>::mr>
struct GemmTiles {
  using Tile = GemmTile<ExecSpace, T>;
  static constexpr int MR = MR_, NR = Tile::nr, NV = Tile::nv, L = Tile::lanes;
  using V = typename Vec<T, L>::type;

  const T* a;         // A's first row
  std::int64_t lda;   // scalars between A's rows
  const int* rows;    // A's rows through this index, or null
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
    const T* b = b_packed + panel * k * NR;

    V acc[MR][NV];
    for (int i = 0; i < MR; ++i)
      for (int v = 0; v < NV; ++v) acc[i][v] = V{};
    // Rows past m (a partial block) read row m - 1 again; their sums are not stored.
    const T* ar[MR];
    for (int i = 0; i < MR; ++i) {
      const std::int64_t r = block * MR + i < m ? block * MR + i : std::int64_t(m) - 1;
      ar[i] = a + (rows ? std::int64_t(rows[r]) : r) * lda;
    }
    for (int kk = 0; kk < k; ++kk) {
      V bv[NV];
      for (int v = 0; v < NV; ++v) bv[v] = load<V>(b + kk * NR + v * L);
      for (int i = 0; i < MR; ++i) {
        const T ai = ar[i][kk];
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

// One work item per MR x NR tile (k >= 1).
template <int MR, class ExecSpace, class T>
void gemm_packed_rows(const ExecSpace& exec, const T* a, std::int64_t lda, const int* rows, int m, int k,
                      const T* b_packed, int n, T* c, std::int64_t ldc, const T* bias, bool accumulate) {
  using Tile = GemmTile<ExecSpace, T>;
  const std::int64_t row_blocks = ceil_div(m, MR), panels = ceil_div(n, Tile::nr);
  Kokkos::parallel_for("relayout::kernels::gemm", Kokkos::RangePolicy<ExecSpace>(exec, 0, panels * row_blocks),
                       GemmTiles<ExecSpace, T, MR>{a, lda, rows, b_packed, c, ldc, bias, m, n, k, row_blocks, accumulate});
}

// C[m x n] (+)= rows of A . B^T (+ bias), B packed (A's rows contiguous, lda scalars apart).
template <class ExecSpace, class T>
void gemm_packed(const ExecSpace& exec, const T* a, std::int64_t lda, const int* rows, int m, int k,
                 const T* b_packed, int n, T* c, std::int64_t ldc, const T* bias, bool accumulate) {
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
      case 1: return gemm_packed_rows<1>(exec, a, lda, rows, m, k, b_packed, n, c, ldc, bias, accumulate);
      case 2: return gemm_packed_rows<2>(exec, a, lda, rows, m, k, b_packed, n, c, ldc, bias, accumulate);
      case 3: return gemm_packed_rows<3>(exec, a, lda, rows, m, k, b_packed, n, c, ldc, bias, accumulate);
      case 4: return gemm_packed_rows<4>(exec, a, lda, rows, m, k, b_packed, n, c, ldc, bias, accumulate);
      default: break;
    }
  }
  gemm_packed_rows<Tile::mr>(exec, a, lda, rows, m, k, b_packed, n, c, ldc, bias, accumulate);
}

// The A workspace of a GEMM of T weights: the vendor GEMM gathers indexed or strided rows into it.
template <class ExecSpace, class T>
std::int64_t gemm_a_pack_size(std::int64_t m, std::int64_t k) {
  using Tile = GemmTile<ExecSpace, T>;
  return ceil_div(m, Tile::mr) * Tile::mr * k;
}

}  // namespace relayout::kernels::impl
