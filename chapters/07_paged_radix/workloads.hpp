#pragma once
/// \file workloads.hpp
/// \brief Seeded serving traces, a small serving loop that runs them over the
///        block pool with a prefix cache (radix tree, hash of blocks, or none), and
///        the fragmentation study of paged against contiguous allocation.
///
/// The simulator is the smallest loop that shows what a prefix cache buys: requests
/// are admitted in trace order (up to `max_running` at once) when their pages fit,
/// the cached prefix of each prompt is reused and only the rest is prefilled, every
/// step appends one generated token to every running request, and a finished
/// request hands its pages to the cache. When the pool runs dry the cache evicts;
/// when the cache has nothing left to evict, the newest request is preempted. Two
/// ways, as in vLLM: **recompute** frees its pages and queues the request again at
/// the front (its KV is computed again when it returns); **swap** copies the pages
/// only it holds to a host pool, keeps its shared prefix pages (and their locks) on
/// the device, and brings it back (before any new request is admitted) as soon as
/// its pages fit again. Nothing is timed: the outputs are counts, identical on every
/// machine; swap_vs_recompute() turns them into time with measured rates.

#include <cstdint>
#include <string>
#include <vector>

#include "radix_cache.hpp"

namespace attn::ch07 {

enum class Workload {
  chat,         ///< conversations that share one system prompt; each turn extends the last
  few_shot,     ///< batches of questions behind a few long few-shot prefixes
  agent,        ///< tool-using agents: a shared tool manual, then a growing loop of call and observation
  independent,  ///< unrelated questions: nothing to share (the control)
};
const char* workload_name(Workload w);
bool parse_workload(const std::string& s, Workload* w);
const std::vector<Workload>& all_workloads();

struct TraceRequest {
  std::vector<int32_t> prompt, output;
  int after = -1;  ///< a request that must finish first (the previous turn), or -1
};

struct Trace {
  Workload kind = Workload::chat;
  std::vector<TraceRequest> requests;
  long prompt_tokens() const;
  long output_tokens() const;
};

/// A trace of `requests` requests, the same for the same seed on every machine.
Trace make_trace(Workload w, int requests, uint64_t seed);

enum class CacheKind { none, radix, hash };
const char* cache_name(CacheKind c);

/// What the scheduler does with a request it must preempt: always recompute, always
/// swap (recompute when the host pool is full), or, per victim, whichever the cost model
/// prices lower (`cheaper`): copying its private pages out and back, against prefilling
/// again the tokens it would lose. `lookahead` prices what follows the choice as well:
/// the victim's own price leaves out that a swapped request comes back with all its
/// pages (before any new request is admitted), so the pool stays as full as it was and
/// the next page fault preempts again; simulate_lookahead() chooses each preemption by
/// the modelled time of the whole rest of the trace after it (SimConfig::forced).
enum class Preemption { recompute, swap, cheaper, lookahead };
const char* preemption_name(Preemption p);

/// The rates that turn the simulator's counts into time. The model's shape fixes the
/// bytes and FLOPs of a token; the rates are measured (ch07_paged_radix swap on a GPU:
/// pinned copies of one page of one layer at a time, and the cuBLAS bf16 GEMM).
struct SwapCostModel {
  double kv_bytes_per_token = 32.0 * 8 * 128 * 2 * 2;  ///< 32 layers x 8 KV heads x d 128, K and V, bf16: 128 KiB
  double prefill_flops_per_token = 2.0 * 8.0e9;       ///< 2 x parameters (8B), the weights' GEMMs
  double d2h_gbps = 0, h2d_gbps = 0;                  ///< measured pinned copy rates
  double gemm_tflops = 0;                             ///< measured; prefill runs at most at this rate
  std::string source;                                 ///< where the rates come from
  bool valid() const { return d2h_gbps > 0 && h2d_gbps > 0 && gemm_tflops > 0; }
  /// Seconds to copy `out` pages to the host and `in` pages back (P tokens each).
  double swap_s(long out, long in, int page_size) const;
  /// Seconds to prefill `tokens` again (a lower bound: the GEMM ceiling, attention left out).
  double recompute_s(long tokens) const;
};


struct SimConfig {
  int page_size = 16;
  int pool_pages = 4096;
  int max_running = 8;
  Eviction radix_policy = Eviction::lru;
  Preemption preempt = Preemption::recompute;
  int host_pages = 0;  ///< host pool for swap (0: as many pages as the device pool)
  SwapCostModel cost;  ///< the prices of Preemption::cheaper (must be valid() for it)
  bool validate_every_step = false;  ///< run every validate() after every step (tests)
  bool log_preemptions = false;      ///< keep one PreemptionRecord per preemption in SimStats (tests)
  /// Preemption::lookahead: the choices of the first forced.size() preemptions, in the
  /// order they happen (1: swap, if the host pool has room; 0: recompute); the later
  /// ones are priced per victim, as Preemption::cheaper does.
  std::vector<char> forced;
};

/// One preemption, as the scheduler saw it (SimConfig::log_preemptions).
struct PreemptionRecord {
  int request = -1;
  int private_pages = 0;  ///< pages only the victim held: what a swap copies out (and back)
  long lost_tokens = 0;   ///< tokens a recompute prefills again (those the cache did not serve)
  bool host_room = false; ///< the host pool had room for its private pages
  bool swapped = false;   ///< what was done
};

struct SimStats {
  int requests = 0;
  long prompt_tokens = 0;    ///< over every prefill (a preempted request prefills again)
  long cached_tokens = 0;    ///< prompt tokens served from the cache: prefill saved
  long computed_tokens = 0;  ///< prompt tokens prefilled
  long generated_tokens = 0;
  int peak_pages = 0;          ///< pool pages in use at once, running and cached
  int peak_running_pages = 0;  ///< distinct pages referenced by running requests
  long evicted_pages = 0;
  int preemptions = 0;
  long recompute_tokens = 0;    ///< tokens whose KV a preemption by recompute threw away (prefilled again)
  int swap_outs = 0;            ///< preemptions by swap
  int priced_recomputes = 0;    ///< Preemption::cheaper: victims the prices sent to recompute (host room or not)
  long swapped_out_pages = 0, swapped_in_pages = 0;  ///< pages copied device -> host and back
  int peak_host_pages = 0;
  int steps = 0;
  int cached_pages_at_end = 0;
  int unreachable_pages_at_end = 0;  ///< hash cache: cached blocks no lookup can reach
  std::string final_validation;      ///< validate() after the last request: empty when sound
  std::vector<PreemptionRecord> log; ///< with SimConfig::log_preemptions (victims of the decode loop)
  double hit_rate() const { return prompt_tokens ? double(cached_tokens) / double(prompt_tokens) : 0.0; }
};

/// Runs the trace. Throws UsageError when one request alone cannot fit in the pool.
SimStats simulate(const Trace& trace, CacheKind cache, const SimConfig& cfg);

/// Modelled seconds of a run's preemptions: its copies (out and in) plus its recomputed
/// prefill, at m's prices.
double preemption_seconds(const SimStats& s, const SwapCostModel& m, int page_size);

/// Preemption::lookahead (a rollout of the per-victim rule): starting from the run that
/// prices every victim alone, each preemption in turn (the k-th, with the first k - 1
/// fixed) is tried the other way, the rest of the trace priced per victim, and the other
/// way is kept when the whole run's preemption_seconds() is lower. Every kept change
/// lowers the total, so the result never costs more than Preemption::cheaper. Runs the
/// simulator about twice per preemption; `stats.log` holds the choices made, and
/// simulating with them as SimConfig::forced gives the same run.
SimStats simulate_lookahead(const Trace& trace, CacheKind cache, const SimConfig& cfg);

// ----------------------------------------------------------------------------- swap or recompute

struct SwapComparison {
  Workload workload;
  CacheKind cache;
  SimStats recompute, swap;
  SimStats cheaper;    ///< Preemption::cheaper, when cfg.cost is valid (else default)
  SimStats lookahead;  ///< Preemption::lookahead (simulate_lookahead()), when cfg.cost is valid
  /// Modelled seconds of each policy's preemptions: copies plus recomputed prefill.
  double seconds(const SimStats& s, const SwapCostModel& m, int page_size) const;
};

/// Every workload with the radix cache and with none (plain paging), each run twice:
/// preemption by recompute and by swap, on the same pool; and a third time, per victim
/// the cheaper of the two at cfg.cost's prices, and a fourth with what follows each choice
/// priced too (simulate_lookahead()), when those are valid.
std::vector<SwapComparison> swap_vs_recompute(int requests, const SimConfig& cfg, uint64_t seed);

// ----------------------------------------------------------------------------- fragmentation

/// `n` sequence lengths (prompt + output): lognormal prompt and output lengths
/// (medians 256 and 192 tokens), long-tailed as chat traffic is, capped at `max_len`.
std::vector<int> sample_lengths(int n, int max_len, uint64_t seed);

struct FragmentationRow {
  std::string scheme;  ///< "paged P=16", "contiguous max-length", ...
  int page_size = 0;   ///< 0 for the contiguous schemes
  long tokens = 0;     ///< tokens stored
  long slots = 0;      ///< token slots reserved
  long pages = 0;      ///< pages used (paged schemes, measured by the block manager)
  double waste() const { return slots ? 1.0 - double(tokens) / double(slots) : 0.0; }
};

/// Stores every sequence with the block manager at each page size (pages counted by
/// the pool) and compares with a contiguous allocator that reserves `max_len` per
/// sequence and one that reserves the next power of two.
std::vector<FragmentationRow> fragmentation_study(const std::vector<int>& lengths, int max_len,
                                                  const std::vector<int>& page_sizes);

/// Slots a paged allocator reserves for these lengths: the sum of ceil(len / P) * P.
/// The block manager's measured count must equal it.
long predicted_paged_slots(const std::vector<int>& lengths, int page_size);

// ----------------------------------------------------------------------------- text output

/// One bar of an ASCII chart.
struct Bar {
  std::string group, label, text;
  double value = 0;
};
/// Horizontal bars scaled to `max_value`, `width` characters at most.
std::string bar_chart(const std::string& title, const std::vector<Bar>& bars, double max_value, int width = 40);

}  // namespace attn::ch07
