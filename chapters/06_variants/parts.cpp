#include "parts.hpp"

namespace attn::ch06 {

const Part* parts(int* count) {
  static const Part kParts[] = {
      {"mask", "masks and score modifiers through one policy interface, with a block map", mask_main},
      {"gqa", "GQA/MQA: K/V loaded once per group of query heads", gqa_main},
      {"mla", "MLA (DeepSeek-V3): decompressed prefill and absorbed decode", mla_main},
      {"ring", "ring attention: K/V rotate over P ranks, partials merge with the LSE form of ⊕", ring_main},
  };
  *count = int(sizeof(kParts) / sizeof(kParts[0]));
  return kParts;
}

}  // namespace attn::ch06
