# Chapter 06, part "gqa_mla": the cache table, the packed GQA model, MLA's two forms
# against the fp64 reference (CPU), and the kernels (GPU).
tutorial_tests(tests_ch06_gqa_mla LABEL ch06
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gqa_model.cpp ${CMAKE_CURRENT_LIST_DIR}/test_mla_model.cpp
          ${CMAKE_CURRENT_LIST_DIR}/test_gqa_mla_cli.cpp
  LINK attn_ch06)
target_compile_definitions(tests_ch06_gqa_mla PRIVATE CH06_BINARY="$<TARGET_FILE:ch06_variants>")
add_dependencies(tests_ch06_gqa_mla ch06_variants)
tutorial_tests(tests_ch06_gqa_mla_gpu LABEL ch06 GPU
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gqa_gpu.cpp ${CMAKE_CURRENT_LIST_DIR}/test_mla_gpu.cpp
  LINK attn_ch06)
