"""gpu_trace.summarize: a run's batches (copy and engine-run spans on the GPU's clock) summed up as
how busy the GPU was and where it waited. The spans a TensorRT backend records are checked on the GPU
in test_tensorrt_backend.py."""

import pytest
from trtfuse.gpu_trace import GAP_MS, BatchSpan, summarize


def test_back_to_back_runs_keep_the_gpu_busy():
    spans = [BatchSpan(0.0, 2.0, 2.0, 12.0), BatchSpan(3.0, 5.0, 12.0, 22.0), BatchSpan(13.0, 15.0, 22.0, 32.0)]
    s = summarize(spans, host_span_ms=40.0)
    assert s["batches"] == 3 and s["host_span_ms"] == 40.0
    assert s["first_run_start_ms"] == 2.0 and s["span_ms"] == 30.0
    assert s["busy_fraction"] == 1.0 and s["idle_ms"] == 0.0 and s["gaps"]["count"] == 0
    assert s["run_ms"] == {"mean": 10.0, "p50": 10.0, "max": 10.0}
    assert s["copy_ms"]["mean"] == 2.0


def test_idle_stretches_between_runs_are_the_hosts_share():
    # Runs 10 ms each, a 5 ms and a 1 ms wait between them (in any order of arrival), and one wait below
    # GAP_MS, which is a launch's latency and not counted.
    tiny = GAP_MS / 2
    spans = [BatchSpan(0, 1, 26.0, 36.0 - tiny), BatchSpan(0, 1, 0.0, 10.0), BatchSpan(0, 1, 15.0, 25.0),
             BatchSpan(0, 1, 36.0, 46.0)]
    s = summarize(spans)
    assert s["host_span_ms"] is None
    assert s["span_ms"] == 46.0
    assert s["gaps"] == {"count": 2, "mean": 3.0, "p50": 5.0, "max": 5.0}
    assert s["idle_ms"] == 6.0
    assert s["busy_fraction"] == pytest.approx((46.0 - 6.0 - tiny) / 46.0, abs=1e-4)


def test_overlapping_runs_count_once():
    # Two streams whose runs overlap (serial_compute off): busy time is their union, not their sum.
    s = summarize([BatchSpan(0, 0, 0.0, 10.0), BatchSpan(0, 0, 5.0, 15.0), BatchSpan(0, 0, 20.0, 30.0)])
    assert s["span_ms"] == 30.0
    assert s["busy_fraction"] == pytest.approx(25.0 / 30.0, abs=1e-4)
    assert s["gaps"]["count"] == 1 and s["idle_ms"] == 5.0


def test_no_batches_says_so_without_ratios():
    assert summarize([], host_span_ms=12.5) == {"batches": 0, "host_span_ms": 12.5}


def test_a_run_table_names_the_gpus_busy_share_and_its_waits():
    from trtfuse.gpu_trace import describe
    from trtfuse.report import format_table

    trace = summarize([BatchSpan(0.0, 8.0, 8.0, 32.0), BatchSpan(9.0, 17.0, 44.0, 68.0)])
    assert describe(trace) == ("busy 80.0 % of 0.06 s, idle 12 ms in 1 gap (longest 12.0 ms); per batch "
                               "run 24.00 ms, copy 8.00 ms (p50)")
    assert describe(summarize([BatchSpan(0, 1, 1, 5)])).startswith("busy 100.0 % of 0.00 s, no idle gaps")
    assert describe(None) is None and describe(summarize([])) is None
    report = {"model": "m", "backend": "tensorrt", "scenario": "offline", "mode": "performance", "batch_size": 8,
              "dataset": "d", "dataset_size": 8, "run_dir": "runs/x",
              "loadgen": {"scenario": "offline", "samples_per_s": 10.0, "latency_ns": {}, "valid": True},
              "harness": {"gpu": trace}}
    assert "  GPU  " in format_table(report) and describe(trace) in format_table(report)
    report["harness"]["gpu"] = {"lanes": [trace, None]}  # two GPUs, the second without a trace
    table = format_table(report)
    assert "GPU 0" in table and "GPU 1" not in table
    report["harness"]["gpu"] = None  # a backend without a device clock: no line
    assert "GPU" not in format_table(report)
