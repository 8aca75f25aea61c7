// Internal: the vendor side of the GEMM dispatch, C[m x n] (+)= rows of A . B (+ bias) with B the
// plain k x n matrix (W^T row-major), through KokkosBlas::gemm, which calls the BLAS Kokkos Kernels
// was built with (cuBLAS, rocBLAS, host BLAS). Compiled only with RELAYOUT_HAVE_KOKKOS_KERNELS.
// Not public API.
#pragma once

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <type_traits>

#if defined(RELAYOUT_HAVE_KOKKOS_KERNELS)
#include <KokkosBlas3_gemm.hpp>
#endif

namespace relayout::kernels::impl {

// Whether this build can hand a GEMM of scalar T to the vendor library.
template <class T>
inline constexpr bool vendor_gemm_available_v =
#if defined(RELAYOUT_HAVE_KOKKOS_KERNELS)
    std::is_same_v<T, float> || std::is_same_v<T, double>;
#else
    false;
#endif

#if defined(RELAYOUT_HAVE_KOKKOS_KERNELS)
// a_buf holds m * k scalars: A is gathered there when it comes through `rows` or with lda != k, so
// that every view is LayoutRight with its natural stride (the layout the BLAS bindings take).
template <class ExecSpace, class T>
void gemm_vendor(const ExecSpace& exec, const T* a, std::int64_t lda, const int* rows, int m, int k,
                 const T* b_plain, int n, T* c, std::int64_t ldc, const T* bias, bool accumulate, T* a_buf) {
  using Device = Kokkos::Device<ExecSpace, typename ExecSpace::memory_space>;
  using Unmanaged = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
  if (m == 0 || n == 0) return;
  const T* ap = a;
  if (k > 0 && (rows || lda != k)) {
    Kokkos::parallel_for(
        "relayout::kernels::gemm_vendor_gather", Kokkos::RangePolicy<ExecSpace>(exec, 0, std::int64_t(m) * k),
        KOKKOS_LAMBDA(const std::int64_t idx) {
          const std::int64_t i = idx / k, kk = idx % k;
          a_buf[idx] = a[(rows ? std::int64_t(rows[i]) : i) * lda + kk];
        });
    ap = a_buf;
  }
  // The bias goes into C first and the BLAS accumulates onto it (beta = 1).
  if (bias || k == 0) {
    Kokkos::parallel_for(
        "relayout::kernels::gemm_vendor_bias", Kokkos::RangePolicy<ExecSpace>(exec, 0, std::int64_t(m) * n),
        KOKKOS_LAMBDA(const std::int64_t idx) {
          const std::int64_t i = idx / n, j = idx % n;
          const T add = bias ? bias[j] : T(0);
          c[i * ldc + j] = accumulate ? T(c[i * ldc + j] + add) : add;
        });
  }
  if (k == 0) return;
  const T beta = bias || accumulate ? T(1) : T(0);
  // KokkosBlas::gemm (Kokkos Kernels 3.x) runs on the default instance of ExecSpace: order it after
  // and before the caller's instance.
  exec.fence();
  Kokkos::View<const T**, Kokkos::LayoutRight, Device, Unmanaged> av(ap, m, k), bv(b_plain, k, n);
  if (ldc == n) {
    Kokkos::View<T**, Kokkos::LayoutRight, Device, Unmanaged> cv(c, m, n);
    KokkosBlas::gemm("N", "N", T(1), av, bv, beta, cv);
  } else {  // a row-strided C: Kokkos Kernels' own GEMM (the BLAS bindings take LayoutRight only)
    Kokkos::View<T**, Kokkos::LayoutStride, Device, Unmanaged> cv(c, Kokkos::LayoutStride(m, ldc, n, 1));
    KokkosBlas::gemm("N", "N", T(1), av, bv, beta, cv);
  }
  ExecSpace().fence();
}
#endif

}  // namespace relayout::kernels::impl
