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

# (the GPU backends are being written: until then every build uses the stub)
list(APPEND CH06_SOURCES ${_ring}/ring_gpu_none.cpp)
