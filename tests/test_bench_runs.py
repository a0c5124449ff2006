"""trtfuse.bench.runs, the LoadGen rows and the Server search of the GPU machine's benchmark
scripts, run here on ONNX Runtime and a tiny model."""

import json

from conftest_harness import SyntheticDataset, tiny_model
from trtfuse.backends import create_backend
from trtfuse.bench.runs import BOUND_MS, loadgen_row, server_search


def test_a_row_of_an_offline_run(tmp_path):
    model = tiny_model(tmp_path)
    backend = create_backend("onnxruntime")
    backend.load(model, 8)
    try:
        # 200/s x 10 s, and LoadGen's 10 % more: 2200 samples in batches of 8. LoadGen's verdict and its samples/s, whatever this
        # machine made of them, reach the row as they are.
        row = loadgen_row(backend, model, SyntheticDataset(64), "offline", 8, 200.0, tmp_path / "runs", "tiny")
    finally:
        backend.close()
    reports = list((tmp_path / "runs").glob("tiny-*/report.json"))
    assert len(reports) == 1
    report = json.loads(reports[0].read_text())
    lg = report["loadgen"]
    assert (row["valid"], row["invalid_reasons"], row["samples_per_s"]) == (
        lg["valid"], lg["invalid_reasons"], lg["samples_per_s"])
    assert report["harness"]["issued"] == 2200 and row["mean_batch"] == 8
    assert row["lanes"] is None


def test_the_search_keeps_the_highest_passing_target_and_every_try():
    saved = []

    def run_at(qps):  # passes below 1000 QPS; above, the p99 is over the bound
        return {"valid": qps < 1000, "p99_ms": 5.0 if qps < 1000 else 2 * BOUND_MS}

    found = server_search(run_at, 800.0, 5, after_try=lambda: saved.append(1))
    assert found["valid"] and 800 <= found["qps"] < 1000 and found["p99_ms"] == 5.0
    assert len(found["tries"]) == 5 == len(saved)
    assert not server_search(lambda qps: {"valid": False, "p99_ms": 99.0}, 800.0, 2)["valid"]
