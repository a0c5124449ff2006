"""BN folding: exact numerics against ONNX Runtime on a toy residual network, and what it leaves alone."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from trtfuse.passes.bn_fold import fold_batchnorm, fold_pad_into_conv


class GraphBuilder:
    """Tiny ONNX builder for CNN test graphs (Conv/BN/Relu/Add/Pad), random but seeded weights."""

    def __init__(self, seed=0, channels=8, size=8):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.n = [], [], 0
        self.input = helper.make_tensor_value_info(
            "input", TensorProto.FLOAT, ["N", channels, size, size]
        )

    def _name(self, kind):
        self.n += 1
        return f"{kind}{self.n}"

    def init(self, array, kind="w"):
        name = self._name(kind)
        self.inits.append(numpy_helper.from_array(np.asarray(array, np.float32), name))
        return name

    def conv(self, x, cin, cout, k=1, stride=1, bias=False, pads=None, group=1):
        w = self.init(
            self.rng.normal(0, (2.0 / (cin * k * k / group)) ** 0.5, (cout, cin // group, k, k))
        )
        inputs = [x, w] + ([self.init(self.rng.normal(0, 0.1, cout))] if bias else [])
        out = self._name("conv")
        p = k // 2 if pads is None else pads
        self.nodes.append(
            helper.make_node(
                "Conv",
                inputs,
                [out],
                name=out,
                kernel_shape=[k, k],
                strides=[stride, stride],
                pads=[p] * 4,
                group=group,
            )
        )
        return out

    def bn(self, x, c):
        params = [
            self.init(self.rng.uniform(0.5, 1.5, c)),
            self.init(self.rng.normal(0, 0.2, c)),
            self.init(self.rng.normal(0, 0.2, c)),
            self.init(self.rng.uniform(0.5, 2.0, c)),
        ]
        out = self._name("bn")
        self.nodes.append(
            helper.make_node("BatchNormalization", [x, *params], [out], name=out, epsilon=1e-5)
        )
        return out

    def op(self, op_type, *inputs, **attrs):
        out = self._name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=out, **attrs))
        return out

    def bottleneck(self, x, cin, width, cout, downsample=False, stride=1):
        y = self.op("Relu", self.bn(self.conv(x, cin, width), width))
        y = self.op("Relu", self.bn(self.conv(y, width, width, k=3, stride=stride), width))
        y = self.bn(self.conv(y, width, cout), cout)
        short = self.bn(self.conv(x, cin, cout, stride=stride), cout) if downsample else x
        return self.op("Relu", self.op("Add", y, short))

    def model(self, out, opset=17):
        graph = helper.make_graph(
            self.nodes,
            "toy",
            [self.input],
            [helper.make_tensor_value_info(out, TensorProto.FLOAT, ["N", None])],
            self.inits,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = 8  # what every ONNX Runtime reads (the onnx package's default is newer)
        onnx.checker.check_model(model)
        return model


def toy_resnet(seed=0, classes=10):
    """stem conv -> 2 bottlenecks (the first with a projection shortcut) -> pool -> fc."""
    g = GraphBuilder(seed, channels=3, size=16)
    x = g.op("Relu", g.bn(g.conv("input", 3, 16, k=3), 16))
    x = g.bottleneck(x, 16, 8, 32, downsample=True, stride=2)
    x = g.bottleneck(x, 32, 8, 32)
    x = g.op("Flatten", g.op("GlobalAveragePool", x))
    fc = g.op(
        "Gemm", x, g.init(g.rng.normal(0, 0.2, (classes, 32))), g.init(np.zeros(classes)), transB=1
    )
    return g.model(fc)


def run(model, x):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"input": x})[0]


def test_fold_matches_onnxruntime():
    model = toy_resnet()
    folded, n = fold_batchnorm(model)
    assert n == 8  # stem + 3 per bottleneck x 2 + the projection shortcut
    assert not [nd for nd in folded.graph.node if nd.op_type == "BatchNormalization"]
    x = np.random.default_rng(1).normal(size=(4, 3, 16, 16)).astype(np.float32)
    ref, got = run(model, x), run(folded, x)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    assert np.abs(got - ref).max() < 1e-3 * np.abs(ref).max()


def test_fold_keeps_bn_whose_conv_output_is_read_elsewhere():
    g = GraphBuilder()
    c = g.conv("input", 8, 8)
    out = g.op("Add", g.bn(c, 8), c)  # the conv output is also read by the Add: cannot fold
    folded, n = fold_batchnorm(g.model(out))
    assert n == 0
    assert [nd.op_type for nd in folded.graph.node].count("BatchNormalization") == 1


def test_fold_with_conv_bias_and_shared_weight():
    g = GraphBuilder()
    a = g.conv("input", 8, 8, bias=True)
    # two convs reading one weight initializer: folding one BN must not change the other conv
    w = g.nodes[0].input[1]
    other = g.op("Conv", "input", w, kernel_shape=[1, 1])
    out = g.op("Add", g.bn(a, 8), other)
    model = g.model(out)
    folded, n = fold_batchnorm(model)
    assert n == 1
    x = np.random.default_rng(2).normal(size=(2, 8, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(run(folded, x), run(model, x), rtol=1e-4, atol=1e-4)


def test_fold_pad_into_conv():
    g = GraphBuilder()
    pads = g.init(np.array([0, 0, 1, 1, 0, 0, 2, 2]), "pads")
    g.inits[-1] = numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 2, 2], np.int64), pads)
    p = g.op("Pad", "input", pads, mode="constant")
    out = g.conv(p, 8, 8, k=3, pads=0)
    model = g.model(out)
    folded, n = fold_pad_into_conv(model)
    assert n == 1 and [nd.op_type for nd in folded.graph.node] == ["Conv"]
    x = np.random.default_rng(3).normal(size=(2, 8, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(run(folded, x), run(model, x), rtol=1e-5, atol=1e-5)


def test_fold_pad_leaves_reflect_padding():
    g = GraphBuilder()
    pads = g.init(np.zeros(8), "pads")
    g.inits[-1] = numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), pads)
    out = g.conv(g.op("Pad", "input", pads, mode="reflect"), 8, 8, k=3, pads=0)
    _, n = fold_pad_into_conv(g.model(out))
    assert n == 0


if __name__ == "__main__":
    pytest.main([__file__])
