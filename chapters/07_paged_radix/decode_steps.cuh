/// \file decode_steps.cuh
/// \brief Chapter 07: the launchers of the decode steps, one name in each step's
///        namespace: `gpu::v1::launch` (steps/v1_paged_decode.cu), `gpu::v2::launch`
///        (steps/v2_split_k.cu), `gpu::v3::launch` (steps/v3_fused_combine.cu), each
///        instantiated for d = 64 and 128 over paged and contiguous bf16 K/V, and for
///        d = 128 over 8-bit pages (PagedKv8, FP8 and INT8); and `gpu::v4::launch`
///        (steps/v4_codes_to_fragments.cu) and `gpu::v5::launch` (steps/v5_table_lookahead.cu),
///        for paged K/V only; `gpu::v6::launch` (steps/v6_lazy_rescale.cu), `gpu::v7::launch`
///        (steps/v7_tma_pages.cu) and `gpu::v9::launch` (steps/v9_keys_as_rows.cu), for 8-bit
///        pages only; `gpu::v12::launch` (steps/v12_one_trip_merge.cu) and `gpu::v14::launch`
///        (steps/v14_overlapped_launch.cu), for bf16 pages; the final kernels
///        `gpu::final_bf16::launch` (steps/final_bf16.cu) and `gpu::final_8bit::launch`
///        (steps/final_8bit.cu); and the lab's `gpu::v8`, `gpu::v10` and `gpu::v13`
///        (steps/lab/, built with TUTORIAL_LAB=ON), for 8-bit pages.
#pragma once

#include <cuda.h>  // CUtensorMap (v7)

#include "decode_tile.cuh"

namespace attn::ch07::gpu {

namespace v1 {
/// One block per (sequence, KV head group): grid (Hkv x head chunks, B).
template <int D, class Kv>
void launch(const DecodeParams& p, const Kv& kv, int batch, int kv_heads);
}  // namespace v1

namespace v2 {
/// The split kernel, grid (S, Hkv x head chunks, B), then the merge kernel, grid (Hq, B).
template <int D, class Kv>
void launch(const DecodeParams& p, const Kv& kv, int batch, int kv_heads);
}  // namespace v2

namespace v3 {
/// The split kernel, grid (S, Hkv x head chunks, B), whose last block per (b, group) merges.
template <int D, class Kv>
void launch(const DecodeParams& p, const Kv& kv, int batch, int kv_heads);
}  // namespace v3

namespace v4 {
/// v3 with an 8-bit cache's codes converted straight into MMA fragments (paged K/V only).
template <int D, class Kv>
void launch(const DecodeParams& p, const Kv& kv, int batch, int kv_heads);
}  // namespace v4

namespace v5 {
/// v4 with fixed-size splits and the block-table entries read ahead (paged K/V only).
template <int D, class Kv>
void launch(const DecodeParams& p, const Kv& kv, int batch, int kv_heads);
}  // namespace v5

namespace v6 {
/// v5 with O rescaled only when a row maximum grew; 8-bit pages only.
template <int D, class Kv>
void launch(const DecodeParams& p, const Kv& kv, int batch, int kv_heads);
}  // namespace v6

namespace v7 {
/// Pages below 8 tokens are not for v7: a box of P rows of 128 bytes lands at a multiple of
/// P x 128 bytes, and a box with the 128-byte swizzle must start on a 1024-byte boundary.
constexpr int kMinPageSize = DecodeGeometry::kTmaMinPage;
/// The 8-bit pools as TMA tensors, [page x KV head][slot][128 bytes], boxes of min(P, 64) slots.
struct CodeMaps {
  CUtensorMap k, v;
};
/// v6 with the pages copied by the TMA; 8-bit pages only.
template <int D, class Kv>
void launch(const DecodeParams& p, const Kv& kv, const CodeMaps& maps, int batch, int kv_heads);
}  // namespace v7

namespace v8 {
using v7::CodeMaps;
using v7::kMinPageSize;
/// v7 with one "empty" mbarrier per stage in place of the loop's block barrier; 8-bit pages only.
template <int D, class Kv>
void launch(const DecodeParams& p, const Kv& kv, const CodeMaps& maps, int batch, int kv_heads);
}  // namespace v8

namespace v9 {
using v7::CodeMaps;
using v7::kMinPageSize;
/// v8 with S^T = K Q^T and O^T = V^T P^T (the keys on the MMA's M side), 8 heads per block; 8-bit pages only.
template <int D, class Kv>
void launch(const DecodeParams& p, const Kv& kv, const CodeMaps& maps, int batch, int kv_heads);
}  // namespace v9

namespace v10 {
using v7::CodeMaps;
using v7::kMinPageSize;
/// v9 with four 8-bit blocks per SM (at most 128 registers); 8-bit pages only.
template <int D, class Kv>
void launch(const DecodeParams& p, const Kv& kv, const CodeMaps& maps, int batch, int kv_heads);
}  // namespace v10

namespace v12 {
/// v5 with the last split's merge loading everything in one round trip; bf16 pages only.
template <int D, class Kv>
void launch(const DecodeParams& p, const Kv& kv, int batch, int kv_heads);
}  // namespace v12

namespace v13 {
using v7::CodeMaps;
using v7::kMinPageSize;
/// v10 with each stage refilled as soon as every warp holds its codes, behind a proxy fence; 8-bit pages only.
template <int D, class Kv>
void launch(const DecodeParams& p, const Kv& kv, const CodeMaps& maps, int batch, int kv_heads);
}  // namespace v13

namespace v14 {
/// v12 launched as a programmatic dependent launch: its start overlaps the kernel before it; bf16 pages only.
template <int D, class Kv>
void launch(const DecodeParams& p, const Kv& kv, int batch, int kv_heads);
}  // namespace v14

namespace final_bf16 {
/// The final bf16 kernel (steps/final_bf16.cu): v12's configuration in one table; bf16 pages only.
template <int D, class Kv>
void launch(const DecodeParams& p, const Kv& kv, int batch, int kv_heads);
}  // namespace final_bf16

namespace final_8bit {
using v7::CodeMaps;
using v7::kMinPageSize;
/// The final 8-bit kernel (steps/final_8bit.cu): v9 with three or four blocks per SM from one
/// table (final_8bit_blocks_per_sm()); 8-bit pages only.
template <int D, class Kv>
void launch(const DecodeParams& p, const Kv& kv, const CodeMaps& maps, int batch, int kv_heads);
}  // namespace final_8bit

}  // namespace attn::ch07::gpu
