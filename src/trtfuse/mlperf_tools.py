"""MLCommons' own scripts (compliance verification, the ImageNet accuracy scorer), called, never copied.

They live in a checkout of github.com/mlcommons/inference (``compliance/TEST01/...``,
``compliance/TEST04/...``, ``vision/classification_and_detection/tools/accuracy-imagenet.py``,
``tools/submission/...``), or in a flattened copy of those with the scorer at ``tools/accuracy-imagenet.py``
(../shared/third_party/mlperf). Where it is, is a setting: ``--mlperf-dir DIR`` on the commands that
need it, else ``$MLPERF_INFERENCE_DIR``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from trtfuse.errors import UserError

ENV_VAR = "MLPERF_INFERENCE_DIR"
ACCURACY_SCRIPT = Path("tools") / "accuracy-imagenet.py"  # in a flattened copy
# Where the ImageNet scorer is: a clone of mlcommons/inference, then a flattened copy.
ACCURACY_SCRIPTS = (Path("vision") / "classification_and_detection" / ACCURACY_SCRIPT, ACCURACY_SCRIPT)
# Our accuracy responses are top-5 int32 class indices; MLCommons' scorers must read them as int32.
RESPONSE_DTYPE = "int32"
# TEST01's verify_performance.py imports ``log_parser`` from tools/submission of the inference repo.
LOG_PARSER = Path("tools") / "submission" / "log_parser.py"
_LOG_PARSER_SHIM = Path(__file__).with_name("mlperf_log_parser_shim")


def inference_dir(given: str | os.PathLike | None = None) -> Path:
    """The MLCommons inference folder: ``given``, else $MLPERF_INFERENCE_DIR; checked for the scripts."""
    value = given or os.environ.get(ENV_VAR)
    if not value:
        raise UserError("the MLCommons inference scripts' folder is not set",
                        f"clone github.com/mlcommons/inference and pass --mlperf-dir DIR or set {ENV_VAR}")
    path = Path(value).expanduser().resolve()  # absolute: the scripts run in scratch folders
    missing = [p for p in ("compliance/TEST01/run_verification.py", "compliance/TEST04/run_verification.py")
               if not (path / p).is_file()]
    if not any((path / p).is_file() for p in ACCURACY_SCRIPTS):
        missing.append(" or ".join(map(str, ACCURACY_SCRIPTS)))
    if missing:
        raise UserError(f"{path} is not an MLCommons inference folder (missing {', '.join(missing)})",
                        f"point --mlperf-dir (or {ENV_VAR}) at a checkout of mlcommons/inference")
    return path


def accuracy_script(mlperf_dir: Path) -> Path:
    """The ImageNet scorer's path inside the inference folder (a clone's, else a flattened copy's)."""
    for p in ACCURACY_SCRIPTS:
        if (Path(mlperf_dir) / p).is_file():
            return p
    raise UserError(f"{mlperf_dir} has no {' or '.join(map(str, ACCURACY_SCRIPTS))}",
                    f"point --mlperf-dir (or {ENV_VAR}) at a checkout of mlcommons/inference")


def script_env(mlperf_dir: Path) -> dict:
    """The environment to run MLCommons' scripts in. Where the folder lacks tools/submission's
    log_parser (a partial copy), our own reader of LoadGen's detail log stands in for it."""
    env = dict(os.environ)
    if not (mlperf_dir / LOG_PARSER).is_file():
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_LOG_PARSER_SHIM), env.get("PYTHONPATH")) if p)
    return env


def run_script(mlperf_dir: Path, script: Path, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``python script args`` in ``cwd`` (MLCommons' scripts write files into their working directory),
    stdout and stderr together in ``.stdout``."""
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run([sys.executable, str(mlperf_dir / script), *map(str, args)], cwd=cwd,
                          env=script_env(mlperf_dir), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, check=False)
