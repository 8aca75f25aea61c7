# Helpers that register this repository's tests with ctest.
#
#   relayout_add_test(NAME SOURCES ... [LIBS ...] [LABELS ...])
#       a doctest executable (Kokkos initialised, no MPI), run as one process.
#   relayout_add_mpi_test(NAME SOURCES ... [RANKS 1 2 4 8] [LIBS ...] [LABELS ...] [TIMEOUT s])
#       a doctest executable on the shared MPI test main, registered once per rank count as
#       NAME_npN under `mpiexec -n N`. Rank counts >= 16 also get the label `large`.
#   relayout_add_compile_fail_test(NAME SOURCE REGEX [DEFINES ...])
#       passes when compiling SOURCE fails with a diagnostic matching REGEX.
#   relayout_add_command_test(NAME COMMAND ... [EXPECT_RC n] [STDOUT regex] [STDERR regex])
#       runs a command and checks its exit code and output.
include_guard(GLOBAL)

set(RELAYOUT_TEST_DEFAULT_RANKS 1 2 4 8 CACHE STRING "Rank counts for MPI tests")
set(RELAYOUT_TEST_COLLECTIVE_TIMEOUT 120 CACHE STRING
    "RELAYOUT_COLLECTIVE_TIMEOUT (seconds) for MPI tests: the watchdog's deadline")

function(relayout_add_test name)
  cmake_parse_arguments(T "" "" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE relayout::relayout relayout_test_main relayout_warnings relayout_demo ${T_LIBS})
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES LABELS "unit;${T_LABELS}" TIMEOUT 300)
endfunction()

function(relayout_add_mpi_test name)
  cmake_parse_arguments(T "" "TIMEOUT" "SOURCES;RANKS;LIBS;LABELS" ${ARGN})
  if(NOT T_RANKS)
    set(T_RANKS ${RELAYOUT_TEST_DEFAULT_RANKS})
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 600)
  endif()
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE relayout::relayout relayout_mpi_test_main relayout_warnings relayout_demo ${T_LIBS})
  foreach(n IN LISTS T_RANKS)
    set(labels "mpi;${T_LABELS}")
    if(n GREATER_EQUAL 16)
      list(APPEND labels large)
    endif()
    add_test(NAME ${name}_np${n}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n} ${MPIEXEC_PREFLAGS}
                     $<TARGET_FILE:${name}> ${MPIEXEC_POSTFLAGS})
    # A rank left waiting in a collective (a REQUIRE that failed on another rank, a skipped call)
    # ends the job with the watchdog's message long before the test's own timeout.
    set_tests_properties(${name}_np${n} PROPERTIES LABELS "${labels}" TIMEOUT ${T_TIMEOUT}
                         PROCESSORS ${n} RESOURCE_LOCK mpi
                         ENVIRONMENT "RELAYOUT_COLLECTIVE_TIMEOUT=${RELAYOUT_TEST_COLLECTIVE_TIMEOUT}")
  endforeach()
endfunction()

function(relayout_add_compile_fail_test name)
  cmake_parse_arguments(T "" "SOURCE;REGEX" "DEFINES;LIBS" ${ARGN})
  add_executable(${name} EXCLUDE_FROM_ALL ${T_SOURCE})
  target_link_libraries(${name} PRIVATE relayout::relayout ${T_LIBS})
  target_compile_definitions(${name} PRIVATE ${T_DEFINES})
  add_test(NAME ${name}
           COMMAND ${CMAKE_COMMAND} --build ${PROJECT_BINARY_DIR} --target ${name})
  set_tests_properties(${name} PROPERTIES LABELS "compile_fail" PASS_REGULAR_EXPRESSION "${T_REGEX}"
                       TIMEOUT 300)
endfunction()

function(relayout_add_command_test name)
  cmake_parse_arguments(T "" "EXPECT_RC;STDOUT;STDERR" "COMMAND;LABELS" ${ARGN})
  if(NOT DEFINED T_EXPECT_RC)
    set(T_EXPECT_RC 0)
  endif()
  string(REPLACE ";" "@@" escaped "${T_COMMAND}")  # the script splits it again
  add_test(NAME ${name}
           COMMAND ${CMAKE_COMMAND} "-DCOMMAND=${escaped}" "-DEXPECT_RC=${T_EXPECT_RC}"
                   "-DEXPECT_STDOUT=${T_STDOUT}" "-DEXPECT_STDERR=${T_STDERR}"
                   -P ${PROJECT_SOURCE_DIR}/cmake/RelayoutCheckCommand.cmake)
  set_tests_properties(${name} PROPERTIES LABELS "cli;${T_LABELS}" TIMEOUT 300)
endfunction()

# Bad-input tests from a table: each case is "name|arguments|stderr regex". The test
# bad_input_<prefix><name> runs the list in the variable named by command_var, then the arguments,
# and expects exit code 2 and stderr starting with <stderr_prefix><regex>. The cases are read one
# argument at a time (not as a CMake list), so a regex may hold an unbalanced '['.
function(relayout_add_bad_input_cases prefix command_var stderr_prefix)
  math(EXPR last "${ARGC} - 1")
  foreach(i RANGE 3 ${last})
    string(REPLACE "|" ";" parts "${ARGV${i}}")
    list(GET parts 0 name)
    list(GET parts 1 args)
    list(GET parts 2 expect)
    separate_arguments(args)
    relayout_add_command_test(bad_input_${prefix}${name} EXPECT_RC 2 LABELS bad_input
      COMMAND ${${command_var}} ${args}
      STDERR "^${stderr_prefix}${expect}")
  endforeach()
endfunction()
