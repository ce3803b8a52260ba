// Decode batches, the v1/v2 heuristic, the byte count and the fp64 check (see decode.hpp).
#include "decode.hpp"

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>

#include "common/errors.hpp"
#include "common/parallel.hpp"
#include "decode_checks.hpp"
#include "kv_values.hpp"

namespace attn::ch07 {

using G = DecodeGeometry;

int decode_blocks_per_sm(int d) {
  const std::size_t per_sm = 228 * 1024;  // Hopper: shared memory per SM
  return int(std::max<std::size_t>(1, per_sm / (decode_smem_bytes(d) + 1024)));
}

int decode_blocks_per_sm(int d, KvDtype kv) {
  const std::size_t per_sm = 228 * 1024;
  return int(std::max<std::size_t>(1, per_sm / (decode_smem_bytes(d, kv) + 1024)));
}

bool decode_head_dim_supported(int d) { return d == 64 || d == 128; }

int DecodeBatch::max_len() const { return lens.empty() ? 0 : *std::max_element(lens.begin(), lens.end()); }

long DecodeBatch::used_pages() const {
  long n = 0;
  for (int l : lens) n += ceil_div(l, page_size);
  return n;
}

long DecodeBatch::total_tokens() const {
  long n = 0;
  for (int l : lens) n += l;
  return n;
}

double DecodeBatch::softmax_scale() const { return scale != 0 ? scale : 1.0 / std::sqrt(double(d)); }

std::size_t DecodeBatch::kv_index(int b, int hk, int t) const {
  const int page = block_table[std::size_t(b) * max_pages + t / page_size];
  return ((std::size_t(page) * kv_heads + hk) * page_size + t % page_size) * std::size_t(d);
}

std::string DecodeBatch::describe() const {
  std::ostringstream s;
  const int lo = lens.empty() ? 0 : *std::min_element(lens.begin(), lens.end());
  s << "B=" << batch() << " Hq=" << heads << " Hkv=" << kv_heads << " d=" << d << " P=" << page_size << " L=";
  if (lo == max_len()) s << max_len();
  else s << lo << ".." << max_len() << " (ragged, " << total_tokens() << " tokens)";
  s << " " << kv_dtype_name(kv_dtype);
  return s.str();
}

void validate(const DecodeBatch& b) {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw UsageError(what);
  };
  need(b.batch() >= 1, "a decode batch needs at least one sequence");
  need(heads_grouped(b.heads, b.kv_heads), "--heads must be a multiple of --kv-heads");
  need(page_size_power_of_two(b.page_size) && b.page_size <= 256,
       "--page-size must be a power of two in [1, 256], got " + std::to_string(b.page_size));
  for (int l : b.lens) need(l >= 1, "every sequence needs at least one cached token");
  need(int(b.block_table.size()) == b.batch() * b.max_pages, "block table size does not match the batch");
  for (int s = 0; s < b.batch(); ++s)
    for (int i = 0; i < ceil_div(b.lens[s], b.page_size); ++i) {
      const int p = b.block_table[std::size_t(s) * b.max_pages + i];
      need(p >= 0 && p < b.num_pages, "block table of sequence " + std::to_string(s) + " points outside the pool");
    }
}

std::vector<int> ragged_lengths(int batch, int max_len, int page_size, uint64_t seed) {
  std::vector<int> awkward = {max_len, 1, page_size + 1, page_size - 1, page_size, 2 * page_size + 3};
  std::vector<int> lens;
  for (int x : awkward)
    if (int(lens.size()) < batch) lens.push_back(std::clamp(x, 1, max_len));
  Rng rng(seed * 0x2545f4914f6cdd1dull + 5);
  while (int(lens.size()) < batch) lens.push_back(rng.range(1, max_len));
  return lens;
}

DecodeBatch build_batch(int heads, int kv_heads, int d, int page_size, const std::vector<int>& lens,
                        int shared_prefix, uint64_t seed) {
  DecodeBatch out;
  out.heads = heads;
  out.kv_heads = kv_heads;
  out.d = d;
  out.page_size = page_size;
  out.lens = lens;
  const int P = page_size;
  const int prefix_pages = std::max(0, shared_prefix) / P;
  long need = prefix_pages;
  for (int l : lens) {
    const bool forked = prefix_pages > 0 && l >= prefix_pages * P;
    need += forked ? ceil_div(l - prefix_pages * P, P) : ceil_div(l, P);
  }
  // Spare pages so that the shuffled free list scatters the tables over a larger range.
  const long pages = need + need / 8 + 8;
  if (pages > (1L << 30)) throw UsageError("the decode batch needs more than 2^30 pages");
  PagePool pool(int(pages), P);
  pool.shuffle_free_list(seed * 0x94d049bb133111ebull + 3);
  PagedKvCache cache(pool);
  PagedKvCache::SeqId root = -1;
  if (prefix_pages > 0) {
    root = cache.create();
    cache.append_tokens(root, prefix_pages * P);
  }
  std::vector<PagedKvCache::SeqId> ids;
  for (int l : lens) {
    PagedKvCache::SeqId s;
    if (root >= 0 && l >= prefix_pages * P) {
      cache.fork(root, &s);  // shares the prefix pages
      cache.append_tokens(s, l - prefix_pages * P);
    } else {
      s = cache.create();
      cache.append_tokens(s, l);
    }
    ids.push_back(s);
  }
  if (root >= 0) cache.free(root);  // the forks keep the prefix alive
  const std::string why = cache.validate();
  if (!why.empty()) throw std::logic_error("build_batch: " + why);
  DecodeBatch b = batch_from_cache(cache, ids, heads);
  b.d = d;  // a pool without storage has no head dim of its own
  b.kv_heads = kv_heads;
  return b;
}

DecodeBatch batch_from_cache(const PagedKvCache& cache, const std::vector<PagedKvCache::SeqId>& seqs, int heads) {
  DecodeBatch b;
  const PagePool& pool = cache.pool();
  b.heads = heads;
  b.kv_heads = std::max(1, pool.kv_heads());
  b.d = pool.head_dim();
  b.page_size = pool.page_size();
  b.kv_dtype = pool.has_storage() ? pool.kv_dtype() : KvDtype::bf16;
  b.num_pages = pool.num_pages();
  for (auto s : seqs) {
    b.lens.push_back(cache.length(s));
    b.max_pages = std::max(b.max_pages, int(cache.block_table(s).size()));
  }
  b.block_table.assign(std::size_t(b.batch()) * b.max_pages, -1);
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    const auto& t = cache.block_table(seqs[i]);
    std::copy(t.begin(), t.end(), b.block_table.begin() + long(i) * b.max_pages);
  }
  return b;
}

// ----------------------------------------------------------------------------- contents

namespace {
/// Element i of a pool filled from kv_value(), as the cache receives it (bf16).
float hashed(uint64_t seed, uint32_t stream, std::size_t i, Dist dist) {
  return round_to(DType::bf16, kv_value(seed, stream, i, dist));
}
}  // namespace

float KvContents::k(std::size_t i) const {
  if (pools) return pools->dtype == KvDtype::bf16 ? pools->k[i] : kv_dequant(pools->k[i], pools->k_scale[i / page_elems]);
  const float x = hashed(seed, kStreamK, i, dist);
  if (dtype == KvDtype::bf16) return x;
  const float s = scales->k[i / page_elems];
  return kv_dequant(kv_code(dtype, x * q8::inverse_scale(s)), s);
}
float KvContents::v(std::size_t i) const {
  if (pools) return pools->dtype == KvDtype::bf16 ? pools->v[i] : kv_dequant(pools->v[i], pools->v_scale[i / page_elems]);
  const float x = hashed(seed, kStreamV, i, dist);
  if (dtype == KvDtype::bf16) return x;
  const float s = scales->v[i / page_elems];
  return kv_dequant(kv_code(dtype, x * q8::inverse_scale(s)), s);
}

KvContents hashed_contents(const DecodeBatch& b, uint64_t seed, Dist dist, const KvScales* scales) {
  KvContents c;
  c.seed = seed;
  c.dist = dist;
  c.dtype = b.kv_dtype;
  c.scales = scales;
  c.page_elems = std::size_t(b.page_size) * b.d;
  if (kv_quantised(b.kv_dtype) && !scales) throw std::logic_error("hashed_contents: an 8-bit pool needs its scales");
  return c;
}

KvContents pooled_contents(const DecodeBatch& b, const KvPools* pools) {
  KvContents c;
  c.pools = pools;
  c.dtype = pools->dtype;
  c.page_elems = std::size_t(b.page_size) * b.d;
  return c;
}

KvPools pools_of(const PagePool& pool) {
  KvPools p;
  p.k = pool.k_data();
  p.v = pool.v_data();
  p.dtype = pool.kv_dtype();
  p.k_scale = pool.k_scales();
  p.v_scale = pool.v_scales();
  return p;
}

KvScales pool_scales(const DecodeBatch& b, uint64_t seed, Dist dist) {
  KvScales s;
  if (!kv_quantised(b.kv_dtype)) return s;
  const std::size_t blocks = b.scale_elems(), per = std::size_t(b.page_size) * b.d;
  const float qmax = kv_qmax(b.kv_dtype);
  s.k.resize(blocks);
  s.v.resize(blocks);
  parallel_for(long(blocks), [&](long blk) {
    float ak = 0.f, av = 0.f;
    for (std::size_t i = std::size_t(blk) * per, e = i + per; i < e; ++i) {
      ak = std::max(ak, std::fabs(hashed(seed, kStreamK, i, dist)));
      av = std::max(av, std::fabs(hashed(seed, kStreamV, i, dist)));
    }
    s.k[blk] = q8::block_scale(ak, qmax);
    s.v[blk] = q8::block_scale(av, qmax);
  });
  return s;
}

KvPools fill_pools(const DecodeBatch& b, uint64_t seed, Dist dist) {
  KvPools p;
  p.dtype = b.kv_dtype;
  const std::size_t n = b.pool_elems();
  p.k.resize(n);
  p.v.resize(n);
  const bool q = kv_quantised(b.kv_dtype);
  KvScales sc;
  if (q) {
    sc = pool_scales(b, seed, dist);
    p.k_scale = sc.k;
    p.v_scale = sc.v;
  }
  const std::size_t per = std::size_t(b.page_size) * b.d;
  const long chunks = long((n + 65535) / 65536);
  parallel_for(chunks, [&](long c) {
    const std::size_t end = std::min(n, std::size_t(c + 1) * 65536);
    for (std::size_t i = std::size_t(c) * 65536; i < end; ++i) {
      const float k = hashed(seed, kStreamK, i, dist), v = hashed(seed, kStreamV, i, dist);
      if (!q) {
        p.k[i] = k;
        p.v[i] = v;
      } else {
        p.k[i] = kv_code(b.kv_dtype, k * q8::inverse_scale(sc.k[i / per]));
        p.v[i] = kv_code(b.kv_dtype, v * q8::inverse_scale(sc.v[i / per]));
      }
    }
  });
  return p;
}

std::vector<float> make_queries(const DecodeBatch& b, uint64_t seed, Dist dist) {
  std::vector<float> q;
  fill(q, std::size_t(b.batch()) * b.heads * b.d, dist, seed, 1, DType::bf16);
  return q;
}

// ----------------------------------------------------------------------------- v1 or v2

SplitPlan choose_splits(int batch, int kv_heads, int group, int max_len, int d, int sms, KvDtype kv,
                        int blocks_per_sm) {
  SplitPlan plan;
  plan.base_blocks = batch * kv_heads * head_chunks(group);
  plan.target_blocks = sms * (blocks_per_sm > 0 ? blocks_per_sm : decode_blocks_per_sm(d, kv));
  // EXERCISE ch07.3: make v2 pick its split count
  //| plan.splits = 1;  // TODO: your code here (fill the GPU, but keep every split >= kMinSplitKeys keys)
  // Enough splits that every SM holds as many blocks as it can run at once (one
  // wave: a second, partial wave would leave most SMs idle at the end)...
  int s = std::max(1, plan.target_blocks / std::max(1, plan.base_blocks));
  // ...but no split shorter than kMinSplitKeys: each split costs a pipeline fill and
  // a partial (m, l, O) written and read back.
  s = std::min(s, std::max(1, max_len / G::kMinSplitKeys));
  // Cutting whole tiles may need fewer splits than asked for.
  plan.splits = ceil_div(max_len, keys_per_split(max_len, s));
  // END EXERCISE
  std::ostringstream w;
  if (plan.splits == 1)
    w << "v1: " << plan.base_blocks << " blocks for " << plan.target_blocks << " block slots"
      << (plan.base_blocks >= plan.target_blocks / 2 ? " already fill the GPU" : ", and the sequences are too short to split");
  else
    w << "v2 with " << plan.splits << " splits of " << keys_per_split(max_len, plan.splits) << " keys: "
      << plan.base_blocks << " blocks would leave most of the " << plan.target_blocks << " block slots idle";
  plan.why = w.str();
  return plan;
}

int keys_per_split(int len, int splits) {
  const int per = ceil_div(len, std::max(1, splits));
  return ceil_div(per, G::kBc) * G::kBc;
}

DecodeTraffic decode_traffic(const DecodeBatch& b, int splits, bool paged) {
  DecodeTraffic t;
  const int chunks = head_chunks(b.group());
  const double e = 2.0;  // bf16: Q, O
  const double ekv = kv_elem_bytes(b.kv_dtype);
  const double per_page = 4.0 + (kv_quantised(b.kv_dtype) ? 8.0 : 0.0);  // table entry (+ K and V scale)
  for (int s = 0; s < b.batch(); ++s) {
    const int len = b.lens[s];
    const int per = splits > 1 ? keys_per_split(len, splits) : len;
    for (int hk = 0; hk < b.kv_heads; ++hk)
      for (int c = 0; c < chunks; ++c) {
        const int rows = std::min(G::kRows, b.group() - c * G::kRows);
        for (int sp = 0; sp < splits; ++sp) {
          const int t0 = std::min(len, sp * per), t1 = std::min(len, t0 + per);
          t.q_read += rows * b.d * e;
          t.meta_read += 4;  // the sequence's length
          t.kv_read += double(t1 - t0) * b.d * ekv * 2;
          if (paged)
            for (int x = t0; x < t1; x += G::kBc) {
              const int last = std::min(t1, x + G::kBc) - 1;
              t.meta_read += per_page * (last / b.page_size - x / b.page_size + 1);
            }
          if (splits > 1) t.partial_write += rows * (b.d + 2) * 4.0;
          else t.o_write += rows * (b.d * e + 4);
        }
      }
    if (splits > 1) {
      t.partial_read += double(b.heads) * splits * (b.d + 2) * 4.0;
      t.o_write += double(b.heads) * (b.d * e + 4);
    }
  }
  return t;
}

// ----------------------------------------------------------------------------- checking

DecodeOracle::DecodeOracle(const DecodeBatch& b, const std::vector<float>& q, const KvContents& kv, bool check_all,
                           double budget_flops)
    : batch_(b) {
  const int G_ = b.group();
  double cost = 0;
  for (int l : b.lens) cost += 4.0 * l * b.heads * b.d;
  std::vector<std::pair<int, std::vector<int>>> plan;
  std::vector<int> all_heads(b.kv_heads);
  for (int h = 0; h < b.kv_heads; ++h) all_heads[h] = h;
  const bool everything = check_all || cost <= budget_flops;
  if (everything) {
    for (int s = 0; s < b.batch(); ++s) plan.push_back({s, all_heads});
    describe_ = "every sequence and head checked in fp64";
  } else {
    std::set<int> seqs = {0, b.batch() - 1,
                          int(std::max_element(b.lens.begin(), b.lens.end()) - b.lens.begin())};
    const std::vector<int> heads = b.kv_heads > 1 ? std::vector<int>{0, b.kv_heads - 1} : std::vector<int>{0};
    for (int s : seqs) plan.push_back({s, heads});
    std::ostringstream d;
    d << seqs.size() << " of " << b.batch() << " sequences and " << heads.size() << " of " << b.kv_heads
      << " KV heads (all their query heads) checked in fp64 (sampled); every element checked for NaN";
    describe_ = d.str();
  }
  for (auto& [s, hks] : plan) {
    Part part;
    part.b = s;
    part.kv_heads = hks;
    Problem& p = part.p;
    p.batch = 1;
    p.kv_heads = int(hks.size());
    p.heads = G_ * p.kv_heads;
    p.nq = 1;
    p.nk = b.lens[s];
    p.d = p.dv = b.d;
    p.scale = b.scale;
    p.dtype = DType::bf16;
    // The gather: this sequence's K and V through its block table, contiguous.
    AttnInputs in;
    in.q.resize(p.q_elems());
    in.k.resize(p.k_elems());
    in.v.resize(p.v_elems());
    for (std::size_t j = 0; j < hks.size(); ++j) {
      for (int g = 0; g < G_; ++g)
        for (int c = 0; c < b.d; ++c)
          in.q[(j * G_ + g) * b.d + c] = q[(std::size_t(s) * b.heads + hks[j] * G_ + g) * b.d + c];
      parallel_for(long(p.nk + 1023) / 1024, [&](long blk) {
        for (int t = int(blk) * 1024; t < std::min(p.nk, int(blk + 1) * 1024); ++t) {
          const std::size_t src = b.kv_index(s, hks[j], t);
          const std::size_t dst = (j * std::size_t(p.nk) + t) * b.d;
          for (int c = 0; c < b.d; ++c) {
            in.k[dst + c] = kv.k(src + c);
            in.v[dst + c] = kv.v(src + c);
          }
        }
      });
    }
    part.oracle = std::make_unique<ForwardOracle>(p, in, CheckPlan::full(p));
    parts_.push_back(std::move(part));
  }
}

CheckResult DecodeOracle::judge(const std::vector<float>& o, const std::vector<float>& lse) const {
  const DecodeBatch& b = batch_;
  const int G_ = b.group();
  CheckResult r;
  // Every element of both outputs must have been written (they were poisoned).
  {
    TensorCheck t;
    t.name = "O and LSE (every element written)";
    const std::size_t no = std::size_t(b.batch()) * b.heads * b.d, nl = std::size_t(b.batch()) * b.heads;
    std::size_t bad = 0;
    if (o.size() != no || lse.size() != nl) {
      t.verdict.pass = false;
      t.verdict.reason = "wrong output sizes";
    } else {
      bad = count_unwritten(o.data(), o.size()) + count_unwritten(lse.data(), lse.size());
      t.verdict = accept(ErrorStats{}, ErrorStats{}, DType::bf16, bad);
    }
    r.tensors.push_back(t);
    if (!t.verdict.pass) return r;
  }
  for (const Part& part : parts_) {
    const Problem& p = part.p;
    std::vector<float> oc(p.o_elems()), lc(p.lse_elems());
    for (std::size_t j = 0; j < part.kv_heads.size(); ++j)
      for (int g = 0; g < G_; ++g) {
        const std::size_t h = std::size_t(part.kv_heads[j]) * G_ + g;
        const std::size_t row = std::size_t(part.b) * b.heads + h;
        std::copy_n(o.data() + row * b.d, b.d, oc.data() + (j * G_ + g) * b.d);
        lc[j * G_ + g] = lse[row];
      }
    CheckResult c = part.oracle->judge(oc, &lc);
    for (auto& t : c.tensors) {
      t.name += " of sequence " + std::to_string(part.b) + " (L=" + std::to_string(p.nk) + ")";
      r.tensors.push_back(std::move(t));
    }
  }
  return r;
}

SplitPlan final_8bit_plan(const DecodeBatch& b, int sms) {
  const SplitPlan four = choose_splits(b, sms, 4);
  if (final_8bit_blocks_per_sm(keys_per_split(b.max_len(), std::max(2, four.splits))) == 4) return four;
  return choose_splits(b, sms, 3);
}

}  // namespace attn::ch07
