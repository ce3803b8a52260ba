// The backward's CPU model (backward_model.hpp): the kernels' loops over counted tensors.
#include "backward_model.hpp"

#include <algorithm>
#include <cmath>

#include "backward_gpu.hpp"  // backward_unsupported()
#include "backward_tiles.hpp"
#include "common/errors.hpp"
#include "common/index.hpp"
#include "common/online_softmax.hpp"
#include "fa3_model.hpp"

namespace attn::ch05 {
namespace {

float dot(const float* a, const float* b, int n) {
  float s = 0.f;
  for (int k = 0; k < n; ++k) s += a[k] * b[k];
  return s;
}

}  // namespace

// Declared in backward_gpu.hpp; defined here so that CPU-only builds have it too.
std::string backward_unsupported(const Problem& p) {
  if (p.d != p.dv) return "d != dv";
  if (p.dtype != DType::bf16 && p.dtype != DType::f16) return std::string(dtype_name(p.dtype)) + " inputs";
  if (p.d != 64 && p.d != 128) return "head dim " + std::to_string(p.d) + " (backward: 64, 128)";
  return "";
}

Fa3BackwardTraffic fa3_backward_traffic(const Problem& p) {
  Fa3BackwardTraffic t;
  const double e = dtype_bytes(p.dtype), d = p.d;
  const int Br = kBwdBr, Bc = kBwdBc, tr = ceil_div(p.nq, Br);
  const double heads = double(p.batch) * p.heads, rows_pad = double(tr) * Br;
  t.pre_read = heads * p.nq * (2 * d * e + 4);
  t.pre_write = heads * rows_pad * (2 * 4 + d * 4);
  for (int col0 = 0; col0 < p.nk; col0 += Bc) {
    const double cols = std::min(Bc, p.nk - col0);
    const int i_first = first_query_block(col0, Br, p.nq, p.nk, p.causal);
    double q_rows = 0;  // rows of Q_i (and dO_i) read per query head
    for (int i = i_first; i < tr; ++i) q_rows += std::min(Br, p.nq - i * Br);
    const double steps = double(tr - i_first) * p.group();  // per KV head
    const double kv_heads = double(p.batch) * p.kv_heads;
    t.main_read += kv_heads * (2 * cols * d * e + p.group() * q_rows * 2 * d * e + steps * 2 * Br * 4);
    t.main_write += kv_heads * 2 * cols * d * e;
    t.dq_add += kv_heads * steps * 2 * Br * d * 4;
  }
  t.post_read = heads * p.nq * d * 4;
  t.post_write = heads * p.nq * d * e;
  return t;
}

Fa3BackwardModelResult fa3_backward_model(const Problem& p, const AttnInputs& in, std::size_t sram_bytes) {
  if (p.d != p.dv) throw UsageError("the backward model takes d == dv");
  if (in.dout.size() != p.o_elems()) throw UsageError("the backward model needs dO (make_inputs(..., with_dout))");
  // O and LSE: the forward model's, on their own counter (not part of the backward's bytes).
  const Fa3ModelResult fwd = fa3_forward_model(p, in, schedule_for(Step::v8_head_dims, p.d, p.causal), sram_bytes);
  Fa3BackwardModelResult r;
  Traffic& tr = r.traffic;
  Traffic tadd;  // the accumulator's reads and writes by the reduce-adds
  const int Br = kBwdBr, Bc = kBwdBc, d = p.d, e = dtype_bytes(p.dtype);
  const int n_qblocks = ceil_div(p.nq, Br), rows_pad = n_qblocks * Br;
  const std::size_t heads = std::size_t(p.batch) * p.heads;
  const float tau = float(p.softmax_scale()), tau2 = float(p.softmax_scale() * kLog2e);
  const int diag = causal_diag(p.nq, p.nk);

  const GlobalTensor Q(tr, "Q", in.q, p.dtype), K(tr, "K", in.k, p.dtype), V(tr, "V", in.v, p.dtype);
  const GlobalTensor O(tr, "O", fwd.o, p.dtype), dO(tr, "dO", in.dout, p.dtype);
  const GlobalTensor L(tr, "LSE", fwd.lse, DType::f32);
  GlobalTensor L2(tr, "LSE log2 e (padded)", heads * rows_pad, DType::f32, Role::scratch);
  GlobalTensor Dt(tr, "D (padded)", heads * rows_pad, DType::f32, Role::scratch);
  GlobalTensor acc(tr, "dQ accumulator", heads * rows_pad * d, DType::f32, Role::scratch);
  GlobalTensor dQ(tr, "dQ", p.q_elems(), p.dtype, Role::output);
  GlobalTensor dK(tr, "dK", p.k_elems(), p.dtype, Role::output);
  GlobalTensor dV(tr, "dV", p.v_elems(), p.dtype, Role::output);

  // Preprocess: one padded row at a time.
  {
    std::vector<float> a(d), g(d), zeros(d, 0.f);
    for (std::size_t bh = 0; bh < heads; ++bh)
      for (int row = 0; row < rows_pad; ++row) {
        const std::size_t pr = bh * rows_pad + row;
        float dsum = 0.f, l2 = INFINITY;
        if (row < p.nq) {
          const std::size_t at = (bh * p.nq + row) * d;
          O.load(at, d, a.data());
          dO.load(at, d, g.data());
          dsum = dot(a.data(), g.data(), d);
          const float l = L.get(bh * p.nq + row);
          l2 = l == -INFINITY ? INFINITY : l * float(kLog2e);
        }
        Dt.set(pr, dsum);
        L2.set(pr, l2);
        acc.store(pr * d, d, zeros.data());
      }
  }

  OnChip sram(sram_bytes);
  Tile Kj = sram.tile("K_j (shared memory)", std::size_t(Bc) * d, e);
  Tile Vj = sram.tile("V_j (shared memory)", std::size_t(Bc) * d, e);
  Tile Qi = sram.tile("Q_i (shared memory)", std::size_t(Br) * d, e);
  Tile dOi = sram.tile("dO_i (shared memory)", std::size_t(Br) * d, e);
  Tile stats = sram.tile("LSE_i, D_i (shared memory)", 2 * std::size_t(Br), 4);
  Tile dSt = sram.tile("dS^T (shared memory)", std::size_t(Bc) * Br, e);
  Tile dQi = sram.tile("dQ_i (registers, then shared memory)", std::size_t(Br) * d, 4);
  Tile Pt = sram.tile("P^T (registers)", std::size_t(Bc) * Br, 4);
  Tile dKj = sram.tile("dK_j (registers)", std::size_t(Bc) * d, 4);
  Tile dVj = sram.tile("dV_j (registers)", std::size_t(Bc) * d, 4);
  std::vector<float> tile(std::size_t(Br) * d);

  for (int b = 0; b < p.batch; ++b)
    for (int hk = 0; hk < p.kv_heads; ++hk)
      for (int col0 = 0; col0 < p.nk; col0 += Bc) {  // one thread block per key block
        const int cols = std::min(Bc, p.nk - col0);
        K.load_block(p.k_off(b, hk) + std::size_t(col0) * d, cols, d, d, Kj.data());
        V.load_block(p.v_off(b, hk) + std::size_t(col0) * d, cols, d, d, Vj.data());
        dKj.fill(0.f);
        dVj.fill(0.f);
        const int i_first = first_query_block(col0, Br, p.nq, p.nk, p.causal);
        for (int h = hk * p.group(); h < (hk + 1) * p.group(); ++h)
          for (int i = i_first; i < n_qblocks; ++i) {
            const int row0 = i * Br, rows = std::min(Br, p.nq - row0);
            const std::size_t bh = std::size_t(b) * p.heads + h;
            Q.load_block(p.q_off(b, h) + std::size_t(row0) * d, rows, d, d, Qi.data());
            dO.load_block(p.o_off(b, h) + std::size_t(row0) * d, rows, d, d, dOi.data());
            L2.load(bh * rows_pad + row0, Br, stats.data());
            Dt.load(bh * rows_pad + row0, Br, stats.data() + Br);
            const bool masked = bwd_tile_masked(row0, col0, Br, Bc, p.nq, p.nk, p.causal);
            // S^T, P^T, dP^T, dS^T: keys as rows, as each consumer warpgroup holds them.
            for (int c = 0; c < cols; ++c)
              for (int q = 0; q < rows; ++q) {
                const int key = col0 + c, row = row0 + q;
                float pv = std::exp2(tau2 * dot(Kj.data() + std::size_t(c) * d, Qi.data() + std::size_t(q) * d, d) -
                                     stats[q]);
                if (masked && p.causal && key > row + diag) pv = 0.f;
                const float dp = dot(Vj.data() + std::size_t(c) * d, dOi.data() + std::size_t(q) * d, d);
                Pt[std::size_t(c) * Br + q] = round_to(p.dtype, pv);
                dSt[std::size_t(c) * Br + q] = round_to(p.dtype, pv * (dp - stats[Br + q]));
              }
            // dV_j += P^T dO_i, dK_j += dS^T Q_i, dQ_i = dS K_j.
            dQi.fill(0.f);
            for (int c = 0; c < cols; ++c)
              for (int q = 0; q < rows; ++q) {
                const float pq = Pt[std::size_t(c) * Br + q], ds = dSt[std::size_t(c) * Br + q];
                for (int k = 0; k < d; ++k) {
                  dVj[std::size_t(c) * d + k] += pq * dOi[std::size_t(q) * d + k];
                  dKj[std::size_t(c) * d + k] += ds * Qi[std::size_t(q) * d + k];
                  dQi[std::size_t(q) * d + k] += ds * Kj[std::size_t(c) * d + k];
                }
              }
            // The reduce-add: each half of the Br x d tile, contiguous in the accumulator,
            // read, added to and written back (in L2, by the copy engine, on the GPU).
            for (int half = 0; half < 2; ++half) {
              const std::size_t at = std::size_t(dq_accum_index((long long)bh, row0, half * (d / 2), n_qblocks, Br, d));
              const std::size_t n = std::size_t(Br) * (d / 2);
              Traffic before = tr;
              acc.load(at, n, tile.data());
              for (int q = 0; q < Br; ++q)
                for (int k = 0; k < d / 2; ++k) tile[std::size_t(q) * (d / 2) + k] += dQi[std::size_t(q) * d + half * (d / 2) + k];
              acc.store(at, n, tile.data());
              tadd.bytes_read += tr.bytes_read - before.bytes_read;
              tadd.bytes_written += tr.bytes_written - before.bytes_written;
            }
            ++r.dq_tile_adds;
          }
        for (std::size_t k = 0; k < std::size_t(cols) * d; ++k) dKj[k] *= tau;
        dK.store_block(p.k_off(b, hk) + std::size_t(col0) * d, cols, d, d, dKj.data());
        dV.store_block(p.v_off(b, hk) + std::size_t(col0) * d, cols, d, d, dVj.data());
      }
  // Postprocess: dQ = tau x accumulator, in the input dtype, [B][Hq][Nq][d].
  {
    std::vector<float> row(d);
    for (std::size_t bh = 0; bh < heads; ++bh)
      for (int q = 0; q < p.nq; ++q) {
        for (int half = 0; half < 2; ++half)
          acc.load(std::size_t(dq_accum_index((long long)bh, q, half * (d / 2), n_qblocks, Br, d)), d / 2,
                   row.data() + half * (d / 2));
        for (float& x : row) x *= tau;
        dQ.store((bh * p.nq + q) * d, d, row.data());
      }
  }
  r.dq_add_bytes = tadd.bytes();
  r.sram_peak = sram.peak();
  r.dq = dQ.host();
  r.dk = dK.host();
  r.dv = dV.host();
  return r;
}

}  // namespace attn::ch05
