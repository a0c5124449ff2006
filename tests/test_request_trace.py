"""request_trace: a client's requests to a server summed up (made-up spans, no server)."""

from trtfuse.request_trace import RequestSpan, describe, server_side, summarize


def test_requests_summed_up():
    # three requests on two slots: filled in 1-2 ms, answered 4-10 ms later; two overlap
    spans = [RequestSpan(8, 0.000, 0.001, 0.005), RequestSpan(8, 0.001, 0.003, 0.013),
             RequestSpan(4, 0.013, 0.014, 0.020)]
    s = summarize(spans, slots=2)
    assert s["requests"] == 3 and s["slots"] == 2 and s["span_ms"] == 20.0
    assert s["requests_per_s"] == 150.0
    assert s["rows"] == {"mean": 6.667, "p50": 8.0, "max": 8.0}
    assert s["fill_ms"] == {"mean": 1.333, "p50": 1.0, "max": 2.0}
    assert s["answer_ms"] == {"mean": 6.667, "p50": 6.0, "max": 10.0}
    assert s["in_flight_mean"] == 1.0   # (4 + 10 + 6) ms waiting over 20 ms
    line = describe(s)
    assert line.startswith("3 requests of 7 rows (mean), 150/s; fill 1.00 ms, answer 6.00 ms") and "1.00 of 2" in line


def test_no_requests_say_nothing():
    assert summarize([], slots=4) == {"source": summarize([], 1)["source"], "requests": 0, "slots": 4}
    assert describe(summarize([], slots=4)) is None and describe(None) is None


def _stats(model, requests, request_ns, queue_ns, infer_ns, inferences, executions):
    """Triton's statistics as the gRPC client's JSON gives them: 64-bit counts as strings, zero fields left out."""
    inference = {"success": {"count": str(requests), "ns": str(request_ns)}, "queue": {"count": str(requests),
                 "ns": str(queue_ns)}, "compute_infer": {"count": str(requests), "ns": str(infer_ns)}}
    return {"model_stats": [{"name": "other", "inference_count": "999", "execution_count": "999"},
                            {"name": model, "version": "1", "inference_count": str(inferences),
                             "execution_count": str(executions), "inference_stats": inference}]}


def test_server_side_is_the_difference_of_two_reads():
    before = _stats("resnet50", 10, 50_000_000, 10_000_000, 20_000_000, 800, 10)
    after = _stats("resnet50", 110, 650_000_000, 210_000_000, 320_000_000, 10_800, 60)
    s = server_side(before, after, "resnet50")
    assert s["requests"] == 100 and s["executions"] == 50 and s["rows_per_execution"] == 200.0
    # 600 ms over 100 requests; queue 200 ms, infer 300 ms; input and output copies were never counted
    assert s["request_ms"] == 6.0 and s["queue_ms"] == 2.0 and s["compute_infer_ms"] == 3.0
    assert s["compute_input_ms"] == 0.0 and s["compute_output_ms"] == 0.0
    spans = [RequestSpan(100, 0.0, 0.001, 0.009), RequestSpan(100, 0.009, 0.010, 0.020)]
    line = describe({**summarize(spans, slots=2), "server": s})
    assert "the server (mean per request): queue 2.00 ms, input 0.00, infer 3.00, output 0.00 of 6.00 ms" in line
    assert line.endswith("200 rows per execution")


def test_server_side_without_the_model_or_a_read_is_none():
    stats = _stats("resnet50", 1, 1, 1, 1, 1, 1)
    assert server_side(stats, stats, "efficientnet-lite0") is None
    assert server_side(None, stats, "resnet50") is None
    idle = server_side(stats, stats, "resnet50")
    assert idle["requests"] == 0 and idle["rows_per_execution"] is None and "request_ms" not in idle
