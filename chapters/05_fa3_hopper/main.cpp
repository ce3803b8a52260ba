// ch05_fa3_hopper: FlashAttention-3 on Hopper. The CPU model of the producer/consumer
// schedule (counted traffic), the FP8 accuracy table, and on an sm_90 GPU the main path's
// steps and final kernels (the lab's too with --lab) checked against the fp64 reference
// and timed.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>

#include "common/check.hpp"
#include "common/cli.hpp"
#include "common/device.hpp"
#include "common/report.hpp"
#include "backward_gpu.hpp"
#include "backward_model.hpp"
#include "fa3_gpu.hpp"
#include "fa3_model.hpp"
#include "fp8_model.hpp"

#if TUTORIAL_HAVE_CUDA
#include "common/cuda/ceilings.cuh"
#endif

using namespace attn;
using namespace attn::ch05;

namespace {

/// The CPU model does the full N^2 d work on one core; above this many FLOPs the report
/// takes the model's bytes from the formula instead of running it.
constexpr double kModelFlopBudget = 4e9;
/// fp64 work of the FP8 accuracy table (it runs four computations on sampled rows).
constexpr double kTableBudget = 3e8;

void add_accuracy_table(Report& rep, const Problem& p, const AttnInputs& in, const std::string& label) {
  if (p.d != p.dv || (p.d & (p.d - 1)) != 0) return;
  const CheckPlan plan = CheckPlan::sampled(p, kTableBudget);
  rep.notes.push_back("FP8 accuracy, O against fp64 (" + label + ", " + plan.describe(p) + "):");
  for (const Fp8AccuracyRow& r : fp8_accuracy_table(p, in, plan))
    rep.notes.push_back("  " + r.method + std::string(34 - std::min<std::size_t>(34, r.method.size()), ' ') +
                        "rel L2 " + fmt("%.2e", r.rel_l2) + "   max abs " + fmt("%.2e", r.max_abs));
}

/// One SM's on-chip memory (228 KB of shared memory and the 256 KB register file): the
/// budget of the backward model's tiles (K_j, V_j, dK_j, dV_j, Q_i, dO_i, dS^T, dQ_i).
constexpr std::size_t kBackwardModelSram = (228 + 256) * 1024;

/// The backward's CPU model row (the loops of steps b1 and b2 over counted tensors), or
/// its bytes from the formula when the problem is too large for one core.
void add_backward_model_row(Report& rep, const Problem& p, const AttnInputs& in, const BackwardOracle* oracle) {
  ResultRow row;
  row.impl = "FA3 backward model (b-step loops)";
  row.device = "cpu";
  row.flops = flops_backward(p);
  const Fa3BackwardTraffic f = fa3_backward_traffic(p);
  if (oracle) {
    const Fa3BackwardModelResult m = fa3_backward_model(p, in, kBackwardModelSram);
    row.set_traffic(m.traffic);
    row.set_check(oracle->judge(m.dq, m.dk, m.dv));
    if (m.traffic.bytes_read != f.read() || m.traffic.bytes_written != f.write())
      row.note = "counted traffic differs from fa3_backward_traffic()";
    else if (row.note.empty())
      row.note = std::to_string(m.dq_tile_adds) + " dQ tiles reduce-added (" + format_bytes(m.dq_add_bytes) +
                 " of accumulator reads and writes); on-chip " + format_bytes(double(m.sram_peak));
  } else {
    row.hbm_read_bytes = f.read();
    row.hbm_write_bytes = f.write();
    row.note = "backward model not run at this size; bytes from fa3_backward_traffic()";
  }
  rep.rows.push_back(row);
}

#if TUTORIAL_HAVE_CUDA
/// The backward rows: every backward step, dQ added in any order and deterministically,
/// each checked against the fp64 backward before it is timed (a failing kernel is not timed).
void add_backward_rows(Report& rep, const Problem& p, const AttnInputs& in, const BackwardOracle& oracle,
                       const DeviceInfo& dev, const std::string& which, const std::vector<int>& list, bool lab) {
  require_device_memory(dev, fa3_backward_device_bytes(p), "the backward's tensors");
  BackwardRunner runner(p, in);  // the tensors uploaded once for every row
  for (BwdStep s : kAllBwdSteps)
    for (bool det : {false, true}) {
      if (!list.empty() ? std::find(list.begin(), list.end(), int(s)) == list.end()
          : which == "all" ? bwd_step_in_lab(s) && !lab
                           : (s == BwdStep::final_bwd ? "final" : std::to_string(int(s))) != which)
        continue;
      if (!bwd_step_supports(s, p)) continue;  // b12: d = 64 only
      ResultRow row;
      row.impl = std::string(bwd_step_name(s)) + (det ? ", deterministic dQ" : "");
      row.device = "cuda";
      row.flops = flops_backward(p);
      row.bound = Bound::compute;
      CheckResult c;
      const GpuBackward g = runner.run(s, det, /*time=*/true, [&](const GpuBackward& r) {
        c = oracle.judge(r.dq, r.dk, r.dv);
        return c.pass();
      });
      row.set_check(c);
      if (c.pass()) row.set_time(g.time_ms);
      if (row.note.empty())
        row.note = std::to_string(g.grid) + " blocks, " + std::to_string(g.smem_bytes / 1024) +
                   " KB smem each; time = preprocess + main + postprocess";
      rep.rows.push_back(row);
    }
}
#endif

}  // namespace

int main(int argc, char** argv) {
  Problem defaults;
  defaults.batch = 1;
  defaults.heads = defaults.kv_heads = 4;
  defaults.nq = defaults.nk = 1024;
  defaults.d = defaults.dv = 128;
  defaults.dtype = DType::bf16;
  Cli cli("ch05_fa3_hopper",
          "FlashAttention-3 on Hopper: TMA, wgmma, warp specialisation, pingpong, overlap, persistent tiles, FP8.");
  cli.defaults(defaults).head_dims({64, 128, 256}).dtypes({DType::bf16, DType::f16});
  cli.faults({Fault::last_key_block, Fault::last_batch, Fault::stale_lse, Fault::wrong_kv_head});
  std::vector<int> step_list;  // empty: all
  constexpr int kLastLabStep = int(kLabSteps[std::size(kLabSteps) - 1]);
  cli.add_int_list("--step", &step_list,
                   "run these forward steps, e.g. 1,8,final (v1-v8, final, final-fp8; with --lab also the lab's v9-v" +
                       std::to_string(kLastLabStep) + "; inputs uploaded once for all), or all [all]",
                   1, kLastLabStep, {{"final", int(Step::final_fwd)}, {"final-fp8", int(Step::final_fp8)}});
  bool lab = false;
  cli.add_flag("--lab", &lab,
               "also run the lab's steps (steps/lab/, LAB.md): forward v9-v" + std::to_string(kLastLabStep) +
                   " and backward b3, b4, b7-b9, b12-b17; "
               "needs a build configured with -DTUTORIAL_LAB=ON");
  bool no_table = false;
  cli.add_flag("--no-fp8-table", &no_table, "skip the CPU FP8 accuracy table");
  bool no_backward = false;
  cli.add_flag("--no-backward", &no_backward, "skip the backward rows (dQ added in any order, then deterministically)");
  bool backward_only = false;
  cli.add_flag("--backward-only", &backward_only, "run the backward rows and no forward step (the backward still runs v8 for O and LSE)");
  int launch_only = 0;
  cli.add_int("--launch-only", &launch_only,
              "launch the chosen steps K times each on device-made inputs, and the steps of --backward-steps on seeded ones, nothing checked or timed (for a profiler)", 1, 100);
  std::string bwd_step_text = "auto";
  cli.add_choice("--backward-step", &bwd_step_text, {"auto", "all", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16", "17", "final"},
                 "run one backward step (b1, b2, b5, b6, b10, b11, final; the lab's with --lab) or all (see --backward-steps for several); auto: all with --step all, none with a list of forward steps");

  std::vector<int> bwd_step_list;  // empty: --backward-step decides
  cli.add_int_list("--backward-steps", &bwd_step_list,
                   "run these backward steps, e.g. 11,final (b1-b17, final), in place of --backward-step", 1,
                   int(BwdStep::b17_fa4_order), {{"final", int(BwdStep::final_bwd)}});

  return run_chapter(argc, argv, cli, [&](const Options& opt) {
    const Problem& p = opt.problem;
    Report rep;
    rep.chapter = "ch05_fa3_hopper";
    rep.title = "FlashAttention-3 on Hopper (warp-specialised TMA + wgmma, FP8)";
    rep.problem = p;
    rep.inputs = std::string(dist_name(opt.dist)) + ", seed " + std::to_string(opt.seed);
    const auto dev = select_device(opt.device, &rep.mode);
    if (lab && !TUTORIAL_LAB) throw UsageError("--lab: this build has no lab steps (configure with -DTUTORIAL_LAB=ON)");
    for (int k : step_list)
      if (!step_built(Step(k)))
        throw UsageError("--step " + std::to_string(k) + ": a lab step, and this build has no lab (configure with -DTUTORIAL_LAB=ON)");
    for (int k : bwd_step_list)
      if (!bwd_step_built(BwdStep(k)))
        throw UsageError("--backward-steps " + std::to_string(k) + ": a lab step, and this build has no lab (configure with -DTUTORIAL_LAB=ON)");
    if (bwd_step_text != "auto" && bwd_step_text != "all" && bwd_step_text != "final" &&
        !bwd_step_built(BwdStep(std::stoi(bwd_step_text))))
      throw UsageError("--backward-step " + bwd_step_text + ": a lab step, and this build has no lab (configure with -DTUTORIAL_LAB=ON)");
    std::vector<Step> steps;  // the main path (the lab's too with --lab), or the steps listed
    for (Step s : kAllSteps)
      if (step_list.empty() ? !step_in_lab(s) || lab
                            : std::find(step_list.begin(), step_list.end(), int(s)) != step_list.end())
        steps.push_back(s);
    if (backward_only) steps.clear();
    if (launch_only > 0) {  // the kernels alone, for Nsight Compute (scripts/ncu_fwd.py)
#if TUTORIAL_HAVE_CUDA
      std::string why;
      if (!dev || !hopper_ready(&why)) throw UsageError("--launch-only needs an sm_90 GPU" + (why.empty() ? "" : ": " + why));
      for (Step s : steps)
        if (step_supports(s, p)) fa3_launch_only(p, s, launch_only);
      // The backward steps of --backward-steps: seeded inputs, O and LSE from v8, no oracle.
      if (!bwd_step_list.empty()) fa3_backward_launch_only(p, make_inputs(p, opt.dist, opt.seed, true), bwd_step_list, launch_only);
      return 0;
#else
      throw UsageError("--launch-only needs the CUDA build");
#endif
    }

    const ScheduleConfig cfg = schedule_for(Step::v8_head_dims, p.d, p.causal);
    const bool run_model = flops_forward(p) <= kModelFlopBudget || opt.device == DeviceChoice::cpu;
    require_host_memory(4.0 * double(p.q_elems() + p.k_elems() + p.v_elems() + 3 * p.o_elems()), "this problem");

    const AttnInputs in = make_inputs(p, opt.dist, opt.seed, /*with_dout=*/!no_backward);
    const ForwardOracle oracle(p, in, opt.check_all ? CheckPlan::full(p) : CheckPlan::sampled(p));
    rep.check_plan = oracle.plan().describe(p);
    const Fa3TrafficFormula formula = fa3_forward_traffic(p, cfg);

    // Row 1: the schedule model (producer + two consumers, pingpong, overlap, persistent).
    {
      ResultRow row;
      row.impl = "FA3 schedule model (v8)";
      row.device = "cpu";
      row.flops = flops_forward(p);
      if (run_model) {
        const Fa3ModelResult m =
            run_faulty(opt.fault, p, in, cfg.Bc, [&](const Problem& fp, const AttnInputs& fin) {
              return fa3_forward_model(fp, fin, cfg, opt.sram_bytes);
            });
        row.set_traffic(m.traffic);
        row.set_check(oracle.judge(m.o, &m.lse));
        if (m.traffic.bytes_read != formula.read() || m.traffic.bytes_written != formula.write())
          row.note = "counted traffic differs from fa3_forward_traffic()";
        else if (m.stats.hazards)
          row.note = std::to_string(m.stats.hazards) + " stage reads found the wrong block";
        else
          row.note = std::to_string(m.stats.ops) + " schedule operations, no hazard; on-chip " +
                     format_bytes(double(m.sram_peak)) + " (Q tile + K/V ring of " + std::to_string(cfg.stages) +
                     ")";
      } else {
        row.hbm_read_bytes = formula.read();
        row.hbm_write_bytes = formula.write();
        row.extra_bytes = 0.0;
        row.note = "model not run at this size (" + fmt("%.3g", flops_forward(p)) +
                   " FLOPs on one core); bytes from fa3_forward_traffic()";
      }
      if (opt.fault != Fault::none) row.note = fault_note(opt.fault);
      rep.rows.push_back(row);
    }
    // The backward's fp64 oracle, once for the model row and the GPU rows.
    if (!bwd_step_list.empty()) bwd_step_text = "list";
    if (bwd_step_text == "auto") bwd_step_text = step_list.empty() || backward_only ? "all" : "none";
    const bool with_backward = !no_backward && bwd_step_text != "none" && backward_unsupported(p).empty();
    const bool run_backward_model = flops_backward(p) <= kModelFlopBudget || opt.device == DeviceChoice::cpu;
    std::optional<BackwardOracle> boracle;
    if (with_backward && (run_backward_model || dev))
      boracle.emplace(p, in, opt.check_all ? BackwardPlan::full(p) : BackwardPlan::sampled(p));
    if (boracle) rep.check_plan += "; backward: " + boracle->plan().describe(p);
    if (with_backward) add_backward_model_row(rep, p, in, run_backward_model ? &*boracle : nullptr);
    else if (!no_backward && bwd_step_text != "none") rep.notes.push_back("backward: not built for " + backward_unsupported(p) + ": not run");

#if TUTORIAL_HAVE_CUDA
    std::string why;
    if (dev && !hopper_ready(&why)) {
      rep.notes.push_back(why);
    } else if (dev) {
      rep.device = dev->name;
      require_device_memory(*dev, fa3_device_bytes(p, Step::final_fp8), "the chapter's tensors");
      std::optional<double> fp8_ceiling;
      if (opt.bench) {
        rep.ceilings = measure_ceilings(p.dtype);
        fp8_ceiling = measure_fp8_gemm_tflops();
        rep.notes.push_back("fp8 ceiling: cuBLASLt E4M3 GEMM 8192^3 " + fmt("%.4g", *fp8_ceiling) +
                            " TFLOP/s (measured in this run)");
      }
      std::unique_ptr<Fp8Oracle> fp8_oracle;
      std::unique_ptr<ForwardRunner> runner;  // Q, K, V uploaded once for every step's row
      for (Step s : steps) {
        std::string no;
        if (!step_supports(s, p, &no)) {
          rep.notes.push_back("  " + no + ": not run");
          continue;
        }
        ResultRow row;
        row.impl = step_name(s);
        row.device = "cuda";
        row.flops = flops_forward(p);
        const Fa3TrafficFormula f = fa3_forward_traffic(p, schedule_for(s, p.d, p.causal));
        row.hbm_read_bytes = f.read();
        row.hbm_write_bytes = f.write();
        row.extra_bytes = 0.0;
        if (!runner) runner = std::make_unique<ForwardRunner>(p, in);
        // An injected fault launches the step on the faulty problem, with its own upload.
        const GpuForward g =
            opt.fault == Fault::none
                ? runner->run(s, /*time=*/true)
                : run_faulty(opt.fault, p, in, schedule_for(s, p.d, p.causal).Bc,
                             [&](const Problem& fp, const AttnInputs& fin) {
                               return ForwardRunner(fp, fin).run(s, /*time=*/true);
                             });
        if (step_is_fp8(s)) {
          if (!fp8_oracle) fp8_oracle = std::make_unique<Fp8Oracle>(p, in, oracle.plan());
          const CheckResult c = fp8_oracle->judge(g.o, &g.lse);
          row.set_check(c);
          if (!c.pass()) row.note = c.failures();
          // The time is the attention kernel's alone; the preparation pass (Hadamard, scales, V^T)
          // is timed the same way and shown beside it, with the rate the two give together.
          if (row.note.empty())
            row.note = "judged against the plain FP8 computation (fp8_model.hpp); time: the kernel alone, without the "
                       "separate preparation pass of " + fmt("%.3f", g.prep_ms) + " ms (Hadamard, scales, V^T); with it: " +
                       fmt("%.3f", g.time_ms + g.prep_ms) + " ms, " +
                       fmt("%.4g", row.flops.value_or(0.0) / ((g.time_ms + g.prep_ms) * 1e-3) / 1e12) + " TFLOP/s";
          row.bound = Bound::none;
          row.set_time(g.time_ms);
          row.prep_ms = g.prep_ms;  // JSON "prep_ms": the bench reports the rate with it too
          if (fp8_ceiling && row.tflops) row.ceiling_share = *row.tflops / *fp8_ceiling;
        } else {
          const CheckResult c = oracle.judge(g.o, &g.lse);
          row.set_check(c);
          if (!c.pass()) row.note = c.failures();
          row.bound = Bound::compute;
          row.set_time(g.time_ms);
        }
        if (row.note.empty())
          row.note = std::to_string(g.grid) + " blocks, " + std::to_string(g.smem_bytes / 1024) + " KB smem each";
        if (opt.fault != Fault::none) row.note = fault_note(opt.fault) + "; " + row.note;
        rep.rows.push_back(row);
      }
      runner.reset();  // the forward's tensors freed before the backward's are allocated
      if (with_backward) add_backward_rows(rep, p, in, *boracle, *dev, bwd_step_text, bwd_step_list, lab);
      rep.apply_ceilings();
    }
#else
    (void)dev;
#endif
    if (!no_table) {
      add_accuracy_table(rep, p, in, std::string(dist_name(opt.dist)) + " inputs");
      add_accuracy_table(rep, p, channel_outlier_inputs(p, opt.seed), "outliers x20 in two channels of Q and K");
    }
    rep.notes.push_back("FA3 moves " + format_bytes(formula.read() + formula.write()) + " here: Q once per tile, K and V " +
                        "once per visited block of each 128-row tile (" +
                        fmt("%.2f", (formula.read() + formula.write()) / p.ideal_fwd_bytes()) +
                        "x the ideal " + format_bytes(p.ideal_fwd_bytes()) + ")");
    rep.previous = "chapter 04's FA2 uses mma.sync and cp.async in 4 identical warps; here TMA, wgmma, a producer "
                   "warpgroup and two pingponged consumers do the same math (README: the 04 -> 05 diff)";
    return rep.emit(std::cout, opt.json);
  });
}
