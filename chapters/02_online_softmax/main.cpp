// ch02_online_softmax: the softmax of rows of scores in three sweeps, two and one, every
// variant checked against the fp64 reference; with a GPU, the four kernels of steps/
// timed against the read bandwidth measured in the same run.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>

#include "common/cli.hpp"
#include "common/device.hpp"
#include "common/report.hpp"
#include "scores.hpp"
#include "softmax_gpu.hpp"
#include "softmax_model.hpp"

#if TUTORIAL_HAVE_CUDA
#include "common/cuda/ceilings.cuh"
#endif

using namespace attn;
using namespace attn::ch02;

namespace {

/// --shift's value when it is not given.
constexpr int kShiftUnset = -1000000;
/// Above this many scores the report takes the models' bytes from softmax_traffic()
/// instead of running them (unless --device cpu asks for the models).
constexpr double kModelScoreBudget = double(1 << 25);
/// The --bench sweep: row lengths, and 2^28 scores (1 GiB of fp32 S) at each.
constexpr int kSweep[] = {4096, 8192, 16384, 32768};
constexpr long kSweepScores = 1L << 28;
constexpr int kSweepHeads = 16;

void add_note(ResultRow& row, const std::string& note) {
  row.note = row.note.empty() ? note : row.note + "; " + note;
}

/// The CPU model of one variant as a report row (counted traffic), or its formula.
ResultRow model_row(const Problem& p, const SoftmaxInputs& in, const SoftmaxOracle& oracle, Variant v,
                    const Options& opt, bool run) {
  ResultRow row;
  row.impl = variant_name(v);
  row.device = "cpu";
  const SoftmaxTraffic f = softmax_traffic(p, v);
  if (!run) {
    row.hbm_read_bytes = f.read;
    row.hbm_write_bytes = f.write;
    row.extra_bytes = 0;
    row.note = "model not run at this size; bytes from softmax_traffic()";
    return row;
  }
  const SoftmaxRun m = softmax_model(p, in, v, opt.sram_bytes);
  row.set_traffic(m.traffic);
  row.set_check(v == Variant::fused ? oracle.judge_fused(m.o, m.lse) : oracle.judge_softmax(m.p, m.lse));
  if (m.traffic.bytes_read != f.read || m.traffic.bytes_written != f.write)
    add_note(row, "counted traffic differs from softmax_traffic()");
  if (v == Variant::online_on_chip && !m.on_chip)
    add_note(row, "rows longer than " + std::to_string(kRowInRegisters) + " scores stream (2 sweeps over HBM)");
  // Step 0 has no shift: where sum_j e^x_ij exceeds FLT_MAX, the overflow is the lesson, not a defect.
  if (v == Variant::naive && row.pass && !*row.pass && oracle.max_lse() > kLogFltMax) {
    row.pass.reset();
    row.note = "overflows, as expected: a row's log sum e^x reaches " + fmt("%.1f", oracle.max_lse()) +
               " > ln(FLT_MAX) = 88.72, so sum e^x is inf in fp32 (the safe variants subtract m_i first)";
  }
  return row;
}

#if TUTORIAL_HAVE_CUDA
/// One kernel as a report row: checked, then timed (median of 20, L2 flushed before each).
ResultRow gpu_row(GpuSoftmax& gpu, Kernel k, const Problem& p, const SoftmaxOracle& oracle, const std::string& suffix) {
  ResultRow row;
  row.impl = kernel_name(k) + suffix;
  row.device = "cuda";
  const SoftmaxTraffic f = softmax_traffic(p, kernel_variant(k));
  row.hbm_read_bytes = f.read;
  row.hbm_write_bytes = f.write;
  row.extra_bytes = 0;
  row.bound = Bound::memory;
  const GpuResult g = gpu.run(k, /*time=*/true);
  row.set_check(k == Kernel::fused ? oracle.judge_fused(g.o, g.lse) : oracle.judge_softmax(g.p, g.lse));
  row.set_time(g.time_ms);
  if (g.streamed) add_note(row, "rows longer than " + std::to_string(kRowInRegisters) + " scores: v2 ran");
  return row;
}

/// --bench: each row length of the sweep with 2^28 scores (1 GiB of S), every kernel.
void bench_sweep(const Options& opt, double score_shift, const DeviceInfo& dev, Report& rep) {
  for (int n : kSweep) {
    Problem q = opt.problem;
    q.batch = 1;
    q.heads = q.kv_heads = kSweepHeads;
    q.nk = n;
    q.nq = int(kSweepScores / n / kSweepHeads);
    q.causal = false;
    require_device_memory(dev, softmax_device_bytes(q), "the --bench sweep");
    require_host_memory(4.0 * 3 * double(q.s_elems()), "the --bench sweep");
    const SoftmaxInputs in = make_softmax_inputs(q, opt.dist, opt.seed, score_shift);
    const SoftmaxOracle oracle(q, in, CheckPlan::sampled(q));
    GpuSoftmax gpu(q, in);
    const std::string suffix = "  N=" + std::to_string(n);
    for (Kernel k : all_kernels()) rep.rows.push_back(gpu_row(gpu, k, q, oracle, suffix));
  }
  rep.notes.push_back("bench sweep: N = 4096, 8192, 16384, 32768 scores per row, " + std::to_string(kSweepScores) +
                      " scores (1 GiB of fp32 S) each, " + std::to_string(kSweepHeads) + " heads, " +
                      dist_name(opt.dist) + " inputs, sampled rows checked in fp64");
}
#endif

}  // namespace

int main(int argc, char** argv) {
  Problem defaults;
  defaults.batch = 1;
  defaults.heads = defaults.kv_heads = 4;
  defaults.nq = 256;
  defaults.nk = 4096;
  defaults.d = defaults.dv = 64;
  defaults.scale = 1.0;
  defaults.dtype = DType::f32;
  Cli cli("ch02_online_softmax",
          "Online softmax: P = softmax(tau S) over rows of scores S [batch][heads][Nq][Nk] in 3, 2 and 1 sweeps,\n"
          "and O = P V in one sweep that never stores P. Rows: batch x heads x Nq; row length: Nk (--nk).\n"
          "tau = 1 unless --scale; V has --dv columns (--d sets both).");
  cli.defaults(defaults).head_dims({32, 64, 128}).dtypes({DType::f32});
  int shift = kShiftUnset;
  cli.add_int("--shift", &shift, "offset of --inputs mean-shifted scores [100]", -1000, 1000);

  return run_chapter(argc, argv, cli, [&](const Options& opt) {
    const Problem& p = opt.problem;
    if (shift != kShiftUnset && opt.dist != Dist::mean_shifted)
      throw UsageError("--shift applies to --inputs mean-shifted");
    const double score_shift = shift == kShiftUnset ? kDefaultShift : double(shift);

    Report rep;
    rep.chapter = "ch02_online_softmax";
    rep.title = "online softmax: 3 sweeps, 2, 1";
    rep.problem = p;
    rep.inputs = std::string(dist_name(opt.dist)) +
                 (opt.dist == Dist::mean_shifted ? " (+" + fmt("%g", score_shift) + ")" : std::string()) +
                 ", seed " + std::to_string(opt.seed);
    const auto dev = select_device(opt.device, &rep.mode);
    const double s_bytes = 4.0 * double(p.s_elems());
    const bool run_models = double(p.s_elems()) <= kModelScoreBudget || opt.device == DeviceChoice::cpu;
    // Host: S, and for the models a counted copy, P and its download; for the GPU, P downloaded.
    require_host_memory(s_bytes * (run_models ? 4.0 : 2.0) + 8.0 * double(p.v_elems() + p.o_elems()),
                        "this problem");
    if (dev) {
      rep.device = dev->name;
      require_device_memory(*dev, softmax_device_bytes(p), "S, P, V and O");
    }

    const SoftmaxInputs in = make_softmax_inputs(p, opt.dist, opt.seed, score_shift);
    const SoftmaxOracle oracle(p, in, opt.check_all ? CheckPlan::full(p) : CheckPlan::sampled(p));
    rep.check_plan = oracle.plan().describe(p) + "; P or O, and the LSE";

    for (Variant v : all_variants()) rep.rows.push_back(model_row(p, in, oracle, v, opt, run_models));

#if TUTORIAL_HAVE_CUDA
    if (dev) {
      rep.ceilings.read_gbps = measure_read_gbps();
      {
        GpuSoftmax gpu(p, in);
        for (Kernel k : all_kernels()) rep.rows.push_back(gpu_row(gpu, k, p, oracle, ""));
      }
      if (opt.bench) bench_sweep(opt, score_shift, *dev, rep);
      rep.apply_ceilings();
      rep.notes.push_back("GB/s = the kernel's own count of bytes (each sweep over HBM reads the row; P, or O, and "
                          "the LSE written once) / median time; ceil = that over the read bandwidth measured above. "
                          "A re-read served by L1/L2 still counts, so v1 and v2 can show more than 100%.");
    }
#endif
    if (opt.bench && !dev) rep.notes.push_back("--bench measures the GPU kernels: skipped (" + rep.mode + ")");
    rep.notes.push_back("rows: " + std::to_string(row_count(p)) + " of Nk = " + std::to_string(p.nk) +
                        " fp32 scores (S = " + format_bytes(s_bytes) + "); sweeps over S: naive 2, safe 3, online 2, "
                        "online on chip 2 of which 1 reads HBM, fused 1 (and P is never written)");
    const SoftmaxTraffic t3 = softmax_traffic(p, Variant::safe3), t1 = softmax_traffic(p, Variant::online_on_chip);
    rep.notes.push_back("bytes moved: safe 3-pass " + format_bytes(t3.read + t3.write) + ", online with the row on chip " +
                        format_bytes(t1.read + t1.write) + " (" + fmt("%.2f", (t3.read + t3.write) / (t1.read + t1.write)) +
                        "x less); the fused pass reads V once per block of " + std::to_string(kBr) +
                        " rows and writes O instead of P");
    rep.previous = "ch01's softmax_rows makes v1's three sweeps with 4-byte loads; v2 merges the first two (online), "
                   "v3 keeps the row in registers so HBM is read once, v4 carries O and never writes P";
    return rep.emit(std::cout, opt.json);
  });
}
