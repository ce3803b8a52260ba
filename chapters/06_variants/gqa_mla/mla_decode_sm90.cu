// MLA's absorbed decode on Hopper (sm_90a): the 64-row tile of mla_decode.cu rebuilt on
// wgmma and TMA, in the structure of FlashMLA.
//
// Its kReleasePhased form is the one the chapter's final MLA decode (mla_final.cu) takes above 16
// packed rows: the kernel's code is in mla_tile64_sm90.cuh, shared by both files. This file is
// the lab's: every release form and decode_sm90_halves_kernel below (`--lab --tile64 ...`, LAB.md).
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
#include "gqa_mla/mla_tile64_sm90.cuh"

namespace attn::ch06::mla {
namespace {

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

}  // namespace

int launch_decode_sm90(const DecodeParams& p, int release) {
  static const bool configured = [] {
    for (Tile64Kernel k : {decode_sm90_kernel<kReleaseSync>, decode_sm90_kernel<kReleaseBlock>,
                           decode_sm90_kernel<kReleaseLockstep>, decode_sm90_halves_kernel,
                           decode_sm90_kernel<kReleasePhased>, decode_sm90_kernel<kReleaseArrive>})
      CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes));
    return true;
  }();
  (void)configured;
  const Tile64Kernel kernel = release == kReleaseSync       ? decode_sm90_kernel<kReleaseSync>
                              : release == kReleaseBlock    ? decode_sm90_kernel<kReleaseBlock>
                              : release == kReleaseLockstep ? decode_sm90_kernel<kReleaseLockstep>
                              : release == kHalves          ? decode_sm90_halves_kernel
                              : release == kReleasePhased   ? decode_sm90_kernel<kReleasePhased>
                              : release == kReleaseArrive   ? decode_sm90_kernel<kReleaseArrive>
                                                            : nullptr;
  if (kernel == nullptr) throw UsageError("launch_decode_sm90: no such release of P");
  launch_tile64(kernel, p);
  return kBytes;
}

}  // namespace attn::ch06::mla
