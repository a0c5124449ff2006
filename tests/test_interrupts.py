"""Ctrl-C and SIGTERM during a LoadGen test: the command ends promptly with exit code 130, without
LoadGen's abort, and leaves no unfinished run folder; a second signal quits at once.

Each case runs ``trtfuse`` in a child process (``slow_trtfuse.py``: every batch takes a known extra
time, so the run is still going whatever the machine's speed) and signals it once LoadGen has
started (its detail log exists). The runs would last 10 minutes: a child that has not ended within
the generous ``WAIT_S`` means the signal did not stop the run (this bounds a hang; it measures
nothing).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest_harness import MLPERF_DIR, needs_mlperf, tiny_rgb_onnx
from test_cli import jpeg_folder
from trtfuse import cli, interrupts

DRIVER = Path(__file__).with_name("slow_trtfuse.py")
WAIT_S = 60  # far below the runs' 600 s, far above what an interrupted run takes on a loaded machine
ABORT_TEXT = ("terminate called", "Aborted", "core dumped", "Traceback")


@pytest.fixture
def inputs(tmp_path):
    return {"model": str(tiny_rgb_onnx(tmp_path / "tiny.onnx")), "images": str(jpeg_folder(tmp_path / "images"))}


def start(tmp_path, args, delay_s=0.05):
    """The child, its stderr in a file (read while it runs)."""
    env = {**os.environ, "TRTFUSE_HOME": str(tmp_path / "home"), "OMP_NUM_THREADS": "1"}
    with open(tmp_path / "stderr.txt", "w") as err:
        proc = subprocess.Popen([sys.executable, str(DRIVER), str(delay_s), *args], cwd=tmp_path, env=env,
                                stdout=subprocess.DEVNULL, stderr=err, text=True)
    proc.stderr_path = tmp_path / "stderr.txt"
    return proc


def wait_for_text(proc, text: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while text not in proc.stderr_path.read_text():
        assert time.monotonic() < deadline, f"{text!r} never appeared"
        time.sleep(0.05)


def wait_for_file(proc, path: Path) -> None:
    """Until ``path`` exists (LoadGen has started); the child must still be running then."""
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        assert proc.poll() is None, f"ended before {path.name} appeared: {proc.stderr_path.read_text()}"
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    time.sleep(0.3)  # into the test: the query issued, batches running


def finish(proc) -> tuple[int, str]:
    try:
        proc.wait(timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"the signal did not end the run: {proc.stderr_path.read_text()[-2000:]}")
    err = proc.stderr_path.read_text()
    for text in ABORT_TEXT:
        assert text not in err, err
    return proc.returncode, err


def run_args(inputs, run_dir, *extra):
    return ["run", "--model", inputs["model"], "--dataset", inputs["images"], "--backend", "onnxruntime",
            "--batch-size", "2", "--threads", "1", "--run-dir", str(run_dir), *extra]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_offline_run_ends_at_a_signal_and_leaves_no_run_folder(tmp_path, inputs, sig):
    run_dir = tmp_path / "run"
    proc = start(tmp_path, run_args(inputs, run_dir, "--min-duration-s", "600", "--target-qps", "40"))
    wait_for_file(proc, run_dir / "mlperf_log_detail.txt")
    proc.send_signal(sig)
    rc, err = finish(proc)
    assert rc == 130, err
    assert "interrupted: stopping the run" in err
    assert not run_dir.exists()


def test_server_run_ends_at_ctrl_c_and_leaves_no_run_folder(tmp_path, inputs):
    run_dir = tmp_path / "run"
    proc = start(tmp_path, run_args(inputs, run_dir, "--scenario", "server", "--target-qps", "20",
                                    "--latency-bound-ms", "100", "--min-duration-s", "600"))
    wait_for_file(proc, run_dir / "mlperf_log_detail.txt")
    proc.send_signal(signal.SIGINT)
    rc, err = finish(proc)
    assert rc == 130 and "cannot be stopped early" in err, err
    assert not run_dir.exists()


@pytest.mark.parametrize("scenario", ["offline", "server"])
def test_native_sut_run_ends_at_ctrl_c_and_leaves_no_run_folder(tmp_path, inputs, scenario):
    """--sut native: StartTest runs in C++; the first signal stops the session (everything answered at
    once), and the command ends as with the Python SUT."""
    run_dir = tmp_path / "run"
    conf = tmp_path / "native.toml"
    conf.write_text("[native]\nnull_batch_us = 50000.0\n")  # the null engine: 50 ms a batch
    args = ["run", "--model", inputs["model"], "--dataset", inputs["images"], "--sut", "native", "--backend", "null",
            "--batch-size", "2", "--run-dir", str(run_dir), "--config", str(conf), "--min-duration-s", "600",
            "--scenario", scenario, "--target-qps", "20", "--latency-bound-ms", "1000"]
    proc = start(tmp_path, args, delay_s=0.0)
    wait_for_file(proc, run_dir / "mlperf_log_detail.txt")
    proc.send_signal(signal.SIGINT)
    rc, err = finish(proc)
    assert rc == 130, err
    assert not run_dir.exists()


def test_a_second_ctrl_c_quits_at_once(tmp_path, inputs):
    """The SUT ignores the first signal here (as a backend stuck in a call would): the Offline run goes
    on, and the second signal quits, removing the run folder."""
    run_dir = tmp_path / "run"
    proc = start(tmp_path, run_args(inputs, run_dir, "--min-duration-s", "600", "--target-qps", "40"),
                 delay_s="0.05:deaf")
    wait_for_file(proc, run_dir / "mlperf_log_detail.txt")
    proc.send_signal(signal.SIGINT)
    wait_for_text(proc, "stopping the run")
    assert proc.poll() is None  # still running: the first signal did not end it
    proc.send_signal(signal.SIGINT)
    rc, err = finish(proc)
    assert rc == 130 and "quitting at once" in err, err
    assert not run_dir.exists()


def test_accuracy_run_ends_at_ctrl_c_and_leaves_no_run_folder(tmp_path, inputs):
    run_dir = tmp_path / "run"
    # One sample per second: the 6 samples take 6 s, LoadGen's test is under way within the first.
    proc = start(tmp_path, [*run_args(inputs, run_dir, "--mode", "accuracy"), "--batch-size", "1"], delay_s=1.0)
    wait_for_file(proc, run_dir / "mlperf_log_detail.txt")
    proc.send_signal(signal.SIGINT)
    rc, err = finish(proc)
    assert rc == 130, err
    assert not run_dir.exists()


def test_ctrl_c_before_loadgen_starts_leaves_no_run_folder(tmp_path, inputs):
    """During the warm-up (each batch takes 2 s): Python's KeyboardInterrupt, caught by the CLI."""
    run_dir = tmp_path / "run"
    proc = start(tmp_path, run_args(inputs, run_dir, "--min-duration-s", "600"), delay_s=2.0)
    wait_for_file(proc, run_dir / "qsl.json")
    proc.send_signal(signal.SIGINT)
    rc, err = finish(proc)
    assert rc == 130 and err.rstrip().endswith("interrupted"), err
    assert not run_dir.exists()


@needs_mlperf
def test_compliance_ends_at_ctrl_c_and_leaves_no_folder(tmp_path, inputs):
    out = tmp_path / "test04"
    args = ["compliance", "TEST04", "--model", inputs["model"], "--dataset", inputs["images"], "--backend",
            "onnxruntime", "--batch-size", "2", "--threads", "1", "--out", str(out), "--min-duration-s", "600",
            "--target-qps", "40", "--mlperf-dir", str(MLPERF_DIR)]
    proc = start(tmp_path, args)
    wait_for_file(proc, out / "reference" / "performance" / "run_1" / "mlperf_log_detail.txt")
    proc.send_signal(signal.SIGINT)
    rc, err = finish(proc)
    assert rc == 130, err
    assert not out.exists()


def test_a_signal_while_the_report_is_written_completes_the_folder_marked(tmp_path, monkeypatch, capsys):
    """LoadGen's test ended by itself: the folder is completed (report and pictures), its report
    says it was interrupted, and the command exits 130."""
    from trtfuse import plots

    model = tiny_rgb_onnx(tmp_path / "tiny.onnx")
    images = jpeg_folder(tmp_path / "images")
    monkeypatch.setenv("TRTFUSE_HOME", str(tmp_path / "home"))
    write_plots = plots.write_run_plots
    before = signal.getsignal(signal.SIGINT)  # Python's own, or SIG_IGN where the parent ignores SIGINT

    def signalled_then_plots(run_dir, result):
        os.kill(os.getpid(), signal.SIGINT)  # handled before the next bytecode, in this (main) thread
        return write_plots(run_dir, result)

    monkeypatch.setattr(plots, "write_run_plots", signalled_then_plots)
    run_dir = tmp_path / "run"
    rc = cli.main(["run", "--model", str(model), "--dataset", str(images), "--backend", "onnxruntime",
                   "--batch-size", "2", "--min-duration-s", "0.1", "--run-dir", str(run_dir), "--quiet"])
    assert rc == 130
    assert "interrupted: finishing the run folder first" in capsys.readouterr().err
    report = json.loads((run_dir / "report.json").read_text())
    assert "the measurement is whole" in report["interrupted"]
    assert (run_dir / "completed_over_time.png").is_file()
    assert signal.getsignal(signal.SIGINT) is before  # restored after the command


def test_run_folder_is_removed_only_while_unfinished(tmp_path):
    with interrupts.handled():
        done = interrupts.RunFolder(tmp_path / "done")
        done.path.mkdir()
        done.complete()
        pending = interrupts.RunFolder(tmp_path / "pending")
        (pending.path / "sub").mkdir(parents=True)
        interrupts.remove_unfinished()
    assert done.path.is_dir() and not pending.path.exists()
    kept = tmp_path / "given"
    (kept / "x").mkdir(parents=True)
    interrupts.RunFolder(kept, created=False).remove()  # a folder that was there is emptied, not removed
    assert kept.is_dir() and not any(kept.iterdir())
