#include "gqa_mla/grouped_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#include "common/errors.hpp"
#include "common/online_softmax.hpp"

namespace attn::ch06 {
namespace {

int cdiv(long a, long b) { return int((a + b - 1) / b); }

/// One tile's rows: which query head and position each packed row stands for.
struct TileRows {
  std::vector<int> head, pos;  // per row of the tile (only the real rows)
};

TileRows tile_rows(const Problem& p, bool pack, int group_index, int m0, int mt) {
  TileRows r;
  const int g = p.group();
  const long rows = pack ? long(g) * p.nq : p.nq;
  for (long m = m0; m < std::min<long>(rows, m0 + mt); ++m) {
    if (pack) {
      const int hk = group_index % p.kv_heads;
      // EXERCISE ch06.4: packed row m of KV head hk: which query head, which position?
      //| r.head.push_back(hk * g);  // TODO: the G heads of the group follow one another, Nq rows each
      //| r.pos.push_back(int(m));
      r.head.push_back(hk * g + int(m / p.nq));
      r.pos.push_back(int(m % p.nq));
      // END EXERCISE
    } else {
      r.head.push_back(group_index % p.heads);
      r.pos.push_back(int(m));
    }
  }
  return r;
}

}  // namespace

long grouped_tiles(const Problem& p, bool pack, int m_tile) {
  return pack ? long(p.batch) * p.kv_heads * cdiv(long(p.group()) * p.nq, m_tile)
              : long(p.batch) * p.heads * cdiv(p.nq, m_tile);
}

double grouped_kv_bytes(const Problem& p, const GroupedOptions& opt) {
  const double e = dtype_bytes(p.dtype);
  const double per_tile = double(p.nk) * (p.d + (opt.v_in_k ? 0 : p.dv)) * e;
  return double(grouped_tiles(p, opt.pack, opt.m_tile)) * per_tile;
}

GroupedResult grouped_forward_model(const Problem& p, const AttnInputs& in, const GroupedOptions& opt) {
  if (opt.m_tile < 1 || opt.n_tile < 1 || opt.splits < 1) throw UsageError("tile sizes and splits must be >= 1");
  if (opt.v_in_k && p.dv > p.d) throw UsageError("V inside K needs dv <= d");
  GroupedResult res;
  Traffic& t = res.traffic;
  const DType dt = p.dtype;
  GlobalTensor Q(t, "Q", in.q, dt), K(t, "K", in.k, dt);
  GlobalTensor V(t, "V", opt.v_in_k ? std::vector<float>(1, 0.f) : in.v, dt);
  GlobalTensor O(t, "O", p.o_elems(), dt, Role::output);
  GlobalTensor L(t, "LSE", p.lse_elems(), DType::f32, Role::output);
  const int S = opt.splits, mt = opt.m_tile, bc = opt.n_tile, d = p.d, dv = p.dv;
  // Split-K scratch: per split and row, the unnormalised O (fp32), m and l.
  const std::size_t rows_total = std::size_t(p.batch) * p.heads * p.nq;
  std::unique_ptr<GlobalTensor> part_o, part_ml;
  if (S > 1) {
    part_o = std::make_unique<GlobalTensor>(t, "O_split", rows_total * S * dv, DType::f32, Role::scratch);
    part_ml = std::make_unique<GlobalTensor>(t, "ml_split", rows_total * S * 2, DType::f32, Role::scratch);
  }
  OnChip sram(opt.sram_bytes);
  const float tau2 = float(p.softmax_scale() * kLog2e);  // base 2, as the kernels
  const int groups = opt.pack ? p.batch * p.kv_heads : p.batch * p.heads;
  const long rows_per_group = opt.pack ? long(p.group()) * p.nq : p.nq;
  const int keys_per_split = cdiv(cdiv(p.nk, bc), S) * bc;
  double kv_before = 0;

  for (int gi = 0; gi < groups; ++gi) {
    const int b = gi / (opt.pack ? p.kv_heads : p.heads);
    for (long m0 = 0; m0 < rows_per_group; m0 += mt) {
      const TileRows tr = tile_rows(p, opt.pack, gi, int(m0), mt);
      const int nr = int(tr.head.size());
      const int hk = p.kv_head_of(tr.head[0]);  // every row of the tile shares it
      Tile q = sram.tile("Q tile", std::size_t(mt) * d, dtype_bytes(dt));
      for (int r = 0; r < nr; ++r) Q.load(p.q_off(b, tr.head[r]) + std::size_t(tr.pos[r]) * d, d, q.data() + r * d);
      Tile kt = sram.tile("K block", std::size_t(bc) * d, dtype_bytes(dt));
      Tile vt = opt.v_in_k ? Tile() : sram.tile("V block", std::size_t(bc) * dv, dtype_bytes(dt));
      // The last key any row of the tile sees (causal): blocks past it are skipped.
      int last_key = p.nk - 1;
      if (p.causal) {
        const int max_pos = *std::max_element(tr.pos.begin(), tr.pos.end());
        last_key = std::min(p.nk - 1, max_pos + p.nk - p.nq);
      }
      for (int s = 0; s < S; ++s) {
        ++res.tiles;
        const int k_lo = s * keys_per_split, k_hi = std::min(p.nk, (s + 1) * keys_per_split);
        std::vector<SoftmaxState<float, Base2>> st(nr, SoftmaxState<float, Base2>::identity());
        std::vector<float> acc(std::size_t(nr) * dv, 0.f), sc(bc), pr(bc);
        for (int j0 = k_lo; j0 < k_hi && j0 <= last_key; j0 += bc) {
          const int nb = std::min(bc, k_hi - j0);
          const double before = t.bytes_read;
          K.load_block(p.k_off(b, hk) + std::size_t(j0) * d, nb, d, d, kt.data());
          if (!opt.v_in_k) V.load_block(p.v_off(b, hk) + std::size_t(j0) * dv, nb, dv, dv, vt.data());
          kv_before += t.bytes_read - before;
          const float* vrow = opt.v_in_k ? kt.data() : vt.data();
          const int vld = opt.v_in_k ? d : dv;
          for (int r = 0; r < nr; ++r) {
            float mx = st[r].m;
            for (int j = 0; j < nb; ++j) {
              const int key = j0 + j;
              if (p.causal && key > tr.pos[r] + p.nk - p.nq) {
                sc[j] = -std::numeric_limits<float>::infinity();
                continue;
              }
              float a = 0;
              for (int c = 0; c < d; ++c) a += q[std::size_t(r) * d + c] * kt[std::size_t(j) * d + c];
              sc[j] = a * tau2;
              mx = std::max(mx, sc[j]);
            }
            const float shift = finite_max(mx);
            const float alpha = std::exp2(st[r].m - shift);
            float lsum = 0;
            for (int j = 0; j < nb; ++j) {
              const float e = std::exp2(sc[j] - shift);
              lsum += e;
              pr[j] = round_to(dt, e);  // P enters P V in the input dtype
            }
            st[r].l = st[r].l * alpha + lsum;
            st[r].m = mx;
            float* o = acc.data() + std::size_t(r) * dv;
            for (int c = 0; c < dv; ++c) o[c] *= alpha;
            for (int j = 0; j < nb; ++j)
              if (pr[j] != 0.f)
                for (int c = 0; c < dv; ++c) o[c] += pr[j] * vrow[std::size_t(j) * vld + c];
          }
          t.add_flops(2.0 * nr * nb * (d + dv));
        }
        for (int r = 0; r < nr; ++r) {
          const std::size_t row = p.lse_off(b, tr.head[r]) + tr.pos[r];
          float* o = acc.data() + std::size_t(r) * dv;
          if (S == 1) {
            const float inv = st[r].l > 0 ? 1.f / st[r].l : 0.f;
            for (int c = 0; c < dv; ++c) o[c] *= inv;
            O.store(row * dv, dv, o);
            L.set(row, st[r].lse());
          } else {
            part_o->store((row * S + s) * dv, dv, o);
            const float ml[2] = {st[r].m, st[r].l};
            part_ml->store((row * S + s) * 2, 2, ml);
          }
        }
      }
    }
  }
  if (S > 1) {
    // The combine kernel: one pass over every row, merging its S partial states with ⊕.
    std::vector<float> o(dv), ob(dv);
    float ml[2];
    for (std::size_t row = 0; row < rows_total; ++row) {
      SoftmaxState<float, Base2> sa = SoftmaxState<float, Base2>::identity();
      std::fill(o.begin(), o.end(), 0.f);
      for (int s = 0; s < S; ++s) {
        part_ml->load((row * S + s) * 2, 2, ml);
        part_o->load((row * S + s) * dv, dv, ob.data());
        // EXERCISE ch06.6: fold split s's (m, l, O) into the running (sa, o)
        //| sa = SoftmaxState<float, Base2>{ml[0], ml[1]};  // TODO: this keeps the last split only
        //| std::copy(ob.begin(), ob.end(), o.begin());
        merge_into(sa, o.data(), SoftmaxState<float, Base2>{ml[0], ml[1]}, ob.data(), dv);
        // END EXERCISE
      }
      const float inv = sa.l > 0 ? 1.f / sa.l : 0.f;
      for (float& x : o) x *= inv;
      O.store(row * dv, dv, o.data());
      L.set(row, sa.lse());
    }
  }
  res.o = O.host();
  res.lse = L.host();
  res.kv_bytes = kv_before;
  res.sram_peak = sram.peak();
  return res;
}

}  // namespace attn::ch06
