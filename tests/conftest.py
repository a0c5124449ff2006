"""Shared test fixtures: GPU/TensorRT detection so GPU tests skip cleanly on CPU-only machines."""

import functools
import shutil
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


@functools.lru_cache(maxsize=None)
def gpu_available() -> bool:
    if not shutil.which("nvidia-smi"):
        return False
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@functools.lru_cache(maxsize=None)
def tensorrt_available() -> bool:
    try:
        import tensorrt  # noqa: F401
    except Exception:
        return False
    return gpu_available()


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs an NVIDIA GPU")
    skip_trt = pytest.mark.skip(reason="needs TensorRT's Python API and a GPU")
    for item in items:
        if "gpu" in item.keywords and not gpu_available():
            item.add_marker(skip_gpu)
        if "tensorrt" in item.keywords and not tensorrt_available():
            item.add_marker(skip_trt)


@pytest.fixture(scope="session")
def imagenet_sample() -> Path:
    """The 750 labelled ImageNet photos beside the checkout (../shared/data), if present."""
    path = SHARED_DATA / "imagenet-sample"
    if not path.is_dir():
        pytest.skip("../shared/data/imagenet-sample is not beside this checkout")
    return path
