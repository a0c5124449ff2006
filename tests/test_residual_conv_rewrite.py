"""The residual-tail rewrite: what it matches, the plugin node contract, and CPU numerics."""

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_bn_fold import GraphBuilder, toy_resnet
from test_quantize import calib_batches
from trtfuse.passes.quantize import calibrate, quantize, top1_onnxruntime, weights_as_float_qdq
from trtfuse.passes.residual_conv_rewrite import (
    MAX_FUSED_K_BYTES,
    MAX_NEXT_COUT,
    MAX_NEXT_STEM_COUT,
    MAX_NEXT_TAIL_COUT,
    PLUGIN_OP,
    compare_logits,
    evaluate_with_reference,
    find_projections,
    find_tails,
    find_conv3x3,
    find_stems,
    fused_k_bytes,
    plugin_counts,
    plugin_kind,
    rewrite,
)

PLUGIN_SOURCE = Path(__file__).resolve().parent.parent / "plugins" / "residual_conv" / "residual_conv_plugin.cpp"


def _quantized(model, size=16, channels=3):
    rng = np.random.default_rng(0)
    batches = [rng.normal(size=(8, channels, size, size)).astype(np.float32) for _ in range(3)]
    return quantize(model, calibrate(model, batches, progress=False), "max").model


@pytest.fixture(scope="module")
def toy():
    return _quantized(toy_resnet())


def test_plugin_node_contract(toy):
    out, n = rewrite(toy)
    assert n == 2  # both bottlenecks, the first one with a projection shortcut
    onnx.checker.check_model(out)
    plugins = [nd for nd in out.graph.node if nd.op_type == PLUGIN_OP]
    assert len(plugins) == 2
    producer = {o: nd for nd in out.graph.node for o in nd.output}
    users = {}
    for nd in out.graph.node:
        for i in nd.input:
            users.setdefault(i, []).append(nd)
    for p in plugins:
        assert p.domain == "trtfuse"
        a = {x.name: x for x in p.attribute}
        assert set(a) == {"plugin_version", "plugin_namespace", "weights", "w_scale", "bias", "x_scale",
                          "r_scale", "out_scale", "relu", "cin", "cout", "stride"}
        assert a["stride"].i == 1
        assert a["plugin_version"].s == b"1" and a["plugin_namespace"].s == b""
        w = numpy_helper.to_array(a["weights"].t)
        assert w.shape == (a["cout"].i, a["cin"].i) and np.abs(w).max() <= 127
        assert len(a["w_scale"].floats) == len(a["bias"].floats) == a["cout"].i
        assert a["relu"].i == 1
        # int8 in, int8 out: both inputs come from QuantizeLinear, the output goes to DequantizeLinear
        assert all(producer[i].op_type in ("QuantizeLinear", PLUGIN_OP) for i in p.input)
        assert {u.op_type for u in users[p.output[0]]} <= {"DequantizeLinear", PLUGIN_OP}
        # scales are the neighbouring Q/DQ scales
        q_x = producer[p.input[0]]
        inits = {t.name: t for t in out.graph.initializer}
        assert a["x_scale"].f == pytest.approx(float(numpy_helper.to_array(inits[q_x.input[1]])))
    assert not [nd for nd in out.graph.node if nd.op_type == "Add"]  # both tails fused
    read = {i for nd in out.graph.node for i in nd.input} | {o.name for o in out.graph.output}
    assert all(any(o in read for o in nd.output) for nd in out.graph.node)  # no dead nodes left


def test_rewrite_computes_the_same_network(toy):
    out, _ = rewrite(toy)
    x = calib_batches(seed=7, n=1)[0]
    _, ref = top1_onnxruntime(toy, x, np.zeros(len(x), np.int64), progress=False)
    got = evaluate_with_reference(out, {"input": x})[0]
    cmp = compare_logits(ref, got)
    # The plugin and Q(out) round the same value; only fp32 summation order differs (1 LSB at most).
    assert cmp["top1_agreement"] >= 0.875
    assert cmp["max_abs_logit_diff"] < 0.05 * cmp["max_abs_logit"]


def test_float_weight_form_and_weight_dtypes(toy):
    a, n_a = rewrite(toy)
    b, n_b = rewrite(weights_as_float_qdq(toy), weight_dtype="int8")
    assert n_a == n_b == 2
    wa = [numpy_helper.to_array(x.t) for nd in a.graph.node if nd.op_type == PLUGIN_OP
          for x in nd.attribute if x.name == "weights"]
    wb = [numpy_helper.to_array(x.t) for nd in b.graph.node if nd.op_type == PLUGIN_OP
          for x in nd.attribute if x.name == "weights"]
    assert wa[0].dtype == np.int32 and wb[0].dtype == np.int8
    for x, y in zip(wa, wb):
        np.testing.assert_array_equal(x, y)


def _mbconv_like(swap_add=False):
    """EfficientNet-style tails (1x1 project conv + Add, no ReLU), 40 channels (not a multiple of 32)."""
    g = GraphBuilder(seed=3, channels=40, size=8)
    x = "input"
    for _ in range(2):
        y = g.op("Clip", g.conv(x, 40, 80, bias=True), g.init(np.array(0.0)), g.init(np.array(6.0)))
        y = g.op("Clip", g.conv(y, 80, 80, k=3, group=80, bias=True), g.init(np.array(0.0)), g.init(np.array(6.0)))
        y = g.conv(y, 80, 40, bias=True)
        x = g.op("Add", x, y) if swap_add else g.op("Add", y, x)
    out = g.op("Flatten", g.op("GlobalAveragePool", g.conv(x, 40, 16, bias=True)))
    return g.model(out)


@pytest.mark.parametrize("swap_add", [False, True])
def test_tails_without_relu_and_either_add_order(swap_add):
    qdq = _quantized(_mbconv_like(swap_add), size=8, channels=40)
    tails = find_tails(qdq)
    assert len(tails) == 2 and all(t.fields["relu"] == 0 for t in tails)
    assert all(t.fields["cin"] == 80 and t.fields["cout"] == 40 for t in tails)
    out, n = rewrite(qdq)
    assert n == 2
    x = np.random.default_rng(1).normal(size=(4, 40, 8, 8)).astype(np.float32)
    _, ref = top1_onnxruntime(qdq, x, np.zeros(4, np.int64), progress=False)
    got = evaluate_with_reference(out, {"input": x})[0]
    assert compare_logits(ref, got)["max_abs_logit_diff"] < 0.05 * np.abs(ref).max()


def test_strided_or_3x3_tail_is_left_alone():
    g = GraphBuilder(channels=8, size=8)
    y = g.conv("input", 8, 8, k=3)  # a 3x3 conv before the Add is not the plugin's 1x1 GEMM
    out = g.op("Relu", g.op("Add", y, "input"))
    out = g.conv(out, 8, 8)
    qdq = _quantized(g.model(out), size=8, channels=8)
    assert rewrite(qdq)[1] == 0


def test_unquantized_graph_has_no_tails():
    assert find_tails(toy_resnet()) == []


def test_plugin_fields_reproduce_the_quantized_block_output(toy):
    """Per tail, the plugin (numpy reference) on the graph's own int8 inputs gives the int8 tensor the
    Q/DQ graph computes, up to 1 LSB where fp32 summation order puts a value on a rounding edge.
    A wrong scale, bias, weight layout or input order would miss by far more."""
    import onnxruntime as ort
    from trtfuse.passes.residual_conv_rewrite import plugin_node, plugin_reference

    tails = find_tails(toy)
    probe = onnx.ModelProto.FromString(toy.SerializeToString())
    names = [n for t in tails for n in (t.x_q, t.r_q, t.q_out.output[0])]
    probe.graph.output.extend(onnx.helper.make_tensor_value_info(n, onnx.TensorProto.INT8, None) for n in names)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(probe.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    values = dict(zip(names, sess.run(names, {"input": calib_batches(seed=9, n=1)[0]})))
    for k, t in enumerate(tails):
        node = plugin_node(f"p{k}", t.x_q, t.r_q, t.q_out.output[0], t.fields)
        got = plugin_reference(values[t.x_q], values[t.r_q], node).astype(np.int16)
        want = values[t.q_out.output[0]].astype(np.int16)
        diff = np.abs(got - want)
        assert diff.max() <= 1 and (diff == 0).mean() > 0.99
        assert np.abs(want).max() > 20  # the block output really spans the int8 range


def test_projections_become_plugin_nodes_without_a_residual_input(toy, monkeypatch):
    """--plugins all without fusion (fuse=False): the first bottleneck's stride-2 projection shortcut becomes a plugin
    node with x as its only input (r_scale 0, no ReLU, stride 2), whose int8 output the tail plugin reads as its
    residual; the network still computes the same logits, and the node reproduces the Q/DQ graph's int8 projection
    output."""
    import onnxruntime as ort
    from trtfuse.passes import residual_conv_rewrite as rcr
    from trtfuse.passes.residual_conv_rewrite import plugin_node, plugin_reference

    assert find_projections(toy) == []  # 32 output channels: below MIN_PROJECTION_COUT, left to TensorRT
    monkeypatch.setattr(rcr, "MIN_PROJECTION_COUT", 32)  # the toy's width, to exercise the path
    (p,) = find_projections(toy)
    assert (p.fields["cin"], p.fields["cout"], p.fields["stride"], p.fields["relu"]) == (16, 32, 2, 0)
    out, n = rewrite(toy, projections=True, fuse=False)
    assert n == 3 and plugin_counts(out) == {"tail": 2, "proj": 1, "fused": 0, "conv3x3": 0, "stem": 0, "next": 0}
    assert plugin_counts(rewrite(toy)[0]) == {"tail": 2, "proj": 0, "fused": 0, "conv3x3": 0, "stem": 0, "next": 0}
    onnx.checker.check_model(out)
    (proj,) = [nd for nd in out.graph.node if nd.op_type == PLUGIN_OP and len(nd.input) == 1]
    a = {x.name: x for x in proj.attribute}
    assert a["r_scale"].f == 0.0 and a["relu"].i == 0 and a["stride"].i == 2
    readers = [nd for nd in out.graph.node if proj.output[0] in nd.input]
    assert any(nd.op_type == PLUGIN_OP and nd.input[1] == proj.output[0] for nd in readers)
    assert not [nd for nd in out.graph.node if nd.op_type == "Conv" and nd.output[0] == p.conv.output[0]]

    x = calib_batches(seed=7, n=1)[0]
    _, ref = top1_onnxruntime(toy, x, np.zeros(len(x), np.int64), progress=False)
    cmp = compare_logits(ref, evaluate_with_reference(out, {"input": x})[0])
    assert cmp["top1_agreement"] >= 0.875
    assert cmp["max_abs_logit_diff"] < 0.05 * cmp["max_abs_logit"]

    probe = onnx.ModelProto.FromString(toy.SerializeToString())
    names = [p.x_q, p.q_out.output[0]]
    probe.graph.output.extend(onnx.helper.make_tensor_value_info(n, onnx.TensorProto.INT8, None) for n in names)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(probe.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    xq, want = sess.run(names, {"input": x})
    got = plugin_reference(xq, None, plugin_node("p", p.x_q, None, p.q_out.output[0], p.fields))
    diff = np.abs(got.astype(np.int16) - want.astype(np.int16))
    assert got.shape == want.shape and diff.max() <= 1 and (diff == 0).mean() > 0.99


def test_wide_projections_and_conv1_stay_with_tensorrt(toy):
    # above MAX_PROJECTION_CIN input channels (here: a limit below the toy's 16) the projection is not taken
    assert len(find_projections(toy, min_cout=32)) == 1
    assert find_projections(toy, max_cin=8, min_cout=32) == []
    # a 1x1 conv followed by a ReLU (a bottleneck's conv1) is not a projection
    g = GraphBuilder(channels=8, size=8)
    y = g.op("Relu", g.conv("input", 8, 16))
    out = g.op("Flatten", g.op("GlobalAveragePool", g.conv(y, 16, 8, k=3)))
    qdq = _quantized(g.model(out), size=8, channels=8)
    assert find_projections(qdq) == []


# ----------------------------------------------------------------------------- projection + tail in one node
def _int8_values(model, names, x):
    """The int8 tensors ``names`` of the Q/DQ ``model`` on input x (ONNX Runtime, as the other checks run it)."""
    import onnxruntime as ort

    probe = onnx.ModelProto.FromString(model.SerializeToString())
    probe.graph.output.extend(onnx.helper.make_tensor_value_info(n, onnx.TensorProto.INT8, None) for n in names)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(probe.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return dict(zip(names, sess.run(names, {"input": x})))


def _assert_same_network(qdq, rewritten, x):
    """The rewritten graph (plugin references at its plugin nodes) against the Q/DQ graph in ONNX Runtime, as the
    tests above: fp32 summation order may move a block output by 1 LSB, which later layers carry on."""
    _, ref = top1_onnxruntime(qdq, x, np.zeros(len(x), np.int64), progress=False)
    got = evaluate_with_reference(rewritten, {"input": x})[0]
    cmp = compare_logits(ref, got)
    assert cmp["top1_agreement"] >= 0.875
    assert cmp["max_abs_logit_diff"] < 0.05 * cmp["max_abs_logit"]
    return got


def test_fused_k_bytes_rule():
    # the projection's K padded to 32 then to 128, the tail's to 32: ResNet-50's stage openings
    assert MAX_FUSED_K_BYTES == 512
    assert fused_k_bytes(64, 64) == 192  # layer1.0: fits
    assert fused_k_bytes(256, 128) == 384  # layer2.0: fits
    assert fused_k_bytes(512, 256) == 768  # layer3.0: two nodes
    assert fused_k_bytes(16, 8) == 160 and fused_k_bytes(40, 24) == 160  # padding of odd channel counts


def test_projection_and_its_tail_become_one_node(toy, monkeypatch):
    """--plugins all: the first bottleneck's projection (16 -> 32, stride 2) and its tail (8 -> 32) become one node
    with inputs [the tail's x_q, the block input] and the projection's fields as proj_*; it computes exactly what the
    two nodes compute (fuse=False), and the network the Q/DQ graph computes."""
    from trtfuse.passes import residual_conv_rewrite as rcr
    from trtfuse.passes.residual_conv_rewrite import plugin_node, plugin_reference

    monkeypatch.setattr(rcr, "MIN_PROJECTION_COUT", 32)  # the toy's width, to exercise the path
    (p,) = find_projections(toy)
    (t,) = [t for t in find_tails(toy) if t.r_q == p.q_out.output[0]]
    out, n = rewrite(toy, projections=True)
    assert n == 2 and plugin_counts(out) == {"tail": 1, "proj": 0, "fused": 1, "conv3x3": 0, "stem": 0, "next": 0}
    onnx.checker.check_model(out)
    (fused,) = [nd for nd in out.graph.node if nd.op_type == PLUGIN_OP and plugin_kind(nd) == "fused"]
    assert list(fused.input) == [t.x_q, p.x_q] and list(fused.output) == [t.q_out.output[0]]
    a = {x.name: x for x in fused.attribute}
    proj_fields = {"proj_weights", "proj_w_scale", "proj_bias", "proj_x_scale", "proj_out_scale", "proj_cin",
                   "proj_stride"}
    assert set(a) == {"plugin_version", "plugin_namespace", "weights", "w_scale", "bias", "x_scale", "r_scale",
                      "out_scale", "relu", "cin", "cout", "stride"} | proj_fields
    assert (a["cin"].i, a["cout"].i, a["stride"].i, a["relu"].i) == (8, 32, 1, 1)
    assert (a["proj_cin"].i, a["proj_stride"].i) == (16, 2)
    assert numpy_helper.to_array(a["proj_weights"].t).shape == (32, 16)
    np.testing.assert_array_equal(numpy_helper.to_array(a["proj_weights"].t), p.fields["weights"])
    assert a["proj_x_scale"].f == pytest.approx(p.fields["x_scale"])
    # the tail's residual scale is the projection's output scale (one QuantizeLinear), both kept
    assert a["r_scale"].f == pytest.approx(a["proj_out_scale"].f)
    # the projection's conv, its QuantizeLinear and the residual's DequantizeLinear are gone: r_q is nowhere
    assert not [nd for nd in out.graph.node if p.q_out.output[0] in list(nd.input) + list(nd.output)]
    assert not [nd for nd in out.graph.node if nd.op_type == "Conv" and nd.output[0] == p.conv.output[0]]

    x = calib_batches(seed=7, n=1)[0]
    got = _assert_same_network(toy, out, x)
    two = rewrite(toy, projections=True, fuse=False)[0]
    np.testing.assert_array_equal(got, evaluate_with_reference(two, {"input": x})[0])  # exactly the composition

    # the node alone, on the graph's own int8 tensors: the Q/DQ graph's block output (<= 1 LSB where fp32 summation
    # order puts a value on a rounding edge), and exactly the projection node then the tail node
    v = _int8_values(toy, [t.x_q, p.x_q, t.q_out.output[0]], x)
    got = plugin_reference(v[t.x_q], None, fused, xp=v[p.x_q])
    r = plugin_reference(v[p.x_q], None, plugin_node("p", p.x_q, None, "r", p.fields))
    np.testing.assert_array_equal(got, plugin_reference(v[t.x_q], r, plugin_node("t", t.x_q, "r", "o", t.fields)))
    diff = np.abs(got.astype(np.int16) - v[t.q_out.output[0]].astype(np.int16))
    assert diff.max() <= 1 and (diff == 0).mean() > 0.99


def test_fuse_false_and_the_k_limit_keep_two_nodes(toy, monkeypatch):
    from trtfuse.passes import residual_conv_rewrite as rcr

    monkeypatch.setattr(rcr, "MIN_PROJECTION_COUT", 32)
    two = {"tail": 2, "proj": 1, "fused": 0, "conv3x3": 0, "stem": 0, "next": 0}
    assert plugin_counts(rewrite(toy, projections=True, fuse=False)[0]) == two
    assert plugin_counts(rewrite(toy, fuse=True)[0]) == {"tail": 2, "proj": 0, "fused": 0, "conv3x3": 0, "stem": 0, "next": 0}  # no projections: no-op
    # the toy's pair needs 128 + 32 = 160 bytes per row: at the limit it fuses, one byte below it does not
    monkeypatch.setattr(rcr, "MAX_FUSED_K_BYTES", 160)
    assert plugin_counts(rewrite(toy, projections=True)[0])["fused"] == 1
    monkeypatch.setattr(rcr, "MAX_FUSED_K_BYTES", 159)
    assert rewrite(toy, projections=True) == (rewrite(toy, projections=True, fuse=False)[0], 3)
    assert plugin_counts(rewrite(toy, projections=True)[0]) == two


def test_a_projection_output_read_elsewhere_is_not_fused(toy, monkeypatch):
    from trtfuse.passes import residual_conv_rewrite as rcr

    monkeypatch.setattr(rcr, "MIN_PROJECTION_COUT", 32)
    (p,) = find_projections(toy)
    probe = onnx.ModelProto.FromString(toy.SerializeToString())
    probe.graph.output.append(onnx.helper.make_tensor_value_info(p.q_out.output[0], onnx.TensorProto.INT8, None))
    out, n = rewrite(probe, projections=True)
    assert n == 3 and plugin_counts(out) == {"tail": 2, "proj": 1, "fused": 0, "conv3x3": 0, "stem": 0, "next": 0}
    x = calib_batches(seed=7, n=1)[0]
    got = evaluate_with_reference(out, {"input": x})
    assert got[1].dtype == np.int8 and got[1].shape == (8, 32, 8, 8)


def _stage_opening(proj_cin, width, cout=64, size=8):
    """A stage's first block alone: its input has proj_cin channels; the projection (stride 2) and the tail (width ->
    cout) meet at the Add."""
    g = GraphBuilder(seed=5, channels=proj_cin, size=size)
    x = g.bottleneck("input", proj_cin, width, cout, downsample=True, stride=2)
    return g.model(g.op("Flatten", g.op("GlobalAveragePool", x)))


@pytest.mark.parametrize("proj_cin,width,fused", [(384, 128, True), (448, 32, False), (40, 24, True)],
                         ids=["k512-fits", "k544-too-large", "odd-channels"])
def test_fusion_follows_the_k_rule_on_real_widths(monkeypatch, proj_cin, width, fused):
    from trtfuse.passes import residual_conv_rewrite as rcr

    monkeypatch.setattr(rcr, "MIN_PROJECTION_COUT", 64)
    assert (fused_k_bytes(proj_cin, width) <= MAX_FUSED_K_BYTES) == fused
    qdq = _quantized(_stage_opening(proj_cin, width), size=8, channels=proj_cin)
    out, n = rewrite(qdq, projections=True)
    want = {"tail": 0, "proj": 0, "fused": 1, "conv3x3": 0, "stem": 0, "next": 0} if fused else {"tail": 1, "proj": 1, "fused": 0, "conv3x3": 0, "stem": 0, "next": 0}
    assert plugin_counts(out) == want and n == sum(want.values())
    x = np.random.default_rng(2).normal(size=(8, proj_cin, 8, 8)).astype(np.float32)
    got = _assert_same_network(qdq, out, x)
    np.testing.assert_array_equal(got, evaluate_with_reference(rewrite(qdq, projections=True, fuse=False)[0],
                                                               {"input": x})[0])


def test_emitted_fields_are_the_plugin_creators(toy, monkeypatch):
    """Every attribute a rewritten node carries (but the ONNX parser's plugin_version/plugin_namespace) is a field
    the TrtfuseResidualConv creator declares (TensorRT's ONNX parser passes only those)."""
    from trtfuse.passes import residual_conv_rewrite as rcr

    monkeypatch.setattr(rcr, "MIN_PROJECTION_COUT", 32)
    declared = set(re.findall(r'PluginField\("(\w+)"', PLUGIN_SOURCE.read_text()))
    assert {"weights", "proj_weights", "proj_stride"} <= declared
    out = rewrite(toy, projections=True, chain_next=True)[0]
    emitted = {a.name for nd in out.graph.node if nd.op_type == PLUGIN_OP for a in nd.attribute}
    assert {"proj_weights", "next_weights", "next_relu"} <= emitted
    assert emitted - {"plugin_version", "plugin_namespace"} <= declared


def test_conv3x3_becomes_a_plugin_node(toy, monkeypatch):
    """A stride-1 3x3 conv + ReLU quantized on its own becomes a kernel_size 3 node with one input (the stem's and
    the second bottleneck's here; the first bottleneck's is strided), writing the int8 tensor its QuantizeLinear
    wrote (within 1 LSB: ONNX Runtime sums in fp32), and the network still computes the same."""
    from trtfuse.passes import residual_conv_rewrite as rcr

    found = find_conv3x3(toy, max_cout=64)
    assert [c.fields["cin"] for c in found] == [3, 8]
    monkeypatch.setattr(rcr, "MAX_CONV3X3_COUT", 0)
    assert find_conv3x3(toy) == [] and plugin_counts(rewrite(toy, conv3x3=True)[0])["conv3x3"] == 0
    monkeypatch.setattr(rcr, "MAX_CONV3X3_COUT", 64)
    out, n = rewrite(toy, conv3x3=True)
    assert plugin_counts(out) == {"tail": 2, "proj": 0, "fused": 0, "conv3x3": 2, "stem": 0, "next": 0} and n == 4
    nodes = [nd for nd in out.graph.node if nd.op_type == PLUGIN_OP and plugin_kind(nd) == "conv3x3"]
    for nd, c in zip(nodes, found):
        a = {at.name: at for at in nd.attribute}
        assert len(nd.input) == 1 and a["kernel_size"].i == 3 and a["r_scale"].f == 0 and a["relu"].i == 1
        assert numpy_helper.to_array(a["weights"].t).size == 9 * c.fields["cin"] * c.fields["cout"]
    x = np.random.default_rng(3).normal(size=(8, 3, 16, 16)).astype(np.float32)
    names = [nd.output[0] for nd in nodes]
    want = _int8_values(toy, names, x)
    from trtfuse.passes.residual_conv_rewrite import plugin_reference

    ins = _int8_values(toy, [nd.input[0] for nd in nodes], x)
    for nd in nodes:
        got = plugin_reference(ins[nd.input[0]], None, nd)
        diff = np.abs(got.astype(np.int16) - want[nd.output[0]].astype(np.int16))
        assert diff.max() <= 1 and (diff == 0).mean() > 0.99
    _assert_same_network(toy, out, x)


def _stem_net(pool_pads=1, pool_after_relu=True, width=8):
    """ResNet's stem (7x7/2 conv + BN + ReLU + 3x3/2 max pool) on a 32 x 32 input, then a bottleneck (its conv1 16 ->
    ``width``, reading the pooled output as its downsample does) and a classifier."""
    g = GraphBuilder(seed=4, channels=3, size=32)
    x = g.op("Relu", g.bn(g.conv("input", 3, 16, k=7, stride=2), 16))
    if pool_after_relu:
        x = g.op("MaxPool", x, kernel_shape=[3, 3], strides=[2, 2], pads=[pool_pads] * 4)
    x = g.bottleneck(x, 16, width, 32, downsample=True)
    out = g.op("Gemm", g.op("Flatten", g.op("GlobalAveragePool", x)), g.init(g.rng.normal(0, 0.2, (10, 32))),
               g.init(np.zeros(10)), transB=1)
    return g.model(out)


def test_stem_becomes_a_plugin_node():
    """The stem becomes one kernel_size 7 node reading the quantized network input and writing the int8 tensor the
    max pool's QuantizeLinear wrote (within 1 LSB: ONNX Runtime sums in fp32); the network computes the same. A max
    pool of another shape, or a conv without one, stays with TensorRT."""
    from trtfuse.passes.residual_conv_rewrite import plugin_reference

    qdq = _quantized(_stem_net(), size=32)
    assert find_stems(_quantized(_stem_net(pool_pads=0), size=32)) == []
    assert find_stems(_quantized(_stem_net(pool_after_relu=False), size=32)) == []
    (stem,) = find_stems(qdq)
    assert stem.fields["cin"] == 3 and stem.fields["cout"] == 16 and stem.fields["kernel_size"] == 7
    assert plugin_counts(rewrite(qdq)[0])["stem"] == 0  # only when asked
    out, n = rewrite(qdq, stem=True)
    assert plugin_counts(out) == {"tail": 1, "proj": 0, "fused": 0, "conv3x3": 0, "stem": 1, "next": 0} and n == 2
    (nd,) = [nd for nd in out.graph.node if nd.op_type == PLUGIN_OP and plugin_kind(nd) == "stem"]
    a = {at.name: at for at in nd.attribute}
    assert len(nd.input) == 1 and a["kernel_size"].i == 7 and a["stride"].i == 2 and a["relu"].i == 1
    assert numpy_helper.to_array(a["weights"].t).size == 49 * 3 * 16
    assert not [m for m in out.graph.node if m.op_type == "MaxPool"]
    x = np.random.default_rng(5).normal(size=(4, 3, 32, 32)).astype(np.float32)
    vals = _int8_values(qdq, [nd.input[0], nd.output[0]], x)
    got = plugin_reference(vals[nd.input[0]], None, nd)
    assert got.shape == (4, 16, 8, 8)
    diff = np.abs(got.astype(np.int16) - vals[nd.output[0]].astype(np.int16))
    assert diff.max() <= 1 and (diff == 0).mean() > 0.99
    _assert_same_network(qdq, out, x)


def test_stem_chains_the_next_conv1():
    """With stem and chain_next the stem's node also computes the bottleneck's conv1 (16 -> 8, 1x1 + ReLU) that reads
    its pooled output (as layer1.0's conv1 reads ResNet-50's): a second output, Q(conv1)'s int8 tensor, and the conv1's
    fields as next_*; the conv1, its ReLU and its QuantizeLinear go, the downsample keeps reading output 0. The second
    output is the 1x1 reference of the first (within 1 LSB of ONNX Runtime's on the graph's own int8 tensors, which
    sums in fp32) and the network computes the same."""
    from trtfuse.passes.residual_conv_rewrite import next_reference, plugin_reference

    assert MAX_NEXT_STEM_COUT == 64
    qdq = _quantized(_stem_net(), size=32)
    assert plugin_counts(rewrite(qdq, stem=True)[0])["next"] == 0   # only when asked
    assert plugin_counts(rewrite(qdq, chain_next=True)[0])["next"] == 0   # only a replaced stem chains
    out, n = rewrite(qdq, stem=True, chain_next=True)
    onnx.checker.check_model(out)
    assert n == 2 and plugin_counts(out) == {"tail": 1, "proj": 0, "fused": 0, "conv3x3": 0, "stem": 1, "next": 1}
    (nd,) = [m for m in out.graph.node if m.op_type == PLUGIN_OP and plugin_kind(m) == "stem"]
    assert len(nd.input) == 1 and len(nd.output) == 2
    a = {at.name: at for at in nd.attribute}
    assert {k for k in a if k.startswith("next_")} == {"next_weights", "next_w_scale", "next_bias", "next_x_scale",
                                                      "next_out_scale", "next_cout", "next_relu"}
    assert (a["kernel_size"].i, a["cout"].i, a["next_cout"].i, a["next_relu"].i) == (7, 16, 8, 1)
    assert numpy_helper.to_array(a["next_weights"].t).shape == (8, 16)   # [next_cout][the stem's cout]
    assert a["next_x_scale"].f == a["out_scale"].f   # the conv1 reads the pooled int8 output at its own scale
    # the conv1 is gone: what stays are the downsample (reading output 0) and the 3x3 conv2 (reading output 1)
    convs = [m for m in out.graph.node if m.op_type == "Conv"]
    assert sorted(_attr_ints(m, "kernel_shape") for m in convs) == [[1, 1], [3, 3]]
    producer = {o: m for m in out.graph.node for o in m.output}
    reads = {tuple(_attr_ints(m, "kernel_shape")): producer[m.input[0]] for m in convs}   # each through its DQ
    assert all(dq.op_type == "DequantizeLinear" for dq in reads.values())
    assert reads[(1, 1)].input[0] == nd.output[0] and reads[(3, 3)].input[0] == nd.output[1]
    # the rewritten stem node exactly as the references compute it, both outputs against the original graph
    x = np.random.default_rng(6).normal(size=(4, 3, 32, 32)).astype(np.float32)
    want = _int8_values(qdq, [nd.input[0], *nd.output], x)
    got0 = plugin_reference(want[nd.input[0]], None, nd)
    got1 = next_reference(want[nd.output[0]], nd)
    assert got1.shape == (4, 8, 8, 8) and got1.max() > 0
    for got, name in ((got0, nd.output[0]), (got1, nd.output[1])):
        diff = np.abs(got.astype(np.int16) - want[name].astype(np.int16))
        assert diff.max() <= 1 and (diff == 0).mean() > 0.99, name
    # evaluate_with_reference computes output 1 from its own output 0 (the stem's reference, then the 1x1's)
    _assert_same_network(qdq, out, x)


def _attr_ints(node, name):
    return next(list(a.ints) for a in node.attribute if a.name == name)


@pytest.mark.parametrize("width,chained", [(64, True), (72, False)], ids=["conv1-64", "conv1-72"])
def test_stem_chains_a_conv1_of_at_most_64_channels(width, chained):
    """The stem kernel's N tile (MAX_NEXT_STEM_COUT, 64): a conv1 of 64 output channels reading the pooled output is
    chained, one of 72 is not (the stem is replaced as before and the conv1 stays, with the same result)."""
    qdq = _quantized(_stem_net(width=width), size=32)
    out, n = rewrite(qdq, stem=True, chain_next=True)
    assert n == 2 and plugin_counts(out)["next"] == int(chained)
    (nd,) = [m for m in out.graph.node if m.op_type == PLUGIN_OP and plugin_kind(m) == "stem"]
    assert len(nd.output) == (2 if chained else 1)
    if not chained:
        assert out == rewrite(qdq, stem=True)[0]
    assert len([m for m in out.graph.node if m.op_type == "Conv"]) == (2 if chained else 3)
    x = np.random.default_rng(7).normal(size=(4, 3, 32, 32)).astype(np.float32)
    _assert_same_network(qdq, out, x)


@pytest.mark.slow
def test_resnet50_fuses_layer1_and_layer2_openings(tmp_path):
    """The real network (random weights; ~15 s): with --plugins all its 16 tails and 3 replaced projections become 14
    tails, layer3.0's projection alone, and layer1.0 + layer2.0 as fused nodes; the fused graph computes exactly what
    the unfused one computes. The three layer1 tails (256 channels) chain the next conv1: layer1.1's, layer1.2's (64)
    and layer2.0's (128, stride 1 in torchvision's v1.5); the stem chains layer1.0's (64 -> 64)."""
    pytest.importorskip("torch")
    from trtfuse.models import prepare
    from trtfuse.passes.bn_fold import fold_pad_into_conv

    pm = prepare("resnet50", tmp_path / "resnet50")
    fp32, _ = fold_pad_into_conv(onnx.load(pm.onnx_path))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 3, 224, 224)).astype(np.float32)
    qdq = quantize(fp32, calibrate(fp32, [x], progress=False), "max").model
    out, n = rewrite(qdq, projections=True)
    assert n == 17 and plugin_counts(out) == {"tail": 14, "proj": 1, "fused": 2, "conv3x3": 0, "stem": 0, "next": 0}
    fused = [{a.name: a.i for a in nd.attribute if a.name in ("cin", "proj_cin", "proj_stride")}
             for nd in out.graph.node if nd.op_type == PLUGIN_OP and plugin_kind(nd) == "fused"]
    assert fused == [{"cin": 64, "proj_cin": 64, "proj_stride": 1}, {"cin": 128, "proj_cin": 256, "proj_stride": 2}]
    two, n_two = rewrite(qdq, projections=True, fuse=False)
    assert n_two == 19 and plugin_counts(two) == {"tail": 16, "proj": 3, "fused": 0, "conv3x3": 0, "stem": 0, "next": 0}
    np.testing.assert_array_equal(evaluate_with_reference(out, {pm.input_name: x})[0],
                                  evaluate_with_reference(two, {pm.input_name: x})[0])
    # --plugins all also takes the 3x3 convs of Cout 64 (MAX_CONV3X3_COUT), layer1's three conv2, and the stem
    every, n_every = rewrite(qdq, projections=True, conv3x3=True, stem=True, chain_next=True)
    assert n_every == 21 and plugin_counts(every) == {"tail": 14, "proj": 1, "fused": 2, "conv3x3": 3, "stem": 1,
                                                      "next": 4}
    chained = [(plugin_kind(nd), {a.name: a.i for a in nd.attribute}) for nd in every.graph.node
               if nd.op_type == PLUGIN_OP and len(nd.output) == 2]
    assert [(kind, a["cout"], a["next_cout"]) for kind, a in chained] == [("stem", 64, 64), ("fused", 256, 64),
                                                                        ("tail", 256, 64), ("tail", 256, 128)]
    # layer1.0's, layer1.1's and layer1.2's conv2 (3x3 nodes) read the first three chained outputs directly; layer2.0's
    # stride-2 conv2 (TensorRT's) reads the fourth through a DequantizeLinear
    second = [nd.output[1] for nd in every.graph.node if nd.op_type == PLUGIN_OP and len(nd.output) == 2]
    readers = [[plugin_kind(r) if r.op_type == PLUGIN_OP else r.op_type for r in every.graph.node if o in r.input]
               for o in second]
    assert readers == [["conv3x3"], ["conv3x3"], ["conv3x3"], ["DequantizeLinear"]]
    # the stem's output 0 goes to layer1.0's fused node only (as its xp: the downsample's input), no conv1 left on it
    (stem,) = [nd for nd in every.graph.node if nd.op_type == PLUGIN_OP and plugin_kind(nd) == "stem"]
    assert [plugin_kind(r) for r in every.graph.node if stem.output[0] in r.input] == ["fused"]
    cmp = compare_logits(evaluate_with_reference(out, {pm.input_name: x})[0],
                         evaluate_with_reference(every, {pm.input_name: x})[0])
    assert cmp["max_abs_logit_diff"] < 0.05 * cmp["max_abs_logit"]


# ----------------------------------------------------------------------------- a tail that computes the next conv1
def _tail_then_conv1(cin=40, cout=64, next_cout=48, stride=1, relu=True, shared_dq=False, seed=0):
    """A hand-made Q/DQ graph: a tail (1x1 conv + bias + residual Add + ReLU, quantized: out_q) whose int8 output the
    next conv1 (1x1 + bias (+ ReLU), quantized: "c1_q") reads through its own DequantizeLinear (``shared_dq``: the one
    the graph output "out" reads). Every scale is a power of two and every bias a multiple of its channel's x_scale *
    w_scale, so each float value is exact and ONNX Runtime rounds what the plugin's rule rounds: the rewritten graph
    must give the same bytes. Returns (model, the conv1's int8 weights, w_scale, bias, its out_scale)."""
    rng = np.random.default_rng(seed)
    sx, sr, so, s1 = 2.0**-3, 2.0**-2, 2.0**-1, 2.0**-2
    inits, nodes = [], []

    def init(name, a):
        inits.append(numpy_helper.from_array(np.asarray(a), name))
        return name

    def node(op, inputs, out, **kw):
        nodes.append(helper.make_node(op, inputs, [out], **kw))
        return out

    zp = init("zp", np.array(0, np.int8))

    def qdq(x, scale, name):   # Q then DQ (per tensor, zero point 0)
        q = node("QuantizeLinear", [x, init(name + "_s", np.float32(scale)), zp], name + "_q")
        return q, node("DequantizeLinear", [q, name + "_s", zp], name + "_dq")

    def conv(x, ci, co, name, in_scale, strides=1):   # per-channel int8 weights behind a DequantizeLinear, axis 0
        w = rng.integers(-127, 128, (co, ci, 1, 1)).astype(np.int8)
        ws = (2.0 ** -rng.integers(6, 9, co)).astype(np.float32)
        b = (rng.integers(-1000, 1000, co) * in_scale * ws).astype(np.float32)
        wd = node("DequantizeLinear", [init(name + "_w", w), init(name + "_ws", ws),
                                       init(name + "_wz", np.zeros(co, np.int8))], name + "_wdq", axis=0)
        y = node("Conv", [x, wd, init(name + "_b", b)], name, kernel_shape=[1, 1], strides=[strides, strides])
        return y, w.reshape(co, ci), ws, b

    _, xd = qdq("x", sx, "x")
    _, rd = qdq("r", sr, "r")
    y, *_ = conv(xd, cin, cout, "tail_conv", sx)
    out_q, out_dq = qdq(node("Relu", [node("Add", [y, rd], "add")], "tail_relu"), so, "out")
    c1_in = out_dq if shared_dq else node("DequantizeLinear", [out_q, "out_s", zp], "c1_in")
    c1, w1, ws1, b1 = conv(c1_in, cout, next_cout, "conv1", so, stride)
    c1_q, c1_dq = qdq(node("Relu", [c1], "conv1_relu") if relu else c1, s1, "c1")
    h = 6
    graph = helper.make_graph(
        nodes, "tail_then_conv1",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, cin, h, h]),
         helper.make_tensor_value_info("r", TensorProto.FLOAT, [None, cout, h, h])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, ["N", None, None, None]) for o in (out_dq, c1_dq)],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model, w1, ws1, b1, s1


def _int8_feeds(model, n=3, seed=1):
    """Random int8 values for the graph's inputs x and r, as floats their QuantizeLinear gives back exactly."""
    rng = np.random.default_rng(seed)
    scales = {"x": 2.0**-3, "r": 2.0**-2}
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    return {k: (rng.integers(-128, 128, (n, *shapes[k][1:])) * scales[k]).astype(np.float32) for k in ("x", "r")}


def _run_ort(model, feeds):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


@pytest.mark.parametrize("shared_dq", [False, True], ids=["own-dq", "shared-dq"])
def test_tail_chains_the_next_conv1(shared_dq):
    """With chain_next the tail's node gets a second output, the conv1's int8 output (Q(c1)'s name), and the conv1's
    fields as next_*; the conv1, its ReLU and its QuantizeLinear go (its DequantizeLinear too, unless the graph output
    reads it), and the rewritten graph computes byte for byte what ONNX Runtime computes on the original."""
    qdq, w1, ws1, b1, s1 = _tail_then_conv1(shared_dq=shared_dq)
    assert plugin_counts(rewrite(qdq)[0]) == {"tail": 1, "proj": 0, "fused": 0, "conv3x3": 0, "stem": 0, "next": 0}
    out, n = rewrite(qdq, chain_next=True)
    onnx.checker.check_model(out)
    assert n == 1 and plugin_counts(out) == {"tail": 1, "proj": 0, "fused": 0, "conv3x3": 0, "stem": 0, "next": 1}
    (nd,) = [m for m in out.graph.node if m.op_type == PLUGIN_OP]
    assert list(nd.input) == ["x_q", "r_q"] and list(nd.output) == ["out_q", "c1_q"]
    a = {at.name: at for at in nd.attribute}
    assert {k for k in a if k.startswith("next_")} == {"next_weights", "next_w_scale", "next_bias", "next_x_scale",
                                                      "next_out_scale", "next_cout", "next_relu"}
    nw = numpy_helper.to_array(a["next_weights"].t)
    assert nw.dtype == np.int32 and nw.shape == (48, 64)   # the rewrite's weight_dtype, [next_cout][cout]
    np.testing.assert_array_equal(nw, w1)
    np.testing.assert_array_equal(np.float32(a["next_w_scale"].floats), ws1)
    np.testing.assert_array_equal(np.float32(a["next_bias"].floats), b1)
    assert (a["next_x_scale"].f, a["next_out_scale"].f) == (a["out_scale"].f, s1)   # the DQ's scale is out_q's
    assert (a["next_cout"].i, a["next_relu"].i, a["cout"].i) == (48, 1, 64)
    kept = {m.name or m.output[0] for m in out.graph.node}
    assert not kept & {"conv1", "conv1_relu"} and not [m for m in out.graph.node if m.op_type == "Relu"]
    assert [m.op_type for m in out.graph.node if "c1_q" in m.output] == [PLUGIN_OP]
    # out_q's readers: the graph output's DequantizeLinear only (the conv1's own went with it)
    assert [m.output[0] for m in out.graph.node if "out_q" in m.input] == ["out_dq"]
    i8 = rewrite(qdq, weight_dtype="int8", chain_next=True)[0]
    assert numpy_helper.to_array(next(at.t for m in i8.graph.node if m.op_type == PLUGIN_OP
                                      for at in m.attribute if at.name == "next_weights")).dtype == np.int8

    feeds = _int8_feeds(qdq)
    want = _run_ort(qdq, feeds)
    got = evaluate_with_reference(out, feeds)
    assert np.abs(want[1]).max() > 10 * s1 and (want[1] == 0).mean() < 0.9   # conv1 outputs span the int8 range
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_next_output_is_the_1x1_reference_of_the_first():
    """evaluate_with_reference computes the second output as the library's 1x1 reference (r_scale 0, relu 1, stride
    1) of the first: exactly the plugin node a conv1 of these fields would be."""
    from trtfuse.passes.residual_conv_rewrite import next_reference, plugin_node, plugin_reference

    qdq, w1, ws1, b1, s1 = _tail_then_conv1(seed=3)
    out, _ = rewrite(qdq, chain_next=True)
    (nd,) = [m for m in out.graph.node if m.op_type == PLUGIN_OP]
    a = {at.name: at for at in nd.attribute}
    y = np.random.default_rng(4).integers(-128, 128, (2, 64, 5, 7)).astype(np.int8)
    conv1 = plugin_node("c1", "y", None, "c1_q", dict(weights=w1, w_scale=ws1, bias=b1, x_scale=a["out_scale"].f,
                                                      out_scale=s1, cin=64, cout=48, r_scale=0.0, relu=1))
    want = plugin_reference(y, None, conv1)
    got = next_reference(y, nd)
    assert got.dtype == np.int8 and got.shape == (2, 48, 5, 7) and want.min() == 0 and want.max() > 0
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("kw", [dict(cin=16, cout=512, next_cout=16), dict(stride=2), dict(relu=False),
                                dict(next_cout=136)], ids=["tail-cout-512", "conv1-stride-2", "no-relu",
                                                           "next-cout-136"])
def test_what_does_not_chain_is_left_alone(kw):
    """A tail wider than the kernel's N tile (MAX_NEXT_TAIL_COUT), a strided conv1, one without a ReLU or with more
    than MAX_NEXT_COUT output channels: the tail is replaced as before and the conv1 stays, with the same result."""
    assert (MAX_NEXT_TAIL_COUT, MAX_NEXT_COUT) == (256, 128)
    qdq, *_ = _tail_then_conv1(**kw)
    out, n = rewrite(qdq, chain_next=True)
    assert n == 1 and plugin_counts(out)["next"] == 0
    assert out == rewrite(qdq)[0]
    assert len([m for m in out.graph.node if m.op_type == "Conv"]) == 1   # the conv1
    feeds = _int8_feeds(qdq)
    for g, w in zip(evaluate_with_reference(out, feeds), _run_ort(qdq, feeds)):
        np.testing.assert_array_equal(g, w)


def test_a_fused_node_chains_the_next_conv1_too(toy, monkeypatch):
    """The toy's first block as one projection + tail node also computes the second block's conv1 (32 -> 8): its
    second output is that conv1's int8 tensor (within 1 LSB of ONNX Runtime's on the graph's own int8 tensors, which
    sums in fp32), the network computes the same, and a 3x3 node (conv3x3) reads the chained output."""
    from trtfuse.passes import residual_conv_rewrite as rcr
    from trtfuse.passes.residual_conv_rewrite import next_reference

    monkeypatch.setattr(rcr, "MIN_PROJECTION_COUT", 32)
    monkeypatch.setattr(rcr, "MAX_CONV3X3_COUT", 64)
    out, n = rewrite(toy, projections=True, conv3x3=True, chain_next=True)
    assert n == 4 and plugin_counts(out) == {"tail": 1, "proj": 0, "fused": 1, "conv3x3": 2, "stem": 0, "next": 1}
    onnx.checker.check_model(out)
    (fused,) = [nd for nd in out.graph.node if nd.op_type == PLUGIN_OP and plugin_kind(nd) == "fused"]
    assert len(fused.output) == 2
    readers = [nd for nd in out.graph.node if fused.output[1] in nd.input]
    assert [plugin_kind(nd) for nd in readers] == ["conv3x3"]
    x = calib_batches(seed=7, n=1)[0]
    v = _int8_values(toy, list(fused.output), x)
    diff = np.abs(next_reference(v[fused.output[0]], fused).astype(np.int16) - v[fused.output[1]].astype(np.int16))
    assert diff.max() <= 1 and (diff == 0).mean() > 0.99
    _assert_same_network(toy, out, x)
