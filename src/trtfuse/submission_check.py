"""MLCommons' submission tools on a tree `trtfuse submission` wrote: ``truncate_accuracy_log.py`` (the
step before submitting: accuracy.txt gets the full accuracy log's hash, the log keeps its first and last
4 KB) and the submission checker (``submission_checker.main``), called from the inference folder
(``--mlperf-dir``), never copied.

Both walk a root that holds ``<division>/<submitter>/``: trtfuse's DIR is that inner folder, so each runs
on a scratch root whose ``<division>/<submitter>`` is a link to DIR, and writes nothing outside it but
into that scratch folder (the checker's summary.csv, truncation's backups).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from trtfuse.errors import UserError

TOOLS = Path("tools") / "submission"
CHECKER_PACKAGE = "submission_checker"
TRUNCATE = TOOLS / "truncate_accuracy_log.py"
# The checker's log lines: "[time file.py:line LEVEL] message" (its loader's logging format).
LOG_LINE = re.compile(r"^\[[^\]]*?(\w+\.py):\d+ (ERROR|WARNING)\] (.*)$")
SUMMARY = re.compile(r"SUMMARY: (submission looks OK|submission has errors)")
RESULTS = re.compile(r"Results=(\d+), NoResults=(\d+)")


def tools_dir(mlperf_dir: Path) -> Path:
    path = Path(mlperf_dir) / TOOLS
    if not (path / CHECKER_PACKAGE / "main.py").is_file() or not (Path(mlperf_dir) / TRUNCATE).is_file():
        raise UserError(f"{mlperf_dir} lacks MLCommons' submission tools ({TOOLS}/{CHECKER_PACKAGE}, "
                        f"{TRUNCATE})",
                        "point --mlperf-dir at a checkout of mlcommons/inference that has them (commit b66003e "
                        "or later knows rounds v5.0-v6.1)")
    return path


def _scratch_root(work: Path, tree: Path, division: str, submitter: str) -> Path:
    root = work / "root"
    (root / division).mkdir(parents=True)
    os.symlink(Path(tree).resolve(), root / division / submitter, target_is_directory=True)
    return root


def _run(cmd: list, cwd: Path, mlperf_dir: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(mlperf_dir).resolve() / TOOLS),
                                                    env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, *map(str, cmd)], cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, check=False)


def truncate_accuracy_logs(tree: Path, division: str, submitter: str, mlperf_dir: Path) -> list[str]:
    """MLCommons' truncate_accuracy_log.py on the tree, in place. The full logs it would back up stay
    where they came from (the run folders), so its backup goes to a scratch folder. Returns what it
    could not truncate because the tree lacks it (a scenario without an accuracy run, a TEST01 log
    without accuracy.txt); any other complaint is an error."""
    tools_dir(mlperf_dir)
    with tempfile.TemporaryDirectory(prefix="trtfuse-truncate-") as work:
        work = Path(work)
        root = _scratch_root(work, tree, division, submitter)
        done = _run([Path(mlperf_dir).resolve() / TRUNCATE, "--input", root, "--submitter", submitter,
                     "--backup", work / "backup"], cwd=work, mlperf_dir=mlperf_dir)
    said = [m.group(3) for m in map(LOG_LINE.match, done.stdout.splitlines()) if m and m.group(2) == "ERROR"]
    said += [line.split(":", 2)[2] for line in done.stdout.splitlines() if line.startswith("ERROR:")]
    lacking = [e for e in said if e.endswith((" missing", "missing, generate to continue"))]
    errors = [e for e in said if e not in lacking]
    if done.returncode != 0 or errors:
        raise UserError(f"MLCommons' truncate_accuracy_log.py failed on the tree (exit {done.returncode}): "
                        + ("; ".join(errors) or done.stdout.strip()[-300:]),
                        "check --mlperf-dir's tools/submission, then run `trtfuse submission` again")
    return lacking


@dataclass
class CheckerVerdict:
    version: str
    returncode: int
    passed: bool
    errors: list = field(default_factory=list)
    warnings: list = field(default_factory=list)
    results: int | None = None
    no_results: int | None = None
    output: str = ""


def run_checker(tree: Path, division: str, submitter: str, version: str, mlperf_dir: Path,
                extra: list[str] | None = None) -> CheckerVerdict:
    """MLCommons' submission checker on the tree as round ``version``; its verdict and every error line."""
    import importlib.util

    tools_dir(mlperf_dir)
    if importlib.util.find_spec("yaml") is None:
        raise UserError("MLCommons' submission checker needs PyYAML, which is not installed", "pip install pyyaml")
    with tempfile.TemporaryDirectory(prefix="trtfuse-check-") as work:
        work = Path(work)
        root = _scratch_root(work, tree, division, submitter)
        done = _run(["-m", f"{CHECKER_PACKAGE}.main", "--input", root, "--version", version,
                     "--submitter", submitter, "--csv", work / "summary.csv", *(extra or [])],
                    cwd=work, mlperf_dir=mlperf_dir)
    out = done.stdout
    root_text = str(root)
    errors, warnings = [], []
    for line in out.splitlines():
        m = LOG_LINE.match(line)
        if not m:
            if line.startswith("ERROR:"):  # a message logged before the checker set its format
                errors.append(line.split(":", 2)[2])
            continue
        message = m.group(3).replace(root_text + "/", "").replace(root_text, ".")
        (errors if m.group(2) == "ERROR" else warnings).append(message)
    summary = SUMMARY.search(out)
    counts = RESULTS.search(out)
    if summary is None:  # the checker itself failed (a traceback): its last lines say why
        errors.append("the checker stopped: " + " | ".join(out.strip().splitlines()[-3:]))
    return CheckerVerdict(version=version, returncode=done.returncode,
                          passed=done.returncode == 0 and bool(summary) and summary.group(1).endswith("OK"),
                          errors=errors, warnings=warnings,
                          results=int(counts.group(1)) if counts else None,
                          no_results=int(counts.group(2)) if counts else None, output=out)


def format_verdict(v: CheckerVerdict) -> str:
    head = (f"MLCommons submission checker ({v.version}): "
            + ("PASS, submission looks OK" if v.passed else f"FAIL, {len(v.errors)} error(s)")
            + (f"; results {v.results}, no results {v.no_results}" if v.results is not None else ""))
    return "\n".join([head] + [f"  ERROR {e}" for e in v.errors])
