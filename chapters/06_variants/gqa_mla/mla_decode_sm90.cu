// MLA's absorbed decode on Hopper (sm_90a): the 64-row tile of mla_decode.cu rebuilt on
// wgmma and TMA, in the structure of FlashMLA.
//
// With its defaults (kReleasePhased, the combine chosen by absorb_run()) it is the chapter's
// final MLA decode at more than 16 packed rows (the row "final absorb decode (wgmma)"); at 16 or
// fewer, mla_decode.cu's 16-row tile is (absorb_run() in gqa_mla_gpu.cu picks the tile by the
// head count). The other release forms and decode_sm90_halves_kernel below are the lab's forms
// (`--lab --tile64 ...`, LAB.md).
//
// Why a second kernel. At H = 128 the decode is compute-bound (242 FLOP per latent byte,
// the balance of the H200 is about 185), and the mma.sync tile (mla_decode.cu, "Large")
// stalls on shared memory: every warp re-reads its Q and K fragments with ldmatrix for
// each 16 x 32 piece of S, and four warps read each V fragment. wgmma reads both operands
// of S = Q K^T straight from shared memory through descriptors, once per warpgroup, and
// TMA brings each 72 KB key block with one thread's nine instructions.
//
//     thread block (tile of 64 packed rows, key range s, sequence b): two warpgroups
//       | Q [64][576] 72 KB | K ring 2 x [64][576] 144 KB | P 8 KB | alpha 1 KB | mbarriers |
//       Q and K arrive by TMA as nine 128-byte-wide boxes (the 128-byte swizzle)
//
//     both warpgroups, one loop; per key block j (the default, kReleasePhased):
//       warpgroup 0: P_j, alpha_j -> shared      warpgroup 1: .
//       __syncthreads() "P full" ------------------------------------------------------------
//       warpgroup 0 (rows 0..63, O columns 0..255)   warpgroup 1 (O columns 256..511)
//         O_L = alpha O_L + P_j V_j[:, 0:256]          P_j, alpha_j -> registers
//           (4 wgmma m64n256k16, P from registers)     O_R = alpha O_R + P_j V_j[:, 256:512]
//         S_{j+1} = Q K_{j+1}^T issued behind it       wait; both halves done: TMA K_{j+2}
//           (36 wgmma m64n64k16, SS); wait               into the stage
//         mask, online softmax: P_{j+1} in registers
//       __syncthreads() "P read" ------------------------------------------------------------
//
// V is the first 512 columns of the same key tile (the latent c): no bytes of its own.
// The S of a row block is computed once and shared through 8 KB of shared memory, and
// each warpgroup accumulates a 64 x 256 half of O in 128 registers a thread. Each key
// range writes the same (m, l, O) partials as mla_decode.cu, so combine_kernel is shared.
//
// Releasing P. Warpgroup 1 reads P_j and alpha_j into registers; warpgroup 0 may then
// overwrite the single P buffer with P_{j+1}. The forms of that release, all correct by the
// PTX ISA ("bar, barrier": bar.sync and bar.arrive guarantee that when the barrier completes,
// the thread's prior memory accesses are performed for every participant; a read is
// performed once its value has been transmitted and can no longer be changed by another
// participant). P is no wgmma operand (both P V products take it from registers), so nothing
// reads it asynchronously past the release. compute-sanitizer's racecheck follows only one
// pattern at every launch: all 256 threads at the same barrier instruction.
//   kReleasePhased  the default (--tile64 wgmma): both warpgroups in one loop meeting at two
//                   __syncthreads() a block, "P full" and "P read" (above), every wgmma commit
//                   group issued and waited for inside its warpgroup's branch, so that none is in
//                   flight across a branch and ptxas keeps them pipelined (no C7520). Warpgroup 0's
//                   softmax of S_{j+1} sits before "P read", where it overlaps warpgroup 1's
//                   P_j V_j as in kReleaseArrive; warpgroup 0 then waits at "P read" for warpgroup
//                   1's product and refill before it stores P_{j+1}, as in kReleaseSync.
//                   racecheck 0 hazards at 1, 2, 8 and 24 blocks and on one block's data twice,
//                   synccheck and memcheck 0 errors; 1.03-1.04x kReleaseArrive's time at H = 128,
//                   kReleaseBlock's. Its first form, the softmax after "P read": racecheck
//                   0 hazards at 1, 2 and 8 blocks and on one block's data twice, synccheck and
//                   memcheck 0 errors, but 0.98-1.13x kReleaseArrive's time: warpgroup 0 waited
//                   there for warpgroup 1's P_j V_j, queued behind its own S_{j+1}, and the
//                   tensor pipe idled through the softmax.
//   kReleaseArrive  the former default (--tile64 wgmma-arrive): two loops, one per warpgroup;
//                   warpgroup 1 bar.arrives "P empty" right after its loads and goes on, warpgroup 0
//                   bar.syncs on it before its stores. racecheck reports a write-after-read
//                   hazard on every byte of P and alpha whenever the launch has 2+ blocks with 2+
//                   key blocks each: it does not order a load before a bar.arrive with a store
//                   after the matching bar.sync (it does order a store before bar.arrive with a
//                   load after bar.sync: "P full" is never reported).
//   kReleaseSync    kReleaseArrive's loops with barrier.sync "P empty" once warpgroup 1's own
//                   P_j V_j and its refill are done (--tile64 wgmma-sync). Both warpgroups wait
//                   at it from different instructions, so it is the form without .aligned
//                   (barrier_unaligned.cuh; two bar.sync made synccheck report "Divergent
//                   thread(s) in block"). synccheck: 0 errors; racecheck: 0 hazards with one
//                   thread block in the launch, WAR reports on P with several, which follow the
//                   launch, not P's traffic: the one-block shape run twice (--batch 2) is reported
//                   (129), two blocks of one key block each are not. 0-4% slower than kReleaseArrive.
//   kReleaseBlock   kReleaseSync's barrier.sync on barrier 0 (all 256 threads of the block,
//                   __syncthreads()'s barrier) instead of barrier 2 (--tile64 wgmma-block):
//                   racecheck 0 hazards at 1 and 2 blocks, 3,977 at 8; synccheck, memcheck 0.
//   kReleaseLockstep both warpgroups in one loop (--tile64 wgmma-lockstep), as kReleasePhased,
//                   but both issue their half of P_j V_j on the shared path and warpgroup 0 also
//                   S_{j+1} on a branch inside it, left in flight across the barrier: ptxas
//                   serialises the wgmma of this kernel (its C7520 "Potential Performance Loss").
//                   racecheck 0 hazards at 2 and 8 blocks, 1.17-1.51x kReleaseArrive's time.
//   decode_sm90_halves_kernel (--tile64 wgmma-halves, below): the same instructions in both
//                   warpgroups, each computing S for half of the key block; every barrier a
//                   __syncthreads(). racecheck 0 hazards at 1, 2 and 8 blocks and on the one-block
//                   shape run twice; 1.03-1.30x kReleaseArrive's time: its 72 m64n32k16 a block each
//                   read all of Q, and it runs 1.50x the instructions (ncu).
// (Measured on the H200, 2026-12-01 and 2026-12-02; LAB.md.)
//
// With exactly 2 key ranges (DecodeParams::cluster_merge, the default there) the two blocks of
// a (tile, sequence) run as one cluster and merge_in_cluster() merges them through distributed
// shared memory: no fp32 partials, no combine kernel (H = 128, B = 32 x 4K: 0.0858 -> 0.0791 ms).
// (An earlier alternative, P in the k_rope box of its own stage, released through the
// ring's mbarriers, was also flagged by racecheck and ran 9-11% slower on the H200.)
//
// New instructions: `barrier.sync` without .aligned (common/cuda/hopper/barrier_unaligned.cuh,
// the wgmma-sync variant only). wgmma (SS and RS forms), TMA and mbarriers are chapter 05's
// (common/cuda/hopper/: wgmma.cuh, tma.cuh, mbarrier.cuh, named_barrier.cuh).
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "common/cuda/check.cuh"
#include "common/cuda/fast_math.cuh"
#include "common/cuda/frag_softmax.cuh"
#include "common/cuda/hopper/barrier_unaligned.cuh"
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
constexpr int kDK = 576, kDVl = 512;             // latent key [c ; k_rope], latent value c
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
/// cluster_merge, launch_decode_sm90()): rank 1 leaves its O and each row's (m, l) in its key
/// ring (free after the loop: 128 KB of O), rank 0 reads them through distributed shared memory,
/// merges them with its own by the ⊕ and writes O / l in bf16 to o_c. Called by every thread of
/// both blocks; o is this thread's 64 x 256 half of O (warpgroup wg), mrow / lrow its two rows'
/// m (base 2, scaled) and l, the same in every thread of a row.
__device__ __forceinline__ void merge_in_cluster(unsigned char* smem, const float (&o)[kHalf / 2], const float (&mrow)[2],
                                                 const float (&lrow)[2], const DecodeParams& p, int b, int m0,
                                                 const int (&row)[2], int wg, int lane) {
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  float4* xo = reinterpret_cast<float4*>(smem + kK);                   // [32][256] float4
  float* xml = reinterpret_cast<float*>(xo + (kHalf / 8) * kThreads);  // [64 rows][m, l]
  if (cluster.block_rank() == 1) {
#pragma unroll
    for (int c = 0; c < kHalf / 8; ++c)
      xo[c * kThreads + threadIdx.x] = make_float4(o[4 * c], o[4 * c + 1], o[4 * c + 2], o[4 * c + 3]);
    if (wg == 0 && lane % 4 == 0)
#pragma unroll
      for (int r = 0; r < 2; ++r) xml[2 * row[r]] = mrow[r], xml[2 * row[r] + 1] = lrow[r];
  }
  cluster.sync();  // rank 1's partials are in its shared memory, visible to the cluster
  if (cluster.block_rank() == 0) {
    const float4* ro = cluster.map_shared_rank(xo, 1);
    const float* rml = cluster.map_shared_rank(xml, 1);
    float wa[2], wb[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const RangeWeights w = two_range_weights(mrow[r], lrow[r], rml[2 * row[r]], rml[2 * row[r] + 1]);
      wa[r] = w.wa, wb[r] = w.wb;
    }
#pragma unroll
    for (int c = 0; c < kHalf / 8; ++c) {
      const float4 v = ro[c * kThreads + threadIdx.x];
      const float x[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int grow = m0 + row[r];
        if (grow >= p.rows) continue;
        *reinterpret_cast<uint32_t*>(p.o_c + (std::size_t(b) * p.rows + grow) * kDVl + wg * kHalf + 8 * c +
                                     2 * (lane % 4)) =
            pack2<bf16>(o[4 * c + 2 * r] * wa[r] + x[2 * r] * wb[r], o[4 * c + 2 * r + 1] * wa[r] + x[2 * r + 1] * wb[r]);
      }
    }
  }
  cluster.sync();  // rank 0 is done reading rank 1's shared memory: rank 1 may exit
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

// ------------------------------------------------------------------ the key block split in halves
// --tile64 wgmma-halves. Both warpgroups run the same instructions: warpgroup w computes
// S for keys 32 w .. 32 w + 31 of the block (36 wgmma m64n32k16), their row maxima meet in
// shared memory, each writes its half of P, and both multiply all of P by their half of V.
//
//     warpgroup w (rows 0..63; keys 32w..32w+31 of S; O columns 256w..256w+255)
//       S_w = Q K_j[32w:32w+32]^T; mask; row max over its keys (and m) -> smax[w]
//       __syncthreads()  A: m_new = max(smax[0], smax[1]), the same in both warpgroups
//       P_w = 2^(c s - c m_new), l_w = alpha l_w + sum P_w; P_w -> sp[w]
//       __syncthreads()  B: both halves of P written
//       P (both halves) -> registers; O_w = alpha O_w + P V_j[:, 256w:256w+256]; S_{j+1} behind it
//
// Every barrier is the block's barrier 0, reached by all 256 threads at the same instruction,
// and no wgmma sits on a path only one warpgroup takes. Each shared buffer is rewritten only
// after a barrier that follows every read of it: smax[w] is read between A_j and B_j and
// rewritten before A_{j+1}; sp[w] is read between B_j and A_{j+1} and rewritten after A_{j+1}.
// l is kept per warpgroup (its own keys) and summed once at the end.
__global__ void __launch_bounds__(kThreads, 1)
    decode_sm90_halves_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_kv,
                              const DecodeParams p) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = align_1024(smem_raw);
  uint64_t* full_q = reinterpret_cast<uint64_t*>(smem + kBars);
  uint64_t* full = full_q + 1;
  uint64_t* empty = full + kStages;
  uint32_t* sp = reinterpret_cast<uint32_t*>(smem + kP);        // [2 halves][8 registers][128 threads]
  float* smax = reinterpret_cast<float*>(smem + kAlpha);        // [2 halves][64 rows]
  float* sl = smax + 2 * kM;                                    // [64 rows]: warpgroup 1's l, at the end

  const int tile = blockIdx.x, split = blockIdx.y, b = blockIdx.z;
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
  const int m0 = tile * kM;
  const int nblocks = ceil_div(p.nk, kBc);
  const int lo = min(nblocks, split * p.blocks_per_split), hi = min(nblocks, lo + p.blocks_per_split);
  const int n = hi - lo;

  if (threadIdx.x == 0) {
    mbarrier_init(full_q, 1);
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&full[s], 1);
      mbarrier_init(&empty[s], kEmptyArrivals);
    }
    mbarrier_init_fence();
  }
  __syncthreads();

  cudaTriggerProgrammaticLaunchCompletion();

  auto load_kv = [&](int i) {
    const int st = i % kStages;
    mbarrier_arrive_expect_tx(&full[st], kStageBytes);
    for (int bx = 0; bx < kBoxes; ++bx)
      tma_load_3d(smem + kK + st * kStageBytes + bx * kBoxBytes, &tm_kv, &full[st], bx * kBoxCols, (lo + i) * kBc, b);
  };
  if (threadIdx.x == 0 && n > 0) {
    mbarrier_arrive_expect_tx(full_q, kQBytes);
    for (int bx = 0; bx < kBoxes; ++bx)
      tma_load_3d(smem + kQ + bx * kM * kRowBytes, &tm_q, full_q, bx * kBoxCols, m0, b);
    for (int i = 0; i < n && i < kStages; ++i) load_kv(i);
  }

  auto q_desc = [&](int k) {
    return desc_k_major(smem + kQ + (k / 4) * kM * kRowBytes + (32 * k) % kRowBytes, kRowBytes);
  };
  // This warpgroup's 32 keys: 32 rows (4 KB, whole 1024-byte swizzle atoms) into every box.
  auto k_desc = [&](int st, int k) {
    return desc_k_major(smem + kK + st * kStageBytes + (k / 4) * kBoxBytes + wg * (kBc / 2) * kRowBytes +
                            (32 * k) % kRowBytes,
                        kRowBytes);
  };
  auto v_desc = [&](int st, int kk) {
    return desc_mn_major(smem + kK + st * kStageBytes + 4 * wg * kBoxBytes + kk * 16 * kRowBytes, kBoxBytes);
  };

  const int row[2] = {16 * warp + lane / 4, 16 * warp + lane / 4 + 8};
  int limit[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) limit[r] = causal_key_end((m0 + row[r]) % p.nq + 1, p.nq, p.nk);

  float o[kHalf / 2];
#pragma unroll
  for (int i = 0; i < kHalf / 2; ++i) o[i] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  float s[kBc / 4];        // S for this warpgroup's 32 keys
  uint32_t pa[kBc / 4];    // P, both halves: 4 k-steps of 16 keys x 4 registers
  auto issue_s = [&](int st) {
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kDK / 16; ++k) WgmmaSS<bf16, kBc / 2>::mma(s, q_desc(k), k_desc(st, k), k > 0);
    wgmma_commit();
  };
  if (n > 0) {
    mbarrier_wait(full_q, 0);
    mbarrier_wait(&full[0], 0);
    issue_s(0);
    wgmma_wait<0>();
    fence_operand(s);
  }
  auto step = [&](int i, auto next) {
    constexpr bool kNext = decltype(next)::value;
    const int st = i % kStages, j = lo + i;
    const uint32_t ph = (i / kStages) & 1;
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int e = 0; e < kBc / 4; ++e) {
      const int key = j * kBc + wg * (kBc / 2) + 8 * (e / 4) + 2 * (lane % 4) + (e & 1);
      s[e] = key < limit[(e >> 1) & 1] ? s[e] : -INFINITY;
      mx[(e >> 1) & 1] = fmaxf(mx[(e >> 1) & 1], s[e]);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      if (lane % 4 == 0) smax[wg * kM + row[r]] = mx[r];
    }
    __syncthreads();  // A: both warpgroups' row maxima
    float alpha[2], shift[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float mn = fmaxf(smax[row[r]], smax[kM + row[r]]);  // the same value in both warpgroups
      shift[r] = finite_max(mn) * p.scale_log2;
      alpha[r] = exp2_approx((m[r] - finite_max(mn)) * p.scale_log2);
      m[r] = mn;
      l[r] *= alpha[r];
    }
#pragma unroll
    for (int e = 0; e < kBc / 4; ++e) {
      s[e] = exp2_approx(fmaf(s[e], p.scale_log2, -shift[(e >> 1) & 1]));
      l[(e >> 1) & 1] += s[e];
    }
#pragma unroll
    for (int q = 0; q < kBc / 8; ++q) sp[(wg * (kBc / 8) + q) * 128 + t] = pack2<bf16>(s[2 * q], s[2 * q + 1]);
    __syncthreads();  // B: both halves of P
#pragma unroll
    for (int q = 0; q < kBc / 4; ++q) pa[q] = sp[q * 128 + t];
    mbarrier_wait(&full[st], ph);  // complete already; makes the TMA bytes visible to this thread
    rescale(o, alpha);
    fence_operand(o);
    fence_operand(pa);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) {
      const uint32_t a[4] = {pa[4 * kk], pa[4 * kk + 1], pa[4 * kk + 2], pa[4 * kk + 3]};
      WgmmaRS<bf16, kHalf>::mma(o, a, v_desc(st, kk), 1);
    }
    wgmma_commit();
    if constexpr (kNext) {
      mbarrier_wait(&full[(i + 1) % kStages], ((i + 1) / kStages) & 1);
      issue_s((i + 1) % kStages);
    }
    wgmma_wait<kNext ? 1 : 0>();  // P_i V_i is done; S_{i+1} may still run
    fence_operand(o);
    fence_operand(pa);
    if (lane == 0) mbarrier_arrive(&empty[st]);  // this warp is done with the stage
    if (threadIdx.x == 128 && i + kStages < n) {  // the producer: block i + 2 into the stage
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

  // ---- the range's (m, l, O): l of both halves summed (warpgroup 1's through shared memory)
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    if (wg == 1 && lane % 4 == 0) sl[row[r]] = l[r];
  }
  __syncthreads();
  if (p.cluster_merge) {  // l of both halves in every thread (warpgroup 0's through smax, free now)
    if (wg == 0 && lane % 4 == 0)
#pragma unroll
      for (int r = 0; r < 2; ++r) smax[row[r]] = l[r];
    __syncthreads();
    float mrow[2], lrow[2];
#pragma unroll
    for (int r = 0; r < 2; ++r)
      mrow[r] = m[r] == -INFINITY ? -INFINITY : m[r] * p.scale_log2, lrow[r] = smax[row[r]] + sl[row[r]];
    merge_in_cluster(smem, o, mrow, lrow, p, b, m0, row, wg, lane);
    return;
  }
  const float lt[2] = {l[0] + sl[row[0]], l[1] + sl[row[1]]};
  store_partials(o, m, lt, p, b, split, m0, row, wg, lane);
}

/// The two tensor maps of a launch, kept while the tensors stay the same (encoding one is
/// a driver call: not something to repeat in every timed launch).
struct Maps {
  const void* q = nullptr;
  const void* kv = nullptr;
  int batch = 0, rows = 0, nk = 0;
  CUtensorMap tq{}, tkv{};
};

}  // namespace

int launch_decode_sm90(const DecodeParams& p, int release) {
  if (release != kReleaseSync && release != kReleaseArrive && release != kReleaseBlock && release != kReleaseLockstep &&
      release != kHalves && release != kReleasePhased)
    throw UsageError("launch_decode_sm90: no such release of P");
  static const bool configured = [] {
    CUDA_CHECK(cudaFuncSetAttribute(decode_sm90_kernel<kReleaseSync>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    kBytes));
    CUDA_CHECK(cudaFuncSetAttribute(decode_sm90_kernel<kReleaseBlock>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    kBytes));
    CUDA_CHECK(cudaFuncSetAttribute(decode_sm90_kernel<kReleaseLockstep>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    kBytes));
    CUDA_CHECK(cudaFuncSetAttribute(decode_sm90_halves_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes));
    CUDA_CHECK(cudaFuncSetAttribute(decode_sm90_kernel<kReleasePhased>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    kBytes));
    CUDA_CHECK(cudaFuncSetAttribute(decode_sm90_kernel<kReleaseArrive>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    kBytes));
    return true;
  }();
  (void)configured;
  static Maps maps;
  if (maps.q != p.q || maps.kv != p.kv || maps.batch != p.batch || maps.rows != p.rows || maps.nk != p.nk) {
    const CUtensorMapDataType ty = tma_type<bf16>();
    maps.tq = make_tensor_map_3d(p.q, ty, 2, kDK, uint64_t(p.rows), uint64_t(p.batch), kBoxCols, kM);
    maps.tkv = make_tensor_map_3d(p.kv, ty, 2, kDK, uint64_t(p.nk), uint64_t(p.batch), kBoxCols, kBc);
    maps.q = p.q, maps.kv = p.kv, maps.batch = p.batch, maps.rows = p.rows, maps.nk = p.nk;
  }
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
    if (release == kReleaseSync) CUDA_CHECK(cudaLaunchKernelEx(&cfg, decode_sm90_kernel<kReleaseSync>, maps.tq, maps.tkv, p));
    else if (release == kReleaseBlock)
      CUDA_CHECK(cudaLaunchKernelEx(&cfg, decode_sm90_kernel<kReleaseBlock>, maps.tq, maps.tkv, p));
    else if (release == kReleaseLockstep)
      CUDA_CHECK(cudaLaunchKernelEx(&cfg, decode_sm90_kernel<kReleaseLockstep>, maps.tq, maps.tkv, p));
    else if (release == kHalves) CUDA_CHECK(cudaLaunchKernelEx(&cfg, decode_sm90_halves_kernel, maps.tq, maps.tkv, p));
    else if (release == kReleasePhased)
      CUDA_CHECK(cudaLaunchKernelEx(&cfg, decode_sm90_kernel<kReleasePhased>, maps.tq, maps.tkv, p));
    else CUDA_CHECK(cudaLaunchKernelEx(&cfg, decode_sm90_kernel<kReleaseArrive>, maps.tq, maps.tkv, p));
    CUDA_CHECK_LAUNCH("mla decode_sm90_kernel");
    return kBytes;
  }
  if (release == kReleaseSync)
    decode_sm90_kernel<kReleaseSync><<<grid, kThreads, kBytes>>>(maps.tq, maps.tkv, p);
  else if (release == kReleaseBlock)
    decode_sm90_kernel<kReleaseBlock><<<grid, kThreads, kBytes>>>(maps.tq, maps.tkv, p);
  else if (release == kReleaseLockstep)
    decode_sm90_kernel<kReleaseLockstep><<<grid, kThreads, kBytes>>>(maps.tq, maps.tkv, p);
  else if (release == kHalves)
    decode_sm90_halves_kernel<<<grid, kThreads, kBytes>>>(maps.tq, maps.tkv, p);
  else if (release == kReleasePhased)
    decode_sm90_kernel<kReleasePhased><<<grid, kThreads, kBytes>>>(maps.tq, maps.tkv, p);
  else
    decode_sm90_kernel<kReleaseArrive><<<grid, kThreads, kBytes>>>(maps.tq, maps.tkv, p);
  CUDA_CHECK_LAUNCH("mla decode_sm90_kernel");
  return kBytes;
}

}  // namespace attn::ch06::mla
