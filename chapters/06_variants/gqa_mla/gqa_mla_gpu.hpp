#pragma once
/// \file gqa_mla_gpu.hpp
/// \brief This part's kernels behind a plain C++ interface (no CUDA types), so the
///        binary and the tests compile with or without the CUDA toolkit.
///
///     packed_fwd.cu   (sm_90a) chapter 05's last bf16 step with the query heads of a KV
///                     head packed on the tile's M dimension, and d != dv (d = 192 for MLA)
///     mla_decode.cu   (sm_80+) MLA's absorbed decode: the (head, query) rows of one
///                     sequence on the M dimension of mma.sync tiles, the latent cache
///                     streamed once per tile, split-K, one ⊕ combine
///     mla_decode_sm90.cu  (sm_90a) its 64-row tile on wgmma + TMA, every release of P
///     mla_final.cu    (sm_90a) the final MLA decode: the default forms, one table
///     gqa_mla_gpu.cu  host side: uploads, the cuBLAS GEMMs of absorb / decompress, timing

#include <string>
#include <vector>

#include "common/inputs.hpp"
#include "common/problem.hpp"
#include "mla_model.hpp"

namespace attn::ch06 {

/// True when the binary carries this part's sm_90a kernels and the GPU is sm_90.
bool hopper_ready(std::string* why);

/// Whether the packed Hopper forward has a kernel for `p` (bf16; (d, dv) = (128, 128) or
/// (192, 128)); the reason when not.
bool packed_fwd_supports(const Problem& p, std::string* why = nullptr);

struct GpuResult {
  std::vector<float> o, lse;  ///< downloaded, poisoned before the checked run
  double time_ms = 0;         ///< median of >= 20 repeats, L2 flushed (0 when not timed)
  int grid = 0, smem_bytes = 0;
};

/// The packed forward (pack = true) or the same kernel with one query head per tile
/// (pack = false: chapter 05's GQA). Throws UsageError when unsupported.
GpuResult packed_forward_gpu(const Problem& p, const AttnInputs& in, bool pack, bool time);

/// Whether the packed sm_80 forward (ampere_packed.cu, chapter 04's v9 packed) has a
/// kernel for `p` (bf16 or fp16; d = dv in {64, 128, 256}); the reason when not.
bool packed_sm80_supports(const Problem& p, std::string* why = nullptr);
/// That kernel, packed (pack = true) or with one query head per tile (chapter 04's v9), on
/// any CUDA GPU of sm_80 or later. Throws UsageError when unsupported.
GpuResult packed_forward_sm80_gpu(const Problem& p, const AttnInputs& in, bool pack, bool time);
/// The same, timed on device-generated inputs (the sweeps).
GpuResult packed_forward_sm80_bench(const Problem& p, bool pack);

/// The same kernel timed on device-generated inputs (for the sweeps: no host tensors,
/// no check; the tests and the checked rows cover correctness).
GpuResult packed_forward_bench(const Problem& p, bool pack);

/// One MLA step on the GPU, either form. o is the final [B][H][Nq][128].
struct MlaGpuResult {
  std::vector<float> o;
  double attn_ms = 0;   ///< the attention kernels alone (absorb: decode + combine)
  double total_ms = 0;  ///< every kernel of the form (absorb: + q_c GEMM + W_UV GEMM; decompress: + K/V GEMMs)
  int splits = 1;       ///< key ranges per sequence (absorb)
  int head_tile = 0;    ///< packed rows per thread block (absorb)
  std::string what;     ///< which kernels ran
};

/// The 64-row tile's kernel: wgmma + TMA (mla_decode_sm90.cu; where hopper_ready(), else
/// mma.sync) or mma.sync (mla_decode.cu) everywhere. kTile64Wgmma, the default: both warpgroups
/// in one loop at __syncthreads(), each wgmma in its role's branch (kReleasePhased, the form
/// racecheck follows). kTile64WgmmaArrive: the former default, P released by bar.arrive.
/// kTile64WgmmaSync: P released by bar.sync after warpgroup 1's P V (mla_decode_sm90.cu's header).
/// kTile64WgmmaBlock: the same bar.sync release on barrier 0, all 256 threads of the block.
/// kTile64WgmmaLockstep: both warpgroups in one loop, two __syncthreads() a key block.
/// kTile64WgmmaHalves: each warpgroup computes S for half of the key block (mla_decode_sm90.cu).
constexpr int kTile64Wgmma = 0, kTile64Mma = 1, kTile64WgmmaSync = 2, kTile64WgmmaBlock = 3, kTile64WgmmaLockstep = 4,
              kTile64WgmmaHalves = 5, kTile64WgmmaArrive = 6;
/// How the key ranges are merged: by the separate combine kernel (the default), or fused into
/// the mma.sync decode kernel, whose last range of a tile merges them (at most 4 ranges;
/// otherwise, and on the wgmma tile, the separate kernel). Fused was measured slower on the
/// H200 (LAB.md): the last block's merge is a serial tail.
/// kCombineGeneral: the separate kernel always in its general form (two round trips), not
/// the few-ranges form it takes for up to 8 ranges in 4 parts (mla_decode.cuh).
/// kCombineCluster: with exactly 2 key ranges on the mma.sync tiles (sm_90), the two ranges of
/// a (tile, sequence) as one cluster of two blocks, merged through distributed shared memory
/// (mla_decode.cu); otherwise the separate kernel.
/// kCombineAuto (the default): kCombineCluster where it applies (measured faster at every
/// 2-range row but one, LAB.md), else kCombineSeparate.
constexpr int kCombineSeparate = 0, kCombineFused = 1, kCombineGeneral = 2, kCombineCluster = 3, kCombineAuto = 4;
/// Absorbed decode. `splits` = 0 picks the split count from the SM count. Timed when `time`.
/// With every form at its default (no lab form) the final decode, mla_final.cu, where
/// hopper_ready(); otherwise, and on other GPUs, mla_decode.cu's and mla_decode_sm90.cu's kernels.
/// `small_variant`: the 16-row tile's shape (mla_decode.cuh; 0 is the default); `tile64`:
/// the 64-row tile's kernel.
/// `combine_parts`: the separate combine's column parts, 4, 8 or 16 (0: from the grid, mla_decode.cuh);
/// `pdl`: the combine as a programmatic dependent launch on sm_90+ (mla_decode.cuh).
MlaGpuResult mla_absorb_gpu(const MlaShape& s, const MlaInputs& in, int splits, bool time, int small_variant = 0,
                            int tile64 = kTile64Wgmma, int combine = kCombineAuto, int combine_parts = 0,
                            bool pdl = true);
/// Absorbed decode timed on device-generated inputs (the sweeps).
/// The key ranges mla_absorb_gpu(s, ..., splits, ..., small_variant) cuts each sequence
/// into: how many, and the keys of each but the last (whole key blocks).
struct MlaRanges {
  int ranges = 1;
  int keys_per_range = 0;
};
MlaRanges mla_absorb_ranges(const MlaShape& s, int splits, int small_variant = 0);
MlaGpuResult mla_absorb_bench(const MlaShape& s, int splits, int small_variant = 0, int tile64 = kTile64Wgmma,
                              int combine = kCombineAuto, int combine_parts = 0, bool pdl = true);
/// The name of a 16-row tile shape: "ring4", "ring2x2", "wide".
const char* small_variant_label(int small_variant);
/// Decompressed form: K/V GEMMs (cuBLAS) and the packed Hopper forward with d = 192, dv = 128.
MlaGpuResult mla_decompress_gpu(const MlaShape& s, const MlaInputs& in, bool time);

/// Device bytes either form allocates.
double mla_device_bytes(const MlaShape& s, bool decompress);

}  // namespace attn::ch06
