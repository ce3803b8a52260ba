// ch04_fa2: FlashAttention-2. The CPU model of Algorithms 1 and 2 with counted
// traffic, and (with a GPU) the forward steps of the main path, the final kernel (the
// lab's steps too with --lab) and the backward, checked against the fp64 reference and timed.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <vector>

#include "common/check.hpp"
#include "common/cli.hpp"
#include "common/device.hpp"
#include "common/report.hpp"
// Chapter 03's FA1, by path: the report puts its kernel (--fa1) and its traffic next to FA2's.
#include "chapters/03_fa1/fa1_blocks.hpp"
#include "chapters/03_fa1/fa1_gpu.hpp"
#include "chapters/03_fa1/fa1_model.hpp"
#include "fa2_gpu.hpp"
#include "fa2_model.hpp"

#if TUTORIAL_HAVE_CUDA
#include "common/cuda/ceilings.cuh"
#endif

using namespace attn;

namespace {

/// The CPU models do all the work on one core; above this many FLOPs they are skipped.
constexpr double kModelFlopBudget = 3e9;

}  // namespace

int main(int argc, char** argv) {
  Problem defaults;
  defaults.batch = 1;
  defaults.heads = defaults.kv_heads = 4;
  defaults.nq = defaults.nk = 1000;  // not a multiple of any tile
  defaults.d = defaults.dv = 64;
  defaults.causal = false;  // --causal turns the mask on (the CLI has no flag to turn it off)
  defaults.dtype = DType::bf16;
  Cli cli("ch04_fa2", "FlashAttention-2: Q outer, K/V inner, tensor cores; forward steps v1-v6, the final kernel and the backward.");
  cli.defaults(defaults).head_dims({64, 128, 256}).dtypes({DType::bf16, DType::f16});
  cli.faults({Fault::last_key_block, Fault::last_batch, Fault::stale_lse, Fault::wrong_kv_head});
  // The CPU model's on-chip budget: one SM of an H100/H200, 228 KB of shared memory plus the
  // 256 KB register file, which holds the final kernel's tiles at every head dim the chapter
  // accepts (d = 256: 128 KB of shared-memory tiles and 160 KB of fp32 S, O and (m, l)).
  cli.sram_default(ch04::kSmOnChipBytes);
  std::vector<int> steps;  // empty (all, or 0): the main path (and the lab with --lab)
  bool no_backward = false, forward_only_model = false, with_fa1 = false, lab = false;
  cli.add_int_list("--step", &steps,
                   "run only these forward steps, e.g. 6,final (v1-v6, final; with --lab also the lab's v7-v9; "
                   "inputs uploaded once for all; all or 0 = the main path)",
                   0, ch04::kLastLabStep, {{"final", ch04::kFinal}});
  cli.add_flag("--lab", &lab,
               "also run the lab's steps (steps/lab/, LAB.md): v7-v9; needs a build configured with -DTUTORIAL_LAB=ON");
  cli.add_flag("--no-backward", &no_backward, "skip the backward rows");
  cli.add_flag("--no-model", &forward_only_model, "skip the CPU model rows");
  cli.add_flag("--fa1", &with_fa1, "also time chapter 03's FA1 kernels (slow: one block per head)");

  return run_chapter(argc, argv, cli, [&](const Options& opt) {
    const Problem& p = opt.problem;
    if (std::find(steps.begin(), steps.end(), 0) != steps.end()) {
      if (steps.size() > 1) throw UsageError("--step: 0 (every step) cannot be listed with other steps");
      steps.clear();
    }
    if (lab && !TUTORIAL_LAB) throw UsageError("--lab: this build has no lab steps (configure with -DTUTORIAL_LAB=ON)");
    for (int k : steps)
      if (!ch04::step_built(k))
        throw UsageError("--step " + std::to_string(k) +
                         ": a lab step, and this build has no lab (configure with -DTUTORIAL_LAB=ON)");
    std::vector<int> order;  // the main path (the lab's too with --lab), or the steps listed, in path order
    for (int s : ch04::kMainSteps)
      if (steps.empty() || std::find(steps.begin(), steps.end(), s) != steps.end()) order.push_back(s);
    for (int s : ch04::kLabSteps)
      if (steps.empty() ? lab && ch04::step_built(s) : std::find(steps.begin(), steps.end(), s) != steps.end())
        order.push_back(s);
    Report rep;
    rep.chapter = "ch04_fa2";
    rep.title = "FlashAttention-2 (Q outer, K/V inner, tensor cores)";
    rep.problem = p;
    rep.inputs = std::string(dist_name(opt.dist)) + ", seed " + std::to_string(opt.seed);
    const auto dev = select_device(opt.device, &rep.mode);
#if TUTORIAL_HAVE_CUDA
    if (dev) require_device_memory(*dev, ch04::fa2_device_bytes(p, !no_backward), "this problem");
#endif
    const bool with_backward = !no_backward;
    const bool run_model = !forward_only_model && (flops_forward(p) <= kModelFlopBudget || opt.device == DeviceChoice::cpu);
    require_host_memory(4.0 * double(2 * p.q_elems() + 2 * p.k_elems() + 2 * p.v_elems() + 3 * p.o_elems()),
                        "this problem");

    const AttnInputs in = make_inputs(p, opt.dist, opt.seed, with_backward);
    const ch04::Fa2Tiles final_tiles = ch04::step_tiles(ch04::kFinal, p.d);  // the model runs the final kernel's tiles
    const ForwardOracle oracle(p, in, opt.check_all ? CheckPlan::full(p) : CheckPlan::sampled(p));
    rep.check_plan = oracle.plan().describe(p);

    if (run_model) {
      ResultRow row;
      row.impl = "FA2 model, forward (Alg. 1)";
      row.device = "cpu";
      row.flops = flops_forward(p);
      const ch04::Fa2ForwardResult m =
          run_faulty(opt.fault, p, in, final_tiles.Bc, [&](const Problem& fp, const AttnInputs& fin) {
            return ch04::fa2_forward_model(fp, fin, opt.sram_bytes, final_tiles);
          });
      row.set_traffic(m.traffic);
      row.set_check(oracle.judge(m.o, &m.lse));
      if (opt.fault != Fault::none) row.note = fault_note(opt.fault);
      rep.rows.push_back(row);
      rep.notes.push_back("model: Q read " + fmt("%.2f", m.q_read / (dtype_bytes(p.dtype) * double(p.q_elems()))) +
                          "x, K/V read " + fmt("%.2f", m.kv_read / (dtype_bytes(p.dtype) * double(p.k_elems() + p.v_elems()))) +
                          "x, O and LSE written once, no statistics in HBM (extra memory 0)");
    }
    std::optional<BackwardOracle> boracle;
    if (with_backward && (run_model || dev))
      boracle.emplace(p, in, opt.check_all ? BackwardPlan::full(p) : BackwardPlan::sampled(p));
    if (run_model && with_backward) {
      ResultRow row;
      row.impl = "FA2 model, backward (Alg. 2)";
      row.device = "cpu";
      row.flops = flops_backward(p);
      const ch04::Fa2BackwardResult m = ch04::fa2_backward_model(p, in, opt.sram_bytes);
      row.set_traffic(m.traffic);
      row.set_check(boracle->judge(m.dq, m.dk, m.dv));
      rep.rows.push_back(row);
      rep.notes.push_back("model backward: " + format_bytes(m.dq_accum_bytes) +
                          " of the traffic are dQ's fp32 read-modify-writes (the atomics)");
    }

#if TUTORIAL_HAVE_CUDA
    if (dev) {
      if (opt.bench) rep.ceilings = measure_ceilings(p.dtype);
      std::unique_ptr<ch04::ForwardRunner> runner;  // Q, K, V uploaded once for every step's row
      for (int s : order) {
        ResultRow row;
        row.impl = ch04::step_name(s);
        row.device = "cuda";
        row.flops = flops_forward(p);
        row.bound = Bound::compute;
        const std::string why = ch04::step_unsupported(s, p);
        if (!why.empty()) {
          row.note = "not built for " + why;
          rep.rows.push_back(row);
          continue;
        }
        const ch04::Fa2Tiles tiles = ch04::step_tiles(s, p.d);
        row.hbm_read_bytes = ch04::fa2_forward_bytes(p, tiles) - double(p.o_elems()) * dtype_bytes(p.dtype) -
                             4.0 * double(p.lse_elems());
        row.hbm_write_bytes = double(p.o_elems()) * dtype_bytes(p.dtype) + 4.0 * double(p.lse_elems());
        row.extra_bytes = 0;
        if (!runner) runner = std::make_unique<ch04::ForwardRunner>(p, in);
        // An injected fault launches the step on the faulty problem, with its own upload.
        const ch04::GpuForward g =
            opt.fault == Fault::none
                ? runner->run(s, /*time=*/true)
                : run_faulty(opt.fault, p, in, tiles.Bc, [&](const Problem& fp, const AttnInputs& fin) {
                    return ch04::ForwardRunner(fp, fin).run(s, /*time=*/true);
                  });
        row.set_check(oracle.judge(g.o, &g.lse));
        if (opt.fault != Fault::none) row.note = fault_note(opt.fault);
        row.set_time(g.time_ms);
        rep.rows.push_back(row);
      }
      runner.reset();  // the forward's tensors freed before the other rows allocate theirs
      if (with_fa1 && ch03::kernel_unsupported(p).empty()) {
        ResultRow row;
        row.impl = "FA1 kernel (chapter 03)";
        row.device = "cuda";
        row.flops = flops_forward(p);
        row.bound = Bound::compute;
        const ch03::Fa1Traffic t = ch03::fa1_forward_traffic(p, ch03::kernel_forward_blocks(p.d));
        row.hbm_read_bytes = t.read();
        row.hbm_write_bytes = t.write();
        row.extra_bytes = t.extra;
        const ch03::GpuForward g = ch03::fa1_forward_gpu(p, in, /*time=*/true);
        row.set_check(oracle.judge(g.o, &g.lse));
        row.set_time(g.time_ms);
        rep.rows.insert(rep.rows.begin() + (run_model ? (with_backward ? 2 : 1) : 0), row);
      }
      if (with_backward && ch04::backward_unsupported(p).empty()) {
        for (bool det : {false, true}) {
          ResultRow row;
          row.impl = det ? "backward, deterministic dQ" : "backward, dQ atomics";
          row.device = "cuda";
          row.flops = flops_backward(p);
          row.bound = Bound::compute;
          const ch04::GpuBackward g = ch04::fa2_backward_gpu(p, in, det, /*time=*/true);
          row.set_check(boracle->judge(g.dq, g.dk, g.dv));
          row.set_time(g.time_ms);
          rep.rows.push_back(row);
        }
      } else if (with_backward) {
        ResultRow row;
        row.impl = "backward";
        row.device = "cuda";
        row.note = "not built for " + ch04::backward_unsupported(p);
        rep.rows.push_back(row);
      }
      rep.apply_ceilings();
    }
#endif
    if (boracle) rep.check_plan += "; backward: " + boracle->plan().describe(p);
    {
      // Chapter 03's FA1 at the same on-chip budget, from its traffic formula.
      const ch03::Fa1Traffic fa1 = ch03::fa1_forward_traffic(p, ch03::forward_blocks(p, opt.sram_bytes));
      const double fa2 = ch04::fa2_forward_bytes(p, final_tiles);
      rep.previous = "FA1 (chapter 03) moves " + format_bytes(fa1.total()) + " at this M (Q and (m, l, O) " +
                     "re-read on every K/V step), FA2 " + format_bytes(fa2) +
                     (fa1.total() >= fa2 ? ": " + fmt("%.1f", fa1.total() / fa2) + "x less"
                                         : ": " + fmt("%.1f", fa2 / fa1.total()) +
                                               "x more (FA1's blocks at this M cover most of the sequence, while "
                                               "FA2 re-reads K and V once per " + std::to_string(final_tiles.Br) +
                                               "-row query block)") +
                     ", and no statistics in HBM";
    }
    return rep.emit(std::cout, opt.json);
  });
}
