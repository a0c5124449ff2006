"""LoadGen's query sample library (QSL) over a preprocessed dataset.

LoadGen decides which samples are resident: it calls ``load`` with a set of sample indices before it
issues queries over them and ``unload`` afterwards (several times in accuracy mode, once per set of
``performance_sample_count`` samples). The QSL holds exactly those samples in RAM, already
preprocessed, so a timed run only ever copies arrays.
"""

from __future__ import annotations

import numpy as np

LARGE_SAMPLE_BYTES = 16 * 1024  # above this, gather row by row (see gather)


class SampleLibrary:
    def __init__(self, dataset, performance_sample_count: int):
        self.dataset = dataset
        self.total_count = len(dataset)
        self.performance_sample_count = max(1, min(performance_sample_count, self.total_count))
        self._rows = np.full(self.total_count, -1, dtype=np.int64)  # sample index -> row of _loaded
        self._loaded: np.ndarray | None = None
        self.load_calls: list[list[int]] = []    # what LoadGen asked for, for tests and the report
        self.unload_calls: list[list[int]] = []

    @property
    def loaded_indices(self) -> np.ndarray:
        return np.flatnonzero(self._rows >= 0)

    def load(self, indices: list[int]) -> None:
        self.load_calls.append(list(indices))
        new = np.asarray(indices, dtype=np.int64)
        new = new[self._rows[new] < 0]  # already resident samples stay where they are
        images = self.dataset.images(new)
        start = 0 if self._loaded is None else len(self._loaded)
        self._loaded = images if self._loaded is None else np.concatenate([self._loaded, images])
        self._rows[new] = np.arange(start, start + len(new))

    def unload(self, indices: list[int]) -> None:
        self.unload_calls.append(list(indices))
        self._rows[np.asarray(indices, dtype=np.int64)] = -1
        keep = np.flatnonzero(self._rows >= 0)
        if len(keep) == 0:
            self._loaded = None
            return
        # Compact what is still resident so memory follows what LoadGen asked for.
        self._loaded = self._loaded[self._rows[keep]]
        self._rows[keep] = np.arange(len(keep))

    def gather(self, sample_indices, out: np.ndarray | None = None) -> np.ndarray:
        """The resident samples ``sample_indices`` as one contiguous batch (into ``out`` if given)."""
        rows = self._rows[sample_indices]
        if self._loaded is None or (rows < 0).any():
            missing = np.asarray(sample_indices)[rows < 0] if self._loaded is not None else sample_indices
            raise RuntimeError(f"LoadGen issued samples that are not loaded: {list(missing)[:5]}")
        if out is None:
            return self._loaded[rows]
        out = out[: len(rows)]
        if self._loaded[0].nbytes >= LARGE_SAMPLE_BYTES:
            # One memcpy per sample: for image-sized rows about 4x faster than np.take/fancy indexing,
            # which copy element-wise (measured: 5.6 vs 1.3 GB/s for 3x224x224 float32).
            for k, row in enumerate(rows.tolist()):
                out[k] = self._loaded[row]
            return out
        return np.take(self._loaded, rows, axis=0, out=out)

    def sample_shape(self) -> tuple[int, ...]:
        if self._loaded is None:
            raise RuntimeError("no samples are loaded")
        return tuple(self._loaded.shape[1:])

    def sample_dtype(self) -> np.dtype:
        """The samples' own type (float32, or int8 for an engine with int8 input): never converted here."""
        if self._loaded is None:
            raise RuntimeError("no samples are loaded")
        return self._loaded.dtype
