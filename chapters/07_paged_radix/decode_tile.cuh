/// \file decode_tile.cuh
/// \brief Chapter 07: what both decode steps (steps/v1_paged_decode.cu and
///        steps/v2_split_k.cu) share: the K/V row address (through the block table, or
///        contiguous), the cp.async load of one 64-key tile, and one warp's work on its
///        16 keys of a tile (S = Q K^T, the online softmax, O += P V on tensor cores);
///        then the merge of the four warps.
///
/// A decode step is one query row per head. With GQA the G = Hq / Hkv query heads of
/// a KV head read the same keys, so a block takes all of them (up to 16) as the 16
/// rows of an m16n8k16 MMA: K and V are read from HBM once per KV head, and the
/// tensor cores do the dot products (rows beyond G are zeros and are never stored).
///
///     block (b, hk): 4 warps, Q = the G heads of KV head hk (16 rows, zero-padded)
///
///            tile j = 64 keys, one cp.async stage in shared memory (K_j and V_j, swizzled)
///          +--------+--------+--------+--------+
///          | warp 0 | warp 1 | warp 2 | warp 3 |   warp w owns keys 16w .. 16w+15 of every tile,
///          | 16 keys| 16 keys| 16 keys| 16 keys|   and its own (m, l, O) for the 16 rows
///          +--------+--------+--------+--------+
///     stages: [ tile j | tile j+1 | tile j+2 ]   tile j computed while j+1 and j+2 load, 32 KB each at d = 128
///
/// At the end the four warps' states are merged through shared memory with the
/// shared merge() of common/online_softmax.hpp: the same operator that v2 uses
/// across blocks.
///
/// An 8-bit cache (PagedKv8, kv_quant.hpp; INT4 pages too, PagedKv8<KvDtype::int4>)
/// changes three things here and nothing in the steps' structure: the stage holds codes and one K and one V scale per row (load_tile
/// for PagedKv8); each warp converts its 16 keys' codes to
/// f16 in registers into its own slot (DequantRows, codes_to_f16); and its MMAs run in
/// f16 with the K scales on S's columns and the V scales on P's (WarpDecode<D, __half>).
///
/// The instructions are the project's wrappers, taught in chapter 04: `cp.async`
/// (common/cuda/cp_async.cuh), `ldmatrix` (ldmatrix.cuh), `mma.sync.m16n8k16` and
/// `pack2` (mma_sync.cuh), the XOR-swizzled tile (smem_tiles.cuh); the online softmax
/// of a fragment's rows is `cuda::RowSoftmax` (frag_softmax.cuh), in base 2 as in
/// chapters 04 and 05: the scale c = tau log2 e is one FFMA per score, and the states
/// that leave a warp carry m in base-2 units (`Base2`).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "common/cuda/cp_async.cuh"
#include "common/cuda/frag_softmax.cuh"
#include "common/cuda/index.cuh"
#include "common/cuda/ldmatrix.cuh"
#include "common/cuda/mma_sync.cuh"
#include "common/cuda/smem_addr.cuh"
#include "common/cuda/smem_tiles.cuh"
#include "common/online_softmax.hpp"
#include "decode.hpp"

namespace attn::ch07::gpu {

using Geo = DecodeGeometry;
using bf16 = __nv_bfloat16;

/// Everything a decode kernel needs besides the K/V.
struct DecodeParams {
  const bf16* q;     ///< [B][Hq][D]
  bf16* o;           ///< [B][Hq][D]
  float* lse;        ///< [B][Hq]
  const int* lens;   ///< [B] keys per sequence
  int heads, group, chunks;  ///< Hq, G = Hq / Hkv, blocks per KV head (G / 16 rounded up)
  float scale;       ///< tau
  // v2 only: the splits' partial states
  float* part_m;     ///< [B][Hq][S]
  float* part_l;     ///< [B][Hq][S]
  float* part_o;     ///< [B][Hq][S][D], unnormalised
  int splits;        ///< S
  // v3 only: one arrival counter per (sequence, KV head group), zero between launches
  int* arrivals;     ///< [B][Hkv x chunks]
  // v5 only: every sequence's splits are this many keys (whole tiles), whatever its length
  int split_keys;    ///< keys_per_split(max_len, S)
};

// ----------------------------------------------------------------------------- K/V addressing

/// K/V in pages: [page][kv_head][slot][D], token t of sequence b in page
/// block_table[b][t / P], slot t % P. P is a power of two: P = 1 << page_shift.
struct PagedKv {
  static constexpr KvDtype kDtype = KvDtype::bf16;  ///< how the pool stores K and V
  const bf16* k;
  const bf16* v;
  const int* block_table;  ///< [B][max_pages]
  int max_pages, kv_heads, page_shift;

  /// Row index (in units of D elements) of token t of (sequence b, KV head hk).
  __device__ __forceinline__ std::size_t row(int b, int hk, int t) const {
    // EXERCISE ch07.5: find token t's row in the pool through the block table
    //| return ((std::size_t(t >> page_shift) * kv_heads + hk) << page_shift) + (t & ((1 << page_shift) - 1));  // TODO: use the block table
    const int page = __ldg(block_table + std::size_t(b) * max_pages + (t >> page_shift));
    const int slot = t & ((1 << page_shift) - 1);
    return ((std::size_t(page) * kv_heads + hk) << page_shift) + slot;
    // END EXERCISE
  }
};

/// The same K/V laid out contiguously, [B][kv_head][ld][D]: the baseline that
/// measures what the indirection costs.
struct ContiguousKv {
  static constexpr KvDtype kDtype = KvDtype::bf16;
  const bf16* k;
  const bf16* v;
  int kv_heads, ld;

  __device__ __forceinline__ std::size_t row(int b, int hk, int t) const {
    return (std::size_t(b) * kv_heads + hk) * ld + t;
  }
};

/// K/V in 8-bit pages (kv_quant.hpp): codes [page][kv_head][slot][D], one byte each
/// (F = int4: two codes per byte, a row D / 2 bytes), and one fp32 scale per (page,
/// KV head) for K and one for V. The addressing is PagedKv's (rows, in units of a row's
/// bytes); row >> page_shift is the (page, KV head) of a row, the index of its scale.
template <KvDtype F>
struct PagedKv8 {
  static constexpr KvDtype kDtype = F;
  const uint8_t* k;
  const uint8_t* v;
  const float* k_scale;    ///< [num_pages][kv_heads]
  const float* v_scale;
  const int* block_table;  ///< [B][max_pages]
  int max_pages, kv_heads, page_shift;

  __device__ __forceinline__ std::size_t row(int b, int hk, int t) const {
    const int page = __ldg(block_table + std::size_t(b) * max_pages + (t >> page_shift));
    const int slot = t & ((1 << page_shift) - 1);
    return ((std::size_t(page) * kv_heads + hk) << page_shift) + slot;
  }
};

// ----------------------------------------------------------------------------- one tile

/// Byte offset of 16-byte chunk `ch` of row `row` in a [64][D] bf16 tile, XOR-swizzled
/// (common/cuda/smem_tiles.cuh: the 8 rows an ldmatrix reads at the same logical chunk
/// fall in 8 different bank groups, no conflicts).
template <int D>
__device__ __forceinline__ uint32_t tile_offset(int row, int ch) {
  return uint32_t(cuda::swizzle<D / 8>(row, ch)) * 16u;
}

/// Which element of the m16n8k16 fragments a lane holds (PTX ISA, "Matrix fragments
/// for mma.m16n8k16"), and which row address it gives ldmatrix.
///
///   C, S, O (16 x 8, fp32): element j of lane l is (row l/4 + 8 (j/2), col 2 (l%4) + j%2)
///   A, Q, P (16 x 16, bf16 pairs): register i of lane l is (row l/4 + 8 (i%2), cols 2 (l%4) + 8 (i/2) + {0,1})
///
///   ldmatrix.x4 of K_j (rows = keys, 8-dim chunks):   lanes  0-7  keys 0-7, chunk 2ks    -> b0 of keys 0-7
///                                                     lanes  8-15 keys 0-7, chunk 2ks+1  -> b1 of keys 0-7
///                                                     lanes 16-23 keys 8-15, chunk 2ks   -> b0 of keys 8-15
///                                                     lanes 24-31 keys 8-15, chunk 2ks+1 -> b1 of keys 8-15
///   ldmatrix.x4.trans of V_j:                         lanes  0-15 keys 0-15, chunk 2n    -> b0, b1 of dims 16n..16n+7
///                                                     lanes 16-31 keys 0-15, chunk 2n+1  -> b0, b1 of dims 16n+8..16n+15
struct Frag {
  static __host__ __device__ __forceinline__ int c_row(int lane, int j) { return lane / 4 + 8 * (j / 2); }
  static __host__ __device__ __forceinline__ int c_col(int lane, int j) { return 2 * (lane % 4) + j % 2; }
  static __host__ __device__ __forceinline__ int a_row(int lane, int i) { return lane / 4 + 8 * (i % 2); }
  static __host__ __device__ __forceinline__ int a_col(int lane, int i) { return 2 * (lane % 4) + 8 * (i / 2); }
  static __host__ __device__ __forceinline__ int k_key(int lane) { return (lane & 7) + ((lane >> 4) << 3); }
  static __host__ __device__ __forceinline__ int k_chunk(int lane, int ks) { return 2 * ks + ((lane >> 3) & 1); }
  static __host__ __device__ __forceinline__ int v_key(int lane) { return lane & 15; }
  static __host__ __device__ __forceinline__ int v_chunk(int lane, int n) { return 2 * n + (lane >> 4); }
};

template <int D>
constexpr uint32_t kTileBytes = uint32_t(Geo::kBc) * D * 2;  ///< one K_j or V_j tile

/// Pipeline stages for K/V stored as Kv says (kStages8 for an 8-bit cache: three, as
/// for bf16; five, for as many bytes in flight per SM as bf16 keeps, measured slower).
template <class Kv>
constexpr int kStagesFor = kv_quantised(Kv::kDtype) ? Geo::kStages8 : Geo::kStages;

/// One pipeline stage in shared memory, for K/V stored as Kv says:
///
///     bf16:   [ K_j (64 x D bf16, swizzled) | V_j ]                       the MMAs read it as it is
///     8-bit:  [ K_j codes (64 x D) | V_j codes | K scales (64) | V scales (64) ]
///             then, after the kStages8 stages, one slot of 16 f16 rows per warp that
///             the warp dequantises its keys into (DequantRows) and its MMAs read
template <int D, class Kv>
constexpr uint32_t kCodeTileBytes = uint32_t(Geo::kBc) * kv_row_bytes(Kv::kDtype, D);
template <int D, class Kv>
constexpr uint32_t kStageBytes = 2 * kCodeTileBytes<D, Kv> + (kv_quantised(Kv::kDtype) ? 2 * Geo::kBc * 4 : 0);
/// Where the warps' bf16 slots of an 8-bit cache start.
template <int D, class Kv>
constexpr uint32_t kWorkOffset = kStagesFor<Kv> * kStageBytes<D, Kv>;

/// Issues the cp.async loads of keys [t0, t0 + 64) of (b, hk) into one stage. Rows at
/// or past t_end are zero-filled without touching HBM.
///
///   thread tid -> chunk tid % (D/8) of rows tid / (D/8) + pass * (128 / (D/8))
///   (d = 128: 16 threads cover one 256-byte row, the block 8 rows per pass, 8 passes)
template <int D, class Kv>
__device__ __forceinline__ void load_tile(uint32_t sk, uint32_t sv, const Kv& kv, int b, int hk, int t0, int t_end) {
  constexpr int CH = D / 8;                      // 16-byte chunks per row
  constexpr int ROWS = Geo::kThreads / CH;       // rows per pass
  const int ch = threadIdx.x % CH;
#pragma unroll
  for (int pass = 0; pass < Geo::kBc / ROWS; ++pass) {
    const int row = pass * ROWS + threadIdx.x / CH;
    const int t = t0 + row;
    const bool in = t < t_end;
    const std::size_t off = in ? kv.row(b, hk, t) * D + ch * 8 : 0;
    const uint32_t dst = tile_offset<D>(row, ch);
    cuda::cp_async_16(sk + dst, kv.k + off, in);
    cuda::cp_async_16(sv + dst, kv.v + off, in);
  }
}

/// The 8-bit form: 16 codes (16 bytes) per cp.async, D/16 per row, so 8 threads cover a
/// row at d = 128 and the block 16 rows per pass (INT4: 32 codes per cp.async, 4 threads
/// a row, 32 rows a pass); the thread that loads chunk 0 of a
/// row also copies the row's K and V scale (4 bytes each, `cp_async_4`). A row's scale
/// is read once per row (the rows of a page hit the same L1 line); rows at or past
/// t_end get zero codes and a zero scale.
template <int D, KvDtype F>
__device__ __forceinline__ void load_tile(uint32_t sk, uint32_t sv, const PagedKv8<F>& kv, int b, int hk, int t0,
                                          int t_end) {
  constexpr int RB = kv_row_bytes(F, D);         // bytes per row
  constexpr int CH = RB / 16;                    // 16-byte chunks per row
  constexpr int ROWS = Geo::kThreads / CH;       // rows per pass
  const int ch = threadIdx.x % CH;
  const uint32_t scales = sv + uint32_t(Geo::kBc) * RB;  // K scales, then V scales
#pragma unroll
  for (int pass = 0; pass < Geo::kBc / ROWS; ++pass) {
    const int row = pass * ROWS + threadIdx.x / CH;
    const int t = t0 + row;
    const bool in = t < t_end;
    const std::size_t r = in ? kv.row(b, hk, t) : 0;
    const uint32_t dst = uint32_t(row) * RB + ch * 16;
    cuda::cp_async_16(sk + dst, kv.k + r * RB + ch * 16, in);
    cuda::cp_async_16(sv + dst, kv.v + r * RB + ch * 16, in);
    if (ch == 0) {
      cuda::cp_async_4(scales + 4 * row, kv.k_scale + (r >> kv.page_shift), in);
      cuda::cp_async_4(scales + 4 * (Geo::kBc + row), kv.v_scale + (r >> kv.page_shift), in);
    }
  }
}

/// Four codes (one 32-bit word) as two f16x2 words, exactly (every E4M3 value and every
/// integer in [-127, 127] is an f16): E4M3 through the hardware's fp8x2 -> f16x2
/// conversion (cuda_fp8.h, one instruction per pair), INT8 through the exponent trick:
/// the byte b + 128 placed under the f16 exponent of 1024 is the f16 1024 + b + 128,
/// so one f16x2 subtraction of 1152 gives the pair (no int-to-float unit involved).
template <KvDtype F>
__device__ __forceinline__ void codes_to_f16(uint32_t w, uint32_t& lo, uint32_t& hi) {
  if constexpr (F == KvDtype::fp8) {
    const __half2_raw a = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(w & 0xffffu), __NV_E4M3);
    const __half2_raw b = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(w >> 16), __NV_E4M3);
    lo = uint32_t(a.x) | (uint32_t(a.y) << 16);
    hi = uint32_t(b.x) | (uint32_t(b.y) << 16);
  } else {
    const uint32_t u = w ^ 0x80808080u;  // two's complement -> offset binary, byte by byte
    const __half2 bias = __half2(__ushort_as_half(0x6480u), __ushort_as_half(0x6480u));  // 1152
    const uint32_t pa = __byte_perm(u, 0x64646464u, 0x5140u);  // f16 pair 1024 + (b0 + 128), 1024 + (b1 + 128)
    const uint32_t pb = __byte_perm(u, 0x64646464u, 0x5342u);  // the same for b2, b3
    const __half2 a = __hsub2(*reinterpret_cast<const __half2*>(&pa), bias);
    const __half2 b = __hsub2(*reinterpret_cast<const __half2*>(&pb), bias);
    lo = *reinterpret_cast<const uint32_t*>(&a);
    hi = *reinterpret_cast<const uint32_t*>(&b);
  }
}

/// Eight INT4 codes (one 32-bit word, element 2i in the low nibble of byte i) as four
/// f16x2 words, exactly, by INT8's exponent trick four bits at a time: the nibble XOR 8
/// is the code plus 8 (two's complement -> offset binary), placed under the f16 exponent
/// of 1024 it is the f16 1024 + c + 8, and one f16x2 subtraction of 1032 gives the pair.
///
///   byte k of u = w ^ 0x88888888:  [ hi nibble: c(2k+1) + 8 | lo nibble: c(2k) + 8 ]
///   pair k = (u >> 8k) & 0xf  |  ((u >> 8k) & 0xf0) << 12  |  0x64006400   (lo half: element 2k)
__device__ __forceinline__ void codes4_to_f16(uint32_t w, uint32_t (&out)[4]) {
  const uint32_t u = w ^ 0x88888888u;
  const __half2 bias = __half2(__ushort_as_half(0x6408u), __ushort_as_half(0x6408u));  // 1032
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t t = u >> (8 * k);
    const uint32_t p = (t & 0xfu) | ((t & 0xf0u) << 12) | 0x64006400u;
    const __half2 h = __hsub2(*reinterpret_cast<const __half2*>(&p), bias);
    out[k] = *reinterpret_cast<const uint32_t*>(&h);
  }
}

/// Where one warp finds its 16 keys of a tile for the ldmatrix reads. bf16 K/V are read
/// where they landed: rows k0 .. k0 + 15 of the stage.
struct StageRows {
  static constexpr bool kScaled = false;
  uint32_t sk, sv;
  __device__ __forceinline__ uint32_t k() const { return sk; }
  __device__ __forceinline__ uint32_t v() const { return sv; }
  __device__ __forceinline__ int row0(int k0) const { return k0; }
  __device__ __forceinline__ float scale(int, int) const { return 1.f; }
};

/// 8-bit K/V: the warp converts its own 16 keys' codes, in registers, to f16 (exact)
/// into its slot of 16 rows (4 KB at d = 128): K just before S = Q K^T, V into the same
/// slot just before O += P V, in the swizzled layout the ldmatrix reads expect. The
/// scales never enter the tile: S's column j is multiplied by key j's K scale, and P's
/// column j by key j's V scale (relative to the warp's running V scale, WarpDecode), so
/// the products are f16 x f16 -> fp32 of the codes themselves. Only the warp reads its
/// slot, so a __syncwarp() orders it, and no warp waits for another.
template <int D, KvDtype F>
struct DequantRows {
  static constexpr bool kScaled = true;  ///< S and P take per-key scales
  uint32_t sk, sv, work;  ///< the stage's K and V codes; the warp's f16 slot
  int k0;                 ///< the warp's first key in the tile
  unsigned char* smem;    ///< the pointer whose shared-window address is s0
  uint32_t s0;

  __device__ __forceinline__ unsigned char* at(uint32_t a) const { return smem + (a - s0); }
  static constexpr int RB = kv_row_bytes(F, D);  ///< bytes of a row of codes
  /// Key `key` (0..15 of the warp's) K scale (which = 0) or V scale (which = 1).
  __device__ __forceinline__ float scale(int key, int which) const {
    return *reinterpret_cast<const float*>(at(sv + uint32_t(Geo::kBc) * RB + 4u * uint32_t(which * Geo::kBc + k0 + key)));
  }
  __device__ __forceinline__ void convert(uint32_t codes) const {
    constexpr int CH = RB / 16;  // 16-byte chunks per row (16 codes, or 32 INT4 codes)
    const int lane = threadIdx.x % 32;
    __syncwarp();  // every lane is done with the slot's previous contents
#pragma unroll
    for (int i = 0; i < Geo::kWarpKeys * CH / 32; ++i) {
      const int id = i * 32 + lane, row = id / CH, ch = id % CH;
      const uint4 c = *reinterpret_cast<const uint4*>(at(codes + uint32_t(k0 + row) * RB + ch * 16));
      if constexpr (F == KvDtype::int4) {  // 32 codes: four 16-byte f16 chunks of the row
        uint32_t out[4][4];
        codes4_to_f16(c.x, out[0]);
        codes4_to_f16(c.y, out[1]);
        codes4_to_f16(c.z, out[2]);
        codes4_to_f16(c.w, out[3]);
#pragma unroll
        for (int j = 0; j < 4; ++j)
          *reinterpret_cast<uint4*>(at(work + tile_offset<D>(row, 4 * ch + j))) =
              make_uint4(out[j][0], out[j][1], out[j][2], out[j][3]);
      } else {
        uint32_t out[8];
        codes_to_f16<F>(c.x, out[0], out[1]);
        codes_to_f16<F>(c.y, out[2], out[3]);
        codes_to_f16<F>(c.z, out[4], out[5]);
        codes_to_f16<F>(c.w, out[6], out[7]);
        *reinterpret_cast<uint4*>(at(work + tile_offset<D>(row, 2 * ch))) = make_uint4(out[0], out[1], out[2], out[3]);
        *reinterpret_cast<uint4*>(at(work + tile_offset<D>(row, 2 * ch + 1))) = make_uint4(out[4], out[5], out[6], out[7]);
      }
    }
    __syncwarp();  // the slot is written before any lane reads it
  }
  __device__ __forceinline__ uint32_t k() const {
    convert(sk);
    return work;
  }
  __device__ __forceinline__ uint32_t v() const {
    convert(sv);
    return work;
  }
  __device__ __forceinline__ int row0(int) const { return 0; }
};

/// The rows of warp `warp` in a stage: bf16 K/V as they are.
template <int D, class Kv>
__device__ __forceinline__ StageRows warp_rows(const Kv&, uint32_t sk, uint32_t sv, int, unsigned char*, uint32_t) {
  return {sk, sv};
}
/// 8-bit K/V: dequantised by the warp into its slot after the kStages8 stages.
template <int D, KvDtype F>
__device__ __forceinline__ DequantRows<D, F> warp_rows(const PagedKv8<F>&, uint32_t sk, uint32_t sv, int warp,
                                                       unsigned char* smem, uint32_t s0) {
  const uint32_t work = s0 + kWorkOffset<D, PagedKv8<F>> + uint32_t(warp) * Geo::kWarpKeys * D * 2;
  return {sk, sv, work, warp * Geo::kWarpKeys, smem, s0};
}

/// Four consecutive floats of a flat fragment array as one 16x8 mma accumulator.
template <int N>
__device__ __forceinline__ float (&acc4(float (&a)[N], int t))[4] {
  return *reinterpret_cast<float(*)[4]>(&a[4 * t]);
}

/// 8-bit V: P's column j times s_j / vsig before P V, where s_j is key j's V scale and
/// vsig the largest V scale the warp has seen (O's unit). The warp's 16 keys' largest
/// scale joins vsig first (a max over the 32 lanes, warp-uniform); if it is larger, O is
/// rescaled by vsig_old / vsig_new, as the online softmax rescales O for a larger maximum
/// (vsig_old = 0 while O is still 0). So p_j s_j / vsig <= p_j: f16 holds it with its full
/// precision, and the products are f16 x f16 of the codes themselves.
///
///   s:        P of the warp's 16 keys, two n8 tiles in the C layout (s[i] is key 8 (i / 4) + c_col(lane, i % 4))
///   o:        the warp's O accumulator, in units of vsig
///   v_scale:  key (0..15 of the warp's) -> its V scale
///
/// WarpDecode::tile (the 8-bit path of v1-v3) and the 8-bit steps from v4 on call it.
template <int N, class VScale>
__device__ __forceinline__ void p_times_v_scales(float (&s)[8], float (&o)[N], float& vsig, const VScale& v_scale) {
  const int lane = threadIdx.x % 32;
  float sv[8], mx = vsig;
#pragma unroll
  for (int i = 0; i < 8; ++i) mx = fmaxf(mx, sv[i] = v_scale(8 * (i / 4) + Frag::c_col(lane, i % 4)));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
  if (mx > vsig) {  // warp-uniform
    const float r = vsig / mx;  // 0 while O is still 0
#pragma unroll
    for (int i = 0; i < N; ++i) o[i] *= r;
    vsig = mx;
  }
  const float inv = mx > 0.f ? 1.f / mx : 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) s[i] *= sv[i] * inv;
}

/// One warp's share of a block: the 16 query rows against its 16 keys of every tile.
///
///   lane l holds rows r = l/4 and r + 8 of every MMA fragment (common/cuda/mma_sync.cuh):
///     S (16 x 16 keys) : s[4nt + 0..1] row r, keys 8nt + 2(l%4) + {0,1};  s[4nt + 2..3] row r + 8
///     O (16 x D)       : o[4n  + 0..1] row r, dims 8n  + 2(l%4) + {0,1};  o[4n  + 2..3] row r + 8
///   the (m, l) of both rows in `softmax` (l is this lane's part of the row sum until
///   store() adds up the four lanes of the quad)
///
/// T is the element type of the MMAs: bf16 for a bf16 cache; f16 for an 8-bit one, whose
/// codes are exact in f16 (Q is converted once, bf16 -> f16). With an 8-bit cache O is
/// kept in units of `vsig`, the largest V scale the warp has seen: P's column j enters
/// the product as p_j * s_j / vsig (at most p_j, so f16 holds it with its full
/// precision), and O is rescaled by vsig_old / vsig_new when a larger scale arrives,
/// the way the online softmax rescales it for a larger max.
template <int D, class T = bf16>
struct WarpDecode {
  static constexpr int KS = D / 16;  ///< k-steps of Q K^T
  static constexpr int ND = D / 8;   ///< 8-wide column tiles of O
  uint32_t qa[KS][4];                ///< Q_i as A fragments, T pairs
  float o[4 * ND];
  float vsig;                        ///< 8-bit cache: O's unit, the largest V scale so far (0: none yet)
  cuda::RowSoftmax softmax;          ///< m in score units, l in units of 2^(c (s - m))

  /// Q rows of heads h0 .. h0 + rows - 1 (rows <= 16); the others are zero.
  __device__ __forceinline__ void init(const bf16* q, int rows) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = Frag::a_row(lane, i), col = 16 * ks + Frag::a_col(lane, i);
        const uint32_t x = row < rows ? *reinterpret_cast<const uint32_t*>(q + std::size_t(row) * D + col) : 0u;
        if constexpr (std::is_same_v<T, bf16>) {
          qa[ks][i] = x;
        } else {  // bf16 -> f16 (exact in f16's normal range)
          const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&x));
          qa[ks][i] = cuda::pack2<T>(f.x, f.y);
        }
      }
#pragma unroll
    for (int i = 0; i < 4 * ND; ++i) o[i] = 0.f;
    vsig = 0.f;
    softmax.init();
  }

  /// Keys k0 .. k0 + 15 of the tile, found through `rows` (StageRows: the stage; 8-bit
  /// K/V: DequantRows, which dequantises K, then V); only the first `valid` exist.
  /// c = tau log2 e: the softmax scale in base 2.
  template <class Rows>
  __device__ __forceinline__ void tile(const Rows& rows, int k0, int valid, float c) {
    const int lane = threadIdx.x % 32;
    const uint32_t sk = rows.k();
    const int r0 = rows.row0(k0);  // the warp's first row in what sk and sv address
    // S_ij = Q_i K_j^T: two 16 x 8 MMA tiles, D/16 k-steps. ldmatrix matrices:
    // (keys 0-7, chunk 2ks) (keys 0-7, chunk 2ks+1) (keys 8-15, chunk 2ks) (keys 8-15, chunk 2ks+1).
    float s[8] = {};
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      uint32_t b[4];
      cuda::ldmatrix_x4(b, sk + tile_offset<D>(r0 + Frag::k_key(lane), Frag::k_chunk(lane, ks)));
      cuda::mma_m16n8k16<T>(acc4(s, 0), qa[ks], b[0], b[1]);
      cuda::mma_m16n8k16<T>(acc4(s, 1), qa[ks], b[2], b[3]);
    }
    // 8-bit K: S's column j times key j's K scale (this lane holds 4 keys' columns).
    if constexpr (Rows::kScaled) {
#pragma unroll
      for (int i = 0; i < 8; ++i) s[i] *= rows.scale(8 * (i / 4) + Frag::c_col(lane, i % 4), 0);
    }
    // Mask the keys past the end: -inf, which the softmax turns into P = 0.
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (8 * (i / 4) + Frag::c_col(lane, i % 4) >= valid) s[i] = neg_inf<float>();
    // Online softmax (common/cuda/frag_softmax.cuh): the rows' new max over the quad,
    // P = 2^(c s - c m) in place of S, l and O rescaled by alpha = 2^(c (m_old - m)).
    float alpha[2];
    softmax.update(s, c, alpha);
    cuda::rescale(o, alpha);
    // 8-bit V: P's column j times s_j / vsig, vsig the largest V scale so far (the
    // warp's 16 keys' maximum joins it first; O is rescaled if it grows).
    if constexpr (Rows::kScaled) p_times_v_scales(s, o, vsig, [&](int key) { return rows.scale(key, 1); });
    // P_ij rounded to T as the A operand of P V (the C layout of two n8 tiles is
    // exactly the A layout of one k16 step). The row sum l took P before the V scales.
    const uint32_t pa[4] = {cuda::pack2<T>(s[0], s[1]), cuda::pack2<T>(s[2], s[3]),
                            cuda::pack2<T>(s[4], s[5]), cuda::pack2<T>(s[6], s[7])};
    const uint32_t sv = rows.v();
    // O_i += P_ij V_j: D/8 MMA tiles of 8 dims. ldmatrix.trans matrices:
    // (keys 0-7, chunk 2n) (keys 8-15, chunk 2n) (keys 0-7, chunk 2n+1) (keys 8-15, chunk 2n+1).
#pragma unroll
    for (int n = 0; n < ND / 2; ++n) {
      uint32_t b[4];
      cuda::ldmatrix_x4_trans(b, sv + tile_offset<D>(r0 + Frag::v_key(lane), Frag::v_chunk(lane, n)));
      cuda::mma_m16n8k16<T>(acc4(o, 2 * n), pa, b[0], b[1]);
      cuda::mma_m16n8k16<T>(acc4(o, 2 * n + 1), pa, b[2], b[3]);
    }
  }

  /// Completes each row's sum over the 4 lanes that share it, and writes the warp's
  /// (m, l, O) to shared memory: ms, ls [4 warps][16], os [4 warps][16][D]. m leaves
  /// in base-2 units, c m, as the Base2 merge expects.
  __device__ __forceinline__ void store(float* ms, float* ls, float* os, float c) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r = Frag::c_row(lane, 0), cl = Frag::c_col(lane, 0);
    float l[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      l[i] = softmax.l[i];
      l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
      l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    }
    if (lane % 4 == 0) {
      ms[warp * 16 + r] = softmax.m[0] * c;  // -inf stays -inf (c > 0)
      ms[warp * 16 + r + 8] = softmax.m[1] * c;
      ls[warp * 16 + r] = l[0];
      ls[warp * 16 + r + 8] = l[1];
    }
    const float u = std::is_same_v<T, bf16> ? 1.f : vsig;  // 8-bit V: O back to value units
#pragma unroll
    for (int n = 0; n < ND; ++n) {
      float* top = os + std::size_t(warp * 16 + r) * D + 8 * n + cl;
      float* bottom = os + std::size_t(warp * 16 + r + 8) * D + 8 * n + cl;
      top[0] = o[4 * n] * u;
      top[1] = o[4 * n + 1] * u;
      bottom[0] = o[4 * n + 2] * u;
      bottom[1] = o[4 * n + 3] * u;
    }
  }
};

/// The warp's state for a K/V type: bf16 MMAs for a bf16 cache, f16 for an 8-bit one.
template <int D, class Kv>
using WarpDecodeFor = WarpDecode<D, std::conditional_t<kv_quantised(Kv::kDtype), __half, bf16>>;

/// Row `i`'s state over the whole block, dims c4 .. c4 + 3: the four warps' states
/// merged with the shared operator (common/online_softmax.hpp), in base 2.
template <int D>
__device__ __forceinline__ AttnState<4, float, Base2> merge_warps(const float* ms, const float* ls, const float* os,
                                                                  int i, int c4) {
  auto acc = AttnState<4, float, Base2>::identity();
#pragma unroll
  for (int w = 0; w < Geo::kWarps; ++w) {
    AttnState<4, float, Base2> part;
    part.s = {ms[w * 16 + i], ls[w * 16 + i]};
    const float4 v = *reinterpret_cast<const float4*>(os + std::size_t(w * 16 + i) * D + c4);
    part.o[0] = v.x;
    part.o[1] = v.y;
    part.o[2] = v.z;
    part.o[3] = v.w;
    acc = merge(acc, part);
  }
  return acc;
}

/// Shared-memory layout of the merge, reusing the drained K/V stages:
/// ms [4][16] | ls [4][16] | os [4][16][D] floats.
struct MergeSmem {
  float *ms, *ls, *os;
  __device__ explicit MergeSmem(unsigned char* smem)
      : ms(reinterpret_cast<float*>(smem)), ls(ms + Geo::kWarps * 16), os(ls + Geo::kWarps * 16) {}
};

}  // namespace attn::ch07::gpu
