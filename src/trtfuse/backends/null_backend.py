"""A backend that answers at once: measures what the harness itself costs."""

from __future__ import annotations

import numpy as np
from trtfuse.backends import Backend


class NullBackend(Backend):
    name = "null"

    def __init__(self, num_classes: int | None = None, **_options):
        self._num_classes = num_classes

    def load(self, model, batch_size: int) -> None:
        self.max_batch = batch_size
        n = self._num_classes or model.num_classes
        # One preallocated answer, sliced per call: the point is to cost nothing.
        self._answer = np.zeros((batch_size, n), dtype=np.float32)

    def infer(self, batch: np.ndarray) -> np.ndarray:
        return self._answer[: len(batch)]
