"""Several backends serving one model as one: each batch goes to the lane with the least work.

A lane is a complete ``Backend`` of its own: TensorRT on one GPU, or (for a Triton client) one
server. ``LanesBackend`` loads them all, tells the harness to run as many batches at once as the
lanes together can (the sum of their concurrency), and hands each call to the lane with the fewest
samples outstanding at that moment: a slower or busier lane is given less, and lanes that are even
take turns. The QSL's store is allocated once, by the first lane, and adopted by the others, so
every lane's fast path reads the same samples in place.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import numpy as np
from trtfuse.backends import TOP_K, Backend


class LanesBackend(Backend):
    """``lanes``: backends already constructed (not loaded), all for the same model."""

    def __init__(self, lanes: Sequence[Backend]):
        if not lanes:
            raise ValueError("LanesBackend needs at least one lane")
        self.lanes = list(lanes)
        names = [lane.name for lane in self.lanes]
        # The kind of backend, as one lane would say it (reports and submissions key on it); how many
        # lanes and what each did is lane_stats()'s.
        self.name = names[0] if len(set(names)) == 1 else " + ".join(names)
        self._lock = threading.Lock()  # guards the counters below, taken twice per call
        self._outstanding = [0] * len(self.lanes)  # samples handed to a lane and not yet returned
        self._samples = [0] * len(self.lanes)      # samples and batches each lane has answered
        self._batches = [0] * len(self.lanes)
        self._next = 0  # where the search for the least busy lane starts: ties go round-robin

    @property
    def max_batch(self) -> int:
        return min(lane.max_batch for lane in self.lanes)

    @property
    def concurrency(self) -> int:
        return sum(lane.concurrency for lane in self.lanes)

    def load(self, model, batch_size: int) -> None:
        """Load every lane: the first alone, then the others at once, each on its own thread.
        The first goes alone because it may do one-time work the others then reuse instead of
        racing to repeat it (TensorRT: plugins registered, the engine built or found in the cache,
        which the other lanes then load). If any lane fails, the lanes loaded are closed and the
        first failure is raised."""
        self.lanes[0].load(model, batch_size)
        errors: list[BaseException | None] = [None] * len(self.lanes)

        def load_lane(i: int) -> None:
            try:
                self.lanes[i].load(model, batch_size)
            except BaseException as e:  # noqa: BLE001 - re-raised below, on the caller's thread
                errors[i] = e

        threads = [threading.Thread(target=load_lane, args=(i,), name=f"trtfuse-load-lane-{i}")
                   for i in range(1, len(self.lanes))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        failed = [e for e in errors if e is not None]
        if failed:
            try:
                self._close_lanes([lane for lane, e in zip(self.lanes, errors) if e is None])
            except Exception:  # noqa: BLE001 - the load failure is the one to report
                pass
            raise failed[0]

    # -- spreading ----------------------------------------------------------------------------
    def _take_lane(self, n: int) -> int:
        """The lane with the fewest outstanding samples (the first at or after ``_next`` among
        equals), charged with ``n`` more."""
        with self._lock:
            count = len(self.lanes)
            order = [(self._next + j) % count for j in range(count)]
            i = min(order, key=self._outstanding.__getitem__)  # min keeps the first of equals
            self._outstanding[i] += n
            self._next = (i + 1) % count
        return i

    def _on_a_lane(self, n: int, call: Callable[[Backend], np.ndarray]) -> np.ndarray:
        """``call`` on the least busy lane, counted while it runs; its exceptions pass unchanged."""
        i = self._take_lane(n)
        done = False
        try:
            result = call(self.lanes[i])
            done = True
            return result
        finally:
            with self._lock:
                self._outstanding[i] -= n
                if done:
                    self._samples[i] += n
                    self._batches[i] += 1

    def infer(self, batch: np.ndarray) -> np.ndarray:
        return self._on_a_lane(len(batch), lambda lane: lane.infer(batch))

    def infer_rows(self, store: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return self._on_a_lane(len(rows), lambda lane: lane.infer_rows(store, rows))

    def classify_rows(self, store: np.ndarray, rows: np.ndarray, k: int = TOP_K) -> np.ndarray:
        return self._on_a_lane(len(rows), lambda lane: lane.classify_rows(store, rows, k))

    def classify(self, batch: np.ndarray, k: int = TOP_K) -> np.ndarray:
        return self._on_a_lane(len(batch), lambda lane: lane.classify(batch, k))

    def lane_stats(self) -> list[dict]:
        """Per lane: its name, the samples and batches it answered, the samples it holds now."""
        with self._lock:
            return [{"lane": i, "name": lane.name, "samples": self._samples[i], "batches": self._batches[i],
                     "outstanding": self._outstanding[i]} for i, lane in enumerate(self.lanes)]

    def start_trace(self) -> None:
        for lane in self.lanes:
            lane.start_trace()

    def stop_trace(self) -> dict | None:
        """Each lane's trace (None where a lane has none); None when no lane traced."""
        lanes = [lane.stop_trace() for lane in self.lanes]
        return {"lanes": lanes} if any(t is not None for t in lanes) else None

    # -- what every lane shares -----------------------------------------------------------------
    def to_input(self, images: np.ndarray) -> np.ndarray:
        return self.lanes[0].to_input(images)  # the same model on every lane: the same input type

    def host_array(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        """The first lane's memory (TensorRT: pinned, portable to every GPU), adopted by the others
        so that each reads it through its own fast path."""
        array = self.lanes[0].host_array(shape, dtype)
        for lane in self.lanes[1:]:
            lane.adopt_host_array(array)
        return array

    def adopt_host_array(self, array: np.ndarray) -> None:
        for lane in self.lanes:
            lane.adopt_host_array(array)

    def close(self) -> None:
        self._close_lanes(self.lanes)

    @staticmethod
    def _close_lanes(lanes: list[Backend]) -> None:
        """Close every lane, the first last (it owns the stores the others adopted), even when one
        fails; then raise the first failure."""
        failure = None
        for lane in reversed(lanes):
            try:
                lane.close()
            except BaseException as e:  # noqa: BLE001 - the other lanes still have to be closed
                failure = failure or e
        if failure is not None:
            raise failure
