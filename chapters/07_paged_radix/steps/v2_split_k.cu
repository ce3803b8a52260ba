// Chapter 07, decode step v2: split-K over the sequence, then a merge kernel
// (flash-decoding; the chapter's README, section 3).
//
// What changes from v1, every change: the block's coordinates gain the split (grid.x); its
// keys are split `split` of the sequence, whole tiles of it; after the warp merge it stores
// the unnormalised (m, l, O) of its split in part_m, part_l, part_o instead of O and the LSE;
// merge_splits() is new; and the launcher runs both kernels.
//
// Why: v1's grid has B * Hkv blocks, 8 for one GQA 32/8 sequence. Cutting every sequence into
// S splits gives S * B * Hkv blocks. A split cannot normalise its output (it has not seen the
// other splits' keys), so it writes its state, and the merge kernel folds the S states of
// every (b, h) with chapter 02's operator, the same merge() that combines a block's warps:
//
//     (m_a, l_a, O_a) (+) (m_b, l_b, O_b) = (m, l_a e^(m_a - m) + l_b e^(m_b - m), O_a e^(m_a - m) + O_b e^(m_b - m))
//
//     b = 0   | split 0 | split 1 | split 2 | split 3 |  -> merge kernel: O, LSE of every (0, h)
//     b = 1   | split 0 | split 1 | (empty) | (empty) |  -> an empty split writes the identity (-inf, 0, 0)
//
// What it buys: one long sequence fills the GPU (recorded H200 run, B = 1, L = 32K, GQA 32/8:
// 3054 GB/s against v1's 178). The price is S partial states of d + 2 floats per query head,
// written and read once; choose_splits() never cuts a split under 512 keys.

#include "common/cuda/check.cuh"
#include "decode_steps.cuh"

namespace attn::ch07::gpu::v2 {

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
}

/// The second kernel: one warp per (b, h) folds the S split states in order with
/// merge(), then normalises. Lane l owns dims l * D/32 .. (l+1) * D/32 - 1.
template <int D>
__global__ void __launch_bounds__(32) merge_splits(DecodeParams p) {
  constexpr int W = D / 32;
  const std::size_t row = std::size_t(blockIdx.y) * p.heads + blockIdx.x;
  const int c = threadIdx.x * W;
  auto acc = AttnState<W, float, Base2>::identity();
  for (int s = 0; s < p.splits; ++s) {
    const std::size_t at = row * p.splits + s;
    AttnState<W, float, Base2> part;
    part.s = {p.part_m[at], p.part_l[at]};
    if constexpr (W == 4) {
      const float4 v = *reinterpret_cast<const float4*>(p.part_o + at * D + c);
      part.o[0] = v.x, part.o[1] = v.y, part.o[2] = v.z, part.o[3] = v.w;
    } else {
      const float2 v = *reinterpret_cast<const float2*>(p.part_o + at * D + c);
      part.o[0] = v.x, part.o[1] = v.y;
    }
    acc = merge(acc, part);
  }
#pragma unroll
  for (int k = 0; k < W; k += 2)
    *reinterpret_cast<uint32_t*>(p.o + row * D + c + k) = cuda::pack2<bf16>(acc.out(k), acc.out(k + 1));
  if (threadIdx.x == 0) p.lse[row] = acc.s.lse();
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
  CUDA_CHECK_LAUNCH("v2::decode");
  merge_splits<D><<<dim3(p.heads, batch), 32>>>(p);
  CUDA_CHECK_LAUNCH("v2::merge_splits");
}

template void launch<64, PagedKv>(const DecodeParams&, const PagedKv&, int, int);
template void launch<128, PagedKv>(const DecodeParams&, const PagedKv&, int, int);
template void launch<64, ContiguousKv>(const DecodeParams&, const ContiguousKv&, int, int);
template void launch<128, ContiguousKv>(const DecodeParams&, const ContiguousKv&, int, int);
template void launch<128, PagedKv8<KvDtype::fp8>>(const DecodeParams&, const PagedKv8<KvDtype::fp8>&, int, int);
template void launch<128, PagedKv8<KvDtype::int8>>(const DecodeParams&, const PagedKv8<KvDtype::int8>&, int, int);
template void launch<128, PagedKv8<KvDtype::int4>>(const DecodeParams&, const PagedKv8<KvDtype::int4>&, int, int);

}  // namespace attn::ch07::gpu::v2
