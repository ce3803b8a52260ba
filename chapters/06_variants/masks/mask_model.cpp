// Chapter 06, masks: the CPU model of the masked forward and backward. The loops are
// the kernels' (chapter 04's Algorithms 1 and 2); what changes is where the key loop
// gets its blocks from (the block map) and the three places a policy enters:
// the starting state (sink), the score (score mods) and the element mask (partial tiles).
#include "mask_model.hpp"

#include <algorithm>
#include <cmath>

#include "common/online_softmax.hpp"

namespace attn::ch06 {
namespace {

constexpr float kNegInf = -INFINITY;
using State = SoftmaxState<float, Base2>;

float dot(const float* a, const float* b, int n) {
  float acc = 0.f;
  for (int k = 0; k < n; ++k) acc += a[k] * b[k];
  return acc;
}

/// The state a row starts from, in base 2.
template <class P>
State initial_state(const P& pol, int h) {
  // EXERCISE ch06.2: the learnable sink: start every row from the sink's own state (base 2)
  //| (void)pol, (void)h;
  //| return State::identity();  // TODO: your code here (SoftmaxState::with_sink)
  if constexpr (P::kSink) return State::with_sink(pol.sink(h) * float(kLog2e));
  (void)pol, (void)h;
  return State::identity();
  // END EXERCISE
}

/// The base-2 score of pair (i, j) from q.k: tau log2(e) q.k, or score(tau q.k) log2(e).
template <class P>
float score2(const P& pol, float qk, float tau, float scale_log2, int b, int h, int i, int j) {
  if constexpr (P::kScore) return pol.score(qk * tau, b, h, i, j) * float(kLog2e);
  (void)pol, (void)tau, (void)b, (void)h, (void)i, (void)j;
  return qk * scale_log2;
}

/// The map's K/V blocks of forward row block (b, h, qb): partial ones first.
struct KeyList {
  const int* part;
  const int* full;
  int np, nf;
  int size() const { return np + nf; }
  int block(int n) const { return n < np ? part[n] : full[n - np]; }
  bool masked(int n) const { return n < np; }
};

KeyList forward_list(const BlockMap& m, int b, int h, int qb) {
  const std::size_t f = std::size_t(m.map_of(b, h)) * m.tq + qb;
  return {m.part.data() + f * m.tk, m.full.data() + f * m.tk, m.n_part[f], m.n_full[f]};
}

KeyList backward_list(const BlockMap& m, int b, int h, int kb) {
  const std::size_t f = std::size_t(m.map_of(b, h)) * m.tk + kb;
  return {m.q_part.data() + f * m.tq, m.q_full.data() + f * m.tq, m.q_n_part[f], m.q_n_full[f]};
}

template <class P>
MaskForwardResult forward(const Problem& p, const TokenLayout& L, const AttnInputs& in, const P& pol,
                          const BlockMap& map, std::size_t sram_bytes) {
  MaskForwardResult r;
  Traffic& tr = r.traffic;
  const GlobalTensor Q(tr, "Q", in.q, p.dtype), K(tr, "K", in.k, p.dtype), V(tr, "V", in.v, p.dtype);
  GlobalTensor O(tr, "O", p.o_elems(), p.dtype, Role::output);
  GlobalTensor LSE(tr, "LSE", p.lse_elems(), DType::f32, Role::output);
  OnChip sram(sram_bytes);
  const int e = dtype_bytes(p.dtype), Br = map.Br, Bc = map.Bc, d = p.d, dv = p.dv;
  Tile Qi = sram.tile("Q_i (shared memory)", std::size_t(Br) * d, e);
  Tile Kj = sram.tile("K_j (shared memory)", std::size_t(Bc) * d, e);
  Tile Vj = sram.tile("V_j (shared memory)", std::size_t(Bc) * dv, e);
  Tile S = sram.tile("S_ij / P_ij (registers)", std::size_t(Bc), 4);
  Tile Oi = sram.tile("O_i (registers)", std::size_t(Br) * dv, 4);
  Tile ml = sram.tile("m_i, l_i (registers)", 2 * std::size_t(Br), 4);
  const float tau = float(p.softmax_scale()), scale_log2 = float(p.softmax_scale() * kLog2e);
  std::vector<State> st(Br);

  for (const int item : map.order) {  // the scheduler's order: most kept tiles first
    const int bh = item / map.tq, qb = item % map.tq, b = bh / p.heads, h = bh % p.heads;
    const int hk = p.kv_head_of(h);
    const int row0 = qb * Br, rows = std::min(Br, p.nq - row0);
    Q.load_block(L.q.at(b, h, row0), rows, d, L.q.row, Qi.data());
    Oi.fill(0.f);
    for (int r2 = 0; r2 < rows; ++r2) st[r2] = initial_state(pol, h);
    const KeyList keys = forward_list(map, b, h, qb);
    for (int n = 0; n < keys.size(); ++n) {
      const int col0 = keys.block(n) * Bc, cols = std::min(Bc, p.nk - col0);
      const bool masked = keys.masked(n);
      K.load_block(L.k.at(b, hk, col0), cols, d, L.k.row, Kj.data());
      V.load_block(L.v.at(b, hk, col0), cols, dv, L.v.row, Vj.data());
      r.tiles_visited += 1;
      r.tiles_masked += masked;
      for (int r2 = 0; r2 < rows; ++r2) {
        const int i = row0 + r2;
        float* s = S.data();
        float mx = kNegInf;
        for (int c = 0; c < cols; ++c) {
          const int j = col0 + c;
          if (masked && !pol.keep(b, h, i, j)) {
            s[c] = kNegInf;
          } else {
            s[c] = score2(pol, dot(Qi.data() + std::size_t(r2) * d, Kj.data() + std::size_t(c) * d, d), tau,
                          scale_log2, b, h, i, j);
          }
          mx = std::max(mx, s[c]);
        }
        // The online-softmax update of chapter 04, base 2 (common/online_softmax.hpp).
        State& sr = st[r2];
        const float m_new = std::max(sr.m, mx), shift = finite_max(m_new);
        const float alpha = std::exp2(sr.m - shift);
        float rowsum = 0.f;
        float* o = Oi.data() + std::size_t(r2) * dv;
        for (int k = 0; k < dv; ++k) o[k] *= alpha;
        for (int c = 0; c < cols; ++c) {
          const float pv = std::exp2(s[c] - shift);
          rowsum += pv;
          const float pr = round_to(p.dtype, pv);  // P enters P V in the dtype, as in the kernel
          if (pr != 0.f)
            for (int k = 0; k < dv; ++k) o[k] += pr * Vj[std::size_t(c) * dv + k];
        }
        sr.l = sr.l * alpha + rowsum;
        sr.m = m_new;
        tr.add_flops(2.0 * d * cols + 2.0 * dv * cols);
      }
    }
    for (int r2 = 0; r2 < rows; ++r2) {
      const State& sr = st[r2];
      const float inv = sr.l > 0.f ? 1.f / sr.l : 0.f;  // an empty row's output is 0
      float* o = Oi.data() + std::size_t(r2) * dv;
      for (int k = 0; k < dv; ++k) o[k] *= inv;
      O.store(L.o.at(b, h, row0 + r2), dv, o);
      LSE.set(p.lse_off(b, h) + row0 + r2, sr.lse());
    }
  }
  r.o = O.host();
  r.lse = LSE.host();
  return r;
}

template <class P>
MaskBackwardResult backward(const Problem& p, const TokenLayout& L, const AttnInputs& in, const std::vector<float>& o_in,
                            const std::vector<float>& lse_in, const P& pol, const BlockMap& map,
                            std::size_t sram_bytes) {
  MaskBackwardResult r;
  Traffic& tr = r.traffic;
  const GlobalTensor Q(tr, "Q", in.q, p.dtype), K(tr, "K", in.k, p.dtype), V(tr, "V", in.v, p.dtype);
  const GlobalTensor dO(tr, "dO", in.dout, p.dtype), O(tr, "O", o_in, p.dtype);
  const GlobalTensor LSE(tr, "LSE", lse_in, DType::f32);
  GlobalTensor Dt(tr, "D", p.lse_elems(), DType::f32, Role::scratch);
  GlobalTensor dQacc(tr, "dQ accumulator (fp32)", p.q_elems(), DType::f32, Role::scratch);
  GlobalTensor dQ(tr, "dQ", p.q_elems(), p.dtype, Role::output);
  GlobalTensor dK(tr, "dK", p.k_elems(), p.dtype, Role::output), dV(tr, "dV", p.v_elems(), p.dtype, Role::output);
  const int d = p.d, dv = p.dv, Br = map.Br, Bc = map.Bc, e = dtype_bytes(p.dtype), g = p.group();
  const float tau = float(p.softmax_scale()), scale_log2 = float(p.softmax_scale() * kLog2e);

  // Preprocess: D_i = dO_i . O_i (and, with a learnable sink, dLoss/dsink_h = -sum_i P_sink,i D_i).
  if constexpr (P::kSink) r.dsink.assign(p.heads, 0.0);
  {
    std::vector<float> orow(dv), grow(dv);
    for (int b = 0; b < p.batch; ++b)
      for (int h = 0; h < p.heads; ++h)
        for (int i = 0; i < p.nq; ++i) {
          O.load(L.o.at(b, h, i), dv, orow.data());
          dO.load(L.o.at(b, h, i), dv, grow.data());
          const float D = dot(orow.data(), grow.data(), dv);
          Dt.set(p.lse_off(b, h) + i, D);
          if constexpr (P::kSink)
            r.dsink[h] -= std::exp(double(pol.sink(h)) - double(lse_in[p.lse_off(b, h) + i])) * D;
        }
  }

  OnChip sram(sram_bytes);
  Tile Kj = sram.tile("K_j (shared memory)", std::size_t(Bc) * d, e);
  Tile Vj = sram.tile("V_j (shared memory)", std::size_t(Bc) * dv, e);
  Tile dKj = sram.tile("dK_j (registers)", std::size_t(Bc) * d, 4);
  Tile dVj = sram.tile("dV_j (registers)", std::size_t(Bc) * dv, 4);
  Tile Qi = sram.tile("Q_i (shared memory)", std::size_t(Br) * d, e);
  Tile dOi = sram.tile("dO_i (shared memory)", std::size_t(Br) * dv, e);
  Tile LDi = sram.tile("LSE_i, D_i (shared memory)", 2 * std::size_t(Br), 4);
  Tile dQi = sram.tile("dQ_i update (registers)", std::size_t(d), 4);

  for (int b = 0; b < p.batch; ++b)
    for (int hk = 0; hk < p.kv_heads; ++hk)
      for (int kb = 0; kb < map.tk; ++kb) {  // one thread block per (b, KV head, key block)
        const int col0 = kb * Bc, cols = std::min(Bc, p.nk - col0);
        bool loaded = false;
        dKj.fill(0.f);
        dVj.fill(0.f);
        for (int h = hk * g; h < (hk + 1) * g; ++h) {
          const KeyList qs = backward_list(map, b, h, kb);
          if (qs.size() > 0 && !loaded) {
            K.load_block(L.k.at(b, hk, col0), cols, d, L.k.row, Kj.data());
            V.load_block(L.v.at(b, hk, col0), cols, dv, L.v.row, Vj.data());
            loaded = true;
          }
          for (int n = 0; n < qs.size(); ++n) {
            const int row0 = qs.block(n) * Br, rows = std::min(Br, p.nq - row0);
            const bool masked = qs.masked(n);
            r.tiles_visited += 1;
            Q.load_block(L.q.at(b, h, row0), rows, d, L.q.row, Qi.data());
            dO.load_block(L.o.at(b, h, row0), rows, dv, L.o.row, dOi.data());
            LSE.load(p.lse_off(b, h) + row0, rows, LDi.data());
            Dt.load(p.lse_off(b, h) + row0, rows, LDi.data() + Br);
            for (int r2 = 0; r2 < rows; ++r2) {
              const int i = row0 + r2;
              const float lse2 = LDi[r2] * float(kLog2e), D = LDi[Br + r2];
              const float* q = Qi.data() + std::size_t(r2) * d;
              const float* go = dOi.data() + std::size_t(r2) * dv;
              std::fill(dQi.data(), dQi.data() + d, 0.f);
              for (int c = 0; c < cols; ++c) {
                const int j = col0 + c;
                if (LDi[r2] == kNegInf || (masked && !pol.keep(b, h, i, j))) continue;  // P = 0
                const float qk = dot(q, Kj.data() + std::size_t(c) * d, d);
                const float pv = std::exp2(score2(pol, qk, tau, scale_log2, b, h, i, j) - lse2);
                const float pr = round_to(p.dtype, pv);
                const float dp = dot(go, Vj.data() + std::size_t(c) * dv, dv);
                float ds = pv * (dp - D);
                if constexpr (P::kScore) ds *= pol.dscore(qk * tau, b, h, i, j);
                ds = round_to(p.dtype, ds);
                for (int k = 0; k < dv; ++k) dVj[std::size_t(c) * dv + k] += pr * go[k];
                for (int k = 0; k < d; ++k) {
                  dQi[k] += tau * ds * Kj[std::size_t(c) * d + k];
                  dKj[std::size_t(c) * d + k] += tau * ds * q[k];
                }
              }
              tr.add_flops(2.0 * cols * (2 * d + 3 * dv));
              // dQ_i += dS K_j: the fp32 read-modify-write the kernel does with atomics.
              std::vector<float> acc(d);
              dQacc.load(L.q.at(b, h, i), d, acc.data());
              for (int k = 0; k < d; ++k) acc[k] += dQi[k];
              dQacc.store(L.q.at(b, h, i), d, acc.data());
            }
          }
        }
        dK.store_block(L.k.at(b, hk, col0), cols, d, L.k.row, dKj.data());
        dV.store_block(L.v.at(b, hk, col0), cols, dv, L.v.row, dVj.data());
      }
  // dQ: fp32 accumulator to the dtype.
  {
    std::vector<float> row(d);
    for (int b = 0; b < p.batch; ++b)
      for (int h = 0; h < p.heads; ++h)
        for (int i = 0; i < p.nq; ++i) {
          dQacc.load(L.q.at(b, h, i), d, row.data());
          dQ.store(L.q.at(b, h, i), d, row.data());
        }
  }
  r.dq = dQ.host();
  r.dk = dK.host();
  r.dv = dV.host();
  return r;
}

std::vector<int> host_doc(const MaskSpec& s) {
  return s.kind == MaskKind::document ? doc_of_tokens(s.doc_lens) : std::vector<int>{};
}

}  // namespace

MaskForwardResult mask_forward_model(const Problem& p, const MaskSpec& s, const TokenLayout& layout,
                                     const AttnInputs& in, const BlockMap& map, std::size_t sram_bytes) {
  const std::vector<int> doc = host_doc(s);
  return visit_policy(s, p, PolicyData{doc.data(), s.sink_logits.data()},
                      [&](const auto& pol) { return forward(p, layout, in, pol, map, sram_bytes); });
}

MaskBackwardResult mask_backward_model(const Problem& p, const MaskSpec& s, const TokenLayout& layout,
                                       const AttnInputs& in, const std::vector<float>& o,
                                       const std::vector<float>& lse, const BlockMap& map,
                                       std::size_t sram_bytes) {
  const std::vector<int> doc = host_doc(s);
  return visit_policy(s, p, PolicyData{doc.data(), s.sink_logits.data()},
                      [&](const auto& pol) { return backward(p, layout, in, o, lse, pol, map, sram_bytes); });
}

}  // namespace attn::ch06
