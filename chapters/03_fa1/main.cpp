// ch03_fa1: FlashAttention-1. The CPU models of Algorithm 1 (forward) and Algorithm 4
// (backward) with counted HBM traffic next to chapter 01's, and (with a GPU) both
// kernels checked against the fp64 reference, timed, and compared with chapter 01's.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <optional>

#include "common/check.hpp"
#include "common/cli.hpp"
#include "common/device.hpp"
#include "common/report.hpp"
#include "fa1_gpu.hpp"
#include "fa1_model.hpp"
#include "linear_attention.hpp"
// Chapter 01, by its path: this binary reports chapter 01's numbers next to FA1's.
#include "chapters/01_naive/naive_gpu.hpp"
#include "chapters/01_naive/naive_model.hpp"

#if TUTORIAL_HAVE_CUDA
#include "common/cuda/ceilings.cuh"
#endif

using namespace attn;
using namespace attn::ch03;

namespace {

/// Above this many forward FLOPs the CPU models are not run (one core, scalar loops);
/// their bytes come from the traffic formulas instead, which the tests prove equal.
constexpr double kModelFlopBudget = 2e10;
/// Chapter 01's backward model stores and rereads four N^2 matrices: run it below this.
constexpr double kNaiveBackwardFlopBudget = 4e9;
/// fp64 backward checks above this many FLOPs run on a smaller problem instead.
constexpr double kBackwardCheckBudget = 2e10;

/// The --bench sweep: 128 (batch, head) pairs, one thread block each for the 132 SMs of
/// an H200, and enough that chapter 01's S and P (both pipelines) stop fitting in its
/// memory at N = 16K while FA1's O(N) scratch does not notice.
constexpr int kSweepBatch = 8, kSweepHeads = 16;
constexpr int kSweepN[] = {1024, 4096, 16384};

std::string blocks_text(Blocks b) { return std::to_string(b.Br) + " x " + std::to_string(b.Bc); }

/// The problem on which the backward's values are checked in fp64: the problem itself
/// when that is cheap enough, else one KV group at a sequence length of at most 2048.
Problem backward_check_problem(const Problem& p, bool check_all) {
  const double per_group = 2.0 * 5.0 * p.nq * double(p.nk) * p.d * p.group();
  if (check_all || per_group * double(BackwardPlan::sampled(p).kv_groups.size()) <= kBackwardCheckBudget) return p;
  Problem c = p;
  c.batch = 1;
  c.heads = p.group();
  c.kv_heads = 1;
  const double f = std::min(1.0, 2048.0 / std::max(p.nq, p.nk));
  c.nq = std::max(1, int(p.nq * f));
  c.nk = std::max(1, int(p.nk * f));
  return c;
}

BackwardPlan backward_plan(const Problem& p, bool check_all) {
  return check_all ? BackwardPlan::full(p) : BackwardPlan::sampled(p);
}

double ratio(double a, double b) { return b > 0 ? a / b : 0; }

#if TUTORIAL_HAVE_CUDA

/// The GPU backward, checked: in fp64 on `p` itself when affordable (with `oracle` when
/// the caller has one), else in fp64 on backward_check_problem() and for NaN
/// (unwritten elements) on every element of `p`.
ResultRow gpu_backward_row(const Problem& p, const AttnInputs& in, const Options& opt, const std::string& label,
                           const BackwardOracle* oracle, int warmup) {
  ResultRow row;
  row.impl = label;
  row.device = "cuda";
  row.flops = flops_backward(p);
  const Fa1Traffic t = fa1_backward_traffic(p, kernel_backward_blocks(p.d));
  row.hbm_read_bytes = t.read();
  row.hbm_write_bytes = t.write();
  row.extra_bytes = t.extra;
  row.bound = Bound::compute;
  const GpuBackward g = fa1_backward_gpu(p, in, /*time=*/true, warmup);
  row.set_time(g.time_ms);
  const Problem cp = backward_check_problem(p, opt.check_all);
  if (cp.nq == p.nq && cp.nk == p.nk && cp.batch == p.batch && cp.heads == p.heads) {
    if (oracle) {
      row.set_check(oracle->judge(g.dq, g.dk, g.dv));
    } else {
      const BackwardOracle here(p, in, backward_plan(p, opt.check_all));
      row.set_check(here.judge(g.dq, g.dk, g.dv));
    }
    return row;
  }
  const AttnInputs small_in = make_inputs(cp, opt.dist, opt.seed, /*with_dout=*/true);
  const BackwardOracle small(cp, small_in, BackwardPlan::full(cp));
  const GpuBackward gs = fa1_backward_gpu(cp, small_in, /*time=*/false);
  CheckResult c = small.judge(gs.dq, gs.dk, gs.dv);
  for (const auto* x : {&g.dq, &g.dk, &g.dv}) {
    const std::size_t nan = count_unwritten(x->data(), x->size());
    if (nan) {
      TensorCheck unwritten;
      unwritten.name = "NaN";
      unwritten.verdict.reason = std::to_string(nan) + " unwritten (NaN) elements at the full size";
      c.tensors.push_back(unwritten);
    }
  }
  row.set_check(c);
  if (row.note.empty()) row.note = "values checked in fp64 at " + cp.describe() + "; every element checked for NaN";
  return row;
}

ResultRow gpu_forward_row(const Problem& p, const AttnInputs& in, const ForwardOracle& oracle, const std::string& label,
                          int warmup, Fault fault = Fault::none) {
  ResultRow row;
  row.impl = label;
  row.device = "cuda";
  row.flops = flops_forward(p);
  const Fa1Traffic t = fa1_forward_traffic(p, kernel_forward_blocks(p.d));
  row.hbm_read_bytes = t.read();
  row.hbm_write_bytes = t.write();
  row.extra_bytes = t.extra;
  row.bound = Bound::compute;
  const GpuForward g = run_faulty(fault, p, in, kernel_forward_blocks(p.d).Bc,
                                  [&](const Problem& fp, const AttnInputs& fin) {
                                    return fa1_forward_gpu(fp, fin, /*time=*/true, warmup);
                                  });
  row.set_check(oracle.judge(g.o, &g.lse));
  if (fault != Fault::none) row.note = fault_note(fault);
  row.set_time(g.time_ms);
  return row;
}

/// Chapter 01's pipeline at the same shape, or a row that says it does not fit.
ResultRow naive_row(const Problem& p, const AttnInputs& in, const ForwardOracle& oracle, ch01::Pipeline which,
                    const std::string& label, double* ms) {
  ResultRow row;
  row.impl = label;
  row.device = "cuda";
  row.flops = flops_forward(p);
  const ch01::NaiveTrafficFormula f =
      which == ch01::Pipeline::handwritten ? ch01::naive_forward_traffic(p) : ch01::naive_cublas_traffic(p);
  row.hbm_read_bytes = f.read();
  row.hbm_write_bytes = f.write();
  row.extra_bytes = f.extra();
  row.bound = Bound::memory;
  *ms = 0;
  std::string why;
  const auto dev = query_device(&why);  // free memory now
  const double need = ch01::naive_device_bytes(p, which);
  if (!dev || need > 0.95 * double(dev->free_mem)) {
    row.note = "does not fit: needs " + format_bytes(need) + " of device memory, " +
               (dev ? format_bytes(double(dev->free_mem)) : std::string("0 B")) + " free (S and P are N^2)";
    return row;
  }
  const ch01::GpuForward g = ch01::naive_forward_gpu(p, in, which, /*time=*/true);
  row.set_check(oracle.judge(g.o, &g.lse));
  row.set_time(g.time_ms);
  *ms = g.time_ms;
  return row;
}

/// --bench: N = 1K, 4K, 16K at B = 8, Hq = 16.
void sweep(const Options& opt, Report& rep) {
  const Problem& base = opt.problem;
  for (int n : kSweepN) {
    Problem s = base;
    s.batch = kSweepBatch;
    s.heads = kSweepHeads;
    s.kv_heads = kSweepHeads % base.group() == 0 ? kSweepHeads / base.group() : kSweepHeads;
    s.nq = s.nk = n;
    const std::string tag = "N=" + std::to_string(n) + " ";
    std::string why;
    const auto dev = query_device(&why);
    if (!dev || fa1_device_bytes(s, true) > 0.95 * double(dev->free_mem)) {
      rep.notes.push_back("sweep " + s.describe() + ": FA1 does not fit in device memory either");
      continue;
    }
    const AttnInputs in = make_inputs(s, opt.dist, opt.seed, /*with_dout=*/true);
    const ForwardOracle oracle(s, in, CheckPlan::sampled(s));
    ResultRow f = gpu_forward_row(s, in, oracle, tag + "FA1 forward kernel", /*warmup=*/1);
    rep.rows.push_back(f);
    rep.rows.push_back(gpu_backward_row(s, in, opt, tag + "FA1 backward kernel", nullptr, /*warmup=*/1));
    std::string line = "sweep " + s.describe() + ": FA1 forward " + fmt("%.3g ms", f.time_ms.value_or(0));
    for (ch01::Pipeline which : {ch01::Pipeline::handwritten, ch01::Pipeline::cublas}) {
      double ms = 0;
      ResultRow r = naive_row(s, in, oracle, which, tag + "ch01 " + ch01::pipeline_name(which), &ms);
      line += std::string(", ch01 ") + ch01::pipeline_name(which) + ": " +
              (ms > 0 ? fmt("%.2fx", ratio(ms, *f.time_ms)) + " speed-up" : std::string("does not fit"));
      rep.rows.push_back(r);
    }
    rep.notes.push_back(line);
  }
}

#endif  // TUTORIAL_HAVE_CUDA

}  // namespace

int main(int argc, char** argv) {
  Problem defaults;
  defaults.batch = 1;
  defaults.heads = defaults.kv_heads = 4;
  defaults.nq = defaults.nk = 1024;
  defaults.d = defaults.dv = 64;
  defaults.dtype = DType::bf16;
  Cli cli("ch03_fa1",
          "FlashAttention-1: Q, K, V tiled through on-chip memory (K/V outer, Q inner), no N^2 matrix in HBM,\n"
          "S and P recomputed in the backward. CPU models with counted traffic; the kernels when a GPU is present.");
  cli.defaults(defaults).head_dims({32, 64, 128});
  cli.faults({Fault::last_key_block, Fault::last_batch, Fault::stale_lse});
  int br = 0, bc = 0;
  cli.add_int("--br", &br, "B_r of the CPU models (0: the paper's rule from --sram-bytes)", 0, 1 << 20);
  cli.add_int("--bc", &bc, "B_c of the CPU models (0: the paper's rule from --sram-bytes)", 0, 1 << 20);
  bool linear_study = false;
  LinearStudyOptions lin;
  cli.add_flag("--linear-study", &linear_study,
               "instead of the report: Performer and Linformer against exact attention, and causal Performer against exact causal (CPU, fp64; give a non-causal problem)");
  cli.add_int_list("--linear-m", &lin.features, "Performer's feature counts m of --linear-study (default 64,256,1024)",
                   1, 1 << 14);
  cli.add_int_list("--linear-k", &lin.projections, "Linformer's projected lengths k of --linear-study (default 64,256)",
                   1, 1 << 20);

  return run_chapter(argc, argv, cli, [&](const Options& opt) {
    const Problem& p = opt.problem;
    if (linear_study) {
      LinearStudyOptions o = lin;
      if (o.features.empty()) o.features = LinearStudyOptions{}.features;  // "all": the defaults
      if (o.projections.empty()) o.projections = LinearStudyOptions{}.projections;
      o.sram_bytes = opt.sram_bytes;
      require_host_memory(8.0 * (6.0 * double(p.s_elems()) / std::max(1, p.batch * p.heads)) +
                              16.0 * double(p.q_elems() + p.k_elems() + p.v_elems() + p.o_elems()),
                          "the linear-attention study");
      std::cout << format_linear_study(p, opt.seed, o, run_linear_study(p, opt.seed, o));
      return 0;
    }
    Report rep;
    rep.chapter = "ch03_fa1";
    rep.title = "FlashAttention-1 (Algorithm 1 forward, Algorithm 4 backward)";
    rep.problem = p;
    rep.inputs = std::string(dist_name(opt.dist)) + ", seed " + std::to_string(opt.seed);
    const auto dev = select_device(opt.device, &rep.mode);
    const std::string unsupported = kernel_unsupported(p);
    if (dev) {
      rep.device = dev->name;
      if (!unsupported.empty() && opt.device == DeviceChoice::cuda) throw UsageError(unsupported);
#if TUTORIAL_HAVE_CUDA
      if (unsupported.empty()) require_device_memory(*dev, fa1_device_bytes(p, true), "the FA1 kernels");
#endif
    }
    const bool run_model = flops_forward(p) <= kModelFlopBudget || opt.device == DeviceChoice::cpu;
    const bool run_naive_bwd = flops_forward(p) <= kNaiveBackwardFlopBudget;
    const double host_bytes = 4.0 * double(3 * p.q_elems() + 3 * p.k_elems() + 3 * p.v_elems() + 3 * p.o_elems()) +
                              (run_naive_bwd ? 4.0 * 4.0 * double(p.s_elems()) : 0.0);
    require_host_memory(host_bytes, "this problem");

    // --br / --bc override the paper's rule; either one alone keeps the rule for the other.
    auto pick = [&](Blocks rule) { return Blocks{br ? br : rule.Br, bc ? bc : rule.Bc}; };
    const Blocks model_fwd_blocks = pick(forward_blocks(p, opt.sram_bytes));
    const Blocks model_bwd_blocks = pick(backward_blocks(p, opt.sram_bytes));

    const AttnInputs in = make_inputs(p, opt.dist, opt.seed, /*with_dout=*/true);
    const ForwardOracle oracle(p, in, opt.check_all ? CheckPlan::full(p) : CheckPlan::sampled(p));
    rep.check_plan = oracle.plan().describe(p);
    const Problem bwd_check = backward_check_problem(p, opt.check_all);
    const bool bwd_here = bwd_check.nq == p.nq && bwd_check.nk == p.nk && bwd_check.batch == p.batch &&
                          bwd_check.heads == p.heads;
    std::optional<BackwardOracle> bwd_oracle;
    if (bwd_here) bwd_oracle.emplace(p, in, backward_plan(p, opt.check_all));
    rep.check_plan += "; backward: " + (bwd_here ? bwd_oracle->plan().describe(p)
                                                 : "values in fp64 at " + bwd_check.describe() +
                                                       " (all KV groups), every element for NaN");

    // Row 1-2: the CPU models, counted; or the formulas when the models would take too long.
    const Fa1Traffic fwd_formula = fa1_forward_traffic(p, model_fwd_blocks);
    const Fa1Traffic bwd_formula = fa1_backward_traffic(p, model_bwd_blocks);
    double fa1_fwd_bytes = fwd_formula.total(), fa1_bwd_bytes = bwd_formula.total();
    {
      ResultRow f, b;
      f.impl = "FA1 forward model (Alg. 1)";
      b.impl = "FA1 backward model (Alg. 4)";
      f.device = b.device = "cpu";
      f.flops = flops_forward(p);
      b.flops = flops_backward(p);
      if (run_model) {
        // An injected fault goes into the forward; the backward then reads its O and LSE.
        const Fa1ForwardResult m =
            run_faulty(opt.fault, p, in, model_fwd_blocks.Bc, [&](const Problem& fp, const AttnInputs& fin) {
              return fa1_forward_model(fp, fin, opt.sram_bytes, model_fwd_blocks);
            });
        f.set_traffic(m.traffic);
        f.set_check(oracle.judge(m.o, &m.lse));
        fa1_fwd_bytes = m.traffic.bytes();
        const Fa1BackwardResult mb = fa1_backward_model(p, in, m.o, m.lse, opt.sram_bytes, model_bwd_blocks);
        b.set_traffic(mb.traffic);
        fa1_bwd_bytes = mb.traffic.bytes();
        if (bwd_oracle) b.set_check(bwd_oracle->judge(mb.dq, mb.dk, mb.dv));
        else b.note = "not checked in fp64 at this size (see the GPU row)";
        if (m.traffic.bytes_read != fwd_formula.read() || m.traffic.bytes_written != fwd_formula.write())
          f.note = "counted traffic differs from fa1_forward_traffic()";
        if (mb.traffic.bytes_read != bwd_formula.read() || mb.traffic.bytes_written != bwd_formula.write())
          b.note = "counted traffic differs from fa1_backward_traffic()";
        if (opt.fault != Fault::none) f.note = fault_note(opt.fault);
      } else {
        for (auto* r : {&f, &b}) {
          const Fa1Traffic& t = r == &f ? fwd_formula : bwd_formula;
          r->hbm_read_bytes = t.read();
          r->hbm_write_bytes = t.write();
          r->extra_bytes = t.extra;
          r->note = "model not run at this size (" + fmt("%.3g", flops_forward(p)) +
                    " FLOPs on one core); bytes from the traffic formula";
        }
      }
      rep.rows.push_back(f);
      rep.rows.push_back(b);
    }

    // Rows 3-4: chapter 01 at the same shape, counted.
    const ch01::NaiveTrafficFormula naive_fwd = ch01::naive_forward_traffic(p);
    const double naive_fwd_bytes = naive_fwd.read() + naive_fwd.write();
    double naive_bwd_bytes = 0, naive_bwd_extra = 0;
    {
      ResultRow f;
      f.impl = "ch01 naive forward (counted)";
      f.device = "cpu";
      f.flops = flops_forward(p);
      f.hbm_read_bytes = naive_fwd.read();
      f.hbm_write_bytes = naive_fwd.write();
      f.extra_bytes = naive_fwd.extra();
      rep.rows.push_back(f);
      if (run_naive_bwd) {
        const ch01::NaiveBackwardResult nb = ch01::naive_backward_model(p, in, opt.sram_bytes);
        ResultRow b;
        b.impl = "ch01 naive backward (counted)";
        b.device = "cpu";
        b.flops = flops_backward(p);
        b.set_traffic(nb.traffic);
        naive_bwd_bytes = nb.traffic.bytes();
        naive_bwd_extra = nb.traffic.extra_peak;
        rep.rows.push_back(b);
      }
    }

    double fa1_fwd_ms = 0, naive_ms[2] = {0, 0};
#if TUTORIAL_HAVE_CUDA
    if (dev && !unsupported.empty()) rep.notes.push_back("GPU rows skipped: " + unsupported);
    if (dev && unsupported.empty()) {
      if (opt.bench) rep.ceilings = measure_ceilings(p.dtype);
      ResultRow f = gpu_forward_row(p, in, oracle, "FA1 forward kernel", 3, opt.fault);
      fa1_fwd_ms = f.time_ms.value_or(0);
      rep.rows.push_back(f);
      rep.rows.push_back(gpu_backward_row(p, in, opt, "FA1 backward kernel", bwd_oracle ? &*bwd_oracle : nullptr, 3));
      int k = 0;
      for (ch01::Pipeline which : {ch01::Pipeline::handwritten, ch01::Pipeline::cublas})
        rep.rows.push_back(naive_row(p, in, oracle, which, std::string("ch01 ") + ch01::pipeline_name(which) + " (fwd)",
                                     &naive_ms[k++]));
      rep.notes.push_back("kernels: B_r x B_c = " + blocks_text(kernel_forward_blocks(p.d)) + " forward, " +
                          blocks_text(kernel_backward_blocks(p.d)) + " backward (fp32 FMA, 256 threads); grid = " +
                          std::to_string(p.batch * p.heads) + " thread blocks forward, " +
                          std::to_string(p.batch * p.kv_heads) + " backward, on " + std::to_string(dev->sms) +
                          " SMs");
      if (opt.bench) sweep(opt, rep);
      rep.apply_ceilings();
    }
#endif

    // What Theorem 2 predicts, next to what was counted.
    const double thm2 = theorem2_scale(p, opt.sram_bytes);
    rep.notes.push_back("CPU model blocks: B_r x B_c = " + blocks_text(model_fwd_blocks) + " forward, " +
                        blocks_text(model_bwd_blocks) + " backward, from M = " + format_bytes(double(opt.sram_bytes)) +
                        " = " + std::to_string(opt.sram_bytes / kOnChipElemBytes) +
                        " fp32 elements (B_c = ceil(M/4d), B_r = min(B_c, d), capped to fit)");
    rep.notes.push_back("Theorem 2: forward bytes = " + format_bytes(fa1_fwd_bytes) + " = " +
                        fmt("%.1f", fa1_fwd_bytes / thm2) + " x N^2 d^2 / M summed over heads; T_c = " +
                        std::to_string(ceil_div(p.nk, model_fwd_blocks.Bc)) +
                        " passes over Q and (m, l, O), which are " +
                        fmt("%.0f%%", 100.0 * (fwd_formula.q_read + fwd_formula.state_read + fwd_formula.state_write) /
                                          fwd_formula.total()) +
                        " of the bytes");
    rep.notes.push_back("extra HBM: FA1 " + format_bytes(fwd_formula.extra) + " forward, " +
                        format_bytes(bwd_formula.extra) + " backward (O(N): statistics and fp32 accumulators); " +
                        "chapter 01 " + format_bytes(naive_fwd.extra()) + " forward" +
                        (naive_bwd_extra > 0 ? ", " + format_bytes(naive_bwd_extra) + " backward" : std::string()) +
                        " (O(N^2))");
    std::string prev = "chapter 01 moves " + fmt("%.2fx", ratio(naive_fwd_bytes, fa1_fwd_bytes)) +
                       " FA1's forward bytes (" + format_bytes(naive_fwd_bytes) + " vs " +
                       format_bytes(fa1_fwd_bytes) + ")";
    if (naive_bwd_bytes > 0)
      prev += " and " + fmt("%.2fx", ratio(naive_bwd_bytes, fa1_bwd_bytes)) + " its backward bytes (" +
              format_bytes(naive_bwd_bytes) + " vs " + format_bytes(fa1_bwd_bytes) + ")";
    if (fa1_fwd_ms > 0) {
      prev += "; FA1 forward speed-up over chapter 01's kernels: ";
      prev += naive_ms[0] > 0 ? fmt("%.2fx", naive_ms[0] / fa1_fwd_ms) + " (hand-written)" : "hand-written does not fit";
      prev += ", ";
      prev += naive_ms[1] > 0 ? fmt("%.2fx", naive_ms[1] / fa1_fwd_ms) + " (cuBLAS)" : "cuBLAS does not fit";
    }
    rep.previous = prev;
    return rep.emit(std::cout, opt.json);
  });
}
