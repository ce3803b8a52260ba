#pragma once
/// \file quant8.hpp
/// \brief Eight-bit storage formats shared by host and device code: FP8 E4M3 and
///        symmetric INT8, each with one fp32 scale per block of values (and the 4-bit
///        INT4 codes of chapter 07's KV pages, Q = 7).
///
/// A block of values x is stored as codes c with x ~ c * s, the scale chosen so the
/// block's largest magnitude lands on the format's largest code:
///
///     s = amax / Q,   Q = 448 (E4M3) or 127 (INT8),   c = round(x * (1 / s))
///
/// An all-zero block has amax = 0: its scale is 0, its inverse is taken as 0 (not
/// 1/0 = inf, which would turn 0 * inf into NaN), every code is 0 and every value
/// dequantises to 0.
///
/// **E4M3**: 1 sign, 4 exponent (bias 7) and 3 mantissa bits; no infinities; the
/// largest finite value 448 = 1.75 x 2^8, the smallest normal 2^-6, the smallest
/// subnormal 2^-9; relative rounding error at most 2^-4. **INT8**: integers in
/// [-127, 127] (-128 is not used, so the format is symmetric); absolute error at most
/// s / 2, so small entries of a block with one large entry lose their precision.
///
/// Every function here is plain fp32 and integer arithmetic with round-to-nearest-even
/// and no contraction opportunity (a product is never added to), so host and device
/// produce the same bits. Chapter 05 quantises its attention inputs with its own
/// E4M3 routines (fp8_model.hpp), which agree with these on every input.

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/hd.hpp"

namespace attn::q8 {

constexpr float kE4M3Max = 448.f;  ///< largest finite E4M3 value
constexpr float kInt8Max = 127.f;  ///< largest INT8 code used (symmetric)
constexpr float kInt4Max = 7.f;    ///< largest INT4 code used (symmetric; chapter 07's 4-bit KV pages)

ATTN_HD uint32_t f32_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
#endif
}
ATTN_HD float bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, 4);
  return x;
#endif
}

/// x as E4M3 bits: round to nearest even, |x| >= 448 saturates to +-448 (satfinite),
/// NaN -> 0x7f.
ATTN_HD uint8_t e4m3_encode(float x) {
  const uint32_t u = f32_bits(x);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;               // NaN
  if (a >= 0x43e00000u) return sign | 0x7e;       // >= 448 (and inf): saturate
  if (a < 0x3c800000u) {                          // below 2^-6: subnormal m * 2^-9
    const float m = rintf(bits_f32(a) * 512.f);   // exact scaling, then round half to even
    return sign | uint8_t(int(m));                // m = 8 is 0.0001.000, the smallest normal
  }
  // Normal: keep 3 of the 23 mantissa bits, round to nearest even (a carry moves the exponent).
  const uint32_t r = (a + 0x7ffffu + ((a >> 20) & 1u)) >> 20;  // fp32 exponent (8 bits) and 3 mantissa bits
  const int code = int(r) - ((127 - 7) << 3);                  // rebias the exponent: 127 -> 7
  return sign | uint8_t(code > 0x7e ? 0x7e : code);
}

/// The value of E4M3 bits (0x7f and 0xff are NaN).
ATTN_HD float e4m3_decode(uint8_t b) {
  const uint32_t sign = uint32_t(b & 0x80u) << 24, field = (b >> 3) & 0xfu, mant = b & 0x7u;
  if (field == 15 && mant == 7) return bits_f32(0x7fc00000u);
  if (field == 0) return bits_f32(sign | f32_bits(float(mant) * (1.f / 512.f)));
  return bits_f32(sign | ((field + 120u) << 23) | (mant << 20));
}

/// x as a symmetric INT8 code: round to nearest even, clamped to [-127, 127].
ATTN_HD int8_t int8_encode(float x) {
  if (!(x == x)) return 0;  // NaN
  const float r = rintf(x);
  return int8_t(r > kInt8Max ? kInt8Max : r < -kInt8Max ? -kInt8Max : r);
}

/// x as a symmetric INT4 code: round to nearest even, clamped to [-7, 7] (-8 is not used).
ATTN_HD int8_t int4_encode(float x) {
  if (!(x == x)) return 0;  // NaN
  const float r = rintf(x);
  return int8_t(r > kInt4Max ? kInt4Max : r < -kInt4Max ? -kInt4Max : r);
}
/// An INT4 code as the 4-bit two's complement nibble it is stored as (low 4 bits).
ATTN_HD uint8_t int4_nibble(int8_t c) { return uint8_t(c) & 0xfu; }
/// The code of a nibble (the low 4 bits of `b`; 0x8 = -8 never occurs in a valid page).
ATTN_HD int8_t int4_from_nibble(uint8_t b) { return int8_t(int(b & 0xfu) - (b & 0x8u ? 16 : 0)); }

/// The scale of a block whose largest magnitude is `amax`, for codes up to `qmax`.
ATTN_HD float block_scale(float amax, float qmax) { return amax > 0.f ? amax / qmax : 0.f; }
/// 1 / s, and 0 for the all-zero block (so that 0 * inverse is 0, never NaN).
ATTN_HD float inverse_scale(float s) { return s > 0.f ? 1.f / s : 0.f; }

}  // namespace attn::q8
