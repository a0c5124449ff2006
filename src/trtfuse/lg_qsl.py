"""LoadGen's query sample library (QSL) over a preprocessed dataset.

LoadGen decides which samples are resident: it calls ``load`` with a set of sample indices before it
issues queries over them and ``unload`` afterwards (several times in accuracy mode, once per set of
``performance_sample_count`` samples). The QSL holds exactly those samples, already preprocessed and
in the backend's input type, in one store allocated by the backend (page-locked for a GPU backend).
A timed batch is then just a list of store rows: the backend copies those rows straight to its
device, and no query pays for preprocessing, conversion or assembling a batch on the host.
"""

from __future__ import annotations

import numpy as np
from trtfuse.backends import gather_rows


class SampleLibrary:
    """``backend`` supplies the store's memory (``host_array``) and the input type (``to_input``);
    without one, plain numpy memory and the dataset's own type."""

    def __init__(self, dataset, performance_sample_count: int, backend=None):
        self.dataset = dataset
        self.total_count = len(dataset)
        self.performance_sample_count = max(1, min(performance_sample_count, self.total_count))
        self._backend = backend
        self._rows = np.full(self.total_count, -1, dtype=np.int64)  # sample index -> store row
        self.store: np.ndarray | None = None  # [capacity, *sample_shape], rows reused after unload
        self._free: list[int] = []            # store rows not holding a sample
        self.load_calls: list[list[int]] = []    # what LoadGen asked for, for tests and the report
        self.unload_calls: list[list[int]] = []

    @property
    def loaded_indices(self) -> np.ndarray:
        return np.flatnonzero(self._rows >= 0)

    def load(self, indices: list[int]) -> None:
        self.load_calls.append(list(indices))
        new = np.unique(np.asarray(indices, dtype=np.int64))
        new = new[self._rows[new] < 0]  # already resident samples stay where they are
        if len(new) == 0:
            return
        images = self.dataset.images(new)
        if self._backend is not None:
            images = self._backend.to_input(images)
        self._reserve(len(new), images)
        rows = np.array([self._free.pop() for _ in range(len(new))], dtype=np.int64)
        self.store[rows] = images
        self._rows[new] = rows

    def _reserve(self, n: int, images: np.ndarray) -> None:
        """Make room for ``n`` more samples shaped like ``images``. LoadGen keeps at most
        ``performance_sample_count`` resident, so the first store is the only one in a normal run."""
        if self.store is not None and (self.store.shape[1:] != images.shape[1:] or self.store.dtype != images.dtype):
            raise ValueError(f"dataset returned samples {images.dtype}{list(images.shape[1:])}, the store holds "
                             f"{self.store.dtype}{list(self.store.shape[1:])}")
        if len(self._free) >= n:
            return
        held = 0 if self.store is None else len(self.store)
        capacity = max(self.performance_sample_count, held - len(self._free) + n)
        alloc = self._backend.host_array if self._backend is not None else np.empty
        store = alloc((capacity, *images.shape[1:]), images.dtype)
        if self.store is not None:
            store[:held] = self.store
        self._free = list(range(capacity - 1, held - 1, -1)) + self._free  # pop() takes low rows first
        self.store = store

    def unload(self, indices: list[int]) -> None:
        self.unload_calls.append(list(indices))
        gone = np.unique(np.asarray(indices, dtype=np.int64))
        gone = gone[self._rows[gone] >= 0]
        self._free.extend(self._rows[gone].tolist())
        self._rows[gone] = -1

    def rows(self, sample_indices) -> np.ndarray:
        """The store rows of resident samples (LoadGen's sample indices)."""
        rows = self._rows[np.asarray(sample_indices, dtype=np.int64)]
        if (rows < 0).any():
            missing = np.asarray(sample_indices)[rows < 0]
            raise RuntimeError(f"LoadGen issued samples that are not loaded: {missing[:5].tolist()}")
        return rows

    def gather(self, sample_indices, out: np.ndarray | None = None) -> np.ndarray:
        """The resident samples ``sample_indices`` as one contiguous batch (into ``out`` if given)."""
        return gather_rows(self.store, self.rows(sample_indices), out)
