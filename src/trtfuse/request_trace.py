"""Where a run's time went on the client of a server (the triton backend): each request's filling of its input (rows
gathered and copied to the server's memory) and its wait for the answer, on the client's clock, while a trace is on
(``Backend.start_trace``). A Server run that falls short of its target shows here whether the requests waited on the
client (fill) or on the server (answer), and how many were in flight; this module only sums them up, so that it can
be checked without a server.
"""

from __future__ import annotations

from dataclasses import dataclass

from trtfuse.gpu_trace import stats


@dataclass(frozen=True)
class RequestSpan:
    """One request: its rows, and when (s, the client's perf_counter) it took a slot, was sent and was answered."""
    rows: int
    start: float
    sent: float
    answered: float


def summarize(spans: list[RequestSpan], slots: int) -> dict:
    """The trace's requests summed up. in_flight_mean: the requests waiting for an answer, on average over the span
    from the first request's start to the last answer (``slots`` at most: the backend's inflight)."""
    out = {"source": "the client's clock: per request, filling its input, then waiting for the server's answer",
           "requests": len(spans), "slots": slots}
    if not spans:
        return out
    span = max(s.answered for s in spans) - min(s.start for s in spans)
    out.update({
        "span_ms": round(span * 1e3, 3),
        "requests_per_s": round(len(spans) / span, 1) if span > 0 else None,
        "rows": stats([float(s.rows) for s in spans]),
        "fill_ms": stats([(s.sent - s.start) * 1e3 for s in spans]),
        "answer_ms": stats([(s.answered - s.sent) * 1e3 for s in spans]),
        "in_flight_mean": round(sum(s.answered - s.sent for s in spans) / span, 2) if span > 0 else None,
    })
    return out


def describe(summary: dict | None) -> str | None:
    """One line for a person: requests, their rows, fill and answer times, and how many were in flight."""
    if not summary or not summary.get("requests") or summary.get("span_ms") is None:
        return None
    return (f"{summary['requests']:,} requests of {summary['rows']['mean']:,.0f} rows (mean), "
            f"{summary['requests_per_s']:,.0f}/s; fill {summary['fill_ms']['p50']:,.2f} ms, answer "
            f"{summary['answer_ms']['p50']:,.2f} ms (p50, max {summary['answer_ms']['max']:,.1f}); "
            f"{summary['in_flight_mean']:.2f} of {summary['slots']} slots in flight on average")
