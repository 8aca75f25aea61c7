# ctest script: the programs and the CLI (apps/, examples/, tools/) make every collective through
# relayout's communicators, which check it and keep it under RELAYOUT_COLLECTIVE_TIMEOUT; an MPI_*
# call of their own would escape both (a stopped rank would hang the job there). Allowed: the MPI
# session of apps/common/mpi_main.hpp (MPI_Init and MPI_Finalize) and examples/engine/, which plays
# an inference engine that owns its own communicator and hands it to relayout. Names of types and
# constants (MPI_Comm, MPI_COMM_WORLD, ...) are not calls. Run with -DSOURCE_DIR=<repo>.
cmake_policy(SET CMP0057 NEW)  # IN_LIST
set(allowed_calls "apps/common/mpi_main.hpp:MPI_Init" "apps/common/mpi_main.hpp:MPI_Finalize")
set(bad "")
set(count 0)
foreach(dir apps examples tools)
  file(GLOB_RECURSE sources "${SOURCE_DIR}/${dir}/*.hpp" "${SOURCE_DIR}/${dir}/*.cpp")
  foreach(f IN LISTS sources)
    file(RELATIVE_PATH rel "${SOURCE_DIR}" "${f}")
    if(rel MATCHES "^examples/engine/")
      continue()
    endif()
    math(EXPR count "${count} + 1")
    file(STRINGS "${f}" lines REGEX "MPI_[A-Z][a-z_]+[ \t]*\\(")
    foreach(line IN LISTS lines)
      if(line MATCHES "^[ \t]*//")
        continue()
      endif()
      string(REGEX MATCHALL "MPI_[A-Z][a-z_]+[ \t]*\\(" calls "${line}")
      foreach(call IN LISTS calls)
        string(REGEX REPLACE "[ \t]*\\($" "" name "${call}")
        if(NOT "${rel}:${name}" IN_LIST allowed_calls)
          string(STRIP "${line}" shown)
          string(APPEND bad "  ${rel}: ${name}: ${shown}\n")
        endif()
      endforeach()
    endforeach()
  endforeach()
endforeach()
if(bad)
  message(FATAL_ERROR "MPI called directly, outside relayout's checked communicators (use MpiCommunicator and "
                      "the free collectives of relayout/comm.hpp):\n${bad}")
endif()
message("programs_mpi: ${count} files of apps/, examples/ and tools/, no MPI call outside the MPI session")
