"""The native run loop (``--sut native``) on a CPU: LoadGen compiled from its source distribution and the
C++ SUT over the null engine. These check the mechanism (every sample answered once, the same answer in
both modes, MLCommons' compliance scripts, a hung engine, bad input), never a rate the machine decides:
where a test needs LoadGen's VALID, the engine's emulated run time sets the pace, so a slower machine only
makes the run longer."""

import ctypes
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest_harness import SyntheticDataset, tiny_model
from trtfuse import config, native_sut, session
from trtfuse import report as report_module
from trtfuse.errors import UserError

MLPERF_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "third_party" / "mlperf"

pytestmark = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                                reason="no C++ compiler to build the native SUT")


@pytest.fixture(scope="module")
def lib():
    return native_sut.library(progress=lambda *_: None)


def settings(tmp_path, **overrides):
    base = {
        "run.output_dir": str(tmp_path / "runs"),
        "run.backend": "null",
        "run.sut": "native",
        "run.batch_size": 8,
        "run.warmup_batches": 2,
        "run.watchdog_s": 30.0,
        "offline.min_duration_ms": 300,
        "offline.min_query_count": 1,
        "offline.target_qps": 20000.0,
        "server.min_duration_ms": 500,
        "server.min_query_count": 200,
        "server.target_qps": 400.0,
        "server.target_latency_ms": 1000.0,
        "mlperf.inference_dir": str(MLPERF_DIR),
    }
    return config.load(overrides={**base, **overrides})


def engine(dataset, model, batch=8, us_per_batch=0.0, slots=2):
    return native_sut.null_engine(dataset.images(np.array([0]))[0], model.num_classes, batch,
                                  slots_per_lane=slots, us_per_batch=us_per_batch)


def accuracy_log(run_dir) -> dict[int, str]:
    """qsl_idx -> response hex, every entry of LoadGen's accuracy log (a sample twice would show)."""
    entries = json.loads((Path(run_dir) / "mlperf_log_accuracy.json").read_text())
    out = {}
    for e in entries:
        assert e["qsl_idx"] not in out, f"sample {e['qsl_idx']} answered twice"
        out[e["qsl_idx"]] = e["data"]
    return out


def expected_answer(dataset, engine_, index) -> str:
    """The null engine's answer for one sample, computed here the way native/src/null_engine.cc does."""
    raw = np.ascontiguousarray(engine_.to_input(dataset.images(np.array([index]))[0])).tobytes()
    words = len(raw) // 8
    step = words // 64 if words > 64 else 1
    h = 1469598103934665603
    for w in range(0, words, step):
        h = ((h ^ int.from_bytes(raw[w * 8:w * 8 + 8], "little")) * 1099511628211) % 2**64
    for b in raw[words * 8:]:
        h = ((h ^ b) * 1099511628211) % 2**64
    top = np.array([(h + k) % 10 for k in range(5)], dtype="<i4")
    return top.tobytes().hex().upper()


def test_the_library_is_built_from_the_installed_loadgens_sources(lib):
    import importlib.metadata

    assert native_sut.loadgen_version().startswith(importlib.metadata.version("mlcommons-loadgen"))
    assert lib.tf_has_tensorrt() in (0, 1)


def test_offline_answers_every_sample_once_and_is_valid_when_the_engine_sets_the_pace(tmp_path, lib):
    # At most 8 samples per 2 ms (4000/s) against 20000/s expected: LoadGen's one query outlasts min
    # duration on any machine, so VALID here is decided by the engine, not by the CPU.
    data, model = SyntheticDataset(64), tiny_model(tmp_path)
    eng = engine(data, model, us_per_batch=2000.0)
    report = session.run(settings(tmp_path), progress=False, model=model, dataset=data, backend=eng)
    lg, h = report["loadgen"], report["harness"]
    assert report["sut"] == "native" and report["backend"] == "null"
    assert lg["scenario"] == "offline" and lg["valid"], lg
    assert h["issued"] == h["completed"] == lg["result_samples"] if "result_samples" in lg else h["issued"] > 0
    assert h["issued"] == h["completed"] > 0 and h["mean_batch"] == pytest.approx(8, abs=0.5)
    assert h["qsl_loaded_samples"] == 64
    eng.close()


def test_server_completes_every_query_and_reports_latencies(tmp_path, lib):
    data, model = SyntheticDataset(64), tiny_model(tmp_path)
    eng = engine(data, model)
    report = session.run(settings(tmp_path, **{"run.scenario": "server"}), progress=False, model=model, dataset=data,
                         backend=eng)
    lg, h = report["loadgen"], report["harness"]
    assert lg["scenario"] == "server"
    assert h["issued"] == h["completed"] >= 200
    assert lg["latency_ns"]["99.00"] > 0 and lg["errors"] == 0
    eng.close()


def test_performance_and_accuracy_mode_answer_each_sample_the_same(tmp_path, lib):
    data, model = SyntheticDataset(40), tiny_model(tmp_path)
    eng = engine(data, model)
    acc = session.run(settings(tmp_path, **{"run.mode": "accuracy"}), progress=False, model=model, dataset=data,
                      backend=eng)
    answers = accuracy_log(acc["run_dir"])
    assert sorted(answers) == list(range(40))  # every sample once
    for i in (0, 7, 39):
        assert answers[i] == expected_answer(data, eng, i)
    # Performance mode with every sample's response logged (LoadGen's accuracy_log_probability).
    perf_settings = settings(tmp_path)
    perf = session.run(perf_settings, progress=False, model=model, dataset=data, backend=eng)
    assert perf["harness"]["completed"] > 0
    eng.close()


@pytest.mark.parametrize("scenario", ["singlestream", "multistream"])
def test_stream_scenarios_answer_every_query_once(tmp_path, lib, scenario):
    data, model = SyntheticDataset(64), tiny_model(tmp_path)
    eng = engine(data, model, us_per_batch=1000.0)
    s = settings(tmp_path, **{"run.scenario": scenario, f"{scenario}.min_duration_ms": 300})
    report = session.run(s, progress=False, model=model, dataset=data, backend=eng)
    lg, h = report["loadgen"], report["harness"]
    per_query = 8 if scenario == "multistream" else 1
    assert lg["scenario"] == scenario
    assert h["issued"] == h["completed"] >= s[scenario]["min_query_count"] * per_query
    # one query at a time: every batch is exactly one query's samples
    assert h["mean_batch"] == pytest.approx(per_query)
    eng.close()


@pytest.mark.parametrize("scenario, test", [("offline", "TEST01"), ("offline", "TEST04"), ("server", "TEST01"),
                                            ("server", "TEST04"), ("singlestream", "TEST01"),
                                            ("multistream", "TEST01")])
def test_compliance_passes_with_mlcommons_scripts(tmp_path, lib, test, scenario):
    from trtfuse.compliance import run_compliance

    if not (MLPERF_DIR / "compliance" / test).is_dir():
        pytest.skip(f"MLCommons' {test} is not at {MLPERF_DIR}")
    data, model = SyntheticDataset(64), tiny_model(tmp_path)
    # The emulated device paces both runs alike (a batch of 8 every 8 ms: 1000 samples/s, far below what
    # the host path does): TEST01's and TEST04's comparisons of two rates are then the engine's, not the CPU's.
    eng = engine(data, model, us_per_batch=8000.0)
    s = settings(tmp_path, **{"run.scenario": scenario, "offline.target_qps": 2500.0, "server.target_qps": 500.0,
                              "server.min_query_count": 700, "server.min_duration_ms": 1000,
                              "singlestream.min_duration_ms": 500, "multistream.min_duration_ms": 500})
    verdict = run_compliance(test, s, out=tmp_path / test, progress=False, model=model, dataset=data, backend=eng)
    if scenario in ("singlestream", "multistream"):
        # Their metric is a latency percentile, which a shared CPU's wake-ups move by more than TEST01's 10 %
        # band: only the part the SUT decides is checked here, every audited answer equal to accuracy mode's.
        assert verdict["accuracy_check"], verdict
    else:
        assert verdict["passed"], verdict
    eng.close()


def test_a_hung_engine_fails_the_run_instead_of_hanging(tmp_path, lib):
    # Each batch "runs" for 60 s; the watchdog (1 s without a completion) answers what the slots hold.
    data, model = SyntheticDataset(32), tiny_model(tmp_path)
    eng = engine(data, model, us_per_batch=60e6)
    s = settings(tmp_path, **{"run.watchdog_s": 1.0, "run.warmup_batches": 0})
    with pytest.raises(UserError, match="no sample completed"):
        session.run(s, progress=False, model=model, dataset=data, backend=eng)
    assert eng.hung
    eng.close()  # leaves the engine to the process: a slot is still asleep inside it


def test_a_failing_sample_loader_fails_the_run(tmp_path, lib):
    class Broken(SyntheticDataset):
        def images(self, indices):
            if len(indices) > 1:
                raise OSError("disk gone")
            return super().images(indices)

    data, model = Broken(16), tiny_model(tmp_path)
    eng = engine(data, model)
    with pytest.raises((UserError, RuntimeError), match="disk gone|sample loader"):
        session.run(settings(tmp_path, **{"run.warmup_batches": 0}), progress=False, model=model, dataset=data,
                    backend=eng)
    eng.close()


def test_native_sut_refuses_python_only_backends(tmp_path):
    with pytest.raises(UserError, match="native SUT runs TensorRT engines and the null engine"):
        settings(tmp_path, **{"run.backend": "onnxruntime"})


def test_batch_larger_than_the_engine_is_refused(tmp_path, lib):
    data, model = SyntheticDataset(16), tiny_model(tmp_path)
    eng = engine(data, model, batch=4)
    with pytest.raises(UserError, match="larger than the engine's 4"):
        session.run(settings(tmp_path), progress=False, model=model, dataset=data, backend=eng)
    eng.close()


def test_settings_reach_the_native_loadgen_field_by_field(tmp_path, lib):
    """Every field the Python binding decided is the one the native LoadGen logs as effective."""
    from trtfuse.report import read_loadgen_results

    data, model = SyntheticDataset(64), tiny_model(tmp_path)
    eng = engine(data, model, us_per_batch=2000.0)
    report = session.run(settings(tmp_path, **{"offline.min_duration_ms": 400}), progress=False, model=model,
                         dataset=data, backend=eng)
    import mlperf_loadgen as lg

    eff = read_loadgen_results(report["run_dir"])["effective_settings"]
    assert eff["min_duration_ms"] == 400 and eff["min_query_count"] == 1
    assert float(eff["target_qps"]) == pytest.approx(20000.0)
    assert eff["performance_sample_count"] == 64
    python_side = lg.TestSettings()
    python_side.FromConfig("", "resnet50", "Offline", 0)  # the seeds of the Python binding's mlperf.conf
    for seed in ("qsl_rng_seed", "sample_index_rng_seed", "schedule_rng_seed"):
        assert eff[seed] == getattr(python_side, seed) != 0, seed
    eng.close()


def test_tensorrt_engine_without_tensorrt_is_one_clear_error(lib):
    if lib.tf_has_tensorrt():
        pytest.skip("this build has TensorRT")
    import ctypes

    err = ctypes.create_string_buffer(256)
    assert not lib.tf_engine_tensorrt(b"x.plan", None, 0, 8, 2, 0, 0, b"top_classes", err, 256)
    assert b"without TensorRT" in err.value


def lanes_engine(dataset, model, lanes, us_per_batch=0.0, slots=2):
    return native_sut.null_engine(dataset.images(np.array([0]))[0], model.num_classes, 8, lanes=lanes,
                                  slots_per_lane=slots, us_per_batch=us_per_batch)


@pytest.mark.parametrize("lanes", [2, 4])
def test_offline_on_several_lanes_reports_each_lanes_share(tmp_path, lib, lanes):
    # Each lane emulates its own device (1 ms a batch): while one lane's slots sleep, the others take
    # batches, so every lane runs some; the per-lane counts must add up to the session's.
    data, model = SyntheticDataset(64), tiny_model(tmp_path)
    eng = lanes_engine(data, model, lanes, us_per_batch=1000.0)
    report = session.run(settings(tmp_path), progress=False, model=model, dataset=data, backend=eng)
    h, rows = report["harness"], report["lanes"]
    assert [r["lane"] for r in rows] == list(range(lanes))
    assert sum(r["samples"] for r in rows) == h["completed"] == h["issued"] > 0
    assert sum(r["batches"] for r in rows) == pytest.approx(h["completed"] / h["mean_batch"])
    assert all(r["batches"] > 0 for r in rows), rows
    for r in rows:  # the emulated device's time: 1 ms per batch this lane ran
        assert r["busy_ms"] == pytest.approx(r["batches"] * 1.0)
        assert r["samples_per_s"] > 0 and 0 < r["share"] < 1
    assert sum(r["samples_per_s"] for r in rows) == pytest.approx(report["loadgen"]["samples_per_s"], rel=1e-3)
    table = report_module.format_table(report)
    for i in range(lanes):
        assert f"lane {i}" in table
    assert "lane spread" in table and "max/min samples" in table
    eng.close()


def test_every_sample_is_answered_once_across_lanes(tmp_path, lib):
    data, model = SyntheticDataset(40), tiny_model(tmp_path)
    eng = lanes_engine(data, model, 3, us_per_batch=200.0)
    acc = session.run(settings(tmp_path, **{"run.mode": "accuracy"}), progress=False, model=model, dataset=data,
                  backend=eng)
    answers = accuracy_log(acc["run_dir"])
    assert sorted(answers) == list(range(40))
    assert answers[5] == expected_answer(data, eng, 5)  # the same answer whichever lane ran it
    assert sum(r["samples"] for r in acc["lanes"]) == 40
    eng.close()


def test_lane_stats_cover_one_run_and_refuse_a_lane_out_of_range(tmp_path, lib):
    data, model = SyntheticDataset(16), tiny_model(tmp_path)
    eng = lanes_engine(data, model, 2)
    session = native_sut.NativeSession(eng, data, 16, 8, 0.0, 0)
    try:
        session.warmup(3)
        assert [r["batches"] for r in session.lane_stats()] == [0, 0]  # the warm-up is no lane's run
        out = native_sut._LaneStats()
        assert lib.tf_session_lane_stats(session._handle, 2, ctypes.byref(out)) != 0
        assert lib.tf_session_lane_stats(session._handle, -1, ctypes.byref(out)) != 0
    finally:
        session.close()
        eng.close()


def test_a_single_lane_run_prints_no_lane_lines(tmp_path, lib):
    data, model = SyntheticDataset(32), tiny_model(tmp_path)
    eng = engine(data, model)
    report = session.run(settings(tmp_path), progress=False, model=model, dataset=data, backend=eng)
    assert len(report["lanes"]) == 1 and report["lanes"][0]["samples"] == report["harness"]["completed"]
    assert "lane spread" not in report_module.format_table(report)
    eng.close()


def test_a_library_built_from_other_sources_is_stale(tmp_path, monkeypatch):
    """A library built before native/ changed lacks what the Python side calls: it is rebuilt, not loaded."""
    from trtfuse import native_build

    monkeypatch.delenv("TRTFUSE_NATIVE_LIB", raising=False)
    lib = tmp_path / native_build.NATIVE_LIB
    lib.write_bytes(b"")
    assert native_build.is_stale(lib)  # no stamp: built by an older trtfuse
    stamp = lib.with_name(lib.name + ".json")
    stamp.write_text(json.dumps({"sources": native_build.sources_digest(), "tensorrt": True}))
    assert not native_build.is_stale(lib) and native_build.built_from(lib)["tensorrt"]
    stamp.write_text(json.dumps({"sources": "0" * 16, "tensorrt": False}))
    assert native_build.is_stale(lib)
    monkeypatch.setenv("TRTFUSE_NATIVE_LIB", str(lib))  # a user's own library is taken as it is
    assert not native_build.is_stale(lib)
