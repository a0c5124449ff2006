"""Inference backends behind one small interface: load a prepared model, infer a batch.

The harness only ever talks to ``Backend``; TensorRT plugs in here without changes elsewhere.
Backends are looked up by name and imported lazily, so an optional runtime (TensorRT) that is
not installed costs nothing until someone asks for it.
"""

from __future__ import annotations

import abc
import importlib
import sys
from typing import TYPE_CHECKING

import numpy as np
from trtfuse.errors import UserError

if TYPE_CHECKING:
    from trtfuse.models import PreparedModel


class Backend(abc.ABC):
    """One model on one device. ``infer`` may be called from several threads at once."""

    name: str = "backend"
    max_batch: int = 0  # the largest batch infer() takes; set by load()

    @abc.abstractmethod
    def load(self, model: PreparedModel, batch_size: int) -> None:
        """Make ``model`` ready to infer batches of up to ``batch_size`` samples."""

    @abc.abstractmethod
    def infer(self, batch: np.ndarray) -> np.ndarray:
        """float32 [n, C, H, W] -> logits/probabilities [n, num_classes], n <= max_batch."""

    def close(self) -> None:
        """Release the model and its device memory."""


# name -> "module:Class", imported on first use.
_REGISTRY = {
    "onnxruntime": "trtfuse.backends.onnxruntime_backend:OnnxRuntimeBackend",
    "null": "trtfuse.backends.null_backend:NullBackend",
    "tensorrt": "trtfuse.backends.tensorrt_backend:TensorRTBackend",
}
BACKEND_NAMES = ("auto", *_REGISTRY)

TENSORRT_MISSING = UserError(
    "TensorRT is not installed (or its Python API cannot be imported)",
    "install it with `pip install tensorrt` on a machine with an NVIDIA GPU and driver, "
    "or use --backend onnxruntime",
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


def create_backend(name: str, **options) -> Backend:
    """A backend by name: "onnxruntime", "tensorrt", "null", or "auto" (TensorRT if usable)."""
    if name not in BACKEND_NAMES:
        raise UserError(f"unknown backend {name!r}", f"use one of: {', '.join(BACKEND_NAMES)}")
    if name == "auto":
        try:
            return _load_class("tensorrt")(**options)
        except UserError as e:
            # Why one line, not silence: a user on a GPU box must notice they are timing the CPU.
            print(f"note: {e.problem}; using onnxruntime instead", file=sys.stderr)
            return _load_class("onnxruntime")(**options)
    return _load_class(name)(**options)
