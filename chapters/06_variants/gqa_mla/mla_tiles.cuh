#pragma once
/// \file mla_tiles.cuh
/// \brief MLA's absorbed decode on mma.sync (sm_80+), the device code and its launches,
///        shared by the lab's mla_decode.cu (every shape of the tile, the fused combine) and the
///        final mla_final.cu (the 16-row tile's default shape): each file that includes it
///        compiles its own copy of the kernels it launches (mla_decode.cu's header comment
///        describes them).
#include <cuda_bf16.h>

#include <algorithm>
#include <cfloat>

#include "common/cuda/check.cuh"
#include "common/cuda/cp_async.cuh"
#include "common/cuda/fast_math.cuh"
#include "common/cuda/hopper/cluster_merge.cuh"
#include "common/cuda/ldmatrix.cuh"
#include "common/cuda/mma_sync.cuh"
#include "common/cuda/smem_addr.cuh"
#include "common/cuda/smem_tiles.cuh"
#include "common/errors.hpp"
#include "common/index.hpp"
#include "common/online_softmax.hpp"
#include "gqa_mla/mla_decode.cuh"

namespace attn::ch06::mla {
namespace {

using namespace attn::cuda;
using bf16 = __nv_bfloat16;

constexpr int kChunks = kDK / 8;  // 16-byte chunks per row (72)

/// A thread block's shape: RT row tiles of 16, WARPS warps, BC keys per block, a ring of
/// STAGES key blocks, BLOCKS_PER_SM resident (mla_decode.cu names the lab's shapes).
template <int RT, int WARPS, int BC, int STAGES, int BLOCKS_PER_SM = 1>
struct Shape {
  static constexpr int kM = 16 * RT, kWarps = WARPS, kThreads = 32 * WARPS, kBc = BC, kStages = STAGES;
  static constexpr int kBlocksPerSm = BLOCKS_PER_SM;
  // Shared memory: | Q [kM][576] | K ring STAGES x [BC][576] | P [kM][BC] | row maxima / sums |
  static constexpr int kQ = 0;
  static constexpr int kKStage = BC * kDK * 2;
  static constexpr int kK = kQ + kM * kDK * 2;
  static constexpr int kP = kK + STAGES * kKStage;
  static constexpr int kRed = kP + kM * BC * 2;
  static constexpr int kBytes = kRed + (WARPS / RT) * kM * 4;
};

/// Chunk c of row r of the P tile (BC / 8 chunks per row). Rows of 128 bytes take the
/// usual c ^ (r % 8); rows of 64 bytes (BC = 32) pair up in one 128-byte line, so the XOR
/// uses (r / 2) % 4: eight consecutive rows at one chunk still hit eight bank groups.
template <int BC>
__device__ __forceinline__ int p_chunk(int r, int c) {
  if constexpr (BC / 8 == 8) return swizzle<8>(r, c);
  else return r * (BC / 8) + (c ^ ((r >> 1) & 3));
}

/// Rows [r0, r0 + R) of a [n][576] bf16 tensor into a swizzled [R][576] tile by cp.async;
/// rows at or past n are zero-filled (so P V never meets garbage past the end).
template <int R, int kThreads>
__device__ __forceinline__ void load_rows(uint32_t tile, const bf16* g, int r0, int n) {
  for (int idx = threadIdx.x; idx < R * kChunks; idx += kThreads) {
    const int r = idx / kChunks, c = idx % kChunks;
    const bool valid = r0 + r < n;
    cp_async_16(tile + uint32_t(swizzle<kChunks>(r, c)) * 16u, valid ? g + std::size_t(r0 + r) * kDK + c * 8 : g,
                valid);
  }
}

template <class S>
__global__ void __launch_bounds__(S::kThreads, S::kBlocksPerSm) decode_kernel(const DecodeParams p) {
  constexpr int RT = S::kM / 16, kM = S::kM, kBc = S::kBc, kThreads = S::kThreads, kStages = S::kStages;
  constexpr int KG = S::kWarps / RT, NKW = kBc / KG, NT = NKW / 8;  // S: key groups, keys and n8 tiles per warp
  constexpr int NCW = kDVl / KG, NTO = NCW / 8;                     // PV: columns and n8 tiles per warp
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sq = smem_u32(smem + S::kQ), sk = smem_u32(smem + S::kK), sp = smem_u32(smem + S::kP);
  float* red = reinterpret_cast<float*>(smem + S::kRed);
  const int tile = blockIdx.x, split = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, rt = warp % RT, kg = warp / RT;
  const int m0 = tile * kM;
  const int nblocks = ceil_div(p.nk, kBc);
  const int blk_lo = split * p.blocks_per_split, blk_hi = min(nblocks, blk_lo + p.blocks_per_split);

  // This lane's two rows (mma accumulator rows g and g + 8 of row tile rt), and the keys
  // they may see: causal, bottom-right, by query position i = row % Nq.
  int row[2], limit[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    row[r] = rt * 16 + lane / 4 + 8 * r;
    limit[r] = causal_key_end((m0 + row[r]) % p.nq + 1, p.nq, p.nk);  // keys [0, limit) are visible
  }

#if __CUDA_ARCH__ >= 900
  // The combine (a programmatic dependent launch) may be scheduled from now on: its blocks
  // wait for this grid's completion, so only its launch overlaps the decode.
  cudaTriggerProgrammaticLaunchCompletion();
#endif
  const bf16* qb = p.q + std::size_t(b) * p.rows * kDK;
  const bf16* kb = p.kv + std::size_t(b) * p.nk * kDK;
  // Prologue: Q and the first key blocks, one cp.async group each (a group may be empty: the
  // wait counts below stay the same for any range length). Early refill (the default): every
  // stage is filled at once, and a stage is refilled as soon as the block that used it is
  // done, so that kStages blocks are in flight at the start and kStages - 1 while a block is
  // computed; late refill (ATTN_CH06_MLA_REFILL=late, the form before): kStages - 1 blocks, a
  // stage refilled once the next block has arrived.
  const bool early = p.early_refill;
  const int prologue = early ? kStages : kStages - 1;
  load_rows<kM, kThreads>(sq, qb, m0, p.rows);
#pragma unroll
  for (int st = 0; st < kStages; ++st) {
    if (st >= prologue) break;
    if (blk_lo + st < blk_hi) load_rows<kBc, kThreads>(sk + uint32_t(st * S::kKStage), kb, (blk_lo + st) * kBc, p.nk);
    cp_async_commit();
  }

  float o[NTO][4];
#pragma unroll
  for (int n = 0; n < NTO; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};

  // With one row tile (RT = 1) every warp multiplies the same 16 Q rows: their A
  // fragments (36 k-steps x 4 registers) stay in registers for the whole key range
  // instead of being re-read from shared memory for every block.
  uint32_t qf[RT == 1 ? kDK / 16 : 1][4];
  if constexpr (RT == 1) {
    if (early) cp_async_wait<kStages - 1>();  // Q (in the first group)
    else cp_async_wait<kStages - 2>();
    __syncthreads();
#pragma unroll
    for (int ks = 0; ks < kDK / 16; ++ks)
      ldmatrix_x4(qf[ks], sq + uint32_t(swizzle<kChunks>(lane % 16, 2 * ks + lane / 16)) * 16u);
  }

  for (int j = blk_lo; j < blk_hi; ++j) {
    const int stage = (j - blk_lo) % kStages;
    // K_j's group is complete; the newer kStages - 1 (early) or kStages - 2 (late) may still fly
    if (early) cp_async_wait<kStages - 1>();
    else cp_async_wait<kStages - 2>();
    __syncthreads();  // K_j has arrived for everyone; block j-1's P V is done with its stage
    if (!early) {
      if (j + kStages - 1 < blk_hi)  // into the stage block j-1 used
        load_rows<kBc, kThreads>(sk + uint32_t(((j - blk_lo + kStages - 1) % kStages) * S::kKStage), kb,
                                 (j + kStages - 1) * kBc, p.nk);
      cp_async_commit();
    }
    const uint32_t kt = sk + uint32_t(stage * S::kKStage);

    // ---- S = Q K^T: 16 rows x NKW keys, 36 k-steps of 16
    float s[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
    if constexpr (RT == 1) {
      static_assert(NT == 1, "one row tile: 8 keys per warp");
      // The 36 k-steps go round four accumulators: one would make a chain of 36 dependent
      // mma (about 1 us), and with one 4-warp block per SM nothing else would hide it.
      float sa[4][4];
#pragma unroll
      for (int a = 0; a < 4; ++a) sa[a][0] = sa[a][1] = sa[a][2] = sa[a][3] = 0.f;
#pragma unroll
      for (int ks2 = 0; ks2 < kDK / 32; ++ks2) {
        // 8 keys: one x4 holds their B fragments for two k-steps
        uint32_t bb[4];
        ldmatrix_x4(bb, kt + uint32_t(swizzle<kChunks>(kg * NKW + lane % 8, 4 * ks2 + lane / 8)) * 16u);
        mma_m16n8k16<bf16>(sa[(2 * ks2) % 4], qf[2 * ks2], bb[0], bb[1]);
        mma_m16n8k16<bf16>(sa[(2 * ks2 + 1) % 4], qf[2 * ks2 + 1], bb[2], bb[3]);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) s[0][e] = (sa[0][e] + sa[1][e]) + (sa[2][e] + sa[3][e]);
    } else {
#pragma unroll 2
      for (int ks2 = 0; ks2 < kDK / 32; ++ks2) {
        uint32_t a0[4], a1[4];
        ldmatrix_x4(a0, sq + uint32_t(swizzle<kChunks>(rt * 16 + lane % 16, 4 * ks2 + lane / 16)) * 16u);
        ldmatrix_x4(a1, sq + uint32_t(swizzle<kChunks>(rt * 16 + lane % 16, 4 * ks2 + 2 + lane / 16)) * 16u);
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
          const int key = kg * NKW + np * 16 + (lane / 16) * 8 + lane % 8;
          uint32_t b0[4], b1[4];
          ldmatrix_x4(b0, kt + uint32_t(swizzle<kChunks>(key, 4 * ks2 + (lane / 8) % 2)) * 16u);
          ldmatrix_x4(b1, kt + uint32_t(swizzle<kChunks>(key, 4 * ks2 + 2 + (lane / 8) % 2)) * 16u);
          mma_m16n8k16<bf16>(s[2 * np], a0, b0[0], b0[1]);
          mma_m16n8k16<bf16>(s[2 * np + 1], a0, b0[2], b0[3]);
          mma_m16n8k16<bf16>(s[2 * np], a1, b1[0], b1[1]);
          mma_m16n8k16<bf16>(s[2 * np + 1], a1, b1[2], b1[3]);
        }
      }
    }

    // ---- online softmax, base 2; one m per row across the KG key groups
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = j * kBc + kg * NKW + n * 8 + 2 * (lane % 4) + (e & 1);
        const float x = key < limit[e >> 1] ? s[n][e] * p.scale_log2 : -INFINITY;
        s[n][e] = x;
        mx[e >> 1] = fmaxf(mx[e >> 1], x);
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      if (lane % 4 == 0) red[kg * kM + row[r]] = mx[r];
    }
    __syncthreads();
    float alpha[2], shift[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float m_new = m_run[r];
#pragma unroll
      for (int g = 0; g < KG; ++g) m_new = fmaxf(m_new, red[g * kM + row[r]]);
      shift[r] = finite_max(m_new);
      alpha[r] = exp2_approx(m_run[r] - shift[r]);  // m_run = -inf: 0
      m_run[r] = m_new;
      l_run[r] *= alpha[r];
    }
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[n][e] = exp2_approx(s[n][e] - shift[e >> 1]);  // masked: 2^-inf = 0
        l_run[e >> 1] += s[n][e];
      }
      const int col = kg * NKW + n * 8 + 2 * (lane % 4);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        unsigned char* at = smem + S::kP + p_chunk<kBc>(row[r], col / 8) * 16 + (col % 8) * 2;
        *reinterpret_cast<uint32_t*>(at) = pack2<bf16>(s[n][2 * r], s[n][2 * r + 1]);
      }
    }
    __syncthreads();  // P is complete; every warp has read the row maxima

    // ---- O = alpha O + P V, V = the latent c: columns kg * NCW .. of the K tile
#pragma unroll
    for (int n = 0; n < NTO; ++n) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) {
      uint32_t a[4];
      ldmatrix_x4(a, sp + uint32_t(p_chunk<kBc>(rt * 16 + lane % 16, 2 * kk + lane / 16)) * 16u);
      const int key = kk * 16 + lane % 8 + ((lane / 8) % 2) * 8;
#pragma unroll
      for (int np = 0; np < NTO / 2; ++np) {
        uint32_t bb[4];
        ldmatrix_x4_trans(bb, kt + uint32_t(swizzle<kChunks>(key, kg * NCW / 8 + 2 * np + lane / 16)) * 16u);
        mma_m16n8k16<bf16>(o[2 * np], a, bb[0], bb[1]);
        mma_m16n8k16<bf16>(o[2 * np + 1], a, bb[2], bb[3]);
      }
    }
    if (early) {
      __syncthreads();  // every warp is done with stage `stage`: block j + kStages goes into it
      if (j + kStages < blk_hi) load_rows<kBc, kThreads>(kt, kb, (j + kStages) * kBc, p.nk);
      cp_async_commit();
    }
  }

  // ---- this key range's (m, l, O): l summed over the quad, then over the key groups
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
  }
  __syncthreads();  // the last block's row maxima have been read by every warp
#pragma unroll
  for (int r = 0; r < 2; ++r)
    if (lane % 4 == 0) red[kg * kM + row[r]] = l_run[r];
  __syncthreads();
#if __CUDA_ARCH__ >= 900
  if (p.cluster_merge) {
    // ---- the two key ranges of (tile, b) are one cluster of two blocks (launch_shape()): rank 1
    // leaves its (m, l, O) in its own shared memory, rank 0 reads it there (distributed shared
    // memory), merges it with its own registers by the ⊕ and writes O / l in bf16; no partials
    // go to global memory and no combine kernel runs (common/cuda/hopper/cluster_merge.cuh).
    float4* xo = reinterpret_cast<float4*>(smem + S::kK);  // rank 1's O: [NTO][kThreads] float4, in the free ring
    float* xml = reinterpret_cast<float*>(xo + NTO * kThreads);  // rank 1's (m, l) of each row
    float lrow[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      lrow[r] = 0.f;
#pragma unroll
      for (int g = 0; g < KG; ++g) lrow[r] += red[g * kM + row[r]];
    }
    cp_async_wait<0>();  // (only empty groups are left: every stage's last load was consumed)
    // (writes_ml tests lane before kg: in the other order nvcc swaps one OR's operands, and the SASS
    // is no longer that of the merge written out here, as it was before ClusterPairMerge.)
    hopper::ClusterPairMerge<NTO, kThreads> merge;
    merge(
        xo, xml, o, m_run, lrow, row, [&] { return lane % 4 == 0 && kg == 0; },
        [&](int r) { return m0 + row[r] < p.rows; },
        [&](int n, int r, float v0, float v1) {
          const int grow = m0 + row[r];
          *reinterpret_cast<uint32_t*>(p.o_c + (std::size_t(b) * p.rows + grow) * kDVl + kg * NCW + 8 * n +
                                       2 * (lane % 4)) = pack2<bf16>(v0, v1);
        });
    return;
  }
#endif
  const std::size_t part = (std::size_t(b) * p.splits + split) * p.rows;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int grow = m0 + row[r];
    if (grow >= p.rows) continue;
    float* dst = p.o_part + (part + grow) * kDVl + kg * NCW + 2 * (lane % 4);
#pragma unroll
    for (int n = 0; n < NTO; ++n)
      *reinterpret_cast<float2*>(dst + 8 * n) = make_float2(o[n][2 * r], o[n][2 * r + 1]);
    if (kg == 0 && lane % 4 == 0) {
      float l = 0.f;
#pragma unroll
      for (int g = 0; g < KG; ++g) l += red[g * kM + row[r]];
      p.ml_part[(part + grow) * 2] = m_run[r];
      p.ml_part[(part + grow) * 2 + 1] = l;
    }
  }
  if (p.counters == nullptr) return;

  // ---- the fused combine: the last range of this (sequence, tile) to finish merges all of
  // them (at most kFuseMaxSplits), so no second kernel runs. Each block makes its partials
  // visible device-wide before it counts itself; the last one reads the others' through L2.
  __shared__ int is_last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    int* counter = &p.counters[b * gridDim.x + tile];
    is_last = atomicAdd(counter, 1) == p.splits - 1;
    if (is_last) *counter = 0;  // ready for the next launch
  }
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  for (int idx = threadIdx.x; idx < kM * (kDVl / 4); idx += kThreads) {
    const int grow = m0 + idx / (kDVl / 4), c4 = idx % (kDVl / 4);
    if (grow >= p.rows) continue;
    auto at = [&](int sp) { return (std::size_t(b) * p.splits + sp) * p.rows + grow; };
    float m = -INFINITY;
    for (int sp = 0; sp < p.splits; ++sp) m = fmaxf(m, __ldcg(&p.ml_part[at(sp) * 2]));
    const float shift = finite_max(m);  // every range empty: weights 2^-inf = 0
    float l = 0.f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int sp = 0; sp < p.splits; ++sp) {
      const std::size_t a = at(sp);
      const float wgt = exp2_approx(__ldcg(&p.ml_part[a * 2]) - shift);
      l += __ldcg(&p.ml_part[a * 2 + 1]) * wgt;
      const float4 v = __ldcg(reinterpret_cast<const float4*>(p.o_part + a * kDVl) + c4);
      acc.x += wgt * v.x, acc.y += wgt * v.y, acc.z += wgt * v.z, acc.w += wgt * v.w;
    }
    const float inv = l > 0.f ? 1.f / l : 0.f;
    *reinterpret_cast<uint2*>(p.o_c + (std::size_t(b) * p.rows + grow) * kDVl + 4 * c4) =
        make_uint2(pack2<bf16>(acc.x * inv, acc.y * inv), pack2<bf16>(acc.z * inv, acc.w * inv));
  }
}

/// The key ranges of a row merged with ⊕, then O / l in bf16. All ranges at once: with
/// M = max_s m_s, the merged state is (M, sum_s 2^(m_s - M) l_s) and O = sum_s 2^(m_s - M) O_s,
/// which is what folding them in one by one with merge_weights<Base2> gives (exercise
/// ch06.6 is that fold on the CPU), but every range's load is independent of the others.
/// One thread block per (sequence, row, part of the 512 columns): `parts` = 4, 8 or 16 parts
/// of 32, 16 or 8 float4, so that a warp reads 1, 2 or 4 ranges at once (one float4 a lane),
/// and the ranges dealt out to the block's warps (up to 8), whose sums meet in shared memory.
/// Few rows and many ranges (one sequence, H = 16, 64K keys: 16 rows, 128 ranges) take 16
/// parts, so that 256 blocks share the 4 MB of partials instead of 64 (launch_combine()).
constexpr int kCombineMaxWarps = 8;
/// Few ranges (combine_one_trip(): up to kCombineFewSplits, 4 parts): one warp per (row, part)
/// loads every range's (m, l) and float4 at once, one round trip to memory, no shared memory;
/// the general form below reads the maxima first and then the partials, two round trips.
__global__ void combine_kernel(const DecodeParams p, bf16* o_c, int parts) {
  const int c4n = kDVl / 4 / parts, per = 32 / c4n;  // float4 of a part; ranges a warp reads at once
  __shared__ float4 acc_w[kCombineMaxWarps][32];
  __shared__ float l_w[kCombineMaxWarps];
  const int bw = blockIdx.x, part = blockIdx.y, b = bw / p.rows, row = bw % p.rows;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const int sub = lane / c4n, c4 = lane % c4n;  // this lane's range of the warp's `per`, its float4
  auto at = [&](int s) { return (std::size_t(b) * p.splits + s) * p.rows + row; };
#if __CUDA_ARCH__ >= 900
  // Launched as a programmatic dependent launch (launch_combine()): this block may start
  // while the decode still runs; here it waits until the decode grid has completed and its
  // partials are visible. (Without that launch attribute it returns at once.)
  cudaGridDependencySynchronize();
#endif
  if (combine_one_trip(p, parts)) {  // one warp a block (launch_combine())
    float mv[kCombineFewSplits], lv[kCombineFewSplits];
    float4 ov[kCombineFewSplits];
#pragma unroll
    for (int s = 0; s < kCombineFewSplits; ++s) {
      if (s >= p.splits) break;
      const std::size_t a = at(s);
      mv[s] = p.ml_part[a * 2];
      lv[s] = p.ml_part[a * 2 + 1];
      ov[s] = reinterpret_cast<const float4*>(p.o_part + a * kDVl + part * (kDVl / 4))[lane];
    }
    float m = -INFINITY;
#pragma unroll
    for (int s = 0; s < kCombineFewSplits; ++s)
      if (s < p.splits) m = fmaxf(m, mv[s]);
    const float shift = finite_max(m);  // every range empty: weights 2^-inf = 0
    float l = 0.f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int s = 0; s < kCombineFewSplits; ++s) {
      if (s >= p.splits) break;
      const float wgt = exp2_approx(mv[s] - shift);
      l += lv[s] * wgt;
      acc.x += wgt * ov[s].x, acc.y += wgt * ov[s].y, acc.z += wgt * ov[s].z, acc.w += wgt * ov[s].w;
    }
    const float inv = l > 0.f ? 1.f / l : 0.f;
    bf16* dst = o_c + (std::size_t(b) * p.rows + row) * kDVl + part * (kDVl / 4) + 4 * lane;
    *reinterpret_cast<uint2*>(dst) =
        make_uint2(pack2<bf16>(acc.x * inv, acc.y * inv), pack2<bf16>(acc.z * inv, acc.w * inv));
    return;
  }
  float m = -INFINITY;
  for (int s = lane; s < p.splits; s += 32) m = fmaxf(m, p.ml_part[at(s) * 2]);
#pragma unroll
  for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  const float shift = finite_max(m);  // every range empty: weights 2^-inf = 0
  float l = 0.f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
  for (int s = warp * per + sub; s < p.splits; s += warps * per) {
    const std::size_t a = at(s);
    const float wgt = exp2_approx(p.ml_part[a * 2] - shift);
    l += p.ml_part[a * 2 + 1] * wgt;
    const float4 v = reinterpret_cast<const float4*>(p.o_part + a * kDVl + part * (kDVl / parts))[c4];
    acc.x += wgt * v.x, acc.y += wgt * v.y, acc.z += wgt * v.z, acc.w += wgt * v.w;
  }
  // the warp's `per` ranges: lanes with the same float4 are c4n apart
  for (int off = c4n; off < 32; off *= 2) {
    acc.x += __shfl_xor_sync(0xffffffffu, acc.x, off);
    acc.y += __shfl_xor_sync(0xffffffffu, acc.y, off);
    acc.z += __shfl_xor_sync(0xffffffffu, acc.z, off);
    acc.w += __shfl_xor_sync(0xffffffffu, acc.w, off);
    l += __shfl_xor_sync(0xffffffffu, l, off);
  }
  acc_w[warp][lane] = acc;
  if (lane == 0) l_w[warp] = l;
  __syncthreads();
  if (warp != 0 || sub != 0) return;
  for (int w = 1; w < warps; ++w) {
    const float4 v = acc_w[w][lane];
    acc.x += v.x, acc.y += v.y, acc.z += v.z, acc.w += v.w;
    l += l_w[w];
  }
  const float inv = l > 0.f ? 1.f / l : 0.f;
  bf16* dst = o_c + (std::size_t(b) * p.rows + row) * kDVl + part * (kDVl / parts) + 4 * c4;
  *reinterpret_cast<uint2*>(dst) =
      make_uint2(pack2<bf16>(acc.x * inv, acc.y * inv), pack2<bf16>(acc.z * inv, acc.w * inv));
}

/// Launches decode_kernel<S> on `p` as given (grid = (tiles, splits, batch)); with
/// p.cluster_merge the two key ranges of a (tile, sequence) as one cluster (sm_90+).
/// Returns the dynamic shared memory it uses.
template <class S>
int launch_tile(const DecodeParams& p) {
  const dim3 grid(ceil_div(p.rows, S::kM), p.splits, p.batch);
  static const bool configured = [] {  // once per shape, not in every timed launch
    CUDA_CHECK(cudaFuncSetAttribute(decode_kernel<S>, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kBytes));
    return true;
  }();
  (void)configured;
  if (p.cluster_merge) {  // the two key ranges of a (tile, sequence) as one cluster (sm_90+)
    if (p.splits != 2) throw UsageError("mla decode: the cluster merge takes exactly 2 key ranges");
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = 1, attr.val.clusterDim.y = 2, attr.val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(S::kThreads);
    cfg.dynamicSmemBytes = S::kBytes;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, decode_kernel<S>, p));
  } else {
    decode_kernel<S><<<grid, S::kThreads, S::kBytes>>>(p);
  }
  CUDA_CHECK_LAUNCH("mla decode_kernel");
  return S::kBytes;
}

/// Launches combine_kernel: o_c = the ⊕ of every row's key ranges, O / l in bf16.
void launch_combine_kernel(const DecodeParams& p, bf16* o_c) {
  static const int sms = [] {
    int dev = 0, n = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return n;
  }();
  const int parts = combine_parts(p, sms);
  if (parts != 4 && parts != 8 && parts != 16) throw UsageError("mla combine: 4, 8 or 16 parts");
  static const bool hopper_or_later = [] {
    int dev = 0, major = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    return major >= 9;
  }();
  const int per = 32 / (kDVl / 4 / parts);
  const int warps = combine_one_trip(p, parts) ? 1  // the few-ranges form
                                                : std::min(kCombineMaxWarps, ceil_div(p.splits, per));
  // A programmatic dependent launch (sm_90+): the driver may start the combine's blocks once
  // every decode block has called cudaTriggerProgrammaticLaunchCompletion(); each waits in
  // cudaGridDependencySynchronize() for the decode to complete.
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(p.batch * p.rows, parts);
  cfg.blockDim = dim3(32 * warps);
  cfg.attrs = &attr;
  cfg.numAttrs = p.pdl && hopper_or_later ? 1 : 0;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, combine_kernel, p, o_c, parts));
  CUDA_CHECK_LAUNCH("mla combine_kernel");
}

}  // namespace
}  // namespace attn::ch06::mla
