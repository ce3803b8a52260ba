/* The C ABI of the lineage kernels, for python/attn_lineage (ctypes) and any other caller.
 *
 * Every function takes raw device pointers, sizes and a cudaStream_t (as void*; NULL is the
 * legacy default stream), and returns 0 on success or a nonzero code with a one-line reason
 * written into `err` (at most err_len bytes, NUL-terminated). No function aborts the process
 * or prints anything.
 *
 * Layout: every tensor contiguous, [batch][head][sequence][dim], d fastest (the project's
 * layout, DEVELOPERS.md); 16-byte aligned base pointers. K and V have kv_heads heads; query
 * head h reads KV head h / (heads / kv_heads). Causal masking is bottom-right aligned
 * (query i sees key j iff j <= i + nk - nq); an empty row has output 0 and LSE -inf.
 */
#ifndef ATTN_LINEAGE_C_H
#define ATTN_LINEAGE_C_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Return codes. */
#define ATTN_LINEAGE_OK 0
#define ATTN_LINEAGE_BAD_ARGUMENT 1 /* a size, dtype or head dim with no kernel */
#define ATTN_LINEAGE_NO_KERNEL 2    /* this GPU has no kernel (the kernels are sm_90a) */
#define ATTN_LINEAGE_CUDA_ERROR 3   /* a CUDA call failed */

/* Data types (the values of common/dtype.hpp's names are not part of the ABI). */
#define ATTN_LINEAGE_BF16 0
#define ATTN_LINEAGE_F16 1

/* The formats of an 8-bit KV cache (chapter 07's kv_quant.hpp): one byte a code. */
#define ATTN_LINEAGE_KV_FP8_E4M3 2
#define ATTN_LINEAGE_KV_INT8 3

/* The ABI version: changes whenever a signature below changes (2: the paged decode; 3: the
 * masked forward and the MLA decode; 4: the paged decode over 8-bit pages; 5: the masked
 * backward). */
int attn_lineage_abi_version(void);

/* 0 when `device` runs the kernels of this library (compute capability 9.0, built for
 * sm_90a), else ATTN_LINEAGE_NO_KERNEL or ATTN_LINEAGE_CUDA_ERROR with the reason. */
int attn_lineage_device_ready(int device, char* err, size_t err_len);

/* Chapter 05's final forward (steps/final.cu): O [B][Hq][Nq][d] in the input dtype and the
 * LSE [B][Hq][Nq] in fp32, natural log. d in {64, 128, 256}. scale: the softmax scale tau
 * (0: 1/sqrt(d)). */
int attn_lineage_fa3_forward(int device, void* stream, int dtype, const void* q, const void* k, const void* v,
                             void* o, float* lse, int batch, int heads, int kv_heads, int nq, int nk, int d,
                             float scale, int causal, char* err, size_t err_len);

/* Bytes of scratch memory attn_lineage_fa3_backward needs (any alignment of 256 bytes). */
int attn_lineage_fa3_backward_workspace(int batch, int heads, int nq, int d, size_t* bytes, char* err,
                                        size_t err_len);

/* Chapter 05's final backward (steps/final_backward.cu, with the preprocess and postprocess
 * of backward_prepost.cuh): dQ, dK, dV in the input dtype from Q, K, V, O, dO and the
 * forward's LSE. d in {64, 128}. dk and dv are [B][Hkv][Nk][d] (GQA: summed over the group).
 * workspace: attn_lineage_fa3_backward_workspace() bytes, 256-byte aligned. */
int attn_lineage_fa3_backward(int device, void* stream, int dtype, const void* q, const void* k, const void* v,
                              const void* o, const void* dout, const float* lse, void* dq, void* dk, void* dv,
                              void* workspace, size_t workspace_bytes, int batch, int heads, int kv_heads, int nq,
                              int nk, int d, float scale, int causal, int deterministic, char* err, size_t err_len);

/* Chapter 07's final bf16 paged decode (steps/final_bf16.cu): one query token per sequence.
 * q [B][Hq][d] and o [B][Hq][d] bf16, lse [B][Hq] fp32 natural log. The pools are
 * [pages][Hkv][page_size][d] bf16 (chapter 07's
 * layout); block_table [B][max_pages] int32 names the page of each sequence's tokens
 * t / page_size; seqlens [B] int32, each in [1, max_pages * page_size]. page_size: a power of two.
 * d in {64, 128}. The block table's entries and the lengths live on the device and are not
 * checked: a page index outside the pool reads outside it.
 * workspace: attn_lineage_paged_decode_workspace() bytes, 256-byte aligned. */
int attn_lineage_paged_decode_workspace(int device, int batch, int heads, int kv_heads, int d, int max_pages,
                                        int page_size, size_t* bytes, char* err, size_t err_len);
int attn_lineage_paged_decode(int device, void* stream, const void* q, const void* k_pool, const void* v_pool,
                              const int* block_table, const int* seqlens, void* o, float* lse, void* workspace,
                              size_t workspace_bytes, int batch, int heads, int kv_heads, int d, int max_pages,
                              int page_size, float scale, char* err, size_t err_len);

/* Chapter 07's final 8-bit paged decode (steps/final_8bit.cu, Hopper): as the bf16 decode above,
 * over pages of 8-bit codes. kv_format: ATTN_LINEAGE_KV_FP8_E4M3 or ATTN_LINEAGE_KV_INT8.
 * k_codes, v_codes [num_pages][Hkv][page_size][d], one byte a code (E4M3, or int8 in
 * [-127, 127]); k_scale, v_scale [num_pages][Hkv] fp32: an element's value is code * scale,
 * one scale per (page, KV head) (chapter 07's kv_quant.hpp). d = 128; page_size a power of two
 * of at least 8 tokens (the kernel copies pages by TMA boxes). num_pages: the pool's pages (the
 * tensor maps' extent). Every argument is checked before the device.
 * workspace: attn_lineage_paged_decode_8bit_workspace() bytes, 256-byte aligned. */
int attn_lineage_paged_decode_8bit_workspace(int device, int kv_format, int batch, int heads, int kv_heads, int d,
                                             int max_pages, int page_size, size_t* bytes, char* err,
                                             size_t err_len);
int attn_lineage_paged_decode_8bit(int device, void* stream, int kv_format, const void* q, const void* k_codes,
                                   const void* v_codes, const float* k_scale, const float* v_scale,
                                   const int* block_table, const int* seqlens, void* o, float* lse, void* workspace,
                                   size_t workspace_bytes, int batch, int heads, int kv_heads, int d, int num_pages,
                                   int max_pages, int page_size, float scale, char* err, size_t err_len);

/* Chapter 06's final masked forward (masks/steps/final.cu): O and the LSE as
 * attn_lineage_fa3_forward's, bf16 or fp16, d in {64, 128, 256}, GQA. The mask, one of:
 *
 *  - a window (FlashAttention's window_size): query i at key position q = i + nk - nq sees key
 *    j iff j >= q - window_left (window_left >= 0; -1: no left bound) and j <= q + window_right
 *    (-1: no right bound); causal = 1 sets the right bound to 0. No window and causal = 0: dense.
 *  - softcap > 0 (score = softcap tanh(s / softcap), s = scale q.k) or sinks != NULL (a device
 *    array [heads] fp32 of learnable sink logits, natural log: one more term e^sink_h in every
 *    row's denominator, counted in the LSE, with no value row), not both: the mask may then
 *    only be dense, causal, or a causal sliding window (window_right 0 or causal = 1).
 *  - packed documents (FlashAttention's varlen): cu_seqlens != NULL, a HOST array of docs + 1
 *    ints [0, l0, l0 + l1, ..., total], every document at least one token. Then q, k, v and o
 *    are packed [total][heads][d] (k and v: [total][kv_heads][d]), batch = 1 and nq = nk =
 *    total; a token sees the tokens of its own document (causal = 1: not later ones); the LSE
 *    is [heads][total]. No window, softcap or sinks with documents.
 *
 * Otherwise the layout is [B][H][N][d]. Every argument is checked before the device: a bad one
 * returns ATTN_LINEAGE_BAD_ARGUMENT even without a GPU. The block map is built on the host on
 * every call and copied to the device in the caller's stream (stream-ordered allocations). */
int attn_lineage_masked_forward(int device, void* stream, int dtype, const void* q, const void* k, const void* v,
                                void* o, float* lse, int batch, int heads, int kv_heads, int nq, int nk, int d,
                                float scale, int causal, int window_left, int window_right, float softcap,
                                const float* sinks, const int* cu_seqlens, int docs, char* err, size_t err_len);

/* Chapter 06's sm90a masked backward (masks/hopper_backward.cu, with chapter 05's preprocess and
 * postprocess): dQ, dK, dV as attn_lineage_fa3_backward's, for the masks of
 * attn_lineage_masked_forward but packed documents, d in {64, 128}, from the masked forward's O
 * and LSE. With sinks, dsink (a device array [heads] fp32, or NULL for none) receives
 * dLoss/dsink_h. workspace: attn_lineage_fa3_backward_workspace() bytes, 256-byte aligned.
 * deterministic = 1: dQ's adds in the order of the key blocks (the same bits on every run). */
int attn_lineage_masked_backward(int device, void* stream, int dtype, const void* q, const void* k, const void* v,
                                 const void* o, const void* dout, const float* lse, void* dq, void* dk, void* dv,
                                 float* dsink, void* workspace, size_t workspace_bytes, int batch, int heads,
                                 int kv_heads, int nq, int nk, int d, float scale, int causal, int window_left,
                                 int window_right, float softcap, const float* sinks, int deterministic, char* err,
                                 size_t err_len);

/* Chapter 06's final absorbed MLA decode (gqa_mla/mla_final.cu), forward only, bf16: each
 * query head attends to one shared latent cache. q [B][heads][nq][576] (the absorbed query
 * [q_nope W_UK^T ; q_rope]), kv [B][nk][576] (the cache as stored: [c ; k_rope]), o
 * [B][heads][nq][512] (the latent output, before W_UV). Causal, bottom-right: query i sees keys
 * j <= i + nk - nq; nq <= nk. scale: tau (0: 1/sqrt(192), DeepSeek's 128 + 64 dims).
 * workspace: attn_lineage_mla_decode_workspace() bytes, 256-byte aligned (the key ranges'
 * partial results). */
int attn_lineage_mla_decode_workspace(int device, int batch, int heads, int nq, int nk, size_t* bytes, char* err,
                                      size_t err_len);
int attn_lineage_mla_decode(int device, void* stream, const void* q, const void* kv, void* o, void* workspace,
                            size_t workspace_bytes, int batch, int heads, int nq, int nk, float scale, char* err,
                            size_t err_len);

#ifdef __cplusplus
}
#endif

#endif /* ATTN_LINEAGE_C_H */
