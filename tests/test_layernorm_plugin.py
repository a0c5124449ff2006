"""TrtfuseLayerNorm / TrtfuseSkipLayerNorm through TensorRT (marked ``tensorrt``; needs TensorRT's Python API
and a GPU). Runs with TensorRT 8.5 (Python 3.10: tensorrt, numpy, cuda-python; no torch/cupy):

    python3 -m trtfuse.plugin_build build --tensorrt-root $TRT --archs 90      # with $TRT/lib present
    TRTFUSE_PLUGIN_LIB=build/plugins/libtrtfuse_plugins.so python3 -m pytest -m tensorrt tests/test_layernorm_plugin.py

Each test builds a tiny network with the plugin (fields as in docs/ARCHITECTURE.md), runs it and compares
against a float64 numpy reference on random inputs, with NaN-poisoned output buffers.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

pytestmark = pytest.mark.tensorrt

trt = pytest.importorskip("tensorrt")

try:  # cuda-python: new (`cuda.bindings.runtime`) and old (`from cuda import cudart`) layouts
    from cuda.bindings import runtime as cudart
except ImportError:  # pragma: no cover - depends on the cuda-python version
    try:
        from cuda import cudart
    except ImportError:
        pytest.skip("cuda-python is not installed", allow_module_level=True)

LOGGER = trt.Logger(trt.Logger.WARNING)


@pytest.fixture(scope="module")
def registry():
    from trtfuse.plugin_build import library_path

    # The plugin library calls getPluginRegistry() from libnvinfer. It links libnvinfer when built with
    # --tensorrt-root at an install that has lib/; for a header-only build, make libnvinfer global first.
    for name in ("libnvinfer.so." + trt.__version__.split(".")[0], "libnvinfer.so"):
        try:
            ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
            break
        except OSError:
            continue
    ctypes.CDLL(str(library_path("plugins")), mode=ctypes.RTLD_GLOBAL)  # registers the creators
    reg = trt.get_plugin_registry()
    for name in ("TrtfuseLayerNorm", "TrtfuseSkipLayerNorm"):
        assert reg.get_plugin_creator(name, "1", "") is not None, f"{name} not registered"
    return reg


def _check(err):
    err = err[0] if isinstance(err, tuple) else err
    assert int(err) == 0, f"CUDA error {err}"


class DeviceBuffers:
    def __init__(self):
        self.ptrs = []

    def alloc(self, nbytes: int) -> int:
        err, ptr = cudart.cudaMalloc(max(nbytes, 1))
        _check(err)
        self.ptrs.append(ptr)
        return int(ptr)

    def upload(self, arr: np.ndarray) -> int:
        arr = np.ascontiguousarray(arr)
        ptr = self.alloc(arr.nbytes)
        _check(
            cudart.cudaMemcpy(
                ptr, arr.ctypes.data, arr.nbytes, cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
            )
        )
        return ptr

    def download(self, ptr: int, shape, dtype) -> np.ndarray:
        out = np.empty(shape, dtype=dtype)
        _check(
            cudart.cudaMemcpy(
                out.ctypes.data, ptr, out.nbytes, cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
            )
        )
        return out

    def free(self):
        for p in self.ptrs:
            cudart.cudaFree(p)
        self.ptrs = []


def _field_arrays(**values):
    """(name, array, type) per field. A trt.PluginField keeps only a pointer into its array, so the
    arrays must outlive create_plugin (inline temporaries arrive as garbage: NVIDIA/TensorRT#238)."""
    return [
        (name, np.array([v], dtype=np.float32), trt.PluginFieldType.FLOAT32)
        if isinstance(v, float)
        else (name, np.array([v], dtype=np.int32), trt.PluginFieldType.INT32)
        for name, v in values.items()
    ]


def _create(registry, name, **values):
    arrays = _field_arrays(**values)
    fields = trt.PluginFieldCollection([trt.PluginField(*a) for a in arrays])
    return registry.get_plugin_creator(name, "1", "").create_plugin(name.lower(), fields)


def _build(network_fn, fp16: bool):
    """Build and return (serialized plan bytes or None, keep-alive list)."""
    builder = trt.Builder(LOGGER)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH))
    config = builder.create_builder_config()
    if hasattr(config, "set_memory_pool_limit"):
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, 1 << 28)
    if fp16:
        config.set_flag(trt.BuilderFlag.FP16)
    config.set_tactic_sources(0)  # the GPU machine's TensorRT 8.5 has no cuBLAS/cuDNN to load
    keep = network_fn(network)
    plan = builder.build_serialized_network(network, config)
    return (None if plan is None else bytes(plan)), keep


def _run_engine(plan: bytes, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Deserialize, run once with NaN-poisoned outputs, return every output as numpy."""
    runtime = trt.Runtime(LOGGER)
    engine = runtime.deserialize_cuda_engine(plan)
    assert engine is not None, "engine did not deserialize"
    context = engine.create_execution_context()
    bufs = DeviceBuffers()
    try:
        if hasattr(engine, "get_binding_index"):  # TensorRT 8.x
            names = [engine.get_binding_name(i) for i in range(engine.num_bindings)]
            is_input = [engine.binding_is_input(i) for i in range(engine.num_bindings)]
            shapes = [tuple(context.get_binding_shape(i)) for i in range(engine.num_bindings)]
            dtypes = [trt.nptype(engine.get_binding_dtype(i)) for i in range(engine.num_bindings)]
        else:  # TensorRT 10+
            names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
            is_input = [engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT for n in names]
            shapes = [tuple(context.get_tensor_shape(n)) for n in names]
            dtypes = [trt.nptype(engine.get_tensor_dtype(n)) for n in names]
        ptrs, outputs = [], {}
        for name, inp, shape, dt in zip(names, is_input, shapes, dtypes):
            if inp:
                ptrs.append(bufs.upload(inputs[name].astype(dt)))
            else:
                ptrs.append(bufs.upload(np.full(shape, np.nan, dtype=dt)))  # poison
                outputs[name] = (len(ptrs) - 1, shape, dt)
        if hasattr(engine, "get_binding_index"):
            assert context.execute_v2(ptrs), "execute_v2 failed"
        else:
            for name, p in zip(names, ptrs):
                context.set_tensor_address(name, p)
            err, stream = cudart.cudaStreamCreate()
            _check(err)
            assert context.execute_async_v3(int(stream))
            _check(cudart.cudaStreamSynchronize(stream))
            cudart.cudaStreamDestroy(stream)
        _check(cudart.cudaDeviceSynchronize())
        return {n: bufs.download(ptrs[i], s, d) for n, (i, s, d) in outputs.items()}
    finally:
        bufs.free()


def _reference(x, gamma, beta, eps, residual=None, bias=None):
    s = x.astype(np.float64)
    if residual is not None:
        s = s + residual.astype(np.float64)
        if bias is not None:
            s = s + bias.astype(np.float64)
    mean = s.mean(axis=-1, keepdims=True)
    var = ((s - mean) ** 2).mean(axis=-1, keepdims=True)
    inv = 1.0 / np.sqrt(var + eps)
    return (s - mean) * inv * gamma + beta, s, mean[..., 0], inv[..., 0]


def _close(got, ref, fp16, what):
    got = got.astype(np.float64)
    assert np.isfinite(got).all(), f"{what}: unwritten (NaN) or non-finite elements"
    atol, rtol = (4e-3, 2e-3) if fp16 else (1e-4, 1e-4)
    bad = np.abs(got - ref) > atol + rtol * np.abs(ref)
    assert not bad.any(), f"{what}: {bad.sum()} elements off, max err {np.abs(got - ref).max()}"


def _random_inputs(rng, shape, fp16):
    dt = np.float16 if fp16 else np.float32
    x = (rng.standard_normal(shape) * rng.uniform(0.2, 2.0) + rng.uniform(-3, 3)).astype(dt)
    cols = shape[-1]
    gamma = rng.uniform(-0.5, 1.5, cols).astype(np.float32)
    beta = rng.standard_normal(cols).astype(np.float32)
    return x, gamma, beta


def _layernorm_network(registry, shape, fp16, gamma, beta, eps, stats):
    def make(network):
        dt = trt.float16 if fp16 else trt.float32
        x = network.add_input("x", dt, shape)
        g = network.add_constant((shape[-1],), trt.Weights(gamma)).get_output(0)
        b = network.add_constant((shape[-1],), trt.Weights(beta)).get_output(0)
        plugin = _create(registry, "TrtfuseLayerNorm", epsilon=eps, stats_outputs=int(stats))
        assert plugin is not None
        layer = network.add_plugin_v2([x, g, b], plugin)
        y = layer.get_output(0)
        y.name = "y"
        network.mark_output(y)
        y.dtype = dt
        if stats:
            for i, name in ((1, "mean"), (2, "inv_std")):
                t = layer.get_output(i)
                t.name = name
                network.mark_output(t)
        return [gamma, beta, plugin]

    return make


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
@pytest.mark.parametrize("shape", [(2, 3, 384), (5, 768), (4, 1000), (2, 2, 2, 4096), (1, 7, 33)])
def test_layernorm_plugin_matches_reference(registry, fp16, shape):
    rng = np.random.default_rng()
    x, gamma, beta = _random_inputs(rng, shape, fp16)
    eps = 1e-5
    stats = shape == (2, 3, 384)
    plan, _keep = _build(_layernorm_network(registry, shape, fp16, gamma, beta, eps, stats), fp16)
    assert plan is not None, "engine build failed"
    out = _run_engine(plan, {"x": x})
    ref, _, mean, inv = _reference(x, gamma, beta, eps)
    assert out["y"].shape == shape
    _close(out["y"], ref, fp16, f"y {shape}")
    if stats:
        assert out["mean"].shape == shape[:-1] and out["inv_std"].shape == shape[:-1]
        np.testing.assert_allclose(out["mean"], mean, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(out["inv_std"], inv, rtol=1e-4)


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
@pytest.mark.parametrize("has_bias,sum_output", [(1, 1), (0, 0), (1, 0)])
def test_skip_layernorm_plugin_matches_reference(registry, fp16, has_bias, sum_output):
    rng = np.random.default_rng()
    shape = (2, 3, 384)
    x, gamma, beta = _random_inputs(rng, shape, fp16)
    r = (rng.standard_normal(shape) * 0.5).astype(x.dtype)
    bias = rng.standard_normal(shape[-1]).astype(np.float32)
    eps = 1e-6

    def make(network):
        dt = trt.float16 if fp16 else trt.float32
        xin = network.add_input("x", dt, shape)
        rin = network.add_input("residual", dt, shape)
        consts = [gamma, beta] + ([bias] if has_bias else [])
        tensors = [network.add_constant((shape[-1],), trt.Weights(c)).get_output(0) for c in consts]
        plugin = _create(
            registry, "TrtfuseSkipLayerNorm", epsilon=eps, has_bias=has_bias, sum_output=sum_output
        )
        assert plugin is not None
        layer = network.add_plugin_v2([xin, rin] + tensors, plugin)
        for i, name in enumerate(["y", "sum"][: 1 + sum_output]):
            t = layer.get_output(i)
            t.name = name
            network.mark_output(t)
            t.dtype = dt
        return consts + [plugin]

    plan, _keep = _build(make, fp16)
    assert plan is not None, "engine build failed"
    out = _run_engine(plan, {"x": x, "residual": r})
    ref, s, _, _ = _reference(x, gamma, beta, eps, r, bias if has_bias else None)
    _close(out["y"], ref, fp16, "skip y")
    if sum_output:
        _close(out["sum"], s, fp16, "skip sum")


def test_engine_serialization_round_trip(registry):
    """serialize -> deserialize -> serialize again -> deserialize: the plugin's fields survive both trips."""
    rng = np.random.default_rng()
    shape = (3, 768)
    x, gamma, beta = _random_inputs(rng, shape, False)
    eps = 0.25  # far from the default, so a lost field shows in the output
    plan, _keep = _build(_layernorm_network(registry, shape, False, gamma, beta, eps, True), False)
    assert plan is not None
    engine = trt.Runtime(LOGGER).deserialize_cuda_engine(plan)
    plan2 = bytes(engine.serialize())
    out = _run_engine(plan2, {"x": x})
    ref, _, _, inv = _reference(x, gamma, beta, eps)
    _close(out["y"], ref, False, "round trip y")
    np.testing.assert_allclose(out["inv_std"], inv, rtol=1e-4)


def test_refuses_bad_fields(registry):
    # Logged reason on stderr ("trtfuse: TrtfuseLayerNorm refused: ..."), and no plugin.
    assert _create(registry, "TrtfuseLayerNorm", epsilon=1e-5, stats_outputs=2) is None
    assert _create(registry, "TrtfuseLayerNorm", epsilon=-1.0, stats_outputs=0) is None
    assert _create(registry, "TrtfuseSkipLayerNorm", epsilon=1e-5, has_bias=3, sum_output=0) is None
    assert _create(registry, "TrtfuseLayerNorm", epsilon=1e-5, stats_outputs=0) is not None


def test_refuses_gamma_of_the_wrong_length(registry):
    shape = (2, 64)
    gamma = np.ones(32, dtype=np.float32)  # wrong: x has 64 columns
    beta = np.zeros(32, dtype=np.float32)

    def make(network):
        x = network.add_input("x", trt.float32, shape)
        g = network.add_constant((32,), trt.Weights(gamma)).get_output(0)
        b = network.add_constant((32,), trt.Weights(beta)).get_output(0)
        plugin = _create(registry, "TrtfuseLayerNorm", epsilon=1e-5, stats_outputs=0)
        layer = network.add_plugin_v2([x, g, b], plugin)
        network.mark_output(layer.get_output(0))
        return [gamma, beta, plugin]

    try:
        plan, _ = _build(make, False)
    except Exception:  # some TensorRT versions raise instead of returning None
        plan = None
    assert plan is None, "a gamma of the wrong length must not build"
