// Chapter 04 CPU model: FlashAttention-2 forward (Algorithm 1) and backward
// (Algorithm 2), with the final kernel's tiles and counted HBM traffic.
#include "fa2_model.hpp"

#include <algorithm>
#include <cmath>

#include "common/index.hpp"
#include "common/online_softmax.hpp"

namespace attn::ch04 {
namespace {

constexpr float kNegInf = -INFINITY;

/// Keys [0, n_end) that rows [row0, row0 + rows) can see (causal skipping).
int key_end(const Problem& p, int row0, int rows) {
  if (!p.causal) return p.nk;
  // EXERCISE ch04.2: causal block skipping: the keys the block's rows see (the rule: common/index.hpp)
  //| return p.nk;  // TODO: your code here
  return CausalMask(p.nq, p.nk).key_end(row0 + rows);  // its last row sees the most
  // END EXERCISE
}

float dot(const float* a, const float* b, int n) {
  float acc = 0.f;
  for (int k = 0; k < n; ++k) acc += a[k] * b[k];
  return acc;
}

}  // namespace

std::size_t fa2_onchip_bytes(const Problem& p, Fa2Tiles t) {
  const std::size_t e = dtype_bytes(p.dtype);
  return e * (std::size_t(t.Br) * p.d + std::size_t(t.Bc) * (p.d + p.dv)) +   // Q_i, K_j, V_j (smem)
         4 * (std::size_t(t.Br) * t.Bc + std::size_t(t.Br) * p.dv + 2 * t.Br);  // S/P, O_i, m_i, l_i
}

Fa2ForwardResult fa2_forward_model(const Problem& p, const AttnInputs& in, std::size_t sram_bytes, Fa2Tiles t) {
  Fa2ForwardResult r;
  Traffic tq, tkv, to, tl;  // one counter per tensor, summed at the end
  const GlobalTensor Q(tq, "Q", in.q, p.dtype), K(tkv, "K", in.k, p.dtype), V(tkv, "V", in.v, p.dtype);
  GlobalTensor O(to, "O", p.o_elems(), p.dtype, Role::output);
  GlobalTensor L(tl, "LSE", p.lse_elems(), DType::f32, Role::output);
  OnChip sram(sram_bytes);
  const int e = dtype_bytes(p.dtype), Br = t.Br, Bc = t.Bc, d = p.d, dv = p.dv;
  Tile Qi = sram.tile("Q_i (shared memory)", std::size_t(Br) * d, e);
  Tile Kj = sram.tile("K_j (shared memory)", std::size_t(Bc) * d, e);
  Tile Vj = sram.tile("V_j (shared memory)", std::size_t(Bc) * dv, e);
  Tile S = sram.tile("S_ij / P_ij (registers)", std::size_t(Br) * Bc, 4);
  Tile Oi = sram.tile("O_i (registers)", std::size_t(Br) * dv, 4);
  Tile ml = sram.tile("m_i, l_i (registers)", 2 * std::size_t(Br), 4);
  const float scale_log2 = float(p.softmax_scale() * kLog2e);
  double flops = 0;

  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < p.heads; ++h) {
      const int hk = p.kv_head_of(h);
      for (int row0 = 0; row0 < p.nq; row0 += Br) {  // one thread block
        const int rows = std::min(Br, p.nq - row0);
        Q.load_block(p.q_off(b, h) + std::size_t(row0) * d, rows, d, d, Qi.data());  // Q_i: once
        Oi.fill(0.f);
        float* m = ml.data();
        float* l = ml.data() + Br;
        std::fill(m, m + Br, kNegInf);
        std::fill(l, l + Br, 0.f);
        const int n_end = key_end(p, row0, rows);
        for (int col0 = 0; col0 < n_end; col0 += Bc) {
          const int cols = std::min(Bc, p.nk - col0);
          K.load_block(p.k_off(b, hk) + std::size_t(col0) * d, cols, d, d, Kj.data());
          V.load_block(p.v_off(b, hk) + std::size_t(col0) * dv, cols, dv, dv, Vj.data());
          for (int r2 = 0; r2 < rows; ++r2) {
            const int row = row0 + r2;
            float* s = S.data() + std::size_t(r2) * Bc;
            float mx = kNegInf;
            for (int c = 0; c < cols; ++c) {
              const bool hidden = p.causal && !causal_visible(row, col0 + c, p.nq, p.nk);
              s[c] = hidden ? kNegInf : dot(Qi.data() + std::size_t(r2) * d, Kj.data() + std::size_t(c) * d, d);
              mx = std::max(mx, s[c]);
            }
            // The base-2 online softmax of the tensor-core steps: one FFMA and one exp2 per score.
            const float m_new = std::max(m[r2], mx * scale_log2);
            const float shift = finite_max(m_new);
            const float alpha = std::exp2(m[r2] - shift);
            m[r2] = m_new;
            float* o = Oi.data() + std::size_t(r2) * dv;
            // EXERCISE ch04.1: rescale the running output O_i to the new maximum
            //| (void)alpha;  // TODO: your code here
            for (int k = 0; k < dv; ++k) o[k] *= alpha;
            // END EXERCISE
            float rowsum = 0.f;
            for (int c = 0; c < cols; ++c) {
              const float pv = std::exp2(s[c] * scale_log2 - shift);
              rowsum += pv;
              const float pq = round_to(p.dtype, pv);  // P enters P V_j in the input type
              if (pq != 0.f)
                for (int k = 0; k < dv; ++k) o[k] += pq * Vj[std::size_t(c) * dv + k];
            }
            l[r2] = l[r2] * alpha + rowsum;
          }
          flops += 2.0 * rows * cols * (d + dv);
        }
        for (int r2 = 0; r2 < rows; ++r2) {  // O_i / l_i and the LSE: once
          const float inv = l[r2] > 0.f ? 1.f / l[r2] : 0.f;
          for (int k = 0; k < dv; ++k) Oi[std::size_t(r2) * dv + k] *= inv;
          L.set(p.lse_off(b, h) + row0 + r2, l[r2] > 0.f ? Base2::lse(m[r2], l[r2]) : kNegInf);
        }
        O.store_block(p.o_off(b, h) + std::size_t(row0) * dv, rows, dv, dv, Oi.data());
      }
    }
  r.q_read = tq.bytes_read;
  r.kv_read = tkv.bytes_read;
  r.o_written = to.bytes_written;
  r.lse_written = tl.bytes_written;
  r.traffic.bytes_read = tq.bytes_read + tkv.bytes_read;
  r.traffic.bytes_written = to.bytes_written + tl.bytes_written;
  r.traffic.flops = flops;
  r.o = O.host();
  r.lse = L.host();
  r.sram_peak = sram.peak();
  return r;
}

double fa2_forward_bytes(const Problem& p, Fa2Tiles t) {
  const double e = dtype_bytes(p.dtype);
  double kv_rows = 0;  // K/V rows loaded by one (batch, head)'s thread blocks
  for (int row0 = 0; row0 < p.nq; row0 += t.Br) {
    const int n_end = key_end(p, row0, std::min(t.Br, p.nq - row0));
    kv_rows += std::min(p.nk, (n_end + t.Bc - 1) / t.Bc * t.Bc);  // whole tiles, clipped at Nk
  }
  const double bh = double(p.batch) * p.heads;
  return bh * (e * (double(p.nq) * p.d + kv_rows * (p.d + p.dv) + double(p.nq) * p.dv) + 4.0 * p.nq);
}

Fa2BackwardResult fa2_backward_model(const Problem& p, const AttnInputs& in, std::size_t sram_bytes, Fa2Tiles t) {
  // The forward's O and LSE are inputs of the backward: computed on their own counters.
  const Fa2ForwardResult fwd = fa2_forward_model(p, in, sram_bytes, Fa2Tiles{});
  Fa2BackwardResult r;
  Traffic& tr = r.traffic;
  Traffic tdq;  // the dQ accumulator's own counter
  const GlobalTensor Q(tr, "Q", in.q, p.dtype), K(tr, "K", in.k, p.dtype), V(tr, "V", in.v, p.dtype);
  const GlobalTensor O(tr, "O", fwd.o, p.dtype), dO(tr, "dO", in.dout, p.dtype), L(tr, "LSE", fwd.lse, DType::f32);
  GlobalTensor Dt(tr, "D", p.lse_elems(), DType::f32, Role::scratch);
  GlobalTensor dQacc(tdq, "dQ accumulator", p.q_elems(), DType::f32, Role::scratch);
  GlobalTensor dQ(tr, "dQ", p.q_elems(), p.dtype, Role::output);
  GlobalTensor dK(tr, "dK", p.k_elems(), p.dtype, Role::output);
  GlobalTensor dV(tr, "dV", p.v_elems(), p.dtype, Role::output);
  const int e = dtype_bytes(p.dtype), Br = t.Br, Bc = t.Bc, d = p.d, dv = p.dv;
  const float tau = float(p.softmax_scale());
  const CausalMask mask(p.nq, p.nk);

  // Preprocess: D_i = dO_i . O_i, and dQ's accumulator zeroed.
  {
    std::vector<float> a(dv), bq(dv), zeros(d, 0.f);
    for (std::size_t row = 0; row < p.lse_elems(); ++row) {
      O.load(row * dv, dv, a.data());
      dO.load(row * dv, dv, bq.data());
      Dt.set(row, dot(a.data(), bq.data(), dv));
      dQacc.store(row * d, d, zeros.data());
    }
  }

  OnChip sram(sram_bytes);
  Tile Kj = sram.tile("K_j (shared memory)", std::size_t(Bc) * d, e);
  Tile Vj = sram.tile("V_j (shared memory)", std::size_t(Bc) * dv, e);
  Tile Qi = sram.tile("Q_i (shared memory)", std::size_t(Br) * d, e);
  Tile dOi = sram.tile("dO_i (shared memory)", std::size_t(Br) * dv, e);
  Tile dSt = sram.tile("dS^T (shared memory)", std::size_t(Bc) * Br, e);
  Tile stats = sram.tile("LSE_i, D_i (shared memory)", 2 * std::size_t(Br), 4);
  Tile P = sram.tile("P^T (registers)", std::size_t(Bc) * Br, 4);
  Tile dP = sram.tile("dP^T (registers)", std::size_t(Bc) * Br, 4);
  Tile dKj = sram.tile("dK_j (registers)", std::size_t(Bc) * d, 4);
  Tile dVj = sram.tile("dV_j (registers)", std::size_t(Bc) * dv, 4);
  Tile dQi = sram.tile("dQ_i partial (registers)", std::size_t(Br) * d, 4);
  double flops = 0;

  for (int b = 0; b < p.batch; ++b)
    for (int hk = 0; hk < p.kv_heads; ++hk)
      for (int col0 = 0; col0 < p.nk; col0 += Bc) {  // one thread block per K/V block
        const int cols = std::min(Bc, p.nk - col0);
        K.load_block(p.k_off(b, hk) + std::size_t(col0) * d, cols, d, d, Kj.data());
        V.load_block(p.v_off(b, hk) + std::size_t(col0) * dv, cols, dv, dv, Vj.data());
        dKj.fill(0.f);
        dVj.fill(0.f);
        const int i_first = p.causal ? mask.first_query(col0) / Br * Br : 0;
        for (int h = hk * p.group(); h < (hk + 1) * p.group(); ++h)
          for (int row0 = i_first; row0 < p.nq; row0 += Br) {
            const int rows = std::min(Br, p.nq - row0);
            Q.load_block(p.q_off(b, h) + std::size_t(row0) * d, rows, d, d, Qi.data());
            dO.load_block(p.o_off(b, h) + std::size_t(row0) * dv, rows, dv, dv, dOi.data());
            L.load(p.lse_off(b, h) + row0, rows, stats.data());
            Dt.load(p.lse_off(b, h) + row0, rows, stats.data() + Br);
            dQi.fill(0.f);
            for (int c = 0; c < cols; ++c)
              for (int r2 = 0; r2 < rows; ++r2) {
                const int row = row0 + r2, key = col0 + c;
                const float lse = stats[r2];
                float pv = 0.f;
                if (!(p.causal && !mask.visible(row, key)) && lse != kNegInf)
                  pv = std::exp(tau * dot(Qi.data() + std::size_t(r2) * d, Kj.data() + std::size_t(c) * d, d) - lse);
                const float dp = dot(dOi.data() + std::size_t(r2) * dv, Vj.data() + std::size_t(c) * dv, dv);
                const float ds = round_to(p.dtype, pv * (dp - stats[Br + r2]));  // dS enters two products
                const float pq = round_to(p.dtype, pv);
                P[std::size_t(c) * Br + r2] = pq;
                dP[std::size_t(c) * Br + r2] = dp;
                dSt[std::size_t(c) * Br + r2] = ds;
                for (int k = 0; k < dv; ++k) dVj[std::size_t(c) * dv + k] += pq * dOi[std::size_t(r2) * dv + k];
                for (int k = 0; k < d; ++k) {
                  dKj[std::size_t(c) * d + k] += ds * Qi[std::size_t(r2) * d + k];
                  dQi[std::size_t(r2) * d + k] += ds * Kj[std::size_t(c) * d + k];
                }
              }
            flops += 2.0 * rows * cols * (2.0 * d + 2.0 * dv + d);  // S, dP, dV, dK, dQ
            // dQ_i += tau dS K_j: an atomic add is a read and a write of each fp32 element.
            std::vector<float> acc(std::size_t(rows) * d);
            // EXERCISE ch04.4: add tau dS K_j into dQ's accumulator in HBM (read, add, write back)
            //| for (std::size_t k = 0; k < acc.size(); ++k) acc[k] = tau * dQi[k];  // TODO: your code here
            dQacc.load_block(p.q_off(b, h) + std::size_t(row0) * d, rows, d, d, acc.data());
            for (std::size_t k = 0; k < acc.size(); ++k) acc[k] += tau * dQi[k];
            // END EXERCISE
            dQacc.store_block(p.q_off(b, h) + std::size_t(row0) * d, rows, d, d, acc.data());
          }
        for (std::size_t k = 0; k < std::size_t(cols) * d; ++k) dKj[k] *= tau;
        dK.store_block(p.k_off(b, hk) + std::size_t(col0) * d, cols, d, d, dKj.data());
        dV.store_block(p.v_off(b, hk) + std::size_t(col0) * dv, cols, dv, dv, dVj.data());
      }
  // Postprocess: the fp32 accumulator becomes dQ in the input type.
  {
    std::vector<float> row(d);
    for (std::size_t r2 = 0; r2 < p.lse_elems(); ++r2) {
      dQacc.load(r2 * d, d, row.data());
      dQ.store(r2 * d, d, row.data());
    }
  }
  r.dq_accum_bytes = tdq.bytes();
  tr.bytes_read += tdq.bytes_read;
  tr.bytes_written += tdq.bytes_written;
  tr.extra_peak += tdq.extra_peak;
  tr.flops = flops;
  r.dq = dQ.host();
  r.dk = dK.host();
  r.dv = dV.host();
  return r;
}

}  // namespace attn::ch04
