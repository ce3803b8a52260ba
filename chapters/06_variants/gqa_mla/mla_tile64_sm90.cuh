#pragma once
/// \file mla_tile64_sm90.cuh
/// \brief MLA's absorbed decode on Hopper (sm_90a), the 64-row wgmma + TMA tile: its layout,
///        decode_sm90_kernel<kRelease> (every release of P: mla_decode_sm90.cu's header comment),
///        the cluster merge, the partials, and the launch. Shared by the lab's
///        mla_decode_sm90.cu (every release, and its halves kernel) and the final mla_final.cu
///        (kReleasePhased alone): each file compiles only the instantiations it launches.
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "common/cuda/check.cuh"
#include "common/cuda/fast_math.cuh"
#include "common/cuda/frag_softmax.cuh"
#include "common/cuda/hopper/barrier_unaligned.cuh"
#include "common/cuda/hopper/cluster_merge.cuh"
#include "common/cuda/hopper/mbarrier.cuh"
#include "common/cuda/hopper/named_barrier.cuh"
#include "common/cuda/hopper/tma.cuh"
#include "common/cuda/hopper/wgmma.cuh"
#include "common/cuda/mma_sync.cuh"
#include "common/errors.hpp"
#include "common/index.hpp"
#include "gqa_mla/mla_decode.cuh"

namespace attn::ch06::mla {
namespace {


using namespace attn::hopper;
using attn::cuda::RowSoftmax;
using attn::cuda::exp2_approx;

using attn::cuda::pack2;
using attn::cuda::rescale;
using bf16 = __nv_bfloat16;

constexpr int kM = 64;                           // packed rows per tile (one wgmma M)
constexpr int kBc = kSm90KeysPerBlock;           // keys per block (the N of S = Q K^T)
constexpr int kStages = 2;                       // the K ring
constexpr int kRowBytes = 128, kBoxCols = 64;    // one TMA box row: 64 bf16 (the 128-byte swizzle)
constexpr int kBoxes = kDK / kBoxCols;           // 9 boxes across a key row
constexpr int kHalf = kDVl / 2;                  // O columns per warpgroup (256)
constexpr int kBoxBytes = kBc * kRowBytes;       // 8 KB: one box of 64 rows
constexpr int kQBytes = kBoxes * kM * kRowBytes;     // 72 KB
constexpr int kStageBytes = kBoxes * kBoxBytes;      // 72 KB
constexpr int kThreads = 256;                        // two warpgroups
constexpr int kPWords = (kBc / 16) * 4 * 128;        // P as 4 k-slices x 4 registers x 128 threads
// Shared memory: | Q | K ring | P | alpha | mbarriers: full_q, full[2], empty[2] |
constexpr int kQ = 0;
constexpr int kK = kQ + kQBytes;
constexpr int kP = kK + kStages * kStageBytes;
constexpr int kAlpha = kP + kPWords * 4;
constexpr int kBars = kAlpha + 128 * 2 * 4;
constexpr int kBytes = kBars + 8 * (1 + 2 * kStages) + 1024;  // + 1024: the base aligned up to 1024
static_assert(kQBytes % 1024 == 0 && kStageBytes % 1024 == 0, "TMA's 128-byte swizzle needs 1024-aligned tiles");
static_assert(kBytes <= 227 * 1024, "one block per SM");
// Named barriers between the two warpgroups (0 is __syncthreads): P_j written, P_j read.
constexpr int kBarPFull = 1, kBarPEmpty = 2;
// kReleaseBlock meets at "P empty" on barrier 0: all 256 threads of the block, the barrier
// of __syncthreads(), without .aligned (the two warpgroups wait at different instructions).
template <int kRelease>
constexpr int bar_p_empty() { return kRelease == kReleaseBlock ? 0 : kBarPEmpty; }
constexpr int kEmptyArrivals = 8;  // lane 0 of every warp releases a stage

__device__ __forceinline__ unsigned char* align_1024(unsigned char* p) {
  return reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(p) + 1023) & ~uintptr_t(1023));
}

/// The two key ranges of a (tile, sequence) as one cluster of two blocks (DecodeParams::
/// cluster_merge, launch_decode_sm90()): ClusterPairMerge (common/cuda/hopper/
/// cluster_merge.cuh) with rank 1's O and each row's (m, l) in its key ring (free after the loop:
/// 128 KB of O), O / l in bf16 to o_c. Called by every thread of both blocks; o is this thread's
/// 64 x 256 half of O (warpgroup wg), mrow / lrow its two rows' m (base 2, scaled) and l, the
/// same in every thread of a row.
__device__ __forceinline__ void merge_in_cluster(unsigned char* smem, const float (&o)[kHalf / 2], const float (&mrow)[2],
                                                 const float (&lrow)[2], const DecodeParams& p, int b, int m0,
                                                 const int (&row)[2], int wg, int lane) {
  float4* xo = reinterpret_cast<float4*>(smem + kK);                   // [32][256] float4
  float* xml = reinterpret_cast<float*>(xo + (kHalf / 8) * kThreads);  // [64 rows][m, l]
  ClusterPairMerge<kHalf / 8, kThreads> merge;
  merge(
      xo, xml, o, mrow, lrow, row, [&] { return wg == 0 && lane % 4 == 0; },
      [&](int r) { return m0 + row[r] < p.rows; },
      [&](int c, int r, float v0, float v1) {
        const int grow = m0 + row[r];
        *reinterpret_cast<uint32_t*>(p.o_c + (std::size_t(b) * p.rows + grow) * kDVl + wg * kHalf + 8 * c +
                                     2 * (lane % 4)) = pack2<bf16>(v0, v1);
      });
}

/// A key range's partials, in mla_decode.cu's layout (combine_kernel merges them): this thread's
/// part of warpgroup wg's 64 x 256 half of the unnormalised O in fp32, and (warpgroup 0) each of
/// its two rows' (m, l), m in base-2 units of the scaled score. m_raw: the rows' maxima of the raw
/// scores (-inf for a row that saw no key), l: their sums over the whole key range.
__device__ __forceinline__ void store_partials(const float (&o)[kHalf / 2], const float (&m_raw)[2], const float (&l)[2],
                                               const DecodeParams& p, int b, int split, int m0, const int (&row)[2],
                                               int wg, int lane) {
  const std::size_t part = (std::size_t(b) * p.splits + split) * p.rows;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int grow = m0 + row[r];
    if (grow >= p.rows) continue;
    float* dst = p.o_part + (part + grow) * kDVl + wg * kHalf + 2 * (lane % 4);
#pragma unroll
    for (int c = 0; c < kHalf / 8; ++c)
      *reinterpret_cast<float2*>(dst + 8 * c) = make_float2(o[4 * c + 2 * r], o[4 * c + 2 * r + 1]);
    if (wg == 0 && lane % 4 == 0) {
      p.ml_part[(part + grow) * 2] = m_raw[r] == -INFINITY ? -INFINITY : m_raw[r] * p.scale_log2;
      p.ml_part[(part + grow) * 2 + 1] = l[r];
    }
  }
}

template <int kRelease>
__global__ void __launch_bounds__(kThreads, 1)
    decode_sm90_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_kv,
                       const DecodeParams p) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = align_1024(smem_raw);
  uint64_t* full_q = reinterpret_cast<uint64_t*>(smem + kBars);
  uint64_t* full = full_q + 1;
  uint64_t* empty = full + kStages;
  uint32_t* sp = reinterpret_cast<uint32_t*>(smem + kP);
  float* salpha = reinterpret_cast<float*>(smem + kAlpha);

  const int tile = blockIdx.x, split = blockIdx.y, b = blockIdx.z;
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
  const int m0 = tile * kM;
  const int nblocks = ceil_div(p.nk, kBc);
  const int lo = min(nblocks, split * p.blocks_per_split), hi = min(nblocks, lo + p.blocks_per_split);
  const int n = hi - lo;  // key blocks of this range

  if (threadIdx.x == 0) {
    mbarrier_init(full_q, 1);
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&full[s], 1);
      mbarrier_init(&empty[s], kEmptyArrivals);
    }
    mbarrier_init_fence();
  }
  __syncthreads();

  cudaTriggerProgrammaticLaunchCompletion();  // the combine may be launched (it waits for this grid)

  // Block lo + i into stage i % kStages: nine boxes of [64 keys][64 columns]. Keys past
  // Nk arrive as zeros (and count towards the transaction).
  auto load_kv = [&](int i) {
    const int st = i % kStages;
    mbarrier_arrive_expect_tx(&full[st], kStageBytes);
    for (int bx = 0; bx < kBoxes; ++bx)
      tma_load_3d(smem + kK + st * kStageBytes + bx * kBoxBytes, &tm_kv, &full[st], bx * kBoxCols, (lo + i) * kBc, b);
  };
  if (threadIdx.x == 0 && n > 0) {
    mbarrier_arrive_expect_tx(full_q, kQBytes);
    for (int bx = 0; bx < kBoxes; ++bx)
      tma_load_3d(smem + kQ + bx * kM * kRowBytes, &tm_q, full_q, bx * kBoxCols, m0, b);  // rows past H Nq: zeros
    for (int i = 0; i < n && i < kStages; ++i) load_kv(i);
  }

  // Descriptors. K-step k (16 columns, 32 bytes) of Q or K: box k / 4, 32 (k % 4) bytes into its rows.
  auto q_desc = [&](int k) {
    return desc_k_major(smem + kQ + (k / 4) * kM * kRowBytes + (32 * k) % kRowBytes, kRowBytes);
  };
  auto k_desc = [&](int st, int k) {
    return desc_k_major(smem + kK + st * kStageBytes + (k / 4) * kBoxBytes + (32 * k) % kRowBytes, kRowBytes);
  };
  // V = columns [256 h, 256 h + 256) of the key tile, N-major: boxes 4h..4h+3 are its
  // four 64-column slabs (kBoxBytes apart); K-step kk is keys 16 kk.. (16 rows down).
  auto v_desc = [&](int st, int kk, int h) {
    return desc_mn_major(smem + kK + st * kStageBytes + 4 * h * kBoxBytes + kk * 16 * kRowBytes, kBoxBytes);
  };

  // This thread's two rows of the tile (the accumulator layout of wgmma.cuh), and the
  // keys they may see: causal, bottom-right, by query position i = row % Nq.
  const int row[2] = {16 * warp + lane / 4, 16 * warp + lane / 4 + 8};
  int limit[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) limit[r] = causal_key_end((m0 + row[r]) % p.nq + 1, p.nq, p.nk);

  float o[kHalf / 2];  // this warpgroup's 64 x 256 half of O
#pragma unroll
  for (int i = 0; i < kHalf / 2; ++i) o[i] = 0.f;
  RowSoftmax sm;
  sm.init();

  // What every form of the loop below shares; they differ only in how P_i reaches warpgroup 1
  // and how its buffer is released. S = Q K^T of stage st, issued into s:
  auto issue_s = [&](float (&s)[kBc / 2], int st) {
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kDK / 16; ++k) WgmmaSS<bf16, kBc>::mma(s, q_desc(k), k_desc(st, k), k > 0);
    wgmma_commit();
  };
  // The keys of block i a row may not see (past Nk, or a causal diagonal with Nq > 1) to -inf.
  // A select on every score, not a branch around the loop: accumulator registers written on a
  // divergent path make ptxas serialise the wgmma of this warpgroup.
  auto mask = [&](float (&s)[kBc / 2], int i) {
    const int j = lo + i;
#pragma unroll
    for (int e = 0; e < kBc / 2; ++e) {
      const int key = j * kBc + 8 * (e / 4) + 2 * (lane % 4) + (e & 1);
      s[e] = key < limit[(e >> 1) & 1] ? s[e] : -INFINITY;
    }
  };
  // Half h of O (columns 256 h .. 256 h + 255) += P V of stage st, P from registers, issued.
  auto issue_pv = [&](const uint32_t (&pb)[kBc / 4], int st, int h) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) {
      const uint32_t a[4] = {pb[4 * kk], pb[4 * kk + 1], pb[4 * kk + 2], pb[4 * kk + 3]};
      WgmmaRS<bf16, kHalf>::mma(o, a, v_desc(st, kk, h), 1);
    }
    wgmma_commit();
  };
  // Warpgroup 1's part of block i once P_i and alpha_i are in its registers: O_R = alpha O_R +
  // P_i V_i[:, 256:512], then the stage released and (thread 0, the producer) refilled with block
  // i + 2 once all eight warps have released it.
  auto right_half = [&](uint32_t (&pb)[kBc / 4], const float (&ab)[2], int i, int st, uint32_t ph) {
    mbarrier_wait(&full[st], ph);  // complete already (warpgroup 0 waited); makes the TMA bytes visible here
    rescale(o, ab);
    fence_operand(o);
    fence_operand(pb);
    issue_pv(pb, st, 1);
    wgmma_wait<0>();
    fence_operand(o);
    fence_operand(pb);
    if (lane == 0) mbarrier_arrive(&empty[st]);
    if (t == 0 && i + kStages < n) {
      mbarrier_wait(&empty[st], ph);
      load_kv(i + kStages);
    }
    __syncwarp();  // warp 0 whole again after its lane 0 was the producer: bar.sync wants the whole warp
  };

  if constexpr (kRelease == kReleaseLockstep) {
    // ------------------------------------------------ both warpgroups in one loop (--tile64 wgmma-lockstep)
    // Per block i: warpgroup 0's softmax writes P_i; __syncthreads() "P full"; warpgroup 0
    // issues P_i V_i (left) and S_{i+1}, warpgroup 1 loads P_i; __syncthreads() "P read";
    // warpgroup 1 issues P_i V_i (right) and refills the stage. Both barriers are reached by
    // every thread at the same instruction (the aligned barrier 0, as racecheck expects).
    float s[kBc / 2];
    uint32_t pr[kBc / 4];
    if (wg == 0 && n > 0) {
      mbarrier_wait(full_q, 0);
      mbarrier_wait(&full[0], 0);
      issue_s(s, 0);
      wgmma_wait<0>();
      fence_operand(s);
    }
    // Block i; kNext: S_{i+1} follows (every block but the last, peeled off so that no wgmma
    // sits under a condition inside the loop).
    auto step = [&](int i, auto next) {
      constexpr bool kNext = decltype(next)::value;
      const int st = i % kStages;
      const uint32_t ph = (i / kStages) & 1;
      float alpha[2];
      if (wg == 0) {
        mask(s, i);
        sm.update(s, p.scale_log2, alpha);
#pragma unroll
        for (int q = 0; q < kBc / 4; ++q) pr[q] = pack2<bf16>(s[2 * q], s[2 * q + 1]);
#pragma unroll
        for (int q = 0; q < kBc / 4; ++q) sp[q * 128 + t] = pr[q];
        salpha[2 * t] = alpha[0];
        salpha[2 * t + 1] = alpha[1];
      }
      __syncthreads();  // "P full": P_i and alpha_i written
      if (wg == 1) {
#pragma unroll
        for (int q = 0; q < kBc / 4; ++q) pr[q] = sp[q * 128 + t];
        alpha[0] = salpha[2 * t];
        alpha[1] = salpha[2 * t + 1];
        mbarrier_wait(&full[st], ph);  // complete already (warpgroup 0 waited); makes the TMA bytes visible here
      }
      // O_half = alpha O_half + P_i V_i[:, 256 wg : 256 wg + 256], the same instructions in both warpgroups
      rescale(o, alpha);
      fence_operand(o);
      fence_operand(pr);
      issue_pv(pr, st, wg);
      if constexpr (kNext) {
        if (wg == 0) {
          mbarrier_wait(&full[(i + 1) % kStages], ((i + 1) / kStages) & 1);
          issue_s(s, (i + 1) % kStages);
        } else {
          wgmma_commit();  // an empty group, so that both warpgroups wait at the same count below
        }
      }
      __syncthreads();  // "P read": warpgroup 1 holds P_i in registers; P_{i+1} may be written
      wgmma_wait<kNext ? 1 : 0>();  // P_i V_i is done; S_{i+1} may still run
      fence_operand(o);
      fence_operand(pr);
      if (lane == 0) mbarrier_arrive(&empty[st]);  // this warp is done with the stage
      // The producer: once all eight warps have released stage st, block i + 2 goes into it.
      if (threadIdx.x == 128 && i + kStages < n) {
        mbarrier_wait(&empty[st], ph);
        load_kv(i + kStages);
      }
      __syncwarp();
      if constexpr (kNext) {
        wgmma_wait<0>();
        fence_operand(s);
      }
    };
    for (int i = 0; i + 1 < n; ++i) step(i, std::true_type{});
    if (n > 0) step(n - 1, std::false_type{});
  } else if constexpr (kRelease == kReleasePhased) {
    // ----------------------- both warpgroups in one loop, each wgmma in its role (the default, --tile64 wgmma)
    // Per block i: warpgroup 0 stores P_i and alpha_i (its softmax of S_i ran in the phase
    // before); __syncthreads() "P full"; warpgroup 0 issues O_L += P_i V_i and S_{i+1}, waits,
    // and runs the softmax of S_{i+1} into registers, while warpgroup 1 loads P_i, issues O_R
    // += P_i V_i, waits and refills the stage; __syncthreads() "P read". Both barriers are
    // reached by all 256 threads at the same instruction (lockstep's pattern, the one
    // racecheck follows), but no wgmma is in flight across a branch: every commit group is
    // issued and waited for on one warpgroup's path, as in kReleaseArrive's two loops, so
    // ptxas keeps the products pipelined. The softmax of S_{i+1} sits before "P read", so it
    // overlaps warpgroup 1's P_i V_i as in kReleaseArrive; what is added is warpgroup 0
    // waiting, before it may store P_{i+1}, for warpgroup 1's product and refill (as in
    // kReleaseSync), and one more barrier a block.
    float s[kBc / 2];
    uint32_t pr[kBc / 4];
    float alpha[2];
    // Warpgroup 0: mask and softmax of S_i into P_i (registers, bf16) and alpha_i.
    auto softmax = [&](int i) {
      mask(s, i);
      sm.update(s, p.scale_log2, alpha);
#pragma unroll
      for (int q = 0; q < kBc / 4; ++q) pr[q] = pack2<bf16>(s[2 * q], s[2 * q + 1]);
    };
    if (wg == 0 && n > 0) {
      mbarrier_wait(full_q, 0);
      mbarrier_wait(&full[0], 0);
      issue_s(s, 0);
      wgmma_wait<0>();
      fence_operand(s);
      softmax(0);
    }
    auto step = [&](int i, auto next) {
      constexpr bool kNext = decltype(next)::value;
      const int st = i % kStages;
      const uint32_t ph = (i / kStages) & 1;
      if (wg == 0) {  // P_i and alpha_i to shared memory
#pragma unroll
        for (int q = 0; q < kBc / 4; ++q) sp[q * 128 + t] = pr[q];
        salpha[2 * t] = alpha[0];
        salpha[2 * t + 1] = alpha[1];
      }
      __syncthreads();  // "P full": P_i and alpha_i written
      if (wg == 0) {    // O_L = alpha O_L + P_i V_i[:, 0:256], then S_{i+1} and its softmax
        rescale(o, alpha);
        fence_operand(o);
        issue_pv(pr, st, 0);
        if constexpr (kNext) {
          mbarrier_wait(&full[(i + 1) % kStages], ((i + 1) / kStages) & 1);
          issue_s(s, (i + 1) % kStages);
        }
        wgmma_wait<kNext ? 1 : 0>();  // P_i V_i is done; S_{i+1} may still run
        fence_operand(o);
        fence_operand(pr);
        if (lane == 0) mbarrier_arrive(&empty[st]);  // this warp is done with the stage
        __syncwarp();
        if constexpr (kNext) {
          wgmma_wait<0>();
          fence_operand(s);
          softmax(i + 1);  // P_{i+1} into registers: shared memory's P_i may still be read
        }
      } else {  // O_R = alpha O_R + P_i V_i[:, 256:512], and the refill of the stage
        // P_i and alpha_i in registers of this branch's own (warpgroup 0's pr and alpha live
        // across the barriers; sharing them would make the two paths meet in register moves).
        uint32_t pb[kBc / 4];
#pragma unroll
        for (int q = 0; q < kBc / 4; ++q) pb[q] = sp[q * 128 + t];
        const float ab[2] = {salpha[2 * t], salpha[2 * t + 1]};
        right_half(pb, ab, i, st, ph);
      }
      __syncthreads();  // "P read": P_i is in warpgroup 1's registers; P_{i+1} may be stored
    };
    for (int i = 0; i + 1 < n; ++i) step(i, std::true_type{});
    if (n > 0) step(n - 1, std::false_type{});
  } else if (wg == 0) {
    // ---------------------------------------------------------------- warpgroup 0: S, softmax, left half of O
    float s[kBc / 2];
    uint32_t pr[kBc / 4];
    if (n > 0) {
      mbarrier_wait(full_q, 0);
      mbarrier_wait(&full[0], 0);
      issue_s(s, 0);
      wgmma_wait<0>();
      fence_operand(s);
    }
    // Block i: mask and softmax of S_i, P_i out to warpgroup 1, then O_L += P_i V_i issued.
    auto softmax_and_pv = [&](int i) {
      const int st = i % kStages;
      mask(s, i);
      float alpha[2];
      sm.update(s, p.scale_log2, alpha);
#pragma unroll
      for (int q = 0; q < kBc / 4; ++q) pr[q] = pack2<bf16>(s[2 * q], s[2 * q + 1]);
      // P_i and alpha_i to warpgroup 1 (it has read P_{i-1} once "P empty" completes).
      if (i > 0) {
        if constexpr (kRelease != kReleaseArrive) named_barrier_sync_unaligned(bar_p_empty<kRelease>(), kThreads);
        else named_barrier_sync(kBarPEmpty, kThreads);
      }
#pragma unroll
      for (int q = 0; q < kBc / 4; ++q) sp[q * 128 + t] = pr[q];
      salpha[2 * t] = alpha[0];
      salpha[2 * t + 1] = alpha[1];
      named_barrier_arrive(kBarPFull, kThreads);
      // O_L = alpha O_L + P_i V_i[:, 0:256]
      rescale(o, alpha);
      fence_operand(o);
      issue_pv(pr, st, 0);
    };
    // Every block but the last: S_{i+1} is issued behind P_i V_i, so the tensor cores
    // have the next product queued while this warpgroup waits. (The last block is peeled
    // off: a wgmma under a condition inside the loop would be serialised by ptxas.)
    for (int i = 0; i + 1 < n; ++i) {
      softmax_and_pv(i);
      const int st1 = (i + 1) % kStages;
      mbarrier_wait(&full[st1], ((i + 1) / kStages) & 1);
      issue_s(s, st1);
      wgmma_wait<1>();  // P_i V_i is done; S_{i+1} may still run
      fence_operand(o);
      fence_operand(pr);
      if (lane == 0) mbarrier_arrive(&empty[i % kStages]);  // this warp is done with the stage
      __syncwarp();  // the whole warp again before the aligned wgmma.wait_group and bar.sync
      wgmma_wait<0>();
      fence_operand(s);
    }
    if (n > 0) {
      softmax_and_pv(n - 1);
      wgmma_wait<0>();
      fence_operand(o);
      fence_operand(pr);
      if (lane == 0) mbarrier_arrive(&empty[(n - 1) % kStages]);
    }
  } else {
    // ---------------------------------------------------------------- warpgroup 1: right half of O, the loads
    for (int i = 0; i < n; ++i) {
      const int st = i % kStages;
      const uint32_t ph = (i / kStages) & 1;
      named_barrier_sync(kBarPFull, kThreads);
      uint32_t pr[kBc / 4];
#pragma unroll
      for (int q = 0; q < kBc / 4; ++q) pr[q] = sp[q * 128 + t];
      const float alpha[2] = {salpha[2 * t], salpha[2 * t + 1]};
      if (kRelease == kReleaseArrive && i + 1 < n) named_barrier_arrive(kBarPEmpty, kThreads);
      right_half(pr, alpha, i, st, ph);
      // P_j was read (its values are in this thread's registers and P_j V_j is complete):
      // warpgroup 0 may write P_{j+1}, after its softmax of block j + 1.
      if (kRelease != kReleaseArrive && i + 1 < n) named_barrier_sync_unaligned(bar_p_empty<kRelease>(), kThreads);
    }
  }

  // ---- this key range's (m, l, O): the same partials as mla_decode.cu (m in base-2 units of
  // the scaled score, l summed over the quad, O not normalised)
  float l[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] = sm.l[r];
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  if (p.cluster_merge) {
    // Warpgroup 0 holds the rows' (m, l): to warpgroup 1 through the alpha buffer (both
    // warpgroups are past their last use of it at the first barrier).
    __syncthreads();
    float* sml = reinterpret_cast<float*>(smem + kAlpha);
    if (wg == 0 && lane % 4 == 0)
#pragma unroll
      for (int r = 0; r < 2; ++r)
        sml[2 * row[r]] = sm.m[r] == -INFINITY ? -INFINITY : sm.m[r] * p.scale_log2, sml[2 * row[r] + 1] = l[r];
    __syncthreads();
    float mrow[2], lrow[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) mrow[r] = sml[2 * row[r]], lrow[r] = sml[2 * row[r] + 1];
    merge_in_cluster(smem, o, mrow, lrow, p, b, m0, row, wg, lane);
    return;
  }
  store_partials(o, sm.m, l, p, b, split, m0, row, wg, lane);
}

/// The two tensor maps of a launch, kept while the tensors stay the same (encoding one is
/// a driver call: not something to repeat in every timed launch).
struct Maps {
  const void* q = nullptr;
  const void* kv = nullptr;
  int batch = 0, rows = 0, nk = 0;
  CUtensorMap tq{}, tkv{};
};

/// The tensor maps of `p`'s q and kv, encoded again only when the tensors change.
const Maps& tensor_maps(const DecodeParams& p) {
  static Maps maps;
  if (maps.q != p.q || maps.kv != p.kv || maps.batch != p.batch || maps.rows != p.rows || maps.nk != p.nk) {
    const CUtensorMapDataType ty = tma_type<bf16>();
    maps.tq = make_tensor_map_3d(p.q, ty, 2, kDK, uint64_t(p.rows), uint64_t(p.batch), kBoxCols, kM);
    maps.tkv = make_tensor_map_3d(p.kv, ty, 2, kDK, uint64_t(p.nk), uint64_t(p.batch), kBoxCols, kBc);
    maps.q = p.q, maps.kv = p.kv, maps.batch = p.batch, maps.rows = p.rows, maps.nk = p.nk;
  }
  return maps;
}

/// A kernel of this tile's layout and arguments (decode_sm90_kernel<kRelease>, the halves kernel).
using Tile64Kernel = void (*)(const CUtensorMap, const CUtensorMap, const DecodeParams);

/// Launches `kernel` (its dynamic shared memory already allowed: kBytes) on `p`, grid = (tiles,
/// splits, batch); with p.cluster_merge the two key ranges of a (tile, sequence) as one cluster.
void launch_tile64(Tile64Kernel kernel, const DecodeParams& p) {
  const Maps& maps = tensor_maps(p);
  const dim3 grid(ceil_div(p.rows, kM), p.splits, p.batch);
  if (p.cluster_merge) {  // the two key ranges of a (tile, sequence) as one cluster of two blocks
    if (p.splits != 2) throw UsageError("mla decode_sm90: the cluster merge takes exactly 2 key ranges");
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = 1, attr.val.clusterDim.y = 2, attr.val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = kBytes;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, maps.tq, maps.tkv, p));
  } else {
    kernel<<<grid, kThreads, kBytes>>>(maps.tq, maps.tkv, p);
  }
  CUDA_CHECK_LAUNCH("mla decode_sm90_kernel");
}

}  // namespace
}  // namespace attn::ch06::mla
