#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "common/dtype.hpp"

using namespace attn;

TEST_CASE("bf16 rounding is round-to-nearest-even on known values") {
  CHECK(round_to(DType::bf16, 1.0f) == 1.0f);
  // 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties go to the even 1.0.
  CHECK(round_to(DType::bf16, 1.0f + 0x1.0p-8f) == 1.0f);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: ties to the even 1 + 2^-6.
  CHECK(round_to(DType::bf16, 1.0f + 3 * 0x1.0p-8f) == 1.0f + 0x1.0p-6f);
  CHECK(round_to(DType::bf16, 1.0f + 0x1.8p-8f) == 1.0f + 0x1.0p-7f);  // above halfway rounds up
  CHECK(round_to(DType::bf16, -2.5f) == -2.5f);
  CHECK(std::isnan(round_to(DType::bf16, std::numeric_limits<float>::quiet_NaN())));
  CHECK(std::isinf(round_to(DType::bf16, std::numeric_limits<float>::infinity())));
}

TEST_CASE("fp16 rounding: normals, subnormals, overflow") {
  CHECK(round_to(DType::f16, 1.0f) == 1.0f);
  CHECK(round_to(DType::f16, 65504.0f) == 65504.0f);      // largest half
  CHECK(std::isinf(round_to(DType::f16, 65520.0f)));       // halfway to 2^16 rounds to inf
  CHECK(round_to(DType::f16, 65519.0f) == 65504.0f);
  CHECK(round_to(DType::f16, 0x1.0p-24f) == 0x1.0p-24f);   // smallest subnormal
  CHECK(round_to(DType::f16, 0x1.0p-25f) == 0.0f);         // halfway to it: ties to even (0)
  CHECK(round_to(DType::f16, 0x1.8p-25f) == 0x1.0p-24f);
  CHECK(round_to(DType::f16, 1.0f + 0x1.0p-11f) == 1.0f);  // tie to even
  CHECK(round_to(DType::f16, 1.0f + 0x1.0p-10f) == 1.0f + 0x1.0p-10f);
  CHECK(std::isnan(round_to(DType::f16, std::numeric_limits<float>::quiet_NaN())));
  // Every half bit pattern survives a round trip through float.
  int mismatches = 0;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = half_bits_to_float(uint16_t(h));
    if (std::isnan(f)) continue;
    if (float_to_half_bits(f) != h) ++mismatches;
  }
  CHECK(mismatches == 0);
}

TEST_CASE("dtype names and sizes") {
  DType t;
  CHECK(parse_dtype("bf16", &t));
  CHECK(t == DType::bf16);
  CHECK(parse_dtype("fp16", &t));
  CHECK(t == DType::f16);
  CHECK_FALSE(parse_dtype("int8", &t));
  CHECK(dtype_bytes(DType::f32) == 4);
  CHECK(dtype_bytes(DType::bf16) == 2);
}
