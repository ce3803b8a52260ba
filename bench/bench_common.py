"""What the bench scripts share: the shapes, the FLOP convention, and the row schema.

A *row* is one kernel on one shape in one pass, ours or a peer's:

    {"chapter": "04", "kernel": "ch04 v6 final", "kind": "ours" | "peer",
     "pass": "fwd" | "bwd" | "softmax" | "decode",
     "d": 128, "N": 8192, "nk": 8192, "B": 2, "H": 16, "Hkv": 16, "causal": false,
     "dtype": "bf16", "status": "ok" | "failed" | "unsupported" | "error" | "not run",
     "time_ms", "tflops", "gbps", "flops", "bytes", "unit": "TFLOP/s" | "GB/s",
     "ceiling": "bf16_gemm" | "fp8_gemm" | "read", "share", "vs": {peer: ratio},
     "max_abs_err", "note", "page_size", "config",
     "prep_ms", "time_with_prep_ms", "tflops_with_prep"}   (an FP8 kernel of ours: its preparation pass)

Only a row whose status is "ok" carries a speed: `clean_row()` drops the speed of
every other row, wherever it came from, so a failed kernel cannot show one.
"""

import json
import re

TOKENS = 16384  # B * N, the FlashAttention papers' benchmark
HIDDEN = 2048   # H * d

PEERS = ["fa4", "sdpa_cudnn", "sdpa_flash", "sdpa_efficient", "flex"]
# The FP8 peers: compared with chapter 05's FP8 kernels only (their own table, ch05-fp8), on the
# forward shapes chapter 05 runs; the bf16 tables, plots and the lineage leave them out
FP8_PEERS = ["cudnn_fp8"]
DECODE_PEERS = ["fa4", "sdpa_cudnn", "sdpa_flash"]
SOFTMAX_PEERS = ["torch_softmax"]
PEER_LABEL = {
    "fa4": "FA4",
    "sdpa_cudnn": "cuDNN",
    "sdpa_flash": "FA2 (SDPA flash)",
    "sdpa_efficient": "SDPA efficient",
    "flex": "FlexAttention",
    "cudnn_fp8": "cuDNN FP8",
    "torch_softmax": "torch.softmax",
}
# Chapter 06's named model cases (`ch06_variants mask --model NAME`, bench/ch06_masks.py --models):
# their rows carry the case's name as their variant, and have a table of their own (ch06-models)
CH06_MODEL_CASES = ["gpt-oss", "gemma2", "mistral", "packed-docs"]
# Chapter 06's structured sparse patterns beside FlexAttention (bench/ch06_masks.py --variants): their
# rows carry the pattern as their variant and table = CH06_SPARSE_TABLE, the table of their own
CH06_SPARSE = ["strided", "fixed", "longformer", "bigbird"]
CH06_SPARSE_TABLE = "ch06-sparse"
SPEED_FIELDS = ("time_ms", "tflops", "gbps", "share", "vs", "prep_ms", "time_with_prep_ms", "tflops_with_prep")

# The main path of a chapter that keeps a lab beside it (chapter 05: steps/ and its final kernels,
# against steps/lab/ and LAB.md): the steps its binary runs without --lab, by pass. Every other step
# of the chapter ("v9".."v29", "b3", "b4", ...) is a lab step: the default tables and plots leave it
# out, the lab's own tables (`--lab`) and the ch05-lab section show it. A lab step may change a final
# kernel (v30 changes final.cu): its parent is then "final".
MAIN_PATH = {
    "04": {"fwd": ["v1", "v2", "v3", "v4", "v5", "v6", "final"]},  # chapter 04: v7-v9 are its lab
    "05": {"fwd": ["v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8", "final", "final-fp8"],
           "bwd": ["b1", "b2", "b5", "b6", "b10", "b11", "final"]},
    # chapter 06: the masked forward's main path (rows "ch06 mask sm90a forward, step K", step_token "vK"),
    # its lab step v5 (--hopper-step 5, built with TUTORIAL_LAB) and its final kernel
    "06": {"fwd": ["v1", "v2", "v3", "v4", "final"]},
    # chapter 07: the decode steps of the main path (bf16 and the 8-bit cache); v8, v10 and v13 are its lab
    "07": {"decode": ["v1", "v2", "v3", "v4", "v5", "v6", "v7", "v9", "v12", "v14", "final"]},
}
# The kernel that stands for a chapter in the lineage when a run has it (else its fastest kernel).
# (Chapter 06's final kernels are the rows "ch06 mask final sm90a forward" and "... final backward".)
FINAL_KERNEL = {"04": "ch04 final forward", "05": "ch05 final forward", "06": "ch06 mask final sm90a forward",
                "07": "ch07 final-bf16 paged"}
# Each lab step's parent, as the step files' headers say ("What changes from vN", "(from vN)"): used
# where the headers cannot be read (bench_report.step_parents reads them; bench/test_bench.py checks
# that the two agree). A step whose file is gone keeps its entry for the recorded runs that timed it:
# v32 (final_fp8's causal rows on v6's grid) became final_fp8's own rows.
LAB_PARENTS = {
    "04": {"v7": "v6", "v8": "v7", "v9": "v8"},
    "05": {"v9": "v8", "v10": "v8", "v11": "v10", "v12": "v9", "v13": "v11", "v14": "v13", "v15": "v12",
           "v16": "v11", "v17": "v11", "v18": "v17", "v19": "v18", "v20": "v17", "v21": "v18", "v22": "v14",
           "v23": "v21", "v24": "v23", "v25": "v14", "v26": "v15", "v27": "v15", "v28": "v25", "v29": "v26",
           "v30": "final", "v31": "v30", "v32": "final-fp8",
           "b3": "b2", "b4": "b3", "b7": "b6", "b8": "b6", "b9": "b8", "b12": "b11", "b13": "b11", "b14": "b13",
           "b15": "b13", "b16": "final", "b17": "b16"},
    "06": {"v5": "v4"},  # masks/steps/lab/v5_epilogue_in_place.cu (step_parents reads steps/ of a chapter's root)
    "07": {"v8": "v7", "v10": "v9", "v13": "v10"},
}


def step_token(kernel):
    """The step a kernel row is: "ch05 v12 fp8 softmax ..." -> "v12", "ch05 b3 backward, ..." -> "b3",
    "ch05 final forward" -> "final", "ch05 final fp8 forward" -> "final-fp8", "ch05 final backward[,
    deterministic dQ]" -> "final" (its pass tells the two finals apart); None for any other kernel."""
    m = re.match(r"ch\d\d ([vb]\d+[a-z]?)\b", kernel or "")
    if m:
        return m.group(1)
    m = re.match(r"ch\d\d final( fp8)? (forward|backward)\b", kernel or "")
    if m:
        return "final-fp8" if m.group(1) else "final"
    if re.match(r"ch07 final-(bf16|8bit)\b", kernel or ""):
        return "final"  # chapter 07's final decode kernels; the row's KV format tells the two apart
    if re.match(r"ch06 mask final (sm90a forward|backward)\b", kernel or ""):
        return "final"  # chapter 06's final masked forward and backward (the row's variant is its mask)
    m = re.match(r"ch06 mask sm90a forward, step ([1-9])$", kernel or "")
    if m:
        return "v" + m.group(1)  # the masked forward's steps (--hopper-step 1,2,3,4,final; the lab's 5)
    return None


def is_lab_row(row):
    """True for a row of ours that is a lab step of a chapter with a main path (MAIN_PATH)."""
    main = MAIN_PATH.get(row.get("chapter"))
    if not main or row.get("kind") != "ours" or row.get("pass") not in main:
        return False
    t = step_token(row.get("kernel"))
    return t is not None and t not in main[row["pass"]]


def attention_flops(b, h, nq, nk, d, causal, backward=False):
    """FlashAttention's count: 4 B H Nq Nk d, causal square problems halved, backward 2.5x."""
    f = 4.0 * b * h * nq * nk * d
    if causal:
        if nq == nk:
            f *= 0.5
        else:  # bottom-right aligned: query i sees keys j <= i + (nk - nq)
            kept = sum(max(0, min(nk, i + (nk - nq) + 1)) for i in range(nq))
            f = 4.0 * b * h * kept * d
    return f * (2.5 if backward else 1.0)


def paper_shape(n, d):
    """B and H of the papers' shapes: B * N = 16K tokens, H * d = 2048."""
    return max(1, TOKENS // n), max(1, HIDDEN // d)


def shape_key(row):
    """Rows that compare with each other: same pass, shape and mask."""
    return (row.get("pass"), row.get("d"), row.get("N"), row.get("nk"), row.get("B"), row.get("H"),
            row.get("Hkv"), bool(row.get("causal")), row.get("page_size"), row.get("variant"))


def speed(row):
    """The row's rate in its unit, or None (only rows that passed have one)."""
    if row.get("status") != "ok":
        return None
    return row.get("tflops") if row.get("unit") == "TFLOP/s" else row.get("gbps")


def clean_row(row):
    """The speed fields of a row that did not pass are removed (never shown, never plotted)."""
    if row.get("status") != "ok":
        for f in SPEED_FIELDS:
            row.pop(f, None)
    return row


def shape_text(row):
    if row.get("pass") == "decode":
        return "B=%s L=%s Hq/Hkv=%s/%s P=%s" % (row["B"], row["nk"], row["H"], row["Hkv"], row.get("page_size"))
    if row.get("pass") == "softmax":
        return "rows=%s N=%s" % (row["B"] * row["H"] * row["nq"] if "nq" in row else "?", row["N"])
    return "d=%s N=%s B=%s H=%s%s" % (row["d"], row["N"], row["B"], row["H"], " causal" if row.get("causal") else "")


def read_json(path):
    with open(path) as f:
        return json.load(f)


def fp8_prep(row):
    """(prep_ms, time_with_prep_ms, tflops_with_prep) of an FP8 row of ours that passed: from its fields,
    else from its note ("... preparation pass of 0.123 ms (...); with it: 1.234 ms, 567 TFLOP/s", the
    chapter 05 binary's wording, which runs recorded before the fields carry); None where neither has it."""
    if row.get("status") != "ok":
        return None
    if row.get("prep_ms") is not None and row.get("time_ms"):
        t = row["time_ms"] + row["prep_ms"]
        fl = row.get("flops")
        return row["prep_ms"], t, (fl / (t * 1e-3) / 1e12 if fl else None)
    m = re.search(r"preparation pass of ([0-9.]+) ms.*?with it: ([0-9.]+) ms, ([0-9.eE+]+) TFLOP/s", row.get("note") or "")
    if not m:
        return None
    return float(m.group(1)), float(m.group(2)), float(m.group(3))


def cpu_name():
    """The CPU's model name (/proc/cpuinfo), for a record computed on the CPU."""
    import platform
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def git_state(root):
    """(full commit, dirty) of the tree at root: dirty is True when tracked files differ from the
    commit, None if unknown."""
    import subprocess
    head = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True)
    st = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                        capture_output=True, text=True)
    commit = head.stdout.strip() if head.returncode == 0 else ""
    return commit or None, (bool(st.stdout.strip()) if st.returncode == 0 else None)
