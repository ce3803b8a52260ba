// The CPU model of the decode kernels (see decode_model.hpp).
#include "decode_model.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <stdexcept>

#include "common/online_softmax.hpp"

namespace attn::ch07 {

using G = DecodeGeometry;
using State = SoftmaxState<float, Base2>;  // m in base-2 units, as the kernels keep it

DecodeModelResult decode_model(const DecodeBatch& b, const std::vector<float>& q, const KvPools& kv, int splits,
                               std::size_t sram_bytes) {
  validate(b);
  DecodeModelResult r;
  Traffic& tr = r.traffic;
  const int D = b.d, group = b.group(), chunks = head_chunks(group), S = std::max(1, splits);
  const float scale2 = float(b.softmax_scale() * kLog2e);  // the softmax scale in base 2, as the kernels use it
  const GlobalTensor Q(tr, "Q", q, DType::bf16);
  const GlobalTensor K(tr, "K pool", kv.k, DType::bf16), V(tr, "V pool", kv.v, DType::bf16);
  const bool quant = kv_quantised(b.kv_dtype);
  if (kv.dtype != b.kv_dtype) throw std::logic_error("decode_model: the pools' format is not the batch's");
  const std::size_t page_elems = std::size_t(b.page_size) * D;
  // An 8-bit pool: one byte per code, an INT4 pool half a byte (two codes per byte),
  // counted here (GlobalTensor counts 2-byte elements). The row is dequantised on chip,
  // code * scale (the kernels put the scales on S and P instead).
  auto load_codes = [&](const std::vector<float>& codes, const std::vector<float>& scales, std::size_t at, float* dst) {
    tr.bytes_read += double(kv_row_bytes(b.kv_dtype, D));
    const float sc = scales[at / page_elems];
    for (int e = 0; e < D; ++e) dst[e] = kv_dequant(codes[at + e], sc);
  };
  GlobalTensor O(tr, "O", std::size_t(b.batch()) * b.heads * D, DType::bf16, Role::output);
  GlobalTensor L(tr, "LSE", std::size_t(b.batch()) * b.heads, DType::f32, Role::output);
  // v2's partial states, [batch][heads][splits] (and [..][d]), fp32 scratch.
  std::unique_ptr<GlobalTensor> Pm, Pl, Po;
  if (S > 1) {
    const std::size_t rows = std::size_t(b.batch()) * b.heads * S;
    Pm = std::make_unique<GlobalTensor>(tr, "m partial", rows, DType::f32, Role::scratch);
    Pl = std::make_unique<GlobalTensor>(tr, "l partial", rows, DType::f32, Role::scratch);
    Po = std::make_unique<GlobalTensor>(tr, "O partial", rows * D, DType::f32, Role::scratch);
  }
  OnChip sram(sram_bytes);
  auto read_meta = [&](int words) { tr.bytes_read += 4.0 * words; };  // lengths and table entries, int32

  for (int s = 0; s < b.batch(); ++s) {
    const int len = b.lens[s];
    const int per = S > 1 ? keys_per_split(len, S) : len;
    for (int hk = 0; hk < b.kv_heads; ++hk)
      for (int c = 0; c < chunks; ++c)
        for (int sp = 0; sp < S; ++sp) {
          // ---- one thread block
          read_meta(1);  // lens[b]
          const int rows = std::min(G::kRows, group - c * G::kRows);
          const int h0 = hk * group + c * G::kRows;  // first query head of the block
          const int t_begin = std::min(len, sp * per), t_end = std::min(len, t_begin + per);
          Tile stages = sram.tile("K and V stages (3 x 2 x 64 x d, bf16, shared memory)",
                                  std::size_t(G::kStages) * 2 * G::kBc * D, 2);
          std::vector<float> q_rows(std::size_t(rows) * D);  // registers: the MMA's A fragments
          Q.load((std::size_t(s) * b.heads + h0) * D, q_rows.size(), q_rows.data());
          // Per warp: (m, l) and the unnormalised O of every row, in registers.
          std::vector<State> st(std::size_t(G::kWarps) * rows, State::identity());
          std::vector<float> acc(std::size_t(G::kWarps) * rows * D, 0.f);

          for (int it = 0, t0 = t_begin; t0 < t_end; ++it, t0 += G::kBc) {
            const int n = std::min(G::kBc, t_end - t0);
            float* Ks = stages.data() + std::size_t(it % G::kStages) * 2 * G::kBc * D;  // K_j: 64 x d
            float* Vs = Ks + std::size_t(G::kBc) * D;                                    // V_j: 64 x d
            // Table entries of the tile (and an 8-bit pool's K and V scale of each page).
            read_meta(((t0 + n - 1) / b.page_size - t0 / b.page_size + 1) * (quant ? 3 : 1));
            for (int row = 0; row < G::kBc; ++row) {
              if (row < n) {
                const std::size_t at = b.kv_index(s, hk, t0 + row);
                if (quant) {
                  load_codes(kv.k, kv.k_scale, at, Ks + std::size_t(row) * D);
                  load_codes(kv.v, kv.v_scale, at, Vs + std::size_t(row) * D);
                } else {
                  K.load(at, D, Ks + std::size_t(row) * D);
                  V.load(at, D, Vs + std::size_t(row) * D);
                }
              } else {  // past the end: zero-filled, never read from HBM
                std::fill_n(Ks + std::size_t(row) * D, D, 0.f);
                std::fill_n(Vs + std::size_t(row) * D, D, 0.f);
              }
            }
            for (int w = 0; w < G::kWarps; ++w) {
              const int k0 = w * G::kWarpKeys;  // this warp's 16 keys of the tile
              if (t0 + k0 >= t_end) continue;   // nothing left for this warp
              for (int i = 0; i < rows; ++i) {
                State& si = st[std::size_t(w) * rows + i];
                float* oi = acc.data() + (std::size_t(w) * rows + i) * D;
                // S_ij = tau log2(e) q_i . k_j for the warp's keys (base 2); keys past the end are masked.
                float x[G::kWarpKeys], mx = neg_inf<float>();
                for (int j = 0; j < G::kWarpKeys; ++j) {
                  float dot = 0.f;
                  if (t0 + k0 + j < t_end) {
                    for (int e = 0; e < D; ++e) dot += q_rows[std::size_t(i) * D + e] * Ks[std::size_t(k0 + j) * D + e];
                    x[j] = dot * scale2;
                  } else {
                    x[j] = neg_inf<float>();
                  }
                  mx = std::max(mx, x[j]);
                }
                // Online softmax over the warp's tile: one rescale per tile, as the kernel does.
                const float m_new = std::max(si.m, mx), shift = finite_max(m_new);
                const float alpha = std::exp2(si.m - shift);
                si.l *= alpha;
                for (int e = 0; e < D; ++e) oi[e] *= alpha;
                for (int j = 0; j < G::kWarpKeys; ++j) {
                  const float p = std::exp2(x[j] - shift);
                  si.l += p;
                  const float pb = round_to(DType::bf16, p);  // P enters the tensor-core product as bf16
                  if (pb != 0.f)
                    for (int e = 0; e < D; ++e) oi[e] += pb * Vs[std::size_t(k0 + j) * D + e];
                }
                si.m = m_new;
              }
              tr.add_flops(4.0 * rows * std::min(G::kWarpKeys, t_end - t0 - k0) * D);
            }
          }
          // The four warps saw disjoint keys: merge their states with the shared operator.
          for (int i = 0; i < rows; ++i) {
            State m0 = st[i];
            float* o0 = acc.data() + std::size_t(i) * D;
            for (int w = 1; w < G::kWarps; ++w)
              merge_into(m0, o0, st[std::size_t(w) * rows + i], acc.data() + (std::size_t(w) * rows + i) * D, D);
            const std::size_t row = std::size_t(s) * b.heads + h0 + i;
            if (S == 1) {
              std::vector<float> out(D);
              for (int e = 0; e < D; ++e) out[e] = m0.l > 0.f ? o0[e] / m0.l : 0.f;
              O.store(row * D, D, out.data());
              L.set(row, m0.lse());
            } else {
              Pm->set(row * S + sp, m0.m);
              Pl->set(row * S + sp, m0.l);
              Po->store((row * S + sp) * D, D, o0);
            }
          }
        }
  }

  if (S > 1) {
    // The second kernel: (m, l, O) of the splits merged in order, then normalised.
    std::vector<float> o(D), part(D);
    for (std::size_t row = 0; row < std::size_t(b.batch()) * b.heads; ++row) {
      State acc = State::identity();
      std::fill(o.begin(), o.end(), 0.f);
      for (int sp = 0; sp < S; ++sp) {
        const State ps{Pm->get(row * S + sp), Pl->get(row * S + sp)};
        Po->load((row * S + sp) * D, D, part.data());
        merge_into(acc, o.data(), ps, part.data(), D);
      }
      for (int e = 0; e < D; ++e) o[e] = acc.l > 0.f ? o[e] / acc.l : 0.f;
      O.store(row * D, D, o.data());
      L.set(row, acc.lse());
    }
  }
  r.o = O.host();
  r.lse = L.host();
  r.sram_peak = sram.peak();
  return r;
}

}  // namespace attn::ch07
