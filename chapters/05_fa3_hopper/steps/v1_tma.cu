// Chapter 05, step 1 of 8: TMA and mbarriers.
//
//   > v1  TMA: chapter 04's last kernel with cp.async replaced by TMA copies and mbarriers
//     v2  wgmma: S = Q K^T with both operands in shared memory, O += P V with P in registers
//     v3  warp specialisation: a producer warpgroup, two consumer warpgroups, setmaxnreg
//     v4  pingpong: named barriers alternate the two consumers' GEMMs
//     v5  intra-warpgroup overlap: S_j = Q K_j^T issued before softmax(S_{j-1}) is done
//     v6  masked blocks first: only the key blocks the causal diagonal crosses take the mask
//     v7  persistent blocks: one per SM, each walking a longest-first list of tiles
//     v8  every head dim: d = 64, 128, 256, each with its key block and ring depth
//         then final.cu and final_fp8.cu: v8 with the configurations the lab (steps/lab/)
//         measured, FP8 inputs (the lab's v9) in final_fp8.cu
//
// This step is chapter 04's v9 (chapters/04_fa2/steps/lab/v9_per_dim_tiles.cu, its lab)
// with cp.async replaced by TMA and mbarriers; diff the two files to see it. Chapter
// 04's threads each copied 16-byte pieces with cp.async and computed the swizzled
// address of every piece. Here one thread asks the copy engine (TMA) for a whole box
// of 128-byte rows, [Br rows][64 columns] of Q or [Bc rows][64 columns] of K or V
// (common/cuda/hopper/tma.cuh), and the engine writes it swizzled (the 128-byte
// swizzle of common/cuda/hopper/wgmma.cuh) and reports the bytes to an mbarrier
// (common/cuda/hopper/mbarrier.cuh). The other threads only wait for its phase:
//
//     thread 0:     arrive_expect_tx(full_v, bytes); TMA V_j -> sV      (returns at once)
//     all threads:  ... S = Q K_j^T, softmax ...
//                   wait(full_v, phase j & 1)                        (until V_j's bytes are in)
//
// What changes, and nothing else:
//   1. the kernel takes three tensor maps (built once in prepare()) and chapter 05's
//      Fa3Params instead of chapter 04's FwdParams with the Q, K, V pointers;
//   2. load_tile() (cp.async) becomes load() (one TMA box per 64 columns, issued by
//      thread 0), cp_async_commit() an arrive.expect_tx on the tile's mbarrier
//      (full_k, which also carries Q the first time, or full_v), and cp_async_wait<0>()
//      a wait for that barrier's phase; the __syncthreads() after it stays, as the
//      sign that every warp is done with the buffer TMA refills next;
//   3. the tiles are laid out as TMA writes them, boxes of 64 columns side by side
//      (TmaLane in fa3_common.cuh replaces SwizzledLane), 1024-aligned for the
//      swizzle, with the two mbarriers after them (Cfg::kSmemBytes);
//   4. the launcher is chapter 05's prepare() (step_launch.cuh), not chapter 04's launch().
// The compute is chapter 04's: ldmatrix fragments, mma.sync.m16n8k16, the base-2 online
// softmax, O staged through shared memory, for d = 64, 128 and 256.
//
// In the recorded H100 run it reaches 388 TFLOP/s at d = 128, N = 8K (348 causal).
#include <string>

#include "common/cuda/check.cuh"
#include "common/cuda/fast_math.cuh"
#include "common/cuda/hopper/mbarrier.cuh"
#include "common/cuda/hopper/tma.cuh"
#include "common/cuda/index.cuh"
#include "common/cuda/ldmatrix.cuh"
#include "common/cuda/mma_sync.cuh"
#include "common/cuda/smem_tiles.cuh"
#include "common/errors.hpp"
#include "common/online_softmax.hpp"
#include "fa3_common.cuh"
#include "step_launch.cuh"

namespace attn::ch05::v1 {
namespace {
using namespace attn::cuda;
using namespace attn::hopper;

/// Tile shapes of one configuration.
///   Br = kWarps * 16 * MT query rows per thread block (warp w owns rows [w*16*MT, (w+1)*16*MT))
///   Bc keys per K/V tile; D head dim.
template <int D_, int kWarps_, int MT_, int Bc_>
struct Cfg {
  static constexpr int D = D_, kWarps = kWarps_, MT = MT_, Bc = Bc_;
  static constexpr int Br = kWarps * 16 * MT;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kChunks = D / 8;  // 16-byte chunks per row of a tile
  static constexpr int NT = Bc / 8;      // n8 tiles of S per 16-row tile
  static constexpr int DT = D / 8;       // n8 tiles of O per 16-row tile
  static constexpr int kBars = (Br + 2 * Bc) * D * 2;           // sQ, sK, sV (16-bit elements), then full_k, full_v
  static constexpr int kSmemBytes = kBars + 2 * 8 + 1024;        // + slack to align the base to 1024 (the swizzle's atom)
};

template <class T, class C>
__global__ void __launch_bounds__(C::kThreads)
    kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
           const __grid_constant__ CUtensorMap tm_v, const Fa3Params p) {
  constexpr int D = C::D, MT = C::MT, Bc = C::Bc, Br = C::Br, NT = C::NT, DT = C::DT, KC = C::kChunks;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = align_1024(smem_raw);
  T* sQ = reinterpret_cast<T*>(smem);  // [Br][D]  Q_i (as TMA boxes), later O_i on its way out
  T* sK = sQ + Br * D;                 // [Bc][D]  K_j
  T* sV = sK + Bc * D;                 // [Bc][D]  V_j
  uint64_t* full_k = reinterpret_cast<uint64_t*>(smem + C::kBars);  // K_j (and Q_i with K_0) landed
  uint64_t* full_v = full_k + 1;                                    // V_j landed

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;  // mma fragment coordinates (common/cuda/mma_sync.cuh)
  // Causal: the last query blocks see the most keys; start them first.
  const int i_blk = p.causal ? int(gridDim.x) - 1 - int(blockIdx.x) : int(blockIdx.x);
  const int bh = blockIdx.y, b = bh / p.heads, h = bh % p.heads;
  const int hk = kv_head_of(h, p.heads, p.kv_heads);
  const int bhk = b * p.kv_heads + hk;  // the K/V tensor maps' outer coordinate
  T* O = static_cast<T*>(p.o) + std::size_t(bh) * p.nq * D;
  float* LSE = p.lse + std::size_t(bh) * p.nq;
  const int row0 = i_blk * Br;          // first query row of Q_i
  const int wrow = warp * 16 * MT;      // first row of this warp within Q_i
  const CausalMask mask(p.nq, p.nk);    // row i sees keys j <= i + (nk - nq)

  // Causal (chapter 03's block skipping, in the common rule of common/index.hpp): K/V
  // blocks past the diagonal of the block's last row are never visited; blocks the
  // diagonal crosses are masked below, blocks left of it need no mask.
  //
  //          keys ->   j=0   j=1   j=2   j=3
  //   Q_i rows     |  full  full  diag  skip |
  //
  const int n_end = p.causal ? mask.key_end(min(row0 + Br, p.nq)) : p.nk;
  const int n_blocks = ceil_div(n_end, Bc);

  const uint32_t aQ = smem_u32(sQ), aK = smem_u32(sK), aV = smem_u32(sV);
  // ROWS rows from row r0 of `map` into `tile`: D / 64 boxes of 128-byte rows, side by
  // side, completing on `bar`. Thread 0 only; rows past the tensor arrive as zeros.
  auto load = [&](T* tile, const CUtensorMap& map, int rows, int r0, int outer, uint64_t* bar) {
    for (int box = 0; box < D / 64; ++box) tma_load_3d(tile + box * rows * 64, &map, bar, box * 64, r0, outer);
  };
  if (threadIdx.x == 0) {
    mbarrier_init(full_k, 1);
    mbarrier_init(full_v, 1);
    mbarrier_init_fence();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbarrier_arrive_expect_tx(full_k, (Br + (n_blocks > 0 ? Bc : 0)) * D * 2);
    load(sQ, tm_q, Br, row0, bh, full_k);
    if (n_blocks > 0) load(sK, tm_k, Bc, 0, bhk, full_k);
  }
  // ldmatrix addresses (common/cuda/smem_tiles.cuh): A = Q rows wrow + lane%16 at chunks 2kk + lane/16;
  // B = K rows (lane/16)*8 + lane%8 at chunks 2kk + (lane/8)%2; B = V rows lane%8 +
  // ((lane/8)%2)*8 at chunks 2dp + lane/16, transposed on load.
  const TmaLane<Br> q_frag(aQ, wrow + lane % 16, lane / 16);
  const TmaLane<Bc> k_frag(aK, (lane / 16) * 8 + lane % 8, (lane / 8) % 2);
  const TmaLane<Bc> v_frag(aV, lane % 8 + ((lane / 8) % 2) * 8, lane / 16);

  float o[MT][DT][4];   // O_i, unnormalised: rows g and g+8 of each 16-row tile
  float m[MT][2], l[MT][2];  // running max (base-2 units) and this thread's partial row sum
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) o[mt][dt][0] = o[mt][dt][1] = o[mt][dt][2] = o[mt][dt][3] = 0.f;
    m[mt][0] = m[mt][1] = neg_inf<float>();
    l[mt][0] = l[mt][1] = 0.f;
  }

  for (int j = 0; j < n_blocks; ++j) {
    mbarrier_wait(full_k, j & 1);  // K_j (and, the first time, Q_i) have arrived ...
    __syncthreads();     // ... for every thread, and every warp is done with V_{j-1}
    if (threadIdx.x == 0) {  // V_j streams in while S = Q_i K_j^T runs
      mbarrier_arrive_expect_tx(full_v, Bc * D * 2);
      load(sV, tm_v, Bc, j * Bc, bhk, full_v);
    }

    // S_ij = Q_i K_j^T: (16*MT) x Bc per warp, k over the head dim in steps of 16.
    float s[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) ldmatrix_x4(a[mt], q_frag.at(mt * 16, 2 * kk));
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        uint32_t bk[4];  // B = K_j^T for n tiles 2np, 2np+1: K rows are B's columns
        ldmatrix_x4(bk, k_frag.at(np * 16, 2 * kk));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_m16n8k16<T>(s[mt][2 * np], a[mt], bk[0], bk[1]);
          mma_m16n8k16<T>(s[mt][2 * np + 1], a[mt], bk[2], bk[3]);
        }
      }
    }

    // Mask only where needed: the ragged last block, and blocks the diagonal crosses.
    const int col0 = j * Bc;
    const bool diagonal = p.causal && mask.tile(row0, row0 + Br, col0, col0 + Bc) != TileMask::full;
    if (col0 + Bc > p.nk || diagonal) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int row = row0 + wrow + mt * 16 + g + (e / 2) * 8;
            const int col = col0 + nt * 8 + 2 * t + (e % 2);
            if (col >= p.nk || (p.causal && !mask.visible(row, col))) s[mt][nt][e] = neg_inf<float>();
          }
    }

    // Online softmax in base 2 (common/online_softmax.hpp): m_new = max(m, rowmax(S) * tau*log2e),
    // P = 2^(S * tau*log2e - m_new) in one FFMA + one ex2, O and l rescaled by 2^(m - m_new).
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {  // r = 0: row g, r = 1: row g + 8
        float mx = neg_inf<float>();
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * r], s[mt][nt][2 * r + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));  // the 4 lanes of a quad share a row
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m[mt][r], mx * p.scale_log2);
        const float shift = finite_max(m_new);  // an all-masked row shifts by 0, not -inf
        const float alpha = exp2_approx(m[mt][r] - shift);
        m[mt][r] = m_new;
        float rowsum = 0.f;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const float pv = exp2_approx(fmaf(s[mt][nt][2 * r + c], p.scale_log2, -shift));
            s[mt][nt][2 * r + c] = pv;
            rowsum += pv;
          }
        l[mt][r] = l[mt][r] * alpha + rowsum;  // partial over this thread's columns
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
          o[mt][dt][2 * r] *= alpha;
          o[mt][dt][2 * r + 1] *= alpha;
        }
      }

    mbarrier_wait(full_v, j & 1);  // V_j has arrived ...
    __syncthreads();     // ... for every thread, and every warp is done reading K_j
    if (threadIdx.x == 0 && j + 1 < n_blocks) {
      mbarrier_arrive_expect_tx(full_k, Bc * D * 2);
      load(sK, tm_k, Bc, (j + 1) * Bc, bhk, full_k);  // K_{j+1} streams in while O += P V_j runs
    }

    // O_i += P_ij V_j. P's accumulators are already the A fragments of the second product.
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        a[mt][0] = pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        a[mt][1] = pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        a[mt][2] = pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        a[mt][3] = pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < DT / 2; ++dp) {
        uint32_t bv[4];  // B = V_j (keys x dims), transposed on load: keys kk*16.., dims dp*16..
        ldmatrix_x4_trans(bv, v_frag.at(kk * 16, 2 * dp));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_m16n8k16<T>(o[mt][2 * dp], a[mt], bv[0], bv[1]);
          mma_m16n8k16<T>(o[mt][2 * dp + 1], a[mt], bv[2], bv[3]);
        }
      }
    }
  }
  if (n_blocks == 0) mbarrier_wait(full_k, 0);  // an empty tile: Q_i landed all the same

  // Epilogue: l_i = quad sum of the partial sums; O_i / l_i staged in sQ (swizzled, as Q
  // was), then written out 16 bytes at a time; LSE_i = (m_i + log2 l_i) * ln 2.
  __syncthreads();  // every warp is done reading sQ (its Q fragments)
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float lsum = l[mt][r];
      lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
      lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
      const float inv = lsum > 0.f ? 1.f / lsum : 0.f;  // an empty row's output is 0
      const int r_tile = wrow + mt * 16 + g + r * 8;
#pragma unroll
      for (int dt = 0; dt < DT; ++dt)
        *reinterpret_cast<uint32_t*>(sQ + swizzle<KC>(r_tile, dt) * 8 + 2 * t) =
            pack2<T>(o[mt][dt][2 * r] * inv, o[mt][dt][2 * r + 1] * inv);
      const int row = row0 + r_tile;
      if (t == 0 && row < p.nq) LSE[row] = lsum > 0.f ? Base2::lse(m[mt][r], lsum) : neg_inf<float>();
    }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < Br * KC / C::kThreads; ++k) {
    const int idx = threadIdx.x + k * C::kThreads;
    const int r = idx / KC, c = idx % KC;
    if (row0 + r < p.nq)
      *reinterpret_cast<uint4*>(O + std::size_t(row0 + r) * D + c * 8) =
          *reinterpret_cast<const uint4*>(sQ + swizzle<KC>(r, c) * 8);
  }
}

template <class T, class C>
PreparedStep prepare_cfg(const StepArgs& a) {
  const Problem& pr = a.problem;
  const CUtensorMapDataType ty = tma_type<T>();
  const uint64_t bhq = uint64_t(pr.batch) * pr.heads, bhk = uint64_t(pr.batch) * pr.kv_heads;
  const CUtensorMap tq = make_tensor_map_3d(a.q, ty, 2, C::D, pr.nq, bhq, 64, C::Br);
  const CUtensorMap tk = make_tensor_map_3d(a.k, ty, 2, C::D, pr.nk, bhk, 64, C::Bc);
  const CUtensorMap tv = make_tensor_map_3d(a.v, ty, 2, C::D, pr.nk, bhk, 64, C::Bc);
  CUDA_CHECK(cudaFuncSetAttribute(kernel<T, C>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes));
  const dim3 grid(ceil_div(pr.nq, C::Br), unsigned(bhq));
  const Fa3Params params = a.params;
  PreparedStep s;
  s.grid = int(grid.x * grid.y);
  s.smem_bytes = C::kSmemBytes;
  s.launch = [=] {
    kernel<T, C><<<grid, C::kThreads, C::kSmemBytes>>>(tq, tk, tv, params);
    CUDA_CHECK_LAUNCH("kernel");
  };
  return s;
}

template <class T>
PreparedStep prepare_dtype(const StepArgs& a) {
  switch (a.problem.d) {
    case 64: return prepare_cfg<T, Cfg<64, 4, 2, 128>>(a);    // Br 128, Bc 128, 48 KB smem
    case 128: return prepare_cfg<T, Cfg<128, 4, 2, 64>>(a);   // Br 128, Bc 64, 64 KB smem
    case 256: return prepare_cfg<T, Cfg<256, 8, 1, 64>>(a);   // Br 128, Bc 64, 128 KB smem
  }
  throw UsageError("chapter 05 v1: no kernel for head dim " + std::to_string(a.problem.d) + " (64, 128, 256)");
}

}  // namespace

PreparedStep prepare(const StepArgs& a) {
  if (a.problem.dtype == DType::bf16) return prepare_dtype<__nv_bfloat16>(a);
  if (a.problem.dtype == DType::f16) return prepare_dtype<__half>(a);
  throw UsageError("chapter 05 v1: bf16 or fp16 inputs only");
}

}  // namespace attn::ch05::v1
