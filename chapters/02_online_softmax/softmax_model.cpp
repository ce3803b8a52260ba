// Chapter 02 CPU models: the softmax of rows of scores, step 0 to step 4, with counted traffic.
#include "softmax_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace attn::ch02 {

const char* variant_name(Variant v) {
  switch (v) {
    case Variant::naive: return "naive (no max shift), 2 passes";
    case Variant::safe3: return "safe, 3 passes";
    case Variant::online2: return "online, 2 passes";
    case Variant::online_on_chip: return "online, 2 passes, row on chip";
    case Variant::fused: return "fused with V, 1 pass";
  }
  return "?";
}

int variant_sweeps(Variant v) {
  switch (v) {
    case Variant::safe3: return 3;
    case Variant::fused: return 1;
    default: return 2;
  }
}

std::vector<Variant> all_variants() {
  return {Variant::naive, Variant::safe3, Variant::online2, Variant::online_on_chip, Variant::fused};
}

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

/// Row r of S: where it starts and the last key it sees.
struct RowAt {
  std::size_t off;
  int last;
};

RowAt row_at(const Problem& p, std::size_t r) {
  return {r * std::size_t(p.nk), last_visible(p, int(r % std::size_t(p.nq)))};
}

/// One sweep over a row as the kernel's block makes it, one wave of kWave scores at a
/// time (256 threads x 4 float4 each): the wave arrives in `wave` as x_j = tau S_ij, with
/// masked keys at -inf, and f(j0, n) consumes wave[0, n).
template <class F>
void sweep(const GlobalTensor& S, const RowAt& row, const Problem& p, float tau, Tile& wave, F&& f) {
  for (int j0 = 0; j0 < p.nk; j0 += kWave) {
    const int n = std::min(kWave, p.nk - j0);
    S.load(row.off + j0, n, wave.data());
    for (int k = 0; k < n; ++k) wave[k] = j0 + k <= row.last ? tau * wave[k] : kNegInf;
    f(j0, n);
  }
}

/// The last sweep of every softmax variant: P_ij = e^(x_ij - shift) * inv_l, written once.
void write_p(const GlobalTensor& S, GlobalTensor& P, const RowAt& row, const Problem& p, float tau, Tile& wave,
             float shift, float inv_l) {
  sweep(S, row, p, tau, wave, [&](int j0, int n) {
    for (int k = 0; k < n; ++k) wave[k] = std::exp(wave[k] - shift) * inv_l;
    P.store(row.off + j0, n, wave.data());
  });
}

// Step 0: y_j = e^(x_j) / sum_k e^(x_k). Two sweeps, and e^x overflows fp32 above x = 88.72.
void naive_row(const GlobalTensor& S, GlobalTensor& P, GlobalTensor& L, std::size_t r, const Problem& p, float tau,
               Tile& wave) {
  const RowAt row = row_at(p, r);
  float l = 0.f;
  sweep(S, row, p, tau, wave, [&](int, int n) {
    for (int k = 0; k < n; ++k) l += std::exp(wave[k]);  // no shift
  });
  sweep(S, row, p, tau, wave, [&](int j0, int n) {
    for (int k = 0; k < n; ++k) wave[k] = l > 0.f ? std::exp(wave[k]) / l : 0.f;
    P.store(row.off + j0, n, wave.data());
  });
  L.set(r, std::log(l));  // log 0 = -inf for an empty row; log inf = inf after an overflow
}

// Step 1: the safe softmax. Sweep 1 finds m_i, sweep 2 sums e^(x - m_i), sweep 3 writes P.
void safe3_row(const GlobalTensor& S, GlobalTensor& P, GlobalTensor& L, std::size_t r, const Problem& p, float tau,
               Tile& wave) {
  const RowAt row = row_at(p, r);
  float m = kNegInf;
  sweep(S, row, p, tau, wave, [&](int, int n) {
    for (int k = 0; k < n; ++k) m = std::max(m, wave[k]);
  });
  // EXERCISE ch02.3: a fully masked row (m = -inf) must give P = 0 and LSE = -inf, never NaN
  //| const float shift = m;
  //| float l = 0.f;
  //| sweep(S, row, p, tau, wave, [&](int, int n) {
  //|   for (int k = 0; k < n; ++k) l += std::exp(wave[k] - shift);
  //| });
  //| const float inv_l = 1.f / l;
  //| const float lse = m + std::log(l);  // TODO: what do these give when every key is masked?
  const float shift = finite_max(m);  // e^(-inf - 0) = 0, where e^(-inf - (-inf)) would be NaN
  float l = 0.f;
  sweep(S, row, p, tau, wave, [&](int, int n) {
    for (int k = 0; k < n; ++k) l += std::exp(wave[k] - shift);
  });
  const float inv_l = l > 0.f ? 1.f / l : 0.f;
  const float lse = l > 0.f ? m + std::log(l) : kNegInf;
  // END EXERCISE
  write_p(S, P, row, p, tau, wave, shift, inv_l);
  L.set(r, lse);
}

// Step 3: the online softmax. Sweep 1 keeps the running (m_i, l_i): each wave is summarised
// by its own (max, sum of e^(x - max)) and merged in, (m_i, l_i) <- (m_i, l_i) (+) (m_w, l_w).
// Sweep 2 writes P. (The kernel merges per thread and float4, then across the block.)
void online2_row(const GlobalTensor& S, GlobalTensor& P, GlobalTensor& L, std::size_t r, const Problem& p, float tau,
                 Tile& wave) {
  const RowAt row = row_at(p, r);
  SoftmaxState<float> st = SoftmaxState<float>::identity();
  sweep(S, row, p, tau, wave, [&](int, int n) {
    float m_w = kNegInf;
    for (int k = 0; k < n; ++k) m_w = std::max(m_w, wave[k]);
    float l_w = 0.f;
    for (int k = 0; k < n; ++k) l_w += std::exp(wave[k] - finite_max(m_w));
    st = merge(st, SoftmaxState<float>{m_w, l_w});
  });
  write_p(S, P, row, p, tau, wave, finite_max(st.m), st.l > 0.f ? 1.f / st.l : 0.f);
  L.set(r, st.lse());
}

// Step 3 with the row on chip: one read from HBM into registers; both sweeps run there.
void on_chip_row(const GlobalTensor& S, GlobalTensor& P, GlobalTensor& L, std::size_t r, const Problem& p, float tau,
                 Tile& x) {
  const RowAt row = row_at(p, r);
  S.load(row.off, std::size_t(p.nk), x.data());
  for (int j = 0; j < p.nk; ++j) x[j] = j <= row.last ? tau * x[j] : kNegInf;
  float m = kNegInf;
  for (int j = 0; j < p.nk; ++j) m = std::max(m, x[j]);
  const float shift = finite_max(m);
  float l = 0.f;
  for (int j = 0; j < p.nk; ++j) l += std::exp(x[j] - shift);
  const SoftmaxState<float> st{m, l};
  const float inv_l = l > 0.f ? 1.f / l : 0.f;
  for (int j = 0; j < p.nk; ++j) x[j] = std::exp(x[j] - shift) * inv_l;
  P.store(row.off, std::size_t(p.nk), x.data());
  L.set(r, st.lse());
}

// Step 4: one sweep over S and V per block of Br rows, carrying (m_i, l_i, O_i) with O_i
// unnormalised until the end. Each tile of Bc keys is summarised as
//   (m_ij, l_ij, O_ij) = (max_k x_k, sum_k e^(x_k - m_ij), sum_k e^(x_k - m_ij) V_k)
// and merged in; V_j is loaded once per block and shared by its Br rows.
void fused_model(const Problem& p, const GlobalTensor& S, const GlobalTensor& V, GlobalTensor& O, GlobalTensor& L,
                 OnChip& sram, float tau, Traffic& t) {
  const int dv = p.dv;
  Tile Vj = sram.tile("V_j (Bc x dv)", std::size_t(kBc) * dv);
  Tile Sij = sram.tile("S_ij (Br x Bc, registers)", std::size_t(kBr) * kBc);
  Tile Pij = sram.tile("P_ij (Br x Bc)", std::size_t(kBr) * kBc);
  Tile Oi = sram.tile("O_i (Br x dv, registers)", std::size_t(kBr) * dv);
  Tile Oij = sram.tile("O_ij (Br x dv, registers)", std::size_t(kBr) * dv);
  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < p.heads; ++h) {
      const std::size_t v_off = p.v_off(b, p.kv_head_of(h));
      const std::size_t row0 = (std::size_t(b) * p.heads + h) * p.nq;
      for (int i0 = 0; i0 < p.nq; i0 += kBr) {
        const int br = std::min(kBr, p.nq - i0);
        SoftmaxState<float> st[kBr];
        for (auto& s : st) s = SoftmaxState<float>::identity();
        Oi.fill(0.f);
        for (int j0 = 0; j0 < p.nk; j0 += kBc) {
          const int bc = std::min(kBc, p.nk - j0);
          V.load(v_off + std::size_t(j0) * dv, std::size_t(bc) * dv, Vj.data());
          for (int w = 0; w < br; ++w) {
            const RowAt row = row_at(p, row0 + i0 + w);
            float* x = &Sij[std::size_t(w) * kBc];
            float* P_ij = &Pij[std::size_t(w) * kBc];
            float* O_i = &Oi[std::size_t(w) * dv];
            float* O_ij = &Oij[std::size_t(w) * dv];
            S.load(row.off + j0, bc, x);
            for (int k = 0; k < bc; ++k) x[k] = j0 + k <= row.last ? tau * x[k] : kNegInf;
            // EXERCISE ch02.2: make the 2-pass 1-pass: summarise the tile as (m_ij, l_ij, O_ij) and merge it into (m_i, l_i, O_i)
            //| (void)x; (void)P_ij; (void)O_i; (void)O_ij;  // TODO: your code here
            float m_ij = kNegInf;
            for (int k = 0; k < bc; ++k) m_ij = std::max(m_ij, x[k]);
            const float shift = finite_max(m_ij);
            float l_ij = 0.f;
            for (int k = 0; k < bc; ++k) l_ij += P_ij[k] = std::exp(x[k] - shift);
            std::fill(O_ij, O_ij + dv, 0.f);
            for (int k = 0; k < bc; ++k)
              for (int c = 0; c < dv; ++c) O_ij[c] += P_ij[k] * Vj[std::size_t(k) * dv + c];
            merge_into(st[w], O_i, SoftmaxState<float>{m_ij, l_ij}, O_ij, dv);
            // END EXERCISE
            t.add_flops(2.0 * bc * dv);
          }
        }
        for (int w = 0; w < br; ++w) {
          const std::size_t r = row0 + i0 + w;
          float* out = &Oij[std::size_t(w) * dv];
          for (int c = 0; c < dv; ++c) out[c] = st[w].l > 0.f ? Oi[std::size_t(w) * dv + c] / st[w].l : 0.f;
          O.store(r * dv, std::size_t(dv), out);
          L.set(r, st[w].lse());
        }
      }
    }
}

}  // namespace

SoftmaxTraffic softmax_traffic(const Problem& p, Variant v) {
  SoftmaxTraffic t;
  const double rows = double(row_count(p)), row_bytes = 4.0 * p.nk, lse_bytes = 4.0 * rows;
  // EXERCISE ch02.5: count the bytes each variant reads and writes (hbm_sweeps, on_chip, read, write)
  //| (void)rows; (void)row_bytes; (void)lse_bytes;  // TODO: fill in t
  switch (v) {
    case Variant::safe3: t.hbm_sweeps = 3; break;
    case Variant::naive:
    case Variant::online2: t.hbm_sweeps = 2; break;
    case Variant::online_on_chip:
      t.on_chip = row_fits_in_registers(p.nk);
      t.hbm_sweeps = t.on_chip ? 1 : 2;
      break;
    case Variant::fused: t.hbm_sweeps = 1; break;
  }
  if (v == Variant::fused) {
    // S once; V_j once per block of Br rows (its rows below nk); O and the LSE written once.
    const double blocks = double(p.batch) * p.heads * ceil_div(p.nq, kBr);
    t.read = rows * row_bytes + blocks * 4.0 * p.nk * p.dv;
    t.write = 4.0 * rows * p.dv + lse_bytes;
  } else {
    // Every sweep that goes to global memory reads the whole row; P and the LSE are written once.
    t.read = t.hbm_sweeps * rows * row_bytes;
    t.write = rows * row_bytes + lse_bytes;
  }
  // END EXERCISE
  return t;
}

SoftmaxRun softmax_model(const Problem& p, const SoftmaxInputs& in, Variant v, std::size_t sram_bytes) {
  SoftmaxRun run;
  Traffic& t = run.traffic;
  OnChip sram(sram_bytes);
  const float tau = float(p.softmax_scale());
  const std::size_t rows = row_count(p);
  const GlobalTensor S(t, "S", in.s, DType::f32);
  GlobalTensor L(t, "LSE", rows, DType::f32, Role::output);

  if (v == Variant::fused) {
    const GlobalTensor V(t, "V", in.v, DType::f32);
    GlobalTensor O(t, "O", p.o_elems(), DType::f32, Role::output);
    fused_model(p, S, V, O, L, sram, tau, t);
    run.o = O.host();
  } else {
    GlobalTensor P(t, "P", p.s_elems(), DType::f32, Role::output);
    run.on_chip = v == Variant::online_on_chip && row_fits_in_registers(p.nk);
    if (run.on_chip) {
      // The registers of one block of up to 1024 threads: a budget of their own.
      OnChip regs(std::size_t(kRowInRegisters) * 4);
      Tile x = regs.tile("row of S (registers)", std::size_t(p.nk));
      for (std::size_t r = 0; r < rows; ++r) on_chip_row(S, P, L, r, p, tau, x);
    } else {
      Tile wave = sram.tile("S wave (256 threads x 4 float4)", kWave);
      for (std::size_t r = 0; r < rows; ++r) {
        switch (v) {
          case Variant::naive: naive_row(S, P, L, r, p, tau, wave); break;
          case Variant::safe3: safe3_row(S, P, L, r, p, tau, wave); break;
          default: online2_row(S, P, L, r, p, tau, wave); break;  // online2, and on_chip rows too long
        }
      }
    }
    run.p = P.host();
  }
  run.lse = L.host();
  run.sram_peak = sram.peak();
  return run;
}

}  // namespace attn::ch02
