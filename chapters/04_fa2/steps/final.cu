// Chapter 04, the final forward kernel: v6 with what the lab measured after it (from v6).
//
// The main path, each file a whole kernel (`diff` two neighbours to see one idea):
//
//   ../../03_fa1/fa1.cu        chapter 03: K/V outer, Q inner, (m, l, O) through HBM
//   v1_loop_swap.cu            Q outer, K/V inner, grid (Nq/Br, B*H): (m, l, O) stay on chip
//   v2_mma.cu                  tensor cores: mma.sync m16n8k16, Q split over 4 warps, P in registers
//   v3_ldmatrix_swizzle.cu     ldmatrix fragments from XOR-swizzled shared memory: no bank conflicts
//   v4_cp_async.cu             cp.async: K_{j+1} and V_j stream in while the other product runs
//   v5_heaviest_first.cu       causal: the query blocks with the most keys start first
//   v6_two_tiles_per_warp.cu   each warp owns 2 x 16 query rows (Br = 128): a K/V fragment feeds 2 mmas
// > final.cu                   one configuration table per head dim, fp16 too
//
// What changes from v6: the kernel's structure stays (Q_i outside, K_{j+1} and V_j streamed
// by cp.async under the two products, P kept in registers, heaviest query blocks first),
// and what the lab (steps/lab/, LAB.md) measured after v6 becomes one table, Cfg, read in
// launch_dtype(), a row per head dim:
//
//   d     warps x tiles   Br    Bc    O leaves through    smem     taken from
//   64    4 x 2           128   128   shared memory       48 KB    v9 (the wider key tile)
//   128   4 x 2           128    64   registers           64 KB    v7 (v6 + deferred row sums)
//   256   8 x 1           128    64   shared memory      128 KB    v9 (two tiles a warp would need
//                                                                    2 x 128 O accumulators a thread)
//
// Every row keeps v7's row sums: each thread's partial sum, rescaled with the row and added
// across the quad once, in the epilogue. The column kSmemO chooses the epilogue: through
// the Q tile in shared memory and out in 16-byte rows (v8), or straight from the
// accumulators, 4 bytes a store (v7); an `if constexpr` on it is the only place the code
// differs. fp16 runs the same kernel as bf16 (mma_m16n8k16<__half>, pack2<__half>).
//
// Each row compiles to the machine code of the step it is taken from (sm_90,
// scripts/same_machine_code.py --pair): d = 128 to v7's kernel, d = 64 and 256 to v9's.
#include "common/cuda/check.cuh"
#include "common/cuda/cp_async.cuh"
#include "common/cuda/fast_math.cuh"
#include "common/cuda/index.cuh"
#include "common/cuda/ldmatrix.cuh"
#include "common/cuda/mma_sync.cuh"
#include "common/cuda/smem_tiles.cuh"
#include "common/online_softmax.hpp"
#include "fa2_kernels.cuh"

namespace attn::ch04::final_fwd {
namespace {
using namespace attn::cuda;

/// One row of the configuration table.
///   Br = kWarps * 16 * MT query rows per thread block (warp w owns rows [w*16*MT, (w+1)*16*MT))
///   Bc keys per K/V tile; D head dim; kSmemO: O leaves through shared memory (else from registers).
template <int D_, int kWarps_, int MT_, int Bc_, bool kSmemO_>
struct Cfg {
  static constexpr int D = D_, kWarps = kWarps_, MT = MT_, Bc = Bc_;
  static constexpr bool kSmemO = kSmemO_;
  static constexpr int Br = kWarps * 16 * MT;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kChunks = D / 8;  // 16-byte chunks per row of a tile
  static constexpr int NT = Bc / 8;      // n8 tiles of S per 16-row tile
  static constexpr int DT = D / 8;       // n8 tiles of O per 16-row tile
  static constexpr int kSmemBytes = (Br + 2 * Bc) * D * 2;  // sQ, sK, sV (16-bit elements)
};

template <class T, class C>
__global__ void __launch_bounds__(C::kThreads) fwd_kernel(const FwdParams p) {
  constexpr int D = C::D, MT = C::MT, Bc = C::Bc, Br = C::Br, NT = C::NT, DT = C::DT, KC = C::kChunks;
  extern __shared__ __align__(128) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);  // [Br][D]  Q_i (with kSmemO, later O_i on its way out)
  T* sK = sQ + Br * D;                 // [Bc][D]  K_j
  T* sV = sK + Bc * D;                 // [Bc][D]  V_j

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;  // mma fragment coordinates (common/cuda/mma_sync.cuh)
  // Causal: the last query blocks see the most keys; start them first.
  const int i_blk = p.causal ? int(gridDim.x) - 1 - int(blockIdx.x) : int(blockIdx.x);
  const int bh = blockIdx.y, b = bh / p.heads, h = bh % p.heads;
  const int hk = kv_head_of(h, p.heads, p.kv_heads);
  const T* Q = static_cast<const T*>(p.q) + std::size_t(bh) * p.nq * D;
  const T* K = static_cast<const T*>(p.k) + (std::size_t(b) * p.kv_heads + hk) * p.nk * D;
  const T* V = static_cast<const T*>(p.v) + (std::size_t(b) * p.kv_heads + hk) * p.nk * D;
  T* O = static_cast<T*>(p.o) + std::size_t(bh) * p.nq * D;
  float* LSE = p.lse + std::size_t(bh) * p.nq;
  const int row0 = i_blk * Br;          // first query row of Q_i
  const int wrow = warp * 16 * MT;      // first row of this warp within Q_i
  const int diag = causal_diag(p.nq, p.nk);  // row i sees keys j <= i + diag (common/index.hpp)

  // Causal (chapter 03's block skipping; the rule j <= i + diag of common/index.hpp): K/V
  // blocks past the diagonal of the block's last row are never visited; blocks the
  // diagonal crosses are masked below, blocks left of it need no mask.
  //
  //          keys ->   j=0   j=1   j=2   j=3
  //   Q_i rows     |  full  full  diag  skip |
  //
  int n_end = p.nk;
  if (p.causal) n_end = min(p.nk, min(row0 + Br, p.nq) + diag);
  const int n_blocks = n_end > 0 ? ceil_div(n_end, Bc) : 0;

  const uint32_t aQ = smem_u32(sQ), aK = smem_u32(sK), aV = smem_u32(sV);
  load_tile<Br, D, C::kThreads>(aQ, Q, row0, p.nq);
  if (n_blocks > 0) load_tile<Bc, D, C::kThreads>(aK, K, 0, p.nk);
  cp_async_commit();
  // ldmatrix addresses (common/cuda/smem_tiles.cuh): A = Q rows wrow + lane%16 at chunks 2kk + lane/16;
  // B = K rows (lane/16)*8 + lane%8 at chunks 2kk + (lane/8)%2; B = V rows lane%8 +
  // ((lane/8)%2)*8 at chunks 2dp + lane/16, transposed on load.
  const SwizzledLane<KC> q_frag(aQ, wrow + lane % 16, lane / 16);
  const SwizzledLane<KC> k_frag(aK, (lane / 16) * 8 + lane % 8, (lane / 8) % 2);
  const SwizzledLane<KC> v_frag(aV, lane % 8 + ((lane / 8) % 2) * 8, lane / 16);

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
    cp_async_wait<0>();  // K_j (and, the first time, Q_i) have arrived ...
    __syncthreads();     // ... for every thread, and every warp is done with V_{j-1}
    load_tile<Bc, D, C::kThreads>(aV, V, j * Bc, p.nk);  // V_j streams in while S = Q_i K_j^T runs
    cp_async_commit();

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
    const bool diagonal = p.causal && col0 + Bc - 1 > row0 + diag;  // not a full tile
    if (col0 + Bc > p.nk || diagonal) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int row = row0 + wrow + mt * 16 + g + (e / 2) * 8;
            const int col = col0 + nt * 8 + 2 * t + (e % 2);
            if (col >= p.nk || (p.causal && col > row + diag)) s[mt][nt][e] = neg_inf<float>();
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

    cp_async_wait<0>();  // V_j has arrived ...
    __syncthreads();     // ... for every thread, and every warp is done reading K_j
    if (j + 1 < n_blocks) {
      load_tile<Bc, D, C::kThreads>(aK, K, (j + 1) * Bc, p.nk);  // K_{j+1} streams in while O += P V_j runs
      cp_async_commit();
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
  cp_async_wait<0>();

  if constexpr (C::kSmemO) {
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
  } else {
    // Epilogue: l_i = quad sum of the partial sums; O_i / l_i straight from the
    // accumulators (4 bytes per store) and LSE_i = (m_i + log2 l_i) * ln 2.
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float lsum = l[mt][r];
        lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
        lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
        const float inv = lsum > 0.f ? 1.f / lsum : 0.f;  // an empty row's output is 0
        const int row = row0 + wrow + mt * 16 + g + r * 8;
        if (row >= p.nq) continue;
#pragma unroll
        for (int dt = 0; dt < DT; ++dt)
          *reinterpret_cast<uint32_t*>(O + std::size_t(row) * D + dt * 8 + 2 * t) =
              pack2<T>(o[mt][dt][2 * r] * inv, o[mt][dt][2 * r + 1] * inv);
        if (t == 0) LSE[row] = lsum > 0.f ? Base2::lse(m[mt][r], lsum) : neg_inf<float>();
      }
  }
}

template <class T, class C>
void launch_cfg(const FwdParams& p, cudaStream_t s) {
  static const bool configured = [] {  // once per instantiation
    CUDA_CHECK(cudaFuncSetAttribute(fwd_kernel<T, C>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes));
    return true;
  }();
  (void)configured;
  const dim3 grid(ceil_div(p.nq, C::Br), p.batch * p.heads);
  fwd_kernel<T, C><<<grid, C::kThreads, C::kSmemBytes, s>>>(p);
}

template <class T>
bool launch_dtype(const FwdParams& p, cudaStream_t s) {
  switch (p.d) {
    //                         D    warps  MT  Bc   kSmemO
    case 64: launch_cfg<T, Cfg<64,  4,     2,  128, true>>(p, s); return true;    // v9's row: 48 KB smem
    case 128: launch_cfg<T, Cfg<128, 4,    2,  64,  false>>(p, s); return true;   // v7's row: 64 KB smem
    case 256: launch_cfg<T, Cfg<256, 8,    1,  64,  true>>(p, s); return true;    // v9's row: 128 KB smem
    default: return false;
  }
}

}  // namespace

bool launch(const FwdParams& p, DType t, cudaStream_t s) {
  if (t == DType::bf16) return launch_dtype<__nv_bfloat16>(p, s);
  if (t == DType::f16) return launch_dtype<__half>(p, s);
  return false;
}

}  // namespace attn::ch04::final_fwd
