"""Top-1/top-5 from a LoadGen accuracy log, checked against hand-written logs."""

import json

import numpy as np
import pytest
from trtfuse import accuracy
from trtfuse.errors import UserError
from trtfuse.backends import top_k_classes


def write_run(run_dir, labels, predictions):
    """predictions: {qsl_idx: [top-5 classes]} written as LoadGen writes response bytes."""
    run_dir.mkdir(parents=True, exist_ok=True)
    accuracy.write_qsl_labels(run_dir, [f"{i}.JPEG" for i in range(len(labels))], labels)
    entries = [
        {"seq_id": k, "qsl_idx": i, "data": np.asarray(p, dtype=np.int32).tobytes().hex().upper()}
        for k, (i, p) in enumerate(predictions.items())
    ]
    (run_dir / accuracy.ACCURACY_LOG).write_text(json.dumps(entries))
    return run_dir


def test_top1_top5_from_hand_written_log(tmp_path):
    labels = [3, 7, 1, 9]
    run = write_run(
        tmp_path / "r",
        labels,
        {
            0: [3, 0, 0, 0, 0],  # top-1 right
            1: [1, 2, 4, 5, 7],  # right at rank 5
            2: [0, 2, 3, 4, 5],  # wrong
            3: [9, 1, 1, 1, 1],  # top-1 right
        },
    )
    assert accuracy.evaluate(run) == {"top1": 0.5, "top5": 0.75, "n": 4}


def test_reference_ratio_passes_at_99_percent_and_fails_below():
    ref = {"top1": 0.8}
    assert accuracy.compare({"top1": 0.792}, ref)["passed"]  # exactly 99 %
    assert not accuracy.compare({"top1": 0.7919}, ref)["passed"]
    assert accuracy.compare({"top1": 0.4}, ref)["ratio"] == pytest.approx(0.5)


def test_cli_accuracy_with_reference(tmp_path, capsys):
    from trtfuse.cli import main

    good = write_run(tmp_path / "good", [1, 2], {0: [1, 0, 0, 0, 0], 1: [2, 0, 0, 0, 0]})
    half = write_run(tmp_path / "half", [1, 2], {0: [1, 0, 0, 0, 0], 1: [0, 0, 0, 0, 0]})
    assert main(["accuracy", str(good), "--reference", str(good)]) == 0
    assert main(["accuracy", str(half), "--reference", str(good)]) == 1
    out = capsys.readouterr().out
    assert "top-1  50.00 %" in out and "FAIL" in out
    assert json.loads((half / "accuracy.json").read_text())["reference"]["ratio"] == 0.5


def test_top_k_orders_best_first():
    logits = np.array([[0.1, 0.9, 0.3, 0.8, 0.2, 0.0, 0.7]], dtype=np.float32)
    assert top_k_classes(logits).tolist() == [[1, 3, 6, 2, 4]]
    assert top_k_classes(logits).dtype == np.int32
    assert top_k_classes(logits, k=2).tolist() == [[1, 3]]


def test_missing_or_empty_logs_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        accuracy.evaluate(tmp_path)
    run = write_run(tmp_path / "empty", [1], {})
    with pytest.raises(UserError, match="holds no responses"):
        accuracy.evaluate(run)
