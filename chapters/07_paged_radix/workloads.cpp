// Serving traces, the serving-loop simulator and the fragmentation study (see workloads.hpp).
#include "workloads.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <iomanip>
#include <memory>
#include <sstream>

#include "common/errors.hpp"
#include "common/index.hpp"
#include "common/inputs.hpp"
#include "hash_prefix_cache.hpp"
#include "paged_kv_cache.hpp"

namespace attn::ch07 {

const char* workload_name(Workload w) {
  switch (w) {
    case Workload::chat: return "chat";
    case Workload::few_shot: return "few-shot";
    case Workload::agent: return "agent";
    case Workload::independent: return "independent";
  }
  return "?";
}

bool parse_workload(const std::string& s, Workload* w) {
  for (Workload x : all_workloads())
    if (s == workload_name(x)) {
      *w = x;
      return true;
    }
  return false;
}

const std::vector<Workload>& all_workloads() {
  static const std::vector<Workload> all = {Workload::chat, Workload::few_shot, Workload::agent, Workload::independent};
  return all;
}

const char* cache_name(CacheKind c) {
  switch (c) {
    case CacheKind::none: return "none";
    case CacheKind::radix: return "radix";
    case CacheKind::hash: return "hash";
  }
  return "?";
}

long Trace::prompt_tokens() const {
  long n = 0;
  for (const auto& r : requests) n += long(r.prompt.size());
  return n;
}

long Trace::output_tokens() const {
  long n = 0;
  for (const auto& r : requests) n += long(r.output.size());
  return n;
}

// ----------------------------------------------------------------------------- traces

namespace {

constexpr int kVocab = 32000;

/// round(exp(N(log median, sigma))) clamped to [lo, hi].
int lognormal(Rng& rng, double median, double sigma, int lo, int hi) {
  const double x = std::exp(std::log(median) + sigma * rng.normal());
  return std::clamp(int(std::lround(x)), lo, hi);
}

std::vector<int32_t> tokens(Rng& rng, int n) {
  std::vector<int32_t> t(n);
  for (auto& x : t) x = int32_t(rng.next_u64() % kVocab);
  return t;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

/// Sessions (conversations, agent episodes) whose steps depend on each other,
/// interleaved as they would arrive: session s starts at a random time and its
/// step t arrives a few ticks after step t - 1. Returns the trace in arrival order.
struct Step {
  double time;
  int session, index;
  TraceRequest req;
};

Trace order_sessions(Workload kind, std::vector<Step> steps, int limit) {
  std::stable_sort(steps.begin(), steps.end(), [](const Step& a, const Step& b) { return a.time < b.time; });
  if (int(steps.size()) > limit) steps.resize(limit);
  // Dependencies point at the previous step of the same session, by position in the trace.
  std::vector<std::vector<int>> where;
  Trace tr;
  tr.kind = kind;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    Step& s = steps[i];
    if (int(where.size()) <= s.session) where.resize(s.session + 1);
    auto& w = where[s.session];
    if (int(w.size()) <= s.index) w.resize(s.index + 1, -1);
    w[s.index] = int(i);
    s.req.after = s.index > 0 ? w[s.index - 1] : -1;
    tr.requests.push_back(std::move(s.req));
  }
  return tr;
}

Trace chat_trace(int n, Rng& rng) {
  const std::vector<int32_t> system = tokens(rng, 512);  // one system prompt for every conversation
  std::vector<Step> steps;
  for (int c = 0; int(steps.size()) < n; ++c) {
    const int turns = rng.range(1, 6);
    double t = 1.5 * c + 4.0 * rng.uniform();  // conversations start one after another, overlapping
    std::vector<int32_t> history = system;
    for (int k = 0; k < turns; ++k) {
      TraceRequest r;
      r.prompt = concat(history, tokens(rng, lognormal(rng, 60, 0.8, 4, 400)));
      r.output = tokens(rng, lognormal(rng, 150, 0.7, 4, 600));
      history = concat(r.prompt, r.output);
      steps.push_back({t, c, k, std::move(r)});
      t += 2.0 + 3.0 * rng.uniform();  // the user reads, then types the next turn
    }
  }
  return order_sessions(Workload::chat, std::move(steps), n);
}

Trace few_shot_trace(int n, Rng& rng) {
  // A few tasks, each with an instruction and eight worked examples in front of every question.
  std::vector<std::vector<int32_t>> prefixes;
  for (int k = 0; k < 4; ++k) {
    std::vector<int32_t> p = tokens(rng, 100);
    for (int e = 0; e < 8; ++e) p = concat(p, tokens(rng, lognormal(rng, 150, 0.3, 60, 400)));
    prefixes.push_back(std::move(p));
  }
  Trace tr;
  tr.kind = Workload::few_shot;
  while (int(tr.requests.size()) < n) {
    const auto& prefix = prefixes[rng.range(0, int(prefixes.size()) - 1)];
    const int batch = rng.range(4, 16);
    for (int b = 0; b < batch && int(tr.requests.size()) < n; ++b) {
      TraceRequest r;
      r.prompt = concat(prefix, tokens(rng, lognormal(rng, 50, 0.6, 4, 300)));
      r.output = tokens(rng, lognormal(rng, 30, 0.6, 2, 200));
      tr.requests.push_back(std::move(r));
    }
  }
  return tr;
}

Trace agent_trace(int n, Rng& rng) {
  const std::vector<int32_t> manual = tokens(rng, 1500);  // system prompt and tool descriptions, shared
  std::vector<Step> steps;
  for (int a = 0; int(steps.size()) < n; ++a) {
    const int loop = rng.range(8, 16);
    double t = 6.0 * a + 6.0 * rng.uniform();  // a few agents at work at any time
    std::vector<int32_t> history = concat(manual, tokens(rng, lognormal(rng, 200, 0.5, 20, 800)));  // the task
    for (int k = 0; k < loop; ++k) {
      TraceRequest r;
      r.prompt = history;
      r.output = tokens(rng, lognormal(rng, 60, 0.6, 8, 300));  // thought and tool call
      // The tool's answer joins the context before the next call.
      history = concat(concat(r.prompt, r.output), tokens(rng, lognormal(rng, 250, 0.8, 10, 1500)));
      steps.push_back({t, a, k, std::move(r)});
      t += 1.0 + rng.uniform();  // tools answer quickly
    }
  }
  return order_sessions(Workload::agent, std::move(steps), n);
}

Trace independent_trace(int n, Rng& rng) {
  Trace tr;
  tr.kind = Workload::independent;
  for (int i = 0; i < n; ++i) {
    TraceRequest r;
    r.prompt = tokens(rng, lognormal(rng, 300, 0.8, 16, 2000));
    r.output = tokens(rng, lognormal(rng, 150, 0.7, 4, 600));
    tr.requests.push_back(std::move(r));
  }
  return tr;
}

}  // namespace

Trace make_trace(Workload w, int requests, uint64_t seed) {
  Rng rng(seed * 0x9e3779b97f4a7c15ull + uint64_t(w) * 0x632be59bd9b4e019ull + 7);
  switch (w) {
    case Workload::chat: return chat_trace(requests, rng);
    case Workload::few_shot: return few_shot_trace(requests, rng);
    case Workload::agent: return agent_trace(requests, rng);
    case Workload::independent: return independent_trace(requests, rng);
  }
  return {};
}

// ----------------------------------------------------------------------------- simulation

namespace {

/// The two prefix caches behind one interface for the serving loop.
class PrefixCache {
 public:
  virtual ~PrefixCache() = default;
  /// Pages of the cached prefix of `tokens`, each retained for the request; `node`
  /// receives what release() needs (the radix node it locked).
  virtual std::vector<int> acquire(const std::vector<int32_t>& tokens, int* node) = 0;
  /// The request no longer needs its locks (finished or preempted).
  virtual void release(int node) = 0;
  virtual void insert(const std::vector<int32_t>& tokens, const std::vector<int>& pages) = 0;
  virtual int evict(int pages) = 0;
  virtual std::string validate() const = 0;
  virtual int cached_pages() const = 0;
  virtual int unreachable_pages() const { return 0; }
};

class RadixAdapter : public PrefixCache {
 public:
  RadixAdapter(PagePool& pool, Eviction e) : pool_(pool), tree_(pool, e) {}
  std::vector<int> acquire(const std::vector<int32_t>& tokens, int* node) override {
    const PrefixMatch m = tree_.match_prefix(tokens);
    tree_.lock(m.node);
    for (int p : m.pages) pool_.retain(p);
    *node = m.node;
    return m.pages;
  }
  void release(int node) override { tree_.unlock(node); }
  void insert(const std::vector<int32_t>& tokens, const std::vector<int>& pages) override { tree_.insert(tokens, pages); }
  int evict(int pages) override { return tree_.evict(pages); }
  std::string validate() const override { return tree_.validate(); }
  int cached_pages() const override { return tree_.total_pages(); }

 private:
  PagePool& pool_;
  RadixCache tree_;
};

class HashAdapter : public PrefixCache {
 public:
  explicit HashAdapter(PagePool& pool) : cache_(pool) {}
  std::vector<int> acquire(const std::vector<int32_t>& tokens, int* node) override {
    *node = 0;
    return cache_.match(tokens);
  }
  void release(int) override {}
  void insert(const std::vector<int32_t>& tokens, const std::vector<int>& pages) override { cache_.insert(tokens, pages); }
  int evict(int pages) override { return cache_.evict(pages); }
  std::string validate() const override { return cache_.validate(); }
  int cached_pages() const override { return cache_.cached_pages(); }
  int unreachable_pages() const override { return cache_.unreachable_pages(); }

 private:
  HashPrefixCache cache_;
};

/// The running requests' page references, as a PageOwner so the pool can check them.
struct Running {
  int idx = -1;
  std::vector<int> pages;
  std::vector<char> host;  ///< per page: 1 when it is in the host pool (swapped out)
  int len = 0, generated = 0, node = 0;
  int cached = 0;          ///< prompt tokens the prefix cache served at admission
};

class RunningSet : public PageOwner {
 public:
  std::vector<Running> list;
  std::deque<Running> swapped;  ///< preempted by swap, oldest first
  void count_references(std::vector<int>& refs) const override {
    for (const auto& r : list)
      for (int p : r.pages) ++refs[p];
    for (const auto& r : swapped)  // their shared prefix pages stay on the device
      for (std::size_t i = 0; i < r.pages.size(); ++i)
        if (!r.host[i]) ++refs[r.pages[i]];
  }
  const char* owner_name() const override { return "running requests"; }
};

/// The swapped-out requests' host pages, checked by the host pool.
struct HostSet : public PageOwner {
  const RunningSet* rs = nullptr;
  void count_references(std::vector<int>& refs) const override {
    for (const auto& r : rs->swapped)
      for (std::size_t i = 0; i < r.pages.size(); ++i)
        if (r.host[i]) ++refs[r.pages[i]];
  }
  const char* owner_name() const override { return "swapped-out requests"; }
};

}  // namespace

SimStats simulate(const Trace& trace, CacheKind kind, const SimConfig& cfg) {
  const int P = cfg.page_size;
  PagePool pool(cfg.pool_pages, P);
  RunningSet running;
  pool.attach(&running);
  const bool priced = cfg.preempt == Preemption::cheaper || cfg.preempt == Preemption::lookahead;
  const bool swap = cfg.preempt == Preemption::swap || priced;
  if (priced && !cfg.cost.valid())
    throw UsageError("preemption by the cheaper of swap and recompute needs measured copy and prefill rates");
  PagePool host(swap ? (cfg.host_pages > 0 ? cfg.host_pages : cfg.pool_pages) : 0, P);
  HostSet host_refs;
  host_refs.rs = &running;
  host.attach(&host_refs);
  std::unique_ptr<PrefixCache> cache;
  if (kind == CacheKind::radix) cache = std::make_unique<RadixAdapter>(pool, cfg.radix_policy);
  if (kind == CacheKind::hash) cache = std::make_unique<HashAdapter>(pool);

  SimStats st;
  const int n = int(trace.requests.size());
  st.requests = n;
  std::vector<char> done(n, 0);
  std::deque<int> waiting;
  for (int i = 0; i < n; ++i) waiting.push_back(i);
  std::vector<int> stamp(cfg.pool_pages, -1);

  auto take = [&](int count, std::vector<int>& into) {
    if (count <= 0) return true;
    if (pool.free_pages() < count && cache) st.evicted_pages += cache->evict(count - pool.free_pages());
    return pool.alloc_n(count, &into) == Status::ok;
  };
  auto drop = [&](Running& r) {
    for (int p : r.pages) pool.release(p);
    r.pages.clear();
    if (cache) cache->release(r.node);
  };
  auto too_small = [&](int idx) {
    return UsageError("--pool-pages " + std::to_string(cfg.pool_pages) + " cannot hold request " + std::to_string(idx) +
                      " alone (" + std::to_string(trace.requests[idx].prompt.size() + trace.requests[idx].output.size()) +
                      " tokens at page size " + std::to_string(P) + ")");
  };

  // Preempts running.list[victim]: to the host pool when swapping and it has room,
  // else by recompute (pages freed, queued again at the front). Preemption::cheaper
  // prices both for this victim first: its private pages copied out and back in,
  // against prefilling again the tokens it would lose (those the cache did not serve);
  // Preemption::lookahead takes the first cfg.forced.size() choices as given.
  auto preempt = [&](std::size_t victim) {
    Running& v = running.list[victim];
    const std::size_t nth = std::size_t(st.preemptions);
    ++st.preemptions;
    PreemptionRecord rec;
    rec.request = v.idx;
    rec.lost_tokens = long(v.len) - v.cached;
    for (int p : v.pages) rec.private_pages += pool.refcount(p) == 1 ? 1 : 0;
    rec.host_room = swap && rec.private_pages <= host.free_pages();
    if (swap) {
      const int priv = rec.private_pages;
      const bool forced = cfg.preempt == Preemption::lookahead && nth < cfg.forced.size();
      const bool by_price = forced   ? cfg.forced[nth] != 0
                            : !priced ? true
                                      : cfg.cost.swap_s(priv, priv, P) < cfg.cost.recompute_s(rec.lost_tokens);
      if (!by_price) ++st.priced_recomputes;
      if (by_price && rec.host_room) {
        rec.swapped = true;
        if (cfg.log_preemptions) st.log.push_back(rec);
        v.host.assign(v.pages.size(), 0);
        for (std::size_t i = 0; i < v.pages.size(); ++i) {
          if (pool.refcount(v.pages[i]) != 1) continue;  // shared with the cache: stays, with its lock
          int h = -1;
          host.alloc(&h);  // the copy device -> host of one page (all layers)
          pool.release(v.pages[i]);
          v.pages[i] = h;
          v.host[i] = 1;
        }
        ++st.swap_outs;
        st.swapped_out_pages += priv;
        st.peak_host_pages = std::max(st.peak_host_pages, host.used_pages());
        running.swapped.push_back(std::move(v));
        running.list.erase(running.list.begin() + long(victim));
        return;
      }
    }
    if (cfg.log_preemptions) st.log.push_back(rec);
    st.recompute_tokens += v.len - v.cached;
    drop(v);
    waiting.push_front(v.idx);
    running.list.erase(running.list.begin() + long(victim));
  };
  // Swapped-out requests come back first, oldest first, when their pages fit.
  auto swap_in = [&]() {
    while (!running.swapped.empty() && int(running.list.size()) < cfg.max_running) {
      Running& r = running.swapped.front();
      int need = 0;
      for (char h : r.host) need += h;
      std::vector<int> got;
      if (!take(need, got)) return false;
      for (std::size_t i = 0, j = 0; i < r.pages.size(); ++i)
        if (r.host[i]) {
          host.release(r.pages[i]);  // the copy host -> device
          r.pages[i] = got[j++];
          r.host[i] = 0;
        }
      st.swapped_in_pages += need;
      running.list.push_back(std::move(r));
      running.swapped.pop_front();
    }
    return running.swapped.empty();
  };

  int finished = 0;
  while (finished < n) {
    if (!swap_in() && running.list.empty()) {
      // Nothing runs and the oldest swapped request does not fit: recompute it instead.
      Running r = std::move(running.swapped.front());
      running.swapped.pop_front();
      for (std::size_t i = 0; i < r.pages.size(); ++i) (r.host[i] ? host : pool).release(r.pages[i]);
      r.pages.clear();
      if (cache) cache->release(r.node);
      st.recompute_tokens += r.len - r.cached;
      waiting.push_front(r.idx);
    }
    // Admit in trace order while there is room (and nobody waits in host memory); a
    // request waits for the turn it follows.
    for (auto it = waiting.begin(); running.swapped.empty() && it != waiting.end() &&
                                    int(running.list.size()) < cfg.max_running;) {
      const int idx = *it;
      const TraceRequest& req = trace.requests[idx];
      if (req.after >= 0 && !done[req.after]) {
        ++it;
        continue;
      }
      Running r;
      r.idx = idx;
      // The last prompt token is always computed: its logits give the first output token.
      const std::vector<int32_t> lookup(req.prompt.begin(), req.prompt.end() - 1);
      if (cache) r.pages = cache->acquire(lookup, &r.node);
      const int cached = int(r.pages.size()) * P;
      const int need = ceil_div(int(req.prompt.size()), P) - int(r.pages.size());
      if (!take(need, r.pages)) {
        drop(r);
        break;  // the pool is full: admit nobody else this step
      }
      r.len = int(req.prompt.size());
      r.cached = cached;
      st.prompt_tokens += long(req.prompt.size());
      st.cached_tokens += cached;
      st.computed_tokens += long(req.prompt.size()) - cached;
      running.list.push_back(std::move(r));
      it = waiting.erase(it);
    }
    if (running.list.empty()) {
      if (!running.swapped.empty()) continue;  // the next round recomputes or swaps one in
      throw too_small(waiting.front());
    }

    // One decode step: every running request appends one token.
    for (std::size_t i = 0; i < running.list.size(); ++i) {
      if (running.list[i].len % P == 0) {
        std::vector<int> got;
        bool self = false;
        while (!take(1, got)) {
          // No page and nothing evictable: preempt the newest request, which may be this
          // one. The list is in admission order, so the oldest running request is never
          // preempted while another runs: it finishes, and the loop always progresses
          // (preempting an older request for a newer one can livelock, each restart
          // undoing the other's progress).
          if (running.list.size() == 1) throw too_small(running.list[i].idx);
          const std::size_t victim = running.list.size() - 1;
          preempt(victim);
          if (victim == i) {
            self = true;
            break;
          }
        }
        if (self) break;  // it was the last of the list: the step is over
        running.list[i].pages.push_back(got[0]);
      }
      ++running.list[i].len;
      ++running.list[i].generated;
      ++st.generated_tokens;
    }
    ++st.steps;
    st.peak_pages = std::max(st.peak_pages, pool.used_pages());
    int distinct = 0;
    for (const auto& r : running.list)
      for (int p : r.pages)
        if (stamp[p] != st.steps) stamp[p] = st.steps, ++distinct;
    st.peak_running_pages = std::max(st.peak_running_pages, distinct);

    // Finished requests leave their KV behind in the cache.
    for (std::size_t i = 0; i < running.list.size();) {
      Running& r = running.list[i];
      const TraceRequest& req = trace.requests[r.idx];
      if (r.generated < int(req.output.size())) {
        ++i;
        continue;
      }
      if (cache) cache->insert(concat(req.prompt, req.output), r.pages);
      drop(r);
      done[r.idx] = 1;
      ++finished;
      running.list.erase(running.list.begin() + long(i));
    }
    if (cfg.validate_every_step) {
      std::string why = cache ? cache->validate() : pool.validate();
      if (why.empty() && swap) why = host.validate();
      if (!why.empty()) {
        st.final_validation = "step " + std::to_string(st.steps) + ": " + why;
        pool.detach(&running);
        host.detach(&host_refs);
        return st;
      }
    }
  }
  st.final_validation = cache ? cache->validate() : pool.validate();
  if (st.final_validation.empty() && swap) st.final_validation = host.validate();
  if (st.final_validation.empty() && host.used_pages() != 0)
    st.final_validation = "host pages leaked: " + std::to_string(host.used_pages()) + " after the last request";
  if (st.final_validation.empty() && pool.used_pages() != (cache ? cache->cached_pages() : 0))
    st.final_validation = "pages leaked: " + std::to_string(pool.used_pages()) + " in use after the last request";
  st.cached_pages_at_end = cache ? cache->cached_pages() : 0;
  st.unreachable_pages_at_end = cache ? cache->unreachable_pages() : 0;
  pool.detach(&running);
  host.detach(&host_refs);
  return st;
}

const char* preemption_name(Preemption p) {
  return p == Preemption::swap        ? "swap"
         : p == Preemption::cheaper   ? "cheaper"
         : p == Preemption::lookahead ? "lookahead"
                                      : "recompute";
}

double preemption_seconds(const SimStats& s, const SwapCostModel& m, int page_size) {
  return m.swap_s(s.swapped_out_pages, s.swapped_in_pages, page_size) + m.recompute_s(s.recompute_tokens);
}

double SwapComparison::seconds(const SimStats& s, const SwapCostModel& m, int page_size) const {
  return preemption_seconds(s, m, page_size);
}

SimStats simulate_lookahead(const Trace& trace, CacheKind cache, const SimConfig& cfg) {
  SimConfig c = cfg;
  c.preempt = Preemption::lookahead;
  c.log_preemptions = true;  // the choices of a run, in order
  c.forced.clear();
  SimStats best = simulate(trace, cache, c);
  double best_s = preemption_seconds(best, c.cost, c.page_size);
  // best.log grows or shrinks as choices change; each pass fixes one more preemption.
  for (std::size_t k = 0; k < best.log.size(); ++k) {
    const bool swapped = best.log[k].swapped;
    if (!best.log[k].host_room) {  // no room on the host: recompute either way
      c.forced.push_back(0);
      continue;
    }
    SimConfig other = c;
    other.forced.push_back(swapped ? 0 : 1);
    SimStats s = simulate(trace, cache, other);
    const double t = preemption_seconds(s, c.cost, c.page_size);
    if (t < best_s && s.final_validation.empty()) {
      best = std::move(s);
      best_s = t;
      c.forced = std::move(other.forced);
    } else {
      c.forced.push_back(swapped ? 1 : 0);
    }
  }
  return best;
}

double SwapCostModel::swap_s(long out, long in, int page_size) const {
  const double per_page = kv_bytes_per_token * page_size;
  return double(out) * per_page / (d2h_gbps * 1e9) + double(in) * per_page / (h2d_gbps * 1e9);
}

double SwapCostModel::recompute_s(long tokens) const {
  return double(tokens) * prefill_flops_per_token / (gemm_tflops * 1e12);
}

std::vector<SwapComparison> swap_vs_recompute(int requests, const SimConfig& cfg, uint64_t seed) {
  std::vector<SwapComparison> out;
  for (Workload w : all_workloads()) {
    const Trace tr = make_trace(w, requests, seed);
    for (CacheKind c : {CacheKind::radix, CacheKind::none}) {
      SwapComparison x{w, c, {}, {}, {}, {}};
      SimConfig rc = cfg, sc = cfg;
      rc.preempt = Preemption::recompute;
      sc.preempt = Preemption::swap;
      x.recompute = simulate(tr, c, rc);
      x.swap = simulate(tr, c, sc);
      if (cfg.cost.valid()) {
        SimConfig cc = cfg;
        cc.preempt = Preemption::cheaper;
        x.cheaper = simulate(tr, c, cc);
        x.lookahead = simulate_lookahead(tr, c, cfg);
      }
      out.push_back(x);
    }
  }
  return out;
}

// ----------------------------------------------------------------------------- fragmentation

std::vector<int> sample_lengths(int n, int max_len, uint64_t seed) {
  Rng rng(seed * 0xd1b54a32d192ed03ull + 11);
  std::vector<int> len(n);
  for (int& x : len) {
    const int prompt = lognormal(rng, 256, 1.0, 1, max_len - 1);
    const int output = lognormal(rng, 192, 0.9, 1, max_len);
    x = std::min(prompt + output, max_len);
  }
  return len;
}

long predicted_paged_slots(const std::vector<int>& lengths, int page_size) {
  long slots = 0;
  for (int len : lengths) slots += long((len + page_size - 1) / page_size) * page_size;
  return slots;
}

std::vector<FragmentationRow> fragmentation_study(const std::vector<int>& lengths, int max_len,
                                                  const std::vector<int>& page_sizes) {
  long tokens = 0, pow2 = 0;
  for (int len : lengths) {
    tokens += len;
    long r = 1;
    while (r < len) r *= 2;
    pow2 += std::min<long>(r, max_len);
  }
  std::vector<FragmentationRow> rows;
  rows.push_back({"contiguous, max length", 0, tokens, long(lengths.size()) * max_len, 0});
  rows.push_back({"contiguous, next power of 2", 0, tokens, pow2, 0});
  for (int P : page_sizes) {
    // Measured by the block manager itself: each sequence grows token by token, as in decoding.
    long need = 0;
    for (int len : lengths) need += ceil_div(len, P);
    PagePool pool(int(need), P);
    {
      PagedKvCache cache(pool);
      for (int len : lengths) {
        const auto s = cache.create();
        for (int t = 0; t < len; ++t) cache.append(s);
      }
      rows.push_back({"paged, P = " + std::to_string(P), P, tokens, long(pool.used_pages()) * P, long(pool.used_pages())});
    }
  }
  return rows;
}

// ----------------------------------------------------------------------------- text

std::string bar_chart(const std::string& title, const std::vector<Bar>& bars, double max_value, int width) {
  std::size_t gw = 0, lw = 0;
  for (const auto& b : bars) gw = std::max(gw, b.group.size()), lw = std::max(lw, b.label.size());
  std::ostringstream s;
  s << title << "\n";
  std::string last_group;
  for (const auto& b : bars) {
    const int n = max_value > 0 ? int(std::lround(std::clamp(b.value / max_value, 0.0, 1.0) * width)) : 0;
    s << std::left << std::setw(int(gw)) << (b.group == last_group ? "" : b.group) << "  " << std::setw(int(lw))
      << b.label << " |" << std::string(n, '#') << std::string(width - n, ' ') << "| " << b.text << "\n";
    last_group = b.group;
  }
  return s.str();
}

}  // namespace attn::ch07
