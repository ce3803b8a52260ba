# Helpers shared by every chapter and test folder.
#
#   tutorial_default_cuda_architectures()   (the top CMakeLists, before enable_language(CUDA))
#   tutorial_warnings(<target>)
#   tutorial_chapter_library(<lib> SOURCES ... [CUDA_SOURCES ...] [HOPPER_SOURCES ...]
#                            [LAB_CUDA_SOURCES ...] [LAB_HOPPER_SOURCES ...] [LINK ...])
#   tutorial_chapter_binary(<name> SOURCES ... LINK ...)
#   tutorial_tests(<name> LABEL chNN SOURCES ... [LINK ...] [GPU])

set(TUTORIAL_GPU_SKIP_CODE 77)  # ctest reports a GPU test that returns 77 as skipped

# Hopper-only code (TMA, mbarrier, wgmma, setmaxnreg: instructions that exist for sm_90a
# alone) is compiled for this and nothing else: sm_90a machine code, no PTX (PTX of
# compute_90a could run on no other GPU anyway).
set(TUTORIAL_HOPPER_ARCHITECTURES 90a-real)

# The compute capabilities of the GPUs on this machine ("9.0;8.0"), empty without one.
function(tutorial_detect_gpus out)
  set(caps "")
  find_program(TUTORIAL_NVIDIA_SMI nvidia-smi)
  mark_as_advanced(TUTORIAL_NVIDIA_SMI)
  if(TUTORIAL_NVIDIA_SMI)
    execute_process(COMMAND ${TUTORIAL_NVIDIA_SMI} --query-gpu=compute_cap --format=csv,noheader
                    OUTPUT_VARIABLE text ERROR_QUIET RESULT_VARIABLE rc TIMEOUT 20)
    if(rc EQUAL 0)
      string(REGEX MATCHALL "[0-9]+\\.[0-9]+" caps "${text}")
    endif()
  endif()
  set(${out} "${caps}" PARENT_SCOPE)
endfunction()

# The portable kernels' architectures when the user names none (-DCMAKE_CUDA_ARCHITECTURES
# or the CUDAARCHS environment variable still decide when given):
#   a GPU on this machine  ->  "native": exactly that GPU, nothing compiled twice;
#   no GPU                 ->  80: sm_80 code and compute_80 PTX. Every kernel of the
#                              portable chapters needs sm_80 (mma.sync, cp.async, ldmatrix);
#                              the driver compiles the PTX for any newer GPU at first launch.
# Hopper-only code ignores this list (TUTORIAL_HOPPER_ARCHITECTURES).
macro(tutorial_default_cuda_architectures)
  if(DEFINED CMAKE_CUDA_ARCHITECTURES OR DEFINED ENV{CUDAARCHS})
    set(TUTORIAL_CUDA_ARCH_SOURCE "given")
  else()
    tutorial_detect_gpus(_tutorial_gpus)
    if(_tutorial_gpus)
      set(CMAKE_CUDA_ARCHITECTURES native CACHE STRING
          "CUDA architectures of the portable kernels (default: this machine's GPU)")
      set(TUTORIAL_CUDA_ARCH_SOURCE "the GPU of this machine: compute capability ${_tutorial_gpus}")
    else()
      set(CMAKE_CUDA_ARCHITECTURES 80 CACHE STRING
          "CUDA architectures of the portable kernels (default without a GPU: 80, whose PTX runs on newer GPUs)")
      set(TUTORIAL_CUDA_ARCH_SOURCE "no GPU found: sm_80 code and PTX, compiled for newer GPUs at first launch")
    endif()
    set(TUTORIAL_CUDA_ARCH_SOURCE "${TUTORIAL_CUDA_ARCH_SOURCE}" CACHE INTERNAL "why the architectures are what they are")
  endif()
  if(NOT TUTORIAL_CUDA_ARCH_SOURCE)
    set(TUTORIAL_CUDA_ARCH_SOURCE "given")
  endif()
endmacro()

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
#
# The sources come in kinds, and this function is the one place that knows what each
# kind is built for:
#   SOURCES             C++ (CPU models, CLI, host code): everywhere
#   CUDA_SOURCES        portable kernels: for CMAKE_CUDA_ARCHITECTURES, when CUDA is on
#   HOPPER_SOURCES      kernels with sm_90a-only instructions: for TUTORIAL_HOPPER_ARCHITECTURES
#                       (90a) alone, when CUDA is on. Their launchers must refuse other GPUs
#                       in one line (the chapters call attn::hopper_device()).
#   LAB_CUDA_SOURCES,   the chapter's lab steps (tuning experiments beside the main path):
#   LAB_HOPPER_SOURCES  built only with TUTORIAL_LAB=ON; the library then carries
#                       TUTORIAL_LAB=1, so that its step lists include them.
# The Hopper sources compile as an object library of their own (a target property is the
# only way CMake sets architectures) whose objects go into <lib>: one archive, so that
# host code on either side may call the other.
function(tutorial_chapter_library lib)
  cmake_parse_arguments(A "" "" "SOURCES;CUDA_SOURCES;HOPPER_SOURCES;LAB_CUDA_SOURCES;LAB_HOPPER_SOURCES;LINK" ${ARGN})
  set(srcs ${A_SOURCES})
  set(hopper)
  if(TUTORIAL_CUDA)
    list(APPEND srcs ${A_CUDA_SOURCES})
    set(hopper ${A_HOPPER_SOURCES})
    if(TUTORIAL_LAB)
      list(APPEND srcs ${A_LAB_CUDA_SOURCES})
      list(APPEND hopper ${A_LAB_HOPPER_SOURCES})
    endif()
  endif()
  add_library(${lib} STATIC ${srcs})
  target_include_directories(${lib} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
  target_link_libraries(${lib} PUBLIC attn::common ${A_LINK})
  if(TUTORIAL_LAB)
    target_compile_definitions(${lib} PUBLIC TUTORIAL_LAB=1)
  else()
    target_compile_definitions(${lib} PUBLIC TUTORIAL_LAB=0)
  endif()
  tutorial_warnings(${lib})
  if(hopper)
    add_library(${lib}_sm90a OBJECT ${hopper})
    set_property(TARGET ${lib}_sm90a PROPERTY CUDA_ARCHITECTURES ${TUTORIAL_HOPPER_ARCHITECTURES})
    target_include_directories(${lib}_sm90a PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
    target_link_libraries(${lib}_sm90a PUBLIC attn::common ${A_LINK})
    target_compile_definitions(${lib}_sm90a PUBLIC TUTORIAL_LAB=$<BOOL:${TUTORIAL_LAB}>)
    tutorial_warnings(${lib}_sm90a)
    target_sources(${lib} PRIVATE $<TARGET_OBJECTS:${lib}_sm90a>)
  endif()
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
