#include "common/dtype.hpp"

namespace attn {

bool parse_dtype(const std::string& s, DType* out) {
  if (s == "fp32" || s == "f32" || s == "float") { *out = DType::f32; return true; }
  if (s == "fp16" || s == "f16" || s == "half") { *out = DType::f16; return true; }
  if (s == "bf16") { *out = DType::bf16; return true; }
  return false;
}

uint16_t float_to_half_bits(float x) {
  const uint32_t u = float_bits(x);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u); // rounds to >= 65520: inf
  if (a < 0x38800000u) {                                 // below 2^-14: subnormal or zero
    // Shift the 24-bit significand into place and round to nearest even.
    if (a < 0x33000000u) return sign;                    // below 2^-25: rounds to zero
    const uint32_t e = a >> 23;
    const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - e;                     // 14..24 for this range
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return uint16_t(sign | h);
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits.
  uint32_t h = ((a - 0x38000000u) >> 13);
  const uint32_t rem = a & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return uint16_t(sign | h);
}

float half_bits_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x3ffu;
  if (e == 0) {
    // zero or subnormal: m * 2^-24
    const float v = std::ldexp(float(m), -24);
    return (sign ? -v : v);
  }
  if (e == 31) return bits_float(sign | 0x7f800000u | (m << 13));
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

}  // namespace attn
