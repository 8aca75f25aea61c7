# Provides the imported target Kokkos::kokkos, from upstream Kokkos or from Debian's Trilinos
# Kokkos 3.4, whose KokkosConfig.cmake defines no such target and whose include path can point at a
# directory that does not exist. Shared by the build tree and the installed relayoutConfig.cmake.
include_guard(GLOBAL)

if(NOT TARGET Kokkos::kokkos)
  find_package(Kokkos CONFIG QUIET)
endif()

function(_relayout_find_kokkos_headers out)
  find_path(RELAYOUT_KOKKOS_INCLUDE_DIR Kokkos_Core.hpp
            HINTS ${KokkosCore_INCLUDE_DIRS} ${Kokkos_INCLUDE_DIRS}
            PATHS /usr/include/trilinos /usr/local/include/trilinos
            PATH_SUFFIXES trilinos)
  set(${out} "${RELAYOUT_KOKKOS_INCLUDE_DIR}" PARENT_SCOPE)
endfunction()

if(TARGET Kokkos::kokkos)
  # Trilinos' KokkosConfig.cmake defines Kokkos::kokkos with an include path computed one level too
  # high (/usr/lib/include). Replace paths that do not exist by the directory holding the headers.
  get_target_property(_rl_aliased Kokkos::kokkos ALIASED_TARGET)
  get_target_property(_rl_inc Kokkos::kokkos INTERFACE_INCLUDE_DIRECTORIES)
  if(NOT _rl_aliased AND _rl_inc AND NOT _rl_inc MATCHES "\\$<")
    set(_rl_fixed)
    set(_rl_broken FALSE)
    foreach(_rl_dir IN LISTS _rl_inc)
      if(EXISTS "${_rl_dir}")
        list(APPEND _rl_fixed "${_rl_dir}")
      else()
        set(_rl_broken TRUE)
      endif()
    endforeach()
    if(_rl_broken)
      _relayout_find_kokkos_headers(_rl_headers)
      if(NOT _rl_headers)
        message(FATAL_ERROR "Kokkos::kokkos names missing include paths (${_rl_inc}) and "
                            "Kokkos_Core.hpp was not found elsewhere")
      endif()
      list(APPEND _rl_fixed "${_rl_headers}")
      set_target_properties(Kokkos::kokkos PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_rl_fixed}")
    endif()
  endif()
endif()

if(NOT TARGET Kokkos::kokkos)
  # Trilinos packaging without a usable KokkosConfig: KokkosCore's config defines
  # trilinos_kokkoscore; find the headers ourselves.
  find_package(KokkosCore CONFIG QUIET)
  _relayout_find_kokkos_headers(_rl_headers)
  if(TARGET trilinos_kokkoscore AND _rl_headers)
    add_library(Kokkos::kokkos INTERFACE IMPORTED GLOBAL)
    set_target_properties(Kokkos::kokkos PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${_rl_headers}"
      INTERFACE_LINK_LIBRARIES trilinos_kokkoscore)
  endif()
endif()

if(NOT TARGET Kokkos::kokkos)
  message(FATAL_ERROR "relayout needs Kokkos: install libtrilinos-kokkos-dev (Debian) or point "
                      "CMAKE_PREFIX_PATH at a Kokkos installation")
endif()
