// Chapter 05, backward step 15 of 15 (from b13): the next step's S^T issued before this step's dQ leaves.
//
//     b1  wgmma backward: S^T, dP^T, dV, dK and dQ on wgmma; TMA loads; dQ through shared
//         memory and one bulk reduce-add per tile
//     b2  warp specialisation: a producer warpgroup feeds Q_i, dO_i, LSE_i, D_i through a
//         ring of full/empty mbarriers; the consumers never stop for __syncthreads()
//     b3  dQ in fragment order: each thread's dQ registers go to shared memory (and the
//         accumulator) in the wgmma accumulator's order, with no bank conflict
//     b4  no spills: the wgmma descriptors of K_j and V_j are rebuilt every step instead
//         of being kept in registers across the loop
//     b5  a dQ writer warp: a warp of the producer warpgroup issues the reduce-adds (and, in
//         the deterministic mode, waits for its turn), from double-buffered dQ tiles
//     b6  deterministic walk from the end: in the deterministic mode every key block walks
//         its query blocks from the last one down, so that the blocks reach a tile together
//     b7  dQ split by keys: each consumer multiplies its own 64 keys' dS by its own rows of
//         K_j and hands over a whole 64 x d tile; no barrier between the two consumers
//     b8  stages released on named barriers (from b6): the consumers arrive, the producer's
//         warp waits, and compute-sanitizer's racecheck can see the order
//     b9  two dS^T buffers: step s writes buffer s % 2, and the consumers meet once a step
//     b10 consumer offset: consumer 0 computes step s - 1's dQ in step s; the meeting becomes
//         one-way signals, and the two consumers stop running in lockstep
//     b11 longest walks first: with the causal mask the grid is (KV head, key block), so the
//         hardware starts every head's key block 0 (the longest walk) before any key block 1
//     b12 (d = 64) pairs of query blocks: 128 queries a step
//     b13 eighty queries (d = 128 only, from b11): Br = 80, dQ^T = K_j^T dS^T on the tensor
//         cores, dS^T in 32-byte-swizzled slabs, one dQ buffer per consumer
//     b14 dS by queries: dS stored [queries][keys], K-major (slower: a counter-example)
//   > b15 scores ahead (from b13): the next step's S^T is issued before this step's dQ leaves
//
// What changes from b13. In b13 a consumer's step ends with one wait for all three of its
// products (dV, dK, dQ), then stores dQ into shared memory for the writer, and only then, at the
// top of the next step, waits for the next stage and issues the next S^T: between the last
// product of a step and the first of the next, the tensor cores have nothing of this consumer's
// to do (the dQ stores, the fence, the barriers, the stage wait and the issue itself). b15 keeps
// the next S^T in flight across that gap:
//
//     b13, step s: ... dV dK dQ | wait all | release | dQ -> smem || wait stage | S^T dP^T | wait S^T | exp ...
//     b15, step s: ... dV dK dQ | wait dV dK | release | wait stage | S^T | wait dQ | dQ -> smem || wait S^T | dP^T | exp ...
//
// Three commit groups where b13 has two: {dV, dK}, {dQ}, {the next S^T}; wgmma_wait<1> after
// the first two leaves dQ running, wgmma_wait<1> after the third leaves S^T(s+1) running while
// dQ goes to shared memory. At the top of the step S^T is waited for alone and dP^T issued after
// it, still under the exponentials as in b13 (waiting for S^T with dP^T already issued, b13's
// order, ptxas cannot follow across the loop's back edge: it serialised every wgmma of the
// kernel, C7514). The registers fit as in b13: S^T(s+1)'s 40 accumulators are live with
// dQ's 40 and dK_j, dV_j's 128 only once P^T and dS^T (40) are free, the 208 of b13's peak. The
// stage is released once dV and dK are done (dQ reads K_j and dS^T, never the stage). The first
// step's S^T is issued before the loop, and the last step issues one more from its own stage
// (nobody refills it): a product under a condition made ptxas keep both paths' accumulators in
// b10, so every step issues one, and the extra one is never read.
//
// Measured (NVIDIA H200, 2026-12-01, the full sweep of 21:11 UTC, every step in one run; d = 128,
// N = 8K, B = 2, H = 16): 477 TFLOP/s not causal and 470 causal against b13's 492 and 488 (-3.1%,
// -3.8%; +2-5% was predicted), deterministic 454 / 404 against 469 / 425. Both modes passed the fp64
// check there. What the order costs is what ptxas forced: dP^T now waits for S^T to complete at
// the top of every step instead of being issued behind it, a bubble larger than the dQ stores the
// early S^T hides. A counter-example, like b14; b13 is the step to use.
//
// What b13 changed from b11 (b13 is a branch: b12 is the d = 64 move, this is d = 128's). A step's
// chain of latencies (S^T, the exponentials, dS^T to shared memory, dV and dK, dQ, dQ to shared
// memory) is paid once per Br queries; at d = 128 registers allow 80 where d = 64 allows 128
// (dK_j and dV_j alone take 128 of a consumer thread's 240): 25% more work per chain.
//
//     S^T  = K_w Q_i^T     m64 n80 k16 x 8     (was n64)        dP^T likewise
//     dV  += P^T dO_i      m64 n128 k16 x 5    (was x 4)        dK likewise
//     dQ_i^T[half w] = K_j^T[half w] dS^T                        m64 n80 k16 x 8
//
// * **dQ transposed.** dQ_i has 80 rows, and a wgmma's M is 64: b11's dQ = dS K_j (M = the
//   queries) no longer fits. Its transpose does: dQ_i^T = K_j^T dS^T, M = d (consumer w takes
//   columns 64w .. 64w + 63 of d, as before), N = the 80 queries, K = the 128 keys. Both
//   operands are already in shared memory in the right form: K_j^T is K_j read MN-major (b11's
//   B operand of dQ becomes the A operand), dS^T is stored [keys][queries], N contiguous: MN-major
//   too (WgmmaSSMN<T, 80>, a new shape of gen_wgmma_ops.py).
// * **dS^T in the 32-byte swizzle.** A row of dS^T is now 80 queries, 160 bytes: not one
//   128-byte swizzled row. It is stored as five slabs of 16 queries, each 128 keys x 32 bytes in
//   the 32-byte swizzle (16-byte chunk c of row r at c ^ ((r / 4) % 2): eight rows of a warp's
//   store on different banks), which is the MN-major canonical layout with LBO = the slab stride
//   (4 KB) and SBO = 8 rows x 32 bytes = 256 (PTX ISA, the matrix descriptor; swizzle mode 3).
//   20 KB a buffer, two buffers as in b9.
// * **The accumulator, transposed.** Consumer w's dQ^T half is 64 d-columns x 80 queries in the
//   registers' order (float2 y of thread w at (y x 128 + w) x 2, y < 20), in blocks of 80 query
//   rows: dq_accum_transposed_index() (backward_tiles.hpp), which the postprocess inverts (a
//   float4 there is four queries of one column). The walk, the LSE and D arrays and the
//   accumulator are in 80-row blocks (Fa3BwdParams::block_rows, set by the host).
// * **One dQ buffer per consumer** (b5 had two). Shared memory at d = 128: K_j, V_j 64 KB;
//   Q_i, dO_i 20 KB each x 2 stages; dS^T 20 KB x 2; dQ 2 halves x 20 KB; LSE_i, D_i 1.25 KB:
//   231,784 bytes with b11's alignment slack, where a second dQ buffer (40 KB) does not fit.
//   The writer releases each half once the engine has read it (cp.async.bulk.wait_group.read,
//   about 20 KB from shared memory), and takes consumer 1's half of a step before consumer 0's
//   (consumer 0 hands its half over a step later), so a consumer waits for it only if the writer
//   is a whole step behind, as in the deterministic mode. (The first form took them in the order
//   0, 1, and consumer 1 then waited every step for consumer 0's lagging handover: 415 TFLOP/s
//   against b10's 453 at d = 128, N = 8K, not causal, in the same launch at 18:00 UTC.)
//
// Per consumer thread: dK_j, dV_j 64 + 64 fp32, S^T and dP^T 40 + 40 (were 32 + 32), P^T and
// dS^T 20 + 20 bf16 pairs, dQ^T 40: 208 live at the exponentials, of 240. ptxas spills 124
// bytes stored and 140 loaded with dS^T's D_i read element by element as in b11, 36 and 60 with
// the pair of queries a thread holds read as one float2, and none with the row address of the
// dS^T stores computed once rather than per store (both done here, as in b12). At d = 64, b12's step
// of 128 is the better move; b13 refuses it as "not built".
//
// What b11 changed from b10. With the causal mask key block j walks Tr - 2j query blocks (Bc =
// 2 Br): at N = 8K, 128 steps for j = 0 down to 2 for j = 63. b10's grid is (key block, KV
// head), and the hardware hands out thread blocks in the order of their linear index, x
// fastest: head 0's key blocks 0 .. 63, then head 1's, ... The last head's key block 0, the
// longest walk of all, starts when about 31/32 of the work has been handed out and runs on
// alone while the other SMs drain:
//
//     SMs  |=====head 0..30 (long and short walks mixed)=====|==head 31: j = 0 ......|   <- tail
//
// Handed out longest first (the classic list-scheduling rule), the last blocks to start are
// the shortest walks and the SMs finish together. b11 only swaps the grid's two dimensions
// when the mask is on, grid (KV head, key block): block index x is the head, y the key block,
// so every head's key block 0 is handed out first, then every head's key block 1, and so on.
// A greedy simulation of 132 SMs over the 2048 walks of the benchmark's shape (each walk's
// steps plus 3 for its K_j, V_j load and dK, dV stores) gives 1114 step-times in b10's order
// and 1058 in b11's, against 1055 for a perfect split: +5%. Without the mask every walk is
// as long, the order changes nothing but L2 locality (b10's order keeps two heads' Q, dO and
// dQ accumulator in flight at a time), so the grid stays b10's. In the deterministic mode key
// block j still waits only for key block j - 1 of its head, which has been handed out before
// it in both orders: no wait on a block that has not started.
//
// What b10 changed from b9. In b9 both consumers meet on named barrier 1 every step (dQ reads
// both halves of dS^T) and then run the same phases at the same time: both wait for their
// S^T and dP^T, both exponentiate and write dS^T while the tensor cores have little to do,
// both issue dV, dK and dQ at once, both store their dQ half. b10 lets consumer 0 run ahead:
// in step s it multiplies step s - 1's dQ (its dS^T is complete by then: consumer 1 wrote
// its half a while ago), and the last dQ after the loop. The two buffers of b9 are what
// make this possible: step s - 1's dS^T stays in buffer (s - 1) % 2 while step s writes the
// other. Consumer 0 then issues step s + 1's S^T and dP^T while consumer 1 still multiplies
// and stores step s's dQ, and exponentiates while consumer 1 multiplies: their phases
// interleave as in the forward's pingpong (v4), with no turn-taking barrier. Nothing
// else moves: the registers are b9's (the late dQ is computed and stored in the same
// step), the dQ writer, the stage ring and the walk are unchanged.
//
// The meeting becomes four one-way signals on named barriers of 256 threads, one side
// arriving (bar.arrive, no wait) and the other waiting (bar.sync), each with one barrier
// per dS^T buffer so that a signal of step s + 2 can never complete step s's:
//
//     half[w][b]  (ids 1-4)   consumer w has written its half of dS^T into buffer b;
//                             the other consumer waits before its dQ product of that step
//     done[w][b]  (ids 7-10)  consumer w's dQ product has finished reading buffer b;
//                             the other consumer waits before it writes buffer b again
//                             (two steps later), only where such a step exists
//
// (ids 5 and 6 still release the stages, as in b8.) A consumer's own half needs no signal:
// its 128 threads are among the barrier's 256, so every one of them has written its part
// (and fenced it for the async proxy) before the barrier completes.
//
// Consumer 0 has no earlier step in step 0: it multiplies anyway (dS^T buffer 1, not yet
// written), stores the result into its dQ buffer 1 (which the writer has not seen) and hands
// nothing over. With the product or its stores under an `if`, ptxas kept the accumulators
// of both paths: 584 bytes of spills and the loop's wgmma serialised. Unconditional, the
// kernel has b9's registers and no local memory; the extra product is one of the ~65 a
// block computes at N = 8K.
//
// Measured (NVIDIA H200, 2026-12-01, the README's same-run table, 15:32 UTC): 429 TFLOP/s
// causal and 455 not causal at d = 128, N = 8K, against b9's 425 and 450 in the same run
// (+0.9%, +1.1%; +4-8% was predicted). The lockstep was not what limited a step: ncu finds
// the tensor pipe active half the time and a third of the issue slots used, the warps
// waiting on latencies that a larger step (more queries) would amortise (README, next steps).
//
// What b9 changed from b8. The consumers meet twice a step: on named barrier 1 once both
// halves of dS^T are written (dQ reads all 128 keys), and on named barrier 2 once both dQ
// products are done with them (the next step overwrites dS^T). With two buffers (16 KB more:
// 226 KB of 227 at d = 128) step s writes buffer s % 2, and the second meeting is not
// needed: a consumer rewrites buffer b at step s + 2 only after passing barrier 1 of step
// s + 1, which the other consumer reaches only after its dQ product of step s (the one
// reading buffer b) has completed. One meeting a step is left.
//
// What b8 changed from b6 (b8 is a branch: b7 split dQ by keys, b8 keeps b6's dQ). Since b2 a
// stage of the ring is released through an "empty" mbarrier: each consumer warp arrives,
// the producer waits, then its copy engine overwrites the stage. The consumers' last
// reads of a stage are ordinary loads of LSE_i and D_i (the products read it through
// wgmma), and racecheck, which follows __syncthreads() and named barriers, does not take
// the mbarrier's arrive and wait as an order between those loads and the bulk copy that
// follows: it reported 4 hazards on the LSE/D stage in every step from b2 to b6 (and none
// in b1, which releases with __syncthreads()). b8 releases a stage with a named barrier
// per stage (ids 5, 6) of 288 threads: the 256 consumer threads arrive (bar.arrive, no
// wait) once they are done with it, and the producer's warp, all 32 lanes now, waits on it
// (bar.sync) before lane 0 refills the stage, from the third step on. The full side stays
// an mbarrier (the copy engine must complete it), and so do the dQ tiles'.
//
// What b6 changed from b5. The deterministic mode adds into each dQ tile in the order of the
// key blocks, j = 0, 1, 2, ... With the causal mask key block j starts its walk at query
// block i_first(j) = 2j (Bc = 2 Br) and reaches tile i at step i - 2j: block j - 1 gets
// there two steps *later* than block j, which must wait for it. Block j waits for j - 1,
// which waited for j - 2, ...: the waits add up along the key blocks, and the last key
// blocks of a head start adding only after the first ones are nearly done (b1: -53%
// causal). Walking the query blocks from the last one down instead, every key block
// reaches tile i at the same step, Tr - 1 - i, whatever its first block: the wait at each
// tile is only for the adds just before it, and it does not grow with j. (Without the mask
// both orders are the same; the non-deterministic mode keeps the ascending walk, which
// spreads the key blocks' adds over different tiles.) The order of the adds into a tile is
// still j = 0, 1, 2, ..., so the result is the same bits as b5's deterministic mode.
//
// What b5 changed from b4. In b4 one consumer thread per warpgroup issues each step's
// reduce-add, and the whole warpgroup waits for it at the next step: for the copy engine to
// have read the tile (a named barrier before the tile is rewritten) and, in the
// deterministic mode, for the previous key block's add into the same tile and then for its
// own add to complete, a round trip to L2 every step (b1: the deterministic mode cost 53%
// causal, 24% not, at d = 128, N = 8K). b5 hands the tile over instead:
//
//     consumer warpgroup w, step s:  wait dq_empty[w][s % 2] -> write dQ tile (fragment order)
//                                    -> fence, __syncwarp, 4 warps arrive dq_full[w][s % 2]
//     producer warp 1, one thread:   wait dq_full[w][s % 2] -> [deterministic: wait for its turn]
//                                    -> reduce-add -> [deterministic: wait for it, pass the turn]
//                                    -> wait until the engine has read the tile -> arrive dq_empty[w][s % 2]
//
// Two tiles per warpgroup (32 KB more shared memory at d = 128: 210 KB), so the consumers
// wait only if the writer falls two steps behind. The named barriers 3 and 4 of b4 are gone.
// (ptxas: 20 bytes of local memory in the consumers at d = 128, five loads a step; none at
// d = 64.)
//
// What b4 changed from b3. K_j and V_j stay put for the whole walk, so the compiler computes
// their 24 descriptors (8 K-steps of K_j K-major for S^T, 8 of K_j MN-major for dQ, 8 of
// V_j) once, before the loop, and keeps their low words alive across it: with dK_j, dV_j
// (128 fp32) and the step's accumulators that does not fit the consumers' 240 registers,
// and ptxas spills them to local memory (b3 at d = 128: 128 bytes stored, 152 loaded,
// every load inside the loop). b4 derives the descriptors every step from a shared-memory
// base the compiler cannot see through (`smem + fresh_zero()`, roles.cuh): a few integer
// adds per wgmma, and ptxas reports no local memory at all.
//
// What b3 changed from b2. b2 writes a warpgroup's 64 x d/2 fp32 dQ tile to shared memory
// row by row. A store instruction of a warp covers 8 rows x 4 pairs of columns, and rows
// are d/2 x 4 = 256 bytes apart (d = 128): the 8 rows fall on the same banks, an 8-way
// conflict, 32 such stores per thread and step. The tile's layout does not matter to
// anyone but the postprocess, which reads each element once: so b3 keeps the registers'
// order,
//
//     float2 y (= accumulators 2y, 2y + 1) of thread w (0..127) of the warpgroup  at  (y x 128 + w) x 2,
//
// consecutive lanes at consecutive 8 bytes, and the postprocess maps (row, column) to
// that position (dq_accum_fragment_index(), backward_tiles.hpp). The reduce-add adds
// tiles element by element, so any layout that is the same for every key block works.
// (b2's header, what it changed from b1, follows.)
//
// What changes from b1. A third warpgroup joins, and it only moves data, as in the
// forward's v3:
//
//     warpgroup 0 (producer)   one thread: wait empty[s] -> expect_tx -> TMA Q_i, dO_i and
//                              bulk copies of LSE_i, D_i into stage s (K_j, V_j once, first)
//     warpgroup 1 (consumer)   keys  0-63:  wait full[s] -> five wgmma products -> arrive empty[s]
//     warpgroup 2 (consumer)   keys 64-127: the same on its keys
//
// The two __syncthreads() of b1's loop are gone. The stage is released by an "empty"
// mbarrier that the 8 consumer warps arrive on once their wgmma no longer read it, so
// the producer runs up to kStages steps ahead without stopping anyone. The two
// consumers still meet twice per step, on named barriers of their 256 threads only:
// once when both halves of dS^T are in shared memory (dQ reads all 128 keys), and once
// when both dQ products are done with it (the next step overwrites it).
// Registers are re-divided at run time: the producer drops to 24 per thread and the
// consumers rise to 240 (setmaxnreg; 128 x 24 + 256 x 240 = 64,512 of 65,536). Each role
// computes its indices from %tid and %ctaid itself (roles.cuh says why).
//
// What b1 changed from chapter 04's last backward (chapters/04_fa2/backward.cu, fa2_bwd_main):
//
//   * Two warpgroups of 4 warps (256 threads) instead of 8 independent warps: warpgroup
//     w owns keys 64w .. 64w + 63 of the block's Bc = 128, as one m64 wgmma tile.
//   * S^T = K_j Q_i^T and dP^T = V_j dO_i^T: wgmma with both operands in shared memory
//     (K-major, the forward's Q K^T form), where chapter 04 loaded ldmatrix fragments.
//   * dV_j += P^T dO_i and dK_j += dS^T Q_i: wgmma with A = P^T, dS^T straight from the
//     accumulator registers and B = dO_i, Q_i read MN-major (the forward's P V form).
//   * dQ_i = dS K_j: dS^T goes to shared memory (128-byte swizzled, as TMA would write
//     it) and wgmma reads it transposed, with K_j transposed too (WgmmaSSMN,
//     common/cuda/hopper/wgmma.cuh); each warpgroup computes half of dQ_i's columns.
//   * dQ leaves through shared memory and one cp.reduce.async.bulk .add.f32 per
//     warpgroup and step (common/cuda/hopper/bulk_copy.cuh) into an fp32 accumulator
//     laid out by tile halves (backward_tiles.hpp), instead of one fp32 atomic per
//     two elements from every thread.
//   * Q_i, dO_i arrive by TMA and LSE_i, D_i by bulk copies (padded by the preprocess,
//     so a copy never runs past the tensor), in a 2-stage ring: step s + 2 is in
//     flight while step s computes; K_j, V_j arrive once, by TMA.
//   * Deterministic mode is a flag of the same kernel: before its add into dQ_i, key
//     block j waits until blocks 0 .. j-1 have added theirs (a counter per tile half,
//     acquire/release); chapter 04 recomputed dQ in a separate kernel instead.
//
// Per thread block (key block j of KV head hk; d = 128, bf16):
//
//     shared memory                                 registers (per consumer thread)
//     K_j, V_j     128 x d   32 KB each, once       dK_j, dV_j  64 keys x d / wg: 64 + 64 fp32
//     Q_i, dO_i     64 x d   16 KB each, 2 stages   S^T, dP^T   64 keys x 64 queries: 32 + 32
//     LSE_i, D_i    64 fp32              2 stages   P^T, dS^T   the same as bf16 pairs: 16 + 16
//     dS^T    128 x 64 bf16  16 KB                  dQ_i half   64 queries x d/2: 32
//     dQ_i    64 x d fp32    32 KB (2 halves)
//
// Operands (A x B, "smem" = a descriptor, "regs" = the accumulator as A fragments):
//
//     S^T  = K_j   Q_i^T    A smem K-major, B smem K-major        m64 n64  k16 x d/16
//     dP^T = V_j   dO_i^T   A smem K-major, B smem K-major        m64 n64  k16 x d/16
//     dV  += P^T   dO_i     A regs,         B smem MN-major       m64 n(d) k16 x 4
//     dK  += dS^T  Q_i      A regs,         B smem MN-major       m64 n(d) k16 x 4
//     dQ   = dS    K_j      A smem MN-major (dS^T), B smem MN-major m64 n(d/2) k16 x 8
#include "common/cuda/check.cuh"
#include "common/errors.hpp"
#include "common/cuda/fast_math.cuh"
#include "common/cuda/hopper/bulk_copy.cuh"
#include "common/cuda/hopper/mbarrier.cuh"
#include "common/cuda/hopper/named_barrier.cuh"
#include "common/cuda/hopper/roles.cuh"
#include "common/cuda/hopper/setmaxnreg.cuh"
#include "common/cuda/hopper/tma.cuh"
#include "common/cuda/hopper/wgmma.cuh"
#include "backward_launch.cuh"
#include "backward_tiles.hpp"
#include "fa3_common.cuh"

namespace attn::ch05::b15 {
namespace {

using namespace attn::hopper;
using attn::cuda::exp2_approx;

constexpr int Br = 80;         // queries per step, and rows of the walk's and the accumulator's blocks
constexpr int Bc = kBwdBc;     // keys per thread block
constexpr int kStages = 2;     // Q_i, dO_i, LSE_i, D_i ring depth
constexpr int kThreads = 384;  // a producer and two consumer warpgroups

/// Shared memory, every tile 1024-aligned, tiles as TMA boxes of 128-byte rows.
template <class T, int D>
struct BwdPlan {
  static constexpr int kRowBytes = 128, kBoxCols = 64, kBoxes = D / kBoxCols;
  static constexpr int kKVBytes = Bc * D * 2;  ///< K_j or V_j
  static constexpr int kQBytes = Br * D * 2;   ///< one stage of Q_i or dO_i
  static constexpr int kK = 0;
  static constexpr int kV = kK + kKVBytes;
  static constexpr int kQ = kV + kKVBytes;
  static constexpr int kdO = kQ + kStages * kQBytes;
  static constexpr int kdS = kdO + kStages * kQBytes;  ///< dS^T [buffer 2][slab 5]: Bc rows of 16 bf16 (32 B)
  static constexpr int kdSSlabBytes = Bc * 32;         ///< one slab of 16 queries, 32-byte swizzle
  static constexpr int kdSBytes = Bc * Br * 2;
  static constexpr int kdQ = kdS + 2 * kdSBytes;       ///< [half 2] of Br x D/2 fp32 (one buffer)
  static constexpr int kdQHalfBytes = Br * (D / 2) * 4;
  static constexpr int kL = kdQ + 2 * kdQHalfBytes;    ///< LSE_i (base 2) per stage
  static constexpr int kD = kL + kStages * Br * 4;     ///< D_i per stage
  static constexpr int kBars = kD + kStages * Br * 4;  ///< kv, full[kStages], empty[kStages], dq_full[4], dq_empty[4]
  static constexpr int kStepBytes = 2 * kQBytes + 2 * Br * 4;
  static constexpr int kBytes = kBars + 8 * (1 + 2 * kStages + 8) + 1024;
  static_assert(Br % 16 == 0 && kdSBytes == (Br / 16) * kdSSlabBytes, "dS^T rows are slabs of 16 queries");
  static_assert(kBytes <= 232448, "more shared memory than a block may have");
};

/// The walk of one thread block, as every role computes it for itself after the split.
struct Walk {
  int j, bk, b, hk, group, col0, i_first, steps_per_head, n_steps;
  __device__ __forceinline__ explicit Walk(const Fa3BwdParams& p) {
    j = p.causal ? fresh_block_index_y() : fresh_block_index_x();  // causal: longest walks first
    bk = p.causal ? fresh_block_index_x() : fresh_block_index_y();
    b = bk / p.kv_heads;
    hk = bk % p.kv_heads;
    group = p.heads / p.kv_heads;
    col0 = j * Bc;
    i_first = first_query_block(col0, Br, p.nq, p.nk, p.causal);
    steps_per_head = p.n_qblocks - i_first;
    n_steps = steps_per_head * group;
  }
  /// The query block of step s: ascending from i_first, or (deterministic) descending from the last.
  __device__ __forceinline__ int block_of(int s, const Fa3BwdParams& p) const {
    const int k = s % steps_per_head;
    return p.deterministic ? p.n_qblocks - 1 - k : i_first + k;
  }
  __device__ __forceinline__ int head_of(int s, const Fa3BwdParams& p) const {
    return b * p.heads + hk * group + s / steps_per_head;
  }
};

/// The dQ tiles' barriers after the ring's: dq_full[2 w + b], dq_empty[2 w + b] for warpgroup w, buffer b.
template <class Plan>
__device__ __forceinline__ uint64_t* dq_bars(unsigned char* smem) {
  return reinterpret_cast<uint64_t*>(smem + Plan::kBars) + 1 + 2 * kStages;
}

// ---------------------------------------------------------------- dQ writer (warp 1, one thread)
// Step s's two tile halves, as the consumers hand them over, into dQ's accumulator: consumer
// 1's first, since consumer 0 hands step s over a step later (b10's offset). With one buffer a
// consumer, taking consumer 0's half first would hold consumer 1's release back until consumer 0
// is done with step s + 1, and consumer 1 would wait for it at every step.
template <class T, int D>
__device__ __forceinline__ void dq_writer(const Fa3BwdParams& p, unsigned char* smem) {
  using Plan = BwdPlan<T, D>;
  uint64_t* dq_full = dq_bars<Plan>(smem);
  uint64_t* dq_empty = dq_full + 4;
  const Walk w(p);
  for (int s = 0; s < w.n_steps; ++s) {
    const int bh = w.head_of(s, p), i = w.block_of(s, p);
    for (int wg = 1; wg >= 0; --wg) {
      mbarrier_wait(&dq_full[2 * wg], s & 1);  // one buffer a consumer: its phase is the step's
      const float* sdq = reinterpret_cast<const float*>(smem + Plan::kdQ + wg * Plan::kdQHalfBytes);
      float* dst = p.dq_accum + dq_accum_index(bh, i * Br, wg * (D / 2), p.n_qblocks, Br, D);
      int* order = p.dq_order + (size_t(bh) * p.n_qblocks + i) * 2 + wg;
      if (p.deterministic) ordered_wait(order, w.j);
      bulk_reduce_add_f32(dst, sdq, Plan::kdQHalfBytes);
      bulk_commit();
      if (p.deterministic) {
        bulk_wait<0>();
        ordered_release(order);
      }
      bulk_wait_read<0>();  // this half has been read by the engine: consumer wg may write the next
      mbarrier_arrive(&dq_empty[2 * wg]);
    }
  }
  bulk_wait<0>();
}

// ---------------------------------------------------------------- producer warpgroup (warps 0-3)
// Lane 0 of warp 0 issues every copy: K_j, V_j once; step s's Q_i, dO_i, LSE_i, D_i into stage
// s % 2 once the consumers have released it (the whole warp waits on the named barrier).
// One thread of warp 1 is the dQ writer.
template <class T, int D>
__device__ __forceinline__ void producer(const CUtensorMap& tm_q, const CUtensorMap& tm_k, const CUtensorMap& tm_v,
                                         const CUtensorMap& tm_do, const Fa3BwdParams& p, unsigned char* smem) {
  using Plan = BwdPlan<T, D>;
  if (fresh_thread_index() == 32) dq_writer<T, D>(p, smem);
  if (fresh_thread_index() >= 32) return;
  const bool leader = fresh_thread_index() == 0;
  uint64_t* bar_kv = reinterpret_cast<uint64_t*>(smem + Plan::kBars);
  uint64_t* full = bar_kv + 1;
  const Walk w(p);
  if (w.n_steps == 0) return;
  if (leader) {
    mbarrier_arrive_expect_tx(bar_kv, 2 * Plan::kKVBytes);
    for (int x = 0; x < Plan::kBoxes; ++x) {
      tma_load_3d(smem + Plan::kK + x * Bc * Plan::kRowBytes, &tm_k, bar_kv, x * Plan::kBoxCols, w.col0, w.bk);
      tma_load_3d(smem + Plan::kV + x * Bc * Plan::kRowBytes, &tm_v, bar_kv, x * Plan::kBoxCols, w.col0, w.bk);
    }
  }
  RingState<kStages> ring;
  for (int s = 0; s < w.n_steps; ++s, ring.advance()) {
    const int st = ring.stage, bh = w.head_of(s, p), i = w.block_of(s, p);
    if (s >= kStages) named_barrier_sync(5 + st, 288);  // the consumers are done with step s - 2
    if (!leader) continue;
    mbarrier_arrive_expect_tx(&full[st], Plan::kStepBytes);
    for (int x = 0; x < Plan::kBoxes; ++x) {
      tma_load_3d(smem + Plan::kQ + st * Plan::kQBytes + x * Br * Plan::kRowBytes, &tm_q, &full[st],
                  x * Plan::kBoxCols, i * Br, bh);
      tma_load_3d(smem + Plan::kdO + st * Plan::kQBytes + x * Br * Plan::kRowBytes, &tm_do, &full[st],
                  x * Plan::kBoxCols, i * Br, bh);
    }
    const size_t row = size_t(bh) * p.n_qblocks * Br + size_t(i) * Br;
    bulk_load(smem + Plan::kL + st * Br * 4, p.lse2 + row, Br * 4, &full[st]);
    bulk_load(smem + Plan::kD + st * Br * 4, p.delta + row, Br * 4, &full[st]);
  }
}

// ---------------------------------------------------------------- consumer warpgroups (warps 4-11)
template <class T, int D>
__device__ __forceinline__ void consumer(const Fa3BwdParams& p, unsigned char* smem) {
  using Plan = BwdPlan<T, D>;
  uint64_t* bar_kv = reinterpret_cast<uint64_t*>(smem + Plan::kBars);
  uint64_t* full = bar_kv + 1;
  uint64_t* dq_full = dq_bars<Plan>(smem);
  uint64_t* dq_empty = dq_full + 4;
  const float* sL = reinterpret_cast<const float*>(smem + Plan::kL);
  const float* sD = reinterpret_cast<const float*>(smem + Plan::kD);
  // wg: 0 or 1 for warpgroups 1 and 2 (keys 0-63, 64-127).
  const int tid = fresh_thread_index() - 128, wg = tid / 128, wtid = tid % 128, warp = wtid / 32, lane = tid % 32;
  const int t = lane % 4;
  const int lag = wg == 0 ? 1 : 0;  // consumer 0 multiplies step s - 1's dQ in step s
  const Walk w(p);
  const int col0 = w.col0, n_steps = w.n_steps;
  const int diag = causal_diag(p.nq, p.nk);

  // Descriptors. K-major: the k-th K-step (16 elements = 32 bytes of every row) of a tile
  // of `rows` rows, starting at row `row0` of the tile.
  unsigned char* tiles = smem;  // re-read every step (below), so no descriptor is kept across steps
  auto kmajor = [&](int tile, int rows, int row0, int k) {
    const int byte = 32 * k;
    return desc_k_major(tiles + tile + (byte / Plan::kRowBytes) * rows * Plan::kRowBytes + row0 * Plan::kRowBytes +
                            byte % Plan::kRowBytes,
                        Plan::kRowBytes);
  };
  // MN-major: K-step kk is rows 16kk .. 16kk + 15 of the tile; columns from `col` on.
  auto mnmajor = [&](int tile, int rows, int col, int kk) {
    const int byte = 2 * col;
    return desc_mn_major(tiles + tile + (byte / Plan::kRowBytes) * rows * Plan::kRowBytes + byte % Plan::kRowBytes +
                             kk * 16 * Plan::kRowBytes,
                         rows * Plan::kRowBytes);
  };

  // dS^T as dQ^T's B operand: MN-major (queries contiguous) in the 32-byte swizzle, slabs of 16
  // queries kdSSlabBytes apart (LBO), 8-key groups 256 bytes apart (SBO); K-step kk is keys
  // 16kk .. 16kk + 15, 512 bytes into every slab. make_desc() writes the 128-byte mode; the
  // descriptor's bits 62-63 are set to 3 (32 bytes) here.
  auto ds_mn32 = [&](int tile, int kk) {
    const uint64_t d = make_desc(tiles + tile + kk * 16 * 32, Plan::kdSSlabBytes, 8 * 32, Plan::kRowBytes);
    return (d & ~(uint64_t(3) << 62)) | (uint64_t(3) << 62);
  };

  // This thread's keys (rows of S^T, dK, dV) within the block, and its queries' columns.
  const int key_local = 64 * wg + 16 * warp + lane / 4;  // and key_local + 8

  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int x = 0; x < D / 2; ++x) dk[x] = dv[x] = 0.f;

  // Step sd's dQ half: wait for the other consumer's half of its dS^T, then multiply (issued,
  // not waited for). sd = -1 (consumer 0 in step 0, which has no earlier step) multiplies
  // buffer 1, not yet written, and the handover below drops the result: with the product
  // or its stores under a branch, ptxas spilled 584 bytes and serialised the loop's wgmma.
  auto dq_product = [&](int sd, float (&dq)[Br / 2]) {
    const int src_ds = Plan::kdS + ((sd + 2) % 2) * Plan::kdSBytes;
    if (sd >= 0) named_barrier_sync(1 + 2 * (1 - wg) + sd % 2, 256);  // half[other][sd % 2]
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk)
      WgmmaSSMN<T, Br>::mma(dq, mnmajor(Plan::kK, Bc, wg * (D / 2), kk), ds_mn32(src_ds, kk), kk > 0);
    wgmma_commit();
  };
  // Once the product is complete: tell the other consumer (if it writes buffer sd % 2 again),
  // then dQ_i's half to shared memory in fragment order, handed to the dQ writer (warp 1).
  // sd = -1: stored into dQ buffer 1, which the writer has not seen yet, and not handed over.
  auto dq_handover = [&](int sd, const float (&dq)[Br / 2]) {
    if (sd >= 0 && sd + 2 < n_steps) named_barrier_arrive(7 + 2 * wg + sd % 2, 256);  // done[wg][sd % 2]
    float* sdq = reinterpret_cast<float*>(smem + Plan::kdQ + wg * Plan::kdQHalfBytes);
    if (sd >= 1) mbarrier_wait(&dq_empty[2 * wg], (sd - 1) & 1);  // the writer has read step sd - 1's half
#pragma unroll
    for (int y = 0; y < Br / 4; ++y)
      *reinterpret_cast<float2*>(sdq + (y * 128 + wtid) * 2) = make_float2(dq[2 * y], dq[2 * y + 1]);
    fence_proxy_async_shared();  // visible to the copy engine
    __syncwarp();
    if (lane == 0 && sd >= 0) mbarrier_arrive(&dq_full[2 * wg]);
  };

  // S^T = K_w Q_i^T of the step whose Q_i is in tile qt (issued, not waited for).
  float sT[Br / 2];
  auto s_product = [&](int qt) {
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < D / 16; ++k) WgmmaSS<T, Br>::mma(sT, kmajor(Plan::kK, Bc, 64 * wg, k), kmajor(qt, Br, 0, k), k > 0);
    wgmma_commit();
  };

  if (n_steps > 0) {
    mbarrier_wait(bar_kv, 0);
    mbarrier_wait(&full[0], 0);
  }
  tiles = smem + fresh_zero();
  s_product(Plan::kQ);  // step 0's S^T (with no step at all, a product nobody reads)
  RingState<kStages> ring;
  for (int s = 0; s < n_steps; ++s, ring.advance()) {
    const int st = ring.stage, bh = w.head_of(s, p), i = w.block_of(s, p), row0 = i * Br;
    const int qt = Plan::kQ + st * Plan::kQBytes, dot = Plan::kdO + st * Plan::kQBytes;

    // S^T (issued at the end of step s - 1) complete; dP^T = V_w dO_i^T (64 keys x 80 queries per
    // warpgroup) issued now, under the exponentials. (Waiting for S^T with dP^T issued, as b13
    // does, ptxas cannot follow across the loop's back edge and serialises every wgmma.)
    wgmma_wait<0>();
    fence_operand(sT);
    float dpT[Br / 2];
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < D / 16; ++k)
      WgmmaSS<T, Br>::mma(dpT, kmajor(Plan::kV, Bc, 64 * wg, k), kmajor(dot, Br, 0, k), k > 0);
    wgmma_commit();

    // P^T = 2^(S^T tau log2 e - LSE_i log2 e). Element 4c + e: key key_local + 8 (e / 2),
    // query 8c + 2t + e % 2 of Q_i.
    const float* lse2 = sL + st * Br;
    const float* dlt = sD + st * Br;
    const bool masked = bwd_tile_masked(row0, col0, Br, Bc, p.nq, p.nk, p.causal);
#pragma unroll
    for (int x = 0; x < Br / 2; ++x) {
      const int q = 8 * (x / 4) + 2 * t + (x & 1);
      float pv = exp2_approx(fmaf(sT[x], p.scale_log2, -lse2[q]));
      if (masked) {
        const int key = col0 + key_local + 8 * ((x >> 1) & 1);
        if (key >= p.nk || (p.causal && key > row0 + q + diag)) pv = 0.f;
      }
      sT[x] = pv;
    }
    // dS^T = P^T o (dP^T - D_i)
    wgmma_wait<0>();
    fence_operand(dpT);
#pragma unroll
    for (int c = 0; c < Br / 8; ++c) {  // D_i of queries 8c + 2t, 8c + 2t + 1 as one float2 (fewer live registers)
      const float2 dd = *reinterpret_cast<const float2*>(dlt + 8 * c + 2 * t);
      dpT[4 * c] = sT[4 * c] * (dpT[4 * c] - dd.x);
      dpT[4 * c + 1] = sT[4 * c + 1] * (dpT[4 * c + 1] - dd.y);
      dpT[4 * c + 2] = sT[4 * c + 2] * (dpT[4 * c + 2] - dd.x);
      dpT[4 * c + 3] = sT[4 * c + 3] * (dpT[4 * c + 3] - dd.y);
    }
    uint32_t pT[Br / 4], dsT[Br / 4];
    convert_p<T>(sT, pT);
    convert_p<T>(dpT, dsT);

    // dS^T to shared memory for dQ, in the 32-byte swizzle: pair y = 2c + h is key
    // key_local + 8h, queries 8c + 2t, 8c + 2t + 1 (16-byte chunk c % 2 of the row in slab c / 2).
    const int dst_ds = Plan::kdS + (s % 2) * Plan::kdSBytes;  // this step's buffer
    if (s >= 2) named_barrier_sync(7 + 2 * (1 - wg) + s % 2, 256);  // done[other][s % 2]: its dQ of step s - 2 read it
    {
      unsigned char* rowp = smem + dst_ds + key_local * 32 + 4 * t;  // key_local + 8h: 256 h bytes further
      const int k2 = (key_local >> 2) & 1;                            // the swizzle bit, the same for + 8h
#pragma unroll
      for (int y = 0; y < Br / 4; ++y) {
        const int h = y & 1, c = y / 2;
        *reinterpret_cast<uint32_t*>(rowp + (c / 2) * Plan::kdSSlabBytes + 8 * h * 32 + (((c % 2) ^ k2) * 16)) = dsT[y];
      }
    }
    fence_proxy_async_shared();  // visible to wgmma (the async proxy)
    named_barrier_arrive(1 + 2 * wg + s % 2, 256);  // half[wg][s % 2]: this consumer's half is written

    // dV_w += P^T dO_i and dK_w += dS^T Q_i: K = the 64 queries.
    fence_operand(dv);
    fence_operand(dk);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Br / 16; ++kk) {
      const uint32_t a[4] = {pT[4 * kk], pT[4 * kk + 1], pT[4 * kk + 2], pT[4 * kk + 3]};
      WgmmaRS<T, D>::mma(dv, a, mnmajor(dot, Br, 0, kk), 1);
    }
#pragma unroll
    for (int kk = 0; kk < Br / 16; ++kk) {
      const uint32_t a[4] = {dsT[4 * kk], dsT[4 * kk + 1], dsT[4 * kk + 2], dsT[4 * kk + 3]};
      WgmmaRS<T, D>::mma(dk, a, mnmajor(qt, Br, 0, kk), 1);
    }
    wgmma_commit();

    // dQ_i^T[half wg] = K_j^T[half wg] dS^T of step sd = s - lag: K = the 128 keys.
    const int sd = s - lag;
    float dq[Br / 2];
    dq_product(sd, dq);
    wgmma_wait<1>();  // dV and dK done, dQ still running
    fence_operand(dv);
    fence_operand(dk);
    fence_operand(pT);
    fence_operand(dsT);
    named_barrier_arrive(5 + st, 288);  // Q_i, dO_i, LSE_i, D_i no longer read by this thread

    // The next step's S^T, under this step's dQ and its trip to shared memory. The last step
    // issues one more from its own stage, which nobody refills.
    RingState<kStages> next = ring;
    next.advance();
    const bool more = s + 1 < n_steps;
    if (more) mbarrier_wait(&full[next.stage], next.phase);
    tiles = smem + fresh_zero();
    s_product(more ? Plan::kQ + next.stage * Plan::kQBytes : qt);
    wgmma_wait<1>();  // dQ done, the next S^T still running
    fence_operand(dq);
    dq_handover(sd, dq);
  }
  wgmma_wait<0>();  // the last S^T, never read
  fence_operand(sT);
  if (lag && n_steps > 0) {  // consumer 0: the last step's dQ
    float dq[Br / 2];
    dq_product(n_steps - 1, dq);
    wgmma_wait<0>();
    fence_operand(dq);
    dq_handover(n_steps - 1, dq);
  }

  // dK_j = tau sum dS^T Q and dV_j = sum P^T dO over every query head of the group.
  T* dK = static_cast<T*>(p.dk) + size_t(w.bk) * p.nk * D;
  T* dV = static_cast<T*>(p.dv) + size_t(w.bk) * p.nk * D;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int key = col0 + key_local + 8 * h;
    if (key >= p.nk) continue;
#pragma unroll
    for (int c = 0; c < D / 8; ++c) {
      *reinterpret_cast<uint32_t*>(dK + size_t(key) * D + 8 * c + 2 * t) =
          pack2<T>(p.scale * dk[4 * c + 2 * h], p.scale * dk[4 * c + 2 * h + 1]);
      *reinterpret_cast<uint32_t*>(dV + size_t(key) * D + 8 * c + 2 * t) = pack2<T>(dv[4 * c + 2 * h], dv[4 * c + 2 * h + 1]);
    }
  }
}

template <class T, int D>
__global__ void __launch_bounds__(kThreads, 1)
    kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
           const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
           const Fa3BwdParams p) {
  using Plan = BwdPlan<T, D>;
  extern __shared__ unsigned char smem_raw[];
  if (threadIdx.x == 0) {
    uint64_t* bar_kv = reinterpret_cast<uint64_t*>(align_1024(smem_raw) + Plan::kBars);
    mbarrier_init(bar_kv, 1);
    for (int s = 0; s < kStages; ++s) mbarrier_init(&bar_kv[1 + s], 1);  // full[s] (the empty[s] slots: unused)
    for (int x = 0; x < 4; ++x) {
      mbarrier_init(&bar_kv[1 + 2 * kStages + x], 4);      // dq_full: the 4 warps of a consumer
      mbarrier_init(&bar_kv[1 + 2 * kStages + 4 + x], 1);  // dq_empty: the writer
    }
    mbarrier_init_fence();
  }
  __syncthreads();
  // The role split: every value below is computed inside its role.
  if (threadIdx.x < 128) {
    setmaxnreg_dec<24>();
    producer<T, D>(tm_q, tm_k, tm_v, tm_do, p, fresh_smem(smem_raw));
  } else {
    setmaxnreg_inc<240>();
    consumer<T, D>(p, fresh_smem(smem_raw));
  }
}

template <class T, int D>
PreparedStep prepare_d(const BwdStepArgs& a) {
  using Plan = BwdPlan<T, D>;
  const Problem& pr = a.problem;
  const CUtensorMapDataType ty = tma_type<T>();
  const uint64_t bhq = uint64_t(pr.batch) * pr.heads, bhk = uint64_t(pr.batch) * pr.kv_heads;
  const CUtensorMap tq = make_tensor_map_3d(a.q, ty, 2, D, pr.nq, bhq, Plan::kBoxCols, Br);
  const CUtensorMap tdo = make_tensor_map_3d(a.dout, ty, 2, D, pr.nq, bhq, Plan::kBoxCols, Br);
  const CUtensorMap tk = make_tensor_map_3d(a.k, ty, 2, D, pr.nk, bhk, Plan::kBoxCols, Bc);
  const CUtensorMap tv = make_tensor_map_3d(a.v, ty, 2, D, pr.nk, bhk, Plan::kBoxCols, Bc);
  CUDA_CHECK(cudaFuncSetAttribute(kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, Plan::kBytes));
  const unsigned n_kblocks = unsigned(ceil_div(pr.nk, Bc));
  const dim3 grid = pr.causal ? dim3(unsigned(bhk), n_kblocks) : dim3(n_kblocks, unsigned(bhk));  // x fastest
  const Fa3BwdParams params = a.params;
  PreparedStep s;
  s.grid = int(grid.x * grid.y);
  s.smem_bytes = Plan::kBytes;
  s.launch = [=] {
    kernel<T, D><<<grid, kThreads, Plan::kBytes>>>(tq, tk, tv, tdo, params);
    CUDA_CHECK_LAUNCH("backward b15");
  };
  return s;
}

template <class T>
PreparedStep prepare_t(const BwdStepArgs& a) {
  switch (a.problem.d) {
    case 128: return prepare_d<T, 128>(a);
  }
  throw UsageError("backward b15: head dim " + std::to_string(a.problem.d) + " not built (128; at 64 it is b12)");
}

}  // namespace

PreparedStep prepare(const BwdStepArgs& a) {
  return a.problem.dtype == DType::f16 ? prepare_t<__half>(a) : prepare_t<__nv_bfloat16>(a);
}

}  // namespace attn::ch05::b15
