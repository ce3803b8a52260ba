#pragma once
/// \file linear_attention.hpp
/// \brief Two "efficient attention" approximations, in fp64 on the CPU, as a measured
///        contrast to FlashAttention, which is exact.
///
/// **Performer FAVOR+** (Choromanski et al. 2020, arXiv:2009.14794, Sec. 2.3-2.4, Lemma 1):
/// positive random features
/// \f[ \varphi(x) = \frac{1}{\sqrt m}\big(e^{w_r^\top x - \|x\|^2/2}\big)_{r=1..m},\qquad
///     \mathbb{E}\big[\varphi(x)^\top\varphi(y)\big] = e^{x^\top y},\quad w_r \sim N(0, I_d) \f]
/// applied to x = d^{-1/4} q and y = d^{-1/4} k, so that the product estimates e^{q.k/sqrt d};
/// then \f$O_i = \varphi(q_i)^\top(\sum_j \varphi(k_j) v_j^\top) / \varphi(q_i)^\top \sum_j \varphi(k_j)\f$,
/// O(N m d) instead of O(N^2 d). The w_r are orthogonal random features (Sec. 2.4): blocks of
/// d rows made orthonormal by Gram-Schmidt (QR) of a Gaussian d x d matrix, each row then
/// rescaled to the norm of an independent N(0, I_d) vector, so that every w_r is still
/// marginally N(0, I_d) and the estimator stays unbiased. Stabilised as the paper's code does:
/// a query's exponents have their row maximum of w_r^T x subtracted, the keys' exponents the
/// maximum over all keys and features; both offsets cancel between numerator and denominator.
/// The code's small additive constant (1e-6) is left out: in fp64 nothing underflows to 0.
///
/// **Linformer** (Wang et al. 2020, arXiv:2006.04768, Sec. 4): K and V are projected along the
/// sequence, \f$\bar K = E K,\ \bar V = F V\f$ with \f$E, F \in \mathbb{R}^{k\times N}\f$, then exact
/// softmax attention of Q against the k projected rows, O(N k d). The paper learns E and F; here
/// they are seeded Gaussians with entries N(0, 1/k) (the paper's JL argument), the untrained worst
/// case. Non-causal only: E mixes every position into every projected row, so a query would see
/// the future.

#include <cstdint>
#include <string>
#include <vector>

#include <Eigen/Dense>

#include "common/inputs.hpp"
#include "common/problem.hpp"

namespace attn::ch03 {

using MatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// m x d orthogonal random features, seeded.
MatD orthogonal_features(int m, int d, uint64_t seed);

/// FAVOR+ features of the rows of X (already scaled by d^{-1/4}): phi (rows x m), stabilised,
/// and each row's log offset, so that the unstabilised phi(x_i) = phi.row(i) * exp(log_offset[i]).
/// `per_row` subtracts each row's own max (queries), otherwise one max over all rows (keys).
struct FavorFeatures {
  MatD phi;
  Eigen::VectorXd log_offset;
};
FavorFeatures favor_features(const MatD& X, const MatD& W, bool per_row);

/// Performer FAVOR+ attention of one head, non-causal: Q (N x d), K (Nk x d), V (Nk x dv).
MatD performer_attention(const MatD& Q, const MatD& K, const MatD& V, const MatD& W);

/// Causal Performer (Choromanski et al. 2020, Sec. 2.2 and Fig. 2, the unidirectional case):
/// the same features, and running sums over the visible keys instead of sums over all,
/// \f[ S_i = \sum_{j \le i} \varphi(k_j) v_j^\top,\quad z_i = \sum_{j \le i} \varphi(k_j),\quad
///     O_i = \varphi(q_i)^\top S_i \,/\, \varphi(q_i)^\top z_i, \f]
/// one outer-product update and one product with \f$\varphi(q_i)\f$ per row: O(N m d), the
/// non-causal FLOPs. Query i sees keys j <= i + Nk - Nq (the project's bottom-right mask); a
/// row that sees no key gets 0. The key offset is the maximum over all keys, as non-causal:
/// in fp64 on the CPU it is known in advance (a streaming kernel would keep a running maximum
/// and rescale S and z when it grows, as online softmax does; not counted below).
MatD performer_causal_attention(const MatD& Q, const MatD& K, const MatD& V, const MatD& W);

/// The same estimator in O(N^2): A = phi(Q) phi(K)^T with the mask applied entry by entry,
/// O = A V / (A 1). What the prefix sums must equal, to fp64 rounding (the tests' oracle).
MatD performer_masked_quadratic(const MatD& Q, const MatD& K, const MatD& V, const MatD& W, bool causal);

/// k x n Gaussian projection with entries N(0, 1/k), seeded.
MatD linformer_projection(int k, int n, uint64_t seed);

/// Linformer attention of one head: softmax(tau Q (E K)^T) (F V), tau = 1/sqrt(d).
MatD linformer_attention(const MatD& Q, const MatD& K, const MatD& V, const MatD& E, const MatD& F);

/// Exact softmax attention of one head in fp64 (the same rows the reference computes);
/// `causal`: bottom-right mask, a row that sees no key gets 0.
MatD exact_attention(const MatD& Q, const MatD& K, const MatD& V, bool causal = false);

/// One (batch, head) slice of the inputs as fp64 matrices.
MatD q_matrix(const Problem& p, const AttnInputs& in, int b, int h);
MatD k_matrix(const Problem& p, const AttnInputs& in, int b, int hk);
MatD v_matrix(const Problem& p, const AttnInputs& in, int b, int hk);

/// Inputs with the structure real attention has: a few large scores per row. Starting from
/// make_inputs(p, normal, seed), each query row i gets c_i keys, c_i uniform in {1, 2, 3, 4},
/// the keys j_1..j_c uniform and distinct (seeded), and
///     q_i <- q_i + beta sqrt(d) sum_t k_{j_t} / |k_{j_t}|^2,
/// which raises the score q_i.k_{j_t} / sqrt(d) of each chosen key by beta standard deviations
/// of the unplanted scores (which are N(0, 1)), up to the cross terms between the chosen keys
/// (about N(0, (c - 1) beta^2 / d)). The new direction of q_i also moves every other score of
/// the row, by about N(0, beta^2 / d) per chosen key: at d = 64 and beta = 8 the other scores
/// spread to a standard deviation of sqrt(1 + c), and the chosen keys stand 3.6 (c = 4) to
/// 5.7 (c = 1) of those above the rest. Q is then rounded to the problem's dtype. `planted`,
/// when given, receives each query row's chosen keys (rows in (batch, head, row) order).
constexpr double kPlantSigmas = 8.0;
AttnInputs make_planted_inputs(const Problem& p, uint64_t seed, double beta = kPlantSigmas,
                               std::vector<std::vector<int>>* planted = nullptr);

// ---- Costs of one forward pass, summed over (batch, head) ----

/// Exact attention as FlashAttention computes it: 4 N^2 d FLOPs (flops_forward).
double exact_flops(const Problem& p);
/// Its bytes: chapter 03's FA1 traffic model (fa1_forward_traffic) with the blocks from M.
double exact_bytes(const Problem& p, std::size_t sram_bytes);
/// Performer: feature maps 2 N m d for Q and for K, phi(K)^T [V 1] and phi(Q) [KV z],
/// 2 N m (dv + 1) each: 4 N m d + 4 N m (dv + 1).
double performer_flops(const Problem& p, int m);
/// Performer, two fused passes: Q, K, V read once and O written once (dtype), W (fp32, m x d)
/// read in each pass, the fp32 state [phi(K)^T V, phi(K)^T 1] (m x (dv + 1)) written once and
/// read once per B_r-row query tile (it does not fit on chip beside the tile for m >= 128).
double performer_bytes(const Problem& p, int m, std::size_t sram_bytes);
/// Causal Performer: the non-causal FLOPs (each product is made once, over fewer terms).
double performer_causal_flops(const Problem& p, int m);
/// Feature rows r of the running state that stay on chip: each needs its state row
/// (dv + 1 fp32) and its row of W (d fp32), so m_s = M / (4 (d + dv + 1)).
int performer_causal_state_rows(const Problem& p, std::size_t sram_bytes);
/// Causal Performer, one streaming pass per slice of s = ceil(m / m_s) feature rows (a slice's
/// state and W rows on chip, the state never written out): each pass reads Q, K, V (dtype)
/// and its W rows (fp32, W once in all) and adds its share of phi(q_i)^T [S_i z_i], kept as
/// fp32 partials [O~ den] (N (dv + 1)) written by every pass but the last and read by every
/// pass but the first; the last writes O (dtype). s = 1: Q, K, V, O once and W once.
double performer_causal_bytes(const Problem& p, int m, std::size_t sram_bytes);
/// Linformer: projections 2 k N d + 2 k N dv, then exact attention against k keys (4 N k d).
double linformer_flops(const Problem& p, int k);
/// Linformer: pass 1 reads K, V and the stored E, F (dtype) and writes E K, F V; pass 2 is FA1
/// against k keys (its traffic model at nk = k).
double linformer_bytes(const Problem& p, int k, std::size_t sram_bytes);

// ---- The study ----

struct LinearStudyOptions {
  std::vector<int> features = {64, 256, 1024};  ///< Performer's m
  std::vector<int> projections = {64, 256};     ///< Linformer's k
  std::size_t sram_bytes = 96 * 1024;
  int crossover_limit = 1 << 15;  ///< crossovers searched for N up to this
};

struct StudyErrorRow {
  std::string method;  ///< "exact (FA1 model)", "Performer", "Linformer", "exact causal (FA1 model)", "causal Performer"
  int param = 0;       ///< m or k; 0 for exact
  std::string family;  ///< "normal" or "planted"
  double max_abs = 0, rel_l2 = 0;  ///< O against the fp64 reference, every row
  double tolerance = 0;            ///< the acceptance rule's largest per-row max-abs tolerance
  double margin = 0;               ///< worst row's error / its tolerance (> 1 fails)
  bool pass = false;               ///< the project's acceptance rule (compare.hpp), computed
};

struct StudyCostRow {
  std::string method;
  int param = 0;
  int n = 0;
  double flops = 0, bytes = 0;
};

struct StudyCrossover {
  std::string method;
  int param = 0;
  int n_flops = -1, n_bytes = -1;  ///< smallest N from which it stays cheaper (-1: not below the limit)
};

struct LinearStudy {
  std::vector<StudyErrorRow> errors;
  std::vector<StudyCostRow> costs;
  std::vector<StudyCrossover> crossovers;
};

/// Runs the study on `p` (non-causal, nq = nk; UsageError otherwise) with seed `seed`, then
/// the causal part on the same inputs: `p` with the causal mask, exact (FA1 model) and causal
/// Performer against the causal fp64 reference, costs against FA1's causal counts (FLOPs halved).
LinearStudy run_linear_study(const Problem& p, uint64_t seed, const LinearStudyOptions& o);

/// The study as text: a readable table, then `csv,` lines (error, cost, crossover) for scripts.
std::string format_linear_study(const Problem& p, uint64_t seed, const LinearStudyOptions& o, const LinearStudy& s);

}  // namespace attn::ch03
