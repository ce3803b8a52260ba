#pragma once
/// \file fp8_model.hpp
/// \brief The FP8 forward's numerics on the CPU: E4M3 rounding, the Hadamard
///        rotation ("incoherent processing"), per-block scales, and the plain FP8
///        computation that is step 7's yardstick, plus the accuracy table.
///
/// **E4M3.** 1 sign, 4 exponent (bias 7) and 3 mantissa bits; no infinities; the
/// largest finite value is 448 = 1.75 x 2^8, the smallest normal 2^-6, the smallest
/// subnormal 2^-9. Every value in a binade is 1/8 of the binade apart, so the relative
/// rounding error is at most 2^-4: sixteen times bf16's.
///
/// **Scaling.** A tensor is stored as X8 = e4m3(X / s), s = amax(X) / 448, so its
/// largest entry lands on 448. Per-tensor scaling lets one large entry set s for
/// everything; per-block scaling (one s per 64 rows of Q or K of one head, one per
/// channel of V) confines it to its block.
///
/// **Incoherent processing** (FA3 paper, Section 3.3). Multiply Q and K by the same
/// orthogonal H = Hadamard / sqrt(d) along d: (Q H)(K H)^T = Q K^T, but an entry of q
/// that is 20 times the others becomes d entries of about 20 / sqrt(d) times: the
/// energy is spread, amax falls, and with it the error of every other entry of the
/// block. The fast Walsh-Hadamard transform costs d log2(d) additions per row.
///
/// The CPU and GPU (fp8_prepare.cu) quantise through the same butterflies in the same
/// order and the same round-to-nearest-even conversion, so their E4M3 tensors and
/// scales are bit-identical; tests check it.

#include <cstdint>
#include <string>
#include <vector>

#include "common/check.hpp"
#include "common/inputs.hpp"
#include "common/problem.hpp"
#include "common/reference.hpp"

namespace attn::ch05 {

/// Rows of Q or K (of one head) that share a quantisation scale.
constexpr int kFp8ScaleRows = 64;
/// The largest finite E4M3 value.
constexpr float kE4M3Max = 448.f;

/// x as E4M3 bits: round to nearest even, |x| >= 448 saturates to +-448, NaN -> 0x7f.
uint8_t e4m3_bits(float x);
/// The value of E4M3 bits (0x7f / 0xff are NaN).
float e4m3_value(uint8_t bits);
/// x rounded to E4M3 (with saturation).
inline float round_e4m3(float x) { return e4m3_value(e4m3_bits(x)); }

/// x <- H x / sqrt(d) in place, H the d x d Sylvester-Hadamard matrix (d a power of 2).
/// Butterflies h = 1, 2, ..., d/2: x[k] <- x[k] + x[k+h] and x[k+h] <- x[k] - x[k+h].
void hadamard_inplace(float* x, int d);

enum class Fp8Scaling { per_tensor, per_block };

struct Fp8Options {
  Fp8Scaling scaling = Fp8Scaling::per_block;
  bool hadamard = true;  ///< rotate Q and K by H before quantising
};

/// Q, K, V in E4M3 (held as floats that are exact E4M3 values) and their scales, so
/// that Q ~ q8 * s_q (after H), K ~ k8 * s_k, V ~ v8 * s_v.
struct Fp8Inputs {
  Fp8Options options;
  std::vector<float> q8, k8, v8;  ///< layouts of Problem (V not transposed)
  std::vector<float> q_scale;     ///< [B][Hq][q_blocks]
  std::vector<float> k_scale;     ///< [B][Hkv][k_blocks]
  std::vector<float> v_scale;     ///< [B][Hkv][dv]
  int q_blocks = 0, k_blocks = 0;
};

/// Quantises in's Q, K, V as the options say. Per-block: one scale per 64 rows of Q
/// and K and per channel of V; per-tensor: one per (batch, head) for each tensor.
Fp8Inputs quantize_fp8(const Problem& p, const AttnInputs& in, Fp8Options opt = {});

/// The plain FP8 computation of the checked rows, as the kernel does it but row by
/// row: s = (q8 . k8) (s_q c) s_k in fp32, P = 2^(s - max) rounded to E4M3,
/// O = (sum_j P_j v8_j) s_v / l with l the fp32 sum of the unrounded P, O rounded to
/// the problem's dtype. Requires p.d == p.dv.
NaiveForward naive_fp8_forward(const Problem& p, const Fp8Inputs& f, const CheckPlan& plan);

/// ForwardOracle's rule with the FP8 computation as the yardstick: the kernel's error
/// against the fp64 reference may be at most twice naive_fp8_forward()'s, plus the
/// floor of the output dtype.
class Fp8Oracle {
 public:
  Fp8Oracle(const Problem& p, const AttnInputs& in, CheckPlan plan, Fp8Options opt = {});
  CheckResult judge(const std::vector<float>& o, const std::vector<float>* lse = nullptr) const;
  const CheckPlan& plan() const { return plan_; }
  const Fp8Inputs& inputs() const { return fp8_; }
  /// The yardstick's own errors (O and LSE).
  const ErrorStats& naive_o() const { return naive_o_; }

 private:
  Problem p_;
  CheckPlan plan_;
  Fp8Inputs fp8_;
  RefForward ref_;
  ErrorStats naive_o_, naive_lse_;
};

/// One line of the accuracy table: a way of computing O, and its error against fp64.
struct Fp8AccuracyRow {
  std::string method;
  double rel_l2 = 0;   ///< ||O - O_ref|| / ||O_ref|| over the checked rows
  double max_abs = 0;
};

/// bf16 (same-precision naive), FP8 per-tensor, FP8 per-block, FP8 per-block + Hadamard,
/// each against the fp64 reference on the plan's rows.
std::vector<Fp8AccuracyRow> fp8_accuracy_table(const Problem& p, const AttnInputs& in, const CheckPlan& plan);

/// Inputs whose outliers sit in fixed channels, as in real activations: N(0, 1), with
/// channels 3 and d/2 + 5 of Q and K scaled by `factor` in every row. (Dist::outliers
/// scatters them at random, where Q's and K's outliers rarely meet.)
AttnInputs channel_outlier_inputs(const Problem& p, uint64_t seed, float factor = 20.f);

}  // namespace attn::ch05
