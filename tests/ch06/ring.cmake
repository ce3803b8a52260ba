# Chapter 06, part "ring": ring attention's tests.
#   tests_ch06_ring      CPU: schedule, merge, the threads ring against fp64 (every P, layout, mask), CLI
#   tests_ch06_ring_gpu  GPU: the streams ring (and the NCCL ring at P = 1 when built)
tutorial_tests(tests_ch06_ring LABEL ch06 SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_ring.cpp LINK attn_ch06)
target_compile_definitions(tests_ch06_ring PRIVATE CH06_BINARY="$<TARGET_FILE:ch06_variants>")
tutorial_tests(tests_ch06_ring_gpu LABEL ch06 GPU SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_ring_gpu.cpp
               LINK attn_ch06)
if(TARGET tests_ch06_ring_gpu)
  target_compile_definitions(tests_ch06_ring_gpu PRIVATE CH06_BINARY="$<TARGET_FILE:ch06_variants>")
endif()
