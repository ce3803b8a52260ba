#pragma once
/// \file dtype.hpp
/// \brief Element types of the tensors every chapter moves, and host-side rounding.
///
/// Host code keeps every tensor as `float` whose values are exactly representable
/// in the tensor's element type, so the CPU models, the fp64 reference and the
/// kernels all see the same numbers. `round_to()` performs that quantisation with
/// round-to-nearest-even, written here without any CUDA header so the CPU-only
/// build needs none.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

namespace attn {

/// Storage type of the inputs and outputs (accumulation is always fp32).
enum class DType { f32, f16, bf16 };

/// Bytes one element occupies in global memory.
constexpr int dtype_bytes(DType t) { return t == DType::f32 ? 4 : 2; }

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "fp32";
    case DType::f16: return "fp16";
    case DType::bf16: return "bf16";
  }
  return "?";
}

/// Parses "fp32" / "f32" / "float", "fp16" / "half", "bf16"; returns false otherwise.
bool parse_dtype(const std::string& s, DType* out);

/// Unit roundoff u = 2^-p of the type (half the distance from 1 to the next number).
constexpr double dtype_unit_roundoff(DType t) {
  return t == DType::f32 ? 5.9604644775390625e-08    // 2^-24
       : t == DType::f16 ? 4.8828125e-04             // 2^-11
                         : 3.90625e-03;              // 2^-8
}

inline uint32_t float_bits(float x) { uint32_t u; std::memcpy(&u, &x, 4); return u; }
inline float bits_float(uint32_t u) { float x; std::memcpy(&x, &u, 4); return x; }

/// fp32 -> bf16 bits, round to nearest even; NaN stays NaN.
inline uint16_t float_to_bf16_bits(float x) {
  uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
inline float bf16_bits_to_float(uint16_t h) { return bits_float(uint32_t(h) << 16); }

/// fp32 -> IEEE binary16 bits, round to nearest even, with subnormals and overflow to inf.
uint16_t float_to_half_bits(float x);
float half_bits_to_float(uint16_t h);

/// The value `x` takes once stored as `t` (identity for fp32).
inline float round_to(DType t, float x) {
  switch (t) {
    case DType::f32: return x;
    case DType::bf16: return bf16_bits_to_float(float_to_bf16_bits(x));
    case DType::f16: return half_bits_to_float(float_to_half_bits(x));
  }
  return x;
}

}  // namespace attn
