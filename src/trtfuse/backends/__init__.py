"""Inference backends behind one small interface: load a prepared model, infer a batch.

The harness only ever talks to ``Backend``; TensorRT plugs in here without changes elsewhere.
Backends are looked up by name and imported lazily, so an optional runtime (TensorRT) that is
not installed costs nothing until someone asks for it. A backend class makes itself from the
settings (``Backend.create``): one backend, or several spread as lanes (``lanes.LanesBackend``:
TensorRT with ``devices``, one lane per GPU; Triton with several URLs, one lane per server).
"""

from __future__ import annotations

import abc
import importlib
import sys
import threading
from typing import TYPE_CHECKING

import numpy as np
from trtfuse.errors import UserError

if TYPE_CHECKING:
    from trtfuse.models import PreparedModel


TOP_K = 5  # a response: the top-5 class indices as int32, best first (MLPerf ResNet-50 reads the first)


def top_k_classes(scores: np.ndarray, k: int = TOP_K) -> np.ndarray:
    """[n, classes] scores -> [n, k] int32 class indices, best first."""
    k = min(k, scores.shape[1])
    part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    order = np.take_along_axis(-scores, part, axis=1).argsort(axis=1, kind="stable")
    return np.take_along_axis(part, order, axis=1).astype(np.int32)


class Backend(abc.ABC):
    """One model on one device. ``infer`` may be called from several threads at once."""

    name: str = "backend"
    max_batch: int = 0  # the largest batch infer() takes; set by load()
    concurrency: int = 1  # batches it can run at once (TensorRT: its streams): worker threads to feed it

    @classmethod
    def create(cls, **options) -> Backend:
        """The backend the settings ask for (``create_backend`` calls this). A class that can
        spread over several devices returns a ``LanesBackend`` of itself here; one device: itself."""
        return cls(**options)

    @abc.abstractmethod
    def load(self, model: PreparedModel, batch_size: int) -> None:
        """Make ``model`` ready to infer batches of up to ``batch_size`` samples."""

    @abc.abstractmethod
    def infer(self, batch: np.ndarray) -> np.ndarray:
        """float32 [n, C, H, W] -> logits/probabilities [n, num_classes], n <= max_batch."""

    # -- the serving path: samples held by the QSL, batches named by row ----------------------
    def to_input(self, images: np.ndarray) -> np.ndarray:
        """``images`` in the type the model takes. The QSL calls this once per sample it loads
        (untimed by LoadGen), so no query pays for a conversion."""
        return images

    def host_array(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        """Host memory for samples that ``infer_rows`` will read many times (the QSL's resident
        samples). A backend that copies them to a device returns page-locked memory (freed by close)."""
        return np.empty(shape, dtype)

    def adopt_host_array(self, array: np.ndarray) -> None:
        """Treat ``array``, a store another backend's ``host_array`` allocated (one lane of several
        serving the same samples), as one of this backend's own for ``infer_rows``, without owning
        it: its allocator frees it. Nothing to do for a backend without a fast path for its stores."""

    def infer_rows(self, store: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """``infer(store[rows])``: the batch is rows of the QSL's sample store. This default gathers
        them into the calling thread's reused buffer; a device backend copies each row straight to
        the device instead, so a batch is never assembled on the host."""
        return self.infer(gather_rows(store, rows, _thread_scratch(store, len(rows))))

    def classify_rows(self, store: np.ndarray, rows: np.ndarray, k: int = TOP_K) -> np.ndarray:
        """The response of every sample, in both LoadGen modes: the model's ``k`` best class indices
        as int32 [n, k], best first. This default ranks ``infer_rows``' scores on the host; a device
        backend ranks them on the device, so that k int32 per sample come back instead of the scores."""
        return top_k_classes(self.infer_rows(store, rows), k)

    def classify(self, batch: np.ndarray, k: int = TOP_K) -> np.ndarray:
        """``classify_rows`` for a batch that is not in a QSL store (a request a server received):
        the ``k`` best class indices of each sample, int32 [n, k], best first."""
        return top_k_classes(self.infer(batch), k)

    def start_trace(self) -> None:
        """Start timing each batch on the device (gpu_trace), for ``stop_trace``; nothing to do for a
        backend without a device clock to read."""

    def stop_trace(self) -> dict | None:
        """The batches run since ``start_trace``, summed up (``gpu_trace.summarize``); None here."""
        return None

    def close(self) -> None:
        """Release the model and its device memory."""


LARGE_ROW_BYTES = 16 * 1024  # above this, gather row by row (see gather_rows)


def gather_rows(store: np.ndarray, rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``store[rows]`` as one contiguous array (into ``out`` if given)."""
    if out is None:
        return store[rows]
    out = out[: len(rows)]
    if store[0].nbytes >= LARGE_ROW_BYTES:
        # One memcpy per row: for image-sized rows about 4x faster than np.take/fancy indexing,
        # which copy element-wise (measured: 5.6 vs 1.3 GB/s for 3x224x224 float32).
        for k, row in enumerate(rows.tolist()):
            out[k] = store[row]
        return out
    return np.take(store, rows, axis=0, out=out)


_scratch = threading.local()


def _thread_scratch(store: np.ndarray, n: int) -> np.ndarray:
    """This thread's batch buffer for rows of ``store``, grown when needed, never shrunk."""
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.dtype != store.dtype or buf.shape[1:] != store.shape[1:] or len(buf) < n:
        buf = _scratch.buf = np.empty((n, *store.shape[1:]), store.dtype)
    return buf[:n]


# name -> "module:Class", imported on first use.
_REGISTRY = {
    "onnxruntime": "trtfuse.backends.onnxruntime_backend:OnnxRuntimeBackend",
    "null": "trtfuse.backends.null_backend:NullBackend",
    "tensorrt": "trtfuse.backends.tensorrt_backend:TensorRTBackend",
    "triton": "trtfuse.backends.triton_backend:TritonBackend",
}
BACKEND_NAMES = ("auto", *_REGISTRY)

TENSORRT_MISSING = UserError(
    "TensorRT is not installed (or its Python API cannot be imported)",
    "install it with `pip install tensorrt` on a machine with an NVIDIA GPU and driver, "
    "or run on the CPU: `trtfuse run --backend onnxruntime`",
)


def _load_class(name: str) -> type[Backend]:
    module_name, class_name = _REGISTRY[name].split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        if name == "tensorrt":
            raise TENSORRT_MISSING from e
        if name == "onnxruntime":
            raise UserError("onnxruntime is not installed", "pip install onnxruntime") from e
        raise
    return getattr(module, class_name)


_NOTED: set[str] = set()


def create_backend(name: str, **options) -> Backend:
    """A backend by name: "onnxruntime", "tensorrt", "null", or "auto" (TensorRT if usable), made by
    its class's ``create`` from ``options`` (each backend ignores the options it does not take)."""
    if name not in BACKEND_NAMES:
        raise UserError(f"unknown backend {name!r}", f"use one of: {', '.join(BACKEND_NAMES)}")
    if name == "auto":
        try:
            return _load_class("tensorrt").create(**options)
        except UserError as e:
            if options.get("devices"):
                raise  # GPUs named on purpose (--devices): their problem is the answer, not a CPU run
            # Why one line, not silence: a user on a GPU box must notice they are timing the CPU.
            note = f"note: {e.problem}; using onnxruntime instead"
            if note not in _NOTED:  # once per process: the default run makes two backends
                _NOTED.add(note)
                print(note, file=sys.stderr)
            return _load_class("onnxruntime").create(**options)
    return _load_class(name).create(**options)
