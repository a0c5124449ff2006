"""run.sut "auto" (the default): the native SUT for TensorRT once it is built with TensorRT, the Python SUT
otherwise. Nothing is built or run here: the choice only."""

import json

import pytest
from trtfuse import config, native_build, native_sut


def settings(**overrides):
    return config.load(overrides={"run.sut": "auto", **overrides})


@pytest.fixture
def build_dir(tmp_path, monkeypatch):
    """An empty native build folder: no library until a test writes one."""
    monkeypatch.setenv("TRTFUSE_NATIVE_BUILD_DIR", str(tmp_path))
    monkeypatch.delenv("TRTFUSE_NATIVE_LIB", raising=False)
    monkeypatch.setattr(native_sut, "_NOTED", set())
    return tmp_path


def built(build_dir, tensorrt: bool, sources: str | None = None):
    lib = build_dir / native_build.NATIVE_LIB
    lib.write_bytes(b"\x7fELF")
    stamp = {"sources": sources or native_build.sources_digest(), "tensorrt": tensorrt}
    lib.with_name(lib.name + ".json").write_text(json.dumps(stamp))


def test_the_default_is_auto():
    assert config.load()["run"]["sut"] == "auto"


def test_tensorrt_takes_the_native_sut_once_it_is_built_with_tensorrt(build_dir, capsys):
    s = settings(**{"run.backend": "tensorrt"})
    assert native_sut.resolve_sut(s)["run"]["sut"] == "python"  # not built: the Python SUT, and why
    assert "the native SUT is not built (trtfuse plugins build --native" in capsys.readouterr().err
    built(build_dir, tensorrt=False)
    assert native_sut.resolve_sut(s)["run"]["sut"] == "python"  # built for the null engine only
    built(build_dir, tensorrt=True, sources="an older native/")
    assert native_sut.resolve_sut(s)["run"]["sut"] == "python"  # stale: never rebuilt unasked
    built(build_dir, tensorrt=True)
    resolved = native_sut.resolve_sut(s)
    assert resolved["run"]["sut"] == "native" and s["run"]["sut"] == "auto"  # a copy: the caller's stays


def test_the_auto_backend_is_tensorrt_only_where_it_is_usable(build_dir, monkeypatch):
    built(build_dir, tensorrt=True)
    s = settings(**{"run.backend": "auto"})
    monkeypatch.setattr(native_sut, "_tensorrt_usable", lambda: False)
    assert native_sut.resolve_sut(s)["run"]["sut"] == "python"  # auto runs onnxruntime here
    monkeypatch.setattr(native_sut, "_tensorrt_usable", lambda: True)
    assert native_sut.resolve_sut(s)["run"]["sut"] == "native"


def test_other_backends_and_the_python_diagnostics_keep_the_python_sut(build_dir):
    built(build_dir, tensorrt=True)
    for backend in ("onnxruntime", "triton", "null"):
        assert native_sut.resolve_sut(settings(**{"run.backend": backend}))["run"]["sut"] == "python"
    timeline = settings(**{"run.backend": "tensorrt", "server.query_timeline": True})
    assert native_sut.resolve_sut(timeline)["run"]["sut"] == "python"


def test_a_backend_given_ready_made_decides(build_dir):
    s = settings(**{"run.backend": "tensorrt"})
    engine = native_sut.NativeEngine(None, 0, "null", None, None, (3, 8, 8), 5, 8, 1, 2)
    assert native_sut.resolve_sut(s, engine)["run"]["sut"] == "native"
    assert native_sut.resolve_sut(s, object())["run"]["sut"] == "python"


def test_an_explicit_choice_stands(build_dir):
    for sut in ("python", "native"):
        s = config.load(overrides={"run.sut": sut, "run.backend": "tensorrt"})
        assert native_sut.resolve_sut(s) is s
    with pytest.raises(Exception, match="run.sut must be auto, python or native"):
        config.load(overrides={"run.sut": "cpp"})
