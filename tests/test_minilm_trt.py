"""MiniLM through TensorRT with the trtfuse LayerNorm plugins vs the PyTorch reference (GPU machine).

Needs a bundle from ``trtfuse bench minilm prepare`` (on a machine with torch), at
$TRTFUSE_MINILM_BUNDLE or .devcache/minilm, and the built plugin library. Runs the same check as
``trtfuse bench minilm check`` on 4 sentences.
"""

import os
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.tensorrt


def _bench():
    from trtfuse.bench import minilm

    return minilm


@pytest.fixture(scope="module")
def bundle() -> Path:
    path = Path(os.environ.get("TRTFUSE_MINILM_BUNDLE", REPO_ROOT / ".devcache" / "minilm"))
    if not (path / "bundle.json").is_file():
        pytest.skip(
            f"no MiniLM bundle at {path}: run `trtfuse bench minilm prepare` and carry it"
        )
    return path


@pytest.fixture(scope="module")
def plugin_lib() -> str:
    from trtfuse.errors import UserError
    from trtfuse.plugin_build import library_path

    try:
        return str(library_path("plugins"))
    except UserError as e:
        pytest.skip(str(e))


def test_minilm_tensorrt_plugins_match_pytorch(bundle, plugin_lib, tmp_path):
    bench = _bench()
    result = bench.check(
        bundle,
        tmp_path / "minilm_trt.json",
        "rewritten",
        plugin_lib,
        ("fp32", "fp16"),
        max_sentences=4,
    )
    for precision in ("fp32", "fp16"):
        r = result[precision]
        # All 13 LayerNorms reach TensorRT as plugin layers (1 TrtfuseLayerNorm + 12 TrtfuseSkipLayerNorm).
        assert r["plugin_layers_network"] == 13
        assert r["plugin_layers_engine"] == 13
        assert r["min_cosine"] >= bench.BARS[precision], r
        assert r["min_cosine_dynamic_subset"] >= bench.BARS[precision], r
    assert result["pass"]
