"""`trtfuse report RUN [RUN ...]`: runs side by side.

A table with one column per run folder (model, backend, plugins, scenario/mode, batch, throughput and
which metric it is, the Server's scheduled QPS, p50/p90/p99 latency, VALID/INVALID, top-1), written
also as OUT/NAME.json, and one chart OUT/NAME.png: throughput per run as bars, p99 latency as markers
on a second axis. Runs of different scenarios may stand side by side: Offline's metric is samples/s,
the Server's completed samples/s (MLPerf's), and the table says which each column shows.
"""

from __future__ import annotations

import argparse
import json
import re
import textwrap
from pathlib import Path

from trtfuse.config import plugin_mode
from trtfuse.errors import UserError
from trtfuse.plots import as_number, load_matplotlib, new_figure, thousands_formatter
from trtfuse.report import read_report

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


def _plugin_mode(value) -> str:
    """A report's tensorrt.plugins as off/tails/all (older reports say true/false); an unknown value as given."""
    try:
        return plugin_mode(value)
    except UserError:
        return str(value)


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "report", help="runs side by side: a table, NAME.json and a chart NAME.png",
        description="Put `trtfuse run` folders side by side: a table (one column per run: model, "
                    "backend, plugins, scenario/mode, batch, samples/s or completed samples/s, "
                    "p50/p90/p99 latency, VALID/INVALID, top-1), the same rows in OUT/NAME.json and a "
                    "chart in OUT/NAME.png (throughput bars, p99 latency markers).")
    p.add_argument("runs", nargs="*", metavar="RUN", help="run folders (each holds report.json)")
    p.add_argument("--out", metavar="DIR",
                   help="where NAME.json and NAME.png go (default: the first run's parent folder)")
    p.add_argument("--name", default="comparison", help="the files' name (default comparison)")
    return p


# -- one run ----------------------------------------------------------------------------------------


def load_run(path) -> tuple[Path, dict]:
    """(run folder, report) for a run folder (or its report.json), with UserErrors that say what to give."""
    path = Path(path).expanduser()
    if path.is_file() and path.name == "report.json":
        path = path.parent
    if not path.exists():
        raise UserError(f"{path} does not exist", "give run folders written by `trtfuse run`")
    if not path.is_dir():
        raise UserError(f"{path} is not a folder",
                        "give run folders written by `trtfuse run` (they hold report.json)")
    if not (path / "report.json").is_file():
        hint = (" (a compliance test's folder: give its run folders instead)"
                if (path / "compliance.json").is_file() else "")
        raise UserError(f"{path} has no report.json{hint}",
                        "give run folders written by `trtfuse run` (they hold report.json)")
    report = read_report(path)
    if not isinstance(report.get("loadgen"), dict) and "model" not in report:
        raise UserError(f"{path / 'report.json'} is not a trtfuse run report (no loadgen results, "
                        "no model)", "give run folders written by `trtfuse run`")
    return path, report


def _ms(ns) -> float | None:
    x = as_number(ns)
    return None if x is None else x / 1e6


def summarize(report: dict, label: str, path: Path) -> dict:
    """The numbers of one run the comparison shows (None where the run has none)."""
    lg = report.get("loadgen") if isinstance(report.get("loadgen"), dict) else {}
    scenario = str(lg.get("scenario") or report.get("scenario") or "").lower()
    mode = str(report.get("mode") or lg.get("mode") or "")
    performance = mode == "performance"
    plugins = ((report.get("settings") or {}).get("tensorrt") or {}).get("plugins")
    latency = lg.get("latency_ns") if isinstance(lg.get("latency_ns"), dict) else {}
    server = performance and scenario == "server"
    if scenario == "server":
        metric, throughput = "completed samples/s", as_number(lg.get("completed_samples_per_s"))
    elif scenario in ("singlestream", "multistream"):  # one query at a time: samples/s follows the latency
        metric = "samples/s"
        qps, per_query = as_number(lg.get("queries_per_s")), as_number(lg.get("samples_per_query"))
        throughput = qps * per_query if qps is not None and per_query is not None else None
    else:
        metric, throughput = "samples/s", as_number(lg.get("samples_per_s"))
    accuracy = report.get("accuracy") if isinstance(report.get("accuracy"), dict) else {}
    return {
        "label": label,
        "run_dir": str(path),
        "model": report.get("model"),
        "random_weights": bool(report.get("random_weights")),
        "backend": report.get("backend"),
        "plugins": None if plugins is None else _plugin_mode(plugins),
        "scenario": scenario or None,
        "mode": mode or None,
        "batch_size": report.get("batch_size"),
        "dataset": _dataset(report),
        "metric": metric if performance else None,
        "throughput": throughput if performance else None,
        "scheduled_qps": as_number(lg.get("scheduled_qps")) if server else None,
        "target_qps": as_number(lg.get("target_qps")) if server else None,
        "p50_ms": _ms(latency.get("50.00")) if performance else None,
        "p90_ms": _ms(latency.get("90.00")) if performance else None,
        "p99_ms": _ms(latency.get("99.00")) if performance else None,
        "latency_bound_ms": _ms(lg.get("target_latency_ns")) if server else None,
        "valid": bool(lg.get("valid")) if performance and "valid" in lg else None,
        "invalid_reasons": (list(lg.get("invalid_reasons") or [])
                            if performance and not lg.get("valid") else []),
        "top1": as_number(accuracy.get("top1")),
        "top5": as_number(accuracy.get("top5")),
    }


def _dataset(report: dict) -> str | None:
    """Where a run's images came from and how many: "demo (20 images)"."""
    source, size = report.get("dataset"), report.get("dataset_size")
    if source is None and size is None:
        return None
    name = Path(str(source)).name or str(source) if source is not None else "?"
    return f"{name} ({size} images)" if size is not None else name


def labels_for(paths: list[Path]) -> list[str]:
    """Each run's folder name; parent/name where two names are the same, then a number if still."""
    names = [p.name or str(p) for p in paths]
    if len(set(names)) < len(names):
        names = [f"{p.parent.name}/{p.name}" if names.count(p.name) > 1 else p.name for p in paths]
    seen: dict[str, int] = {}
    out = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n} ({seen[n]})")
    return out


# -- the table --------------------------------------------------------------------------------------


def _num(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _lat(x: float | None) -> str:
    return "-" if x is None else f"{x:,.3f}" if x < 10 else f"{x:,.2f}" if x < 1000 else f"{x:,.0f}"


def table_rows(runs: list[dict]) -> list[tuple[str, list[str]]]:
    """(row name, one value per run): what the table prints and NAME.json keeps."""
    def row(name, fn):
        return (name, [fn(r) for r in runs])

    rows = [
        row("model", lambda r: str(r["model"] or "-") + (" (random weights)" if r["random_weights"] else "")),
        row("backend", lambda r: str(r["backend"] or "-")),
        row("plugins", lambda r: "-" if r["plugins"] is None else r["plugins"]),
        row("scenario / mode", lambda r: f"{r['scenario'] or '-'} / {r['mode'] or '-'}"),
        row("batch size", lambda r: "-" if r["batch_size"] is None else str(r["batch_size"])),
        row("dataset", lambda r: r.get("dataset") or "-"),
        row("throughput", lambda r: _num(r["throughput"])),
        row("  metric", lambda r: r["metric"] or "- (accuracy run)"),
    ]
    if any(r["scenario"] == "server" and r["mode"] == "performance" for r in runs):
        rows.append(row("  scheduled QPS", lambda r: _num(r["scheduled_qps"])))
        rows.append(row("latency bound ms", lambda r: _lat(r["latency_bound_ms"])))
    rows += [
        row("latency p50 ms", lambda r: _lat(r["p50_ms"])),
        row("latency p90 ms", lambda r: _lat(r["p90_ms"])),
        row("latency p99 ms", lambda r: _lat(r["p99_ms"])),
        row("result", lambda r: "-" if r["valid"] is None else "VALID" if r["valid"] else "INVALID"),
    ]
    if any(r["top1"] is not None for r in runs):
        rows.append(row("top-1", lambda r: "-" if r["top1"] is None else f"{r['top1'] * 100:.2f} %"))
        rows.append(row("top-5", lambda r: "-" if r["top5"] is None else f"{r['top5'] * 100:.2f} %"))
    return rows


def format_table(runs: list[dict]) -> str:
    rows = [("run", [r["label"] for r in runs]), *table_rows(runs)]
    name_w = max(len(name) for name, _ in rows)
    widths = [max(len(values[i]) for _, values in rows) for i in range(len(runs))]
    lines = []
    for k, (name, values) in enumerate(rows):
        cells = "  ".join(f"{v:<{w}}" for v, w in zip(values, widths))
        lines.append(f"  {name:<{name_w}}  {cells}".rstrip())
        if k == 0:
            lines.append(f"  {'-' * name_w}  " + "  ".join("-" * w for w in widths))
    for r in runs:
        if r["valid"] is False:
            why = "; ".join(r["invalid_reasons"] or ["see its mlperf_log_summary.txt"])
            lines.append(f"  INVALID {r['label']}: {why}")
    return "\n".join(lines)


# -- the chart --------------------------------------------------------------------------------------

SCENARIO_COLORS = {"offline": "tab:blue", "server": "tab:green"}


def _ms_text(v: float) -> str:
    """Milliseconds as people write them: 14,200 and 1.42, never 1.42e+04."""
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}" if abs(v) >= 0.001 else f"{v:.1e}"


def draw_chart(mpl, runs: list[dict], path: Path) -> Path:
    """Throughput bars per run (colour: scenario; hatched: INVALID), p99 latency markers (right axis)."""
    n = len(runs)
    fig, (ax,) = new_figure(mpl, max(6.0, 1.7 * n + 2.5), 5.4,
                             margins=dict(left=0.12, right=0.87, bottom=0.24, top=0.9))
    xs = list(range(n))
    heights = [r["throughput"] or 0.0 for r in runs]
    for x, r, h in zip(xs, runs, heights):
        if r["throughput"] is None:
            what = "accuracy run" if r["mode"] == "accuracy" else "no throughput"
            if r["top1"] is not None:
                what += f"\ntop-1 {r['top1'] * 100:.2f} %"
            ax.text(x, 0, what, ha="center", va="bottom", fontsize=8, color="0.35")
            continue
        invalid = r["valid"] is False
        ax.bar(x, h, width=0.6, color=SCENARIO_COLORS.get(r["scenario"], "tab:gray"),
               hatch="//" if invalid else None, edgecolor="0.2" if invalid else "white")
        ax.annotate(f"{h:,.0f}" + ("\nINVALID" if invalid else ""), (x, h), textcoords="offset points",
                    xytext=(0, 3), ha="center", va="bottom", fontsize=8)
        if r["scheduled_qps"] is not None:
            ax.plot([x - 0.3, x + 0.3], [r["scheduled_qps"]] * 2, color="k", ls=":", lw=1.2)
    ax.set_ylabel("throughput (samples/s; Server: completed)")
    ax.set_ylim(0, max(heights + [r["scheduled_qps"] or 0 for r in runs] + [1.0]) * 1.2)
    ax.yaxis.set_major_formatter(thousands_formatter())
    ax.set_xticks(xs, [_wrap(r["label"]) for r in runs], fontsize=8)
    ax.set_xlim(-0.6, n - 0.4)
    ax.grid(True, axis="y", alpha=0.3)

    lat = ax.twinx()
    p99 = [(x, r["p99_ms"]) for x, r in zip(xs, runs) if r["p99_ms"] is not None]
    if p99:
        # Right of the bar's middle, clear of its throughput label.
        lat.plot([x + 0.2 for x, _ in p99], [v for _, v in p99], "D", color="tab:red", ms=8, ls="none",
                 zorder=5)
        for x, v in p99:
            lat.annotate(f"{_ms_text(v)} ms", (x + 0.2, v), textcoords="offset points", xytext=(8, -4),
                         fontsize=8, color="tab:red",
                         bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.85))
        for x, r in zip(xs, runs):
            if r["latency_bound_ms"] is not None:
                lat.plot([x - 0.3, x + 0.3], [r["latency_bound_ms"]] * 2, color="tab:orange", ls="--",
                         lw=1.5)
        values = [v for _, v in p99] + [r["latency_bound_ms"] for r in runs if r["latency_bound_ms"]]
        if min(values) > 0 and max(values) / min(values) > 20:
            lat.set_yscale("log")  # a 1 s bound beside 3 ms p99s: both readable
            lat.set_ylim(min(values) / 2, max(values) * 3)
            from matplotlib.ticker import FuncFormatter

            lat.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: _ms_text(v)))
        else:
            lat.set_ylim(0, max(values) * 1.25)
    lat.set_ylabel("p99 latency (ms)" + (", log scale" if lat.get_yscale() == "log" else ""), color="tab:red")
    lat.tick_params(axis="y", which="both", colors="tab:red")

    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [Patch(color=c, label=f"{s.capitalize()}") for s, c in SCENARIO_COLORS.items()
               if any(r["scenario"] == s and r["throughput"] is not None for r in runs)]
    if any(r["valid"] is False for r in runs):
        handles.append(Patch(facecolor="white", edgecolor="0.2", hatch="//", label="INVALID"))
    if any(r["scheduled_qps"] is not None for r in runs):
        handles.append(Line2D([], [], color="k", ls=":", label="scheduled QPS (Server)"))
    if p99:
        handles.append(Line2D([], [], color="tab:red", marker="D", ls="none", label="p99 latency"))
    if any(r["latency_bound_ms"] is not None for r in runs):
        handles.append(Line2D([], [], color="tab:orange", ls="--", label="latency bound (Server)"))
    if handles:
        ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.17),
                  ncol=min(len(handles), 4), fontsize=8, frameon=False)
    models = sorted({str(r["model"]) for r in runs if r["model"]})
    fig.suptitle(f"{n} run{'s' if n > 1 else ''} side by side" + (f": {', '.join(models)}" if models else ""),
                 fontsize=11)
    fig.savefig(path)
    return path


def _wrap(label: str, width: int = 18) -> str:
    # Folder names break best at their dashes: "20261123-235359-tiny-offline-performance".
    lines = textwrap.wrap(label.replace("-", "- "), width=width, break_long_words=True)
    return "\n".join(line.replace("- ", "-") for line in lines)


# -- the command ------------------------------------------------------------------------------------


def compare(run_dirs: list, out: Path | None = None, name: str = "comparison") -> dict:
    """Read the runs, write OUT/NAME.json (and OUT/NAME.png with matplotlib); return what was written:
    ``runs`` (summaries), ``rows``, ``table`` (text), ``json`` and ``png`` (paths; png None without
    matplotlib)."""
    if not run_dirs:
        raise UserError("no run folders given", "name one or more: trtfuse report runs/RUN_A runs/RUN_B")
    if not NAME_RE.fullmatch(str(name)):
        raise UserError(f"--name {name!r} is not a usable file name",
                        "use letters, digits and . _ + - (e.g. offline-vs-server)")
    loaded = [load_run(p) for p in run_dirs]
    labels = labels_for([p for p, _ in loaded])
    runs = [summarize(report, label, path) for (path, report), label in zip(loaded, labels)]
    out = Path(out).expanduser() if out else loaded[0][0].resolve().parent
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is not a folder", "give a folder for NAME.json and NAME.png")
    out.mkdir(parents=True, exist_ok=True)
    rows = table_rows(runs)
    table = format_table(runs)
    json_path = out / f"{name}.json"
    json_path.write_text(json.dumps({
        "columns": labels,
        "rows": [{"name": row_name.strip(), "values": values} for row_name, values in rows],
        "runs": runs,
    }, indent=2) + "\n")
    png_path = None
    mpl = load_matplotlib()
    if mpl is not None:
        png_path = draw_chart(mpl, runs, out / f"{name}.png")
    return {"runs": runs, "rows": rows, "table": table, "json": json_path, "png": png_path}


def main(args: argparse.Namespace) -> int:
    result = compare(list(args.runs or []), getattr(args, "out", None),
                     getattr(args, "name", None) or "comparison")
    print(result["table"])
    print()
    print(f"wrote {result['json']}" + (f" and {result['png']}" if result["png"] else ""))
    return 0

