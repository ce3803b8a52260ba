"""The C library's ABI through ctypes, without a GPU: its version, and that bad calls come back
as a code and a message (never an abort). Skipped when the library is not built."""

import ctypes

from harness import need_torch, raises, skip, torch

if torch is not None:
    from attn_lineage import _lib


def _lib_or_skip():
    need_torch()
    try:
        return _lib.load()
    except _lib.LibraryNotFound as e:
        skip(str(e))


def test_abi_version():
    lib = _lib_or_skip()
    assert lib.attn_lineage_abi_version() == _lib.ABI_VERSION


def test_workspace_sizes():
    _lib_or_skip()
    small = _lib.fa3_backward_workspace(1, 1, 100, 64)
    big = _lib.fa3_backward_workspace(2, 8, 1000, 128)
    assert 0 < small < big and small % 256 == 0 and big % 256 == 0
    # d = 128: blocks of 80 rows, 13 of them for 1000 rows; lse2 and delta one float a row,
    # the accumulator d floats a row, the counters two ints a block
    rows = 2 * 8 * 13 * 80
    assert big >= rows * 4 * 2 + rows * 128 * 4 + 2 * 8 * 13 * 2 * 4
    with raises(ValueError, r"head dim 256"):
        _lib.fa3_backward_workspace(1, 1, 100, 256)
    with raises(ValueError, r"positive"):
        _lib.fa3_backward_workspace(0, 1, 100, 64)


def test_calls_without_a_device_return_an_error():
    lib = _lib_or_skip()
    if torch.cuda.is_available():
        skip("a CUDA device is present: the GPU tests cover the calls")
    err = ctypes.create_string_buffer(256)
    code = lib.attn_lineage_device_ready(0, err, 256)
    assert code != _lib.OK and err.value, (code, err.value)
    null = None
    code = lib.attn_lineage_fa3_forward(0, null, _lib.BF16, null, null, null, null, null, 1, 1, 1, 128, 128, 64,
                                        0.0, 0, err, 256)
    assert code != _lib.OK and err.value
    # a message buffer of one byte (or none) is never overrun
    tiny = ctypes.create_string_buffer(1)
    assert lib.attn_lineage_device_ready(0, tiny, 1) != _lib.OK and tiny.value == b""
    assert lib.attn_lineage_device_ready(0, None, 0) != _lib.OK


def test_error_codes_become_the_promised_exceptions():
    need_torch()
    err = ctypes.create_string_buffer(b"head dim 96: no kernel")
    with raises(ValueError, r"head dim 96"):
        _lib.check(_lib.BAD_ARGUMENT, err, "forward")
    with raises(ValueError, r"sm_90a"):
        _lib.check(_lib.NO_KERNEL, ctypes.create_string_buffer(b"no kernel: built for sm_90a"), "forward")
    with raises(_lib.KernelError, r"illegal"):
        _lib.check(_lib.CUDA_ERROR, ctypes.create_string_buffer(b"illegal address"), "forward")
    _lib.check(_lib.OK, err, "forward")


def test_masked_forward_refusals_become_value_errors():
    """The masked forward checks its arguments before the device: refused here with or without a GPU."""
    _lib_or_skip()
    p = 1 << 16  # an aligned address that is never read (every call below is refused first)

    def call(d=64, left=-1, right=-1, softcap=0.0, sinks=None, cu=None, batch=1, causal=False):
        _lib.masked_forward(0, None, _lib.BF16, p, p, p, p, p, batch, 4, 2, 100, 100, d, 0.0, causal, left, right,
                            softcap, sinks, cu)

    with raises(ValueError, r"^attn_lineage masked forward: head dim 96"):
        call(d=96)
    with raises(ValueError, r"window_left must be >= -1"):
        call(left=-2)
    with raises(ValueError, r"softcap and sinks together"):
        call(softcap=3.0, sinks=p)
    with raises(ValueError, r"causal sliding window"):
        call(softcap=3.0, left=8, right=2)
    with raises(ValueError, r"document 1 is empty"):
        call(cu=[0, 50, 50, 100])
    with raises(ValueError, r"cu_seqlens\[docs\] = 90"):
        call(cu=[0, 1, 90])
    with raises(ValueError, r"batch must be 1"):
        call(cu=[0, 1, 100], batch=2)
    with raises(ValueError, r"no window"):
        call(cu=[0, 1, 100], left=4, right=0)
