"""`trtfuse triton export` on CPU: a fake engine (any bytes) with the ENGINE.json build_engine writes
beside it, exported for Triton's TensorRT backend; config.pbtxt read back with Triton's own schema;
the refusals and what they leave behind; and PyTriton's real `tritonserver` parsing the exported
config (it has no TensorRT backend, so loading stops there, not on the config)."""

import argparse
import json
import os
import shlex
import socket
import subprocess
from pathlib import Path

import onnx
import pytest
from conftest_harness import NUM_CLASSES, SHAPE, tiny_model
from google.protobuf import text_format
from trtfuse.engine import BuildConfig
from trtfuse.errors import UserError
from trtfuse.models import default_model_dir
from trtfuse.models.prepared import write_prepared
from trtfuse.triton import export

pb = pytest.importorskip("tritonclient.grpc.model_config_pb2",
                         reason="tritonclient is not installed (pip install '.[triton]')")

TRT_VERSION = "8.5.3.1"
GPU = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def prepared(tmp_path, monkeypatch):
    """The tiny model, prepared under a private $TRTFUSE_HOME; TensorRT is never asked (the engines
    here are fake), so the sidecar path is the one tested, also on a GPU machine."""
    monkeypatch.setenv("TRTFUSE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TRTFUSE_PLUGIN_LIB", raising=False)
    monkeypatch.setenv("TRTFUSE_BUILD_DIR", str(tmp_path / "no-build"))
    monkeypatch.setattr(export, "usable_tensorrt", lambda: None)
    model = tiny_model(tmp_path)
    return write_prepared(onnx.load(model.onnx_path), model, default_model_dir("tiny"))


def fake_engine(folder: Path, name: str = "tiny", sidecar: bool = True, **config) -> Path:
    """An engine file and the ENGINE.json build_engine writes beside it."""
    engine = folder / f"{name}-int8-b256.engine"
    engine.write_bytes(b"not really a TensorRT plan, " + os.urandom(64))
    if sidecar:
        cfg = BuildConfig(**{"precision": "int8", "batch": 256, "profiles": 2, "input_format": "int8", **config})
        engine.with_suffix(".json").write_text(json.dumps(
            {"model": name, "config": cfg.key(), "tensorrt": TRT_VERSION, "gpu": GPU, "build_s": 1.0}))
    return engine


def fake_plugin_library(path: Path) -> Path:
    path.write_bytes(b"\x7fELF fake plugin library " + os.urandom(32))
    return path


def read_config(folder: Path):
    """config.pbtxt as Triton's schema reads it (text_format directly, not through model_io)."""
    return text_format.Parse((folder / "config.pbtxt").read_text(), pb.ModelConfig())


def files_under(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    export.add_parser(parser.add_subparsers(dest="command"))
    return export.main(parser.parse_args(argv))


# ----------------------------------------------------------------------------- what is written
def test_repository_layout_and_config_follow_the_engine(prepared, tmp_path):
    engine = fake_engine(tmp_path)
    repo = tmp_path / "repo"
    before = sorted(p.name for p in tmp_path.iterdir())
    folder = export.export_repository(prepared, engine, repo, gpus=[0, 1])

    assert folder == repo / "tiny"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*before, "repo"])  # the scratch folder went
    assert files_under(folder) == {"config.pbtxt", "1/model.plan", "tritonserver.txt"}
    assert (folder / "1" / "model.plan").read_bytes() == engine.read_bytes()
    cfg = read_config(folder)
    assert (cfg.name, cfg.platform, cfg.max_batch_size) == ("tiny", "tensorrt_plan", 256)
    assert [(i.name, pb.DataType.Name(i.data_type), list(i.dims)) for i in cfg.input] == \
        [("input", "TYPE_INT8", list(SHAPE))]
    assert [(o.name, pb.DataType.Name(o.data_type), list(o.dims)) for o in cfg.output] == \
        [("top_classes", "TYPE_INT32", [5]), ("logits", "TYPE_FP32", [NUM_CLASSES])]
    # One instance per optimization profile on each GPU (2 profiles x 2 GPUs).
    groups = [(g.kind, list(g.gpus), g.count, list(g.profile)) for g in cfg.instance_group]
    gpu = pb.ModelInstanceGroup.KIND_GPU
    assert groups == [(gpu, [0], 1, ["0"]), (gpu, [0], 1, ["1"]), (gpu, [1], 1, ["0"]), (gpu, [1], 1, ["1"])]
    assert list(cfg.dynamic_batching.preferred_batch_size) == [256]
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 100

    text = (folder / "tritonserver.txt").read_text()
    assert f"tritonserver --model-repository={repo}\n" in text and "--backend-config" not in text
    assert f"TensorRT {TRT_VERSION}" in text and GPU in text


def test_float_input_one_profile_and_the_batching_options(prepared, tmp_path):
    engine = fake_engine(tmp_path, input_format="float", profiles=1, batch=64, top_k=3)
    folder = export.export_repository(prepared, engine, tmp_path / "repo", name="tiny-fp32", gpus=[1],
                                      instances_per_gpu=2, preferred_batch_sizes=[32, 64],
                                      max_queue_delay_us=500)
    cfg = read_config(folder)
    assert folder.name == cfg.name == "tiny-fp32" and cfg.max_batch_size == 64
    assert pb.DataType.Name(cfg.input[0].data_type) == "TYPE_FP32"
    assert list(cfg.output[0].dims) == [3]
    assert [(list(g.gpus), g.count, list(g.profile)) for g in cfg.instance_group] == [([1], 2, [])]
    assert list(cfg.dynamic_batching.preferred_batch_size) == [32, 64]
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 500


def test_the_plugin_library_is_shipped_and_named_in_the_command(prepared, tmp_path):
    engine = fake_engine(tmp_path, plugins=True)
    lib = fake_plugin_library(tmp_path / "libmine.so")
    repo = tmp_path / "repo"
    folder = export.export_repository(prepared, engine, repo, plugin_lib=lib)

    shipped = folder / "plugins" / "libtrtfuse_plugins.so"
    assert shipped.read_bytes() == lib.read_bytes() and os.access(shipped, os.X_OK)
    text = (folder / "tritonserver.txt").read_text()
    assert f"tritonserver --model-repository={repo} --backend-config=tensorrt,plugins={shipped}\n" in text
    assert f"LD_PRELOAD={shipped} tritonserver --model-repository={repo}\n" in text
    assert "same version" in text and f"whose TensorRT is {TRT_VERSION}" in text and GPU in text


def test_the_default_plugin_library_is_the_one_trtfuse_would_load(prepared, tmp_path, monkeypatch):
    lib = fake_plugin_library(tmp_path / "built.so")
    monkeypatch.setenv("TRTFUSE_PLUGIN_LIB", str(lib))
    folder = export.export_repository(prepared, fake_engine(tmp_path, plugins=True), tmp_path / "repo")
    assert (folder / "plugins" / "libtrtfuse_plugins.so").read_bytes() == lib.read_bytes()


def test_the_cli_prints_the_command(prepared, tmp_path, capsys):
    engine = fake_engine(tmp_path, plugins=True)
    lib = fake_plugin_library(tmp_path / "lib.so")
    repo = tmp_path / "repo"
    assert run_cli(["triton", "export", "tiny", "--engine", str(engine), "--out", str(repo),
                    "--gpus", "0,1", "--plugin-lib", str(lib), "--preferred-batch-sizes", "128,256"]) == 0
    out = capsys.readouterr().out
    assert f"wrote {repo / 'tiny'}" in out
    assert out.endswith((repo / "tiny" / "tritonserver.txt").read_text())
    assert f"plugins={repo / 'tiny' / 'plugins' / 'libtrtfuse_plugins.so'}" in out
    assert len(read_config(repo / "tiny").instance_group) == 4


# ----------------------------------------------------------------------------- refusals
def test_an_existing_model_is_refused_and_replaced_whole_with_force(prepared, tmp_path):
    engine = fake_engine(tmp_path)
    repo = tmp_path / "repo"
    (repo / "other" / "1").mkdir(parents=True)
    (repo / "other" / "config.pbtxt").write_text('name: "other"\n')
    folder = export.export_repository(prepared, engine, repo)
    (folder / "stale.txt").write_text("left from before")

    with pytest.raises(UserError, match="--force"):
        export.export_repository(prepared, engine, repo, max_queue_delay_us=7)
    assert read_config(folder).dynamic_batching.max_queue_delay_microseconds == 100

    export.export_repository(prepared, engine, repo, max_queue_delay_us=7, force=True)
    assert read_config(folder).dynamic_batching.max_queue_delay_microseconds == 7
    assert not (folder / "stale.txt").exists()
    assert (repo / "other" / "config.pbtxt").read_text() == 'name: "other"\n'
    assert sorted(p.name for p in repo.iterdir()) == ["other", "tiny"]


def test_a_missing_plugin_library_leaves_nothing_behind(prepared, tmp_path):
    engine = fake_engine(tmp_path, plugins=True)
    repo = tmp_path / "repo"
    (repo / "tiny").mkdir(parents=True)
    (repo / "tiny" / "keep.txt").write_text("mine")
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(UserError, match="trtfuse plugins build"):
        export.export_repository(prepared, engine, repo, force=True)
    with pytest.raises(UserError, match="trtfuse plugins build"):
        export.export_repository(prepared, engine, repo, force=True, plugin_lib=tmp_path / "nowhere.so")
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no temporary folder
    assert files_under(repo) == {"tiny/keep.txt"}
    assert not (tmp_path / "fresh").exists()
    with pytest.raises(UserError, match="trtfuse plugins build"):
        export.export_repository(prepared, engine, tmp_path / "fresh")
    assert not (tmp_path / "fresh").exists()


@pytest.mark.parametrize("failing", ["copy", "rename"])
def test_a_failure_while_writing_leaves_the_repository_as_it_was(prepared, tmp_path, monkeypatch, failing):
    engine = fake_engine(tmp_path, plugins=True)
    lib = fake_plugin_library(tmp_path / "lib.so")
    repo = tmp_path / "repo"
    folder = export.export_repository(prepared, engine, repo, plugin_lib=lib)
    before_files = {p: (folder / p).read_bytes() for p in files_under(folder)}
    before = sorted(p.name for p in tmp_path.iterdir())
    if failing == "copy":  # the disk fills while the plugin library is copied
        real_copy = export.shutil.copyfile

        def copyfile(src, dst, **kw):
            if Path(dst).name == "libtrtfuse_plugins.so":
                raise OSError(28, "No space left on device")
            return real_copy(src, dst, **kw)
        monkeypatch.setattr(export.shutil, "copyfile", copyfile)
    else:  # the new folder cannot be renamed into place after the old one was moved aside
        real_rename = Path.rename

        def rename(self, target):
            if self.name == "tiny" and Path(target) == folder:
                raise OSError(5, "Input/output error")
            return real_rename(self, target)
        monkeypatch.setattr(Path, "rename", rename)
    with pytest.raises(OSError):
        export.export_repository(prepared, engine, repo, plugin_lib=lib, max_queue_delay_us=9, force=True)
    assert {p: (folder / p).read_bytes() for p in files_under(folder)} == before_files
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no temporary folder


def test_a_config_that_does_not_read_back_as_meant_fails_loudly(prepared, tmp_path, monkeypatch):
    real = export.model_io.config_text
    monkeypatch.setattr(export.model_io, "config_text",
                        lambda cfg: real(cfg).replace("dims: 5", "dims: 6"))
    with pytest.raises(RuntimeError, match="does not parse back"):
        export.export_repository(prepared, fake_engine(tmp_path), tmp_path / "repo")
    assert not (tmp_path / "repo").exists()


@pytest.mark.parametrize("case, match", [
    ("engine missing", "does not exist"),
    ("engine empty", "is empty"),
    ("sidecar unreadable", "not the description"),
    ("no sidecar, no TensorRT", "ENGINE.json"),
    ("another model's engine", "built from model 'resnet50'"),
    ("out is a file", "is a file"),
    ("preferred above max batch", "preferred batch sizes"),
    ("bad name", "cannot be a Triton model name"),
])
def test_user_errors(prepared, tmp_path, case, match):
    engine, repo, options = fake_engine(tmp_path), tmp_path / "repo", {}
    if case == "engine missing":
        engine = tmp_path / "nowhere.engine"
    elif case == "engine empty":
        engine.write_bytes(b"")
    elif case == "sidecar unreadable":
        engine.with_suffix(".json").write_text("{not json")
    elif case == "no sidecar, no TensorRT":
        engine = fake_engine(tmp_path, sidecar=False, name="bare")
    elif case == "another model's engine":
        engine = fake_engine(tmp_path, name="resnet50")
    elif case == "out is a file":
        repo.write_text("")
    elif case == "preferred above max batch":
        options = {"preferred_batch_sizes": [512]}
    elif case == "bad name":
        options = {"name": "../escape"}
    with pytest.raises(UserError, match=match):
        export.export_repository(prepared, engine, repo, **options)
    assert not (repo / "tiny").exists()


@pytest.mark.parametrize("gpus", ["a", "-1", "0,0", "", "0,,1"])
def test_bad_gpus_are_refused(prepared, tmp_path, gpus):
    with pytest.raises(UserError, match="--gpus"):
        run_cli(["triton", "export", "tiny", "--engine", str(fake_engine(tmp_path)), "--out",
                 str(tmp_path / "repo"), "--gpus", gpus])


def test_an_unprepared_model_is_refused_not_prepared(prepared, tmp_path):
    with pytest.raises(UserError, match="trtfuse prepare efficientnet-lite0"):
        run_cli(["triton", "export", "efficientnet-lite0", "--engine", str(fake_engine(tmp_path)),
                 "--out", str(tmp_path / "repo")])
    assert not (tmp_path / "home" / "models" / "efficientnet-lite0").exists()
    with pytest.raises(UserError, match="no prepared model"):
        export.find_prepared(str(tmp_path))
    assert export.find_prepared(str(prepared.dir)).name == "tiny"


# ----------------------------------------------------------------------------- a real tritonserver
def _bundled_tritonserver():
    """PyTriton's bundled tritonserver (trtfuse.triton.tritonserver), or None where it is not installed."""
    from trtfuse.triton import tritonserver

    try:
        dist = tritonserver.bundled()
    except UserError:
        return None
    return dist if os.access(dist.binary, os.X_OK) else None


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _load_in_tritonserver(folder: Path, dist) -> str:
    """Run the exported command line (its first line) with PyTriton's binary, loading only this model;
    the server exits by itself when the load fails. Its log."""
    command = shlex.split((folder / "tritonserver.txt").read_text().splitlines()[1])
    assert command[0] == "tritonserver"
    http, grpc, metrics = _free_ports(3)
    argv = [str(dist.binary), *command[1:], "--model-control-mode=explicit", f"--load-model={folder.name}",
            f"--backend-directory={dist.backends}", f"--http-port={http}", f"--grpc-port={grpc}",
            f"--metrics-port={metrics}", "--exit-timeout-secs=2"]
    env = {**os.environ, "LD_LIBRARY_PATH": ":".join(filter(None, [os.environ.get("LD_LIBRARY_PATH"), str(dist.libs)]))}
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired as e:  # subprocess.run has killed it
        pytest.fail(f"tritonserver did not exit within 30 s: {e.stdout} {e.stderr}")
    log = done.stdout + done.stderr
    if "server.cc" not in log and "model_repository_manager" not in log:
        pytest.skip(f"PyTriton's tritonserver does not start here: {log[-500:]}")
    return log


NO_TENSORRT_BACKEND = "unable to find backend library for backend 'tensorrt'"


def test_tritonserver_parses_the_exported_config(prepared, tmp_path):
    server = _bundled_tritonserver()
    if server is None:
        pytest.skip("PyTriton's tritonserver is not installed")
    engine = fake_engine(tmp_path, plugins=True)
    folder = export.export_repository(prepared, engine, tmp_path / "repo", gpus=[0, 1],
                                      plugin_lib=fake_plugin_library(tmp_path / "lib.so"))
    log = _load_in_tritonserver(folder, server)
    # The config was read, checked and the model handed on to its backend: loading stops only there.
    assert f"failed to load '{folder.name}' version 1: Invalid argument: {NO_TENSORRT_BACKEND}" in log
    assert "Poll failed" not in log and "failed to read text proto" not in log

    # The same server does stop at a config Triton rejects (preferred batch above max_batch_size).
    cfg = folder / "config.pbtxt"
    cfg.write_text(cfg.read_text().replace("preferred_batch_size: 256", "preferred_batch_size: 512"))
    log = _load_in_tritonserver(folder, server)
    assert "Poll failed for model directory 'tiny'" in log and NO_TENSORRT_BACKEND not in log


# ----------------------------------------------------------------------------- on the GPU
@pytest.mark.tensorrt
def test_tensorrt_reads_what_the_sidecar_says(tmp_path, monkeypatch):
    """A real fp32 engine of the tiny model: TensorRT's reading of it and ENGINE.json agree, and the
    exported config is the engine's."""
    from trtfuse.engine import build_engine

    monkeypatch.setenv("TRTFUSE_HOME", str(tmp_path / "home"))
    model = tiny_model(tmp_path)
    prepared = write_prepared(onnx.load(model.onnx_path), model, default_model_dir("tiny"))
    engine = build_engine(prepared.dir, BuildConfig(precision="fp32", batch=8, profiles=2, input_format="float"))
    from_engine = export.read_engine_with_tensorrt(engine)
    from_sidecar = export.engine_io_from_sidecar(export.read_sidecar(engine), prepared)
    assert {f: getattr(from_engine, f) for f in export.EngineIO.COMPARED} == \
        {f: getattr(from_sidecar, f) for f in export.EngineIO.COMPARED}
    io, notes = export.describe_engine(engine, prepared)
    assert notes == [] and io.max_batch == 8 and io.profiles == 2 and io.plugins is False
    folder = export.export_repository(prepared, engine, tmp_path / "repo")
    cfg = read_config(folder)
    assert cfg.max_batch_size == 8 and len(cfg.instance_group) == 2
