// ch06_variants gqa / mla: the cache arithmetic of real models, GQA/MQA with packed
// query groups, and DeepSeek's MLA in its decompressed (prefill) and absorbed (decode)
// forms. CPU models with counted traffic everywhere; the kernels where a GPU is present.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <sstream>
#include <tuple>
#include <vector>

#include "common/check.hpp"
#include "common/cli.hpp"
#include "common/device.hpp"
#include "common/report.hpp"
#include "gqa_mla/cache_table.hpp"
#include "gqa_mla/gqa_mla_gpu.hpp"
#include "gqa_mla/grouped_model.hpp"
#include "gqa_mla/mla_model.hpp"
#include "parts.hpp"

// The kernels of this part (gqa_mla_gpu.hpp) are linked in CUDA builds once they exist.
#define CH06_GQA_MLA_KERNELS 1
#if TUTORIAL_HAVE_CUDA && CH06_GQA_MLA_KERNELS
#include "common/cuda/ceilings.cuh"
#endif

namespace attn::ch06 {
namespace {

/// Above this many FLOPs the CPU models are not run (one core's worth of seconds).
constexpr double kModelFlopBudget = 3e9;

void push_lines(Report& rep, const std::string& text) {
  std::istringstream s(text);
  for (std::string line; std::getline(s, line);) rep.notes.push_back(line);
}

#if TUTORIAL_HAVE_CUDA && CH06_GQA_MLA_KERNELS
/// One GPU row of the packed forward (pack) or of the same kernel unpacked: its counted
/// bytes, its check against the oracle, and its time. `note_ok` describes the launch.
ResultRow packed_row(const Problem& p, const ForwardOracle& oracle, const std::string& impl, bool pack,
                     const GpuResult& g, const std::string& note_ok, bool timed) {
  ResultRow row;
  row.impl = impl;
  row.device = "cuda";
  row.flops = flops_forward(p);
  GroupedOptions go;
  go.pack = pack;
  row.hbm_read_bytes = grouped_kv_bytes(p, go) + double(p.q_elems()) * dtype_bytes(p.dtype);
  row.hbm_write_bytes = double(p.o_elems()) * dtype_bytes(p.dtype) + 4.0 * p.lse_elems();
  const CheckResult c = oracle.judge(g.o, &g.lse);
  row.set_check(c);
  row.note = c.pass() ? note_ok : c.failures();
  row.bound = p.nq * p.group() <= 128 ? Bound::memory : Bound::compute;
  if (timed) row.set_time(g.time_ms);
  return row;
}

std::string shape_of(const Problem& p) {
  return "B=" + std::to_string(p.batch) + " Hq=" + std::to_string(p.heads) + " Hkv=" + std::to_string(p.kv_heads) + " G=" + std::to_string(p.group()) +
         " Nq=" + std::to_string(p.nq) + " Nk=" + std::to_string(p.nk);
}

/// The packed-vs-unpacked sweep of LAB.md (GPU): G in {1, 2, 4, 8} over 8 KV heads and
/// MQA (32 query heads, 1 KV head), Nq in {1, 4, 16, 64, 128, 4096}, Nk = 8192, d = 128.
void gqa_sweep(Report& rep) {
  rep.notes.push_back("sweep (Nk=8192, d=128, bf16, not causal, device-generated inputs; medians of 20, L2 flushed):");
  rep.notes.push_back("  shape                                   packed ms  unpacked ms  speed-up   K/V bytes packed / unpacked");
  struct Hs { int hq, hkv; };
  const Hs heads[] = {{8, 8}, {16, 8}, {32, 8}, {64, 8}, {32, 1}};
  struct Bn { int b, nq; };
  const Bn sizes[] = {{1, 1}, {16, 1}, {16, 4}, {16, 16}, {16, 64}, {16, 128}, {1, 4096}};
  for (const Hs& h : heads)
    for (const Bn& bn : sizes) {
      Problem p;
      p.batch = bn.b, p.heads = h.hq, p.kv_heads = h.hkv, p.nq = bn.nq, p.nk = 8192, p.d = p.dv = 128;
      const GpuResult a = packed_forward_bench(p, true), b = packed_forward_bench(p, false);
      GroupedOptions po, uo;
      uo.pack = false;
      const double kp = grouped_kv_bytes(p, po), ku = grouped_kv_bytes(p, uo);
      char line[256];
      std::snprintf(line, sizeof line, "  sweep %-33s  %9.4f  %11.4f  %8.2fx   %s / %s", shape_of(p).c_str(), a.time_ms,
                    b.time_ms, b.time_ms / a.time_ms, format_bytes(kp).c_str(), format_bytes(ku).c_str());
      rep.notes.push_back(line);
      // The chapter 04-derived kernel (ampere_packed.cu, no split-K) on the same shape.
      const GpuResult c = packed_forward_sm80_bench(p, true), d = packed_forward_sm80_bench(p, false);
      std::snprintf(line, sizeof line, "  sweep80 %-33s  %9.4f  %11.4f  %8.2fx", shape_of(p).c_str(), c.time_ms, d.time_ms,
                    d.time_ms / c.time_ms);
      rep.notes.push_back(line);
    }
}
#endif

/// The key tile of --inject-fault last-key-block and stale-lse (the packed kernels' K/V tile).
constexpr int kFaultKeyTile = 128;

int run_gqa(const Options& opt, bool sweep, bool no_table, bool no_time) {
  const Problem& p = opt.problem;
  Report rep;
  rep.chapter = "ch06_variants gqa";
  rep.title = "GQA/MQA: the G query heads of a KV head packed on the M dimension of one tile";
  rep.problem = p;
  rep.inputs = std::string(dist_name(opt.dist)) + ", seed " + std::to_string(opt.seed);
  const auto dev = select_device(opt.device, &rep.mode);
  require_host_memory(4.0 * double(p.q_elems() + p.k_elems() + p.v_elems() + 3 * p.o_elems()), "this problem");
  const AttnInputs in = make_inputs(p, opt.dist, opt.seed);
  const ForwardOracle oracle(p, in, opt.check_all ? CheckPlan::full(p) : CheckPlan::sampled(p));
  rep.check_plan = oracle.plan().describe(p);

  const bool run_model = flops_forward(p) * std::min(p.group(), 8) <= kModelFlopBudget || opt.check_all;
  for (bool pack : {false, true}) {
    ResultRow row;
    GroupedOptions go;
    go.pack = pack;
    go.sram_bytes = opt.sram_bytes;
    row.impl = pack ? "model packed (Mt=128)" : "model unpacked (Mt=128)";
    row.device = "cpu";
    row.flops = flops_forward(p);
    if (run_model) {
      const GroupedResult m = run_faulty(opt.fault, p, in, kFaultKeyTile, [&](const Problem& fp, const AttnInputs& fin) {
        return grouped_forward_model(fp, fin, go);
      });
      row.set_traffic(m.traffic);
      row.set_check(oracle.judge(m.o, &m.lse));
      row.note = std::to_string(m.tiles) + " tiles; K/V read " + format_bytes(m.kv_bytes) + " (" +
                 fmt("%.2f", m.kv_bytes / (double(p.k_elems() + p.v_elems()) * dtype_bytes(p.dtype))) +
                 "x each K/V element once)";
      if (opt.fault != Fault::none) row.note = fault_note(opt.fault) + "; " + row.note;
    } else {
      row.note = "model not run at this size; K/V bytes by formula: " + format_bytes(grouped_kv_bytes(p, go));
    }
    rep.rows.push_back(row);
  }
  {
    GroupedOptions po, uo;
    uo.pack = false;
    const double kp = grouped_kv_bytes(p, po), ku = grouped_kv_bytes(p, uo);
    rep.notes.push_back("K/V bytes per forward: unpacked " + format_bytes(ku) + ", packed " + format_bytes(kp) + " (" +
                        fmt("%.2f", ku / kp) + "x fewer; at most G = " + std::to_string(p.group()) +
                        ", reached when G Nq <= 128)");
  }

#if TUTORIAL_HAVE_CUDA && CH06_GQA_MLA_KERNELS
  std::string why;
  // The chapter 04-derived packed forward (ampere_packed.cu): any CUDA GPU of sm_80 on.
  if (dev && packed_sm80_supports(p, &why)) {
    rep.device = dev->name;
    for (bool pack : {true, false}) {
      const GpuResult g = run_faulty(opt.fault, p, in, kFaultKeyTile, [&](const Problem& fp, const AttnInputs& fin) {
        return packed_forward_sm80_gpu(fp, fin, pack, !no_time);
      });
      rep.rows.push_back(packed_row(p, oracle, pack ? "packed (sm_80, ch04 v9)" : "unpacked (sm_80, ch04 v9)", pack, g,
                                    std::to_string(g.grid) + " blocks of 128 packed rows", !no_time));
      if (opt.fault != Fault::none) rep.rows.back().note = fault_note(opt.fault) + "; " + rep.rows.back().note;
    }
  } else if (dev) {
    rep.notes.push_back("sm_80 rows not run: " + why);
  }
  if (dev && !hopper_ready(&why)) {
    rep.notes.push_back(why);
  } else if (dev && !packed_fwd_supports(p, &why)) {
    rep.notes.push_back("GPU rows not run: " + why);
  } else if (dev) {
    rep.device = dev->name;
    require_device_memory(*dev, 2.0 * double(p.q_elems() + p.k_elems() + p.v_elems() + p.o_elems()) +
                                    4.0 * p.lse_elems(), "the problem's tensors");
    if (opt.bench) rep.ceilings = measure_ceilings(p.dtype);
    for (bool pack : {true, false}) {
      const GpuResult g = run_faulty(opt.fault, p, in, kFaultKeyTile, [&](const Problem& fp, const AttnInputs& fin) {
        return packed_forward_gpu(fp, fin, pack, !no_time);
      });
      // The packed form is the chapter's final GQA forward (packed_fwd.cu); unpacked, the same kernel.
      rep.rows.push_back(packed_row(p, oracle, pack ? "final packed (sm_90a)" : "unpacked (sm_90a)", pack, g,
                                    std::to_string(g.grid) + " blocks, " + std::to_string(g.smem_bytes / 1024) + " KB smem each",
                                    !no_time));
      if (opt.fault != Fault::none) rep.rows.back().note = fault_note(opt.fault) + "; " + rep.rows.back().note;
    }
    rep.apply_ceilings();
    if (sweep) gqa_sweep(rep);
  }
#else
  (void)dev;
  (void)sweep;
  (void)no_time;
#endif
  if (!no_table) push_lines(rep, cache_table_text());
  rep.previous = "chapter 05's v6 maps each query head to its KV head but streams K/V once per query head; "
                 "packed_fwd.cu is that file with the group on the tile's rows (diff it)";
  return rep.emit(std::cout, opt.json);
}

// ----------------------------------------------------------------------------- mla

#if TUTORIAL_HAVE_CUDA && CH06_GQA_MLA_KERNELS
/// The two regimes of the MLA decode (README; measured in LAB.md), on the GPU (absorbed decode kernel, Nq = 1). With `lab`, every
/// case also runs the measured alternatives of LAB.md in the same process (the other 16-row tiles,
/// the other combines, the other 64-row forms, other split counts).
void mla_sweep(Report& rep, const Ceilings& ceil, int tile64, int only_heads, int only_batch,
               const std::vector<int>& more_splits, bool lab) {
  rep.notes.push_back("sweep: absorbed decode, Nq = 1 (time of decode + combine; cache GB/s = latent bytes read / time)");
  rep.notes.push_back("  H    B     Nk     splits  attn ms   total ms   cache GB/s  of read ceil   TFLOP/s  of GEMM ceil");
  struct Case { int h, b, nk; };
  const Case cases[] = {{16, 1, 4096},   {16, 8, 4096},  {16, 64, 4096},  {16, 1, 65536},
                        {16, 8, 65536},  {16, 32, 32768}, {16, 64, 16384}, {16, 64, 65536},
                        {128, 1, 4096},  {128, 8, 4096}, {128, 32, 4096}, {128, 8, 16384}, {128, 64, 8192}};
  for (const Case& c : cases) {
    if (only_heads > 0 && c.h != only_heads) continue;
    if (only_batch > 0 && c.b != only_batch) continue;
    MlaShape s;
    s.batch = c.b, s.heads = c.h, s.nq = 1, s.nk = c.nk;
    const MlaGpuResult g = mla_absorb_bench(s, 0, 0, tile64);
    const MlaCost cost = mla_cost_absorb(s, g.head_tile);
    const double gbps = cost.cache_bytes / (g.attn_ms * 1e-3) / 1e9;
    const double attn_flops = 2.0 * s.batch * s.heads * s.nq * double(s.nk) * (kDLatentKey + kDC);
    const double tf = attn_flops / (g.attn_ms * 1e-3) / 1e12;
    char line[256];
    std::snprintf(line, sizeof line, "  sweep %3d %4d %6d  %6d  %8.4f  %9.4f  %10.1f  %11.1f%%  %8.1f  %11.1f%%", c.h,
                  c.b, c.nk, g.splits, g.attn_ms, g.total_ms, gbps, 100 * gbps / ceil.read_gbps.value_or(1), tf,
                  100 * tf / ceil.gemm_tflops.value_or(1));
    rep.notes.push_back(line);
    // The 16-row tile's other shapes on the same case (mla_decode.cuh), for the choice of the default.
    if (lab && c.h * s.nq <= 16)
      for (int v = 1; v < 3; ++v) {
        const MlaGpuResult gv = mla_absorb_bench(s, 0, v);
        const double gb = cost.cache_bytes / (gv.attn_ms * 1e-3) / 1e9;
        std::snprintf(line, sizeof line, "  tile16 %-8s %3d %4d %6d  %6d  %8.4f  %10.1f  %11.1f%%", small_variant_label(v),
                      c.h, c.b, c.nk, gv.splits, gv.attn_ms, gb, 100 * gb / ceil.read_gbps.value_or(1));
        rep.notes.push_back(line);
      }
    // The combine launched after the decode, not as a programmatic dependent launch (same process).
    if (lab) {
      const MlaGpuResult gn = mla_absorb_bench(s, 0, 0, tile64, kCombineSeparate, 0, false);
      const double gb = cost.cache_bytes / (gn.attn_ms * 1e-3) / 1e9;
      std::snprintf(line, sizeof line, "  nopdl %3d %4d %6d  %6d  %8.4f  %10.1f  %11.1f%%", c.h, c.b, c.nk, gn.splits,
                    gn.attn_ms, gb, 100 * gb / ceil.read_gbps.value_or(1));
      rep.notes.push_back(line);
    }
    // The combine in 4 parts where the grid gave it more (the form before 16 parts; same process).
    if (lab && g.what.find("combine in 4 parts") == std::string::npos && g.what.find("fused") == std::string::npos &&
        g.what.find("cluster") == std::string::npos) {
      const MlaGpuResult g4 = mla_absorb_bench(s, 0, 0, tile64, kCombineSeparate, 4);
      const double gb = cost.cache_bytes / (g4.attn_ms * 1e-3) / 1e9;
      std::snprintf(line, sizeof line, "  combine4 %3d %4d %6d  %6d  %8.4f  %10.1f  %11.1f%%", c.h, c.b, c.nk, g4.splits,
                    g4.attn_ms, gb, 100 * gb / ceil.read_gbps.value_or(1));
      rep.notes.push_back(line);
    }
    // The combine in its general form where it took the few-ranges one (the same process).
    if (lab && g.what.find("one trip") != std::string::npos) {
      const MlaGpuResult gg = mla_absorb_bench(s, 0, 0, tile64, kCombineGeneral);
      const double gb = cost.cache_bytes / (gg.attn_ms * 1e-3) / 1e9;
      std::snprintf(line, sizeof line, "  general %3d %4d %6d  %6d  %8.4f  %10.1f  %11.1f%%", c.h, c.b, c.nk, gg.splits,
                    gg.attn_ms, gb, 100 * gb / ceil.read_gbps.value_or(1));
      rep.notes.push_back(line);
    }
    // The default merged its 2 ranges in a cluster: the separate combine on the same case (same process).
    if (lab && g.what.find("cluster") != std::string::npos) {
      const MlaGpuResult gc = mla_absorb_bench(s, 0, 0, tile64, kCombineSeparate);
      const double gb = cost.cache_bytes / (gc.attn_ms * 1e-3) / 1e9;
      std::snprintf(line, sizeof line, "  separate %3d %4d %6d  %6d  %8.4f  %10.1f  %11.1f%%", c.h, c.b, c.nk, gc.splits,
                    gc.attn_ms, gb, 100 * gb / ceil.read_gbps.value_or(1));
      rep.notes.push_back(line);
    }
    // The combine fused into the decode kernel where it can be (the same process).
    if (lab && c.h * s.nq <= 16 && g.splits <= 4) {
      const MlaGpuResult gs = mla_absorb_bench(s, 0, 0, tile64, kCombineFused);
      const double gb = cost.cache_bytes / (gs.attn_ms * 1e-3) / 1e9;
      std::snprintf(line, sizeof line, "  combine fused %3d %4d %6d  %6d  %8.4f  %10.1f  %11.1f%%", c.h, c.b, c.nk,
                    gs.splits, gs.attn_ms, gb, 100 * gb / ceil.read_gbps.value_or(1));
      rep.notes.push_back(line);
    }
    // The 64-row tile's other kernels on the same case (wgmma against mma.sync; with lab also the
    // other releases of P; one process).
    if (c.h * s.nq > 16)
      for (int other : {kTile64Mma, kTile64Wgmma, kTile64WgmmaSync, kTile64WgmmaBlock, kTile64WgmmaLockstep,
                         kTile64WgmmaHalves, kTile64WgmmaArrive}) {
        if (other == tile64 || (!lab && other != kTile64Mma && other != kTile64Wgmma)) continue;
        const MlaGpuResult gv = mla_absorb_bench(s, 0, 0, other);
        const double tv = attn_flops / (gv.attn_ms * 1e-3) / 1e12;
        const char* name = gv.what.find("bar.arrive") != std::string::npos ? "wgmma-arrive"
                           : gv.what.find("halves") != std::string::npos     ? "wgmma-halves"
                           : gv.what.find("lockstep") != std::string::npos   ? "wgmma-lockstep"
                           : gv.what.find("barrier 0") != std::string::npos  ? "wgmma-block"
                           : gv.what.find("bar.sync") != std::string::npos ? "wgmma-sync"
                           : gv.what.find("wgmma") != std::string::npos    ? "wgmma"
                                                                           : "mma";
        std::snprintf(line, sizeof line, "  tile64 %-12s %3d %4d %6d  %6d  %8.4f  %8.1f TFLOP/s  %6.1f%% of GEMM ceil", name,
                      c.h, c.b, c.nk, gv.splits, gv.attn_ms, tv, 100 * tv / ceil.gemm_tflops.value_or(1));
        rep.notes.push_back(line);
      }
    // Other split counts on the same case (--sweep-splits), for the choice of mla_pick_splits().
    for (int k : more_splits) {
      const MlaGpuResult gk = mla_absorb_bench(s, k, 0, tile64);
      if (gk.splits == g.splits && k != g.splits) continue;  // rounded to the same ranges
      const double gb = cost.cache_bytes / (gk.attn_ms * 1e-3) / 1e9, tk = attn_flops / (gk.attn_ms * 1e-3) / 1e12;
      std::snprintf(line, sizeof line, "  splits %3d %4d %6d  %6d  %8.4f  %10.1f  %11.1f%%  %8.1f  %11.1f%%", c.h, c.b, c.nk,
                    gk.splits, gk.attn_ms, gb, 100 * gb / ceil.read_gbps.value_or(1), tk,
                    100 * tk / ceil.gemm_tflops.value_or(1));
      rep.notes.push_back(line);
    }
  }
}
#endif

/// `s` and `in` with keys [first, first + count) of every sequence's latent cache (the
/// RoPE parts are stored rotated, so the keys keep their positions; the causal mask is
/// bottom-right, so every query still sees the keys it saw among them).
std::pair<MlaShape, MlaInputs> mla_keys(const MlaShape& s, const MlaInputs& in, int first, int count) {
  MlaShape fs = s;
  MlaInputs fin = in;
  fs.nk = count;
  auto keys = [&](const std::vector<float>& x, int width) {
    std::vector<float> y(std::size_t(s.batch) * count * width);
    for (int b = 0; b < s.batch; ++b)
      std::copy_n(x.begin() + (std::size_t(b) * s.nk + first) * width, std::size_t(count) * width,
                  y.begin() + std::size_t(b) * count * width);
    return y;
  };
  fin.c = keys(in.c, kDC);
  fin.k_rope = keys(in.k_rope, kDRope);
  return {fs, fin};
}

/// --inject-fault in MLA: the shape and inputs a faulty launch hands the model and the kernels
/// (last-key-block: the last 64-key tile of the latent cache never read; last-batch: the
/// last sequence left out). faulty_mla_output() widens its O back to `s` (zeros).
/// split-dropped goes into the absorbed decode alone (split_dropped_mla()).
std::pair<MlaShape, MlaInputs> faulty_mla(Fault f, const MlaShape& s, const MlaInputs& in) {
  if (f == Fault::last_key_block) {
    if (s.nk <= 64) throw UsageError("last-key-block needs --nk > 64");
    const int nk = s.nk - (s.nk % 64 ? s.nk % 64 : 64);
    if (nk < s.nq) throw UsageError("last-key-block needs --nk >= --n + 64");
    return mla_keys(s, in, 0, nk);
  }
  MlaShape fs = s;
  MlaInputs fin = in;
  if (f == Fault::last_batch) {
    if (s.batch < 2) throw UsageError("last-batch needs --batch > 1");
    fs.batch = s.batch - 1;
    const double keep = double(fs.batch) / s.batch;
    for (auto* x : {&fin.c, &fin.k_rope, &fin.q_nope, &fin.q_rope}) x->resize(std::size_t(double(x->size()) * keep));
  }
  return {fs, fin};
}

/// split-dropped in an absorbed decode of `ranges` key ranges of `keys_per_range` keys each:
/// the merge leaves out range 0's partial state, and what it returns is the decode of the
/// keys past range 0 in the remaining ranges, the launch this hands the model or the kernels.
/// False (nothing changed) when the decode has one range: the fault does not go into it.
bool split_dropped_mla(const MlaShape& s, const MlaInputs& in, int ranges, int keys_per_range, MlaShape* fs,
                       MlaInputs* fin) {
  if (ranges < 2 || keys_per_range >= s.nk) return false;
  if (s.nk - keys_per_range < s.nq)
    throw UsageError("split-dropped needs --nk >= --n + the " + std::to_string(keys_per_range) +
                     " keys of one split");
  std::tie(*fs, *fin) = mla_keys(s, in, keys_per_range, s.nk - keys_per_range);
  return true;
}

std::vector<float> faulty_mla_output(std::vector<float> o, const MlaShape& s) {
  o.resize(s.output().o_elems(), 0.0f);
  return o;
}

int run_mla(const Options& opt, const std::string& form, long pos0, int splits, bool sweep, bool no_time,
            int tile16, int tile64, int sweep_heads, int sweep_batch, int combine, const std::vector<int>& sweep_splits,
            int combine_parts, bool pdl, bool lab) {
  const Problem& cp = opt.problem;
  if (cp.d != kDQK || cp.dv != kDV)
    throw UsageError("mla uses DeepSeek-V3's head dims (d_qk = 192, d_v = 128, d_c = 512, d_rope = 64); --d/--dv "
                     "cannot change them");
  if (cp.kv_heads != cp.heads)
    throw UsageError("mla has one latent KV head shared by all query heads; --kv-heads does not apply");
  MlaShape s;
  s.batch = cp.batch, s.heads = cp.heads, s.nq = cp.nq, s.nk = cp.nk, s.pos0 = pos0, s.causal = true;
  validate(s);
  const bool do_abs = form != "decompress", do_dec = form != "absorb";
  Report rep;
  rep.chapter = "ch06_variants mla";
  rep.title = "MLA (DeepSeek-V3 dims): decompressed prefill form and absorbed decode form";
  rep.problem = s.output();
  rep.inputs = std::string(dist_name(opt.dist)) + ", seed " + std::to_string(opt.seed) + ", key 0 at position " +
               std::to_string(pos0) + " (RoPE)";
  const auto dev = select_device(opt.device, &rep.mode);
  require_host_memory(4.0 * (double(s.batch) * s.nk * (kDLatentKey + kDC) * (do_dec ? 1 + s.heads * 0.6 : 1) +
                             double(s.batch) * s.heads * s.nq * 2048),
                      "this problem");
  const MlaInputs in = make_mla_inputs(s, opt.dist, opt.seed);
  const Problem out = s.output();
  const CheckPlan plan = mla_check_plan(s, opt.check_all);
  rep.check_plan = mla_check_describe(s, plan);
  const CheckedRows<double> ref = mla_reference(s, in, plan);
  const ErrorStats naive = mla_naive_error(s, in, plan, ref);
  auto judge = [&](const std::vector<float>& o) {
    CheckResult c;
    c.tensors.push_back(judge_tensor("O", o, out.o_elems(), ref, naive, DType::bf16, false));
    return c;
  };
  const MlaCost ca = mla_cost_absorb(s, 64), cd = mla_cost_decompress(s);
  // --inject-fault: every model and kernel below runs on what a faulty launch hands it.
  const auto [fs, fin] = faulty_mla(opt.fault, s, in);

  if (do_dec) {
    ResultRow row;
    row.impl = "model decompress";
    row.device = "cpu";
    row.flops = cd.flops;
    row.hbm_read_bytes = cd.bytes;  // both kernels; written bytes folded in (see note)
    if (cd.flops <= kModelFlopBudget || opt.check_all) {
      const Problem pd = fs.decompressed();
      const AttnInputs dec = decompress(fs, fin);
      GroupedOptions go;
      go.pack = false;
      go.sram_bytes = std::max<std::size_t>(opt.sram_bytes, 227 * 1024);
      const GroupedResult m = grouped_forward_model(pd, dec, go);
      row.set_check(judge(faulty_mla_output(m.o, s)));
      row.note = "K = [c W_UK ; k_rope] (192 per head) and V = c W_UV materialised: " +
                 format_bytes(double(pd.k_elems() + pd.v_elems()) * 2) + " written, then attention reads " +
                 format_bytes(m.kv_bytes) + " of them";
    } else {
      row.note = "model not run at this size (over " + fmt("%.0e", kModelFlopBudget) + " FLOPs; --check-all runs it)";
    }
    if (opt.fault != Fault::none && opt.fault != Fault::split_dropped && row.pass)
      row.note = fault_note(opt.fault) + "; " + row.note;
    rep.rows.push_back(row);
  }
  if (do_abs) {
    ResultRow row;
    row.impl = "model absorb";
    row.device = "cpu";
    row.flops = ca.flops;
    row.hbm_read_bytes = ca.bytes;
    bool faulted = opt.fault != Fault::none && opt.fault != Fault::split_dropped;
    if (ca.flops <= kModelFlopBudget || opt.check_all) {
      GroupedOptions go;
      go.pack = true;  // the H heads share the one latent head: an MQA, packed
      go.m_tile = 64;
      go.n_tile = 64;
      go.splits = splits > 0 ? splits : std::min(4, (s.nk + 63) / 64);
      go.v_in_k = true;
      go.sram_bytes = std::max<std::size_t>(opt.sram_bytes, 227 * 1024);
      MlaShape ms = fs;
      MlaInputs ms_in = fin;
      std::string dropped;
      // The model's ranges: whole 64-key blocks, ceil(blocks / splits) of them a range (grouped_model.cpp).
      const int per_range = ((s.nk + 63) / 64 + go.splits - 1) / go.splits * 64;
      if (opt.fault == Fault::split_dropped && split_dropped_mla(s, in, go.splits, per_range, &ms, &ms_in)) {
        faulted = true;
        dropped = " (split 0, keys 0-" + std::to_string(per_range - 1) + ", left out of the merge)";
        go.splits -= 1;
      }
      const GroupedResult m = grouped_forward_model(ms.absorbed(), absorb(ms, ms_in), go);
      row.set_check(judge(faulty_mla_output(project_out(ms, m.o, ms_in), s)));
      row.note = "q_c = q_nope W_UK^T; " + std::to_string(go.splits) + " key splits merged with ⊕" + dropped +
                 "; latent read " + format_bytes(m.kv_bytes) + " (" +
                 fmt("%.2f", m.kv_bytes / (double(s.batch) * s.nk * 1152)) + "x the cache once); o = o_c W_UV";
    } else {
      row.note = "model not run at this size (over " + fmt("%.0e", kModelFlopBudget) + " FLOPs; --check-all runs it)";
    }
    if (faulted && row.pass) row.note = fault_note(opt.fault) + "; " + row.note;
    rep.rows.push_back(row);
  }

#if TUTORIAL_HAVE_CUDA && CH06_GQA_MLA_KERNELS
  if (dev) {
    rep.device = dev->name;
    require_device_memory(*dev, mla_device_bytes(s, do_dec), "the MLA tensors");
    if (opt.bench || sweep) rep.ceilings = measure_ceilings(DType::bf16);
    if (do_abs) {
      // split-dropped: the kernels' own key ranges (mla_absorb_ranges()), range 0 left out.
      MlaShape gs = fs;
      MlaInputs gin = fin;
      int gsplits = splits;
      bool faulted = opt.fault != Fault::none && opt.fault != Fault::split_dropped;
      if (opt.fault == Fault::split_dropped) {
        const MlaRanges rg = mla_absorb_ranges(s, splits, tile16);
        if (split_dropped_mla(s, in, rg.ranges, rg.keys_per_range, &gs, &gin)) {
          faulted = true;
          gsplits = rg.ranges - 1;
        }
      }
      const MlaGpuResult g = mla_absorb_gpu(gs, gin, gsplits, !no_time, tile16, tile64, combine, combine_parts, pdl);
      ResultRow row;
      // Without a lab form (--tile16, --tile64, --combine, --combine-parts, --no-pdl) this is the
      // chapter's final MLA decode: mla_final.cu on sm_90a, its tile by the packed rows (its table);
      // on other GPUs mla_decode.cu's mma.sync tiles.
      const bool final_form = tile16 == 0 && tile64 == kTile64Wgmma && combine == kCombineAuto &&
                              combine_parts == 0 && pdl;
      row.impl = std::string(final_form ? "final " : "") +
                 (g.what.find("wgmma") != std::string::npos ? "absorb decode (wgmma)" : "absorb decode (mma.sync)");
      row.device = "cuda";
      const MlaCost c = mla_cost_absorb(s, g.head_tile);
      row.flops = c.flops;
      row.hbm_read_bytes = c.bytes;
      row.hbm_write_bytes = 0.0;
      const CheckResult chk = judge(faulty_mla_output(g.o, s));
      row.set_check(chk);
      row.bound = Bound::memory;
      if (!no_time) row.set_time(g.total_ms);
      row.note = !chk.pass() ? chk.failures()
                 : no_time   ? g.what
                             : g.what + "; attention kernels " + fmt("%.4f", g.attn_ms) + " ms = " +
                                 fmt("%.0f", c.cache_bytes / (g.attn_ms * 1e-3) / 1e9) + " GB/s of latent cache";
      if (faulted && row.pass) row.note = fault_note(opt.fault) + "; " + row.note;
      rep.rows.push_back(row);
    }
    std::string why;
    if (do_dec && !hopper_ready(&why)) {
      rep.notes.push_back("decompress on the GPU: " + why);
    } else if (do_dec) {
      const MlaGpuResult g = mla_decompress_gpu(fs, fin, !no_time);
      ResultRow row;
      row.impl = "decompress + packed_fwd d=192";
      row.device = "cuda";
      row.flops = cd.flops;
      row.hbm_read_bytes = cd.bytes;
      row.hbm_write_bytes = 0.0;
      const CheckResult chk = judge(faulty_mla_output(g.o, s));
      row.set_check(chk);
      row.bound = Bound::compute;
      if (!no_time) row.set_time(g.total_ms);
      row.note = !chk.pass() ? chk.failures() : no_time ? g.what : g.what + "; attention alone " + fmt("%.4f", g.attn_ms) + " ms";
      if (opt.fault != Fault::none && opt.fault != Fault::split_dropped && row.pass)
        row.note = fault_note(opt.fault) + "; " + row.note;
      rep.rows.push_back(row);
    }
    rep.apply_ceilings();
    if (sweep) mla_sweep(rep, rep.ceilings, tile64, sweep_heads, sweep_batch, sweep_splits, lab);
  }
#else
  (void)dev;
  (void)sweep;
  (void)no_time;
  (void)tile16;
  (void)tile64;
  (void)sweep_heads;
  (void)sweep_batch;
  (void)combine;
  (void)sweep_splits;
  (void)combine_parts;
  (void)pdl;
  (void)lab;
#endif
  rep.notes.push_back("cache per token and layer: latent [c ; k_rope] = 576 x 2 B = 1152 B, shared by all " +
                      std::to_string(s.heads) + " heads; decompressed K + V = " + std::to_string(s.heads) +
                      " x 320 x 2 B = " + format_bytes(s.heads * 640.0) + " (" + fmt("%.1f", s.heads * 640.0 / 1152) +
                      "x more)");
  rep.notes.push_back("one step, counted: absorb " + fmt("%.3g", ca.flops) + " FLOPs / " + format_bytes(ca.bytes) +
                      " (" + fmt("%.1f", ca.flops / ca.bytes) + " FLOP/B); decompress " + fmt("%.3g", cd.flops) +
                      " FLOPs / " + format_bytes(cd.bytes) + " (" + fmt("%.1f", cd.flops / cd.bytes) + " FLOP/B)");
  rep.notes.push_back("naive bf16 yardstick (decompressed, plain): max abs err " + fmt("%.3g", naive.max_abs));
  rep.previous = "the absorbed form is chapter 06's packed GQA with G = H and one KV head (d = 576, dv = 512, V "
                 "inside K); the decompressed form is packed_fwd.cu with d = 192, dv = 128";
  return rep.emit(std::cout, opt.json);
}

}  // namespace

int gqa_main(int argc, char** argv) {
  Problem d;
  d.batch = 1;
  d.heads = 8;
  d.kv_heads = 2;
  d.nq = 4;
  d.nk = 1000;
  d.d = d.dv = 128;
  d.dtype = DType::bf16;
  Cli cli(argv[0], "GQA/MQA with packed query groups: K/V loaded once per group of query heads, not once per head.");
  cli.defaults(d).dtypes({DType::bf16, DType::f16}).sram_default(227 * 1024);
  cli.faults({Fault::wrong_kv_head, Fault::last_key_block, Fault::last_batch, Fault::stale_lse});
  bool sweep = false, no_table = false, no_time = false;
  cli.add_flag("--sweep", &sweep, "GPU: packed vs unpacked over G and Nq (LAB.md's sweep)");
  cli.add_flag("--no-table", &no_table, "leave out the cache table of real models");
  cli.add_flag("--no-time", &no_time, "GPU: check only, no timing (for compute-sanitizer)");
  return run_chapter(argc, argv, cli, [&](const Options& o) { return run_gqa(o, sweep, no_table, no_time); });
}

int mla_main(int argc, char** argv) {
  Problem d;
  d.batch = 2;
  d.heads = d.kv_heads = 16;
  d.nq = 1;
  d.nk = 300;
  d.d = kDQK;
  d.dv = kDV;
  d.causal = true;
  d.dtype = DType::bf16;
  Cli cli(argv[0],
          "MLA with DeepSeek-V3's dims: the latent cache, decompressed prefill and absorbed decode, against fp64.\n"
          "--n is the number of new tokens per sequence (1 = decode); causal (bottom-right) always.");
  cli.defaults(d).dtypes({DType::bf16}).sram_default(227 * 1024);
  cli.faults({Fault::last_key_block, Fault::last_batch, Fault::split_dropped});
  std::string form = "both";
  int pos0 = 1000, splits = 0;
  bool sweep = false, no_time = false;
  cli.add_choice("--form", &form, {"absorb", "decompress", "both"}, "which form(s) to run");
  cli.add_int("--pos0", &pos0, "RoPE position of key 0 [1000]", 0, 1 << 30);
  cli.add_int("--splits", &splits, "key splits of the absorbed decode (0: from the SM count) [0]", 0, 1024);
  cli.add_flag("--sweep", &sweep, "GPU: the memory-bound and compute-bound decode sweep (LAB.md)");
  int sweep_heads = 0;
  cli.add_int("--sweep-heads", &sweep_heads, "GPU: only the sweep's rows with this H (16 or 128; 0: all) [0]", 0, 128);
  int sweep_batch = 0;
  cli.add_int("--sweep-batch", &sweep_batch, "GPU: only the sweep's rows with this batch B (0: all) [0]", 0, 1 << 20);
  // The measured alternatives of LAB.md: accepted with --lab only (the defaults are the chapter's kernels).
  bool lab = false;
  cli.add_flag("--lab", &lab,
               "allow the lab's forms (LAB.md): --tile16, --tile64, --combine, --combine-parts, --no-pdl, "
               "--sweep-splits; with --sweep, also time them beside the default");
  std::string tile16 = "wide";
  cli.add_choice("--tile16", &tile16, {"wide", "ring2x2", "ring4"}, "GPU, lab: the shape of the 16-row decode tile [wide]");
  int sweep_splits = 0;
  cli.add_int("--sweep-splits", &sweep_splits,
              "GPU, lab: also time each sweep row with 1, 2, 4, ... up to this many key ranges (0: none) [0]", 0, 1024);
  std::string tile64 = "wgmma";
  cli.add_choice("--tile64", &tile64, {"wgmma", "wgmma-arrive", "wgmma-sync", "wgmma-block", "wgmma-lockstep", "wgmma-halves", "mma"},
                 "GPU, lab: the 64-row decode tile's kernel (wgmma + TMA on sm_90, else mma.sync; wgmma: both "
                 "warpgroups in one loop at __syncthreads(), each wgmma issued and waited for in its "
                 "warpgroup's branch; wgmma-arrive: P released by bar.arrive, the former default; "
                 "wgmma-sync: P released by bar.sync; wgmma-block: the same on barrier 0, all threads of "
                 "the block; wgmma-lockstep: both warpgroups in one loop, S issued on warpgroup 0's "
                 "branch; wgmma-halves: each warpgroup computes S for half of the key block) [wgmma]");
  std::string combine = "auto";
  cli.add_choice("--combine", &combine, {"auto", "separate", "fused", "general", "cluster"},
                 "GPU, lab: how the key ranges are merged: auto (exactly 2 ranges on sm_90: in a cluster of the "
                 "two blocks; otherwise separate), separate (a second kernel, one round trip for up to 8 "
                 "ranges in 4 parts), fused (the decode kernel's last range: mma.sync tiles, at most 4 "
                 "ranges), general (the second kernel's two-trip form always), cluster (as auto) [auto]");
  std::string parts = "auto";
  cli.add_choice("--combine-parts", &parts, {"auto", "4", "8", "16"},
                 "GPU, lab: the separate combine's column parts, one thread block each (auto: more while the "
                 "blocks would not fill two per SM) [auto]");
  bool no_pdl = false;
  cli.add_flag("--no-pdl", &no_pdl, "GPU, lab: launch the combine after the decode, not as a programmatic dependent launch");
  cli.add_flag("--no-time", &no_time, "GPU: check only, no timing (for compute-sanitizer)");
  return run_chapter(argc, argv, cli, [&](const Options& o) {
    const std::string lab_form = tile16 != "wide"    ? "--tile16 " + tile16
                                 : tile64 != "wgmma" ? "--tile64 " + tile64
                                 : combine != "auto" ? "--combine " + combine
                                 : parts != "auto"   ? "--combine-parts " + parts
                                 : no_pdl            ? std::string("--no-pdl")
                                 : sweep_splits > 0  ? std::string("--sweep-splits")
                                                     : std::string();
    if (!lab && !lab_form.empty()) throw UsageError(lab_form + " is one of the lab's forms (LAB.md): add --lab");
    const int v = tile16 == "ring2x2" ? 1 : tile16 == "ring4" ? 2 : 0;
    const int t64 = tile64 == "mma"           ? kTile64Mma
                    : tile64 == "wgmma-sync"  ? kTile64WgmmaSync
                    : tile64 == "wgmma-block" ? kTile64WgmmaBlock
                    : tile64 == "wgmma-lockstep" ? kTile64WgmmaLockstep
                    : tile64 == "wgmma-halves" ? kTile64WgmmaHalves
                    : tile64 == "wgmma-arrive" ? kTile64WgmmaArrive
                                              : kTile64Wgmma;
    std::vector<int> more_splits;
    for (int k = 1; k <= sweep_splits; k *= 2) more_splits.push_back(k);
    return run_mla(o, form, pos0, splits, sweep, no_time, v, t64, sweep_heads, sweep_batch,
                   combine == "fused"       ? kCombineFused
                   : combine == "general"   ? kCombineGeneral
                   : combine == "cluster"   ? kCombineCluster
                   : combine == "separate"  ? kCombineSeparate
                                            : kCombineAuto,
                   more_splits,
                   parts == "auto" ? 0 : std::stoi(parts), !no_pdl, lab);
  });
}

}  // namespace attn::ch06
