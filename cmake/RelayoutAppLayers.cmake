# ctest script: the programs' folders point one way. apps/ (what the programs and the CLI share)
# includes only the library and itself; examples/ includes the library and apps/, never the CLI
# (tools/); tools/ includes the library and apps/, never the demo model (examples/). Run with
# -DSOURCE_DIR=<repo>.
#
# Every include is resolved to the file it names, as the compiler would find it: "quoted" ones
# first beside the including file (so ../ paths count), then, quoted or <angled>, in each folder
# the targets put on the include path (include/, apps/, examples/, tools/). An include is judged
# by the top folder of every file it resolves to; one that resolves to none (the standard
# library, Kokkos, MPI) is not ours. Before the tree, the script scans a small tree of its own
# with one crossing of each kind and fails unless it finds them all, so the check can fail.

set(roots include apps examples tools)

# Scans apps/, examples/ and tools/ under `top`; sets <out_bad> to the crossings found (one line
# each) and <out_count> to the files read.
function(relayout_scan_app_layers top out_bad out_count)
  set(bad "")
  set(count 0)
  foreach(dir apps examples tools)
    file(GLOB_RECURSE sources "${top}/${dir}/*.hpp" "${top}/${dir}/*.cpp" "${top}/${dir}/*.h" "${top}/${dir}/*.cc"
         "${top}/${dir}/*.inl")
    foreach(f IN LISTS sources)
      math(EXPR count "${count} + 1")
      file(RELATIVE_PATH rel "${top}" "${f}")
      get_filename_component(here "${f}" DIRECTORY)
      file(STRINGS "${f}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]")
      foreach(line IN LISTS lines)
        if(NOT line MATCHES "^[ \t]*#[ \t]*include[ \t]*([<\"])([^>\"]+)[>\"]")
          continue()
        endif()
        set(delim "${CMAKE_MATCH_1}")
        set(inc "${CMAKE_MATCH_2}")
        set(candidates "")
        set(close ">")
        if(delim STREQUAL "\"")
          set(close "\"")
          list(APPEND candidates "${here}/${inc}")
        endif()
        foreach(root IN LISTS roots)
          list(APPEND candidates "${top}/${root}/${inc}")
        endforeach()
        foreach(c IN LISTS candidates)
          if(NOT EXISTS "${c}" OR IS_DIRECTORY "${c}")
            continue()
          endif()
          get_filename_component(real "${c}" REALPATH)
          file(RELATIVE_PATH where "${top}" "${real}")
          if(where MATCHES "^\\.\\./")
            continue()  # outside the tree
          endif()
          string(REGEX MATCH "^[^/]+" folder "${where}")
          set(why "")
          if(dir STREQUAL "apps" AND NOT folder MATCHES "^(apps|include)$")
            set(why "apps/ sits below both examples/ and tools/ and includes only the library and apps/")
          elseif(dir STREQUAL "examples" AND folder STREQUAL "tools")
            set(why "examples/ never include the CLI (tools/); move what both need to apps/")
          elseif(dir STREQUAL "tools" AND folder STREQUAL "examples")
            set(why "tools/ never include the demo model (examples/); move what both need to apps/")
          endif()
          if(why)
            string(APPEND bad "  ${rel} includes ${delim}${inc}${close} (${where}): ${why}\n")
            break()
          endif()
        endforeach()
      endforeach()
    endforeach()
  endforeach()
  set(${out_bad} "${bad}" PARENT_SCOPE)
  set(${out_count} "${count}" PARENT_SCOPE)
endfunction()

# The self-test tree: each way of spelling a crossing, and allowed includes beside them.
set(probe "${CMAKE_CURRENT_BINARY_DIR}/app_layers_probe")
file(REMOVE_RECURSE "${probe}")
file(WRITE "${probe}/include/relayout/lib.hpp" "#pragma once\n")
file(WRITE "${probe}/apps/common/flags.hpp" "#pragma once\n#include <relayout/lib.hpp>\n#include \"../demo_model/config.hpp\"\n")
file(WRITE "${probe}/apps/demo_model/config.hpp" "#pragma once\n#include \"common/flags.hpp\"\n")
file(WRITE "${probe}/apps/common/bad.hpp" "#pragma once\n#include \"../../examples/demo/model.hpp\"\n")
file(WRITE "${probe}/examples/demo/model.hpp" "#pragma once\n#include \"common/flags.hpp\"\n#include \"relayout/lib.hpp\"\n")
file(WRITE "${probe}/examples/one.cpp" "#include \"demo/model.hpp\"\n#include \"../tools/cli/plan.hpp\"\n#include <vector>\n")
file(WRITE "${probe}/examples/two.cpp" "  #  include <cli/plan.hpp>\n// #include \"cli/plan.hpp\"\n")
file(WRITE "${probe}/tools/cli/plan.hpp" "#pragma once\n#include <common/flags.hpp>\n#include \"cli/other.hpp\"\n")
file(WRITE "${probe}/tools/cli/other.hpp" "#pragma once\n#include \"../../examples/demo/model.hpp\"\n")
file(WRITE "${probe}/tools/main.cpp" "#include <demo/model.hpp>\n#include \"cli/plan.hpp\"\n")
relayout_scan_app_layers("${probe}" probe_bad probe_count)
set(expected
    "apps/common/bad.hpp includes \"../../examples/demo/model.hpp\" (examples/demo/model.hpp)"
    "examples/one.cpp includes \"../tools/cli/plan.hpp\" (tools/cli/plan.hpp)"
    "examples/two.cpp includes <cli/plan.hpp> (tools/cli/plan.hpp)"
    "tools/cli/other.hpp includes \"../../examples/demo/model.hpp\" (examples/demo/model.hpp)"
    "tools/main.cpp includes <demo/model.hpp> (examples/demo/model.hpp)")
string(REGEX MATCHALL "\n" probe_lines "\n${probe_bad}")
list(LENGTH probe_lines probe_n)
math(EXPR probe_n "${probe_n} - 1")
list(LENGTH expected want_n)
foreach(e IN LISTS expected)
  string(FIND "${probe_bad}" "${e}" at)
  if(at LESS 0)
    message(FATAL_ERROR "app_layers self-test: the check missed ${e}; it found:\n${probe_bad}")
  endif()
endforeach()
if(NOT probe_n EQUAL want_n)
  message(FATAL_ERROR "app_layers self-test: ${want_n} crossings expected in the probe tree, found ${probe_n}:\n${probe_bad}")
endif()
file(REMOVE_RECURSE "${probe}")

relayout_scan_app_layers("${SOURCE_DIR}" bad count)
if(bad)
  message(FATAL_ERROR "an include crosses between examples/ and tools/:\n${bad}")
endif()
message("apps: ${count} files of apps/, examples/ and tools/ (self-test: ${want_n} crossings found in its probe tree), "
        "no include between examples/ and tools/")
