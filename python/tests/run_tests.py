#!/usr/bin/env python3
"""Runs python/tests without pytest (pytest runs the same files: `python3 -m pytest python/tests`).

    run_tests.py [--cpu | --gpu] [-k SUBSTRING]

--cpu: the test_*_cpu.py files; --gpu: test_gpu.py; neither: all. Exit 0 when every test
passed or skipped, 1 on a failure, and 77 (ctest's skip) with --gpu when every test skipped
(no GPU, no library, or not sm_90), or when torch is not importable.
"""

import argparse
import importlib.util
import sys
import traceback
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
SKIP_CODE = 77


def main():
    ap = argparse.ArgumentParser()
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--cpu", action="store_true")
    group.add_argument("--gpu", action="store_true")
    ap.add_argument("-k", default="")
    args = ap.parse_args()
    try:
        import torch  # noqa: F401
    except ImportError:
        print("python tests: torch is not importable: skipped")
        return SKIP_CODE
    sys.path.insert(0, str(HERE))
    files = sorted(HERE.glob("test_*.py"))
    if args.cpu:
        files = [f for f in files if f.stem.endswith("_cpu")]
    elif args.gpu:
        files = [f for f in files if not f.stem.endswith("_cpu")]
    passed = skipped = failed = 0
    for path in files:
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for name in sorted(n for n in dir(module) if n.startswith("test_") and args.k in n):
            try:
                getattr(module, name)()
            except unittest.SkipTest as e:
                skipped += 1
                print(f"SKIP {path.stem}::{name}: {e}")
            except Exception:  # noqa: BLE001 - every failure is reported
                failed += 1
                print(f"FAIL {path.stem}::{name}")
                traceback.print_exc()
            else:
                passed += 1
                print(f"ok   {path.stem}::{name}")
    print(f"python tests: {passed} passed, {skipped} skipped, {failed} failed")
    if failed:
        return 1
    if args.gpu and passed == 0:
        return SKIP_CODE
    return 0


if __name__ == "__main__":
    sys.exit(main())
