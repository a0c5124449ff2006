"""Top-1/top-5 from LoadGen's mlperf_log_accuracy.json, and the MLPerf 99 % check against a reference.

Each accuracy response holds the model's top-5 ImageNet class indices as int32, best first (see
``lg_sut.complete``), so the first four bytes are what MLPerf's own accuracy-imagenet.py reads as
the prediction. The labels of the run's samples are in ``qsl.json`` beside the log.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from trtfuse.errors import UserError

ACCURACY_LOG = "mlperf_log_accuracy.json"
QSL_FILE = "qsl.json"
PASS_RATIO = 0.99  # MLPerf's closed division: at least 99 % of the fp32 reference accuracy


def write_qsl_labels(run_dir: Path, names: list[str], labels) -> None:
    (Path(run_dir) / QSL_FILE).write_text(json.dumps(
        {"names": list(names), "labels": [int(x) for x in labels]}))


def read_predictions(run_dir: Path) -> dict[int, np.ndarray]:
    """qsl index -> int32 top-k classes, one entry per sample (repeats give the same answer)."""
    path = Path(run_dir) / ACCURACY_LOG
    if not path.is_file():
        raise UserError(f"{path} does not exist", "give the folder of a LoadGen run (trtfuse run ... --mode accuracy)")
    try:
        entries = json.loads(path.read_text() or "[]")
    except json.JSONDecodeError as e:
        raise UserError(f"{path} is not valid JSON ({e})", "the run may have been cut short; run it again") from None
    return {int(e["qsl_idx"]): np.frombuffer(bytes.fromhex(e["data"]), dtype=np.int32)
            for e in entries if e.get("data")}


def evaluate(run_dir: Path) -> dict:
    run_dir = Path(run_dir)
    predictions = read_predictions(run_dir)
    if not predictions:
        raise UserError(f"{run_dir / ACCURACY_LOG} holds no responses",
                        "run with --mode accuracy (performance runs log no answers)")
    qsl_path = run_dir / QSL_FILE
    if not qsl_path.is_file():
        raise UserError(f"{qsl_path} does not exist", "give a run folder written by `trtfuse run`")
    labels = np.asarray(json.loads(qsl_path.read_text())["labels"], dtype=np.int64)
    indices = np.fromiter(predictions, dtype=np.int64)
    if indices.max() >= len(labels):
        raise UserError(f"{ACCURACY_LOG} refers to sample {indices.max()} but {QSL_FILE} has {len(labels)}",
                        "the two files come from different runs")
    top = np.stack([predictions[i] for i in indices])
    truth = labels[indices]
    top1 = float(np.mean(top[:, 0] == truth))
    top5 = float(np.mean((top[:, :5] == truth[:, None]).any(axis=1)))
    return {"top1": top1, "top5": top5, "n": len(indices)}


def check_same_images(run_dir: Path, reference_dir: Path) -> None:
    """A UserError unless both runs are over the same images (their qsl.json): a top-1 ratio of runs
    over different datasets says nothing."""
    def images(d):
        path = Path(d) / QSL_FILE
        return json.loads(path.read_text())["names"] if path.is_file() else None

    mine, theirs = images(run_dir), images(reference_dir)
    if mine is not None and theirs is not None and mine != theirs:
        size = f"{len(mine)} and {len(theirs)} images" if len(mine) != len(theirs) else \
            f"{len(mine)} images each, not the same ones"
        raise UserError(f"{run_dir} and the reference {reference_dir} are runs over different images ({size})",
                        "give a reference accuracy run over the same dataset (and --sample-count)")


def compare(result: dict, reference: dict) -> dict:
    """``result`` against a reference run's accuracy: ratio of top-1 and pass/fail at 99 %."""
    ratio = result["top1"] / reference["top1"] if reference["top1"] > 0 else float("nan")
    return {"reference_top1": reference["top1"], "ratio": ratio,
            "threshold": PASS_RATIO, "passed": bool(ratio >= PASS_RATIO)}
