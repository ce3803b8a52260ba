// The 8-bit KV formats' names (see kv_quant.hpp).
#include "kv_quant.hpp"

namespace attn::ch07 {

const char* kv_dtype_name(KvDtype t) {
  switch (t) {
    case KvDtype::bf16: return "bf16";
    case KvDtype::fp8: return "fp8";
    case KvDtype::int8: return "int8";
  }
  return "?";
}

bool parse_kv_dtype(const std::string& s, KvDtype* out) {
  if (s == "bf16") *out = KvDtype::bf16;
  else if (s == "fp8" || s == "e4m3") *out = KvDtype::fp8;
  else if (s == "int8") *out = KvDtype::int8;
  else return false;
  return true;
}

}  // namespace attn::ch07
