#!/usr/bin/python3
"""The model example's times: the Llama-like and GPT-2-like models of python/examples/hf_lineage.py
(built from their configs with seeded weights, bf16), prefill and one training step, with
attn_implementation "sdpa" under SDPA's cuDNN backend, "fa4" (FlashAttention-4's
flash_attn.cute.flash_attn_func, where it is importable) and "lineage" (chapter 05's final
forward and backward through attn_lineage), in one run on one GPU.

An unchecked result has no speed: each implementation's prefill logits and training-step
gradients are first judged by the project's rule (attn_lineage.reference.accept), the fp32 SDPA
model the reference and the bf16 SDPA model the yardstick; one that fails is recorded as failed
and not timed.

    python3 bench/hf_models.py --run            on a GPU with torch, transformers and the library
                                                (ATTN_LINEAGE_BUILD): check, time, record
                                                bench/recorded/models/<gpu>-<date>-<HHMM>.json,
                                                then the table
    /usr/bin/python3 bench/hf_models.py --from-record   the table from the newest record
    /usr/bin/python3 bench/hf_models.py --check         the README's table is the newest record's (CI)

The table goes into python/README.md between <!-- hf-models:begin --> and <!-- hf-models:end -->.
Record from a clean committed tree (on a machine that got a copy of it, BENCH_COMMIT names the
commit).
"""
import argparse
import datetime
import glob
import json
import os
import platform
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import bench_common  # noqa: E402
import bench_readme  # noqa: E402
import bench_report  # noqa: E402

README = os.path.join(ROOT, "python", "README.md")
RECORDED = os.path.join(HERE, "recorded", "models")
MARK = re.compile(r"(<!-- hf-models:begin -->\n)(.*?)(<!-- hf-models:end -->)", re.S)
SHAPES = ((2, 500), (4, 2048), (2, 8192))  # (batch, tokens): the example's, and longer prompts
POSITIONS = 8192  # the configs' position tables, long enough for the longest
IMPLS = ("sdpa", "fa4", "lineage")
LABEL = {"sdpa": "SDPA (cuDNN)", "fa4": "FA4", "lineage": "lineage"}
ROUNDS, REPS = 3, 20


def git_state():
    """(commit, dirty), or BENCH_COMMIT's commit and None where the tree is a copy."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"], None
    return bench_common.git_state(ROOT)


def fa4_attention():
    """transformers' attention-function signature around FA4's flash_attn_func, or None."""
    try:
        from flash_attn.cute import flash_attn_func
    except Exception:
        return None

    def forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kw):
        q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # [B, N, H, d]
        o = flash_attn_func(q, k, v, softmax_scale=scaling, causal=True)
        return (o[0] if isinstance(o, tuple) else o), None
    return forward


def run():
    """Checks and times every implementation on every model and shape; returns the record."""
    head, dirty = git_state()
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ")
    sys.path.insert(0, os.path.join(ROOT, "python", "examples"))
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import torch
    import transformers
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from transformers import AttentionInterface
    import attn_lineage.hf as hf
    from attn_lineage.reference import accept
    import hf_lineage as ex  # the example's configs, build(), step() and timed()

    hf.register()
    example_configs = dict(ex.CONFIGS)

    def longer(kind):  # the example's config with POSITIONS positions
        c = example_configs[kind]()
        for attr in ("max_position_embeddings", "n_positions"):
            if hasattr(c, attr):
                setattr(c, attr, POSITIONS)
        return c
    ex.CONFIGS = {k: (lambda k=k: longer(k)) for k in example_configs}
    fa4 = fa4_attention()
    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    impls = [i for i in IMPLS if i != "fa4" or fa4 is not None]
    if fa4 is not None:
        AttentionInterface.register("fa4", fa4)
        try:
            from transformers import AttentionMaskInterface
            AttentionMaskInterface.register("fa4", hf.lineage_mask)  # causal by a flag: no mask built
        except ImportError:
            pass
        try:
            import importlib.metadata as md
            versions["fa4"] = md.version("flash-attn-4")
        except Exception:
            versions["fa4"] = "flash_attn.cute"

    rows = []
    for kind in ex.CONFIGS:
        ref = ex.build(kind, "sdpa", torch.float32)
        models = {i: ex.build(kind, i, torch.bfloat16) for i in impls}
        for batch, n in SHAPES:
            torch.manual_seed(1)
            ids = torch.randint(0, 2048, (batch, n), device="cuda")
            lr, _, gr = ex.step(ref, ids)
            outs, errors = {}, {}
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                for i in impls:
                    try:
                        outs[i] = ex.step(models[i], ids)
                    except Exception as e:  # an implementation that cannot run this shape: a row that says so
                        if i == "sdpa":
                            raise  # the yardstick itself
                        errors[i] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")
            ls, _, gs = outs["sdpa"]
            checked = {}
            for i in impls:
                if i in errors:
                    checked[i] = False
                    rows.append({"model": kind, "impl": i, "batch": batch, "n": n, "error": errors[i],
                                 "prefill_pass": False, "grad_pass": False, "why": errors[i],
                                 "prefill_ms": [], "train_ms": []})
                    continue
                li, loss_i, gi = outs[i]
                p_ok, p_margin, p_why = accept(li, lr, ls, torch.bfloat16, "row")
                verdicts = {nm: accept(gi[nm], gr[nm], gs[nm], torch.bfloat16, "tensor") for nm in gr}
                worst = max(verdicts, key=lambda nm: verdicts[nm][1])
                g_ok = all(v[0] for v in verdicts.values())
                checked[i] = p_ok and g_ok
                rows.append({"model": kind, "impl": i, "batch": batch, "n": n, "loss": loss_i,
                             "prefill_pass": p_ok, "prefill_margin": round(p_margin, 3),
                             "grad_pass": g_ok, "grad_margin": round(verdicts[worst][1], 3), "grad_worst": worst,
                             "why": "" if p_ok and g_ok else (p_why if not p_ok else verdicts[worst][2]),
                             "prefill_ms": [], "train_ms": []})
            del outs
            mine = rows[-len(impls):]
            for _ in range(ROUNDS):  # the implementations in turn, ROUNDS times; the median is kept
                for r in mine:
                    if not checked[r["impl"]]:
                        continue
                    m = models[r["impl"]]
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        with torch.no_grad():
                            r["prefill_ms"].append(ex.timed(lambda: m(ids), REPS))
                        m.zero_grad(set_to_none=True)
                        r["train_ms"].append(ex.timed(lambda: m(ids, labels=ids).loss.backward(), REPS))
            for r in mine:
                for key in ("prefill_ms", "train_ms"):
                    v = sorted(r[key])
                    r[key] = round(v[len(v) // 2], 4) if v else None
                print("%s B=%d N=%d %-8s prefill %s ms, training step %s ms, checked: %s" % (
                    kind, batch, n, r["impl"], r["prefill_ms"], r["train_ms"],
                    "pass" if checked[r["impl"]] else "FAIL " + r["why"]), flush=True)
        del ref, models
        torch.cuda.empty_cache()
    return {"run": {"gpu": torch.cuda.get_device_name(), "date": date,
                    "command": "python3 bench/hf_models.py --run", "git_head": head, "git_dirty": dirty,
                    "commit": head if os.environ.get("BENCH_COMMIT") else None,
                    "python": platform.python_version(), "versions": versions,
                    "reps": REPS, "rounds": ROUNDS, "positions": POSITIONS},
            "rows": rows}


def record_name(rec):
    """bench/recorded/models/<gpu>-<date>-<HHMM>.json, named as the attention runs are."""
    return os.path.join(RECORDED, bench_readme.run_name(rec))


def newest_record():
    runs = sorted(glob.glob(os.path.join(RECORDED, "*.json")), key=bench_readme.run_time)
    return runs[-1] if runs else None


def table(rec, path):
    r = rec["run"]
    commit = bench_report.commit_text({k: v for k, v in r.items() if v is not None})
    vers = ", ".join("%s %s" % kv for kv in sorted(r.get("versions", {}).items()))
    rel = os.path.relpath(path, os.path.dirname(README))
    out = ["<!-- generated by bench/hf_models.py from %s -->" % os.path.relpath(path, ROOT),
           "Measured on one %s on %s by `%s`, %s; %s; the median of %d rounds, each the mean of %d calls; generated "
           "from [%s](%s) by `bench/hf_models.py` (never typed by hand). Milliseconds, bf16, the whole model "
           "(4 layers, d = 64, positions up to %d; Llama with 8 query and 2 KV heads); a training step is the forward with "
           "the loss and the backward." % (
               r.get("gpu"), (r.get("date") or "?")[:10], r.get("command"),
               "at " + commit if commit else "commit not recorded", vers, r.get("rounds"), r.get("reps"),
               os.path.relpath(path, ROOT), rel, r.get("positions", 2048)), ""]
    impls = [i for i in IMPLS if any(x["impl"] == i for x in rec["rows"])]
    out.append("| model | B x N | " + " | ".join("%s prefill" % LABEL[i] for i in impls) + " | " +
               " | ".join("%s training step" % LABEL[i] for i in impls) + " | lineage / cuDNN (prefill, step) |")
    out.append("|---|---|" + "---:|" * (2 * len(impls)) + "---|")
    groups = {}
    for x in rec["rows"]:
        groups.setdefault((x["model"], x["batch"], x["n"]), {})[x["impl"]] = x

    def cell(x, key):
        if x is None:
            return "-"
        if x.get("error"):
            return "did not run"
        if not (x["prefill_pass"] and x["grad_pass"]):
            return "failed the check"
        return "%.2f" % x[key]

    def ratio(g, key):
        a, b = g.get("lineage"), g.get("sdpa")
        if not a or not b or a[key] is None or b[key] is None:
            return "-"
        return "%.2fx" % (b[key] / a[key])
    for (model, b, n), g in groups.items():
        out.append("| %s | %d x %d | %s | %s | %s, %s |" % (
            model, b, n, " | ".join(cell(g.get(i), "prefill_ms") for i in impls),
            " | ".join(cell(g.get(i), "train_ms") for i in impls), ratio(g, "prefill_ms"), ratio(g, "train_ms")))
    out.append("")
    out.append("lineage / cuDNN: SDPA's time over the lineage's (above 1: the lineage is faster). Every "
               "timed implementation passed the check of its prefill logits and gradients first.")
    errors = ["%s %s, %d x %d: %s" % (LABEL[x["impl"]], x["model"], x["batch"], x["n"], x["error"])
              for x in rec["rows"] if x.get("error")]
    if errors:
        out.append("")
        out.append("Did not run: " + "; ".join(errors) + ".")
    return "\n".join(out) + "\n"


def replace_section(text, body):
    if not MARK.search(text):
        raise SystemExit("python/README.md has no <!-- hf-models:begin --> ... <!-- hf-models:end --> markers")
    return MARK.sub(lambda m: m.group(1) + body + m.group(3), text, count=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--run", action="store_true", help="check, time and record (GPU)")
    g.add_argument("--from-record", action="store_true", help="the table from the newest record")
    g.add_argument("--check", action="store_true", help="the README's table is the newest record's")
    ap.add_argument("--out", help="--run: write the record here instead of bench/recorded/models/")
    a = ap.parse_args()
    if a.run:
        rec = run()
        path = a.out or record_name(rec)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(rec, f, indent=1)
            f.write("\n")
        print("recorded", path)
        print(table(rec, path))
        return 0
    path = newest_record()
    with open(README) as f:
        old = f.read()
    if path is None:
        body = "Not measured yet: no record in bench/recorded/models/.\n"
    else:
        with open(path) as f:
            body = table(json.load(f), path)
    new = replace_section(old, body)
    if a.check:
        if new != old:
            print("python/README.md: the model table is not the newest record's; run /usr/bin/python3 "
                  "bench/hf_models.py --from-record", file=sys.stderr)
            return 1
        return 0
    if new != old:
        with open(README, "w") as f:
            f.write(new)
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
