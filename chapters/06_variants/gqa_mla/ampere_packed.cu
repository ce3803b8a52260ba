// Chapter 06, packed GQA for GPUs other than Hopper: chapter 04's forward step v9
// (steps/lab/v9_per_dim_tiles.cu) with the G query heads of one KV head packed on the rows
// of a tile, as packed_fwd.cu does for chapter 05's kernel.
//
//     diff chapters/04_fa2/steps/lab/v9_per_dim_tiles.cu chapters/06_variants/gqa_mla/ampere_packed.cu
//
// What changes from chapter 04's v9 (one idea: the packed view):
//
// 1. launch() hands the kernel the packed view: heads Hq -> Hkv, rows Nq -> G Nq. The G
//    heads hk G .. hk G + G-1 that read KV head hk are stored one after another, so for
//    one (batch, hk) their Q, O and LSE already are one [G Nq][d] matrix: the kernel's
//    pointers, its tile walk and its epilogue need nothing else, and a 128-row tile
//    holds up to 128 (head, position) rows whose K/V blocks it loads once. In the view
//    heads == kv_heads, so kv_head_of() maps "head" hk to KV head hk.
//
//        packed row m = (query head hk G + m / Nq, position m % Nq)
//
// 2. The kernel takes `pos_rows` (the problem's Nq): a row's causal limit uses its
//    position m % pos_rows, and so do the blocks a tile visits and the test for a
//    diagonal block. A tile inside one head holds positions pos_lo..pos_hi; one that
//    straddles two heads holds the end of one and the start of the next, so it visits
//    the blocks of positions 0..Nq-1 (each row still masks its own keys).
//
// With pack = false the view is the problem itself and the kernel is v9's. The header
// include is chapter 04's by path (chapter 04's FwdParams and launch convention).
#include "common/cuda/check.cuh"
#include "common/cuda/cp_async.cuh"
#include "common/cuda/fast_math.cuh"
#include "common/cuda/index.cuh"
#include "common/cuda/ldmatrix.cuh"
#include "common/cuda/mma_sync.cuh"
#include "common/cuda/smem_tiles.cuh"
#include "common/online_softmax.hpp"
// Chapter 04's FwdParams, by path: this kernel is its v9 with the packed view.
#include "chapters/04_fa2/fa2_kernels.cuh"

namespace attn::ch06::ampere_packed {
using attn::ch04::FwdParams;
namespace {
using namespace attn::cuda;

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
  static constexpr int kSmemBytes = (Br + 2 * Bc) * D * 2;  // sQ, sK, sV (16-bit elements)
};

template <class T, class C>
__global__ void __launch_bounds__(C::kThreads) fwd_kernel(const FwdParams p, const int pos_rows) {
  constexpr int D = C::D, MT = C::MT, Bc = C::Bc, Br = C::Br, NT = C::NT, DT = C::DT, KC = C::kChunks;
  extern __shared__ __align__(128) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);  // [Br][D]  Q_i, later O_i on its way out
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
  const int diag = causal_diag(pos_rows, p.nk);  // position i sees keys j <= i + diag (common/index.hpp)
  // The positions this tile's packed rows hold: pos_lo..pos_hi inside one head, every
  // position when the tile straddles two heads.
  const int last_row = min(row0 + Br, p.nq) - 1;
  const bool straddles = row0 / pos_rows != last_row / pos_rows;
  const int pos_lo = straddles ? 0 : row0 % pos_rows, pos_hi = straddles ? pos_rows - 1 : last_row % pos_rows;

  // Causal (chapter 03's block skipping; the rule j <= i + diag of common/index.hpp): K/V
  // blocks past the diagonal of the block's last row are never visited; blocks the
  // diagonal crosses are masked below, blocks left of it need no mask.
  //
  //          keys ->   j=0   j=1   j=2   j=3
  //   Q_i rows     |  full  full  diag  skip |
  //
  int n_end = p.nk;
  if (p.causal) n_end = min(p.nk, pos_hi + 1 + diag);
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
    const bool diagonal = p.causal && col0 + Bc - 1 > pos_lo + diag;  // not a full tile
    if (col0 + Bc > p.nk || diagonal) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int row = (row0 + wrow + mt * 16 + g + (e / 2) * 8) % pos_rows;  // its position
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
void launch_cfg(const FwdParams& p, int pos_rows, cudaStream_t s) {
  static const bool configured = [] {  // once per instantiation
    CUDA_CHECK(cudaFuncSetAttribute(fwd_kernel<T, C>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes));
    return true;
  }();
  (void)configured;
  const dim3 grid(ceil_div(p.nq, C::Br), p.batch * p.heads);
  fwd_kernel<T, C><<<grid, C::kThreads, C::kSmemBytes, s>>>(p, pos_rows);
}

template <class T>
bool launch_dtype(const FwdParams& p, int pos_rows, cudaStream_t s) {
  switch (p.d) {
    case 64: launch_cfg<T, Cfg<64, 4, 2, 128>>(p, pos_rows, s); return true;    // Br 128, Bc 128, 48 KB smem
    case 128: launch_cfg<T, Cfg<128, 4, 2, 64>>(p, pos_rows, s); return true;   // Br 128, Bc 64, 64 KB smem
    case 256: launch_cfg<T, Cfg<256, 8, 1, 64>>(p, pos_rows, s); return true;   // Br 128, Bc 64, 128 KB smem
    default: return false;
  }
}

}  // namespace

bool launch(const FwdParams& p, DType t, cudaStream_t s, bool pack) {
  // The packed view: G query heads x Nq rows of one KV head are one [G Nq][d] "head".
  const int g = pack ? p.heads / p.kv_heads : 1;
  FwdParams view = p;
  view.heads = p.heads / g;
  view.nq = p.nq * g;
  if (t == DType::bf16) return launch_dtype<__nv_bfloat16>(view, p.nq, s);
  if (t == DType::f16) return launch_dtype<__half>(view, p.nq, s);
  return false;
}

}  // namespace attn::ch06::ampere_packed
