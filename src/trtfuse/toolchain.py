"""Where the CUDA and TensorRT toolchain is: nvcc, TensorRT's headers and libraries, the nvcc target flags, and the
checkout the sources live in. Shared by the plugin build (plugin_build) and the native SUT's (native_build)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from trtfuse.errors import UserError

REPO_ROOT = Path(__file__).resolve().parents[2]  # src/trtfuse/toolchain.py -> the checkout


def find_nvcc() -> str:
    nvcc = os.environ.get("CUDACXX") or shutil.which("nvcc")
    if not nvcc:
        for guess in ("/usr/local/cuda/bin/nvcc",):
            if Path(guess).exists():
                return guess
        raise UserError("nvcc not found", "install the CUDA toolkit, or put nvcc on PATH / set CUDACXX")
    return nvcc


def tensorrt_include_dir(tensorrt_root: str | os.PathLike | None) -> Path:
    root = tensorrt_root or os.environ.get("TENSORRT_ROOT")
    if not root:
        raise UserError(
            "TensorRT headers not given",
            "pass --tensorrt-root DIR or set TENSORRT_ROOT (a folder with include/NvInfer.h)",
        )
    for inc in (Path(root) / "include", Path(root)):
        if (inc / "NvInfer.h").is_file():
            return inc.resolve()
    raise UserError(f"no NvInfer.h under {root} or {root}/include", "point TENSORRT_ROOT at a TensorRT install")


def tensorrt_lib_dir(tensorrt_root: str | os.PathLike | None) -> Path | None:
    env = os.environ.get("TENSORRT_LIB_DIR")
    root = tensorrt_root or os.environ.get("TENSORRT_ROOT")
    for d in ([Path(env)] if env else []) + ([Path(root) / "lib"] if root else []):
        if any(d.glob("libnvinfer.so*")):
            return d.resolve()
    return None


def gencode_flags(archs: tuple[str, ...]) -> list[str]:
    """'90' -> sm_90 SASS; '90a' -> sm_90a (wgmma/setmaxnreg). PTX of the highest plain arch too."""
    flags = []
    for a in archs:
        flags += ["-gencode", f"arch=compute_{a},code=sm_{a}"]
    plain = [a for a in archs if a.isdigit()]
    if plain:
        top = max(plain, key=int)
        flags += ["-gencode", f"arch=compute_{top},code=compute_{top}"]
    return flags
