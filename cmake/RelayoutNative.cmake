# relayout::native (target relayout_native here): compile for the CPU that runs the build
# (-march=native) and stop, at start, a program so built on a CPU without those instructions
# (relayout_isa_guard.cpp, compiled into each executable that links the target, exits 2 with the
# missing features named instead of dying of SIGILL). The library itself never adds the flag: an
# engine opts in by linking relayout::native, or keeps its own flags.
#
# g++ before 13 miscompiles with AVX-512 enabled: its SLP vectorizer copies a constant list of
# 64-bit elements such as {1, 1, 1, 1, 1, 0, 0, 0} with one broadcast (eight ones). The target adds
# -fno-tree-slp-vectorize for those compilers (the kernels' vector code is written with intrinsics
# and does not need it); relayout_codegen_probe.cpp checks the result at configure time.
include_guard(GLOBAL)
include(CheckCXXCompilerFlag)

check_cxx_compiler_flag(-march=native RELAYOUT_HAVE_MARCH_NATIVE)
add_library(relayout_native INTERFACE)
add_library(relayout::native ALIAS relayout_native)
set_target_properties(relayout_native PROPERTIES EXPORT_NAME native)
target_link_libraries(relayout_native INTERFACE relayout)
set(_relayout_gcc12 "$<AND:$<CXX_COMPILER_ID:GNU>,$<VERSION_LESS:$<CXX_COMPILER_VERSION>,13>>")
if(RELAYOUT_HAVE_MARCH_NATIVE)
  target_compile_options(relayout_native INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-march=native>
                         $<$<AND:$<COMPILE_LANGUAGE:CXX>,${_relayout_gcc12}>:-fno-tree-slp-vectorize>)
  if(PROJECT_IS_TOP_LEVEL AND RELAYOUT_NATIVE AND NOT CMAKE_CROSSCOMPILING)
    set(_flags -O2 -march=native)
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
      list(APPEND _flags -fno-tree-slp-vectorize)
    endif()
    # try_run on the file itself: passed through a CMake string, the probe's escapes would change.
    try_run(_relayout_probe_run _relayout_probe_built "${CMAKE_BINARY_DIR}/relayout_codegen_probe"
            "${CMAKE_CURRENT_LIST_DIR}/relayout_codegen_probe.cpp"
            COMPILE_DEFINITIONS ${_flags}
            COMPILE_OUTPUT_VARIABLE _relayout_probe_log RUN_OUTPUT_VARIABLE _relayout_probe_out)
    if(NOT _relayout_probe_built)
      message(FATAL_ERROR "relayout: cmake/relayout_codegen_probe.cpp does not build with ${CMAKE_CXX_COMPILER} "
                          "and '${_flags}':\n${_relayout_probe_log}")
    elseif(NOT _relayout_probe_run EQUAL 0)
      message(FATAL_ERROR "relayout: ${CMAKE_CXX_COMPILER} with '${_flags}' builds constant lists of 64-bit "
                          "elements wrong on this CPU (cmake/relayout_codegen_probe.cpp: ${_relayout_probe_out}). "
                          "Configure with -DRELAYOUT_NATIVE=OFF for portable binaries, or use another compiler.")
    endif()
    message(STATUS "relayout: -march=native code generation checked (cmake/relayout_codegen_probe.cpp)")
  endif()
endif()
target_sources(relayout_native INTERFACE
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/cmake/relayout_isa_guard.cpp>
  $<INSTALL_INTERFACE:$<INSTALL_PREFIX>/${RELAYOUT_CMAKE_DIR}/relayout_isa_guard.cpp>)
