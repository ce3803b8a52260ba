// ch06_variants ring: ring attention over P ranks, checked against single-device attention.
//
//   ch06_variants ring                                  P = 4 threads, zigzag, causal, N = 1000, GQA
//   ch06_variants ring --ranks 8 --layout striped       any P in [1, N], any layout
//   ch06_variants ring --backend streams --n 32768      P virtual ranks on one GPU (timed with --bench)
//   ch06_variants ring --backend nccl --ranks 2         one GPU per rank (when built with NCCL)
//   ch06_variants ring --table                          the load-balance table of every layout
//   ch06_variants ring --precision-study                bf16 against fp32 accumulators, P = 1 .. 64
//   ch06_variants ring --backend streams --bench --timeline t.svg   the overlap timeline
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "common/check.hpp"
#include "common/compare.hpp"
#include "common/cli.hpp"
#include "common/device.hpp"
#include "common/errors.hpp"
#include "common/report.hpp"
#include "parts.hpp"
#include "ring/ring_cpu.hpp"
#include "ring/ring_gpu.hpp"

namespace attn::ch06 {

using namespace ring;

namespace {

std::string pass_text(bool ok) { return ok ? "pass" : "FAIL"; }

int print_tables(const Problem& p, int ranks) {
  for (Layout l : {Layout::contiguous, Layout::striped, Layout::zigzag}) {
    std::printf("%s\n", format_work_table(l, p.nq, ranks, true).c_str());
  }
  return 0;
}

int print_precision(const Problem& base) {
  Problem p = base;
  const std::vector<int> ranks = {1, 2, 4, 8, 16, 32, 64};
  if (p.nq < 64) throw UsageError("--precision-study needs --n >= 64 (P goes up to 64)");
  std::printf("precision of the ring's merge, %s (CPU model, against fp64)\n", p.describe().c_str());
  std::printf("accumulator between steps: fp32, or rounded to bf16 after every merge / every add\n\n");
  std::printf("%4s | %10s %10s %10s %10s | %10s %10s %10s %10s | %s\n", "P", "O fp32", "O bf16", "O naive",
              "O tol", "dKV fp32", "dKV bf16", "dKV naive", "dKV tol", "pass fp32 / bf16");
  const auto rows = precision_study(p, ranks, 7);
  for (const PrecisionRow& r : rows)
    std::printf("%4d | %10.3e %10.3e %10.3e %10.3e | %10.3e %10.3e %10.3e %10.3e | %s / %s\n", r.ranks, r.o_f32,
                r.o_bf16, r.o_naive, r.o_tol, r.dkv_f32, r.dkv_bf16, r.dkv_naive, r.dkv_tol,
                pass_text(r.pass_f32).c_str(), pass_text(r.pass_bf16).c_str());
  std::printf("\n");
  for (const PrecisionRow& r : rows)
    std::printf("csv,%d,%.6e,%.6e,%.6e,%.6e,%.6e,%.6e,%.6e,%.6e,%d,%d\n", r.ranks, r.o_f32, r.o_bf16, r.o_naive,
                r.o_tol, r.dkv_f32, r.dkv_bf16, r.dkv_naive, r.dkv_tol, int(r.pass_f32), int(r.pass_bf16));
  return 0;
}

/// The key tile run_faulty() is given (the ring's faults, last-batch and wrong-kv-head, do not use it;
/// ring-step-skipped goes into the ring's own merge, RingOptions::skip and GpuRingOptions::skip).
constexpr int kFaultKeyTile = 64;

/// ring-step-skipped's place in a row's note: which rank left which step's block out.
std::string skipped_what(const SkippedStep& k) {
  if (k.rank < 0) return "";
  return " (rank " + std::to_string(k.rank) + " never merges the K/V block of rank " +
         std::to_string(kv_source(k.rank, k.step, k.rank + 1)) + ", its step " + std::to_string(k.step) + ")";
}

}  // namespace

int ring_main(int argc, char** argv) {
  Problem defaults;
  defaults.batch = 1;
  defaults.heads = 4;
  defaults.kv_heads = 2;   // GQA
  defaults.nq = defaults.nk = 1000;  // not a multiple of 2P
  defaults.d = defaults.dv = 64;
  defaults.causal = true;
  defaults.dtype = DType::bf16;
  Cli cli(argv[0],
          "ring attention: K/V shards rotate over P ranks; partials merge with the LSE form of ⊕.\n"
          "  --timeline FILE  GPU backends: write the timeline of one timed ring as an SVG");
  cli.defaults(defaults).head_dims({32, 64, 128}).dtypes({DType::bf16, DType::f16});
  cli.faults({Fault::last_batch, Fault::wrong_kv_head, Fault::ring_step_skipped});
  int ranks = 4;
  std::string layout_s = "zigzag", backend_s = "threads", timeline;
  bool no_backward = false, table = false, precision = false, no_decode = false, no_causal = false,
       serial_ranks = false;
  cli.add_int("--ranks", &ranks, "ring size P (1 <= P <= N)", -(1 << 30));
  cli.add_choice("--layout", &layout_s, {"contiguous", "striped", "zigzag"}, "how positions are sharded");
  cli.add_choice("--backend", &backend_s, {"threads", "streams", "nccl"},
                 "threads (CPU), streams (P virtual ranks, one GPU), nccl (a GPU per rank)");
  cli.add_flag("--no-causal", &no_causal, "no causal mask (the default problem is causal)");
  cli.add_flag("--no-backward", &no_backward, "forward only");
  cli.add_flag("--serial-ranks", &serial_ranks,
               "streams: one virtual rank computes at a time (per-rank step times measured alone)");
  cli.add_flag("--no-decode", &no_decode, "skip the tree-attention decode row");
  cli.add_flag("--table", &table, "print the load-balance table of every layout for --n and --ranks, and exit");
  cli.add_flag("--precision-study", &precision, "bf16 against fp32 accumulators for P = 1..64, and exit");
  // --timeline FILE takes a path, which the shared Cli has no kind for: it is taken out
  // of argv here (and listed in the summary line of --help).
  std::vector<char*> args;
  for (int a = 0; a < argc; ++a) {
    if (std::string(argv[a]) == "--timeline" && a + 1 < argc) {
      timeline = argv[++a];
      continue;
    }
    args.push_back(argv[a]);
  }
  if (!args.empty() && std::string(args.back()) == "--timeline") {
    std::fprintf(stderr, "%s: error: --timeline needs a file name\n", argv[0]);
    return kExitUsage;
  }

  return run_chapter(int(args.size()), args.data(), cli, [&](const Options& opt) {
    Problem p = opt.problem;
    if (no_causal) p.causal = false;
    Layout layout;
    Backend backend;
    parse_layout(layout_s, &layout);
    parse_backend(backend_s, &backend);
    validate_ring(p, ranks);
    if (table) return print_tables(p, ranks);
    if (precision) return print_precision(p);

    Report rep;
    rep.chapter = "ch06_variants ring";
    rep.title = "ring attention (" + std::to_string(ranks) + " ranks, " + layout_name(layout) + ", " +
                backend_name(backend) + ")";
    rep.problem = p;
    rep.inputs = std::string(dist_name(opt.dist)) + ", seed " + std::to_string(opt.seed);
    const bool gpu_backend = backend != Backend::threads;
    if (gpu_backend && opt.device == DeviceChoice::cpu)
      throw UsageError(std::string("--backend ") + backend_name(backend) +
                       " runs on the GPU; with --device cpu use --backend threads");
    const auto dev = gpu_backend ? select_device(DeviceChoice::cuda, &rep.mode) : std::nullopt;
    if (!gpu_backend) rep.mode = "CPU: threads backend (one thread per rank, mailboxes)";
    if (dev) rep.device = dev->describe();

    const bool with_backward = !no_backward;
    const AttnInputs in = make_inputs(p, opt.dist, opt.seed, with_backward);
    const CheckPlan plan = opt.check_all ? CheckPlan::full(p) : CheckPlan::sampled(p);
    rep.check_plan = plan.describe(p);
    const ForwardOracle fwd(p, in, plan);
    // The fp64 backward samples KV groups as every chapter's backward does (the first, the
    // last and a spread between; each needs all N x N pairs of its heads, which at the
    // benchmark sizes takes the CPU a while): no backward row passes without it.
    std::optional<BackwardOracle> bwd;
    if (with_backward) {
      bwd.emplace(p, in, opt.check_all ? BackwardPlan::full(p) : BackwardPlan::sampled(p));
      rep.check_plan += "; backward: " + bwd->plan().describe(p);
    }
    auto judge_backward = [&](ResultRow& row, const std::vector<float>& dq, const std::vector<float>& dk,
                              const std::vector<float>& dv) { row.set_check(bwd->judge(dq, dk, dv)); };

    const std::string tag = std::string(backend_name(backend)) + ", P=" + std::to_string(ranks) + ", " +
                            layout_name(layout);
    const double ff = flops_forward(p);
    if (!gpu_backend) {
      RingOptions ro;
      ro.layout = layout;
      ro.ranks = ranks;
      if (opt.fault == Fault::ring_step_skipped) ro.skip = skipped_ring_step(layout, p.nq, ranks, p.causal);
      // --inject-fault: the forward runs as a faulty launch (the backward then reads its O and LSE).
      const RingForwardResult f = run_faulty(opt.fault, p, in, kFaultKeyTile, [&](const Problem& fp, const AttnInputs& fin) {
        return ring_forward_cpu(fp, fin, ro);
      });
      ResultRow row;
      row.impl = "ring forward (" + tag + ")";
      row.device = "cpu";
      row.flops = ff;
      row.set_check(fwd.judge(f.o, &f.lse));
      const auto [lo, hi] = std::minmax_element(f.stats.rank_work.begin(), f.stats.rank_work.end());
      row.note = std::to_string(f.stats.pairs_computed) + " chunk pairs computed, " +
                 std::to_string(f.stats.pairs_skipped) + " skipped; busiest rank " +
                 fmt("%.2f", double(*hi) / std::max(1.0, double(*lo))) + "x the least busy; " +
                 fmt("%.1f", f.stats.bytes_sent / 1e6) + " MB through the mailboxes";
      if (opt.fault != Fault::none) row.note = fault_note(opt.fault) + skipped_what(ro.skip) + "; " + row.note;
      rep.rows.push_back(row);
      if (with_backward) {
        const RingBackwardResult b = ring_backward_cpu(p, in, f.o, f.lse, ro);
        ResultRow br;
        br.impl = "ring backward (" + tag + ")";
        br.device = "cpu";
        br.flops = 2.5 * ff;
        judge_backward(br, b.dq, b.dk, b.dv);
        br.note = "dK/dV travel with K/V and return home; " + fmt("%.1f", b.stats.bytes_sent / 1e6) +
                  " MB through the mailboxes";
        rep.rows.push_back(br);
      }
    } else {
      GpuRingOptions go;
      go.backend = backend;
      go.layout = layout;
      go.ranks = ranks;
      go.backward = with_backward;
      go.time = opt.bench || !timeline.empty();
      go.serial_ranks = serial_ranks;
      if (opt.fault == Fault::ring_step_skipped) go.skip = skipped_ring_step(layout, p.nq, ranks, p.causal);
      const std::string why = ring_gpu_unsupported(p, with_backward);
      if (!why.empty()) throw UsageError("the GPU ring does not run this problem: " + why);
      GpuRingResult g = run_faulty(opt.fault, p, in, kFaultKeyTile, [&](const Problem& fp, const AttnInputs& fin) {
        return ring_gpu(fp, fin, go);
      });
      // A faulty launch's gradients, as p's buffers would hold them (last-batch: zeros).
      g.dq.resize(p.q_elems(), 0.0f);
      g.dk.resize(p.k_elems(), 0.0f);
      g.dv.resize(p.v_elems(), 0.0f);
      ResultRow row;
      row.impl = "ring forward (" + tag + ")";
      row.device = "cuda";
      row.flops = ff;
      row.set_check(fwd.judge(g.o, &g.lse));
      if (go.time) {
        row.set_time(g.fwd_ms);
        row.note = "copies " + fmt("%.3f", g.copy_ms) + " ms, of which " +
                   fmt("%.1f", g.copy_ms > 0 ? 100.0 * g.hidden_copy_ms / g.copy_ms : 100.0) +
                   "% hidden behind compute";
      }
      if (opt.fault != Fault::none)
        row.note = fault_note(opt.fault) + skipped_what(go.skip) + (row.note.empty() ? "" : "; " + row.note);
      rep.rows.push_back(row);
      if (with_backward) {
        ResultRow br;
        br.impl = "ring backward (" + tag + ")";
        br.device = "cuda";
        br.flops = 2.5 * ff;
        judge_backward(br, g.dq, g.dk, g.dv);
        if (go.time) {
          br.set_time(g.bwd_ms);
          br.note = "copies (K/V and dK/dV) " + fmt("%.3f", g.bwd_copy_ms) + " ms, of which " +
                    fmt("%.1f", g.bwd_copy_ms > 0 ? 100.0 * g.bwd_hidden_copy_ms / g.bwd_copy_ms : 100.0) +
                    "% hidden behind compute";
        }
        rep.rows.push_back(br);
      }
      if (go.time) {
        const SingleGpuTiming single = single_gpu_timing(p, in, with_backward);
        ResultRow s;
        s.impl = "one device: chapter 04's kernel on the whole problem";
        s.device = "cuda";
        s.flops = ff;
        s.set_check(fwd.judge(single.o, &single.lse));
        s.set_time(single.fwd_ms);
        rep.rows.push_back(s);
        if (with_backward) {
          ResultRow sb;
          sb.impl = "one device: chapter 04's backward on the whole problem";
          sb.device = "cuda";
          sb.flops = 2.5 * ff;
          judge_backward(sb, single.dq, single.dk, single.dv);
          sb.set_time(single.bwd_ms);
          rep.rows.push_back(sb);
        }
        const double shard_bytes =
            double(kv_elems(p, ShardGeometry::of(layout, p.nq, ranks, 0))) * dtype_bytes(p.dtype);
        const double copy_ms = d2d_copy_ms(shard_bytes);
        rep.notes.push_back("one K/V shard message: " + fmt("%.2f", shard_bytes / 1e6) +
                            " MB; one device-to-device copy of it alone: " + fmt("%.4f", copy_ms) + " ms = " +
                            fmt("%.0f", shard_bytes / (copy_ms * 1e-3) / 1e9) + " GB/s (it reads and writes HBM)");
        rep.notes.push_back("ring forward: sum of compute intervals " + fmt("%.3f", g.compute_ms) + " ms over " +
                            std::to_string(ranks) + " ranks; K/V copies " + fmt("%.3f", g.copy_ms) + " ms, hidden " +
                            fmt("%.3f", g.hidden_copy_ms) + " ms");
        // The forward's compute time of every rank at every step, from the timeline.
        std::vector<std::vector<double>> step_ms(ranks, std::vector<double>(ranks, 0.0));
        for (const TimelineEvent& e : g.timeline)
          if (e.what == "fwd" && e.rank < ranks && e.step < ranks) step_ms[e.rank][e.step] += e.t1 - e.t0;
        for (int r = 0; r < ranks; ++r) {
          std::ostringstream line;
          line << "forward compute ms, rank " << r << ", steps 0.." << ranks - 1 << ":";
          for (double ms : step_ms[r]) line << " " << fmt("%.3f", ms);
          rep.notes.push_back(line.str());
        }
        std::ostringstream per;
        per << "forward compute per rank (ms, timeline):";
        for (double ms : g.rank_compute_ms) per << " " << fmt("%.3f", ms);
        rep.notes.push_back(per.str());
        for (const TimelineEvent& e : g.timeline)
          rep.notes.push_back("event rank=" + std::to_string(e.rank) + " lane=" + e.lane + " step=" +
                              std::to_string(e.step) + " what=" + e.what + " t0=" + fmt("%.4f", e.t0) +
                              " t1=" + fmt("%.4f", e.t1));
      }
      if (!timeline.empty()) {
        std::ofstream f(timeline);
        f << timeline_svg(g.timeline, ranks, rep.title + ", " + p.describe() + ", " + g.device + ", " + today());
        if (!f) throw UsageError("cannot write " + timeline);
      }
    }

    if (!no_decode) {
      // Tree attention: the decode case. A few query rows against the same K/V,
      // sharded contiguously over the ranks, one all-reduce of the partials.
      Problem dp = p;
      dp.nq = std::min(4, p.nk);
      const AttnInputs din = make_inputs(dp, opt.dist, opt.seed + 1);
      const ForwardOracle doracle(dp, din, CheckPlan::full(dp));
      const TreeDecodeResult t = tree_decode_cpu(dp, din, ranks);
      ResultRow row;
      row.impl = "tree decode (threads, P=" + std::to_string(ranks) + ", Nq=" + std::to_string(dp.nq) + ")";
      row.device = "cpu";
      row.flops = flops_forward(dp);
      row.set_check(doracle.judge(t.o, &t.lse));
      row.note = std::string("one all-reduce of (O, LSE) with ⊕; ranks ") +
                 (t.ranks_agree ? "agree bit for bit" : "DISAGREE");
      if (!t.ranks_agree) row.pass = false;
      rep.rows.push_back(row);
    }
    rep.notes.push_back(format_work_table(layout, p.nq, ranks, p.causal));
    return rep.emit(std::cout, opt.json);
  });
}

}  // namespace attn::ch06
