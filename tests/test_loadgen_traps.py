"""LoadGen's known traps, one test each: each would abort, hang or silently change a run."""

import json
import threading

import numpy as np
import pytest
from conftest_harness import SHAPE, ScriptedBackend, SyntheticDataset, tiny_model
from test_loadgen_runs import settings
from trtfuse import config
from trtfuse.backends import Backend, create_backend
from trtfuse.backends.null_backend import NullBackend
from trtfuse.errors import UserError
from trtfuse.lg_qsl import SampleLibrary
from trtfuse.lg_run import loadgen_settings, run_loadgen, warm_up


def detail(run_dir) -> dict:
    logged = {}
    for line in (run_dir / "mlperf_log_detail.txt").read_text().splitlines():
        if line.startswith(":::MLLOG "):
            entry = json.loads(line[9:])
            logged[entry["key"]] = entry["value"]
    return logged


def scripted(tmp_path, s, **faults):
    model = tiny_model(tmp_path)
    backend = ScriptedBackend(create_backend("onnxruntime"), **faults)
    backend.load(model, s["run"]["batch_size"])
    return model, backend


def test_exception_in_the_backend_fails_the_run_without_killing_the_process(tmp_path):
    s = settings(tmp_path)
    model, backend = scripted(tmp_path, s, fail_at=4)  # after the 2 warm-up batches
    with pytest.raises(RuntimeError, match="scripted failure"):
        run_loadgen(backend, model, SyntheticDataset(32), s, tmp_path / "run")
    assert (tmp_path / "run" / "mlperf_log_summary.txt").is_file()  # LoadGen finished normally


def test_user_error_in_the_backend_reaches_the_user_as_one(tmp_path):
    s = settings(tmp_path, **{"run.scenario": "server"})
    model, backend = scripted(
        tmp_path, s, fail_at=3, error=UserError("GPU fell off the bus", "reseat it")
    )
    with pytest.raises(UserError, match="GPU fell off"):
        run_loadgen(backend, model, SyntheticDataset(32), s, tmp_path / "run")


@pytest.mark.parametrize("scenario", ["offline", "server"])
def test_watchdog_ends_a_run_whose_backend_hangs(tmp_path, scenario):
    s = settings(tmp_path, **{"run.scenario": scenario, "run.watchdog_s": 1.0})
    model, backend = scripted(tmp_path, s, hang_at=3)
    timer = threading.Timer(30, backend.release.set)  # never leave a thread stuck if this fails
    timer.start()
    try:
        with pytest.raises(UserError, match="hung"):
            run_loadgen(backend, model, SyntheticDataset(32), s, tmp_path / "run")
        assert not backend.release.is_set()  # the watchdog, not the safety timer, ended it
    finally:
        backend.release.set()
        timer.cancel()


def test_missing_output_folder_is_created(tmp_path):
    s = settings(tmp_path)
    model = tiny_model(tmp_path)
    backend = create_backend("onnxruntime")
    backend.load(model, 4)
    run_dir = tmp_path / "does" / "not" / "exist"
    run_loadgen(backend, model, SyntheticDataset(16), s, run_dir)
    assert (run_dir / "mlperf_log_detail.txt").is_file()


def test_builtin_mlperf_conf_applies_on_every_run_in_a_process():
    # LoadGen's FromConfig(user.conf) loads mlperf.conf only on its first call in a process; ours
    # must give the same (non-default) rng seeds and latency bound every time.
    s = config.load(overrides={"run.scenario": "server"})
    seen = []
    for _ in range(3):
        ts = loadgen_settings(s, total_count=2000, measured_qps=None)
        seen.append(
            (
                ts.qsl_rng_seed,
                ts.sample_index_rng_seed,
                ts.schedule_rng_seed,
                ts.performance_sample_count_override,
            )
        )
    assert seen[0] == seen[1] == seen[2]
    assert all(seen[0][:3]), "mlperf.conf's seeds are non-zero; 0 means it was not loaded"
    assert seen[0][3] == 1024  # resnet50's performance_sample_count in mlperf.conf


def test_audit_config_in_the_working_directory_is_ignored(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # LoadGen reads ./audit.config by default; this one would change the run's sample count.
    (tmp_path / "audit.config").write_text("*.*.performance_sample_count_override = 3\n")
    s = settings(tmp_path, **{"run.performance_sample_count": 8})
    model = tiny_model(tmp_path)
    backend = create_backend("onnxruntime")
    backend.load(model, 4)
    run_loadgen(backend, model, SyntheticDataset(16), s, tmp_path / "run")
    assert detail(tmp_path / "run")["effective_performance_sample_count"] == 8


def test_warm_up_runs_before_loadgen_starts(tmp_path):
    s = settings(tmp_path, **{"run.warmup_batches": 3})
    model, backend = scripted(tmp_path, s)
    dataset = SyntheticDataset(16)
    events = []
    original = dataset.images
    dataset.images = lambda idx: (events.append("images"), original(idx))[1]
    inner_infer = backend.infer
    backend.infer = lambda batch: (events.append("infer"), inner_infer(batch))[1]
    run_loadgen(backend, model, dataset, s, tmp_path / "run")
    # warm-up reads one batch and runs it 3 times; only then does LoadGen load the QSL.
    assert events[:5] == ["images", "infer", "infer", "infer", "images"]


def test_qsl_holds_exactly_what_loadgen_loaded():
    dataset = SyntheticDataset(10)
    qsl = SampleLibrary(dataset, performance_sample_count=4)
    qsl.load([7, 2, 5])
    assert qsl.loaded_indices.tolist() == [2, 5, 7]
    np.testing.assert_array_equal(qsl.gather(np.array([5, 7])), dataset._x[[5, 7]])
    qsl.unload([2, 7])
    assert qsl.loaded_indices.tolist() == [5]
    np.testing.assert_array_equal(qsl.gather(np.array([5])), dataset._x[[5]])
    with pytest.raises(RuntimeError, match="not loaded"):
        qsl.gather(np.array([7]))
    qsl.unload([5])
    assert qsl.loaded_indices.tolist() == []


class _StoreBackend(Backend):
    """Records the QSL's store allocations; its input type is float16."""

    def __init__(self):
        self.allocs = []

    def load(self, model, batch_size):
        pass

    def infer(self, batch):
        return batch

    def to_input(self, images):
        return images.astype(np.float16)

    def host_array(self, shape, dtype):
        self.allocs.append((shape, np.dtype(dtype)))
        return np.full(shape, 99, dtype)  # stale content: every row read must have been written


def test_qsl_store_comes_from_the_backend_and_reuses_rows():
    dataset = SyntheticDataset(10)
    backend = _StoreBackend()
    qsl = SampleLibrary(dataset, performance_sample_count=4, backend=backend)
    qsl.load([7, 2, 5, 2])  # a repeat is loaded once
    assert backend.allocs == [((4, *SHAPE), np.dtype(np.float16))]  # capacity = performance_sample_count
    assert qsl.store.dtype == np.float16
    np.testing.assert_array_equal(qsl.gather([5, 7, 5]), dataset._x[[5, 7, 5]].astype(np.float16))
    qsl.unload([2, 7])
    qsl.load([0, 9, 1])  # the freed rows are reused: still one allocation
    assert len(backend.allocs) == 1
    assert sorted(qsl.rows([0, 9, 1, 5]).tolist()) == [0, 1, 2, 3]
    np.testing.assert_array_equal(qsl.gather([9, 0, 1, 5]), dataset._x[[9, 0, 1, 5]].astype(np.float16))
    # Beyond the capacity (LoadGen never asks for it, but a caller might): the store grows, keeping rows.
    qsl.load([3, 4])
    assert backend.allocs[-1] == ((6, *SHAPE), np.dtype(np.float16))
    np.testing.assert_array_equal(qsl.gather([5, 3, 4, 0]), dataset._x[[5, 3, 4, 0]].astype(np.float16))
    # The default infer_rows gathers exactly those rows.
    rows = qsl.rows([4, 9])
    np.testing.assert_array_equal(backend.infer_rows(qsl.store, rows), qsl.store[rows])


def test_server_completes_every_query_with_its_own_id_under_coalescing(tmp_path):
    # Coalesced Server queries arrive several per call; accuracy answers prove each response went
    # back under its own id (a swapped id would swap the answers between samples).
    dataset = SyntheticDataset(50, rank=[0, 6] * 25)
    s = settings(
        tmp_path,
        **{
            "run.scenario": "server",
            "run.mode": "accuracy",
            "server.coalesce_queries": True,
            "run.batch_size": 8,
        },
    )
    from trtfuse import session

    model = tiny_model(tmp_path)
    backend = create_backend("onnxruntime")
    backend.load(model, 8)
    report = session.run(s, progress=False, model=model, dataset=dataset, backend=backend)
    assert report["accuracy"] == {"top1": 0.5, "top5": 0.5, "n": 50}
    assert report["harness"]["issued"] == report["harness"]["completed"] == 50


def test_server_workers_split_coalesced_queries_into_batches():
    # Queries of 3, 6 and 2 samples into batches of at most 4: every sample once, in arrival order,
    # the index travelling with its id; with nothing pending and the SUT stopping, no batch.
    from trtfuse.lg_sut import ServerSUT

    sut = ServerSUT(backend=None, qsl=None, batch_size=4)
    for q in ([1, 2, 3], [4, 5, 6, 7, 8, 9], [10, 11]):
        sut.issue(q, [i * 10 for i in q])
    batches = [sut._next_work() for _ in range(3)]
    assert [b[0].tolist() for b in batches] == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11]]
    for ids, idx in batches:
        assert (idx == ids.astype(np.int64) * 10).all()
    sut._running = False
    assert sut._next_work() is None


class FakeClock:
    """lg_run's ``time``: perf_counter steps ``step_s`` per call, so a rate follows from the calls."""

    def __init__(self, step_s: float):
        self.now, self.step_s = 0.0, step_s

    def perf_counter(self) -> float:
        self.now += self.step_s
        return self.now


def test_warm_up_times_the_serving_path_not_plain_infer(tmp_path, monkeypatch):
    # A backend like TensorRT's: serving from a store it allocated is fast, plain infer of a host batch
    # pays a conversion. Sizing an Offline run by plain infer made LoadGen expect too few samples/s,
    # and the run ended before its min duration (INVALID). The warm-up runs what the SUT runs.
    from trtfuse import lg_run

    calls = []

    class StoreFast(NullBackend):
        def infer(self, batch):
            calls.append("infer")
            return super().infer(batch)

        def infer_rows(self, store, rows):
            calls.append("infer_rows")
            return self._answer[: len(rows)]

    model = tiny_model(tmp_path)
    backend = StoreFast()
    backend.load(model, 8)
    qsl = SampleLibrary(SyntheticDataset(16), 16, backend)
    monkeypatch.setattr(lg_run, "time", FakeClock(0.5))
    rate = warm_up(backend, qsl, 8, 4)
    assert calls == ["infer_rows"] * 4  # the serving path only, never plain infer
    assert rate == 8 * 3 / 0.5  # all but the first batch, over the timed span
    assert qsl.loaded_indices.size == 0 and qsl.load_calls == []  # nothing left for LoadGen to trip on


def test_warm_up_runs_batches_as_the_sut_does_several_at_once(tmp_path, monkeypatch):
    # A backend that runs 4 batches at once (streams, lanes, servers): timed one at a time it looks 4x
    # slower than it serves, and an Offline run sized by that ended before its min duration
    # (INVALID). The batches run on 4 threads at once: each waits at a barrier for the other 3.
    from trtfuse import lg_run

    together = threading.Barrier(4, timeout=30)  # broken, and the test failed, unless all 4 overlap

    class FourAtOnce(NullBackend):
        concurrency = 4
        calls = 0

        def infer_rows(self, store, rows):
            FourAtOnce.calls += 1
            if FourAtOnce.calls > 1:  # the first batch (one-time setup) runs alone, untimed
                together.wait()
            return self._answer[: len(rows)]

    model = tiny_model(tmp_path)
    backend = FourAtOnce()
    backend.load(model, 8)
    qsl = SampleLibrary(SyntheticDataset(16), 16, backend)
    monkeypatch.setattr(lg_run, "time", FakeClock(0.5))
    rate = warm_up(backend, qsl, 8, 2, threads=4)
    assert FourAtOnce.calls == 1 + 4 + 8  # the first, one untimed per thread, then two timed per thread
    assert rate == 8 * 8 / 0.5
