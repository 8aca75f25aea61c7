# Optional CUDA + NCCL detection (RELAYOUT_ENABLE_NCCL = AUTO | ON | OFF). Defines the imported target
# relayout::nccl and RELAYOUT_HAVE_NCCL when both are found. Compile and link only: no GPU needed.
include_guard(GLOBAL)

set(RELAYOUT_ENABLE_NCCL "AUTO" CACHE STRING "Build the NCCL communicator: AUTO, ON or OFF")
set_property(CACHE RELAYOUT_ENABLE_NCCL PROPERTY STRINGS AUTO ON OFF)
set(RELAYOUT_HAVE_NCCL FALSE)

if(NOT RELAYOUT_ENABLE_NCCL STREQUAL "OFF")
  if(NOT CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  find_path(RELAYOUT_NCCL_INCLUDE_DIR nccl.h
            HINTS ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_ROOT}/include)
  find_library(RELAYOUT_NCCL_LIBRARY nccl
               HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_ROOT}/lib64 ${CUDAToolkit_ROOT}/lib)
  if(CUDAToolkit_FOUND AND RELAYOUT_NCCL_INCLUDE_DIR AND RELAYOUT_NCCL_LIBRARY)
    if(NOT TARGET relayout::nccl)
      add_library(relayout::nccl INTERFACE IMPORTED GLOBAL)
      set_target_properties(relayout::nccl PROPERTIES
        INTERFACE_INCLUDE_DIRECTORIES "${RELAYOUT_NCCL_INCLUDE_DIR}"
        INTERFACE_LINK_LIBRARIES "${RELAYOUT_NCCL_LIBRARY};CUDA::cudart"
        INTERFACE_COMPILE_DEFINITIONS RELAYOUT_HAVE_NCCL=1)
    endif()
    set(RELAYOUT_HAVE_NCCL TRUE)
    message(STATUS "relayout: NCCL found (${RELAYOUT_NCCL_LIBRARY}), CUDA ${CUDAToolkit_VERSION}")
  elseif(RELAYOUT_ENABLE_NCCL STREQUAL "ON")
    message(FATAL_ERROR "RELAYOUT_ENABLE_NCCL=ON but CUDA or NCCL was not found under "
                        "${CUDAToolkit_ROOT} (need nccl.h, libnccl and the CUDA runtime)")
  else()
    message(STATUS "relayout: NCCL not found; the NCCL communicator is not built")
  endif()
endif()
