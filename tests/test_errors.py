"""Every bad input gives one line `error: <problem>. <fix>`, exit status 2, and no traceback."""

import subprocess
import sys

import pytest
from conftest_harness import tiny_rgb_onnx
from trtfuse.cli import main


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TRTFUSE_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def tiny(home):
    return str(tiny_rgb_onnx(home / "tiny_rgb.onnx"))


def one_line_error(capsys, argv, *words):
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def test_missing_dataset_folder(capsys, tiny, home):
    one_line_error(
        capsys, ["run", "--model", tiny, "--dataset", str(home / "nope")], "does not exist"
    )


def test_empty_dataset_folder(capsys, tiny, home):
    (home / "empty").mkdir()
    one_line_error(capsys, ["run", "--model", tiny, "--dataset", str(home / "empty")], "no images")


def test_unreadable_image(capsys, tiny, home):
    folder = home / "broken"
    folder.mkdir()
    (folder / "n01440764_0001.JPEG").write_bytes(b"not a jpeg")
    one_line_error(
        capsys, ["run", "--model", tiny, "--dataset", str(folder), "--quiet"], "n01440764_0001.JPEG"
    )


@pytest.mark.parametrize("argv", [["run", "--model", "resnet51"], ["prepare", "resnet51"]])
def test_unknown_model(capsys, home, argv):
    one_line_error(capsys, argv, "unknown model 'resnet51'", "resnet50")


def test_unknown_config_key(capsys, home):
    (home / "my.toml").write_text("[server]\ntarget_qsp = 100\n")
    one_line_error(capsys, ["run", "--config", "my.toml"], "server.target_qsp", "server.target_qps")


@pytest.mark.parametrize(
    "argv, words",
    [
        (["run", "--batch-size", "0"], "batch size 0"),
        (["run", "--batch-size", "-3"], "batch size -3"),
    ],
)
def test_impossible_batch_size(capsys, home, argv, words):
    one_line_error(capsys, argv, words)


def test_batch_larger_than_a_fixed_batch_model(capsys, home):
    import onnx

    path = tiny_rgb_onnx(home / "fixed.onnx")
    model = onnx.load(str(path))
    for value_info in (model.graph.input[0], model.graph.output[0]):
        value_info.type.tensor_type.shape.dim[0].dim_value = 2
    onnx.save(model, str(path))
    one_line_error(
        capsys,
        ["run", "--model", str(path), "--backend", "onnxruntime", "--batch-size", "8"],
        "fixed batch of 2",
        "--batch-size 2",
    )


def test_accuracy_of_a_folder_that_is_not_a_run(capsys, home):
    one_line_error(capsys, ["accuracy", str(home)], "mlperf_log_accuracy.json")


def test_the_installed_command_exits_2_without_traceback(home):
    # The real entry point, end to end: argument parsing, error printing and exit status.
    result = subprocess.run(
        [sys.executable, "-m", "trtfuse", "run", "--batch-size", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2
    assert (
        result.stderr.startswith("error: batch size 0 is impossible")
        and "Traceback" not in result.stderr
    )
