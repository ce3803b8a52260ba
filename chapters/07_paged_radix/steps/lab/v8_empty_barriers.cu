// Chapter 07 lab, decode step v8: one "empty" mbarrier per stage in place of the loop's block
// barrier; 8-bit pages (Hopper; the chapter's LAB.md).
//
// What changes from v7, every change: the `empty` barriers (declared, initialised for kWarps
// arrivals), warp 0's wait on them before a refill, each warp's arrival after its tile, and
// the loop's __syncthreads() removed; issue_boxes() stores the scales before lane 0's arrival
// on the full barrier (the block barrier used to publish them; now the barrier's phase does);
// the launcher's name.
//
// Why: v7's four warps meet at a block barrier every tile only so that warp 0 may refill the
// stage tile it - 1 used, so every tile waits for the slowest warp. Here each stage's empty
// barrier expects one arrival per warp, and only warp 0 waits on it, with the phase bit of the
// stage's round, before the refill: a warp waits only for its own tile to land. The output is
// v6's bit for bit.
//
// What it buys: nothing; the loop was not waiting on the warps' lockstep, and the waits and
// arrivals add instructions (recorded H200 run, FP8, B = 8, L = 32K, GQA 32/8: 3046 GB/s
// against v7's 3077). v9 starts again from v7.

#include "common/cuda/check.cuh"
#include "common/cuda/hopper/mbarrier.cuh"
#include "common/cuda/hopper/tma.cuh"
#include "decode_steps.cuh"

namespace attn::ch07::gpu::v8 {

/// Byte offset of 16-byte chunk `ch` of row `row` in a [64][D] tile of 8-bit codes,
/// XOR-swizzled: chunk ch ^ (row & 7), so the rows a load phase reads at one chunk
/// position fall in different bank groups (d = 128: 8 chunks per row).
template <int D>
__device__ __forceinline__ uint32_t code_offset(int row, int ch) {
  static_assert(D == 128, "the 8-bit stage is laid out for d = 128");
  return uint32_t(row) * D + uint32_t((ch ^ (row & 7)) * 16);
}

/// An 8-bit stage as the warp reads it: the K and V codes (code_offset() layout, which
/// is the TMA's 128-byte swizzle) and one K and one V scale per box.
struct CodeRows {
  const unsigned char* k;
  const unsigned char* v;
  const float* scales;
  int box_shift;  ///< log2 of the rows per TMA box: one K and one V scale per box
  /// Row `row`'s (0..63 of the tile) K scale (which = 0) or V scale (which = 1).
  __device__ __forceinline__ float scale(int row, int which) const {
    return scales[which * Geo::kBc + (row >> box_shift)];
  }
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
    // O rescaled only if some row's maximum grew (alpha is exactly 1 otherwise).
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) cuda::rescale(o, alpha);
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

/// The boxes of one tile that a lane of warp 0 owns (box j = lane + 32 r: up to 64 boxes,
/// at P = 1), read one tile ahead: each box's pool coordinates and its K and V scale.
struct BoxPages {
  int slot[2], outer[2];  ///< the box's first slot in its page, and page * kv_heads + hk
  float ks[2], vs[2];     ///< its scales; 0 for a box wholly past the sequence's end
};

/// Reads the lane's boxes of the tile at t0 (rows [t0, t0 + 64), boxes of 1 << box_shift
/// rows). A box wholly past t_end reads the last valid row's page again, with scale 0.
template <KvDtype F>
__device__ __forceinline__ BoxPages read_boxes(const PagedKv8<F>& kv, int b, int hk, int t0, int t_end,
                                               int box_shift) {
  const int lane = threadIdx.x % 32;
  BoxPages bp;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int j = lane + 32 * r, t = t0 + (j << box_shift);
    const bool in = t < t_end && j < (Geo::kBc >> box_shift);
    const int tl = in ? t : max(t_end - 1, 0);
    const int page = __ldg(kv.block_table + std::size_t(b) * kv.max_pages + (tl >> kv.page_shift));
    bp.slot[r] = (tl & ((1 << kv.page_shift) - 1)) & ~((1 << box_shift) - 1);
    bp.outer[r] = page * kv.kv_heads + hk;
    bp.ks[r] = in ? __ldg(kv.k_scale + bp.outer[r]) : 0.f;
    bp.vs[r] = in ? __ldg(kv.v_scale + bp.outer[r]) : 0.f;
  }
  return bp;
}

/// Warp 0: one tile's copies into a stage. Each lane stores its boxes' scales; then lane
/// 0 announces the stage's 16 KB to its mbarrier, whose phase now also publishes the
/// scales (no block barrier does any more); then each lane asks the TMA for its boxes of
/// K and of V.
template <int D>
__device__ __forceinline__ void issue_boxes(const CodeMaps& maps, unsigned char* sk, unsigned char* sv, float* scales,
                                            uint64_t* bar, const BoxPages& bp, int box_shift) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int j = lane + 32 * r;
    if (j < (Geo::kBc >> box_shift)) {
      scales[j] = bp.ks[r];
      scales[Geo::kBc + j] = bp.vs[r];
    }
  }
  __syncwarp();  // the warp's scales are stored before lane 0's arrival releases them
  if (lane == 0) hopper::mbarrier_arrive_expect_tx(bar, 2u * Geo::kBc * D);
  __syncwarp();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int j = lane + 32 * r;
    if (j < (Geo::kBc >> box_shift)) {
      hopper::tma_load_3d(sk + (j << box_shift) * D, &maps.k, bar, 0, bp.slot[r], bp.outer[r]);
      hopper::tma_load_3d(sv + (j << box_shift) * D, &maps.v, bar, 0, bp.slot[r], bp.outer[r]);
    }
  }
}

/// Shared memory of a v7 block: the stages' codes (16 KB each, 1024-byte aligned: one
/// KB of slack for the alignment), then the scales, 2 x 64 floats per stage.
template <int D, class Kv>
constexpr std::size_t smem_bytes() {
  return std::size_t(kStagesFor<Kv>) * (2 * kCodeTileBytes<D, Kv> + 2 * Geo::kBc * 4) + 1024;
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

/// Blocks per SM the launch bounds ask for: an 8-bit block keeps v4's three (without
/// the bound ptxas gives v5's 8-bit kernel 224 registers, and two blocks run per SM).
template <class Kv>
constexpr int kMinBlocks = kv_quantised(Kv::kDtype) ? 3 : 1;

template <int D, class Kv>
__global__ void __launch_bounds__(Geo::kThreads, kMinBlocks<Kv>)
    decode(DecodeParams p, Kv kv, const __grid_constant__ CodeMaps maps) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  // The codes on a 1024-byte boundary, as the TMA's 128-byte swizzle needs.
  unsigned char* smem = smem_raw + ((1024u - (cuda::smem_u32(smem_raw) & 1023u)) & 1023u);
  __shared__ __align__(8) uint64_t full[kStagesFor<Kv>];  // one mbarrier per stage: its tile has arrived
  __shared__ __align__(8) uint64_t empty[kStagesFor<Kv>];  // and one: every warp is done with its tile
  const int b = blockIdx.z, hk = blockIdx.y / p.chunks, chunk = blockIdx.y % p.chunks, split = blockIdx.x;
  const int h0 = hk * p.group + chunk * Geo::kRows;  // the block's first query head
  const int rows = min(Geo::kRows, p.group - chunk * Geo::kRows);
  const int warp = threadIdx.x / 32;
  if (threadIdx.x == 0) {
    for (int st = 0; st < kStagesFor<Kv>; ++st) hopper::mbarrier_init(&full[st], 1);
    for (int st = 0; st < kStagesFor<Kv>; ++st) hopper::mbarrier_init(&empty[st], Geo::kWarps);
    hopper::mbarrier_init_fence();
  }
  // The block's keys: split `split`, split_keys keys from split * split_keys, whatever
  // the length.
  const int t_first = split * p.split_keys;
  const int len = p.lens[b];
  const int t_begin = min(len, t_first), t_end = min(len, t_first + p.split_keys);
  const int box_shift = min(kv.page_shift, 6);  // boxes of min(P, 64) rows

  const float c = p.scale * float(kLog2e);  // the softmax scale in base 2
  WarpDecodeV4<D, Kv> wd;  // f16 MMAs over fragments converted from the codes
  wd.init(p.q + (std::size_t(b) * p.heads + h0) * D, rows);
  constexpr int S = kStagesFor<Kv>;
  auto stage_k = [&](int st) { return smem + std::size_t(st) * 2 * kCodeTileBytes<D, Kv>; };
  auto stage_v = [&](int st) { return stage_k(st) + kCodeTileBytes<D, Kv>; };
  auto stage_scales = [&](int st) {
    return reinterpret_cast<float*>(smem + std::size_t(S) * 2 * kCodeTileBytes<D, Kv>) + st * 2 * Geo::kBc;
  };
  const int n_tiles = cuda::ceil_div(t_end - t_begin, Geo::kBc);
  __syncthreads();  // the barriers are initialised

  // Fill the pipeline: warp 0 issues kStages - 1 tiles, then reads the first refill's boxes.
  BoxPages ahead{};
  if (warp == 0) {
#pragma unroll
    for (int st = 0; st < S - 1; ++st)
      if (st < n_tiles)
        issue_boxes<D>(maps, stage_k(st), stage_v(st), stage_scales(st), &full[st],
                       read_boxes(kv, b, hk, t_begin + st * Geo::kBc, t_end, box_shift), box_shift);
    if (S - 1 < n_tiles) ahead = read_boxes(kv, b, hk, t_begin + (S - 1) * Geo::kBc, t_end, box_shift);
  }
  for (int it = 0; it < n_tiles; ++it) {
    const int next = it + S - 1;        // refill the stage that tile it - 1 used
    if (warp == 0 && next < n_tiles) {
      // Round next / S of the stage; its emptying of round next / S - 1 (tile it - 1) must
      // have completed. Round 0 passes at once: the ring starts empty.
      hopper::mbarrier_wait(&empty[next % S], (uint32_t(next / S) & 1u) ^ 1u);
      issue_boxes<D>(maps, stage_k(next % S), stage_v(next % S), stage_scales(next % S), &full[next % S], ahead,
                     box_shift);
      if (next + 1 < n_tiles) ahead = read_boxes(kv, b, hk, t_begin + (next + 1) * Geo::kBc, t_end, box_shift);
    }
    hopper::mbarrier_wait(&full[it % S], uint32_t(it / S) & 1u);  // tile `it` has arrived
    const int t0 = t_begin + it * Geo::kBc;
    const int valid = min(Geo::kWarpKeys, t_end - t0 - warp * Geo::kWarpKeys);  // this warp's keys in the tile
    // The warp's rows of the stage: the codes, converted in the warp's registers.
    const CodeRows rows_it{stage_k(it % S), stage_v(it % S), stage_scales(it % S), box_shift};
    if (valid > 0) wd.tile(rows_it, warp * Geo::kWarpKeys, valid, c);
    __syncwarp();                                              // every lane has read the stage...
    if (threadIdx.x % 32 == 0) hopper::mbarrier_arrive(&empty[it % S]);  // ...and so has this warp
  }
  __syncthreads();  // every tile issued was waited for: reuse the memory for the merge

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
  merge_states<D>(p, b, h0, rows, reinterpret_cast<float*>(smem), int((smem_bytes<D, Kv>() - 1024) / 4));
  if (threadIdx.x == 0) *counter = 0;  // ready for the next step
}

template <int D, class Kv>
void launch(const DecodeParams& p, const Kv& kv, const CodeMaps& maps, int batch, int kv_heads) {
  const int smem = int(smem_bytes<D, Kv>());
  static const bool configured = [&] {  // more than 48 KB of shared memory needs an opt-in
    CUDA_CHECK(cudaFuncSetAttribute(decode<D, Kv>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return true;
  }();
  (void)configured;
  decode<D, Kv><<<dim3(p.splits, kv_heads * p.chunks, batch), Geo::kThreads, smem>>>(p, kv, maps);
  CUDA_CHECK_LAUNCH("v8::decode");
}

template void launch<128, PagedKv8<KvDtype::fp8>>(const DecodeParams&, const PagedKv8<KvDtype::fp8>&, const CodeMaps&,
                                                  int, int);
template void launch<128, PagedKv8<KvDtype::int8>>(const DecodeParams&, const PagedKv8<KvDtype::int8>&,
                                                   const CodeMaps&, int, int);

}  // namespace attn::ch07::gpu::v8
