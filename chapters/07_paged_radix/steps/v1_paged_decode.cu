// Chapter 07, decode step v1: one thread block per (sequence, KV head group), reading K and V
// through the block table (the chapter's README, section 3).
//
// What it is: the shape of vLLM's first PagedAttention kernel. A block owns one sequence and
// walks it from its first page to its last. vLLM's V1 launches a block per (query head,
// sequence); this one takes the G query heads that share a KV head as the rows of its
// m16n8k16 MMA, so every K and V row is read from HBM once per KV head.
//
//   grid.y = sequence b, grid.x = KV head hk (x head chunk when G > 16)
//     b = 0   | block (0, hk) ..................... all of sequence 0 ...................... |
//     b = 1   | block (1, hk) ........... all of sequence 1 ........ |
//
// Each 64-key tile is one cp.async stage (three stages: two tiles load while one is
// computed); warp w owns keys 16w .. 16w + 15 of every tile with its own (m, l, O), and the
// four states are merged at the end with common/online_softmax.hpp's merge(). Rows are found
// by PagedKv::row() (decode_tile.cuh): one table entry per row.
//
// What it buys: a decode that streams at the memory's speed when B * Hkv fills the GPU
// (recorded H200 run: 4460 GB/s, 99% of the read ceiling, at B = 8, L = 32K, 32 KV heads),
// and its limit: one GQA 32/8 sequence is 8 blocks (178 GB/s, 4%), which v2 removes.
//
// Bytes (decode_traffic() counts the same): every K and V row once, the group's Q rows, one
// table entry per page a tile touches, O and the LSE once.
//
// An 8-bit cache (FP8 E4M3 or INT8 codes, one scale per page and KV head, kv_quant.hpp) is
// one more K/V type: the stage holds codes and scales, and each warp converts its keys'
// codes to f16 into a slot of its own before its f16 MMAs (WarpDecode in decode_tile.cuh).
// The instructions are chapter 04's wrappers in common/cuda/ (cp.async, ldmatrix, mma.sync,
// the swizzled tile) and the base-2 online softmax of common/cuda/frag_softmax.cuh.

#include "common/cuda/check.cuh"
#include "decode_steps.cuh"

namespace attn::ch07::gpu::v1 {

template <int D, class Kv>
__global__ void __launch_bounds__(Geo::kThreads) decode(DecodeParams p, Kv kv) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int b = blockIdx.y, hk = blockIdx.x / p.chunks, chunk = blockIdx.x % p.chunks;
  const int h0 = hk * p.group + chunk * Geo::kRows;  // the block's first query head
  const int rows = min(Geo::kRows, p.group - chunk * Geo::kRows);
  const int warp = threadIdx.x / 32;
  // The block's keys: the whole sequence.
  const int t_begin = 0, t_end = p.lens[b];

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
    // The block saw every key of the sequence: O_i = O / l, and LSE_i = m + log l.
    const std::size_t row = std::size_t(b) * p.heads + h0 + i;
    uint2 out;
    out.x = cuda::pack2<bf16>(acc.out(0), acc.out(1));
    out.y = cuda::pack2<bf16>(acc.out(2), acc.out(3));
    *reinterpret_cast<uint2*>(p.o + row * D + c4) = out;
    if (c4 == 0) p.lse[row] = acc.s.lse();
  }
}

template <int D, class Kv>
void launch(const DecodeParams& p, const Kv& kv, int batch, int kv_heads) {
  const int smem = int(decode_smem_bytes(D, Kv::kDtype));
  static const bool configured = [&] {  // more than 48 KB of shared memory needs an opt-in
    CUDA_CHECK(cudaFuncSetAttribute(decode<D, Kv>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return true;
  }();
  (void)configured;
  decode<D, Kv><<<dim3(kv_heads * p.chunks, batch), Geo::kThreads, smem>>>(p, kv);
  CUDA_CHECK_LAUNCH("v1::decode");
}

template void launch<64, PagedKv>(const DecodeParams&, const PagedKv&, int, int);
template void launch<128, PagedKv>(const DecodeParams&, const PagedKv&, int, int);
template void launch<64, ContiguousKv>(const DecodeParams&, const ContiguousKv&, int, int);
template void launch<128, ContiguousKv>(const DecodeParams&, const ContiguousKv&, int, int);
template void launch<128, PagedKv8<KvDtype::fp8>>(const DecodeParams&, const PagedKv8<KvDtype::fp8>&, int, int);
template void launch<128, PagedKv8<KvDtype::int8>>(const DecodeParams&, const PagedKv8<KvDtype::int8>&, int, int);
template void launch<128, PagedKv8<KvDtype::int4>>(const DecodeParams&, const PagedKv8<KvDtype::int4>&, int, int);

}  // namespace attn::ch07::gpu::v1
