# Chapter 06, part "masks": the CPU tests (models against the fp64 reference, the
# policies, the block map, the command line, the exercises) and the GPU tests.
tutorial_tests(tests_ch06_masks LABEL ch06
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_masks.cpp ${CMAKE_CURRENT_LIST_DIR}/test_mask_cli.cpp
  LINK attn_ch06)
if(TUTORIAL_CUDA)
  tutorial_tests(tests_ch06_masks_gpu LABEL ch06 GPU SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_mask_gpu.cpp LINK attn_ch06)
else()
  # tutorial_tests names its placeholder after the label, which the other parts of
  # chapter 06 share: this part's placeholder has its own name.
  add_test(NAME ch06.gpu.masks_not_built
           COMMAND ${CMAKE_COMMAND} -E echo "CUDA toolkit not found: GPU tests of ch06 masks not built")
  set_tests_properties(ch06.gpu.masks_not_built PROPERTIES
    LABELS "gpu;ch06" SKIP_REGULAR_EXPRESSION "CUDA toolkit not found")
endif()
