// Chapter 07, decode step v3: the merge done by the last split to finish, inside the split
// kernel (the chapter's README, section 3).
//
// What changes from v2, every change: DecodeParams' arrival counters; after the partial state
// is stored, the fence, the ticket and the early return of every block but the last; the last
// block's merge of the splits (merge_states(), which replaces the kernel merge_splits()); and
// the launcher runs one kernel.
//
// Why: v2's merge kernel is pure latency for one long sequence. It starts only when the last
// split has finished, and its one warp per (b, h) asks for state s + 1 only after folding
// state s: S round trips to L2 where one would do. In v3 each block stores its (m, l, O),
// fences the stores, and takes a ticket from one arrival counter per (sequence, KV head
// group); the block that draws the last ticket merges the S states with all 128 threads (the
// splits' (m, l) staged in shared memory, sixteen O slices in flight per thread) and resets
// the counter for the next step.
//
//     b = 0   | split 0 | split 1 | split 2 | split 3* |   * = the last to arrive: merges 0..3, writes O, LSE
//     b = 1   | split 0*| split 1 | (empty) | (empty)  |   (any split may be the last)
//
// What it buys: one kernel launch and a parallel merge (recorded H200 run, B = 1, L = 32K,
// GQA 32/8: 3236 GB/s against v2's 3054). The bytes are v2's.

#include "common/cuda/check.cuh"
#include "decode_steps.cuh"

namespace attn::ch07::gpu::v3 {

/// The last block of a (b, KV head group) merges the S split states of its `rows`
/// heads. The states were written by other blocks: read through L2 (__ldcg), not L1.
/// First every (row, split) m and l goes to shared memory, all loads in flight at once;
/// then thread task (row i, dims c4 .. c4 + 3) folds the splits with merge(), sixteen
/// O slices loaded before they are folded: two round trips to L2 for 32 splits, where
/// v2's merge kernel waits for one per split.
template <int D>
__device__ __forceinline__ void merge_states(const DecodeParams& p, int b, int h0, int rows, float* sm,
                                             int sm_floats) {
  constexpr int kBatch = 16;
  const std::size_t row0 = std::size_t(b) * p.heads + h0;
  const bool staged = 2 * rows * p.splits <= sm_floats;  // always, but for thousands of splits
  if (staged) {
    for (int t = threadIdx.x; t < rows * p.splits; t += Geo::kThreads) {
      sm[2 * t] = __ldcg(p.part_m + row0 * p.splits + t);  // rows are consecutive: (row0 + i) * S + s
      sm[2 * t + 1] = __ldcg(p.part_l + row0 * p.splits + t);
    }
    __syncthreads();
  }
  for (int task = threadIdx.x; task < rows * (D / 4); task += Geo::kThreads) {
    const int i = task / (D / 4), c4 = task % (D / 4) * 4;
    const std::size_t row = row0 + i;
    auto acc = AttnState<4, float, Base2>::identity();
    for (int s0 = 0; s0 < p.splits; s0 += kBatch) {
      AttnState<4, float, Base2> part[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        part[j] = AttnState<4, float, Base2>::identity();
        if (s0 + j < p.splits) {
          const std::size_t at = row * p.splits + s0 + j;
          const int t = i * p.splits + s0 + j;
          part[j].s = staged ? SoftmaxState<float, Base2>{sm[2 * t], sm[2 * t + 1]}
                             : SoftmaxState<float, Base2>{__ldcg(p.part_m + at), __ldcg(p.part_l + at)};
          const float4 v = __ldcg(reinterpret_cast<const float4*>(p.part_o + at * D + c4));
          part[j].o[0] = v.x, part[j].o[1] = v.y, part[j].o[2] = v.z, part[j].o[3] = v.w;
        }
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) acc = merge(acc, part[j]);
    }
    uint2 out;
    out.x = cuda::pack2<bf16>(acc.out(0), acc.out(1));
    out.y = cuda::pack2<bf16>(acc.out(2), acc.out(3));
    *reinterpret_cast<uint2*>(p.o + row * D + c4) = out;
    if (c4 == 0) p.lse[row] = acc.s.lse();
  }
}

template <int D, class Kv>
__global__ void __launch_bounds__(Geo::kThreads) decode(DecodeParams p, Kv kv) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int b = blockIdx.z, hk = blockIdx.y / p.chunks, chunk = blockIdx.y % p.chunks, split = blockIdx.x;
  const int h0 = hk * p.group + chunk * Geo::kRows;  // the block's first query head
  const int rows = min(Geo::kRows, p.group - chunk * Geo::kRows);
  const int warp = threadIdx.x / 32;
  // The block's keys: split `split` of the sequence, a whole number of tiles (keys_per_split()).
  const int len = p.lens[b];
  const int per = cuda::ceil_div(cuda::ceil_div(len, p.splits), Geo::kBc) * Geo::kBc;
  const int t_begin = min(len, split * per), t_end = min(len, t_begin + per);

  const float c = p.scale * float(kLog2e);  // the softmax scale in base 2
  WarpDecodeFor<D, Kv> wd;  // bf16 MMAs, or f16 ones over 8-bit codes
  wd.init(p.q + (std::size_t(b) * p.heads + h0) * D, rows);
  const uint32_t s0 = cuda::smem_u32(smem);
  auto stage_k = [&](int st) { return s0 + uint32_t(st) * kStageBytes<D, Kv>; };
  auto stage_v = [&](int st) { return stage_k(st) + kCodeTileBytes<D, Kv>; };
  const int n_tiles = cuda::ceil_div(t_end - t_begin, Geo::kBc);

  // Fill the pipeline: kStages - 1 tiles in flight before the first is used.
  for (int st = 0; st < kStagesFor<Kv> - 1; ++st) {
    if (st < n_tiles) load_tile<D>(stage_k(st), stage_v(st), kv, b, hk, t_begin + st * Geo::kBc, t_end);
    cuda::cp_async_commit();
  }
  for (int it = 0; it < n_tiles; ++it) {
    cuda::cp_async_wait<kStagesFor<Kv> - 2>();  // tile `it` has arrived for this thread...
    __syncthreads();                    // ...for all threads, and every warp is done with tile it - 1
    const int next = it + kStagesFor<Kv> - 1;  // refill the stage that tile it - 1 used
    if (next < n_tiles)
      load_tile<D>(stage_k(next % kStagesFor<Kv>), stage_v(next % kStagesFor<Kv>), kv, b, hk, t_begin + next * Geo::kBc,
                   t_end);
    cuda::cp_async_commit();
    const int t0 = t_begin + it * Geo::kBc;
    const int valid = min(Geo::kWarpKeys, t_end - t0 - warp * Geo::kWarpKeys);  // this warp's keys in the tile
    // The warp's rows of the stage (8-bit K/V: dequantised by the warp as it needs them).
    const auto rows = warp_rows<D>(kv, stage_k(it % kStagesFor<Kv>), stage_v(it % kStagesFor<Kv>), warp, smem, s0);
    if (valid > 0) wd.tile(rows, warp * Geo::kWarpKeys, valid, c);
  }
  cuda::cp_async_wait<0>();
  __syncthreads();  // every stage is drained: reuse the memory for the merge

  const MergeSmem sm(smem);
  wd.store(sm.ms, sm.ls, sm.os, c);
  __syncthreads();
  for (int task = threadIdx.x; task < rows * (D / 4); task += Geo::kThreads) {
    const int i = task / (D / 4), c4 = task % (D / 4) * 4;
    const AttnState<4, float, Base2> acc = merge_warps<D>(sm.ms, sm.ls, sm.os, i, c4);
    // The block saw one split: store its unnormalised (m, l, O) for the merge kernel.
    const std::size_t at = (std::size_t(b) * p.heads + h0 + i) * p.splits + split;
    *reinterpret_cast<float4*>(p.part_o + at * D + c4) = make_float4(acc.o[0], acc.o[1], acc.o[2], acc.o[3]);
    if (c4 == 0) {
      p.part_m[at] = acc.s.m;
      p.part_l[at] = acc.s.l;
    }
  }
  // Arrive: the stores above are made visible to every block first, then one ticket.
  __threadfence();
  __syncthreads();
  __shared__ int ticket;
  int* counter = p.arrivals + std::size_t(b) * gridDim.y + blockIdx.y;
  if (threadIdx.x == 0) ticket = atomicAdd(counter, 1);
  __syncthreads();
  if (ticket != p.splits - 1) return;  // another split will merge
  __threadfence();                     // the last: every other split's state is visible
  merge_states<D>(p, b, h0, rows, reinterpret_cast<float*>(smem), int(decode_smem_bytes(D, Kv::kDtype) / 4));
  if (threadIdx.x == 0) *counter = 0;  // ready for the next step
}

template <int D, class Kv>
void launch(const DecodeParams& p, const Kv& kv, int batch, int kv_heads) {
  const int smem = int(decode_smem_bytes(D, Kv::kDtype));
  static const bool configured = [&] {  // more than 48 KB of shared memory needs an opt-in
    CUDA_CHECK(cudaFuncSetAttribute(decode<D, Kv>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return true;
  }();
  (void)configured;
  decode<D, Kv><<<dim3(p.splits, kv_heads * p.chunks, batch), Geo::kThreads, smem>>>(p, kv);
  CUDA_CHECK_LAUNCH("v3::decode");
}

template void launch<64, PagedKv>(const DecodeParams&, const PagedKv&, int, int);
template void launch<128, PagedKv>(const DecodeParams&, const PagedKv&, int, int);
template void launch<64, ContiguousKv>(const DecodeParams&, const ContiguousKv&, int, int);
template void launch<128, ContiguousKv>(const DecodeParams&, const ContiguousKv&, int, int);
template void launch<128, PagedKv8<KvDtype::fp8>>(const DecodeParams&, const PagedKv8<KvDtype::fp8>&, int, int);
template void launch<128, PagedKv8<KvDtype::int8>>(const DecodeParams&, const PagedKv8<KvDtype::int8>&, int, int);
template void launch<128, PagedKv8<KvDtype::int4>>(const DecodeParams&, const PagedKv8<KvDtype::int4>&, int, int);

}  // namespace attn::ch07::gpu::v3
