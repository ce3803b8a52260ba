#!/usr/bin/env python3
"""./tutorial bench: every chapter's kernels next to the peers and the GPU's own ceilings, in one run.

    ./tutorial bench                       the full sweep (the start line says how long: 6:26 on
                                           an H200 for the recorded run; --plan lists the tasks and estimates)
    ./tutorial bench --quick               fewer shapes (2:13 on an H200)
    ./tutorial bench --n 8192 --d 64,128   only these shapes (--mask causal|none|both, --no-backward)
    ./tutorial bench --chapters 04,05      only these chapters (and the peers on their shapes)
    ./tutorial bench --steps 8,final,final-fp8 --peers cudnn,fa4   only these steps (numbers, and chapter
                                           05's final kernels by name), only these peers (--no-peers: none)
    ./tutorial bench --lab                 chapter 05's lab steps too (steps/lab/, LAB.md): its binary is
                                           built with -DTUTORIAL_LAB=ON in BUILD_DIR-lab (BUILD_DIR itself
                                           when it is configured so already), results in BUILD_DIR/bench-lab
    ./tutorial bench --before OLD_BUILD    this build against an older one, kernel by kernel (--rounds R)
    ./tutorial bench --plan                the tasks and their estimated seconds, nothing run
    ./tutorial bench --only 'ch06 ring'    only the plan's tasks whose label matches (with --plan too)
    ./tutorial bench --chapters 06 --only model   chapter 06's model cases (gpt-oss, gemma2, mistral,
                                           packed-docs at N = 8K and 16K) with FA4 and FlexAttention
                                           (bench/ch06_masks.py --models; the full sweep runs them too)
    ./tutorial bench --chapters 06 --only sparse  chapter 06's structured sparse patterns (strided, fixed,
                                           longformer, bigbird at N = 8K) with FlexAttention
                                           (bench/ch06_masks.py --variants; the full sweep runs them too)
    ./tutorial bench --cpu                 no GPU needed: the CPU models' counted HBM traffic and
                                           extra memory against N and the on-chip budget M
    ./tutorial bench --report FILE.json    tables and plots again from a recorded results.json

Chapter 05 keeps a main path and a lab: without --lab its binary runs the main path (forward v1-v8
and the final bf16/fp16 and FP8 kernels; backward b1, b2, b5, b6, b10, b11 and the final backward),
and the tables and plots show those; --lab times every lab step too (forward v9 and up; backward
b3, b4, b7-b9, b12-b17) and adds the lab's tables and plots.

With a GPU it builds the chapter binaries if needed, then runs, in this order:
the ceilings (read bandwidth; bf16 and FP8 GEMM through cuBLAS/cuBLASLt, measured by the
chapter binaries' --bench), and for each shape every chapter's kernels and steps (each binary
checks every kernel against the fp64 reference before timing it: a kernel that fails is
reported as failed, with no speed), then the peers on the same shape: PyTorch SDPA's flash,
cuDNN and efficient backends, FlexAttention and FlashAttention-4 where importable, and beside
chapter 05's FP8 forward cuDNN's FP8 forward (bench/peer_cudnn_fp8.py: its time compares with our
FP8 kernel's without the preparation pass; the ch05-fp8 table shows ours with and without it).

Shapes: the FlashAttention papers' B*N = 16K tokens and H*d = 2048, N from 512 to 16K,
d in {64, 128, 256} where a chapter supports it, causal and not, forward and (where the
chapter has one) backward; chapter 02's softmax at 2^28 scores; chapter 07's decode sweep.

Outputs in BUILD_DIR/bench/: results.json, results.csv, results.md and PNG plots.
"""
import argparse
import datetime
import glob
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
# No pool of torch.compile workers: its processes (each importing PyTorch) would share the CPU with
# the timing of the peers and of our binaries; FlexAttention compiles in this process instead.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import bench_report  # noqa: E402
from bench_common import (CH06_MODEL_CASES, CH06_SPARSE, CH06_SPARSE_TABLE, DECODE_PEERS, FP8_PEERS,  # noqa: E402
                          PEERS, attention_flops, clean_row, paper_shape, read_json, shape_key, step_token)

QUICK_N = [2048, 8192]
FULL_N = [512, 1024, 2048, 4096, 8192, 16384]
HEAD_DIMS = [64, 128, 256]
SOFTMAX_SCORES = 1 << 28
SOFTMAX_HEADS = 16


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ============================================================================ chapters and build

def discover_chapters():
    """{"04": "ch04_fa2", ...} from chapters/NN_name/CMakeLists.txt."""
    out = {}
    for cm in sorted(glob.glob(os.path.join(ROOT, "chapters", "[0-9][0-9]_*", "CMakeLists.txt"))):
        m = re.search(r"tutorial_chapter_binary\(\s*(\w+)", open(cm).read())
        if m:
            out[os.path.basename(os.path.dirname(cm))[:2]] = m.group(1)
    return out


def lab_chapters():
    """{"05": "ch05_fa3_hopper"}: the chapters whose CMakeLists.txt has lab sources (LAB_CUDA_SOURCES,
    LAB_HOPPER_SOURCES: built only with TUTORIAL_LAB=ON)."""
    out = {}
    for c, name in discover_chapters().items():
        for cm in glob.glob(os.path.join(ROOT, "chapters", c + "_*", "CMakeLists.txt")):
            if re.search(r"\bLAB_(CUDA|HOPPER)_SOURCES\b", open(cm).read()):
                out[c] = name
    return out


def configured_with_lab(build_dir):
    """True when BUILD_DIR's CMake cache has TUTORIAL_LAB on."""
    try:
        text = open(os.path.join(build_dir, "CMakeCache.txt")).read()
    except OSError:
        return False
    m = re.search(r"^TUTORIAL_LAB:BOOL=(\S+)", text, re.M)
    return bool(m) and m.group(1).upper() in ("ON", "1", "TRUE", "YES")


def lab_build_dir(build_dir):
    """Where --lab builds the chapters that have lab steps: BUILD_DIR itself when its cache has
    TUTORIAL_LAB=ON already, else a folder of its own beside it, BUILD_DIR-lab (so that the plain
    build keeps building the main path only)."""
    build_dir = os.path.abspath(build_dir)
    return build_dir if configured_with_lab(build_dir) else build_dir.rstrip("/") + "-lab"


def build(build_dir, targets, cuda, lab=None):
    """Configures BUILD_DIR if it has no cache yet, then builds the targets. lab=True: with the lab
    steps (-DTUTORIAL_LAB=ON; a cache without it is reconfigured); lab=None: as the environment's
    TUTORIAL_LAB says, like ./tutorial (unset: as the cache is)."""
    if not shutil.which("cmake"):
        log("bench: cmake not found: using the binaries already in %s/bin" % build_dir)
        return
    lab_opt = []
    if lab:
        lab_opt = ["-DTUTORIAL_LAB=ON"]
    elif os.environ.get("TUTORIAL_LAB"):
        lab_opt = ["-DTUTORIAL_LAB=" + os.environ["TUTORIAL_LAB"]]
    if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
        gen = ["-G", "Ninja"] if shutil.which("ninja") else []
        extra = []
        if os.environ.get("CMAKE_CUDA_ARCHITECTURES"):
            extra.append("-DCMAKE_CUDA_ARCHITECTURES=" + os.environ["CMAKE_CUDA_ARCHITECTURES"])
        subprocess.run(["cmake", "-S", ROOT, "-B", build_dir, *gen, "-DCMAKE_BUILD_TYPE=Release",
                        "-DTUTORIAL_CUDA=" + cuda, *extra, *lab_opt], check=True, stdout=subprocess.DEVNULL)
    elif lab_opt and (configured_with_lab(build_dir) != (lab_opt[0].split("=")[1].upper() in ("ON", "1", "TRUE"))):
        log("bench: reconfiguring %s with %s" % (build_dir, lab_opt[0]))
        subprocess.run(["cmake", "-S", ROOT, "-B", build_dir, *lab_opt], check=True, stdout=subprocess.DEVNULL)
    jobs = os.environ.get("JOBS", str(os.cpu_count() or 2))
    cmd = ["cmake", "--build", build_dir, "-j", jobs, "--target", *targets]
    if os.path.exists(os.path.join(build_dir, "build.ninja")):
        cmd += ["--", "-k", "0"]  # a chapter that does not compile is reported, the others still run
    log("bench: building " + " ".join(targets))
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode:
        log("bench: the build failed for some targets (their chapters are reported as not built):")
        log("\n".join(r.stdout.splitlines()[-15:]))


def cuda_option():
    if os.environ.get("TUTORIAL_CUDA"):
        return os.environ["TUTORIAL_CUDA"]
    return "ON" if shutil.which("nvcc") else "OFF"


def has_gpu():
    if not shutil.which("nvidia-smi"):
        return False
    r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return r.returncode == 0 and r.stdout.startswith("GPU")


def gpu_info():
    q = "name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.limit,memory.total"
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=" + q, "--format=csv,noheader,nounits", "-i", "0"],
                           capture_output=True, text=True)
        f = [x.strip() for x in r.stdout.strip().split(",")] if r.returncode == 0 else []
    except OSError:
        f = []
    if len(f) < 8:
        return {"gpu": "unknown", "driver": None, "clocks": {}}
    return {"gpu": f[0], "driver": f[1],
            "clocks": {"sm_mhz": f[2], "mem_mhz": f[3], "max_sm_mhz": f[4], "max_mem_mhz": f[5]},
            "power_limit_w": f[6], "memory_mib": f[7]}


# ============================================================================ running a binary

def before_binaries(before, chapters):
    """--before: an older build folder (its bin/ holds the chapter binaries) or one binary of it.
    Returns (the folder or binary as given, {chapter: Binary})."""
    path = os.path.abspath(before)
    if os.path.isfile(path):
        name = os.path.basename(path)
        return before, {c: Binary.at(path) for c, n in chapters.items() if n == name}
    if not os.path.isdir(os.path.join(path, "bin")):
        sys.exit("bench: --before %s: neither a build folder (with bin/) nor a binary" % before)
    out = {}
    for c, n in chapters.items():
        b = Binary.at(os.path.join(path, "bin", n))
        if b.exists():
            out[c] = b
    return before, out


# The chapter binaries' host memory. Every kernel row of a binary allocates its uploads and
# downloads anew (three 67 MB bf16 staging buffers in, a 134 MB fp32 O and its staging buffer out, at
# the papers' 16K tokens x 2048 features), and glibc hands each block above 32 MB to mmap and back to
# the kernel at free: every row paid its page faults and the kernel's zeroing again (about 0.2 s of a
# row's 0.4 s, measured on the CPU alone: bench/README.md, "Where the time goes"). With mmap off and
# no trimming, freed blocks stay in the heap and the next row reuses pages already mapped. Nothing
# else changes: the same allocations, the same numbers. A GLIBC_TUNABLES in the caller's environment
# (empty included) is kept as it is.
HEAP_TUNABLES = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=%d" % (1 << 40)


def binary_env():
    env = dict(os.environ)
    env.setdefault("GLIBC_TUNABLES", HEAP_TUNABLES)
    return env


def split_step_list(binary, args):
    """`args` as launches of `binary`: as they are when its --step takes a list (or no list is
    asked), else one launch per step of the list, the backward (whatever args ask of it) beside
    the last and --no-backward beside the others."""
    if "--step" not in args or "," not in args[args.index("--step") + 1] or binary.step_list():
        return [args]
    i = args.index("--step")
    ks = args[i + 1].split(",")
    quiet = list(args)
    if "--backward-step" in quiet:
        j = quiet.index("--backward-step")
        del quiet[j:j + 2]
    quiet = [a for a in quiet if a != "--no-backward"] + (["--no-backward"] if "--no-backward" in binary.flags() else [])
    out = []
    for k in ks:
        a = list(args if k == ks[-1] else quiet)
        a[a.index("--step") + 1] = k
        out.append(a)
    return out


def step_help(text):
    """What a binary's --help says its --step takes: (main step numbers, names, lab step numbers),
    from its parenthesis: "(v1-v8, final, final-fp8; with --lab also the lab's v9-v29; ...)" gives
    ({1..8}, {"final", "final-fp8"}, {9..29}); an older "(1-29; ...)" gives ({1..29}, {}, {}).
    None when the line or its parenthesis is not there (then every step is tried)."""
    m = re.search(r"--step K\[,K\]([^\n]*)", text)
    p = re.search(r"\(([^()]*)\)", m.group(1)) if m else None
    if not p:
        return None
    main_part, _, lab_part = p.group(1).partition("with --lab")

    def numbers(part):
        out = set()
        for a, b in re.findall(r"\bv?(\d+)\s*-\s*v?(\d+)\b", part):
            out |= set(range(int(a), int(b) + 1))
        return out
    main = numbers(main_part)
    if not main:
        return None
    return main, set(re.findall(r"\b(final-fp8|final)\b", main_part)), numbers(lab_part) - main


class Binary:
    paths = {}  # chapter binary name -> a path given on the command line (--binary), else BUILD/bin/name

    def __init__(self, build_dir, name):
        self.name = name
        self.path = Binary.paths.get(name) or os.path.join(build_dir, "bin", name)

    @staticmethod
    def at(path):
        """A binary at this exact path (an older build's, for --before)."""
        b = Binary.__new__(Binary)
        b.name, b.path = os.path.basename(path), path
        return b

    def exists(self):
        return os.access(self.path, os.X_OK)

    deadline = None  # time.time() by which a run must end (the --budget), or None
    launches = []    # every launch of this process: {binary, args, s, status}, kept in results.json
    verbose = False

    def flags(self):
        """The options this binary's --help lists (asked once): lets the plan pass --no-backward,
        --no-model, --no-fp8-table or --lab only to a binary that has them."""
        if not hasattr(self, "_flags"):
            try:
                r = subprocess.run([self.path, "--help"], capture_output=True, text=True, timeout=30)
                self._flags = set(re.findall(r"(--[a-z0-9][a-z0-9-]*)", r.stdout + r.stderr))
                self._step_list = bool(re.search(r"--step K\[,K\]", r.stdout + r.stderr))
                self._step_help = step_help(r.stdout + r.stderr)
            except (OSError, subprocess.TimeoutExpired):
                self._flags, self._step_list, self._step_help = set(), False, None
        return self._flags

    def has_lab(self):
        """Whether this binary was built with its lab steps: it lists --lab and does not refuse it
        (a build without TUTORIAL_LAB exits 2). Asked once, on a 64-token problem on the CPU."""
        if not hasattr(self, "_has_lab"):
            self._has_lab = False
            if "--lab" in self.flags():
                args = ["--lab", "--n", "64", "--batch", "1", "--heads", "1", "--d", "64", "--device", "cpu",
                        "--json"] + [f for f in ("--no-fp8-table", "--no-model", "--no-backward") if f in self.flags()]
                try:
                    r = subprocess.run([self.path] + args, capture_output=True, text=True, timeout=60,
                                       env=binary_env())
                    self._has_lab = r.returncode in (0, 1)
                except (OSError, subprocess.TimeoutExpired):
                    pass
        return self._has_lab

    def sub_flags(self, sub):
        """The options a subcommand's --help lists (`ch07_paged_radix decode --help`: a binary with
        subcommands lists only them at the top), asked once a subcommand."""
        cache = self.__dict__.setdefault("_sub_flags", {})
        if sub not in cache:
            try:
                r = subprocess.run([self.path, sub, "--help"], capture_output=True, text=True, timeout=30)
                cache[sub] = set(re.findall(r"(--[a-z0-9][a-z0-9-]*)", r.stdout + r.stderr))
            except (OSError, subprocess.TimeoutExpired):
                cache[sub] = set()
        return cache[sub]

    def steps_of(self, ks):
        """The steps of `ks` (numbers, and names: "final", "final-fp8") this binary has: all of them
        when its --help says nothing of its steps; else the numbers and names it lists, and the lab's
        numbers only when it was built with its lab (has_lab). A list with a step the binary does not
        have would be refused whole."""
        self.flags()
        h = getattr(self, "_step_help", None)
        if h is None:
            return list(ks)
        main, names, lab = h
        return [k for k in ks if (k in names if isinstance(k, str) else k in main or (k in lab and self.has_lab()))]

    def lab_steps(self, ks):
        """The steps of `ks` that are this binary's lab steps (by its --help)."""
        self.flags()
        h = getattr(self, "_step_help", None)
        return [k for k in ks if h is not None and not isinstance(k, str) and k in h[2] and k not in h[0]]

    def step_list(self):
        """Whether --step takes a list (K[,K...]: one launch, the inputs uploaded once, for every
        step asked); an older build's binary takes one step a launch."""
        self.flags()
        return self._step_list

    def run(self, args, timeout=300):
        """(status, report or None, message). status: ok (exit 0 or 1: the JSON says which rows
        failed), unsupported (exit 2: the binary refused the problem, with its one-line reason),
        error (anything else)."""
        t0 = time.time()
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        st, rep, msg = self._run(args, timeout)
        secs = time.time() - t0
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        # the launch's own CPU time and page faults (the peers' compilers run in this process, not as children)
        Binary.launches.append({"binary": self.name, "args": " ".join(args), "s": round(secs, 2), "status": st,
                                "user_s": round(ru1.ru_utime - ru0.ru_utime, 2),
                                "sys_s": round(ru1.ru_stime - ru0.ru_stime, 2),
                                "minflt": ru1.ru_minflt - ru0.ru_minflt,
                                "rows": len(rep.get("results", [])) if isinstance(rep, dict) else None})
        if Binary.verbose:
            log("    %5.1f s  %s %s  [%s]" % (secs, self.name, " ".join(args), st))
        return st, rep, msg

    def _run(self, args, timeout):
        cmd = [self.path] + args
        if Binary.deadline is not None:
            timeout = max(5, min(timeout, int(Binary.deadline - time.time())))
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=binary_env())
        except subprocess.TimeoutExpired:
            return "error", None, "timed out after %d s" % timeout
        if r.returncode == 2:
            return "unsupported", None, (r.stderr.strip().splitlines() or ["exit 2"])[-1][:200]
        if r.returncode not in (0, 1):
            return "error", None, "exit %d: %s" % (r.returncode, (r.stderr.strip().splitlines() or [""])[-1][:200])
        try:
            return "ok", json.loads(r.stdout), ""
        except ValueError:
            return "error", None, "no JSON on stdout (%d bytes)" % len(r.stdout)


def is_backward(r, problem):
    """A row of a chapter's report is a backward kernel when the row says so (a "direction" or
    "pass_name" of bwd/backward), its name does ("backward ...", "bwd ...", a step named b1, b2,
    ...), or its FLOPs are the backward's count (2.5x the forward's)."""
    for f in ("direction", "pass_name", "phase"):
        if str(r.get(f, "")).lower() in ("bwd", "backward"):
            return True
    if str(r.get("pass", "")).lower() in ("bwd", "backward"):
        return True
    impl = r.get("impl", "").lower()
    if "backward" in impl or re.match(r"(bwd|b\d+)\b", impl):
        return True
    p = problem or {}
    try:
        fwd = attention_flops(p["batch"], p["heads"], p["nq"], p["nk"], p["d"], bool(p.get("causal")))
        return bool(r.get("flops")) and abs(r["flops"] / fwd - 2.5) < 0.01
    except (KeyError, TypeError, ZeroDivisionError):
        return False


def report_rows(rep, chapter, shape):
    """Rows of a chapter's --json report: its GPU rows, each with its check verdict."""
    p = rep.get("problem", {})
    out = []
    for r in rep.get("results", []):
        if r.get("device") != "cuda":
            continue
        impl = r.get("impl", "?")
        if chapter != "01" and impl.startswith("ch01"):
            continue  # chapter 03 re-times chapter 01's pipelines: chapter 01's own run reports them
        backward = is_backward(r, p)
        fp8 = "fp8" in impl.lower()
        row = {"chapter": chapter, "kernel": "ch%s %s" % (chapter, impl), "kind": "ours",
               "pass": "bwd" if backward else "fwd", "d": p.get("d", shape.get("d")), "N": p.get("nq"),
               "nk": p.get("nk"), "B": p.get("batch"), "H": p.get("heads"), "Hkv": p.get("kv_heads"),
               "causal": bool(p.get("causal")), "dtype": "fp8" if fp8 else p.get("dtype"),
               "unit": "TFLOP/s", "ceiling": "fp8_gemm" if fp8 else "bf16_gemm",
               "flops": r.get("flops"), "max_abs_err": r.get("max_abs_err"), "note": r.get("note", "")}
        rd, wr = r.get("hbm_read_bytes"), r.get("hbm_write_bytes")
        if rd is not None and wr is not None:
            row["bytes"] = rd + wr
        if r.get("pass") is True and r.get("tflops") and r.get("max_abs_err") is not None:
            row.update(status="ok", time_ms=r.get("time_ms"), tflops=r.get("tflops"), gbps=r.get("gbps"))
            if r.get("prep_ms") is not None and r.get("time_ms"):
                # an FP8 kernel: time_ms is the kernel alone; its preparation pass, timed the same way, beside it
                t = r["time_ms"] + r["prep_ms"]
                row.update(prep_ms=r["prep_ms"], time_with_prep_ms=t,
                           tflops_with_prep=r["flops"] / (t * 1e-3) / 1e12 if r.get("flops") else None)
        elif r.get("pass") is True and r.get("tflops"):
            row["status"] = "unchecked"  # a pass with no error figure is no comparison with fp64
        elif r.get("pass") is False:
            row["status"] = "failed"
        else:
            # run but not compared with fp64 (the report drops its speed and says ran_unchecked),
            # or not run at all
            ran = r.get("tflops") is not None or r.get("ran_unchecked")
            row["status"] = "unchecked" if ran else "unsupported"
        out.append(clean_row(row))
    return out


def better(r, old):
    """The row to keep of two runs of one kernel on one shape (--before --rounds): a failure stays
    a failure; of two passing runs, the faster."""
    if old.get("status") == "failed" or r.get("status") == "failed":
        return r.get("status") == "failed" and old.get("status") != "failed"
    if old.get("status") != "ok":
        return r.get("status") == "ok"
    return r.get("status") == "ok" and (r.get("time_ms") or 1e30) < (old.get("time_ms") or 1e30)


# ============================================================================ the plan

def mask_script_rows(base, ours, ours_error, peer_cells, peers, peer_flops, step):
    """The rows of one entry of bench/ch06_masks.py's report: ours (`ours`: {"sm90a", "sm80", "bwd"}
    cells, each a row in the ch06 mask rows' schema) and each peer's cell as a peer row of the same
    shape (its forward; its backward where the report has a "PEER-bwd" cell), on `base`. A kernel or peer that cannot run the entry is a row with status
    "unsupported" and its reason as the note; a run of ours that gave no rows, "error"."""
    rows = []
    names = (("sm90a", "mask final sm90a forward", "fwd"), ("sm80", "mask sm80 forward", "fwd"),
             ("bwd", "mask final backward", "bwd"))
    for key, kernel, pss in names:
        if step and key == "sm90a":
            kernel = "mask sm90a forward"
        row = dict(base, kernel="ch06 " + kernel)
        row["pass"] = pss
        c = ours.get(key)
        if c is None:
            if not ours:
                rows.append(clean_row(dict(row, status="error", note=ours_error or "no rows")))
            continue
        row.update(flops=c.get("flops"), max_abs_err=c.get("err"), note=c.get("why") or c.get("note") or "")
        if c.get("why"):
            row["status"] = "unsupported"
        elif c.get("pass") is True and c.get("ms") and c.get("tflops") and c.get("err") is not None:
            row.update(status="ok", time_ms=c["ms"], tflops=c["tflops"])
        elif c.get("pass") is False:
            row["status"] = "failed"
        else:
            row["status"] = "unchecked" if c.get("ms") else "not run"
        rows.append(clean_row(row))
    # each peer's forward, and its backward where the report has one (the cell "PEER-bwd")
    for p, pss in [(p, "fwd") for p in peers] + [(p, "bwd") for p in peers if p + "-bwd" in peer_cells]:
        c = peer_cells.get(p if pss == "fwd" else p + "-bwd") or {"why": "not run"}
        why = c.get("why") or ""
        row = dict(base, chapter="peer", kind="peer", kernel=p,
                   flops=c.get("flops") or (peer_flops if pss == "fwd" else 2.5 * peer_flops if peer_flops else None),
                   max_abs_err=c.get("err"), note=why or c.get("note") or "")
        row["pass"] = pss
        if why:
            row["status"] = "error" if why.startswith("error") else "unsupported" if (
                "not supported" in why or "not in FA4" in why or "has no" in why) else "not run"
        elif c.get("pass") is False:
            row["status"] = "failed"
        elif c.get("ms") and row.get("flops"):
            row.update(status="ok", time_ms=c["ms"], tflops=row["flops"] / (c["ms"] * 1e-3) / 1e12)
        else:
            row.update(status="not run", note="checked, not timed (the time budget)" if c.get("pass") else
                       "not run")
        rows.append(clean_row(row))
    return rows


def model_rows(out, peers=("fa4", "flex")):
    """Rows of bench/ch06_masks.py --models' report: ours in the ch06 mask rows' schema (kernel
    `ch06 mask final sm90a forward`, `ch06 mask sm80 forward`, `ch06 mask final backward`), the
    peers as peer rows of the same shape (forward, and backward where measured); the case's name is the row's variant and
    its mask the row's `mask`. A kernel not built for the head dim, or a peer without the case, is
    a row with status "unsupported" and its reason as the note; a run that failed, "error"."""
    rows = []
    step = "--hopper-step" in (out.get("command") or "")  # one sm90a step instead of the final kernel
    for e in out.get("models", []):
        base = {"chapter": "06", "kind": "ours", "d": e.get("d"), "N": e.get("n"), "nk": e.get("n"),
                "B": e.get("batch"), "H": e.get("hq"), "Hkv": e.get("hkv"), "causal": True, "dtype": "bf16",
                "unit": "TFLOP/s", "ceiling": "bf16_gemm", "variant": e.get("model"), "mask": e.get("mask")}
        rows += mask_script_rows(base, e.get("ours") or {}, e.get("ours_error"), e.get("peers") or {}, peers,
                                 e.get("flops"), step)
    return rows


def sparse_rows(out, peers=("fa4", "flex")):
    """Rows of bench/ch06_masks.py --variants strided,fixed,longformer,bigbird: each pattern's rows
    (mask_script_rows: our forwards, FlexAttention, and FA4, whose interface has none of them), the
    pattern its variant, its parameters (the binary's description) its mask, and table =
    CH06_SPARSE_TABLE: the table of their own (bench_report.sparse_table)."""
    rows = []
    step = "--hopper-step" in (out.get("command") or "")
    for name, e in (out.get("variants") or {}).items():
        if name not in CH06_SPARSE:
            continue
        spec = (e.get("spec") or "").split(";")[0].split(": ", 1)[-1]
        base = {"chapter": "06", "kind": "ours", "d": out.get("d"), "N": out.get("n"), "nk": out.get("n"),
                "B": 1, "H": out.get("heads"), "Hkv": out.get("heads"), "causal": False, "dtype": "bf16",
                "unit": "TFLOP/s", "ceiling": "bf16_gemm", "variant": name, "mask": spec or name,
                "table": CH06_SPARSE_TABLE}
        kp = e.get("kept_pairs")  # a peer whose mask parameters differ from ours already says so (its why)
        rows += mask_script_rows(base, e.get("ours") or {}, e.get("ours_error"), e.get("peers") or {}, peers,
                                 4.0 * kp * out.get("d") if kp else None, step)
    return rows


class Task:
    def __init__(self, kind, label, est, fn, rounds=False):
        self.kind, self.label, self.est, self.fn = kind, label, est, fn
        self.rounds = rounds  # its launches run --rounds times (the attention shapes' launches of ours)


class Bench:
    def __init__(self, args):
        self.a = args
        self.build_dir = args.build_dir
        self.out_dir = args.out or default_out(self.build_dir, getattr(args, "lab", False))
        self.chapters = discover_chapters()
        if args.chapters:
            want = [c.strip().zfill(2) for c in args.chapters.split(",") if c.strip()]
            bad = [c for c in want if c not in self.chapters]
            if bad:
                sys.exit("bench: no chapter %s (chapters here: %s)" % (",".join(bad), ",".join(self.chapters)))
            self.chapters = {c: self.chapters[c] for c in want}
        self.chapters_asked = set(self.chapters)
        self.bins = {c: Binary(self.build_dir, n) for c, n in self.chapters.items()}
        self.rows, self.notes = [], []
        self.ceilings = {}
        self.peers = None
        self.t0 = time.time()
        self.started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ")
        self.ours_at = {}  # (chapter, d, causal, N) -> {kernel: tflops}: the step-pruning rule
        self.task_times = []
        # --peers / --no-peers / --before: which peers run (a peer left out is a column that says so)
        self.use_peers = set() if (args.no_peers or args.before) else set(
            args.peers or PEERS + FP8_PEERS + ["torch_softmax"])
        self.extra_args = (args.extra or "").split()
        self.lab = bool(getattr(args, "lab", False))
        self._lab_noted = set()
        self.before_dir, self.before_bins = None, None
        if args.before:
            self.before_dir, self.before_bins = before_binaries(args.before, self.chapters)
        Binary.launches = []
        Binary.verbose = bool(getattr(args, "verbose", False))

    # ----------------------------------------------------------------- ceilings
    def ceilings_task(self):
        src = None
        for c in ("05", "04", "01"):  # chapter 05's --bench measures the FP8 GEMM too
            b = self.bins.get(c) or Binary(self.build_dir, discover_chapters().get(c, "-"))
            if not b.exists():
                continue
            args = ["--n", "256", "--batch", "1", "--heads", "1", "--d", "128"] + \
                [f for f in ("--no-model", "--no-fp8-table", "--no-backward") if f in b.flags()]
            st, rep, msg = b.run(args + ["--bench", "--device", "cuda", "--json"], timeout=120)
            if st != "ok":
                self.notes.append("ceilings from %s: %s %s" % (b.name, st, msg))
                continue
            ce = rep.get("ceilings", {})
            self.ceilings["read_gbps"] = ce.get("read_gbps")
            self.ceilings["bf16_gemm_tflops"] = ce.get("gemm_tflops")
            self.ceilings["bf16_gemm_what"] = ce.get("gemm_what")
            for n in rep.get("notes", []):
                m = re.search(r"fp8 ceiling: (.*?) ([0-9.]+) TFLOP/s", n)
                if m:
                    self.ceilings["fp8_gemm_tflops"] = float(m.group(2))
                    self.ceilings["fp8_gemm_what"] = m.group(1)
            src = b.name
            break
        self.ceilings["source"] = (src + " --bench (measure_ceilings: a streaming read kernel, cuBLAS GEMM; "
                                   "cuBLASLt E4M3 GEMM)") if src else "not measured"
        if "fp8_gemm_tflops" not in self.ceilings:
            self.ceilings["fp8_gemm_tflops"] = None
            self.ceilings["fp8_gemm_what"] = "not measured (needs chapter 05 on an sm_90 GPU)"

    # ----------------------------------------------------------------- attention shapes
    def supports(self, chapter, d):
        return {"01": d in (64, 128, 256), "03": d in (64, 128), "04": True, "05": True}.get(chapter, False)

    def previous_run(self, chapter, d, causal, n):
        """{kernel: TFLOP/s or None} of this chapter's all-steps run at the largest smaller N."""
        prev = [k[3] for k in self.ours_at if k[:3] == (chapter, d, causal) and k[3] < n]
        return (max(prev), self.ours_at[(chapter, d, causal, max(prev))]) if prev else (None, None)

    def ch06_mask_lab(self):
        """--lab: whether ch06_variants runs the masked forward's lab step 5 (a build without the
        lab refuses `--hopper-step 5` as bad input, exit 2). Asked once, on the CPU."""
        if not self.lab or "06" not in self.bins:
            return False
        if not hasattr(self, "_ch06_mask_lab"):
            args = ["mask", "--hopper-step", "5", "--mask", "causal", "--n", "64", "--batch", "1", "--heads", "1",
                    "--d", "128", "--device", "cpu", "--no-model", "--json"]
            try:
                r = subprocess.run([self.bins["06"].path] + args, capture_output=True, text=True, timeout=60,
                                   env=binary_env())
                self._ch06_mask_lab = r.returncode in (0, 1)
            except (OSError, subprocess.TimeoutExpired):
                self._ch06_mask_lab = False
        return self._ch06_mask_lab

    def lab_for(self, chapter):
        """--lab: whether this chapter's binary runs its lab steps (it takes --lab and was built with
        them); a chapter that has a lab but whose binary cannot run it gets a note, once."""
        if not self.lab or chapter not in self.bins or "--lab" not in self.bins[chapter].flags():
            return False
        if self.bins[chapter].has_lab():
            return True
        if chapter not in self._lab_noted:
            self._lab_noted.add(chapter)
            self.notes.append("--lab: %s was built without its lab steps (configure with -DTUTORIAL_LAB=ON): "
                              "its main path ran" % self.bins[chapter].path)
        return False

    def has_backward(self, chapter):
        """Chapter 03 always runs its backward; a chapter whose binary takes --no-backward (04, 05, and
        any later one) has one too."""
        return chapter == "03" or (chapter in self.bins and "--no-backward" in self.bins[chapter].flags())

    def shape_bh(self, n, d):
        """B and H of a shape: the papers' (B*N = 16K tokens, H*d = 2048), or --batch."""
        b, h = paper_shape(n, d)
        return (self.a.batch or b), h

    def ours_task(self, chapter, d, n, causal, backward):
        b, h = self.shape_bh(n, d)
        args = ["--n", str(n), "--batch", str(b), "--heads", str(h), "--kv-heads", str(h), "--d", str(d),
                "--device", "cuda", "--json"]
        if causal:
            args.append("--causal")
        flags = self.bins[chapter].flags()
        for f in ("--no-model", "--no-fp8-table"):  # CPU-side extras the bench does not report
            if f in flags:
                args.append(f)
        if self.lab_for(chapter):
            args.append("--lab")  # every lab step, forward and backward ("--backward-step all" too)
        args += self.extra_args
        no_bwd = ["--no-backward"] if "--no-backward" in flags else []
        bwd_all = ["--backward-step", "all"] if "--backward-step" in flags else []
        shape = {"d": d, "N": n, "causal": causal}
        runs = [args + ([] if backward else no_bwd)]
        if self.a.steps and "--step" in flags:
            # --steps: one launch with the list (the backward, when the plan has it here, beside it:
            # chapter 05 runs it beside a --step list only when asked); launch_rows splits the list
            # for a binary that takes one --step K a launch
            ks = self.bins[chapter].steps_of(self.a.steps)
            lab_left = [k for k in self.bins[chapter].lab_steps(self.a.steps) if k not in ks]
            if lab_left and chapter not in self._lab_noted:
                self._lab_noted.add(chapter)
                self.notes.append("--steps %s: lab steps, and %s was built without its lab (./tutorial bench "
                                  "--lab builds it)" % (",".join(map(str, lab_left)), self.bins[chapter].name))
            if not ks:
                self.notes.append("--steps %s: %s has none of them" % (",".join(map(str, self.a.steps)),
                                                                       self.bins[chapter].name))
                return
            runs = [args + ["--step", ",".join(map(str, ks))] + (bwd_all if backward else no_bwd)]
            self.launch_rows(chapter, runs, d, n, causal, shape)
            return
        # Step pruning: from N = prune_from on, a step more than 4x slower than the chapter's best
        # at the previous N is not timed again (its line in the plots stops there), when the time it
        # would take here is more than the extra launches cost (a binary whose --step takes a list
        # runs the kept steps in one launch; an older one takes one --step K a launch, and each
        # launch builds its inputs and fp64 reference again).
        n_prev, speeds = self.previous_run(chapter, d, causal, n)
        pruned = False
        if n >= self.prune_from and speeds and "--step" in flags:
            # each row's step as --step takes it: "ch05 v12 ..." -> 12, "ch05 final fp8 forward" -> final-fp8
            nums = {k: step_arg(k) for k in speeds}
            best = max([v for v in speeds.values() if v] or [0])
            slow = [k for k, v in speeds.items() if v is not None and v < best / 4]
            fl = attention_flops(b, h, n, n, d, causal)
            # a row costs its runs (a check, 3 warm-ups, 20 repeats) and its host time; a launch, its set-up
            slow_s = sum(24 * fl / (speeds[k] * 1e12) + self.row_s(chapter) for k in slow)
            kept = [nums[k] for k in speeds if k not in slow] if all(nums.values()) else []
            extra_launches = 0 if self.bins[chapter].step_list() else len(kept) - 1
            if slow and kept and slow_s > extra_launches * self.SETUP_S.get(chapter, 2):
                pruned = True
                # the backward runs beside the kept steps (chapter 05 runs it beside a --step list
                # only when --backward-step asks)
                runs = [args + ["--step", ",".join(map(str, kept))] + (bwd_all if backward else no_bwd)]
                for k in slow:
                    self.rows.append(self.base_row(chapter, k, "fwd", d, n, causal, status="not run",
                                                   note="more than 4x slower than the chapter's best step at "
                                                        "N = %d: timed up to there" % n_prev))
        got = self.launch_rows(chapter, runs, d, n, causal, shape)
        if not pruned:
            self.ours_at[(chapter, d, causal, n)] = {
                r["kernel"]: r.get("tflops") for r in got
                if r["pass"] == "fwd" and r.get("status") in ("ok", "failed", "unchecked")}

    def launch_rows(self, chapter, runs, d, n, causal, shape):
        """Runs each argument list of `runs` with the chapter's binary and keeps the rows of its
        report, --rounds times (odd rounds in the reverse order, so that no kernel is always timed
        first or last; each kernel's best time kept; a kernel that fails in any round is failed);
        with --before, the older build too, the builds alternating. Returns the rows of this build."""
        builds = [("ours", self.bins[chapter])]
        if self.before_bins is not None:
            if chapter in self.before_bins:
                builds.append(("before", self.before_bins[chapter]))
            else:
                self.notes.append("--before: %s is not in the older build" % self.bins[chapter].name)
        best = {kind: {} for kind, _ in builds}  # kind -> {(kernel, pass): row}
        for rnd in range(max(1, self.a.rounds)):
            for kind, binary in (builds if rnd % 2 == 0 else builds[::-1]):
                launches = [x for run in runs for x in split_step_list(binary, run)]
                for a in (launches if rnd % 2 == 0 else launches[::-1]):
                    if "--lab" in a and "--lab" not in binary.flags():  # --before: an older build's binary
                        a = [x for x in a if x != "--lab"]
                    for r in self.one_launch(chapter, binary, a, d, n, causal, shape):
                        key = (r["kernel"], r["pass"])
                        old = best[kind].get(key)
                        if old is None or better(r, old):
                            best[kind][key] = r
        got = list(best["ours"].values())
        self.rows += got
        for r in best.get("before", {}).values():
            r = dict(r, kind="before", kernel="before: " + r["kernel"], build=self.before_dir)
            self.rows.append(r)
        return got

    def one_launch(self, chapter, binary, a, d, n, causal, shape):
        st, rep, msg = binary.run(a, timeout=self.a.timeout)
        if st != "ok":
            return [self.base_row(chapter, "ch%s (%s)" % (chapter, binary.name), "fwd", d, n, causal, status=st,
                                  note=msg)]
        pr = rep.get("problem", {})
        if bool(pr.get("causal")) != causal or pr.get("nq") != n or pr.get("d") != d:
            return [self.base_row(chapter, "ch%s (%s)" % (chapter, binary.name), "fwd", d, n, causal,
                                  status="error", note="the binary ran another problem (%s) than asked" %
                                  json.dumps(pr))]
        return report_rows(rep, chapter, shape)

    def base_row(self, chapter, kernel, pss, d, n, causal, **kw):
        b, h = self.shape_bh(n, d)
        row = {"chapter": chapter, "kernel": kernel, "kind": "ours", "pass": pss, "d": d, "N": n, "nk": n,
               "B": b, "H": h, "Hkv": h, "causal": causal, "dtype": "bf16", "unit": "TFLOP/s",
               "ceiling": "bf16_gemm"}
        row.update(kw)
        return clean_row(row)

    def peer_task(self, peer, d, n, causal, backward, b=None, h=None, hkv=None):
        if b is None:
            b, h = self.shape_bh(n, d)
        hkv = hkv or h
        pss = "bwd" if backward else "fwd"
        if any(x.get("kind") == "peer" and x["kernel"] == peer and x["pass"] == pss and x["d"] == d and x["N"] == n
               and x["nk"] == n and x["B"] == b and x["H"] == h and x["Hkv"] == hkv and x["causal"] == causal and
               not x.get("variant") for x in self.rows):
            return  # measured on this shape already in this run
        r = self.get_peers().attention(peer, b, h, hkv, n, n, d, causal, backward)
        fp8 = peer in FP8_PEERS
        row = {"chapter": "peer", "kernel": peer, "kind": "peer", "pass": "bwd" if backward else "fwd", "d": d,
               "N": n, "nk": n, "B": b, "H": h, "Hkv": hkv, "causal": causal, "dtype": "fp8" if fp8 else "bf16",
               "unit": "TFLOP/s", "ceiling": "fp8_gemm" if fp8 else "bf16_gemm",
               "flops": attention_flops(b, h, n, n, d, causal, backward)}
        row.update(r)
        self.rows.append(clean_row(row))

    def get_peers(self):
        if self.peers is None:
            if self._preimport is not None:
                self._preimport.join()  # the imports started with the run (start_preimport)
            from bench_peers import Peers
            self.peers = Peers(repeats=self.a.repeats)
        return self.peers

    _preimport = None

    def start_preimport(self):
        """Imports PyTorch, FlexAttention and FlashAttention-4 in a thread while the first binaries
        run (several seconds of Python on the CPU). Imports only: the peers touch the GPU when the
        plan first reaches them, never while one of our kernels is being timed."""
        import threading

        self.preimport_s = {}

        def work():
            # torch.compile's machinery (dynamo, inductor, triton) is most of the import time
            for mod in ("torch", "torch.nn.attention.flex_attention", "torch._dynamo", "torch._inductor",
                        "torch._inductor.config", "torch._inductor.compile_fx", "triton", "flash_attn.cute"):
                t0 = time.time()
                try:
                    __import__(mod)
                except Exception:  # the peer's column will say why, from Peers()
                    pass
                self.preimport_s[mod] = round(time.time() - t0, 2)
        self._preimport = threading.Thread(target=work, name="peer-imports", daemon=True)
        self._preimport.start()

    # ----------------------------------------------------------------- chapter 02: softmax
    def softmax_task(self, n):
        c = "02"
        rows_total = SOFTMAX_SCORES // n
        nq = rows_total // SOFTMAX_HEADS
        args = ["--n", str(nq), "--nk", str(n), "--batch", "1", "--heads", str(SOFTMAX_HEADS), "--d", "64",
                "--device", "cuda", "--json"]
        st, rep, msg = self.bins[c].run(args, timeout=self.a.timeout)
        base = {"chapter": c, "kind": "ours", "pass": "softmax", "d": 64, "N": n, "nk": n, "nq": nq, "B": 1,
                "H": SOFTMAX_HEADS, "Hkv": SOFTMAX_HEADS, "causal": False, "dtype": "fp32", "unit": "GB/s",
                "ceiling": "read"}
        if st != "ok":
            self.rows.append(clean_row(dict(base, kernel="ch02 (%s)" % self.bins[c].name, status=st, note=msg)))
        else:
            for r in rep.get("results", []):
                if r.get("device") != "cuda":
                    continue
                row = dict(base, kernel="ch02 " + r["impl"], max_abs_err=r.get("max_abs_err"),
                           note=r.get("note", ""))
                rd, wr = r.get("hbm_read_bytes"), r.get("hbm_write_bytes")
                if rd is not None and wr is not None:
                    row["bytes"] = rd + wr  # the kernel's traffic formula (every sweep over S), not measured
                if r.get("pass") is True and r.get("time_ms") and wr is not None:
                    # one count for every kernel and for torch.softmax: S read once + what it writes
                    eff = 4.0 * rows_total * n + wr
                    row.update(status="ok", time_ms=r["time_ms"], gbps=eff / (r["time_ms"] * 1e-3) / 1e9,
                               own_gbps=r.get("gbps"))
                else:
                    row["status"] = "failed" if r.get("pass") is False else "unchecked"
                self.rows.append(clean_row(row))
        # torch.softmax on the same scores: reads S and writes P (fp32)
        if "torch_softmax" not in self.use_peers:
            return
        pr = self.get_peers().softmax(rows_total, n, 8.0 * rows_total * n)
        self.rows.append(clean_row(dict(base, chapter="peer", kind="peer", kernel="torch_softmax",
                                        bytes=8.0 * rows_total * n, **pr)))

    # ----------------------------------------------------------------- chapter 07: decode
    def decode_task(self, shapes=None):
        """Chapter 07's decode sweep (`decode --sweep`, or `--sweep-shapes SHAPES` where the binary
        has that option), every kernel and layout it reports, and the peers on its bf16 shapes with
        page size 16 (the peers read contiguous K/V). An 8-bit cache (fp8, int8) is a variant of
        its shape: its bytes are its own, and no peer reads that format."""
        c = "07"
        args = ["decode", "--sweep", "--device", "cuda", "--json"]
        if shapes:
            if "--sweep-shapes" not in self.bins[c].sub_flags("decode"):
                self.notes.append("ch07 decode sweep %s: the binary has no --sweep-shapes" % shapes)
                return
            args[2:2] = ["--sweep-shapes", shapes]
        if self.lab and "--lab" in self.bins[c].sub_flags("decode"):
            args.append("--lab")  # chapter 07's lab steps (v8, v10, v13) join the sweep
        st, rep, msg = self.bins[c].run(args, timeout=self.a.timeout)
        if st == "unsupported" and "--lab" in args:  # a binary built without its lab: the main path runs
            self.notes.append("--lab: %s was built without its lab steps (configure with -DTUTORIAL_LAB=ON): "
                              "its main path ran" % self.bins[c].path)
            args.remove("--lab")
            st, rep, msg = self.bins[c].run(args, timeout=self.a.timeout)
        if st != "ok" or not isinstance(rep, dict):
            self.notes.append("ch07 decode sweep%s: %s: %s" % (" " + shapes if shapes else "", st, msg))
            return
        for cfg in rep.get("configs", []):
            kvt = cfg.get("kv_dtype") or "bf16"
            base = {"chapter": c, "kind": "ours", "pass": "decode", "d": cfg.get("d", rep.get("d")), "N": 1,
                    "nk": cfg.get("len"), "B": cfg.get("batch"), "H": cfg.get("heads"), "Hkv": cfg.get("kv_heads"),
                    "causal": False, "page_size": cfg.get("page_size"), "dtype": kvt, "unit": "GB/s",
                    "ceiling": "read", "bytes": cfg.get("kv_bytes")}
            if kvt != "bf16":
                base["variant"] = "KV " + kvt
            for r in cfg.get("results", []):
                name = "ch07 %s %s" % (r.get("kernel", "?"), r.get("layout", "paged"))
                row = dict(base, kernel=name, max_abs_err=r.get("max_abs_err"), chosen=r.get("chosen"),
                           splits=r.get("splits"), note="%d key splits%s" % (
                               r.get("splits") or 1, "; the kernel the split heuristic picks" if r.get("chosen")
                               else ""))
                if r.get("tokens_per_s"):
                    row["tokens_per_s"] = r["tokens_per_s"]
                if r.get("pass") is True and r.get("time_ms") and r.get("kv_gbps"):
                    row.update(status="ok", time_ms=r["time_ms"], gbps=r["kv_gbps"])
                else:
                    row["status"] = "failed" if r.get("pass") is False else "unchecked"
                self.rows.append(clean_row(row))
            if cfg.get("page_size") == 16 and kvt == "bf16":  # the peers read contiguous bf16 K/V
                for p in DECODE_PEERS:
                    if p not in self.use_peers:
                        continue
                    if any(x.get("kind") == "peer" and x["kernel"] == p and x["pass"] == "decode" and
                           shape_key(x) == shape_key(dict(base, kernel=p)) for x in self.rows):
                        continue  # already measured on this shape in this run
                    pr = self.get_peers().decode(p, cfg["batch"], cfg["heads"], cfg["kv_heads"], cfg["len"], base["d"],
                                      cfg["kv_bytes"])
                    self.rows.append(clean_row(dict(base, chapter="peer", kind="peer", kernel=p, **pr)))

    # ----------------------------------------------------------------- chapter 06 (when written)
    def ch06_task(self, sub, d, n, causal, extra=()):
        """One part of chapter 06 at a paper shape (its default problem if it takes other options),
        then the peers on every plain (unmasked or causal) shape it reported."""
        c = "06"
        b, h = paper_shape(n, d)
        kv = h // 4 if sub == "gqa" else h
        args = [sub, "--n", str(n), "--batch", str(b), "--heads", str(h), "--kv-heads", str(kv), "--d", str(d),
                "--device", "cuda", "--json"] + (["--causal"] if causal and sub == "gqa" else []) + list(extra)
        if sub == "mla":  # DeepSeek-V3's head dims are fixed: a decode step of 4 sequences of 8K, 128 heads
            args = ["mla", "--n", "1", "--nk", "8192", "--batch", "4", "--heads", "128", "--kv-heads", "128",
                    "--device", "cuda", "--json"] + list(extra)
        st, rep, msg = self.bins[c].run(args, timeout=self.a.timeout)
        if st == "unsupported":  # the part has its own options: its default problem then (said in a note)
            self.notes.append("chapter 06 %s: the papers' shape was refused (%s): its default problem ran" % (sub, msg))
            st, rep, msg = self.bins[c].run([sub, "--device", "cuda", "--json"] + list(extra), timeout=self.a.timeout)
        if st != "ok" or not isinstance(rep, dict) or not rep.get("results"):
            self.notes.append("chapter 06 %s: %s" % (sub, msg or "not written yet (no JSON report)"))
            return
        plain = []
        for r in report_rows(rep, c, {"d": d, "N": n, "causal": causal}):
            impl = r["kernel"][5:]
            if sub == "mask" and ": " in impl:
                variant, impl = impl.split(": ", 1)
                if variant == "causal":
                    r["causal"] = True  # the same work as a causal peer: compared with them
                else:
                    r["variant"] = variant
            elif sub in ("mla", "ring"):
                r["variant"] = sub
            r["kernel"] = "ch06 %s %s" % (sub, impl)
            self.rows.append(r)
            if r.get("status") == "ok" and not r.get("variant"):
                k = (r["pass"], r["d"], r["N"], r["nk"], r["B"], r["H"], r["Hkv"], r["causal"])
                if k not in plain:
                    plain.append(k)
        for pss, dd, nq, nk, bb, hh, hkv, cz in plain:
            if nq != nk:
                continue
            for p in PEERS:
                if p not in self.use_peers:
                    continue
                if any(x.get("kind") == "peer" and x["kernel"] == p and x["pass"] == pss and x["d"] == dd and
                       x["N"] == nq and x["B"] == bb and x["H"] == hh and x["Hkv"] == hkv and x["causal"] == cz
                       for x in self.rows):
                    continue  # already measured on this shape in this run
                self.peer_task(p, dd, nq, cz, pss == "bwd", b=bb, h=hh, hkv=hkv)

    # The named model cases of chapter 06 (`ch06_variants mask --model NAME`), run by
    # bench/ch06_masks.py --models with FlexAttention and FA4 beside them (their own processes,
    # each peer checked in fp32 before it is timed). B = 16K tokens / N (packed-docs: B = 1).
    MODEL_CASES = list(CH06_MODEL_CASES)
    MODEL_N = [8192, 16384]
    # an estimate: 8 launches of ours (forwards and the backward, each with its sampled fp64 check)
    # while the peers' processes import PyTorch (15-20 s) and compile and check 32 peer calls (the
    # forwards and the backwards) in parallel, then 3 rounds of 32 timed peer calls (on an H100 the
    # preparations alone can take 330 s: their checks wait for our launches)
    MODEL_EST_S = 420
    MODEL_BUDGET_S = 540  # ch06_masks.py --budget, a cap: a peer not done by then is a cell that says so

    def masks_script(self, args, save, budget, peers):
        """bench/ch06_masks.py with `args` (its peers, FA4 and FlexAttention, where `peers` names them;
        --budget `budget` seconds): (its BENCH_JSON report, or what it saved before it stopped, or
        None; the last line of its stderr)."""
        cmd = [sys.executable, os.path.join(HERE, "ch06_masks.py"), "--bin", self.bins["06"].path] + list(args) + [
            "--budget", str(budget), "--workers", "4", "--save", save]
        if not peers:
            cmd.append("--no-peers")
        elif getattr(self.a, "fake_peers", False):
            cmd.append("--fake-peers")
        text, err = "", ""
        try:
            os.makedirs(self.out_dir, exist_ok=True)
            if os.path.exists(save):
                os.remove(save)
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=budget + 240)
            text, err = r.stdout, r.stderr
        except (subprocess.TimeoutExpired, OSError) as e:
            err = type(e).__name__
        lines = text.splitlines()[::-1]
        if os.path.exists(save):  # what it saved before it stopped
            lines += open(save).read().splitlines()
        out = None
        for line in lines:
            if line.startswith("BENCH_JSON "):
                try:
                    out = json.loads(line[len("BENCH_JSON "):])
                    break
                except ValueError:
                    continue
        return out, ((err or "").strip().splitlines()[-1:] or ["no output"])[0][:200]

    def ch06_models_task(self):
        """Chapter 06's model cases at N = 8K and 16K: our rows (forwards, backward) and the peers'
        (FA4, FlexAttention; forward), in the row schema of the ch06 mask rows, the case's name as
        the row's variant. Every failure is a row (or a note) that says so."""
        peers = [p for p in ("fa4", "flex") if p in self.use_peers]
        out, last = self.masks_script(["--models", ",".join(self.MODEL_CASES), "--model-n", ",".join(map(str, self.MODEL_N))]
                                      + (["--no-model-backward"] if self.a.no_backward else []),
                                      os.path.join(self.out_dir, "ch06_models.json"), self.MODEL_BUDGET_S, peers)
        if not out or not out.get("models"):
            self.notes.append("ch06 model cases: no result from bench/ch06_masks.py (%s)" % last)
            return
        self.rows.extend(model_rows(out, peers))

    # Chapter 06's structured sparse patterns (strided, fixed, longformer, bigbird) at N = 8K, B = 1,
    # H = 16, d = 128, forward: ours and FlexAttention (a BlockMask of the same definition, checked in
    # fp32 before it is timed), by bench/ch06_masks.py --variants. FA4 has none of the patterns.
    SPARSE_N = 8192
    SPARSE_EST_S = 20  # bench/ch06_masks.py --variants strided,fixed,longformer,bigbird: 14.5 s with Flex on the H100
    SPARSE_BUDGET_S = 120

    def ch06_sparse_task(self):
        """The sparse patterns' rows (sparse_rows): every failure is a row (or a note) that says so."""
        peers = [p for p in ("fa4", "flex") if p in self.use_peers]
        out, last = self.masks_script(["--variants", ",".join(CH06_SPARSE), "--skip", "sweep,docs", "--n",
                                       str(self.SPARSE_N), "--heads", "16"],
                                      os.path.join(self.out_dir, "ch06_sparse.json"), self.SPARSE_BUDGET_S, peers)
        if not out or not out.get("variants"):
            self.notes.append("ch06 sparse patterns: no result from bench/ch06_masks.py (%s)" % last)
            return
        self.rows.extend(sparse_rows(out, peers))

    # ----------------------------------------------------------------- plan
    def causal_only(self, chapter):
        """True when the chapter's binary runs a causal problem even without --causal (its default
        problem is causal, and the shared command line has no flag to turn that off). Asked once,
        on a 64-token problem on the CPU."""
        if chapter not in self._causal_only:
            st, rep, _ = self.bins[chapter].run(["--n", "64", "--batch", "1", "--heads", "1", "--d", "64",
                                                 "--device", "cpu", "--json"] +
                                                {"04": ["--no-model"], "05": ["--no-fp8-table"]}.get(chapter, []),
                                                timeout=60)
            self._causal_only[chapter] = bool(st == "ok" and rep.get("problem", {}).get("causal"))
        return self._causal_only[chapter]

    # The cost model of one launch of a chapter binary at a paper shape, in seconds, fitted to the
    # launches of the H200 runs of 2026-12-01 (16 host threads; `bench/bench_timing.py` prints them):
    #   SETUP_S     the launch's host set-up: the seeded inputs and the fp64 reference of the sampled
    #               rows (chapter 01 also allocates S and P; chapter 03 re-times chapter 01's pipelines)
    #   ROW_S       host time per reported kernel row, (forward, backward): the uploads, the outputs
    #               copied back, converted and scanned (a backward row brings back dQ, dK and dV). Every
    #               tensor is 16K tokens x 2048 wide at every N, so it does not grow with N. With
    #               HEAP_TUNABLES; glibc's default heap, which maps and zeroes each block above 32 MB
    #               anew, cost chapter 05's launch at 8K causal 30.0 s instead of 17.5
    #   GPU_S       the kernels' own runs (a check, 3 warm-ups, 20 repeats per row): seconds per
    #               forward FLOP summed over the chapter's rows (forward, backward), from the rows' times
    #   the backward's fp64 check: one KV group of 10 N^2 d FLOPs, in fp64 and the same-precision
    #               yardstick, at BWD_CHECK_FLOP_S (4.5 s at N = 8K, d = 128)
    # A round of ./tutorial bench --quick (134.7 s): chapter 05 at 8K, 17 forward and 20
    # backward rows, 15.2 s causal and 17.1 s not (the model: 15.4, 17.0); chapter 04 7.9 and 9.5 s
    # (8.3, 9.9); chapter 01 5.5 s (5.4); chapter 03 at 2K 6.4 s.
    # The next (Q, K, V uploaded once per launch, --step lists): chapter 05 at 8K causal, 18
    # forward and 22 backward rows, 14.9 s (the one after: 14.8 s for 39 rows); chapter 04 7.3 s (7.2 s): a
    # row's host time is its download, conversion and check, not the uploads.
    SETUP_S = {"01": 3.4, "03": 3.3, "04": 1.2, "05": 1.2}
    ROW_S = {"01": (0.06, 0.2), "03": (0.06, 0.2), "04": (0.06, 0.2), "05": (0.12, 0.25)}
    ROW_S_DEFAULT = (0.12, 0.25)
    ROWS = {"01": (2, 0), "03": (1, 1), "04": (9, 2), "05": (18, 22)}  # (forward, backward) rows at d = 128,
    # in the runs GPU_S was fitted to; chapter 05's rows now: its main path (v1-v8, final, final-fp8;
    # b1, b2, b5, b6, b10, b11, final, each in both dQ modes), and with --lab every lab step too (the
    # steps built for one head dim other than 128 report no time there)
    ROWS_NOW = {"05": (10, 14)}
    ROWS_LAB = {"05": (23, 30)}
    GPU_S = {"01": (7.2e-14, 0.0), "03": (1.04e-13, 2.75e-13), "04": (1.02e-13, 2.3e-14), "05": (2.8e-14, 1.55e-13)}
    BWD_CHECK_FLOP_S = 3.8e10
    PEERS_INIT_S = 0.5  # the first peer: PyTorch's CUDA start (the imports, 15-20 s, run in the background)
    # the full sweep starts at N = 512, where our first launches (about 6 s) hide only part of the imports:
    # its first peer call took 17.9 s in the first full sweep
    PEERS_INIT_FULL_S = 12.0

    def row_s(self, c, pss="fwd"):
        return self.ROW_S.get(c, self.ROW_S_DEFAULT)[0 if pss == "fwd" else 1]

    def rows_of(self, c):
        """(forward, backward) rows a launch of chapter c reports at d = 128."""
        if self.lab_for(c) and c in self.ROWS_LAB:
            return self.ROWS_LAB[c]
        return self.ROWS_NOW.get(c) or self.ROWS.get(c, (4, 2))

    def estimate(self, c, n, d, causal, bwd, fl):
        fwd_rows, bwd_rows = self.rows_of(c)
        launches = 1
        if self.a.steps and c in self.bins and "--step" in self.bins[c].flags():
            fwd_rows = len(self.bins[c].steps_of(self.a.steps))
            launches = 1 if self.bins[c].step_list() else fwd_rows
        gf, gb = self.GPU_S.get(c, (1e-13, 1e-13))
        fit_f, fit_b = self.ROWS.get(c, (4, 2))
        est = launches * self.SETUP_S.get(c, 5) + self.row_s(c) * fwd_rows + (self.row_s(c, "bwd") * bwd_rows if bwd else 0)
        est += 24 * fl * (gf * fwd_rows / max(1, fit_f) + (gb * bwd_rows / max(1, fit_b) if bwd else 0.0))
        if bwd:
            est += 2 * 10.0 * n * n * d / self.BWD_CHECK_FLOP_S
        return est

    def attention_group(self, d, n, causal, chapters, peers_fwd=PEERS, peers_bwd=PEERS):
        """Every chapter at one shape, then the peers on it."""
        tasks, bwd_here = [], False
        label = "d=%d N=%d%s" % (d, n, " causal" if causal else "")
        for c in chapters:
            if c not in self.chapters or not self.supports(c, d):
                continue
            bwd = self.has_backward(c) and not getattr(self, "_no_bwd", False)
            fl = attention_flops(*self.shape_bh(n, d), n, n, d, causal)
            # seconds, from the H200 run of 2026-12-01: host-side set-up (inputs, fp64 reference) dominates
            est = self.estimate(c, n, d, causal, bwd, fl)

            if not causal and self.causal_only(c):
                self.rows.append(self.base_row(c, "ch%s (%s)" % (c, self.bins[c].name), "fwd", d, n, False,
                                               status="unsupported", note="the binary's default problem is causal "
                                               "and its command line has no flag to turn that off"))
                continue
            bwd_here = bwd_here or bwd
            tasks.append(Task("ours", "ch%s %s%s" % (c, label, " + lab" if self.lab_for(c) else ""), est,
                              lambda c=c, bwd=bwd: self.ours_task(c, d, n, causal, bwd), rounds=True))
        if not tasks:
            return tasks
        for p in PEERS:
            for bwd in (False, True):
                if p not in self.use_peers or p not in (peers_bwd if bwd else peers_fwd) or (bwd and not bwd_here):
                    continue
                first = p not in self._peer_seen
                self._peer_seen.add(p)
                # measured in two H200 runs: FA4 compiles each (pass, mask, head dim) once, in 2-3 s
                # (a backward 5-7 s, with its fp32 check); FlexAttention every shape, in 1.5-5 s; cuDNN's
                # first backward of a (mask, head dim) and its fp32 check take 1.5-2 s (0.2 s at the next
                # N); the rest of a peer's call is a few tenths of a second
                key = (p, bwd, causal, d)
                new_key = key not in self._peer_keys
                compiles = p == "flex" or (p == "fa4" and new_key)
                self._peer_keys.add(key)
                est = (0.4 if bwd else 0.2) + (1.5 if p == "sdpa_cudnn" and bwd and new_key else 0.0)
                if compiles:
                    est += {"flex": (4.0 if bwd else 2.0), "fa4": (5.5 if bwd else 2.6)}[p] + (1.0 if first else 0)
                if not self._peers_init_counted:
                    est += self.PEERS_INIT_S if (self.a.quick or self.a.n) else self.PEERS_INIT_FULL_S
                    self._peers_init_counted = True
                tasks.append(Task("peer", "%s %s %s" % (p, "bwd" if bwd else "fwd", label), est,
                                  lambda p=p, bwd=bwd: self.peer_task(p, d, n, causal, bwd)))
        # the FP8 peers beside chapter 05's FP8 forward, where chapter 05 runs (forward only): a graph
        # build (about a second, not measured yet) and the FP8 check on sampled rows
        if "05" in chapters and "05" in self.chapters and self.supports("05", d):
            for p in FP8_PEERS:
                if p not in self.use_peers:
                    continue
                est = 0.3 + (1.0 if p not in self._peer_seen else 0.0)
                self._peer_seen.add(p)
                tasks.append(Task("peer", "%s fwd %s" % (p, label), est,
                                  lambda p=p: self.peer_task(p, d, n, causal, False)))
        return tasks

    def plan(self):
        """Tasks in priority order: with --budget, what does not fit is left off the end.
        --quick: d = 128 at N = 8K, causal and not (chapter 03 at 2K), chapter 07's sweep,
        chapter 02's longest rows, chapter 06's masks and GQA; the full sweep: d = 128 at
        N = 512 ... 16K, d = 64 and 256 at 2K and 8K, the backward at 8K, everything else."""
        self._causal_only, self._peer_seen, self._peers_init_counted, self._peer_keys = {}, set(), False, set()
        q = self.a.quick
        self.prune_from = 8192 if q else 4096
        tasks = [Task("ceilings", "ceilings: read bandwidth, bf16 and FP8 GEMM", 1, self.ceilings_task)]
        extras = []
        if "07" in self.chapters:
            extras.append(Task("ours", "ch07 decode sweep + peers", 14, self.decode_task))
            if not q:
                # its launch took 3.9 s on the H200; its bf16 shapes' peers are the bf16
                # sweep's, measured already (alone, with PyTorch's start, the task took 18.8 s)
                extras.append(Task("ours", "ch07 decode sweep of the 8-bit caches", 5,
                                   lambda: self.decode_task("quant")))
        if "02" in self.chapters:
            for sn in ([32768] if q else [4096, 32768]):  # short and long rows (6 s a launch)
                extras.append(Task("ours", "ch02 softmax, rows of %d" % sn, 6, lambda sn=sn: self.softmax_task(sn)))
        ring = []
        if "06" in self.chapters:
            # the full sweep times the masked forward's main path beside its final kernel (v1-v4, final:
            # bench/final_vs_steps.py holds the final to the fastest step of every variant)
            # (with --lab, and a binary built with the lab, its step 5 as well: LAB.md)
            steps = "1,2,3,4,5,final" if self.ch06_mask_lab() else "1,2,3,4,final"
            masks = ["--no-model"] + (["--mask", "causal"] if q else ["--hopper-step", steps])
            # the ring on P = 4 virtual ranks of one GPU (--backend streams): its default backend is
            # CPU threads, which took 132 s at the papers' shape on the H200's host (first full sweep) and
            # reports no GPU row; it runs last, after every shape (a multi-GPU algorithm on one GPU).
            # Its binary times the GPU backends only with --bench (without it the rows are checked, not
            # timed); --bench adds chapter 04's kernel on the whole problem beside it, timed alone
            for sub, extra in (("mask", masks), ("gqa", []), ("mla", []),
                               ("ring", ["--backend", "streams", "--no-decode", "--bench"]))[:2 if q else 4]:
                # the mask part runs every variant (44 s in the first full sweep; 6.0 s for causal alone)
                # unless --quick asks for causal only
                # (the ring on streams: 3.1 s on the H200 when its backward was checked for NaN only;
                # its backward is now checked in fp64 on 3 sampled KV groups, not yet timed here)
                # (the full sweep's mask run now has four more sm90a rows a variant: 80 s, an estimate)
                est = {"mask": 7 if q else 80, "ring": 4}.get(sub, 8)
                (ring if sub == "ring" else extras).append(
                    Task("ours", "ch06 %s" % sub, est, lambda sub=sub, extra=extra:
                         self.ch06_task(sub, 128, 8192, sub != "mask", extra)))
            if not q:  # the masks in the shapes of real models, with FA4 and FlexAttention (bench/ch06_masks.py)
                extras.append(Task("ours", "ch06 model cases %s at N = %s + FA4, Flex" % (
                    ", ".join(self.MODEL_CASES), ", ".join(map(str, self.MODEL_N))), self.MODEL_EST_S,
                    self.ch06_models_task))
                # the structured sparse patterns beside FlexAttention (bench/ch06_masks.py --variants)
                extras.append(Task("ours", "ch06 sparse patterns %s at N = %d + Flex" % (
                    ", ".join(CH06_SPARSE), self.SPARSE_N), self.SPARSE_EST_S, self.ch06_sparse_task))
        self._no_bwd = bool(self.a.no_backward)
        if self.a.n or self.a.d or self.a.mask != "both":
            # the shapes asked for: every chapter that runs them (chapter 03 up to N = 2K, non-causal)
            ns = self.a.n or ([8192] if q else FULL_N)
            ds = self.a.d or [128]
            masks = {"both": (True, False), "causal": (True,), "none": (False,)}[self.a.mask]
            for d in ds:
                for n in ns:
                    for causal in masks:
                        chs = ["05", "04"] + ([] if causal else ["01"]) + \
                              (["03"] if not causal and n <= 2048 else [])
                        tasks += self.attention_group(d, n, causal, chs)
            return tasks + extras
        if q:
            no_flex = [p for p in PEERS if p != "flex"]  # FlexAttention compiles per shape: N = 8K only
            tasks += self.attention_group(128, 8192, True, ("04", "05"))
            tasks += self.attention_group(128, 8192, False, ("05", "04", "01"))
            tasks += extras
            tasks += self.attention_group(128, 2048, False, ("03",), no_flex, no_flex)  # FA1: minutes at 8K
            return tasks
        # d = 128 over every N; d = 64 and 256 at 2K and 8K; the backward, FlexAttention and chapter 01
        # where FULL_BWD, FULL_FLEX and FULL_CH01_N say (below, with what each choice saves).
        shapes = [(128, n, c) for n in FULL_N for c in (True, False)]
        shapes += [(d, n, c) for d in (64, 256) for n in (2048, 8192) for c in (True, False)]
        for i, (d, n, causal) in enumerate(shapes):
            chs = ["04", "05"] + (["01"] if not causal and d == 128 and n in self.FULL_CH01_N else []) + \
                  (["03"] if not causal and d == 128 and n <= 2048 else [])
            self._no_bwd = bool(self.a.no_backward) or (d, n) not in self.FULL_BWD
            peers = PEERS if (d, n) in self.FULL_FLEX else [p for p in PEERS if p != "flex"]
            peers_bwd = PEERS if d == 128 and (d, n) in self.FULL_FLEX else [p for p in PEERS if p != "flex"]
            tasks += self.attention_group(d, n, causal, chs, peers, peers_bwd)
            if (d, n, causal) == (128, 8192, False):  # after the peers at the papers' shape, which they reuse
                tasks += extras
        return tasks + ring

    # The full sweep's choices, where a shape costs more than it teaches:
    # the backward at these (d, N) only: its fp64 check grows as N^2 (23 s a launch at 16K; ask for
    # --n 16384 to have it);
    # the backward rows (20 of chapter 05's 36) and the check are most of a launch, and the peers'
    # backward compiles per shape: at the papers' N = 8K, d = 64 and 128 (2K cost 29 s, 4K 25 s);
    FULL_BWD = {(128, 8192), (64, 8192)}
    # FlexAttention compiles every shape anew (2-5 s a pass): at d = 128, N = 2K and 8K, and at the
    # other head dims at 8K only (forward only there);
    FULL_FLEX = {(128, 2048), (128, 8192), (64, 8192), (256, 8192)}
    # chapter 01 (naive: S and P in HBM, 4 s of set-up a launch) at 2K, 8K and 16K, where its S and P
    # take 17 GB each.
    FULL_CH01_N = {2048, 8192, 16384}

    # ----------------------------------------------------------------- run
    def meta(self, complete):
        if complete or not hasattr(self, "_info"):
            self._info = gpu_info()  # clocks at the start, then as the run ends
        info = self._info
        git = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        cmd = "./tutorial bench" + "".join(" " + x for x in self.a.user_args)
        if self.a.build_dir_given:
            cmd = "BUILD_DIR=%s %s" % (os.path.relpath(self.build_dir, ROOT), cmd)
        m = {"gpu": info["gpu"], "driver": info["driver"], "clocks": info["clocks"],
             "power_limit_w": info.get("power_limit_w"), "memory_mib": info.get("memory_mib"),
             "date": self.started, "command": cmd,
             "git_head": git.stdout.strip() or None, "git_dirty": self._dirty(), "quick": self.a.quick,
             "lab": self.lab, "chapters": sorted(self.chapters),
             "python": sys.version.split()[0], "duration_s": round(time.time() - self.t0, 1), "complete": complete}
        if self.peers is not None:
            m["peer_versions"] = self.peers.versions
            m["peer_compile_s"] = {k: round(v, 1) for k, v in self.peers.compile_s.items()}
            m["peer_import_s"] = round(getattr(self.peers, "import_s", 0.0), 1)
            m["peer_preimport_s"] = getattr(self, "preimport_s", {})
            m["peer_init_s"] = getattr(self.peers, "init_s", {})  # cumulative seconds inside Peers()
            m["peer_calls"] = self.peers.calls
        # where the time went: every binary launch and every task, in seconds
        if os.environ.get("BENCH_COMMIT"):  # the commit the tree was copied from, where .git is not that tree's
            m["commit"] = os.environ["BENCH_COMMIT"]
            m["git_head"], m["git_dirty"] = os.environ["BENCH_COMMIT"], None  # this machine's .git says nothing of it
        m["rounds"] = max(1, self.a.rounds)  # launches of each of ours, the best time kept
        if self.before_dir:
            m["before"] = {"build": self.before_dir, "rounds": max(1, self.a.rounds)}
        if self.lab:
            m["lab_binaries"] = {c: self.bins[c].path for c in self.bins if self.lab_for(c)}
        m["binary_env"] = {"GLIBC_TUNABLES": binary_env().get("GLIBC_TUNABLES")}
        m["launches"] = Binary.launches
        m["tasks"] = self.task_times
        return m

    def _dirty(self):
        """True when the tree differs from git_head (the binaries then are not that commit's)."""
        if not hasattr(self, "_dirty_v"):
            r = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True)
            self._dirty_v = bool(r.stdout.strip()) if r.returncode == 0 else None
        return self._dirty_v

    def peer_status(self):
        allp = PEERS + FP8_PEERS + ["torch_softmax"]
        asked = {p: "not asked for (%s)" % ("--before" if self.a.before else "--peers" if self.a.peers else "--no-peers")
                 for p in allp if p not in self.use_peers}
        if self.peers is None:
            return dict({p: "not run" for p in PEERS + FP8_PEERS}, **asked)
        return dict({p: (self.peers.avail.get(p) or "available") for p in allp}, **asked)

    def save(self, complete):
        os.makedirs(self.out_dir, exist_ok=True)
        res = {"schema": 1, "run": self.meta(complete), "ceilings": self.ceilings, "peers": self.peer_status(),
               "notes": self.notes, "rows": self.rows}
        path = os.path.join(self.out_dir, "results.json")
        with open(path + ".tmp", "w") as f:
            json.dump(res, f, indent=1)
        os.replace(path + ".tmp", path)
        return res

    def only(self, tasks):
        """--only REGEX: the tasks of the plan whose label matches (the ceilings always run: every
        rate is a share of them), in the plan's order and with its estimates, so that a piece of
        the full sweep runs exactly as the sweep runs it."""
        if not self.a.only:
            return tasks
        rx = re.compile(self.a.only)
        return [t for t in tasks if t.kind == "ceilings" or rx.search(t.label)]

    def lab_lines(self):
        """What the plan runs of each chapter that has lab steps: its main path, or its lab too."""
        def shown(path):
            return os.path.relpath(path, ROOT) if os.path.abspath(path).startswith(ROOT + os.sep) else path
        out = []
        for c, name in sorted(lab_chapters().items()):
            if c not in self.bins:
                if self.lab and c in discover_chapters() and (not self.a.chapters or c in self.chapters_asked):
                    out.append("chapter %s: %s is not built (./tutorial bench --lab builds it)" % (
                        c, shown(Binary(self.build_dir, name).path)))
                continue
            if self.lab_for(c) or (c == "06" and self.ch06_mask_lab()):
                out.append("chapter %s: the main path, the final kernels and every lab step (--lab; %s)" % (
                    c, shown(self.bins[c].path)))
            elif self.lab:
                out.append("chapter %s: the main path and the final kernels: %s has no lab steps" % (
                    c, shown(self.bins[c].path)))
            else:
                out.append("chapter %s: the main path and the final kernels (--lab adds the lab's steps)" % c)
        return out

    def print_plan(self):
        """--plan: the tasks in order with the seconds the progress bar would expect (the costs
        measured on the H200, see the constants above `estimate`), and the total by kind."""
        self.bins = {c: b for c, b in self.bins.items() if b.exists()}
        self.chapters = {c: n for c, n in self.chapters.items() if c in self.bins}
        tasks = self.only(self.plan())
        for line in self.lab_lines():
            print(line)
        by = {}
        for t in tasks:
            print("%6.1f s  %s" % (t.est, t.label))
            k = t.label.split()[0] if t.kind != "peer" else "peer " + t.label.split()[0]
            by[k] = by.get(k, 0.0) + t.est
        total = sum(t.est for t in tasks)
        print("total: %d tasks, %.0f s (%d:%02d) on an H200" % (len(tasks), total, total // 60, total % 60))
        for k, v in sorted(by.items(), key=lambda kv: -kv[1]):
            print("  %-22s %6.1f s" % (k, v))
        return 0

    def run(self):
        missing = [b.name for b in self.bins.values() if not b.exists()]
        for m in missing:
            self.notes.append("%s: not built" % m)
        self.bins = {c: b for c, b in self.bins.items() if b.exists()}
        self.chapters = {c: n for c, n in self.chapters.items() if c in self.bins}
        tasks = self.only(self.plan())
        for line in self.lab_lines():
            log("bench: " + line)
        if self.use_peers and any(t.kind == "peer" or "+ peers" in t.label or "softmax" in t.label for t in tasks):
            self.start_preimport()
        for t in tasks:  # every launch of ours --rounds times (with --before, in both builds)
            if t.kind == "ours" and (self.before_bins is not None or t.rounds):
                t.est *= (2 if self.before_bins is not None else 1) * max(1, self.a.rounds)
        total = sum(t.est for t in tasks)
        log("bench: %d tasks, about %d:%02d on an H200%s" % (len(tasks), total // 60, total % 60,
                                                            " (--budget %d s)" % self.a.budget if self.a.budget else ""))
        done_est = 0.0
        bar = Progress(len(tasks), sys.stderr.isatty())
        if self.a.budget:
            Binary.deadline = self.t0 + self.a.budget
        for i, t in enumerate(tasks):
            elapsed = time.time() - self.t0
            rate = elapsed / done_est if done_est > 0 else 1.0
            left = (total - done_est) * rate
            if self.a.budget and elapsed + t.est * rate > self.a.budget:
                self.notes.append("not run (--budget %d s): %s" % (self.a.budget, t.label))
                bar.show(i, t.label + "  [skipped: budget]", left)
                done_est += t.est
                continue
            bar.show(i, t.label, left)
            t0 = time.time()
            try:
                t.fn()
            except Exception as e:  # one shape's trouble is a note, never the end of the run
                self.notes.append("%s: %s: %s" % (t.label, e.__class__.__name__, e))
            self.task_times.append({"task": t.label, "s": round(time.time() - t0, 1), "est_s": round(t.est, 1)})
            if self.a.verbose:
                log("    %.1f s (estimated %.1f)" % (time.time() - t0, t.est))
            done_est += t.est
            self.save(False)
        bar.finish(time.time() - self.t0)
        return self.save(True)


class Progress:
    def __init__(self, n, tty):
        self.n, self.tty = n, tty

    def show(self, i, label, left):
        w = 24
        full = int(w * i / max(1, self.n))
        line = "[%s%s] %3d/%d  %d:%02d left  %s" % ("#" * full, "." * (w - full), i + 1, self.n, left // 60,
                                                   left % 60, label)
        if self.tty:
            sys.stderr.write("\r\033[K" + line[:150])
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def finish(self, secs):
        sys.stderr.write(("\r\033[K" if self.tty else "") + "bench: done in %d:%02d\n" % (secs // 60, secs % 60))


# ============================================================================ outputs

def default_out(build_dir, lab=False):
    """BUILD_DIR/bench, or BUILD_DIR/bench-lab for a --lab run (the main path's results stay)."""
    return os.path.join(build_dir, "bench-lab" if lab else "bench")


def write_outputs(res, out_dir, plots=True, lab=None):
    """results.json/csv/md and the plots; lab: the lab's tables and plots too (default: when the
    run was made with --lab)."""
    paths = bench_report.write_all(res, out_dir, lab)
    if plots:
        paths += draw_plots(os.path.join(out_dir, "results.json"), out_dir, lab)
    return paths


def draw_plots(results_json, out_dir, lab=None):
    """PNG plots with matplotlib: in this interpreter if it has it, else Debian's /usr/bin/python3."""
    try:
        import matplotlib  # noqa: F401
        import bench_plots
        return bench_plots.draw_all(read_json(results_json), out_dir, lab)
    except ImportError:
        pass
    for py in ("/usr/bin/python3",):
        if os.path.exists(py) and os.path.realpath(py) != os.path.realpath(sys.executable):
            r = subprocess.run([py, os.path.join(HERE, "bench_plots.py"), results_json, out_dir] +
                               (["--lab"] if lab else []), capture_output=True, text=True)
            if r.returncode == 0:
                return r.stdout.split()
            log("bench: plots with %s failed: %s" % (py, r.stderr.strip()[-300:]))
    log("bench: no plots: matplotlib is not importable (Debian: apt-get install python3-matplotlib)")
    return []


def int_list(text):
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError("not a comma-separated list of integers: %r" % text)
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError("not a list of positive integers: %r" % text)
    return out


def positive_int(text):
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("not an integer: %r" % text)
    if v < 1:
        raise argparse.ArgumentTypeError("not a positive integer: %r" % text)
    return v


STEP_NAMES = ("final", "final-fp8")


def step_list(text):
    """--steps: step numbers (v prefix allowed) and chapter 05's final kernels by name: "8,final,final-fp8"."""
    out = []
    for x in text.split(","):
        x = x.strip().lower()
        if not x:
            continue
        if x in STEP_NAMES:
            out.append(x)
            continue
        n = x[1:] if x.startswith("v") else x
        if not n.isdigit() or int(n) < 1:
            raise argparse.ArgumentTypeError("not a step: %r (step numbers, or %s)" % (x, ", ".join(STEP_NAMES)))
        out.append(int(n))
    if not out:
        raise argparse.ArgumentTypeError("no step in %r" % text)
    return out


def step_arg(kernel):
    """A kernel row's step as --step takes it: "ch05 v12 ..." -> 12, "ch05 final forward" -> "final",
    "ch05 final fp8 forward" -> "final-fp8"; None for a kernel that is no forward step."""
    t = step_token(kernel)
    if t is None or t.startswith("b"):
        return None
    if t in STEP_NAMES:
        return t
    return int(t[1:]) if t[1:].isdigit() else None


def regex(text):
    try:
        re.compile(text)
    except re.error as e:
        raise argparse.ArgumentTypeError("not a regular expression: %r (%s)" % (text, e))
    return text


PEER_ALIASES = {"cudnn": "sdpa_cudnn", "flash": "sdpa_flash", "fa2": "sdpa_flash", "efficient": "sdpa_efficient",
                "softmax": "torch_softmax", "cudnn-fp8": "cudnn_fp8"}


def peer_list(text):
    out = []
    for x in text.split(","):
        x = x.strip()
        if not x:
            continue
        p = PEER_ALIASES.get(x, x)
        if p not in PEERS + FP8_PEERS + ["torch_softmax"]:
            raise argparse.ArgumentTypeError("no peer %r (peers: fa4, cudnn, flash, efficient, flex, cudnn-fp8, "
                                             "softmax)" % x)
        out.append(p)
    return out


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="./tutorial bench", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--quick", action="store_true",
                    help="d=128 at N=8K, the decode sweep, softmax, masks and GQA, FA1 at 2K: 2:13 on an H200")
    ap.add_argument("--lab", action="store_true",
                    help="chapter 05's lab steps too (forward v9 and up, backward b3, b4, b7-b9, b12-b17), with "
                         "their own tables and plots: the chapters that have lab steps are built with "
                         "-DTUTORIAL_LAB=ON in their own folder, BUILD_DIR-lab (BUILD_DIR itself when its cache "
                         "has TUTORIAL_LAB=ON), the others come from BUILD_DIR; results in BUILD_DIR/bench-lab. "
                         "With --report: the lab's tables and plots of a recorded run")
    ap.add_argument("--chapters", help="comma-separated chapter numbers, e.g. 04,05 (default: every chapter)")
    ap.add_argument("--cpu", action="store_true", help="no GPU: the CPU models' counted traffic, plotted")
    ap.add_argument("--report", metavar="RESULTS_JSON", help="write the tables and plots from this file, run nothing")
    ap.add_argument("--out", help="output folder (default BUILD_DIR/bench; with --lab BUILD_DIR/bench-lab)")
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"), help=argparse.SUPPRESS)
    ap.add_argument("--no-build", action="store_true", help="use the binaries as they are")
    ap.add_argument("--budget", type=float, help="seconds: tasks that would end later are listed as not run")
    ap.add_argument("--n", type=int_list, help="only these sequence lengths, e.g. 2048,8192 (B = 16K / N)")
    ap.add_argument("--d", type=int_list, help="only these head dims, e.g. 64,128 (H = 2048 / d)")
    ap.add_argument("--mask", choices=["both", "causal", "none"], default="both",
                    help="with --n or --d: causal shapes, non-causal ones, or both (default)")
    ap.add_argument("--no-backward", action="store_true", help="forward passes only")
    ap.add_argument("--steps", type=step_list,
                    help="only these forward steps of each chapter whose binary takes --step, e.g. 1,8,final,"
                         "final-fp8 (numbers, and chapter 05's final kernels by name; a lab step, e.g. 11, "
                         "needs a binary built with its lab: --lab) (one launch with the list, the inputs "
                         "uploaded once; the backward, where the plan has it, beside them; one launch a step "
                         "for a binary of an older build)")
    ap.add_argument("--peers", type=peer_list,
                    help="only these peers: fa4, cudnn, flash, efficient, flex, cudnn-fp8 (cuDNN's FP8 forward, "
                         "beside chapter 05's FP8 kernels: bench/peer_cudnn_fp8.py), softmax (default: all)")
    ap.add_argument("--no-peers", action="store_true", help="time our kernels only")
    ap.add_argument("--before", metavar="BUILD_OR_BINARY",
                    help="compare with an older build (its folder, or one binary): every launch of ours runs in "
                         "both, alternating; results.md gets a before/after table; no peers")
    ap.add_argument("--rounds", type=positive_int, default=1,
                    help="runs of each launch of the chapters' binaries (with --before: of each build), odd rounds "
                         "in reverse order; each kernel's best time kept")
    ap.add_argument("--batch", type=int, help="B of every attention shape (default: 16K tokens / N)")
    ap.add_argument("--extra", help="more flags for every chapter binary of the attention shapes, e.g. "
                                    "--extra=--check-all")
    ap.add_argument("--binary", action="append", default=[], metavar="PATH",
                    help="use this chapter binary (e.g. elsewhere/bin/ch05_fa3_hopper) instead of BUILD/bin's")
    ap.add_argument("--repeats", type=int, default=20, help="timed repeats of each peer (median; default 20)")
    ap.add_argument("--timeout", type=int, default=300, help="seconds one chapter binary may run")
    ap.add_argument("--verbose", action="store_true", help="print each task's time")
    ap.add_argument("--no-plots", action="store_true", help="the JSON, CSV and tables only (plot later with --report)")
    ap.add_argument("--plan", action="store_true", help="print the tasks and their estimated seconds, run nothing")
    ap.add_argument("--only", metavar="REGEX", type=regex,
                    help="only the tasks of the plan whose label (as --plan prints it) matches, e.g. "
                         "--only 'ch06 ring|d=256' (the ceilings always run)")
    ap.add_argument("--gpu", action="store_true", help=argparse.SUPPRESS)  # run the GPU plan even without one
    # the model cases' peers replaced by sleeps (ch06_masks.py --fake-peers): the tests, with no GPU
    ap.add_argument("--fake-peers", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    a.build_dir_given = "--build-dir" in argv and os.path.realpath(a.build_dir) != os.path.realpath(
        os.path.join(ROOT, "build"))
    a.user_args = [x for i, x in enumerate(argv) if x != "--build-dir" and (i == 0 or argv[i - 1] != "--build-dir")]
    a.build_dir = os.path.abspath(a.build_dir)
    Binary.paths = {}  # this command line's (main() may run more than once in a process: the tests)
    for path in a.binary:
        if not os.access(path, os.X_OK):
            sys.exit("bench: --binary %s: not an executable" % path)
        Binary.paths[os.path.basename(path)] = os.path.abspath(path)
    out = a.out or default_out(a.build_dir, a.lab and not a.report)

    if a.report:
        res = read_json(a.report)
        for p in write_outputs(res, out, lab=True if a.lab else None):
            print(p)
        return 0
    gpu = has_gpu() or a.gpu or a.plan  # --plan: the GPU plan, even here
    if not a.cpu and not gpu:
        log("bench: no NVIDIA GPU here: plotting the CPU models' traffic instead (./tutorial bench --cpu)")
        a.cpu = True
    chapters = discover_chapters()
    if a.cpu:
        import bench_cpu
        if not a.no_build:
            build(a.build_dir, list(chapters.values()), cuda_option())
        return bench_cpu.main(a.build_dir, os.path.join(out, "cpu"), chapters, quick=a.quick)
    sel = chapters if not a.chapters else {c.zfill(2): chapters.get(c.zfill(2)) for c in a.chapters.split(",")}
    lab_sel, lab_dir = {}, None
    if a.lab:
        # the chapters with lab steps from their own build (BUILD_DIR-lab, or BUILD_DIR when configured
        # with the lab), unless --binary names one; the others from BUILD_DIR
        lab_dir = lab_build_dir(a.build_dir)
        lab_sel = {c: n for c, n in lab_chapters().items() if c in sel and n not in Binary.paths}
        for n in lab_sel.values():
            Binary.paths[n] = os.path.join(lab_dir, "bin", n)
    if not a.no_build and not a.plan:
        main_targets = [n for c, n in sel.items() if n and (c not in lab_sel or lab_dir == a.build_dir)]
        if main_targets:
            build(a.build_dir, main_targets, cuda_option(), lab=True if lab_dir == a.build_dir and lab_sel else None)
        if lab_sel and lab_dir != a.build_dir:
            log("bench: --lab: building %s with its lab steps in %s" % (
                ", ".join(lab_sel.values()), os.path.relpath(lab_dir, ROOT)))
            build(lab_dir, list(lab_sel.values()), cuda_option(), lab=True)
    b = Bench(a)
    if a.plan:
        return b.print_plan()
    res = b.run()
    for p in write_outputs(res, b.out_dir, plots=not a.no_plots):
        print(p)
    fails = [r for r in res["rows"] if r.get("status") == "failed"]
    if fails:
        log("bench: %d kernel(s) failed their check (see results.md)" % len(fails))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
