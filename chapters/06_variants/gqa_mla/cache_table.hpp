#pragma once
/// \file cache_table.hpp
/// \brief What a KV cache costs per token, computed from real model configurations.
///
/// A decoder layer caches, for every token it has seen, one key and one value per KV
/// head. For a model with Hq query heads, Hkv KV heads of dimension d:
///
///     MHA   (Hkv = Hq)       2 * Hq  * d   elements per token and layer
///     GQA   (1 < Hkv < Hq)   2 * Hkv * d   = Hkv / Hq of MHA's        (not "1/N", as the study notes say)
///     MQA   (Hkv = 1)        2 * d
///     MLA   (DeepSeek)       d_c + d_rope  (the latent c and the shared RoPE key)
///
/// DeepSeek-V3's MLA caches 512 + 64 = 576 elements where its MHA (128 heads of
/// d_qk = 192 keys and d_v = 128 values) would cache 128 * (192 + 128) = 40,960: 71x less.
/// Measured against DeepSeek-V2's MHA yardstick (2 * 128 * 128 = 32,768) it is 57x, not
/// the "~32x" of the study notes; the DeepSeek-V2 paper (Table 1) states the
/// same thing as "equal to GQA with 2.25 groups" (576 = 2.25 * 2 * 128).
///
/// **Decode intensity.** One decode step of one sequence at context N reads the whole
/// cache once and, per query head, does Q K^T and P V over N keys:
///
///     FLOPs = 4 * N * Hq * d        (2 N d for each product and head; the study notes said 2 N H d)
///     bytes = N * (cache elements per token) * bytes per element
///
/// so in bf16 MHA does about 1 FLOP per byte and GQA about Hq / Hkv: far below the ~185
/// FLOP/byte at which an H200 turns compute-bound (800 TFLOP/s bf16 GEMM over 4.35 TB/s, both measured). MLA, in its absorbed form, does
/// 2 N Hq (576 + 512) FLOPs over N * 576 * 2 bytes: about 1.9 Hq FLOP/byte, 242 for Hq = 128.

#include <string>
#include <vector>

namespace attn::ch06 {

enum class AttnKind { mha, gqa, mqa, mla };

/// One model's attention shape (per layer), with the source of the numbers.
struct ModelConfig {
  std::string name;
  AttnKind kind;
  int layers = 0;
  int heads = 0;     ///< query heads Hq
  int kv_heads = 0;  ///< KV heads Hkv (MLA: 1 latent head shared by all)
  int head_dim = 0;  ///< d of K and V (MLA: d_nope + d_rope of the keys)
  int dv = 0;        ///< value head dim (= head_dim except MLA)
  // MLA only
  int d_latent = 0;  ///< d_c = kv_lora_rank
  int d_nope = 0, d_rope = 0;
  std::string source;  ///< config.json fields it was read from
};

/// The six configurations the chapter prints (public config.json files; see the .cpp).
const std::vector<ModelConfig>& model_configs();

/// Elements cached per token and layer by the model as it is (its own GQA / MLA).
double cache_elems_per_token(const ModelConfig& m);
/// Elements the same model would cache per token and layer with full MHA (Hkv = Hq).
double mha_elems_per_token(const ModelConfig& m);
/// ... with MQA (one KV head of the model's head dims).
double mqa_elems_per_token(const ModelConfig& m);

/// FLOPs of one decode step of one sequence at context n, one layer (4 n Hq d for
/// MHA/GQA/MQA; 2 n Hq (d_c + d_rope + d_c) for MLA's absorbed form).
double decode_flops(const ModelConfig& m, double n);
/// Bytes of cache that step reads (every cached element once), at `elem_bytes` each.
double decode_bytes(const ModelConfig& m, double n, int elem_bytes = 2);

/// One printed row per model: bytes per token per layer (MHA / as built / MQA), the
/// whole-model cache of a 32K-token sequence, and the decode intensity.
std::string cache_table_text();
/// The same as a JSON array.
std::string cache_table_json();

}  // namespace attn::ch06
