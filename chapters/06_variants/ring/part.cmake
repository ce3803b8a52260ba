# Chapter 06, part "ring": sources (see ../CMakeLists.txt for the three lists).
#
#   ring_schedule   layouts, the K/V source of every step, per-pair masks (CPU, everywhere)
#   ring_comm       the communication interface and its threads backend
#   ring_cpu        the CPU model: forward, backward, tree decode, precision study
#   ring_gpu.cu     the streams backend (P virtual ranks on one GPU) and the GPU rank code
#   ring_step_ch04  the one adapter to chapter 04's kernels (linked from attn_ch04)
#   ring_nccl.cu    the NCCL backend, built when NCCL is found (TUTORIAL_NCCL, default ON)
set(_ring ${CMAKE_CURRENT_LIST_DIR})
list(APPEND CH06_SOURCES ${_ring}/ring_main.cpp ${_ring}/ring_schedule.cpp ${_ring}/ring_comm.cpp
     ${_ring}/ring_cpu.cpp ${_ring}/ring_timeline.cpp)

if(TUTORIAL_CUDA)
  list(APPEND CH06_CUDA_SOURCES ${_ring}/ring_gpu.cu ${_ring}/ring_step_ch04.cu)
  list(APPEND CH06_LINK attn_ch04)  # chapter 04's final forward and its backward: the per-step kernels

  # NCCL: Debian's libnccl-dev, a CUDA toolkit that ships it, $NCCL_HOME, or the
  # NCCL inside PyTorch's pip packages (site-packages/nvidia/nccl, which ships
  # libnccl.so.2 without the unversioned link).
  option(TUTORIAL_NCCL "Build ring attention's NCCL backend when NCCL is found" ON)
  set(_nccl_hints $ENV{NCCL_HOME} ${CUDAToolkit_LIBRARY_ROOT} ${CUDAToolkit_TARGET_DIR})
  if(TUTORIAL_NCCL AND NOT CH06_NCCL_LIBRARY)
    find_program(_ring_python3 NAMES python3)
    if(_ring_python3)
      execute_process(
        COMMAND ${_ring_python3} -c "import nvidia.nccl as m; print(list(m.__path__)[0])"
        OUTPUT_VARIABLE _pip_nccl OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _pip_rc)
      if(_pip_rc EQUAL 0 AND _pip_nccl)
        list(APPEND _nccl_hints ${_pip_nccl})
      endif()
    endif()
  endif()
  if(TUTORIAL_NCCL)
    find_path(CH06_NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_hints} PATH_SUFFIXES include)
    find_library(CH06_NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_nccl_hints} PATH_SUFFIXES lib lib64
                 lib/x86_64-linux-gnu)
  endif()
  if(TUTORIAL_NCCL AND CH06_NCCL_INCLUDE_DIR AND CH06_NCCL_LIBRARY)
    message(STATUS "ch06 ring: NCCL backend with ${CH06_NCCL_LIBRARY}")
    if(NOT TARGET ch06_nccl)
      add_library(ch06_nccl INTERFACE IMPORTED)
      set_target_properties(ch06_nccl PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${CH06_NCCL_INCLUDE_DIR}"
                                                 INTERFACE_LINK_LIBRARIES "${CH06_NCCL_LIBRARY}")
    endif()
    list(APPEND CH06_CUDA_SOURCES ${_ring}/ring_nccl.cu)
    list(APPEND CH06_LINK ch06_nccl)
  else()
    message(STATUS "ch06 ring: NCCL not found (or TUTORIAL_NCCL=OFF): no nccl backend")
    list(APPEND CH06_SOURCES ${_ring}/ring_nccl_none.cpp)
  endif()
else()
  list(APPEND CH06_SOURCES ${_ring}/ring_gpu_none.cpp)
endif()
