# Every public header compiles on its own: one generated translation unit per header, built by a
# ctest (header_self_contained) so a missing include fails the tests, not only some later user.
option(RELAYOUT_HEADER_CHECK "Test that every public header compiles alone (ctest header_self_contained)" ON)
if(NOT RELAYOUT_HEADER_CHECK)
  return()
endif()
file(GLOB_RECURSE _rl_headers RELATIVE "${PROJECT_SOURCE_DIR}/include" CONFIGURE_DEPENDS
     "${PROJECT_SOURCE_DIR}/include/relayout/*.hpp")
set(_rl_sources "")
foreach(h IN LISTS _rl_headers)
  string(MAKE_C_IDENTIFIER "${h}" id)
  set(src "${PROJECT_BINARY_DIR}/header_check/${id}.cpp")
  file(CONFIGURE OUTPUT "${src}" CONTENT "#include <${h}>\n")
  list(APPEND _rl_sources "${src}")
endforeach()
add_library(relayout_header_check OBJECT EXCLUDE_FROM_ALL ${_rl_sources})
target_link_libraries(relayout_header_check PRIVATE relayout::relayout)
target_compile_options(relayout_header_check PRIVATE -O0)
add_test(NAME header_self_contained
         COMMAND ${CMAKE_COMMAND} --build ${PROJECT_BINARY_DIR} --target relayout_header_check --parallel 2)
# RUN_SERIAL: it has the machine to itself, so it builds two headers at a time.
set_tests_properties(header_self_contained PROPERTIES LABELS "install" TIMEOUT 1200 RUN_SERIAL TRUE)
add_test(NAME header_layers COMMAND ${CMAKE_COMMAND} -DINCLUDE_DIR=${PROJECT_SOURCE_DIR}/include
                                    -P ${PROJECT_SOURCE_DIR}/cmake/RelayoutLayers.cmake)
set_tests_properties(header_layers PROPERTIES LABELS "install"
                     PASS_REGULAR_EXPRESSION "every include points down")
add_test(NAME app_layers COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${PROJECT_SOURCE_DIR}
                                 -P ${PROJECT_SOURCE_DIR}/cmake/RelayoutAppLayers.cmake)
set_tests_properties(app_layers PROPERTIES LABELS "install"
                     PASS_REGULAR_EXPRESSION "no include between examples/ and tools/")
