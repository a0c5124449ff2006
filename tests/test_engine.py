"""`trtfuse build` on CPU: what it hands the parser, the cache key, and its user errors."""

import json
import types

import onnx
import pytest
from test_bn_fold import toy_resnet
from test_quantize import calib_batches
from trtfuse.build_command import cli_main
from trtfuse.engine import BuildConfig, engine_key
from trtfuse.errors import UserError
from trtfuse.passes.quantize import calibrate, quantize
from trtfuse.passes.residual_conv_rewrite import PLUGIN_OP
from trtfuse.quantize_step import QDQ_FILE
from trtfuse.trt_graph import onnx_for_build, pin_int8_plugin_outputs


@pytest.fixture()
def model_dir(tmp_path):
    """A prepared-model folder holding the toy ResNet and its Q/DQ version."""
    model = toy_resnet()
    onnx.save(model, tmp_path / "model.onnx")
    (tmp_path / "model.json").write_text(json.dumps({
        "name": "toy", "onnx_path": "model.onnx", "input_name": "input", "input_shape": [3, 16, 16],
        "num_classes": 10, "label_offset": 0, "random_weights": True, "output_name": "gemm",
        "preprocess": {"mean": [0, 0, 0], "std": [1, 1, 1], "size": 16, "resize": 16, "layout": "NCHW"}}))
    qdq = quantize(model, calibrate(model, calib_batches(), progress=False), "max").model
    onnx.save(qdq, tmp_path / QDQ_FILE)
    return tmp_path


def _ops(data: bytes):
    return [n.op_type for n in onnx.load_from_string(data).graph.node]


def test_onnx_for_build_plugins_on_and_off(model_dir):
    off = _ops(onnx_for_build(model_dir, BuildConfig(plugins=False)))
    on = _ops(onnx_for_build(model_dir, BuildConfig(plugins=True)))
    assert PLUGIN_OP not in off and on.count(PLUGIN_OP) == 2
    # TensorRT 8.5 form: every weight DequantizeLinear reads a QuantizeLinear of float weights
    m = onnx.load_from_string(onnx_for_build(model_dir, BuildConfig(plugins=False)))
    int8_consts = [t.name for t in m.graph.initializer if t.data_type == onnx.TensorProto.INT8]
    assert int8_consts and all(name.endswith("zero_point") for name in int8_consts)
    assert (model_dir / "model.int8.plugins.onnx").is_file()


def test_fp32_build_uses_the_float_model_and_refuses_plugins(model_dir):
    data = onnx_for_build(model_dir, BuildConfig(precision="fp32"))
    assert "QuantizeLinear" not in _ops(data)
    with pytest.raises(UserError, match="int8"):
        onnx_for_build(model_dir, BuildConfig(precision="fp16", plugins=True))


def test_int8_without_calibrated_model_says_how(model_dir):
    (model_dir / QDQ_FILE).unlink()
    with pytest.raises(UserError, match="--calibration"):
        onnx_for_build(model_dir, BuildConfig())


def test_engine_key_covers_model_config_version_and_gpu():
    base = engine_key(b"onnx", BuildConfig(), "8.5.3.1", "H100")
    assert base == engine_key(b"onnx", BuildConfig(), "8.5.3.1", "H100")
    assert len({base, engine_key(b"other", BuildConfig(), "8.5.3.1", "H100"),
                engine_key(b"onnx", BuildConfig(plugins=True), "8.5.3.1", "H100"),
                engine_key(b"onnx", BuildConfig(batch=2048), "8.5.3.1", "H100"),
                engine_key(b"onnx", BuildConfig(), "10.0", "H100"),
                engine_key(b"onnx", BuildConfig(), "8.5.3.1", "A100")}) == 6


def test_cli_errors(tmp_path, model_dir):
    with pytest.raises(UserError, match="model.json"):
        cli_main([str(tmp_path / "nowhere")])
    with pytest.raises(UserError, match="--batch"):
        cli_main([str(model_dir), "--batch", "0"])
    with pytest.raises(UserError, match="--calibration"):
        cli_main([str(model_dir), "--quantize-only"])


def test_cli_build_without_tensorrt_is_a_user_error(model_dir):
    try:
        import tensorrt  # noqa: F401
        pytest.skip("TensorRT is installed here")
    except ImportError:
        pass
    with pytest.raises(UserError, match="TensorRT"):
        cli_main([str(model_dir), "--plugins", "off"])


def test_int8_input_graph_matches_quantizing_on_the_host():
    """Dropping the input QuantizeLinear and feeding round(x / s) as int8 computes the same function."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from trtfuse.trt_graph import int8_input_graph

    scale = np.float32(0.05)
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["input", "s", "z"], ["q"]),
         helper.make_node("DequantizeLinear", ["q", "s", "z"], ["dq"]),
         helper.make_node("Relu", ["dq"], ["out"])],
        "g",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(np.array(scale), "s"), numpy_helper.from_array(np.array(0, np.int8), "z")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    x = np.random.default_rng().normal(size=(2, 3)).astype(np.float32) * 3
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"input": x})[0]
    int8_model = int8_input_graph(onnx.ModelProto.FromString(model.SerializeToString()))
    onnx.checker.check_model(int8_model)
    assert [n.op_type for n in int8_model.graph.node] == ["DequantizeLinear", "Relu"]
    q = np.clip(np.rint(x / scale), -128, 127).astype(np.int8)
    got = ort.InferenceSession(int8_model.SerializeToString()).run(None, {"input": q})[0]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("random_weights", [True, False])
def test_auto_calibration_picks_the_method_by_held_apart_top1(model_dir, tmp_path, monkeypatch, random_weights):
    from test_cli import jpeg_folder
    from trtfuse.quantize_step import QUANT_META, quantize_model_dir

    monkeypatch.setenv("TRTFUSE_HOME", str(tmp_path / "home"))
    meta = json.loads((model_dir / "model.json").read_text())
    (model_dir / "model.json").write_text(json.dumps({**meta, "random_weights": random_weights}))
    (model_dir / QDQ_FILE).unlink()
    images = jpeg_folder(tmp_path / "calib", n=9)  # sorted index % 7 == 0 calibrates: 2 of 9, 7 held apart
    quantize_model_dir(model_dir, str(images), "auto", every=7)
    q = json.loads((model_dir / QUANT_META).read_text())
    assert (model_dir / QDQ_FILE).is_file() and q["method_asked"] == "auto"
    assert len(q["calibration_images"]) == 2
    if random_weights:  # nothing to measure: max, and no scores pretending otherwise
        assert q["chosen"] == "max" and q["top1_by_method"] is None
    else:
        scores = q["top1_by_method"]
        assert list(scores) == ["max", "percentile-99.99", "percentile-99.999", "entropy"]
        best = max(scores.values())
        assert q["chosen"] == next(label for label, v in scores.items() if v == best)  # ties: the earlier
        assert q["evaluation_images"] == 7


def test_plugins_all_adds_the_projections(model_dir, capsys, monkeypatch):
    from trtfuse.passes import residual_conv_rewrite

    # the toy's projection has 32 output channels, below the rule's 256: at the toy's width, the path runs
    monkeypatch.setattr(residual_conv_rewrite, "MIN_PROJECTION_COUT", 32)
    data = onnx_for_build(model_dir, BuildConfig(plugins="all"))
    graph = onnx.load_from_string(data).graph
    plugins = [n for n in graph.node if n.op_type == PLUGIN_OP]
    # the second tail, the first bottleneck's stride-2 projection shortcut fused with its tail (inputs: the tail's x
    # and the block input; the projection's fields as proj_*), and the stride-1 3x3 convs (the stem, the second
    # bottleneck's conv2; input x only)
    assert sorted((residual_conv_rewrite.plugin_kind(n), len(n.input)) for n in plugins) == [
        ("conv3x3", 1), ("conv3x3", 1), ("fused", 2), ("tail", 2)]
    # the fused node also computes the second bottleneck's conv1 (32 -> 8, stride 1 + ReLU): a second output
    assert sorted((residual_conv_rewrite.plugin_kind(n), len(n.output)) for n in plugins if len(n.output) > 1) == [
        ("fused", 2)]
    # (the toy has no 7x7 stem: "0 stems")
    assert "1 residual tail, 0 projections, 1 projection + tail pair (one node each), 2 3x3 convs and 0 stems; " \
           "1 next conv1 computed by the tail or stem before it" in capsys.readouterr().err
    assert (model_dir / "model.int8.plugins-all.onnx").is_file()

    # the two kept apart where the fused kernel could not hold both (MAX_FUSED_K_BYTES): x the projection's only input
    monkeypatch.setattr(residual_conv_rewrite, "MAX_FUSED_K_BYTES", 0)
    graph = onnx.load_from_string(onnx_for_build(model_dir, BuildConfig(plugins="all"))).graph
    plugins = [n for n in graph.node if n.op_type == PLUGIN_OP]
    assert sorted(len(n.input) for n in plugins) == [1, 1, 1, 2, 2]
    assert "2 residual tails, 1 projection, 0 projection + tail pairs" in capsys.readouterr().err
    # --plugins tails chains nothing
    onnx_for_build(model_dir, BuildConfig(plugins="tails"))
    assert "0 next conv1s" in capsys.readouterr().err


def test_plugin_modes_and_their_older_spellings():
    assert [BuildConfig(plugins=v).plugins for v in (False, True, "on", "off", "tails", "all")] == [
        "off", "tails", "tails", "off", "tails", "all"]
    with pytest.raises(UserError, match="off, tails, all"):
        BuildConfig(plugins="most")
    from trtfuse import config

    assert config.load(overrides={"tensorrt.plugins": True})["tensorrt"]["plugins"] == "tails"
    assert config.load()["tensorrt"]["plugins"] == "off"


def test_residual_conv_plugin_outputs_are_pinned_to_int8_and_others_left_alone():
    # a stand-in for TensorRT's network API: a chained tail (two outputs), a LayerNorm plugin, a conv
    class Layer:
        def __init__(self, type_, plugin_type, n_out):
            self.type, self.num_outputs, self.pinned = type_, n_out, {}
            self.plugin = types.SimpleNamespace(plugin_type=plugin_type)

        def set_output_type(self, j, dtype):
            self.pinned[j] = dtype

    trt = types.SimpleNamespace(int8="int8", IPluginV2Layer=Layer,
                                LayerType=types.SimpleNamespace(PLUGIN_V2="plugin", CONVOLUTION="conv"))
    layers = [Layer("plugin", PLUGIN_OP, 2), Layer("plugin", "TrtfuseLayerNorm", 1), Layer("conv", None, 1)]
    network = types.SimpleNamespace(num_layers=len(layers), get_layer=lambda i: layers[i])
    assert pin_int8_plugin_outputs(trt, network) == 2
    assert [L.pinned for L in layers] == [{0: "int8", 1: "int8"}, {}, {}]
