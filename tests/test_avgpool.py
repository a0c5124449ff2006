"""The int8 global average pool (plugins/avgpool, TrtfuseAvgPool version 3: two int8 outputs, hi on the input's scale
s and lo on s / 256, that carry the mean to 1/256 LSB; a DequantizeLinear after each and their Add): the rule (m, the
nearest integer to 256 * sum / hw, ties to even, and its split into hi and lo; the numpy reference and the kernel's
own functions on the host against exact fractions), the rewrite of DequantizeLinear + GlobalAveragePool into
TrtfuseAvgPool -> 2 DequantizeLinear -> Add and what it does to a network's logits (CPU), the plugin's creator,
outputs, formats and serialization compiled against both TensorRT header sets (host, `slow`), the kernel against its
reference bit for bit (GPU, `-m gpu`), and the plugin in TensorRT engines (`-m tensorrt`): one node through the
network API, and the head's Q/DQ pattern through the ONNX parser as src/trtfuse/engine.py builds it."""

from __future__ import annotations

import ctypes
import re
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from test_residual_conv import Cuda, _kernels_lib
from trtfuse.ops.avgpool import M_MAX, M_MIN, avgpool_reference, join_hi_lo, round_mean256, split_hi_lo

ERR_NULL, ERR_SHAPE, ERR_ALIGN = -1, -2, -6
ROOT = Path(__file__).resolve().parent.parent
PLUGIN_SOURCE = ROOT / "plugins" / "avgpool" / "avgpool_plugin.cpp"
HOST_CHECK = ROOT / "tests" / "avgpool_plugin_host.cpp"
# m's ties: 256 * sum / hw = k + 1/2 exactly, i.e. sum = (2 k + 1) hw / 512, which needs hw divisible by 512 (none at
# ResNet-50's hw = 49). (k, what the rule makes of k + 1/2): the even neighbour, around 0, across hi's boundaries
# (m = 128 is hi 1, lo -128; m = -128 is hi 0, lo -128) and at both ends of m's range.
TIES = [(0, 0), (1, 2), (-1, 0), (-2, -2), (127, 128), (128, 128), (-129, -128), (-128, -128), (-32768, -32768),
        (32511, 32512)]


def rule(v: int, hw: int) -> int:
    """m by exact fractions: Python's round of a Fraction is half to even."""
    return round(Fraction(256 * v, hw))


def fill_sums(sums, hw: int) -> np.ndarray:
    """int8 [len(sums), hw] whose rows sum to ``sums`` (each in [-128 hw, 127 hw]): floor(S / hw) everywhere, one more
    on the first S mod hw positions."""
    rows = []
    for v in sums:
        q, r = divmod(int(v), hw)
        row = np.full(hw, q, np.int64)
        row[:r] += 1
        rows.append(row)
    out = np.array(rows)
    assert out.min() >= -128 and out.max() <= 127 and (out.sum(axis=1) == np.asarray(sums)).all()
    return out.astype(np.int8)


def with_ties(x: np.ndarray) -> np.ndarray:
    """x int8 [n, c, h, w] with, where hw is a multiple of 512, image 0's first len(TIES) channels summing to TIES'
    half-way cases; and the extremes of a sum: the next channel all 127, the last channel of the last image all -128."""
    x = x.copy()
    n, c, h, w = x.shape
    hw = h * w
    if hw % 512 == 0:
        k = min(len(TIES), c)
        x[0, :k] = fill_sums([(2 * t + 1) * hw // 512 for t, _ in TIES[:k]], hw).reshape(k, h, w)
    x[0, min(len(TIES), c - 1)] = 127
    x[-1, -1] = -128
    return x


def pooled_m(x: np.ndarray) -> np.ndarray:
    """m of x int8 [n, c, h, w] through the reference's two outputs: 256 hi + lo, int64 [n, c]."""
    hi, lo = avgpool_reference(x)
    return join_hi_lo(hi, lo).reshape(x.shape[:2])


def pool_head_graph(n=4, c=40, h=7, w=7, classes=10, scale=0.0213, seed=0, zero_point: np.ndarray | None = None):
    """(model, fc weights [classes, c], fc bias) of a network head in ResNet-50's Q/DQ form:
    x float [n, c, h, w] -> QuantizeLinear(s, zp) -> DequantizeLinear(s, zp) -> GlobalAveragePool -> Flatten -> Gemm
    (float weights, transB) -> logits. zero_point None: no zero point inputs (uint8 in ONNX)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    wt = rng.normal(0, 0.2, (classes, c)).astype(np.float32)
    bias = rng.normal(0, 0.1, classes).astype(np.float32)
    inits = [numpy_helper.from_array(np.array(scale, np.float32), "s"), numpy_helper.from_array(wt, "fc_w"),
             numpy_helper.from_array(bias, "fc_b")]
    qdq = ["s"]
    if zero_point is not None:
        inits.append(numpy_helper.from_array(np.asarray(zero_point), "zp"))
        qdq.append("zp")
    nodes = [helper.make_node("QuantizeLinear", ["x", *qdq], ["xq"], name="head_QuantizeLinear"),
             helper.make_node("DequantizeLinear", ["xq", *qdq], ["xd"], name="head_DequantizeLinear"),
             helper.make_node("GlobalAveragePool", ["xd"], ["pooled"], name="avgpool"),
             helper.make_node("Flatten", ["pooled"], ["flat"], name="flatten"),
             helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], name="fc", transB=1)]
    graph = helper.make_graph(nodes, "pool_head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, h, w])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [n, classes])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), wt, bias


def head_input(n=4, c=40, h=7, w=7, scale=0.0213, seed=1) -> tuple[np.ndarray, np.ndarray]:
    """(x float, its int8 values): x = xq * s exactly representable, so QuantizeLinear(s) gives xq back; with ties."""
    xq = with_ties(np.random.default_rng(seed).integers(-128, 128, size=(n, c, h, w), dtype=np.int8))
    return xq.astype(np.float32) * np.float32(scale), xq


def head_logits(pooled: np.ndarray, scale: float, wt: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """fc(s * pooled) in float64, pooled [n, c] on t's grid (m / 256 for the plugin's hi + lo)."""
    return pooled.astype(np.float64) * np.float64(np.float32(scale)) @ wt.T.astype(np.float64) + bias.astype(np.float64)


def head_pooled(xq: np.ndarray) -> np.ndarray:
    """The plugin's pooled value on t's grid: m / 256 (float64, exact), [n, c]."""
    return pooled_m(xq).astype(np.float64) / 256


def plugin_version_in_source() -> str:
    return re.search(r'kVersion = "(\w+)"', PLUGIN_SOURCE.read_text()).group(1)


# ---------------------------------------------------------------------------------------------- CPU: the rule
def test_reference_rounds_to_nearest_ties_to_even_exactly():
    """round_mean256 against Python's round of the exact fraction 256 * sum / hw (half to even) for every sum an int8
    tensor can have at several hw (ties only where 512 divides hw: there, positive and negative ones), always within
    1/2 of 256 * sum / hw (so m / 256 within 1/512 of the mean) and in [-32768, 32512], both ends reached; and
    avgpool_reference on constructed ties and on random tensors."""
    for hw in (1, 2, 3, 4, 6, 7, 49, 196, 512, 1024):
        sums = np.arange(-128 * hw, 127 * hw + 1, dtype=np.int64)
        want = np.array([rule(int(v), hw) for v in sums])
        got = round_mean256(sums, hw)
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, want, err_msg=f"hw {hw}")
        assert got.min() == M_MIN == -32768 and got.max() == M_MAX == 32512
        assert np.all(np.abs(2 * (got * hw - 256 * sums)) <= hw)   # |m - 256 sum / hw| <= 1/2, exactly
        ties = ((512 * sums) % hw == 0) & (((512 * sums) // hw) % 2 == 1)   # 256 sum / hw = an odd number / 2
        assert ties.any() == (hw % 512 == 0), hw
        if ties.any():
            assert np.all(got[ties] % 2 == 0) and (sums[ties] < 0).any() and (sums[ties] > 0).any()
    for h, w in ((16, 32), (32, 32), (256, 256)):
        x = with_ties(np.zeros((2, len(TIES) + 2, h, w), np.int8))
        m = pooled_m(x)
        assert m[0, :len(TIES)].tolist() == [want for _, want in TIES], (h, w)
        assert m[0, len(TIES)] == M_MAX and m[-1, -1] == M_MIN
    rng = np.random.default_rng()
    for shape in ((3, 70, 7, 7), (2, 33, 2, 3), (4, 16, 1, 1), (2, 12, 16, 32)):
        x = with_ties(rng.integers(-128, 128, size=shape, dtype=np.int8))
        hi, lo = avgpool_reference(x)
        assert hi.dtype == lo.dtype == np.int8 and hi.shape == lo.shape == (*shape[:2], 1, 1)
        m = pooled_m(x).reshape(-1).astype(np.float64)
        mean = x.astype(np.float64).reshape(shape[0] * shape[1], -1).mean(axis=1)
        assert np.all(np.abs(m / 256 - mean) <= 1 / 512)
        tie = np.abs(np.abs(m / 256 - mean) - 1 / 512) < 1e-12
        assert np.all(m[tie] % 2 == 0) and (tie.any() == (shape[2] * shape[3] % 512 == 0))


def test_split_into_hi_and_lo_stays_in_int8():
    """split_hi_lo for every m in [-32768, 32512]: hi = floor((m + 128) / 256), lo = m - 256 hi, both in [-128, 127]
    (both ends of each reached), 256 hi + lo = m; at the boundaries; for the extreme sums at several hw; m outside the
    range refused."""
    m = np.arange(M_MIN, M_MAX + 1, dtype=np.int64)
    hi, lo = split_hi_lo(m)
    assert hi.dtype == lo.dtype == np.int8
    np.testing.assert_array_equal(join_hi_lo(hi, lo), m)
    np.testing.assert_array_equal(hi.astype(np.int64), [(int(v) + 128) // 256 for v in m])
    assert (hi.min(), hi.max(), lo.min(), lo.max()) == (-128, 127, -128, 127)
    cases = {-32768: (-128, 0), 32512: (127, 0), 0: (0, 0), 127: (0, 127), 128: (1, -128), -128: (0, -128),
             -129: (-1, 127), 32511: (127, -1), 32383: (126, 127), 32384: (127, -128), -32767: (-128, 1)}
    for v, want in cases.items():
        got = split_hi_lo(np.array([v]))
        assert (int(got[0][0]), int(got[1][0])) == want, v
    for hw in (1, 7, 49, 512, 1 << 16):
        sums = np.array([-128 * hw, -128 * hw + 1, -127 * hw - 1, -1, 0, 1, 127 * hw - 1, 127 * hw], np.int64)
        hi, lo = split_hi_lo(round_mean256(sums, hw))
        assert hi[0] == -128 and lo[0] == 0 and hi[-1] == 127 and lo[-1] == 0, hw
        np.testing.assert_array_equal(join_hi_lo(hi, lo), [rule(int(v), hw) for v in sums])
    for bad in (M_MIN - 1, M_MAX + 1):
        with pytest.raises(ValueError):
            split_hi_lo(np.array([bad]))


def test_kernel_rounding_on_the_host_equals_the_reference():
    """The kernel's own functions (trtfuse_avgpool_round_mean256: the same __host__ __device__ round_mean256 and
    split_hi_lo the kernel calls): for every int8 sum at several hw (hw = 256: every m; 512, 1024: ties), m equals
    round_mean256 and hi, lo split_hi_lo's; at hw = 65536 (256 * sum = -2^31 at the low end) the extremes and ties
    against the exact fraction; hw out of range gives 0."""
    _kernels_lib()
    from trtfuse.ops.avgpool import kernel_round_mean256

    for hw in (1, 2, 3, 7, 49, 256, 512, 1024):
        sums = np.arange(-128 * hw, 127 * hw + 1, dtype=np.int64)
        got = np.array([kernel_round_mean256(int(v), hw) for v in sums], np.int64)
        m = round_mean256(sums, hw)
        hi, lo = split_hi_lo(m)
        np.testing.assert_array_equal(got[:, 0], m, err_msg=f"m, hw {hw}")
        np.testing.assert_array_equal(got[:, 1], hi, err_msg=f"hi, hw {hw}")
        np.testing.assert_array_equal(got[:, 2], lo, err_msg=f"lo, hw {hw}")
    hw = 1 << 16
    ties = [(2 * k + 1) * hw // 512 for k, _ in TIES]
    special = [-128 * hw, -128 * hw + 1, 127 * hw, 127 * hw - 1, -1, 0, 1, hw // 2, -hw // 2] + ties + [
        v + d for v in ties for d in (-1, 1) if -128 * hw <= v + d <= 127 * hw]
    for v in special:
        m, hi, lo = kernel_round_mean256(v, hw)
        assert m == rule(v, hw) and (hi, lo) == tuple(int(a[0]) for a in split_hi_lo(np.array([m]))), v
    for k, want in TIES:
        assert kernel_round_mean256((2 * k + 1) * hw // 512, hw)[0] == want, k
    assert kernel_round_mean256(5, 0) == (0, 0, 0) and kernel_round_mean256(5, hw + 1) == (0, 0, 0)


def test_c_abi_refuses_bad_arguments_without_gpu():
    lib = _kernels_lib().library()
    from trtfuse.ops import avgpool

    avgpool._lib()   # argtypes
    buf = ctypes.create_string_buffer(64 + 16)
    a = (ctypes.addressof(buf) + 15) & ~15   # 16-byte aligned host memory: refused before any launch
    f = lib.trtfuse_avgpool_int8_forward
    assert f(None, a, a, 1, 32, 1, None) == ERR_NULL
    assert f(a, None, a, 1, 32, 1, None) == ERR_NULL
    assert f(a, a, None, 1, 32, 1, None) == ERR_NULL
    assert f(a, a, a, 0, 32, 1, None) == ERR_SHAPE
    assert f(a, a, a, 1, 0, 1, None) == ERR_SHAPE
    assert f(a, a, a, 1, 32, 0, None) == ERR_SHAPE
    assert f(a, a, a, 1, 32, -4, None) == ERR_SHAPE
    assert f(a, a, a, 1, 32, (1 << 16) + 1, None) == ERR_SHAPE
    assert f(a + 4, a, a, 1, 32, 1, None) == ERR_ALIGN
    assert f(a + 1, a, a, 1, 32, 1, None) == ERR_ALIGN
    err = lib.trtfuse_avgpool_error_string
    assert err(ERR_NULL) == b"x, hi and lo must not be null"
    assert err(ERR_ALIGN) == b"x must be 16-byte aligned"   # hi, lo: int8 bytes, any alignment
    assert err(-3) == b"unknown status"   # the retired x_scale check
    assert b"65536" in err(ERR_SHAPE) and err(0) == b"ok"


# ---------------------------------------------------------------------------------------------- CPU: the rewrite
# (the CPU tests import the ONNX side here: the GPU machine's TensorRT Python has no ONNX Runtime)
@pytest.fixture(scope="module")
def toy():
    from test_bn_fold import toy_resnet
    from test_residual_conv_rewrite import _quantized

    return _quantized(toy_resnet())


def test_pool_head_found_only_behind_an_int8_dequantize(toy):
    """Found: the toy's head, the head graph with an int8 zero point 0, and without a zero point on the
    DequantizeLinear where its QuantizeLinear's is int8; not: a float network, a nonzero or uint8 zero point, no zero
    point at all (uint8), a scale whose s / 256 is subnormal (not exact in fp32), a float64 scale."""
    import onnx
    from onnx import numpy_helper
    from test_bn_fold import toy_resnet
    from trtfuse.passes.residual_conv_rewrite import find_pool_heads

    heads = find_pool_heads(toy)
    assert len(heads) == 1
    h = heads[0]
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in toy.graph.initializer}
    assert h.x_scale == float(inits[h.dq.input[1]]) and h.scale_shape == inits[h.dq.input[1]].shape
    assert find_pool_heads(toy_resnet()) == []   # a float network: nothing int8 to pool
    assert len(find_pool_heads(pool_head_graph(zero_point=np.int8(0))[0])) == 1
    assert find_pool_heads(pool_head_graph(zero_point=np.int8(3))[0]) == []     # TensorRT's int8 is symmetric
    assert find_pool_heads(pool_head_graph(zero_point=np.uint8(0))[0]) == []    # uint8
    assert find_pool_heads(pool_head_graph(zero_point=None)[0]) == []           # no zero point: uint8 in ONNX
    assert len(find_pool_heads(dq_without_zero_point(pool_head_graph(zero_point=np.int8(0))[0]))) == 1
    # s / 256 must be a normal fp32: 2^-118 / 256 = 2^-126 is the smallest normal; 2^-119 / 256 is subnormal
    assert len(find_pool_heads(pool_head_graph(scale=2.0 ** -118, zero_point=np.int8(0))[0])) == 1
    assert find_pool_heads(pool_head_graph(scale=2.0 ** -119, zero_point=np.int8(0))[0]) == []
    assert find_pool_heads(pool_head_graph(scale=1e-37, zero_point=np.int8(0))[0]) == []
    model = pool_head_graph(zero_point=np.int8(0))[0]
    s = next(t for t in model.graph.initializer if t.name == "s")
    s.CopyFrom(numpy_helper.from_array(np.array(0.0213, np.float64), "s"))
    assert find_pool_heads(model) == []   # not fp32 (opset 13's DequantizeLinear takes fp32 scales only)


def dq_without_zero_point(model):
    """The head graph with its DequantizeLinear's zero point input removed (its QuantizeLinear keeps an int8 one)."""
    dq = next(nd for nd in model.graph.node if nd.op_type == "DequantizeLinear")
    del dq.input[2:]
    return model


def rewritten_head(model):
    """(the rewritten model, the plugin node, the hi DQ, the lo DQ, the Add, initializers by name) after checking the
    wiring: the plugin's two outputs each feed exactly one DequantizeLinear (output 0 the hi one, 1 the lo one), and
    the Add reads exactly those two DequantizeLinears' outputs."""
    import onnx
    from onnx import numpy_helper
    from trtfuse.passes.residual_conv_rewrite import POOL_OP, rewrite

    out, n = rewrite(model, pool_head=True)
    onnx.checker.check_model(out, full_check=True)
    pools = [nd for nd in out.graph.node if nd.op_type == POOL_OP]
    assert len(pools) == 1 and pools[0].domain == "trtfuse"
    pool = pools[0]
    assert len(pool.input) == 1 and len(pool.output) == 2
    readers = {o: [nd for nd in out.graph.node if o in nd.input] for o in pool.output}
    assert all(len(r) == 1 and r[0].op_type == "DequantizeLinear" and r[0].input[0] == o for o, r in readers.items())
    dq_hi, dq_lo = (readers[o][0] for o in pool.output)
    adds = [nd for nd in out.graph.node if dq_hi.output[0] in nd.input or dq_lo.output[0] in nd.input]
    assert len(adds) == 1 and adds[0].op_type == "Add" and sorted(adds[0].input) == sorted(
        [dq_hi.output[0], dq_lo.output[0]])
    inits = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    return out, n, pool, dq_hi, dq_lo, adds[0], inits


@pytest.mark.parametrize("graph", ["toy", "head", "head_dq_without_zero_point"])
def test_rewrite_puts_the_pool_on_the_plugin_and_two_dequantizes_and_an_add_after_it(toy, graph):
    """t -> DQ(s) -> GlobalAveragePool -> y becomes t -> TrtfuseAvgPool (version 3, no fields) -> hi, lo (int8) ->
    DequantizeLinear(hi, s) and DequantizeLinear(lo, s / 256) -> Add -> y: the checker passes; the plugin's two outputs
    feed exactly the two DequantizeLinears; their scales s (the original's initializer) and s / 256 bit-exact, zero
    points int8 0 (the original's, or a new one where the original had none); the Add writes the old pool output
    name, which the Flatten reads; every new node named after the plugin; off unless asked."""
    import onnx
    from trtfuse.passes.residual_conv_rewrite import POOL_OP, find_pool_heads, plugin_counts, rewrite

    model = {"toy": toy, "head": pool_head_graph(zero_point=np.int8(0))[0],
             "head_dq_without_zero_point": dq_without_zero_point(pool_head_graph(zero_point=np.int8(0))[0])}[graph]
    head = find_pool_heads(model)[0]
    out, n, pool, dq_hi, dq_lo, add, inits = rewritten_head(model)
    assert n == plugin_counts(out)["tail"] + 1
    assert not [nd for nd in out.graph.node if nd.op_type == "GlobalAveragePool"]
    attrs = {a.name: a for a in pool.attribute}
    # no fields (the creator declares none), and the version the plugin source registers
    assert set(attrs) == {"plugin_version", "plugin_namespace"}
    assert re.findall(r'PluginField[{(]"(\w+)"', PLUGIN_SOURCE.read_text()) == []
    assert attrs["plugin_version"].s.decode() == plugin_version_in_source() == "3"
    producer = {o: nd for nd in out.graph.node for o in nd.output}
    assert pool.input[0] == head.x_q
    if graph == "toy":
        assert producer[pool.input[0]].domain == "trtfuse"   # it reads the last tail's int8 output directly
    else:
        assert producer[pool.input[0]].op_type == "QuantizeLinear"
    # scales: s exactly the original's (same initializer), s / 256 bit-exact
    s = np.float32(head.x_scale)
    assert dq_hi.input[1] == head.dq.input[1]
    hi_scale, lo_scale = inits[dq_hi.input[1]], inits[dq_lo.input[1]]
    assert hi_scale.dtype == lo_scale.dtype == np.float32 and hi_scale.shape == lo_scale.shape == head.scale_shape
    assert hi_scale.reshape(-1).view(np.uint32)[0] == s.view(np.uint32)
    want_lo = np.float32(np.float64(s) / 256)
    assert lo_scale.reshape(-1).view(np.uint32)[0] == want_lo.view(np.uint32)
    assert float(lo_scale.reshape(-1)[0]) * 256 == float(s)   # exact: a power-of-two scaling of a normal fp32
    # zero points: int8 0, both
    for dq in (dq_hi, dq_lo):
        assert len(dq.input) == 3 and inits[dq.input[2]].dtype == np.int8 and not inits[dq.input[2]].any()
        assert {a.name for a in dq.attribute} <= {"axis"}
    assert (dq_hi.input[2] == head.dq.input[2]) if len(head.dq.input) > 2 else dq_hi.input[2].endswith("zero_point")
    # the Add writes the pool's output, which the Flatten (or whatever read the pool) reads as before
    assert add.output[0] == head.pool.output[0]
    assert [nd.op_type for nd in out.graph.node if add.output[0] in nd.input] == ["Flatten"]
    types = {v.name: v.type.tensor_type.elem_type for v in out.graph.value_info}
    assert types[pool.output[0]] == types[pool.output[1]] == onnx.TensorProto.INT8
    # named after the plugin (resnet50_fullnet.pool_head_row counts them by the prefix)
    assert pool.name == f"{POOL_OP}_0"
    assert [nd.name for nd in (dq_hi, dq_lo, add)] == [f"{pool.name}_DequantizeLinear_hi",
                                                        f"{pool.name}_DequantizeLinear_lo", f"{pool.name}_Add"]
    assert not [nd for nd in rewrite(model)[0].graph.node if nd.op_type == POOL_OP]   # off unless asked


def at_size(model, size: int):
    """A copy of ``model`` taking size x size images: the input's H and W set, every other recorded shape dropped
    (types kept) for ONNX Runtime to infer."""
    model = type(model).FromString(model.SerializeToString())
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_value = dims[3].dim_value = size
    for v in list(model.graph.value_info) + list(model.graph.output):
        v.type.tensor_type.ClearField("shape")
    return model


def test_rewritten_network_moves_the_logits_by_at_most_1_512_lsb_per_pooled_feature(toy):
    """The rewrite adds one rounding: each pooled feature to 1/256 of t's grid, at most s / 512 off. Through the fc
    (W [classes, C]) logit j moves by at most sum_k |W[j, k]| s / 512 (+ fp32 slack): checked against the same network
    with the pool in ONNX Runtime (the same tails); the move equals that rounding through the fc; the bound is small
    next to the logits and the move is not zero; and the move is far (100 times) below the bound of version 2's single
    int8 output (s / 2 per feature) and below what that rounding actually did here; the network still agrees with the
    un-rewritten one as the tails alone do."""
    import onnx
    from onnx import numpy_helper
    from test_quantize import calib_batches
    from trtfuse.passes.quantize import top1_onnxruntime
    from trtfuse.passes.residual_conv_rewrite import compare_logits, evaluate_with_reference, find_pool_heads, rewrite

    head = find_pool_heads(toy)[0]
    s = np.float64(np.float32(head.x_scale))
    fc = next(nd for nd in toy.graph.node if nd.op_type == "Gemm")
    assert [a.i for a in fc.attribute if a.name == "transB"] == [1]
    wt = numpy_helper.to_array(next(t for t in toy.graph.initializer if t.name == fc.input[1])).astype(np.float64)
    # 14 x 14 images: the pool's hw is then 49, as in ResNet-50 (at the toy's 16 x 16, hw = 64 divides 256 and m / 256
    # is the mean exactly)
    x = calib_batches(seed=7, n=1, size=14)[0]
    out = at_size(rewrite(toy, pool_head=True)[0], 14)
    probe = onnx.ModelProto.FromString(out.SerializeToString())   # t, the int8 tensor pooled, as an output too
    probe.graph.output.append(onnx.helper.make_tensor_value_info(head.x_q, onnx.TensorProto.INT8, None))
    got, t = evaluate_with_reference(probe, {"input": x})
    base = evaluate_with_reference(at_size(rewrite(toy)[0], 14), {"input": x})[0]   # the same tails; ORT's fp32 mean
    assert got.shape == base.shape == (len(x), wt.shape[0]) and t.dtype == np.int8 and t.shape[2:] == (7, 7)
    mean = t.astype(np.float64).reshape(*t.shape[:2], -1).mean(axis=2)
    m = pooled_m(t).astype(np.float64)
    # fp32 slack: ORT's fp32 dequantize, mean (or the two dequantizes and the Add) and fc, relative to sum |W| |p|
    slack = 1e-5 * (np.abs(s * mean) @ np.abs(wt).T + np.abs(base)) + 1e-7
    bound = s / 512 * np.abs(wt).sum(axis=1)   # per logit
    diff = got.astype(np.float64) - base
    assert np.all(np.abs(diff) <= bound + slack), (np.abs(diff) - bound - slack).max()
    assert bound.max() < 1e-3 * np.abs(base).max(), (bound.max(), np.abs(base).max())   # a bound that says something
    assert slack.max() < bound.max() / 4   # and is not all slack
    # the move is exactly the rounding of each pooled feature to 1/256 through the fc, and not nothing
    assert np.all(np.abs(m / 256 - mean) <= 1 / 512) and np.abs(m / 256 - mean).max() > 0
    np.testing.assert_allclose(diff, (s * (m / 256 - mean)) @ wt.T, rtol=0, atol=slack.max())
    assert np.abs(diff).max() > 0
    # much smaller than version 2's rounding (the mean to t's grid, up to s / 2): its bound / 100, and what it did
    old_bound = 0.5 * s * np.abs(wt).sum(axis=1)
    assert np.abs(diff).max() <= old_bound.max() / 100, (np.abs(diff).max(), old_bound.max())
    rounded = np.round(mean)   # half to even, as version 2 did (|mean| < 128: no clamping)
    old_move = (s * (rounded - mean)) @ wt.T
    assert np.abs(diff).max() < np.abs(old_move).max() / 20, (np.abs(diff).max(), np.abs(old_move).max())
    _, ref = top1_onnxruntime(at_size(toy, 14), x, np.zeros(len(x), np.int64), progress=False)
    cmp, cmp_tails = compare_logits(ref, got), compare_logits(ref, base)
    assert cmp["max_abs_logit_diff"] < 0.05 * cmp["max_abs_logit"]
    assert abs(cmp["max_abs_logit_diff"] - cmp_tails["max_abs_logit_diff"]) <= bound.max() + slack.max()


def test_head_graph_through_the_reference_is_the_rules_pool_through_the_fc():
    """The TensorRT test's graph (pool_head_graph) rewritten and run on CPU (the rule for the plugin node, ONNX
    Runtime for the DequantizeLinears, the Add, Flatten and Gemm) equals fc(s * m / 256) in float64 within fp32
    rounding: the value the engine is held to below; at hw = 6 (no ties) and 512 (ties)."""
    import onnx
    from trtfuse.passes.residual_conv_rewrite import POOL_OP, evaluate_with_reference, rewrite

    scale = 0.0213
    for h, w in ((2, 3), (16, 32)):
        model, wt, bias = pool_head_graph(n=4, c=40, h=h, w=w, scale=scale, zero_point=np.int8(0))
        out, n = rewrite(model, pool_head=True)
        onnx.checker.check_model(out)
        assert n == 1 and [nd.op_type for nd in out.graph.node] == ["QuantizeLinear", POOL_OP, "DequantizeLinear",
                                                                    "DequantizeLinear", "Add", "Flatten", "Gemm"]
        x, xq = head_input(n=4, c=40, h=h, w=w, scale=scale)
        got = evaluate_with_reference(out, {"x": x})[0]
        pooled = head_pooled(xq)
        want = head_logits(pooled, scale, wt, bias)
        tol = 1e-5 * (np.abs(pooled * scale) @ np.abs(wt).T + np.abs(bias)) + 1e-6
        assert np.all(np.abs(got - want) <= tol), (h, w)
        # version 2's value (the mean rounded to t's grid) is not within that tolerance: the check sees 1/256 LSB
        v2 = head_logits(np.round(xq.astype(np.float64).reshape(4, 40, -1).mean(axis=2)), scale, wt, bias)
        assert np.any(np.abs(v2 - want) > tol)


@pytest.mark.slow
@pytest.mark.parametrize("version", ["8.5.3", "11.1"])
def test_plugin_creator_types_and_serialization_on_the_host(version, tmp_path):
    """tests/avgpool_plugin_host.cpp, compiled against each TensorRT header set with the plugin's own source: creator
    version 3 with no fields (x_scale refused), two int8 outputs (hi, lo), int8 kCHW32 in / int8 kLINEAR out only and
    version 2's one-output layout refused, the "TAV3" blob's round trip, version 1's and version 2's blobs and foreign,
    truncated or longer blobs refused."""
    from test_residual_conv_plugin import run_host_check

    res = run_host_check(HOST_CHECK, version, tmp_path, timeout=120)
    print(res.stdout)
    assert res.returncode == 0 and "FAIL" not in res.stdout and "failures 0" in res.stdout, res.stdout + res.stderr
    assert "x_scale was version 1's field" in res.stderr
    assert "a version 1 TrtfuseAvgPool (fp32 output): rebuild the engine" in res.stderr
    assert "a version 2 TrtfuseAvgPool (one int8 output): rebuild the engine" in res.stderr
    assert "expected one input (int8 [N, C, H, W]) and two outputs (hi, lo), got 1 and 1" in res.stderr


# ---------------------------------------------------------------------------------------------- GPU
@pytest.fixture(scope="module")
def cuda():
    return Cuda()


def to_chw32(x: np.ndarray, pad_value: int) -> np.ndarray:
    """x int8 [n, c, h, w] as kCHW32 [n, ceil(c/32), h*w, 32], padded channels set to pad_value (never read)."""
    n, c, h, w = x.shape
    slabs = -(-c // 32)
    full = np.full((n, slabs * 32, h * w), pad_value, np.int8)
    full[:, :c] = x.reshape(n, c, h * w)
    return np.ascontiguousarray(full.reshape(n, slabs, 32, h * w).transpose(0, 1, 3, 2))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(2, 2048, 7, 7), (3, 45, 7, 7), (3, 40, 5, 3), (1, 1, 1, 1), (2, 70, 1, 1),
                                   (5, 96, 14, 14), (4, 64, 1, 9), (3, 70, 1, 2), (2, 33, 2, 2), (1, 8, 256, 256),
                                   (2, 40, 16, 32)],
                         ids=lambda s: "x".join(map(str, s)))
def test_kernel_equals_its_reference(cuda, shape):
    """hi and lo bit for bit against avgpool_reference (m's ties in image 0 where 512 divides hw: 256 x 256 and
    16 x 32; the extreme sums 127 hw and -128 hw, m = 32512 and -32768), the padded input channels poisoned, both
    outputs poisoned twice with different bytes (every [n, c] entry of each written, nothing past n * c in either)."""
    rng = np.random.default_rng()
    n, c, h, w = shape
    x = with_ties(rng.integers(-128, 128, size=shape, dtype=np.int8))
    from trtfuse.ops.avgpool import avgpool_int8

    want_hi, want_lo = (a.reshape(-1) for a in avgpool_reference(x))
    guard = 64
    dx = cuda.upload(to_chw32(x, 0x55))
    try:
        for poison in (0x5A, -0x5B):
            canvas = np.full(n * c + guard, poison, np.int8)
            dhi, dlo = cuda.upload(canvas), cuda.upload(canvas)
            try:
                avgpool_int8(dx.value, dhi.value, dlo.value, n, c, h * w)
                cuda.sync()
                got_hi, got_lo = cuda.download(dhi, canvas), cuda.download(dlo, canvas)
            finally:
                cuda.free(dhi, dlo)
            for name, got, want in (("hi", got_hi, want_hi), ("lo", got_lo, want_lo)):
                assert (got[n * c:] == poison).all(), f"{name}: wrote past [n, c]"
                mism = int((got[: n * c] != want).sum())
                assert mism == 0, f"{name}: {mism} of {n * c} differ from the rule (poison {poison})"
    finally:
        cuda.free(dx)


# ---------------------------------------------------------------------------------------------- TensorRT
@pytest.mark.tensorrt
@pytest.mark.parametrize("hw", [(7, 7), (16, 32)], ids=lambda s: "x".join(map(str, s)))
def test_plugin_node_in_a_tensorrt_engine(hw):
    """TrtfuseAvgPool(int8 [N, C, H, W] kCHW32) -> hi, lo int8 [N, C, 1, 1] kLINEAR in an engine (network API, one
    node; hi on the input's scale, lo on 1/256 of it; ResNet-50's 7 x 7, and 16 x 32 where m has ties): both outputs
    equal to the rule; a serialize round trip gives the same outputs; the creator is version 3 only (versions 1 and 2
    not registered) and refuses version 1's x_scale."""
    import tensorrt as trt
    from test_residual_conv import trt_benchmark

    bench, stream = trt_benchmark("residual")
    (h, w), n, c, scale = hw, 4, 2048, 0.0213
    rng = np.random.default_rng()
    x = with_ties(rng.integers(-128, 128, size=(n, c, h, w), dtype=np.int8))
    builder = trt.Builder(bench.LOGGER)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH))
    inp = network.add_input("x", trt.int8, (n, c, h, w))
    inp.allowed_formats = 1 << int(trt.TensorFormat.CHW32)
    inp.dynamic_range = (-127.0 * scale, 127.0 * scale)
    registry = trt.get_plugin_registry()
    assert registry.get_plugin_creator("TrtfuseAvgPool", "1", "") is None, "version 1 (fp32 out) is gone"
    assert registry.get_plugin_creator("TrtfuseAvgPool", "2", "") is None, "version 2 (one int8 out) is gone"
    creator = registry.get_plugin_creator("TrtfuseAvgPool", "3", "")
    assert creator is not None, "TrtfuseAvgPool version 3 is not registered"
    old = trt.PluginFieldCollection([trt.PluginField("x_scale", np.array([scale], np.float32),
                                                     trt.PluginFieldType.FLOAT32)])
    assert creator.create_plugin("old", old) is None   # version 1's field
    layer = network.add_plugin_v2([inp], creator.create_plugin("pool", trt.PluginFieldCollection([])))
    assert layer.num_outputs == 2
    for i, (name, s) in enumerate((("hi", scale), ("lo", scale / 256))):
        out = layer.get_output(i)
        out.name = name
        out.dtype = trt.int8
        out.allowed_formats = 1 << int(trt.TensorFormat.LINEAR)
        out.dynamic_range = (-127.0 * s, 127.0 * s)   # hi on the input's scale, lo on 1/256 of it
        network.mark_output(out)
    config = builder.create_builder_config()
    config.set_flag(trt.BuilderFlag.INT8)
    config.set_tactic_sources(0)
    blob = builder.build_serialized_network(network, config)
    assert blob is not None
    want = dict(zip(("hi", "lo"), avgpool_reference(x)))
    from trtfuse.bench.cuda import DeviceBuffer, ck, cudart

    xb = DeviceBuffer(x.nbytes).upload(to_chw32(x, 0))
    obs = {k: DeviceBuffer(v.nbytes) for k, v in want.items()}
    try:
        for round_trip in (False, True):
            engine = trt.Runtime(bench.LOGGER).deserialize_cuda_engine(bytes(blob))
            if round_trip:
                engine = trt.Runtime(bench.LOGGER).deserialize_cuda_engine(engine.serialize())
            assert engine.get_binding_dtype("hi") == engine.get_binding_dtype("lo") == trt.int8
            ctx = engine.create_execution_context()
            for ob in obs.values():
                ob.fill(0x7F)
            ptrs = {"x": xb.ptr, **{k: ob.ptr for k, ob in obs.items()}}
            assert ctx.execute_async_v2([ptrs[engine.get_binding_name(i)] for i in range(engine.num_bindings)],
                                        int(stream))
            ck(cudart.cudaStreamSynchronize(stream))
            for k, ob in obs.items():
                got = ob.download(np.empty_like(want[k]))
                mism = int((got != want[k]).sum())
                assert mism == 0, f"{k}: {mism} of {got.size} differ from the rule (round trip {round_trip})"
    finally:
        xb.free()
        for ob in obs.values():
            ob.free()


# The head's Q/DQ pattern as src/trtfuse/engine.py builds it. "engine": its builder flags for int8 (trt_compat: INT8 and
# FP16 where typing is weak, as --precision int8 sets them), no cuBLAS/cuDNN tactics, pin_int8_plugin_outputs (which
# pins TrtfuseResidualConv only); "engine_pool_pinned": the same with the TrtfuseAvgPool layer's two outputs pinned to
# int8 too (what to add to pin_int8_plugin_outputs if only this one builds); "int8_only": the INT8 flag alone and TF32
# cleared (TensorRT 8.5 sets it by default: the fc's fp32 Gemm in TF32 was 2.5e-3 off on logits of ~60), so the fc
# runs in fp32 and the logits are held to fp32 rounding.
HEAD_BUILDS = {"engine": (True, False), "engine_pool_pinned": (True, True), "int8_only": (False, False)}


@pytest.mark.tensorrt
@pytest.mark.parametrize("build", sorted(HEAD_BUILDS))
def test_head_qdq_graph_builds_through_the_onnx_parser(build):
    """ResNet-50's head in small, after the rewrite: x float [4, 2048, 7, 7] -> QuantizeLinear(s) -> TrtfuseAvgPool ->
    hi, lo -> DequantizeLinear(hi, s), DequantizeLinear(lo, s / 256) -> Add -> Flatten -> Gemm (float weights, 1000
    classes), parsed by TensorRT's ONNX parser with the plugin library loaded. The build succeeds and the logits equal
    fc(s * m / 256) within fp32 rounding (fp16's where the FP16 flag lets the head run in fp16); in the fp32 build that
    tolerance tells version 3 from version 2's single int8 output (fc(s * round(mean))) and from lo lost (fc(s * hi)).
    """
    onnx = pytest.importorskip("onnx", reason="writing the ONNX graph needs onnx (../shared/device/stage-trt.sh "
                                              "stages it with TensorRT 8.5)")
    import tensorrt as trt
    from test_residual_conv import trt_benchmark
    from trtfuse import trt_compat
    from trtfuse.trt_graph import load_plugin_library, pin_int8_plugin_outputs
    from trtfuse.passes.residual_conv_rewrite import POOL_OP, PLUGIN_OP, rewrite

    engine_flags, pin_pool = HEAD_BUILDS[build]
    if not engine_flags and not trt_compat.weakly_typed(trt):
        pytest.skip(f"TensorRT {trt.__version__} is strongly typed: no INT8 builder flag to set alone")
    bench, stream = trt_benchmark("residual")
    load_plugin_library()   # as build_engine does (the same library: registered once)
    n, c, hw, classes, scale = 4, 2048, 7, 1000, 0.0213
    model, wt, bias = pool_head_graph(n=n, c=c, h=hw, w=hw, classes=classes, scale=scale, zero_point=np.int8(0))
    model, replaced = rewrite(model, pool_head=True)
    assert replaced == 1 and [nd.op_type for nd in model.graph.node] == [
        "QuantizeLinear", POOL_OP, "DequantizeLinear", "DequantizeLinear", "Add", "Flatten", "Gemm"]
    onnx.checker.check_model(model)
    x, xq = head_input(n=n, c=c, h=hw, w=hw, scale=scale)

    builder = trt.Builder(bench.LOGGER)
    network = builder.create_network(trt_compat.network_flags(trt))
    parser = trt.OnnxParser(network, bench.LOGGER)
    assert parser.parse(model.SerializeToString()), "; ".join(str(parser.get_error(i))
                                                              for i in range(parser.num_errors))
    assert pin_int8_plugin_outputs(trt, network) == 0   # no TrtfuseResidualConv here
    plugin_layers = []
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        if layer.type == trt.LayerType.PLUGIN_V2:
            layer.__class__ = trt.IPluginV2Layer
            plugin_layers.append(layer)
    assert [ly.plugin.plugin_type for ly in plugin_layers] == [POOL_OP] and POOL_OP != PLUGIN_OP
    assert plugin_layers[0].num_outputs == 2
    if pin_pool:
        plugin_layers[0].set_output_type(0, trt.int8)
        plugin_layers[0].set_output_type(1, trt.int8)
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, 1 << 30)
    for flag in (trt_compat.precision_flags(trt, "int8") if engine_flags else [trt.BuilderFlag.INT8]):
        config.set_flag(flag)
    if not engine_flags and hasattr(trt.BuilderFlag, "TF32"):
        config.clear_flag(trt.BuilderFlag.TF32)   # on by default: the fc's fp32 Gemm would run in TF32
    config.set_tactic_sources(0)   # engine.py's --tactic-sources none; the lent machine's TensorRT 8.5 has no cuBLAS
    blob = builder.build_serialized_network(network, config)
    assert blob is not None, (f"TensorRT {trt.__version__} did not build Q -> {POOL_OP} -> 2 DQ -> Add -> Flatten -> "
                              f"Gemm ({build})")

    from trtfuse.bench.cuda import DeviceBuffer, ck, cudart

    engine = trt.Runtime(bench.LOGGER).deserialize_cuda_engine(bytes(blob))
    ctx = engine.create_execution_context()
    pooled = head_pooled(xq)
    want = head_logits(pooled, scale, wt, bias)
    xb, ob = DeviceBuffer(x.nbytes).upload(x), DeviceBuffer(n * classes * 4)
    try:
        ob.fill(0x7F)
        ptrs = {"x": xb.ptr, "logits": ob.ptr}
        assert ctx.execute_async_v2([ptrs[engine.get_binding_name(i)] for i in range(engine.num_bindings)],
                                    int(stream))
        ck(cudart.cudaStreamSynchronize(stream))
        got = ob.download(np.empty((n, classes), np.float32)).astype(np.float64)
    finally:
        xb.free()
        ob.free()
    # |error| against the float64 value: fp32 (or fp16) rounding of each dequantize, the Add, each product and sum,
    # relative to sum |W| (|s hi| + |s / 256 lo|)
    hi, lo = (a.reshape(n, -1).astype(np.float64) for a in avgpool_reference(xq))
    parts = np.abs(hi) * np.float64(np.float32(scale)) + np.abs(lo) * np.float64(np.float32(scale)) / 256
    scale_of_sum = parts @ np.abs(wt.T).astype(np.float64) + np.abs(bias)
    rel = 1e-5 if not engine_flags or not trt_compat.weakly_typed(trt) else 1e-2
    tol = rel * scale_of_sum + 1e-6
    err = np.abs(got - want)
    assert np.all(err <= tol), f"max error {err.max()} ({build})"
    if rel == 1e-5:   # the fp32 build's tolerance sees 1/256 LSB: version 2's value, or hi alone, would fail it
        v2 = head_logits(np.round(xq.astype(np.float64).reshape(n, c, -1).mean(axis=2)), scale, wt, bias)
        assert np.any(np.abs(v2 - want) > tol) and np.any(np.abs(head_logits(hi, scale, wt, bias) - want) > tol)
