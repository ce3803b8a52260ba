#include "common/problem.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "common/errors.hpp"

namespace attn {

double Problem::softmax_scale() const { return scale != 0 ? scale : 1.0 / std::sqrt(double(d)); }

int Problem::visible_keys(int i) const {
  if (!causal) return nk;
  return std::clamp(i + (nk - nq) + 1, 0, nk);
}

double Problem::ideal_fwd_bytes() const {
  const double e = dtype_bytes(dtype);
  return e * double(q_elems() + k_elems() + v_elems() + o_elems()) + 4.0 * double(lse_elems());
}

double Problem::ideal_bwd_bytes() const {
  // read Q, K, V, O, dO, LSE; write dQ, dK, dV
  const double e = dtype_bytes(dtype);
  return e * double(2 * q_elems() + 2 * k_elems() + 2 * v_elems() + 2 * o_elems()) +
         4.0 * double(lse_elems());
}

std::string Problem::describe() const {
  std::ostringstream s;
  s << "B=" << batch << " Hq=" << heads << " Hkv=" << kv_heads << " Nq=" << nq << " Nk=" << nk
    << " d=" << d;
  if (dv != d) s << " dv=" << dv;
  s << " " << dtype_name(dtype) << (causal ? " causal" : " non-causal");
  if (scale != 0) s << " scale=" << scale;
  return s.str();
}

double flops_forward(const Problem& p) {
  const double bh = double(p.batch) * p.heads;
  const double per_pair = 2.0 * (p.d + p.dv);  // q.k and p*v, a multiply-add = 2 FLOPs
  if (!p.causal) return bh * p.nq * double(p.nk) * per_pair;
  if (p.nq == p.nk) return 0.5 * bh * p.nq * double(p.nk) * per_pair;  // the convention
  double pairs = 0;
  for (int i = 0; i < p.nq; ++i) pairs += p.visible_keys(i);
  return bh * pairs * per_pair;
}

void validate(const Problem& p) {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw UsageError(what);
  };
  need(p.batch >= 1, "--batch must be >= 1");
  need(p.heads >= 1, "--heads must be >= 1");
  need(p.kv_heads >= 1, "--kv-heads must be >= 1");
  need(p.heads % p.kv_heads == 0,
       "--heads (" + std::to_string(p.heads) + ") must be a multiple of --kv-heads (" +
           std::to_string(p.kv_heads) + ")");
  need(p.nq >= 1, "--n must be >= 1");
  need(p.nk >= 1, "--nk must be >= 1");
  need(p.d >= 1, "--d must be >= 1");
  need(p.dv >= 1, "--dv must be >= 1");
  need(std::isfinite(p.scale) && p.scale >= 0, "--scale must be a finite number > 0");
}

}  // namespace attn
