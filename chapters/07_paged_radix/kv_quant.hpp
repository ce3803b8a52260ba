#pragma once
/// \file kv_quant.hpp
/// \brief The KV cache in 8 bits: FP8 E4M3 or INT8 codes with one fp32 scale per
///        (page, KV head), chosen when the page is written.
///
/// Decode reads every cached key and value once per step, so the bytes of the cache
/// are its cost: storing K and V in one byte instead of two halves the bytes of a
/// step, and doubles the tokens that fit in the pool. The format of this chapter:
///
///     page p, KV head hk:   codes c[slot][dim] (1 byte each)   and   scale s[p][hk] (fp32)
///     value = bf16(c * s)            s = amax(|x| over the page's slots of that head) / Q
///
/// with Q = 448 for E4M3 and 127 for INT8 (common/quant8.hpp). One scale covers
/// P * d values of one head: 2048 at P = 16, d = 128, a 0.2% overhead in bytes.
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

#include "common/dtype.hpp"
#include "common/quant8.hpp"

namespace attn::ch07 {

/// How the KV cache stores its elements.
enum class KvDtype { bf16, fp8, int8 };

const char* kv_dtype_name(KvDtype t);
/// "bf16", "fp8" (or "e4m3"), "int8"; false otherwise.
bool parse_kv_dtype(const std::string& s, KvDtype* out);
/// Bytes of one stored element.
constexpr int kv_elem_bytes(KvDtype t) { return t == KvDtype::bf16 ? 2 : 1; }
constexpr bool kv_quantised(KvDtype t) { return t != KvDtype::bf16; }
/// The largest code: 448 (E4M3) or 127 (INT8).
constexpr float kv_qmax(KvDtype t) { return t == KvDtype::fp8 ? q8::kE4M3Max : q8::kInt8Max; }

/// The code of x (already multiplied by the inverse scale), held as a float: an E4M3
/// value or an integer in [-127, 127].
inline float kv_code(KvDtype t, float x_times_inv) {
  return t == KvDtype::fp8 ? q8::e4m3_decode(q8::e4m3_encode(x_times_inv)) : float(q8::int8_encode(x_times_inv));
}
/// The stored byte of a code.
inline uint8_t kv_code_byte(KvDtype t, float code) {
  return t == KvDtype::fp8 ? q8::e4m3_encode(code) : uint8_t(int8_t(code));
}
/// The value of a code under its page's scale: code * scale (fp32).
inline float kv_dequant(float code, float scale) { return code * scale; }

}  // namespace attn::ch07
