"""The start of an Offline run: LoadGen's clock runs from its issue of the one huge query, so the SUT
must hand it to the workers at once; and the timeline records the last completion, so the picture
can place LoadGen's timed span."""

import threading
import time

import numpy as np
from conftest_harness import SyntheticDataset
from test_loadgen_runs import run
from trtfuse import lg_sut
from trtfuse.lg_monitor import RunMonitor
from trtfuse.lg_sut import OfflineQuery, OfflineSUT


def offline_sut(batch_size, threads=1):
    return OfflineSUT(backend=None, qsl=None, batch_size=batch_size, threads=threads)


class CountingNumpy:
    """lg_sut's ``np``: numpy, counting the samples its array constructors convert."""

    def __init__(self):
        self.converted = 0

    def __getattr__(self, name):
        return getattr(np, name)

    def array(self, obj, *args, **kwargs):
        self.converted += len(obj)
        return np.array(obj, *args, **kwargs)

    asarray = array


def test_issue_queues_the_query_whole_without_converting_it(monkeypatch):
    # LoadGen's clock runs from its issue: converting the million-sample query there (what issue did
    # before) cost tens of ms. issue converts and slices nothing; a worker converts only its batch.
    counting = CountingNumpy()
    monkeypatch.setattr(lg_sut, "np", counting)
    n = 1_000_000
    ids, indices = [(1 << 40) + 64 * i for i in range(n)], [i % 1024 for i in range(n)]
    sut = offline_sut(batch_size=256)
    sut.issue(ids, indices)
    assert counting.converted == 0
    query = sut._work.get_nowait()
    assert isinstance(query, OfflineQuery) and query.ids is ids and query.indices is indices
    assert sut._work.empty()
    sut._work.put(query)
    batch_ids, batch_indices = sut._next_work()
    assert counting.converted == 2 * 256  # the first batch's ids and indices, nothing else
    assert batch_ids.tolist() == ids[:256] and batch_indices.tolist() == indices[:256]
    assert sut._work.get_nowait() is query  # back on the queue for the next batch


def test_workers_take_each_batch_once_with_its_indices():
    # Two queries (100 and 30 samples) in batches of 7, taken by 4 threads at once.
    sut = offline_sut(batch_size=7)
    queries = [list(range(100)), list(range(1000, 1030))]
    for ids in queries:
        sut.issue(ids, [i * 10 for i in ids])
    taken, lock = [], threading.Lock()

    def worker():
        while (batch := sut._next_work()) is not None:
            with lock:
                taken.append(batch)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while sum(len(ids) for ids, _ in list(taken)) < 130 and time.monotonic() < deadline:
        time.sleep(0.001)
    for _ in threads:
        sut._work.put(None)  # the SUT stops: each worker's sentinel
    for t in threads:
        t.join(timeout=5)
    ids = np.concatenate([b[0] for b in taken])
    assert sorted(ids.tolist()) == sorted(queries[0] + queries[1])  # every sample, once
    assert len(taken) == 15 + 5 and max(len(b[0]) for b in taken) == 7
    for batch_ids, batch_indices in taken:
        assert batch_ids.dtype == np.uint64 and batch_indices.dtype == np.int64
        assert (batch_indices == batch_ids.astype(np.int64) * 10).all()


def test_abandon_completes_whatever_is_left_once(monkeypatch):
    completed = []
    monkeypatch.setattr(lg_sut, "complete", lambda ids, top=None: completed.extend(np.asarray(ids).tolist()))
    sut = offline_sut(batch_size=4)
    sut.issue(list(range(10)), list(range(10)))
    in_flight, _ = sut._next_work()  # a worker runs samples 0..3 (and hangs)
    sut.ledger.open(in_flight)
    sut.ledger.note_issued(10)
    assert sut.abandon() == 10
    assert sorted(completed) == list(range(10))
    assert sut.ledger.completed == 10 and sut._work.empty()
    assert sut.abandon() == 0 and len(completed) == 10  # nothing twice


def test_abandon_and_workers_share_a_query_without_doubles(monkeypatch):
    # The watchdog empties the query while workers still take batches from it: each batch goes to one.
    abandoned = []
    monkeypatch.setattr(lg_sut, "complete", lambda ids, top=None: abandoned.extend(np.asarray(ids).tolist()))
    n = 20_000
    sut = offline_sut(batch_size=3)
    sut.issue(list(range(n)), list(range(n)))
    taken, lock = [], threading.Lock()

    def worker():
        while (batch := sut._next_work()) is not None:
            with lock:
                taken.extend(batch[0].tolist())

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.01)
    sut.abandon()
    deadline = time.monotonic() + 10
    while len(taken) + len(abandoned) < n and time.monotonic() < deadline:
        sut.abandon()  # a query a worker held for a moment is found on a later call
        time.sleep(0.001)
    for _ in threads:
        sut._work.put(None)
    for t in threads:
        t.join(timeout=5)
    assert sorted(taken + abandoned) == list(range(n))


def test_offline_run_with_several_workers_answers_every_sample_once(tmp_path):
    dataset = SyntheticDataset(40, rank=[0, 0, 2, 7] * 10)
    report = run(tmp_path, dataset, **{"run.mode": "accuracy", "run.threads": 3, "run.batch_size": 3})
    assert report["accuracy"] == {"top1": 0.5, "top5": 0.75, "n": 40}
    assert report["harness"]["issued"] == report["harness"]["completed"] == 40


class _Ledger:
    completed = outstanding = 0
    last_progress = 0.0


class _SUT:
    def __init__(self):
        self.ledger, self.errors = _Ledger(), []


def test_timeline_gets_the_moment_of_the_last_completion_in_order():
    sut = _SUT()
    monitor = RunMonitor(sut, stall_s=60, progress=False)
    monitor._start = 100.0
    monitor.timeline = [(0.5, 100), (1.0, 300), (2.0, 500)]
    sut.ledger.completed, sut.ledger.last_progress = 500, 101.5  # the last completion, 1.5 s in
    monitor._add_last_completion()
    assert monitor.timeline == [(0.5, 100), (1.0, 300), (1.5, 500), (2.0, 500)]
    # A run that did not finish (samples outstanding) or completed nothing has no such moment.
    for completed, outstanding in ((500, 3), (0, 0)):
        sut.ledger.completed, sut.ledger.outstanding = completed, outstanding
        monitor.timeline = [(0.5, 100)]
        monitor._add_last_completion()
        assert monitor.timeline == [(0.5, 100)]


def test_offline_run_timeline_ends_at_its_last_completion(tmp_path):
    report = run(tmp_path, SyntheticDataset(64), backend="null",
                 **{"run.batch_size": 16, "offline.target_qps": 2e5, "offline.min_duration_ms": 100})
    t, done = report["harness"]["timeline"]["t_s"], report["harness"]["timeline"]["completed"]
    assert done[-1] == report["harness"]["completed"]
    # Shorter than one 0.5 s interval: the last completion, then the end (when StartTest returned).
    assert done.count(done[-1]) >= 2 and t == sorted(t)
    last_completion = t[done.index(done[-1])]
    assert last_completion - report["loadgen"]["max_latency_ns"] / 1e9 >= -0.01  # LoadGen issued after 0 s


def _gpu_quickstart():
    from trtfuse.bench import quickstart

    return quickstart


def test_quick_start_offline_is_matched_with_a_loadgen_offline_run_of_the_same_engine():
    compare = _gpu_quickstart().offline_comparison
    engine = [{"model": "efficientnet-lite0", "batch": 256, "plugins": True, "samples_per_s": 1000.0},
              {"model": "efficientnet-lite0", "batch": 256, "plugins": False, "samples_per_s": 1100.0}]
    loadgen = {"model": "efficientnet-lite0", "batch": 256, "input_format": "int8", "valid": True,
               "samples_per_s": 950.0}
    committed = {"engine": engine, "offline_efficientnet_lite0": loadgen}
    both = compare(931.0, "efficientnet-lite0", 256, "int8", committed)
    assert both["ratio_to_committed"] == both["ratio_to_committed_loadgen_offline"] == 0.98
    assert both["ratio_to_committed_engine_only"] == 0.931  # the plugin engine's, still reported
    assert both["committed_engine_only_samples_per_s"] == 1000.0
    assert "LoadGen Offline" in both["compared_with"]
    # No like-for-like run (none committed, another batch or input format, or INVALID): engine-only, said so.
    for e2e in ({"engine": engine},
                {"engine": engine, "offline_efficientnet_lite0": {**loadgen, "batch": 128}},
                {"engine": engine, "offline_efficientnet_lite0": {**loadgen, "input_format": "float"}},
                {"engine": engine, "offline_efficientnet_lite0": {**loadgen, "valid": False}}):
        alone = compare(931.0, "efficientnet-lite0", 256, "int8", e2e)
        assert alone["committed_loadgen_offline_samples_per_s"] is None
        assert alone["ratio_to_committed"] == alone["ratio_to_committed_engine_only"] == 0.931
        assert "engine alone" in alone["compared_with"]
    assert compare(None, "efficientnet-lite0", 256, "int8", {})["ratio_to_committed"] is None
