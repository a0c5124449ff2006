"""The Python SUT's per-query timeline (server.query_timeline): the arithmetic, and a real Server run."""

import time

import numpy as np
import pytest
from conftest_harness import ScriptedBackend, SyntheticDataset, tiny_model
from test_loadgen_runs import settings
from trtfuse import query_timeline, report, session
from trtfuse.backends import create_backend
from trtfuse.query_timeline import QueryTimeline, describe


def test_segments_and_the_attribution_of_the_slow_samples():
    t = QueryTimeline()
    # 99 fast samples in one batch, then one slow sample that waited 50 ms in the queue
    t.add([0.0] * 99, taken=0.001, inferred=0.003, completed=0.0031)
    t.add([1.0], taken=1.050, inferred=1.052, completed=1.0521)
    seg = t.segments_ms()
    assert len(t) == 100 and seg["total"].shape == (100,)
    assert np.allclose(seg["queued"] + seg["inference"] + seg["completion"], seg["total"])
    s = t.summary({"50.00": 4_000_000, "99.00": 60_000_000})
    slow = s["attribution_ms"]["p99"]
    assert slow["queued"] == pytest.approx(50.0) and slow["inference"] == pytest.approx(2.0)
    assert s["percentiles_ms"]["total"]["p50"] == pytest.approx(3.1)
    # LoadGen's p50 4 ms against the SUT's 3.1 ms: 0.9 ms before the SUT saw the query
    assert s["before_seen_ms"]["p50"] == pytest.approx(0.9)
    assert "queued 50.00 ms" in describe(s)


def test_an_empty_timeline_has_no_summary():
    assert QueryTimeline().summary() is None and describe(None) is None


class ClockStepping(ScriptedBackend):
    """Each inference moves the timeline's clock on by STEP_S: the inference segment must hold that step and no
    other segment may, however fast or slow the machine is (no elapsed time is judged)."""

    STEP_S = 1000.0

    def __init__(self, inner, clock: list):
        super().__init__(inner)
        self.clock = clock

    def infer(self, batch):
        self.clock[0] += self.STEP_S
        return super().infer(batch)


def test_a_server_run_times_every_completed_sample(tmp_path, monkeypatch):
    offset = [0.0]
    monkeypatch.setattr(query_timeline, "now", lambda: time.perf_counter() + offset[0])
    # one worker: only its own inference moves the clock between a batch's "taken" and "completed"
    s = settings(tmp_path, **{"run.scenario": "server", "run.backend": "onnxruntime", "run.threads": 1,
                              "server.query_timeline": True})
    model = tiny_model(tmp_path)
    backend = ClockStepping(create_backend("onnxruntime"), offset)
    backend.load(model, s["run"]["batch_size"])
    result = session.run(s, progress=False, model=model, dataset=SyntheticDataset(64), backend=backend)
    where = result["harness"]["query_timeline"]
    assert where["samples"] == result["harness"]["completed"] > 0
    pct, step_ms = where["percentiles_ms"], ClockStepping.STEP_S * 1e3
    assert min(v for seg in pct.values() for v in seg.values()) >= 0
    assert pct["inference"]["p50"] >= step_ms and pct["completion"]["p99"] < step_ms
    assert set(where["before_seen_ms"]) == {"p50", "p90", "p99"}
    assert "where p99 goes" in report.format_table(result)


def test_the_timeline_is_off_by_default(tmp_path):
    s = settings(tmp_path, **{"run.scenario": "server"})
    model = tiny_model(tmp_path)
    backend = create_backend("onnxruntime")
    backend.load(model, s["run"]["batch_size"])
    result = session.run(s, progress=False, model=model, dataset=SyntheticDataset(64), backend=backend)
    assert result["harness"]["query_timeline"] is None
