# Chapter 06, part "gqa_mla": sources (see ../CMakeLists.txt for the three lists).
list(APPEND CH06_SOURCES ${CMAKE_CURRENT_LIST_DIR}/gqa_mla_main.cpp ${CMAKE_CURRENT_LIST_DIR}/cache_table.cpp
     ${CMAKE_CURRENT_LIST_DIR}/grouped_model.cpp ${CMAKE_CURRENT_LIST_DIR}/mla_model.cpp)
list(APPEND CH06_CUDA_SOURCES ${CMAKE_CURRENT_LIST_DIR}/gqa_mla_gpu.cu ${CMAKE_CURRENT_LIST_DIR}/mla_decode.cu
     ${CMAKE_CURRENT_LIST_DIR}/ampere_packed.cu)
list(APPEND CH06_HOPPER_SOURCES ${CMAKE_CURRENT_LIST_DIR}/packed_fwd.cu ${CMAKE_CURRENT_LIST_DIR}/mla_decode_sm90.cu
     ${CMAKE_CURRENT_LIST_DIR}/mla_final.cu)
