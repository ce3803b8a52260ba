// Chapter 03 CPU model: FlashAttention-1's Algorithm 1 (forward) and Algorithm 4
// (backward, no dropout), written with the kernels' loop structure, every HBM
// access counted and every tile held in the on-chip budget M.
#include "fa1_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/errors.hpp"
#include "common/online_softmax.hpp"

namespace attn::ch03 {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

float dot(const float* a, const float* b, int n) {
  float s = 0.f;
  for (int k = 0; k < n; ++k) s += a[k] * b[k];
  return s;
}

Blocks resolve(Blocks given, Blocks from_budget) {
  if (given.Br < 0 || given.Bc < 0) throw UsageError("block sizes must be positive");
  if (given.Br == 0 && given.Bc == 0) return from_budget;
  // One of them given: the other from the budget.
  return {given.Br > 0 ? given.Br : from_budget.Br, given.Bc > 0 ? given.Bc : from_budget.Bc};
}

}  // namespace

// ----------------------------------------------------------------------------- forward

Fa1ForwardResult fa1_forward_model(const Problem& p, const AttnInputs& in, std::size_t sram_bytes, Blocks blocks) {
  const Blocks bl = resolve(blocks, forward_blocks(p, sram_bytes));
  const int Br = bl.Br, Bc = bl.Bc, d = p.d, dv = p.dv;
  const int Tr = ceil_div(p.nq, Br), Tc = ceil_div(p.nk, Bc);
  const float tau = float(p.softmax_scale());

  Fa1ForwardResult r;
  r.blocks = bl;
  Traffic& tr = r.traffic;
  OnChip sram(sram_bytes);
  const GlobalTensor Q(tr, "Q", in.q, p.dtype), K(tr, "K", in.k, p.dtype), V(tr, "V", in.v, p.dtype);
  GlobalTensor O(tr, "O", p.o_elems(), p.dtype, Role::output);
  GlobalTensor L(tr, "LSE", p.lse_elems(), DType::f32, Role::output);
  // Line 2: the running state (m, l, O) lives in HBM between steps: O(N) scratch, fp32.
  GlobalTensor O_acc(tr, "O_acc", p.o_elems(), DType::f32, Role::scratch);
  GlobalTensor m(tr, "m", p.lse_elems(), DType::f32, Role::scratch);
  GlobalTensor l(tr, "l", p.lse_elems(), DType::f32, Role::scratch);

  // Everything on chip, fp32. Allocation throws SramOverflow when B_r, B_c do not fit M.
  Tile K_j = sram.tile("K_j (Bc x d)", std::size_t(Bc) * d);
  Tile V_j = sram.tile("V_j (Bc x dv)", std::size_t(Bc) * dv);
  Tile Q_i = sram.tile("Q_i (Br x d)", std::size_t(Br) * d);
  Tile O_i = sram.tile("O_i (Br x dv)", std::size_t(Br) * dv);
  Tile S_ij = sram.tile("S_ij (Br x Bc)", std::size_t(Br) * Bc);  // P~_ij overwrites it
  Tile m_i = sram.tile("m_i (Br)", Br), l_i = sram.tile("l_i (Br)", Br);

  for (int b = 0; b < p.batch; ++b) {
    for (int h = 0; h < p.heads; ++h) {
      const int hk = p.kv_head_of(h);
      const std::size_t q0 = p.q_off(b, h), o0 = p.o_off(b, h), s0 = p.lse_off(b, h);
      const std::size_t k0 = p.k_off(b, hk), v0 = p.v_off(b, hk);

      // Q blocks whose rows are all empty (causal with Nq > Nk) meet no key: O = 0, LSE = -inf.
      for (int i = 0; i < Tr; ++i) {
        if (last_visit(p, bl, i) >= 0) continue;
        const int i0 = i * Br, rows = std::min(Br, p.nq - i0);
        O_i.fill(0.f);
        m_i.fill(kNegInf);
        O.store(o0 + std::size_t(i0) * dv, std::size_t(rows) * dv, O_i.data());
        L.store(s0 + i0, rows, m_i.data());
      }

      for (int j = 0; j < Tc; ++j) {  // line 5: K/V blocks in the outer loop
        const int j0 = j * Bc, kr = std::min(Bc, p.nk - j0);
        K.load(k0 + std::size_t(j0) * d, std::size_t(kr) * d, K_j.data());  // line 6
        V.load(v0 + std::size_t(j0) * dv, std::size_t(kr) * dv, V_j.data());

        for (int i = 0; i < Tr; ++i) {  // line 7: Q blocks in the inner loop
          const int last = last_visit(p, bl, i);
          if (j > last) continue;  // causal: block (i, j) is entirely masked
          const int i0 = i * Br, rows = std::min(Br, p.nq - i0);

          // Line 8: Q_i, and the state (m_i, l_i, O_i) written by step j - 1.
          Q.load(q0 + std::size_t(i0) * d, std::size_t(rows) * d, Q_i.data());
          if (j == 0) {
            m_i.fill(kNegInf);  // the identity of (+): no score seen yet
            l_i.fill(0.f);
            O_i.fill(0.f);
          } else {
            m.load(s0 + i0, rows, m_i.data());
            l.load(s0 + i0, rows, l_i.data());
            O_acc.load(o0 + std::size_t(i0) * dv, std::size_t(rows) * dv, O_i.data());
          }

          for (int rr = 0; rr < rows; ++rr) {
            const int row = i0 + rr;
            float* S = S_ij.data() + std::size_t(rr) * Bc;
            float* Orow = O_i.data() + std::size_t(rr) * dv;
            // Line 9: S_ij = tau Q_i K_j^T, with the mask applied as it is computed.
            float m_tilde = kNegInf;
            for (int c = 0; c < kr; ++c) {
              S[c] = p.visible(row, j0 + c) ? tau * dot(Q_i.data() + std::size_t(rr) * d,
                                                        K_j.data() + std::size_t(c) * d, d)
                                            : kNegInf;
              m_tilde = std::max(m_tilde, S[c]);
            }
            // Line 10: P~_ij = exp(S_ij - m~_ij), l~_ij = rowsum(P~_ij). A row with every
            // key of this block masked has m~ = -inf: finite_max() makes P~ = 0, not NaN.
            const float shift = finite_max(m_tilde);
            float l_tilde = 0.f;
            for (int c = 0; c < kr; ++c) {
              S[c] = std::exp(S[c] - shift);
              l_tilde += S[c];
            }
            // Line 11: (m_new, l_new) = (m_i, l_i) (+) (m~_ij, l~_ij).
            const MergeWeights<float> w = merge_weights<BaseE>(m_i[rr], m_tilde);  // e^{m_i - m_new}, e^{m~ - m_new}
            const float l_new = l_i[rr] * w.wa + l_tilde * w.wb;
            const float inv = l_new > 0.f ? 1.f / l_new : 0.f;  // still-empty row: O stays 0
            // Line 12: O_i <- diag(l_new)^-1 (diag(l_i) e^{m_i - m_new} O_i + e^{m~ - m_new} P~_ij V_j).
            // EXERCISE ch03.1: the rescale of line 12: weights of the old O_i and of P~_ij V_j
            //| const float scale_old = l_i[rr] * inv, scale_new = inv;  // TODO: forgets e^{m_i - m_new}, e^{m~ - m_new}
            const float scale_old = l_i[rr] * w.wa * inv, scale_new = w.wb * inv;
            // END EXERCISE
            for (int c = 0; c < dv; ++c) Orow[c] *= scale_old;
            for (int c = 0; c < kr; ++c) {
              const float pc = scale_new * S[c];
              if (pc == 0.f) continue;
              const float* Vc = V_j.data() + std::size_t(c) * dv;
              for (int k = 0; k < dv; ++k) Orow[k] += pc * Vc[k];
            }
            m_i[rr] = w.m;
            l_i[rr] = l_new;
          }
          tr.add_flops(2.0 * rows * kr * (d + dv));  // Q_i K_j^T and P~_ij V_j

          // Line 13: the state back to HBM, or, on Q block i's last step, O_i and LSE_i once.
          if (j == last) {
            O.store(o0 + std::size_t(i0) * dv, std::size_t(rows) * dv, O_i.data());
            for (int rr = 0; rr < rows; ++rr) m_i[rr] = l_i[rr] > 0.f ? m_i[rr] + std::log(l_i[rr]) : kNegInf;
            L.store(s0 + i0, rows, m_i.data());
          } else {
            O_acc.store(o0 + std::size_t(i0) * dv, std::size_t(rows) * dv, O_i.data());
            m.store(s0 + i0, rows, m_i.data());
            l.store(s0 + i0, rows, l_i.data());
          }
        }
      }
    }
  }
  r.o = O.host();
  r.lse = L.host();
  r.sram_peak = sram.peak();
  return r;
}

// ----------------------------------------------------------------------------- backward

Fa1BackwardResult fa1_backward_model(const Problem& p, const AttnInputs& in, const std::vector<float>& o,
                                     const std::vector<float>& lse, std::size_t sram_bytes, Blocks blocks) {
  if (in.dout.size() != p.o_elems() || o.size() != p.o_elems() || lse.size() != p.lse_elems())
    throw UsageError("fa1_backward_model needs dO, O and LSE of the problem's shape");
  const Blocks bl = resolve(blocks, backward_blocks(p, sram_bytes));
  const int Br = bl.Br, Bc = bl.Bc, d = p.d, dv = p.dv, g = p.group();
  const int Tr = ceil_div(p.nq, Br), Tc = ceil_div(p.nk, Bc);
  const float tau = float(p.softmax_scale());

  Fa1BackwardResult r;
  r.blocks = bl;
  Traffic& tr = r.traffic;
  OnChip sram(sram_bytes);
  const GlobalTensor Q(tr, "Q", in.q, p.dtype), K(tr, "K", in.k, p.dtype), V(tr, "V", in.v, p.dtype);
  const GlobalTensor dO(tr, "dO", in.dout, p.dtype), O(tr, "O", o, p.dtype), LSE(tr, "LSE", lse, DType::f32);
  GlobalTensor D(tr, "D", p.lse_elems(), DType::f32, Role::scratch);         // O(N)
  GlobalTensor dQ_acc(tr, "dQ_acc", p.q_elems(), DType::f32, Role::scratch);  // O(N d)
  GlobalTensor dQ(tr, "dQ", p.q_elems(), p.dtype, Role::output);
  GlobalTensor dK(tr, "dK", p.k_elems(), p.dtype, Role::output);
  GlobalTensor dV(tr, "dV", p.v_elems(), p.dtype, Role::output);

  // Pass 1: D_i = rowsum(dO_i o O_i). Algorithm 4 computes it inside the loop (line 19),
  // which reloads O_i on every step; one pass up front reads O once and keeps D (N floats).
  {
    Tile dO_i = sram.tile("dO_i (Br x dv)", std::size_t(Br) * dv);
    Tile O_i = sram.tile("O_i (Br x dv)", std::size_t(Br) * dv);
    Tile D_i = sram.tile("D_i (Br)", Br);
    for (int b = 0; b < p.batch; ++b)
      for (int h = 0; h < p.heads; ++h)
        for (int i = 0; i < Tr; ++i) {
          const int i0 = i * Br, rows = std::min(Br, p.nq - i0);
          const std::size_t at = p.o_off(b, h) + std::size_t(i0) * dv;
          dO.load(at, std::size_t(rows) * dv, dO_i.data());
          O.load(at, std::size_t(rows) * dv, O_i.data());
          for (int rr = 0; rr < rows; ++rr)
            D_i[rr] = dot(dO_i.data() + std::size_t(rr) * dv, O_i.data() + std::size_t(rr) * dv, dv);
          D.store(p.lse_off(b, h) + i0, rows, D_i.data());
        }
  }

  Tile K_j = sram.tile("K_j (Bc x d)", std::size_t(Bc) * d);
  Tile V_j = sram.tile("V_j (Bc x dv)", std::size_t(Bc) * dv);
  Tile dK_j = sram.tile("dK_j (Bc x d)", std::size_t(Bc) * d);
  Tile dV_j = sram.tile("dV_j (Bc x dv)", std::size_t(Bc) * dv);
  Tile Q_i = sram.tile("Q_i (Br x d)", std::size_t(Br) * d);
  Tile dO_i = sram.tile("dO_i (Br x dv)", std::size_t(Br) * dv);
  Tile dQ_i = sram.tile("dQ_i (Br x d)", std::size_t(Br) * d);
  Tile P_ij = sram.tile("P_ij (Br x Bc)", std::size_t(Br) * Bc);
  Tile dS_ij = sram.tile("dS_ij (Br x Bc)", std::size_t(Br) * Bc);  // dP_ij, then dS_ij in place
  Tile L_i = sram.tile("LSE_i (Br)", Br), D_i = sram.tile("D_i (Br)", Br);

  for (int b = 0; b < p.batch; ++b) {
    for (int hk = 0; hk < p.kv_heads; ++hk) {
      // One thread block per (batch, KV head): the query heads of its group run inside,
      // so the group's contributions to dK_j, dV_j add up on chip.
      const std::size_t k0 = p.k_off(b, hk), v0 = p.v_off(b, hk);

      // Q blocks whose rows are all empty have dQ = 0 and are never visited.
      for (int h = hk * g; h < (hk + 1) * g; ++h)
        for (int i = 0; i < Tr; ++i) {
          if (last_visit(p, bl, i) >= 0) continue;
          const int i0 = i * Br, rows = std::min(Br, p.nq - i0);
          dQ_i.fill(0.f);
          dQ.store(p.q_off(b, h) + std::size_t(i0) * d, std::size_t(rows) * d, dQ_i.data());
        }

      for (int j = 0; j < Tc; ++j) {  // line 7
        const int j0 = j * Bc, kr = std::min(Bc, p.nk - j0);
        K.load(k0 + std::size_t(j0) * d, std::size_t(kr) * d, K_j.data());  // line 8
        V.load(v0 + std::size_t(j0) * dv, std::size_t(kr) * dv, V_j.data());
        dK_j.fill(0.f);  // line 9
        dV_j.fill(0.f);

        for (int h = hk * g; h < (hk + 1) * g; ++h) {
          const std::size_t q0 = p.q_off(b, h), o0 = p.o_off(b, h), s0 = p.lse_off(b, h);
          for (int i = 0; i < Tr; ++i) {  // line 10
            const int last = last_visit(p, bl, i);
            if (j > last) continue;
            const int i0 = i * Br, rows = std::min(Br, p.nq - i0);
            // Line 11: Q_i, dO_i, LSE_i, D_i, and dQ_i as step j - 1 left it.
            Q.load(q0 + std::size_t(i0) * d, std::size_t(rows) * d, Q_i.data());
            dO.load(o0 + std::size_t(i0) * dv, std::size_t(rows) * dv, dO_i.data());
            LSE.load(s0 + i0, rows, L_i.data());
            D.load(s0 + i0, rows, D_i.data());
            if (j == 0) dQ_i.fill(0.f);
            else dQ_acc.load(q0 + std::size_t(i0) * d, std::size_t(rows) * d, dQ_i.data());

            for (int rr = 0; rr < rows; ++rr) {
              const int row = i0 + rr;
              const float* Qr = Q_i.data() + std::size_t(rr) * d;
              const float* dOr = dO_i.data() + std::size_t(rr) * dv;
              float* P = P_ij.data() + std::size_t(rr) * Bc;
              float* dS = dS_ij.data() + std::size_t(rr) * Bc;
              float* dQr = dQ_i.data() + std::size_t(rr) * d;
              for (int c = 0; c < kr; ++c) {
                const bool visible = p.visible(row, j0 + c);
                const float s = visible ? tau * dot(Qr, K_j.data() + std::size_t(c) * d, d) : kNegInf;
                // Lines 12-14: S_ij recomputed, P_ij = exp(S_ij - LSE_i): no N^2 matrix was kept.
                // EXERCISE ch03.3: recompute P_ij from S_ij and the stored LSE_i (0 when masked)
                //| const float prob = 0.f;  // TODO: your code here (s, visible and L_i[rr] are at hand)
                const float prob = visible ? std::exp(s - L_i[rr]) : 0.f;
                // END EXERCISE
                P[c] = prob;
                // Line 17: dP_ij = dO_i V_j^T; line 20: dS_ij = P_ij o (dP_ij - D_i).
                const float dp = dot(dOr, V_j.data() + std::size_t(c) * dv, dv);
                dS[c] = prob * (dp - D_i[rr]);
              }
              for (int c = 0; c < kr; ++c) {
                // Line 16: dV_j += P_ij^T dO_i.
                if (P[c] != 0.f) {
                  float* dVc = dV_j.data() + std::size_t(c) * dv;
                  for (int k = 0; k < dv; ++k) dVc[k] += P[c] * dOr[k];
                }
                if (dS[c] == 0.f) continue;
                // Line 21: dQ_i += tau dS_ij K_j; line 22: dK_j += tau dS_ij^T Q_i.
                const float ds = tau * dS[c];
                const float* Kc = K_j.data() + std::size_t(c) * d;
                float* dKc = dK_j.data() + std::size_t(c) * d;
                for (int k = 0; k < d; ++k) {
                  dQr[k] += ds * Kc[k];
                  dKc[k] += ds * Qr[k];
                }
              }
            }
            // S, dV, dP, dQ, dK: five matmuls to the forward's two, hence 2.5x its FLOPs.
            tr.add_flops(2.0 * rows * kr * (d + dv + dv + d + d));
            // Line 21's write: dQ_i back to HBM, in fp32 until its last step.
            if (j == last) dQ.store(q0 + std::size_t(i0) * d, std::size_t(rows) * d, dQ_i.data());
            else dQ_acc.store(q0 + std::size_t(i0) * d, std::size_t(rows) * d, dQ_i.data());
          }
        }
        // Line 24: dK_j, dV_j to HBM, once.
        dK.store(k0 + std::size_t(j0) * d, std::size_t(kr) * d, dK_j.data());
        dV.store(v0 + std::size_t(j0) * dv, std::size_t(kr) * dv, dV_j.data());
      }
    }
  }
  r.dq = dQ.host();
  r.dk = dK.host();
  r.dv = dV.host();
  r.sram_peak = sram.peak();
  return r;
}

// ----------------------------------------------------------------------------- traffic

Fa1Traffic fa1_forward_traffic(const Problem& p, Blocks b) {
  Fa1Traffic f;
  const double e = dtype_bytes(p.dtype), bh = double(p.batch) * p.heads;
  const int Tr = ceil_div(p.nq, b.Br);
  // EXERCISE ch03.4: predict the forward's bytes from B_r and B_c
  //| (void)e; (void)bh; (void)Tr;  // TODO: fill in f (see Fa1Traffic)
  f.kv_read = bh * p.nk * double(p.d + p.dv) * e;  // every K/V block, once per query head
  for (int i = 0; i < Tr; ++i) {
    const double rows = std::min(b.Br, p.nq - i * b.Br);
    const int last = last_visit(p, b, i);
    f.out_write += bh * rows * (p.dv * e + 4.0);  // O_i and LSE_i, once
    if (last < 0) continue;
    const double steps = last + 1.0;              // j = 0 .. last
    f.visits += bh * steps;
    f.q_read += bh * steps * rows * p.d * e;      // Q_i on every step
    f.state_read += bh * last * rows * (4.0 * p.dv + 8.0);   // (O_i, m_i, l_i) in fp32, j > 0
    f.state_write += bh * last * rows * (4.0 * p.dv + 8.0);  // and back, j < last
  }
  // END EXERCISE
  f.extra = bh * p.nq * (4.0 * p.dv + 8.0);  // O_acc, m, l
  return f;
}

Fa1Traffic fa1_backward_traffic(const Problem& p, Blocks b) {
  Fa1Traffic f;
  const double e = dtype_bytes(p.dtype), bh = double(p.batch) * p.heads, bhk = double(p.batch) * p.kv_heads;
  const int Tr = ceil_div(p.nq, b.Br);
  f.pre_read = bh * p.nq * 2.0 * p.dv * e;  // D pass: O and dO
  f.pre_write = bh * p.nq * 4.0;            //          D
  f.kv_read = bhk * p.nk * double(p.d + p.dv) * e;    // once per KV head: the group shares the block
  f.out_write = bhk * p.nk * double(p.d + p.dv) * e;  // dK, dV once
  for (int i = 0; i < Tr; ++i) {
    const double rows = std::min(b.Br, p.nq - i * b.Br);
    const int last = last_visit(p, b, i);
    f.out_write += bh * rows * p.d * e;  // dQ_i, once
    if (last < 0) continue;
    const double steps = last + 1.0;
    f.visits += bh * steps;
    f.q_read += bh * steps * rows * ((p.d + p.dv) * e + 8.0);  // Q_i, dO_i, LSE_i, D_i
    f.state_read += bh * last * rows * 4.0 * p.d;              // dQ_i in fp32, j > 0
    f.state_write += bh * last * rows * 4.0 * p.d;             // and back, j < last
  }
  f.extra = bh * p.nq * 4.0 + 4.0 * double(p.q_elems());  // D, dQ_acc
  return f;
}

double theorem2_scale(const Problem& p, std::size_t sram_bytes) {
  const double M = double(sram_bytes) / kOnChipElemBytes;
  const double dd = 0.5 * (p.d + p.dv);
  return double(p.batch) * p.heads * p.nq * double(p.nk) * dd * dd / M;
}

}  // namespace attn::ch03
