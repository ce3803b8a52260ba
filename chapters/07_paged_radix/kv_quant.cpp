// The KV formats' names, and their codes packed into bytes (see kv_quant.hpp).
#include "kv_quant.hpp"

namespace attn::ch07 {

const char* kv_dtype_name(KvDtype t) {
  switch (t) {
    case KvDtype::bf16: return "bf16";
    case KvDtype::fp8: return "fp8";
    case KvDtype::int8: return "int8";
    case KvDtype::int4: return "int4";
  }
  return "?";
}

bool parse_kv_dtype(const std::string& s, KvDtype* out) {
  if (s == "bf16") *out = KvDtype::bf16;
  else if (s == "fp8" || s == "e4m3") *out = KvDtype::fp8;
  else if (s == "int8") *out = KvDtype::int8;
  else if (s == "int4") *out = KvDtype::int4;
  else return false;
  return true;
}

std::vector<uint8_t> kv_pack_codes(KvDtype t, const float* codes, std::size_t n) {
  if (t != KvDtype::int4) {
    std::vector<uint8_t> out(n);
    for (std::size_t i = 0; i < n; ++i) out[i] = kv_code_byte(t, codes[i]);
    return out;
  }
  std::vector<uint8_t> out((n + 1) / 2, 0);
  for (std::size_t i = 0; i < n; ++i) out[i / 2] |= q8::int4_nibble(int8_t(codes[i])) << (4 * (i % 2));
  return out;
}

std::vector<float> kv_unpack_codes(KvDtype t, const uint8_t* bytes, std::size_t n) {
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (t == KvDtype::int4) out[i] = float(q8::int4_from_nibble(uint8_t(bytes[i / 2] >> (4 * (i % 2)))));
    else if (t == KvDtype::fp8) out[i] = q8::e4m3_decode(bytes[i]);
    else out[i] = float(int8_t(bytes[i]));
  }
  return out;
}

}  // namespace attn::ch07
