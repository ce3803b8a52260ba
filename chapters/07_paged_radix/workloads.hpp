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
/// when the cache has nothing left to evict, the newest request is preempted (its
/// pages freed, the request queued again at the front). Nothing is timed: the
/// outputs are counts, identical on every machine.

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

struct SimConfig {
  int page_size = 16;
  int pool_pages = 4096;
  int max_running = 8;
  Eviction radix_policy = Eviction::lru;
  bool validate_every_step = false;  ///< run every validate() after every step (tests)
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
  int steps = 0;
  int cached_pages_at_end = 0;
  int unreachable_pages_at_end = 0;  ///< hash cache: cached blocks no lookup can reach
  std::string final_validation;      ///< validate() after the last request: empty when sound
  double hit_rate() const { return prompt_tokens ? double(cached_tokens) / double(prompt_tokens) : 0.0; }
};

/// Runs the trace. Throws UsageError when one request alone cannot fit in the pool.
SimStats simulate(const Trace& trace, CacheKind cache, const SimConfig& cfg);

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
