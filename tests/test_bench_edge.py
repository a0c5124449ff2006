"""trtfuse.bench.edge on the CPU: what a latency row takes from a run's report."""

from trtfuse.bench.edge import per_query


def test_a_latency_row_splits_the_query_into_engine_copies_and_host():
    report = {"harness": {"gpu": {"run_ms": {"mean": 0.313, "p50": 0.312}, "copy_ms": {"mean": 0.073},
                                  "gaps": {"count": 9, "mean": 0.293}}}}
    assert per_query(report) == {"gpu_run_ms": 0.313, "copy_ms": 0.073, "host_gap_ms": 0.293}
    assert per_query({"harness": {"gpu": None}}) == {}   # a backend without CUDA events (ONNX Runtime)
