"""What the bench scripts share: the shapes, the FLOP convention, and the row schema.

A *row* is one kernel on one shape in one pass, ours or a peer's:

    {"chapter": "04", "kernel": "ch04 v6 final", "kind": "ours" | "peer",
     "pass": "fwd" | "bwd" | "softmax" | "decode",
     "d": 128, "N": 8192, "nk": 8192, "B": 2, "H": 16, "Hkv": 16, "causal": false,
     "dtype": "bf16", "status": "ok" | "failed" | "unsupported" | "error" | "not run",
     "time_ms", "tflops", "gbps", "flops", "bytes", "unit": "TFLOP/s" | "GB/s",
     "ceiling": "bf16_gemm" | "fp8_gemm" | "read", "share", "vs": {peer: ratio},
     "max_abs_err", "note", "page_size", "config"}

Only a row whose status is "ok" carries a speed: `clean_row()` drops the speed of
every other row, wherever it came from, so a failed kernel cannot show one.
"""

import json

TOKENS = 16384  # B * N, the FlashAttention papers' benchmark
HIDDEN = 2048   # H * d

PEERS = ["fa4", "sdpa_cudnn", "sdpa_flash", "sdpa_efficient", "flex"]
DECODE_PEERS = ["fa4", "sdpa_cudnn", "sdpa_flash"]
SOFTMAX_PEERS = ["torch_softmax"]
PEER_LABEL = {
    "fa4": "FA4",
    "sdpa_cudnn": "cuDNN",
    "sdpa_flash": "FA2 (SDPA flash)",
    "sdpa_efficient": "SDPA efficient",
    "flex": "FlexAttention",
    "torch_softmax": "torch.softmax",
}
SPEED_FIELDS = ("time_ms", "tflops", "gbps", "share", "vs")


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
