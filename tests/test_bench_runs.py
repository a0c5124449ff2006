"""benchmarks/bench_runs.py, the LoadGen rows and the Server search of the GPU machine's benchmark
scripts, run here on ONNX Runtime and a tiny model."""

import sys
from pathlib import Path

from conftest_harness import SyntheticDataset, tiny_model
from trtfuse.backends import create_backend

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "benchmarks"), str(REPO / "tools")]
from bench_runs import BOUND_MS, loadgen_row, server_search  # noqa: E402


def test_a_row_of_an_offline_run(tmp_path):
    model = tiny_model(tmp_path)
    backend = create_backend("onnxruntime")
    backend.load(model, 8)
    try:
        # 2000/s x 10 s = 20,000 samples, which the tiny model answers in well under 10 s: LoadGen's
        # verdict (INVALID, min duration not met) must reach the row as it is.
        row = loadgen_row(backend, model, SyntheticDataset(64), "offline", 8, 2000.0, tmp_path / "runs", "tiny")
    finally:
        backend.close()
    assert row["valid"] is False and "min duration not met" in row["invalid_reasons"]
    assert row["samples_per_s"] > 2000 and row["mean_batch"] == 8
    assert row["lanes"] is None and len(list((tmp_path / "runs").glob("tiny-*/report.json"))) == 1


def test_the_search_keeps_the_highest_passing_target_and_every_try():
    saved = []

    def run_at(qps):  # passes below 1000 QPS; above, the p99 is over the bound
        return {"valid": qps < 1000, "p99_ms": 5.0 if qps < 1000 else 2 * BOUND_MS}

    found = server_search(run_at, 800.0, 5, after_try=lambda: saved.append(1))
    assert found["valid"] and 800 <= found["qps"] < 1000 and found["p99_ms"] == 5.0
    assert len(found["tries"]) == 5 == len(saved)
    assert not server_search(lambda qps: {"valid": False, "p99_ms": 99.0}, 800.0, 2)["valid"]
