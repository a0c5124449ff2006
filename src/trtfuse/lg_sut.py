"""LoadGen systems under test (SUTs): Offline, Server, SingleStream and MultiStream over one ``Backend``.

Threads: LoadGen calls ``issue`` on its own thread; it must return at once and must never raise (an
exception in a LoadGen callback aborts the whole process). Batches run on worker threads, each
completing its own samples with ``QuerySamplesComplete`` right after inference. Every issued sample
is completed exactly once: by its worker, or by the watchdog (``abandon``) when the backend hangs,
since LoadGen's StartTest otherwise waits forever for it.

Responses: MLPerf requires the same work and the same answer in performance and accuracy mode (its
TEST01 compares them), so every sample is completed with its response in both: the top-5 ImageNet
class indices as int32, best first (``Backend.classify_rows``). LoadGen logs it only where the mode
(or an audit.config's sampling) asks. Only a failed run completes samples without one.
"""

from __future__ import annotations

import collections
import queue
import threading
import time

import mlperf_loadgen as lg
import numpy as np
from trtfuse import query_timeline


class Ledger:
    """Batches in flight, and counts for progress and stall detection.

    Dict operations are atomic under the GIL, so whoever pops a batch first (worker or watchdog)
    owns its completion; no lock on the hot path.
    """

    def __init__(self):
        self._open: dict[int, np.ndarray] = {}
        self._keys = iter(range(1 << 62))
        self.issued = 0      # written only on LoadGen's issue thread
        self.completed = 0   # written by every worker: under a lock, once per batch
        self.batches = 0        # batches the workers ran, and their samples (same lock)
        self.batch_samples = 0
        self._count_lock = threading.Lock()
        self.last_progress = time.monotonic()

    def note_issued(self, n: int) -> None:
        if self.issued == self.completed:
            self.last_progress = time.monotonic()  # the stall clock starts when there is work
        self.issued += n

    def open(self, ids: np.ndarray) -> int:
        key = next(self._keys)
        self._open[key] = ids
        return key

    def close(self, key: int) -> bool:
        return self._open.pop(key, None) is not None

    def note_completed(self, n: int, batch: bool = False) -> None:
        """``n`` samples answered: by a worker's batch (``batch``), or otherwise (errors, watchdog)."""
        with self._count_lock:
            self.completed += n
            if batch:
                self.batches += 1
                self.batch_samples += n
        self.last_progress = time.monotonic()

    def take_all(self) -> list[np.ndarray]:
        taken = []
        for key in list(self._open):
            ids = self._open.pop(key, None)
            if ids is not None:
                taken.append(ids)
        return taken

    @property
    def outstanding(self) -> int:
        return self.issued - self.completed


def complete(ids, top_classes: np.ndarray | None = None) -> None:
    """Tell LoadGen these samples are done; with ``top_classes`` [n, k] int32, as response data
    (None only for samples of a failed run)."""
    if top_classes is None:
        responses = [lg.QuerySampleResponse(i, 0, 0) for i in np.asarray(ids).tolist()]
    else:
        # LoadGen copies the response bytes inside QuerySamplesComplete, so the array only has to
        # live until the call returns.
        top_classes = np.ascontiguousarray(top_classes, dtype=np.int32)
        base, stride = top_classes.ctypes.data, top_classes.strides[0]
        responses = [lg.QuerySampleResponse(i, base + k * stride, stride)
                     for k, i in enumerate(np.asarray(ids).tolist())]
    lg.QuerySamplesComplete(responses)


class BatchSUT:
    """Worker threads that infer batches of (response ids, sample indices) and complete them."""

    def __init__(self, backend, qsl, batch_size: int, threads: int = 1, label_offset: int = 0):
        self.backend = backend
        self.qsl = qsl
        self.batch_size = batch_size
        self.label_offset = label_offset  # model class index - ImageNet class index (1001-class models: 1)
        self.ledger = Ledger()
        self.errors: list[BaseException] = []
        self.interrupted = False  # Ctrl-C: every sample is answered at once, without inference
        self.timeline = None  # a query_timeline.QueryTimeline: the Server SUT records where latency goes
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._worker, name=f"trtfuse-worker-{k}", daemon=True)
                         for k in range(max(1, threads))]

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self, timeout: float = 5.0) -> None:
        for _ in self._threads:
            self._work.put(None)
        for t in self._threads:
            t.join(timeout=timeout)

    def mean_batch(self) -> float | None:
        """Samples per batch run so far (None before the first)."""
        led = self.ledger
        return led.batch_samples / led.batches if led.batches else None

    def flush(self) -> None:
        """LoadGen's flush_queries: no SUT here ever holds a query back, so nothing to do."""

    # -- the hot path ------------------------------------------------------------------------
    def _next_work(self):
        """The next (ids, indices) batch to run, or None when the SUT stops."""
        return self._work.get()

    def _worker(self) -> None:
        while (item := self._next_work()) is not None:
            taken = query_timeline.now()
            ids, indices, *seen = item  # seen: when each sample reached the SUT, where a timeline is on
            key = self.ledger.open(ids)
            top = None
            try:
                if not (self.errors or self.interrupted):  # after a failure, finish quickly without inferring
                    # Rows of the QSL's store, not a gathered batch: the backend reads them in place.
                    top = self.backend.classify_rows(self.qsl.store, self.qsl.rows(indices))
                    if self.label_offset:
                        top = top - self.label_offset  # a new array: never the backend's buffer
            except BaseException as e:  # noqa: BLE001 - reported after StartTest returns
                self.errors.append(e)
                top = None
            inferred = query_timeline.now()
            if self.ledger.close(key):
                try:
                    complete(ids, top)
                except BaseException as e:  # noqa: BLE001
                    self.errors.append(e)
                self.ledger.note_completed(len(ids), batch=True)
                if seen and top is not None:
                    self.timeline.add(seen[0], taken, inferred, query_timeline.now())

    def abandon(self) -> int:
        """Complete everything still queued or in flight with empty responses (watchdog)."""
        abandoned = 0
        while True:
            try:
                item = self._work.get_nowait()
            except queue.Empty:
                break
            if item is None:  # the SUT is stopping: leave the sentinel for its worker
                self._work.put(None)
                break
            abandoned += self._abandon_queued(item)
        for ids in self.ledger.take_all():
            complete(ids)
            abandoned += len(ids)
        self.ledger.note_completed(abandoned)
        return abandoned

    def interrupt(self) -> int:
        """Ctrl-C: answer everything outstanding, and every later query, at once with empty
        responses, so that LoadGen's StartTest returns (its Python binding has no way to stop a test)."""
        self.interrupted = True
        return self.abandon()

    def _abandon_queued(self, item) -> int:
        """Complete one queued work item with empty responses; the samples it held."""
        complete(item[0])
        return len(item[0])

    def guarded_issue(self, ids: list[int], indices: list[int]) -> None:
        """LoadGen's issue callback (ConstructFastSUT: two lists of ints). Never raises."""
        try:
            self.ledger.note_issued(len(ids))
            if self.errors or self.interrupted:  # answer at once so LoadGen finishes soon
                complete(ids)
                self.ledger.note_completed(len(ids))
                return
            self.issue(ids, indices)
        except BaseException as e:  # noqa: BLE001
            self.errors.append(e)
            complete(ids)
            self.ledger.note_completed(len(ids))

    def issue(self, ids: list[int], indices: list[int]) -> None:
        raise NotImplementedError


class OfflineQuery:
    """One Offline query as LoadGen's binding handed it over (two Python lists), given out a batch
    at a time. ``next`` on a range iterator is atomic under the GIL, so each batch goes to exactly one
    taker (a worker, or the watchdog), however many take at once."""

    def __init__(self, ids: list[int], indices: list[int], batch_size: int):
        self.ids, self.indices, self.batch_size = ids, indices, batch_size
        self._starts = iter(range(0, len(ids), batch_size))

    def take(self) -> tuple[list[int], list[int]] | None:
        """The next batch's (ids, indices), slices of the lists; None once every batch is taken."""
        start = next(self._starts, None)
        if start is None:
            return None
        stop = start + self.batch_size
        return self.ids[start:stop], self.indices[start:stop]


class OfflineSUT(BatchSUT):
    """Offline: LoadGen sends every sample in one huge query; the workers take it a batch at a time.

    LoadGen's clock runs from before it calls ``issue`` to the last completion, so the handover is
    timed: ``issue`` queues the query whole, as the lists it came in, and returns. Converting the
    whole query to numpy and queueing every batch up front held the first batch back ~75 ms per
    million samples (a 2-core CPU; slicing every batch up front instead: ~30 ms); here each worker
    slices and converts only the batch it takes, beside the other workers' inference. (LoadGen's
    binding spends about as long again building the two lists before ``issue`` is called: no SUT
    can save that.) The query stays on the work queue until its last batch is taken.
    """

    def issue(self, ids, indices):
        # One step: were anything to fail after the put, guarded_issue would complete samples that
        # the workers complete too.
        self._work.put(OfflineQuery(ids, indices, self.batch_size))

    def _next_work(self):
        while (query := self._work.get()) is not None:
            batch = query.take()
            if batch is None:
                continue  # every batch of it was taken: it leaves the queue
            self._work.put(query)  # back first: the other workers take its next batches meanwhile
            ids, indices = batch
            return np.array(ids, dtype=np.uint64), np.array(indices, dtype=np.int64)
        return None

    def _abandon_queued(self, query: OfflineQuery) -> int:
        """Every batch of the query not yet taken (watchdog); a query a worker holds for a moment is
        found on the watchdog's next call, its batches still given out once each."""
        abandoned = 0
        while (batch := query.take()) is not None:
            complete(batch[0])
            abandoned += len(batch[0])
        return abandoned


class ServerSUT(BatchSUT):
    """Server: queries arrive one (or, coalesced, a few) at a time on LoadGen's thread.

    No batcher thread: each worker, when it is free, takes every pending query (up to the batch
    size) and runs them at once. While all workers are busy, arrivals pile up into the next batch,
    so batches grow with the load by themselves, and at low load a query starts at once: waiting
    for a batch to fill could only add latency while a worker (and its stream) sat idle.
    ``poll_s`` bounds how long a free worker sleeps before it looks again (no condition variable:
    a notify per query costs more GIL time on LoadGen's thread than an occasional wake-up).
    """

    def __init__(self, *args, poll_s: float = 0.0002, **kwargs):
        super().__init__(*args, **kwargs)
        self.poll_s = poll_s
        self._pending: collections.deque = collections.deque()
        self._running = True

    def stop(self, timeout: float = 5.0):
        self._running = False
        super().stop(timeout)

    def issue(self, ids, indices):
        # Plain lists, no numpy: this runs once per query on LoadGen's thread, holding the GIL.
        self._pending.append((ids, indices, query_timeline.now()))  # deque.append: atomic, no lock

    def _next_work(self):
        """The next batch: every pending query up to the batch size, as soon as there is one."""
        pending, size, timed = self._pending, self.batch_size, self.timeline is not None
        while True:
            ids, idx, seen = [], [], []
            while len(ids) < size:
                try:
                    new_ids, new_idx, t = pending.popleft()  # atomic: each query goes to one worker
                except IndexError:
                    break
                room = size - len(ids)
                if len(new_ids) > room:  # a coalesced query larger than the room left: split it
                    pending.appendleft((new_ids[room:], new_idx[room:], t))
                    new_ids, new_idx = new_ids[:room], new_idx[:room]
                ids += new_ids
                idx += new_idx
                if timed:
                    seen += [t] * len(new_ids)
            if ids:
                batch = np.array(ids, dtype=np.uint64), np.array(idx, dtype=np.int64)
                return (*batch, seen) if timed else batch
            if not self._running:
                return None
            time.sleep(self.poll_s)

    def abandon(self) -> int:
        abandoned = 0
        while True:
            try:
                ids, _, _ = self._pending.popleft()
            except IndexError:
                break
            complete(ids)
            abandoned += len(ids)
        self.ledger.note_completed(abandoned)
        return abandoned + super().abandon()


class StreamSUT(BatchSUT):
    """SingleStream (one sample per query) and MultiStream (8): LoadGen issues the next query only once
    the last is answered, so latency is everything and there is nothing to batch across queries. A
    query goes to the workers whole (split at the batch size when larger): a blocking queue wakes a
    worker at once, where the Server SUT's polling would add up to its poll period to every query.
    """

    def issue(self, ids, indices):
        size = self.batch_size
        batches = [(np.array(ids[k:k + size], dtype=np.uint64), np.array(indices[k:k + size], dtype=np.int64))
                   for k in range(0, len(ids), size)]
        # Converted first, queued after: nothing can fail between two puts, so guarded_issue never
        # completes samples a worker completes too.
        for batch in batches:
            self._work.put(batch)
