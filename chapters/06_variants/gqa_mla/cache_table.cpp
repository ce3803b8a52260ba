#include "gqa_mla/cache_table.hpp"

#include <cstdio>
#include <sstream>

#include "common/report.hpp"
#include "common/traffic.hpp"

namespace attn::ch06 {

const std::vector<ModelConfig>& model_configs() {
  // Each row is read from the model's public config.json (Hugging Face hub, the
  // repository named in `source`): num_hidden_layers, num_attention_heads,
  // num_key_value_heads and head_dim (or hidden_size / num_attention_heads where the
  // file has no head_dim). DeepSeek-V3: kv_lora_rank = 512, qk_nope_head_dim = 128,
  // qk_rope_head_dim = 64, v_head_dim = 128, num_attention_heads = 128, 61 layers.
  static const std::vector<ModelConfig> kModels = {
      {"Llama-3.1-8B", AttnKind::gqa, 32, 32, 8, 128, 128, 0, 0, 0,
       "meta-llama/Llama-3.1-8B: 32 layers, 32 heads, 8 KV heads, hidden 4096 / 32"},
      {"Llama-3.1-70B", AttnKind::gqa, 80, 64, 8, 128, 128, 0, 0, 0,
       "meta-llama/Llama-3.1-70B: 80 layers, 64 heads, 8 KV heads, hidden 8192 / 64"},
      {"Mistral-7B", AttnKind::gqa, 32, 32, 8, 128, 128, 0, 0, 0,
       "mistralai/Mistral-7B-v0.3: 32 layers, 32 heads, 8 KV heads, head_dim 128"},
      {"Qwen2.5-7B", AttnKind::gqa, 28, 28, 4, 128, 128, 0, 0, 0,
       "Qwen/Qwen2.5-7B: 28 layers, 28 heads, 4 KV heads, hidden 3584 / 28"},
      {"Gemma-2-9B", AttnKind::gqa, 42, 16, 8, 256, 256, 0, 0, 0,
       "google/gemma-2-9b: 42 layers, 16 heads, 8 KV heads, head_dim 256"},
      {"DeepSeek-V3", AttnKind::mla, 61, 128, 1, 192, 128, 512, 128, 64,
       "deepseek-ai/DeepSeek-V3: 61 layers, 128 heads, kv_lora_rank 512, qk_nope 128, qk_rope 64, v_head_dim 128"},
  };
  return kModels;
}

double cache_elems_per_token(const ModelConfig& m) {
  if (m.kind == AttnKind::mla) return double(m.d_latent + m.d_rope);
  return double(m.kv_heads) * (m.head_dim + m.dv);
}
double mha_elems_per_token(const ModelConfig& m) { return double(m.heads) * (m.head_dim + m.dv); }
double mqa_elems_per_token(const ModelConfig& m) { return double(m.head_dim + m.dv); }

double decode_flops(const ModelConfig& m, double n) {
  if (m.kind == AttnKind::mla)  // absorbed: scores over d_c + d_rope, output over d_c
    return 2.0 * n * m.heads * (m.d_latent + m.d_rope) + 2.0 * n * m.heads * m.d_latent;
  return 2.0 * n * m.heads * m.head_dim + 2.0 * n * m.heads * m.dv;  // = 4 n Hq d when d = dv
}
double decode_bytes(const ModelConfig& m, double n, int elem_bytes) {
  return n * cache_elems_per_token(m) * elem_bytes;
}

namespace {
const char* kind_name(AttnKind k) {
  switch (k) {
    case AttnKind::mha: return "MHA";
    case AttnKind::gqa: return "GQA";
    case AttnKind::mqa: return "MQA";
    case AttnKind::mla: return "MLA";
  }
  return "?";
}
}  // namespace

std::string cache_table_text() {
  std::ostringstream s;
  const double ctx = 32768;
  s << "KV cache per token and layer (bf16), and one decode step at context N (any N: both scale with N)\n";
  s << "  model            attn  layers  Hq  Hkv    d     MHA B/tok   model B/tok   MQA B/tok   saving  "
       "32K-token seq   decode FLOP/B\n";
  for (const ModelConfig& m : model_configs()) {
    char line[256];
    const double mha = 2 * mha_elems_per_token(m), own = 2 * cache_elems_per_token(m),
                 mqa = 2 * mqa_elems_per_token(m);
    const std::string d = m.kind == AttnKind::mla ? std::to_string(m.d_latent) + "+" + std::to_string(m.d_rope)
                                                   : std::to_string(m.head_dim);
    std::snprintf(line, sizeof line, "  %-16s %-4s  %6d %3d  %3d  %6s  %11.0f  %12.0f  %10.0f  %6.1fx  %13s  %14.2f\n",
                  m.name.c_str(), kind_name(m.kind), m.layers, m.heads, m.kv_heads, d.c_str(), mha, own, mqa,
                  mha / own, format_bytes(own * m.layers * ctx).c_str(),
                  decode_flops(m, ctx) / decode_bytes(m, ctx));
    s << line;
  }
  s << "  (saving = MHA / model. GQA caches Hkv/Hq of MHA, not 1/N. DeepSeek-V3's MHA yardstick is 128 heads x\n"
       "   (192 + 128); against DeepSeek-V2's 2 x 128 x 128 = 32,768 the 576-element latent is 57x smaller.\n"
       "   Decode FLOPs: 4 N Hq d (GQA), 2 N Hq (576 + 512) for MLA absorbed; bytes: the cache read once.\n"
       "   Gemma-2 alternates sliding-window (4096) and global layers: half its layers keep at most 4096\n"
       "   tokens, so its 32K-sequence figure is an upper bound.)\n";
  return s.str();
}

std::string cache_table_json() {
  std::ostringstream s;
  s << "[";
  bool first = true;
  for (const ModelConfig& m : model_configs()) {
    s << (first ? "" : ", ") << "{\"model\": \"" << json_escape(m.name) << "\", \"attn\": \"" << kind_name(m.kind)
      << "\", \"layers\": " << m.layers << ", \"heads\": " << m.heads << ", \"kv_heads\": " << m.kv_heads
      << ", \"head_dim\": " << m.head_dim << ", \"dv\": " << m.dv << ", \"mha_bytes_per_token_layer\": "
      << 2 * mha_elems_per_token(m) << ", \"bytes_per_token_layer\": " << 2 * cache_elems_per_token(m)
      << ", \"mqa_bytes_per_token_layer\": " << 2 * mqa_elems_per_token(m)
      << ", \"decode_flops_per_byte\": " << decode_flops(m, 1) / decode_bytes(m, 1) << "}";
    first = false;
  }
  s << "]";
  return s.str();
}

}  // namespace attn::ch06
