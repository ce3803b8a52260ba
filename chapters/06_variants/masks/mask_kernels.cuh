#pragma once
/// \file mask_kernels.cuh
/// \brief What the masked kernels receive: chapter 04's parameters plus the strides
///        of each tensor (for the packed varlen layout) and the block map.
///
/// The field names are chapter 04's (`fa2_kernels.cuh`), so that a step's diff
/// against its chapter 04 / 05 ancestor shows only what the mask adds.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>

#include "chapters/05_fa3_hopper/backward_launch.cuh"  // chapter 05's Fa3BwdParams (the sm90a backward)
#include "mask_spec.hpp"

namespace attn::ch06 {

/// Element strides of one tensor on the device: (b, h, i) starts at b*batch + h*head + i*row.
struct DevStrides {
  long long batch, head, row;
  __host__ __device__ __forceinline__ long long at(int b, int h) const { return b * batch + h * head; }
};

/// The block map on the device: for each (map, outer block) the partial and the full
/// inner blocks (forward: outer = query block, inner = key block; backward: the
/// transposed lists). `order`: the forward's (b*H + h)*tq + q_block, heaviest first.
struct DevMap {
  const int *n_part, *part, *n_full, *full;
  const int* order;
  int outer, inner;          ///< blocks per list owner, and the list capacity
  int map_batch, map_heads;  ///< 1 when shared by every batch / head
  /// A document map (sm90a v3; null for a grid map): the rows [q_row0, q_row1) of each
  /// query tile, and lists that hold each key block's first key instead of its index.
  const int* q_row0 = nullptr;
  const int* q_row1 = nullptr;
  /// Tiles with at least one kept block: the first n_work entries of `order` (heaviest first).
  int n_work = 0;
  __device__ __forceinline__ int owner(int b, int h, int blk) const {
    return ((map_batch > 1 ? b : 0) * map_heads + (map_heads > 1 ? h : 0)) * outer + blk;
  }
};

struct FwdParams {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;
  int batch, heads, kv_heads;
  int nq, nk, d;
  float scale, scale_log2;
  DevStrides sq, sk, sv, so;  ///< element strides (standard [B][H][N][d] or packed [N][H][d])
  DevMap map;                 ///< key blocks of each query block
  int ctas = 0;               ///< sm90a: thread blocks of the persistent grid (0: one per SM)
};

struct BwdParams {
  const void* q;
  const void* k;
  const void* v;
  const void* o;
  const void* dout;
  const float* lse;
  void* dq;
  void* dk;
  void* dv;
  float* dq_accum;  ///< fp32, laid out as Q
  float* delta;     ///< D_i = rowsum(dO o O), [B][Hq][Nq]
  int batch, heads, kv_heads;
  int nq, nk, d;
  float scale, scale_log2;
  DevStrides sq, sk, sv, so;
  DevMap map;  ///< query blocks of each key block (the transposed lists)
  DevMap dq_map;  ///< deterministic dQ: key blocks of each query block (forward lists, Br x DqBc)
  bool deterministic = false;  ///< dQ from fa2_bwd_dq (fixed order, no atomics) instead of atomics
  float* dsink = nullptr;      ///< learned sink: dLoss/dsink_h, [H] (written when the policy has one)
};

/// The launchers of each step: one instantiation per policy, d = 128, bf16.
namespace ampere_mask {
bool launch(const FwdParams& p, const MaskSpec& s, const Problem& prob, const PolicyData& d, cudaStream_t st);
constexpr int Br = 128, Bc = 64;
}  // namespace ampere_mask
namespace hopper_mask {
bool launch(const FwdParams& p, const MaskSpec& s, const Problem& prob, const PolicyData& d, cudaStream_t st);
/// The launch with its tensor maps encoded once: what a timed repeat runs (empty: not built for this problem).
std::function<void()> prepare(const FwdParams& p, const MaskSpec& s, const Problem& prob, const PolicyData& d,
                              cudaStream_t st);
bool available();
constexpr int Br = 128, Bc = 128;
}  // namespace hopper_mask
/// The sm90a steps after it (steps/v1_two_q_buffers.cu, v2_tile_overlap.cu,
/// v3_document_tiles.cu, v4_row_spans.cu): the same interface and tiles.
namespace hopper_v1 {
bool available();
bool launch(const FwdParams& p, const MaskSpec& s, const Problem& prob, const PolicyData& d, cudaStream_t st);
std::function<void()> prepare(const FwdParams& p, const MaskSpec& s, const Problem& prob, const PolicyData& d,
                              cudaStream_t st);
constexpr int Br = hopper_mask::Br, Bc = hopper_mask::Bc;
}  // namespace hopper_v1
namespace hopper_v2 {
bool available();
bool launch(const FwdParams& p, const MaskSpec& s, const Problem& prob, const PolicyData& d, cudaStream_t st);
std::function<void()> prepare(const FwdParams& p, const MaskSpec& s, const Problem& prob, const PolicyData& d,
                              cudaStream_t st);
constexpr int Br = hopper_mask::Br, Bc = hopper_mask::Bc;
}  // namespace hopper_v2
namespace hopper_v3 {
bool available();
bool launch(const FwdParams& p, const MaskSpec& s, const Problem& prob, const PolicyData& d, cudaStream_t st);
std::function<void()> prepare(const FwdParams& p, const MaskSpec& s, const Problem& prob, const PolicyData& d,
                              cudaStream_t st);
constexpr int Br = hopper_mask::Br, Bc = hopper_mask::Bc;
}  // namespace hopper_v3
namespace hopper_v4 {
bool available();
bool launch(const FwdParams& p, const MaskSpec& s, const Problem& prob, const PolicyData& d, cudaStream_t st);
std::function<void()> prepare(const FwdParams& p, const MaskSpec& s, const Problem& prob, const PolicyData& d,
                              cudaStream_t st);
constexpr int Br = hopper_mask::Br, Bc = hopper_mask::Bc;
}  // namespace hopper_v4
/// The lab's step 5 (steps/lab/v5_epilogue_in_place.cu): v4 with every tile's epilogue in place.
namespace hopper_v5 {
std::function<void()> prepare(const FwdParams& p, const MaskSpec& s, const Problem& prob, const PolicyData& d,
                              cudaStream_t st);
constexpr int Br = hopper_mask::Br, Bc = hopper_mask::Bc;
}  // namespace hopper_v5
/// The final masked forward (steps/final.cu): v4 with its configuration in one table,
/// d = 64, 128 and 256, bf16 and fp16.
namespace hopper_final {
bool available();
bool launch(const FwdParams& p, const MaskSpec& s, const Problem& prob, const PolicyData& d, cudaStream_t st);
std::function<void()> prepare(const FwdParams& p, const MaskSpec& s, const Problem& prob, const PolicyData& d,
                              cudaStream_t st);
/// prepare()'s fp16 kernels, compiled in a translation unit of their own (masks/final_fp16.cu).
std::function<void()> prepare_fp16(const FwdParams& p, const MaskSpec& s, const Problem& prob, const PolicyData& d,
                                   cudaStream_t st);
constexpr int Br = hopper_mask::Br, Bc = hopper_mask::Bc;
/// Keys per K/V tile at head dim d, the block map's Bc: 128, and 64 at d = 256, where two
/// stages of 128 keys do not fit beside Q (its configuration table).
constexpr int tile_keys(int d) { return d == 256 ? 64 : Bc; }
}  // namespace hopper_final
namespace backward_mask {
bool launch(const BwdParams& p, const MaskSpec& s, const Problem& prob, const PolicyData& d, cudaStream_t st);
constexpr int Br = 64, Bc = 128;
constexpr int DqBc = 64;  ///< keys per step of the deterministic dQ kernel (chapter 04's)
}  // namespace backward_mask

/// The sm90a masked backward's walk (hopper_backward.cu): for each key block of each map (one, or
/// one per batch: BlockMap::map_batch), the query steps it visits, ascending, as step << 1 | 1
/// where the step's tile is partial; and, for the deterministic mode, its rank among the key
/// blocks that visit each of them (the number of lower key blocks that do).
struct MaskWalks {
  const int* list = nullptr;   ///< [maps][tk][tq]
  const int* count = nullptr;  ///< [maps][tk]
  const int* rank = nullptr;   ///< [maps][tk][tq]
  int tq = 0, tk = 0, map_batch = 1;
};
/// What the sm90a masked backward runs on: chapter 05's parameters (pointers, sizes, the final
/// backward's dQ layout), the walk, Q K V dO for the tensor maps (standard layout), and
/// dLoss/dsink ([H], or null).
struct HopperBwdArgs {
  Problem problem;
  ch05::Fa3BwdParams params;
  MaskWalks walks;
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* dout = nullptr;
  float* dsink = nullptr;
};
namespace hopper_bwd {
bool available();
/// The preprocess, the kernel, the postprocess and the sink's gradient as one ready launch
/// (empty when no kernel fits: d not 64 or 128, a dtype other than bf16 and fp16, a document mask).
std::function<void()> prepare(const HopperBwdArgs& a, const MaskSpec& s, const PolicyData& d, cudaStream_t st);
std::function<void()> prepare_fp16(const HopperBwdArgs& a, const MaskSpec& s, const PolicyData& d, cudaStream_t st);
constexpr int kBc = 128;  ///< keys a thread block (chapter 05's kBwdBc)
/// Queries a step: chapter 05's final backward's Config<D>::kBr.
constexpr int step_rows(int d) { return d == 64 ? 128 : 80; }
}  // namespace hopper_bwd

}  // namespace attn::ch06
