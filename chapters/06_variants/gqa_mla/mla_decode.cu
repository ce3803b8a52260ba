// MLA's absorbed decode, in the style of FlashMLA, on mma.sync (sm_80+). The kernels' code is in
// mla_tiles.cuh, shared with the final MLA decode (mla_final.cu, sm_90a), which takes the 16-row
// tile's default shape, the combine and the cluster merge; this file launches every shape (the
// lab's forms, LAB.md) and is the absorbed decode on GPUs other than sm_90a.
//
// After absorption every head of a sequence reads the same keys [c ; k_rope] (576) and
// the same values c (512): one KV head, an MQA. So, as the packed GQA kernel does, the
// (head, query) rows of one sequence go on the M dimension of a tile, and the latent
// cache streams through shared memory once per tile of rows, not once per head:
//
//     thread block (tile t, key range s, sequence b), two shapes (Shape below):
//       small: 16 rows (H Nq <= 16), 8 warps, blocks of 64 keys, a ring of 2: 168 KB, one per SM
//       large: 64 rows (4 row tiles), 8 warps, blocks of 64 keys, a ring of 2: 225 KB, one per SM
//     Q tile  [rows][576]   loaded once (small: its mma fragments then stay in registers)
//     K ring  STAGES x [BC][576]  cp.async, zero-filled past Nk; every stage filled at the start,
//             a stage refilled as soon as the block that used it is done
//     for each block of BC keys in range s:
//       S phase:  warp w = (row tile w % RT, key group w / RT): S = Q K^T on its 16 rows x 8 or 32 keys
//                 row maxima of the key groups meet in shared memory -> one m per row,
//                 P = 2^(tau' s - m) to shared memory (bf16)
//       PV phase: warp w = (row tile w % RT, column group w / RT): O[16 rows][128 or 256 cols] += P V,
//                 V = the first 512 columns of the same K tile (the latent c): no bytes of its own
//     write (m, l, O) of range s; combine_kernel merges the ranges of each row with the ⊕ of
//     common/online_softmax.hpp (split-K, "flash-decoding"); with exactly 2 ranges on sm_90
//     (DecodeParams::cluster_merge) the two blocks are one cluster and rank 0 merges rank 1's
//     (m, l, O) from its shared memory instead (H = 16, B = 64 x 4K: 0.0848 -> 0.0819 ms)
//
// Every warp of a row tile computes the same m (the maxima of all key groups, in the same
// order), so the O columns of different warps are scaled alike; l is summed over the key
// groups at the end. The memory-bound case (H = 16) needs bytes in flight and threads to
// issue them: three shapes of the 16-row tile were measured side by side on the H200
// (LAB.md): 8 warps over 64-key blocks ("wide", the default) reached 93% of the
// read ceiling at B = 64, Nk = 16K, two 4-warp blocks per SM with 32-key rings of 2
// ("ring2x2") 88%, one 4-warp block with a ring of 4 ("ring4") 57%: each 16-byte cp.async
// is a thread's instruction, and 128 threads do not keep 110 KB moving. The compute-bound
// case (H = 128) needs the 64-row tile's reuse of each key; its ring of two fills shared memory.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_bf16.h>

#include <cstdlib>
#include <string>

#include "gqa_mla/mla_tiles.cuh"

namespace attn::ch06::mla {
namespace {

using Small = Shape<1, 4, 32, 4>;
using Large = Shape<4, 8, 64, 2>;
// The 16-row tile's other shapes, selectable (mla_small_variant(), the sweep times all three):
//   Wide:   8 warps, 64-key blocks, a ring of 2, 168 KB, one block per SM (the default)
//   Small2: 4 warps, 32-key blocks, a ring of 2, 93 KB, two blocks per SM (two K streams)
//   Small:  4 warps, 32-key blocks, a ring of 4, 167 KB, one block per SM
using Small2 = Shape<1, 4, 32, 2, 2>;
using Wide = Shape<1, 8, 64, 2>;
static_assert(Small::kBytes <= 227 * 1024 && Large::kBytes <= 227 * 1024 && Wide::kBytes <= 227 * 1024 &&
                  2 * Small2::kBytes <= 228 * 1024,
              "the blocks per SM each shape claims");

constexpr int kRowsPerGemmBlock = 8;

/// q_c = q_nope W_UK^T for 8 (batch, query) rows of head blockIdx.x: thread r of 512
/// computes latent dim r from row r of W_UK[h] (128 contiguous weights); threads < 64 copy q_rope.
__global__ void absorb_q_kernel(const bf16* q_nope, const bf16* q_rope, const bf16* w_uk, bf16* q, int batch,
                                int heads, int nq) {
  __shared__ float qn[kRowsPerGemmBlock][128];
  const int h = blockIdx.x, n0 = blockIdx.y * kRowsPerGemmBlock, r = threadIdx.x;
  const int rows = min(kRowsPerGemmBlock, batch * nq - n0);
  auto qrow = [&](int n) { return (std::size_t(n / nq) * heads + h) * nq + n % nq; };
  for (int idx = threadIdx.x; idx < rows * 128; idx += blockDim.x)
    qn[idx / 128][idx % 128] = __bfloat162float(q_nope[qrow(n0 + idx / 128) * 128 + idx % 128]);
  __syncthreads();
  float acc[kRowsPerGemmBlock] = {};
  const uint4* w = reinterpret_cast<const uint4*>(w_uk + (std::size_t(h) * 512 + r) * 128);
  for (int c = 0; c < 16; ++c) {
    const uint4 v = w[c];
    const bf16* e = reinterpret_cast<const bf16*>(&v);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float x = __bfloat162float(e[k]);
#pragma unroll
      for (int n = 0; n < kRowsPerGemmBlock; ++n) acc[n] += qn[n][8 * c + k] * x;
    }
  }
  for (int n = 0; n < rows; ++n) {
    bf16* dst = q + qrow(n0 + n) * kDK;
    dst[r] = __float2bfloat16_rn(acc[n]);
    if (r < 64) dst[512 + r] = q_rope[qrow(n0 + n) * 64 + r];
  }
}

/// o = o_c W_UV for 8 (batch, query) rows of head blockIdx.x: thread c of 128 sums over 512.
__global__ void project_kernel(const bf16* o_c, const bf16* w_uv, bf16* o, int batch, int heads, int nq) {
  __shared__ float oc[kRowsPerGemmBlock][512];
  const int h = blockIdx.x, n0 = blockIdx.y * kRowsPerGemmBlock, c = threadIdx.x;
  const int rows = min(kRowsPerGemmBlock, batch * nq - n0);
  auto orow = [&](int n) { return (std::size_t(n / nq) * heads + h) * nq + n % nq; };
  for (int idx = threadIdx.x; idx < rows * 512; idx += blockDim.x)
    oc[idx / 512][idx % 512] = __bfloat162float(o_c[orow(n0 + idx / 512) * 512 + idx % 512]);
  for (int idx = rows * 512 + threadIdx.x; idx < kRowsPerGemmBlock * 512; idx += blockDim.x) oc[idx / 512][idx % 512] = 0.f;
  __syncthreads();
  float acc[kRowsPerGemmBlock] = {};
  const bf16* w = w_uv + std::size_t(h) * 512 * 128 + c;
  for (int r = 0; r < 512; ++r) {
    const float x = __bfloat162float(w[std::size_t(r) * 128]);
#pragma unroll
    for (int n = 0; n < kRowsPerGemmBlock; ++n) acc[n] += oc[n][r] * x;
  }
  for (int n = 0; n < rows; ++n) o[orow(n0 + n) * 128 + c] = __float2bfloat16_rn(acc[n]);
}

}  // namespace

template <class S>
int launch_shape(const DecodeParams& p_in) {
  static const bool late = [] {
    const char* e = std::getenv("ATTN_CH06_MLA_REFILL");
    return e != nullptr && std::string(e) == "late";
  }();
  DecodeParams p = p_in;
  p.early_refill = !late;
  return launch_tile<S>(p);
}

int launch_decode(const DecodeParams& p, int rows_per_tile, int small_variant) {
  if (rows_per_tile != kRowsSmall) return launch_shape<Large>(p);
  return small_variant == 1 ? launch_shape<Small2>(p) : small_variant == 2 ? launch_shape<Small>(p) : launch_shape<Wide>(p);
}

int keys_per_block(int rows_per_tile, int v) {
  return rows_per_tile != kRowsSmall ? Large::kBc : v == 1 ? Small2::kBc : v == 2 ? Small::kBc : Wide::kBc;
}
int blocks_per_sm(int rows_per_tile, int v) {
  return rows_per_tile != kRowsSmall ? Large::kBlocksPerSm
         : v == 1 ? Small2::kBlocksPerSm : v == 2 ? Small::kBlocksPerSm : Wide::kBlocksPerSm;
}
const char* small_variant_name(int v) { return v == 1 ? "ring2x2" : v == 2 ? "ring4" : "wide"; }

void launch_combine(const DecodeParams& p, bf16* o_c) {
  launch_combine_kernel(p, o_c);
}

void launch_absorb_q(const bf16* q_nope, const bf16* q_rope, const bf16* w_uk, bf16* q, int batch, int heads, int nq) {
  const dim3 grid(heads, ceil_div(batch * nq, kRowsPerGemmBlock));
  absorb_q_kernel<<<grid, 512>>>(q_nope, q_rope, w_uk, q, batch, heads, nq);
  CUDA_CHECK_LAUNCH("mla absorb_q_kernel");
}

void launch_project(const bf16* o_c, const bf16* w_uv, bf16* o, int batch, int heads, int nq) {
  const dim3 grid(heads, ceil_div(batch * nq, kRowsPerGemmBlock));
  project_kernel<<<grid, 128>>>(o_c, w_uv, o, batch, heads, nq);
  CUDA_CHECK_LAUNCH("mla project_kernel");
}

}  // namespace attn::ch06::mla