// Serving traces, the simulator over both prefix caches, and the fragmentation study.
#include <doctest/doctest.h>

#include "chapters/07_paged_radix/workloads.hpp"
#include "common/errors.hpp"

using namespace attn;
using namespace attn::ch07;

TEST_CASE("traces are seeded: the same seed gives the same trace") {
  for (Workload w : all_workloads()) {
    CAPTURE(workload_name(w));
    const Trace a = make_trace(w, 60, 3), b = make_trace(w, 60, 3), c = make_trace(w, 60, 4);
    REQUIRE(a.requests.size() == 60);
    bool same = true, differs = false;
    for (std::size_t i = 0; i < a.requests.size(); ++i) {
      same = same && a.requests[i].prompt == b.requests[i].prompt && a.requests[i].output == b.requests[i].output;
      differs = differs || a.requests[i].prompt != c.requests[i].prompt;
    }
    CHECK(same);
    CHECK(differs);
  }
}

TEST_CASE("a chat turn extends the turn before it") {
  const Trace t = make_trace(Workload::chat, 120, 1);
  int followups = 0;
  for (std::size_t i = 0; i < t.requests.size(); ++i) {
    const TraceRequest& r = t.requests[i];
    if (r.after < 0) continue;
    REQUIRE(r.after < int(i));  // a turn comes after the turn it follows
    const TraceRequest& prev = t.requests[r.after];
    std::vector<int32_t> history = prev.prompt;
    history.insert(history.end(), prev.output.begin(), prev.output.end());
    REQUIRE(r.prompt.size() > history.size());
    CHECK(std::equal(history.begin(), history.end(), r.prompt.begin()));
    ++followups;
  }
  CHECK(followups > 20);
}

TEST_CASE("every simulation leaves a sound pool and leaks no page") {
  SimConfig cfg;
  cfg.page_size = 16;
  cfg.pool_pages = 900;  // small enough to evict and preempt
  cfg.max_running = 6;
  cfg.validate_every_step = true;
  for (Workload w : all_workloads())
    for (CacheKind c : {CacheKind::radix, CacheKind::hash, CacheKind::none}) {
      CAPTURE(workload_name(w));
      CAPTURE(cache_name(c));
      const Trace t = make_trace(w, 40, 2);
      const SimStats s = simulate(t, c, cfg);
      CHECK(s.final_validation == "");
      CHECK(s.generated_tokens >= t.output_tokens());
      CHECK(s.prompt_tokens >= t.prompt_tokens());
      CHECK(s.cached_tokens + s.computed_tokens == s.prompt_tokens);
      CHECK(s.peak_pages <= cfg.pool_pages);
      if (c == CacheKind::none) CHECK(s.cached_tokens == 0);
    }
}

TEST_CASE("with room to spare, radix and hash caches save the same prefill") {
  SimConfig cfg;
  cfg.pool_pages = 20000;
  for (Workload w : {Workload::chat, Workload::few_shot, Workload::agent}) {
    CAPTURE(workload_name(w));
    const Trace t = make_trace(w, 80, 5);
    const SimStats r = simulate(t, CacheKind::radix, cfg), h = simulate(t, CacheKind::hash, cfg),
                   n = simulate(t, CacheKind::none, cfg);
    CHECK(r.evicted_pages == 0);
    CHECK(r.cached_tokens == h.cached_tokens);
    CHECK(r.hit_rate() > 0.5);
    CHECK(n.hit_rate() == 0.0);
    // Shared prefix pages are held once by all the requests running on them.
    CHECK(r.peak_running_pages < n.peak_running_pages);
  }
}

TEST_CASE("independent questions share nothing") {
  const Trace t = make_trace(Workload::independent, 80, 5);
  SimConfig cfg;
  const SimStats r = simulate(t, CacheKind::radix, cfg);
  CHECK(r.hit_rate() < 0.01);
}

TEST_CASE("a pool that cannot hold one request is a usage error") {
  const Trace t = make_trace(Workload::agent, 10, 1);
  SimConfig cfg;
  cfg.pool_pages = 8;
  CHECK_THROWS_AS(simulate(t, CacheKind::radix, cfg), UsageError);
}

TEST_CASE("fragmentation: the block manager's pages match the prediction, waste < one page per sequence") {
  const std::vector<int> lens = sample_lengths(400, 4096, 9);
  for (int len : lens) REQUIRE((len >= 2 && len <= 4096));
  const std::vector<FragmentationRow> rows = fragmentation_study(lens, 4096, {1, 8, 16, 32, 64});
  REQUIRE(rows.size() == 7);
  CHECK(rows[0].slots == 400L * 4096);
  CHECK(rows[0].waste() > 0.5);  // reserving the maximum length wastes most of the memory
  for (std::size_t i = 2; i < rows.size(); ++i) {
    const FragmentationRow& r = rows[i];
    CAPTURE(r.scheme);
    CHECK(r.slots == predicted_paged_slots(lens, r.page_size));
    CHECK(r.pages * r.page_size == r.slots);
    CHECK(r.slots - r.tokens < long(lens.size()) * r.page_size);
    if (i > 2) CHECK(r.waste() >= rows[i - 1].waste());  // bigger pages, more waste
  }
  CHECK(rows[2].waste() == 0.0);  // P = 1 wastes nothing
}

TEST_CASE("bar_chart scales bars to the maximum") {
  const std::string c = bar_chart("t", {{"g", "a", "50%", 0.5}, {"g", "b", "100%", 1.0}}, 1.0, 10);
  CHECK(c.find("|#####     | 50%") != std::string::npos);
  CHECK(c.find("|##########| 100%") != std::string::npos);
}

TEST_CASE("a tight pool still finishes every request: the oldest running request is never preempted") {
  // Preempting an older request for a newer one could livelock (each restart undid the
  // other's progress): the agent trace at 600 pages never finished. Every workload, both
  // preemption modes, pools from tight to roomy.
  for (Workload w : all_workloads())
    for (int pages : {600, 700, 1000})
      for (Preemption pre : {Preemption::recompute, Preemption::swap}) {
        CAPTURE(workload_name(w));
        CAPTURE(pages);
        CAPTURE(preemption_name(pre));
        SimConfig cfg;
        cfg.page_size = 16;
        cfg.pool_pages = pages;
        cfg.max_running = 8;
        cfg.preempt = pre;
        const Trace t = make_trace(w, 200, 1);
        const SimStats s = simulate(t, CacheKind::radix, cfg);
        CHECK(s.final_validation == "");
        CHECK(s.generated_tokens >= t.output_tokens());
        CHECK(s.peak_pages <= cfg.pool_pages);
      }
}

TEST_CASE("the serving loop preempts by swap: every step sound, every swapped page comes back") {
  for (CacheKind c : {CacheKind::radix, CacheKind::none}) {
    CAPTURE(cache_name(c));
    SimConfig cfg;
    cfg.pool_pages = 800;
    cfg.max_running = 16;
    cfg.validate_every_step = true;
    const Trace tr = make_trace(Workload::chat, 120, 1);
    cfg.preempt = Preemption::recompute;
    const SimStats rc = simulate(tr, c, cfg);
    cfg.preempt = Preemption::swap;
    const SimStats sw = simulate(tr, c, cfg);
    CHECK(rc.final_validation.empty());
    CHECK(sw.final_validation.empty());
    CHECK(rc.preemptions > 0);
    CHECK(rc.recompute_tokens > 0);
    CHECK(sw.swap_outs > 0);
    CHECK(sw.swapped_in_pages == sw.swapped_out_pages);  // nothing is left on the host
    CHECK(sw.recompute_tokens == 0);                       // the host pool never ran out
    CHECK(sw.generated_tokens == tr.output_tokens());      // swapped requests resume, not restart
    CHECK(sw.peak_host_pages > 0);
    // A host pool of one page: every preemption falls back to recompute.
    cfg.host_pages = 1;
    const SimStats tiny = simulate(tr, c, cfg);
    CHECK(tiny.final_validation.empty());
    CHECK(tiny.swap_outs == 0);
    CHECK(tiny.recompute_tokens > 0);
  }
}

namespace {
/// Rates for the cost model: copies at `gbps` both ways, prefill at 805 TFLOP/s.
SwapCostModel rates(double gbps) {
  SwapCostModel m;
  m.d2h_gbps = m.h2d_gbps = gbps;
  m.gemm_tflops = 805;
  return m;
}
}  // namespace

TEST_CASE("per-victim choice: every preemption takes the cheaper of swap and recompute at the given prices") {
  // 14 GB/s puts the break-even near a full page per 16 lost tokens, so the chat trace
  // has victims of both kinds; 1e6 GB/s makes every copy free, 1e-3 GB/s dear.
  for (double gbps : {14.0, 1e6, 1e-3}) {
    CAPTURE(gbps);
    SimConfig cfg;
    cfg.pool_pages = 800;
    cfg.max_running = 16;
    cfg.log_preemptions = true;
    cfg.cost = rates(gbps);
    cfg.preempt = Preemption::cheaper;
    const Trace tr = make_trace(Workload::chat, 120, 1);
    const SimStats ch = simulate(tr, CacheKind::radix, cfg);
    CHECK(ch.final_validation.empty());
    CHECK(ch.generated_tokens >= tr.output_tokens());
    REQUIRE(ch.preemptions > 0);
    REQUIRE(int(ch.log.size()) == ch.preemptions);
    int swaps = 0, priced = 0;
    for (const PreemptionRecord& r : ch.log) {
      const bool cheaper_to_swap = cfg.cost.swap_s(r.private_pages, r.private_pages, cfg.page_size) <
                                   cfg.cost.recompute_s(r.lost_tokens);
      CHECK(r.swapped == (cheaper_to_swap && r.host_room));
      swaps += r.swapped;
      priced += !cheaper_to_swap;
    }
    CHECK(swaps == ch.swap_outs);
    CHECK(priced == ch.priced_recomputes);
    SimConfig other = cfg;
    if (gbps == 14.0) {
      CHECK(ch.swap_outs > 0);  // both kinds of victim
      CHECK(ch.priced_recomputes > 0);
    } else if (gbps > 1e5) {  // copies free: the swap policy, decision for decision
      other.preempt = Preemption::swap;
      const SimStats sw = simulate(tr, CacheKind::radix, other);
      CHECK(ch.priced_recomputes == 0);
      CHECK(ch.swap_outs == sw.swap_outs);
      CHECK(ch.swapped_out_pages == sw.swapped_out_pages);
      CHECK(ch.steps == sw.steps);
    } else {  // copies dear: the recompute policy
      other.preempt = Preemption::recompute;
      const SimStats rc = simulate(tr, CacheKind::radix, other);
      CHECK(ch.swap_outs == 0);
      CHECK(ch.preemptions == rc.preemptions);
      CHECK(ch.recompute_tokens == rc.recompute_tokens);
      CHECK(ch.steps == rc.steps);
    }
  }
}

TEST_CASE("per-victim choice needs rates, and swap_vs_recompute runs it only with them") {
  SimConfig cfg;
  cfg.pool_pages = 800;
  cfg.max_running = 16;
  cfg.preempt = Preemption::cheaper;
  const Trace tr = make_trace(Workload::chat, 40, 1);
  CHECK_THROWS_AS(simulate(tr, CacheKind::radix, cfg), UsageError);
  cfg.preempt = Preemption::recompute;
  const auto none = swap_vs_recompute(40, cfg, 1);
  for (const auto& r : none) CHECK(r.cheaper.steps == 0);  // not run
  cfg.cost = rates(18);
  const auto rows = swap_vs_recompute(40, cfg, 1);
  for (const auto& r : rows) {
    CHECK(r.cheaper.steps > 0);
    CHECK(r.cheaper.final_validation.empty());
  }
}

TEST_CASE("lookahead: each choice priced by the rest of the trace, never dearer than the per-victim rule") {
  // The swap command's pool (800 pages of 16 tokens, 16 running) at 18 GB/s and 788 TFLOP/s,
  // the rates measured on the H200: on the agent trace the per-victim rule swaps every
  // victim and costs more than recomputing them all, because a swapped victim comes back
  // with all its pages and the next page fault preempts again.
  SimConfig cfg;
  cfg.pool_pages = 800;
  cfg.max_running = 16;
  cfg.cost = rates(18);
  cfg.cost.gemm_tflops = 788;
  bool beat_somewhere = false;
  for (Workload w : {Workload::chat, Workload::agent, Workload::few_shot}) {
    const Trace tr = make_trace(w, 200, 1);
    for (CacheKind c : {CacheKind::radix, CacheKind::none}) {
      CAPTURE(workload_name(w));
      CAPTURE(cache_name(c));
      SimConfig each = cfg;
      each.preempt = Preemption::cheaper;
      const SimStats per_victim = simulate(tr, c, each);
      const SimStats ahead = simulate_lookahead(tr, c, cfg);
      CHECK(ahead.final_validation.empty());
      CHECK(ahead.generated_tokens >= tr.output_tokens());
      const double t_victim = preemption_seconds(per_victim, cfg.cost, cfg.page_size);
      const double t_ahead = preemption_seconds(ahead, cfg.cost, cfg.page_size);
      CHECK(t_ahead <= t_victim);
      beat_somewhere |= t_ahead < t_victim;
      // The choices it logged, replayed as forced choices, are the same run.
      REQUIRE(int(ahead.log.size()) == ahead.preemptions);
      SimConfig replay = cfg;
      replay.preempt = Preemption::lookahead;
      for (const PreemptionRecord& r : ahead.log) replay.forced.push_back(r.swapped ? 1 : 0);
      const SimStats again = simulate(tr, c, replay);
      CHECK(again.steps == ahead.steps);
      CHECK(again.swap_outs == ahead.swap_outs);
      CHECK(again.swapped_out_pages == ahead.swapped_out_pages);
      CHECK(again.recompute_tokens == ahead.recompute_tokens);
      if (w == Workload::agent) {
        // Where the per-victim rule lost to recomputing everything, the lookahead does not.
        SimConfig rc = cfg;
        rc.preempt = Preemption::recompute;
        const double t_rc = preemption_seconds(simulate(tr, c, rc), cfg.cost, cfg.page_size);
        CHECK(t_victim > t_rc);
        CHECK(t_ahead <= t_rc);
      }
    }
  }
  CHECK(beat_somewhere);
  // Forced choices override the prices: all-recompute forced is the recompute policy's run.
  const Trace tr = make_trace(Workload::agent, 200, 1);
  SimConfig rc = cfg;
  rc.preempt = Preemption::recompute;
  const SimStats base = simulate(tr, CacheKind::radix, rc);
  SimConfig forced = cfg;
  forced.preempt = Preemption::lookahead;
  forced.forced.assign(std::size_t(base.preemptions) + 8, 0);
  const SimStats f = simulate(tr, CacheKind::radix, forced);
  CHECK(f.swap_outs == 0);
  CHECK(f.preemptions == base.preemptions);
  CHECK(f.recompute_tokens == base.recompute_tokens);
  CHECK(f.steps == base.steps);
}
