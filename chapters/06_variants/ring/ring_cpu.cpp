// Ring attention on the CPU: the threads backend and the per-step compute as loops.
#include "ring/ring_cpu.hpp"

#include <algorithm>
#include <cmath>
#include <exception>
#include <mutex>
#include <thread>

#include "common/check.hpp"
#include "common/compare.hpp"
#include "common/errors.hpp"
#include "ring/ring_comm.hpp"
#include "ring/ring_merge.hpp"

namespace attn::ch06::ring {

void validate_ring(const Problem& p, int ranks) {
  if (p.nq != p.nk)
    throw UsageError("ring attention shards one sequence (self-attention): --nk must equal --n");
  if (ranks <= 0 || ranks > p.nq)
    throw UsageError("--ranks " + std::to_string(ranks) + " does not fit: it must be between 1 and N = " +
                     std::to_string(p.nq) + " (every rank holds at least one token)");
}

ShardGeometry ShardGeometry::of(Layout layout, int n, int ranks, int rank) {
  ShardGeometry g;
  g.chunks = shard_chunks(layout, n, ranks, rank);
  for (const Chunk& c : g.chunks) g.tokens += c.count;
  return g;
}

std::size_t ShardGeometry::chunk_offset(int c, int batch, int heads, int width) const {
  std::size_t rows = 0;
  for (int k = 0; k < c; ++k) rows += std::size_t(chunks[k].count);
  return std::size_t(batch) * heads * rows * width;
}

void gather_shard(const float* global, int batch, int heads, int n, int width, const ShardGeometry& g, float* shard) {
  for (int c = 0; c < int(g.chunks.size()); ++c) {
    const Chunk& ch = g.chunks[c];
    float* dst = shard + g.chunk_offset(c, batch, heads, width);
    for (int bh = 0; bh < batch * heads; ++bh)
      for (int i = 0; i < ch.count; ++i)
        std::copy_n(global + (std::size_t(bh) * n + ch.position(i)) * width, width,
                    dst + (std::size_t(bh) * ch.count + i) * width);
  }
}

void scatter_shard(const float* shard, int batch, int heads, int n, int width, const ShardGeometry& g, float* global) {
  for (int c = 0; c < int(g.chunks.size()); ++c) {
    const Chunk& ch = g.chunks[c];
    const float* src = shard + g.chunk_offset(c, batch, heads, width);
    for (int bh = 0; bh < batch * heads; ++bh)
      for (int i = 0; i < ch.count; ++i)
        std::copy_n(src + (std::size_t(bh) * ch.count + i) * width, width,
                    global + (std::size_t(bh) * n + ch.position(i)) * width);
  }
}

std::size_t kv_elems(const Problem& p, const ShardGeometry& g) {
  return g.elems(p.batch, p.kv_heads, p.d) + g.elems(p.batch, p.kv_heads, p.dv);
}

namespace {

/// Runs fn(r) on one thread per rank and rethrows the first failure.
template <class F>
void run_ranks(int ranks, F&& fn) {
  std::vector<std::thread> threads;
  std::exception_ptr error;
  std::mutex mu;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

void round_all(DType t, float* x, std::size_t n) {
  if (t == DType::f32) return;
  for (std::size_t k = 0; k < n; ++k) x[k] = round_to(t, x[k]);
}

/// One K/V shard as the message carries it: K chunks, then V chunks.
struct KvView {
  const float* base;
  const ShardGeometry* g;
  const Problem* p;
  /// K rows of chunk c for (batch b, kv head hk).
  const float* k(int c, int b, int hk) const {
    return base + g->chunk_offset(c, p->batch, p->kv_heads, p->d) +
           (std::size_t(b) * p->kv_heads + hk) * g->chunks[c].count * p->d;
  }
  const float* v(int c, int b, int hk) const {
    return base + g->elems(p->batch, p->kv_heads, p->d) + g->chunk_offset(c, p->batch, p->kv_heads, p->dv) +
           (std::size_t(b) * p->kv_heads + hk) * g->chunks[c].count * p->dv;
  }
};

/// Keys query row i of a pair sees: all, or j <= i + offset (clamped to the chunk).
int keys_seen(const PairMask& m, int i, int nk) {
  return m.kind == PairKind::full ? nk : std::clamp(i + m.offset + 1, 0, nk);
}

/// The forward of one pair for one query row, as chapter 04's kernel computes it:
/// fp32 scores and softmax, P rounded to the dtype before P V, O stored in the dtype,
/// the LSE in fp32. Writes (o_part, lse_part).
void attend_row(const Problem& p, const float* q, const float* k, const float* v, int nkeys, float tau,
                std::vector<float>& scores, float* o_part, float* lse_part) {
  if (nkeys == 0) {
    std::fill_n(o_part, p.dv, 0.f);
    *lse_part = neg_inf<float>();
    return;
  }
  float m = neg_inf<float>();
  for (int j = 0; j < nkeys; ++j) {
    float dot = 0.f;
    for (int c = 0; c < p.d; ++c) dot += q[c] * k[std::size_t(j) * p.d + c];
    scores[j] = tau * dot;
    m = std::max(m, scores[j]);
  }
  float l = 0.f;
  std::fill_n(o_part, p.dv, 0.f);
  for (int j = 0; j < nkeys; ++j) {
    const float pj = std::exp(scores[j] - m);
    l += pj;
    const float pr = round_to(p.dtype, pj);
    for (int c = 0; c < p.dv; ++c) o_part[c] += pr * v[std::size_t(j) * p.dv + c];
  }
  for (int c = 0; c < p.dv; ++c) o_part[c] = round_to(p.dtype, o_part[c] / l);
  *lse_part = m + std::log(l);
}

/// The state one rank keeps in the forward.
struct ForwardRank {
  ShardGeometry gq;
  std::vector<float> q, acc_o, acc_lse;
};

}  // namespace

RingForwardResult ring_forward_cpu(const Problem& p, const AttnInputs& in, const RingOptions& opt) {
  validate_ring(p, opt.ranks);
  const int P = opt.ranks, n = p.nq;
  const float tau = float(p.softmax_scale());
  std::vector<ShardGeometry> geo(P);
  std::size_t kv_cap = 0;
  for (int r = 0; r < P; ++r) {
    geo[r] = ShardGeometry::of(opt.layout, n, P, r);
    kv_cap = std::max(kv_cap, kv_elems(p, geo[r]));
  }
  ThreadMailboxes boxes(P);
  RingForwardResult res;
  res.o.assign(p.o_elems(), 0.f);
  res.lse.assign(p.lse_elems(), 0.f);
  res.stats.rank_work.assign(P, 0);
  std::mutex out_mu;

  run_ranks(P, [&](int r) {
    RingComm& comm = boxes.comm(r);
    const ShardGeometry& gq = geo[r];
    std::vector<float> q(gq.elems(p.batch, p.heads, p.d));
    gather_shard(in.q.data(), p.batch, p.heads, n, p.d, gq, q.data());
    std::vector<float> kv(kv_cap), kv_next(kv_cap);
    gather_shard(in.k.data(), p.batch, p.kv_heads, n, p.d, gq, kv.data());
    gather_shard(in.v.data(), p.batch, p.kv_heads, n, p.dv, gq, kv.data() + gq.elems(p.batch, p.kv_heads, p.d));

    std::vector<float> acc_o(gq.elems(p.batch, p.heads, p.dv), 0.f);
    std::vector<float> acc_lse(std::size_t(p.batch) * p.heads * gq.tokens, neg_inf<float>());
    std::vector<float> scores(static_cast<std::size_t>(n)), o_part(static_cast<std::size_t>(p.dv));
    long long work = 0;
    int computed = 0, skipped = 0;

    for (int s = 0; s < P; ++s) {
      const int src = kv_source(r, s, P);
      if (s + 1 < P)  // pass on what we hold while we compute with it
        comm.start(kChannelKV, kv.data(), kv_elems(p, geo[src]) * sizeof(float), kv_next.data(),
                   kv_cap * sizeof(float));
      const StepPlan plan = step_plan(opt.layout, n, P, r, s, p.causal);
      const KvView view{kv.data(), &geo[src], &p};
      // ring-step-skipped: this block's partials never reach the accumulator.
      const bool skip = r == opt.skip.rank && s == opt.skip.step;
      for (const StepPair& pr : plan.pairs) {
        if (skip) break;
        const Chunk& qc = gq.chunks[pr.q_chunk];
        const Chunk& kc = geo[src].chunks[pr.k_chunk];
        const std::size_t q0 = gq.chunk_offset(pr.q_chunk, p.batch, p.heads, p.d);
        const std::size_t o0 = gq.chunk_offset(pr.q_chunk, p.batch, p.heads, p.dv);
        const std::size_t l0 = gq.chunk_offset(pr.q_chunk, p.batch, p.heads, 1);
        for (int b = 0; b < p.batch; ++b)
          for (int h = 0; h < p.heads; ++h) {
            const int hk = p.kv_head_of(h);
            const std::size_t bh = std::size_t(b) * p.heads + h;
            for (int i = 0; i < qc.count; ++i) {
              const std::size_t row = bh * qc.count + i;
              float lse_part;
              attend_row(p, q.data() + q0 + row * p.d, view.k(pr.k_chunk, b, hk), view.v(pr.k_chunk, b, hk),
                         keys_seen(pr.mask, i, kc.count), tau, scores, o_part.data(), &lse_part);
              float* acc = acc_o.data() + o0 + row * p.dv;
              float& lse = acc_lse[l0 + row];
              lse = merge_lse(acc, lse, o_part.data(), lse_part, p.dv);
              round_all(opt.acc, acc, std::size_t(p.dv));  // the accumulator's storage between steps
            }
          }
        ++computed;
      }
      work += plan.work;
      skipped += plan.skipped;
      if (s + 1 < P) {
        comm.finish(kChannelKV);
        std::swap(kv, kv_next);
      }
    }
    round_all(p.dtype, acc_o.data(), acc_o.size());
    std::lock_guard<std::mutex> lock(out_mu);
    scatter_shard(acc_o.data(), p.batch, p.heads, n, p.dv, gq, res.o.data());
    scatter_shard(acc_lse.data(), p.batch, p.heads, n, 1, gq, res.lse.data());
    res.stats.rank_work[r] = work;
    res.stats.pairs_computed += computed;
    res.stats.pairs_skipped += skipped;
  });
  res.stats.bytes_sent = double(boxes.bytes_sent());
  return res;
}

RingBackwardResult ring_backward_cpu(const Problem& p, const AttnInputs& in, const std::vector<float>& o,
                                     const std::vector<float>& lse, const RingOptions& opt) {
  validate_ring(p, opt.ranks);
  if (in.dout.size() != p.o_elems()) throw UsageError("ring backward: dO is missing");
  const int P = opt.ranks, n = p.nq;
  const float tau = float(p.softmax_scale());
  std::vector<ShardGeometry> geo(P);
  std::size_t kv_cap = 0;
  for (int r = 0; r < P; ++r) {
    geo[r] = ShardGeometry::of(opt.layout, n, P, r);
    kv_cap = std::max(kv_cap, kv_elems(p, geo[r]));
  }
  ThreadMailboxes boxes(P);
  RingBackwardResult res;
  res.dq.assign(p.q_elems(), 0.f);
  res.dk.assign(p.k_elems(), 0.f);
  res.dv.assign(p.v_elems(), 0.f);
  res.stats.rank_work.assign(P, 0);
  std::mutex out_mu;

  run_ranks(P, [&](int r) {
    RingComm& comm = boxes.comm(r);
    const ShardGeometry& gq = geo[r];
    const std::size_t rows = std::size_t(p.batch) * p.heads * gq.tokens;
    std::vector<float> q(gq.elems(p.batch, p.heads, p.d)), dout(gq.elems(p.batch, p.heads, p.dv)),
        out(gq.elems(p.batch, p.heads, p.dv)), l(rows), delta(rows);
    gather_shard(in.q.data(), p.batch, p.heads, n, p.d, gq, q.data());
    gather_shard(in.dout.data(), p.batch, p.heads, n, p.dv, gq, dout.data());
    gather_shard(o.data(), p.batch, p.heads, n, p.dv, gq, out.data());
    gather_shard(lse.data(), p.batch, p.heads, n, 1, gq, l.data());
    for (std::size_t i = 0; i < rows; ++i) {  // D_i = dO_i . O_i, with the final O
      float acc = 0.f;
      for (int c = 0; c < p.dv; ++c) acc += dout[i * p.dv + c] * out[i * p.dv + c];
      delta[i] = acc;
    }
    std::vector<float> kv(kv_cap), kv_next(kv_cap), dkv(kv_cap), dkv_next(kv_cap), part(kv_cap);
    gather_shard(in.k.data(), p.batch, p.kv_heads, n, p.d, gq, kv.data());
    gather_shard(in.v.data(), p.batch, p.kv_heads, n, p.dv, gq, kv.data() + gq.elems(p.batch, p.kv_heads, p.d));
    std::vector<float> dq(q.size(), 0.f);
    // fp32 partials of one pair, rounded to the dtype as the kernel stores them
    std::vector<float> pdq, pdkv(kv_cap);
    long long work = 0;
    int computed = 0, skipped = 0;

    for (int s = 0; s < P; ++s) {
      const int src = kv_source(r, s, P);
      const ShardGeometry& gk = geo[src];
      const std::size_t kv_n = kv_elems(p, gk), k_part = gk.elems(p.batch, p.kv_heads, p.d);
      if (s + 1 < P)
        comm.start(kChannelKV, kv.data(), kv_n * sizeof(float), kv_next.data(), kv_cap * sizeof(float));
      std::fill_n(part.begin(), kv_n, 0.f);
      const StepPlan plan = step_plan(opt.layout, n, P, r, s, p.causal);
      const KvView view{kv.data(), &gk, &p};
      for (const StepPair& pr : plan.pairs) {
        const Chunk& qc = gq.chunks[pr.q_chunk];
        const Chunk& kc = gk.chunks[pr.k_chunk];
        const std::size_t q0 = gq.chunk_offset(pr.q_chunk, p.batch, p.heads, p.d);
        const std::size_t o0 = gq.chunk_offset(pr.q_chunk, p.batch, p.heads, p.dv);
        const std::size_t l0 = gq.chunk_offset(pr.q_chunk, p.batch, p.heads, 1);
        const std::size_t dk0 = gk.chunk_offset(pr.k_chunk, p.batch, p.kv_heads, p.d);
        const std::size_t dv0 = k_part + gk.chunk_offset(pr.k_chunk, p.batch, p.kv_heads, p.dv);
        pdq.assign(std::size_t(p.batch) * p.heads * qc.count * p.d, 0.f);
        const std::size_t pk = std::size_t(p.batch) * p.kv_heads * kc.count;
        std::fill_n(pdkv.begin(), pk * (p.d + p.dv), 0.f);
        float* pdk = pdkv.data();
        float* pdv = pdkv.data() + pk * p.d;
        for (int b = 0; b < p.batch; ++b)
          for (int h = 0; h < p.heads; ++h) {
            const int hk = p.kv_head_of(h);
            const std::size_t bh = std::size_t(b) * p.heads + h, bhk = std::size_t(b) * p.kv_heads + hk;
            const float* kk = view.k(pr.k_chunk, b, hk);
            const float* vv = view.v(pr.k_chunk, b, hk);
            for (int i = 0; i < qc.count; ++i) {
              const std::size_t row = bh * qc.count + i;
              const float* qi = q.data() + q0 + row * p.d;
              const float* doi = dout.data() + o0 + row * p.dv;
              const float li = l[l0 + row], di = delta[l0 + row];
              const int nkeys = keys_seen(pr.mask, i, kc.count);
              for (int j = 0; j < nkeys; ++j) {
                float dot = 0.f, dp = 0.f;
                for (int c = 0; c < p.d; ++c) dot += qi[c] * kk[std::size_t(j) * p.d + c];
                for (int c = 0; c < p.dv; ++c) dp += doi[c] * vv[std::size_t(j) * p.dv + c];
                const float pij = li == neg_inf<float>() ? 0.f : std::exp(tau * dot - li);
                const float pr16 = round_to(p.dtype, pij);
                const float ds = round_to(p.dtype, pij * (dp - di));
                float* dvj = pdv + (bhk * kc.count + j) * p.dv;
                float* dkj = pdk + (bhk * kc.count + j) * p.d;
                float* dqi = pdq.data() + row * p.d;
                for (int c = 0; c < p.dv; ++c) dvj[c] += pr16 * doi[c];
                for (int c = 0; c < p.d; ++c) {
                  dkj[c] += ds * qi[c];
                  dqi[c] += ds * kk[std::size_t(j) * p.d + c];
                }
              }
            }
          }
        // The pair's outputs, as the kernel writes them (scaled by tau, in the dtype),
        // added into fp32: dQ into the local accumulator, dK/dV into this step's part.
        for (std::size_t k = 0; k < pdq.size(); ++k) dq[q0 + k] += round_to(p.dtype, tau * pdq[k]);
        for (std::size_t k = 0; k < pk * p.d; ++k) part[dk0 + k] += round_to(p.dtype, tau * pdk[k]);
        for (std::size_t k = 0; k < pk * p.dv; ++k) part[dv0 + k] += round_to(p.dtype, pdv[k]);
        ++computed;
      }
      work += plan.work;
      skipped += plan.skipped;
      // The dK/dV accumulator of shard src: it arrives from rank r - 1, which worked on
      // src at step s - 1 (at step 0 it starts here, at zero).
      if (s > 0) {
        comm.finish(kChannelDKV);
        std::swap(dkv, dkv_next);
      } else {
        std::fill_n(dkv.begin(), kv_n, 0.f);
      }
      for (std::size_t k = 0; k < kv_n; ++k) dkv[k] += part[k];
      round_all(opt.acc, dkv.data(), kv_n);  // its storage while it travels
      // On to rank r + 1, which holds src at step s + 1; after the last step that is home.
      comm.start(kChannelDKV, dkv.data(), kv_n * sizeof(float), dkv_next.data(), kv_cap * sizeof(float));
      if (s + 1 < P) {
        comm.finish(kChannelKV);
        std::swap(kv, kv_next);
      }
    }
    comm.finish(kChannelDKV);  // our own dK_r, dV_r, home from rank r - 1
    std::swap(dkv, dkv_next);
    round_all(p.dtype, dq.data(), dq.size());
    const std::size_t k_own = gq.elems(p.batch, p.kv_heads, p.d);
    round_all(p.dtype, dkv.data(), kv_elems(p, gq));
    std::lock_guard<std::mutex> lock(out_mu);
    scatter_shard(dq.data(), p.batch, p.heads, n, p.d, gq, res.dq.data());
    scatter_shard(dkv.data(), p.batch, p.kv_heads, n, p.d, gq, res.dk.data());
    scatter_shard(dkv.data() + k_own, p.batch, p.kv_heads, n, p.dv, gq, res.dv.data());
    res.stats.rank_work[r] = work;
    res.stats.pairs_computed += computed;
    res.stats.pairs_skipped += skipped;
  });
  res.stats.bytes_sent = double(boxes.bytes_sent());
  return res;
}

TreeDecodeResult tree_decode_cpu(const Problem& p, const AttnInputs& in, int ranks) {
  if (ranks <= 0 || ranks > p.nk)
    throw UsageError("--ranks " + std::to_string(ranks) + " does not fit: it must be between 1 and Nk = " +
                     std::to_string(p.nk));
  const float tau = float(p.softmax_scale());
  const std::size_t rows = p.lse_elems();
  const std::size_t state = rows * (std::size_t(p.dv) + 1);  // per rank: O rows, then the LSEs
  ThreadMailboxes boxes(ranks);
  std::vector<std::vector<float>> result(ranks);

  run_ranks(ranks, [&](int r) {
    const Chunk kc = shard_chunks(Layout::contiguous, p.nk, ranks, r)[0];
    std::vector<float> mine(state), all(state * ranks), scores(static_cast<std::size_t>(p.nk));
    for (int b = 0; b < p.batch; ++b)
      for (int h = 0; h < p.heads; ++h) {
        const int hk = p.kv_head_of(h);
        for (int i = 0; i < p.nq; ++i) {
          const std::size_t row = p.lse_off(b, h) + i;
          // keys j of this shard the row sees: kc.start <= j < kc.start + count, j <= i + nk - nq
          const int last = p.causal ? std::min(kc.start + kc.count, i + (p.nk - p.nq) + 1) : kc.start + kc.count;
          const int nkeys = std::max(0, last - kc.start);
          attend_row(p, in.q.data() + p.q_off(b, h) + std::size_t(i) * p.d,
                     in.k.data() + p.k_off(b, hk) + std::size_t(kc.start) * p.d,
                     in.v.data() + p.v_off(b, hk) + std::size_t(kc.start) * p.dv, nkeys, tau, scores,
                     mine.data() + row * p.dv, mine.data() + rows * p.dv + row);
        }
      }
    // The all-reduce: every rank gets every partial, and folds them in rank order
    // with ⊕, so all ranks hold the same bits.
    boxes.comm(r).allgather(kChannelDecode, mine.data(), all.data(), state * sizeof(float));
    std::vector<float> o(rows * p.dv, 0.f), l(rows, neg_inf<float>());
    for (int k = 0; k < ranks; ++k) {
      const float* part = all.data() + std::size_t(k) * state;
      for (std::size_t row = 0; row < rows; ++row)
        l[row] = merge_lse(o.data() + row * p.dv, l[row], part + row * p.dv, part[rows * p.dv + row], p.dv);
    }
    round_all(p.dtype, o.data(), o.size());
    o.insert(o.end(), l.begin(), l.end());
    result[r] = std::move(o);
  });
  TreeDecodeResult t;
  t.ranks_agree = true;
  for (int r = 1; r < ranks; ++r) t.ranks_agree = t.ranks_agree && result[r] == result[0];
  t.o.assign(result[0].begin(), result[0].begin() + std::ptrdiff_t(rows * p.dv));
  t.lse.assign(result[0].begin() + std::ptrdiff_t(rows * p.dv), result[0].end());
  return t;
}

std::vector<PrecisionRow> precision_study(const Problem& p, const std::vector<int>& ranks, uint64_t seed) {
  const AttnInputs in = make_inputs(p, Dist::normal, seed, true);
  const ForwardOracle fwd(p, in, CheckPlan::full(p));
  const BackwardOracle bwd(p, in, BackwardPlan::full(p));
  std::vector<PrecisionRow> rows;
  for (int P : ranks) {
    PrecisionRow row;
    row.ranks = P;
    for (DType acc : {DType::f32, DType::bf16}) {
      RingOptions opt;
      opt.ranks = P;
      opt.acc = acc;
      const RingForwardResult f = ring_forward_cpu(p, in, opt);
      const CheckResult cf = fwd.judge(f.o, &f.lse);
      const RingBackwardResult b = ring_backward_cpu(p, in, f.o, f.lse, opt);
      const CheckResult cb = bwd.judge(b.dq, b.dk, b.dv);
      const TensorCheck& o = cf.tensors[0];
      const TensorCheck& dk = cb.tensors[1];
      const TensorCheck& dv = cb.tensors[2];
      const double dkv = std::max(dk.err.max_abs, dv.err.max_abs);
      if (acc == DType::f32) {
        row.o_f32 = o.err.max_abs;
        row.dkv_f32 = dkv;
        row.pass_f32 = cf.pass() && cb.pass();
      } else {
        row.o_bf16 = o.err.max_abs;
        row.dkv_bf16 = dkv;
        row.pass_bf16 = cf.pass() && cb.pass();
      }
      row.o_naive = o.naive.max_abs;
      row.o_tol = o.verdict.tolerance;
      row.dkv_naive = std::max(dk.naive.max_abs, dv.naive.max_abs);
      row.dkv_tol = std::min(dk.verdict.tolerance, dv.verdict.tolerance);
    }
    rows.push_back(row);
  }
  return rows;
}

}  // namespace attn::ch06::ring
