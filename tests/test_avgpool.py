"""The int8 global average pool (plugins/avgpool, TrtfuseAvgPool): the rewrite of DequantizeLinear +
GlobalAveragePool onto it (CPU), the kernel against its reference bit for bit and against the float64 mean (GPU,
`-m gpu`), and one plugin node in a TensorRT engine (`-m tensorrt`)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from test_residual_conv import Cuda, _kernels_lib
from trtfuse.ops.avgpool import avgpool_reference

ERR_NULL, ERR_SHAPE, ERR_SCALE, ERR_ALIGN = -1, -2, -3, -6


# ---------------------------------------------------------------------------------------------- CPU
# (the CPU tests import the ONNX side here: the GPU machine's TensorRT Python has no ONNX Runtime)
@pytest.fixture(scope="module")
def toy():
    from test_bn_fold import toy_resnet
    from test_residual_conv_rewrite import _quantized

    return _quantized(toy_resnet())


def test_pool_head_found_only_behind_an_int8_dequantize(toy):
    import onnx
    from test_bn_fold import toy_resnet
    from trtfuse.models.residual_conv_rewrite import find_pool_heads

    heads = find_pool_heads(toy)
    assert len(heads) == 1
    h = heads[0]
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in toy.graph.initializer}
    assert h.x_scale == pytest.approx(float(inits[h.dq.input[1]]))
    assert find_pool_heads(toy_resnet()) == []   # a float network: nothing int8 to pool


def test_rewrite_puts_the_pool_on_the_plugin_and_computes_the_same_network(toy):
    import onnx
    from test_quantize import calib_batches
    from trtfuse.models.quantize import top1_onnxruntime
    from trtfuse.models.residual_conv_rewrite import (POOL_OP, compare_logits, evaluate_with_reference,
                                                      plugin_counts, rewrite)

    out, n = rewrite(toy, pool_head=True)
    onnx.checker.check_model(out)
    pools = [nd for nd in out.graph.node if nd.op_type == POOL_OP]
    assert len(pools) == 1 and pools[0].domain == "trtfuse" and n == plugin_counts(out)["tail"] + 1
    assert not [nd for nd in out.graph.node if nd.op_type == "GlobalAveragePool"]
    pool = pools[0]
    producer = {o: nd for nd in out.graph.node for o in nd.output}
    assert producer[pool.input[0]].domain == "trtfuse"   # it reads the last tail's int8 output directly
    assert not [nd for nd in rewrite(toy)[0].graph.node if nd.op_type == POOL_OP]   # off unless asked
    x = calib_batches(seed=7, n=1)[0]
    _, ref = top1_onnxruntime(toy, x, np.zeros(len(x), np.int64), progress=False)
    got = evaluate_with_reference(out, {"input": x})[0]
    base = evaluate_with_reference(rewrite(toy)[0], {"input": x})[0]
    # the pool's own rounding (one fp32 product and quotient instead of ORT's dequantize and fp32 mean) moves the
    # logits far less than the tails' 1-LSB differences do
    assert np.abs(got - base).max() <= 1e-4 * np.abs(base).max()
    cmp = compare_logits(ref, got)
    assert cmp["max_abs_logit_diff"] < 0.05 * cmp["max_abs_logit"]


def test_reference_is_the_exact_mean_within_one_ulp():
    rng = np.random.default_rng()
    x = rng.integers(-128, 128, size=(3, 70, 7, 7), dtype=np.int8)
    s = np.float32(0.0371)
    got = avgpool_reference(x, s).astype(np.float64)
    exact = x.astype(np.float64).reshape(3, 70, 49).sum(axis=2).reshape(3, 70, 1, 1) * np.float64(s) / 49
    assert np.all(np.abs(got - exact) <= 2 * np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64) + 1e-30)


def test_c_abi_refuses_bad_arguments_without_gpu():
    lib = _kernels_lib().library()
    from trtfuse.ops import avgpool

    avgpool._lib()   # argtypes
    buf = ctypes.create_string_buffer(64 + 16)
    a = (ctypes.addressof(buf) + 15) & ~15   # 16-byte aligned host memory: refused before any launch
    assert lib.trtfuse_avgpool_int8_forward(None, a, 1, 32, 1, 1.0, None) == ERR_NULL
    assert lib.trtfuse_avgpool_int8_forward(a, a, 0, 32, 1, 1.0, None) == ERR_SHAPE
    assert lib.trtfuse_avgpool_int8_forward(a, a, 1, 32, 1 << 17, 1.0, None) == ERR_SHAPE
    assert lib.trtfuse_avgpool_int8_forward(a, a, 1, 32, 1, 0.0, None) == ERR_SCALE
    assert lib.trtfuse_avgpool_int8_forward(a, a, 1, 32, 1, float("nan"), None) == ERR_SCALE
    assert lib.trtfuse_avgpool_int8_forward(a + 4, a, 1, 32, 1, 1.0, None) == ERR_ALIGN
    assert b"x_scale" in lib.trtfuse_avgpool_error_string(ERR_SCALE)


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
@pytest.mark.parametrize("shape", [(2, 2048, 7, 7), (3, 40, 5, 3), (1, 1, 1, 1), (5, 96, 14, 14), (4, 64, 1, 9)],
                         ids=lambda s: "x".join(map(str, s)))
def test_kernel_equals_its_reference(cuda, shape):
    rng = np.random.default_rng()
    n, c, h, w = shape
    x = rng.integers(-128, 128, size=shape, dtype=np.int8)
    x[0, 0] = 127   # the extremes of a sum
    x[-1, -1] = -128
    scale = float(rng.uniform(0.001, 0.1))
    from trtfuse.ops.avgpool import avgpool_int8

    guard = 64
    poison = np.full(n * c + guard, np.nan, np.float32)
    dx, do = cuda.upload(to_chw32(x, 0x55)), cuda.upload(poison)
    try:
        avgpool_int8(dx.value, do.value, n, c, h * w, scale)
        cuda.sync()
        got = cuda.download(do, poison)
    finally:
        cuda.free(dx, do)
    want = avgpool_reference(x, scale).reshape(-1)
    assert np.isnan(got[n * c:]).all(), "wrote past [n, c]"
    mism = int((got[: n * c].view(np.int32) != want.view(np.int32)).sum())
    assert mism == 0, f"{mism} of {n * c} means differ from the reference's fp32 bits"


# ---------------------------------------------------------------------------------------------- TensorRT
@pytest.mark.tensorrt
def test_plugin_node_in_a_tensorrt_engine():
    """TrtfuseAvgPool(int8 [N, 2048, 7, 7] kCHW32) -> float [N, 2048, 1, 1] in an engine: equal to the kernel's
    reference; a serialize round trip gives the same outputs."""
    import tensorrt as trt
    from test_residual_conv import trt_benchmark

    bench, stream = trt_benchmark("residual_conv_trt")
    n, c, hw, scale = 4, 2048, 7, 0.0213
    rng = np.random.default_rng()
    x = rng.integers(-128, 128, size=(n, c, hw, hw), dtype=np.int8)
    builder = trt.Builder(bench.LOGGER)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH))
    inp = network.add_input("x", trt.int8, (n, c, hw, hw))
    inp.allowed_formats = 1 << int(trt.TensorFormat.CHW32)
    inp.dynamic_range = (-127.0 * scale, 127.0 * scale)
    creator = trt.get_plugin_registry().get_plugin_creator("TrtfuseAvgPool", "1", "")
    assert creator is not None, "TrtfuseAvgPool is not registered"
    fields = trt.PluginFieldCollection([trt.PluginField("x_scale", np.array([scale], np.float32),
                                                        trt.PluginFieldType.FLOAT32)])
    assert creator.create_plugin("bad", trt.PluginFieldCollection([])) is None   # x_scale is required
    out = network.add_plugin_v2([inp], creator.create_plugin("pool", fields)).get_output(0)
    out.name = "out"
    network.mark_output(out)
    config = builder.create_builder_config()
    config.set_flag(trt.BuilderFlag.INT8)
    config.set_tactic_sources(0)
    blob = builder.build_serialized_network(network, config)
    assert blob is not None
    want = avgpool_reference(x, scale)
    from bench_cuda import DeviceBuffer, ck, cudart

    xb = DeviceBuffer(x.nbytes).upload(to_chw32(x, 0))
    ob = DeviceBuffer(want.nbytes)
    try:
        for round_trip in (False, True):
            engine = trt.Runtime(bench.LOGGER).deserialize_cuda_engine(bytes(blob))
            if round_trip:
                engine = trt.Runtime(bench.LOGGER).deserialize_cuda_engine(engine.serialize())
            ctx = engine.create_execution_context()
            ob.fill(0x7F)
            ptrs = {"x": xb.ptr, "out": ob.ptr}
            assert ctx.execute_async_v2([ptrs[engine.get_binding_name(i)] for i in range(engine.num_bindings)],
                                        int(stream))
            ck(cudart.cudaStreamSynchronize(stream))
            got = ob.download(np.empty_like(want))
            assert (got.view(np.int32) == want.view(np.int32)).all()
    finally:
        xb.free()
        ob.free()
