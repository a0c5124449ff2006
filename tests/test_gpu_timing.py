"""trtfuse.ops.gpu_timing: the spin queued ahead of timed launches (plugins/common/gpu_spin.cu)."""

import ctypes

import pytest

from trtfuse.ops import gpu_timing


def test_the_spin_covers_twice_the_hosts_time_for_the_calls_within_bounds():
    assert gpu_timing.spin_ns(100, 20e-6) == 4_000_000
    assert gpu_timing.spin_ns(10, 1e-6) == 1_000_000  # never under 1 ms
    assert gpu_timing.spin_ns(1000, 1.0) == gpu_timing.MAX_SPIN_NS


def test_the_kernels_library_exports_the_spin():
    from test_residual_conv import _kernels_lib

    assert hasattr(_kernels_lib().library(), "trtfuse_gpu_spin")


@pytest.mark.gpu
def test_the_spin_holds_the_stream_for_at_least_the_time_asked():
    from test_residual_conv import Cuda

    cuda = Cuda()
    rt = cuda.rt
    start, end = ctypes.c_void_p(), ctypes.c_void_p()
    cuda.ok(rt.cudaEventCreate(ctypes.byref(start)))
    cuda.ok(rt.cudaEventCreate(ctypes.byref(end)))
    cuda.ok(rt.cudaEventRecord(start, None))
    gpu_timing.queue_ahead(0, 1, 0.005)  # 2 x 1 call x 5 ms
    cuda.ok(rt.cudaEventRecord(end, None))
    cuda.sync()
    ms = ctypes.c_float()
    cuda.ok(rt.cudaEventElapsedTime(ctypes.byref(ms), start, end))
    assert ms.value >= 10.0 * 0.999
