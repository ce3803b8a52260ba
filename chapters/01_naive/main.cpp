// ch01_naive: naive three-kernel attention, its counted HBM traffic, and (with a
// GPU) the hand-written and cuBLAS pipelines checked against the fp64 reference.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "common/check.hpp"
#include "common/cli.hpp"
#include "common/device.hpp"
#include "common/report.hpp"
#include "naive_gpu.hpp"
#include "naive_model.hpp"

#if TUTORIAL_HAVE_CUDA
#include "common/cuda/ceilings.cuh"
#endif

using namespace attn;

namespace {

/// The CPU model does the full N^2 d work on one core; above this many FLOPs the
/// report takes the model's bytes from the formula instead of running it.
constexpr double kModelFlopBudget = 2e10;

/// The key block of --inject-fault last-key-block, stale-lse and partial-tile-full (the
/// softmax kernel walks a row of S in blocks of this many scores).
constexpr int kFaultKeyTile = 64;

#if TUTORIAL_HAVE_CUDA
/// Largest N at which one fp32 score matrix for all (batch, head) still fits in `bytes`.
long largest_n_for_s(const Problem& p, double bytes) {
  return long(std::floor(std::sqrt(bytes / (4.0 * p.batch * p.heads))));
}
#endif

}  // namespace

int main(int argc, char** argv) {
  Problem defaults;
  defaults.batch = 1;
  defaults.heads = defaults.kv_heads = 4;
  defaults.nq = defaults.nk = 1024;
  defaults.d = defaults.dv = 64;
  defaults.dtype = DType::bf16;
  Cli cli("ch01_naive", "Naive attention: S = tau Q K^T, P = softmax(S), O = P V, with S and P in HBM.");
  cli.defaults(defaults).head_dims({16, 32, 64, 96, 128, 256});
  cli.faults({Fault::last_key_block, Fault::last_batch, Fault::stale_lse, Fault::partial_tile_full});

  return run_chapter(argc, argv, cli, [&](const Options& opt) {
    const Problem& p = opt.problem;
    Report rep;
    rep.chapter = "ch01_naive";
    rep.title = "naive 3-kernel attention (S and P in HBM)";
    rep.problem = p;
    rep.inputs = std::string(dist_name(opt.dist)) + ", seed " + std::to_string(opt.seed);
    const auto dev = select_device(opt.device, &rep.mode);
#if TUTORIAL_HAVE_CUDA
    if (dev) {
      rep.device = dev->name;
      require_device_memory(*dev, ch01::naive_device_bytes(p, ch01::Pipeline::handwritten),
                            "the naive pipeline (S and P)");
    }
#endif
    const bool run_model = flops_forward(p) <= kModelFlopBudget || opt.device == DeviceChoice::cpu;
    // Host memory: inputs, outputs, and the model's S and P when it runs.
    const double host_bytes = 4.0 * double(p.q_elems() + p.k_elems() + p.v_elems() + 2 * p.o_elems()) +
                              (run_model ? 8.0 * double(p.s_elems()) : 0.0);
    require_host_memory(host_bytes, "this problem");

    const AttnInputs in = make_inputs(p, opt.dist, opt.seed);
    const ForwardOracle oracle(p, in, opt.check_all ? CheckPlan::full(p) : CheckPlan::sampled(p));
    rep.check_plan = oracle.plan().describe(p);
    const ch01::NaiveTrafficFormula formula = ch01::naive_forward_traffic(p);

    // Row 1: the CPU model (counted traffic), or the formula when the model would take too long.
    {
      ResultRow row;
      row.impl = "naive model (3 kernels)";
      row.device = "cpu";
      row.flops = flops_forward(p);
      if (run_model) {
        const ch01::NaiveForwardResult m =
            run_faulty(opt.fault, p, in, kFaultKeyTile, [&](const Problem& fp, const AttnInputs& fin) {
              return ch01::naive_forward_model(fp, fin, opt.sram_bytes);
            });
        row.set_traffic(m.traffic);
        row.set_check(oracle.judge(m.o, &m.lse));
        if (m.traffic.bytes_read != formula.read() || m.traffic.bytes_written != formula.write())
          row.note = "counted traffic differs from naive_forward_traffic()";
        if (opt.fault != Fault::none) row.note = fault_note(opt.fault);
      } else {
        row.hbm_read_bytes = formula.read();
        row.hbm_write_bytes = formula.write();
        row.extra_bytes = formula.extra();
        row.note = "model not run at this size (" + fmt("%.3g", flops_forward(p)) +
                   " FLOPs on one core); bytes from naive_forward_traffic()";
      }
      rep.rows.push_back(row);
    }

#if TUTORIAL_HAVE_CUDA
    if (dev) {
      if (opt.bench) rep.ceilings = measure_ceilings(p.dtype);
      for (ch01::Pipeline which : {ch01::Pipeline::handwritten, ch01::Pipeline::cublas}) {
        const ch01::NaiveTrafficFormula f =
            which == ch01::Pipeline::handwritten ? formula : ch01::naive_cublas_traffic(p);
        ResultRow row;
        row.impl = std::string(ch01::pipeline_name(which)) + " GEMMs + softmax";
        row.device = "cuda";
        row.flops = flops_forward(p);
        row.hbm_read_bytes = f.read();
        row.hbm_write_bytes = f.write();
        row.extra_bytes = f.extra();
        row.bound = Bound::memory;
        const ch01::GpuForward g =
            run_faulty(opt.fault, p, in, kFaultKeyTile, [&](const Problem& fp, const AttnInputs& fin) {
              return ch01::naive_forward_gpu(fp, fin, which, /*time=*/true);
            });
        row.set_check(oracle.judge(g.o, &g.lse));
        if (opt.fault != Fault::none) row.note = fault_note(opt.fault);
        row.set_time(g.time_ms);
        rep.notes.push_back("  " + row.impl + ": QK^T " + fmt("%.3f", g.qk_ms) + " ms, softmax " +
                            fmt("%.3f", g.softmax_ms) + " ms, PV " + fmt("%.3f", g.pv_ms) + " ms (each timed alone)");
        rep.rows.push_back(row);
      }
      rep.apply_ceilings();
      const long n_max = largest_n_for_s(p, double(dev->total_mem));
      rep.notes.push_back("S alone (fp32, B*Hq*N^2*4 bytes) no longer fits in this GPU's " +
                          format_bytes(double(dev->total_mem)) + " at N = " + std::to_string(n_max + 1) +
                          " for B*Hq = " + std::to_string(p.batch * p.heads) + "; S and P together at N = " +
                          std::to_string(largest_n_for_s(p, double(dev->total_mem) / 2) + 1) + ".");
    }
#endif
    const double ai = flops_forward(p) / (formula.read() + formula.write());
    std::string line = "arithmetic intensity of the pipeline: " + fmt("%.1f", ai) + " FLOP/byte";
    if (rep.ceilings.gemm_tflops && rep.ceilings.read_gbps)
      line += " against this GPU's balance point of " +
              fmt("%.0f", *rep.ceilings.gemm_tflops * 1e12 / (*rep.ceilings.read_gbps * 1e9)) +
              " FLOP/byte: memory-bound";
    rep.notes.push_back(line);
    rep.notes.push_back("S and P are " + format_bytes(formula.extra()) + " of extra HBM, " +
                        fmt("%.0f", formula.extra() / p.ideal_fwd_bytes()) + "x the ideal traffic of " +
                        format_bytes(p.ideal_fwd_bytes()) + " (Q, K, V read once, O and LSE written once)");
    rep.previous = "none: chapter 01 is the baseline the later chapters compare with";
    return rep.emit(std::cout, opt.json);
  });
}
