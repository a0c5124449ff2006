"""`trtfuse profile` / `trtfuse compare` on CPU: the profile's arithmetic, table and chart from given
layer times, and clean refusals where TensorRT is not installed."""

import importlib.util
import json

import pytest
from trtfuse import cli
from trtfuse.engine_inspect import format_profile, is_ours, plot_profile, summarize

LAYERS = {"/conv1/Conv + /relu/Relu": 1.85, "TrtfuseResidualConv_3": 0.62, "TrtfuseResidualConv_7": 0.58,
          "/layer1/layer1.0/conv2/Conv": 0.76, "Reformatting CopyNode for Input Tensor 0": 0.01,
          "/fc/Gemm": 0.18}


def test_profile_splits_ours_from_tensorrts():
    p = summarize(LAYERS, batch=2048)
    assert p["total_ms"] == pytest.approx(sum(LAYERS.values()))
    assert p["ours_ms"] == pytest.approx(1.20) and p["ours_layers"] == 2
    assert p["trt_ms"] == pytest.approx(p["total_ms"] - 1.20)
    assert [r["ms"] for r in p["layers"]] == sorted(LAYERS.values(), reverse=True)
    assert sum(r["share"] for r in p["layers"]) == pytest.approx(1.0, abs=1e-3)
    assert is_ours("TrtfuseSkipLayerNorm_0") and not is_ours("/layer4/Add")


def test_profile_table_and_chart(tmp_path):
    p = summarize(LAYERS, batch=2048)
    table = format_profile(p, top=3)
    assert "ours" in table and "(3 more layers)" in table and "trtfuse's 1.200 ms" in table
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("matplotlib is not installed")
    png = plot_profile(p, tmp_path / "profile.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


@pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None, reason="TensorRT is installed here")
@pytest.mark.parametrize("argv", [["profile", "x.engine"],
                                  ["compare", "a.engine", "b.engine", "--model", "m", "--dataset", "d"]])
def test_without_tensorrt_the_commands_say_how_to_get_it(argv, capsys):
    assert cli.main(argv) == 2
    assert "TensorRT is not installed" in capsys.readouterr().err


def test_profile_json_round_trips():
    p = summarize(LAYERS, batch=256)
    assert json.loads(json.dumps(p)) == p
