"""The TensorRT version switch, driven on CPU by stand-ins that offer exactly the builder API each
version documents (8.5: EXPLICIT_BATCH + FP16/INT8 flags; 10: EXPLICIT_BATCH ignored, STRONGLY_TYPED
flag, precision flags kept; 11: always strongly typed, no precision flags), through build_engine."""

import enum
import sys
import types

import pytest
from test_engine import model_dir  # noqa: F401 - the fixture
from trtfuse import engine, trt_compat, trt_graph
from trtfuse.errors import UserError


def fake_tensorrt(version: str):
    major = int(version.split(".")[0])
    if major < 10:
        net_flags = {"EXPLICIT_BATCH": 0, "EXPLICIT_PRECISION": 1}
    elif major == 10:
        net_flags = {"EXPLICIT_BATCH": 0, "STRONGLY_TYPED": 1}
    else:
        net_flags = {"STRONGLY_TYPED": 0, "PREFER_JIT_PYTHON_PLUGINS": 1}
    builder_flags = {"DEBUG": 2, "REFIT": 4}
    if major < 11:
        builder_flags.update(FP16=0, INT8=1)
    trt = types.SimpleNamespace(__version__=version, calls=[])
    trt.NetworkDefinitionCreationFlag = enum.IntEnum("NetworkDefinitionCreationFlag", net_flags)
    trt.BuilderFlag = enum.IntEnum("BuilderFlag", builder_flags)
    trt.MemoryPoolType = types.SimpleNamespace(WORKSPACE=0)
    trt.TopKOperation = types.SimpleNamespace(MAX="max")
    trt.TensorFormat = types.SimpleNamespace(LINEAR=0)
    trt.int32 = "int32"
    trt.Logger = type("Logger", (), {"WARNING": 1, "__init__": lambda self, level=1: None})
    trt.init_libnvinfer_plugins = lambda logger, ns: True

    class Tensor:
        def __init__(self, name, shape, dtype="float"):
            self.name, self.shape, self.dtype, self.allowed_formats = name, shape, dtype, 0

    class Network:
        def __init__(self, flags):
            trt.calls.append(("create_network", flags))
            self.outputs = [Tensor("gemm", (-1, 10))]
            self.input = Tensor("input", (-1, 3, 16, 16))

        num_outputs = property(lambda self: len(self.outputs))
        num_layers = 0   # the fake parser adds none (pin_int8_plugin_outputs then has nothing to pin)

        def get_output(self, i):
            return self.outputs[i]

        def get_input(self, i):
            return self.input

        def add_topk(self, tensor, op, k, axes):
            trt.calls.append(("add_topk", tensor.name, k, axes))
            return types.SimpleNamespace(get_output=lambda i: Tensor(f"topk{i}", (-1, k), "int32"))

        def mark_output(self, tensor):
            self.outputs.append(tensor)
            trt.calls.append(("mark_output", tensor.name))

    class Config:
        def set_memory_pool_limit(self, pool, size):
            pass

        def set_flag(self, flag):
            trt.calls.append(("set_flag", flag.name))

        def set_tactic_sources(self, sources):
            trt.calls.append(("set_tactic_sources", sources))

        def add_optimization_profile(self, profile):
            pass

        def create_timing_cache(self, data):
            return data

        def set_timing_cache(self, cache, ignore_mismatch):
            pass

        def get_timing_cache(self):
            return types.SimpleNamespace(serialize=lambda: b"timing")

    class Builder:
        def __init__(self, logger):
            pass

        create_network = staticmethod(Network)

        def create_builder_config(self):
            return Config()

        def create_optimization_profile(self):
            return types.SimpleNamespace(set_shape=lambda *a: None)

        def build_serialized_network(self, network, config):
            return b"plan:" + ",".join(t.name for t in network.outputs).encode()

    trt.Builder = Builder
    trt.OnnxParser = lambda network, logger: types.SimpleNamespace(parse=lambda data: True, num_errors=0)
    return trt


@pytest.fixture()
def build(model_dir, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("TRTFUSE_HOME", str(tmp_path / "home"))
    # No GPU (nor cuda-python) here: the two calls build_engine makes of the CUDA layer.
    fake_cuda = types.SimpleNamespace(require_gpu=lambda: None, device_name=lambda: "Fake GPU")
    monkeypatch.setitem(sys.modules, "trtfuse.cuda_runtime", fake_cuda)
    monkeypatch.setattr(sys.modules["trtfuse"], "cuda_runtime", fake_cuda, raising=False)

    def run(version, **cfg):
        trt = fake_tensorrt(version)
        monkeypatch.setattr(engine, "import_tensorrt", lambda: trt)
        path = engine.build_engine(model_dir, engine.BuildConfig(**cfg))
        return trt.calls, path

    return run


def test_tensorrt_8_5_int8_is_weakly_typed_with_explicit_batch(build):
    calls, path = build("8.5.3.1", precision="int8")
    assert ("create_network", 1 << 0) in calls
    assert [c[1] for c in calls if c[0] == "set_flag"] == ["FP16", "INT8"]
    assert "-trt8-" in path.name and path.read_bytes() == b"plan:gemm,top_classes"
    assert ("add_topk", "gemm", 5, 1 << 1) in calls and ("mark_output", trt_graph.TOP_CLASSES) in calls
    assert not any(c[0] == "set_tactic_sources" for c in calls)  # TensorRT's own tactics by default


def test_tensorrt_10_keeps_weak_typing_without_the_deprecated_batch_flag(build):
    calls, path = build("10.3.0", precision="int8", tactic_sources="none")
    assert ("create_network", 0) in calls
    assert [c[1] for c in calls if c[0] == "set_flag"] == ["FP16", "INT8"]
    assert ("set_tactic_sources", 0) in calls and "-trt10-" in path.name


def test_tensorrt_11_builds_the_qdq_graph_strongly_typed(build):
    calls, path = build("11.1.0", precision="int8", top_k=0)
    assert ("create_network", 0) in calls
    assert not any(c[0] == "set_flag" for c in calls)  # no INT8/FP16 flags exist: the Q/DQ graph types it
    assert path.read_bytes() == b"plan:gemm" and "-trt11-" in path.name


def test_tensorrt_11_refuses_fp16_it_cannot_express(build):
    with pytest.raises(UserError, match="no FP16 builder flag"):
        build("11.1.0", precision="fp16")


def test_the_cache_keeps_engines_of_each_major_apart(build):
    _, p8 = build("8.5.3.1", precision="fp32")
    _, p11 = build("11.1.0", precision="fp32")
    assert p8 != p11 and p8.is_file() and p11.is_file()


@pytest.mark.parametrize("version, weak", [("8.5.3.1", True), ("10.13.0", True), ("11.1.0", False)])
def test_weak_typing_is_read_from_the_api(version, weak):
    assert trt_compat.weakly_typed(fake_tensorrt(version)) is weak
