"""ctypes wrapper over the int8 global average pool (plugins/avgpool/avgpool.h), and its numpy reference.

Device memory is passed as integer pointers, as in trtfuse.ops.residual_conv (same kernels library). The pool writes
two int8 outputs that together carry the mean to 1/256 of the input's LSB: m = the nearest integer to 256 * sum / hw
(ties to even), hi = floor((m + 128) / 256) on the input's scale s, lo = m - 256 * hi on s / 256; the
DequantizeLinears after the plugin apply those scales, and their sum s * m / 256 is within s / 512 of the mean
(avgpool.h says why int8, and why two)."""

from __future__ import annotations

import ctypes
import functools

import numpy as np

M_MIN, M_MAX = -128 * 256, 127 * 256   # m's range: the mean of int8 values is in [-128, 127]


@functools.cache
def _lib() -> ctypes.CDLL:
    from trtfuse.ops.residual_conv import library

    lib = library()   # the kernels library, loaded once
    lib.trtfuse_avgpool_int8_forward.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 3 + [ctypes.c_void_p]
    lib.trtfuse_avgpool_round_mean256.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int8),
                                                  ctypes.POINTER(ctypes.c_int8)]
    lib.trtfuse_avgpool_round_mean256.restype = ctypes.c_int
    lib.trtfuse_avgpool_error_string.restype = ctypes.c_char_p
    lib.trtfuse_avgpool_error_string.argtypes = [ctypes.c_int]
    return lib


def avgpool_int8(x_ptr: int, hi_ptr: int, lo_ptr: int, n: int, c: int, hw: int, stream: int = 0) -> None:
    """hi, lo int8 [n, c] = the split of m, the mean over hw of x to 1/256, rounded to the nearest, ties to even
    (avgpool_reference); x int8 kCHW32 [n, ceil(c / 32), hw, 32] (device pointers; x 16-byte aligned)."""
    st = _lib().trtfuse_avgpool_int8_forward(x_ptr, hi_ptr, lo_ptr, n, c, hw, stream)
    if st != 0:
        raise RuntimeError(f"trtfuse_avgpool_int8_forward failed ({st}): {_lib().trtfuse_avgpool_error_string(st).decode()}")


def kernel_round_mean256(sum_: int, hw: int) -> tuple[int, int, int]:
    """(m, hi, lo) of one sum by the kernel's own __host__ __device__ functions, on the host (no GPU)."""
    hi, lo = ctypes.c_int8(), ctypes.c_int8()
    m = _lib().trtfuse_avgpool_round_mean256(sum_, hw, ctypes.byref(hi), ctypes.byref(lo))
    return m, hi.value, lo.value


def round_mean256(sums: np.ndarray, hw: int) -> np.ndarray:
    """m = the nearest integer to 256 * sums / hw, ties to even, exactly (int64 arithmetic: 256 * sum reaches 2^31):
    floor division, then up by one where 2 * remainder > hw, or == hw and the floor is odd; clamped to
    [M_MIN, M_MAX] (a no-op for the sums an int8 tensor has). int64."""
    num = np.asarray(sums, np.int64) * 256
    q, r = np.divmod(num, hw)   # floor division: 0 <= r < hw, negative sums too
    q = q + ((2 * r > hw) | ((2 * r == hw) & (q % 2 == 1)))
    return np.clip(q, M_MIN, M_MAX)


def split_hi_lo(m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(hi, lo) int8 of m in [M_MIN, M_MAX]: hi = floor((m + 128) / 256), lo = m - 256 * hi (m = 256 * hi + lo)."""
    m = np.asarray(m, np.int64)
    if m.size and (m.min() < M_MIN or m.max() > M_MAX):
        raise ValueError(f"m out of [{M_MIN}, {M_MAX}]")
    hi = np.floor_divide(m + 128, 256)
    return hi.astype(np.int8), (m - 256 * hi).astype(np.int8)


def join_hi_lo(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """m = 256 * hi + lo (int64)."""
    return 256 * np.asarray(hi, np.int64) + np.asarray(lo, np.int64)


def avgpool_reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's outputs for x int8 [n, c, h, w]: the exact int sum over h w, round_mean256, split_hi_lo:
    (hi, lo), each int8 [n, c, 1, 1] (hi on x's scale s, lo on s / 256)."""
    n, c, h, w = x.shape
    s = x.astype(np.int64).reshape(n, c, h * w).sum(axis=2)
    hi, lo = split_hi_lo(round_mean256(s, h * w))
    return hi.reshape(n, c, 1, 1), lo.reshape(n, c, 1, 1)
