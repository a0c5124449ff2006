"""Pictures of a run (trtfuse.plots) and runs side by side (trtfuse.compare_runs), on real short
LoadGen runs (Offline, Server, accuracy) over onnxruntime and the tiny model."""

import argparse
import importlib.util
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest_harness import ScriptedBackend, SyntheticDataset, tiny_model
from trtfuse import cli, compare_runs, config, plots, session
from trtfuse.backends import create_backend
from trtfuse.errors import UserError

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
needs_matplotlib = pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib is not installed")


def _run(tmp_path, scenario="offline", mode="performance"):
    s = config.load(overrides={
        "run.output_dir": str(tmp_path / "runs"), "run.backend": "onnxruntime",
        "run.scenario": scenario, "run.mode": mode,
        "run.batch_size": 16, "run.warmup_batches": 2, "run.watchdog_s": 30.0,
        "offline.min_duration_ms": 500, "offline.min_query_count": 1, "offline.target_qps": 4000.0,
        "server.min_duration_ms": 1000, "server.min_query_count": 700, "server.target_qps": 700.0,
        "server.target_latency_ms": 1000.0,
    })
    model = tiny_model(tmp_path)
    backend = create_backend("onnxruntime")
    if scenario == "offline" and mode == "performance":
        # At most 16 samples per 5 ms (3200/s) against the 4000/s LoadGen expects: its one query of
        # 2200 samples lasts past min duration (0.5 s), so the timeline has samples in the run.
        backend = ScriptedBackend(backend, delay_s=0.005)
    backend.load(model, 16)
    return session.run(s, progress=False, model=model, dataset=SyntheticDataset(64), backend=backend)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three real runs, made once: Offline and Server performance, Offline accuracy."""
    tmp = tmp_path_factory.mktemp("plots")
    made = {"offline": _run(tmp, "offline"), "server": _run(tmp, "server"),
            "accuracy": _run(tmp, "offline", "accuracy")}
    return {k: (Path(r["run_dir"]), r) for k, r in made.items()}


def _assert_real_png(path):
    from matplotlib.image import imread

    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, path
    assert len(data) > 5000, (path, len(data))
    pixels = imread(str(path))
    assert pixels.ndim == 3 and pixels.shape[0] > 300 and pixels.shape[1] > 500
    rgba = (pixels * 255).astype(np.uint8)
    if rgba.shape[2] == 3:
        rgba = np.concatenate([rgba, np.full(rgba.shape[:2] + (1,), 255, np.uint8)], axis=2)
    colours = np.unique(np.ascontiguousarray(rgba).reshape(-1, 4).view(np.uint32))
    assert len(colours) > 20, f"{path} is (nearly) one colour"


# -- plots of one run -------------------------------------------------------------------------------


@needs_matplotlib
@pytest.mark.parametrize("kind", ["offline", "server"])
def test_performance_run_gets_a_latency_cdf_and_a_timeline_png(runs, kind):
    run_dir, report = runs[kind]
    written = plots.write_run_plots(run_dir)
    assert [p.name for p in written] == ["latency_cdf.png", "completed_over_time.png"]
    for path in written:
        assert path.parent == run_dir and path.is_file()
        _assert_real_png(path)
    # The report session.run returns (which write_run_plots may be given) draws what its report.json does.
    saved = json.loads((run_dir / "report.json").read_text())
    assert plots.latency_cdf_data(report) == plots.latency_cdf_data(saved)
    assert plots.timeline_data(report) == plots.timeline_data(saved)


@needs_matplotlib
def test_accuracy_run_gets_only_the_timeline_png(runs):
    run_dir, report = runs["accuracy"]
    assert report["mode"] == "accuracy"
    assert plots.latency_cdf_data(report) is None
    timeline = plots.timeline_data(report)
    assert timeline["completed"][-1] == 64  # every sample once
    assert timeline["min_duration_s"] is None and timeline["target_qps"] is None  # not for accuracy
    written = plots.write_run_plots(run_dir)
    assert [p.name for p in written] == ["completed_over_time.png"]
    assert not (run_dir / "latency_cdf.png").exists()
    _assert_real_png(written[0])


def test_server_cdf_goes_through_loadgens_percentiles_and_marks_the_bound(runs):
    _, report = runs["server"]
    lg = report["loadgen"]
    data = plots.latency_cdf_data(report)
    labels = [label for label, _, _ in data["points"]]
    assert labels == ["min", "p50", "p90", "p95", "p97", "p99", "p99.9", "max"]
    xs = [x for _, x, _ in data["points"]]
    ys = [y for _, _, y in data["points"]]
    assert xs == sorted(xs) and ys == sorted(ys)  # a CDF: monotone in latency and in fraction
    assert data["points"][0] == ("min", lg["min_latency_ns"] / 1e6, 0.0)
    assert data["points"][-1] == ("max", lg["max_latency_ns"] / 1e6, 1.0)
    assert data["p99_ms"] == lg["latency_ns"]["99.00"] / 1e6 == xs[labels.index("p99")]
    assert data["bound_ms"] == pytest.approx(1000.0)  # server.target_latency_ms, as LoadGen ran it
    assert data["mean_ms"] == pytest.approx(lg["mean_latency_ns"] / 1e6)
    assert data["title"].split(", ")[1:3] == ["Server performance", "VALID" if lg["valid"] else "INVALID"]


def test_offline_cdf_has_no_latency_bound(runs):
    data = plots.latency_cdf_data(runs["offline"][1])
    assert data["bound_ms"] is None
    assert data["points"][-1][0] == "max" and data["points"][-1][2] == 1.0


def test_timeline_of_a_run_starts_at_zero_and_ends_at_every_sample(runs):
    for kind, min_duration_s in (("offline", 0.5), ("server", 1.0)):
        _, report = runs[kind]
        data = plots.timeline_data(report)
        assert data["t_s"][0] == 0 and data["completed"][0] == 0
        assert data["t_s"] == sorted(data["t_s"]) and data["completed"] == sorted(data["completed"])
        assert len(data["t_s"]) >= 3  # StartTest, at least one 0.5 s sample, the end
        assert data["completed"][-1] == report["harness"]["completed"]
        # The rate's intervals follow each other from StartTest to the last completion, no gaps.
        last_completion = data["t_s"][data["completed"].index(data["completed"][-1])]
        assert data["rate_from_s"][0] == 0 and data["rate_to_s"][-1] == last_completion
        assert data["rate_from_s"][1:] == data["rate_to_s"][:-1]
        assert all(r >= 0 for r in data["rate"])
        assert data["min_duration_s"] == pytest.approx(min_duration_s)
    server = plots.timeline_data(runs["server"][1])
    assert server["target_qps"] == pytest.approx(700.0)
    # Marked: LoadGen's result, and the lead-in before its first query (no completion in it).
    assert server["result_qps"] == runs["server"][1]["loadgen"]["completed_samples_per_s"]
    lead_in = server["lead_in_s"] or 0.0
    assert not any(n for t, n in zip(server["t_s"], server["completed"]) if t <= lead_in)
    assert plots.timeline_data(runs["offline"][1])["result_qps"] is None
    assert server["loadgen_span"] is None  # Server: LoadGen's latencies are per query, not from one issue
    # The per-interval rates add up to every sample the run completed (how fast they came is the
    # machine's: not checked here).
    widths = [b - a for a, b in zip(server["rate_from_s"], server["rate_to_s"])]
    assert sum(r * w for r, w in zip(server["rate"], widths)) == pytest.approx(server["completed"][-1])


def test_offline_timeline_places_loadgens_timed_span(runs):
    # LoadGen's Offline samples/s is all samples over its issue-to-last-completion span (its max
    # latency); the harness records the last completion, so the span lands on the timeline.
    _, report = runs["offline"]
    lg = report["loadgen"]
    data = plots.timeline_data(report)
    span = data["loadgen_span"]
    assert span["samples_per_s"] == lg["samples_per_s"]
    assert span["end_s"] - span["start_s"] == pytest.approx(lg["max_latency_ns"] / 1e9)
    assert span["first_completion_s"] - span["start_s"] == pytest.approx(lg["min_latency_ns"] / 1e9)
    assert report["harness"]["completed"] / (span["end_s"] - span["start_s"]) == pytest.approx(
        lg["samples_per_s"], rel=1e-3)
    assert 0 <= span["start_s"] < span["first_completion_s"] < span["end_s"] < data["t_s"][-1]
    # Consistent with the harness's own samples: nothing had completed before LoadGen's first completion.
    first = span["first_completion_s"]
    assert not any(n for t, n in zip(data["t_s"], data["completed"]) if t < first - 0.002)


def test_rate_is_per_interval_so_a_start_is_a_step_not_a_ramp():
    # Nothing completes until 0.75 s, then 1000 samples/s until the last completion at 3.01 s; StartTest
    # returns at 3.3 s. An average over 2 s drew this as a ramp to 3 s: per interval it is one step.
    t = [0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.01, 3.3]
    done = [0, 250, 750, 1250, 1750, 2250, 2260, 2260]
    data = plots.timeline_data({"harness": {"timeline": {"t_s": t, "completed": done}}})
    assert data["t_s"][0] == 0.0 and data["completed"][0] == 0  # StartTest added
    # The last 10 ms (a short interval) joins the one before; the wait after the last completion has none.
    assert data["rate_from_s"] == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]
    assert data["rate_to_s"] == [0.5, 1.0, 1.5, 2.0, 2.5, 3.01]
    assert data["rate"][:5] == pytest.approx([0, 500, 1000, 1000, 1000])
    assert data["rate"][5] == pytest.approx(510 / 0.51)
    assert data["loadgen_span"] is None  # no LoadGen results in this report


def test_interval_rates_join_short_intervals():
    assert plots.interval_rates([0, 0.1, 0.5], [0, 10, 50]) == [(0, 0.5, 100)]  # short first: the next
    assert plots.interval_rates([0, 0.5, 0.6], [0, 50, 70]) == [(0, 0.6, pytest.approx(70 / 0.6))]
    assert plots.interval_rates([0, 0.1], [0, 10]) == [(0, 0.1, pytest.approx(100))]  # all short: one
    assert plots.interval_rates([0], [0]) == []
    steps = plots.interval_rates([0, 0.5, 1.0], [0, 0, 100], min_interval_s=0.5)
    assert steps == [(0, 0.5, 0), (0.5, 1.0, 200)]


def test_loadgen_span_only_where_loadgen_timed_one_issue():
    t, done = [0.0, 0.5, 1.0, 1.2, 1.5], [0, 100, 300, 380, 380]
    offline = {"mode": "performance", "loadgen": {"scenario": "offline", "samples_per_s": 380 / 1.0,
                                                  "min_latency_ns": 0.3e9, "max_latency_ns": 1.0e9}}
    span = plots.loadgen_offline_span(offline, t, done)
    assert span == {"start_s": pytest.approx(0.2), "first_completion_s": pytest.approx(0.5), "end_s": 1.2,
                    "samples_per_s": 380.0}
    server = json.loads(json.dumps(offline))
    server["loadgen"]["scenario"] = "server"
    accuracy = {**offline, "mode": "accuracy"}
    no_latency = json.loads(json.dumps(offline))
    no_latency["loadgen"]["max_latency_ns"] = None
    longer_than_the_timeline = json.loads(json.dumps(offline))
    longer_than_the_timeline["loadgen"]["max_latency_ns"] = 5e9
    for report in (server, accuracy, no_latency, longer_than_the_timeline):
        assert plots.loadgen_offline_span(report, t, done) is None
    assert plots.loadgen_offline_span(offline, t, [0] * 5) is None  # nothing completed


@needs_matplotlib
def test_a_report_missing_fields_gets_the_pictures_it_can(runs, tmp_path, capsys):
    _, server = runs["server"]
    no_latency = json.loads(json.dumps(server))
    no_latency["loadgen"].update(latency_ns={}, min_latency_ns=None, max_latency_ns=None)
    no_timeline = json.loads(json.dumps(server))
    del no_timeline["harness"]["timeline"]
    bare = {"model": "tiny", "mode": "performance"}
    cases = {"no_latency": (no_latency, ["completed_over_time.png"]),
             "no_timeline": (no_timeline, ["latency_cdf.png"]),
             "bare": (bare, []),
             "broken_values": ({"loadgen": {"latency_ns": {"99.00": "x"}, "max_latency_ns": None},
                                "harness": {"timeline": {"t_s": [0.5, None], "completed": "many"}}}, [])}
    for name, (report, expected) in cases.items():
        run_dir = tmp_path / name
        run_dir.mkdir()
        (run_dir / "report.json").write_text(json.dumps(report))
        assert [p.name for p in plots.write_run_plots(run_dir)] == expected, name
    assert "could not draw" not in capsys.readouterr().err


def test_without_matplotlib_there_are_no_pictures_and_one_note(runs, tmp_path, monkeypatch, capsys):
    for module in [m for m in list(sys.modules) if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, module)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib...` raises ImportError
    monkeypatch.setattr(plots, "_noted_missing", False)
    run_dir, _ = runs["server"]
    assert plots.write_run_plots(run_dir) == []
    assert plots.write_run_plots(run_dir) == []
    err = capsys.readouterr().err
    assert err.count("pip install matplotlib") == 1, err
    # `trtfuse report` still prints its table and writes the JSON, without the chart.
    result = compare_runs.compare([run_dir], out=tmp_path, name="nompl")
    assert result["png"] is None and (tmp_path / "nompl.json").is_file()
    assert not (tmp_path / "nompl.png").exists()


# -- runs side by side ------------------------------------------------------------------------------


def _report_args(*argv):
    parser = argparse.ArgumentParser(prog="trtfuse")
    compare_runs.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["report", *map(str, argv)])


@needs_matplotlib
def test_report_puts_an_offline_and_a_server_run_side_by_side(runs, capsys):
    (off_dir, off), (srv_dir, srv) = runs["offline"], runs["server"]
    assert compare_runs.main(_report_args(off_dir, srv_dir)) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert off_dir.name in lines[0] and srv_dir.name in lines[0]
    row = {re.split(r"\s{2,}", line.strip())[0]: line for line in lines if line.startswith("  ")}
    assert "samples/s" in row["metric"] and "completed samples/s" in row["metric"]
    assert f"{off['loadgen']['samples_per_s']:,.1f}" in row["throughput"]
    assert f"{srv['loadgen']['completed_samples_per_s']:,.1f}" in row["throughput"]
    assert f"{srv['loadgen']['scheduled_qps']:,.1f}" in row["scheduled QPS"]
    cells = re.split(r"\s{2,}", row["scenario / mode"].strip())
    assert cells == ["scenario / mode", "offline / performance", "server / performance"]
    assert row["plugins"].split()[1:] == ["off", "off"]
    assert row["result"].split()[1:] == [("VALID" if r["loadgen"]["valid"] else "INVALID") for r in (off, srv)]
    for p in ("p50", "p90", "p99"):
        assert f"latency {p} ms" in row

    # Default --out: the first run's parent folder; default --name: comparison.
    out_dir = off_dir.parent
    saved = json.loads((out_dir / "comparison.json").read_text())
    assert saved["columns"] == [off_dir.name, srv_dir.name]
    rows = {r["name"]: r["values"] for r in saved["rows"]}
    assert rows["metric"] == ["samples/s", "completed samples/s"]
    assert saved["runs"][0]["throughput"] == pytest.approx(off["loadgen"]["samples_per_s"])
    assert saved["runs"][1]["p99_ms"] == pytest.approx(srv["loadgen"]["latency_ns"]["99.00"] / 1e6)
    assert saved["runs"][1]["latency_bound_ms"] == pytest.approx(1000.0)
    _assert_real_png(out_dir / "comparison.png")


@needs_matplotlib
def test_report_with_an_accuracy_run_shows_top1_and_takes_out_and_name(runs, tmp_path, capsys):
    (srv_dir, _), (acc_dir, acc) = runs["server"], runs["accuracy"]
    out = tmp_path / "cmp"
    args = _report_args(srv_dir, acc_dir / "report.json", "--out", out, "--name", "srv-acc")
    assert compare_runs.main(args) == 0
    text = capsys.readouterr().out
    top1 = next(line for line in text.splitlines() if line.strip().startswith("top-1"))
    assert f"{acc['accuracy']['top1'] * 100:.2f} %" in top1 and top1.split()[1] == "-"
    assert (out / "srv-acc.json").is_file()
    _assert_real_png(out / "srv-acc.png")


def test_report_errors_say_what_to_give(runs, tmp_path):
    run_dir, _ = runs["offline"]
    empty = tmp_path / "empty"
    empty.mkdir()
    not_json = tmp_path / "not_json"
    not_json.mkdir()
    (not_json / "report.json").write_text("{ truncated")
    a_list = tmp_path / "a_list"
    a_list.mkdir()
    (a_list / "report.json").write_text("[1, 2]")
    cases = [([], "no run folders given"),
             ([empty], "has no report.json"),
             ([run_dir, not_json], "is not JSON"),
             ([a_list], "not a trtfuse report"),
             ([tmp_path / "missing"], "does not exist")]
    for given, problem in cases:
        with pytest.raises(UserError) as e:
            compare_runs.main(_report_args(*given))
        assert problem in e.value.problem and e.value.fix, (given, str(e.value))
    with pytest.raises(UserError, match="not a usable file name"):
        compare_runs.main(_report_args(run_dir, "--name", "../x"))
    with pytest.raises(UserError, match="has no report.json"):
        plots.write_run_plots(empty)


def test_trtfuse_report_command_line(runs, tmp_path, capsys):
    if "report" not in cli._parser()._subparsers._group_actions[0].choices:
        pytest.skip("`trtfuse report` is not wired into src/trtfuse/cli.py yet")
    (off_dir, _), (srv_dir, _) = runs["offline"], runs["server"]
    assert cli.main(["report", str(off_dir), str(srv_dir), "--out", str(tmp_path), "--name", "cli"]) == 0
    assert (tmp_path / "cli.json").is_file()
    assert cli.main(["report", str(tmp_path / "nowhere")]) == 2
    assert "does not exist" in capsys.readouterr().err
