#pragma once
/// \file kv_quant.hpp
/// \brief The KV cache in 8 or 4 bits: FP8 E4M3, INT8 or INT4 codes with one fp32 scale
///        per (page, KV head), chosen when the page is written.
///
/// Decode reads every cached key and value once per step, so the bytes of the cache
/// are its cost: storing K and V in one byte instead of two halves the bytes of a
/// step, and doubles the tokens that fit in the pool. The format of this chapter:
///
///     page p, KV head hk:   codes c[slot][dim] (1 byte each)   and   scale s[p][hk] (fp32)
///     value = bf16(c * s)            s = amax(|x| over the page's slots of that head) / Q
///
/// with Q = 448 for E4M3, 127 for INT8 and 7 for INT4 (common/quant8.hpp). One scale
/// covers P * d values of one head: 2048 at P = 16, d = 128, a 0.2% overhead in bytes
/// (0.4% at INT4's half a byte per value).
///
/// **INT4** stores two codes in [-7, 7] per byte (4-bit two's complement, -8 unused):
/// element 2i in the low nibble of byte i, element 2i + 1 in the high one; an odd count
/// leaves the last high nibble 0. The decode kernels unpack a nibble to f16 exactly (the
/// exponent trick of INT8, four bits at a time), so INT4 pages run v1-v3 as INT8 pages do.
///
/// **Written token by token.** A page fills one token at a time during decode. The
/// first token sets the scale to its amax / Q. A later token whose largest magnitude
/// fits under the scale is quantised with it; one that does not doubles the scale until
/// it fits, and the slots already in the page are quantised again from their values.
/// Powers of two keep the requantisations from compounding: an E4M3 code just shifts
/// its exponent (exact unless it leaves the normal range), and INT8's errors (half a
/// step of each grid: s/2 + s/4 + ...) stay under one step of the final grid. The price
/// is a scale up to twice the page's amax / Q, one bit of INT8 precision on a page that
/// grew. The scale never shrinks while the page lives. A page written whole (prefill,
/// and the GPU's pools) gets amax / Q of all its slots at once. A fresh page starts at scale 0 with zero codes, and an all-zero
/// page keeps scale 0: its values are 0, never 0 * inf = NaN.
///
/// **Dequantised value.** An element's value is code * scale in fp32. The decode
/// kernels never form it: they convert the codes to f16 (exact), multiply Q by them on
/// the tensor cores, and put the scales on the products (S's column j times key j's K
/// scale, P's column j times its V scale), which is the same sum up to fp32 rounding;
/// the fp64 check uses code * scale.

#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.hpp"
#include "common/quant8.hpp"

namespace attn::ch07 {

/// How the KV cache stores its elements.
enum class KvDtype { bf16, fp8, int8, int4 };

const char* kv_dtype_name(KvDtype t);
/// "bf16", "fp8" (or "e4m3"), "int8", "int4"; false otherwise.
bool parse_kv_dtype(const std::string& s, KvDtype* out);
/// Bits of one stored element: 16, 8 or 4.
constexpr int kv_code_bits(KvDtype t) { return t == KvDtype::bf16 ? 16 : t == KvDtype::int4 ? 4 : 8; }
/// Bytes of one stored element (0.5 for INT4).
constexpr double kv_elem_bytes(KvDtype t) { return kv_code_bits(t) / 8.0; }
/// Bytes of a row of `d` elements (INT4: d / 2 rounded up).
constexpr int kv_row_bytes(KvDtype t, int d) { return (d * kv_code_bits(t) + 7) / 8; }
constexpr bool kv_quantised(KvDtype t) { return t != KvDtype::bf16; }
/// The largest code: 448 (E4M3), 127 (INT8) or 7 (INT4).
constexpr float kv_qmax(KvDtype t) {
  return t == KvDtype::fp8 ? q8::kE4M3Max : t == KvDtype::int4 ? q8::kInt4Max : q8::kInt8Max;
}

/// The code of x (already multiplied by the inverse scale), held as a float: an E4M3
/// value, an integer in [-127, 127] or one in [-7, 7].
inline float kv_code(KvDtype t, float x_times_inv) {
  if (t == KvDtype::fp8) return q8::e4m3_decode(q8::e4m3_encode(x_times_inv));
  if (t == KvDtype::int4) return float(q8::int4_encode(x_times_inv));
  return float(q8::int8_encode(x_times_inv));
}
/// The stored byte of an 8-bit code.
inline uint8_t kv_code_byte(KvDtype t, float code) {
  return t == KvDtype::fp8 ? q8::e4m3_encode(code) : uint8_t(int8_t(code));
}
/// Codes (as floats, a code of `t` each) in their stored form: one byte each for FP8 and
/// INT8, two per byte for INT4 (nibble order above).
std::vector<uint8_t> kv_pack_codes(KvDtype t, const float* codes, std::size_t n);
/// The inverse of kv_pack_codes(): `n` codes from their stored bytes.
std::vector<float> kv_unpack_codes(KvDtype t, const uint8_t* bytes, std::size_t n);
/// The value of a code under its page's scale: code * scale (fp32).
inline float kv_dequant(float code, float scale) { return code * scale; }

}  // namespace attn::ch07
