# Helpers shared by every chapter and test folder.
#
#   tutorial_warnings(<target>)
#   tutorial_chapter_library(<lib> SOURCES ... [CUDA_SOURCES ...] [LINK ...])
#   tutorial_chapter_binary(<name> SOURCES ... LINK ...)
#   tutorial_tests(<name> LABEL chNN SOURCES ... [LINK ...] [GPU])

set(TUTORIAL_GPU_SKIP_CODE 77)  # ctest reports a GPU test that returns 77 as skipped

function(tutorial_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wshadow=local -Wno-unknown-pragmas>
    $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo -Xptxas=-warn-spills,-warn-lmem-usage
                               -Xcompiler=-Wall,-Wextra --expt-relaxed-constexpr>)
endfunction()

# A chapter's algorithms (CPU model and, when CUDA is on, its kernels) live in a
# library so that later chapters can put their numbers next to it.
#
# The chapter folder is on the include path of the library's own sources only
# (PRIVATE): its steps/ include the chapter's headers by name. Everybody else (tests,
# later chapters, the chapter binary's other users) includes a chapter header by its
# path from the project root, `chapters/NN_name/x.hpp` (attn::common puts the root on
# the include path), so an include line always says which chapter a file lives in.
function(tutorial_chapter_library lib)
  cmake_parse_arguments(A "" "" "SOURCES;CUDA_SOURCES;LINK" ${ARGN})
  set(srcs ${A_SOURCES})
  if(TUTORIAL_CUDA)
    list(APPEND srcs ${A_CUDA_SOURCES})
  endif()
  add_library(${lib} STATIC ${srcs})
  target_include_directories(${lib} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
  target_link_libraries(${lib} PUBLIC attn::common ${A_LINK})
  tutorial_warnings(${lib})
endfunction()

function(tutorial_chapter_binary name)
  cmake_parse_arguments(A "" "" "SOURCES;LINK" ${ARGN})
  add_executable(${name} ${A_SOURCES})
  target_link_libraries(${name} PRIVATE attn::common ${A_LINK})
  tutorial_warnings(${name})
  set_property(GLOBAL APPEND PROPERTY TUTORIAL_CHAPTER_BINARIES ${name})
endfunction()

# One doctest binary; every TEST_CASE becomes its own ctest entry.
# GPU binaries exit with TUTORIAL_GPU_SKIP_CODE when no device is present, so
# ctest lists them as skipped rather than passed.
function(tutorial_tests name)
  cmake_parse_arguments(A "GPU" "LABEL" "SOURCES;LINK" ${ARGN})
  if(A_GPU AND NOT TUTORIAL_CUDA)
    # Nothing to build: still tell ctest, so the report says "skipped" (once per label:
    # a chapter may have several GPU test targets).
    if(NOT TEST ${A_LABEL}.gpu.not_built)
      add_test(NAME ${A_LABEL}.gpu.not_built
               COMMAND ${CMAKE_COMMAND} -E echo "CUDA toolkit not found: GPU tests of ${A_LABEL} not built")
      set_tests_properties(${A_LABEL}.gpu.not_built PROPERTIES
        LABELS "gpu;${A_LABEL}" SKIP_REGULAR_EXPRESSION "CUDA toolkit not found")
    endif()
    return()
  endif()
  add_executable(${name} ${A_SOURCES})
  if(A_GPU)
    target_sources(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests/support/gpu_main.cpp)
    set(kind gpu)
  else()
    target_sources(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests/support/cpu_main.cpp)
    set(kind cpu)
  endif()
  target_link_libraries(${name} PRIVATE attn::common doctest::doctest ${A_LINK})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  tutorial_warnings(${name})
  # Test names become ctest names: keep ';' out of TEST_CASE names. CMake splits lists on
  # it, so the ctest entry would carry half the name, its doctest filter would match no test
  # case, and the entry would pass without running anything. Refused at configure time.
  foreach(src ${A_SOURCES})
    get_filename_component(abs "${src}" ABSOLUTE)
    file(STRINGS "${abs}" bad REGEX "TEST_CASE\\(\"[^\"]*;")
    if(bad)
      message(FATAL_ERROR "${abs}: a TEST_CASE name holds ';' (its ctest entry would never run it): ${bad}")
    endif()
  endforeach()
  doctest_discover_tests(${name} TEST_PREFIX "${A_LABEL}.${kind}:" TEST_LIST ${name}_TESTS)
  # doctest's module writes one LABELS property of its own, so the labels and the
  # skip code are set by a second include file that runs after its discovery file.
  set(props_file ${CMAKE_CURRENT_BINARY_DIR}/${name}_properties.cmake)
  file(WRITE ${props_file}
    "if(${name}_TESTS)\n"
    "  set_tests_properties(\${${name}_TESTS} PROPERTIES LABELS \"${kind};${A_LABEL}\"\n"
    "    SKIP_RETURN_CODE ${TUTORIAL_GPU_SKIP_CODE} TIMEOUT 900)\n"
    "endif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${props_file})
endfunction()
