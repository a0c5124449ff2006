"""ctypes wrapper over the int8 global average pool (plugins/avgpool/avgpool.h), and its numpy reference.

Device memory is passed as integer pointers, as in trtfuse.ops.residual_conv (same kernels library)."""

from __future__ import annotations

import ctypes
import functools

import numpy as np


@functools.cache
def _lib() -> ctypes.CDLL:
    from trtfuse.ops.residual_conv import library

    lib = library()   # the kernels library, loaded once
    lib.trtfuse_avgpool_int8_forward.argtypes = [ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int] * 3 + [
        ctypes.c_float, ctypes.c_void_p]
    lib.trtfuse_avgpool_error_string.restype = ctypes.c_char_p
    lib.trtfuse_avgpool_error_string.argtypes = [ctypes.c_int]
    return lib


def avgpool_int8(x_ptr: int, out_ptr: int, n: int, c: int, hw: int, x_scale: float, stream: int = 0) -> None:
    """out [n, c] float32 = x_scale * mean over hw of x, x int8 kCHW32 [n, ceil(c / 32), hw, 32] (device pointers)."""
    st = _lib().trtfuse_avgpool_int8_forward(x_ptr, out_ptr, n, c, hw, x_scale, stream)
    if st != 0:
        raise RuntimeError(f"trtfuse_avgpool_int8_forward failed ({st}): {_lib().trtfuse_avgpool_error_string(st).decode()}")


def avgpool_reference(x: np.ndarray, x_scale: float) -> np.ndarray:
    """The kernel's value of x int8 [n, c, h, w]: the exact int sum, times x_scale, then / hw, each in fp32
    ([n, c, 1, 1])."""
    n, c, h, w = x.shape
    s = x.astype(np.int64).reshape(n, c, h * w).sum(axis=2).astype(np.float32)
    return ((s * np.float32(x_scale)) / np.float32(h * w)).astype(np.float32).reshape(n, c, 1, 1)
