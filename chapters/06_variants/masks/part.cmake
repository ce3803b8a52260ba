# Chapter 06, part "masks": sources (see ../CMakeLists.txt for the three lists).
list(APPEND CH06_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/masks_main.cpp
  ${CMAKE_CURRENT_LIST_DIR}/mask_spec.cpp
  ${CMAKE_CURRENT_LIST_DIR}/block_map.cpp
  ${CMAKE_CURRENT_LIST_DIR}/mask_model.cpp)
