"""Where a run's time went on the client of a server (the triton backend): each request's filling of its input (rows
gathered and copied to the server's memory) and its wait for the answer, on the client's clock, while a trace is on
(``Backend.start_trace``). A Server run that falls short of its target shows here whether the requests waited on the
client (fill) or on the server (answer), and how many were in flight. The server's own statistics over the same span
(Triton's per-model counters: queue, input copy, inference, output copy) split the answer further: what is left of
it is the transport (gRPC, the client's callback). This module only sums them up, so that it can be checked
without a server.
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


SERVER_PHASES = ("queue", "compute_input", "compute_infer", "compute_output")


def _counters(stats: dict | None, model: str) -> dict | None:
    """One model's counters in Triton's statistics (``get_inference_statistics(as_json=True)``: protobuf's JSON,
    whose 64-bit counts are strings and whose zeros are left out), summed over its versions."""
    rows = [m for m in (stats or {}).get("model_stats", []) if m.get("name") == model]
    if not rows:
        return None
    out = {"inferences": 0, "executions": 0, "requests": 0, "request_ns": 0}
    out.update({f"{phase}_ns": 0 for phase in SERVER_PHASES})
    for m in rows:
        inference = m.get("inference_stats", {})
        out["inferences"] += int(m.get("inference_count", 0))
        out["executions"] += int(m.get("execution_count", 0))
        out["requests"] += int(inference.get("success", {}).get("count", 0))
        out["request_ns"] += int(inference.get("success", {}).get("ns", 0))
        for phase in SERVER_PHASES:
            out[f"{phase}_ns"] += int(inference.get(phase, {}).get("ns", 0))
    return out


def server_side(before: dict | None, after: dict | None, model: str) -> dict | None:
    """What the server counted for ``model`` between two reads of its statistics: requests, the rows it ran in how
    many executions (its dynamic batcher's merges), and per request the mean time (ms) in its queue, copying
    inputs, inferring and copying outputs; None when either read lacks the model."""
    a, b = _counters(before, model), _counters(after, model)
    if a is None or b is None:
        return None
    d = {k: b[k] - a[k] for k in a}
    requests = d["requests"]
    out = {"source": "the server's statistics (Triton's per-model counters)", "requests": requests,
           "executions": d["executions"],
           "rows_per_execution": round(d["inferences"] / d["executions"], 1) if d["executions"] else None}
    if requests:
        out["request_ms"] = round(d["request_ns"] / requests / 1e6, 3)
        out.update({f"{phase}_ms": round(d[f"{phase}_ns"] / requests / 1e6, 3) for phase in SERVER_PHASES})
    return out


def describe(summary: dict | None) -> str | None:
    """One line for a person: requests, their rows, fill and answer times, and how many were in flight."""
    if not summary or not summary.get("requests") or summary.get("span_ms") is None:
        return None
    line = (f"{summary['requests']:,} requests of {summary['rows']['mean']:,.0f} rows (mean), "
            f"{summary['requests_per_s']:,.0f}/s; fill {summary['fill_ms']['p50']:,.2f} ms, answer "
            f"{summary['answer_ms']['p50']:,.2f} ms (p50, max {summary['answer_ms']['max']:,.1f}); "
            f"{summary['in_flight_mean']:.2f} of {summary['slots']} slots in flight on average")
    server = summary.get("server")
    if server and server.get("request_ms") is not None:
        rows = server["rows_per_execution"]
        line += (f"; the server (mean per request): queue {server['queue_ms']:.2f} ms, input "
                 f"{server['compute_input_ms']:.2f}, infer {server['compute_infer_ms']:.2f}, output "
                 f"{server['compute_output_ms']:.2f} of {server['request_ms']:.2f} ms, "
                 f"{'no' if rows is None else f'{rows:,.0f}'} rows per execution")
    return line
