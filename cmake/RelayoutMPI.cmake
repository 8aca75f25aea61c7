# Finds MPI (MPICH on Debian) for the relayout::relayout interface. When both MPICH and Open MPI are
# installed, prefer MPICH's wrappers and launcher unless the caller chose otherwise.
include_guard(GLOBAL)

if(NOT MPI_CXX_COMPILER AND EXISTS /usr/bin/mpicxx.mpich)
  set(MPI_CXX_COMPILER /usr/bin/mpicxx.mpich CACHE FILEPATH "MPI C++ wrapper")
endif()
if(NOT MPI_C_COMPILER AND EXISTS /usr/bin/mpicc.mpich)
  set(MPI_C_COMPILER /usr/bin/mpicc.mpich CACHE FILEPATH "MPI C wrapper")
endif()
if(NOT MPIEXEC_EXECUTABLE AND EXISTS /usr/bin/mpiexec.mpich)
  set(MPIEXEC_EXECUTABLE /usr/bin/mpiexec.mpich CACHE FILEPATH "MPI launcher")
endif()
find_package(MPI REQUIRED COMPONENTS CXX)
