"""Timing short GPU work with CUDA events: hold the stream back (plugins/common/gpu_spin.cu) while the host queues
the timed launches.

At batch 1 a kernel takes a few microseconds on the GPU and its launch takes longer on the host (a ctypes call, a
TensorRT enqueue). Events recorded around each launch on an idle GPU then time the host. With a spin queued first,
the launches and their events wait behind it and run back to back, as in a CUDA graph, and each event pair times
the GPU's work."""

from __future__ import annotations

import ctypes
import functools
import time

MAX_SPIN_NS = 2_000_000_000


@functools.cache
def _spin():
    from trtfuse.ops.residual_conv import library

    f = library().trtfuse_gpu_spin
    f.argtypes = [ctypes.c_longlong, ctypes.c_void_p]
    f.restype = ctypes.c_int
    return f


def spin_ns(calls: int, host_s_per_call: float) -> int:
    """How long to hold the stream for `calls` more calls that took the host `host_s_per_call` each: twice that
    (the events recorded between them cost the host too), at least 1 ms, at most MAX_SPIN_NS."""
    return int(min(max(2e9 * calls * host_s_per_call, 1e6), MAX_SPIN_NS))


def warm_up(call, times: int) -> float:
    """call(i) for i < times; the host's seconds per call, from the second half (the first may load modules)."""
    t0 = time.perf_counter()
    for i in range(times):
        if i == times // 2:
            t0 = time.perf_counter()
        call(i)
    return (time.perf_counter() - t0) / max(times - times // 2, 1) if times else 1e-3


def queue_ahead(stream: int, calls: int, host_s_per_call: float) -> None:
    """Queue the spin on `stream` (a cudaStream_t as an int; 0: the legacy default stream)."""
    status = _spin()(spin_ns(calls, host_s_per_call), ctypes.c_void_p(int(stream) or None))
    if status:
        raise RuntimeError(f"trtfuse_gpu_spin failed: CUDA error {status}")
