"""Short real LoadGen runs (Offline and Server) over onnxruntime and a tiny model with known answers."""

import json

import numpy as np
import pytest
from conftest_harness import ScriptedBackend, SyntheticDataset, tiny_model
from trtfuse import config, session
from trtfuse.backends import create_backend


def settings(tmp_path, **overrides):
    base = {
        "run.output_dir": str(tmp_path / "runs"),
        "run.backend": "onnxruntime",
        "run.batch_size": 4,
        "run.warmup_batches": 2,
        "run.watchdog_s": 30.0,
        "offline.min_duration_ms": 300,
        "offline.min_query_count": 1,
        "offline.target_qps": 2000.0,
        "server.min_duration_ms": 1000,
        "server.min_query_count": 700,
        "server.target_qps": 700.0,
        # A bound no query of a ~1 s run can miss unless the run hangs: whether a Server run is VALID must
        # not depend on the machine's speed here (CI shares 2 cores); real bounds are measured in benchmarks/.
        "server.target_latency_ms": 60000.0,
    }
    return config.load(overrides={**base, **overrides})


def run(tmp_path, dataset, background=False, backend="onnxruntime", **overrides):
    s = settings(tmp_path, **overrides)
    model = tiny_model(tmp_path, background=background)
    b = create_backend(backend)
    b.load(model, s["run"]["batch_size"])
    return session.run(s, progress=False, model=model, dataset=dataset, backend=b)


def test_offline_performance_run_is_valid_and_writes_the_run_folder(tmp_path):
    # At most 16 samples per 2 ms = 8000/s, below the 20000/s LoadGen is told to expect: its one
    # query (6000 samples) then outlasts min duration whatever the machine's speed.
    s = settings(tmp_path, **{"run.batch_size": 16, "offline.target_qps": 20000.0})
    model = tiny_model(tmp_path)
    backend = ScriptedBackend(create_backend("onnxruntime"), delay_s=0.002)
    backend.load(model, 16)
    report = session.run(s, progress=False, model=model, dataset=SyntheticDataset(64), backend=backend)
    lg = report["loadgen"]
    assert lg["scenario"] == "offline" and lg["valid"], lg
    assert lg["samples_per_s"] > 0
    assert report["harness"]["issued"] == report["harness"]["completed"] > 0
    run_dir = tmp_path / "runs" / report["run_dir"].split("/")[-1]
    for name in (
        "mlperf_log_summary.txt",
        "mlperf_log_detail.txt",
        "mlperf_log_accuracy.json",
        "report.json",
        "qsl.json",
    ):
        assert (run_dir / name).is_file(), name
    assert json.loads((run_dir / "report.json").read_text())["loadgen"]["valid"] is True
    assert "VALID" in cli_table(report)


def cli_table(report):
    from trtfuse.report import format_table

    return format_table(report)


def test_server_performance_run_meets_its_latency_bound(tmp_path):
    report = run(tmp_path, SyntheticDataset(64), **{"run.scenario": "server"})
    lg = report["loadgen"]
    assert lg["scenario"] == "server" and lg["valid"], lg
    assert lg["latency_ns"]["99.00"] <= 60000e6
    assert report["harness"]["issued"] == report["harness"]["completed"] >= 700
    assert lg["errors"] == 0


def test_server_batch_leaves_at_once_when_a_worker_is_idle():
    # A free worker takes what is pending at once, however far from a full batch (64): a batcher that
    # waited for full batches held every query of a 100 QPS run ~0.6 s. Queries that arrive while
    # the workers are busy go together in the next batch.
    from trtfuse.lg_sut import ServerSUT

    sut = ServerSUT(backend=None, qsl=None, batch_size=64, poll_s=3600.0)  # a poll would hang the test
    sut.issue([7], [70])
    ids, indices = sut._next_work()
    assert ids.tolist() == [7] and indices.tolist() == [70]
    for q in ([1], [2, 3], [4]):
        sut.issue(q, [i * 10 for i in q])
    ids, indices = sut._next_work()
    assert ids.tolist() == [1, 2, 3, 4] and indices.tolist() == [10, 20, 30, 40]


def test_server_run_with_a_batch_larger_than_the_load_answers_every_query(tmp_path):
    # 100 QPS against batches of 64: every query comes back, none waits for a batch to fill.
    report = run(tmp_path, SyntheticDataset(64), **{
        "run.scenario": "server", "run.batch_size": 64,
        "server.target_qps": 100.0, "server.min_query_count": 100, "server.min_duration_ms": 1000})
    assert report["harness"]["issued"] == report["harness"]["completed"] >= 100
    assert report["loadgen"]["latency_ns"]["99.00"] > 0


@pytest.mark.parametrize("scenario", ["offline", "server"])
@pytest.mark.parametrize("background", [False, True])
def test_accuracy_round_trip_gives_the_known_answer(tmp_path, scenario, background):
    # 40 samples: 20 right at top-1, 10 right only within top-5, 10 wrong -> 50 % / 75 %.
    dataset = SyntheticDataset(40, rank=[0, 0, 2, 7] * 10)
    report = run(
        tmp_path,
        dataset,
        background=background,
        **{"run.scenario": scenario, "run.mode": "accuracy"},
    )
    acc = report["accuracy"]
    assert acc["n"] == 40
    assert acc["top1"] == pytest.approx(dataset.expected_top1) == 0.5
    assert acc["top5"] == pytest.approx(dataset.expected_top5) == 0.75


def test_accuracy_mode_loads_every_sample_once_over_several_qsl_loads(tmp_path):
    dataset = SyntheticDataset(40, rank=[0, 3] * 20)
    report = run(tmp_path, dataset, **{"run.mode": "accuracy", "run.performance_sample_count": 16})
    h = report["harness"]
    assert h["qsl_load_calls"] == 3  # 16 + 16 + 8
    assert h["qsl_loaded_samples"] == 40
    # The QSL read exactly the samples LoadGen asked for (plus the warm-up batch, read first).
    qsl_reads = np.concatenate(dataset.images_calls[1:])
    assert sorted(qsl_reads.tolist()) == list(range(40))
    assert report["accuracy"]["top1"] == 0.5 and report["accuracy"]["n"] == 40


def test_offline_splits_its_one_huge_query_into_batches(tmp_path):
    s = settings(tmp_path, **{"run.batch_size": 8, "offline.target_qps": 2000.0})
    model = tiny_model(tmp_path)
    inner = create_backend("onnxruntime")
    backend = ScriptedBackend(inner)
    backend.load(model, 8)
    report = session.run(s, progress=False, model=model, dataset=SyntheticDataset(64), backend=backend)
    issued = report["harness"]["issued"]
    loadgen_calls = backend.calls[s["run"]["warmup_batches"] :]
    assert issued >= 600  # one query of (2000/s x 0.3 s) samples
    assert max(loadgen_calls) == 8 and sum(loadgen_calls) == issued
    assert len(loadgen_calls) == -(-issued // 8)


def test_null_backend_offline_and_server_answer_every_sample_in_full_batches(tmp_path):
    # How fast the harness itself goes is measured by `trtfuse bench harness-cpu`, not here: a loaded
    # CI machine decides that. Here: Offline's 20,000 samples go in full batches, each answered once;
    # Server's 3000 queries all come back.
    dataset = SyntheticDataset(256)
    offline = run(
        tmp_path,
        dataset,
        backend="null",
        **{"run.batch_size": 64, "offline.target_qps": 0.0, "offline.min_duration_ms": 0,
           "offline.min_query_count": 20_000},
    )
    assert offline["loadgen"]["valid"], offline["loadgen"]  # min duration 0: met at any speed
    assert offline["harness"]["issued"] == offline["harness"]["completed"] == 20_000
    assert offline["harness"]["mean_batch"] == pytest.approx(20_000 / 313)  # 312 full batches and one of 32
    server = run(
        tmp_path,
        dataset,
        backend="null",
        **{
            "run.scenario": "server",
            "run.batch_size": 64,
            "server.target_qps": 3000.0,
            "server.min_query_count": 3000,
        },
    )
    assert server["loadgen"]["valid"], server["loadgen"]
    assert server["harness"]["issued"] == server["harness"]["completed"] >= 3000


class GcProbe(ScriptedBackend):
    """Records, at each batch, whether Python's garbage collector is on."""

    def __init__(self, inner):
        super().__init__(inner)
        self.gc_on: list[bool] = []

    def infer(self, batch):
        import gc
        self.gc_on.append(gc.isenabled())
        return super().infer(batch)


@pytest.mark.parametrize("gc_disable", [True, False])
def test_the_gc_is_off_only_during_the_timed_run_when_asked(tmp_path, gc_disable):
    import gc
    model = tiny_model(tmp_path)
    backend = GcProbe(create_backend("onnxruntime"))
    backend.load(model, 4)
    assert gc.isenabled()
    report = session.run(settings(tmp_path, **{"run.gc_disable": gc_disable}), progress=False, model=model,
                         dataset=SyntheticDataset(16), backend=backend)
    assert report["harness"]["completed"] > 0
    timed = backend.gc_on[2:]  # after the two warm-up batches, which run before StartTest
    assert backend.gc_on[:2] == [True, True] and timed
    assert not any(timed) if gc_disable else all(timed)
    assert gc.isenabled()  # on again once the run is over
    assert report["harness"]["gpu"] is None  # a backend without a device clock keeps no trace
