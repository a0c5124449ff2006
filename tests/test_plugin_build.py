"""The plugin library compiles against both TensorRT header sets (8.5.3 and 11.1) with nvcc.

This is CI's check that the IPluginV2DynamicExt plugins stay source-compatible with the TensorRT
that runs on the lent GPU machine (8.5) and with the current API (11.x). It compiles every source
in plugins/ without linking, so it needs nvcc but no GPU.
"""

import os
import shutil
from pathlib import Path

import pytest

from trtfuse import plugin_build
from trtfuse.errors import UserError

REPO = Path(__file__).resolve().parent.parent
HEADER_SETS = REPO.parent / "shared" / "third_party" / "tensorrt"

needs_nvcc = pytest.mark.skipif(
    not (os.environ.get("CUDACXX") or shutil.which("nvcc")), reason="nvcc not installed"
)


@needs_nvcc
@pytest.mark.slow
@pytest.mark.parametrize("version", ["8.5.3", "11.1"])
def test_plugins_compile_against_tensorrt_headers(version, tmp_path):
    include = HEADER_SETS / version / "include"
    if not (include / "NvInfer.h").is_file():
        pytest.skip(f"TensorRT {version} headers are not beside this checkout")
    plan = plugin_build.BuildPlan(
        source_dir=plugin_build.plugins_source_dir(),
        build_dir=tmp_path,
        archs=("90",),  # one architecture keeps CI time down (wgmma code compiles out); see the sm_90a test below
        tensorrt_include=include,
    )
    both, plugin_only = plan.sources()
    assert plugin_only, "no *_plugin.cpp sources found: the plugins would not be checked"
    plugin_build.build(plan, link=False, jobs=2, progress=lambda *_: None)
    objects = list((tmp_path / "obj").glob("*.o"))
    assert len(objects) == len(both) + len(plugin_only)


@needs_nvcc
@pytest.mark.slow
def test_kernels_compile_for_sm90a(tmp_path):
    # The wgmma kernels of conv_int8 (kernels/*_sm90.cuh) are compiled only in the sm_90a pass (the sm_90
    # pass above compiles them out): assemble them here so that CI sees their inline PTX. Kernels only, no TensorRT.
    plan = plugin_build.BuildPlan(
        source_dir=plugin_build.plugins_source_dir(), build_dir=tmp_path, archs=("90a",)
    )
    both, _ = plan.sources()
    # host/config_table.cu is the one translation unit that instantiates the conv kernels
    assert any(p.relative_to(plan.source_dir).as_posix() == "conv_int8/host/config_table.cu" for p in both)
    plugin_build.build(plan, link=False, jobs=2, progress=lambda *_: None)
    assert len(list((tmp_path / "obj").glob("*.o"))) == len(both)


def test_conv_library_layout():
    """The int8 conv library by part (core/, kernels/ one file per family, host/, the C ABI) and no source under
    plugins/ over 700 lines (issue 40's bar: a file a reader can hold)."""
    plugins = plugin_build.plugins_source_dir()
    conv = plugins / "conv_int8"
    for rel in ("c_api.h", "c_api.cu", "host/config_table.cu", "kernels/conv1x1_sm80.cuh",
                "kernels/conv1x1_sm90.cuh", "kernels/conv3x3_sm90.cuh", "kernels/stem_sm90.cuh", "core/params.h"):
        assert (conv / rel).is_file(), rel
    long = [f"{p.relative_to(plugins)}: {n}" for p in sorted(plugins.rglob("*")) if p.is_file()
            and (n := len(p.read_text(errors="replace").splitlines())) > 700]
    assert not long, long


def test_missing_tensorrt_headers_is_a_user_error(tmp_path, monkeypatch):
    monkeypatch.delenv("TENSORRT_ROOT", raising=False)
    with pytest.raises(UserError, match="TensorRT headers not given"):
        plugin_build.tensorrt_include_dir(None)
    with pytest.raises(UserError, match="no NvInfer.h"):
        plugin_build.tensorrt_include_dir(tmp_path)


def test_missing_library_names_the_build_command(tmp_path, monkeypatch):
    monkeypatch.setenv("TRTFUSE_PLUGIN_LIB", str(tmp_path / "nope.so"))
    with pytest.raises(UserError, match="trtfuse plugins build"):
        plugin_build.library_path("plugins")


def test_gencode_flags_embed_ptx_of_the_highest_plain_arch():
    flags = plugin_build.gencode_flags(("80", "90", "90a"))
    assert "arch=compute_90a,code=sm_90a" in flags
    assert flags[-1] == "arch=compute_90,code=compute_90"
