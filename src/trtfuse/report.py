"""What a run produced: LoadGen's logs read back, a JSON report, and a readable table."""

from __future__ import annotations

import json
import re
from pathlib import Path

from trtfuse import query_timeline
from trtfuse.errors import UserError
from trtfuse.gpu_trace import describe
from trtfuse.request_trace import describe as describe_requests

RANDOM_WEIGHTS_NOTE = "random weights: performance only"
PERCENTILES = ("50.00", "90.00", "95.00", "97.00", "99.00", "99.90")
LOADGEN_MODES = {"PerformanceOnly": "performance", "AccuracyOnly": "accuracy"}


# The rng seeds each round's mlperf.conf gives LoadGen (qsl_rng_seed), as MLCommons' submission checker
# expects them in every log of that round (its constants.py, MODEL_CONFIG[round]["seeds"]); a log with
# another round's seeds fails "qsl_rng_seed is wrong". tests/test_mlperf_rounds.py holds this table
# against the checker's.
ROUND_SEEDS = {6023615788873153749: "v5.0", 1780908523862526354: "v5.1", 2465351861681999779: "v6.0",
               2085463073848966840: "v6.1"}
# LoadGen releases that carry a later round's seeds than their major.minor says: (first version, round).
# 6.0.16 took round v6.1's seeds (and mlperf.conf) while keeping the 6.0 version number.
LOADGEN_ROUND_FROM = (((6, 0, 16), "v6.1"),)
# The metric of each scenario, as LoadGen's detail log holds it and the checker reads it: Offline and
# Server a rate; SingleStream the 90th and MultiStream the 99th percentile latency, early stopping's
# estimate of it (what the checker scores).
LATENCY_METRIC = {"singlestream": ("90", "early_stopping_latency_ss", "result_90.00_percentile_latency_ns"),
                  "multistream": ("99", "early_stopping_latency_ms", "result_99.00_percentile_latency_ns")}


def _version_tuple(loadgen_version: str) -> tuple[int, ...]:
    head = str(loadgen_version or "").split()[0] if str(loadgen_version or "").split() else ""
    return tuple(int(p) for p in re.findall(r"\d+", head)[:3])


def mlperf_round(loadgen_version: str, qsl_rng_seed: int | None = None) -> str:
    """The MLPerf Inference round whose rules and seeds a LoadGen run used: the round of the seeds it
    logged where known, else the one its version belongs to (major.minor, or later where the release
    took a later round's seeds: LoadGen 6.0.16 and later carry v6.1's)."""
    if qsl_rng_seed is not None and int(qsl_rng_seed) in ROUND_SEEDS:
        return ROUND_SEEDS[int(qsl_rng_seed)]
    version = _version_tuple(loadgen_version)
    if len(version) < 2:
        return "unknown"
    for first, round_ in LOADGEN_ROUND_FROM:
        if version[:2] == first[:2] and version >= first:
            return round_
    return f"v{version[0]}.{version[1]}"


def read_loadgen_results(run_dir: Path) -> dict:
    """The results LoadGen logged in mlperf_log_detail.txt (and percentiles from the summary)."""
    run_dir = Path(run_dir)
    logged: dict = {}
    with open(run_dir / "mlperf_log_detail.txt") as f:
        for line in f:
            if line.startswith(":::MLLOG "):
                entry = json.loads(line[len(":::MLLOG "):])
                logged[entry["key"]] = entry["value"]
    summary = (run_dir / "mlperf_log_summary.txt").read_text()
    percentiles = {p: int(ns) for p, ns in
                   re.findall(r"^(\d+\.\d+) percentile latency \(ns\)\s*:\s*(\d+)", summary, re.MULTILINE)}
    scenario = str(logged.get("effective_scenario", "")).lower()
    version = str(logged.get("loadgen_version", ""))
    valid = logged.get("result_validity") == "VALID"
    reasons = []
    checks = {"result_min_duration_met": "min duration not met",
              "result_min_queries_met": "min query count not met",
              "result_perf_constraints_met": "latency constraint not met",
              "early_stopping_met": "early stopping criterion not met"}
    for key, why in checks.items():
        if logged.get(key) is False:
            reasons.append(why)
    if logged.get("result_invalid_reason"):
        reasons.append(str(logged["result_invalid_reason"]).strip())
    results = {
        "scenario": scenario,
        # After mlperf.conf, user.conf and audit.config: an audit.config may switch the mode.
        "mode": LOADGEN_MODES.get(str(logged.get("effective_test_mode", "")),
                                  str(logged.get("effective_test_mode", ""))),
        "valid": valid,
        "invalid_reasons": [] if valid else reasons,
        "latency_ns": {p: percentiles[p] for p in PERCENTILES if p in percentiles},
        "min_latency_ns": logged.get("result_min_latency_ns"),
        "mean_latency_ns": logged.get("result_mean_latency_ns"),
        "max_latency_ns": logged.get("result_max_latency_ns"),
        "errors": logged.get("num_errors", 0),
        "loadgen_version": version,
        "mlperf_round": mlperf_round(version, logged.get("effective_qsl_rng_seed")),
        # LoadGen's own settings as it ran them, after mlperf.conf, user.conf and audit.config.
        "effective_settings": {k[len("effective_"):]: v for k, v in logged.items()
                               if k.startswith("effective_")},
        # What was asked of it (Offline turns min_query_count into one query of min_sample_count).
        "requested_settings": {k[len("requested_"):]: v for k, v in logged.items()
                               if k.startswith("requested_")},
    }
    if scenario == "server":
        results["scheduled_qps"] = logged.get("result_scheduled_samples_per_sec")
        results["completed_samples_per_s"] = logged.get("result_completed_samples_per_sec")
        results["target_qps"] = logged.get("effective_target_qps")
        results["target_latency_ns"] = logged.get("effective_target_latency_ns")
    elif scenario in LATENCY_METRIC:
        percentile, early, plain = LATENCY_METRIC[scenario]
        results["metric_percentile"] = percentile
        results["latency_metric_ns"] = logged.get(early, logged.get(plain))  # early stopping's estimate
        results["latency_percentile_ns"] = logged.get(plain)
        results["samples_per_query"] = logged.get("effective_samples_per_query")
        results["queries_per_s"] = logged.get("result_qps_with_loadgen_overhead")
        results["query_count"] = logged.get("result_query_count")
    else:
        results["samples_per_s"] = logged.get("result_samples_per_second")
    return results


def read_report(run_dir: Path) -> dict:
    """report.json of a run folder, with a UserError (problem and fix) when it is missing or broken."""
    path = Path(run_dir) / "report.json"
    if not path.is_file():
        raise UserError(f"{run_dir} has no report.json",
                        "give a run folder written by `trtfuse run` (it holds report.json)")
    try:
        report = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not JSON ({e})",
                        "run the test again, or give another run folder") from None
    if not isinstance(report, dict):
        raise UserError(f"{path} is not a trtfuse report (not a JSON object)",
                        "give a run folder written by `trtfuse run`")
    return report


def write_report(run_dir: Path, report: dict) -> Path:
    path = Path(run_dir) / "report.json"
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    return path


def _ms(ns) -> str:
    return "-" if ns is None else f"{ns / 1e6:,.2f} ms"


def format_table(report: dict) -> str:
    """The report as aligned `name  value` lines."""
    rows: list[tuple[str, str]] = [
        ("model", report["model"] + (f"  ({RANDOM_WEIGHTS_NOTE})" if report.get("random_weights") else "")),
        ("backend", report["backend"] + (f"  ({report['sut']} SUT)" if report.get("sut") == "native" else "")),
        ("scenario / mode", f"{report['scenario']} / {report['mode']}"),
        ("batch size", str(report["batch_size"])),
        ("dataset", f"{report['dataset']} ({report['dataset_size']} images)"),
    ]
    lg = report.get("loadgen")
    if lg and report["mode"] == "performance":
        if lg["scenario"] == "server":
            # MLPerf's Server metric since v5.0 is completed samples/s; the scheduled rate beside it.
            rows.append(("completed samples/s", f"{lg['completed_samples_per_s']:,.1f}  (scheduled "
                         f"{lg['scheduled_qps']:,.1f} QPS, target {lg['target_qps']:,.0f})"))
            rows.append(("latency bound", f"p99 <= {_ms(lg['target_latency_ns'])}"))
        elif lg["scenario"] in LATENCY_METRIC:
            # The metric: early stopping's estimate of the percentile (the checker's score), the
            # measured percentile beside it.
            p = lg["metric_percentile"]
            rows.append((f"p{p} latency", f"{_ms(lg['latency_metric_ns'])}  (early stopping estimate; measured "
                         f"{_ms(lg['latency_percentile_ns'])}; {lg.get('samples_per_query') or '?'} sample(s) "
                         f"per query, {lg.get('query_count') or 0:,} queries)"))
        else:
            rows.append(("samples/s", f"{lg['samples_per_s']:,.1f}"))
        for p in ("50.00", "90.00", "99.00"):
            if p in lg["latency_ns"]:
                rows.append((f"latency p{p.rstrip('0').rstrip('.')}", _ms(lg["latency_ns"][p])))
        verdict = "VALID" if lg["valid"] else "INVALID: " + "; ".join(lg["invalid_reasons"] or ["see log"])
        rows.append(("result", verdict))
        gpu = (report.get("harness") or {}).get("gpu") or {}
        for lane, trace in enumerate(gpu.get("lanes") or [gpu]):  # several GPUs or servers: a line each
            # a backend's trace: the GPU's batches (gpu_trace), or a server's requests (request_trace)
            what, line = (("requests", describe_requests(trace)) if trace and "requests" in trace
                          else ("GPU", describe(trace)))
            if line:
                rows.append((what + (f" {lane}" if "lanes" in gpu else ""), line))
        rows.extend(lane_lines(report.get("lanes") or []))
        where = query_timeline.describe((report.get("harness") or {}).get("query_timeline"))
        if where:
            rows.append(("where p99 goes", where))
        energy = (report.get("harness") or {}).get("energy")
        if energy:
            rows.append(("GPU energy", f"{energy['avg_watts']:,.0f} W average, {energy['samples_per_joule']:,.1f} "
                         "samples/J (the GPU's own counter, not MLPerf Power)"))
        eff, req = lg.get("effective_settings", {}), lg.get("requested_settings", {})
        if "min_duration_ms" in eff:
            rows.append(("LoadGen settings", f"min duration {eff['min_duration_ms'] / 1000:g} s, min query count "
                         f"{req.get('min_query_count', eff.get('min_query_count', 0)):,}"
                         + ("  (official: mlperf.conf's)" if report.get("official") else "")))
    if lg and lg.get("loadgen_version"):
        rows.append(("LoadGen", f"{lg['loadgen_version'].split()[0]} (MLPerf {lg['mlperf_round']} rules and seeds)"
                     + ("; audit.config applied" if report.get("audit_config") else "")))
    acc = report.get("accuracy")
    if acc:
        rows.append(("top-1", f"{acc['top1'] * 100:.2f} %  ({acc['n']} images)"))
        rows.append(("top-5", f"{acc['top5'] * 100:.2f} %"))
        if report.get("random_weights"):
            rows.append(("note", RANDOM_WEIGHTS_NOTE + ": accuracy is meaningless"))
    rows.append(("run folder", str(report["run_dir"])))
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"  {name:<{width}}  {value}" for name, value in rows)


def lane_lines(lanes: list[dict]) -> list[tuple[str, str]]:
    """Several lanes (GPUs): a line each (samples, share, batches, and where known the rate over LoadGen's
    span and the device's busy fraction), and the spread of samples across them."""
    if len(lanes) < 2:
        return []
    rows = []
    for i, lane in enumerate(lanes):
        parts = [f"{lane.get('samples', 0):,} samples"]
        if lane.get("share") is not None:
            parts[0] += f" ({lane['share'] * 100:.1f} %)"
        mean = lane.get("mean_batch") or (lane["samples"] / lane["batches"] if lane.get("batches") else None)
        parts.append(f"{lane.get('batches', 0):,} batches" + (f" (mean {mean:,.0f})" if mean else ""))
        if lane.get("samples_per_s") is not None:
            parts.append(f"{lane['samples_per_s']:,.0f} samples/s")
        if lane.get("busy_fraction") is not None:
            parts.append(f"device busy {lane['busy_fraction'] * 100:.1f} %")
        rows.append((f"lane {lane.get('lane', i)}", f"{lane.get('name', '')}: " + ", ".join(parts)))
    samples = [lane.get("samples", 0) for lane in lanes]
    batches = [lane.get("batches", 0) for lane in lanes]
    spread = f"{max(samples) / min(samples):.3f}" if min(samples) > 0 else "inf (a lane answered nothing)"
    rows.append(("lane spread", f"max/min samples {spread} over {len(lanes)} lanes; batches "
                 f"{min(batches):,}..{max(batches):,}"))
    return rows


def invalid_verdict(report: dict) -> str | None:
    """One line for a performance run LoadGen called INVALID: why, and what to change (None when
    VALID, or for an accuracy run, which has no verdict)."""
    lg = report.get("loadgen") or {}
    if report.get("mode") != "performance" or lg.get("valid", True):
        return None
    reasons = lg.get("invalid_reasons") or ["see mlperf_log_summary.txt"]
    line = f"LoadGen's result is INVALID ({reasons[0]})"
    harness = report.get("harness") or {}
    expected = (harness.get("effective") or {}).get("offline_expected_qps")
    rate = lg.get("samples_per_s")
    if report.get("scenario") == "offline" and "min duration not met" in reasons and rate and expected:
        given = (report.get("settings") or {}).get("offline", {}).get("target_qps")
        told = "told" if given else "sized by the warm-up's estimate to expect"
        return (f"{line}: LoadGen was {told} {expected:,.0f} samples/s, the backend ran {rate:,.0f}/s and "
                f"answered them all too soon. Run again with --target-qps {rate * 1.5:.0f}")
    if report.get("scenario") == "server" and "latency constraint not met" in reasons:
        return f"{line}. Lower --target-qps, or raise --latency-bound-ms for a quick run"
    return f"{line}. The reasons are in {report.get('run_dir', 'the run folder')}/mlperf_log_summary.txt"
