# Chapter 06, part "gqa_mla": sources (see ../CMakeLists.txt for the three lists).
list(APPEND CH06_SOURCES ${CMAKE_CURRENT_LIST_DIR}/gqa_mla_main.cpp ${CMAKE_CURRENT_LIST_DIR}/cache_table.cpp
     ${CMAKE_CURRENT_LIST_DIR}/grouped_model.cpp ${CMAKE_CURRENT_LIST_DIR}/mla_model.cpp)
