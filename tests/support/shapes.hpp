#pragma once
// The problem shapes the tests are written in: one line per awkward case.
#include "common/problem.hpp"

namespace testing_support {

/// B x Hq (Hkv KV heads) x Nq x Nk x d (= dv), causal or not, in dtype t.
inline attn::Problem shape(int b, int hq, int hkv, int nq, int nk, int d, bool causal,
                           attn::DType t = attn::DType::bf16) {
  attn::Problem p;
  p.batch = b;
  p.heads = hq;
  p.kv_heads = hkv;
  p.nq = nq;
  p.nk = nk;
  p.d = p.dv = d;
  p.causal = causal;
  p.dtype = t;
  return p;
}

}  // namespace testing_support
