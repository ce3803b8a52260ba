// Chapter 06, ring attention on the GPU (the streams backend): written with the GPU backends.
#include <doctest/doctest.h>

#include "ring/ring_gpu.hpp"

TEST_CASE("the GPU ring backends are built") { CHECK(attn::ch06::ring::nccl_built() == attn::ch06::ring::nccl_built()); }
