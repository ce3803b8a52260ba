// ch02_online_softmax: the softmax of rows of scores in three sweeps, two and one, every
// variant checked against the fp64 reference; with a GPU, the four kernels of steps/
// timed against the read bandwidth measured in the same run.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>
#include <utility>

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

/// The key block of --inject-fault last-key-block and stale-lse: a row's last block of this
/// many scores (and V's rows with them) is never read.
constexpr int kFaultKeyTile = 128;

/// The scores and values a launch with fault `f` hands a variant (common/faults.hpp).
std::pair<Problem, SoftmaxInputs> faulty_softmax(Fault f, const Problem& p, const SoftmaxInputs& in) {
  Problem fp = p;
  SoftmaxInputs fin;
  if (f == Fault::last_key_block) {
    if (p.nk <= kFaultKeyTile)
      throw UsageError("last-key-block needs --nk > " + std::to_string(kFaultKeyTile));
    fp.nk = p.nk - (p.nk % kFaultKeyTile ? p.nk % kFaultKeyTile : kFaultKeyTile);
    fin.s.resize(fp.s_elems());
    for (std::size_t r = 0; r < row_count(p); ++r)
      std::copy_n(in.s.begin() + r * p.nk, fp.nk, fin.s.begin() + r * fp.nk);
    fin.v.resize(fp.v_elems());
    for (int g = 0; g < p.batch * p.kv_heads; ++g)
      std::copy_n(in.v.begin() + std::size_t(g) * p.nk * p.dv, std::size_t(fp.nk) * p.dv,
                  fin.v.begin() + std::size_t(g) * fp.nk * p.dv);
  } else if (f == Fault::last_batch) {
    if (p.batch < 2) throw UsageError("last-batch needs --batch > 1");
    fp.batch = p.batch - 1;
    fin.s.assign(in.s.begin(), in.s.begin() + fp.s_elems());
    fin.v.assign(in.v.begin(), in.v.begin() + fp.v_elems());
  } else {
    fin = in;
  }
  return {fp, fin};
}

/// Runs `run(problem, inputs)` (a variant, returning P or O and the LSE) with fault `f`: the
/// outputs of a faulty launch as p's buffers hold them (columns or batches never written
/// stay zero), or for stale-lse the right P or O with the LSE of a launch one key block short.
template <class Run>
auto run_faulty_softmax(Fault f, const Problem& p, const SoftmaxInputs& in, Run run) -> decltype(run(p, in)) {
  if (f == Fault::none) return run(p, in);
  if (f == Fault::stale_lse) {
    auto r = run(p, in);
    const auto [fp, fin] = faulty_softmax(Fault::last_key_block, p, in);
    r.lse = run(fp, fin).lse;
    return r;
  }
  const auto [fp, fin] = faulty_softmax(f, p, in);
  auto r = run(fp, fin);
  if (!r.p.empty()) {
    std::vector<float> full(p.s_elems(), 0.0f);
    for (std::size_t row = 0; row < row_count(fp); ++row)
      std::copy_n(r.p.begin() + row * fp.nk, fp.nk, full.begin() + row * p.nk);
    r.p = std::move(full);
  }
  if (!r.o.empty()) r.o.resize(p.o_elems(), 0.0f);
  r.lse.resize(p.lse_elems(), 0.0f);
  return r;
}

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
  const SoftmaxRun m = run_faulty_softmax(opt.fault, p, in, [&](const Problem& fp, const SoftmaxInputs& fin) {
    return softmax_model(fp, fin, v, opt.sram_bytes);
  });
  row.set_traffic(m.traffic);
  row.set_check(v == Variant::fused ? oracle.judge_fused(m.o, m.lse) : oracle.judge_softmax(m.p, m.lse));
  if (opt.fault != Fault::none) add_note(row, fault_note(opt.fault));
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
/// `fault`: the kernel runs as run_faulty_softmax() says, on its own upload of `in`.
ResultRow gpu_row(GpuSoftmax& gpu, Kernel k, const Problem& p, const SoftmaxOracle& oracle, const std::string& suffix,
                  Fault fault = Fault::none, const SoftmaxInputs* in = nullptr) {
  ResultRow row;
  row.impl = kernel_name(k) + suffix;
  row.device = "cuda";
  const SoftmaxTraffic f = softmax_traffic(p, kernel_variant(k));
  row.hbm_read_bytes = f.read;
  row.hbm_write_bytes = f.write;
  row.extra_bytes = 0;
  row.bound = Bound::memory;
  const GpuResult g = fault == Fault::none
                         ? gpu.run(k, /*time=*/true)
                         : run_faulty_softmax(fault, p, *in, [&](const Problem& fp, const SoftmaxInputs& fin) {
                             return GpuSoftmax(fp, fin).run(k, /*time=*/true);
                           });
  row.set_check(k == Kernel::fused ? oracle.judge_fused(g.o, g.lse) : oracle.judge_softmax(g.p, g.lse));
  if (fault != Fault::none) add_note(row, fault_note(fault));
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
  cli.faults({Fault::last_key_block, Fault::last_batch, Fault::stale_lse});
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
        for (Kernel k : all_kernels()) rep.rows.push_back(gpu_row(gpu, k, p, oracle, "", opt.fault, &in));
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
