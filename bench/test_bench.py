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


def table_rows(md, name):
    body = bench_report.extract_section(md, name)
    assert body is not None, "no section %s" % name
    lines = [l for l in body.splitlines() if l.startswith("|")]
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
        self.assertEqual(body[0][head.index("v7 fp8 e4m3")], "unchecked")
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
                    "hbm_read_bytes": 1.0, "hbm_write_bytes": 2.0, "flops": 6e11},
                   {"impl": "v1 loop swap", "device": "cuda", "pass": None, "tflops": None,
                    "note": "not built for d=256"},
                   {"impl": "backward, dQ atomics", "device": "cuda", "pass": True, "tflops": 200.0, "time_ms": 3.0},
                   {"impl": "ch01 cuBLAS (fwd)", "device": "cuda", "pass": True, "tflops": 50.0, "time_ms": 9.0}]}
        rows = lineage.report_rows(rep, "04", {"d": 128, "N": 8192, "causal": True})
        by = {r["kernel"]: r for r in rows}
        self.assertEqual(set(by), {"ch04 v5 exp2", "ch04 v6 final", "ch04 v1 loop swap", "ch04 backward, dQ atomics"})
        self.assertEqual(by["ch04 v5 exp2"]["status"], "failed")
        self.assertNotIn("tflops", by["ch04 v5 exp2"])
        self.assertEqual(by["ch04 v6 final"]["status"], "ok")
        self.assertEqual(by["ch04 v6 final"]["bytes"], 3.0)
        self.assertEqual(by["ch04 v1 loop swap"]["status"], "unsupported")
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

    def build(self, root, name, slow=1.0, fail=None, step_list=False):
        os.makedirs(os.path.join(root, name, "bin"))
        path = os.path.join(root, name, "bin", "ch05_fa3_hopper")
        with open(path, "w") as f:
            f.write("#!/bin/sh\nFAKE_SLOW=%s FAKE_FAIL=%s FAKE_LIST=%s exec %s %s \"$@\"\n" % (
                slow, fail or "", "1" if step_list else "", sys.executable, FAKE))
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
    def test_readme_sections_match_the_recorded_run(self):
        import bench_readme
        if not any(n.endswith(".json") for n in os.listdir(bench_readme.RECORDED)):
            self.skipTest("no recorded run yet")
        files = bench_readme.generate(bench_readme.newest_run())
        for path, new in files.items():
            self.assertEqual(open(path).read(), new, "%s differs from the recorded run: "
                             "bench/bench_readme.py --write" % path)
        readme = open(os.path.join(os.path.dirname(HERE), "README.md")).read()
        m = re.search(r"<!-- bench:lineage begin -->\n(.*?)<!-- bench:lineage end -->", readme, re.S)
        self.assertIsNotNone(m, "README.md has no generated lineage section")
        self.assertIn("Measured on one", m.group(1))


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


if __name__ == "__main__":
    unittest.main(verbosity=1)
