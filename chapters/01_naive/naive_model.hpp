#pragma once
/// \file naive_model.hpp
/// \brief Chapter 01's CPU model: the three-kernel pipeline with S and P in "HBM".
///
///     kernel 1   S = tau * Q K^T          tiled GEMM, writes S   (Nq x Nk fp32)
///     kernel 2   P = softmax(S)           3 passes over S, writes P
///     kernel 3   O = P V                  tiled GEMM, reads P
///
/// The model runs the same loops as the CUDA kernels in naive.cu, with every global
/// access counted, so its bytes are the ones the kernels ask for.

#include <cstddef>
#include <vector>

#include "common/inputs.hpp"
#include "common/problem.hpp"
#include "common/traffic.hpp"

namespace attn::ch01 {

/// The tiling of naive.cu's GEMM kernel: a BM x BN tile of C per thread block, the
/// reduction dimension walked BK at a time.
struct GemmTiles {
  int BM = 64, BN = 64, BK = 16;
};

/// Row softmax kernel geometry: one thread block of this many threads per row.
constexpr int kSoftmaxThreads = 256;

struct NaiveForwardResult {
  std::vector<float> o, lse;  ///< O in the problem's dtype, LSE in fp32
  Traffic traffic;            ///< counted by the model
  std::size_t sram_peak = 0;  ///< peak on-chip bytes of any kernel
};

/// The forward pipeline. `sram_bytes` is the on-chip budget the tiles must fit in.
/// S and P are stored as fp32 (4 bytes each).
NaiveForwardResult naive_forward_model(const Problem& p, const AttnInputs& in, std::size_t sram_bytes,
                                       GemmTiles t = {});

/// Bytes the three kernels move, from the tile sizes alone (no simulation). The
/// model's counted traffic must equal this; the GPU report gives it as the kernels'
/// bytes (a formula of their loop structure, not a measurement).
struct NaiveTrafficFormula {
  double qk_read = 0, qk_write = 0;            ///< kernel 1
  double softmax_read = 0, softmax_write = 0;  ///< kernel 2 (P and LSE)
  double pv_read = 0, pv_write = 0;            ///< kernel 3
  double read() const { return qk_read + softmax_read + pv_read; }
  double write() const { return qk_write + softmax_write + pv_write; }
  double extra() const { return s_bytes + p_bytes; }  ///< S + P: the N^2 scratch
  double s_bytes = 0, p_bytes = 0;
};
NaiveTrafficFormula naive_forward_traffic(const Problem& p, GemmTiles t = {});

/// The same for the cuBLAS pipeline, whose GEMM tiling is cuBLAS's own: its GEMMs
/// are counted at their minimum (each operand read once), P is stored in the
/// problem's dtype, and the softmax is kernel 2 unchanged.
NaiveTrafficFormula naive_cublas_traffic(const Problem& p);

struct NaiveBackwardResult {
  std::vector<float> dq, dk, dv;
  Traffic traffic;  ///< the backward alone (the forward's P is reused from HBM)
};

/// The materialising backward, five GEMM-shaped kernels over stored N^2 matrices:
///   dV = P^T dO,  dP = dO V^T,  dS = P o (dP - D) with D = rowsum(dO o O),
///   dQ = tau dS K,  dK = tau dS^T Q.
/// P (and O, LSE) come from the forward; dP and dS are two more N^2 scratch matrices.
NaiveBackwardResult naive_backward_model(const Problem& p, const AttnInputs& in, std::size_t sram_bytes,
                                         GemmTiles t = {});

}  // namespace attn::ch01
