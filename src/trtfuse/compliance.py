"""``trtfuse compliance TEST01|TEST04``: an MLPerf compliance test, judged by MLCommons' own scripts.

A test needs reference runs to compare against (TEST01: an accuracy run and a performance run;
TEST04: a performance run), then the audited run (a performance run with the test's audit.config),
then MLCommons' ``run_verification.py``. Reference runs given (``performance_run``, ``accuracy_run``:
run folders of ``trtfuse run``) are copied in; missing ones are run first. The folder it writes:

    OUT/reference/accuracy/            the reference accuracy run (TEST01), a trtfuse run folder
    OUT/reference/performance/run_1/   the reference performance run
    OUT/audited/                       the run with the audit.config
    OUT/TEST01/ (or TEST04/)           what run_verification.py writes: the submission's
                                       compliance/<system>/<model>/<scenario>/TEST01 folder
    OUT/verification.log               run_verification.py's output
    OUT/compliance.json                the verdict and where everything is

The verdict is MLCommons' ("Accuracy check pass: True", "Performance check pass: True"); trtfuse
only checks beforehand that LoadGen did apply the audit.config (its detail log says so).
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from trtfuse import mlperf_tools
from trtfuse.errors import UserError
from trtfuse.lg_scenarios import SCENARIO_NAME

TESTS = ("TEST01", "TEST04")
# What each audit.config must have made LoadGen do (its effective settings), so that a test that
# silently ran without it is never reported as passed.
AUDIT_EFFECT = {"TEST01": ("accuracy_log_sampling_target", lambda v: int(v) > 0),
                "TEST04": ("performance_issue_same", lambda v: bool(v))}
CHECK_LINE = re.compile(r"^(Accuracy|Performance) check pass: (True|False)", re.MULTILINE)


def audit_config(mlperf_dir: Path, test: str, model: str) -> Path:
    """The test's audit.config in the MLCommons folder: TEST01's is per benchmark."""
    path = mlperf_dir / "compliance" / test / (model if test == "TEST01" else "") / "audit.config"
    if not path.is_file():
        raise UserError(f"{path} does not exist: MLCommons has no {test} audit.config for {model!r}",
                        "run the test for a benchmark it covers (run.mlperf_model, e.g. resnet50)")
    return path


def _settings(settings: dict, mode: str, audit: str = "") -> dict:
    s = copy.deepcopy(settings)
    s["run"]["mode"], s["run"]["audit_config"] = mode, audit
    return s


def _reference_dirs(reference: Path, test: str) -> dict[str, Path]:
    dirs = {"performance": reference / "performance" / "run_1"}
    if test == "TEST01":
        dirs["accuracy"] = reference / "accuracy"
    return dirs


def run_compliance(test: str, settings: dict, out: str | Path | None = None,
                   performance_run: str | Path | None = None, accuracy_run: str | Path | None = None,
                   progress: bool = True, weights: str | None = None,
                   model=None, dataset=None, backend=None) -> dict:
    """Run ``test`` in the settings' scenario and return (and write) its verdict."""
    from trtfuse import native_sut, session
    from trtfuse.report import read_loadgen_results

    if test not in TESTS:
        raise UserError(f"unknown compliance test {test!r}", f"use one of: {', '.join(TESTS)}")
    r = settings["run"]
    mlperf_dir = mlperf_tools.inference_dir(settings["mlperf"]["inference_dir"])
    audit = audit_config(mlperf_dir, test, r["mlperf_model"])
    scenario = r["scenario"]
    out = Path(out) if out else Path(r["output_dir"]) / f"compliance-{test}-{scenario}-{time.strftime('%Y%m%d-%H%M%S')}"
    if out.exists() and any(out.iterdir()):
        raise UserError(f"{out} already exists and is not empty", "give a new --out folder")
    reference = out / "reference"
    ref_dirs = _reference_dirs(reference, test)
    given = {"performance": performance_run, "accuracy": accuracy_run if test == "TEST01" else None}
    for mode, run_dir in given.items():
        if not run_dir:
            continue
        if not (Path(run_dir) / "mlperf_log_detail.txt").is_file():
            raise UserError(f"the reference {mode} run {run_dir} has no LoadGen logs",
                            f"give a run folder of `trtfuse run --mode {mode}`, or leave it out to run one")
        logged = read_loadgen_results(run_dir)
        if (logged["scenario"], logged["mode"]) != (scenario, mode):
            raise UserError(f"the reference {mode} run {run_dir} is a {logged['scenario']} {logged['mode']} run",
                            f"give a {scenario} {mode} run (or --scenario {logged['scenario']})")
    from trtfuse import files, interrupts

    files.check_folder_path(out, "--out")
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    folder = interrupts.RunFolder(out, created)  # an interrupted test leaves no folder (or an empty one)
    for mode, run_dir in given.items():
        if run_dir:
            shutil.copytree(run_dir, ref_dirs[mode])

    own_backend = backend is None
    settings = native_sut.resolve_sut(settings, backend)  # one SUT for the reference and audited runs
    r = settings["run"]
    native = r["sut"] == "native"
    model, dataset, backend = session.open_inputs(settings, weights, progress, model, dataset, backend,
                                                  with_backend=not native)
    if native and backend is None:  # one native engine for the reference and audited runs
        backend = native_sut.open_engine(settings, model, dataset)
    try:
        for mode, d in ref_dirs.items():
            if d.exists():
                continue
            if progress:
                print(f"trtfuse: {test}: reference {mode} run", file=sys.stderr)
            session.run(_settings(settings, mode), progress, model=model, dataset=dataset, backend=backend, run_dir=d)
        if progress:
            print(f"trtfuse: {test}: audited run with {audit}", file=sys.stderr)
        audited = out / "audited"
        session.run(_settings(settings, "performance", str(audit)), progress, model=model, dataset=dataset,
                    backend=backend, run_dir=audited)
    finally:
        if own_backend:
            backend.close()

    key, applied = AUDIT_EFFECT[test]
    effective = read_loadgen_results(audited)["effective_settings"]
    if not applied(effective.get(key, 0)):
        raise UserError(f"LoadGen did not apply {audit} (effective {key} = {effective.get(key)!r})",
                        f"check {audited / 'mlperf_log_detail.txt'}; the audit.config may not match "
                        f"{r['mlperf_model']}.{SCENARIO_NAME[scenario]}")
    verdict = verify(test, mlperf_dir, reference, audited, out)
    verdict.update(test=test, scenario=scenario, model=model.name, audit_config=str(audit),
                   mlperf_dir=str(mlperf_dir), reference=str(reference),
                   reference_runs={m: str(given[m] or "run here") for m in ref_dirs}, audited_run=str(audited),
                   scores={"reference": _score(ref_dirs["performance"]), "audited": _score(audited)})
    (out / "compliance.json").write_text(json.dumps(verdict, indent=2) + "\n")
    folder.complete()
    print(format_verdict(verdict))
    return verdict


def verify(test: str, mlperf_dir: Path, results_dir: Path, audited: Path, out: Path) -> dict:
    """MLCommons' run_verification.py on the reference runs and the audited run; its verdict."""
    # Absolute paths: the scripts run in a scratch folder.
    args = ["-r", results_dir.resolve(), "-c", audited.resolve(), "-o", out.resolve()]
    if test == "TEST01":
        args += ["--dtype", mlperf_tools.RESPONSE_DTYPE]
    # The scripts write their verify_*.txt into the working directory before copying them to OUT/TEST.
    with tempfile.TemporaryDirectory(prefix="trtfuse-verify-") as work:
        proc = mlperf_tools.run_script(mlperf_dir, Path("compliance") / test / "run_verification.py", args,
                                       cwd=Path(work))
    (out / "verification.log").write_text(proc.stdout)
    checks = {f"{kind.lower()}_check": value == "True" for kind, value in CHECK_LINE.findall(proc.stdout)}
    wanted = ["accuracy_check", "performance_check"] if test == "TEST01" else ["performance_check"]
    passed = proc.returncode == 0 and all(checks.get(c) for c in wanted)
    return {"passed": passed, **checks, "verification_rc": proc.returncode,
            "verification_log": str(out / "verification.log"), "test_dir": str(out / test),
            "verification_tail": proc.stdout.strip().splitlines()[-12:]}


def _score(run_dir: Path) -> dict:
    """A performance run's MLPerf score and validity (the verification refuses INVALID runs): a rate,
    or (SingleStream, MultiStream) the latency percentile in ms."""
    from trtfuse.report import LATENCY_METRIC, read_loadgen_results

    lg = read_loadgen_results(run_dir)
    if lg["scenario"] in LATENCY_METRIC:
        score = (lg.get("latency_metric_ns") or 0) / 1e6
    elif lg["scenario"] == "offline":
        score = lg.get("samples_per_s")
    else:
        score = lg.get("completed_samples_per_s")
    return {"score": score, "valid": lg["valid"], "invalid_reasons": lg["invalid_reasons"]}


def format_verdict(v: dict) -> str:
    rows = [("test", f"{v['test']} ({v['scenario']}, {v['model']})"),
            ("verdict", "PASS" if v["passed"] else "FAIL")]
    for check in ("accuracy_check", "performance_check"):
        if check in v:
            rows.append((check.replace("_", " "), "pass" if v[check] else "fail"))
    unit = {"offline": "samples/s", "server": "completed samples/s", "singlestream": "ms (p90, early stopping)",
            "multistream": "ms (p99, early stopping)"}.get(v["scenario"], "")
    for name, sc in v.get("scores", {}).items():
        state = "VALID" if sc["valid"] else "INVALID: " + "; ".join(sc["invalid_reasons"] or ["see its log"])
        rows.append((f"{name} run", f"{sc['score'] or 0:,.{3 if 'ms' in unit else 1}f} {unit}, {state}"))
    rows += [("verified by", "MLCommons run_verification.py (" + v["mlperf_dir"] + ")"),
             ("test folder", v["test_dir"]), ("log", v["verification_log"])]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {val}" for k, val in rows)
