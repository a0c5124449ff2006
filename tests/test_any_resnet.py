"""Every ResNet a user brings gets the fusions its shapes allow (issue 41): torchvision's ResNet-50/101/152, Wide
ResNet and ResNeXt through the TorchScript (legacy) and dynamo exporters, and a TensorFlow-style graph (NHWC input +
Transpose, explicit Pads, v1 bottlenecks with the shortcut first in the Add, Clip(0, inf) for some ReLUs, a ReduceMean
-> Squeeze -> MatMul head, 1001 classes), as MLPerf's resnet50_v1.onnx is laid out. Random weights, small batch and
spatial size; the expected counts come from the shapes and the rewrite's rules, written out here independently."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtfuse.passes.bn_fold import fold_pad_into_conv
from trtfuse.passes.quantize import calibrate, quantize
from trtfuse.passes.residual_conv_rewrite import (
    MAX_CONV3X3_COUT,
    MAX_FUSED_K_BYTES,
    MAX_NEXT_COUT,
    MAX_NEXT_STEM_COUT,
    MAX_NEXT_TAIL_COUT,
    MAX_PROJECTION_CIN,
    MIN_PROJECTION_COUT,
    PLUGIN_OP,
    compare_logits,
    evaluate_with_reference,
    fused_k_bytes,
    node_agreement,
    plugin_counts,
    rewrite_report,
)

ALL = dict(projections=True, conv3x3=True, stem=True, chain_next=True, pool_head=True)


def expected_counts(stages: list[dict]) -> dict:
    """plugin_counts under --plugins all for a torchvision bottleneck ResNet with these stages (stage_shapes): the
    rewrite's rules applied to the shapes."""
    tails = sum(s["blocks"] for s in stages)
    projs = [s for s in stages if s["cin"] <= MAX_PROJECTION_CIN and s["cout"] >= MIN_PROJECTION_COUT]
    fused = [s for s in projs if fused_k_bytes(s["cin"], s["width"]) <= MAX_FUSED_K_BYTES]
    conv3 = sum(s["blocks"] - (s["stride"] != 1) for s in stages
                if s["groups"] == 1 and s["width"] <= MAX_CONV3X3_COUT)
    nxt = int(stages[0]["width"] <= MAX_NEXT_STEM_COUT)   # the stem chains layer1.0's conv1
    for k, s in enumerate(stages):   # a tail chains the conv1 after it (stride 1 in v1.5): the next block's
        if s["cout"] <= MAX_NEXT_TAIL_COUT:
            nxt += (s["blocks"] - 1) * (s["width"] <= MAX_NEXT_COUT)
            nxt += k + 1 < len(stages) and stages[k + 1]["width"] <= MAX_NEXT_COUT
    return {"tail": tails - len(fused), "proj": len(projs) - len(fused), "fused": len(fused), "conv3x3": conv3,
            "stem": 1, "next": nxt}


def _qdq(model, shape, seed=0):
    """The quantize step as `trtfuse build --quantize-only` runs it (Pads folded, constants inlined, BN folded where
    there is any, max calibration) on a random batch of two."""
    model, _ = fold_pad_into_conv(model)
    x = np.random.default_rng(seed).normal(size=(2, *shape)).astype(np.float32)
    return quantize(model, calibrate(model, [x], progress=False), "max").model, x


def _check_reference(qdq, out, feeds):
    """The rewrite's CPU reference equals ONNX Runtime on the Q/DQ graph to the plugin's rounding rule: node by node
    (on ORT's own int8 inputs) at most 1 LSB off and >= 99 % equal. Through the network the logits stay close: a
    1-LSB step is carried on by every later layer of a random network (Wide ResNet-50-2: one value of 270k a step
    apart, node by node, moved the logits by 6.4 % of the largest), so this only says the graph is wired right (a
    wrong input or field gives differences the size of the logits)."""
    for kind, r in node_agreement(qdq, out, feeds).items():
        assert r["max_lsb"] <= 1 and r["exact"] >= 0.99, (kind, r)
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(qdq.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(None, feeds)
    got = evaluate_with_reference(out, feeds)
    cmp = compare_logits(want[0].reshape(len(want[0]), -1), got[0].reshape(len(got[0]), -1))
    assert cmp["max_abs_logit_diff"] < 0.15 * cmp["max_abs_logit"], cmp
    return got


# ----------------------------------------------------------------------------- torchvision's ResNets
CASES = [  # (arch, dynamo exporter, input size): small spatial sizes, every stage still at least 1 x 1
    pytest.param("resnet50", False, 64, id="resnet50-legacy"),
    pytest.param("resnet50", True, 64, id="resnet50-dynamo", marks=pytest.mark.slow),
    pytest.param("resnet101", False, 32, id="resnet101-legacy", marks=pytest.mark.slow),
    pytest.param("resnet152", False, 32, id="resnet152-legacy", marks=pytest.mark.slow),
    pytest.param("wide_resnet50_2", False, 32, id="wide_resnet50_2-legacy", marks=pytest.mark.slow),
    pytest.param("resnext50_32x4d", False, 32, id="resnext50_32x4d-legacy", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("arch,dynamo,hw", CASES)
def test_torchvision_resnets_get_what_their_shapes_allow(arch, dynamo, hw):
    pytest.importorskip("torch")
    if dynamo:
        pytest.importorskip("onnxscript")
    from trtfuse.models import torchvision_resnet as tvr

    module, _ = tvr.build(arch)
    qdq, x = _qdq(tvr.export(module, hw, dynamo=dynamo), (3, hw, hw))
    feeds = {qdq.graph.input[0].name: x}
    # the dynamo exporter's opset 18 goes back to 17 (TensorRT 8.5 parses up to 17), ReduceMean's axes an attribute
    assert [o.version for o in qdq.opset_import if o.domain in ("", "ai.onnx")] == [17]
    assert all(len(n.input) == 1 for n in qdq.graph.node if n.op_type == "ReduceMean")
    stages = tvr.stage_shapes(arch)
    tails, n, report = rewrite_report(qdq)
    assert plugin_counts(tails) == {"tail": sum(s["blocks"] for s in stages), "proj": 0, "fused": 0, "conv3x3": 0,
                                    "stem": 0, "next": 0}
    assert not report.any_refused(), report.table()
    out, n, report = rewrite_report(qdq, **ALL)
    want = expected_counts(stages)
    assert plugin_counts(out) == want, report.table()
    rows = {r["kind"]: r for r in report.rows()}
    assert rows["pool"]["fused"] == 1 and rows["tail"]["fused"] == rows["tail"]["found"]
    if stages[0]["groups"] > 1:   # ResNeXt: every grouped 3x3 found and refused, with the reason
        assert rows["conv3x3"]["found"] == sum(s["blocks"] for s in stages) and rows["conv3x3"]["fused"] == 0
        assert rows["conv3x3"]["first_reason"] == "grouped conv (group 32): stays with TensorRT"
    _check_reference(qdq, out, feeds)


@pytest.mark.slow
def test_torchvision_resnet50_export_gets_what_our_export_gets():
    """torchvision's ResNet-50 as a user exports it (BN folded by the exporter, zero biases read through Identity
    nodes) gets exactly the fusions of our own export (BN kept, folded by the quantizer), under tails and all."""
    pytest.importorskip("torch")
    from trtfuse.models import resnet50
    from trtfuse.models import torchvision_resnet as tvr
    from trtfuse.models.onnx_model import export_torch

    theirs = tvr.export(tvr.build("resnet50")[0], 64)
    assert sum(n.op_type == "Identity" for n in theirs.graph.node) > 16   # the case the matchers missed
    ours = export_torch(resnet50.build()[0], (3, 64, 64))
    counts = []
    for model in (theirs, ours):
        qdq, _ = _qdq(model, (3, 64, 64))
        counts.append([plugin_counts(rewrite_report(qdq, **kw)[0]) for kw in ({}, ALL)])
    assert counts[0] == counts[1]
    assert counts[0][1] == {"tail": 14, "proj": 1, "fused": 2, "conv3x3": 3, "stem": 1, "next": 4}


def test_build_prints_the_refusal_table(tmp_path, capsys):
    """`trtfuse build --plugins all` prints, for a shape the kernel does not take, a table: kind, found, fused, the
    first refusal (node: reason). Here a 3x3 conv of 128 output channels (over MAX_CONV3X3_COUT) and a grouped one."""
    from trtfuse.engine import BuildConfig
    from trtfuse.trt_graph import onnx_for_build

    qdq, _ = _qdq(_tf_style(widths=((64, 1, 128), (128, 1, 256)), group=2), (32, 32, 3))
    onnx.save(qdq, tmp_path / "model.int8.onnx")
    onnx_for_build(tmp_path, BuildConfig(precision="int8", plugins="all"))
    err = capsys.readouterr().err
    assert "not fused" in err and "kind" in err and "first refusal" in err
    row = next(line for line in err.splitlines() if line.strip().startswith("conv3x3"))
    assert row.split()[1:3] == ["4", "0"] and "grouped conv (group 2): stays with TensorRT" in row
    _, _, report = rewrite_report(qdq, **ALL)
    (c3,) = [r for r in report.rows() if r["kind"] == "conv3x3"]
    assert c3["found"] == 4 and c3["fused"] == 0 and c3["refused"] == 4


# ----------------------------------------------------------------------------- a TensorFlow-style graph
def _tf_style(widths=((64, 1, 256), (128, 2, 512)), classes=1001, clip_stage=1, group=1, seed=0, squeeze=True):
    """MLPerf resnet50_v1.onnx's layout, small: input [N, 32, 32, 3] -> Transpose -> Pad 3 -> Conv 7x7/2 (bias) ->
    Relu -> MaxPool 3x3/2 pads [0, 0, 1, 1] (TF's SAME) -> per stage (width, stride, cout) two v1 bottlenecks (the
    stride on conv1, the 3x3 behind an explicit Pad, the shortcut first in the Add; stage ``clip_stage``'s block ReLUs
    are Clip(0, inf)) -> ReduceMean [2, 3] -> Squeeze -> MatMul + Add (``classes``) -> Softmax and ArgMax. BN already
    folded into the conv biases. ``squeeze`` False: ReduceMean with keepdims 0 instead of the Squeeze."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []

    def init(a, name):
        inits.append(numpy_helper.from_array(np.asarray(a), name))
        return name

    def node(op, inputs, name, **kw):
        nodes.append(helper.make_node(op, inputs, [name], name=name, **kw))
        return name

    def conv(x, cin, cout, k, stride, name, pad=0, groups=1):
        if pad:
            x = node("Pad", [x, init(np.array([0, 0, pad, pad, 0, 0, pad, pad], np.int64), f"{name}_pads")],
                     f"{name}_pad")
        w = rng.normal(0, (2.0 / (cin / groups * k * k)) ** 0.5, (cout, cin // groups, k, k)).astype(np.float32)
        b = rng.normal(0, 0.1, cout).astype(np.float32)
        return node("Conv", [x, init(w, f"{name}_w"), init(b, f"{name}_b")], name, kernel_shape=[k, k],
                    strides=[stride, stride], pads=[0, 0, 0, 0], group=groups)

    def relu(x, name, clip=False):
        if clip:
            return node("Clip", [x, init(np.array(0, np.float32), f"{name}_min"),
                                 init(np.array(np.inf, np.float32), f"{name}_max")], name)
        return node("Relu", [x], name)

    x = node("Transpose", ["input_tensor"], "transpose", perm=[0, 3, 1, 2])
    x = relu(conv(x, 3, 64, 7, 2, "conv0", pad=3), "relu0")
    x = node("MaxPool", [x], "pool0", kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1])
    cin = 64
    for s, (width, stride, cout) in enumerate(widths):
        for b in range(2):
            name, st = f"s{s}b{b}", stride if b == 0 else 1
            short = conv(x, cin, cout, 1, st, f"{name}_proj") if b == 0 else x
            y = relu(conv(x, cin, width, 1, st, f"{name}_c1"), f"{name}_r1")
            y = relu(conv(y, width, width, 3, 1, f"{name}_c2", pad=1, groups=group), f"{name}_r2")
            y = conv(y, width, cout, 1, 1, f"{name}_c3")
            x = relu(node("Add", [short, y], f"{name}_add"), f"{name}_out", clip=s == clip_stage)
            cin = cout
    x = node("ReduceMean", [x], "mean", axes=[2, 3], keepdims=int(squeeze))
    if squeeze:
        x = node("Squeeze", [x, init(np.array([2, 3], np.int64), "squeeze_axes")], "squeeze")
    x = node("MatMul", [x, init(rng.normal(0, 0.05, (cin, classes)).astype(np.float32), "fc_w")], "fc")
    x = node("Add", [x, init(rng.normal(0, 0.1, classes).astype(np.float32), "fc_b")], "logits")
    node("Softmax", [x], "softmax_tensor", axis=-1)
    node("ArgMax", [x], "ArgMax", axis=-1, keepdims=0)
    graph = helper.make_graph(nodes, "tf_resnet_v1", [helper.make_tensor_value_info(
        "input_tensor", TensorProto.FLOAT, ["N", 32, 32, 3])], [
        helper.make_tensor_value_info("softmax_tensor", TensorProto.FLOAT, ["N", classes]),
        helper.make_tensor_value_info("ArgMax", TensorProto.INT64, ["N"])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("squeeze", [True, False], ids=["reducemean-squeeze", "reducemean-keepdims0"])
def test_tensorflow_style_graph_gets_what_its_shapes_allow(squeeze):
    """The TF-style graph: 4 tails (2 per stage); both projections (64 -> 256 stride 1, 256 -> 512 stride 2), each
    fused with the tail reading it (K bytes 192 and 384); the two 3x3 convs of 64 channels (stage 1; 128 is over
    MAX_CONV3X3_COUT); one next conv1 (stage 1's first tail -> its second block's conv1; stage 2's conv1 is strided in
    v1, stage 2's tails have 512 channels); the stem refused for its max pool's TF padding [0, 0, 1, 1]; the
    ReduceMean head (with keepdims 0 the plugin's [N, C, 1, 1] goes through a Flatten). Clip(0, inf) block outputs
    are ReLUs to the quantizer and the matchers alike."""
    qdq, x = _qdq(_tf_style(squeeze=squeeze), (32, 32, 3))
    assert sum(n.op_type == "Clip" for n in qdq.graph.node) == 2
    assert sum(n.op_type == "Pad" for n in qdq.graph.node) == 0   # folded into the convs by the quantize step
    out, n, report = rewrite_report(qdq, **ALL)
    assert plugin_counts(out) == {"tail": 2, "proj": 0, "fused": 2, "conv3x3": 2, "stem": 0, "next": 1}
    rows = {r["kind"]: r for r in report.rows()}
    assert rows["stem"]["found"] == 1 and rows["stem"]["fused"] == 0
    assert "max pool pads [0, 0, 1, 1]" in rows["stem"]["first_reason"]
    assert rows["next"]["found"] == 3 and "stride 2" in rows["next"]["first_reason"]
    assert rows["pool"]["fused"] == 1
    assert sum(n.op_type == "Flatten" for n in out.graph.node) == (not squeeze)
    got = _check_reference(qdq, out, {"input_tensor": x})
    assert got[0].shape == (2, 1001) and got[1].shape == (2,)


def test_pad_between_dequantize_and_conv_is_folded_by_the_matchers():
    """A Q/DQ graph whose convs still read an explicit zero Pad (DQ -> Pad -> Conv, pads 0: how a Q/DQ graph from
    another quantizer may come): the matchers see the conv the Pad and the conv compute together, and the rewritten
    graph (the Pads gone with their convs) computes the same network."""
    qdq, x = _qdq(_tf_style(), (32, 32, 3))
    # move every 3x3 conv's padding back into a Pad node between its DequantizeLinear and the conv
    nodes = []
    for nd in qdq.graph.node:
        pads = next((a for a in nd.attribute if a.name == "pads"), None)
        if nd.op_type == "Conv" and pads is not None and any(pads.ints):
            p = list(pads.ints)
            qdq.graph.initializer.append(numpy_helper.from_array(
                np.array([0, 0, p[0], p[1], 0, 0, p[2], p[3]], np.int64), f"{nd.name}_explicit_pads"))
            nodes.append(helper.make_node("Pad", [nd.input[0], f"{nd.name}_explicit_pads"], [f"{nd.name}_padded"]))
            nd.input[0] = f"{nd.name}_padded"
            del pads.ints[:]
            pads.ints.extend([0, 0, 0, 0])
        nodes.append(nd)
    del qdq.graph.node[:]
    qdq.graph.node.extend(nodes)
    assert sum(n.op_type == "Pad" for n in qdq.graph.node) == 5   # the stem's and the four 3x3 convs'
    out, n, report = rewrite_report(qdq, **ALL)
    assert plugin_counts(out) == {"tail": 2, "proj": 0, "fused": 2, "conv3x3": 2, "stem": 0, "next": 1}
    # the two replaced 3x3 convs took their Pads with them; the stem (refused) and the 128-channel 3x3s keep theirs
    assert sum(n.op_type == "Pad" for n in out.graph.node) == 3
    assert sum(n.op_type == PLUGIN_OP for n in out.graph.node) == 6
    _check_reference(qdq, out, {"input_tensor": x})


# ----------------------------------------------------------------------------- the GPU benchmark's bundle
def test_benchmark_bundle_weights_travel_without_bytes_and_come_back_the_same():
    """trtfuse bench any-resnet carries each Q/DQ graph without its large initializers' bytes and refills them from a
    seed on the device: the refilled graph gets the same fusions, and two refills give the same bytes (the engine
    cache is keyed by them)."""
    from trtfuse.bench import any_resnet

    qdq, _ = _qdq(_tf_style(), (32, 32, 3))
    stripped = onnx.ModelProto.FromString(qdq.SerializeToString())
    names = any_resnet.strip_weights(stripped)
    assert names and len(stripped.SerializeToString()) < len(qdq.SerializeToString()) / 4
    a, b = (onnx.ModelProto.FromString(stripped.SerializeToString()) for _ in range(2))
    any_resnet.fill_weights(a, names)
    any_resnet.fill_weights(b, names)
    assert a.SerializeToString() == b.SerializeToString()
    onnx.checker.check_model(a)
    counts = any_resnet.fusion_counts(a)
    assert counts["all"] == any_resnet.fusion_counts(qdq)["all"]
    assert counts["tails_found"] == counts["tails_fused"] == 4
    w = {t.name: numpy_helper.to_array(t) for t in a.graph.initializer if t.name in names}
    assert all(v.dtype == np.int8 and np.abs(v).max() <= 127 for k, v in w.items() if k.endswith("_int8"))


# ----------------------------------------------------------------------------- canonical spellings
def _run(model, feeds):
    import onnxruntime as ort

    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_opset18_reduce_mean_goes_back_to_opset17_and_computes_the_same():
    from trtfuse.passes.canonical import canonicalize, to_opset17

    nodes = [helper.make_node("Constant", [], ["axes"], value=numpy_helper.from_array(np.array([2, 3], np.int64))),
             helper.make_node("ReduceMean", ["x", "axes"], ["m"], keepdims=1, noop_with_empty_axes=0),
             helper.make_node("Relu", ["m"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 1, 1])])
    m18 = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    x = {"x": np.random.default_rng(0).normal(size=(2, 3, 4, 4)).astype(np.float32)}
    for m17 in (to_opset17(m18)[0], canonicalize(m18)):
        onnx.checker.check_model(m17)
        assert m17.opset_import[0].version == 17 and [n.op_type for n in m17.graph.node] == ["ReduceMean", "Relu"]
        np.testing.assert_array_equal(_run(m17, x)[0], _run(m18, x)[0])
    # a node whose opset-18 meaning has no opset-17 spelling here keeps the model at 18, and says which
    split = helper.make_model(helper.make_graph(
        [helper.make_node("Split", ["x"], ["a", "b"], name="split", axis=1, num_outputs=2)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in "ab"]),
        opset_imports=[helper.make_opsetid("", 18)])
    same, why = to_opset17(split)
    assert same is split and why == "split: Split with num_outputs"


def test_identity_constants_and_clip_relu_are_seen_through():
    """Constants behind Identity / Constant nodes become initializers (the graph computes the same); Clip(0) and
    Clip(0, inf) are ReLUs, Clip(0, 6) is not."""
    from trtfuse.passes.canonical import inline_constants, is_relu

    w = numpy_helper.from_array(np.ones((4, 3, 1, 1), np.float32), "w")
    nodes = [helper.make_node("Identity", ["w"], ["w2"]),
             helper.make_node("Constant", [], ["b"], value=numpy_helper.from_array(np.arange(4, dtype=np.float32))),
             helper.make_node("Conv", ["x", "w2", "b"], ["y"], kernel_shape=[1, 1])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 2, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    inlined, n = inline_constants(model)
    assert n == 2 and [nd.op_type for nd in inlined.graph.node] == ["Conv"]
    assert {t.name for t in inlined.graph.initializer} == {"w2", "b"}
    x = {"x": np.random.default_rng(0).normal(size=(1, 3, 2, 2)).astype(np.float32)}
    np.testing.assert_array_equal(_run(inlined, x)[0], _run(model, x)[0])
    consts = {"zero": np.array(0, np.float32), "inf": np.array(np.inf, np.float32), "six": np.array(6, np.float32)}
    assert is_relu(helper.make_node("Relu", ["x"], ["y"]), consts.get)
    assert is_relu(helper.make_node("Clip", ["x", "zero"], ["y"]), consts.get)
    assert is_relu(helper.make_node("Clip", ["x", "zero", "inf"], ["y"]), consts.get)
    assert not is_relu(helper.make_node("Clip", ["x", "zero", "six"], ["y"]), consts.get)
    assert not is_relu(helper.make_node("Clip", ["x"], ["y"]), consts.get)
