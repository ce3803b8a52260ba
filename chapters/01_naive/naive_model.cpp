// Chapter 01 CPU model: the naive pipeline, with S and P going through "HBM".
#include "naive_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/index.hpp"
#include "common/online_softmax.hpp"

namespace attn::ch01 {
namespace {

/// A logical rows x cols matrix inside a global tensor: element (r, c) sits at
/// off + r * ld + c, or at off + c * ld + r when `trans` (a transposed view).
struct View {
  const GlobalTensor* t;
  std::size_t off;
  int rows, cols;
  std::size_t ld;
  bool trans = false;
  std::size_t at(int r, int c) const {
    return trans ? off + std::size_t(c) * ld + r : off + std::size_t(r) * ld + c;
  }
};

/// C (M x N) = alpha * A (M x K) * B (K x N) [+ C when accumulate], with the loop
/// structure of gemm_tiled in naive.cu: one BM x BN tile of C per thread block,
/// BK-deep slices of A and B staged on chip, the C tile held in registers.
void gemm_model(const View& A, const View& B, GlobalTensor& C, std::size_t c_off, std::size_t ldc, float alpha,
                bool accumulate, OnChip& sram, const GemmTiles& t, Traffic& traffic) {
  const int M = A.rows, K = A.cols, N = B.cols;
  for (int m0 = 0; m0 < M; m0 += t.BM) {
    for (int n0 = 0; n0 < N; n0 += t.BN) {
      Tile As = sram.tile("A slice (BK x BM)", std::size_t(t.BK) * t.BM);  // fp32 in shared memory
      Tile Bs = sram.tile("B slice (BK x BN)", std::size_t(t.BK) * t.BN);
      Tile acc = sram.tile("C tile (BM x BN, registers)", std::size_t(t.BM) * t.BN);
      const int mt = std::min(t.BM, M - m0), nt = std::min(t.BN, N - n0);
      for (int k0 = 0; k0 < K; k0 += t.BK) {
        const int kt = std::min(t.BK, K - k0);
        As.fill(0.f);
        Bs.fill(0.f);
        // Stage the slices: out-of-range elements are zero and are not read.
        for (int m = 0; m < mt; ++m)
          for (int k = 0; k < kt; ++k) As[std::size_t(k) * t.BM + m] = A.t->get(A.at(m0 + m, k0 + k));
        for (int k = 0; k < kt; ++k)
          for (int n = 0; n < nt; ++n) Bs[std::size_t(k) * t.BN + n] = B.t->get(B.at(k0 + k, n0 + n));
        for (int k = 0; k < kt; ++k)
          for (int m = 0; m < mt; ++m) {
            const float a = As[std::size_t(k) * t.BM + m];
            for (int n = 0; n < nt; ++n) acc[std::size_t(m) * t.BN + n] += a * Bs[std::size_t(k) * t.BN + n];
          }
        traffic.add_flops(2.0 * mt * nt * kt);
      }
      for (int m = 0; m < mt; ++m)
        for (int n = 0; n < nt; ++n) {
          const std::size_t at = c_off + std::size_t(m0 + m) * ldc + n0 + n;
          float v = alpha * acc[std::size_t(m) * t.BN + n];
          if (accumulate) v += C.get(at);
          C.set(at, v);
        }
    }
  }
}

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

}  // namespace

// ----------------------------------------------------------------------------- forward

namespace {

/// The three kernels on tensors already in "HBM".
void forward_pipeline(const Problem& p, const GlobalTensor& Q, const GlobalTensor& K, const GlobalTensor& V,
                      GlobalTensor& S, GlobalTensor& P, GlobalTensor& O, GlobalTensor& L, OnChip& sram,
                      const GemmTiles& t, Traffic& tr) {
  const float tau = float(p.softmax_scale());
  const std::size_t nn = std::size_t(p.nq) * p.nk;
  for (int b = 0; b < p.batch; ++b) {
    for (int h = 0; h < p.heads; ++h) {
      const int hk = p.kv_head_of(h);
      const std::size_t s_off = (std::size_t(b) * p.heads + h) * nn;

      // Kernel 1: S = tau * Q K^T. Q is Nq x d; K^T is the transposed view of K (Nk x d).
      gemm_model(View{&Q, p.q_off(b, h), p.nq, p.d, std::size_t(p.d)},
                 View{&K, p.k_off(b, hk), p.d, p.nk, std::size_t(p.d), /*trans=*/true}, S, s_off,
                 std::size_t(p.nk), tau, false, sram, t, tr);

      // Kernel 2: one thread block per row, three passes over the row in HBM.
      Tile chunk = sram.tile("softmax row chunk", kSoftmaxThreads);
      for (int i = 0; i < p.nq; ++i) {
        const std::size_t row = s_off + std::size_t(i) * p.nk;
        // The mask is applied here, on the way in: a hidden key scores -inf.
        auto score = [&](int j, float s) { return p.visible(i, j) ? s : kNegInf; };
        // pass 1: m_i = max_j S_ij
        float m = kNegInf;
        for (int j0 = 0; j0 < p.nk; j0 += kSoftmaxThreads) {
          const int n = std::min(kSoftmaxThreads, p.nk - j0);
          S.load(row + j0, n, chunk.data());
          for (int j = 0; j < n; ++j) m = std::max(m, score(j0 + j, chunk[j]));
        }
        const float shift = finite_max(m);  // an empty row keeps m = -inf: shift by 0, not -inf
        // pass 2: l_i = sum_j exp(S_ij - m_i)
        float l = 0.f;
        for (int j0 = 0; j0 < p.nk; j0 += kSoftmaxThreads) {
          const int n = std::min(kSoftmaxThreads, p.nk - j0);
          S.load(row + j0, n, chunk.data());
          for (int j = 0; j < n; ++j) l += std::exp(score(j0 + j, chunk[j]) - shift);
        }
        // pass 3: P_ij = exp(S_ij - m_i) / l_i, written back to HBM
        for (int j0 = 0; j0 < p.nk; j0 += kSoftmaxThreads) {
          const int n = std::min(kSoftmaxThreads, p.nk - j0);
          S.load(row + j0, n, chunk.data());
          // EXERCISE ch01.1: normalise the row: P_ij = exp(S_ij - m_i) / l_i (0 for an empty row)
          //| for (int j = 0; j < n; ++j) chunk[j] = 0.f;  // TODO: your code here
          for (int j = 0; j < n; ++j)
            chunk[j] = l > 0.f ? std::exp(score(j0 + j, chunk[j]) - shift) / l : 0.f;
          // END EXERCISE
          P.store(row + j0, n, chunk.data());
        }
        tr.add_flops(5.0 * p.nk);  // max, sub, exp, add, div per element (not in the convention)
        L.set(p.lse_off(b, h) + i, l > 0.f ? m + std::log(l) : kNegInf);
      }

      // Kernel 3: O = P V (P is Nq x Nk fp32, V is Nk x dv).
      gemm_model(View{&P, s_off, p.nq, p.nk, std::size_t(p.nk)},
                 View{&V, p.v_off(b, hk), p.nk, p.dv, std::size_t(p.dv)}, O, p.o_off(b, h), std::size_t(p.dv),
                 1.f, false, sram, t, tr);
    }
  }
}

}  // namespace

NaiveForwardResult naive_forward_model(const Problem& p, const AttnInputs& in, std::size_t sram_bytes,
                                       GemmTiles t) {
  NaiveForwardResult r;
  Traffic& tr = r.traffic;
  OnChip sram(sram_bytes);
  const GlobalTensor Q(tr, "Q", in.q, p.dtype), K(tr, "K", in.k, p.dtype), V(tr, "V", in.v, p.dtype);
  GlobalTensor O(tr, "O", p.o_elems(), p.dtype, Role::output);
  GlobalTensor L(tr, "LSE", p.lse_elems(), DType::f32, Role::output);
  GlobalTensor S(tr, "S", p.s_elems(), DType::f32, Role::scratch);  // the N^2 matrices
  GlobalTensor P(tr, "P", p.s_elems(), DType::f32, Role::scratch);
  forward_pipeline(p, Q, K, V, S, P, O, L, sram, t, tr);
  r.o = O.host();
  r.lse = L.host();
  r.sram_peak = sram.peak();
  return r;
}

NaiveTrafficFormula naive_forward_traffic(const Problem& p, GemmTiles t) {
  NaiveTrafficFormula f;
  const double e = dtype_bytes(p.dtype), bh = double(p.batch) * p.heads;
  const double nq = p.nq, nk = p.nk, d = p.d, dv = p.dv;
  f.s_bytes = f.p_bytes = 4.0 * bh * nq * nk;
  // EXERCISE ch01.2: count the bytes of the three kernels from the tile sizes
  //| (void)e; (void)bh; (void)nq; (void)nk; (void)d; (void)dv; (void)t;  // TODO: fill in f
  // A tiled GEMM C(M x N) = A(M x K) B(K x N) reads every row of A once per column
  // tile of C, and every column of B once per row tile: ceil(N/BN) M K + ceil(M/BM) N K.
  f.qk_read = bh * (ceil_div(p.nk, t.BN) * nq * d + ceil_div(p.nq, t.BM) * nk * d) * e;
  f.qk_write = f.s_bytes;
  f.softmax_read = 3.0 * f.s_bytes;        // max pass, sum pass, normalise pass
  f.softmax_write = f.p_bytes + 4.0 * bh * nq;  // P and the LSE
  f.pv_read = bh * (ceil_div(p.dv, t.BN) * nq * nk * 4.0 + ceil_div(p.nq, t.BM) * nk * dv * e);
  f.pv_write = bh * nq * dv * e;
  // END EXERCISE
  return f;
}

NaiveTrafficFormula naive_cublas_traffic(const Problem& p) {
  NaiveTrafficFormula f;
  const double e = dtype_bytes(p.dtype), bh = double(p.batch) * p.heads;
  const double nq = p.nq, nk = p.nk, d = p.d, dv = p.dv;
  f.s_bytes = 4.0 * bh * nq * nk;
  f.p_bytes = e * bh * nq * nk;
  f.qk_read = bh * (nq * d + nk * d) * e;
  f.qk_write = f.s_bytes;
  f.softmax_read = 3.0 * f.s_bytes;
  f.softmax_write = f.p_bytes + 4.0 * bh * nq;
  f.pv_read = bh * (nq * nk + nk * dv) * e;
  f.pv_write = bh * nq * dv * e;
  return f;
}

// ----------------------------------------------------------------------------- backward

NaiveBackwardResult naive_backward_model(const Problem& p, const AttnInputs& in, std::size_t sram_bytes,
                                         GemmTiles t) {
  // The forward runs first, on its own counters: its S, P, O are in HBM when the
  // backward starts, and only the backward's traffic is counted below.
  Traffic fwd_tr;
  OnChip fwd_sram(sram_bytes);
  const GlobalTensor fQ(fwd_tr, "Q", in.q, p.dtype), fK(fwd_tr, "K", in.k, p.dtype), fV(fwd_tr, "V", in.v, p.dtype);
  GlobalTensor fO(fwd_tr, "O", p.o_elems(), p.dtype, Role::output);
  GlobalTensor fL(fwd_tr, "LSE", p.lse_elems(), DType::f32, Role::output);
  GlobalTensor fS(fwd_tr, "S", p.s_elems(), DType::f32, Role::scratch);
  GlobalTensor fP(fwd_tr, "P", p.s_elems(), DType::f32, Role::scratch);
  forward_pipeline(p, fQ, fK, fV, fS, fP, fO, fL, fwd_sram, t, fwd_tr);

  NaiveBackwardResult r;
  Traffic& tr = r.traffic;
  OnChip sram(sram_bytes);
  const GlobalTensor Q(tr, "Q", in.q, p.dtype), K(tr, "K", in.k, p.dtype), V(tr, "V", in.v, p.dtype);
  const GlobalTensor dO(tr, "dO", in.dout, p.dtype), O(tr, "O", fO.host(), p.dtype);
  const GlobalTensor P(tr, "P", fP.host(), DType::f32, Role::scratch);  // kept from the forward: N^2
  GlobalTensor dP(tr, "dP", p.s_elems(), DType::f32, Role::scratch);    // two more N^2 matrices
  GlobalTensor dS(tr, "dS", p.s_elems(), DType::f32, Role::scratch);
  GlobalTensor D(tr, "D", p.lse_elems(), DType::f32, Role::scratch);
  GlobalTensor dQ(tr, "dQ", p.q_elems(), p.dtype, Role::output);
  // With GQA the heads of a group add into one dK, dV: keep those sums in fp32.
  const DType acc_t = p.group() > 1 ? DType::f32 : p.dtype;
  GlobalTensor dK(tr, "dK", p.k_elems(), acc_t, Role::output);
  GlobalTensor dV(tr, "dV", p.v_elems(), acc_t, Role::output);
  const float tau = float(p.softmax_scale());
  const std::size_t nn = std::size_t(p.nq) * p.nk;
  Tile row = sram.tile("elementwise row chunk", 2 * std::size_t(kSoftmaxThreads));

  for (int b = 0; b < p.batch; ++b) {
    for (int h = 0; h < p.heads; ++h) {
      const int hk = p.kv_head_of(h);
      const bool first_in_group = h % p.group() == 0;  // later heads of a group accumulate into dK, dV
      const std::size_t s_off = (std::size_t(b) * p.heads + h) * nn;
      const View PTv{&P, s_off, p.nk, p.nq, std::size_t(p.nk), true};
      const View dOv{&dO, p.o_off(b, h), p.nq, p.dv, std::size_t(p.dv)};

      // D_i = dO_i . O_i (one pass over dO and O)
      for (int i = 0; i < p.nq; ++i) {
        O.load(p.o_off(b, h) + std::size_t(i) * p.dv, p.dv, row.data());
        float Di = 0.f;
        for (int c = 0; c < p.dv; ++c) Di += dO.get(p.o_off(b, h) + std::size_t(i) * p.dv + c) * row[c];
        D.set(p.lse_off(b, h) + i, Di);
      }
      // dV = P^T dO
      gemm_model(PTv, dOv, dV, p.v_off(b, hk), std::size_t(p.dv), 1.f, !first_in_group, sram, t, tr);
      // dP = dO V^T
      gemm_model(dOv, View{&V, p.v_off(b, hk), p.dv, p.nk, std::size_t(p.dv), true}, dP, s_off,
                 std::size_t(p.nk), 1.f, false, sram, t, tr);
      // dS = P o (dP - D), elementwise over the N^2 matrices
      for (int i = 0; i < p.nq; ++i) {
        const float Di = D.get(p.lse_off(b, h) + i);
        for (int j0 = 0; j0 < p.nk; j0 += kSoftmaxThreads) {
          const int n = std::min(kSoftmaxThreads, p.nk - j0);
          const std::size_t at = s_off + std::size_t(i) * p.nk + j0;
          P.load(at, n, row.data());
          dP.load(at, n, row.data() + kSoftmaxThreads);
          // EXERCISE ch01.3: the softmax backward: dS_ij = P_ij (dP_ij - D_i)
          //| for (int j = 0; j < n; ++j) row[j] = row[kSoftmaxThreads + j];  // TODO: your code here
          for (int j = 0; j < n; ++j) row[j] = row[j] * (row[kSoftmaxThreads + j] - Di);
          // END EXERCISE
          dS.store(at, n, row.data());
        }
      }
      // dQ = tau dS K ; dK = tau dS^T Q
      gemm_model(View{&dS, s_off, p.nq, p.nk, std::size_t(p.nk)},
                 View{&K, p.k_off(b, hk), p.nk, p.d, std::size_t(p.d)}, dQ, p.q_off(b, h), std::size_t(p.d), tau,
                 false, sram, t, tr);
      gemm_model(View{&dS, s_off, p.nk, p.nq, std::size_t(p.nk), true},
                 View{&Q, p.q_off(b, h), p.nq, p.d, std::size_t(p.d)}, dK, p.k_off(b, hk), std::size_t(p.d), tau,
                 !first_in_group, sram, t, tr);
    }
  }
  r.dq = dQ.host();
  r.dk = dK.host();
  r.dv = dV.host();
  for (float& x : r.dk) x = round_to(p.dtype, x);
  for (float& x : r.dv) x = round_to(p.dtype, x);
  return r;
}

}  // namespace attn::ch01
