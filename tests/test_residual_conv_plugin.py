"""TrtfuseResidualConv inside TensorRT: one small layer, exact against the rounding rule, and a serialize round trip;
the same for the projection + tail form (proj_* fields, inputs [x, xp]).

The TensorRT tests need TensorRT's Python API, cuda-python, a GPU and libtrtfuse_plugins.so (`trtfuse plugins build
--tensorrt-root`). The host check (the creator's fields and refusals, the serialization, configurePlugin's refusals)
needs neither GPU nor TensorRT runtime: nvcc, TensorRT's headers and libtrtfuse_kernels.so.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

tensorrt = pytest.mark.tensorrt

ROOT = Path(__file__).resolve().parent.parent
HOST_CHECK = ROOT / "tests" / "residual_conv_plugin_host.cpp"
HEADER_SETS = ROOT.parent / "shared" / "third_party" / "tensorrt"
PROJ_FIELDS = ("proj_weights", "proj_w_scale", "proj_bias", "proj_x_scale", "proj_out_scale", "proj_cin",
               "proj_stride")
NEXT_FIELDS = ("next_weights", "next_w_scale", "next_bias", "next_x_scale", "next_out_scale", "next_cout", "next_relu")


def run_host_check(source: Path, version: str, tmp_path: Path, timeout: float) -> subprocess.CompletedProcess:
    """Compiles a plugin's host check (a .cpp that includes the plugin's source, no GPU and no libnvinfer needed)
    against TensorRT header set ``version`` and the kernels library, runs it and returns the run; skips without nvcc,
    the headers or the library. Its build must succeed."""
    from trtfuse.errors import UserError
    from trtfuse.plugin_build import library_path, plugins_source_dir

    nvcc = os.environ.get("CUDACXX") or shutil.which("nvcc")
    include = HEADER_SETS / version / "include"
    if not nvcc:
        pytest.skip("nvcc not installed")
    if not (include / "NvInfer.h").is_file():
        pytest.skip(f"TensorRT {version} headers are not beside this checkout")
    try:
        lib = library_path("kernels")
    except UserError as e:
        pytest.skip(f"kernels library not built: {e}")
    exe = tmp_path / source.stem
    cmd = [nvcc, "-std=c++17", "-Xcompiler", "-Wall", "-Wno-deprecated-declarations", f"-I{plugins_source_dir()}",
           f"-I{include}", str(source), str(lib), "-Xlinker", f"-rpath={lib.parent}", "-o", str(exe)]
    built = subprocess.run(cmd, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    return subprocess.run([str(exe)], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def side():
    mod = importlib.import_module("trtfuse.bench.layers.residual")
    mod.load_plugin_library()
    return mod


@tensorrt
@pytest.mark.parametrize(
    "relu,residual,stride",
    [(True, True, 1), (False, True, 1), (False, False, 1), (False, False, 2), (True, False, 2)],
    ids=["tail", "tail-identity", "projection", "projection-stride2", "conv1-relu-stride2"],
)
def test_plugin_engine_exact_and_round_trip(side, relu, residual, stride):
    stream = side.ck(side.cudart.cudaStreamCreate())
    res = side.plugin_round_trip_check(np.random.default_rng(), stream, relu, residual, stride)
    assert res["built"]["diff_1lsb"] == 0 and res["built"]["diff_more"] == 0
    assert res["round_trip"]["diff_1lsb"] == 0 and res["round_trip"]["diff_more"] == 0
    assert any("PluginV2" in line or "residual_conv" in line for line in res["layers"]), res[
        "layers"
    ]


@tensorrt
def test_creator_refuses_bad_fields(side):
    import tensorrt as trt
    from trtfuse.ops import residual_conv_reference as ref

    L = ref.random_layer(np.random.default_rng(), 64, 32)
    creator = side.plugin_creator()
    names = {f.name for f in creator.field_names}
    assert names == {
        "weights",
        "w_scale",
        "bias",
        "x_scale",
        "r_scale",
        "out_scale",
        "relu",
        "cin",
        "cout",
        "stride",
        "kernel_size",
        *PROJ_FIELDS,
        *NEXT_FIELDS,
    }
    assert side.create_plugin("ok", L, 64, 32) is not None
    bad = dict(L, out_scale=-1.0)
    assert side.create_plugin("bad", bad, 64, 32) is None
    assert (
        side.create_plugin("bad", L, 64, 33) is None
    )  # weights size != cin * cout
    assert side.create_plugin("bad", dict(L, stride=3), 64, 32) is None
    assert side.create_plugin("projection", dict(L, r_scale=0.0, stride=2), 64, 32) is not None
    del trt


# ----------------------------------------------------------------------------- projection + tail (the fused form)
class FusedFields:
    """The tail's fields (trtfuse.bench.layers.common.PluginFields) plus the projection's proj_* fields; the arrays
    live as long as this object (a trt.PluginField keeps only a pointer). drop: field names left out; edit: values
    replaced (name -> array)."""

    def __init__(self, side, T, P, cin, cout, stride, drop=(), edit=None):
        import tensorrt as trt

        self.both = side.PluginFields(T, cin, cout, dict(P, stride=stride))
        edit = edit or {}
        self.arrays = self.both.arrays
        self.arrays = [(n, edit.get(n, a), t) for n, a, t in self.arrays if n not in drop]
        self.fields = [trt.PluginField(*a) for a in self.arrays]
        self.collection = trt.PluginFieldCollection(self.fields)

    def create(self, side, name="proj_tail"):
        return side.plugin_creator().create_plugin(name, self.collection)


def _fused_layers(rng, pcin, cin, cout):
    """The tail (ReLU, a residual) and the projection (no ReLU, no residual) of a stage's first block."""
    from trtfuse.ops import residual_conv_reference as ref

    T, P = ref.random_layer(rng, cin, cout, True), ref.random_layer(rng, pcin, cout, False)
    P["r_scale"] = 0.0
    return T, P


def _fused_engine(side, T, P, n, pcin, cin, cout, hw, stride):
    """A one-layer engine: int8 kCHW32 inputs x [n, cin, ho, ho] and xp [n, pcin, hw, hw], the fused plugin."""
    import tensorrt as trt

    builder = trt.Builder(side.LOGGER)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH))
    ho = -(-hw // stride)
    x = network.add_input("x", trt.int8, (n, cin, ho, ho))
    side._int8_io(x, T["x_scale"])
    xp = network.add_input("xp", trt.int8, (n, pcin, hw, hw))
    side._int8_io(xp, P["x_scale"])
    fields = FusedFields(side, T, P, cin, cout, stride)
    plugin = fields.create(side)
    assert plugin is not None, "create_plugin refused the fused fields (see stderr)"
    out = network.add_plugin_v2([x, xp], plugin).get_output(0)
    assert tuple(out.shape) == (n, cout, ho, ho)
    engine, _ = side.finish_engine(builder, network, out, T["out_scale"], "fused plugin")
    return engine


def _run_fused(side, engine, x32, xp32, out_like, stream):
    bufs = {"x": side.DeviceBuffer(x32.nbytes).upload(x32), "xp": side.DeviceBuffer(xp32.nbytes).upload(xp32),
            "out": side.DeviceBuffer(out_like.nbytes)}
    bufs["out"].fill(0x5A)  # poison
    try:
        ctx = engine.create_execution_context()
        names = [engine.get_binding_name(i) for i in range(engine.num_bindings)]
        assert ctx.execute_async_v2([bufs[nm].ptr for nm in names], int(stream)), "execute_async_v2 failed"
        side.ck(side.cudart.cudaStreamSynchronize(stream))
        return bufs["out"].download(out_like)
    finally:
        for b in bufs.values():
            b.free()


# (n, proj_cin, cin, cout, hw, stride): hw the block input's (the projection's) size
FUSED = [
    (2, 64, 64, 256, 9, 1),  # ResNet-50 layer1.0's class: the fused kernel on sm90
    (3, 256, 128, 512, 9, 2),  # layer2.0's class, stride 2, odd input size
    (1, 96, 40, 72, 5, 2),  # channels not multiples of 32 (padded)
    (2, 512, 256, 1024, 5, 2),  # layer3.0's class: both weight matrices never fit, two launches through the workspace
]


@tensorrt
@pytest.mark.parametrize("shape", FUSED, ids=lambda s: "x".join(map(str, s[:5])) + f"_s{s[5]}")
def test_fused_plugin_engine_exact_and_round_trip(side, shape):
    """The fused form in TensorRT: exactly the projection's rounding rule composed with the tail's (the projection's
    int8 output is the tail's residual), before and after engine serialization (the RCV5 blob)."""
    from trtfuse.ops import residual_conv_reference as ref

    n, pcin, cin, cout, hw, stride = shape
    ho = -(-hw // stride)
    rng = np.random.default_rng()
    T, P = _fused_layers(rng, pcin, cin, cout)
    x = rng.integers(-128, 128, size=(n, cin, ho, ho), dtype=np.int8)
    xp = rng.integers(-128, 128, size=(n, pcin, hw, hw), dtype=np.int8)
    r = ref.reference_fp32(xp, P["w"], P["w_scale"], P["bias"], None, P["x_scale"], 0.0, P["out_scale"], False,
                           stride=stride)
    want = ref.reference_fp32(x, T["w"], T["w_scale"], T["bias"], r, T["x_scale"], T["r_scale"], T["out_scale"],
                              True)
    stream = side.ck(side.cudart.cudaStreamCreate())
    engine = _fused_engine(side, T, P, n, pcin, cin, cout, hw, stride)
    side.check_binding_formats(engine)
    x32, xp32 = ref.to_nc32hw32(x), ref.to_nc32hw32(xp)
    out_like = np.empty((n, -(-cout // 32), ho, ho, 32), np.int8)
    got = ref.from_nc32hw32(_run_fused(side, engine, x32, xp32, out_like, stream), cout)
    assert side.compare("fused plugin", got, want, exact=True)["ok"]
    import tensorrt as trt

    engine2 = trt.Runtime(side.LOGGER).deserialize_cuda_engine(engine.serialize())
    assert engine2 is not None, "deserializing the fused plugin engine failed"
    got2 = ref.from_nc32hw32(_run_fused(side, engine2, x32, xp32, out_like, stream), cout)
    assert side.compare("fused plugin after serialize/deserialize", got2, want, exact=True)["ok"]


@tensorrt
def test_creator_refuses_bad_fused_fields(side):
    rng = np.random.default_rng()
    T, P = _fused_layers(rng, 96, 64, 128)

    def create(**kw):
        return FusedFields(side, T, P, 64, 128, 2, **kw).create(side)

    assert create() is not None
    assert create(drop=("proj_stride",)) is not None  # optional: 1
    for name in set(PROJ_FIELDS) - {"proj_stride"}:  # all or none
        assert create(drop=(name,)) is None, name
    assert create(drop=PROJ_FIELDS) is not None  # none: the plain tail
    assert create(edit={"proj_stride": np.array([3], np.int32)}) is None
    assert create(edit={"r_scale": np.array([0.0], np.float32)}) is None  # the tail's residual scale is required
    assert create(edit={"stride": np.array([2], np.int32)}) is None  # the tail runs at stride 1
    assert create(edit={"proj_cin": np.array([95], np.int32)}) is None  # proj_weights != cout * proj_cin
    bad = P["w"].astype(np.int32).reshape(-1).copy()
    bad[0] = -128
    assert create(edit={"proj_weights": bad}) is None
    assert create(edit={"proj_out_scale": np.array([-1.0], np.float32)}) is None


# ----------------------------------------------------------------------------- host check (no GPU, no TensorRT runtime)
@pytest.mark.slow
@pytest.mark.parametrize("version", ["8.5.3", "11.1"])
def test_plugin_fields_and_serialization_on_the_host(version, tmp_path):
    """tests/residual_conv_plugin_host.cpp, compiled against each TensorRT header set with the plugin's own source:
    the creator's proj_* and next_* fields (all or none, proj_stride optional; next_* on a tail or the stem) and
    refusals, the RCV5 round trip of every form, RCV4, RCV3, RCV2 and RCV1 blobs refused, truncated or foreign blobs
    refused, and configurePlugin's refusals by name."""
    res = run_host_check(HOST_CHECK, version, tmp_path, timeout=300)
    print(res.stdout)
    assert res.returncode == 0 and "FAIL" not in res.stdout, res.stdout + res.stderr
    assert "failures 0" in res.stdout
    assert "missing field proj_bias (the proj_* fields come all together)" in res.stderr
    for old in (1, 2, 3, 4):  # older engines' blobs: refused with the fix named
        assert f"a TrtfuseResidualConv blob of an older format (RCV{old}): rebuild the engine" in res.stderr
    assert "needs r_scale > 0" in res.stderr
    assert "missing field next_relu (the next_* fields come all together)" in res.stderr
    assert "next_weights (the next_* fields) given to a layer that is neither a tail nor the stem" in res.stderr
    configure = res.stderr.split("--- configure\n")[1:]
    assert len(configure) == 9
    assert "xp has 100 channels, proj_cin = 96" in configure[0]
    assert "x must be [N, cin, ceil(H/proj_stride), ceil(W/proj_stride)]" in configure[1]
    assert "x has 65 channels, cin = 64" in configure[2]
    assert "expects inputs [x, xp]" in configure[3]
    assert configure[4] == ""  # x 5x5 for xp 9x10 at stride 2: accepted
    assert "expects inputs [x, r] and two outputs [out, next_out] (next_* fields)" in configure[5]
    assert configure[6] == ""  # a tail with a next conv, two outputs: accepted
    assert "expects input [x] and two outputs [out, next_out] (next_* fields) (the stem)" in configure[7]
    assert configure[8] == ""  # the stem with a next conv, two outputs: accepted
