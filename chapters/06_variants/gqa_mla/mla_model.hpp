#pragma once
/// \file mla_model.hpp
/// \brief Multi-head latent attention (DeepSeek-V2/V3) on the CPU: the latent cache,
///        decoupled RoPE, the two ways to compute it, and the fp64 reference.
///
/// **The matrices** (DeepSeek-V3; per layer, H = 128 heads in the model, any H here):
///
///     c_t      [d_c = 512]            latent of token t            (cached)
///     k_rope_t [d_rope = 64]          RoPE(pos_t) W_KR h_t, shared by all heads (cached)
///     W_UK[h]  [512 x d_nope = 128]   k_nope[h]_t = c_t W_UK[h]
///     W_UV[h]  [512 x d_v = 128]      v[h]_t      = c_t W_UV[h]
///     q_nope[h]_i [128], q_rope[h]_i = RoPE(pos_i) (...) [64]
///
///     s[h]_it = tau ( q_nope[h]_i . k_nope[h]_t + q_rope[h]_i . k_rope_t ),  tau = 1/sqrt(192)
///     o[h]_i  = sum_t softmax_t(s[h]_i.) v[h]_t                              [128]
///
/// **Decompress** (prefill): materialise K[h] = [c W_UK[h] ; k_rope] (192 per head) and
/// V[h] = c W_UV[h] (128), then ordinary attention with d_qk = 192, d_v = 128.
///
/// **Absorb** (decode): q_nope . (c W_UK) = (q_nope W_UK^T) . c, so with
///
///     q_c[h]_i = q_nope[h]_i W_UK[h]^T                       [512]
///     q[h]_i   = [q_c[h]_i ; q_rope[h]_i]                    [576]
///     key_t    = [c_t ; k_rope_t]                            [576], the cache itself
///     o_c[h]_i = sum_t softmax_t(tau q[h]_i . key_t) c_t     [512]   (values = c_t)
///     o[h]_i   = o_c[h]_i W_UV[h]                            [128]
///
/// every head reads the same keys and values: an MQA with d = 576, dv = 512 over the
/// cache as it is stored, never decompressed.
///
/// **Why the RoPE part is decoupled.** RoPE rotates a key by its position: had it been
/// applied to k_nope = c W_UK, the score would be q^T R_i^T R_t W_UK^T c = q^T R_{t-i} W_UK^T c,
/// and the matrix between q and c would depend on t: no single q_c per query row.
/// So DeepSeek keeps 64 extra dimensions, rotated and shared, and leaves the 128
/// absorbable ones unrotated (test_mla_model.cpp shows both).

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/check.hpp"
#include "common/inputs.hpp"
#include "common/problem.hpp"

namespace attn::ch06 {

/// DeepSeek-V3's MLA dimensions (config.json: qk_nope_head_dim, qk_rope_head_dim,
/// v_head_dim, kv_lora_rank).
constexpr int kDNope = 128, kDRope = 64, kDV = 128, kDC = 512;
constexpr int kDQK = kDNope + kDRope;  ///< 192: the decompressed query/key head dim
constexpr int kDLatentKey = kDC + kDRope;  ///< 576: one cached token, and the absorbed query
constexpr double kRopeBase = 10000.0;  ///< DeepSeek-V3's rope_theta (its YaRN scaling is left out)

/// One MLA attention problem: B sequences of Nk cached tokens, Nq new query tokens each
/// (1 for decode; 2 with DeepSeek-V3's multi-token prediction), H heads.
struct MlaShape {
  int batch = 2;
  int heads = 16;
  int nq = 1;
  int nk = 300;
  bool causal = true;  ///< query i (at position pos0 + Nk - Nq + i) sees keys t <= Nk - Nq + i
  long pos0 = 1000;    ///< position of key 0: RoPE rotates by absolute positions

  double scale() const;  ///< 1 / sqrt(192)
  long key_pos(int t) const { return pos0 + t; }
  long query_pos(int i) const { return pos0 + nk - nq + i; }
  /// The decompressed attention: B, H, H, Nq, Nk, d = 192, dv = 128, bf16.
  Problem decompressed() const;
  /// The absorbed attention: B, H, 1 (MQA), Nq, Nk, d = 576, dv = 512, bf16, same tau.
  Problem absorbed() const;
  /// The final output's shape, [B][H][Nq][128] (as decompressed()).
  Problem output() const { return decompressed(); }
  std::string describe() const;
};

/// Throws UsageError naming the first bad field.
void validate(const MlaShape& s);

/// Rotates pairs (x[2k], x[2k+1]) by the angle pos * base^(-2k/dim) (RoPE, interleaved
/// pairs as in DeepSeek's reference code).
void rope_rotate(double* x, int dim, long pos, double base = kRopeBase);

/// The cached and computed inputs, every value exactly representable in bf16.
struct MlaInputs {
  std::vector<float> c;       ///< [B][Nk][512]
  std::vector<float> k_rope;  ///< [B][Nk][64], rotated to each key's position
  std::vector<float> q_nope;  ///< [B][H][Nq][128]
  std::vector<float> q_rope;  ///< [B][H][Nq][64], rotated to each query's position
  std::vector<float> w_uk;    ///< [H][512][128]
  std::vector<float> w_uv;    ///< [H][512][128]
};
MlaInputs make_mla_inputs(const MlaShape& s, Dist dist, uint64_t seed);

/// The decompressed tensors of decompressed(): Q = [q_nope ; q_rope], K = [c W_UK ; k_rope],
/// V = c W_UV, products accumulated in fp32 and stored in bf16 (what a prefill writes to HBM).
/// With `only`, just those (batch, head) slices of K and V are computed (the rest stay 0):
/// what a sampled check needs.
AttnInputs decompress(const MlaShape& s, const MlaInputs& in,
                      const std::vector<std::pair<int, int>>* only = nullptr);
/// The absorbed tensors of absorbed(): Q = [q_nope W_UK^T ; q_rope] (fp32 sums, bf16),
/// K = [c ; k_rope] (the cache), V = c.
AttnInputs absorb(const MlaShape& s, const MlaInputs& in);
/// o = o_c W_UV per head: [B][H][Nq][512] -> [B][H][Nq][128], fp32 sums, bf16 result.
std::vector<float> project_out(const MlaShape& s, const std::vector<float>& o_c, const MlaInputs& in);

/// Which fp64 path computes the reference.
enum class MlaRefPath {
  definition,  ///< K and V decompressed in fp64, then softmax(tau Q K^T) V: the definition
  absorbed,    ///< the same algebra in fp64 through q_c and o_c (cheap at long contexts)
  automatic,   ///< definition when it costs under ~4 GFLOP, else absorbed
};

/// The rows the MLA check covers: every row, or (sampled) every (batch, head) pair on the
/// rows of CheckPlan::sampled() (0, 1, Nq - 2, Nq - 1 and a spread between, never fewer than
/// 8 a head), as many as about `budget` FLOPs of the fp64 reference's absorbed path allow
/// (2 Nk (576 + 512) a row). A long context thins the rows of each pair, never the pairs.
CheckPlan mla_check_plan(const MlaShape& s, bool all, double budget = 8e9);

/// The (batch, head) pairs of `plan` on which mla_naive_error() computes the yardstick: all
/// of them, or where their decompression would cost more than about `budget` FLOPs (each
/// pair's K and V cost 2 Nk 512 256, whatever its rows), the first, the last and an even
/// spread between, at least 2.
std::vector<std::pair<int, int>> mla_yardstick_pairs(const MlaShape& s, const CheckPlan& plan, double budget = 8e9);

/// The fp64 reference of the final output o on the rows of `plan` (a plan over
/// output()), in the order naive_forward_same_precision() uses.
CheckedRows<double> mla_reference(const MlaShape& s, const MlaInputs& in, const CheckPlan& plan,
                                  MlaRefPath path = MlaRefPath::automatic);

/// The yardstick of the acceptance rule: the decompressed form computed plainly in
/// bf16 (K, V stored in bf16, fp32 dot products, P and O rounded), its error against `ref`
/// on the plan's rows of the pairs of mla_yardstick_pairs(s, plan, budget). Its worst row
/// is the rule's `n` for every checked pair; where it covers fewer pairs than the plan, its
/// L2 error is scaled by sqrt(plan pairs / its pairs), the same error per row over every
/// checked row (the inputs of every head are drawn alike).
ErrorStats mla_naive_error(const MlaShape& s, const MlaInputs& in, const CheckPlan& plan,
                           const CheckedRows<double>& ref, double budget = 8e9);

/// What the MLA check covers, for the report's `checked` line: the plan, the reference and
/// the yardstick's pairs.
std::string mla_check_describe(const MlaShape& s, const CheckPlan& plan, double budget = 8e9);

/// The split-K count of the absorbed decode: `tiles` x `batch` x splits thread blocks should
/// fill whole waves of `slots` (SMs x blocks resident per SM): the fewest key ranges (fewer
/// partial states to write and merge) that give at least 0.95 of a wave with every wave at
/// least 0.95 full, else the fullest; ranges are whole key blocks, at least
/// `min_blocks_per_range` of them, at most kMlaMaxSplits ranges. 64 sequences of two 64-row
/// tiles on 132 slots: 1 range (128 blocks, 0.97 of a wave), not 2 or 3 (a last wave half
/// full). One sequence of 64K keys at H = 16 (1024 blocks, 132 slots): 128 ranges of 8
/// blocks, so that every SM reads; 8 of them: 16 ranges (128 blocks), not 15 (120 blocks,
/// 0.91: 6% slower on the H200, 2026-12-01; LAB.md). The 64-row tile asks for 2
/// blocks a range: a range writes 64 rows x 512 fp32 = 128 KB of partials, which the combine
/// reads back, against 72 KB of latent keys a block (one sequence of 4K keys at H = 128: 32
/// ranges of 2 blocks ran 15% faster than 64 of 1 in the same run).
constexpr int kMlaMaxSplits = 256;
int mla_pick_splits(int tiles, int batch, int nblocks, int slots, int min_blocks_per_range = 1);

/// Bytes and FLOPs of one step of each form (a counted model of the kernels' traffic;
/// tests check it against the CPU models' counters).
struct MlaCost {
  double flops = 0;       ///< what the form computes (absorbed: 2 Nk (576 + 512) per row)
  double bytes = 0;       ///< HBM bytes read + written, every kernel of the form
  double cache_bytes = 0; ///< of which: the cache (latent, or decompressed K and V) read by attention
};
MlaCost mla_cost_absorb(const MlaShape& s, int head_tile);
MlaCost mla_cost_decompress(const MlaShape& s);

}  // namespace attn::ch06
