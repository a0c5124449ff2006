"""Where a DLPack tensor's data is: its address, shape and device, read from the capsule itself.

Triton's Python backend hands a GPU input tensor over as DLPack (``Tensor.to_dlpack()``); the TensorRT
backend needs only its device address and row count to copy it into an engine's input, so no array
library (PyTorch, CuPy) is needed to read it. The layout is DLPack's ABI (dlpack.h, stable since 0.2):
a ``DLManagedTensor`` begins with its ``DLTensor``.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

CPU, CUDA = 1, 2  # DLDeviceType: kDLCPU, kDLCUDA


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32), ("dtype", _DataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


@dataclass(frozen=True)
class Placement:
    address: int             # the first element (data + byte_offset)
    shape: tuple[int, ...]
    itemsize: int
    device_type: int         # CPU or CUDA
    device_id: int


_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def placement(capsule) -> Placement:
    """Where the tensor of a (not yet consumed) DLPack capsule lives. It must be C-contiguous: the
    copy that reads it takes its rows as one run. The capsule owns the memory: keep it alive while the
    address is used."""
    t = _Tensor.from_address(_get_pointer(capsule, b"dltensor"))
    shape = tuple(t.shape[i] for i in range(t.ndim))
    itemsize = t.dtype.bits * t.dtype.lanes // 8
    if t.strides:
        expected, step = [], 1
        for dim in reversed(shape):
            expected.insert(0, step)
            step *= dim
        got = [t.strides[i] for i in range(t.ndim)]
        if any(g != e for g, e, d in zip(got, expected, shape) if d > 1):
            raise ValueError(f"a DLPack tensor with strides {got} (elements) is not C-contiguous {shape}")
    return Placement((t.data or 0) + t.byte_offset, shape, itemsize, t.device.device_type, t.device.device_id)
