// Chapter 07, decode step v4: an 8-bit cache's codes loaded straight from the stage into the
// MMA's fragments (the chapter's README, section 5).
//
// What changes from v3, every change: code_offset() and load_codes() (the swizzled 8-bit
// stage); load_stage(); CodeRows and WarpCodes (the fragments from the codes: init, tile,
// store); WarpDecodeV4 and warp_rows_v4() pick them for an 8-bit cache; smem_bytes() sizes the
// stage without the slots; the kernel calls load_stage, warp_rows_v4 and WarpDecodeV4; and the
// launcher takes smem_bytes(), for PagedKv and PagedKv8 only. A bf16 cache runs v3's code.
//
// Why: in v3 every warp reads its keys' codes, writes them back as f16 rows into its own slot
// and reads the slot again with ldmatrix, for K and for V: per key (d = 128) 256 bytes of
// cp.async writes, 256 of code reads, 512 of f16 writes and 512 of ldmatrix reads, only
// because ldmatrix wants 16-bit rows. v4 has each lane load, with plain 16-byte loads, exactly
// the codes its m16n8k16 B fragments hold, and convert them in registers. Both products sum
// over an axis whose order is free:
//
//   S = Q K^T sums over the head dim. Lane l (quad q = l % 4, key n = l / 4) loads the 32
//     bytes [32q, 32q + 32) of its key and, at k-step ks, uses the word of dims
//     32q + 4ks .. 32q + 4ks + 3 as its b0, b1 pair; Q's A fragment is loaded in the same
//     order (init()).
//   O = P V sums over the keys in P's order, but an n-tile's 8 columns may be any 8 dims:
//     column n of n-tile nt is dim 16n + nt, so lane l needs dims 16n .. 16n + 15 of its four
//     keys 2q, 2q + 1, 2q + 8, 2q + 9, one 16-byte chunk each; __byte_perm interleaves two
//     keys' bytes into the pairs a B register holds, and store() puts O's dims back in order.
//
// The stage is XOR-swizzled by chunk (chunk ch of row r at ch ^ (r & 7)), so every 16-byte
// load phase touches 8 bank groups. Shared memory sees 256 + 256 bytes per key, and the stage
// shrinks to codes and scales (49.5 KB for three stages).
//
// What it buys: the 8-bit step bound by the memory again rather than by the slot (recorded
// H200 run, FP8, B = 8, L = 32K, GQA 32/8: 2779 GB/s against v3's 2145).

#include "common/cuda/check.cuh"
#include "decode_steps.cuh"

namespace attn::ch07::gpu::v4 {

/// Byte offset of 16-byte chunk `ch` of row `row` in a [64][D] tile of 8-bit codes,
/// XOR-swizzled: chunk ch ^ (row & 7), so the rows a load phase reads at one chunk
/// position fall in different bank groups (d = 128: 8 chunks per row).
template <int D>
__device__ __forceinline__ uint32_t code_offset(int row, int ch) {
  static_assert(D == 128, "the 8-bit stage is laid out for d = 128");
  return uint32_t(row) * D + uint32_t((ch ^ (row & 7)) * 16);
}

/// load_tile() for PagedKv8 (decode_tile.cuh) with the chunks at code_offset().
template <int D, KvDtype F>
__device__ __forceinline__ void load_codes(uint32_t sk, uint32_t sv, const PagedKv8<F>& kv, int b, int hk, int t0,
                                           int t_end) {
  constexpr int CH = D / 16;                     // 16-byte chunks per row
  constexpr int ROWS = Geo::kThreads / CH;       // rows per pass
  const int ch = threadIdx.x % CH;
  const uint32_t scales = sv + uint32_t(Geo::kBc) * D;  // K scales, then V scales
#pragma unroll
  for (int pass = 0; pass < Geo::kBc / ROWS; ++pass) {
    const int row = pass * ROWS + threadIdx.x / CH;
    const int t = t0 + row;
    const bool in = t < t_end;
    const std::size_t r = in ? kv.row(b, hk, t) : 0;
    const uint32_t dst = code_offset<D>(row, ch);
    cuda::cp_async_16(sk + dst, kv.k + r * D + ch * 16, in);
    cuda::cp_async_16(sv + dst, kv.v + r * D + ch * 16, in);
    if (ch == 0) {
      cuda::cp_async_4(scales + 4 * row, kv.k_scale + (r >> kv.page_shift), in);
      cuda::cp_async_4(scales + 4 * (Geo::kBc + row), kv.v_scale + (r >> kv.page_shift), in);
    }
  }
}

/// One stage's loads: the swizzled codes for an 8-bit cache, v3's tile for bf16.
template <int D, class Kv>
__device__ __forceinline__ void load_stage(uint32_t sk, uint32_t sv, const Kv& kv, int b, int hk, int t0, int t_end) {
  if constexpr (kv_quantised(Kv::kDtype)) load_codes<D>(sk, sv, kv, b, hk, t0, t_end);
  else load_tile<D>(sk, sv, kv, b, hk, t0, t_end);
}

/// An 8-bit stage as the warp reads it: the K and V codes (code_offset() layout) and
/// the 64 K scales, then the 64 V scales.
struct CodeRows {
  const unsigned char* k;
  const unsigned char* v;
  const float* scales;
  /// Row `row`'s (0..63 of the tile) K scale (which = 0) or V scale (which = 1).
  __device__ __forceinline__ float scale(int row, int which) const { return scales[which * Geo::kBc + row]; }
};

/// The 16 bytes of chunk `ch` of row `row` of a code tile.
template <int D>
__device__ __forceinline__ uint4 load_chunk(const unsigned char* tile, int row, int ch) {
  return *reinterpret_cast<const uint4*>(tile + code_offset<D>(row, ch));
}

/// Word i (0..3) of a 16-byte chunk.
__device__ __forceinline__ uint32_t word(const uint4& c, int i) { return i == 0 ? c.x : i == 1 ? c.y : i == 2 ? c.z : c.w; }

/// WarpDecode<D, __half> (decode_tile.cuh) with its fragments loaded from the codes:
/// Q in the dim order of the K codes (init), K and V fragments converted from the
/// stage's codes in registers (tile), O's dims put back in order (store). The scales,
/// the online softmax and O's unit vsig are WarpDecode's.
template <int D, KvDtype F>
struct WarpCodes : WarpDecode<D, __half> {
  using Base = WarpDecode<D, __half>;
  using Base::KS;
  using Base::ND;
  using Base::o;
  using Base::qa;
  using Base::softmax;
  using Base::vsig;
  static_assert(D == 128, "lane q's K bytes [32q, 32q + 32) are 4 KS bytes: d = 128");

  /// Q rows of heads h0 .. h0 + rows - 1 (rows <= 16); register pair i of k-step ks
  /// holds dims 32q + 4ks + 2 (i / 2) + {0, 1}: the dims of the K codes' word ks.
  __device__ __forceinline__ void init(const bf16* q, int rows) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = Frag::a_row(lane, i), col = (D / 4) * (lane % 4) + 4 * ks + 2 * (i / 2);
        const uint32_t x = row < rows ? *reinterpret_cast<const uint32_t*>(q + std::size_t(row) * D + col) : 0u;
        const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&x));
        qa[ks][i] = cuda::pack2<__half>(f.x, f.y);
      }
#pragma unroll
    for (int i = 0; i < 4 * ND; ++i) o[i] = 0.f;
    vsig = 0.f;
    softmax.init();
  }

  /// Keys k0 .. k0 + 15 of the stage; only the first `valid` exist. WarpDecode::tile
  /// with the ldmatrix reads of the f16 slot replaced by the codes' own fragments.
  __device__ __forceinline__ void tile(const CodeRows& rows, int k0, int valid, float c) {
    const int lane = threadIdx.x % 32, n = lane / 4, q = lane % 4;
    // K: keys k0 + n (n-tile 0) and k0 + 8 + n (n-tile 1), chunks 2q and 2q + 1 of each.
    uint4 kc[2][2];
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
      for (int j = 0; j < 2; ++j) kc[t][j] = load_chunk<D>(rows.k, k0 + 8 * t + n, 2 * q + j);
    float s[8] = {};
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        uint32_t b0, b1;
        codes_to_f16<F>(word(kc[t][ks / 4], ks % 4), b0, b1);
        cuda::mma_m16n8k16<__half>(acc4(s, t), qa[ks], b0, b1);
      }
    // S's column j times key j's K scale (this lane holds 4 keys' columns).
#pragma unroll
    for (int i = 0; i < 8; ++i) s[i] *= rows.scale(k0 + 8 * (i / 4) + Frag::c_col(lane, i % 4), 0);
    // Mask the keys past the end: -inf, which the softmax turns into P = 0.
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (8 * (i / 4) + Frag::c_col(lane, i % 4) >= valid) s[i] = neg_inf<float>();
    float alpha[2];
    softmax.update(s, c, alpha);
    cuda::rescale(o, alpha);
    // P's column j times s_j / vsig, vsig the largest V scale so far (p_times_v_scales()).
    p_times_v_scales(s, o, vsig, [&](int key) { return rows.scale(k0 + key, 1); });
    const uint32_t pa[4] = {cuda::pack2<__half>(s[0], s[1]), cuda::pack2<__half>(s[2], s[3]),
                            cuda::pack2<__half>(s[4], s[5]), cuda::pack2<__half>(s[6], s[7])};
    // V: keys 2q, 2q + 1 (b0) and 2q + 8, 2q + 9 (b1), dims 16n .. 16n + 15: chunk n.
    uint4 vc[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) vc[i] = load_chunk<D>(rows.v, k0 + 2 * q + (i & 1) + 8 * (i >> 1), n);
    // Word w holds dims 16n + 4w .. + 3 of each key: interleaved key by key (bytes
    // k_a d, k_b d, k_a d+1, k_b d+1), then converted, they are the B registers of the
    // n-tiles 4w .. 4w + 3 (column n of n-tile nt is dim 16n + nt).
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      uint32_t b0[4], b1[4];
      codes_to_f16<F>(__byte_perm(word(vc[0], w), word(vc[1], w), 0x5140u), b0[0], b0[1]);
      codes_to_f16<F>(__byte_perm(word(vc[0], w), word(vc[1], w), 0x7362u), b0[2], b0[3]);
      codes_to_f16<F>(__byte_perm(word(vc[2], w), word(vc[3], w), 0x5140u), b1[0], b1[1]);
      codes_to_f16<F>(__byte_perm(word(vc[2], w), word(vc[3], w), 0x7362u), b1[2], b1[3]);
#pragma unroll
      for (int j = 0; j < 4; ++j) cuda::mma_m16n8k16<__half>(acc4(o, 4 * w + j), pa, b0[j], b1[j]);
    }
  }

  /// WarpDecode::store with O's dims in order: column 2q + j of n-tile nt is dim
  /// ND (2q + j) + nt.
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
    const float u = vsig;  // O back to value units
#pragma unroll
    for (int nt = 0; nt < ND; ++nt) {
      float* top = os + std::size_t(warp * 16 + r) * D + nt;
      float* bottom = os + std::size_t(warp * 16 + r + 8) * D + nt;
      top[ND * cl] = o[4 * nt] * u;
      top[ND * (cl + 1)] = o[4 * nt + 1] * u;
      bottom[ND * cl] = o[4 * nt + 2] * u;
      bottom[ND * (cl + 1)] = o[4 * nt + 3] * u;
    }
  }
};

/// The warp's state for a K/V type: v3's for bf16, WarpCodes for an 8-bit cache.
template <int D, class Kv, bool = kv_quantised(Kv::kDtype)>
struct WarpDecodeV4Of {
  using type = WarpDecodeFor<D, Kv>;
};
template <int D, class Kv>
struct WarpDecodeV4Of<D, Kv, true> {
  using type = WarpCodes<D, Kv::kDtype>;
};
template <int D, class Kv>
using WarpDecodeV4 = typename WarpDecodeV4Of<D, Kv>::type;

/// The rows of warp `warp` in a stage: v3's for bf16; the stage itself for 8-bit codes.
template <int D, class Kv>
__device__ __forceinline__ auto warp_rows_v4(const Kv& kv, uint32_t sk, uint32_t sv, int warp, unsigned char* smem,
                                             uint32_t s0) {
  if constexpr (kv_quantised(Kv::kDtype)) {
    return CodeRows{smem + (sk - s0), smem + (sv - s0),
                    reinterpret_cast<const float*>(smem + (sv - s0) + std::size_t(Geo::kBc) * D)};
  } else {
    return warp_rows<D>(kv, sk, sv, warp, smem, s0);
  }
}

/// Shared memory of a v4 block: the stages (an 8-bit stage without the f16 slots).
template <int D, class Kv>
constexpr std::size_t smem_bytes() {
  return kv_quantised(Kv::kDtype) ? std::size_t(kStagesFor<Kv>) * kStageBytes<D, Kv> : decode_smem_bytes(D);
}

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
  WarpDecodeV4<D, Kv> wd;  // bf16 MMAs, or f16 ones over fragments converted from the codes
  wd.init(p.q + (std::size_t(b) * p.heads + h0) * D, rows);
  const uint32_t s0 = cuda::smem_u32(smem);
  auto stage_k = [&](int st) { return s0 + uint32_t(st) * kStageBytes<D, Kv>; };
  auto stage_v = [&](int st) { return stage_k(st) + kCodeTileBytes<D, Kv>; };
  const int n_tiles = cuda::ceil_div(t_end - t_begin, Geo::kBc);

  // Fill the pipeline: kStages - 1 tiles in flight before the first is used.
  for (int st = 0; st < kStagesFor<Kv> - 1; ++st) {
    if (st < n_tiles) load_stage<D>(stage_k(st), stage_v(st), kv, b, hk, t_begin + st * Geo::kBc, t_end);
    cuda::cp_async_commit();
  }
  for (int it = 0; it < n_tiles; ++it) {
    cuda::cp_async_wait<kStagesFor<Kv> - 2>();  // tile `it` has arrived for this thread...
    __syncthreads();                    // ...for all threads, and every warp is done with tile it - 1
    const int next = it + kStagesFor<Kv> - 1;  // refill the stage that tile it - 1 used
    if (next < n_tiles)
      load_stage<D>(stage_k(next % kStagesFor<Kv>), stage_v(next % kStagesFor<Kv>), kv, b, hk, t_begin + next * Geo::kBc,
                   t_end);
    cuda::cp_async_commit();
    const int t0 = t_begin + it * Geo::kBc;
    const int valid = min(Geo::kWarpKeys, t_end - t0 - warp * Geo::kWarpKeys);  // this warp's keys in the tile
    // The warp's rows of the stage (8-bit K/V: the codes, converted in the warp's registers).
    const auto rows = warp_rows_v4<D>(kv, stage_k(it % kStagesFor<Kv>), stage_v(it % kStagesFor<Kv>), warp, smem, s0);
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
  merge_states<D>(p, b, h0, rows, reinterpret_cast<float*>(smem), int(smem_bytes<D, Kv>() / 4));
  if (threadIdx.x == 0) *counter = 0;  // ready for the next step
}

template <int D, class Kv>
void launch(const DecodeParams& p, const Kv& kv, int batch, int kv_heads) {
  const int smem = int(smem_bytes<D, Kv>());
  static const bool configured = [&] {  // more than 48 KB of shared memory needs an opt-in
    CUDA_CHECK(cudaFuncSetAttribute(decode<D, Kv>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return true;
  }();
  (void)configured;
  decode<D, Kv><<<dim3(p.splits, kv_heads * p.chunks, batch), Geo::kThreads, smem>>>(p, kv);
  CUDA_CHECK_LAUNCH("v4::decode");
}

template void launch<64, PagedKv>(const DecodeParams&, const PagedKv&, int, int);
template void launch<128, PagedKv>(const DecodeParams&, const PagedKv&, int, int);
template void launch<128, PagedKv8<KvDtype::fp8>>(const DecodeParams&, const PagedKv8<KvDtype::fp8>&, int, int);
template void launch<128, PagedKv8<KvDtype::int8>>(const DecodeParams&, const PagedKv8<KvDtype::int8>&, int, int);

}  // namespace attn::ch07::gpu::v4
