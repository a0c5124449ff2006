"""LanesBackend: several backends serving as one, each call to the least busy lane; --devices parsing;
Backend.classify. Lanes here are CPU backends (ONNX Runtime, or a small one whose speed and failures
a test sets); the TensorRT lanes (one per GPU) are tested in test_tensorrt_backend.py."""

import argparse
import threading
import time

import numpy as np
import pytest
from conftest_harness import ScriptedBackend, SyntheticDataset, tensorrt_backend_usable, tiny_model
from test_loadgen_runs import settings
from trtfuse import cli, config, session
from trtfuse.accuracy import read_predictions
from trtfuse.backends import Backend, create_backend, top_k_classes
from trtfuse.backends.lanes import LanesBackend
from trtfuse.backends.null_backend import NullBackend
from trtfuse.backends.tensorrt_backend import TensorRTBackend, parse_devices
from trtfuse.errors import UserError


class Lane(Backend):
    """A lane whose answer is the batch's channel means (the tiny model's logits), after ``delay_s``;
    it records its calls (in ``log`` too, shared by lanes, to see their order), waits on ``gate``
    when given, and can fail on infer, load or close."""

    def __init__(self, name="lane", delay_s=0.0, concurrency=1, cap=None, gate=None, log=None,
                 error=None, load_error=None, close_error=None):
        self.name, self.delay_s, self.concurrency, self.cap = name, delay_s, concurrency, cap
        self.gate, self.log = gate, log if log is not None else []
        self.error, self.load_error, self.close_error = error, load_error, close_error
        self.calls: list[int] = []
        self.adopted: list[np.ndarray] = []
        self.loaded = self.closed = False

    def load(self, model, batch_size):
        if self.load_error:
            raise self.load_error
        self.max_batch = min(batch_size, self.cap or batch_size)
        self.loaded = True

    def infer(self, batch):
        self.calls.append(len(batch))
        self.log.append(self.name)
        if self.gate is not None:
            self.gate.wait(60)
        if self.error:
            raise self.error
        time.sleep(self.delay_s)
        return batch.mean(axis=(2, 3))

    def adopt_host_array(self, array):
        self.adopted.append(array)

    def close(self):
        self.closed = True
        if self.close_error:
            raise self.close_error


def _batch(n, seed=0):
    return SyntheticDataset(max(n, 1), seed=seed).images(range(n))


def _wait_until(condition, timeout_s=60.0):  # a bound on a hang, not a measurement
    end = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.001)


def _loaded(*lanes, batch_size=8):
    backend = LanesBackend(lanes)
    backend.load(None, batch_size)
    return backend


# -- spreading ---------------------------------------------------------------------------------

def test_equal_lanes_take_turns():
    log = []
    backend = _loaded(Lane("a", log=log), Lane("b", log=log), Lane("c", log=log))
    for _ in range(7):
        backend.infer(_batch(4))
    assert log == ["a", "b", "c", "a", "b", "c", "a"]
    assert [s["batches"] for s in backend.lane_stats()] == [3, 2, 2]
    assert [s["samples"] for s in backend.lane_stats()] == [12, 8, 8]
    assert all(s["outstanding"] == 0 for s in backend.lane_stats())


def test_a_call_goes_to_the_lane_with_the_fewest_outstanding_samples():
    # Lane a holds 8 samples, lane b 2, both stuck; round-robin would now pick a, least work picks b.
    gate = threading.Event()
    a, b = Lane("a", gate=gate), Lane("b", gate=gate)
    backend = _loaded(a, b)
    threads = [threading.Thread(target=backend.infer, args=(_batch(8),))]
    threads[0].start()
    _wait_until(lambda: a.calls == [8])
    threads.append(threading.Thread(target=backend.infer, args=(_batch(2),)))
    threads[1].start()
    _wait_until(lambda: b.calls == [2])
    assert [s["outstanding"] for s in backend.lane_stats()] == [8, 2]
    threads.append(threading.Thread(target=backend.infer, args=(_batch(1),)))
    threads[2].start()
    _wait_until(lambda: len(b.calls) == 2)
    gate.set()
    for t in threads:
        t.join(5)
    assert a.calls == [8] and b.calls == [2, 1]
    assert [(s["samples"], s["batches"], s["outstanding"]) for s in backend.lane_stats()] == [(8, 1, 0), (3, 2, 0)]


def test_a_slow_lane_gets_fewer_batches_than_a_fast_one():
    slow, fast = Lane("slow", delay_s=0.03), Lane("fast", delay_s=0.003)
    backend = _loaded(slow, fast)
    x = _batch(4)

    def caller():
        for _ in range(15):
            backend.infer(x)

    threads = [threading.Thread(target=caller) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    stats = backend.lane_stats()
    assert stats[0]["batches"] + stats[1]["batches"] == 60
    # Turn by turn would give each 30; by outstanding work the fast lane takes about 10x as many.
    assert stats[1]["batches"] > 3 * stats[0]["batches"], stats


def test_every_entry_point_is_spread_and_answers_like_one_lane(tmp_path):
    model = tiny_model(tmp_path)
    one = create_backend("onnxruntime", threads=1)
    one.load(model, 8)
    backend = LanesBackend([create_backend("onnxruntime", threads=1) for _ in range(2)])
    backend.load(model, 8)
    data = SyntheticDataset(16, rank=[0, 1, 3, 6] * 4)
    x = data.images(range(16))
    store = backend.host_array(x.shape, x.dtype)
    store[:] = backend.to_input(x)
    rows = np.array([3, 0, 15, 7, 7, 2])
    np.testing.assert_array_equal(backend.infer(x[rows]), one.infer(x[rows]))
    np.testing.assert_array_equal(backend.infer_rows(store, rows), one.infer(x[rows]))
    np.testing.assert_array_equal(backend.classify_rows(store, rows), one.classify_rows(x, rows))
    np.testing.assert_array_equal(backend.classify(x[rows], k=3), one.classify(x[rows], k=3))
    assert [s["batches"] for s in backend.lane_stats()] == [2, 2]
    backend.close()
    one.close()


# -- what the lanes add up to ------------------------------------------------------------------

def test_concurrency_is_the_sum_and_max_batch_the_smallest():
    backend = _loaded(Lane("t", concurrency=2, cap=8), Lane("t", concurrency=3, cap=6), batch_size=16)
    assert backend.concurrency == 5
    assert backend.max_batch == 6
    assert backend.name == "t" and len(backend.lane_stats()) == 2
    assert LanesBackend([Lane("a"), Lane("b")]).name == "a + b"
    with pytest.raises(ValueError, match="at least one lane"):
        LanesBackend([])


def test_the_store_comes_from_the_first_lane_and_every_other_lane_adopts_it():
    first, second, third = Lane(), Lane(), Lane()
    backend = _loaded(first, second, third)
    store = backend.host_array((5, 10, 2, 2), np.float32)
    assert first.adopted == []
    assert second.adopted[0] is store and third.adopted[0] is store


def test_an_exception_in_a_lane_reaches_the_caller_unchanged():
    error = RuntimeError("lane b is broken")
    backend = _loaded(Lane("a"), Lane("b", error=error))
    backend.infer(_batch(2))  # lane a
    with pytest.raises(RuntimeError) as raised:
        backend.infer(_batch(3))  # lane b
    assert raised.value is error
    assert [(s["samples"], s["batches"], s["outstanding"]) for s in backend.lane_stats()] == [(2, 1, 0), (0, 0, 0)]


def test_a_failed_load_closes_the_lanes_loaded_and_raises():
    a, b, c = Lane("a"), Lane("b", load_error=UserError("GPU 1 is out of memory")), Lane("c")
    with pytest.raises(UserError, match="GPU 1 is out of memory"):
        LanesBackend([a, b, c]).load(None, 8)
    assert a.loaded and c.loaded and not b.loaded
    assert a.closed and c.closed and not b.closed


def test_close_closes_every_lane_even_when_one_fails():
    error = RuntimeError("close failed")
    lanes = [Lane("a"), Lane("b", close_error=error), Lane("c")]
    backend = _loaded(*lanes)
    with pytest.raises(RuntimeError, match="close failed"):
        backend.close()
    assert all(lane.closed for lane in lanes)


# -- Backend.classify --------------------------------------------------------------------------

def test_classify_is_the_top_k_of_infer(tmp_path):
    backend = create_backend("onnxruntime")
    backend.load(tiny_model(tmp_path), 8)
    data = SyntheticDataset(8, rank=[0, 1, 2, 4, 0, 0, 7, 9])
    x = data.images(range(8))
    top = backend.classify(x)
    assert top.dtype == np.int32 and top.shape == (8, 5)
    np.testing.assert_array_equal(top, top_k_classes(backend.infer(x)))
    np.testing.assert_array_equal(top[:, 0] == data.labels[:8], data.rank == 0)
    np.testing.assert_array_equal(backend.classify(x, k=2), top[:, :2])


# -- choosing the GPUs ---------------------------------------------------------------------------

@pytest.mark.parametrize("spec, count, devices", [
    ("", 1, [0]), ("", 4, [0]), ("0", 4, [0]), ("all", 3, [0, 1, 2]), ("ALL", 1, [0]),
    ("0,1,3", 4, [0, 1, 3]), (" 2 , 0 ", 4, [2, 0]), ("1", 2, [1]),
])
def test_parse_devices(spec, count, devices):
    assert parse_devices(spec, count) == devices


@pytest.mark.parametrize("spec, count, message", [
    ("4", 4, r"GPU 4 does not exist: 4 GPU\(s\) are visible"),
    ("0,2", 2, r"GPU 2 does not exist: 2 GPU\(s\) are visible"),
    ("0,1,0", 2, "names GPU 0 twice"),
    ("gpu0", 2, "not a list of GPU numbers"),
    ("0,,1", 2, "not a list of GPU numbers"),
    ("-1", 2, "not a list of GPU numbers"),
    ("1.5", 2, "not a list of GPU numbers"),
    ("", 0, "no CUDA GPU is visible"),
    ("all", 0, "no CUDA GPU is visible"),
])
def test_parse_devices_refuses_what_does_not_exist(spec, count, message):
    with pytest.raises(UserError, match=message):
        parse_devices(spec, count)


@pytest.fixture()
def fake_gpus(monkeypatch):
    """TensorRTBackend.create on a CPU machine: TensorRT 'imports' and three GPUs are 'visible'
    (construction only: nothing here touches a GPU)."""
    try:
        from trtfuse import cuda_runtime
    except UserError:
        pytest.skip("cuda-python is not installed")
    from trtfuse.backends import tensorrt_backend

    monkeypatch.setattr(tensorrt_backend, "import_tensorrt", lambda: object())
    monkeypatch.setattr(cuda_runtime, "device_count", lambda: 3)
    monkeypatch.setattr(cuda_runtime, "require_gpu", lambda: None)


def test_tensorrt_create_makes_one_lane_per_device(fake_gpus):
    backend = create_backend("tensorrt", devices="0,2", streams=3)
    assert isinstance(backend, LanesBackend) and backend.name == "tensorrt" and len(backend.lanes) == 2
    assert [lane.device for lane in backend.lanes] == [0, 2]
    assert all(isinstance(lane, TensorRTBackend) and lane.n_streams == 3 for lane in backend.lanes)
    assert backend.lanes[1]._engine_of is backend.lanes[0]  # built or found once, by the lane loaded first
    assert [lane.device for lane in create_backend("tensorrt", devices="all").lanes] == [0, 1, 2]
    # One GPU: the plain backend, exactly as before --devices existed.
    for spec, device in (("", 0), ("0", 0), ("1", 1)):
        plain = create_backend("tensorrt", devices=spec)
        assert type(plain) is TensorRTBackend and plain.device == device
    assert type(create_backend("tensorrt")) is TensorRTBackend
    with pytest.raises(UserError, match="GPU 3 does not exist"):
        create_backend("tensorrt", devices="3")
    with pytest.raises(UserError, match="GPU 3 does not exist"):  # named GPUs: no fallback to the CPU
        create_backend("auto", devices="3")


def test_other_backends_ignore_devices():
    assert type(create_backend("null", devices="all")) is NullBackend


def test_the_devices_flag_is_a_tensorrt_setting():
    parser = argparse.ArgumentParser()
    cli._add_run_arguments(parser)
    given = vars(parser.parse_args(["--devices", "0,1"]))
    assert given["tensorrt.devices"] == "0,1"
    assert config.defaults()["tensorrt"]["devices"] == ""  # GPU 0 alone, as before
    assert config.load(overrides={"tensorrt.devices": "all"})["tensorrt"]["devices"] == "all"


@pytest.mark.skipif(tensorrt_backend_usable(), reason="TensorRT is installed here")
def test_auto_with_named_gpus_says_why_instead_of_running_on_the_cpu():
    with pytest.raises(UserError):
        create_backend("auto", devices="all")
    assert create_backend("auto").name == "onnxruntime"  # without --devices it still falls back


# -- real LoadGen runs over lanes --------------------------------------------------------------

def _onnxruntime_lanes(model, count=2, batch_size=4):
    backend = LanesBackend([create_backend("onnxruntime", threads=1) for _ in range(count)])
    backend.load(model, batch_size)
    return backend


@pytest.mark.parametrize("scenario", ["offline", "server"])
def test_a_loadgen_run_over_lanes_answers_every_sample_as_one_lane_does(tmp_path, scenario):
    dataset = SyntheticDataset(40, rank=[0, 0, 2, 7] * 10)
    model = tiny_model(tmp_path)
    overrides = {"run.scenario": scenario, "run.mode": "accuracy", "run.warmup_batches": 0}
    one = create_backend("onnxruntime", threads=1)
    one.load(model, 4)
    lanes = _onnxruntime_lanes(model)
    try:
        single = session.run(settings(tmp_path / "one", **overrides), progress=False, model=model,
                             dataset=dataset, backend=one)
        spread = session.run(settings(tmp_path / "lanes", **overrides), progress=False, model=model,
                             dataset=dataset, backend=lanes)
    finally:
        one.close()
        lanes.close()
    assert spread["backend"] == "onnxruntime" and len(spread["lanes"]) == 2
    assert spread["harness"]["issued"] == spread["harness"]["completed"] == 40
    assert spread["accuracy"]["n"] == 40
    assert spread["accuracy"]["top1"] == single["accuracy"]["top1"] == 0.5
    predictions = read_predictions(spread["run_dir"])
    assert sorted(predictions) == list(range(40))
    reference = read_predictions(single["run_dir"])
    for index, top in predictions.items():
        np.testing.assert_array_equal(top, reference[index])
    stats = lanes.lane_stats()
    assert all(s["samples"] > 0 for s in stats), stats  # (warm-up off: all of it LoadGen's work)
    assert sum(s["samples"] for s in stats) == 40


def test_an_offline_performance_run_keeps_every_lane_busy(tmp_path):
    # Each lane runs at most 4 samples per 2 ms; two of them, fed by two workers, share the query.
    s = settings(tmp_path, **{"run.warmup_batches": 0, "offline.target_qps": 3000.0})
    model = tiny_model(tmp_path)
    lanes = [ScriptedBackend(create_backend("onnxruntime", threads=1), delay_s=0.002) for _ in range(2)]
    backend = LanesBackend(lanes)
    backend.load(model, 4)
    try:
        report = session.run(s, progress=False, model=model, dataset=SyntheticDataset(64), backend=backend)
    finally:
        backend.close()
    issued = report["harness"]["issued"]
    assert issued == report["harness"]["completed"] >= 900  # one query: 3000/s x 0.3 s
    stats = backend.lane_stats()
    assert sum(s["samples"] for s in stats) == issued == sum(sum(lane.calls) for lane in lanes)
    assert min(s["batches"] for s in stats) > 0.3 * max(s["batches"] for s in stats), stats


class TracedLane(Lane):
    def __init__(self, trace=None, **kwargs):
        super().__init__(**kwargs)
        self.trace, self.tracing = trace, False

    def start_trace(self):
        self.tracing = True

    def stop_trace(self):
        self.tracing = False
        return self.trace


def test_lanes_trace_each_lane_and_report_them_in_order():
    a, b = TracedLane(trace={"batches": 3}), TracedLane(trace={"batches": 5})
    lanes = LanesBackend([a, b])
    lanes.start_trace()
    assert a.tracing and b.tracing
    assert lanes.stop_trace() == {"lanes": [{"batches": 3}, {"batches": 5}]}
    assert not a.tracing and not b.tracing
    # Lanes without a device clock (the base Backend's no-op): no trace at all.
    assert LanesBackend([Lane(), Lane()]).stop_trace() is None
