"""request_trace: a client's requests to a server summed up (made-up spans, no server)."""

from trtfuse.request_trace import RequestSpan, describe, summarize


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
