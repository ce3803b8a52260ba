// ch06_variants mask: every mask and score modifier through one policy interface.
//
//   ch06_variants mask                        every variant at a small size (CPU model; GPU when present)
//   ch06_variants mask --mask window --window 256,0 --n 4096 --map
//   ch06_variants mask --mask document --doc-lens 100,900,24 --n 1024 --causal
//   ch06_variants mask --model gpt-oss --n 4096     a published model's heads, head dim and mask
//
// Each variant runs its CPU model (forward and backward) and, with a GPU, the sm_80
// forward, the final sm_90a forward (Hopper; --hopper-step picks the main path's steps) and
// the final backward; every result is judged against the fp64 reference of the same mask.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "common/check.hpp"
#include "common/cli.hpp"
#include "common/device.hpp"
#include "common/report.hpp"
#include "mask_gpu.hpp"
#include "mask_model.hpp"
#include "mask_spec.hpp"
#include "model_cases.hpp"
#include "parts.hpp"

#if TUTORIAL_HAVE_CUDA
#include "common/cuda/ceilings.cuh"
#endif

namespace attn::ch06 {
namespace {

/// The mask options that take text (the shared Cli parses numbers and choices only).
struct TextOptions {
  std::string window, doc_lens, softcap, svg, windows, hopper_steps, model;
  bool window_set = false, doc_lens_set = false, softcap_set = false, windows_set = false, hopper_steps_set = false;
  bool model_set = false;
  std::vector<std::string> seen;  ///< every option given (the name before any '='), for --model's conflicts
  std::string error;  // reported as a UsageError once the Cli has parsed the rest
};

/// Takes --window, --doc-lens, --softcap, --svg, --windows, --hopper-step and --model (with
/// their values) out of argv, and notes the name of every option given.
std::vector<char*> take_text_options(int argc, char** argv, TextOptions* t) {
  std::vector<char*> rest;
  for (int a = 0; a < argc; ++a) {
    std::string arg = argv[a], value;
    bool inline_value = false;
    if (const auto eq = arg.find('='); a > 0 && arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1), arg = arg.substr(0, eq), inline_value = true;
    }
    if (a > 0 && arg.rfind("--", 0) == 0) t->seen.push_back(arg);
    std::string* target = arg == "--window" ? &t->window : arg == "--doc-lens" ? &t->doc_lens
                        : arg == "--softcap" ? &t->softcap : arg == "--svg" ? &t->svg
                        : arg == "--windows" ? &t->windows : arg == "--hopper-step" ? &t->hopper_steps
                        : arg == "--model" ? &t->model : nullptr;
    if (a == 0 || !target) {
      rest.push_back(argv[a]);
      continue;
    }
    if (!inline_value) {
      if (a + 1 >= argc) {
        t->error = arg + " needs a value";
        continue;
      }
      value = argv[++a];
    }
    *target = value;
    if (arg == "--window") t->window_set = true;
    if (arg == "--doc-lens") t->doc_lens_set = true;
    if (arg == "--softcap") t->softcap_set = true;
    if (arg == "--windows") t->windows_set = true;
    if (arg == "--hopper-step") t->hopper_steps_set = true;
    if (arg == "--model") t->model_set = true;
  }
  return rest;
}

std::vector<int> parse_int_list(const std::string& flag, const std::string& text) {
  std::vector<int> v;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(int(parse_integer(flag, item, -(1LL << 30), 1LL << 30)));
  if (v.empty() || text.back() == ',') throw UsageError(flag + " expects a comma-separated list, got '" + text + "'");
  return v;
}

/// The user's mask options, before the problem is known.
struct MaskArgs {
  std::string mask;  // empty: every variant
  int chunk = -1, prefix = -1, docs = -1, sinks = -1;
  int stride = -1, block = -1, summary = -1, globals = -1, random = -1;  ///< the sparse patterns (-1: default)
  bool map = false;
  bool no_model = false, no_backward = false, no_time = false;
  bool alone = false;          ///< document: also run each document alone
  int check_mflops = 4000;     ///< the fp64 check's budget per variant, in MFLOPs (sampled rows)
  std::string gpu_path = "all";  ///< sm80, sm90a or all (the forwards; the backward follows --no-backward)
  std::vector<int> hopper_steps = {kHopperFinal};  ///< the sm90a steps that run (mask_gpu.hpp: 0 hopper_mask.cu, ..., final)
  int ctas = 0;                ///< sm90a: thread blocks of the persistent grid (0: one per SM)
  bool all_partial = false;    ///< forwards: every visited tile takes the element mask (a measurement)
  TextOptions text;
};

/// A run of one variant: its inputs when already made (the sweeps share them), the fp64
/// check's budget, and the label of its rows (the variant's name unless a sweep names it).
struct RunOptions {
  const AttnInputs* inputs = nullptr;
  double check_flops = 4e9;
  std::string label;
  bool quiet_notes = false;
};

/// Builds the spec of `kind` from the arguments; rejects options the mask does not take.
MaskSpec make_spec(MaskKind kind, const MaskArgs& a, const Options& opt, bool explicit_mask) {
  MaskSpec s;
  s.kind = kind;
  s.causal = opt.problem.causal;
  auto only = [&](bool given, const char* flag, std::initializer_list<MaskKind> ok) {
    if (!given || !explicit_mask) return;
    for (MaskKind k : ok)
      if (k == kind) return;
    throw UsageError(std::string(flag) + " does not apply to --mask " + mask_name(kind));
  };
  only(a.text.window_set, "--window",
       {MaskKind::window, MaskKind::sink, MaskKind::learned_sink, MaskKind::softcap, MaskKind::longformer});
  only(a.stride >= 0, "--stride", {MaskKind::strided});
  only(a.block >= 0, "--block", {MaskKind::fixed, MaskKind::bigbird});
  only(a.summary >= 0, "--summary", {MaskKind::fixed});
  only(a.globals >= 0, "--globals", {MaskKind::longformer, MaskKind::bigbird});
  only(a.random >= 0, "--random", {MaskKind::bigbird});
  if (explicit_mask && opt.problem.causal && (kind == MaskKind::longformer || kind == MaskKind::bigbird))
    throw UsageError(std::string("--causal does not apply to --mask ") + mask_name(kind) + " (a bidirectional pattern)");
  only(a.chunk >= 0, "--chunk", {MaskKind::chunked});
  only(a.prefix >= 0, "--prefix", {MaskKind::prefix});
  only(a.text.doc_lens_set || a.docs >= 0, a.docs >= 0 ? "--docs" : "--doc-lens", {MaskKind::document});
  only(a.sinks >= 0, "--sinks", {MaskKind::sink});
  only(a.text.softcap_set, "--softcap", {MaskKind::softcap});
  if (explicit_mask && opt.problem.causal && kind == MaskKind::window)
    throw UsageError("--causal does not apply to --mask window (a causal window is --window L,0)");
  // In the tour (no --mask) each option applies to the variant it belongs to (--window: window).
  const bool mine_window = explicit_mask || kind == MaskKind::window;
  if (a.text.window_set && mine_window) {
    const std::vector<int> w = parse_int_list("--window", a.text.window);
    // learned-sink and softcap: --window L is a causal sliding window on top (gpt-oss, Gemma 2).
    const bool sliding = kind == MaskKind::learned_sink || kind == MaskKind::softcap;
    if (w.size() > 2 || ((kind == MaskKind::sink || kind == MaskKind::longformer || sliding) && w.size() != 1))
      throw UsageError(kind == MaskKind::window ? "--window takes L or L,R"
                                                : std::string("--window takes one value L with --mask ") + mask_name(kind));
    if (sliding) {
      if (w[0] < 0) throw UsageError(std::string("--window must be L >= 0 with --mask ") + mask_name(kind));
      s.sliding = w[0];
    } else {
      s.left = w[0];
      s.right = w.size() == 2 ? w[1] : 0;
    }
  }
  {
    if (a.chunk >= 0) s.chunk = a.chunk;
    if (a.prefix >= 0) s.prefix = a.prefix;
    if (a.sinks >= 0) s.sinks = a.sinks;
    if (a.stride >= 0) s.stride = a.stride;
    if (a.block >= 0) s.block = a.block;
    if (a.summary >= 0) s.summary = a.summary;
    if (a.globals >= 0) s.globals = a.globals;
    if (a.random >= 0) s.random = a.random;
    if (a.text.softcap_set) s.softcap = parse_number("--softcap", a.text.softcap);
    if (a.text.doc_lens_set && a.docs >= 0) throw UsageError("give --doc-lens or --docs, not both");
    if (a.text.doc_lens_set) s.doc_lens = parse_int_list("--doc-lens", a.text.doc_lens);
    if (a.docs >= 0) {
      if (a.docs > opt.problem.nq) throw UsageError("--docs must be <= N");
      s.doc_lens = random_doc_lens(opt.problem.nq, a.docs, unsigned(opt.seed));
    }
  }
  if ((kind == MaskKind::sink || kind == MaskKind::longformer) && !(a.text.window_set && explicit_mask)) s.left = 64;
  if (!explicit_mask && kind != MaskKind::document) s.doc_lens.clear();
  finalize_spec(s, opt.problem);
  return s;
}

/// --model: the problem's head dim and heads and the mask from a published config (sets them
/// in `opt`). An option that says otherwise (another --mask, --d, --heads, a mask option) is
/// a UsageError; --n, --nk, --batch, --causal and --docs (packed-docs) still apply.
MaskSpec model_case_spec(const ModelCase& m, const MaskArgs& a, Options* opt) {
  auto given = [&](const char* flag) {
    return std::find(a.text.seen.begin(), a.text.seen.end(), flag) != a.text.seen.end();
  };
  const std::string who = std::string("--model ") + m.name;
  Problem& p = opt->problem;
  if (!a.mask.empty() && a.mask != mask_name(m.kind))
    throw UsageError(who + " sets --mask " + mask_name(m.kind) + ", not " + a.mask);
  if ((given("--d") && p.d != m.d) || (given("--dv") && p.dv != m.d))
    throw UsageError(who + " sets d = " + std::to_string(m.d));
  if ((given("--heads") && p.heads != m.heads) || (given("--kv-heads") && p.kv_heads != m.kv_heads))
    throw UsageError(who + " sets " + std::to_string(m.heads) + " query heads and " + std::to_string(m.kv_heads) +
                     " KV heads");
  for (const char* flag : {"--window", "--softcap", "--doc-lens", "--chunk", "--prefix", "--sinks", "--stride", "--block",
                           "--summary", "--globals", "--random"})
    if (given(flag)) throw UsageError(who + " sets the mask: " + flag + " does not apply");
  if (a.docs >= 0 && m.kind != MaskKind::document) throw UsageError(who + ": --docs applies to packed-docs only");
  apply_model_problem(m, &p);
  validate(p);
  return model_spec(m, p, unsigned(opt->seed), a.docs);
}

constexpr double kModelFlopBudget = 2e9;  // the CPU model's limit (one core)

/// One variant: the model's rows (and the kernels'), judged against the reference.
void run_variant(const MaskSpec& spec, const Problem& user, const Options& opt, const MaskArgs& a,
                 const std::optional<DeviceInfo>& dev, bool explicit_mask, Report& rep, const RunOptions& ro = {}) {
  const Problem p = masked_problem(user);
  const std::string name = ro.label.empty() ? mask_name(spec.kind) : ro.label;
  const TokenLayout layout = layout_for(spec, p);
  const ModelTiles tiles = model_tiles(p.d);
  const BlockMap map = build_block_map(spec, p, tiles.Br, tiles.Bc);
  if (a.map) {
    std::ostream& os = opt.json ? std::cerr : std::cout;
    os << name << ": " << spec.describe() << "\n" << map.text(0, 0);
    const std::string path = !a.text.svg.empty() && explicit_mask ? a.text.svg : "block_map_" + name + ".svg";
    std::ofstream f(path);
    if (!f) throw UsageError("cannot write " + path);
    f << map.svg(0, 0, name + ": " + spec.describe() + ", " + p.describe());
    os << "  (picture written to " << path << ")\n";
  }
  const AttnInputs made = ro.inputs ? AttnInputs{} : make_inputs(p, opt.dist, opt.seed, /*with_dout=*/!a.no_backward);
  const AttnInputs& in = ro.inputs ? *ro.inputs : made;
  AttnInputs lin;  // the inputs in the layout the mask runs in (packed for documents)
  lin.q = to_layout(in.q, p.heads, p.nq, p.d, layout.packed);
  lin.k = to_layout(in.k, p.kv_heads, p.nk, p.d, layout.packed);
  lin.v = to_layout(in.v, p.kv_heads, p.nk, p.dv, layout.packed);
  if (!in.dout.empty()) lin.dout = to_layout(in.dout, p.heads, p.nq, p.dv, layout.packed);
  const std::unique_ptr<ScoreMod> mod = reference_mod(spec, p);
  const ForwardOracle oracle(p, in, opt.check_all ? CheckPlan::full(p) : CheckPlan::sampled(p, ro.check_flops), mod.get());
  // The backward's fp64 reference is made when a backward runs, not before: each sampled KV group
  // needs all Nq x Nk pairs of its heads (at a model's shape, minutes of fp64 for a head dim with
  // no backward kernel).
  const BackwardPlan bplan = opt.check_all ? BackwardPlan::full(p) : BackwardPlan::sampled(p, 2.0 * ro.check_flops);
  std::optional<BackwardOracle> boracle_made;
  auto boracle = [&]() -> const BackwardOracle& {
    if (!boracle_made) boracle_made.emplace(p, in, bplan, mod.get());
    return *boracle_made;
  };
  if (rep.check_plan.empty())
    rep.check_plan = oracle.plan().describe(p) + (a.no_backward ? "" : "; backward: " + bplan.describe(p));
  const double fwd_flops = mask_flops_forward(spec, p, map);
  if (!ro.quiet_notes)
    rep.notes.push_back(name + ": " + spec.describe() + "; " + fmt("%.0f", map.kept_tiles()) + " of " +
                      fmt("%.0f", map.total_tiles()) + " tiles kept (" + fmt("%.0f", map.count(TileKind::partial)) +
                      " partial) at " + std::to_string(map.Br) + " x " + std::to_string(map.Bc) + ", " +
                      fmt("%.1f", 100.0 * map.kept_pairs / (double(p.batch) * p.heads * p.nq * p.nk)) +
                      "% of pairs kept");

  const bool run_model = !a.no_model && (flops_forward(p) <= kModelFlopBudget || opt.device == DeviceChoice::cpu);
  if (run_model) {
    // --inject-fault: the forward reads the lists a faulty map builder leaves (the backward reads its O and LSE).
    BlockMap fmap = map;
    const int faulted = inject_map_fault(fmap, opt.fault);
    const MaskForwardResult f = mask_forward_model(p, spec, layout, lin, fmap, opt.sram_bytes);
    ResultRow row;
    row.impl = name + ": model forward";
    row.device = "cpu";
    row.flops = fwd_flops;
    row.set_traffic(f.traffic);
    const std::vector<float> o = from_layout(f.o, p.heads, p.nq, p.dv, layout.packed);
    row.set_check(oracle.judge(o, &f.lse));
    if (faulted) row.note = fault_note(opt.fault) + " (" + std::to_string(faulted) + " key lists)";
    rep.rows.push_back(row);
    if (!a.no_backward) {
    const MaskBackwardResult g = mask_backward_model(p, spec, layout, lin, f.o, f.lse, map, opt.sram_bytes);
    ResultRow brow;
    brow.impl = name + ": model backward";
    brow.device = "cpu";
    brow.flops = 2.5 * fwd_flops;
    brow.set_traffic(g.traffic);
    brow.set_check(boracle().judge(from_layout(g.dq, p.heads, p.nq, p.d, layout.packed),
                                 from_layout(g.dk, p.kv_heads, p.nk, p.d, layout.packed),
                                 from_layout(g.dv, p.kv_heads, p.nk, p.dv, layout.packed)));
    rep.rows.push_back(brow);
    }
  }
#if TUTORIAL_HAVE_CUDA
  if (dev) {
    // The forward kernels to run: sm80, each sm90a step asked for, the backward.
    std::vector<std::pair<GpuPath, int>> runs;
    if (a.gpu_path != "sm90a") runs.push_back({GpuPath::sm80, 0});
    if (a.gpu_path != "sm80")
      for (int step : a.hopper_steps) runs.push_back({GpuPath::sm90a, step});
    if (!a.no_backward) runs.push_back({GpuPath::backward, 0});
    for (const auto& [path, step] : runs) {
      ResultRow row;
      // The final kernels are named so: "final sm90a forward" (steps/final.cu), "final backward"
      // (backward_mask.cu). Several sm90a steps: a row each, a step by its number.
      const bool final_row = (path == GpuPath::sm90a && step == kHopperFinal) || path == GpuPath::backward;
      row.impl = name + ": " + (final_row ? "final " : "") + gpu_path_name(path);
      if (path == GpuPath::sm90a && !final_row && a.hopper_steps.size() > 1) row.impl += ", step " + std::to_string(step);
      row.device = "cuda";
      row.flops = path == GpuPath::backward ? 2.5 * fwd_flops : fwd_flops;
      row.bound = Bound::compute;
      if (path == GpuPath::backward) {
        // The final backward is the sm90a one (hopper_backward.cu) where it runs, else the sm80 one
        // (backward_mask.cu); on Hopper the sm80 one runs too, as its own rows ("sm80 backward").
        const std::string why90 = mask_backward_unsupported(p, spec, BwdKernel::sm90a, *dev);
        const std::string why80 = mask_backward_unsupported(p, spec, BwdKernel::sm80, *dev);
        std::vector<std::pair<BwdKernel, bool>> kernels;  // (kernel, is the final one)
        if (why90.empty()) kernels.push_back({BwdKernel::sm90a, true});
        kernels.push_back({BwdKernel::sm80, !why90.empty()});
        if (!why90.empty() && !why80.empty()) {
          row.note = why80 + "; " + why90;
          rep.rows.push_back(row);
          continue;
        }
        // O and LSE from a forward that runs this problem: the final sm90a one with the sm90a backward.
        const GpuMaskForward f =
            mask_forward_gpu(p, spec, layout, lin, why90.empty() ? GpuPath::sm90a : GpuPath::sm80, /*time=*/false);
        for (const auto& [kernel, final_kernel] : kernels) {
          const std::string base = name + ": " + (final_kernel ? "final backward" : bwd_kernel_name(kernel));
          if (kernel == BwdKernel::sm80 && !why80.empty()) {
            ResultRow nr = row;
            nr.impl = base;
            nr.note = why80;
            rep.rows.push_back(nr);
            continue;
          }
          row.impl = base;
          // Two rows: dQ's adds in any order, and in a fixed order (deterministic).
          for (const bool det : {false, true}) {
            ResultRow br = row;
            if (det) br.impl = base + ", deterministic dQ";
            const GpuMaskBackward g = mask_backward_gpu(p, spec, layout, lin, f.o, f.lse, !a.no_time, det, kernel);
            br.set_check(boracle().judge(from_layout(g.dq, p.heads, p.nq, p.d, layout.packed),
                                       from_layout(g.dk, p.kv_heads, p.nk, p.d, layout.packed),
                                       from_layout(g.dv, p.kv_heads, p.nk, p.dv, layout.packed)));
            if (!a.no_time) br.set_time(g.time_ms);
            br.note = kernel == BwdKernel::sm90a ? "hopper_backward.cu" : "backward_mask.cu";
            if (!g.dsink.empty()) {
              std::string d = "dLoss/dsink_h (GPU):";
              for (std::size_t h = 0; h < g.dsink.size() && h < 4; ++h) d += " " + fmt("%.4g", g.dsink[h]);
              br.note += "; " + d + (g.dsink.size() > 4 ? " ..." : "");
            }
            rep.rows.push_back(br);
          }
        }
        continue;
      }
      const std::string why = mask_gpu_unsupported(p, path, *dev, step);
      if (!why.empty()) {
        row.note = why;
        rep.rows.push_back(row);
        continue;
      }
      GpuForwardOptions fo;
      fo.hopper_step = step;
      fo.ctas = a.ctas;
      fo.all_partial = a.all_partial;
      fo.fault = opt.fault;
      const GpuMaskForward f = mask_forward_gpu(p, spec, layout, lin, path, !a.no_time, fo);
      row.set_check(oracle.judge(from_layout(f.o, p.heads, p.nq, p.dv, layout.packed), &f.lse));
      if (!a.no_time) row.set_time(f.time_ms);
      row.note = fmt("%.0f", f.tiles) + " tiles visited" + (a.all_partial ? " (all partial: --all-partial)" : "");
      if (path == GpuPath::sm90a) row.note += std::string(", ") + hopper_step_file(step);
      if (f.faulted_lists)
        row.note = fault_note(opt.fault) + " (" + std::to_string(f.faulted_lists) + " key lists); " + row.note;
      // The kernel's own count: Q read once per query block, K and V once per visited tile, O and LSE written once.
      const double e = dtype_bytes(p.dtype), bc = f.tile_keys;
      row.hbm_read_bytes = e * (double(p.q_elems()) + f.tiles * bc * (p.d + p.dv));
      row.hbm_write_bytes = e * double(p.o_elems()) + 4.0 * double(p.lse_elems());
      row.extra_bytes = 0;
      rep.rows.push_back(row);
    }
  }
#else
  (void)dev;
#endif
}

}  // namespace

int mask_main(int argc, char** argv) {
  MaskArgs a;
  std::vector<char*> args = take_text_options(argc, argv, &a.text);
  Problem defaults;
  defaults.batch = 1;
  defaults.heads = 4;
  defaults.kv_heads = 2;       // GQA
  defaults.nq = defaults.nk = 333;  // not a multiple of any tile
  defaults.d = defaults.dv = 128;
  defaults.dtype = DType::bf16;
  std::vector<std::string> names;
  for (MaskKind k : all_mask_kinds()) names.push_back(mask_name(k));
  Cli cli(argv[0],
          "masks and score modifiers through one policy interface (keep / score / classify) and a block map.\n"
          "Text-valued mask options: --window L[,R] (window; L for sink), --doc-lens a,b,c (document),\n"
          "--softcap C (softcap), --window L with learned-sink or softcap (a causal sliding window on top),\n"
          "--window W with longformer (W keys each side, default 64),\n"
          "--model NAME (" + model_case_names() + ": a published model's head dim, heads and mask),\n"
          "--svg PATH (with --map), --hopper-step K[,K...] (the sm90a steps: 0 hopper_mask.cu,\n"
          "1 v1_two_q_buffers.cu, 2 v2_tile_overlap.cu, 3 v3_document_tiles.cu, 4 v4_row_spans.cu, with the lab 5\n"
          "lab/v5_epilogue_in_place.cu; final: the final kernel, steps/final.cu; default final).\n"
          "With no --mask: every variant at a small size.");
  cli.defaults(defaults).head_dims({32, 64, 128, 256}).dtypes({DType::bf16, DType::f16});
  cli.sram_default(224 * 1024);
  cli.faults({Fault::partial_tile_full, Fault::last_key_block});
  cli.add_choice("--mask", &a.mask, names, "the variant (default: every one)");
  cli.add_int("--chunk", &a.chunk, "chunked: chunk length C", 1);
  cli.add_int("--prefix", &a.prefix, "prefix: bidirectional prefix length P", 0);
  cli.add_int("--docs", &a.docs, "document: K documents of random lengths", 1);
  cli.add_int("--sinks", &a.sinks, "sink: S sink tokens (with --window L)", 0);
  cli.add_int("--stride", &a.stride, "strided: stride l [64]", 1);
  cli.add_int("--block", &a.block, "fixed, bigbird: block l (fixed) or b (bigbird) in tokens [64]", 1);
  cli.add_int("--summary", &a.summary, "fixed: c summary columns per block, c <= block [8]", 0);
  cli.add_int("--globals", &a.globals, "longformer: g global tokens [1]; bigbird: g global blocks [2]", 0);
  cli.add_int("--random", &a.random, "bigbird: r random key blocks per query block, r <= 64 [3]", 0, 64);
  cli.add_flag("--map", &a.map, "print the block map (keep / skip / partial per tile) and write it as SVG");
  cli.add_flag("--no-model", &a.no_model, "skip the CPU model rows");
  cli.add_flag("--no-backward", &a.no_backward, "skip the backward rows");
  cli.add_flag("--no-time", &a.no_time, "check the kernels without timing them (for compute-sanitizer)");
  cli.add_int("--check-mflops", &a.check_mflops, "fp64 check budget per variant in MFLOPs (sampled rows) [4000]", 1);
  cli.add_flag("--alone", &a.alone, "document: also run each document alone (the cost the packed run should match)");
  cli.add_choice("--gpu-path", &a.gpu_path, {"all", "sm80", "sm90a"}, "which forward kernels run (default: all)");
  cli.add_flag("--all-partial", &a.all_partial,
               "GPU forwards: every visited tile takes the element mask (what the mask costs per tile)");
  cli.add_int("--ctas", &a.ctas, "sm90a: thread blocks of the persistent grid (0: one per SM) [0]", 0);
  return run_chapter(int(args.size()), args.data(), cli, [&](const Options& given) {
    if (!a.text.error.empty()) throw UsageError(a.text.error);
    Options opt = given;  // --model sets the problem's head dim and heads
    const ModelCase* model = nullptr;
    if (a.text.model_set) {
      model = find_model_case(a.text.model);
      if (!model) throw UsageError("--model: no model '" + a.text.model + "' (" + model_case_names() + ")");
    }
    if (a.text.hopper_steps_set) {
      // The steps by number, the final kernel by its name: "1,2,3,4,final".
      const std::string& text = a.text.hopper_steps;
      if (text.empty() || text.back() == ',') throw UsageError("--hopper-step expects a comma-separated list, got '" + text + "'");
      a.hopper_steps.clear();
      std::stringstream ss(text);
      for (std::string item; std::getline(ss, item, ',');) {
        if (item == "final") {
          a.hopper_steps.push_back(kHopperFinal);
          continue;
        }
        const long long st = parse_integer("--hopper-step", item, -(1LL << 30), 1LL << 30);
        if (st < 0 || st >= kHopperFinal)
          throw UsageError("--hopper-step: a step is in [0, " + std::to_string(kHopperFinal - 1) + "] or final, got " +
                           std::to_string(st));
        if (!hopper_step_built(int(st)))
          throw UsageError("--hopper-step " + std::to_string(st) +
                           ": a lab step, and this build has no lab (configure with -DTUTORIAL_LAB=ON)");
        a.hopper_steps.push_back(int(st));
      }
    }
    const bool explicit_mask = !a.mask.empty() || model;
    std::vector<MaskSpec> specs;
    if (model) {
      specs.push_back(model_case_spec(*model, a, &opt));
    } else if (explicit_mask) {
      MaskKind k;
      parse_mask(a.mask, &k);
      specs.push_back(make_spec(k, a, opt, true));
    } else {
      for (MaskKind k : all_mask_kinds()) {
        const Problem& u = opt.problem;
        if (k == MaskKind::document && (u.nq != u.nk || u.batch != 1)) continue;  // needs one packed batch, Nq = Nk
        specs.push_back(make_spec(k, a, opt, false));
      }
    }
    Report rep;
    rep.chapter = "ch06_variants mask";
    rep.title = model ? "masks and score modifiers: " + std::string(model->name) + ", " + specs[0].describe()
                : explicit_mask ? "masks and score modifiers: " + specs[0].describe()
                                : "masks and score modifiers: every variant";
    if (model)
      rep.notes.push_back(std::string("--model ") + model->name + ": " + model->source +
                          (model->window > 0 ? "; a sliding_window of W keys (the query's own included) is the "
                                               "left bound W - 1"
                                             : ""));
    rep.problem = masked_problem(opt.problem);
    rep.inputs = std::string(dist_name(opt.dist)) + ", seed " + std::to_string(opt.seed);
    const auto dev = select_device(opt.device, &rep.mode);
#if TUTORIAL_HAVE_CUDA
    if (dev && opt.bench) rep.ceilings = measure_ceilings(opt.problem.dtype);
#endif
    if (!explicit_mask && specs.size() < all_mask_kinds().size())
      rep.notes.push_back("document: not run (document masking packs one batch with Nq = Nk)");
    if (a.text.windows_set && !(explicit_mask && specs[0].kind == MaskKind::window))
      throw UsageError("--windows applies to --mask window only");
    if (a.alone && !(explicit_mask && specs[0].kind == MaskKind::document))
      throw UsageError("--alone applies to --mask document only");
    std::vector<int> windows;
    if (a.text.windows_set) {
      windows = parse_int_list("--windows", a.text.windows);
      for (int w : windows)
        if (w < 0) throw UsageError("--windows: a window is >= 0, got " + std::to_string(w));
    }
    {  // every variant of the tour on the same inputs
      const Problem p = masked_problem(opt.problem);
      const AttnInputs in = make_inputs(p, opt.dist, opt.seed, /*with_dout=*/!a.no_backward);
      RunOptions ro;
      ro.inputs = &in;
      ro.check_flops = 1e6 * a.check_mflops;
      if (model) ro.label = model->name;  // rows "gpt-oss: model forward", ...
      for (const MaskSpec& s : specs) run_variant(s, opt.problem, opt, a, dev, explicit_mask, rep, ro);
    }
    // The window sweep: the same inputs, one window after another (rows "window L=...").
    if (!windows.empty()) {
      const Problem p = masked_problem(opt.problem);
      const AttnInputs in = make_inputs(p, opt.dist, opt.seed, /*with_dout=*/!a.no_backward);
      rep.notes.push_back("window sweep: rows 'window L=...' share one set of inputs and are checked in fp64 on "
                          "fewer sampled rows (a budget of 5e8 FLOPs each)");
      for (int w : windows) {
        MaskSpec s = specs[0];
        s.left = w;
        finalize_spec(s, opt.problem);
        RunOptions ro;
        ro.inputs = &in, ro.check_flops = std::min(5e8, 1e6 * a.check_mflops), ro.label = "window L=" + std::to_string(w);
        run_variant(s, opt.problem, opt, a, dev, false, rep, ro);
      }
    }
    // Each document alone: a problem of its own length with one document (full, or causal).
    if (a.alone) {
      const std::vector<int> lens = specs[0].doc_lens;
      rep.notes.push_back("documents alone: rows 'document k alone (L)' run document k as a problem of its own "
                          "length, checked in fp64 on sampled rows (a budget of 5e8 FLOPs each)");
      for (std::size_t k = 0; k < lens.size(); ++k) {
        Problem one = opt.problem;
        one.nq = one.nk = lens[k];
        MaskSpec s = specs[0];
        s.doc_lens = {lens[k]};
        finalize_spec(s, one);
        RunOptions ro;
        ro.check_flops = std::min(5e8, 1e6 * a.check_mflops), ro.quiet_notes = true;
        ro.label = "document " + std::to_string(k) + " alone (" + std::to_string(lens[k]) + ")";
        run_variant(s, one, opt, a, dev, false, rep, ro);
      }
    }
    rep.apply_ceilings();
    return rep.emit(std::cout, opt.json);
  });
}

}  // namespace attn::ch06
