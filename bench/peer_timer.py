"""One event timer for every peer, timed as the chapter binaries time ours.

The chapter binaries time with `time_gpu()` (common/cuda/runtime.cu); this is the same loop for a
Python callable on the GPU (PyTorch SDPA, FlexAttention, FlashAttention-4):

    warm-up   3 calls, then a synchronize
    repeat    20 times: flush L2, record an event, the call, record an event, wait
    result    the median of the 20 event times, in ms

The flush leaves L2 clean, as time_gpu()'s does. It writes a scrap buffer of twice the L2 (every
line of the previous call's data is evicted), then reads a second buffer of twice the L2, whose
clean lines push the write's dirty lines out before the first event is recorded:

    write scrap    L2: [dirty scrap lines .............]   <- the write alone ends here
    read second    L2: [clean lines of the second buffer]  (the dirty ones written back now)
    timed call     every miss evicts a clean line: no write-back shares DRAM with the call

After the write alone, each line the timed call misses on evicts a dirty line, and the write-backs
cost every short measurement about 8 us (chapter 07's probe,
chapters/07_paged_radix/scripts/flush_probe.py). `TUTORIAL_L2_FLUSH=write` selects the write alone
(the flush before this one), for before/after comparisons, in the binaries and here alike.

    timer = PeerTimer(torch)
    ms = timer(fn)             # the median
    ms_list = timer.samples(fn)  # the 20 times, in order

For the diagnostics that ask what the timed interval holds besides the kernel (bench/flush_ab.py,
chapters/05_fa3_hopper/scripts/peer_gap.py): `PeerTimer(torch, spin_cycles=spin_cycles(torch, us))`
keeps the GPU busy for about `us` microseconds after each flush, so that the call is already queued
when the GPU reaches the first event.
"""
import os
import statistics


def spin_cycles(torch, us, probe=200000):
    """The torch.cuda._sleep() argument that keeps the GPU busy for about `us` microseconds,
    measured once with a spin of `probe` cycles (after a short one that warms the path)."""
    c0, c1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1000)
    c0.record()
    torch.cuda._sleep(probe)
    c1.record()
    c1.synchronize()
    return int(probe * us / (c0.elapsed_time(c1) * 1e3))


def flush_mode():
    """'write' (the write alone) when TUTORIAL_L2_FLUSH=write, else 'clean'."""
    return "write" if os.environ.get("TUTORIAL_L2_FLUSH", "") == "write" else "clean"


class PeerTimer:
    def __init__(self, torch, repeats=20, warmup=3, mode=None, spin_cycles=0):
        self.torch = torch
        self.repeats, self.warmup = repeats, warmup
        self.spin = spin_cycles  # a GPU spin after each flush (0: none)
        self.mode = mode or flush_mode()
        if self.mode not in ("clean", "write"):
            raise ValueError("flush mode is 'clean' or 'write', not %r" % self.mode)
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        l2 = getattr(props, "L2_cache_size", 0) or (64 << 20)
        n = max(2 * l2, 64 << 20)
        self.scrap = torch.empty(n, dtype=torch.uint8, device="cuda")
        # the read buffer as int64, so that the read is a plain streaming reduction of 8-byte words
        self.second = torch.zeros(n // 8, dtype=torch.int64, device="cuda") if self.mode == "clean" else None
        self.flush_bytes = n

    def flush(self, r=0):
        """The flush before repeat r (asynchronous, on the current stream)."""
        self.scrap.fill_(r & 0xFF)
        if self.second is not None:
            self.second.sum()
        if self.spin:
            self.torch.cuda._sleep(self.spin)

    def samples(self, fn):
        """The event times (ms) of `repeats` calls of fn, each after a flush, in call order."""
        torch = self.torch
        for _ in range(self.warmup):
            fn()
        torch.cuda.synchronize()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ms = []
        for r in range(self.repeats):
            self.flush(r)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            ms.append(start.elapsed_time(stop))
        return ms

    def median(self, fn):
        return statistics.median(self.samples(fn))

    __call__ = median

    def describe(self):
        what = ("a %d MB buffer written, then a second one read (L2 left clean)" if self.mode == "clean"
                else "a %d MB buffer written (L2 left dirty: TUTORIAL_L2_FLUSH=write)")
        return "median of %d event-timed calls after %d warm-ups; before each, %s%s" % (
            self.repeats, self.warmup, what % (self.flush_bytes >> 20),
            ", then a GPU spin of %d cycles" % self.spin if self.spin else "")
