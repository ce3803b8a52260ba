"""What the tests share, usable with pytest or with run_tests.py (no pytest needed).

A skip is unittest.SkipTest, which pytest reports as skipped too.
"""

import re
import sys
import unittest
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

try:
    import torch
except ImportError:  # pragma: no cover - the runner reports it
    torch = None


def skip(reason):
    raise unittest.SkipTest(reason)


def need_torch():
    if torch is None:
        skip("torch is not importable")


def need_gpu():
    """Skips unless a Hopper GPU and the C library are there."""
    need_torch()
    if not torch.cuda.is_available():
        skip("no CUDA device")
    import attn_lineage
    if not attn_lineage.library_available():
        skip("the C library is not built (./tutorial python)")
    if torch.cuda.get_device_capability() != (9, 0):
        skip(f"{torch.cuda.get_device_name()} is not sm_90 (the kernels are sm_90a)")


@contextmanager
def raises(kind, match):
    """Asserts that the block raises `kind` with a message matching the regex `match`."""
    try:
        yield
    except kind as e:
        if not re.search(match, str(e)):
            raise AssertionError(f"{kind.__name__} raised, but {str(e)!r} does not match {match!r}") from e
        return
    raise AssertionError(f"{kind.__name__} not raised (expected one matching {match!r})")
