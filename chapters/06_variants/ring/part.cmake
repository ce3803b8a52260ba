# Chapter 06, part "ring": sources (see ../CMakeLists.txt for the three lists).
list(APPEND CH06_SOURCES ${CMAKE_CURRENT_LIST_DIR}/ring_main.cpp)
