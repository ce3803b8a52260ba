#!/usr/bin/env python3
"""Tests of the report and plot generator on a small results file (bench/testdata).

    /usr/bin/python3 bench/test_bench.py        (CI runs it; plots need python3-matplotlib)

The fixture holds made-up numbers that exercise the rules: a kernel that failed its check
but still carries a speed in the file, a kernel that was not checked, an absent peer, a peer
with no kernel for a shape, and a kernel slower than its peer.
"""
import copy
import csv
import io
import json
import os
import re
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_common  # noqa: E402
import bench_report  # noqa: E402
import lineage  # noqa: E402
from bench_common import read_json  # noqa: E402

FIXTURE = os.path.join(HERE, "testdata", "small_results.json")


def load():
    return read_json(FIXTURE)


def table_rows(md, name, which=0):
    """(head, body) of the section's table number `which` (0: its first)."""
    body = bench_report.extract_section(md, name)
    assert body is not None, "no section %s" % name
    tables, last = [], False
    for l in body.splitlines():
        if l.startswith("|"):
            if not last:
                tables.append([])
            tables[-1].append(l)
        last = l.startswith("|")
    lines = tables[which]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    return head, [[c.strip() for c in l.strip("|").split("|")] for l in lines[2:]]


class FailedKernels(unittest.TestCase):
    def test_failed_kernel_has_no_speed_anywhere(self):
        res = load()
        md = bench_report.markdown(res)
        self.assertNotIn("988", md)  # the failed v5's 987.6 TFLOP/s in the file
        self.assertNotIn("9999", md)  # the failed decode kernel's GB/s
        head, body = table_rows(md, "ch04-fwd")
        col = head.index("v5 exp2 + causal skip")
        row = [r for r in body if r[1] == "8192"][0]
        self.assertEqual(row[col], "FAIL")
        # the same kernel at N = 2048 passed and keeps its number
        row2k = [r for r in body if r[1] == "2048"][0]
        self.assertEqual(row2k[col], "280 (35%)")

    def test_failed_kernel_is_not_the_best(self):
        res = load()
        md = bench_report.markdown(res)
        head, body = table_rows(md, "lineage")
        ch04 = [r for r in body if r[0] == "04"][0]
        self.assertIn("v6 final: 320", ch04[head.index("best kernel")])
        self.assertIn("v5 exp2 + causal skip", ch04[head.index("failed its check")])
        # the best-over-peer ratio uses v6 (320 / 680), not the failed 987.6
        row = [r for r in table_rows(md, "ch04-fwd")[1] if r[1] == "8192"][0]
        self.assertEqual(row[-2], "%.2fx" % (320 / 680))

    def test_unchecked_kernel_has_no_speed(self):
        md = bench_report.markdown(load())
        head, body = table_rows(md, "ch05-fwd")
        self.assertEqual(body[0][head.index("v7 fp8 e4m3 (kernel alone)")], "unchecked")
        self.assertNotIn("735", md)

    def test_csv_has_no_speed_for_failed_rows(self):
        rows = list(csv.DictReader(io.StringIO(bench_report.csv_text(load()))))
        failed = [r for r in rows if r["status"] == "failed"]
        self.assertEqual(len(failed), 2)
        for r in failed:
            self.assertEqual((r["value"], r["tflops"], r["gbps"], r["share"]), ("", "", "", ""))
        v6 = [r for r in rows if r["kernel"] == "ch04 v6 final" and r["N"] == "8192"][0]
        self.assertAlmostEqual(float(v6["share"]), 320 / 800, places=4)
        self.assertAlmostEqual(float(v6["vs_sdpa_flash"]), 320 / 350, places=3)
        self.assertEqual(v6["vs_fa4"], "")
        self.assertEqual(v6["gpu"], "Fixture GPU (not a measurement)")
        self.assertEqual(v6["command"], "./tutorial bench --quick")

    def test_clean_row_drops_speed_of_any_status_but_ok(self):
        for st in ("failed", "unsupported", "not run", "error", "unchecked", None):
            r = bench_common.clean_row({"status": st, "tflops": 1.0, "gbps": 2.0, "time_ms": 3.0, "share": 0.5,
                                        "vs": {"x": 1}})
            self.assertFalse(set(r) & set(bench_common.SPEED_FIELDS), st)
            self.assertIsNone(bench_common.speed(dict(r, unit="TFLOP/s")))


class AbsentPeers(unittest.TestCase):
    def test_absent_peer_is_a_column_that_says_so(self):
        md = bench_report.markdown(load())
        head, body = table_rows(md, "ch04-fwd")
        for r in body:
            self.assertEqual(r[head.index("FA4")], "absent")
            self.assertEqual(r[head.index("best / FA4")], "absent")
        self.assertRegex(md, r"FA4: absent \(flash-attn-4 not importable")

    def test_peer_without_a_kernel_is_not_absent(self):
        md = bench_report.markdown(load())
        head, body = table_rows(md, "ch04-fwd")
        row = [r for r in body if r[1] == "8192"][0]
        self.assertEqual(row[head.index("FlexAttention")], "n/a")
        row2k = [r for r in body if r[1] == "2048"][0]
        self.assertEqual(row2k[head.index("cuDNN")], "not run")  # present in the run, not measured at 2K

    def test_peer_that_disappears_turns_its_column_absent(self):
        res = load()
        res["peers"]["sdpa_cudnn"] = "PyTorch not importable (ModuleNotFoundError)"
        md = bench_report.markdown(res)
        head, body = table_rows(md, "ch04-fwd")
        self.assertTrue(all(r[head.index("cuDNN")] == "absent" for r in body))
        head, body = table_rows(md, "ch07-decode")
        self.assertEqual(body[0][head.index("chosen / cuDNN")], "absent")


class Ratios(unittest.TestCase):
    def test_regression_stays_visible(self):
        """A kernel slower than its peer shows a ratio below 1, as measured."""
        md = bench_report.markdown(load())
        head, body = table_rows(md, "ch04-bwd")
        self.assertEqual(body[0][head.index("backward, dQ atomics")], "230 (29%)")
        self.assertEqual(body[0][head.index("best / FA2 (SDPA flash)")], "%.2fx" % (230 / 290))
        res = load()
        worse = copy.deepcopy(res)
        for r in worse["rows"]:
            if r["kernel"] == "ch04 v6 final" and r["N"] == 8192:
                r["tflops"] = 200.0
        head, body = table_rows(bench_report.markdown(worse), "lineage")
        self.assertIn("v6 final: 200", [r for r in body if r[0] == "04"][0][2])

    def test_decode_table(self):
        md = bench_report.markdown(load())
        head, body = table_rows(md, "ch07-decode")
        self.assertEqual(body[0][head.index("v1 paged")], "FAIL")
        self.assertEqual(body[0][head.index("chosen / cuDNN")], "%.2fx" % (3500 / 3100))
        self.assertEqual(body[0][head.index("FA4")], "absent")

    def test_run_line_names_gpu_date_command(self):
        md = bench_report.markdown(load())
        self.assertIn("Fixture GPU (not a measurement)", md)
        self.assertIn("2026-01-01T00:00Z", md)
        self.assertIn("`./tutorial bench --quick`", md)


class Plots(unittest.TestCase):
    def setUp(self):
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            if os.environ.get("CI_REQUIRE_PLOTS"):
                raise
            self.skipTest("matplotlib is not importable")

    def test_plots_are_written_and_failed_kernels_have_no_point(self):
        import bench_plots
        res = load()
        rows = bench_report.enrich(res)
        f = lambda r: r.get("pass") == "fwd"  # noqa: E731
        self.assertEqual(bench_plots.points(rows, "ch04 v5 exp2 + causal skip", f), [(2048, 280.0)])
        self.assertEqual(bench_plots.points(rows, "fa4", f), [])
        with tempfile.TemporaryDirectory() as d:
            paths = bench_plots.draw_all(res, d)
            names = sorted(os.path.basename(p) for p in paths)
            for want in ("lineage.png", "roofline.png", "decode_gbps.png", "tflops_ch04_fwd.png",
                         "tflops_ch04_bwd.png", "tflops_lineage_fwd.png", "tflops_ch05_fwd.png"):
                self.assertIn(want, names)
            for p in paths:
                with open(p, "rb") as fh:
                    self.assertEqual(fh.read(8), b"\x89PNG\r\n\x1a\n")
                self.assertGreater(os.path.getsize(p), 10000)


    def test_variant_shapes_get_their_own_panels(self):
        """Chapter 06's variants and GQA groups at one N: one bar panel each, never one bar for two."""
        import bench_plots
        res = load()
        base = {"chapter": "06", "kind": "ours", "pass": "fwd", "d": 128, "N": 8192, "nk": 8192, "B": 2, "H": 16,
                "dtype": "bf16", "unit": "TFLOP/s", "ceiling": "bf16_gemm", "status": "ok"}
        res["rows"] += [dict(base, kernel="ch06 mask sm90a", Hkv=16, causal=False, variant="window", tflops=400.0),
                        dict(base, kernel="ch06 mask sm90a", Hkv=16, causal=True, tflops=500.0),
                        dict(base, kernel="ch06 gqa packed", Hkv=4, causal=True, tflops=550.0)]
        rows = bench_report.enrich(res)
        with tempfile.TemporaryDirectory() as d:
            import matplotlib.pyplot as plt
            made = []
            real = plt.subplots

            def spy(*a, **k):
                fig, axes = real(*a, **k)
                made.append(axes)
                return fig, axes
            bench_plots.plt.subplots = spy
            try:
                path = bench_plots.fig_chapter(res, rows, "06", "fwd", d)
            finally:
                bench_plots.plt.subplots = real
            self.assertTrue(path and os.path.exists(path))
            titles = [ax.get_title() for ax in made[0].flat if ax.get_title()]
            self.assertEqual(len(titles), 3, titles)
            self.assertTrue(any("window" in t for t in titles))
            self.assertTrue(any("16/4" in t for t in titles))

    def test_no_panel_draws_more_than_eight_lines(self):
        """Every plot of the fixture, of the recorded run (lab or not) and of a run with many kernels:
        at most bench_plots.MAX_LINES (8) lines (kernels and peers) in any panel."""
        import bench_plots
        from matplotlib.figure import Figure
        self.assertEqual(bench_plots.MAX_LINES, 8)
        runs = [("fixture", load(), None)]
        rec = [os.path.join(HERE, "recorded", f) for f in sorted(os.listdir(os.path.join(HERE, "recorded")))
               if f.endswith(".json")]
        if rec:
            runs += [("recorded", read_json(rec[-1]), None), ("recorded --lab", read_json(rec[-1]), True)]
        many = load()  # 14 steps, 2 finals, every peer, at three N: a chapter with more lines than a panel holds
        ks = [("ch05 v%d step" % i, 200.0 + 20 * i) for i in range(1, 15)] + [("ch05 final forward", 700.0),
                                                                             ("ch05 final fp8 forward", 900.0)]
        many["rows"] += ch05_rows(ks, ns=(2048, 4096, 8192))
        for p in bench_common.PEERS:
            many["rows"] += [dict(r, chapter="peer", kind="peer", kernel=p, tflops=500.0)
                             for r in ch05_rows([("ch05 v1 step", 1.0)], ns=(2048, 4096, 8192))]
        many["peers"] = {p: "available" for p in bench_common.PEERS}
        runs.append(("many", many, True))
        seen = []
        real = Figure.savefig

        def spy(fig, *a, **k):
            for ax in fig.axes:
                seen.append((name, os.path.basename(str(a[0])), ax.get_title(), len(bench_plots.drawn_lines(ax))))
            return real(fig, *a, **k)
        Figure.savefig = spy
        try:
            for name, res, lab in runs:
                with tempfile.TemporaryDirectory() as d:
                    err = io.StringIO()
                    import contextlib
                    with contextlib.redirect_stderr(err):
                        paths = bench_plots.draw_all(res, d, lab)
                    self.assertNotIn("failed:", err.getvalue(), name)
                    self.assertTrue(paths, name)
        finally:
            Figure.savefig = real
        too_many = [x for x in seen if x[3] > 8]
        self.assertEqual(too_many, [])
        self.assertTrue([x for x in seen if x[0] == "many" and x[1] == "tflops_ch05_fwd.png" and x[3] == 8], seen)
        # the lab's own plot, and a figure that would break the rule is refused
        self.assertTrue([x for x in seen if x[0] == "recorded --lab" and x[1] == "tflops_ch05_lab_fwd.png"] or not rec)
        fig, ax = bench_plots.plt.subplots()
        for i in range(9):
            ax.plot([0, 1], [i, i], label="line %d" % i)
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaises(ValueError):
                bench_plots.save(fig, os.path.join(d, "x.png"))

    def test_line_groups(self):
        import bench_plots
        steps = ["v%d" % i for i in range(1, 9)]
        g = bench_plots.line_groups(steps + ["final", "final-fp8"], list("abcde"), finals=["final", "final-fp8"])
        self.assertEqual(g, [(steps, []), (["v8", "final", "final-fp8"], list("abcde"))])
        g = bench_plots.line_groups(["v%d" % i for i in range(1, 16)], list("abc"))
        self.assertTrue(all(len(k) + len(p) <= 8 for k, p in g))
        self.assertEqual([k for ks, _ in g for k in ks], ["v%d" % i for i in range(1, 16)])
        self.assertEqual(bench_plots.line_groups(["v1", "v2"], ["a"]), [(["v1", "v2"], ["a"])])

    def test_plots_of_a_run_where_nothing_passed(self):
        import bench_plots
        res = load()
        for r in res["rows"]:
            r["status"] = "failed"
        with tempfile.TemporaryDirectory() as d:
            import contextlib
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                paths = bench_plots.draw_all(res, d)
            self.assertNotIn("failed:", err.getvalue())  # no figure raised
            # no kernel passed: no speed plot, only the lineage picture that says "failed"
            self.assertEqual([os.path.basename(p) for p in paths], ["lineage.png"])
        md = bench_report.markdown(res)
        self.assertIn("no kernel passed", md)


class Runner(unittest.TestCase):
    def test_chapter_report_rows(self):
        """A chapter's --json report becomes rows; failed and unsupported rows carry no speed."""
        rep = {"problem": {"batch": 2, "heads": 16, "kv_heads": 16, "nq": 8192, "nk": 8192, "d": 128,
                           "causal": True, "dtype": "bf16"},
               "results": [
                   {"impl": "FA2 model", "device": "cpu", "pass": True},
                   {"impl": "v5 exp2", "device": "cuda", "pass": False, "tflops": 500.0, "time_ms": 1.0,
                    "hbm_read_bytes": 1.0, "hbm_write_bytes": 2.0},
                   {"impl": "v6 final", "device": "cuda", "pass": True, "tflops": 300.0, "time_ms": 2.0,
                    "hbm_read_bytes": 1.0, "hbm_write_bytes": 2.0, "flops": 6e11, "max_abs_err": 1e-3},
                   {"impl": "v1 loop swap", "device": "cuda", "pass": None, "tflops": None,
                    "note": "not built for d=256"},
                   {"impl": "v2 timed only", "device": "cuda", "pass": None, "tflops": None, "time_ms": None,
                    "ran_unchecked": True},
                   {"impl": "v3 no error figure", "device": "cuda", "pass": True, "tflops": 400.0, "time_ms": 1.5},
                   {"impl": "backward, dQ atomics", "device": "cuda", "pass": True, "tflops": 200.0, "time_ms": 3.0,
                    "max_abs_err": 2e-3},
                   {"impl": "ch01 cuBLAS (fwd)", "device": "cuda", "pass": True, "tflops": 50.0, "time_ms": 9.0}]}
        rows = lineage.report_rows(rep, "04", {"d": 128, "N": 8192, "causal": True})
        by = {r["kernel"]: r for r in rows}
        self.assertEqual(set(by), {"ch04 v5 exp2", "ch04 v6 final", "ch04 v1 loop swap", "ch04 v2 timed only",
                                   "ch04 v3 no error figure", "ch04 backward, dQ atomics"})
        self.assertEqual(by["ch04 v3 no error figure"]["status"], "unchecked")  # "pass" without an error figure
        self.assertNotIn("tflops", by["ch04 v3 no error figure"])
        self.assertEqual(by["ch04 v5 exp2"]["status"], "failed")
        self.assertNotIn("tflops", by["ch04 v5 exp2"])
        self.assertEqual(by["ch04 v6 final"]["status"], "ok")
        self.assertEqual(by["ch04 v6 final"]["bytes"], 3.0)
        self.assertEqual(by["ch04 v1 loop swap"]["status"], "unsupported")
        self.assertEqual(by["ch04 v2 timed only"]["status"], "unchecked")  # run, never compared: no speed
        self.assertNotIn("tflops", by["ch04 v2 timed only"])
        self.assertEqual(by["ch04 backward, dQ atomics"]["pass"], "bwd")
        self.assertTrue(all(r["causal"] and r["N"] == 8192 for r in rows))

    def test_backward_rows_are_found_by_name_field_or_flops(self):
        """Chapter 05's backward steps (b1, b2, ...) and any row the report marks as backward are
        the backward pass; forward steps are not, whatever they are called."""
        prob = {"batch": 2, "heads": 16, "nq": 8192, "nk": 8192, "d": 128, "causal": False}
        fwd = bench_common.attention_flops(2, 16, 8192, 8192, 128, False)
        yes = [{"impl": "b1 wgmma backward"}, {"impl": "b2 warp specialised"}, {"impl": "backward, dQ atomics"},
               {"impl": "bwd deterministic"}, {"impl": "whatever", "direction": "bwd"},
               {"impl": "new kernel", "flops": 2.5 * fwd}]
        no = [{"impl": "v10 tile sizes", "flops": fwd}, {"impl": "v9 fp8 e4m3"}, {"impl": "FA1 kernel (chapter 03)"},
              {"impl": "v2 mma.sync", "pass": True}]
        for r in yes:
            self.assertTrue(lineage.is_backward(r, prob), r)
        for r in no:
            self.assertFalse(lineage.is_backward(r, prob), r)

    def test_8bit_decode_caches_are_their_own_rows(self):
        """A decode shape measured with an FP8 cache is a variant of the bf16 shape: its own row in the
        table (KV column), no peer next to it, and not the lineage's reference."""
        res = load()
        extra = []
        for r in res["rows"]:
            if r.get("pass") == "decode" and r.get("kind") == "ours":
                q = copy.deepcopy(r)
                q.update(variant="KV fp8", dtype="fp8", status="ok", gbps=1234.0, time_ms=1.0)
                extra.append(q)
        res["rows"] += extra
        md = bench_report.markdown(res)
        head, body = table_rows(md, "ch07-decode")
        self.assertIn("KV", head)
        fp8 = [r for r in body if r[head.index("KV")] == "fp8"]
        self.assertTrue(fp8)
        for r in fp8:
            self.assertEqual(r[head.index("cuDNN")], "-")
        self.assertNotIn("1234", table_rows(md, "lineage")[1][-1][2])

    def test_flops_convention(self):
        self.assertEqual(bench_common.attention_flops(2, 16, 8192, 8192, 128, False), 4.0 * 2 * 16 * 8192 ** 2 * 128)
        self.assertEqual(bench_common.attention_flops(2, 16, 8192, 8192, 128, True),
                         2.0 * 2 * 16 * 8192 ** 2 * 128)
        self.assertEqual(bench_common.attention_flops(1, 1, 4, 4, 1, False, backward=True), 2.5 * 64)
        # bottom-right causal with Nq < Nk: query i sees i + (Nk - Nq) + 1 keys
        self.assertEqual(bench_common.attention_flops(1, 1, 2, 4, 1, True), 4.0 * (3 + 4))
        self.assertEqual(bench_common.paper_shape(8192, 128), (2, 16))

    def test_report_mode_writes_everything(self):
        with tempfile.TemporaryDirectory() as d:
            rc = lineage.main(["--report", FIXTURE, "--out", d])
            self.assertEqual(rc, 0)
            for f in ("results.json", "results.csv", "results.md"):
                self.assertTrue(os.path.exists(os.path.join(d, f)), f)
            self.assertEqual(read_json(os.path.join(d, "results.json")), load())


FAKE = os.path.join(HERE, "testdata", "fake_ch05.py")


class Modes(unittest.TestCase):
    """./tutorial bench --steps, --before, --no-peers on a stand-in chapter binary (testdata/fake_ch05.py)."""

    def build(self, root, name, slow=1.0, fail=None, step_list=False, main_path=False, lab=False, v1=300):
        """A build folder whose bin/ch05_fa3_hopper is testdata/fake_ch05.py: main_path, the binary of
        a chapter with a main path and a lab (its --help lists --lab and "(v1-v8, final, final-fp8;
        with --lab also the lab's v9-v29 ...)"); lab, built with its lab (else --lab exits 2)."""
        os.makedirs(os.path.join(root, name, "bin"))
        path = os.path.join(root, name, "bin", "ch05_fa3_hopper")
        with open(path, "w") as f:
            f.write("#!/bin/sh\nFAKE_SLOW=%s FAKE_FAIL=%s FAKE_LIST=%s FAKE_MAIN=%s FAKE_LAB=%s FAKE_V1=%s "
                    "exec %s %s \"$@\"\n" % (slow, fail or "", "1" if step_list else "", "1" if main_path else "",
                                             "1" if lab else "", v1, sys.executable, FAKE))
        os.chmod(path, 0o755)
        return os.path.join(root, name)

    def run_bench(self, args, log):
        os.environ["FAKE_LOG"] = log
        try:
            err = io.StringIO()
            old, sys.stderr = sys.stderr, err
            try:
                lineage.main(args + ["--gpu", "--no-build", "--no-plots", "--chapters", "05"])
            finally:
                sys.stderr = old
        finally:
            del os.environ["FAKE_LOG"]
        return [l for l in open(log).read().splitlines() if "--device cuda" in l and "--bench" not in l]

    def test_steps_run_one_launch_each_and_only_those_steps(self):
        with tempfile.TemporaryDirectory() as d:
            new = self.build(d, "new")
            out = os.path.join(d, "out")
            launches = self.run_bench(["--build-dir", new, "--out", out, "--n", "2048", "--d", "128", "--mask",
                                       "causal", "--steps", "8,10", "--no-peers"], os.path.join(d, "log"))
            self.assertEqual(len(launches), 2, launches)
            self.assertIn("--step 8 --no-backward", launches[0])
            self.assertIn("--step 10 --backward-step all", launches[1])  # the backward beside the last step
            res = read_json(os.path.join(out, "results.json"))
            ks = sorted({r["kernel"] for r in res["rows"] if r["kind"] == "ours"})
            self.assertEqual(ks, ["ch05 b9 backward", "ch05 v10 step 10", "ch05 v8 step 8"])
            self.assertEqual(res["peers"]["fa4"], "not asked for (--no-peers)")
            self.assertIn("absent", bench_report.extract_section(open(os.path.join(out, "results.md")).read(),
                                                                 "ch05-fwd"))

    def test_a_binary_whose_step_takes_a_list_runs_every_step_in_one_launch(self):
        with tempfile.TemporaryDirectory() as d:
            new = self.build(d, "new", step_list=True)
            out = os.path.join(d, "out")
            launches = self.run_bench(["--build-dir", new, "--out", out, "--n", "2048", "--d", "128", "--mask",
                                       "causal", "--steps", "8,10", "--no-peers"], os.path.join(d, "log"))
            self.assertEqual(len(launches), 1, launches)
            self.assertIn("--step 8,10 --backward-step all", launches[0])
            res = read_json(os.path.join(out, "results.json"))
            ks = sorted({r["kernel"] for r in res["rows"] if r["kind"] == "ours"})
            self.assertEqual(ks, ["ch05 b9 backward", "ch05 v10 step 10", "ch05 v8 step 8"])

    def test_split_step_list_for_a_binary_of_one_step_a_launch(self):
        one = lineage.Binary.at("/nonexistent/ch04_fa2")
        one._flags, one._step_list = {"--step", "--no-backward"}, False
        many = lineage.Binary.at("/nonexistent/ch04_fa2")
        many._flags, many._step_list = {"--step", "--no-backward"}, True
        a = ["--n", "8192", "--step", "6,9", "--json"]
        self.assertEqual(lineage.split_step_list(many, a), [a])
        self.assertEqual(lineage.split_step_list(one, a), [["--n", "8192", "--step", "6", "--json", "--no-backward"],
                                                           ["--n", "8192", "--step", "9", "--json"]])
        b = a + ["--no-backward"]
        self.assertEqual(lineage.split_step_list(one, b), [["--n", "8192", "--step", "6", "--json", "--no-backward"],
                                                           ["--n", "8192", "--step", "9", "--json", "--no-backward"]])

    def test_binaries_get_the_heap_tunables_unless_the_caller_set_them(self):
        with tempfile.TemporaryDirectory() as d:
            new = self.build(d, "new")
            args = ["--build-dir", new, "--out", os.path.join(d, "o"), "--n", "2048", "--d", "128", "--mask",
                    "causal", "--steps", "8", "--no-peers", "--no-backward"]
            self.assertIn("GLIBC_TUNABLES=" + lineage.HEAP_TUNABLES, self.run_bench(args, os.path.join(d, "l1"))[0])
            os.environ["GLIBC_TUNABLES"] = ""
            try:
                self.assertTrue(self.run_bench(args, os.path.join(d, "l2"))[0].endswith("GLIBC_TUNABLES="))
            finally:
                del os.environ["GLIBC_TUNABLES"]

    def test_before_alternates_builds_keeps_the_best_and_a_failure(self):
        with tempfile.TemporaryDirectory() as d:
            new = self.build(d, "new")
            old = self.build(d, "old", slow=1.25, fail="1")
            out = os.path.join(d, "out")
            launches = self.run_bench(["--build-dir", new, "--out", out, "--n", "8192", "--d", "128", "--mask",
                                       "causal", "--no-backward", "--before", old, "--rounds", "2"],
                                      os.path.join(d, "log"))
            self.assertEqual(len(launches), 4)  # two builds, two rounds
            res = read_json(os.path.join(out, "results.json"))
            self.assertFalse([r for r in res["rows"] if r["kind"] == "peer"])  # no peers with --before
            head, body = table_rows(open(os.path.join(out, "results.md")).read(), "before-after")
            by = {r[head.index("kernel")]: r for r in body}
            self.assertEqual(by["ch05 v8 step 8"][head.index("after / before")], "1.25x")
            self.assertEqual(by["ch05 v8 step 8"][head.index("after")], "600")
            self.assertEqual(by["ch05 v1 step 1"][head.index("before")], "FAIL")  # failed in the old build
            self.assertEqual(by["ch05 v1 step 1"][head.index("after / before")], "-")
            # the before rows never enter the chapter's own table or the lineage
            self.assertNotIn("before:", bench_report.extract_section(open(os.path.join(out, "results.md")).read(),
                                                                     "ch05-fwd"))


    def test_rounds_repeat_each_launch_in_alternating_order_one_row_a_kernel(self):
        with tempfile.TemporaryDirectory() as d:
            new = self.build(d, "new")
            out = os.path.join(d, "out")
            launches = self.run_bench(["--build-dir", new, "--out", out, "--n", "8192", "--d", "128", "--mask",
                                       "causal", "--steps", "1,8", "--no-peers", "--no-backward", "--rounds", "3"],
                                      os.path.join(d, "log"))
            one = self.run_bench(["--build-dir", new, "--out", os.path.join(d, "o1"), "--n", "8192", "--d", "128",
                                  "--mask", "causal", "--steps", "1,8", "--no-peers", "--no-backward"],
                                 os.path.join(d, "log1"))
            self.assertEqual(len(one), 2)  # this binary takes one step a launch
            self.assertEqual(len(launches), 3 * len(one))
            self.assertEqual(launches[2:4], launches[0:2][::-1])  # the second round the other way round
            self.assertEqual(launches[4:6], launches[0:2])
            res = read_json(os.path.join(out, "results.json"))
            self.assertEqual(res["run"]["rounds"], 3)
            ours = [(r["kernel"], r["pass"]) for r in res["rows"] if r["kind"] == "ours" and r.get("chapter") == "05"]
            self.assertEqual(len(ours), len(set(ours)))  # one row a kernel, whatever the rounds
            self.assertTrue(ours)

    def test_rounds_must_be_positive(self):
        err = io.StringIO()
        old, sys.stderr = sys.stderr, err
        try:
            with self.assertRaises(SystemExit) as e:
                lineage.main(["--plan", "--rounds", "0"])
        finally:
            sys.stderr = old
        self.assertEqual(e.exception.code, 2)
        self.assertIn("not a positive integer", err.getvalue())

    def test_only_runs_the_matching_tasks_of_the_plan_and_the_ceilings(self):
        with tempfile.TemporaryDirectory() as d:
            new = self.build(d, "new")
            out = io.StringIO()
            old, sys.stdout = sys.stdout, out
            try:
                lineage.main(["--build-dir", new, "--plan", "--gpu", "--chapters", "05", "--only", "ch05 d=128 N=8192"])
            finally:
                sys.stdout = old
            labels = [l.split("s  ", 1)[1] for l in out.getvalue().splitlines() if re.match(r"\s*[0-9.]+ s  ", l)]
            self.assertEqual(labels[0], "ceilings: read bandwidth, bf16 and FP8 GEMM")
            self.assertEqual(sorted(labels[1:]), ["ch05 d=128 N=8192", "ch05 d=128 N=8192 causal"])
            # the same tasks run, with the full plan's arguments (the backward at 8K)
            launches = self.run_bench(["--build-dir", new, "--out", os.path.join(d, "o"), "--no-peers", "--only",
                                       "ch05 d=128 N=8192 causal"], os.path.join(d, "log"))
            self.assertEqual(len(launches), 1, launches)
            self.assertIn("--n 8192", launches[0])
            self.assertIn("--causal", launches[0])
            self.assertNotIn("--no-backward", launches[0])

    def test_a_subcommands_options_are_read_from_its_own_help(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "ch07_paged_radix")
            with open(path, "w") as f:  # as chapter 07: the top-level help lists the subcommands only
                f.write("#!/bin/sh\nif [ \"$1\" = decode ]; then echo '  --sweep  --sweep-shapes X'; "
                        "else echo 'usage: ch07_paged_radix [paged | decode | radix] [options]'; fi\n")
            os.chmod(path, 0o755)
            b = lineage.Binary.at(path)
            self.assertNotIn("--sweep-shapes", b.flags())
            self.assertIn("--sweep-shapes", b.sub_flags("decode"))
            self.assertNotIn("--sweep-shapes", b.sub_flags("radix"))


class MainPathAndLab(unittest.TestCase):
    """Chapter 05's main path and lab in ./tutorial bench: --lab, the step names, the pruning."""

    build = Modes.build
    run_bench = Modes.run_bench

    def kernels(self, out):
        res = read_json(os.path.join(out, "results.json"))
        return res, sorted({r["kernel"] for r in res["rows"] if r["kind"] == "ours" and r.get("status") == "ok"})

    def test_step_help_of_the_new_and_the_old_binaries(self):
        new = lineage.step_help("  --step K[,K]     run these forward steps, e.g. 1,8,final (v1-v8, final, final-fp8; "
                                "with --lab also the lab's v9-v29; inputs uploaded once for all), or all [all]\n")
        self.assertEqual(new, (set(range(1, 9)), {"final", "final-fp8"}, set(range(9, 30))))
        old = lineage.step_help("  --step K[,K]     run these steps' kernels, e.g. 11,18 (1-29; inputs uploaded once "
                                "for all), or all that support the problem [all]\n")
        self.assertEqual(old, (set(range(1, 30)), set(), set()))
        self.assertIsNone(lineage.step_help("usage: x [--step K[,K]] [--json]"))
        b = lineage.Binary.at("/nonexistent/ch05_fa3_hopper")
        b._flags, b._step_list, b._step_help, b._has_lab = {"--step", "--lab"}, True, new, False
        self.assertEqual(b.steps_of([1, 8, "final", "final-fp8", 11, 30]), [1, 8, "final", "final-fp8"])
        self.assertEqual(b.lab_steps([1, 11, "final"]), [11])
        b._has_lab = True
        self.assertEqual(b.steps_of([8, 11, "final"]), [8, 11, "final"])
        b._step_help = old  # an older build: numbers only, no names
        self.assertEqual(b.steps_of([8, 11, "final"]), [8, 11])
        self.assertEqual(lineage.step_list("1,v8,final,final-fp8"), [1, 8, "final", "final-fp8"])
        self.assertEqual([lineage.step_arg(k) for k in ("ch05 v12 fp8 softmax", "ch05 final forward",
                                                        "ch05 final fp8 forward", "ch05 b11 backward", "ch04 v6 x")],
                         [12, "final", "final-fp8", None, 6])

    def test_without_lab_the_main_path_runs_and_names_prune(self):
        with tempfile.TemporaryDirectory() as d:
            new = self.build(d, "build", main_path=True, lab=True, v1=100)  # v1 4x slower than the best
            out = os.path.join(d, "out")
            launches = self.run_bench(["--build-dir", new, "--out", out, "--n", "2048,4096", "--d", "128", "--mask",
                                       "causal", "--no-peers"], os.path.join(d, "log"))
            self.assertEqual(len(launches), 2, launches)
            self.assertFalse([l for l in launches if "--lab" in l.split()])
            # N = 4096: v1 not timed again; the kept steps by number and by name, the backward beside them
            self.assertIn("--step 8,final,final-fp8 --backward-step all", launches[1])
            res, ks = self.kernels(out)
            self.assertEqual(ks, ["ch05 b11 backward", "ch05 final backward", "ch05 final forward",
                                  "ch05 final fp8 forward", "ch05 v1 step 1", "ch05 v8 step 8"])
            self.assertFalse(res["run"]["lab"])
            v1 = [r for r in res["rows"] if r["kernel"] == "ch05 v1 step 1" and r["N"] == 4096]
            self.assertEqual(v1[0]["status"], "not run")

    def test_lab_runs_the_lab_build_with_lab(self):
        with tempfile.TemporaryDirectory() as d:
            main = self.build(d, "build", main_path=True, lab=False)
            self.build(d, "build-lab", main_path=True, lab=True)
            launches = self.run_bench(["--build-dir", main, "--n", "2048", "--d", "128", "--mask", "causal",
                                       "--no-peers", "--lab"], os.path.join(d, "log"))
            self.assertEqual(len(launches), 1, launches)
            self.assertIn("--lab", launches[0].split())
            out = os.path.join(main, "bench-lab")  # a --lab run's results beside the main path's
            res, ks = self.kernels(out)
            self.assertTrue(res["run"]["lab"])
            self.assertEqual(res["run"]["lab_binaries"]["05"], os.path.join(d, "build-lab", "bin", "ch05_fa3_hopper"))
            self.assertIn("ch05 v10 step 10", ks)
            self.assertIn("ch05 b13 backward", ks)
            md = open(os.path.join(out, "results.md")).read()
            head, _ = table_rows(md, "ch05-fwd")  # the main path's table keeps the lab out
            self.assertNotIn("v10 step 10", head)
            self.assertIn("final forward", head)
            self.assertIn("v10 step 10", table_rows(md, "ch05-lab-fwd")[0])
            self.assertIn("v10 step 10", table_rows(md, "ch05-lab")[1][0][1])
            # the plan says so, and labels the chapter's tasks
            buf = io.StringIO()
            old, sys.stdout = sys.stdout, buf
            try:
                lineage.main(["--build-dir", main, "--plan", "--gpu", "--chapters", "05", "--lab", "--n", "2048",
                              "--d", "128", "--mask", "causal", "--no-peers"])
            finally:
                sys.stdout = old
            self.assertIn("every lab step", buf.getvalue())
            self.assertIn("ch05 d=128 N=2048 causal + lab", buf.getvalue())

    def test_lab_steps_without_a_lab_build_are_a_note(self):
        with tempfile.TemporaryDirectory() as d:
            main = self.build(d, "build", main_path=True, lab=False)
            out = os.path.join(d, "out")
            launches = self.run_bench(["--build-dir", main, "--out", out, "--n", "2048", "--d", "128", "--mask",
                                       "causal", "--no-peers", "--steps", "8,final,10"], os.path.join(d, "log"))
            self.assertEqual(len(launches), 1, launches)
            self.assertIn("--step 8,final --backward-step all", launches[0])
            res, ks = self.kernels(out)
            self.assertIn("ch05 final forward", ks)
            self.assertTrue([n for n in res["notes"] if n.startswith("--steps 10: lab steps")], res["notes"])
            # --lab with a binary built without its lab: the main path, and a note
            self.build(d, "build-lab", main_path=True, lab=False)
            launches = self.run_bench(["--build-dir", main, "--out", out, "--n", "2048", "--d", "128", "--mask",
                                       "causal", "--no-peers", "--lab"], os.path.join(d, "log2"))
            self.assertEqual(len(launches), 1, launches)
            self.assertNotIn("--lab", launches[0].split())
            res, ks = self.kernels(out)
            self.assertNotIn("ch05 v10 step 10", ks)
            self.assertTrue([n for n in res["notes"] if "built without its lab steps" in n], res["notes"])


def ch05_rows(kernels, lab_steps=(), ns=(2048, 8192)):
    """Chapter 05 rows at d = 128 for each (kernel, TFLOP/s): the time follows from the speed."""
    rows = []
    for n in ns:
        b, h = bench_common.paper_shape(n, 128)
        fl = bench_common.attention_flops(b, h, n, n, 128, False)
        for k, v in kernels:
            bwd = " b" in k[4:6] or "backward" in k
            f = fl * (2.5 if bwd else 1.0)
            rows.append({"chapter": "05", "kernel": k, "kind": "ours", "pass": "bwd" if bwd else "fwd", "d": 128,
                         "N": n, "nk": n, "B": b, "H": h, "Hkv": h, "causal": False,
                         "dtype": "fp8" if "fp8" in k else "bf16", "unit": "TFLOP/s", "ceiling": "bf16_gemm",
                         "status": "ok", "flops": f, "tflops": v * (1.0 + (n == 8192) * 0.1),
                         "time_ms": f / (v * (1.0 + (n == 8192) * 0.1) * 1e12) * 1e3})
    return rows


class MainPathReport(unittest.TestCase):
    """Chapter 05's tables and plots: the main path and the final kernels by default, the lab when asked."""

    KERNELS = [("ch05 v1 TMA", 300.0), ("ch05 v8 every head dim", 600.0), ("ch05 final forward", 650.0),
               ("ch05 final fp8 forward", 900.0), ("ch05 v10 key blocks", 700.0), ("ch05 v11 two pipes", 630.0),
               ("ch05 b11 backward, longest walks first", 400.0),
               ("ch05 b11 backward, longest walks first, deterministic dQ", 380.0),
               ("ch05 b13 backward, 80 queries a step", 440.0),
               ("ch05 b13 backward, 80 queries a step, deterministic dQ", 361.0)]

    def res(self, with_final=True):
        res = load()
        ks = [k for k in self.KERNELS if with_final or "final" not in k[0]]
        res["rows"] = [r for r in res["rows"] if r["chapter"] != "05"] + ch05_rows(ks)
        return res

    def test_lab_rows_are_classified_by_the_main_path(self):
        lab = [k for k, _ in self.KERNELS if bench_common.is_lab_row({"chapter": "05", "kind": "ours", "kernel": k,
                                                                        "pass": "bwd" if " b1" in k else "fwd"})]
        self.assertEqual(lab, ["ch05 v10 key blocks", "ch05 v11 two pipes", "ch05 b13 backward, 80 queries a step",
                               "ch05 b13 backward, 80 queries a step, deterministic dQ"])
        # chapter 04's main path is v1-v6 and its final kernel; v7-v9 are its lab
        self.assertTrue(bench_common.is_lab_row({"chapter": "04", "kind": "ours", "kernel": "ch04 v9 x", "pass": "fwd"}))
        for k in ("ch04 v6 x", "ch04 final forward"):
            self.assertFalse(bench_common.is_lab_row({"chapter": "04", "kind": "ours", "kernel": k, "pass": "fwd"}))
        self.assertFalse(bench_common.is_lab_row({"chapter": "03", "kind": "ours", "kernel": "ch03 v9 x", "pass": "fwd"}))

    def test_default_tables_show_the_main_path_and_the_finals(self):
        md = bench_report.markdown(self.res())
        head, _ = table_rows(md, "ch05-fwd")
        self.assertIn("final forward", head)
        self.assertIn("final fp8 forward (kernel alone)", head)
        self.assertIn("v8 every head dim", head)
        self.assertNotIn("v10 key blocks", head)
        self.assertNotIn("v11 two pipes", head)
        self.assertNotIn("b13 backward, 80 queries a step", table_rows(md, "ch05-bwd")[0])
        self.assertIsNone(bench_report.extract_section(md, "ch05-lab-fwd"))  # the lab's own tables: when asked
        md = bench_report.markdown(self.res(), lab=True)
        self.assertIn("v10 key blocks", table_rows(md, "ch05-lab-fwd")[0])
        self.assertNotIn("v8 every head dim", table_rows(md, "ch05-lab-fwd")[0])
        res = self.res()
        res["run"]["lab"] = True  # a --lab run asks for them itself
        self.assertIsNotNone(bench_report.extract_section(bench_report.markdown(res), "ch05-lab-bwd"))

    def test_lineage_takes_the_final_kernel_else_the_fastest(self):
        head, body = table_rows(bench_report.markdown(self.res()), "lineage")
        ch05 = [r for r in body if r[0] == "05"][0]
        self.assertTrue(ch05[head.index("best kernel")].startswith("final forward: 715"), ch05)  # not v10's 770
        self.assertEqual(ch05[head.index("picked as")], "its final kernel")
        head, body = table_rows(bench_report.markdown(self.res(with_final=False)), "lineage")
        ch05 = [r for r in body if r[0] == "05"][0]
        self.assertTrue(ch05[head.index("best kernel")].startswith("v10 key blocks: 770"), ch05)
        self.assertEqual(ch05[head.index("picked as")], "fastest that passed")
        self.assertEqual([r for r in body if r[0] == "04"][0][head.index("picked as")], "fastest that passed")

    def test_lab_ratio_table(self):
        rows = bench_report.enrich(self.res())
        parents = {"v10": "v8", "v11": "v10", "b13": "b11"}
        es = {e["kernel"]: e for e in bench_report.lab_ratio_entries(rows, "05", parents)}
        self.assertEqual(list(es), ["ch05 v10 key blocks", "ch05 v11 two pipes", "ch05 b13 backward, 80 queries a step",
                                    "ch05 b13 backward, 80 queries a step, deterministic dQ"])
        e = es["ch05 v10 key blocks"]
        self.assertEqual(e["parent"], "ch05 v8 every head dim")
        self.assertEqual(len(e["ratios"]), 2)  # both shapes
        for x in e["ratios"]:
            self.assertAlmostEqual(x, 600.0 / 700.0)  # time over the parent's time: the inverse of the speeds
        # a deterministic row against its parent's deterministic row
        self.assertEqual(es["ch05 b13 backward, 80 queries a step, deterministic dQ"]["parent"],
                         "ch05 b11 backward, longest walks first, deterministic dQ")
        self.assertAlmostEqual(es["ch05 b13 backward, 80 queries a step, deterministic dQ"]["ratios"][0], 380 / 361)
        # min / median / max over the shapes both passed, and how many
        rows = [r for r in rows if not (r["kernel"] == "ch05 v8 every head dim" and r["N"] == 8192)]
        rows += [dict(r, N=4096, time_ms=r["time_ms"] * f) for r, f in
                 ((r, f) for r in rows if r["N"] == 2048 and r["kernel"] in ("ch05 v10 key blocks",)
                  for f in (1.2,))]
        rows += [dict(r, N=4096) for r in rows if r["N"] == 2048 and r["kernel"] == "ch05 v8 every head dim"]
        t = bench_report.lab_ratio_table(rows, "05", dict(parents, v11="v99"))
        lines = {l.split("|")[2].strip(): [c.strip() for c in l.strip("|").split("|")] for l in t.splitlines()[2:]}
        v10 = lines["v10 key blocks"]
        self.assertEqual(v10[2:], ["v8", "2", "%.2fx" % (600 / 700), "%.2fx" % (1.1 * 600 / 700),
                                   "%.2fx" % (1.2 * 600 / 700)])
        self.assertEqual(lines["v11 two pipes"][2:], ["v99 (not in this run)", "0", "-", "-", "-"])

    def test_lab_parents_fallback_agrees_with_the_step_headers(self):
        read = bench_report.step_parents("05")
        for step, parent in bench_common.LAB_PARENTS["05"].items():
            self.assertEqual(read.get(step), parent, step)

    def test_main_path_matches_the_lab_folder(self):
        """Once the lab's steps live in steps/lab/, MAIN_PATH's steps are the files left in steps/."""
        steps = os.path.join(os.path.dirname(HERE), "chapters", "05_fa3_hopper", "steps")
        if not os.path.isdir(os.path.join(steps, "lab")):
            self.skipTest("no steps/lab/ yet")
        main = {re.match(r"([vb]\d+)_", f).group(1) for f in os.listdir(steps) if re.match(r"[vb]\d+_.*\.cu$", f)}
        want = {t for p in ("fwd", "bwd") for t in bench_common.MAIN_PATH["05"][p] if not t.startswith("final")}
        self.assertEqual(main, want)


class Provenance(unittest.TestCase):
    def test_provenance_names_gpu_date_commit_and_dirty_tree(self):
        import bench_readme
        res = load()
        # a run on a copy of a committed tree (BENCH_COMMIT) names that commit, whatever its .git said
        res["run"].update(commit="0000000", git_head="09430b9", git_dirty=True)
        line = bench_readme.provenance(res, os.path.join(HERE, "recorded", "x.json"))
        self.assertIn("at commit 0000000 (clean tree: the committed tree, copied to the GPU machine)", line)
        self.assertNotIn("09430b9", line)
        del res["run"]["commit"]
        line = bench_readme.provenance(res, os.path.join(HERE, "recorded", "x.json"))
        for want in ("Fixture GPU (not a measurement)", "2026-01-01", "commit 09430b9 (uncommitted changes)"):
            self.assertIn(want, line)
        res["run"].update(git_head="0123456789abcdef0123456789abcdef01234567", git_dirty=False)
        line = bench_readme.provenance(res, os.path.join(HERE, "recorded", "x.json"))
        self.assertIn("at commit 0123456 (clean tree)", line)
        self.assertIn("commit 0123456 (clean tree)", bench_report.run_line(res))
        res["run"]["git_dirty"] = None
        self.assertIn("commit 0123456 (tree state not recorded)", bench_readme.provenance(res, os.path.join(HERE, "recorded", "x.json")))
        del res["run"]["git_head"]
        self.assertIn("commit not recorded", bench_readme.provenance(res, os.path.join(HERE, "recorded", "x.json")))


class StepDiffsLab(unittest.TestCase):
    """scripts/step_diffs.py on a scratch tree: chapter 05's main series in steps/, its lab in steps/lab/."""

    def setUp(self):
        sys.path.insert(0, os.path.join(os.path.dirname(HERE), "scripts"))
        import step_diffs
        self.sd = step_diffs
        self.tmp = tempfile.TemporaryDirectory()
        self.root = self.tmp.name
        self.old_root = step_diffs.ROOT
        from pathlib import Path
        step_diffs.ROOT = Path(self.root)

    def tearDown(self):
        self.sd.ROOT = self.old_root
        self.tmp.cleanup()

    def put(self, rel, text):
        path = os.path.join(self.root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)

    def tree(self):
        def kernel(first, head, body):
            return "// %s\n// %s\nint k() {\n%s\n}\n" % (first, head, body)
        self.put("chapters/04_fa2/steps/v9_per_dim_tiles.cu", kernel("ch04 v9", "", "  return 49;"))
        self.put("chapters/04_fa2/backward.cu", kernel("ch04 backward", "", "  return 40;"))
        ch = "chapters/05_fa3_hopper/"
        for i in range(1, 9):
            name = {1: "v1_tma", 8: "v8_head_dims"}.get(i, "v%d_step" % i)
            self.put(ch + "steps/%s.cu" % name, kernel("step %d" % i, "What changes from v%d." % (i - 1) if i > 1
                                                       else "", "  return %d;" % i))
        self.put(ch + "steps/final.cu", kernel("final", "What changes from v8: a table.", "  return 100;"))
        self.put(ch + "steps/b1_wgmma_backward.cu", kernel("b1", "", "  return -1;"))
        self.put(ch + "steps/b2_warp_specialized.cu", kernel("b2", "What changes from b1.", "  return -2;"))
        self.put(ch + "steps/b5_dq_writer.cu", kernel("b5", "What changes from b4.", "  return -5;"))
        self.put(ch + "steps/lab/v9_fp8.cu", kernel("step 9", "What changes from v8.", "  return 9;"))
        self.put(ch + "steps/lab/v10_tile_sizes.cu", kernel("step 10 (branches from v8).", "", "  return 10;"))
        self.put(ch + "steps/lab/v12_fp8_two_pipes.cu", kernel("step 12 (from v9)", "What changes from v9.",
                                                               "  return 12;"))
        self.put(ch + "steps/lab/v30_final_grid.cu", kernel("lab step 30 (from final)", "What changes from final: "
                                                            "one field.", "  return 130;"))
        self.put(ch + "steps/lab/b3_dq_fragment_order.cu", kernel("b3", "What changes from b2.", "  return -3;"))
        self.put(ch + "steps/lab/b4_no_spills.cu", kernel("b4", "What changes from b3.", "  return -4;"))
        self.put(ch + "README.md", "# ch05\n\n<!-- step-diffs:begin -->\n<!-- step-diffs:end -->\n")
        self.put(ch + "LAB.md", "# ch05 lab\n\n<!-- step-diffs:begin -->\n<!-- step-diffs:end -->\n")

    def test_the_lab_series_goes_to_lab_md_with_its_parents(self):
        self.tree()
        tables, errors = self.sd.build()
        self.assertEqual(errors, [])
        by = {p.name: t for p, t in tables.items()}
        self.assertEqual(sorted(by), ["LAB.md", "README.md"])
        lab = by["LAB.md"]
        self.assertIn("| `v8_head_dims.cu` → `v9_fp8.cu` (from the main path) | `diff steps/v8_head_dims.cu "
                      "steps/lab/v9_fp8.cu` |", lab)
        self.assertIn("`v8_head_dims.cu` → `v10_tile_sizes.cu` (from the main path)", lab)  # its first line
        self.assertIn("`v9_fp8.cu` → `v12_fp8_two_pipes.cu` (branch)", lab)
        self.assertIn("| `final.cu` → `v30_final_grid.cu` (from the main path) | `diff steps/final.cu "
                      "steps/lab/v30_final_grid.cu` |", lab)  # a lab step that changes a final kernel
        self.assertIn("`b2_warp_specialized.cu` → `b3_dq_fragment_order.cu` (from the main path)", lab)
        self.assertIn("| `b3_dq_fragment_order.cu` → `b4_no_spills.cu` | `diff steps/lab/b3_dq_fragment_order.cu "
                      "steps/lab/b4_no_spills.cu` |", lab)
        main = by["README.md"]
        self.assertNotIn("v9_fp8", main.replace("lab/b4", ""))
        order = [l.split("`")[3] for l in main.splitlines() if l.startswith("| `")]
        self.assertEqual(order, ["v1_tma.cu", "v2_step.cu", "v3_step.cu", "v4_step.cu", "v5_step.cu", "v6_step.cu",
                                 "v7_step.cu", "v8_head_dims.cu", "final.cu", "b1_wgmma_backward.cu",
                                 "b2_warp_specialized.cu", "b5_dq_writer.cu"])  # the final right after v8
        self.assertIn("`b4_no_spills.cu` → `b5_dq_writer.cu` (from the lab) | `diff steps/lab/b4_no_spills.cu "
                      "steps/b5_dq_writer.cu`", main)

    def test_check_fails_on_a_missing_parent_or_two_parents(self):
        self.tree()
        os.remove(os.path.join(self.root, "chapters/05_fa3_hopper/steps/lab/v9_fp8.cu"))
        tables, errors = self.sd.build()
        self.assertTrue([e for e in errors if "v12_fp8_two_pipes.cu" in e and "changes v9" in e], errors)
        self.tree()
        self.put("chapters/05_fa3_hopper/steps/lab/v10_tile_sizes.cu", "// step 10 (from v8)\n// What changes from "
                 "v9.\nint k();\n")
        tables, errors = self.sd.build()
        self.assertTrue([e for e in errors if "v10_tile_sizes.cu" in e and "first line" in e], errors)
        self.tree()
        self.put("chapters/05_fa3_hopper/steps/lab/v13_x.cu", "// step 13\nint k();\n")
        tables, errors = self.sd.build()
        self.assertTrue([e for e in errors if "v13_x.cu" in e and "names no parent" in e], errors)

    def test_a_lab_md_before_the_move_is_left_alone(self):
        self.tree()
        import shutil
        shutil.rmtree(os.path.join(self.root, "chapters/05_fa3_hopper/steps/lab"))
        self.put("chapters/05_fa3_hopper/steps/b4_no_spills.cu", "// b4\n// What changes from b3.\nint k();\n")
        self.put("chapters/05_fa3_hopper/steps/b3_dq_fragment_order.cu", "// b3\n// What changes from b2.\nint k();\n")
        tables, errors = self.sd.build()
        self.assertEqual(errors, [])
        self.assertEqual([p.name for p in tables], ["README.md"])
        self.assertTrue([n for n in self.sd.notes if "LAB.md" in n])
        # b5's parent, named in steps/lab/ by CROSS, is found in steps/ before the move
        self.assertIn("`diff steps/b4_no_spills.cu steps/b5_dq_writer.cu`", tables[next(iter(tables))])


class Ch05Script(unittest.TestCase):
    """bench/ch05_fa3.py keeps its command line and becomes ./tutorial bench's."""

    def cmd(self, argv):
        import ch05_fa3
        a, rest = ch05_fa3.parser().parse_known_args(argv)
        return ch05_fa3.bench_command(a, rest)

    def test_modes_map_onto_the_bench(self):
        c = self.cmd(["--bin", "/b/bin/ch05_fa3_hopper", "--extra=--no-backward", "--dims", "64,256", "--mask",
                      "causal", "--steps", "11,16", "--peers", "cudnn,fa4"])
        self.assertEqual(c[c.index("--build-dir") + 1], "/b")
        self.assertIn("--no-backward", c)
        self.assertFalse([x for x in c if x.startswith("--extra")])
        self.assertEqual(c[c.index("--steps") + 1], "11,16")
        self.assertEqual(c[c.index("--peers") + 1], "cudnn,fa4")
        self.assertEqual(c[c.index("--d") + 1], "64,256")
        c = self.cmd(["--bin", "/b/bin/ch05_fa3_hopper", "--before", "/old/bin/ch05_fa3_hopper", "--rounds", "2",
                      "--shapes", "quick", "--out", "/tmp/x"])
        self.assertEqual(c[c.index("--before") + 1], "/old/bin/ch05_fa3_hopper")
        self.assertEqual(c[c.index("--rounds") + 1], "2")
        self.assertEqual(c[c.index("--d") + 1], "128")
        self.assertNotIn("--peers", c)  # --before: no peers
        self.assertEqual(c[-2:], ["--out", "/tmp/x"])  # other options pass through
        c = self.cmd(["--bin", "/b/bin/ch05_fa3_hopper", "--no-peers"])
        self.assertIn("--no-peers", c)
        # every option of the chapter's own script is still accepted by the script itself
        r = __import__("subprocess").run([sys.executable, os.path.join(HERE, "ch05_fa3.py"), "--bin", "/b/bin/x",
                                          "--n", "4096", "--batch", "4", "--json", "o.json", "--timeout", "9",
                                          "--print-command"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("--batch 4", r.stdout)


class Record(unittest.TestCase):
    def test_a_gpu_log_with_the_run_in_gzip_base64_is_recorded_whole(self):
        import base64
        import gzip
        import json
        import bench_readme
        with tempfile.TemporaryDirectory() as d:
            log = os.path.join(d, "bench.log")
            with open(log, "w") as f:
                f.write("ninja rc=0\nBENCH_RESULTS_B64GZ %s\ndone\n" % base64.b64encode(
                    gzip.compress(json.dumps(load()).encode())).decode())
            old, bench_readme.RECORDED = bench_readme.RECORDED, d
            try:
                path = bench_readme.record(log)
            finally:
                bench_readme.RECORDED = old
            self.assertEqual(os.path.dirname(path), d)
            self.assertEqual(read_json(path), load())


class Recorded(unittest.TestCase):
    def test_a_chapter_section_comes_from_the_newest_run_that_measured_the_chapter(self):
        import bench_readme
        runs = {p: (read_json(p), bench_report.markdown(read_json(p))) for p in bench_readme.all_runs()}
        if len(runs) < 2:
            self.skipTest("fewer than two recorded runs")
        main = bench_readme.main_run_of(runs)
        self.assertNotIn("--chapters", runs[main][0]["run"].get("command", ""))  # the lineage's run is a full sweep
        for name in ("ch05-fwd", "ch04-fwd"):
            src = bench_readme.section_run(name, runs, main)
            if src is None:
                continue
            newer = [p for p in bench_readme.all_runs() if bench_readme.run_time(p) > bench_readme.run_time(src)]
            for p in newer:  # no newer run measured that chapter's table
                chapters = runs[p][0].get("run", {}).get("chapters") or []
                self.assertFalse(name[2:4] in chapters and bench_report.extract_section(runs[p][1], name), (name, p))

    def test_readme_sections_match_the_recorded_run(self):
        import bench_readme
        if not any(n.endswith(".json") for n in os.listdir(bench_readme.RECORDED)):
            self.skipTest("no recorded run yet")
        files = bench_readme.generate()  # each section from its run (bench_readme.section_run())
        for path, new in files.items():
            self.assertEqual(open(path).read(), new, "%s differs from the recorded runs: "
                             "bench/bench_readme.py --write" % path)
        readme = open(os.path.join(os.path.dirname(HERE), "README.md")).read()
        m = re.search(r"<!-- bench:lineage begin -->\n(.*?)<!-- bench:lineage end -->", readme, re.S)
        self.assertIsNotNone(m, "README.md has no generated lineage section")
        self.assertIn("Measured on one", m.group(1))


class Ch03Linear(unittest.TestCase):
    """Chapter 03's linear-attention table is the recorded study's (bench/ch03_linear.py)."""

    def test_readme_table_is_the_recorded_output(self):
        import ch03_linear
        self.assertEqual(ch03_linear.check(), 0, "bench/ch03_linear.py --from-record")

    def test_table_marks_failures_from_the_verdict(self):
        import ch03_linear
        text = "\n".join([
            "csv,error,exact (FA1 model),0,normal,1e-03,1e-03,5e-03,2e-01,1",
            "csv,error,exact (FA1 model),0,planted,1e-03,1e-03,5e-03,2e-01,1",
            "csv,error,Performer,64,normal,1e+00,3e+00,5e-03,3e+02,0",
            "csv,error,Performer,64,planted,1e+00,3e+00,5e-03,3e+02,1",
            "csv,cost,exact (FA1),0,64,1e+06,1e+05",
            "csv,crossover,Performer,64,130,176"])
        err, cost, cross = ch03_linear.parse(text)
        t = ch03_linear.table(err, cross)
        self.assertIn("| Performer | 64 | 1.00e+00 | 3.00e+00 | 1.00e+00 | 3.00e+00 | **fails** (300x) / pass | 130 / 176 |", t)
        self.assertIn("| exact (FA1 model) | - |", t)
        with self.assertRaises(SystemExit):
            ch03_linear.parse("csv,error,too,few")


class HfModels(unittest.TestCase):
    """python/README.md's model table is the newest model record's (bench/hf_models.py)."""

    def test_readme_table_is_the_newest_record(self):
        import hf_models
        self.assertIsNotNone(hf_models.newest_record(), "no record in bench/recorded/models/")
        old = sys.argv
        try:
            sys.argv = ["hf_models.py", "--check"]
            self.assertEqual(hf_models.main(), 0, "bench/hf_models.py --from-record")
        finally:
            sys.argv = old

    def test_a_failed_check_has_no_time(self):
        import hf_models
        rows = [{"model": "llama", "impl": i, "batch": 2, "n": 500, "prefill_pass": i != "fa4", "grad_pass": True,
                 "prefill_ms": t, "train_ms": 2 * t} for i, t in (("sdpa", 2.0), ("fa4", 1.0), ("lineage", 4.0))]
        rec = {"run": {"gpu": "G", "date": "2026-01-01T00:00Z", "command": "c", "versions": {}, "reps": 1,
                       "rounds": 1}, "rows": rows}
        t = hf_models.table(rec, os.path.join(hf_models.RECORDED, "g-2026-01-01-0000.json"))
        self.assertIn("| llama | 2 x 500 | 2.00 | failed the check | 4.00 | 4.00 | failed the check | 8.00 | 0.50x, 0.50x |", t)
        rows[1].update(error="RuntimeError: no kernel", prefill_ms=None, train_ms=None)
        t = hf_models.table(rec, os.path.join(hf_models.RECORDED, "g-2026-01-01-0000.json"))
        self.assertIn("| llama | 2 x 500 | 2.00 | did not run | 4.00 | 4.00 | did not run | 8.00 |", t)
        self.assertIn("Did not run: FA4 llama, 2 x 500: RuntimeError: no kernel.", t)


class Ch07Int4(unittest.TestCase):
    """Chapter 07's INT4 accuracy table is the recorded run's (bench/ch07_int4.py)."""

    def test_readme_table_is_the_recorded_run(self):
        import ch07_int4
        self.assertEqual(ch07_int4.check(), 0, "bench/ch07_int4.py --from-record")

    def test_check_fails_when_the_table_is_edited_by_hand(self):
        import ch07_int4
        with open(ch07_int4.README) as f:
            text = f.read()
        block = ch07_int4.MARK.search(text).group(2)
        row = next(l for l in block.splitlines() if l.startswith("| normal |"))
        cells = row.split(" | ")
        cells[1] = "9.99e-02" if cells[1] != "9.99e-02" else "1.00e-01"  # one number typed over
        edits = {"a number": text.replace(row, " | ".join(cells)),
                 "a row removed": text.replace(row + "\n", ""),
                 "the provenance line": text.replace("never typed by hand", "typed by hand")}
        with tempfile.TemporaryDirectory() as d:
            for what, edited in edits.items():
                self.assertNotEqual(edited, text, what)
                path = os.path.join(d, "README.md")
                with open(path, "w") as f:
                    f.write(edited)
                self.assertEqual(ch07_int4.check(readme=path), 1, what)
            with open(path, "w") as f:  # text outside the markers is the author's
                f.write(text.replace("### INT4: two codes per byte", "### INT4, two codes per byte"))
            self.assertEqual(ch07_int4.check(readme=path), 0)
            with open(path, "w") as f:
                f.write(ch07_int4.MARK.sub("", text))
            with self.assertRaises(SystemExit):
                ch07_int4.check(readme=path)

    def test_recorded_run_is_from_a_clean_committed_tree(self):
        import ch07_int4
        run = ch07_int4.load_record()["run"]
        self.assertIs(run["git_dirty"], False)
        self.assertRegex(run["git_head"], r"^[0-9a-f]{40}$")
        self.assertTrue(run["cpu"] and run["date"] and run["command"].startswith("ch07_paged_radix decode --accuracy"))

    def test_table_from_a_record(self):
        import ch07_int4

        def row(inputs, errs):
            return {"inputs": inputs, "ref_max": 1.0, "variants": [
                {"name": n, "rel_l2": e, "max_abs": e} for n, e in errs]}
        acc = {"chapter": "ch07_paged_radix", "subcommand": "decode-accuracy", "shape": "s", "rows": [
            row(i, [("bf16", 1e-3), ("int8 per page", 7e-3), ("int4 per page", k * 0.125),
                    ("int4 per 32 channels", k * 0.0625)])
            for k, i in enumerate(ch07_int4.INPUTS, 1)]}
        run = {"cpu": "Fixture CPU", "date": "2026-01-01T00:00:00Z", "command": "ch07_paged_radix decode --accuracy",
               "git_head": "0123456789abcdef0123456789abcdef01234567", "git_dirty": True}
        t = ch07_int4.table({"run": run, "accuracy": acc})
        self.assertIn("| inputs (rel L2 of O) | int4 per page | int4 per 32 channels |", t)
        self.assertIn("| outliers | 2.50e-01 | 1.25e-01 |", t)
        self.assertNotIn("int8", t)
        self.assertIn("Fixture CPU on 2026-01-01", t)
        self.assertIn("commit 0123456 (uncommitted changes)", t)
        acc["rows"].pop()
        with self.assertRaises(SystemExit):
            ch07_int4.table({"run": run, "accuracy": acc})


class FakeTorch:
    """Just enough of torch for PeerTimer: tensors, events and a log of the device calls."""

    def __init__(self, times):
        self.log, self.times = [], list(times)
        torch = self

        class Props:
            L2_cache_size = 50 << 20

        class Tensor:
            def __init__(self, name, n):
                self.name, self.n = name, n

            def fill_(self, v):
                torch.log.append(("write", self.name, self.n, v))

            def sum(self):
                torch.log.append(("read", self.name, self.n))

        class Event:
            def __init__(self, enable_timing=False):
                pass

            def record(self):
                torch.log.append(("event",))

            def synchronize(self):
                pass

            def elapsed_time(self, other):
                return torch.times.pop(0)

        class Cuda:
            @staticmethod
            def current_device():
                return 0

            @staticmethod
            def get_device_properties(dev):
                return Props()

            @staticmethod
            def synchronize():
                torch.log.append(("sync",))

            @staticmethod
            def _sleep(cycles):
                torch.log.append(("sleep", cycles))

        Cuda.Event = Event
        self.cuda = Cuda
        self.uint8, self.int64 = "uint8", "int64"
        self.empty = lambda n, dtype, device: Tensor("scrap", n)
        self.zeros = lambda n, dtype, device: Tensor("second", n * 8)


class PeerTimerFlush(unittest.TestCase):
    def run_timer(self, env):
        import peer_timer
        old = os.environ.pop("TUTORIAL_L2_FLUSH", None)
        if env is not None:
            os.environ["TUTORIAL_L2_FLUSH"] = env
        try:
            torch = FakeTorch([float(x) for x in range(20, 0, -1)])
            calls = []
            ms = peer_timer.PeerTimer(torch)(lambda: (calls.append(1), torch.log.append(("call",))))
            return torch, calls, ms
        finally:
            os.environ.pop("TUTORIAL_L2_FLUSH", None)
            if old is not None:
                os.environ["TUTORIAL_L2_FLUSH"] = old

    def test_clean_flush_writes_then_reads_a_second_buffer_before_every_timed_call(self):
        torch, calls, ms = self.run_timer(None)
        self.assertEqual(len(calls), 23)  # 3 warm-ups, 20 timed
        self.assertEqual(ms, 10.5)  # the median of 20, 19, ..., 1
        timed = torch.log[torch.log.index(("sync",)) + 1:]
        self.assertEqual(len(timed), 20 * 5)
        for r in range(20):
            w, rd, e0, call, e1 = timed[5 * r:5 * r + 5]
            self.assertEqual(w, ("write", "scrap", 100 << 20, r & 0xFF))
            self.assertEqual(rd, ("read", "second", 100 << 20))  # twice L2, not the scrap buffer
            self.assertEqual((e0, call, e1), (("event",), ("call",), ("event",)))

    def test_write_only_flush_is_the_old_one(self):
        torch, calls, ms = self.run_timer("write")
        self.assertFalse([x for x in torch.log if x[0] == "read"])
        self.assertEqual(len([x for x in torch.log if x[0] == "write"]), 20)

    def test_spin_follows_each_flush_before_the_first_event(self):
        import peer_timer
        torch = FakeTorch([float(x) for x in range(20, 0, -1)])
        calls = []
        timer = peer_timer.PeerTimer(torch, mode="write", spin_cycles=1234)
        self.assertEqual(timer(lambda: (calls.append(1), torch.log.append(("call",)))), 10.5)
        timed = torch.log[torch.log.index(("sync",)) + 1:]
        self.assertEqual(len(timed), 20 * 5)
        for r in range(20):
            self.assertEqual(timed[5 * r:5 * r + 5], [("write", "scrap", 100 << 20, r & 0xFF), ("sleep", 1234),
                                                      ("event",), ("call",), ("event",)])
        self.assertIn("a GPU spin of 1234 cycles", timer.describe())
        self.assertNotIn("spin", peer_timer.PeerTimer(FakeTorch([]), mode="write").describe())

    def test_spin_cycles_scale_the_probe_to_the_asked_time(self):
        import peer_timer
        torch = FakeTorch([2.0])  # the probe of 200000 cycles took 2 ms
        self.assertEqual(peer_timer.spin_cycles(torch, 300.0), 30000)
        self.assertEqual([x for x in torch.log if x[0] == "sleep"], [("sleep", 1000), ("sleep", 200000)])


class PeerCheck(unittest.TestCase):
    """The peers' check (bench_peers.py), its parts that need no GPU: the rule of common/compare.hpp
    on per-row numbers, the sampling, and which exceptions are the peer's and which are ours."""

    def setUp(self):
        import bench_peers
        self.bp = bench_peers

    def test_rows_and_pairs_cover_the_problem(self):
        rows = self.bp.sample_rows(8192)
        for r in (0, 1, 8190, 8191):
            self.assertIn(r, rows)
        self.assertGreaterEqual(len(rows), 8)
        self.assertEqual(self.bp.sample_rows(1), [0])
        pairs = self.bp.sample_pairs(32, 16)
        self.assertEqual(pairs[0], (0, 0))
        self.assertEqual(pairs[-1], (31, 15))
        self.assertGreaterEqual(len({b for b, _ in pairs}), 4)  # several batches and several heads
        self.assertGreaterEqual(len({h for _, h in pairs}), 4)
        self.assertEqual(self.bp.sample_pairs(2, 2), [(0, 0), (0, 1), (1, 0), (1, 1)])

    def test_scale_aware_rule_fails_zeros_and_passes_a_bf16_result(self):
        # decode at 128K: rows of max |O| ~ 0.015, a correct bf16 result is off by ~ 2^-9 of that
        scale = [0.015, 0.012, 0.017]
        naive = [3e-5, 2.5e-5, 3.5e-5]
        margin, bad = self.bp.judge_rows("O", [4e-5, 3e-5, 3e-5], naive, scale, 4e-4, 3e-4, 128)
        self.assertIsNone(bad)
        self.assertLess(margin, 1.0)
        # all zeros: each row's error is its own max |ref|, far above 2 x naive + 2^-8 |ref|
        margin, bad = self.bp.judge_rows("O", scale, naive, scale, 0.1, 3e-4, 128)
        self.assertIsNotNone(bad)
        self.assertGreater(margin, 10)
        # the old rule, 2e-2 x max(1, max |ref|), let every one of these through
        self.assertTrue(all(e <= 2e-2 * max(1.0, s) for e, s in zip(scale, scale)))

    def test_an_overflowing_yardstick_and_nan_fail(self):
        inf = float("inf")
        self.assertIsNotNone(self.bp.judge_rows("O", [0.0], [inf], [1.0], 0.0, inf, 4)[1])
        self.assertIsNotNone(self.bp.judge_rows("O", [float("nan")], [0.0], [1.0], 0.0, 0.0, 4)[1])

    def test_l2_bound_fails_an_error_spread_over_every_row(self):
        n = 64
        margin, bad = self.bp.judge_rows("O", [0.9e-3] * n, [1e-3] + [0.0] * (n - 1), [1.0] * n,
                                         0.9e-3 * (4 * n) ** 0.5, 1e-3, 4, u=3.8e-6)
        self.assertIsNotNone(bad)
        self.assertIn("L2", bad)

    def test_a_harness_error_is_not_unsupported(self):
        self.assertTrue(self.bp.peer_refused(RuntimeError("No available kernel. Aborting execution.")))
        self.assertTrue(self.bp.peer_refused(NotImplementedError("fa4: d=256")))
        self.assertFalse(self.bp.peer_refused(TypeError("f() got an unexpected keyword argument")))
        self.assertFalse(self.bp.peer_refused(NameError("name 'x' is not defined")))
        self.assertFalse(self.bp.peer_refused(IndexError("list index out of range")))


FAKE06 = os.path.join(HERE, "testdata", "fake_ch06.py")


def model_row(case, n, kernel, status, tflops=None, kind="ours", pss="fwd", note="", **kw):
    d, hq, hkv, mask = {"gpt-oss": (64, 64, 8, "learned sink + causal window 128"),
                        "gemma2": (256, 16, 8, "softcap 50 + causal window 4096"),
                        "mistral": (128, 32, 8, "causal window 4096")}[case]
    r = {"chapter": "06" if kind == "ours" else "peer", "kernel": kernel, "kind": kind, "pass": pss, "d": d, "N": n,
         "nk": n, "B": 16384 // n, "H": hq, "Hkv": hkv, "causal": True, "dtype": "bf16", "unit": "TFLOP/s",
         "ceiling": "bf16_gemm", "variant": case, "mask": mask, "status": status, "note": note}
    if tflops is not None:
        r.update(tflops=tflops, time_ms=1.0, max_abs_err=0.001)
    r.update(kw)
    return r


def model_results():
    """The fixture with chapter 06's model rows: mistral measured by every kernel and peer; gemma2
    with no kernel of ours for d = 256 and no FA4; gpt-oss with a peer that failed its check."""
    res = load()
    res["run"]["chapters"] = res["run"]["chapters"] + ["06"]
    F, B = "ch06 mask final sm90a forward", "ch06 mask final backward"
    res["rows"] += [
        model_row("mistral", 8192, F, "ok", 500.0), model_row("mistral", 8192, "fa4", "ok", 400.0, kind="peer"),
        model_row("mistral", 8192, "flex", "ok", 250.0, kind="peer"),
        model_row("mistral", 8192, B, "ok", 200.0, pss="bwd"),
        model_row("gemma2", 8192, F, "unsupported", note="not built for d = 256"),
        model_row("gemma2", 8192, B, "unsupported", pss="bwd", note="not built for d = 256"),
        model_row("gemma2", 8192, "fa4", "unsupported", kind="peer", note="not supported: head dim 256 on sm90"),
        model_row("gemma2", 8192, "flex", "ok", 300.0, kind="peer"),
        model_row("gpt-oss", 16384, F, "ok", 450.0), model_row("gpt-oss", 16384, "fa4", "failed", kind="peer"),
        model_row("gpt-oss", 16384, "flex", "ok", 90.0, kind="peer"),
        model_row("gpt-oss", 16384, B, "unsupported", pss="bwd", note="not built for d = 64"),
    ]
    return res


class FakeCh06Bench(unittest.TestCase):
    """The set-up that chapter 06's table tests share: a build folder whose ch06_variants is the fake
    binary (testdata/fake_ch06.py), the plan's task labels, a run of one task with fake peers, and the
    README that bench_readme writes from recorded runs."""

    def build(self, root):
        os.makedirs(os.path.join(root, "bin"))
        path = os.path.join(root, "bin", "ch06_variants")
        with open(path, "w") as f:
            f.write("#!/bin/sh\nexec %s %s \"$@\"\n" % (sys.executable, FAKE06))
        os.chmod(path, 0o755)
        return root

    def plan(self, args):
        out = io.StringIO()
        old, sys.stdout = sys.stdout, out
        try:
            lineage.main(args)
        finally:
            sys.stdout = old
        return [l.split("s  ", 1)[1] for l in out.getvalue().splitlines() if re.match(r"\s*[0-9.]+ s  ", l)]

    def one_task(self, name, only):
        """The label of the task whose label holds `name`, after checking that the full sweep of
        chapter 06 plans it once, beside the mask task, that `--only ONLY` plans it alone (with the
        ceilings) and that --quick leaves it out."""
        with tempfile.TemporaryDirectory() as d:
            b = self.build(os.path.join(d, "b"))
            labels = self.plan(["--build-dir", b, "--plan", "--gpu", "--chapters", "06"])
            task = [l for l in labels if name in l]
            self.assertEqual(len(task), 1, labels)
            self.assertIn("ch06 mask", labels)  # beside the mask task, not instead of it
            self.assertEqual(self.plan(["--build-dir", b, "--plan", "--gpu", "--chapters", "06", "--only", only]),
                             ["ceilings: read bandwidth, bf16 and FP8 GEMM", task[0]])
            self.assertFalse([l for l in self.plan(["--build-dir", b, "--plan", "--gpu", "--chapters", "06",
                                                    "--quick"]) if only in l])
            return task[0]

    def run_only(self, d, only, fail=None):
        """Runs `--only ONLY` of chapter 06 with fake peers in folder `d` (the fake binary fails the
        pattern `fail`): the run's results and its markdown."""
        b = self.build(os.path.join(d, "b"))
        out = os.path.join(d, "o")
        err = io.StringIO()
        old, sys.stderr = sys.stderr, err
        old_fail = os.environ.pop("FAKE_FAIL", None)
        if fail:
            os.environ["FAKE_FAIL"] = fail
        try:
            lineage.main(["--build-dir", b, "--gpu", "--no-build", "--no-plots", "--chapters", "06", "--only",
                          only, "--out", out, "--fake-peers"])
        finally:
            sys.stderr = old
            os.environ.pop("FAKE_FAIL", None)
            if old_fail is not None:
                os.environ["FAKE_FAIL"] = old_fail
        return read_json(os.path.join(out, "results.json")), open(os.path.join(out, "results.md")).read()

    def readme_after(self, section, *runs):
        """The text bench_readme generates for a README that holds `section`'s markers, once `runs`
        (results, oldest first) are recorded as runs of ./tutorial bench."""
        import bench_readme
        old_rec, old_readmes = bench_readme.RECORDED, bench_readme.readmes
        with tempfile.TemporaryDirectory() as d:
            readme = os.path.join(d, "README.md")
            with open(readme, "w") as f:
                f.write("x\n\n<!-- bench:%s begin -->\nold\n<!-- bench:%s end -->\n" % (section, section))
            bench_readme.RECORDED, bench_readme.readmes = d, lambda: [readme]
            try:
                for i, res in enumerate(runs):
                    res["run"]["command"] = "./tutorial bench"
                    with open(os.path.join(d, "gpu-2026-01-%02d-0000.json" % (i + 1)), "w") as f:
                        json.dump(res, f)
                return bench_readme.generate()[readme]
            finally:
                bench_readme.RECORDED, bench_readme.readmes = old_rec, old_readmes


class ModelCases(FakeCh06Bench):
    """Chapter 06's model cases: the plan's task, the rows of bench/ch06_masks.py --models, the
    ch06-models table and its README placeholder."""

    def test_the_plan_has_the_model_cases_in_the_full_sweep_and_only_matches_them(self):
        label = self.one_task("model cases", "model")
        for case in ("gpt-oss", "gemma2", "mistral", "packed-docs", "8192", "16384", "FA4", "Flex"):
            self.assertIn(case, label)

    def test_a_run_of_the_model_cases_with_fake_peers(self):
        with tempfile.TemporaryDirectory() as d:
            res, md = self.run_only(d, "model")
        rows = [r for r in res["rows"] if r.get("variant") in bench_common.CH06_MODEL_CASES]
        by = {(r["variant"], r["N"], r["kernel"]): r for r in rows if r["pass"] == "fwd" or r["kind"] == "ours"}
        byb = {(r["variant"], r["N"], r["kernel"]): r for r in rows if r["pass"] == "bwd" and r["kind"] == "peer"}
        self.assertEqual({r["variant"] for r in rows}, set(bench_common.CH06_MODEL_CASES))
        self.assertEqual({r["N"] for r in rows}, {8192, 16384})
        r = by[("gpt-oss", 8192, "ch06 mask sm80 forward")]
        self.assertEqual((r["status"], r["note"], r["B"], r["H"], r["Hkv"], r["d"]),
                         ("unsupported", "not built for d = 64", 2, 64, 8, 64))
        self.assertNotIn("tflops", r)
        self.assertEqual(by[("gemma2", 16384, "fa4")]["status"], "unsupported")
        m = by[("mistral", 8192, "ch06 mask final sm90a forward")]
        self.assertEqual((m["status"], m["tflops"]), ("ok", 500.0))
        self.assertEqual(by[("mistral", 8192, "ch06 mask final backward")]["pass"], "bwd")
        # the peer's FLOPs are our kernel's count (4 B Hq kept d over the window's kept pairs)
        f = by[("mistral", 8192, "fa4")]
        kept = sum(min(i, 4096) + 1 for i in range(8192))
        self.assertEqual(f["flops"], 4.0 * 2 * 32 * kept * 128)
        self.assertEqual(m["flops"], f["flops"])
        head, body = table_rows(md, "ch06-models")
        row = {(x[0], x[1]): x for x in body}[("mistral", "8192")]
        want = "%.2fx" % (m["tflops"] / f["tflops"])
        self.assertEqual(row[head.index("ours / FA4")], want)
        self.assertEqual({(x[0], x[1]): x for x in body}[("gemma2", "8192")][head.index("FA4")], "not supported")
        # the peers' backwards: their own rows (pass bwd, 2.5 x the forward's FLOPs) and table
        self.assertEqual(byb[("gemma2", 16384, "fa4")]["status"], "unsupported")
        fb = byb[("mistral", 8192, "fa4")]
        self.assertEqual((fb["status"], fb["flops"]), ("ok", 2.5 * f["flops"]))
        mb = by[("mistral", 8192, "ch06 mask final backward")]
        bhead, bbody = table_rows(md, "ch06-models", 1)
        brow = {(x[0], x[1]): x for x in bbody}[("mistral", "8192")]
        self.assertEqual(brow[bhead.index("ours / FA4")], "%.2fx" % (mb["tflops"] / fb["tflops"]))

    def test_the_table_gives_ours_over_each_peer_and_text_where_a_case_is_missing(self):
        md = bench_report.markdown(model_results())
        head, body = table_rows(md, "ch06-models")
        by = {(x[0], x[1]): dict(zip(head, x)) for x in body}
        self.assertEqual([k[0] for k in by], ["gpt-oss", "gemma2", "mistral"])  # the cases' order
        m = by[("mistral", "8192")]
        self.assertEqual((m["d"], m["Hq/Hkv"], m["mask"]), ("128", "32/8", "causal window 4096"))
        self.assertEqual((m["ours forward (final sm90a)"], m["FA4"], m["FlexAttention"]), ("500", "400", "250"))
        # no peer backward in this run: our backward is the table's last column
        self.assertEqual((m["ours / FA4"], m["ours / Flex"], m["ours backward (final)"]), ("1.25x", "2.00x", "200"))
        self.assertNotIn("The backward", bench_report.extract_section(md, "ch06-models"))
        bb = by
        g = by[("gemma2", "8192")]
        self.assertEqual((g["ours forward (final sm90a)"], g["FA4"], g["FlexAttention"]),
                         ("not built for d = 256", "not supported", "300"))
        self.assertEqual((g["ours / FA4"], g["ours / Flex"]), ("-", "-"))
        self.assertEqual(bb[("gemma2", "8192")]["ours backward (final)"], "not built for d = 256")
        o = by[("gpt-oss", "16384")]
        self.assertEqual((o["FA4"], o["ours / FA4"], o["ours / Flex"]), ("FAIL", "-", "5.00x"))
        # the model rows have their own table: the chapter's forward table leaves them out
        self.assertNotIn("mistral", bench_report.extract_section(md, "ch06-fwd") or "")

    def test_the_readme_section_is_a_placeholder_until_a_run_has_the_table(self):
        self.assertIsNone(bench_report.extract_section(bench_report.markdown(load()), "ch06-models"))
        self.assertIn("<!-- bench:ch06-models begin -->\nNot measured yet in the recorded run.\n"
                      "<!-- bench:ch06-models end -->", self.readme_after("ch06-models", load()))
        new = self.readme_after("ch06-models", load(), model_results())
        self.assertNotIn("Not measured yet", new)
        self.assertIn("| mistral | 8192 |", new)


class SparseTable(FakeCh06Bench):
    """Chapter 06's structured sparse patterns beside FlexAttention: the plan's task, its rows from
    bench/ch06_masks.py --variants (a fake binary, fake peers), the ch06-sparse table and its README
    placeholder."""

    def test_the_plan_has_the_sparse_task_in_the_full_sweep_and_only_matches_it(self):
        label = self.one_task("sparse patterns", "sparse")
        for word in bench_common.CH06_SPARSE + ["8192", "Flex"]:
            self.assertIn(word, label)

    def test_a_run_with_fake_peers_fills_the_table(self):
        with tempfile.TemporaryDirectory() as d:
            res, md = self.run_only(d, "sparse", fail="fixed")
        rows = [r for r in res["rows"] if r.get("table") == bench_common.CH06_SPARSE_TABLE]
        by = {(r["variant"], r["kernel"]): r for r in rows}
        self.assertEqual({r["variant"] for r in rows}, set(bench_common.CH06_SPARSE))
        o = by[("strided", "ch06 mask final sm90a forward")]
        f = by[("strided", "flex")]
        self.assertEqual((o["status"], o["tflops"], o["N"], o["B"], o["H"], o["d"]), ("ok", 400.0, 8192, 1, 16, 128))
        self.assertEqual(o["mask"], "strided (Sparse Transformer, merged), stride 128, causal")
        self.assertEqual(f["status"], "ok")
        self.assertEqual(f["flops"], o["flops"])  # the peer's FLOPs are our count of kept pairs
        self.assertEqual(by[("bigbird", "fa4")]["status"], "unsupported")
        self.assertEqual(by[("fixed", "ch06 mask final sm90a forward")]["status"], "failed")
        head, body = table_rows(md, "ch06-sparse")
        t = {x[0]: dict(zip(head, x)) for x in body}
        self.assertEqual(list(t), bench_common.CH06_SPARSE)
        self.assertEqual(t["strided"]["ours forward (final sm90a)"], "400")
        self.assertEqual(t["strided"]["ours / Flex"], "%.2fx" % (o["tflops"] / f["tflops"]))
        self.assertEqual(t["bigbird"]["FA4"], "not supported")
        self.assertEqual((t["fixed"]["ours forward (final sm90a)"], t["fixed"]["ours / Flex"]), ("FAIL", "-"))
        self.assertIn("window 256 each side", t["longformer"]["mask"])
        # the chapter's forward table leaves these rows to their own table
        self.assertNotIn("strided", bench_report.extract_section(md, "ch06-fwd") or "")

    def test_a_pattern_not_in_the_run_reads_not_measured_yet(self):
        import lineage as L
        out = {"n": 8192, "heads": 16, "d": 128, "command": "python3 bench/ch06_masks.py",
               "variants": {"longformer": {"spec": "longformer: longformer, window 256 each side, 1 global tokens; x",
                                           "ours": {"sm90a": {"ms": 2.0, "pass": True, "flops": 8e11, "tflops": 400.0,
                                                              "err": 0.001}},
                                           "kept_pairs": 8e11 / 512, "params_agree": True,
                                           "peers": {"flex": {"ms": 4.0, "pass": True, "err": 0.01, "flops": 8e11}}}}}
        rows = L.sparse_rows(out)
        head, body = table_rows(bench_report.markdown({"run": {}, "rows": rows}), "ch06-sparse")
        t = {x[0]: dict(zip(head, x)) for x in body}
        self.assertEqual(t["longformer"]["ours / Flex"], "2.00x")
        self.assertEqual(t["longformer"]["ours forward (sm80)"], "not run")
        for name in ("strided", "fixed", "bigbird"):
            self.assertEqual(set(list(t[name].values())[1:]), {"not measured yet"})

    def test_the_readme_section_is_a_placeholder_until_a_run_has_the_table(self):
        self.assertIsNone(bench_report.extract_section(bench_report.markdown(load()), "ch06-sparse"))
        self.assertIn("<!-- bench:ch06-sparse begin -->\nNot measured yet in the recorded run.\n"
                      "<!-- bench:ch06-sparse end -->", self.readme_after("ch06-sparse", load()))


class ModelPeers(unittest.TestCase):
    """bench/ch06_masks.py's model cases: the kept pairs, and (where PyTorch is installed) each peer's
    call on the CPU: FlexAttention's, and FA4's arguments given to a reference with FlashAttention's
    window semantics (key j kept iff i + Nk - Nq - left <= j <= i + Nk - Nq + right)."""

    def test_kept_pairs_against_a_count(self):
        import ch06_masks as M
        for n, left in ((100, 128), (300, 128), (1000, 7), (64, 0)):
            self.assertEqual(M.model_kept_pairs({"left": left}, n),
                             sum(1 for i in range(n) for j in range(n) if j <= i and i - j <= left))
        lens = [3, 5, 9]
        doc = [k for k, ln in enumerate(lens) for _ in range(ln)]
        self.assertEqual(M.model_kept_pairs({"docs": True}, 17, lens),
                         sum(1 for i in range(17) for j in range(17) if j <= i and doc[i] == doc[j]))
        self.assertIsNone(M.model_kept_pairs({"docs": True}, 17, None))

    def test_peer_calls_pass_the_check_and_a_window_one_key_short_fails_it(self):
        try:
            import torch
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        except Exception:  # noqa: BLE001
            self.skipTest("no PyTorch with FlexAttention here")
        import inspect
        import warnings
        import ch06_masks as M

        def fa(q, k, v, causal=False, window_size=(None, None), softcap=0.0, learnable_sink=None, short=0):
            b, nq, hq, d = q.shape
            nk, hkv = k.shape[1], k.shape[2]
            left, right = window_size
            right = 0 if causal else right
            kk, vv = (t.float().repeat_interleave(hq // hkv, dim=2) for t in (k, v))
            s = torch.einsum("bihd,bjhd->bhij", q.float(), kk) * d ** -0.5
            if softcap:
                s = softcap * torch.tanh(s / softcap)
            i, j = torch.arange(nq)[:, None], torch.arange(nk)[None, :]
            keep = torch.ones(nq, nk, dtype=torch.bool)
            if right is not None:
                keep &= j <= i + nk - nq + right
            if left is not None:
                keep &= j >= i + nk - nq - (left - short)
            s = s.masked_fill(~keep, float("-inf"))
            if learnable_sink is not None:
                s = torch.cat([s, learnable_sink[None, :, None, None].expand(b, hq, nq, 1)], -1)
            p = torch.softmax(s, -1)[..., :nk]
            return torch.einsum("bhij,bjhd->bihd", p, vv).to(q.dtype)

        def fa_varlen(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, **kw):
            out = torch.empty_like(q)
            cu = cu_seqlens_q.tolist()
            for a, b in zip(cu[:-1], cu[1:]):
                out[a:b] = fa(q[None, a:b], k[None, a:b], v[None, a:b], **kw)[0]
            return out, None
        params = set(inspect.signature(fa).parameters)
        vparams = set(inspect.signature(fa_varlen).parameters) | {"causal", "window_size", "softcap", "learnable_sink"}
        n, hq, hkv, d = 1024, 8, 2, 64
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for name, case in M.MODELS.items():
                prm = {"model": name, "batch": 2, "hkv": hkv, "left": case.get("left") and min(case["left"], 128),
                       "softcap": case.get("softcap"), "sink": bool(case.get("sink"))}
                if case.get("docs"):
                    prm["doc_lens"] = [300, 505, 219]
                x = M.model_inputs(torch, prm, n, hq, d, "cpu")
                for peer, f in (("flex", None), ("fa4", fa), ("fa4", lambda *a, **kw: fa(*a, short=1, **kw))):
                    fn, out_of, why = M.model_peer_call(torch, peer, prm, x, flex=flex_attention,
                                                        create_block_mask=create_block_mask, fa4=f, fa4_params=params,
                                                        fa4_varlen=fa_varlen, fa4_varlen_params=vparams)
                    self.assertIsNone(why)
                    ok, err = M.model_check(torch, out_of(), x)
                    short = f is not None and f is not fa
                    if short and not prm["left"]:
                        continue
                    self.assertEqual(ok, not short, (name, peer, short, err))
                fn, out_of, why = M.model_peer_call(torch, "fa4", prm, x, fa4=fa, fa4_params={"causal"},
                                                    fa4_varlen=None)
                self.assertTrue(why.startswith("not supported"), why)
                # the backward: the peer's gradients through model_peer_call(grad=True) pass
                # model_grad_check, and a window one key short fails it (FA4's arguments only:
                # FlexAttention has no backward on the CPU)
                xg = M.model_inputs(torch, prm, n, hq, d, "cpu", grad=True)
                for peer, f in (("fa4", fa), ("fa4", lambda *a, **kw: fa(*a, short=1, **kw))):
                    fn, out_of, why = M.model_peer_call(torch, peer, prm, xg, flex=flex_attention,
                                                        create_block_mask=create_block_mask, fa4=f, fa4_params=params,
                                                        fa4_varlen=fa_varlen, fa4_varlen_params=vparams, grad=True)
                    o = fn()
                    dout = torch.randn(o.shape, dtype=o.dtype, generator=torch.Generator().manual_seed(3))
                    grads = xg["grads_bhnd"](*torch.autograd.grad(o, xg["leaves"], dout))
                    self.assertEqual([tuple(t.shape) for t in grads], [(2, hq, n, d), (2, hkv, n, d), (2, hkv, n, d)])
                    bad, gerr = M.model_grad_check(torch, grads, xg["grads_bhnd"](dout)[0], xg)
                    self.assertGreater(gerr, 0.0)  # the gradients' largest error: bf16 inputs, fp32 reference
                    short = f is not None and f is not fa
                    if short and not prm["left"]:
                        continue
                    self.assertEqual(bad is None, not short, (name, peer, short, bad))
                    if short:
                        self.assertIn("differs", bad)


class CudnnFp8Peer(unittest.TestCase):
    """cuDNN's FP8 forward as a peer: the FP8 kernels' preparation pass in the rows and the ch05-fp8
    table, the peer's plan and options, and (where PyTorch is importable) its check on the CPU."""

    def fp8_res(self, peers=None, peer_row=None):
        base = {"chapter": "05", "kind": "ours", "pass": "fwd", "d": 128, "N": 8192, "nk": 8192, "B": 2, "H": 16,
                "Hkv": 16, "causal": False, "unit": "TFLOP/s"}
        fl = 4.0 * 2 * 16 * 8192 * 8192 * 128
        rows = [dict(base, kernel="ch05 final forward", dtype="bf16", status="ok", time_ms=fl / 700e12 * 1e3,
                     tflops=700.0, flops=fl, ceiling="bf16_gemm"),
                dict(base, kernel="ch05 final fp8 forward", dtype="fp8", status="ok", time_ms=fl / 880e12 * 1e3,
                     tflops=880.0, flops=fl, ceiling="fp8_gemm", prep_ms=0.5,
                     time_with_prep_ms=fl / 880e12 * 1e3 + 0.5, tflops_with_prep=fl / (fl / 880e12 + 0.5e-3) / 1e12)]
        if peer_row is not None:
            rows.append(dict(base, chapter="peer", kind="peer", kernel="cudnn_fp8", dtype="fp8", ceiling="fp8_gemm",
                             flops=fl, **peer_row))
        return {"run": {"gpu": "Fixture GPU (not a measurement)", "date": "2026-12-06T12:00Z",
                        "command": "./tutorial bench"}, "ceilings": {}, "peers": peers or {}, "rows": rows}

    def test_the_table_gives_the_kernel_alone_with_preparation_and_the_ratio_on_the_kernel_alone(self):
        res = self.fp8_res({"cudnn_fp8": "available"}, {"status": "ok", "tflops": 800.0, "time_ms": 1.0})
        head, body = table_rows(bench_report.markdown(res), "ch05-fp8")
        self.assertEqual(head, ["d", "N", "causal", "final fp8 forward: kernel alone",
                                "final fp8 forward: with preparation", "cuDNN FP8",
                                "final fp8 forward (kernel alone) / cuDNN FP8"])
        fl = 4.0 * 2 * 16 * 8192 * 8192 * 128
        self.assertEqual(body, [["128", "8192", "no", "880", "%.0f" % (fl / (fl / 880e12 + 0.5e-3) / 1e12), "800",
                                 "1.10x"]])
        # the bf16 tables have no FP8 peer column, and their best / peer ratios stay bf16
        head, body = table_rows(bench_report.markdown(res), "ch05-fwd")
        self.assertNotIn("cuDNN FP8", head)

    def test_a_run_before_the_peer_says_not_measured_yet_and_a_refusal_says_n_a(self):
        head, body = table_rows(bench_report.markdown(self.fp8_res()), "ch05-fp8")
        self.assertEqual(body[0][head.index("cuDNN FP8")], "not measured yet")
        self.assertEqual(body[0][-1], "-")
        self.assertIn("cuDNN FP8: not measured yet", bench_report.markdown(self.fp8_res()))
        res = self.fp8_res({"cudnn_fp8": "available"}, {"status": "unsupported", "note": "no graph for d=256"})
        head, body = table_rows(bench_report.markdown(res), "ch05-fp8")
        self.assertEqual(body[0][head.index("cuDNN FP8")], "n/a")
        self.assertEqual(body[0][-1], "-")
        res = self.fp8_res({"cudnn_fp8": "nvidia-cudnn-frontend not importable (x)"})
        head, body = table_rows(bench_report.markdown(res), "ch05-fp8")
        self.assertEqual(body[0][head.index("cuDNN FP8")], "absent")

    def test_preparation_from_the_json_field_or_an_older_runs_note(self):
        rep = {"problem": {"batch": 2, "heads": 16, "kv_heads": 16, "nq": 8192, "nk": 8192, "d": 128,
                           "causal": False, "dtype": "bf16"},
               "results": [{"impl": "final fp8 forward", "device": "cuda", "pass": True, "tflops": 800.0,
                            "time_ms": 2.0, "prep_ms": 0.5, "flops": 1.6e12, "max_abs_err": 1e-2},
                           {"impl": "v9 fp8", "device": "cuda", "pass": False, "tflops": 800.0, "time_ms": 2.0,
                            "prep_ms": 0.5, "flops": 1.6e12, "max_abs_err": 1.0}]}
        rows = {r["kernel"]: r for r in lineage.report_rows(rep, "05", {"d": 128, "N": 8192, "causal": False})}
        r = rows["ch05 final fp8 forward"]
        self.assertEqual((r["dtype"], r["prep_ms"], r["time_with_prep_ms"]), ("fp8", 0.5, 2.5))
        self.assertAlmostEqual(r["tflops_with_prep"], 1.6e12 / 2.5e-3 / 1e12)
        self.assertEqual(bench_common.fp8_prep(r), (0.5, 2.5, r["tflops_with_prep"]))
        self.assertNotIn("prep_ms", rows["ch05 v9 fp8"])  # a failed row carries no time of any kind
        self.assertIsNone(bench_common.fp8_prep(rows["ch05 v9 fp8"]))
        old = {"status": "ok", "time_ms": 1.0, "note": "judged against the plain FP8 computation (fp8_model.hpp); "
               "time: the kernel alone, without the separate preparation pass of 0.413 ms (Hadamard, scales, "
               "V^T); with it: 1.413 ms, 622.1 TFLOP/s"}
        self.assertEqual(bench_common.fp8_prep(old), (0.413, 1.413, 622.1))
        self.assertIsNone(bench_common.fp8_prep({"status": "ok", "time_ms": 1.0, "note": "128 blocks"}))

    def test_the_option_and_the_plan(self):
        self.assertEqual(lineage.peer_list("cudnn-fp8,fa4"), ["cudnn_fp8", "fa4"])
        with self.assertRaises(Exception):
            lineage.peer_list("cudnn-fp16")
        with tempfile.TemporaryDirectory() as d:
            b = Modes.build(None, d, "b", main_path=True)
            args = ["--build-dir", b, "--plan", "--gpu", "--chapters", "05", "--n", "8192", "--d", "128,256"]
            labels = ModelCases.plan(None, args)
            fp8 = [l for l in labels if l.startswith("cudnn_fp8")]
            self.assertEqual(fp8, ["cudnn_fp8 fwd d=%d N=8192%s" % (dd, c) for dd in (128, 256)
                                   for c in (" causal", "")], labels)
            self.assertFalse([l for l in ModelCases.plan(None, args + ["--peers", "fa4"]) if "cudnn_fp8" in l])
            self.assertEqual([l for l in ModelCases.plan(None, args + ["--peers", "cudnn-fp8"]) if "peer" in l
                              or l.split()[0] in bench_common.PEERS], [])  # no bf16 peer asked

    def test_the_check_passes_the_plain_fp8_result_and_fails_a_wrong_row(self):
        try:
            import torch
        except ImportError:
            self.skipTest("PyTorch is not importable here")
        import peer_cudnn_fp8 as P
        torch.manual_seed(0)
        b, h, n, d = 2, 3, 200, 64
        q, k, v = (torch.randn(b, h, n, d).bfloat16() for _ in range(3))
        h8 = P.hadamard(torch, d, "cpu")
        self.assertLess(float((h8 @ h8.T - torch.eye(d)).abs().max()), 1e-6)
        for causal in (False, True):
            f = P.fp8_inputs(torch, q, k, v)
            s8 = (f["q8"].float() @ f["k8"].float().transpose(-1, -2)) * (f["sq"] * f["sk"] * d ** -0.5)
            if causal:
                s8 = s8.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
            o = (torch.softmax(s8, -1) @ f["v8"].float() * f["sv"]).bfloat16()
            err, bad, det = P.check(torch, o, q, k, v, f, causal)
            self.assertIsNone(bad, (causal, det))
            wrong = o.clone()
            wrong[1, 2, n - 1] += 0.3
            self.assertRegex(P.check(torch, wrong, q, k, v, f, causal)[1] or "", "differs|L2 error")
            self.assertIn("all zeros", P.check(torch, torch.zeros_like(o), q, k, v, f, causal)[1])


class FakeCudnn:
    """A stand-in for the cudnn module (the graph API calls peer_cudnn_fp8 makes), computing sdpa_fp8 on
    the CPU from the variant pack: which output dtypes it builds (`outs`) and whether it forgets V's
    descale (`bug`) are the test's to choose."""

    def __init__(self, torch, outs=("bf16", "fp16", "fp8"), bug=False):
        from types import SimpleNamespace as NS
        self.torch, self.outs, self.bug = torch, outs, bug
        self.data_type = NS(BFLOAT16="bf16", HALF="fp16", FP8_E4M3="fp8", FLOAT="f32")
        self.diagonal_alignment = NS(TOP_LEFT="top_left", BOTTOM_RIGHT="bottom_right")
        self.heur_mode = NS(A="a", FALLBACK="fallback")
        self.handles, self.built = [], []
        fake = self

        class T:
            def __init__(self, **kw):
                self.__dict__.update(kw)

            def set_uid(self, u):
                self.uid = u
                return self

            def set_output(self, x):
                self.output = x
                return self

            def set_dim(self, x):
                return self

            def set_stride(self, x):
                return self

            def set_data_type(self, x):
                self.dt = x
                return self

        class Graph:
            def __init__(self, handle=None, **kw):
                self.kw = kw

            def tensor(self, uid, dim, stride, data_type, name=""):
                return T(uid=uid, dim=dim, dt=data_type, name=name)

            def sdpa_fp8(self, **a):
                self.args = a
                self.outs = [T(uid=None) for _ in range(4)]
                return self.outs

            def validate(self):
                pass

            def build_operation_graph(self):
                pass

            def create_execution_plans(self, modes):
                pass

            def check_support(self):
                if self.outs[0].dt not in fake.outs:
                    raise RuntimeError("No valid engine configs for O %s" % self.outs[0].dt)

            def build_plans(self):
                fake.built.append(self.outs[0].dt)

            def get_workspace_size(self):
                return 0

            def get_plan_name_at_index(self, i):
                return "fake_engine"

            def execute(self, vp, ws, handle):
                t = fake.torch
                a = self.args
                u = {k: a[k].uid for k in ("q", "k", "v", "descale_q", "descale_k", "descale_v", "scale_o")}
                q, k, v = (vp[u[x]].float() for x in ("q", "k", "v"))
                dq, dk, dv, so = (float(vp[u[x]].reshape(-1)[0]) for x in ("descale_q", "descale_k", "descale_v",
                                                                           "scale_o"))
                s = (q @ k.transpose(-1, -2)) * (dq * dk * a["attn_scale"])
                if a.get("right_bound") == 0:
                    n = s.shape[-1]
                    s = s.masked_fill(t.ones(n, n, dtype=t.bool).triu(1), float("-inf"))
                o = t.softmax(s, -1) @ v * (1.0 if fake.bug else dv)
                out = vp[self.outs[0].uid]
                if out.dtype == t.float8_e4m3fn:
                    o = (o * so).clamp(-448, 448)
                out.copy_(o.to(out.dtype))
                vp[self.outs[1].uid].copy_(t.logsumexp(s, -1, keepdim=True))

        self.pygraph = Graph
        self._pybind_module = NS(backend_graph=Graph)

    def create_handle(self):
        self.handles.append(object())
        return self.handles[-1]

    def set_stream(self, h, s):
        pass

    def destroy_handle(self, h):
        self.handles.remove(h)


class CudnnFp8Graph(unittest.TestCase):
    """peer_cudnn_fp8.CudnnFp8 against FakeCudnn on the CPU: the output dtypes it falls back through,
    the variant pack, the check of what comes back, and a shape no graph builds for."""

    def setUp(self):
        try:
            import torch
        except ImportError:
            self.skipTest("PyTorch is not importable here")
        import peer_cudnn_fp8
        self.torch, self.P = torch, peer_cudnn_fp8
        torch.manual_seed(1)
        self.q, self.k, self.v = (torch.randn(1, 2, 128, 64).bfloat16() for _ in range(3))
        self.f = self.P.fp8_inputs(torch, self.q, self.k, self.v)

    def run_fake(self, causal, **kw):
        fake = FakeCudnn(self.torch, **kw)
        peer = self.P.CudnnFp8(self.torch, fake, 1, 2, 2, 128, 128, 64, causal, device="cpu")
        o, lse = peer.run(self.f)
        res = self.P.check(self.torch, o, self.q, self.k, self.v, self.f, causal, peer.out, peer.scale_o)
        peer.close()
        self.assertEqual(fake.handles, [])
        return peer, fake, res

    def test_bf16_first_then_fp16_then_fp8_each_checked(self):
        for outs, want in ((("bf16", "fp16", "fp8"), "bf16"), (("fp16", "fp8"), "fp16"), (("fp8",), "fp8")):
            for causal in (False, True):
                peer, fake, (err, bad, det) = self.run_fake(causal, outs=outs)
                self.assertEqual((peer.out, fake.built), (want, [want]))
                self.assertIsNone(bad, (outs, causal, det))
                self.assertIn("O %s" % want, peer.note())
                self.assertIn("plan fake_engine", peer.note())
                self.assertEqual(len(peer.tried), 2 * ("bf16", "fp16", "fp8").index(want), peer.tried)

    def test_the_cpp_graph_gets_device_pointers(self):
        fake = FakeCudnn(self.torch)
        seen = []

        class Cpp(fake.pygraph):  # 1.32's C++ graph: no execute(), _execute(uid -> pointer, workspace, handle)
            execute = None

            def _execute(self, ptrs, ws, handle):
                seen.append((ptrs, ws, handle))
        fake._pybind_module.backend_graph = Cpp
        peer = self.P.CudnnFp8(self.torch, fake, 1, 2, 2, 128, 128, 64, False, api="backend", device="cpu")
        o, stats = peer.outputs()
        peer.fn(self.f, o, stats)()
        ptrs, ws, handle = seen[0]
        self.assertEqual(ptrs[self.P.UID["q"]], self.f["q8"].data_ptr())
        self.assertEqual(ptrs[self.P.UID["o"]], o.data_ptr())
        self.assertEqual(set(ptrs), {u for k, u in self.P.UID.items() if k != "amax_s"})  # amax_s left virtual
        self.assertEqual((ws, handle), (peer.workspace.data_ptr(), fake.handles[0]))

    def test_a_wrong_result_fails_and_no_graph_is_unsupported(self):
        _, _, (err, bad, det) = self.run_fake(False, bug=True)
        self.assertIsNotNone(bad)
        with self.assertRaises(NotImplementedError) as e:
            self.P.CudnnFp8(self.torch, FakeCudnn(self.torch, outs=()), 1, 2, 2, 128, 128, 64, True, device="cpu")
        self.assertIn("No valid engine configs", str(e.exception))


class SparsePeers(unittest.TestCase):
    """bench/ch06_masks.py's structured sparse patterns: FlexAttention's mask_mod against each paper's
    definition written again here (pair by pair), against the kept pairs of the chapter binary's CPU
    model where one is built, and Flex's output (eager, on the CPU) through the peers' fp32 check."""
    PARAMS = [("strided", {"stride": 1}), ("strided", {"stride": 19}), ("strided", {"stride": 128}),
              ("fixed", {"block": 1, "summary": 1}), ("fixed", {"block": 23, "summary": 5}),
              ("fixed", {"block": 16, "summary": 0}), ("fixed", {"block": 128, "summary": 16}),
              ("longformer", {"left": 0, "globals": 0}), ("longformer", {"left": 9, "globals": 3}),
              ("longformer", {"left": 256, "globals": 1}),
              ("bigbird", {"block": 1, "globals": 0, "random": 0, "seed": 7}),
              ("bigbird", {"block": 23, "globals": 2, "random": 2, "seed": 7}),
              ("bigbird", {"block": 16, "globals": 0, "random": 64, "seed": 7}),
              ("bigbird", {"block": 64, "globals": 2, "random": 3, "seed": 7})]

    @staticmethod
    def definition(name, p, n, q, j):
        """Key j of query q at Nq = Nk = n: Child et al. 2019 (strided, fixed), Beltagy et al. 2020,
        Zaheer et al. 2020 (the random blocks: the chapter's hash of (seed, query block, draw))."""
        import ch06_masks as M
        if name == "strided":
            return j <= q and (q - j < p["stride"] or (q - j) % p["stride"] == 0)
        if name == "fixed":
            l, c = p["block"], p["summary"]
            return j <= q and (q // l == j // l or j % l in range(l - c, l))
        if name == "longformer":
            return abs(q - j) <= p["left"] or q < p["globals"] or j < p["globals"]
        b = p["block"]
        qb, kb, nb = q // b, j // b, -(-n // b)
        draws = [M.hash3(p["seed"], qb, k) % nb for k in range(p["random"])]
        return abs(qb - kb) <= 1 or kb < p["globals"] or qb < p["globals"] or kb in draws

    def torch_or_skip(self):
        try:
            import torch
        except Exception:  # noqa: BLE001
            self.skipTest("no PyTorch here")
        return torch

    def test_mask_mods_are_the_definitions(self):
        torch = self.torch_or_skip()
        import ch06_masks as M
        for n in (1, 7, 150, 333):
            for name, p in self.PARAMS:
                mm, sm, sink = M.mask_fns(torch, name, p, n, 2, "cpu")
                self.assertIsNone(sm)
                self.assertIsNone(sink)
                got = mm(0, 0, torch.arange(n)[:, None], torch.arange(n)[None, :]).expand(n, n).tolist()
                want = [[self.definition(name, p, n, q, j) for j in range(n)] for q in range(n)]
                wrong = sum(g != w for gr, wr in zip(got, want) for g, w in zip(gr, wr))
                self.assertEqual(wrong, 0, (name, p, n))

    def test_kept_pairs_and_parameters_agree_with_the_binary(self):
        torch = self.torch_or_skip()
        import ch06_masks as M
        binary = os.environ.get("CH06_VARIANTS") or os.path.join(os.path.dirname(HERE), "build", "bin", "ch06_variants")
        if not os.access(binary, os.X_OK):
            self.skipTest("no ch06_variants at %s (CH06_VARIANTS names one)" % binary)
        import subprocess
        H, d = 2, 32
        for n in (150, 777):
            for name, p in self.PARAMS:
                if name == "fixed" and p["summary"] > p["block"]:
                    continue
                cmd = [binary, "mask", "--device", "cpu", "--mask", name, "--n", str(n), "--heads", str(H),
                       "--kv-heads", str(H), "--d", str(d), "--batch", "1", "--json", "--no-backward",
                       "--check-mflops", "20"] + M.sparse_args(name, p)
                rep = json.loads(subprocess.run(cmd, capture_output=True, text=True).stdout)
                note = M.spec_of_note(rep, name)
                got = M.params_from_note(name, note)
                self.assertEqual({k: got.get(k) for k in p}, p, note)
                row = [r for r in rep["results"] if r["impl"] == name + ": model forward"][0]
                self.assertTrue(row["pass"])
                mm, _, _ = M.mask_fns(torch, name, p, n, H, "cpu")
                kept = int(mm(0, 0, torch.arange(n)[:, None], torch.arange(n)[None, :]).expand(n, n).sum())
                self.assertEqual(row["flops"], 2.0 * kept * H * (d + d), (name, p, n))  # the binary's count

    def test_flex_passes_the_peers_check_and_a_wrong_mask_fails_it(self):
        torch = self.torch_or_skip()
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        except Exception:  # noqa: BLE001
            self.skipTest("no FlexAttention here")
        import warnings
        import ch06_masks as M
        n, heads, d = 512, 2, 64
        g = torch.Generator().manual_seed(1)
        q, k, v = (torch.randn(1, heads, n, d, dtype=torch.bfloat16, generator=g) for _ in range(3))
        rows = torch.tensor([0, 1, 100, 255, 256, 300, 510, 511])
        hc = [0, heads - 1]

        def check(mm_flex, mm_ref):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                bm = create_block_mask(mm_flex, 1, None, n, n, device="cpu")
                got = flex_attention(q, k, v, block_mask=bm)[0][hc][:, rows].float()
            ref = M.reference_rows(torch, q, k, v, mm_ref, None, None, hc, rows)
            err = (got - ref).abs().max().item()
            return err <= 2e-2 * max(1.0, ref.abs().max().item())
        tables = {"strided": {"stride": 128}, "fixed": {"block": 128, "summary": 16},
                  "longformer": {"left": 100, "globals": 1}, "bigbird": {"block": 64, "globals": 1, "random": 2, "seed": 7}}
        for name, p in tables.items():
            mm, _, _ = M.mask_fns(torch, name, p, n, heads, "cpu")
            self.assertTrue(check(mm, mm), name)
        # bigbird's random blocks drawn with another seed: the check sees it
        mm7, _, _ = M.mask_fns(torch, "bigbird", tables["bigbird"], n, heads, "cpu")
        mm8, _, _ = M.mask_fns(torch, "bigbird", dict(tables["bigbird"], seed=8), n, heads, "cpu")
        self.assertFalse(check(mm8, mm7))


if __name__ == "__main__":
    unittest.main(verbosity=1)
