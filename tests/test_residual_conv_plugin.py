"""TrtfuseResidualConv inside TensorRT: one small layer, exact against the rounding rule, and a serialize round trip.

Needs TensorRT's Python API, cuda-python, a GPU and libtrtfuse_plugins.so (`trtfuse plugins build --tensorrt-root`).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.tensorrt

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def side():
    spec = importlib.util.spec_from_file_location(
        "residual_conv_trt", ROOT / "benchmarks" / "residual_conv_trt.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.load_plugin_library()
    return mod


@pytest.mark.parametrize(
    "relu,residual,stride",
    [(True, True, 1), (False, True, 1), (False, False, 1), (False, False, 2), (True, False, 2)],
    ids=["tail", "tail-identity", "projection", "projection-stride2", "conv1-relu-stride2"],
)
def test_plugin_engine_exact_and_round_trip(side, relu, residual, stride):
    stream = side.ck(side.cudart.cudaStreamCreate())
    res = side.plugin_round_trip_check(np.random.default_rng(), stream, relu, residual, stride)
    assert res["built"]["diff_1lsb"] == 0 and res["built"]["diff_more"] == 0
    assert res["round_trip"]["diff_1lsb"] == 0 and res["round_trip"]["diff_more"] == 0
    assert any("PluginV2" in line or "residual_conv" in line for line in res["layers"]), res[
        "layers"
    ]


def test_creator_refuses_bad_fields(side):
    import tensorrt as trt
    from trtfuse.ops import residual_conv_reference as ref

    L = ref.random_layer(np.random.default_rng(), 64, 32)
    creator = side.plugin_creator()
    names = {f.name for f in creator.field_names}
    assert names == {
        "weights",
        "w_scale",
        "bias",
        "x_scale",
        "r_scale",
        "out_scale",
        "relu",
        "cin",
        "cout",
        "stride",
    }
    assert side.create_plugin("ok", L, 64, 32) is not None
    bad = dict(L, out_scale=-1.0)
    assert side.create_plugin("bad", bad, 64, 32) is None
    assert (
        side.create_plugin("bad", L, 64, 33) is None
    )  # weights size != cin * cout
    assert side.create_plugin("bad", dict(L, stride=3), 64, 32) is None
    assert side.create_plugin("projection", dict(L, r_scale=0.0, stride=2), 64, 32) is not None
    del trt
