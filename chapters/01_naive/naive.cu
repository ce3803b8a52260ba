// Chapter 01 - naive attention on the GPU: three kernels, S and P in HBM.
//
//   kernel 1  gemm_tiled       S = tau * Q K^T    (Nq x Nk fp32 written to HBM)
//   kernel 2  softmax_rows     P = softmax(S)     (3 passes over each row of S)
//   kernel 3  gemm_tiled       O = P V            (P read back from HBM)
//
// and the same pipeline with cuBLAS GEMMs for kernels 1 and 3, to show that even
// the best GEMM cannot save a pipeline that moves N^2 bytes.
//
// Layout: Q, O [B][Hq][N][d]; K, V [B][Hkv][N][d]; S, P [B][Hq][Nq][Nk] (see problem.hpp).
#include <cublas_v2.h>

#include <vector>

#include "common/cuda/buffer.cuh"
#include "common/cuda/check.cuh"
#include "common/cuda/index.cuh"
#include "common/cuda/timing.cuh"
#include "common/cuda/types.cuh"
#include "common/online_softmax.hpp"
#include "naive_gpu.hpp"
#include "naive_model.hpp"

namespace attn::ch01 {
namespace {

/// Which (batch, head) a blockIdx.z works on, and where its operands start.
/// A and C are per query head; B is per KV head (GQA: query head h reads h / group).
struct Batch {
  int heads, group, kv_heads;
  std::size_t a_stride, b_stride, c_stride;
  __device__ void offsets(int z, std::size_t* a, std::size_t* b, std::size_t* c) const {
    const int bi = z / heads, h = z % heads;
    *a = std::size_t(z) * a_stride;
    *b = (std::size_t(bi) * kv_heads + h / group) * b_stride;
    *c = std::size_t(z) * c_stride;
  }
};

constexpr int BM = 64, BN = 64, BK = 16;  // C tile and reduction slice (GemmTiles in naive_model.hpp)
constexpr int TM = 4, TN = 4;              // outputs per thread: 16 x 16 threads x (4 x 4) = 64 x 64

// Kernel 1 and 3: a classic shared-memory tiled GEMM with 4 x 4 register blocking.
//
//   C (M x N) = alpha * A (M x K) * B            B stored K x N   (kBTrans = false)
//   C (M x N) = alpha * A (M x K) * B^T          B stored N x K   (kBTrans = true)
//
//             BN = 64 columns of C
//        +---------------------------+
//        | t0  t1  ...          t15  |  thread (tx, ty) owns rows ty*4..ty*4+3
//   BM   | t16 ...                   |  and columns tx*4..tx*4+3 of the C tile
//   = 64 |  ...                      |  (acc[4][4] in registers)
//        | t240 ...             t255 |
//        +---------------------------+
//
// Each step stages a BK-deep slice of A (BM x BK) and B (BK x BN) in shared memory,
// transposing A so that the inner loop reads both with the k index first.
template <class TA, class TB, class TC, bool kBTrans>
__global__ void __launch_bounds__(256) gemm_tiled(const TA* __restrict__ A, const TB* __restrict__ B,
                                                  TC* __restrict__ C, int M, int N, int K, float alpha,
                                                  Batch batch) {
  __shared__ float As[BK][BM];  // As[k][m] = A[m0 + m][k0 + k]
  __shared__ float Bs[BK][BN];  // Bs[k][n] = B(k0 + k, n0 + n)
  std::size_t a_off, b_off, c_off;
  batch.offsets(blockIdx.z, &a_off, &b_off, &c_off);
  A += a_off;
  B += b_off;
  C += c_off;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  float acc[TM][TN] = {};

  for (int k0 = 0; k0 < K; k0 += BK) {
    // Stage A: consecutive threads read consecutive k of one row (coalesced in K).
    for (int e = threadIdx.x; e < BM * BK; e += blockDim.x) {
      const int m = e / BK, k = e % BK;
      const bool in = m0 + m < M && k0 + k < K;
      As[k][m] = in ? to_float(A[std::size_t(m0 + m) * K + k0 + k]) : 0.f;
    }
    // Stage B, coalesced along whichever dimension is contiguous in memory.
    for (int e = threadIdx.x; e < BN * BK; e += blockDim.x) {
      if (kBTrans) {
        const int n = e / BK, k = e % BK;
        const bool in = n0 + n < N && k0 + k < K;
        Bs[k][n] = in ? to_float(B[std::size_t(n0 + n) * K + k0 + k]) : 0.f;
      } else {
        const int k = e / BN, n = e % BN;
        const bool in = n0 + n < N && k0 + k < K;
        Bs[k][n] = in ? to_float(B[std::size_t(k0 + k) * N + n0 + n]) : 0.f;
      }
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < BK; ++k) {
      float a[TM], b[TN];
#pragma unroll
      for (int i = 0; i < TM; ++i) a[i] = As[k][ty * TM + i];
#pragma unroll
      for (int j = 0; j < TN; ++j) b[j] = Bs[k][tx * TN + j];
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int m = m0 + ty * TM + i;
    if (m >= M) continue;
#pragma unroll
    for (int j = 0; j < TN; ++j) {
      const int n = n0 + tx * TN + j;
      if (n < N) C[std::size_t(m) * N + n] = from_float<TC>(alpha * acc[i][j]);
    }
  }
}

constexpr int kThreads = kSoftmaxThreads;  // one block of 256 threads per row
constexpr int kWarps = kThreads / 32;

/// Max over the block: a warp-shuffle tree inside each warp, then warp 0 combines
/// the eight warp maxima from shared memory. Every thread gets the result.
__device__ float block_max(float x) {
  __shared__ float warp_max[kWarps];
  // EXERCISE ch01.4: reduce x to the maximum over the warp with __shfl_xor_sync
  //| // TODO: your code here (x must end as the max over all 32 lanes)
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  // END EXERCISE
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_max[warp] = x;
  __syncthreads();
  // Every warp reduces the eight partial maxima again, over all 32 lanes (lanes 8..31
  // hold the identity), so that every thread of the block ends with the same m_i.
  x = lane < kWarps ? warp_max[lane] : neg_inf<float>();
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  __syncthreads();  // warp_max is reused by the next call
  return x;
}

__device__ float block_sum(float x) {
  __shared__ float warp_sum[kWarps];
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_sum[warp] = x;
  __syncthreads();
  x = lane < kWarps ? warp_sum[lane] : 0.f;
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  __syncthreads();
  return x;
}

// Kernel 2: the safe softmax of one row of S per thread block, in three passes over HBM:
//   pass 1  m_i = max_j S_ij                    reads the row
//   pass 2  l_i = sum_j exp(S_ij - m_i)         reads it again
//   pass 3  P_ij = exp(S_ij - m_i) / l_i        reads it a third time, writes P
// The causal mask is applied as the scores are read. An empty row (every key
// masked) gets P = 0 and LSE = -inf: the shift goes through finite_max().
template <class TP>
__global__ void __launch_bounds__(kThreads) softmax_rows(const float* __restrict__ S, TP* __restrict__ P,
                                                         float* __restrict__ lse, int nq, int nk, int causal_offset,
                                                         bool causal) {
  const std::size_t row = blockIdx.x;
  const int i = int(row % nq);
  const float* s = S + row * nk;
  TP* prob = P + row * nk;
  // Keys j > i + (nk - nq) are hidden (bottom-right aligned causal mask).
  const int last_visible = causal ? i + causal_offset : nk - 1;
  auto score = [&](int j) { return j <= last_visible ? s[j] : neg_inf<float>(); };

  float m = neg_inf<float>();
  for (int j = threadIdx.x; j < nk; j += kThreads) m = fmaxf(m, score(j));
  m = block_max(m);
  const float shift = finite_max(m);

  float l = 0.f;
  for (int j = threadIdx.x; j < nk; j += kThreads) l += __expf(score(j) - shift);
  l = block_sum(l);

  const float inv_l = l > 0.f ? 1.f / l : 0.f;
  for (int j = threadIdx.x; j < nk; j += kThreads) prob[j] = from_float<TP>(__expf(score(j) - shift) * inv_l);
  if (threadIdx.x == 0) lse[row] = l > 0.f ? m + __logf(l) : neg_inf<float>();
}

void cublas_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw CudaError(std::string(what) + " failed: cuBLAS status " + std::to_string(int(s)));
}

cudaDataType_t cublas_type(DType t) {
  return t == DType::f32 ? CUDA_R_32F : t == DType::f16 ? CUDA_R_16F : CUDA_R_16BF;
}

/// Device pointers of each (batch, head)'s operand, for cublasGemmBatchedEx.
DeviceBuffer<void*> pointer_array(const Problem& p, const void* base, std::size_t stride, int elem_bytes,
                                  bool per_kv_head) {
  std::vector<void*> h;
  for (int b = 0; b < p.batch; ++b)
    for (int hq = 0; hq < p.heads; ++hq) {
      const std::size_t idx = per_kv_head ? std::size_t(b) * p.kv_heads + p.kv_head_of(hq)
                                          : std::size_t(b) * p.heads + hq;
      h.push_back(const_cast<char*>(static_cast<const char*>(base)) + idx * stride * elem_bytes);
    }
  DeviceBuffer<void*> d(h.size());
  d.upload(h);
  return d;
}

}  // namespace

const char* pipeline_name(Pipeline p) { return p == Pipeline::cublas ? "cuBLAS" : "hand-written"; }

double naive_device_bytes(const Problem& p, Pipeline which) {
  const double e = dtype_bytes(p.dtype);
  const double p_bytes = which == Pipeline::cublas ? e : 4.0;
  return e * double(p.q_elems() + p.k_elems() + p.v_elems() + p.o_elems()) + 4.0 * double(p.lse_elems()) +
         4.0 * double(p.s_elems()) + p_bytes * double(p.s_elems());
}

GpuForward naive_forward_gpu(const Problem& p, const AttnInputs& in, Pipeline which, bool time) {
  GpuForward r;
  const DeviceTensor q = DeviceTensor::from_host(in.q, p.dtype), k = DeviceTensor::from_host(in.k, p.dtype),
                     v = DeviceTensor::from_host(in.v, p.dtype);
  DeviceTensor o(p.dtype, p.o_elems());
  DeviceBuffer<float> lse(p.lse_elems()), S(p.s_elems());
  // The hand-written pipeline keeps P in fp32; cuBLAS needs both operands of P V in one type.
  DeviceTensor P(which == Pipeline::cublas ? p.dtype : DType::f32, p.s_elems());
  const float tau = float(p.softmax_scale());
  const int bh = p.batch * p.heads;
  const std::size_t nn = std::size_t(p.nq) * p.nk;

  cublasHandle_t handle = nullptr;
  DeviceBuffer<void*> qa, ka, sa, pa, va, oa;
  auto in_ptrs = [](const DeviceBuffer<void*>& a) { return reinterpret_cast<const void* const*>(a.get()); };
  if (which == Pipeline::cublas) {
    cublas_check(cublasCreate(&handle), "cublasCreate");
    const int e = dtype_bytes(p.dtype);
    qa = pointer_array(p, q.data(), std::size_t(p.nq) * p.d, e, false);
    ka = pointer_array(p, k.data(), std::size_t(p.nk) * p.d, e, true);
    sa = pointer_array(p, S.get(), nn, 4, false);
    pa = pointer_array(p, P.data(), nn, e, false);
    va = pointer_array(p, v.data(), std::size_t(p.nk) * p.dv, e, true);
    oa = pointer_array(p, o.data(), std::size_t(p.nq) * p.dv, e, false);
  }

  dispatch_dtype(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    const dim3 block(256);
    auto qk = [&] {
      if (which == Pipeline::handwritten) {
        const Batch bt{p.heads, p.group(), p.kv_heads, std::size_t(p.nq) * p.d, std::size_t(p.nk) * p.d, nn};
        const dim3 grid(cuda::ceil_div(p.nk, BN), cuda::ceil_div(p.nq, BM), bh);
        gemm_tiled<T, T, float, true><<<grid, block>>>(q.as<T>(), k.as<T>(), S.get(), p.nq, p.nk, p.d, tau, bt);
        CUDA_CHECK_LAUNCH("gemm_tiled (S = tau Q K^T)");
      } else {
        // Row-major S (Nq x Nk) = Q K^T is column-major S^T = K Q^T: op(K) = T, op(Q) = N.
        const float zero = 0.f;
        cublas_check(cublasGemmBatchedEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, p.nk, p.nq, p.d, &tau, in_ptrs(ka),
                                         cublas_type(p.dtype), p.d, in_ptrs(qa), cublas_type(p.dtype), p.d, &zero,
                                         sa.get(), CUDA_R_32F, p.nk, bh,
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     "cublasGemmBatchedEx (S = tau Q K^T)");
      }
    };
    auto softmax = [&] {
      const int diag = cuda::causal_diag(p.nq, p.nk);
      if (which == Pipeline::handwritten)
        softmax_rows<float><<<unsigned(bh) * p.nq, kThreads>>>(S.get(), P.as<float>(), lse.get(), p.nq, p.nk, diag,
                                                               p.causal);
      else
        softmax_rows<T><<<unsigned(bh) * p.nq, kThreads>>>(S.get(), P.as<T>(), lse.get(), p.nq, p.nk, diag, p.causal);
      CUDA_CHECK_LAUNCH("softmax_rows");
    };
    auto pv = [&] {
      if (which == Pipeline::handwritten) {
        const Batch bt{p.heads, p.group(), p.kv_heads, nn, std::size_t(p.nk) * p.dv, std::size_t(p.nq) * p.dv};
        const dim3 grid(cuda::ceil_div(p.dv, BN), cuda::ceil_div(p.nq, BM), bh);
        gemm_tiled<float, T, T, false><<<grid, block>>>(P.as<float>(), v.as<T>(), o.as<T>(), p.nq, p.dv, p.nk, 1.f, bt);
        CUDA_CHECK_LAUNCH("gemm_tiled (O = P V)");
      } else {
        // Row-major O (Nq x dv) = P V is column-major O^T = V^T P^T: both op N.
        const float one = 1.f, zero = 0.f;
        cublas_check(cublasGemmBatchedEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, p.dv, p.nq, p.nk, &one, in_ptrs(va),
                                         cublas_type(p.dtype), p.dv, in_ptrs(pa), cublas_type(p.dtype), p.nk, &zero,
                                         oa.get(), cublas_type(p.dtype), p.dv, bh,
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     "cublasGemmBatchedEx (O = P V)");
      }
    };

    // The checked run: every output poisoned first, so an unwritten element is NaN.
    o.poison();
    lse.poison();
    S.poison();
    P.poison();
    qk();
    softmax();
    pv();
    CUDA_CHECK(cudaDeviceSynchronize());
    r.o = o.to_host();
    const std::vector<float> l = lse.download();
    r.lse.assign(l.begin(), l.end());

    if (time) {
      r.time_ms = time_gpu([&] { qk(); softmax(); pv(); }).median_ms;
      r.qk_ms = time_gpu(qk).median_ms;
      r.softmax_ms = time_gpu(softmax).median_ms;
      r.pv_ms = time_gpu(pv).median_ms;
    }
  });
  if (handle) cublasDestroy(handle);
  return r;
}

void softmax_rows_gpu(const Problem& p, const std::vector<float>& s, std::vector<float>* prob,
                      std::vector<float>* lse) {
  const std::size_t rows = s.size() / p.nk;
  DeviceBuffer<float> S(s.size()), P(s.size()), L(rows);
  S.upload(s);
  P.poison();
  L.poison();
  const int diag = cuda::causal_diag(p.nq, p.nk);
  softmax_rows<float><<<unsigned(rows), kThreads>>>(S.get(), P.get(), L.get(), p.nq, p.nk, diag, p.causal);
  CUDA_CHECK_LAUNCH("softmax_rows");
  CUDA_CHECK(cudaDeviceSynchronize());
  *prob = P.download();
  *lse = L.download();
}

}  // namespace attn::ch01
