# Chapter 06, part "masks": sources (see ../CMakeLists.txt for the three lists).
list(APPEND CH06_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/masks_main.cpp
  ${CMAKE_CURRENT_LIST_DIR}/mask_spec.cpp
  ${CMAKE_CURRENT_LIST_DIR}/block_map.cpp
  ${CMAKE_CURRENT_LIST_DIR}/mask_model.cpp
  ${CMAKE_CURRENT_LIST_DIR}/model_cases.cpp)
# sm_80+: the host side, the forward from chapter 04's v9, the backward from chapter 04's.
list(APPEND CH06_CUDA_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/mask_gpu.cu
  ${CMAKE_CURRENT_LIST_DIR}/ampere_mask.cu
  ${CMAKE_CURRENT_LIST_DIR}/backward_mask.cu)
# sm_90a: the forward from chapter 05's v8 (hopper_mask.cu), then the main path's four steps
# (steps/): two Q buffers, the tile boundary overlapped, tiles from each document's start, row
# spans; and the final masked forward (steps/final.cu: v4 with its configuration in one table;
# its fp16 kernels in final_fp16.cu, a translation unit of their own that compiles beside it);
# the sm90a masked backward (hopper_backward.cu: chapter 05's final backward with the policy; its
# fp16 kernels in hopper_backward_fp16.cu).
list(APPEND CH06_HOPPER_SOURCES ${CMAKE_CURRENT_LIST_DIR}/hopper_mask.cu
  ${CMAKE_CURRENT_LIST_DIR}/steps/v1_two_q_buffers.cu ${CMAKE_CURRENT_LIST_DIR}/steps/v2_tile_overlap.cu
  ${CMAKE_CURRENT_LIST_DIR}/steps/v3_document_tiles.cu ${CMAKE_CURRENT_LIST_DIR}/steps/v4_row_spans.cu
  ${CMAKE_CURRENT_LIST_DIR}/steps/final.cu ${CMAKE_CURRENT_LIST_DIR}/final_fp16.cu
  ${CMAKE_CURRENT_LIST_DIR}/hopper_backward.cu ${CMAKE_CURRENT_LIST_DIR}/hopper_backward_fp16.cu)
# The lab (TUTORIAL_LAB=ON): step 5, v4 with every tile's epilogue in place (LAB.md).
list(APPEND CH06_LAB_HOPPER_SOURCES ${CMAKE_CURRENT_LIST_DIR}/steps/lab/v5_epilogue_in_place.cu)
