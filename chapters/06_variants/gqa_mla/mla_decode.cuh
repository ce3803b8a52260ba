#pragma once
/// \file mla_decode.cuh
/// \brief MLA's absorbed decode on the device (mla_decode.cu): the kernels and what
///        the host side hands them.

#include <cuda_bf16.h>

#include "common/cuda/fast_math.cuh"
#include "common/online_softmax.hpp"

namespace attn::ch06::mla {

constexpr int kDK = 576;   ///< latent key: c (512) ; k_rope (64)
constexpr int kDVl = 512;  ///< latent value: c

/// The latent decode: for each sequence b, the rows = H * Nq (head, query) pairs,
/// packed head-major (row = h Nq + i), against the sequence's cache of Nk latent keys.
struct DecodeParams {
  const __nv_bfloat16* q = nullptr;   ///< [B][rows][576]: [q_c ; q_rope]
  const __nv_bfloat16* kv = nullptr;  ///< [B][Nk][576]: [c ; k_rope], the cache as stored
  float* o_part = nullptr;            ///< [B][splits][rows][512]: unnormalised O of each key range
  float* ml_part = nullptr;           ///< [B][splits][rows][2]: its (m, l), base 2
  int batch = 1, rows = 0, nq = 1, nk = 0;
  int splits = 1, blocks_per_split = 1;  ///< key range s = key blocks [s bps, (s + 1) bps)
  float scale_log2 = 0;               ///< tau log2(e), tau = 1 / sqrt(192)
  /// The fused combine (launch_decode only; nullptr: launch_combine() merges afterwards):
  /// one counter per (sequence, tile), zero before the launch and zero again after it; the
  /// last range of a tile to finish merges the tile's ranges into o_c itself.
  int* counters = nullptr;
  __nv_bfloat16* o_c = nullptr;
  /// launch_combine(): the 512 columns in 4, 8 or 16 parts, one thread block each (0: 4, or
  /// more while the blocks would not fill two per SM).
  int combine_parts = 0;
  /// launch_combine() on sm_90 and later: a programmatic dependent launch (the combine is
  /// launched while the decode runs and waits for it in cudaGridDependencySynchronize(), so
  /// its launch latency is not added to the step's); false: an ordinary launch after it.
  bool pdl = true;
  /// launch_combine(): false (the default) takes the few-ranges form where it applies
  /// (combine_one_trip()); true always takes the general form (two round trips to memory).
  bool combine_general = false;
  /// launch_decode() on sm_90 with exactly 2 key ranges: the two ranges of a (tile, sequence)
  /// run as one cluster of two blocks, and rank 0 merges them through distributed shared
  /// memory into o_c (no partials, no combine kernel).
  bool cluster_merge = false;
  /// The mma.sync decode's ring (set by launch_decode(): early unless ATTN_CH06_MLA_REFILL=late):
  /// every stage filled in the prologue and refilled as soon as its block is done.
  bool early_refill = true;
};
/// The part count launch_combine() uses for `p` on a GPU of `sms` SMs.
inline int combine_parts(const DecodeParams& p, int sms) {
  if (p.combine_parts != 0) return p.combine_parts;
  int parts = 4;  // more parts while the blocks would not fill two per SM
  while (parts < 16 && long(p.batch) * p.rows * parts < 2L * sms) parts *= 2;
  return parts;
}
/// The combine's few-ranges form: up to kCombineFewSplits ranges in 4 parts, one warp per
/// (row, part) that loads every range's (m, l) and float4 at once (one round trip to memory).
constexpr int kCombineFewSplits = 8;
__host__ __device__ inline bool combine_one_trip(const DecodeParams& p, int parts) {
  return !p.combine_general && p.splits <= kCombineFewSplits && parts == 4;
}
/// The most ranges the fused combine merges in one thread block (more: a separate combine).
constexpr int kFuseMaxSplits = 4;

/// Packed rows per thread block: 16 (one mma row tile) or 64 (four).
constexpr int kRowsSmall = 16, kRowsLarge = 64;
/// Keys per block of the kernel for that tile (32 or 64), and its resident blocks per SM (2 or 1).
/// `small_variant` picks the 16-row tile's shape: 0 wide (8 warps, 64-key blocks, a ring
/// of 2, one block per SM: the default), 1 ring2x2 (4 warps, 32-key blocks, a ring of 2,
/// two blocks per SM), 2 ring4 (4 warps, a ring of 4, one block per SM); the 64-row tile
/// has one shape.
int keys_per_block(int rows_per_tile, int small_variant = 0);
int blocks_per_sm(int rows_per_tile, int small_variant = 0);
const char* small_variant_name(int small_variant);
constexpr int kSmallVariants = 3;

/// Launches the decode kernel with tiles of `rows_per_tile` (16 or 64) packed rows;
/// grid = (tiles, splits, batch). Returns the dynamic shared memory it uses.
int launch_decode(const DecodeParams& p, int rows_per_tile, int small_variant = 0);
/// The 64-row tile on wgmma and TMA (mla_decode_sm90.cu, sm_90a only: built into the
/// Hopper library, called where hopper_ready()): the same grid, key blocks and partials as
/// launch_decode(p, kRowsLarge), so launch_combine() merges its ranges.
constexpr int kSm90KeysPerBlock = 64;
/// How warpgroup 1 hands the single P buffer back to warpgroup 0 (mla_decode_sm90.cu's header).
/// kReleasePhased, the default: both warpgroups in one loop, meeting twice a block at
/// __syncthreads(), each warpgroup's wgmma issued and waited for inside its own role's branch
/// (the form compute-sanitizer's racecheck follows at every launch).
/// kReleaseArrive, the former default: bar.arrive right after warpgroup 1's loads (racecheck
/// reports the reuse, which the PTX ISA orders); kReleaseSync: bar.sync once its own P V is done.
/// kReleaseBlock: kReleaseSync on barrier 0, the block's own barrier (all 256 threads).
/// kReleaseLockstep: both warpgroups in one loop, meeting twice a block at __syncthreads(), with
/// warpgroup 0's S issued on a branch (ptxas serialises its wgmma).
/// kHalves: the other kernel of the file, both warpgroups computing S for half of the key
/// block each and meeting twice a block at __syncthreads().
constexpr int kReleaseArrive = 0, kReleaseSync = 1, kReleaseBlock = 2, kReleaseLockstep = 3, kHalves = 4,
              kReleasePhased = 5;
int launch_decode_sm90(const DecodeParams& p, int release = kReleasePhased);
/// The ⊕ of every row's key ranges: o_c = merged O / l, bf16 [B][rows][512].
void launch_combine(const DecodeParams& p, __nv_bfloat16* o_c);
/// q = [q_nope W_UK^T ; q_rope] per head: [B][H][Nq][128] + [B][H][Nq][64] -> [B][H][Nq][576].
void launch_absorb_q(const __nv_bfloat16* q_nope, const __nv_bfloat16* q_rope, const __nv_bfloat16* w_uk,
                     __nv_bfloat16* q, int batch, int heads, int nq);
/// o = o_c W_UV per head: [B][H][Nq][512] -> [B][H][Nq][128].
void launch_project(const __nv_bfloat16* o_c, const __nv_bfloat16* w_uv, __nv_bfloat16* o, int batch, int heads,
                    int nq);

}  // namespace attn::ch06::mla
