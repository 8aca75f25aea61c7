# Optional Kokkos Kernels (RELAYOUT_ENABLE_KOKKOS_KERNELS = AUTO | ON | OFF): the vendor GEMM
# (KokkosBlas::gemm, which calls cuBLAS/rocBLAS/host BLAS as Kokkos Kernels was built) behind the
# dense and expert GEMMs. Always defines the imported target relayout::kokkos_kernels; it carries
# RELAYOUT_HAVE_KOKKOS_KERNELS=1 and the library only when Kokkos Kernels was found (without it
# every GEMM uses relayout's packed kernel). Debian's Trilinos 13.2 ships it as the target
# trilinos_kokkoskernels, whose include path, like Kokkos', may not exist: the headers are found
# next to Kokkos'. Shared by the build tree and the installed relayoutConfig.cmake.
include_guard(GLOBAL)
include("${CMAKE_CURRENT_LIST_DIR}/RelayoutKokkos.cmake")

if(NOT DEFINED RELAYOUT_ENABLE_KOKKOS_KERNELS)
  set(RELAYOUT_ENABLE_KOKKOS_KERNELS "AUTO" CACHE STRING "Use Kokkos Kernels for GEMMs: AUTO, ON or OFF")
  set_property(CACHE RELAYOUT_ENABLE_KOKKOS_KERNELS PROPERTY STRINGS AUTO ON OFF)
endif()
set(RELAYOUT_HAVE_KOKKOS_KERNELS FALSE)

if(NOT TARGET relayout::kokkos_kernels)
  add_library(relayout::kokkos_kernels INTERFACE IMPORTED GLOBAL)
  if(NOT RELAYOUT_ENABLE_KOKKOS_KERNELS STREQUAL "OFF")
    if(NOT TARGET Kokkos::kokkoskernels AND NOT TARGET trilinos_kokkoskernels)
      find_package(KokkosKernels CONFIG QUIET)
    endif()
    find_path(RELAYOUT_KOKKOS_KERNELS_INCLUDE_DIR KokkosBlas3_gemm.hpp
              HINTS ${RELAYOUT_KOKKOS_INCLUDE_DIR} ${KokkosKernels_INCLUDE_DIRS}
              PATHS /usr/include/trilinos /usr/local/include/trilinos
              PATH_SUFFIXES trilinos)
    if(TARGET Kokkos::kokkoskernels)
      set(_rl_kk_lib Kokkos::kokkoskernels)
    elseif(TARGET trilinos_kokkoskernels)
      set(_rl_kk_lib trilinos_kokkoskernels)
    else()
      find_library(_rl_kk_lib NAMES kokkoskernels trilinos_kokkoskernels)
    endif()
    if(RELAYOUT_KOKKOS_KERNELS_INCLUDE_DIR AND _rl_kk_lib)
      set_target_properties(relayout::kokkos_kernels PROPERTIES
        INTERFACE_INCLUDE_DIRECTORIES "${RELAYOUT_KOKKOS_KERNELS_INCLUDE_DIR}"
        INTERFACE_LINK_LIBRARIES "${_rl_kk_lib}"
        INTERFACE_COMPILE_DEFINITIONS RELAYOUT_HAVE_KOKKOS_KERNELS=1)
      set(RELAYOUT_HAVE_KOKKOS_KERNELS TRUE)
    endif()
  endif()
else()
  get_target_property(_rl_kk_defs relayout::kokkos_kernels INTERFACE_COMPILE_DEFINITIONS)
  if(_rl_kk_defs MATCHES "RELAYOUT_HAVE_KOKKOS_KERNELS")
    set(RELAYOUT_HAVE_KOKKOS_KERNELS TRUE)
  endif()
endif()

if(RELAYOUT_HAVE_KOKKOS_KERNELS)
  message(STATUS "relayout: Kokkos Kernels found (${RELAYOUT_KOKKOS_KERNELS_INCLUDE_DIR}): vendor GEMM available")
elseif(RELAYOUT_ENABLE_KOKKOS_KERNELS STREQUAL "ON")
  message(FATAL_ERROR "RELAYOUT_ENABLE_KOKKOS_KERNELS=ON but Kokkos Kernels was not found: install "
                      "libtrilinos-kokkos-kernels-dev (Debian) or point CMAKE_PREFIX_PATH at it")
else()
  message(STATUS "relayout: Kokkos Kernels not found; every GEMM uses the packed kernel")
endif()
