"""Pictures of one run, written beside its report.json.

  latency_cdf.png            performance runs: the latency CDF through LoadGen's logged percentiles
                             (min, p50 ... p99.9, max; not every sample), p99 marked, the Server bound
  completed_over_time.png    completed samples over time and the rate (samples/s) in each interval
                             between the harness's timeline samples (every 0.5 s during StartTest, and
                             the last completion); LoadGen's min duration; Offline: LoadGen's timed
                             span (its issue to the last completion), its first completion and result

matplotlib draws them (Agg canvas, no display, no pyplot state); without it ``write_run_plots`` notes
``pip install matplotlib`` once on stderr and draws nothing. A report missing fields gets the pictures
it can make. The data each picture shows comes from ``latency_cdf_data`` and ``timeline_data``.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from trtfuse.report import read_report

LATENCY_CDF = "latency_cdf.png"
COMPLETED_OVER_TIME = "completed_over_time.png"
# Intervals of the timeline shorter than this join a neighbour for the rate: a few batches completing
# in a few ms (before the last-completion point, or the end) would otherwise read as a spike.
MIN_RATE_INTERVAL_S = 0.25
DPI = 110
# LoadGen's logged percentiles (report.PERCENTILES) as fractions of the samples.
PERCENTILE_FRACTIONS = (("50.00", 0.5), ("90.00", 0.9), ("95.00", 0.95), ("97.00", 0.97),
                        ("99.00", 0.99), ("99.90", 0.999))

_noted_missing = False


def as_number(value) -> float | None:
    """A finite float, or None (absent, null, a string default=str wrote, NaN)."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _dict(value) -> dict:
    return value if isinstance(value, dict) else {}


def run_title(report: dict) -> str:
    """`model, scenario mode, VALID|INVALID` (the verdict only for performance runs)."""
    lg = _dict(report.get("loadgen"))
    scenario = str(report.get("scenario") or lg.get("scenario") or "?")
    mode = str(report.get("mode") or lg.get("mode") or "?")
    parts = [str(report.get("model") or "?"), f"{scenario.capitalize()} {mode}"]
    if mode == "performance" and "valid" in lg:
        parts.append("VALID" if lg["valid"] else "INVALID")
    if report.get("backend"):
        parts.append(str(report["backend"]))
    return ", ".join(parts)


def latency_cdf_data(report: dict) -> dict | None:
    """What latency_cdf.png shows, or None when the report has no latencies (accuracy runs).

    ``points``: (label, latency ms, fraction of samples at or below it), in order: min (0), p50, p90,
    p95, p97, p99, p99.9, max (1); those LoadGen logged. ``p99_ms``, ``mean_ms``, ``bound_ms`` (the
    Server latency bound, else None), ``valid``, ``title``.
    """
    lg = _dict(report.get("loadgen"))
    if (report.get("mode") or lg.get("mode")) == "accuracy":
        return None
    logged = _dict(lg.get("latency_ns"))
    points: list[tuple[str, float, float]] = []
    lo = as_number(lg.get("min_latency_ns"))
    if lo is not None:
        points.append(("min", lo / 1e6, 0.0))
    for key, fraction in PERCENTILE_FRACTIONS:
        ns = as_number(logged.get(key))
        if ns is not None:
            points.append((f"p{key.rstrip('0').rstrip('.')}", ns / 1e6, fraction))
    hi = as_number(lg.get("max_latency_ns"))
    if hi is not None:
        points.append(("max", hi / 1e6, 1.0))
    if len(points) < 2:
        return None
    scenario = str(lg.get("scenario") or report.get("scenario") or "").lower()
    bound = as_number(lg.get("target_latency_ns")) if scenario == "server" else None
    p99 = as_number(logged.get("99.00"))
    mean = as_number(lg.get("mean_latency_ns"))
    return {
        "points": points,
        "p99_ms": None if p99 is None else p99 / 1e6,
        "mean_ms": None if mean is None else mean / 1e6,
        "bound_ms": bound / 1e6 if bound else None,
        "valid": lg.get("valid"),
        "scenario": scenario,
        "title": run_title(report),
    }


def interval_rates(t: list[float], completed: list[float],
                   min_interval_s: float = MIN_RATE_INTERVAL_S) -> list[tuple[float, float, float]]:
    """(from s, to s, samples/s) over consecutive intervals of the timeline: the rate in each interval
    between samples, averaged over nothing wider, so a start is a step, not a ramp. An interval shorter
    than ``min_interval_s`` joins the next one (at the end: the one before)."""
    cuts = [0]
    for j in range(1, len(t)):
        if t[j] - t[cuts[-1]] >= min_interval_s:
            cuts.append(j)
    if cuts[-1] != len(t) - 1:
        if len(cuts) > 1:
            cuts[-1] = len(t) - 1  # a short last interval joins the one before
        else:
            cuts.append(len(t) - 1)  # the whole timeline is short: one interval
    return [(t[a], t[b], (completed[b] - completed[a]) / (t[b] - t[a]))
            for a, b in zip(cuts, cuts[1:]) if t[b] > t[a]]


def loadgen_offline_span(report: dict, t: list[float], completed: list[float]) -> dict | None:
    """Offline performance: LoadGen's timed span on the timeline, or None.

    LoadGen times an Offline run from its issue of the one query to the last completion: its samples/s
    is all samples over that span, which is its max latency, and the first sample completes its min
    latency after the issue. The span ends at the timeline's first point at the final count: the last
    completion, exactly, where the harness recorded it (else up to one interval late). ``start_s``,
    ``first_completion_s``, ``end_s``, ``samples_per_s``.
    """
    lg = _dict(report.get("loadgen"))
    mode = str(report.get("mode") or lg.get("mode") or "")
    scenario = str(lg.get("scenario") or report.get("scenario") or "").lower()
    rate = as_number(lg.get("samples_per_s"))
    first, last = as_number(lg.get("min_latency_ns")), as_number(lg.get("max_latency_ns"))
    if mode != "performance" or scenario != "offline" or not completed[-1]:
        return None
    if not rate or first is None or not last:
        return None
    end = t[completed.index(completed[-1])]
    start = end - last / 1e9
    if start < -0.01:  # LoadGen issues after the harness's 0 s: this timeline is not of that run
        return None
    start = max(start, 0.0)  # (timeline times are rounded to the ms)
    return {"start_s": start, "first_completion_s": start + first / 1e9, "end_s": end,
            "samples_per_s": rate}


def timeline_data(report: dict) -> dict | None:
    """What completed_over_time.png shows, or None without a usable timeline.

    ``t_s``, ``completed``: the harness's samples (from 0 s, 0 samples at StartTest), time-ordered.
    ``rate_from_s``, ``rate_to_s``, ``rate``: samples/s in each interval between samples, up to the
    last completion (``interval_rates``). ``loadgen_span``: Offline performance runs, LoadGen's
    timed span (``loadgen_offline_span``), else None. ``min_duration_s`` (LoadGen's, when logged),
    ``target_qps`` and ``target_label`` (Server: LoadGen's target QPS; Offline: the expected QPS);
    neither for accuracy runs.
    """
    raw = _dict(_dict(report.get("harness")).get("timeline"))
    ts, ns = raw.get("t_s"), raw.get("completed")
    if not isinstance(ts, list) or not isinstance(ns, list):
        return None
    pairs = sorted((t, n) for t, n in ((as_number(t), as_number(n)) for t, n in zip(ts, ns))
                   if t is not None and n is not None and t >= 0)
    if not pairs:
        return None
    if pairs[0][0] > 0:
        pairs.insert(0, (0.0, 0.0))  # StartTest: nothing completed yet
    t = [p[0] for p in pairs]
    completed = [p[1] for p in pairs]
    # Up to the last completion: after it nothing completes (LoadGen writes its logs), and joining that
    # wait to the last interval would read as a slowdown at the end.
    last = completed.index(completed[-1]) if completed[-1] else len(t) - 1
    rates = interval_rates(t[:last + 1], completed[:last + 1])
    lg = _dict(report.get("loadgen"))
    eff = _dict(lg.get("effective_settings"))
    mode = str(report.get("mode") or lg.get("mode") or "")
    scenario = str(lg.get("scenario") or report.get("scenario") or "").lower()
    # Accuracy mode runs every sample once: no min duration, no rate to meet.
    min_ms = as_number(eff.get("min_duration_ms")) if mode != "accuracy" else None
    target = as_number(lg.get("target_qps") if scenario == "server" else eff.get("target_qps"))
    target = target if mode != "accuracy" else None
    server_perf = scenario == "server" and mode == "performance"
    # Server: LoadGen generates its whole query schedule before the first query (seconds, on a CPU):
    # up to the last sample before the first completion, nothing can have completed.
    lead_in = next((t[k - 1] for k in range(1, len(t)) if completed[k] > 0), None) if server_perf else None
    return {
        "t_s": t, "completed": completed,
        "rate_from_s": [r[0] for r in rates], "rate_to_s": [r[1] for r in rates],
        "rate": [r[2] for r in rates],
        "loadgen_span": loadgen_offline_span(report, t, completed),
        "lead_in_s": lead_in or None,
        "result_qps": as_number(lg.get("completed_samples_per_s")) if server_perf else None,
        "min_duration_s": min_ms / 1e3 if min_ms else None,
        "target_qps": target if target else None,
        "target_label": ("LoadGen's target QPS" if scenario == "server"
                         else "expected QPS (offline.target_qps)"),
        "mode": mode,
        "title": run_title(report),
    }


# -- drawing ----------------------------------------------------------------------------------------


def load_matplotlib():
    """(Figure, FigureCanvasAgg), or None with a note (once) when matplotlib is not installed."""
    global _noted_missing
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        if not _noted_missing:
            print("trtfuse: pictures (PNG) skipped: matplotlib is not installed; "
                  "pip install matplotlib", file=sys.stderr)
            _noted_missing = True
        return None
    return Figure, FigureCanvasAgg


def new_figure(mpl, width: float, height: float, nrows: int = 1, ncols: int = 1,
                margins: dict | None = None, **kw):
    """A figure on the Agg canvas (a PNG file, never a window) and its axes. Fixed margins: the
    constrained layout engine would cost about half the drawing time."""
    Figure, FigureCanvasAgg = mpl
    fig = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    fig.subplots_adjust(**(margins or {}))
    return fig, list(fig.subplots(nrows, ncols, squeeze=False, **kw).flat)


def _fmt_ms(ms: float) -> str:
    return f"{ms:,.3g} ms" if ms < 100 else f"{ms:,.0f} ms"


def _axes_fraction(value: float, lo: float, hi: float, log: bool) -> float:
    if log:
        value, lo, hi = math.log10(value), math.log10(lo), math.log10(hi)
    return 0.5 if hi <= lo else (value - lo) / (hi - lo)


def _draw_cdf_panel(ax, data: dict, tail: bool) -> None:
    points = [p for p in data["points"] if not tail or p[2] >= 0.9]
    xs = [p[1] for p in points]
    bound = data["bound_ms"]
    lo, hi = min(xs + ([bound] if bound else [])), max(xs + ([bound] if bound else []))
    log = lo > 0 and hi / lo > 10
    if log:
        ax.set_xscale("log")
    y_lo, y_hi = (0.885, 1.012) if tail else (-0.02, 1.06)
    ax.set_ylim(y_lo, y_hi)
    ax.plot(xs, [p[2] for p in points], "-", color="tab:blue", lw=1.6, marker="o", ms=4, zorder=3,
            label="LoadGen's logged percentiles")
    # Labels beside their points; points too close to tell apart share one ("p99.9 / max").
    shown = [p for p in points if p[0] != "p99" and p[0] != "min" and (tail or p[0] in ("p50", "max"))]
    groups: list[list] = []
    for label, x, y in shown:
        where = (_axes_fraction(x, lo, hi, log), (y - y_lo) / (y_hi - y_lo))
        near = groups and abs(where[0] - groups[-1][2][0]) < 0.06 and abs(where[1] - groups[-1][2][1]) < 0.05
        if near:
            groups[-1][0] += f" / {label}"
        else:
            groups.append([label, (x, y), where])
    for text, xy, where in groups:
        left = where[0] > 0.15  # near the left edge: right of the point, off the tick labels
        ax.annotate(text, xy, textcoords="offset points", xytext=(-6 if left else 6, 3),
                    ha="right" if left else "left", fontsize=8, color="tab:blue")
    p99 = data["p99_ms"]
    if p99 is not None:
        ax.plot([p99], [0.99], "o", color="tab:red", ms=8, zorder=4, label=f"p99 {_fmt_ms(p99)}")
        right = _axes_fraction(p99, lo, hi, log) > 0.7
        ax.annotate(f"p99 {_fmt_ms(p99)}", (p99, 0.99), textcoords="offset points",
                    xytext=(-10 if right else 10, -13), ha="right" if right else "left",
                    fontsize=9, color="tab:red", fontweight="bold")
    if data["mean_ms"] is not None and not tail:
        ax.axvline(data["mean_ms"], color="0.5", ls=":", lw=1, label=f"mean {_fmt_ms(data['mean_ms'])}")
    if bound is not None:
        ax.axvline(bound, color="tab:orange", ls="--", lw=1.8,
                   label=f"latency bound {_fmt_ms(bound)} (for p99)")
    ax.set_title("tail: 90 % to 100 % of the samples" if tail else "all samples", fontsize=10)
    ax.set_xlabel("latency (ms)" + (", log scale" if log else ""))
    ax.grid(True, which="both", alpha=0.3)


def draw_latency_cdf(mpl, data: dict, path: Path) -> Path:
    fig, (full, tail) = new_figure(mpl, 11, 4.8, ncols=2, margins=dict(
        left=0.07, right=0.98, bottom=0.11, top=0.83, wspace=0.18))
    _draw_cdf_panel(full, data, tail=False)
    _draw_cdf_panel(tail, data, tail=True)
    full.set_ylabel("fraction of samples at or below")
    full.legend(loc="lower right", fontsize=8)
    fig.suptitle(f"Latency CDF: {data['title']}\nthrough LoadGen's logged percentiles "
                 "(min, p50, p90, p95, p97, p99, p99.9, max), not every sample", fontsize=11)
    fig.savefig(path, dpi=DPI)
    return path


def draw_completed_over_time(mpl, data: dict, path: Path) -> Path:
    fig, (top, bottom) = new_figure(mpl, 9, 6.2, nrows=2, sharex=True, height_ratios=[3, 2],
                                     margins=dict(left=0.115, right=0.97, bottom=0.09, top=0.93,
                                                  hspace=0.08))
    top.plot(data["t_s"], data["completed"], "-", color="tab:blue", lw=1.8, marker=".", ms=4)
    top.set_ylabel("samples completed")
    from matplotlib.ticker import MaxNLocator

    top.yaxis.set_major_locator(MaxNLocator(integer=True))  # counts: 20 samples tick 0, 5, 10, not 2.5
    top.yaxis.set_major_formatter(thousands_formatter())
    if data["rate"]:
        # Steps: each value is the rate over its own interval; a line between them would draw a ramp.
        bottom.stairs(data["rate"], data["rate_from_s"] + data["rate_to_s"][-1:], baseline=None,
                      color="tab:green", lw=1.8,
                      label="rate in each interval between timeline samples")
    span = data.get("loadgen_span")
    if span:
        # What LoadGen's samples/s divides by: the wait for its first completion counts in full.
        timed_s = span["end_s"] - span["start_s"]
        first_ms = (span["first_completion_s"] - span["start_s"]) * 1e3
        labels = {"span": f"LoadGen's timed span, {timed_s:.2f} s: its issue to the last completion",
                  "first": f"first completion, {first_ms:,.0f} ms after its issue"}
        for ax in (top, bottom):
            ax.axvspan(span["start_s"], span["end_s"], color="0.85", alpha=0.5, lw=0, zorder=0,
                       label=labels["span"] if ax is top else None)
            ax.axvline(span["first_completion_s"], color="tab:red", ls=":", lw=1.4,
                       label=labels["first"] if ax is top else None)
        bottom.axhline(span["samples_per_s"], color="tab:red", ls="--", lw=1.2,
                       label=f"LoadGen's result {span['samples_per_s']:,.0f}/s = all samples / timed span")
    if data.get("lead_in_s"):
        for ax in (top, bottom):
            ax.axvspan(0, data["lead_in_s"], color="0.85", alpha=0.5, lw=0, zorder=0,
                       label=f"before LoadGen's first query ({data['lead_in_s']:.1f} s: it generates its "
                             "schedule)" if ax is top else None)
    if data.get("result_qps"):
        bottom.axhline(data["result_qps"], color="tab:red", ls="--", lw=1.2,
                       label=f"LoadGen's result {data['result_qps']:,.1f} completed samples/s")
    if data["target_qps"]:
        bottom.axhline(data["target_qps"], color="tab:purple", ls=":", lw=1.2,
                       label=f"{data['target_label']} {data['target_qps']:,.0f}/s")
    bottom.set_ylabel("samples/s")
    bottom.yaxis.set_major_formatter(thousands_formatter())
    lines = [data["target_qps"] or 0.0, span["samples_per_s"] if span else 0.0, data.get("result_qps") or 0.0]
    bottom.set_ylim(0, max(data["rate"] + lines + [1.0]) * 1.18)
    bottom.set_xlabel("seconds since StartTest (harness timeline, sampled every 0.5 s)")
    if data["min_duration_s"]:
        # LoadGen counts its min duration from its issue: where the timed span is known, from there.
        at = data["min_duration_s"] + (span["start_s"] if span else 0.0)
        label = f"LoadGen's min duration {data['min_duration_s']:g} s"
        label += " after its issue" if span else ""
        for ax in (top, bottom):
            ax.axvline(at, color="tab:orange", ls="--", lw=1.4, label=label if ax is top else None)
    if top.get_legend_handles_labels()[0]:
        top.legend(loc="lower right", fontsize=8)
    if bottom.get_legend_handles_labels()[0]:
        bottom.legend(loc="lower right", fontsize=8)
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
    top.set_xlim(left=0)
    fig.suptitle(f"Completed samples over time: {data['title']}", fontsize=11)
    fig.savefig(path, dpi=DPI)
    return path


def thousands_formatter():
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda x, _pos: f"{x:,.0f}" if float(x).is_integer() or abs(x) >= 100 else f"{x:,.2g}")


def write_run_plots(run_dir, report: dict | None = None) -> list[Path]:
    """Write the run's pictures into ``run_dir``; return their paths (none without matplotlib).

    ``report``: the run's report (default: ``run_dir/report.json``). Never fails a run for a picture:
    one that cannot be drawn is named on stderr and left out.
    """
    run_dir = Path(run_dir)
    if report is None:
        report = read_report(run_dir)
    mpl = load_matplotlib()
    if mpl is None:
        return []
    jobs = [(LATENCY_CDF, latency_cdf_data, draw_latency_cdf),
            (COMPLETED_OVER_TIME, timeline_data, draw_completed_over_time)]
    written = []
    for name, data_of, draw in jobs:
        data = data_of(report)
        if data is None:
            continue
        try:
            written.append(draw(mpl, data, run_dir / name))
        except Exception as e:  # noqa: BLE001 - a picture must not fail a finished run
            print(f"trtfuse: could not draw {name}: {e!r}", file=sys.stderr)
    return written
