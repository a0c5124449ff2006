"""What a new user meets on a fresh machine (issue 43): each careless input or missing piece gets one
clear line and the right exit code, before any long work, and nothing is written half or wrong."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from conftest_harness import tiny_rgb_onnx
from test_cli import jpeg_folder
from trtfuse import cli, plugin_build
from trtfuse.errors import UserError

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRTFUSE_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run_args(home, *extra):
    images = home / "images"
    if not images.is_dir():
        jpeg_folder(images)
    return ["run", "--model", str(tiny_rgb_onnx(home / "tiny.onnx")), "--dataset", str(images),
            "--backend", "onnxruntime", "--batch-size", "2", "--quiet", *extra]


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


# 2 ------------------------------------------------------------------------------------------------
def test_build_without_tensorrt_says_so_before_calibrating(tmp_path, monkeypatch):
    from trtfuse import build_command

    monkeypatch.setitem(sys.modules, "tensorrt", None)  # `import tensorrt` fails, as without it
    calibrated = []
    monkeypatch.setattr(build_command, "quantize_model_dir", lambda *a, **k: calibrated.append(a))
    (tmp_path / "model.json").write_text("{}")
    with pytest.raises(UserError, match="TensorRT is not installed"):
        build_command.cli_main([str(tmp_path), "--precision", "int8", "--calibration", str(tmp_path)])
    assert calibrated == []  # the minutes of calibration never started
    build_command.cli_main([str(tmp_path), "--precision", "int8", "--calibration", str(tmp_path), "--quantize-only"])
    assert len(calibrated) == 1  # quantizing alone needs no TensorRT


# 3 ------------------------------------------------------------------------------------------------
def test_a_file_in_place_of_a_folder_is_one_line(home, capsys):
    (home / "afile").write_text("x")
    assert cli.main(run_args(home, "--output-dir", "afile")) == 2
    assert "--output-dir afile: afile is a file, not a folder" in one_error_line(capsys)
    assert cli.main(run_args(home, "--run-dir", "afile/run")) == 2
    assert "afile is a file" in one_error_line(capsys)
    assert (home / "afile").read_text() == "x"


# 4 ------------------------------------------------------------------------------------------------
def test_compliance_offers_no_option_it_would_ignore(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["compliance", "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert "--audit-config" not in text and not re.search(r"--mode\b", text) and "--min-duration-s" in text
    assert cli.main(["compliance", "TEST04", "--mode", "accuracy"]) == 2  # argparse: unrecognized


# 5 ------------------------------------------------------------------------------------------------
def test_plugins_build_dir_of_an_installed_package_is_under_trtfuse_home(tmp_path, monkeypatch):
    monkeypatch.delenv("TRTFUSE_BUILD_DIR", raising=False)
    assert plugin_build.default_build_dir() == REPO / "build" / "plugins"  # this checkout (editable)
    site = tmp_path / "site-packages"  # what REPO_ROOT is for `pip install .`
    site.mkdir()
    monkeypatch.setattr(plugin_build, "REPO_ROOT", site)
    monkeypatch.setenv("TRTFUSE_HOME", str(tmp_path / "home"))
    assert plugin_build.default_build_dir() == tmp_path / "home" / "plugins"


# 6 ------------------------------------------------------------------------------------------------
def test_hints_name_only_options_that_exist_where_they_are_given(home, capsys):
    assert cli.main(["run", "--model", "resnet9", "--quiet"]) == 2
    line = one_error_line(capsys)
    assert "unknown model 'resnet9'" in line and "--model FILE.onnx" in line and "pass --onnx" not in line
    from trtfuse.backends import TENSORRT_MISSING

    assert "`trtfuse run --backend onnxruntime`" in str(TENSORRT_MISSING)  # also right under build/profile


# 7 ------------------------------------------------------------------------------------------------
def test_a_truncated_jpeg_is_refused_not_cached(home, capsys):
    images = jpeg_folder(home / "images")
    victim = sorted(images.glob("*.JPEG"))[1]
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])
    from trtfuse.data import open_dataset
    from trtfuse.models import PreprocessSpec

    with pytest.raises(UserError, match=f"{victim.name} is damaged"):
        open_dataset(str(images), PreprocessSpec(), progress=False)
    assert not list((home / "home" / "data").glob("*.npy"))  # no cache holds it


# 8 ------------------------------------------------------------------------------------------------
def test_accuracy_against_a_reference_over_other_images_is_refused(home, capsys):
    runs = {}
    for name, n in (("small", 4), ("big", 6)):
        model = str(tiny_rgb_onnx(home / "tiny.onnx"))
        data = str(jpeg_folder(home / f"images-{name}", n))
        assert cli.main(["run", "--model", model, "--dataset", data, "--backend", "onnxruntime", "--mode",
                         "accuracy", "--run-dir", f"{name}", "--quiet"]) == 0
        runs[name] = home / name
    capsys.readouterr()
    assert cli.main(["accuracy", str(runs["small"]), "--reference", str(runs["big"])]) == 2
    line = capsys.readouterr()
    assert "runs over different images (4 and 6 images)" in line.err and "PASS" not in line.out
    assert not (runs["small"] / "accuracy.json").exists()
    from trtfuse.compare_runs import compare

    rows = dict(compare([runs["small"], runs["big"]])["rows"])
    assert rows["dataset"] == ["images-small (4 images)", "images-big (6 images)"]


# 9 ------------------------------------------------------------------------------------------------
def test_a_negative_offline_target_is_refused(home, capsys):
    assert cli.main(run_args(home, "--target-qps", "-3")) == 2
    assert "Offline target QPS" in one_error_line(capsys)
    assert not (home / "runs").exists()


# 10 -----------------------------------------------------------------------------------------------
def test_an_invalid_offline_run_says_why_and_what_to_pass(home, capsys):
    from trtfuse.report import invalid_verdict

    report = {"mode": "performance", "scenario": "offline", "run_dir": "R", "settings": {"offline": {"target_qps": 0}},
              "loadgen": {"valid": False, "invalid_reasons": ["min duration not met"], "samples_per_s": 70.2},
              "harness": {"effective": {"offline_expected_qps": 33.6}}}
    line = invalid_verdict(report)
    assert "warm-up's estimate" in line and "ran 70/s" in line and line.endswith("--target-qps 105")
    assert invalid_verdict({**report, "loadgen": {"valid": True}}) is None
    assert invalid_verdict({**report, "mode": "accuracy"}) is None
    # Through the command: an INVALID run exits 1 with that line; 4 samples at once, a 60 s minimum.
    rc = cli.main(run_args(home, "--min-duration-s", "60", "--target-qps", "0.06", "--run-dir", "r"))
    assert rc == 1
    assert "error: LoadGen's result is INVALID (min duration not met)" in capsys.readouterr().err
    assert json.loads((home / "r" / "report.json").read_text())["loadgen"]["valid"] is False


# 11 -----------------------------------------------------------------------------------------------
def test_install_lines_leave_pip_nothing_to_complain_about():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    # PyTriton pins numpy < 2, and OpenCV 4.12 needs numpy 2: said in the extra, not a silent downgrade.
    assert "numpy<2" in extras["triton"] and "opencv-python-headless<4.12" in extras["triton"]
    assert any(dep.startswith("foolbox") for dep in extras["demo"])
    readme = (REPO / "README.md").read_text()
    assert "--no-deps" not in readme and 'pip install ".[models,demo]"' in readme


# 12 -----------------------------------------------------------------------------------------------
def _help(argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_help_texts_are_whole_and_say_plugins_the_same(capsys):
    from trtfuse.config import PLUGINS_HELP

    top = _help(["--help"], capsys)
    assert "``" not in top
    assert _help(["--version"], capsys).startswith("trtfuse ")
    assert "from an engine trtfuse build made." in _help(["triton", "export", "--help"], capsys)
    for command in (["run"], ["build"], ["serve"]):
        assert PLUGINS_HELP in _help([*command, "--help"], capsys), command


def test_numbers_on_charts_read_as_numbers():
    from trtfuse.compare_runs import _ms_text
    from trtfuse.plots import thousands_formatter

    assert _ms_text(14200.0) == "14,200" and _ms_text(1.4234) == "1.42" and _ms_text(0.05) == "0.05"
    fmt = thousands_formatter()
    assert [fmt(v, 0) for v in (0, 2.5, 5, 7.5, 12500)] == ["0", "2.5", "5", "7.5", "12,500"]


def test_the_cpu_fallback_note_is_said_once(monkeypatch, capsys):
    """The default run makes two backends (performance, accuracy): one note, not two."""
    from trtfuse import backends

    class NoTensorRT:
        @classmethod
        def create(cls, **options):
            raise UserError("TensorRT is not installed")

    class Cpu:
        @classmethod
        def create(cls, **options):
            return cls()

    monkeypatch.setattr(backends, "_load_class", lambda name: NoTensorRT if name == "tensorrt" else Cpu)
    monkeypatch.setattr(backends, "_NOTED", set())
    assert all(isinstance(backends.create_backend("auto"), Cpu) for _ in range(2))
    assert capsys.readouterr().err.count("using onnxruntime instead") == 1
