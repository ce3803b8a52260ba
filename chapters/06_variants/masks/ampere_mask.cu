// Chapter 06 - masks on sm_80+: chapter 04's forward step v9 with a mask policy.
//
//   ../../04_fa2/steps/lab/v9_per_dim_tiles.cu   chapter 04's v9 (this file's parent)
// > ampere_mask.cu                               + the policy: block map, keep, score, sink
//
// `diff ../../04_fa2/steps/lab/v9_per_dim_tiles.cu ampere_mask.cu` shows the policy going
// in, and nothing else. What changes (masks/mask_policy.hpp has the interface):
//
//   1. The kernel takes a Policy (a template parameter, passed by value). Its key loop
//      walks the block map's lists for this query block, partial tiles first, instead
//      of keys [0, causal_key_end): skipped tiles are never loaded.
//   2. The element mask runs on partial tiles only, as keep(b, h, i, j); full tiles
//      have no mask arithmetic at all (chapter 04 masked the ragged and diagonal blocks).
//   3. With Policy::kScore, S becomes score(tau S) log2(e) before the softmax (ALiBi,
//      softcap); the online softmax then runs with scale 1.
//   4. With Policy::kSink, each row starts from the sink's state (m, l) = (sink, 1)
//      (SoftmaxState::with_sink; the 1 is counted once per row, in lane t = 0).
//   5. One grid entry per (batch, head, query block), in the map's order (most kept
//      tiles first): the heaviest-first rule of chapter 04's v5, for any mask.
//   6. Rows are `ld` elements apart (load_tile_ld, strided stores): the packed varlen
//      layout [tokens][heads][d] of document masking.
//   7. d = 128 and bf16 only, one instantiation per policy (mask_kernels.cuh).
#include "common/cuda/check.cuh"
#include "common/cuda/cp_async.cuh"
#include "common/cuda/fast_math.cuh"
#include "common/cuda/index.cuh"
#include "common/cuda/ldmatrix.cuh"
#include "common/cuda/mma_sync.cuh"
#include "common/cuda/smem_tiles.cuh"
#include "common/online_softmax.hpp"
#include "masks/mask_kernels.cuh"
#include "masks/mask_policy.hpp"

namespace attn::ch06::ampere_mask {
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

template <class T, class C, class Policy>
__global__ void __launch_bounds__(C::kThreads) fwd_kernel(const FwdParams p, const Policy pol) {
  constexpr int D = C::D, MT = C::MT, Bc = C::Bc, Br = C::Br, NT = C::NT, DT = C::DT, KC = C::kChunks;
  extern __shared__ __align__(128) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);  // [Br][D]  Q_i, later O_i on its way out
  T* sK = sQ + Br * D;                 // [Bc][D]  K_j
  T* sV = sK + Bc * D;                 // [Bc][D]  V_j

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;  // mma fragment coordinates (common/cuda/mma_sync.cuh)
  // The map's order: the query blocks with the most kept tiles start first.
  const int item = p.map.order[blockIdx.x], i_blk = item % p.map.outer;
  const int bh = item / p.map.outer, b = bh / p.heads, h = bh % p.heads;
  const int hk = kv_head_of(h, p.heads, p.kv_heads);
  const T* Q = static_cast<const T*>(p.q) + p.sq.at(b, h);
  const T* K = static_cast<const T*>(p.k) + p.sk.at(b, hk);
  const T* V = static_cast<const T*>(p.v) + p.sv.at(b, hk);
  T* O = static_cast<T*>(p.o) + p.so.at(b, h);
  float* LSE = p.lse + std::size_t(bh) * p.nq;  // [B][H][N] in every layout
  const int row0 = i_blk * Br;          // first query row of Q_i
  const int wrow = warp * 16 * MT;      // first row of this warp within Q_i

  // The block map (masks/block_map.hpp): the K/V blocks of this query block that
  // have work, partial ones first; only those are ever loaded. Each index is read one
  // block ahead, so that its load never stalls the block that needs it.
  //
  //          keys ->   j=0   j=1   j=2   j=3
  //   Q_i rows     |  full  skip  part  skip |   ->  part = {2}, full = {0}
  //
  const int owner = p.map.owner(b, h, i_blk);
  const int n_part = p.map.n_part[owner], n_blocks = n_part + p.map.n_full[owner];
  const int* part = p.map.part + std::size_t(owner) * p.map.inner;
  const int* full = p.map.full + std::size_t(owner) * p.map.inner;
  auto key_block = [&](int n) { return n < n_part ? part[n] : full[n - n_part]; };

  const uint32_t aQ = smem_u32(sQ), aK = smem_u32(sK), aV = smem_u32(sV);
  load_tile_ld<Br, D, C::kThreads>(aQ, Q, row0, p.nq, p.sq.row);
  if (n_blocks > 0) load_tile_ld<Bc, D, C::kThreads>(aK, K, key_block(0) * Bc, p.nk, p.sk.row);
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
    // A learnable sink: every row starts from the sink's state (sink, 1), its 1 in lane t = 0.
    m[mt][0] = m[mt][1] = Policy::kSink ? pol.sink(h) * float(kLog2e) : neg_inf<float>();
    l[mt][0] = l[mt][1] = Policy::kSink && t == 0 ? 1.f : 0.f;
  }

  int j_next = n_blocks > 0 ? key_block(0) : 0;  // the map's next index, read one step ahead
  for (int n = 0; n < n_blocks; ++n) {
    const int j = j_next;
    j_next = n + 1 < n_blocks ? key_block(n + 1) : 0;  // in flight while S = Q_i K_j^T runs
    cp_async_wait<0>();  // K_j (and, the first time, Q_i) have arrived ...
    __syncthreads();     // ... for every thread, and every warp is done with V_{j-1}
    load_tile_ld<Bc, D, C::kThreads>(aV, V, j * Bc, p.nk, p.sv.row);  // V_j streams in while S = Q_i K_j^T runs
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

    // The score modifier (ALiBi, softcap): S becomes score(tau S) log2(e), base-2 units.
    const int col0 = j * Bc;
    if constexpr (Policy::kScore) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int row = row0 + wrow + mt * 16 + g + (e / 2) * 8;
            const int col = col0 + nt * 8 + 2 * t + (e % 2);
            s[mt][nt][e] = pol.score(s[mt][nt][e] * p.scale, b, h, row, col) * float(kLog2e);
          }
    }
    // The element mask, on partial tiles only (the ragged last block is always partial).
    if (n < n_part) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int row = row0 + wrow + mt * 16 + g + (e / 2) * 8;
            const int col = col0 + nt * 8 + 2 * t + (e % 2);
            if (col >= p.nk || row >= p.nq || !pol.keep(b, h, row, col)) s[mt][nt][e] = neg_inf<float>();
          }
    }
    const float scale_log2 = Policy::kScore ? 1.f : p.scale_log2;  // score() has applied tau log2(e)

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
        const float m_new = fmaxf(m[mt][r], mx * scale_log2);
        const float shift = finite_max(m_new);  // an all-masked row shifts by 0, not -inf
        const float alpha = exp2_approx(m[mt][r] - shift);
        m[mt][r] = m_new;
        float rowsum = 0.f;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const float pv = exp2_approx(fmaf(s[mt][nt][2 * r + c], scale_log2, -shift));
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
    if (n + 1 < n_blocks) {
      load_tile_ld<Bc, D, C::kThreads>(aK, K, j_next * Bc, p.nk, p.sk.row);  // K_{j+1} streams in while O += P V_j runs
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
      *reinterpret_cast<uint4*>(O + (row0 + r) * p.so.row + c * 8) =
          *reinterpret_cast<const uint4*>(sQ + swizzle<KC>(r, c) * 8);
  }
}

template <class T, class C, class Policy>
void launch_cfg(const FwdParams& p, const Policy& pol, cudaStream_t s) {
  static const bool configured = [] {  // once per instantiation
    CUDA_CHECK(cudaFuncSetAttribute(fwd_kernel<T, C, Policy>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes));
    return true;
  }();
  (void)configured;
  const dim3 grid(p.map.outer * p.batch * p.heads);  // one entry of the map's order each
  fwd_kernel<T, C, Policy><<<grid, C::kThreads, C::kSmemBytes, s>>>(p, pol);
}

}  // namespace

bool launch(const FwdParams& p, const MaskSpec& spec, const Problem& prob, const PolicyData& d, cudaStream_t s) {
  if (prob.dtype != DType::bf16 || p.d != 128) return false;
  using C = Cfg<128, 4, 2, 64>;  // chapter 04's d = 128 tiles: Br 128, Bc 64, 64 KB smem
  static_assert(C::Br == Br && C::Bc == Bc, "the block map is built for these tiles");
  visit_policy(spec, prob, d, [&](const auto& pol) {
    launch_cfg<__nv_bfloat16, C>(p, pol, s);
    return 0;
  });
  return true;
}

}  // namespace attn::ch06::ampere_mask
