"""trtfuse.ops.gpu_timing: the spin queued ahead of timed launches (plugins/common/gpu_spin.cu)."""

import ctypes

import pytest

from trtfuse.ops import gpu_timing


def test_the_spin_covers_twice_the_hosts_time_for_the_calls_within_bounds():
    assert gpu_timing.spin_ns(100, 20e-6) == 4_000_000
    assert gpu_timing.spin_ns(10, 1e-6) == 1_000_000  # never under 1 ms
    assert gpu_timing.spin_ns(1000, 1.0) == gpu_timing.MAX_SPIN_NS


def test_the_warm_up_makes_every_call_once_in_order():
    calls = []
    assert gpu_timing.warm_up(calls.append, 5) >= 0
    assert calls == [0, 1, 2, 3, 4]
    assert gpu_timing.warm_up(calls.append, 0) == 1e-3 and calls == [0, 1, 2, 3, 4]   # none: a nominal 1 ms


def test_the_kernels_library_exports_the_spin():
    from test_residual_conv import _kernels_lib

    assert hasattr(_kernels_lib().library(), "trtfuse_gpu_spin")


@pytest.mark.gpu
def test_work_queued_behind_the_spin_runs_after_it_and_the_stream_drains():
    """The mechanism, not a duration: the spin launches on the stream, a copy queued behind it lands once the stream
    drains, and the stream reports no error (the spin ends: a synchronize returns)."""
    import numpy as np
    from test_residual_conv import Cuda

    cuda = Cuda()
    src = np.arange(256, dtype=np.uint8)
    dst = cuda.upload(np.zeros(256, np.uint8))
    src_dev = cuda.upload(src)
    try:
        gpu_timing.queue_ahead(0, 1, 0.0)   # the shortest spin, 1 ms
        cuda.ok(cuda.rt.cudaMemcpyAsync(dst, src_dev, ctypes.c_size_t(256), 3, None))  # device to device
        cuda.sync()
        assert (cuda.download(dst, src) == src).all()
    finally:
        cuda.free(dst, src_dev)
