"""ONNX Runtime backend: the CPU path (and CUDA, where onnxruntime-gpu is installed)."""

from __future__ import annotations

import numpy as np
from trtfuse.backends import Backend
from trtfuse.errors import UserError


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"

    def __init__(self, threads: int = 0, providers: list[str] | None = None, **_options):
        import onnxruntime as ort

        self._ort = ort
        self._threads = threads  # intra-op threads; 0 lets onnxruntime use every core
        available = ort.get_available_providers()
        preferred = ["CUDAExecutionProvider", "CPUExecutionProvider"]
        self._providers = providers or [p for p in preferred if p in available]

    def load(self, model, batch_size: int) -> None:
        options = self._ort.SessionOptions()
        options.intra_op_num_threads = self._threads
        # Spinning intra-op threads would steal the cores LoadGen's and the harness's threads need
        # (CPU runs share them); waking costs microseconds against milliseconds of inference.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.graph_optimization_level = self._ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        try:
            self._session = self._ort.InferenceSession(
                str(model.onnx_path), options, providers=self._providers)
        except Exception as e:  # onnxruntime raises its own exception types for bad files
            raise UserError(f"onnxruntime cannot load {model.onnx_path}: {e}".split("\n")[0],
                            "check the file with `python -m onnx.checker` or prepare it again") from e
        inputs = {i.name: i for i in self._session.get_inputs()}
        if model.input_name not in inputs:
            raise UserError(f"{model.onnx_path} has no input named {model.input_name!r}",
                            f"its inputs are {sorted(inputs)}; prepare the model again")
        self._input_name = model.input_name
        self._output_names = [model.output_name]
        dim0 = inputs[model.input_name].shape[0]
        # A model exported with a fixed batch takes exactly that many samples; smaller batches are padded.
        self._fixed_batch = dim0 if isinstance(dim0, int) and dim0 > 0 else None
        if self._fixed_batch is not None and batch_size > self._fixed_batch:
            raise UserError(
                f"batch size {batch_size} is larger than the model's fixed batch of {self._fixed_batch}",
                f"use --batch-size {self._fixed_batch} or less, or export the ONNX with a dynamic batch")
        self.max_batch = batch_size

    def infer(self, batch: np.ndarray) -> np.ndarray:
        n = len(batch)
        if self._fixed_batch is not None and n < self._fixed_batch:
            padded = np.zeros((self._fixed_batch, *batch.shape[1:]), dtype=batch.dtype)
            padded[:n] = batch
            batch = padded
        (out,) = self._session.run(self._output_names, {self._input_name: batch})
        return out[:n].reshape(n, -1)

    def close(self) -> None:
        self._session = None
