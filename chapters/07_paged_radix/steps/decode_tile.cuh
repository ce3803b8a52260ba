// Chapter 07 - decode over a paged KV cache. The series:
//
//   steps/decode_tile.cuh     <- this file: what both kernels share. The K/V row address
//                                (through the block table, or contiguous), the cp.async
//                                load of one 64-key tile, and one warp's work on its 16
//                                keys of a tile: S = Q K^T, online softmax, O += P V on
//                                tensor cores; then the merge of the four warps.
//   steps/v1_paged_decode.cu  v1: one thread block per (sequence, KV head group) walks
//                                the whole sequence (the shape of vLLM's PagedAttention V1).
//   steps/v2_split_k.cu       v2: the sequence is cut into splits, one block each, and a
//                                second kernel merges the splits' (m, l, O) with the
//                                chapter 02 operator (flash-decoding; PagedAttention V2).
//
// A decode step is one query row per head. With GQA the G = Hq / Hkv query heads of
// a KV head read the same keys, so a block takes all of them (up to 16) as the 16
// rows of an m16n8k16 MMA: K and V are read from HBM once per KV head, and the
// tensor cores do the dot products (rows beyond G are zeros and are never stored).
//
//   block (b, hk): 4 warps, Q = the G heads of KV head hk (16 rows, zero-padded)
//
//          tile j = 64 keys, one cp.async stage in shared memory (K_j and V_j, swizzled)
//        +--------+--------+--------+--------+
//        | warp 0 | warp 1 | warp 2 | warp 3 |   warp w owns keys 16w .. 16w+15 of every tile,
//        | 16 keys| 16 keys| 16 keys| 16 keys|   and its own (m, l, O) for the 16 rows
//        +--------+--------+--------+--------+
//   stages: [ tile j | tile j+1 | tile j+2 ]   tile j computed while j+1 and j+2 load, 32 KB each at d = 128
//
// At the end the four warps' states are merged through shared memory with the
// shared merge() of common/online_softmax.hpp: the same operator that v2 uses
// across blocks.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

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
};

// ----------------------------------------------------------------------------- K/V addressing

/// K/V in pages: [page][kv_head][slot][D], token t of sequence b in page
/// block_table[b][t / P], slot t % P. P is a power of two: P = 1 << page_shift.
struct PagedKv {
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
  const bf16* k;
  const bf16* v;
  int kv_heads, ld;

  __device__ __forceinline__ std::size_t row(int b, int hk, int t) const {
    return (std::size_t(b) * kv_heads + hk) * ld + t;
  }
};

// ----------------------------------------------------------------------------- PTX

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/// 16 bytes global -> shared, bypassing L1; with `in` false nothing is read and the
/// destination is zero-filled (keys past the end of the sequence).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool in) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(in ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/// Four 8x8 b16 matrices from shared memory; lanes 8i..8i+7 give the row addresses of matrix i.
__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
/// The same, each matrix transposed on the way (V as the k-major B operand).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                                  uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

/// C (16x8, fp32) += A (16x16, bf16, row-major) * B (16x8, bf16, column-major).
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (lo) in the low half
  return *reinterpret_cast<const uint32_t*>(&v);
}

// ----------------------------------------------------------------------------- one tile

/// Byte offset of 16-byte chunk `ch` of row `row` in a [64][D] bf16 tile. The chunk
/// index is XORed with the row's low three bits, so the 8 rows an ldmatrix reads at
/// the same logical chunk fall in 8 different bank groups (no conflicts).
template <int D>
__host__ __device__ __forceinline__ uint32_t swizzle(int row, int ch) {
  return uint32_t((row * (D / 8) + (ch ^ (row & 7))) * 16);
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
    const uint32_t dst = swizzle<D>(row, ch);
    cp_async_16(sk + dst, kv.k + off, in);
    cp_async_16(sv + dst, kv.v + off, in);
  }
}

/// One warp's share of a block: the 16 query rows against its 16 keys of every tile.
///
///   lane l holds rows r = l/4 and r + 8 of every MMA fragment:
///     S (16 x 16 keys) : s[nt][0..1] row r, keys 8nt + 2(l%4) + {0,1};  s[nt][2..3] row r + 8
///     O (16 x D)       : o[n][0..1]  row r, dims 8n  + 2(l%4) + {0,1};  o[n][2..3]  row r + 8
///   m, l per row (l is this lane's part of the row sum until store() adds up the four lanes)
template <int D>
struct WarpDecode {
  static constexpr int KS = D / 16;  ///< k-steps of Q K^T
  static constexpr int ND = D / 8;   ///< 8-wide column tiles of O
  uint32_t qa[KS][4];                ///< Q_i as A fragments, bf16 pairs
  float o[ND][4];
  float m[2], l[2];

  /// Q rows of heads h0 .. h0 + rows - 1 (rows <= 16); the others are zero.
  __device__ __forceinline__ void init(const bf16* q, int rows) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = Frag::a_row(lane, i), col = 16 * ks + Frag::a_col(lane, i);
        qa[ks][i] = row < rows ? *reinterpret_cast<const uint32_t*>(q + std::size_t(row) * D + col) : 0u;
      }
#pragma unroll
    for (int n = 0; n < ND; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    m[0] = m[1] = neg_inf<float>();
    l[0] = l[1] = 0.f;
  }

  /// Keys k0 .. k0 + 15 of the tile in (sk, sv); only the first `valid` exist.
  __device__ __forceinline__ void tile(uint32_t sk, uint32_t sv, int k0, int valid, float tau) {
    const int lane = threadIdx.x % 32;
    // S_ij = Q_i K_j^T: two 16 x 8 MMA tiles, D/16 k-steps. ldmatrix matrices:
    // (keys 0-7, chunk 2ks) (keys 0-7, chunk 2ks+1) (keys 8-15, chunk 2ks) (keys 8-15, chunk 2ks+1).
    float s[2][4] = {};
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      uint32_t b0, b1, b2, b3;
      ldmatrix_x4(sk + swizzle<D>(k0 + Frag::k_key(lane), Frag::k_chunk(lane, ks)), b0, b1, b2, b3);
      mma_16816(s[0], qa[ks], b0, b1);
      mma_16816(s[1], qa[ks], b2, b3);
    }
    // Scale, mask the keys past the end, and take each row's max over the tile.
    float mx[2] = {neg_inf<float>(), neg_inf<float>()};
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int key = 8 * nt + Frag::c_col(lane, j);
        s[nt][j] = key < valid ? s[nt][j] * tau : neg_inf<float>();
        mx[j >> 1] = fmaxf(mx[j >> 1], s[nt][j]);
      }
    // Online softmax (chapter 02): m_new = max(m, rowmax), rescale l and O by e^(m - m_new) once per tile.
    float shift[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));  // the 4 lanes of a row
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
      const float m_new = fmaxf(m[i], mx[i]);
      shift[i] = finite_max(m_new);  // an all-masked row shifts by 0: e^-inf = 0, never NaN
      const float alpha = __expf(m[i] - shift[i]);
      m[i] = m_new;
      l[i] *= alpha;
#pragma unroll
      for (int n = 0; n < ND; ++n) {
        o[n][2 * i] *= alpha;
        o[n][2 * i + 1] *= alpha;
      }
    }
    // P_ij = e^(S_ij - m_i), rounded to bf16 as the A operand of P V (the C layout of
    // two n8 tiles is exactly the A layout of one k16 step).
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        s[nt][j] = __expf(s[nt][j] - shift[j >> 1]);
        l[j >> 1] += s[nt][j];
      }
    const uint32_t pa[4] = {pack_bf16(s[0][0], s[0][1]), pack_bf16(s[0][2], s[0][3]), pack_bf16(s[1][0], s[1][1]),
                            pack_bf16(s[1][2], s[1][3])};
    // O_i += P_ij V_j: D/8 MMA tiles of 8 dims. ldmatrix.trans matrices:
    // (keys 0-7, chunk 2n) (keys 8-15, chunk 2n) (keys 0-7, chunk 2n+1) (keys 8-15, chunk 2n+1).
#pragma unroll
    for (int n = 0; n < ND / 2; ++n) {
      uint32_t b0, b1, b2, b3;
      ldmatrix_x4_trans(sv + swizzle<D>(k0 + Frag::v_key(lane), Frag::v_chunk(lane, n)), b0, b1, b2, b3);
      mma_16816(o[2 * n], pa, b0, b1);
      mma_16816(o[2 * n + 1], pa, b2, b3);
    }
  }

  /// Completes each row's sum over the 4 lanes that share it, and writes the warp's
  /// (m, l, O) to shared memory: ms, ls [4 warps][16], os [4 warps][16][D].
  __device__ __forceinline__ void store(float* ms, float* ls, float* os) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r = Frag::c_row(lane, 0), c = Frag::c_col(lane, 0);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
      l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    }
    if (lane % 4 == 0) {
      ms[warp * 16 + r] = m[0];
      ms[warp * 16 + r + 8] = m[1];
      ls[warp * 16 + r] = l[0];
      ls[warp * 16 + r + 8] = l[1];
    }
#pragma unroll
    for (int n = 0; n < ND; ++n) {
      float* top = os + std::size_t(warp * 16 + r) * D + 8 * n + c;
      float* bottom = os + std::size_t(warp * 16 + r + 8) * D + 8 * n + c;
      top[0] = o[n][0];
      top[1] = o[n][1];
      bottom[0] = o[n][2];
      bottom[1] = o[n][3];
    }
  }
};

/// Row `i`'s state over the whole block, dims c4 .. c4 + 3: the four warps' states
/// merged with the shared operator (common/online_softmax.hpp).
template <int D>
__device__ __forceinline__ AttnState<4, float, BaseE> merge_warps(const float* ms, const float* ls, const float* os,
                                                                  int i, int c4) {
  auto acc = AttnState<4, float, BaseE>::identity();
#pragma unroll
  for (int w = 0; w < Geo::kWarps; ++w) {
    AttnState<4, float, BaseE> part;
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
