"""Loading the C library (python/csrc/lineage_c.h) with ctypes, and calling it.

The library is ``libattn_lineage_c.so``, built by ``./tutorial python`` into ``build/lib/``.
It is looked for, in order, at ``$ATTN_LINEAGE_LIB`` (a path to the file), in
``$ATTN_LINEAGE_BUILD/lib`` and in ``build/lib`` of this repository. It is loaded on the first
call that needs a GPU, never at import: the package imports (and traces, and checks its
arguments) on a machine without CUDA.
"""

import ctypes
import os
import threading
from pathlib import Path

ABI_VERSION = 5
LIB_NAME = "libattn_lineage_c.so"

OK, BAD_ARGUMENT, NO_KERNEL, CUDA_ERROR = 0, 1, 2, 3
BF16, F16 = 0, 1
KV_FP8_E4M3, KV_INT8 = 2, 3  # the formats of an 8-bit KV cache

_ERR_LEN = 1024
_lock = threading.Lock()
_lib = None
_load_error = None


class LibraryNotFound(RuntimeError):
    """The C library is not built (or not found): ``./tutorial python`` builds it."""


class KernelError(RuntimeError):
    """A CUDA call inside the library failed (the message says which)."""


def candidates():
    """Where the library is looked for, in order."""
    out = []
    if os.environ.get("ATTN_LINEAGE_LIB"):
        out.append(Path(os.environ["ATTN_LINEAGE_LIB"]))
    if os.environ.get("ATTN_LINEAGE_BUILD"):
        out.append(Path(os.environ["ATTN_LINEAGE_BUILD"]) / "lib" / LIB_NAME)
    out.append(Path(__file__).resolve().parents[2] / "build" / "lib" / LIB_NAME)
    return out


def _declare(lib):
    c_int, c_size_t, c_float, c_void_p, c_char_p = (ctypes.c_int, ctypes.c_size_t, ctypes.c_float,
                                                     ctypes.c_void_p, ctypes.c_char_p)
    lib.attn_lineage_abi_version.argtypes = []
    lib.attn_lineage_abi_version.restype = c_int
    lib.attn_lineage_device_ready.argtypes = [c_int, c_char_p, c_size_t]
    lib.attn_lineage_device_ready.restype = c_int
    lib.attn_lineage_fa3_forward.argtypes = ([c_int, c_void_p, c_int] + [c_void_p] * 5 + [c_int] * 6 +
                                             [c_float, c_int, c_char_p, c_size_t])
    lib.attn_lineage_fa3_forward.restype = c_int
    lib.attn_lineage_fa3_backward_workspace.argtypes = [c_int] * 4 + [ctypes.POINTER(c_size_t), c_char_p, c_size_t]
    lib.attn_lineage_fa3_backward_workspace.restype = c_int
    lib.attn_lineage_fa3_backward.argtypes = ([c_int, c_void_p, c_int] + [c_void_p] * 10 + [c_size_t] + [c_int] * 6 +
                                              [c_float, c_int, c_int, c_char_p, c_size_t])
    lib.attn_lineage_fa3_backward.restype = c_int
    lib.attn_lineage_paged_decode_workspace.argtypes = [c_int] * 7 + [ctypes.POINTER(c_size_t), c_char_p, c_size_t]
    lib.attn_lineage_paged_decode_workspace.restype = c_int
    lib.attn_lineage_paged_decode.argtypes = ([c_int] + [c_void_p] * 9 + [c_size_t] + [c_int] * 6 +
                                              [c_float, c_char_p, c_size_t])
    lib.attn_lineage_paged_decode.restype = c_int
    lib.attn_lineage_paged_decode_8bit_workspace.argtypes = [c_int] * 8 + [ctypes.POINTER(c_size_t), c_char_p,
                                                                           c_size_t]
    lib.attn_lineage_paged_decode_8bit_workspace.restype = c_int
    lib.attn_lineage_paged_decode_8bit.argtypes = ([c_int, c_void_p, c_int] + [c_void_p] * 10 + [c_size_t] +
                                                   [c_int] * 7 + [c_float, c_char_p, c_size_t])
    lib.attn_lineage_paged_decode_8bit.restype = c_int
    lib.attn_lineage_masked_forward.argtypes = ([c_int, c_void_p, c_int] + [c_void_p] * 5 + [c_int] * 6 +
                                                [c_float, c_int, c_int, c_int, c_float, c_void_p,
                                                 ctypes.POINTER(c_int), c_int, c_char_p, c_size_t])
    lib.attn_lineage_masked_forward.restype = c_int
    lib.attn_lineage_masked_backward.argtypes = ([c_int, c_void_p, c_int] + [c_void_p] * 11 + [c_size_t] +
                                                 [c_int] * 6 + [c_float, c_int, c_int, c_int, c_float, c_void_p,
                                                                c_int, c_char_p, c_size_t])
    lib.attn_lineage_masked_backward.restype = c_int
    lib.attn_lineage_mla_decode_workspace.argtypes = [c_int] * 5 + [ctypes.POINTER(c_size_t), c_char_p, c_size_t]
    lib.attn_lineage_mla_decode_workspace.restype = c_int
    lib.attn_lineage_mla_decode.argtypes = ([c_int] + [c_void_p] * 5 + [c_size_t] + [c_int] * 4 +
                                            [c_float, c_char_p, c_size_t])
    lib.attn_lineage_mla_decode.restype = c_int


def load():
    """The loaded library; LibraryNotFound (with what to run) when there is none."""
    global _lib, _load_error
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for path in candidates():
            if not path.is_file():
                tried.append(f"{path} (missing)")
                continue
            try:
                lib = ctypes.CDLL(str(path))
            except OSError as e:
                tried.append(f"{path} ({e})")
                continue
            _declare(lib)
            version = lib.attn_lineage_abi_version()
            if version != ABI_VERSION:
                tried.append(f"{path} (ABI version {version}, this package needs {ABI_VERSION}: rebuild it)")
                continue
            _lib = lib
            return lib
        raise LibraryNotFound("attn_lineage: the C library is not built; run `./tutorial python` "
                              "(or set ATTN_LINEAGE_LIB). Tried: " + "; ".join(tried))


def available():
    """True when the C library loads (says nothing about the GPU)."""
    try:
        load()
        return True
    except LibraryNotFound:
        return False


def _buffer():
    return ctypes.create_string_buffer(_ERR_LEN)


def check(code, err, what):
    """Turns a return code into the exception the API promises."""
    if code == OK:
        return
    msg = f"{what}: {err.value.decode(errors='replace')}"
    if code == BAD_ARGUMENT or code == NO_KERNEL:
        raise ValueError(msg)
    raise KernelError(msg)


def device_ready(device):
    """None when the GPU `device` (an index) runs the kernels, else the reason."""
    lib = load()
    err = _buffer()
    code = lib.attn_lineage_device_ready(int(device), err, _ERR_LEN)
    return None if code == OK else err.value.decode(errors="replace")


def fa3_forward(device, stream, dtype, q, k, v, o, lse, batch, heads, kv_heads, nq, nk, d, scale, causal):
    lib = load()
    err = _buffer()
    code = lib.attn_lineage_fa3_forward(device, stream, dtype, q, k, v, o, lse, batch, heads, kv_heads, nq, nk, d,
                                        float(scale), int(causal), err, _ERR_LEN)
    check(code, err, "attn_lineage forward")


def fa3_backward_workspace(batch, heads, nq, d):
    lib = load()
    err = _buffer()
    out = ctypes.c_size_t(0)
    check(lib.attn_lineage_fa3_backward_workspace(batch, heads, nq, d, ctypes.byref(out), err, _ERR_LEN), err,
          "attn_lineage backward")
    return out.value


def fa3_backward(device, stream, dtype, q, k, v, o, dout, lse, dq, dk, dv, workspace, workspace_bytes, batch, heads,
                 kv_heads, nq, nk, d, scale, causal, deterministic):
    lib = load()
    err = _buffer()
    code = lib.attn_lineage_fa3_backward(device, stream, dtype, q, k, v, o, dout, lse, dq, dk, dv, workspace,
                                         workspace_bytes, batch, heads, kv_heads, nq, nk, d, float(scale), int(causal),
                                         int(deterministic), err, _ERR_LEN)
    check(code, err, "attn_lineage backward")


def paged_decode_workspace(device, batch, heads, kv_heads, d, max_pages, page_size):
    lib = load()
    err = _buffer()
    out = ctypes.c_size_t(0)
    check(lib.attn_lineage_paged_decode_workspace(device, batch, heads, kv_heads, d, max_pages, page_size,
                                                  ctypes.byref(out), err, _ERR_LEN), err, "attn_lineage paged decode")
    return out.value


def paged_decode(device, stream, q, k_pool, v_pool, block_table, seqlens, o, lse, workspace, workspace_bytes, batch,
                 heads, kv_heads, d, max_pages, page_size, scale):
    lib = load()
    err = _buffer()
    code = lib.attn_lineage_paged_decode(device, stream, q, k_pool, v_pool, block_table, seqlens, o, lse, workspace,
                                         workspace_bytes, batch, heads, kv_heads, d, max_pages, page_size,
                                         float(scale), err, _ERR_LEN)
    check(code, err, "attn_lineage paged decode")


def paged_decode_8bit_workspace(device, kv_format, batch, heads, kv_heads, d, max_pages, page_size):
    lib = load()
    err = _buffer()
    out = ctypes.c_size_t(0)
    check(lib.attn_lineage_paged_decode_8bit_workspace(device, kv_format, batch, heads, kv_heads, d, max_pages,
                                                       page_size, ctypes.byref(out), err, _ERR_LEN), err,
          "attn_lineage 8-bit paged decode")
    return out.value


def paged_decode_8bit(device, stream, kv_format, q, k_codes, v_codes, k_scale, v_scale, block_table, seqlens, o, lse,
                      workspace, workspace_bytes, batch, heads, kv_heads, d, num_pages, max_pages, page_size, scale):
    lib = load()
    err = _buffer()
    code = lib.attn_lineage_paged_decode_8bit(device, stream, kv_format, q, k_codes, v_codes, k_scale, v_scale,
                                              block_table, seqlens, o, lse, workspace, workspace_bytes, batch, heads,
                                              kv_heads, d, num_pages, max_pages, page_size, float(scale), err,
                                              _ERR_LEN)
    check(code, err, "attn_lineage 8-bit paged decode")


def masked_forward(device, stream, dtype, q, k, v, o, lse, batch, heads, kv_heads, nq, nk, d, scale, causal,
                   window_left, window_right, softcap, sinks, cu_seqlens):
    """Chapter 06's final masked forward. sinks: a device pointer or None; cu_seqlens: a list of
    ints (host) or None."""
    lib = load()
    err = _buffer()
    if cu_seqlens is None:
        cu, docs = None, 0
    else:
        cu, docs = (ctypes.c_int * len(cu_seqlens))(*cu_seqlens), len(cu_seqlens) - 1
    code = lib.attn_lineage_masked_forward(device, stream, dtype, q, k, v, o, lse, batch, heads, kv_heads, nq, nk, d,
                                           float(scale), int(causal), int(window_left), int(window_right),
                                           float(softcap), sinks, cu, docs, err, _ERR_LEN)
    check(code, err, "attn_lineage masked forward")


def masked_backward(device, stream, dtype, q, k, v, o, dout, lse, dq, dk, dv, dsink, workspace, workspace_bytes,
                    batch, heads, kv_heads, nq, nk, d, scale, causal, window_left, window_right, softcap, sinks,
                    deterministic):
    """Chapter 06's sm90a masked backward. sinks, dsink: device pointers or None; the workspace is
    fa3_backward_workspace()'s."""
    lib = load()
    err = _buffer()
    code = lib.attn_lineage_masked_backward(device, stream, dtype, q, k, v, o, dout, lse, dq, dk, dv, dsink, workspace,
                                            workspace_bytes, batch, heads, kv_heads, nq, nk, d, float(scale),
                                            int(causal), int(window_left), int(window_right), float(softcap), sinks,
                                            int(deterministic), err, _ERR_LEN)
    check(code, err, "attn_lineage masked backward")


def mla_decode_workspace(device, batch, heads, nq, nk):
    lib = load()
    err = _buffer()
    out = ctypes.c_size_t(0)
    check(lib.attn_lineage_mla_decode_workspace(device, batch, heads, nq, nk, ctypes.byref(out), err, _ERR_LEN), err,
          "attn_lineage MLA decode")
    return out.value


def mla_decode(device, stream, q, kv, o, workspace, workspace_bytes, batch, heads, nq, nk, scale):
    lib = load()
    err = _buffer()
    code = lib.attn_lineage_mla_decode(device, stream, q, kv, o, workspace, workspace_bytes, batch, heads, nq, nk,
                                       float(scale), err, _ERR_LEN)
    check(code, err, "attn_lineage MLA decode")
