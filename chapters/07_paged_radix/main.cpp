// ch07_paged_radix: the paged KV cache (block manager, fork, copy-on-write, and the
// fragmentation it saves), decode kernels that read it (v1 and split-K v2) checked
// against the fp64 reference, and RadixAttention's prefix cache on serving traces.
//
//   ch07_paged_radix                 a short tour of all three at small sizes
//   ch07_paged_radix paged  [opts]   block tables, copy-on-write, fragmentation
//   ch07_paged_radix decode [opts]   decode v1 / v2 (CPU model, and the GPU when present)
//   ch07_paged_radix radix  [opts]   prefix caches on seeded workloads, the radix tree drawn
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>

#include "common/check.hpp"
#include "common/cli.hpp"
#include "common/device.hpp"
#include "common/report.hpp"
#include "decode.hpp"
#include "decode_gpu.hpp"
#include "decode_model.hpp"
#include "hash_prefix_cache.hpp"
#include "kv_accuracy.hpp"
#include "paged_kv_cache.hpp"
#include "radix_cache.hpp"
#include "sweep.hpp"
#include "workloads.hpp"

#if TUTORIAL_HAVE_CUDA
#include "common/cuda/ceilings.cuh"
#include "swap_gpu.hpp"
#endif

using namespace attn;
using namespace attn::ch07;

namespace {

constexpr const char* kChapter = "ch07_paged_radix";
/// SMs assumed by the v1/v2 heuristic when no GPU is present: an H200's.
constexpr int kDefaultSms = 132;
/// The CPU model runs when a step is at most this many FLOPs; above it the report
/// takes the bytes from decode_traffic() alone.
constexpr double kModelFlopBudget = 4e9;

/// The faults `decode` takes (common/faults.hpp); the tour hands --inject-fault to decode alone.
const std::vector<Fault> kDecodeFaults = {Fault::split_dropped, Fault::page_table_shift, Fault::last_batch};


std::string pct(double x) { return fmt("%.1f%%", 100.0 * x); }

/// JSON number (null when not finite).
std::string jnum(double x) {
  if (!std::isfinite(x)) return "null";
  return fmt("%.9g", x);
}

// ============================================================================= paged

struct PagedOptions {
  int page_size = 16, seqs = 1000, max_len = 4096;
};

/// The block-table pictures for the README: a small pool whose pages hold token labels.
std::string paged_demo() {
  std::ostringstream s;
  const int P = 4;
  PagePool pool(8, P, /*kv_heads=*/1, /*head_dim=*/1, DType::f32);  // one number per token: its label
  PagedKvCache cache(pool);
  std::map<PagedKvCache::SeqId, char> name;
  auto label = [](char who, int t) { return float(int(who) * 1000 + t); };
  auto show = [&](const std::string& title) {
    s << title << "\n";
    for (auto id : cache.sequences()) {
      const auto& t = cache.block_table(id);
      s << "  " << name[id] << "  block table [";
      for (std::size_t i = 0; i < t.size(); ++i) s << (i ? " | " : " ") << t[i];
      s << " ]  len " << cache.length(id) << "\n";
    }
    s << "  pages  ";
    for (int p = 0; p < pool.num_pages(); ++p) {
      if (pool.refcount(p) == 0) continue;
      s << " p" << p << "(rc " << pool.refcount(p) << "):[";
      for (int slot = 0; slot < P; ++slot) {
        const float x = pool.k_data()[pool.offset(p, 0, slot)];
        const int v = int(x);
        s << (slot ? " " : "") << (v >= 1000 ? std::string(1, char(v / 1000)) + std::to_string(v % 1000) : ".");
      }
      s << "]";
    }
    s << "   free " << pool.free_pages() << "\n";
  };
  auto append = [&](PagedKvCache::SeqId id, int n) {
    for (int i = 0; i < n; ++i) {
      const float x = label(name[id], cache.length(id));
      cache.append(id, &x, &x);
    }
  };
  const auto a = cache.create();
  name[a] = 'a';
  append(a, 10);
  show("1. sequence a appends 10 tokens: three pages, the last one half full");
  PagedKvCache::SeqId b;
  cache.fork(a, &b);
  name[b] = 'b';
  show("2. fork a -> b (parallel sampling): b shares all three pages, nothing is allocated");
  const float xb = label('b', 10);
  cache.append(b, &xb, &xb);
  show("3. b appends token 10: page 2 is shared, so it is copied first (copy-on-write)");
  const float xa = label('a', 10);
  cache.append(a, &xa, &xa);
  show("4. a appends token 10: page 2 is a's alone now, written in place");
  cache.free(a);
  show("5. a is freed: its private page returns to the free list, the shared ones stay with b");
  const std::string why = cache.validate();
  s << "validate(): " << (why.empty() ? "every invariant holds" : why) << "\n";
  return s.str();
}

int run_paged(int argc, char** argv, bool tour, bool dry = false) {
  PagedOptions po;
  if (tour) po.seqs = 500;
  Cli cli(std::string(kChapter) + " paged",
          "The paged KV cache: block tables, fork, copy-on-write, and the internal fragmentation of\n"
          "paged storage against a contiguous allocator that reserves the maximum length.");
  cli.add_int("--page-size", &po.page_size, "page size of the highlighted row (1..256)", 1, 256);
  cli.add_int("--seqs", &po.seqs, "sequences in the length sample", 1, 1000000);
  cli.add_int("--max-len", &po.max_len, "the model's maximum length (the contiguous reservation)", 2, 1 << 20);
  return run_chapter(argc, argv, cli, [&](const Options& opt) {
    if (dry) return 0;
    const std::vector<int> lens = sample_lengths(po.seqs, po.max_len, opt.seed);
    std::vector<int> sizes = {1, 8, 16, 32, 64};
    if (std::find(sizes.begin(), sizes.end(), po.page_size) == sizes.end()) sizes.push_back(po.page_size);
    std::sort(sizes.begin(), sizes.end());
    const std::vector<FragmentationRow> rows = fragmentation_study(lens, po.max_len, sizes);
    long total = 0;
    for (int l : lens) total += l;
    const double mean = double(total) / lens.size();
    std::vector<int> sorted = lens;
    std::sort(sorted.begin(), sorted.end());
    const int p50 = sorted[sorted.size() / 2], p99 = sorted[std::min(sorted.size() - 1, sorted.size() * 99 / 100)];
    if (opt.json) {
      std::ostringstream j;
      j << "{\"chapter\": \"" << kChapter << "\", \"subcommand\": \"paged\", \"seed\": " << opt.seed
        << ", \"sequences\": " << lens.size() << ", \"max_len\": " << po.max_len << ", \"mean_len\": " << jnum(mean)
        << ", \"p50_len\": " << p50 << ", \"p99_len\": " << p99 << ", \"fragmentation\": [";
      for (std::size_t i = 0; i < rows.size(); ++i)
        j << (i ? ", " : "") << "{\"scheme\": \"" << json_escape(rows[i].scheme) << "\", \"page_size\": "
          << rows[i].page_size << ", \"tokens\": " << rows[i].tokens << ", \"slots\": " << rows[i].slots
          << ", \"pages\": " << rows[i].pages << ", \"waste\": " << jnum(rows[i].waste()) << "}";
      j << "]}\n";
      std::cout << j.str();
      return 0;
    }
    std::cout << "== " << kChapter << " paged: block tables, copy-on-write, fragmentation ==\n\n";
    std::cout << paged_demo() << "\n";
    std::cout << "Internal fragmentation, " << lens.size() << " sequences (seed " << opt.seed
              << "): lognormal prompt + output lengths, mean " << fmt("%.0f", mean) << ", median " << p50
              << ", p99 " << p99 << ", capped at " << po.max_len << " tokens.\n"
              << "Paged rows are measured: every sequence grows token by token in the block manager.\n\n";
    std::printf("  %-30s %14s %12s %10s %22s\n", "allocator", "slots reserved", "tokens", "waste",
                "sequences per memory");
    const double base = double(rows[0].slots);
    for (const auto& r : rows) {
      const bool mark = r.page_size == po.page_size;
      std::printf("%s %-30s %14ld %12ld %9.1f%% %21.2fx\n", mark ? ">" : " ", r.scheme.c_str(), r.slots, r.tokens,
                  100.0 * r.waste(), base / double(r.slots));
    }
    std::cout << "\n(waste = reserved slots holding no token; \"sequences per memory\" is how many more sequences fit\n"
                 " in the same KV memory than with the max-length reservation. A page wastes at most P - 1 slots\n"
                 " per sequence, about P / 2 on average.)\n";
    return 0;
  });
}

// ============================================================================= decode

struct DecodeOptions {
  int page_size = 16, shared_prefix = 0, splits = 0, sms = 0, chain = 0;
  std::string lengths = "ragged", kv_dtype = "bf16", sweep_set = "all", since = "v1";
  bool sweep = false, accuracy = false, untimed = false, lab = false;
};

#if TUTORIAL_HAVE_CUDA
/// `--since vN`: the GPU runs keep kernel vN and the steps after it (v1 by default: every one);
/// the lab's steps (kernel_in_lab()) only with `--lab`.
bool kernel_kept(const DecodeOptions& dopt, DecodeKernel k) {
  if (kernel_in_lab(k) && !dopt.lab) return false;
  if (kernel_is_final(k)) return true;  // the final kernels come after every step
  return std::stoi(std::string(kernel_name(k)).substr(1)) >= std::stoi(dopt.since.substr(1));
}
#endif

DecodeBatch make_batch(const Options& opt, const DecodeOptions& dopt) {
  const Problem& p = opt.problem;
  const std::vector<int> lens = dopt.lengths == "equal" ? std::vector<int>(p.batch, p.nk)
                                                        : ragged_lengths(p.batch, p.nk, dopt.page_size, opt.seed);
  DecodeBatch b = build_batch(p.heads, p.kv_heads, p.d, dopt.page_size, lens, dopt.shared_prefix, opt.seed);
  b.scale = p.scale;
  parse_kv_dtype(dopt.kv_dtype, &b.kv_dtype);
  validate(b);
  return b;
}

Problem as_problem(const DecodeBatch& b) {
  Problem p;
  p.batch = b.batch();
  p.heads = b.heads;
  p.kv_heads = b.kv_heads;
  p.nq = 1;
  p.nk = b.max_len();
  p.d = p.dv = b.d;
  p.scale = b.scale;
  p.dtype = DType::bf16;
  return p;
}

/// Fills a report row's bytes from the kernels' own count.
void set_traffic(ResultRow& row, const DecodeTraffic& t) {
  row.hbm_read_bytes = t.read();
  row.hbm_write_bytes = t.write();
  row.extra_bytes = t.partial_write;  // v2's partial states
}

#if TUTORIAL_HAVE_CUDA
/// Drops the runs whose kernels are built for sm_90a alone (kernel_needs_hopper()) when
/// `dev` is not a Hopper GPU; `skipped` then holds the one line that says so.
template <class Run>
void skip_hopper_runs(std::vector<Run>& runs, const DeviceInfo& dev, std::string* skipped) {
  std::string names;
  for (const Run& r : runs)
    if (kernel_needs_hopper(r.kernel) && names.find(std::string(kernel_name(r.kernel)) + ",") == std::string::npos)
      names += std::string(kernel_name(r.kernel)) + ",";
  if (names.empty()) return;
  names.pop_back();
  std::string why;
  if (hopper_device(dev, names, &why)) return;
  runs.erase(std::remove_if(runs.begin(), runs.end(), [](const Run& r) { return kernel_needs_hopper(r.kernel); }),
             runs.end());
  *skipped = why + ": their rows are skipped";
}

/// The README's bandwidth table: every kernel on each shape, checked against the
/// fp64 reference (sampled at these sizes), then timed.
int run_sweep(const Options& opt, const DecodeOptions& dopt, const DeviceInfo& dev) {
  SweepReport rep;
  rep.device = dev.describe();
  rep.date = today();
  rep.read_gbps = measure_read_gbps();
  rep.d = opt.problem.d;
  for (const SweepShape& c : sweep_shapes(dopt.sweep_set)) {
    SweepResult res;
    res.shape = c;
    res.d = opt.problem.d;
    DecodeBatch b = build_batch(c.heads, c.kv_heads, res.d, c.page_size, std::vector<int>(c.batch, c.len), 0, opt.seed);
    b.kv_dtype = c.kv;
    const SplitPlan plan = choose_splits(b, dev.sms);
    const int v2_splits = std::max(2, dopt.splits > 0 ? dopt.splits : plan.splits);
    // v10 and v13 fill four 8-bit blocks per SM: their own plan (the same as v2's where three fill the GPU).
    const int v10_splits = std::max(2, dopt.splits > 0 ? dopt.splits : choose_splits(b, dev.sms, kV10BlocksPerSm).splits);
    const int final8_splits = std::max(2, dopt.splits > 0 ? dopt.splits : final_8bit_plan(b, dev.sms).splits);
    const bool contiguous = c.page_size == 16 && c.kv == KvDtype::bf16 && dopt.sweep_set == "all";
    res.kv_bytes = b.kv_bytes();
    res.tokens = b.total_tokens();
    res.plan_splits = plan.splits;
    res.plan_why = plan.why;
    require_device_memory(dev, GpuDecoder::device_bytes(b, std::max(v2_splits, v10_splits), contiguous), "the decode sweep");
    const std::vector<float> q = make_queries(b, opt.seed, opt.dist);
    GpuDecoder gpu(b, q, KvContents{opt.seed, opt.dist, nullptr});  // the device fills (and quantises) the pool
    // An 8-bit pool's scales come from the device (a GPU test holds them equal to pool_scales()).
    const KvScales scales = gpu.scales();
    const DecodeOracle oracle(b, q, hashed_contents(b, opt.seed, opt.dist, &scales), opt.check_all);
    res.check_plan = oracle.describe();
    struct Run {
      DecodeKernel kernel;
      int splits;
      KvLayout layout;
    };
    std::vector<Run> runs = {{DecodeKernel::v1, 1, KvLayout::paged},
                             {DecodeKernel::v2, v2_splits, KvLayout::paged},
                             {DecodeKernel::v3, v2_splits, KvLayout::paged}};
    // v4 changes the 8-bit path only (for bf16 it is v3's code): on 8-bit pools and the quant set's bf16 rows.
    if (kv_quantised(c.kv) || dopt.sweep_set == "quant") runs.push_back({DecodeKernel::v4, v2_splits, KvLayout::paged});
    runs.push_back({DecodeKernel::v5, v2_splits, KvLayout::paged});  // v4 with the table entries read ahead
    if (!kv_quantised(c.kv)) {
      runs.push_back({DecodeKernel::v12, v2_splits, KvLayout::paged});  // v5, one-trip merge
      runs.push_back({DecodeKernel::final_bf16, v2_splits, KvLayout::paged});  // the final bf16 kernel
      // v12 overlapping the kernel before it: only where a chain can show it (b1, quant; not the bench's "all" set).
      if (dopt.sweep_set != "all") runs.push_back({DecodeKernel::v14, v2_splits, KvLayout::paged});
    }
    if (kv_quantised(c.kv)) {
      runs.push_back({DecodeKernel::v6, v2_splits, KvLayout::paged});  // lazy rescale
      if (c.page_size >= DecodeGeometry::kTmaMinPage)  // pages by TMA; v8: with per-stage empty barriers
        runs.insert(runs.end(), {{DecodeKernel::v7, v2_splits, KvLayout::paged},
                                 {DecodeKernel::v8, v2_splits, KvLayout::paged},
                                 {DecodeKernel::v9, v2_splits, KvLayout::paged},
                                 {DecodeKernel::v10, v10_splits, KvLayout::paged},
                                 {DecodeKernel::v13, v10_splits, KvLayout::paged},
                                 {DecodeKernel::final_8bit, final8_splits, KvLayout::paged}});
    }
    if (contiguous)
      runs.insert(runs.end(), {{DecodeKernel::v1, 1, KvLayout::contiguous}, {DecodeKernel::v2, v2_splits, KvLayout::contiguous}});
    runs.erase(std::remove_if(runs.begin(), runs.end(), [&](const Run& r) { return !kernel_reads(c.kv, r.kernel); }),
               runs.end());  // INT4 pages: v1-v3
    {
      std::string skipped;
      skip_hopper_runs(runs, dev, &skipped);
      static bool said = false;
      if (!skipped.empty() && !said) std::cerr << skipped << "\n";
      said = said || !skipped.empty();
    }
    for (const Run& r : runs) {
      if (!kernel_kept(dopt, r.kernel)) continue;
      SweepRun x;
      x.kernel = kernel_name(r.kernel);
      x.layout = layout_name(r.layout);
      x.splits = r.splits;
      x.chosen = (r.kernel == DecodeKernel::v1 || r.kernel == DecodeKernel::v2) && (r.splits > 1) == (plan.splits > 1);
      const GpuDecodeOutput out = gpu.run(r.kernel, r.splits, r.layout);
      const CheckResult check = oracle.judge(out.o, out.lse);
      x.pass = check.pass();
      x.max_abs_err = check.max_abs();
      x.failures = check.failures();
      x.time_ms = gpu.time_ms(r.kernel, r.splits, r.layout);
      x.kv_gbps = b.kv_bytes() / (x.time_ms * 1e-3) / 1e9;
      x.tokens_per_s = double(b.total_tokens()) / (x.time_ms * 1e-3);
      if (dopt.chain > 1 && r.kernel >= DecodeKernel::v12 && r.layout == KvLayout::paged) {
        // Steps back to back: the last one's output is checked too (a step must not read what
        // the one before it is still writing), then the time per step.
        const GpuDecodeOutput last = gpu.run_chain(r.kernel, r.splits, r.layout, dopt.chain);
        x.pass = x.pass && oracle.judge(last.o, last.lse).pass();
        x.chain = dopt.chain;
        x.chain_ms = gpu.time_chain_ms(r.kernel, r.splits, r.layout, dopt.chain);
        x.chain_gbps = b.kv_bytes() / (x.chain_ms * 1e-3) / 1e9;
      }
      res.runs.push_back(x);
      // Progress on stderr, one line a run: what was measured survives a later failure.
      std::fprintf(stderr, "sweep: B=%d L=%d %d/%d P=%d %s %s S=%d: %.4f ms, %.0f GB/s, %s\n", c.batch, c.len, c.heads,
                   c.kv_heads, c.page_size, kv_dtype_name(c.kv), x.kernel.c_str(), x.splits, x.time_ms, x.kv_gbps,
                   x.pass ? "pass" : "FAIL");
      if (x.chain > 0)
        std::fprintf(stderr, "sweep:   %s x%d in a row: %.4f ms a step, %.0f GB/s\n", x.kernel.c_str(), x.chain,
                     x.chain_ms, x.chain_gbps);
    }
    rep.results.push_back(res);
  }
  std::cout << (opt.json ? rep.json() : rep.text());
  return rep.all_pass() ? 0 : kExitCheckFailed;
}
#endif

/// Whether fault `f` goes into a run with `splits` splits (split-dropped: split-K runs only).
bool fault_applies(Fault f, int splits) { return f != Fault::none && (f != Fault::split_dropped || splits > 1); }

/// The batch a decode launch with fault `f` hands the kernels, the pool unchanged:
/// split-dropped removes the pages of split 0 of `splits` (keys_per_split()) from every
/// sequence that has a second split; page-table-shift makes the first sequence's first
/// block-table entry read its second page; last-batch leaves out the last sequence.
DecodeBatch faulty_batch(Fault f, const DecodeBatch& b, int splits) {
  DecodeBatch x = b;
  auto entry = [&](int s, int j) -> int32_t& { return x.block_table[std::size_t(s) * x.max_pages + j]; };
  if (f == Fault::split_dropped) {
    bool dropped = false;
    for (int s = 0; s < b.batch(); ++s) {
      const int per = keys_per_split(b.lens[s], splits), pages = per / b.page_size;
      if (b.lens[s] <= per || pages == 0) continue;
      for (int j = 0; j < b.max_pages; ++j) entry(s, j) = j + pages < b.max_pages ? entry(s, j + pages) : -1;
      x.lens[s] = b.lens[s] - pages * b.page_size;
      dropped = true;
    }
    if (!dropped) throw UsageError("split-dropped needs a sequence with two splits of whole pages (a longer --nk)");
  } else if (f == Fault::page_table_shift) {
    if (b.lens[0] <= b.page_size) throw UsageError("page-table-shift needs --nk > --page-size");
    entry(0, 0) = entry(0, 1);
  } else if (f == Fault::last_batch) {
    if (b.batch() < 2) throw UsageError("last-batch needs --batch > 1");
    x.lens.pop_back();
    x.block_table.resize(std::size_t(x.batch()) * x.max_pages);
  }
  return x;
}

/// A faulty launch's outputs as the full batch's buffers hold them (last-batch: zeros).
template <class Out>
Out widen_outputs(Out out, const DecodeBatch& b) {
  out.o.resize(std::size_t(b.batch()) * b.heads * b.d, 0.0f);
  out.lse.resize(std::size_t(b.batch()) * b.heads, 0.0f);
  return out;
}

int run_decode(int argc, char** argv, bool dry = false) {
  DecodeOptions dopt;
  Problem defaults;
  defaults.batch = 4;
  defaults.heads = 8;
  defaults.kv_heads = 2;
  defaults.nq = 1;
  defaults.nk = 1000;
  defaults.d = defaults.dv = 128;
  defaults.dtype = DType::bf16;
  Cli cli(std::string(kChapter) + " decode",
          "One decode step (one query token per sequence) over a paged KV cache with GQA: v1 (one block per\n"
          "sequence and KV head), v2 (split-K, flash-decoding), v3 (the merge fused), v4 (8-bit codes into\n"
          "MMA fragments), v5 (block table read ahead), v6, v7, v9 (8-bit: lazy rescale, pages by TMA, keys\n"
          "as the MMA's rows), v12 (bf16: the merge in one round trip), v14 (bf16: v12 launched to overlap\n"
          "the kernel before it; timed in a --chain of steps), the final kernels final-bf16 and final-8bit,\n"
          "and with --lab the lab's v8, v10, v13; each against the fp64 reference.\n"
          "--nk is the longest cached length; --batch the number of sequences.");
  cli.defaults(defaults).head_dims({64, 128}).dtypes({DType::bf16});
  cli.faults(kDecodeFaults);
  cli.add_int("--page-size", &dopt.page_size, "tokens per page, a power of two in [1, 256]", 1, 256);
  cli.add_choice("--lengths", &dopt.lengths, {"ragged", "equal"},
                 "ragged: --nk, 1, P-1, P, P+1, ... ; equal: every sequence --nk long");
  cli.add_int("--shared-prefix", &dopt.shared_prefix, "tokens every sequence shares (whole pages, by fork)", 0,
              1 << 30);
  cli.add_int("--splits", &dopt.splits, "v2 split count (0: the heuristic's choice)", 0, 4096);
  cli.add_int("--sms", &dopt.sms, "SM count the heuristic assumes (0: the device's, or 132)", 0, 100000);
  cli.add_flag("--sweep", &dopt.sweep, "the README's bandwidth table (needs a GPU)");
  cli.add_choice("--sweep-shapes", &dopt.sweep_set, {"all", "b1", "quant"},
                 "with --sweep: all (the README's table), b1 (one sequence, 32K-128K) or quant (bf16/fp8/int8/int4)");
  cli.add_choice("--kv-dtype", &dopt.kv_dtype, {"bf16", "fp8", "int8", "int4"},
                 "how the cache stores K and V: bf16, or 8-bit codes (E4M3 / INT8) or 4-bit ones (INT4, two per byte; "
                 "kernels v1-v3) with a scale per page and KV head");
  cli.add_choice("--since", &dopt.since, {"v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8", "v9", "v10", "v12", "v13", "v14"},
                 "run (and time) only this GPU kernel and the later steps, e.g. v7: v7 and v8 (default v1: all)");
  cli.add_int("--chain", &dopt.chain,
              "also time v12 and later as R steps launched back to back (the time per step; v14 overlaps each "
              "step with the one before; 0: not timed)", 0, 64);
  cli.add_flag("--untimed", &dopt.untimed, "run and check each GPU kernel once, without timing it (for a profiler)");
  cli.add_flag("--lab", &dopt.lab,
               "also run the lab's steps (v8, v10, v13: steps/lab/, LAB.md); needs a build configured with "
               "-DTUTORIAL_LAB=ON");
  cli.add_flag("--accuracy", &dopt.accuracy,
               "the accuracy table of the 8-bit and 4-bit caches against bf16 and fp64 (CPU model; any machine)");
  return run_chapter(argc, argv, cli, [&](const Options& opt) {
    const Problem& p0 = opt.problem;
    if (p0.nq != 1) throw UsageError("decode has one query token per sequence: --n must be 1");
    if (p0.causal) throw UsageError("--causal means nothing for decode: the new token sees every cached key");
    if ((dopt.page_size & (dopt.page_size - 1)) != 0)
      throw UsageError("--page-size must be a power of two (the kernels find a slot with a shift), got " +
                       std::to_string(dopt.page_size));
    KvDtype kv_dtype = KvDtype::bf16;
    parse_kv_dtype(dopt.kv_dtype, &kv_dtype);
    if (kv_quantised(kv_dtype) && p0.d != 128)
      throw UsageError("--kv-dtype " + dopt.kv_dtype + " is built for --d 128 (the 8-bit kernels' one head dim)");
    if (dopt.lab && !TUTORIAL_LAB)
      throw UsageError("--lab: this build has no lab steps (configure with -DTUTORIAL_LAB=ON)");
    if (dopt.accuracy && dopt.sweep) throw UsageError("--accuracy and --sweep are two different tables: pick one");
    if (dry) return 0;
    if (dopt.accuracy) {
      const AccuracyTable t = kv_accuracy_table(opt.seed);
      std::cout << (opt.json ? t.json() : t.text());
      return 0;
    }
    Report rep;
    rep.chapter = kChapter;
    rep.title = std::string("decode over a paged KV cache: v1, split-K v2, fused-combine v3, codes-to-fragments v4, table lookahead v5, lazy rescale v6, TMA pages v7, keys as rows v9, one-trip merge v12, overlapped launch v14, final-bf16, final-8bit (--lab: v8, v10, v13); K/V ") + kv_dtype_name(kv_dtype);
    const auto dev = select_device(opt.device, &rep.mode);
    if (dopt.sweep) {
#if TUTORIAL_HAVE_CUDA
      if (!dev) throw UsageError("--sweep measures the GPU, and this run has none (" + rep.mode + ")");
      return run_sweep(opt, dopt, *dev);
#else
      throw UsageError("--sweep measures the GPU: this binary was built without CUDA");
#endif
    }
    if (p0.batch > 65535) throw UsageError("--batch must be at most 65535 sequences");
    if (opt.sram_bytes < decode_smem_bytes(p0.d))
      throw UsageError("--sram-bytes " + std::to_string(opt.sram_bytes) + " is less than the decode kernels' shared memory (" +
                       std::to_string(decode_smem_bytes(p0.d)) + " bytes at d = " + std::to_string(p0.d) + ")");
    // Host memory: the block manager's tables (pages of every sequence) and the fp64
    // check, which gathers at most three sequences' K and V for two KV heads.
    require_host_memory(16.0 * double(p0.batch) * (double(p0.nk) / dopt.page_size + 2) + 100.0 * double(p0.nk) * p0.d,
                        "the block tables and the fp64 check");
    const DecodeBatch b = make_batch(opt, dopt);
    rep.problem = as_problem(b);
    rep.inputs = std::string(dist_name(opt.dist)) + ", seed " + std::to_string(opt.seed) + "; " + b.describe();
    const int sms = dopt.sms > 0 ? dopt.sms : dev ? dev->sms : kDefaultSms;
    const SplitPlan plan = choose_splits(b, sms);
    const int v2_splits = std::max(2, dopt.splits > 0 ? dopt.splits : plan.splits);
    const int v10_splits = std::max(2, dopt.splits > 0 ? dopt.splits : choose_splits(b, sms, kV10BlocksPerSm).splits);
    const int final8_splits = std::max(2, dopt.splits > 0 ? dopt.splits : final_8bit_plan(b, sms).splits);
    const std::vector<float> q = make_queries(b, opt.seed, opt.dist);
    // An 8-bit pool: the scales of its pages, computed on the host as the device does.
    const KvScales scales = pool_scales(b, opt.seed, opt.dist);
    const KvContents hash_kv = hashed_contents(b, opt.seed, opt.dist, &scales);
    const DecodeOracle oracle(b, q, hash_kv, opt.check_all);
    rep.check_plan = oracle.describe();
    // --inject-fault: the batch (and queries) a faulty launch hands the model and the kernels.
    const DecodeBatch fb = opt.fault == Fault::none ? b : faulty_batch(opt.fault, b, v2_splits);
    const std::vector<float> fq(q.begin(), q.begin() + std::size_t(fb.batch()) * b.heads * b.d);

    // CPU model rows (counted traffic), while the step is small enough to simulate.
    const double step_flops = 4.0 * double(b.total_tokens()) * b.heads * b.d;
    const bool run_model = step_flops <= kModelFlopBudget;
    KvPools pools;
    if (run_model) {
      require_host_memory(8.0 * double(b.pool_elems()), "the CPU model's K/V pools");
      pools = fill_pools(b, opt.seed, opt.dist);
    }
    for (int splits : {1, v2_splits}) {
      ResultRow row;
      row.impl = splits == 1 ? "model v1" : "model v2, S=" + std::to_string(splits);
      row.device = "cpu";
      row.flops = 4.0 * double(b.total_tokens()) * b.heads * b.d;
      if (kv_quantised(b.kv_dtype)) row.impl += std::string(", ") + kv_dtype_name(b.kv_dtype) + " K/V";
      const DecodeTraffic f = decode_traffic(b, splits, true);
      if (run_model) {
        const bool faulty = fault_applies(opt.fault, splits);
        const DecodeModelResult m = faulty ? widen_outputs(decode_model(fb, fq, pools, splits, opt.sram_bytes), b)
                                           : decode_model(b, q, pools, splits, opt.sram_bytes);
        row.set_traffic(m.traffic);
        row.set_check(oracle.judge(m.o, m.lse));
        if (m.traffic.bytes_read != f.read() || m.traffic.bytes_written != f.write())
          row.note = "counted traffic differs from decode_traffic()";
        if (faulty) row.note = fault_note(opt.fault) + (row.note.empty() ? "" : "; " + row.note);
      } else {
        set_traffic(row, f);
        row.note = "model not run at this size; bytes from decode_traffic()";
      }
      rep.rows.push_back(row);
    }

#if TUTORIAL_HAVE_CUDA
    if (dev) {
      if (!decode_head_dim_supported(b.d)) throw UsageError("the decode kernels support head dims 64 and 128");
      require_device_memory(*dev, GpuDecoder::device_bytes(b, std::max(v2_splits, v10_splits), true), "the decode batch");
      if (opt.bench) rep.ceilings = measure_ceilings(DType::bf16);
      rep.device = dev->name;
      GpuDecoder gpu(b, q, KvContents{opt.seed, opt.dist, nullptr});
      if (kv_quantised(b.kv_dtype)) {
        const KvScales dev_scales = gpu.scales();
        if (dev_scales.k != scales.k || dev_scales.v != scales.v)
          rep.notes.push_back("  the device's page scales differ from the host's: the check below is void");
      }
      struct Run {
        std::string name;
        DecodeKernel kernel;
        int splits;
        KvLayout layout;
      };
      std::vector<Run> runs = {{"v1 paged", DecodeKernel::v1, 1, KvLayout::paged},
                               {"v2 paged, S=" + std::to_string(v2_splits), DecodeKernel::v2, v2_splits, KvLayout::paged},
                               {"v3 paged, S=" + std::to_string(v2_splits), DecodeKernel::v3, v2_splits, KvLayout::paged},
                               {"v4 paged, S=" + std::to_string(v2_splits), DecodeKernel::v4, v2_splits, KvLayout::paged},
                               {"v5 paged, S=" + std::to_string(v2_splits), DecodeKernel::v5, v2_splits, KvLayout::paged}};
      if (!kv_quantised(b.kv_dtype))
        runs.insert(runs.end(), {{"v12 paged, S=" + std::to_string(v2_splits), DecodeKernel::v12, v2_splits, KvLayout::paged},
                                 {"v14 paged, S=" + std::to_string(v2_splits), DecodeKernel::v14, v2_splits, KvLayout::paged},
                                 {"final-bf16 paged, S=" + std::to_string(v2_splits), DecodeKernel::final_bf16, v2_splits,
                                  KvLayout::paged}});
      if (kv_quantised(b.kv_dtype))
        runs.insert(runs.end(),
                    {{"v6 paged, S=" + std::to_string(v2_splits), DecodeKernel::v6, v2_splits, KvLayout::paged},
                     {"v7 paged, S=" + std::to_string(v2_splits), DecodeKernel::v7, v2_splits, KvLayout::paged},
                     {"v8 paged, S=" + std::to_string(v2_splits), DecodeKernel::v8, v2_splits, KvLayout::paged},
                     {"v9 paged, S=" + std::to_string(v2_splits), DecodeKernel::v9, v2_splits, KvLayout::paged},
                     {"v10 paged, S=" + std::to_string(v10_splits), DecodeKernel::v10, v10_splits, KvLayout::paged},
                     {"v13 paged, S=" + std::to_string(v10_splits), DecodeKernel::v13, v10_splits, KvLayout::paged},
                     {"final-8bit paged, S=" + std::to_string(final8_splits), DecodeKernel::final_8bit, final8_splits,
                      KvLayout::paged}});
      if (kv_quantised(b.kv_dtype) && b.page_size < DecodeGeometry::kTmaMinPage)
        runs.resize(runs.size() - 6);  // v7-v10, v13 and final-8bit copy whole pages of >= 8 tokens
      if (!kv_quantised(b.kv_dtype))
        runs.insert(runs.end(),
                    {{"v1 contiguous", DecodeKernel::v1, 1, KvLayout::contiguous},
                     {"v2 contiguous, S=" + std::to_string(v2_splits), DecodeKernel::v2, v2_splits, KvLayout::contiguous}});
      runs.erase(std::remove_if(runs.begin(), runs.end(), [&](const Run& r) { return !kernel_reads(b.kv_dtype, r.kernel); }),
                 runs.end());  // INT4 pages: v1-v3
      {
        std::string skipped;
        skip_hopper_runs(runs, *dev, &skipped);
        if (!skipped.empty()) rep.notes.push_back("  " + skipped);
      }
      std::unique_ptr<GpuDecoder> gpu_fault;  // --inject-fault: the faulty batch, uploaded once
      for (const Run& r : runs) {
        if (!kernel_kept(dopt, r.kernel)) continue;
        ResultRow row;
        row.impl = r.name;
        row.device = "cuda";
        row.flops = step_flops;
        row.bound = Bound::memory;
        set_traffic(row, decode_traffic(b, r.splits, r.layout == KvLayout::paged));
        const bool faulty = fault_applies(opt.fault, r.splits);
        if (faulty && !gpu_fault) gpu_fault = std::make_unique<GpuDecoder>(fb, fq, KvContents{opt.seed, opt.dist, nullptr});
        const GpuDecodeOutput out =
            faulty ? widen_outputs(gpu_fault->run(r.kernel, r.splits, r.layout), b) : gpu.run(r.kernel, r.splits, r.layout);
        row.set_check(oracle.judge(out.o, out.lse));
        if (faulty) row.note = fault_note(opt.fault);
        if (dopt.untimed) {
          rep.rows.push_back(row);
          continue;
        }
        row.set_time(gpu.time_ms(r.kernel, r.splits, r.layout));
        const double kv_gbps = b.kv_bytes() / (*row.time_ms * 1e-3) / 1e9;
        std::string n = "  " + r.name + ": KV " + fmt("%.0f", kv_gbps) + " GB/s, " +
                        fmt("%.1f", double(b.total_tokens()) / (*row.time_ms * 1e-3) / 1e6) + " M cached tokens/s";
        if (rep.ceilings.read_gbps) n += " (" + pct(kv_gbps / *rep.ceilings.read_gbps) + " of the read ceiling)";
        rep.notes.push_back(n);
        if (dopt.chain > 1 && r.kernel >= DecodeKernel::v12 && r.layout == KvLayout::paged) {
          const GpuDecodeOutput last = gpu.run_chain(r.kernel, r.splits, r.layout, dopt.chain);
          const CheckResult chained = oracle.judge(last.o, last.lse);
          const double ms = gpu.time_chain_ms(r.kernel, r.splits, r.layout, dopt.chain);
          rep.notes.push_back("  " + r.name + ", " + std::to_string(dopt.chain) + " steps in a row: " + fmt("%.4f", ms) +
                              " ms a step, KV " + fmt("%.0f", b.kv_bytes() / (ms * 1e-3) / 1e9) + " GB/s, last step " +
                              (chained.pass() ? "pass" : "FAIL"));
          if (!chained.pass()) row.set_check(chained);
        }
        rep.rows.push_back(row);
      }
      rep.apply_ceilings();
    }
#endif
    rep.notes.push_back("heuristic (" + std::to_string(sms) + " SMs): " + plan.why);
    rep.notes.push_back("KV bytes per step: " + format_bytes(b.kv_bytes()) + " for " + std::to_string(b.total_tokens()) +
                        " cached tokens; arithmetic intensity " +
                        fmt("%.1f", step_flops / b.kv_bytes()) + " FLOP/byte (G = " + std::to_string(b.group()) +
                        "): far below any GPU's balance point, so the measure is KV GB/s");
    rep.previous = "the prefill kernels of chapters 03-05 read K/V contiguously for many query rows; decode has one "
                   "row per head, reads K/V through a block table, and splits the keys (v2) instead of the queries";
    return rep.emit(std::cout, opt.json);
  });
}

// ============================================================================= radix

struct RadixOptions {
  int page_size = 16, requests = 200, pool_pages = 4096, max_running = 8;
  std::string workload = "all", policy = "lru";
  bool draw = false;
};

/// The README's radix tree: a tiny chat trace, with words for tokens and 2-token pages.
std::string radix_demo() {
  std::ostringstream s;
  std::vector<std::string> words;
  std::map<std::string, int32_t> ids;
  auto tok = [&](const std::string& text) {
    std::vector<int32_t> t;
    std::istringstream in(text);
    for (std::string w; in >> w;) {
      auto it = ids.find(w);
      if (it == ids.end()) {
        it = ids.emplace(w, int32_t(words.size())).first;
        words.push_back(w);
      }
      t.push_back(it->second);
    }
    return t;
  };
  auto name = [&](int32_t id) { return words[id]; };
  const int P = 2;
  PagePool pool(24, P);
  RadixCache tree(pool);
  struct Req {
    std::string who, prompt, answer;
  };
  const std::vector<Req> reqs = {
      {"r1", "you are a helpful bot . what is a page ?", "a block of slots"},
      {"r2", "you are a helpful bot . what is a trie ?", "a prefix tree"},
      {"r3", "you are a helpful bot . what is a page ? a block of slots and a fork ?", "shared pages"},
  };
  for (const Req& r : reqs) {
    const std::vector<int32_t> prompt = tok(r.prompt), answer = tok(r.answer);
    const std::vector<int32_t> lookup(prompt.begin(), prompt.end() - 1);
    const PrefixMatch m = tree.match_prefix(lookup);
    tree.lock(m.node);
    std::vector<int> pages = m.pages;
    for (int p : pages) pool.retain(p);
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), answer.begin(), answer.end());
    std::vector<int> fresh;
    pool.alloc_n(int((all.size() + P - 1) / P - pages.size()), &fresh);
    pages.insert(pages.end(), fresh.begin(), fresh.end());
    s << r.who << ": \"" << r.prompt << "\" -> \"" << r.answer << "\"\n    prefix hit " << m.tokens << " of "
      << prompt.size() << " prompt tokens (" << m.pages.size() << " pages); locked while it runs\n";
    tree.insert(all, pages);
    tree.unlock(m.node);
    for (int p : pages) pool.release(p);
  }
  s << "\nthe tree after r1, r2, r3 (2 tokens per page; a partial last page is not cached):\n" << tree.draw(name);
  const PrefixMatch m = tree.match_prefix(tok("you are a helpful bot . what is a page ?"));
  tree.lock(m.node);
  s << "\nr4 asks r1's question again and is running (its path is locked); now evict 4 pages:\n";
  std::vector<std::vector<int>> gone;
  const int freed = tree.evict(4, &gone);
  s << "  evicted " << freed << " pages:";
  for (const auto& g : gone) {
    s << " [";
    for (std::size_t i = 0; i < g.size(); ++i) s << (i ? " " : "") << g[i];
    s << "]";
  }
  s << "  (least recently used unlocked leaves first)\n" << tree.draw(name);
  const std::string why = tree.validate();
  s << "validate(): " << (why.empty() ? "every invariant holds" : why) << "; evictable " << tree.evictable_pages()
    << " + protected " << tree.protected_pages() << " = total " << tree.total_pages() << " pages\n";
  tree.unlock(m.node);
  return s.str();
}

int run_radix(int argc, char** argv, bool tour, bool dry = false) {
  RadixOptions ro;
  if (tour) ro.requests = 80;
  Cli cli(std::string(kChapter) + " radix",
          "RadixAttention's prefix cache against a vLLM-style hash-of-block cache and no cache, on seeded\n"
          "serving traces: hit rate, prefill tokens saved, peak pages. --draw: the radix tree of a tiny trace.");
  cli.add_int("--page-size", &ro.page_size, "tokens per page", 1, 4096);
  cli.add_int("--requests", &ro.requests, "requests per workload", 1, 1000000);
  cli.add_int("--pool-pages", &ro.pool_pages, "pages in the pool", 1, 1 << 26);
  cli.add_int("--max-running", &ro.max_running, "requests decoding at once", 1, 100000);
  cli.add_choice("--workload", &ro.workload, {"all", "chat", "few-shot", "agent", "independent"}, "which trace");
  cli.add_choice("--policy", &ro.policy, {"lru", "lfu"}, "radix eviction order");
  cli.add_flag("--draw", &ro.draw, "only draw the radix tree of a tiny trace");
  return run_chapter(argc, argv, cli, [&](const Options& opt) {
    if (dry) return 0;
    if (ro.draw) {
      if (opt.json) throw UsageError("--draw prints a picture: it has no JSON form");
      std::cout << radix_demo();
      return 0;
    }
    std::vector<Workload> ws;
    Workload one;
    if (ro.workload == "all") ws = all_workloads();
    else if (parse_workload(ro.workload, &one)) ws = {one};
    SimConfig cfg;
    cfg.page_size = ro.page_size;
    cfg.pool_pages = ro.pool_pages;
    cfg.max_running = ro.max_running;
    cfg.radix_policy = ro.policy == "lfu" ? Eviction::lfu : Eviction::lru;
    struct Result {
      Workload w;
      CacheKind c;
      SimStats s;
      long prompt;
    };
    std::vector<Result> results;
    for (Workload w : ws) {
      const Trace tr = make_trace(w, ro.requests, opt.seed);
      for (CacheKind c : {CacheKind::radix, CacheKind::hash, CacheKind::none})
        results.push_back({w, c, simulate(tr, c, cfg), tr.prompt_tokens()});
    }
    bool sound = true;
    for (const auto& r : results) sound = sound && r.s.final_validation.empty();
    if (opt.json) {
      std::ostringstream j;
      j << "{\"chapter\": \"" << kChapter << "\", \"subcommand\": \"radix\", \"seed\": " << opt.seed
        << ", \"page_size\": " << cfg.page_size << ", \"pool_pages\": " << cfg.pool_pages
        << ", \"max_running\": " << cfg.max_running << ", \"requests\": " << ro.requests << ", \"policy\": \""
        << ro.policy << "\", \"results\": [";
      for (std::size_t i = 0; i < results.size(); ++i) {
        const auto& r = results[i];
        j << (i ? ", " : "") << "{\"workload\": \"" << workload_name(r.w) << "\", \"cache\": \"" << cache_name(r.c)
          << "\", \"prompt_tokens\": " << r.s.prompt_tokens << ", \"cached_tokens\": " << r.s.cached_tokens
          << ", \"hit_rate\": " << jnum(r.s.hit_rate()) << ", \"computed_tokens\": " << r.s.computed_tokens
          << ", \"peak_pages\": " << r.s.peak_pages << ", \"peak_running_pages\": " << r.s.peak_running_pages
          << ", \"evicted_pages\": " << r.s.evicted_pages << ", \"preemptions\": " << r.s.preemptions
          << ", \"unreachable_pages\": " << r.s.unreachable_pages_at_end << ", \"valid\": "
          << (r.s.final_validation.empty() ? "true" : "false") << "}";
      }
      j << "]}\n";
      std::cout << j.str();
      return sound ? 0 : kExitCheckFailed;
    }
    std::cout << "== " << kChapter << " radix: prefix caches on serving traces ==\n"
              << "traces: " << ro.requests << " requests each, seed " << opt.seed << "; pool " << cfg.pool_pages
              << " pages of " << cfg.page_size << " tokens; " << cfg.max_running
              << " requests at once; radix eviction " << ro.policy << "\n\n";
    std::printf("%-12s %-6s %10s %9s %14s %11s %13s %9s %9s %8s %s\n", "workload", "cache", "prompt tok", "hit rate",
                "prefill saved", "peak pages", "peak running", "evicted", "stranded", "preempt", "check");
    for (const auto& r : results) {
      const std::string check = r.s.final_validation.empty() ? "ok" : "FAIL: " + r.s.final_validation;
      std::printf("%-12s %-6s %10ld %8.1f%% %14ld %11d %13d %9ld %9d %8d %s\n", workload_name(r.w), cache_name(r.c),
                  r.s.prompt_tokens, 100.0 * r.s.hit_rate(), r.s.cached_tokens, r.s.peak_pages,
                  r.s.peak_running_pages, r.s.evicted_pages, r.s.unreachable_pages_at_end, r.s.preemptions,
                  check.c_str());
    }
    std::cout << "\n(hit rate = prompt tokens served from the cache; peak running = distinct pages referenced by\n"
                 " running requests, so shared prefix pages count once; peak pages adds what the cache keeps;\n"
                 " stranded = cached blocks no lookup can reach any more, at the end of the trace.)\n\n";
    std::vector<Bar> hit, running;
    int max_running_pages = 1;
    for (const auto& r : results) max_running_pages = std::max(max_running_pages, r.s.peak_running_pages);
    for (const auto& r : results) {
      hit.push_back({workload_name(r.w), cache_name(r.c), pct(r.s.hit_rate()), r.s.hit_rate()});
      running.push_back({workload_name(r.w), cache_name(r.c), std::to_string(r.s.peak_running_pages),
                         double(r.s.peak_running_pages)});
    }
    std::cout << bar_chart("prompt tokens served from the cache (hit rate)", hit, 1.0) << "\n"
              << bar_chart("peak pages held by running requests", running, double(max_running_pages));
    if (tour) std::cout << "\n" << radix_demo();
    return sound ? 0 : kExitCheckFailed;
  });
}

// ============================================================================= swap

struct SwapOptions {
  int page_size = 16, requests = 200, pool_pages = 800, max_running = 16, host_pages = 0;
  int copy_gbps = 0, prefill_tflops = 0;
};

int run_swap(int argc, char** argv, bool dry = false) {
  SwapOptions so;
  Cli cli(std::string(kChapter) + " swap",
          "Preemption by swap (pages to a pinned host pool and back) against recompute, on the four serving\n"
          "traces with the radix cache and without a prefix cache, in a squeezed pool. Counts on any machine;\n"
          "times from measured rates: on a GPU the binary measures pinned copies and the bf16 GEMM; elsewhere\n"
          "give --copy-gbps and --prefill-tflops.");
  cli.add_int("--page-size", &so.page_size, "tokens per page", 1, 4096);
  cli.add_int("--requests", &so.requests, "requests per workload", 1, 1000000);
  cli.add_int("--pool-pages", &so.pool_pages, "device pages in the pool", 1, 1 << 26);
  cli.add_int("--host-pages", &so.host_pages, "host pages for swap (0: as many as the device pool)", 0, 1 << 26);
  cli.add_int("--max-running", &so.max_running, "requests decoding at once", 1, 100000);
  cli.add_int("--copy-gbps", &so.copy_gbps, "pinned copy rate in GB/s, both directions (0: measure on the GPU)", 0, 1000000);
  cli.add_int("--prefill-tflops", &so.prefill_tflops, "prefill rate in TFLOP/s (0: the measured bf16 GEMM)", 0, 1000000);
  return run_chapter(argc, argv, cli, [&](const Options& opt) {
    if (dry) return 0;
    SwapCostModel model;
    if (so.copy_gbps > 0) model.d2h_gbps = model.h2d_gbps = so.copy_gbps;
    if (so.prefill_tflops > 0) model.gemm_tflops = so.prefill_tflops;
    std::string mode;
    const auto dev = select_device(opt.device, &mode);
#if TUTORIAL_HAVE_CUDA
    if (dev && !model.valid()) {
      // One page of one layer per copy: P tokens x 8 KV heads x d 128, K and V, bf16.
      const std::size_t page_layer = std::size_t(so.page_size) * 8 * 128 * 2 * 2;
      const CopyRates c = measure_pinned_copy(page_layer, int(std::max<std::size_t>(64, (256u << 20) / page_layer)));
      if (so.copy_gbps <= 0) model.d2h_gbps = c.d2h_gbps, model.h2d_gbps = c.h2d_gbps;
      if (so.prefill_tflops <= 0) model.gemm_tflops = measure_gemm_tflops(DType::bf16);
      model.source = dev->describe() + ", " + today() + ": pinned copies of " + format_bytes(double(page_layer)) +
                     " (one page of one layer) D2H " + fmt("%.1f", model.d2h_gbps) + " GB/s, H2D " +
                     fmt("%.1f", model.h2d_gbps) + " GB/s; cuBLAS bf16 GEMM " + fmt("%.0f", model.gemm_tflops) +
                     " TFLOP/s, measured by this run";
    }
#endif
    if (model.valid() && model.source.empty())
      model.source = "rates from the command line: copy " + fmt("%.1f", model.d2h_gbps) + " GB/s, prefill " +
                     fmt("%.0f", model.gemm_tflops) + " TFLOP/s";
    SimConfig cfg;
    cfg.page_size = so.page_size;
    cfg.pool_pages = so.pool_pages;
    cfg.max_running = so.max_running;
    cfg.host_pages = so.host_pages;
    cfg.cost = model;  // with rates, a third run chooses per victim (Preemption::cheaper)
    const std::vector<SwapComparison> rows = swap_vs_recompute(so.requests, cfg, opt.seed);
    auto valid = [&](const SwapComparison& r) {
      return r.recompute.final_validation.empty() && r.swap.final_validation.empty() &&
             r.cheaper.final_validation.empty() && r.lookahead.final_validation.empty();
    };
    bool sound = true;
    for (const auto& r : rows) sound = sound && valid(r);
    auto secs = [](double s) { return std::isfinite(s) ? fmt("%.3f", s) : std::string("-"); };
    if (opt.json) {
      std::ostringstream j;
      j << "{\"chapter\": \"" << kChapter << "\", \"subcommand\": \"swap\", \"seed\": " << opt.seed
        << ", \"page_size\": " << cfg.page_size << ", \"pool_pages\": " << cfg.pool_pages << ", \"requests\": "
        << so.requests << ", \"d2h_gbps\": " << jnum(model.d2h_gbps) << ", \"h2d_gbps\": " << jnum(model.h2d_gbps)
        << ", \"gemm_tflops\": " << jnum(model.gemm_tflops) << ", \"rates\": \"" << json_escape(model.source)
        << "\", \"results\": [";
      for (std::size_t i = 0; i < rows.size(); ++i) {
        const auto& r = rows[i];
        j << (i ? ", " : "") << "{\"workload\": \"" << workload_name(r.workload) << "\", \"cache\": \""
          << cache_name(r.cache) << "\", \"preemptions_recompute\": " << r.recompute.preemptions
          << ", \"recompute_tokens\": " << r.recompute.recompute_tokens << ", \"preemptions_swap\": "
          << r.swap.preemptions << ", \"swap_outs\": " << r.swap.swap_outs << ", \"swapped_out_pages\": "
          << r.swap.swapped_out_pages << ", \"swapped_in_pages\": " << r.swap.swapped_in_pages
          << ", \"swap_fallback_recompute_tokens\": " << r.swap.recompute_tokens << ", \"steps_recompute\": "
          << r.recompute.steps << ", \"steps_swap\": " << r.swap.steps;
        if (model.valid())
          j << ", \"recompute_s\": " << jnum(model.recompute_s(r.recompute.recompute_tokens)) << ", \"swap_s\": "
            << jnum(r.seconds(r.swap, model, cfg.page_size)) << ", \"cheaper_swap_outs\": " << r.cheaper.swap_outs
            << ", \"cheaper_priced_recomputes\": " << r.cheaper.priced_recomputes << ", \"cheaper_preemptions\": "
            << r.cheaper.preemptions << ", \"cheaper_s\": " << jnum(r.seconds(r.cheaper, model, cfg.page_size))
            << ", \"lookahead_swap_outs\": " << r.lookahead.swap_outs << ", \"lookahead_preemptions\": "
            << r.lookahead.preemptions << ", \"lookahead_s\": " << jnum(r.seconds(r.lookahead, model, cfg.page_size));
        j << ", \"valid\": " << (valid(r) ? "true" : "false") << "}";
      }
      j << "]}\n";
      std::cout << j.str();
      return sound ? 0 : kExitCheckFailed;
    }
    std::cout << "== " << kChapter << " swap: preemption by swap against recompute ==\n"
              << "traces: " << so.requests << " requests each, seed " << opt.seed << "; device pool " << cfg.pool_pages
              << " pages of " << cfg.page_size << " tokens, host pool "
              << (cfg.host_pages ? cfg.host_pages : cfg.pool_pages) << " pages; " << cfg.max_running
              << " requests at once\n"
              << "model: " << format_bytes(model.kv_bytes_per_token) << " of KV per token (32 layers, 8 KV heads, d 128, bf16), "
              << fmt("%.0f", model.prefill_flops_per_token / 1e9) << " GFLOP of prefill per token (2 x 8B parameters)\n"
              << "rates: " << (model.valid() ? model.source : std::string("none (no GPU): counts only; give --copy-gbps and --prefill-tflops for times")) << "\n\n";
    std::printf("%-12s %-6s | %8s %12s %12s | %8s %9s %9s %9s %11s | %7s %7s %11s | %7s %7s %11s | %8s\n",
                "workload", "cache", "preempt", "recompute", "recompute s", "preempt", "pages out", "pages in", "fallback",
                "swap s", "swaps", "recomp", "cheaper s", "swaps", "recomp", "lookahead s", "check");
    for (const auto& r : rows) {
      const double rs = model.valid() ? model.recompute_s(r.recompute.recompute_tokens) : NAN;
      const double ss = model.valid() ? r.seconds(r.swap, model, cfg.page_size) : NAN;
      const double cs = model.valid() ? r.seconds(r.cheaper, model, cfg.page_size) : NAN;
      const std::string sw = model.valid() ? std::to_string(r.cheaper.swap_outs) : "-";
      const std::string rc = model.valid() ? std::to_string(r.cheaper.preemptions - r.cheaper.swap_outs) : "-";
      const double ls = model.valid() ? r.seconds(r.lookahead, model, cfg.page_size) : NAN;
      const std::string lsw = model.valid() ? std::to_string(r.lookahead.swap_outs) : "-";
      const std::string lrc = model.valid() ? std::to_string(r.lookahead.preemptions - r.lookahead.swap_outs) : "-";
      std::printf("%-12s %-6s | %8d %12ld %12s | %8d %9ld %9ld %9ld %11s | %7s %7s %11s | %7s %7s %11s | %8s\n",
                  workload_name(r.workload), cache_name(r.cache), r.recompute.preemptions, r.recompute.recompute_tokens,
                  secs(rs).c_str(), r.swap.preemptions, r.swap.swapped_out_pages, r.swap.swapped_in_pages,
                  r.swap.recompute_tokens, secs(ss).c_str(), sw.c_str(), rc.c_str(), secs(cs).c_str(), lsw.c_str(),
                  lrc.c_str(), secs(ls).c_str(),
                  valid(r) ? "ok"
                           : ("FAIL: " + r.recompute.final_validation + r.swap.final_validation +
                              r.cheaper.final_validation + r.lookahead.final_validation)
                                 .c_str());
    }
    std::cout << "\n(recompute: tokens whose KV a preemption threw away, prefilled again, priced at the GEMM ceiling (a\n"
                 " lower bound). swap: pages copied to the host and back, priced at the measured pinned copy rate;\n"
                 " fallback = tokens recomputed when the host pool was full or nothing else could run. cheaper: each\n"
                 " victim swapped or recomputed, whichever these prices make cheaper for it: its swaps, its recomputes,\n"
                 " its time; needs rates. lookahead: each victim's choice priced by the whole rest of the trace after\n"
                 " it (a swapped victim returns with all its pages, and the next page fault preempts again): its swaps,\n"
                 " its recomputes, its time; never more than cheaper's.)\n";
    return sound ? 0 : kExitCheckFailed;
  });
}

// ============================================================================= tour

int run_tour(int argc, char** argv) {
  for (int a = 1; a < argc; ++a) {
    if (std::strcmp(argv[a], "--help") == 0 || std::strcmp(argv[a], "-h") == 0) {
      std::cout << "usage: " << kChapter << " [paged | decode | radix] [options]\n"
                << "PagedAttention and RadixAttention. Without a subcommand: a short tour of all three at small\n"
                << "sizes, taking the common options (--device, --seed, ...). Each subcommand takes --help.\n";
      return 0;
    }
    if (std::strcmp(argv[a], "--json") == 0) {
      std::cerr << kChapter << ": error: --json needs a subcommand: paged, decode or radix\n";
      return kExitUsage;
    }
  }
  for (int a = 1; a < argc; ++a)  // the faults go into decode alone: the tour is decode's run
    if (std::strncmp(argv[a], "--inject-fault", 14) == 0) return run_decode(argc, argv);
  // Every part must accept the options before any of them prints anything.
  if (const int rc = run_paged(argc, argv, true, true)) return rc;
  if (const int rc = run_decode(argc, argv, true)) return rc;
  if (const int rc = run_radix(argc, argv, true, true)) return rc;
  std::cout << "ch07_paged_radix: a tour at small sizes. Subcommands: paged, decode, radix (each takes --help).\n\n";
  int rc = run_paged(argc, argv, true);
  if (rc != 0) return rc;
  std::cout << "\n";
  rc = run_decode(argc, argv);
  std::cout << "\n";
  const int rr = run_radix(argc, argv, true);
  return rc != 0 ? rc : rr;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && argv[1][0] != '-') {
    const std::string sub = argv[1];
    // The subcommand's own argv: the program name, then the options.
    std::vector<char*> args = {argv[0]};
    for (int a = 2; a < argc; ++a) args.push_back(argv[a]);
    const int n = int(args.size());
    if (sub == "paged") return run_paged(n, args.data(), false);
    if (sub == "decode") return run_decode(n, args.data());
    if (sub == "radix") return run_radix(n, args.data(), false);
    if (sub == "swap") return run_swap(n, args.data());
    std::cerr << kChapter << ": error: unknown subcommand '" << sub << "' (paged, decode, radix or swap)\n";
    return kExitUsage;
  }
  return run_tour(argc, argv);
}
