// Chapter 05's host side: uploads a problem, prepares the step's kernel, runs it once
// for the check (outputs poisoned first) and times it.
#include <cublasLt.h>

#include <algorithm>
#include <memory>

#include "common/cuda/buffer.cuh"
#include "common/cuda/check.cuh"
#include "common/cuda/device_problem.cuh"
#include "common/cuda/timing.cuh"
#include "common/cuda/types.cuh"
#include "common/device.hpp"
#include "common/errors.hpp"
#include "fa3_gpu.hpp"
#include "fp8_prepare.cuh"
#include "step_args.cuh"
#include "step_launch.cuh"

namespace attn::ch05 {

bool hopper_ready(std::string* why) {
  std::string reason;
  const auto dev = query_device(&reason);
  if (!dev) {
    if (why) *why = reason;
    return false;
  }
  if (!hopper_device(*dev, "chapter 05", why)) {
    if (why) *why += ": GPU rows skipped";
    return false;
  }
  return true;
}

namespace {

PreparedStep prepare_step(Step s, const StepArgs& a) {
  if (!step_built(s)) throw UsageError(std::string(step_name(s)) + " is a lab step: configure with -DTUTORIAL_LAB=ON");
  switch (s) {
    case Step::v1_tma: return v1::prepare(a);
    case Step::v2_wgmma: return v2::prepare(a);
    case Step::v3_warp_specialized: return v3::prepare(a);
    case Step::v4_pingpong: return v4::prepare(a);
    case Step::v5_intra_overlap: return v5::prepare(a);
    case Step::v6_masked_first: return v6::prepare(a);
    case Step::v7_persistent: return v7::prepare(a);
    case Step::v8_head_dims: return v8::prepare(a);
    case Step::final_fwd: return final_fwd::prepare(a);
    case Step::final_fp8: return final_fp8::prepare(a);
#if TUTORIAL_LAB
    case Step::v9_fp8: return v9::prepare(a);
    case Step::v10_tile_sizes: return v10::prepare(a);
    case Step::v11_two_pipe_exp: return v11::prepare(a);
    case Step::v12_fp8_two_pipes: return v12::prepare(a);
    case Step::v13_dynamic_tiles: return v13::prepare(a);
    case Step::v14_three_consumers: return v14::prepare(a);
    case Step::v15_fp8_lazy_rescale: return v15::prepare(a);
    case Step::v16_causal_grid: return v16::prepare(a);
    case Step::v17_causal_key_blocks: return v17::prepare(a);
    case Step::v18_causal_blocks_registers: return v18::prepare(a);
    case Step::v19_causal_grid_wide_blocks: return v19::prepare(a);
    case Step::v20_exp_one_in_eight: return v20::prepare(a);
    case Step::v21_softmax_chains: return v21::prepare(a);
    case Step::v22_three_consumers_chains: return v22::prepare(a);
    case Step::v23_descriptors_by_addition: return v23::prepare(a);
    case Step::v24_causal_l2_sections: return v24::prepare(a);
    case Step::v25_three_consumers_descriptors: return v25::prepare(a);
    case Step::v26_fp8_wide_blocks_d256: return v26::prepare(a);
    case Step::v27_fp8_wide_blocks_d128: return v27::prepare(a);
    case Step::v28_three_consumers_mufu_exp: return v28::prepare(a);
    case Step::v29_fp8_mufu_exp_d256: return v29::prepare(a);
    case Step::v30_final_causal_grid: return v30::prepare(a);
    case Step::v31_final_causal_grid_bc128: return v31::prepare(a);
#else
    default: break;
#endif
  }
  throw UsageError("unknown step");
}

}  // namespace

namespace {

/// A step's kernel prepared on device tensors (and, for an fp8 step, their E4M3 copies).
struct Prepared {
  PreparedStep step;
  std::unique_ptr<Fp8Device> fp8;
};

Prepared prepare_on(const Problem& p, Step s, const DeviceTensor& q, const DeviceTensor& k, const DeviceTensor& v,
                    DeviceTensor& o, DeviceBuffer<float>& lse) {
  Prepared r;
  if (step_is_fp8(s)) {
    r.fp8 = std::make_unique<Fp8Device>(p);
    fp8_prepare(p, q.data(), k.data(), v.data(), *r.fp8);
    StepArgs a = make_step_args(p, r.fp8->q8.get(), r.fp8->k8.get(), r.fp8->vt8.get(), o.data(), lse.get());
    a.nk_pad = r.fp8->nk_pad;
    a.params.q_scale = r.fp8->q_scale.get();
    a.params.k_scale = r.fp8->k_scale.get();
    a.params.v_scale = r.fp8->v_scale.get();
    r.step = prepare_step(s, a);
  } else {
    r.step = prepare_step(s, make_step_args(p, q.data(), k.data(), v.data(), o.data(), lse.get()));
  }
  return r;
}

/// Unit normals (Box-Muller on a hashed index) as 16-bit floats, written on the device:
/// inputs for fa3_launch_only() without a host upload.
__global__ void fill_normal_16bit(uint16_t* x, std::size_t n, unsigned seed, bool bf16) {
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    auto hash = [](unsigned h) {
      h ^= h >> 16;
      h *= 0x7feb352du;
      h ^= h >> 15;
      h *= 0x846ca68bu;
      return h ^ (h >> 16);
    };
    const unsigned a = hash(unsigned(i) * 2u + seed * 0x9e3779b9u), b = hash(unsigned(i) * 2u + 1u + seed * 0x9e3779b9u);
    const float u1 = (float(a >> 8) + 1.f) * (1.f / 16777216.f), u2 = float(b >> 8) * (1.f / 16777216.f);
    const float z = sqrtf(-2.f * __logf(u1)) * __cosf(6.2831853f * u2);
    x[i] = bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(z)) : __half_as_ushort(__float2half_rn(z));
  }
}

void fill_normal(DeviceTensor& t, unsigned seed) {
  constexpr int kThreads = 256, kBlocks = 1024;  // a grid-stride loop
  fill_normal_16bit<<<kBlocks, kThreads>>>(t.as<uint16_t>(), t.size(), seed, t.dtype() == DType::bf16);
  CUDA_CHECK_LAUNCH("fill_normal_16bit");
}

}  // namespace

// The problem on the device (common/cuda/device_problem.cuh): Q, K, V uploaded once, O and LSE
// allocated once, for every step a launch runs.
struct ForwardRunner::Impl : DeviceProblem {
  using DeviceProblem::DeviceProblem;
};

ForwardRunner::ForwardRunner(const Problem& p, const AttnInputs& in) : impl_(std::make_unique<Impl>(p, in)) {}
ForwardRunner::~ForwardRunner() = default;

GpuForward ForwardRunner::run(Step s, bool time, int launches) {
  const Problem& p = impl_->p;
  std::string why;
  if (!step_supports(s, p, &why)) throw UsageError(why);
  GpuForward r;
  const DeviceTensor &q = impl_->q, &k = impl_->k, &v = impl_->v;
  DeviceTensor& o = impl_->o;
  DeviceBuffer<float>& lse = impl_->lse;

  Prepared prep = prepare_on(p, s, q, k, v, o, lse);
  PreparedStep& step = prep.step;
  r.grid = step.grid;
  r.smem_bytes = step.smem_bytes;

  // The checked run: every output poisoned first, so an unwritten element is NaN.
  for (int i = 0; i < std::max(1, launches); ++i) {
    impl_->poison_outputs();
    step.launch();
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  r.o = o.to_host();
  r.lse = lse.download();

  if (time) {
    r.time_ms = time_gpu(step.launch).median_ms;
    if (prep.fp8) r.prep_ms = time_gpu([&] { fp8_prepare(p, q.data(), k.data(), v.data(), *prep.fp8); }).median_ms;
  }
  return r;
}

GpuForward fa3_forward_gpu(const Problem& p, const AttnInputs& in, Step s, bool time, int launches) {
  std::string why;
  if (!step_supports(s, p, &why)) throw UsageError(why);  // before any upload
  return ForwardRunner(p, in).run(s, time, launches);
}

void fa3_launch_only(const Problem& p, Step s, int launches) {
  std::string why;
  if (!step_supports(s, p, &why)) throw UsageError(why);
  DeviceTensor q(p.dtype, p.q_elems()), k(p.dtype, p.k_elems()), v(p.dtype, p.v_elems());
  fill_normal(q, 1);
  fill_normal(k, 2);
  fill_normal(v, 3);
  DeviceTensor o(p.dtype, p.o_elems());
  DeviceBuffer<float> lse(p.lse_elems());
  Prepared prep = prepare_on(p, s, q, k, v, o, lse);
  for (int i = 0; i < launches; ++i) prep.step.launch();
  CUDA_CHECK(cudaDeviceSynchronize());
}

Fp8Prepared fp8_prepare_gpu(const Problem& p, const AttnInputs& in) {
  const DeviceTensor q = DeviceTensor::from_host(in.q, p.dtype), k = DeviceTensor::from_host(in.k, p.dtype),
                     v = DeviceTensor::from_host(in.v, p.dtype);
  Fp8Device f(p);
  f.q8.poison();
  f.k8.poison();
  f.vt8.poison();
  fp8_prepare(p, q.data(), k.data(), v.data(), f);
  CUDA_CHECK(cudaDeviceSynchronize());
  Fp8Prepared r;
  r.q8 = f.q8.download();
  r.k8 = f.k8.download();
  r.vt8 = f.vt8.download();
  r.q_scale = f.q_scale.download();
  r.k_scale = f.k_scale.download();
  r.v_scale = f.v_scale.download();
  r.nk_pad = f.nk_pad;
  return r;
}

double fa3_device_bytes(const Problem& p, Step s) {
  const double e = dtype_bytes(p.dtype);
  double bytes = e * double(p.q_elems() + p.k_elems() + p.v_elems() + p.o_elems()) + 4.0 * double(p.lse_elems());
  if (step_is_fp8(s)) bytes += double(p.q_elems() + 2 * p.k_elems()) + 32.0 * p.batch * p.kv_heads * p.d;
  return bytes;
}

// ----------------------------------------------------------------------------- fp8 ceiling

namespace {
void lt_check(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) throw CudaError(std::string(what) + " failed: cuBLAS status " + std::to_string(int(st)));
}
__global__ void fill_e4m3(uint8_t* x, std::size_t n, unsigned seed) {
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    unsigned h = unsigned(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    x[i] = uint8_t(0x30 + (h % 0x18)) | uint8_t((h >> 8) & 0x80);  // values of magnitude ~0.5-2, both signs
  }
}
}  // namespace

double measure_fp8_gemm_tflops() {
  static double cached = 0;
  if (cached > 0) return cached;
  const int n = 8192;
  const std::size_t elems = std::size_t(n) * n;
  DeviceBuffer<uint8_t> a(elems), b(elems);
  DeviceBuffer<__nv_bfloat16> c(elems);
  // fill_e4m3 is a grid-stride loop: 256 threads a block, 64 elements a thread.
  constexpr int kFillThreads = 256, kFillPerThread = 64;
  const unsigned fill_blocks = unsigned(ceil_div(int(elems / kFillPerThread), kFillThreads));
  fill_e4m3<<<fill_blocks, kFillThreads>>>(a.get(), elems, 1u);
  fill_e4m3<<<fill_blocks, kFillThreads>>>(b.get(), elems, 2u);
  CUDA_CHECK_LAUNCH("fill_e4m3");
  cublasLtHandle_t lt;
  lt_check(cublasLtCreate(&lt), "cublasLtCreate");
  cublasLtMatmulDesc_t op;
  lt_check(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  // FP8 GEMMs in cuBLASLt take A transposed ("TN"): C (m x n) = A^T (m x k) B (k x n).
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  lt_check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "TRANSA");
  lt_check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "TRANSB");
  cublasLtMatrixLayout_t la, lb, lc;
  lt_check(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, n, n, n), "layout A");
  lt_check(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, n, n, n), "layout B");
  lt_check(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, n, n, n), "layout C");
  cublasLtMatmulPreference_t pref;
  lt_check(cublasLtMatmulPreferenceCreate(&pref), "preference");
  const std::size_t ws_bytes = 64u << 20;
  DeviceBuffer<unsigned char> ws(ws_bytes);
  lt_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                sizeof ws_bytes),
           "workspace");
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  lt_check(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 1, &heur, &found), "heuristic");
  if (!found) throw CudaError("cuBLASLt has no E4M3 GEMM for 8192^3 here");
  const float alpha = 1.f, beta = 0.f;
  const Timing t = time_gpu([&] {
    lt_check(cublasLtMatmul(lt, op, &alpha, a.get(), la, b.get(), lb, &beta, c.get(), lc, c.get(), lc, &heur.algo,
                            ws.get(), ws_bytes, 0),
             "cublasLtMatmul");
  });
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(op);
  cublasLtDestroy(lt);
  cached = 2.0 * n * double(n) * n / (t.median_ms * 1e-3) / 1e12;
  return cached;
}

}  // namespace attn::ch05
