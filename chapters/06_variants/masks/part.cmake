# Chapter 06, part "masks": sources (see ../CMakeLists.txt for the three lists).
list(APPEND CH06_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/masks_main.cpp
  ${CMAKE_CURRENT_LIST_DIR}/mask_spec.cpp
  ${CMAKE_CURRENT_LIST_DIR}/block_map.cpp
  ${CMAKE_CURRENT_LIST_DIR}/mask_model.cpp)
# sm_80+: the host side, the forward from chapter 04's last step, the backward from chapter 04's.
list(APPEND CH06_CUDA_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/mask_gpu.cu
  ${CMAKE_CURRENT_LIST_DIR}/steps/ampere_mask.cu
  ${CMAKE_CURRENT_LIST_DIR}/steps/backward_mask.cu)
# sm_90a: the forward from chapter 05's last bf16 step.
# Its steps: two Q buffers, one pipeline across tiles, tiles from each document's start, row spans.
list(APPEND CH06_HOPPER_SOURCES ${CMAKE_CURRENT_LIST_DIR}/steps/hopper_mask.cu
  ${CMAKE_CURRENT_LIST_DIR}/steps/v1_two_q_buffers.cu ${CMAKE_CURRENT_LIST_DIR}/steps/v2_tile_overlap.cu
  ${CMAKE_CURRENT_LIST_DIR}/steps/v3_document_tiles.cu ${CMAKE_CURRENT_LIST_DIR}/steps/v4_row_spans.cu)
