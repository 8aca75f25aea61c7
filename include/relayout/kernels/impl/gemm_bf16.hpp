// Internal: the GEMM of gemm.hpp for bf16 weights with fp32 accumulation, on bf16 rows (C and
// bias bf16, rounded once per output) or fp32 rows (C and bias fp32). Weights are packed as
// k-pairs, [panels][k/2][NR] 32-bit words each holding (W[j][k], W[j][k+1]), the layout vdpbf16ps
// reads (and AMX's B tiles). Three micro-kernels read it, each compiled by target attribute
// whatever the build's flags and chosen at run time (bf16_kernel): AMX-BF16 (tdpbf16ps on tiles of
// 16 rows x 32 k, after Linux grants the tile state), AVX512-BF16 (vdpbf16ps on bf16 pairs of A)
// and a portable one that reads the bf16 pairs
// straight into fp32 lanes (a shift and a mask per 2 x L weights, no converted copy) and uses fp32
// FMAs: half the weight bytes of fp32. fp32 rows take the portable kernel as they are (their
// products with bf16 weights are exact in fp32), unless the weights say to round them to bf16
// (PackedWeights::round_rows: bf16 activations into every GEMM, as a bf16 model runs): then they
// are rounded while A is packed and take vdpbf16ps where the CPU has it.
// Row counts below the tile height (decode) run a tile of that many rows, so few rows cost few FMAs.
// Not public API.
#pragma once

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "relayout/comm/scalar.hpp"
#include "relayout/kernels/error.hpp"
#include "relayout/kernels/impl/gemm.hpp"
#include "relayout/kernels/isa.hpp"

#if defined(RELAYOUT_KERNELS_HOST_SIMD) && defined(RELAYOUT_ISA_X86) && \
    (defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 10))
#include <immintrin.h>
#define RELAYOUT_KERNELS_DPBF16 1
// AMX tiles need Linux's permission (arch_prctl) and an assembler that knows the instructions
// (binutils >= 2.36; GCC >= 11 and Clang >= 12 ship the intrinsics).
#if defined(__linux__) && defined(__x86_64__) && (defined(__clang__) ? __clang_major__ >= 12 : __GNUC__ >= 11)
#include <sys/syscall.h>
#include <unistd.h>
#define RELAYOUT_KERNELS_AMX 1
#endif
#endif

namespace relayout::kernels::impl {

// bf16 tiles are the fp32 tiles (fp32 accumulators), over k-pairs.
template <class ExecSpace>
struct GemmTile<ExecSpace, relayout::bf16> : GemmTile<ExecSpace, float> {
  static constexpr int k_step = 2;
};

// Which micro-kernel a bf16 GEMM on ExecSpace uses.
enum class Bf16Kernel : std::uint8_t { widen_fp32, avx512_bf16, amx_bf16 };

// Environment variable forcing the bf16 GEMM's micro-kernel: "amx" or "dpbf16" (each where the
// CPU has it; else the rule below picks among the rest) or "widen"; unset: the rule of bf16_kernel.
inline constexpr const char* kBf16KernelEnv = "RELAYOUT_BF16_KERNEL";

// RELAYOUT_BF16_KERNEL as set: nullptr when unset; any other text than the three names (an empty
// one included) throws KernelError naming the variable and the values it takes, so a misspelt
// override is refused rather than silently left to the rule.
inline const char* bf16_kernel_setting() {
  const char* v = std::getenv(kBf16KernelEnv);
  if (!v) return nullptr;
  if (std::strcmp(v, "amx") == 0 || std::strcmp(v, "dpbf16") == 0 || std::strcmp(v, "widen") == 0) return v;
  throw KernelError(kBf16KernelEnv, std::string(kBf16KernelEnv) + (*v ? "=" + std::string(v) : std::string(" is set but empty")) +
                                        ": expected amx, dpbf16 or widen (unset: the kernel is chosen from the CPU)");
}

#if defined(RELAYOUT_KERNELS_AMX)
// Whether this process may use AMX tile data: Linux grants XTILEDATA per process on request
// (ARCH_REQ_XCOMP_PERM); asked once, false where the kernel refuses (or predates the call).
inline bool amx_permitted() {
  static const bool granted = [] {
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return granted;
}
#endif

// Whether the CPU (as RELAYOUT_ISA_HIDE leaves it) and the OS let this process run the AMX kernel.
inline bool amx_bf16_runnable() {
#if defined(RELAYOUT_KERNELS_AMX)
  return isa::cpu_has("amx_tile") && isa::cpu_has("amx_bf16") && amx_permitted();
#else
  return false;
#endif
}

// On a host ExecSpace, with the instructions in the CPU (honouring RELAYOUT_ISA_HIDE, which is how
// tests take the other branches): AMX-BF16 tiles where the CPU has them and Linux grants their
// state; else AVX512-BF16 where it pays: on AMD (Zen 4, measured 1.8-1.96x the fp32 GEMM from 16
// rows), not on Intel parts without AMX, where vdpbf16ps ran at 0.73-0.87x the fp32 GEMM and the
// widening kernel at 0.85-1.48x (docs/benchmarks.md, "bf16 weights"); else the widening kernel.
// RELAYOUT_BF16_KERNEL overrides the rule.
template <class ExecSpace>
Bf16Kernel bf16_kernel() {
  [[maybe_unused]] const char* force = bf16_kernel_setting();  // checked on every build and space
#if defined(RELAYOUT_KERNELS_DPBF16)
  if (is_host_space_v<ExecSpace> && GemmTile<ExecSpace, float>::nr % 16 == 0) {
    if (force && std::strcmp(force, "widen") == 0) return Bf16Kernel::widen_fp32;
    const bool dp = isa::cpu_has("avx512f") && isa::cpu_has("avx512_bf16");
    if (force && std::strcmp(force, "dpbf16") == 0 && dp) return Bf16Kernel::avx512_bf16;
    if (amx_bf16_runnable()) return Bf16Kernel::amx_bf16;
    static const bool pays = std::strcmp(isa::cpu_vendor(), "AuthenticAMD") == 0;
    if (dp && pays) return Bf16Kernel::avx512_bf16;
  }
#endif
  return Bf16Kernel::widen_fp32;
}

KOKKOS_FORCEINLINE_FUNCTION float bits_to_float(std::uint32_t u) {
  float f;
  __builtin_memcpy(&f, &u, sizeof f);
  return f;
}

// An element of A as the bf16 GEMM multiplies it: bf16 rows as they are; fp32 rows as they are, or
// rounded to bf16 (nearest even) when the weights ask for it (PackedWeights::round_rows).
template <class TA>
KOKKOS_FORCEINLINE_FUNCTION float a_value(TA v, bool round) {
  if constexpr (std::is_same_v<TA, float>)
    return round ? float(relayout::bf16(v)) : v;
  else
    return float(v);
}
template <class TA>
KOKKOS_FORCEINLINE_FUNCTION std::uint32_t a_bits(TA v) {
  if constexpr (std::is_same_v<TA, float>)
    return relayout::bf16(v).bits;
  else
    return v.bits;
}

// Packs A rows (bf16 or fp32) for the widening kernel: [blocks][kp][MR] fp32, kp = k rounded up to
// even, zero-padded (rows past m, and the k of an odd k); `round`: fp32 rows rounded to bf16.
template <class ExecSpace, class TA, int MR = GemmTile<ExecSpace, float>::mr>
struct PackABf16Wide {
  const TA* a;
  std::int64_t lda;
  const int* rows;
  int m, k, kp;
  float* out;
  bool round = false;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t idx) const {
    const std::int64_t block = idx / kp;
    const int kk = static_cast<int>(idx % kp);
    float* dst = out + (block * kp + kk) * MR;
    for (int i = 0; i < MR; ++i) {
      const std::int64_t r = block * MR + i;
      dst[i] = r < m && kk < k ? a_value(a[(rows ? std::int64_t(rows[r]) : r) * lda + kk], round) : 0.0f;
    }
  }
};

// ... and for vdpbf16ps: [blocks][kp/2][MR] words of (A[r][2q], A[r][2q+1]), fp32 rows rounded to
// bf16 on the way.
template <class ExecSpace, class TA = relayout::bf16>
struct PackABf16Pairs {
  static constexpr int MR = GemmTile<ExecSpace, float>::mr;
  const TA* a;
  std::int64_t lda;
  const int* rows;
  int m, k, kp;
  std::uint32_t* out;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t idx) const {
    const int pairs = kp / 2;
    const std::int64_t block = idx / pairs;
    const int q = static_cast<int>(idx % pairs);
    std::uint32_t* dst = out + (block * pairs + q) * MR;
    for (int i = 0; i < MR; ++i) {
      const std::int64_t r = block * MR + i;
      std::uint32_t lo = 0, hi = 0;
      if (r < m) {
        const TA* row = a + (rows ? std::int64_t(rows[r]) : r) * lda;
        lo = a_bits(row[2 * q]);
        hi = 2 * q + 1 < k ? a_bits(row[2 * q + 1]) : 0u;
      }
      dst[i] = lo | (hi << 16);
    }
  }
};

// Writes an MR x NR fp32 tile into C (+ bias, + C when accumulating): bf16 C rounds once, fp32 C
// takes the sums as they are. L > 1: the full rows of a bf16 C in vectors of L lanes (the same
// sums in the same order, rounded by store_bf16).
template <int L = 1, class TC>
KOKKOS_INLINE_FUNCTION void store_bf16_tile(const float* acc, int MR, int NR, TC* c0, std::int64_t ldc,
                                            const TC* bias, int col0, int m_valid, int n_valid,
                                            bool accumulate) {
  if constexpr (L > 1 && std::is_same_v<TC, relayout::bf16>) {
    if (n_valid >= NR && NR % L == 0) {
      using V = typename Vec<float, L>::type;
      for (int i = 0; i < m_valid && i < MR; ++i)
        for (int j = 0; j < NR; j += L) {
          V r = load<V>(acc + i * NR + j);
          if (bias) r += load_key<V>(bias + col0 + j);
          TC* dst = c0 + i * ldc + j;
          if (accumulate) r += load_key<V>(dst);
          store_bf16<L>(dst, r);
        }
      return;
    }
  }
  for (int i = 0; i < m_valid && i < MR; ++i)
    for (int j = 0; j < n_valid && j < NR; ++j) {
      float r = acc[i * NR + j];
      if (bias) r += float(bias[col0 + j]);
      TC& dst = c0[i * ldc + j];
      if (accumulate) r += float(dst);
      dst = TC(r);
    }
}

// The widening micro-kernel: per k-pair, NR/L words of B widen to 2 x NV fp32 vectors (the low
// half shifted left by 16, the high half masked), each feeding MR x 2 FMAs. MR_ rows per tile (the
// tile height, or fewer for a short A).
template <class ExecSpace, class TC, int MR_ = GemmTile<ExecSpace, float>::mr>
struct GemmBf16Wide {
  using Tile = GemmTile<ExecSpace, float>;
  static constexpr int MR = MR_, NR = Tile::nr, NV = Tile::nv, L = Tile::lanes;
  using V = typename Vec<float, L>::type;
  using U = typename Vec<std::uint32_t, L>::type;
  const float* a_packed;         // [row blocks][kp][MR]
  const std::uint32_t* b_packed;  // [panels][kp/2][NR]
  TC* c;
  std::int64_t ldc;
  const TC* bias;
  int m, n, kp;
  std::int64_t row_blocks;
  bool accumulate;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t idx) const {
    const std::int64_t panel = idx / row_blocks, block = idx % row_blocks;
    const float* a = a_packed + block * kp * MR;
    const std::uint32_t* b = b_packed + panel * (kp / 2) * NR;
    V acc[MR][NV];
    for (int i = 0; i < MR; ++i)
      for (int v = 0; v < NV; ++v) acc[i][v] = V{};
    for (int q = 0; q < kp / 2; ++q) {
      V lo[NV], hi[NV];
      for (int v = 0; v < NV; ++v) {
        const U w = load<U>(b + q * NR + v * L);
        const U wl = w << 16, wh = w & 0xffff0000u;
        __builtin_memcpy(&lo[v], &wl, sizeof(V));
        __builtin_memcpy(&hi[v], &wh, sizeof(V));
      }
      for (int i = 0; i < MR; ++i) {
        const float a0 = a[(2 * q) * MR + i], a1 = a[(2 * q + 1) * MR + i];
        for (int v = 0; v < NV; ++v) acc[i][v] += a0 * lo[v] + a1 * hi[v];
      }
    }
    float tile[MR * NR];
    for (int i = 0; i < MR; ++i)
      for (int v = 0; v < NV; ++v)
        for (int l = 0; l < L; ++l) tile[i * NR + v * L + l] = lane<L>(acc[i][v], l);
    const std::int64_t row0 = block * MR, col0 = panel * NR;
    store_bf16_tile<Tile::lanes>(tile, MR, NR, c + row0 * ldc + col0, ldc, bias, int(col0), int(m - row0),
                                 int(n - col0), accumulate);
  }
};

#if defined(RELAYOUT_KERNELS_DPBF16)
// One MR x NR tile with vdpbf16ps: NR/16 accumulators per row, A's pair broadcast. Compiled for
// AVX512-BF16 by attribute, so a build without those flags has it too; bf16_kernel() decides.
template <int MR, int NR>
__attribute__((target("avx512f,avx512bf16"))) void dpbf16_tile(const std::uint32_t* a, const std::uint32_t* b,
                                                                int pairs, float* out) {
  constexpr int NZ = NR / 16;
  __m512 acc[MR][NZ];
  for (int i = 0; i < MR; ++i)
    for (int z = 0; z < NZ; ++z) acc[i][z] = _mm512_setzero_ps();
  for (int q = 0; q < pairs; ++q) {
    __m512i bz[NZ];
    for (int z = 0; z < NZ; ++z) bz[z] = _mm512_loadu_si512(b + q * NR + z * 16);
    for (int i = 0; i < MR; ++i) {
      const __m512i ai = _mm512_set1_epi32(int(a[q * MR + i]));
      for (int z = 0; z < NZ; ++z) acc[i][z] = _mm512_dpbf16_ps(acc[i][z], (__m512bh)ai, (__m512bh)bz[z]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int z = 0; z < NZ; ++z) _mm512_storeu_ps(out + i * NR + z * 16, acc[i][z]);
}

template <class ExecSpace, class TC = relayout::bf16>
struct GemmBf16Dp {
  using Tile = GemmTile<ExecSpace, float>;
  static constexpr int MR = Tile::mr, NR = Tile::nr;
  const std::uint32_t* a_packed;  // [row blocks][kp/2][MR]
  const std::uint32_t* b_packed;  // [panels][kp/2][NR]
  TC* c;
  std::int64_t ldc;
  const TC* bias;
  int m, n, kp;
  std::int64_t row_blocks;
  bool accumulate;

  void operator()(const std::int64_t idx) const {
    const std::int64_t panel = idx / row_blocks, block = idx % row_blocks;
    const int pairs = kp / 2;
    float tile[MR * NR];
    dpbf16_tile<MR, NR>(a_packed + block * pairs * MR, b_packed + panel * pairs * NR, pairs, tile);
    const std::int64_t row0 = block * MR, col0 = panel * NR;
    store_bf16_tile<Tile::lanes>(tile, MR, NR, c + row0 * ldc + col0, ldc, bias, int(col0), int(m - row0),
                                 int(n - col0), accumulate);
  }
};
#endif

#if defined(RELAYOUT_KERNELS_AMX)
// AMX: A is packed as bf16 rows of kpad = k rounded up to 32, in blocks of kAmxRows rows
// (zero-padded); B's k-pairs panels are already the layout of a B tile (16 pairs x 16 columns, a
// row stride of NR words). A block of MT x 16 rows by one NR panel keeps MT x NR/16 fp32 tiles of
// C in tile registers across k, 32 k per step; the last step's pairs past k/2 come from a
// zero-padded copy, so nothing beyond the panel is read.
inline constexpr int kAmxRows = 32;

template <class ExecSpace, class TA>
struct PackABf16Amx {
  const TA* a;
  std::int64_t lda;
  const int* rows;
  int m, k, kpad;
  std::uint16_t* out;  // [ceil(m / kAmxRows) * kAmxRows][kpad]
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t r) const {
    std::uint16_t* dst = out + r * kpad;
    if (r >= m) {
      for (int kk = 0; kk < kpad; ++kk) dst[kk] = 0;
      return;
    }
    const TA* row = a + (rows ? std::int64_t(rows[r]) : r) * lda;
    for (int kk = 0; kk < k; ++kk) dst[kk] = std::uint16_t(a_bits(row[kk]));
    for (int kk = k; kk < kpad; ++kk) dst[kk] = 0;
  }
};

struct alignas(64) AmxTileConfig {
  std::uint8_t palette = 1, start_row = 0, reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

// C tiles 0-3 (t * 2 + z), A tiles 4-5, B tiles 6-7; MT A tiles of 16 rows, NZ B tiles of 16
// columns. Tile numbers are immediates, so each (t, z) is spelled out.
template <int MT, int NZ>
__attribute__((target("amx-tile,amx-bf16"))) void amx_tile(const std::uint16_t* a, std::int64_t kpad,
                                                             const std::uint32_t* b, int pairs, float* out) {
  static_assert(MT >= 1 && MT <= 2 && NZ >= 1 && NZ <= 2, "relayout::kernels: AMX block of 1-2 x 1-2 tiles");
  constexpr int NR = NZ * 16;
  AmxTileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
  _tile_zero(0);
  if constexpr (NZ > 1) _tile_zero(1);
  if constexpr (MT > 1) _tile_zero(2);
  if constexpr (MT > 1 && NZ > 1) _tile_zero(3);
  alignas(64) std::uint32_t tail[16 * NR];
  const long sa = long(kpad * 2), sb = long(NR * 4);
  for (int q0 = 0; q0 < pairs; q0 += 16) {
    const std::uint32_t* bq = b + std::int64_t(q0) * NR;
    if (pairs - q0 < 16) {
      std::memset(tail, 0, sizeof tail);
      std::memcpy(tail, bq, sizeof(std::uint32_t) * std::size_t(pairs - q0) * NR);
      bq = tail;
    }
    const std::uint16_t* aq = a + 2 * q0;
    _tile_loadd(4, aq, sa);
    if constexpr (MT > 1) _tile_loadd(5, aq + 16 * kpad, sa);
    _tile_loadd(6, bq, sb);
    if constexpr (NZ > 1) _tile_loadd(7, bq + 16, sb);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NZ > 1) _tile_dpbf16ps(1, 4, 7);
    if constexpr (MT > 1) _tile_dpbf16ps(2, 5, 6);
    if constexpr (MT > 1 && NZ > 1) _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, out, sb);
  if constexpr (NZ > 1) _tile_stored(1, out + 16, sb);
  if constexpr (MT > 1) _tile_stored(2, out + 16 * NR, sb);
  if constexpr (MT > 1 && NZ > 1) _tile_stored(3, out + 16 * NR + 16, sb);
  _tile_release();
}

template <class ExecSpace, class TC, int MT>
struct GemmBf16Amx {
  using Tile = GemmTile<ExecSpace, float>;
  static constexpr int NR = Tile::nr, NZ = NR / 16, MR = MT * 16;
  const std::uint16_t* a_packed;  // [row blocks of kAmxRows][kpad]
  const std::uint32_t* b_packed;  // [panels][kp/2][NR]
  TC* c;
  std::int64_t ldc;
  const TC* bias;
  int m, n, kp, kpad;
  std::int64_t row_blocks;
  bool accumulate;

  void operator()(const std::int64_t idx) const {
    const std::int64_t panel = idx / row_blocks, block = idx % row_blocks;
    const int pairs = kp / 2;
    alignas(64) float tile[MR * NR];
    amx_tile<MT, NZ>(a_packed + block * MR * kpad, kpad, b_packed + panel * pairs * NR, pairs, tile);
    const std::int64_t row0 = block * MR, col0 = panel * NR;
    store_bf16_tile<Tile::lanes>(tile, MR, NR, c + row0 * ldc + col0, ldc, bias, int(col0), int(m - row0),
                                 int(n - col0), accumulate);
  }
};
#endif

// A pack buffer of the bf16 GEMM for A rows of TA holds the widened fp32 rows (k rounded to even),
// counted in TA slots: 2 per element for bf16 rows, 1 for fp32 rows.
template <class ExecSpace, class TA = relayout::bf16>
std::int64_t gemm_a_pack_size_bf16(std::int64_t m, std::int64_t k) {
  using Tile = GemmTile<ExecSpace, float>;
  static_assert(sizeof(float) % sizeof(TA) == 0, "relayout::kernels: bf16 GEMM rows are bf16 or fp32");
  const std::int64_t wide = ceil_div(m, Tile::mr) * Tile::mr * (k + (k & 1)) * std::int64_t(sizeof(float) / sizeof(TA));
#if defined(RELAYOUT_KERNELS_AMX)
  // ... or the AMX kernel's bf16 rows (blocks of kAmxRows, k rounded up to 32), the larger.
  if constexpr (is_host_space_v<ExecSpace>) {
    const std::int64_t amx = ceil_div(m, kAmxRows) * kAmxRows * ceil_div(k, 32) * 32 * 2 / std::int64_t(sizeof(TA));
    return amx > wide ? amx : wide;
  }
#endif
  return wide;
}

// The widening kernel with MR rows per tile: packs A, then one work item per MR x NR tile.
template <int MR, class ExecSpace, class TA, class TC>
void gemm_bf16_wide(const ExecSpace& exec, const TA* a, std::int64_t lda, const int* rows, int m, int k,
                    const std::uint32_t* b, int n, TC* c, std::int64_t ldc, const TC* bias, bool accumulate,
                    float* ap, bool round) {
  using Tile = GemmTile<ExecSpace, float>;
  const int kp = k + (k & 1);
  const std::int64_t row_blocks = ceil_div(m, MR), panels = ceil_div(n, Tile::nr);
  Kokkos::parallel_for("relayout::kernels::pack_a_bf16", Kokkos::RangePolicy<ExecSpace>(exec, 0, row_blocks * kp),
                       PackABf16Wide<ExecSpace, TA, MR>{a, lda, rows, m, k, kp, ap, round});
  Kokkos::parallel_for("relayout::kernels::gemm_bf16", Kokkos::RangePolicy<ExecSpace>(exec, 0, panels * row_blocks),
                       GemmBf16Wide<ExecSpace, TC, MR>{ap, b, c, ldc, bias, m, n, kp, row_blocks, accumulate});
}

// Rows below which vdpbf16ps does not pay: its tile is always MR rows high, where the widening
// kernel runs a tile of the rows there are (measured at one row: 0.96x fp32 against 1.69x).
inline constexpr int kDpbf16MinRows = 5;
// ... and below which the AMX tiles do not: at one row of 2048 x 2048 the widening kernel took
// 0.70 ms against AMX's 0.87 (a tile of 16 rows computed for one), at four 1.26 against 0.97.
inline constexpr int kAmxMinRows = 4;

// C[m x n] (+)= rows of A . B^T (+ bias) for bf16 B (packed as k-pairs), accumulated in fp32. A, C
// and bias are all bf16 (C rounded once per output) or all fp32 (TA = float: bf16 weights, fp32
// activations and outputs); bf16 A may also give fp32 C and bias (TC = float: the sums unrounded,
// e.g. router logits of bf16 rows). fp32 rows are multiplied as they are (the widening kernel: each
// product exact in fp32), or, with round_rows, rounded to bf16 first: then they take vdpbf16ps too
// where the CPU has it, and the widening kernel elsewhere multiplies the same rounded values.
// a_pack must hold gemm_a_pack_size_bf16<ExecSpace, TA>(m, k) TA slots; `kernel` picks the
// micro-kernel for bf16 (or rounded) rows of at least kDpbf16MinRows.
template <class ExecSpace, class TA, class TC = TA>
void gemm_packed_bf16(const ExecSpace& exec, const TA* a, std::int64_t lda, const int* rows, int m, int k,
                      const relayout::bf16* b_packed, int n, TC* c, std::int64_t ldc,
                      const std::type_identity_t<TC>* bias, bool accumulate, TA* a_pack,
                      Bf16Kernel kernel = bf16_kernel<ExecSpace>(),
                      bool round_rows = false) {
  static_assert(std::is_same_v<TA, relayout::bf16> || std::is_same_v<TA, float>,
                "relayout::kernels: the bf16 GEMM takes bf16 or fp32 rows");
  static_assert(std::is_same_v<TC, TA> || (std::is_same_v<TA, relayout::bf16> && std::is_same_v<TC, float>),
                "relayout::kernels: the bf16 GEMM writes C of A's scalar, or fp32 C for bf16 A");
  using Tile = GemmTile<ExecSpace, float>;
  if (m == 0 || n == 0) return;
  const auto* b = reinterpret_cast<const std::uint32_t*>(b_packed);
  const bool round = std::is_same_v<TA, float> && round_rows;
#if defined(RELAYOUT_KERNELS_DPBF16)
  if (std::is_same_v<TA, relayout::bf16> || round) {
#if defined(RELAYOUT_KERNELS_AMX)
    if (kernel == Bf16Kernel::amx_bf16 && is_host_space_v<ExecSpace> && Tile::nr % 16 == 0 && Tile::nr <= 32 &&
        m >= kAmxMinRows) {
      const int kp = k + (k & 1), kpad = int(ceil_div(k, 32) * 32);
      const std::int64_t row_blocks = ceil_div(m, kAmxRows), panels = ceil_div(n, Tile::nr);
      auto* ap = reinterpret_cast<std::uint16_t*>(a_pack);
      Kokkos::parallel_for("relayout::kernels::pack_a_bf16",
                           Kokkos::RangePolicy<ExecSpace>(exec, 0, row_blocks * kAmxRows),
                           PackABf16Amx<ExecSpace, TA>{a, lda, rows, m, k, kpad, ap});
      if (m <= 16)
        Kokkos::parallel_for("relayout::kernels::gemm_bf16", Kokkos::RangePolicy<ExecSpace>(exec, 0, panels),
                             GemmBf16Amx<ExecSpace, TC, 1>{ap, b, c, ldc, bias, m, n, kp, kpad, 1, accumulate});
      else
        Kokkos::parallel_for("relayout::kernels::gemm_bf16",
                             Kokkos::RangePolicy<ExecSpace>(exec, 0, panels * row_blocks),
                             GemmBf16Amx<ExecSpace, TC, 2>{ap, b, c, ldc, bias, m, n, kp, kpad, row_blocks, accumulate});
      return;
    }
#endif
    if (kernel == Bf16Kernel::avx512_bf16 && is_host_space_v<ExecSpace> && Tile::nr % 16 == 0 &&
        m >= kDpbf16MinRows) {
      const int kp = k + (k & 1);
      const std::int64_t row_blocks = ceil_div(m, Tile::mr), panels = ceil_div(n, Tile::nr);
      auto* ap = reinterpret_cast<std::uint32_t*>(a_pack);
      Kokkos::parallel_for("relayout::kernels::pack_a_bf16",
                           Kokkos::RangePolicy<ExecSpace>(exec, 0, row_blocks * (kp / 2)),
                           PackABf16Pairs<ExecSpace, TA>{a, lda, rows, m, k, kp, ap});
      Kokkos::parallel_for("relayout::kernels::gemm_bf16", Kokkos::RangePolicy<ExecSpace>(exec, 0, panels * row_blocks),
                           GemmBf16Dp<ExecSpace, TC>{ap, b, c, ldc, bias, m, n, kp, row_blocks, accumulate});
      return;
    }
  }
#endif
  (void)kernel;
  auto* ap = reinterpret_cast<float*>(a_pack);
  // A short A (a decode step's rows for one expert) runs a tile of its own height: the FMAs of
  // rows that do not exist would cost as much as those of real ones.
  if constexpr (Tile::mr > 4) {
    switch (m) {
      case 1: return gemm_bf16_wide<1>(exec, a, lda, rows, m, k, b, n, c, ldc, bias, accumulate, ap, round);
      case 2: return gemm_bf16_wide<2>(exec, a, lda, rows, m, k, b, n, c, ldc, bias, accumulate, ap, round);
      case 3: return gemm_bf16_wide<3>(exec, a, lda, rows, m, k, b, n, c, ldc, bias, accumulate, ap, round);
      case 4: return gemm_bf16_wide<4>(exec, a, lda, rows, m, k, b, n, c, ldc, bias, accumulate, ap, round);
      default: break;
    }
  }
  gemm_bf16_wide<Tile::mr>(exec, a, lda, rows, m, k, b, n, c, ldc, bias, accumulate, ap, round);
}

}  // namespace relayout::kernels::impl
