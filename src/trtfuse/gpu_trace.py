"""Where a run's GPU time went: each batch's input copy and engine run as the GPU timed them.

A LoadGen figure below the engine's own throughput was lost either on the host, where the GPU sat idle
between engine runs (``idle_ms``, ``gaps``), or on the GPU, where each run took longer than it does
alone (``run_ms``: copies beside it, clocks). A backend that copies to a GPU records four CUDA events
per batch while a trace is on (``Backend.start_trace``); this module only sums them up, so that it can
be checked without a GPU.

Times are milliseconds on the GPU's clock from the trace's start (an event recorded when it began).
"""

from __future__ import annotations

from dataclasses import dataclass

# An idle stretch of the GPU shorter than this is a launch's own latency, not a wait for the host.
GAP_MS = 0.05


@dataclass(frozen=True)
class BatchSpan:
    """One batch on the GPU: its input copy, then its engine run (ms from the trace's start)."""
    copy_start: float
    copy_end: float
    run_start: float
    run_end: float


def stats(values: list[float]) -> dict:
    """mean, p50 and max of ``values`` (ms or counts), rounded; None each without values."""
    if not values:
        return {"mean": None, "p50": None, "max": None}
    ordered = sorted(values)
    return {"mean": round(sum(ordered) / len(ordered), 3), "p50": round(ordered[len(ordered) // 2], 3),
            "max": round(ordered[-1], 3)}


def summarize(spans: list[BatchSpan], host_span_ms: float | None = None) -> dict:
    """The trace's batches summed up.

    busy_fraction: the time some engine run was on the GPU, over the span from the first run's start to
    the last run's end. idle_ms / gaps: the stretches in that span with no run on the GPU (counted from
    ``GAP_MS``). first_run_start_ms: how long after the trace began the first run started (the run's
    start-up: the first query's hand-over and the first copy). host_span_ms: the trace's length on the
    host's clock, to set the span against.
    """
    out = {"batches": len(spans), "host_span_ms": None if host_span_ms is None else round(host_span_ms, 1)}
    if not spans:
        return out
    runs = sorted((s.run_start, s.run_end) for s in spans)
    merged = [list(runs[0])]
    for start, end in runs[1:]:
        if start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    gaps = [b[0] - a[1] for a, b in zip(merged, merged[1:])]
    gaps = [g for g in gaps if g >= GAP_MS]
    span = merged[-1][1] - merged[0][0]
    busy = sum(end - start for start, end in merged)
    out.update({
        "first_run_start_ms": round(merged[0][0], 3),
        "span_ms": round(span, 3),
        "busy_fraction": round(busy / span, 4) if span > 0 else None,
        "idle_ms": round(sum(gaps), 3),
        "gaps": {"count": len(gaps), **stats(gaps)},
        "run_ms": stats([s.run_end - s.run_start for s in spans]),
        "copy_ms": stats([s.copy_end - s.copy_start for s in spans]),
    })
    return out


def describe(summary: dict | None) -> str | None:
    """One line for a person: how busy the GPU was and where it waited; None without a trace or batches."""
    if not summary or not summary.get("batches") or summary.get("busy_fraction") is None:
        return None
    gaps = summary["gaps"]
    waits = (f"idle {summary['idle_ms']:,.0f} ms in {gaps['count']} gap{'s' * (gaps['count'] > 1)} "
             f"(longest {gaps['max']:,.1f} ms)"
             if gaps["count"] else "no idle gaps")
    return (f"busy {summary['busy_fraction'] * 100:.1f} % of {summary['span_ms'] / 1e3:,.2f} s, {waits}; per batch "
            f"run {summary['run_ms']['p50']:,.2f} ms, copy {summary['copy_ms']['p50']:,.2f} ms (p50)")
