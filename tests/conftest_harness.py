"""Helpers for the harness tests: a tiny ONNX classifier whose answers are known, and a synthetic
in-memory dataset, so the LoadGen tests depend neither on JPEGs nor on exported models.

The model: x [N, 10, 2, 2] -> GlobalAveragePool -> Flatten -> MatMul W -> Add b -> logits. With
W = identity the predicted class is the channel with the largest mean; with ``background=True``
W shifts every class up by one and a column 0 of -1 plays MLPerf's "background" class.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from trtfuse.backends import Backend
from trtfuse.models import PreparedModel, PreprocessSpec

def _mlperf_dir() -> Path | None:
    """MLCommons' inference scripts: $MLPERF_INFERENCE_DIR, else ../shared/third_party/mlperf."""
    given = os.environ.get("MLPERF_INFERENCE_DIR")
    path = Path(given) if given else Path(__file__).resolve().parents[2] / "shared" / "third_party" / "mlperf"
    return path if (path / "tools" / "accuracy-imagenet.py").is_file() else None


MLPERF_DIR = _mlperf_dir()
needs_mlperf = pytest.mark.skipif(
    MLPERF_DIR is None, reason="MLCommons' inference scripts not found: set MLPERF_INFERENCE_DIR or put "
                               "them at ../shared/third_party/mlperf")

NUM_CLASSES = 10
SHAPE = (NUM_CLASSES, 2, 2)


def tiny_onnx(path: Path, background: bool = False, batch: int | str = "N") -> Path:
    out = NUM_CLASSES + (1 if background else 0)
    w = np.zeros((NUM_CLASSES, out), dtype=np.float32)
    w[np.arange(NUM_CLASSES), np.arange(NUM_CLASSES) + (1 if background else 0)] = 1.0
    b = np.zeros(out, dtype=np.float32)
    if background:
        b[0] = -1.0
    graph = helper.make_graph(
        [
            helper.make_node("GlobalAveragePool", ["input"], ["pooled"]),
            helper.make_node("Flatten", ["pooled"], ["flat"], axis=1),
            helper.make_node("MatMul", ["flat", "W"], ["mm"]),
            helper.make_node("Add", ["mm", "b"], ["logits"]),
        ],
        "tiny",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, *SHAPE])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, out])],
        initializer=[numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def tiny_model(tmp_path: Path, background: bool = False, batch: int | str = "N") -> PreparedModel:
    path = tiny_onnx(
        Path(tmp_path) / f"tiny{'_bg' if background else ''}_{batch}.onnx", background, batch
    )
    return PreparedModel(
        name="tiny",
        onnx_path=path,
        input_name="input",
        input_shape=SHAPE,
        num_classes=NUM_CLASSES + (1 if background else 0),
        label_offset=1 if background else 0,
        preprocess=PreprocessSpec(),
        random_weights=False,
        output_name="logits",
    )


class SyntheticDataset:
    """``n`` samples whose true class, and the model's top-1/top-5 on them, are known by construction.

    Sample i has label i % 10. Its channel means are a random order of 0..9 except that the label's
    channel gets rank ``rank[i]`` (0 = largest): rank 0 -> top-1 right; 1..4 -> top-5 right only;
    5..9 -> both wrong.
    """

    def __init__(self, n: int, rank: list[int] | None = None, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.names = [f"synthetic_{i:05d}.JPEG" for i in range(n)]
        self.labels = (np.arange(n) % NUM_CLASSES).astype(np.int64)
        self.rank = np.asarray(rank if rank is not None else [0] * n)
        self._x = np.empty((n, *SHAPE), dtype=np.float32)
        for i, label in enumerate(self.labels):
            others = [c for c in rng.permutation(NUM_CLASSES) if c != label]
            order = (
                others[: self.rank[i]] + [label] + others[self.rank[i] :]
            )  # order[k]: k-th largest
            means = np.empty(NUM_CLASSES, dtype=np.float32)
            means[order] = np.arange(NUM_CLASSES, 0, -1, dtype=np.float32)
            self._x[i] = means[:, None, None] + rng.uniform(-0.1, 0.1, SHAPE).astype(np.float32)
        self.images_calls: list[np.ndarray] = []

    @property
    def expected_top1(self) -> float:
        return float(np.mean(self.rank == 0))

    @property
    def expected_top5(self) -> float:
        return float(np.mean(self.rank < 5))

    def __len__(self) -> int:
        return len(self.names)

    def images(self, indices) -> np.ndarray:
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        self.images_calls.append(indices)
        return self._x[indices]


class ScriptedBackend(Backend):
    """Wraps a backend; records calls, can raise or hang on the k-th infer, or slow every call."""

    name = "scripted"

    def __init__(
        self,
        inner,
        fail_at: int | None = None,
        hang_at: int | None = None,
        error: BaseException | None = None,
        delay_s: float = 0.0,
    ):
        self.inner, self.fail_at, self.hang_at, self.delay_s = inner, fail_at, hang_at, delay_s
        self.error = error or RuntimeError("scripted failure")
        self.calls: list[int] = []  # batch size of each infer call
        self.release = threading.Event()

    @property
    def max_batch(self):
        return self.inner.max_batch

    def load(self, model, batch_size):
        self.inner.load(model, batch_size)

    def infer(self, batch):
        k = len(self.calls)
        self.calls.append(len(batch))
        if k == self.fail_at:
            raise self.error
        if k == self.hang_at:
            self.release.wait()
        if self.delay_s:
            time.sleep(self.delay_s)  # caps the speed, so a test knows an upper bound on it
        return self.inner.infer(batch)

    def close(self):
        self.release.set()
        self.inner.close()


def tiny_rgb_onnx(path: Path, size: int = 224) -> Path:
    """An ImageNet-shaped stand-in ([N, 3, size, size] -> [N, 1000]) for CLI tests on real folders."""
    w = np.random.default_rng(0).standard_normal((3, 1000)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("GlobalAveragePool", ["input"], ["pooled"]),
            helper.make_node("Flatten", ["pooled"], ["flat"], axis=1),
            helper.make_node("MatMul", ["flat", "W"], ["logits"]),
        ],
        "tiny_rgb",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, size, size])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 1000])],
        initializer=[numpy_helper.from_array(w, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def tensorrt_backend_usable() -> bool:
    """Whether the TensorRT backend can be made here (TensorRT importable and a GPU visible)."""
    from trtfuse.backends import create_backend
    from trtfuse.errors import UserError

    try:
        create_backend("tensorrt")
        return True
    except UserError:
        return False
