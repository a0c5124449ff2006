"""Triton's own TensorRT backend on CPU: `trtfuse triton build-backend` builds libtriton_tensorrt.so from
the r24.10 sources against TensorRT 8.5 (or the test says which prerequisite is missing), PyTriton's
tritonserver loads it (API 1.19) and refuses an exported model for want of a GPU in one line; and the
one-line refusals of `trtfuse triton serve` before the server starts: a plan another TensorRT wrote, a
plugin library missing or linked against another TensorRT, a config.pbtxt that is wrong, a backend
built for another nvidia-pytriton."""

import argparse
import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import onnx
import pytest
from conftest import gpu_available
from conftest_harness import tiny_model
from test_engine import model_dir  # noqa: F401 - fixture
from trtfuse.engine import BuildConfig
from trtfuse.errors import UserError
from trtfuse.models import default_model_dir
from trtfuse.models.prepared import write_prepared
from trtfuse.triton import backend_build, export, native
from trtfuse.triton.elf import read_dynamic

pytest.importorskip("tritonclient.grpc.model_config_pb2", reason="tritonclient is not installed (pip install '.[triton]')")

SOURCES = backend_build.SHARED / "triton"
needs_cc = pytest.mark.skipif(not shutil.which("gcc"), reason="gcc is not installed")


def _dist():
    from trtfuse.triton import tritonserver

    try:
        return tritonserver.bundled()
    except UserError as e:
        pytest.skip(f"PyTriton's tritonserver is not here: {e}")


def shared_library(path: Path, needed: list[str] = (), link_dir: Path | None = None) -> Path:
    """A small ELF library whose DT_NEEDED is ``needed`` (each a stand-in with that soname in link_dir)."""
    work = path.parent / f".{path.name}.src"
    work.mkdir(parents=True, exist_ok=True)
    link_dir = link_dir or work
    for name in needed:
        if not (link_dir / name).exists():
            (work / "dep.c").write_text("int trtfuse_dep;\n")
            subprocess.run(["gcc", "-shared", "-fPIC", f"-Wl,-soname,{name}", str(work / "dep.c"), "-o",
                            str(link_dir / name)], check=True)
    (work / "lib.c").write_text("int trtfuse_lib;\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,--no-as-needed", str(work / "lib.c"), "-o", str(path),
                    f"-L{link_dir}", *[f"-l:{n}" for n in needed]], check=True)
    return path


def plan_bytes(tag: int) -> bytes:
    """Bytes that start like a TensorRT plan with serialization tag ``tag`` (the word at byte 8)."""
    return b"ptrt" + bytes(4) + struct.pack("<I", tag) + os.urandom(64)


@pytest.fixture
def prepared(tmp_path, monkeypatch):
    monkeypatch.setenv("TRTFUSE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TRTFUSE_BUILD_DIR", str(tmp_path / "no-build"))
    monkeypatch.delenv("TRTFUSE_PLUGIN_LIB", raising=False)
    monkeypatch.delenv("TENSORRT_LIB_DIR", raising=False)
    monkeypatch.setattr(export, "usable_tensorrt", lambda: None)
    model = tiny_model(tmp_path)
    return write_prepared(onnx.load(model.onnx_path), model, default_model_dir("tiny"))


def exported(prepared, tmp_path, tag: int = 232, tensorrt: str = "8.5.3.1", plugin: Path | None = None) -> Path:
    """`trtfuse triton export` of a stand-in engine (plan bytes of ``tag``, ENGINE.json saying ``tensorrt``)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    engine = tmp_path / "tiny-int8-b256.engine"
    engine.write_bytes(plan_bytes(tag))
    cfg = BuildConfig(precision="int8", batch=256, profiles=2, input_format="int8", plugins=plugin is not None)
    engine.with_suffix(".json").write_text(json.dumps({"model": "tiny", "config": cfg.key(), "tensorrt": tensorrt,
                                                       "gpu": "NVIDIA H100 80GB HBM3", "build_s": 1.0}))
    return export.export_repository(prepared, engine, tmp_path / "repo", plugin_lib=plugin).parent


def serve_args(repo: Path, tmp_path: Path, **kw) -> argparse.Namespace:
    from trtfuse.triton.process import free_port

    args = dict(repository=str(repo), backend_dir=None, tensorrt_lib=None, plugin_lib=None, skip_plan_check=False,
                grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(), ready_file=None,
                ready_timeout_s=60.0, workspace=str(tmp_path / "ws"), log_verbose=0)
    args.update(kw)
    return argparse.Namespace(**args)


# ----------------------------------------------------------------------------- the build, its parts
def test_the_loader_patch_guards_only_the_8_6_call():
    loader = SOURCES / "tensorrt_backend" / "src_trt8" / "loader.cc"
    if not loader.is_file():
        pytest.skip("Triton's sources are not beside this checkout (../shared/third_party/triton)")
    text = loader.read_text()
    patched = backend_build.patch_loader(text)
    start = patched.index(backend_build.GUARD)
    guarded = patched[start:patched.index("#endif\n", start)]
    assert "setEngineHostCodeAllowed(true)" in guarded and guarded.count("{") == guarded.count("}")
    assert patched.replace(backend_build.GUARD, "").replace("#endif\n", "", 1) == text
    with pytest.raises(UserError, match="not r24.10's"):
        backend_build.patch_loader(text.replace("getEngineHostCodeAllowed", "somethingElse"))


def _build_args(tmp_path, **kw):
    args = dict(out=str(tmp_path / "out"), sources=None, tensorrt_include=None, tensorrt_lib=None,
                tensorrt_wheel=None, wheels=str(tmp_path / "wheels"), download=False, jobs=2)
    args.update(kw)
    return argparse.Namespace(**args)


def test_build_errors_name_what_is_missing(tmp_path, monkeypatch):
    (tmp_path / "src" / "tensorrt_backend").mkdir(parents=True)
    with pytest.raises(UserError, match=r"sources are not complete under .*src \(no tensorrt_backend, backend, "
                                        r"common, core\).*--sources"):
        backend_build.build_backend(_build_args(tmp_path, sources=str(tmp_path / "src")), progress=lambda *_: None)
    if not (SOURCES / "tensorrt_backend").is_dir():
        pytest.skip("Triton's sources are not beside this checkout")
    with pytest.raises(UserError, match="TensorRT's headers are not in .*NvInferVersion.h"):
        backend_build.build_backend(_build_args(tmp_path, tensorrt_include=str(tmp_path)), progress=lambda *_: None)
    # The TensorRT libraries: neither a wheel nor a folder.
    monkeypatch.setattr(backend_build, "find_tools", lambda: {})
    monkeypatch.setattr(backend_build, "server_files", lambda: (Path("s.so"), Path("c.so.12.6.77"), "12.6.77"))
    with pytest.raises(UserError, match=r"TensorRT 8\.5\.3's libraries are missing: no tensorrt-8\.5\.3\*-cp310 "
                                        r"wheel.*--download"):
        backend_build.build_backend(_build_args(tmp_path), progress=lambda *_: None)
    with pytest.raises(UserError, match=r"TensorRT's libraries are not in .* \(no libnvinfer.so.8, "
                                        r"libnvinfer_plugin.so.8\)"):
        backend_build.build_backend(_build_args(tmp_path, tensorrt_lib=str(tmp_path)), progress=lambda *_: None)


def _build_prerequisites() -> str | None:
    """Why the backend cannot be built here, or None."""
    if not (SOURCES / "tensorrt_backend" / "src_trt8").is_dir():
        return "Triton's sources are not beside this checkout (../shared/third_party/triton)"
    try:
        backend_build.find_tools()
        backend_build.server_files()
    except UserError as e:
        return str(e)
    return None


@pytest.fixture(scope="session")
def built_backend(tmp_path_factory) -> Path:
    """The backend as `trtfuse triton build-backend` builds it: the one in build/triton_backend where a
    build is there, else built now (the wheels fetched with pip where they are not at hand)."""
    out = backend_build.default_out()
    lib = out / "tensorrt" / backend_build.BACKEND_LIB
    if lib.is_file() and (lib.parent / "BUILD.json").is_file():
        return lib
    why = _build_prerequisites()
    if why:
        pytest.skip(f"cannot build Triton's TensorRT backend here: {why}")
    args = argparse.Namespace(out=None, sources=None, tensorrt_include=None, tensorrt_lib=None, tensorrt_wheel=None,
                              wheels=None, download=False, jobs=None)
    try:
        backend_build.gather(args, out, progress=lambda *_: None)
    except UserError as e:
        if "--download" not in e.fix:
            raise
        args.download = True  # the wheels are not here: pip fetches them (a registry, the only network step)
        try:
            backend_build.download_wheels(out / "wheels", progress=print)
        except UserError as e2:
            pytest.skip(f"the TensorRT / CUDA wheels are not here and pip cannot fetch them: {e2.problem}")
    return backend_build.build_backend(args, progress=print)


@pytest.mark.slow
def test_the_backend_builds_for_the_bundled_server(built_backend):
    dyn = read_dynamic(built_backend)
    info = json.loads((built_backend.parent / "BUILD.json").read_text())
    dist = _dist()
    assert info["tensorrt"].startswith("8.5")
    # The server's own library and CUDA runtime (renamed in nvidia_pytriton.libs), TensorRT 8's libraries.
    assert info["server_library"] in dyn.needed and (dist.libs / info["server_library"]).is_file()
    assert info["cuda_runtime"] in dyn.needed and (dist.libs / info["cuda_runtime"]).is_file()
    assert {"libnvinfer.so.8", "libnvinfer_plugin.so.8"} <= set(dyn.needed)
    assert not [n for n in dyn.needed if n in ("libtritonserver.so", "libcudart.so.12", "libcudart.so.13")]
    runtime = built_backend.parent.parent / "runtime"
    assert (runtime / "libnvinfer.so.8").exists() and (runtime / "libnvinfer_plugin.so.8").exists()


@pytest.mark.slow
def test_the_server_loads_the_backend_and_refuses_the_model_without_a_gpu(built_backend, prepared, tmp_path):
    if gpu_available():
        pytest.skip("a GPU is visible: the model would load (tools/device_trt.sh triton-native serves it)")
    _dist()
    plugin = shared_library(tmp_path / "libtrtfuse_plugins.so", ["libnvinfer.so.8"])
    repo = exported(prepared, tmp_path, plugin=plugin)
    args = serve_args(repo, tmp_path, backend_dir=str(built_backend.parent.parent))
    with pytest.raises(UserError) as e:
        native.serve(args)
    assert "tritonserver sees no usable GPU 0" in e.value.problem and "none" in e.value.problem
    assert "\n" not in str(e.value)
    log = (tmp_path / "ws" / "tritonserver.log").read_text()
    # The server found and loaded the backend library, which checked the API version and loaded the plugins.
    assert f"OpenLibraryHandle: {built_backend}" in log or "TRITONBACKEND_Initialize: tensorrt" in log
    assert "TRITONBACKEND_Initialize: tensorrt" in log
    assert "'tensorrt' TRITONBACKEND API version: 1.19" in log
    assert f"plugins\\\":\\\"{repo / 'tiny' / 'plugins' / 'libtrtfuse_plugins.so'}" in log
    assert "unable to load shared library" not in log


@pytest.mark.slow
def test_a_plugin_library_that_does_not_load_is_named_by_the_server(built_backend, prepared, tmp_path):
    """Linked against TensorRT 8, so the check before the start passes; the server's dlopen fails."""
    _dist()
    deps = tmp_path / "deps"
    deps.mkdir()
    plugin = shared_library(tmp_path / "libtrtfuse_plugins.so", ["libnvinfer.so.8", "libtrtfuse_absent.so.1"], deps)
    repo = exported(prepared, tmp_path, plugin=plugin)
    (deps / "libtrtfuse_absent.so.1").unlink()
    with pytest.raises(UserError) as e:
        native.serve(serve_args(repo, tmp_path, backend_dir=str(built_backend.parent.parent)))
    assert "tritonserver could not load the plugin library" in e.value.problem
    assert "libtrtfuse_absent.so.1: cannot open shared object file" in e.value.problem


# ----------------------------------------------------------------------------- refusals before the server
@pytest.fixture
def fake_backend(tmp_path, monkeypatch) -> Path:
    """A backend folder whose library needs nothing (the checks read its DT_NEEDED, nothing runs it)."""
    if not shutil.which("gcc"):
        pytest.skip("gcc is not installed")
    folder = tmp_path / "backend"
    (folder / "tensorrt").mkdir(parents=True)
    shared_library(folder / "tensorrt" / backend_build.BACKEND_LIB)
    (folder / "tensorrt" / "BUILD.json").write_text(json.dumps({"tensorrt": "8.5.3"}))
    (folder / "runtime").mkdir()
    return folder


def _refused(args) -> UserError:
    with pytest.raises(UserError) as e:
        native.serve(args)
    assert "\n" not in str(e.value), str(e.value)
    assert not (Path(args.workspace) / "tritonserver.log").exists(), "refused only after starting the server"
    return e.value


@needs_cc
def test_a_plan_of_another_tensorrt_is_refused(prepared, tmp_path, fake_backend):
    _dist()
    repo = exported(prepared, tmp_path, tag=205)
    e = _refused(serve_args(repo, tmp_path, backend_dir=str(fake_backend)))
    assert "model.plan was built by TensorRT 8.2; the backend runs TensorRT 8.5.3 (tag 232)" in e.problem
    repo = exported(prepared, tmp_path / "b", tag=239)
    e = _refused(serve_args(repo, tmp_path, backend_dir=str(fake_backend)))
    assert "built by another TensorRT (serialization tag 239)" in e.problem
    # What the export recorded says it first.
    repo = exported(prepared, tmp_path / "c", tensorrt="10.3.0.26")
    e = _refused(serve_args(repo, tmp_path, backend_dir=str(fake_backend)))
    assert "engine built by TensorRT 10.3.0.26" in e.problem and "rebuild the engine with TensorRT 8.5.3" in e.fix


@needs_cc
def test_plugin_libraries_missing_or_of_another_tensorrt_are_refused(prepared, tmp_path, fake_backend):
    _dist()
    plugin = shared_library(tmp_path / "libtrtfuse_plugins.so", ["libnvinfer.so.10"])
    repo = exported(prepared, tmp_path, plugin=plugin)
    e = _refused(serve_args(repo, tmp_path, backend_dir=str(fake_backend)))
    assert "was built against TensorRT 10 (it needs libnvinfer.so.10); the backend runs TensorRT 8.5.3" in e.problem
    (repo / "tiny" / "plugins" / "libtrtfuse_plugins.so").unlink()
    e = _refused(serve_args(repo, tmp_path, backend_dir=str(fake_backend)))
    assert "model 'tiny' needs trtfuse's plugin library" in e.problem and "holds none" in e.problem
    e = _refused(serve_args(repo, tmp_path, backend_dir=str(fake_backend), plugin_lib=[str(tmp_path / "nowhere.so")]))
    assert "the TensorRT plugin library" in e.problem and "nowhere.so does not exist" in e.problem


@needs_cc
@pytest.mark.parametrize("case, match", [
    ("garbage", r"config.pbtxt: config.pbtxt does not parse with Triton's schema"),
    ("python", r"config.pbtxt is for 'python', not Triton's TensorRT backend"),
    ("renamed", r"names the model 'other', but its folder is 'tiny'"),
    ("no-plan", r"1/model.plan is missing"),
    ("no-config", r"tiny has no config.pbtxt"),
])
def test_a_wrong_repository_is_refused(prepared, tmp_path, fake_backend, case, match):
    _dist()
    repo = exported(prepared, tmp_path)
    config = repo / "tiny" / "config.pbtxt"
    text = config.read_text()
    if case == "garbage":
        config.write_text(text.replace("max_batch_size", "max_batch_sise"))
    elif case == "python":
        config.write_text(text.replace('platform: "tensorrt_plan"', 'backend: "python"'))
    elif case == "renamed":
        config.write_text(text.replace('name: "tiny"', 'name: "other"'))
    elif case == "no-plan":
        (repo / "tiny" / "1" / "model.plan").unlink()
    else:
        config.unlink()
    e = _refused(serve_args(repo, tmp_path, backend_dir=str(fake_backend)))
    assert __import__("re").search(match, str(e)), str(e)


@needs_cc
def test_a_backend_missing_or_built_for_another_server_is_refused(prepared, tmp_path, fake_backend):
    dist = _dist()
    repo = exported(prepared, tmp_path)
    e = _refused(serve_args(repo, tmp_path, backend_dir=str(tmp_path / "nothing")))
    assert "TensorRT backend is not built" in e.problem and "trtfuse triton build-backend" in e.fix
    lib = fake_backend / "tensorrt" / backend_build.BACKEND_LIB
    shared_library(lib, ["libtritonserver-00000000.so"], link_dir=tmp_path)
    e = _refused(serve_args(repo, tmp_path, backend_dir=str(fake_backend)))
    assert "built for another nvidia-pytriton: it needs libtritonserver-00000000.so" in e.problem
    # TensorRT's libraries, where the backend needs them, must be in the runtime folder.
    server = next(dist.libs.glob("libtritonserver*.so"))
    shared_library(lib, [server.name, "libnvinfer.so.8"], link_dir=tmp_path)
    e = _refused(serve_args(repo, tmp_path, backend_dir=str(fake_backend)))
    assert "TensorRT's libnvinfer.so.8 (which the backend loads) not found in" in e.problem


# ----------------------------------------------------------------------------- what the server says
@pytest.mark.parametrize("line, problem", [
    ('E1128 03:10:51.432196 12217 model_lifecycle.cc:642] "failed to load \'m\' version 1: Invalid argument: '
     'instance group m_0 of model m specifies invalid or unsupported gpu id 0. GPUs with at least the minimum '
     'required CUDA compute compatibility of 6.000000 are: "',
     "tritonserver sees no usable GPU 0 (GPUs of compute capability >= 6 it sees: none)"),
    ('E1128 03:10:51.432129 12217 tensorrt.cc:145] "unable to load shared library: /r/m/plugins/libp.so: '
     'undefined symbol: _ZN8nvinfer1"',
     "could not load the plugin library /r/m/plugins/libp.so: undefined symbol: _ZN8nvinfer1"),
    ("E1128 03:10:51 1 logging.cc:43] 1: [stdArchiveReader.cpp::StdArchiveReader::40] Error Code 1: Serialization "
     "(Serialization assertion stdVersionRead == serializationVersion failed.Version tag does not match. Note: "
     "Current Version: 232, Serialized Engine Version: 205)",
     "it was built by another TensorRT (Current Version: 232, Serialized Engine Version: 205)"),
    ("E1128 03:10:51 1 logging.cc:43] 1: [pluginV2Runner.cpp::load::300] Error Code 1: Serialization "
     "(Serialization assertion creator failed.Cannot deserialize plugin since corresponding IPluginCreator "
     "not found in Plugin Registry) getPluginCreator could not find plugin: TrtfuseResidualConv version: 1",
     "needs a TensorRT plugin the server does not have (getPluginCreator could not find plugin: "
     "TrtfuseResidualConv version: 1)"),
    ('E1128 03:10:51.432196 12217 model_lifecycle.cc:642] "failed to load \'tiny\' version 1: Invalid argument: '
     'unexpected datatype TYPE_INT8 for inference input \'input\', expecting TYPE_FP32 for tiny_0_0"',
     "could not load model 'tiny': Invalid argument: unexpected datatype TYPE_INT8 for inference input 'input', "
     "expecting TYPE_FP32 for tiny_0_0"),
])
def test_server_log_lines_become_one_line_errors(line, problem):
    found = native.diagnose("I1128 a line before\n" + line + "\n")
    assert found is not None and problem in found.problem and "\n" not in str(found)


def test_a_log_without_a_known_cause_is_left_to_the_caller():
    assert native.diagnose('E1128 server.cc:1] "something else"\n') is None


# ----------------------------------------------------------------------------- on the GPU
@pytest.mark.tensorrt
def test_the_exported_engine_served_by_the_tensorrt_backend_answers_as_direct(model_dir, tmp_path):  # noqa: F811
    """The toy ResNet's int8 engine with trtfuse's plugins, exported and served by Triton's own TensorRT
    backend (built here, or carried to the GPU machine): every transport's top classes equal the engine's
    own on one of its profiles, direct."""
    import numpy as np
    from test_quantize import calib_batches
    from test_tensorrt_backend import _BATCHES, _OPTIONS, _classify_through_a_store
    from test_triton_gpu import _classify_on_each_slot
    from trtfuse.backends import create_backend
    from trtfuse.backends.tensorrt_backend import TensorRTBackend
    from trtfuse.models import load_prepared
    from trtfuse.triton.process import ServeProcess

    try:
        backend_build.backend_library()
    except UserError as e:
        pytest.skip(str(e))
    model = load_prepared(model_dir)
    x = np.concatenate(calib_batches(seed=17, n=2))
    direct = TensorRTBackend(**{**_OPTIONS, "plugins": True, "input_format": "int8"})
    direct.load(model, 8)
    try:
        expected = _classify_on_each_slot(direct, x, _BATCHES)
        engine = direct.engine_path
    finally:
        direct.close()
    repo = tmp_path / "repo"
    export.export_repository(model, engine, repo)
    with ServeProcess([str(repo)], tmp_path / "serve", command=("triton", "serve")) as server:
        assert server.ready["backend"] == "tensorrt-native" and server.ready["plugins"]
        for transport in ("cuda", "shm", "grpc"):
            client = create_backend("triton", url=server.url, transport=transport, inflight=4)
            client.load(model, 8)
            try:
                got = _classify_through_a_store(client, x, _BATCHES, threads=4)
            finally:
                client.close()
            for i, (rows, answer) in enumerate(zip(_BATCHES, got)):
                assert any(np.array_equal(answer, on_slot[i]) for on_slot in expected), f"{transport}: rows {rows}"
