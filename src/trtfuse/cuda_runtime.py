"""A small checked layer over the CUDA runtime from cuda-python: devices, memory, streams, events, graphs.

cuda-python names the module ``cuda.bindings.runtime`` (12.x later, 13.x) or ``cuda.cudart``
(older); both are tried. Every call returns ``(err, *values)`` there: ``check`` turns a failure into
an exception naming the call, so a failing CUDA call is never silently ignored.
"""

from __future__ import annotations

import numpy as np
from trtfuse.errors import UserError

try:  # cuda-python >= 12.6 / 13
    from cuda.bindings import runtime as cudart
except ImportError:  # pragma: no cover - older cuda-python
    try:
        from cuda import cudart  # type: ignore[no-redef]
    except ImportError as e:
        raise UserError("cuda-python is not installed (the TensorRT backend drives the GPU with it)",
                        "pip install cuda-python") from e


class CudaError(RuntimeError):
    pass


def check(result, what: str = "CUDA call"):
    """Unpack a cuda-python ``(err, *values)`` result, raising on error."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        _, name = cudart.cudaGetErrorName(err)
        raise CudaError(f"{what} failed: {name.decode() if isinstance(name, bytes) else name}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def device_count() -> int:
    err, n = cudart.cudaGetDeviceCount()
    return int(n) if int(err) == 0 else 0


def require_gpu() -> None:
    if device_count() == 0:
        raise UserError("no CUDA GPU is visible (cudaGetDeviceCount found none or the driver is missing)",
                        "run on a machine with an NVIDIA GPU and driver, or on the CPU: "
                        "`trtfuse run --backend onnxruntime`")


def set_device(device: int) -> None:
    """Make ``device`` current for the calling host thread. The current device is per thread, and
    any thread may call any GPU's backend, so a backend sets its own at the start of every call."""
    check(cudart.cudaSetDevice(int(device)), f"cudaSetDevice({device})")


def pci_bus_id(device: int) -> str:
    """The device's PCI bus id ("0000:18:00.0"): the name NVML knows it by, whatever CUDA_VISIBLE_DEVICES
    renumbered."""
    bus = check(cudart.cudaDeviceGetPCIBusId(32, int(device)), "cudaDeviceGetPCIBusId")
    return (bus.decode() if isinstance(bus, bytes) else str(bus)).rstrip("\x00").strip()


def device_name(device: int = 0) -> str:
    props = check(cudart.cudaGetDeviceProperties(device), "cudaGetDeviceProperties")
    name = props.name
    return (name.decode() if isinstance(name, bytes) else str(name)).rstrip("\x00").strip()


class DeviceBuffer:
    """``nbytes`` of device memory (cudaMalloc), freed by ``free()``."""

    def __init__(self, nbytes: int):
        self.nbytes = int(nbytes)
        self.ptr = int(check(cudart.cudaMalloc(max(self.nbytes, 1)), f"cudaMalloc({nbytes})"))

    def free(self) -> None:
        if self.ptr:
            check(cudart.cudaFree(self.ptr), "cudaFree")
            self.ptr = 0


class PinnedBuffer:
    """Page-locked host memory viewed as a numpy array (async copies need pinned memory).

    Always portable (cudaHostAllocPortable): pinned for every GPU, not only the one current at
    allocation, so one QSL store can feed the lanes of several GPUs. No flag to choose: on one GPU
    it is the same allocation as cudaMallocHost, so there is nothing to gain by leaving it out."""

    def __init__(self, shape, dtype):
        self.dtype = np.dtype(dtype)
        self.nbytes = int(np.prod(shape)) * self.dtype.itemsize
        self.ptr = int(check(cudart.cudaHostAlloc(max(self.nbytes, 1), cudart.cudaHostAllocPortable),
                             f"cudaHostAlloc({self.nbytes}, portable)"))
        import ctypes

        raw = (ctypes.c_byte * max(self.nbytes, 1)).from_address(self.ptr)
        self.array = np.frombuffer(raw, dtype=self.dtype, count=int(np.prod(shape))).reshape(shape)

    def free(self) -> None:
        if self.ptr:
            self.array = None
            check(cudart.cudaFreeHost(self.ptr), "cudaFreeHost")
            self.ptr = 0


class PinnedStores:
    """The page-locked sample stores a backend hands out (``Backend.host_array``) or adopts from another
    lane, by address: a batch of rows from one of them can go host -> device directly."""

    def __init__(self):
        self._owned: list[PinnedBuffer] = []
        self._ranges: list[tuple[int, int]] = []  # (address, bytes): owned and adopted

    def allocate(self, shape, dtype) -> np.ndarray:
        buf = PinnedBuffer(shape, dtype)  # portable: the lanes of other GPUs may adopt it
        self._owned.append(buf)
        self._ranges.append((buf.ptr, buf.nbytes))
        return buf.array

    def adopt(self, array: np.ndarray) -> None:
        """A store another lane allocated: read in place like an owned one; its owner frees it."""
        self._ranges.append((array.ctypes.data, array.nbytes))

    def holds(self, store: np.ndarray, dtype) -> bool:
        """Whether ``store`` (of ``dtype``, C-contiguous) lies in one of these stores."""
        if store.dtype != dtype or not store.flags.c_contiguous:
            return False
        start = store.ctypes.data
        return any(ptr <= start and start + store.nbytes <= ptr + n for ptr, n in self._ranges)

    def free(self) -> None:
        for buf in self._owned:
            buf.free()
        self._owned, self._ranges = [], []


class Stream:
    def __init__(self):
        self.handle = check(cudart.cudaStreamCreateWithFlags(cudart.cudaStreamNonBlocking),
                            "cudaStreamCreate")

    @property
    def ptr(self) -> int:
        return int(self.handle)

    def synchronize(self) -> None:
        check(cudart.cudaStreamSynchronize(self.handle), "cudaStreamSynchronize")

    def wait(self, event: Event) -> None:
        check(cudart.cudaStreamWaitEvent(self.handle, event.handle, 0), "cudaStreamWaitEvent")

    def destroy(self) -> None:
        if self.handle is not None:
            check(cudart.cudaStreamDestroy(self.handle), "cudaStreamDestroy")
            self.handle = None


class Event:
    def __init__(self, timing: bool = False):
        flags = cudart.cudaEventDefault if timing else cudart.cudaEventDisableTiming
        self.handle = check(cudart.cudaEventCreateWithFlags(flags), "cudaEventCreate")

    def record(self, stream: Stream) -> None:
        check(cudart.cudaEventRecord(self.handle, stream.handle), "cudaEventRecord")

    def synchronize(self) -> None:
        check(cudart.cudaEventSynchronize(self.handle), "cudaEventSynchronize")

    def elapsed_ms(self, start: Event) -> float:
        return float(check(cudart.cudaEventElapsedTime(start.handle, self.handle), "cudaEventElapsedTime"))

    def destroy(self) -> None:
        if self.handle is not None:
            check(cudart.cudaEventDestroy(self.handle), "cudaEventDestroy")
            self.handle = None


def copy_htod_async(dst: DeviceBuffer | int, src: PinnedBuffer, nbytes: int, stream: Stream) -> None:
    dptr = dst.ptr if isinstance(dst, DeviceBuffer) else int(dst)
    check(cudart.cudaMemcpyAsync(dptr, src.ptr, nbytes, cudart.cudaMemcpyKind.cudaMemcpyHostToDevice,
                                 stream.handle), "cudaMemcpyAsync H2D")


def copy_rows_htod_async(dst: DeviceBuffer | int, srcs: np.ndarray, row_bytes: int, stream: Stream,
                         device: int | None = None) -> None:
    """Copy ``len(srcs)`` rows of ``row_bytes`` from page-locked host addresses ``srcs`` to consecutive
    device rows at ``dst``, in stream order: a batch assembled on the device, never on the host.
    ``device``: the GPU of ``dst`` and ``stream`` (None: the current one).

    Runs of consecutive source rows go as one copy. The copies are handed over in one
    cudaMemcpyBatchAsync (CUDA 12.8+; one call, not one per row, is what keeps a 2048-row batch cheap
    on the Python side) or, where the driver or cuda-python lacks it, one cudaMemcpyAsync per run.
    """
    srcs = np.asarray(srcs, dtype=np.int64)
    if len(srcs) == 0:
        return
    base = dst.ptr if isinstance(dst, DeviceBuffer) else int(dst)
    starts = np.flatnonzero(np.diff(srcs) != row_bytes) + 1
    starts = np.concatenate(([0], starts))
    sizes = np.diff(np.append(starts, len(srcs))) * row_bytes
    dsts, src_runs = base + starts * row_bytes, srcs[starts]
    if len(starts) > 1 and _batch_copy.usable():
        try:
            check(cudart.cudaMemcpyBatchAsync(dsts.tolist(), src_runs.tolist(), sizes.tolist(), len(starts),
                                              [_batch_copy.attributes(device)], [0], 1, stream.handle),
                  "cudaMemcpyBatchAsync")
            return
        except (CudaError, TypeError) as e:  # an older driver: per-run copies from now on
            _batch_copy.disable(e)
    for d, s_, n in zip(dsts.tolist(), src_runs.tolist(), sizes.tolist()):
        check(cudart.cudaMemcpyAsync(d, s_, n, cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, stream.handle),
              "cudaMemcpyAsync H2D")


class _BatchCopy:
    """Whether cudaMemcpyBatchAsync can be used here, and its copy attributes, one set per GPU (the
    destination hint names the device)."""

    def __init__(self):
        self._usable = hasattr(cudart, "cudaMemcpyBatchAsync")
        self._attrs: dict[int, object] = {}

    def usable(self) -> bool:
        return self._usable

    def disable(self, why: BaseException) -> None:
        if self._usable:
            import sys

            print(f"note: cudaMemcpyBatchAsync unavailable ({why}); copying row runs one by one", file=sys.stderr)
        self._usable = False

    def attributes(self, device: int | None = None):
        """The attributes of a copy to ``device`` (None: the current one)."""
        if device is None:
            device = int(check(cudart.cudaGetDevice(), "cudaGetDevice"))
        a = self._attrs.get(device)
        if a is None:  # two threads may both make it: the same value, either is kept
            a = cudart.cudaMemcpyAttributes()
            a.srcAccessOrder = cudart.cudaMemcpySrcAccessOrder.cudaMemcpySrcAccessOrderStream
            a.srcLocHint.type = cudart.cudaMemLocationType.cudaMemLocationTypeHost
            a.dstLocHint.type = cudart.cudaMemLocationType.cudaMemLocationTypeDevice
            a.dstLocHint.id = device
            a.flags = cudart.cudaMemcpyFlags.cudaMemcpyFlagPreferOverlapWithCompute
            self._attrs[device] = a
        return a


_batch_copy = _BatchCopy()


def copy_dtoh_async(dst: PinnedBuffer, src: DeviceBuffer | int, nbytes: int, stream: Stream) -> None:
    sptr = src.ptr if isinstance(src, DeviceBuffer) else int(src)
    check(cudart.cudaMemcpyAsync(dst.ptr, sptr, nbytes, cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost,
                                 stream.handle), "cudaMemcpyAsync D2H")


def copy_dtod_async(dst: DeviceBuffer | int, src: int, nbytes: int, stream: Stream) -> None:
    dptr = dst.ptr if isinstance(dst, DeviceBuffer) else int(dst)
    check(cudart.cudaMemcpyAsync(dptr, int(src), nbytes, cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice,
                                 stream.handle), "cudaMemcpyAsync D2D")


def ipc_handle(buf: DeviceBuffer) -> bytes:
    """The 64 bytes of ``buf``'s cudaIpcMemHandle: what another process (a Triton server given a CUDA
    shared-memory region) opens to read the same device memory."""
    import ctypes

    handle = check(cudart.cudaIpcGetMemHandle(buf.ptr), "cudaIpcGetMemHandle")
    if hasattr(handle, "reserved"):  # cuda-python 12: the bytes as a field
        return bytes(bytearray(int(b) & 0xFF for b in handle.reserved))
    return bytes((ctypes.c_char * cudart.CUDA_IPC_HANDLE_SIZE).from_address(handle.getPtr()))  # 13: its address


def memset(dst: DeviceBuffer, value: int = 0) -> None:
    check(cudart.cudaMemset(dst.ptr, value, dst.nbytes), "cudaMemset")


class Graph:
    """A captured CUDA graph: ``with Graph.capture(stream) as g: <enqueue work>`` then ``g.launch``."""

    def __init__(self, stream: Stream):
        self.stream = stream
        self.graph = None
        self.exec = None

    @classmethod
    def capture(cls, stream: Stream) -> Graph:
        return cls(stream)

    def __enter__(self) -> Graph:
        mode = cudart.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
        check(cudart.cudaStreamBeginCapture(self.stream.handle, mode), "cudaStreamBeginCapture")
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        graph = check(cudart.cudaStreamEndCapture(self.stream.handle), "cudaStreamEndCapture")
        if exc_type is not None:
            if graph is not None:
                cudart.cudaGraphDestroy(graph)
            return
        self.graph = graph
        self.exec = check(cudart.cudaGraphInstantiate(graph, 0), "cudaGraphInstantiate")

    def launch(self, stream: Stream | None = None) -> None:
        check(cudart.cudaGraphLaunch(self.exec, (stream or self.stream).handle), "cudaGraphLaunch")

    def destroy(self) -> None:
        if self.exec is not None:
            check(cudart.cudaGraphExecDestroy(self.exec), "cudaGraphExecDestroy")
            self.exec = None
        if self.graph is not None:
            check(cudart.cudaGraphDestroy(self.graph), "cudaGraphDestroy")
            self.graph = None
