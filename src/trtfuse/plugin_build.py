"""Build the CUDA kernels and TensorRT plugins under plugins/ with nvcc.

Two shared libraries come out of one set of sources:
  libtrtfuse_kernels.so   every kernel with its C ABI; no TensorRT needed (tests load it by ctypes)
  libtrtfuse_plugins.so   the same plus the TensorRT plugin classes and their creators

Source convention, per folder plugins/<op>/ and its subfolders (plugins/common/, the conv library plugins/conv_int8/
with core/, kernels/ and host/), found by walking plugins/; includes are relative to plugins/ ("conv_int8/c_api.h"):
  *.cu            kernels and their C ABI            -> both libraries
  *_plugin.cpp    TensorRT plugin classes/creators   -> plugins library only (TensorRT headers)
  other *.cpp     host code that needs no TensorRT   -> both libraries

The TensorRT include directory is a setting (``--tensorrt-root`` or ``TENSORRT_ROOT``), never a copy
in this project. ``check`` compiles every translation unit without linking, which is what CI does
against each TensorRT header set on a machine with nvcc but no GPU.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from trtfuse.errors import UserError
from trtfuse.toolchain import REPO_ROOT, find_nvcc, gencode_flags, tensorrt_include_dir, tensorrt_lib_dir

# 90a: the wgmma kernels of plugins/conv_int8 (kernels/*_sm90.cuh) exist only in the sm_90a cubin; on an
# H100/H200 the driver loads the sm_90a cubin when both it and the sm_90 one are present (checked on the H100 with
# CUDA 13.0). 90: the PTX for newer GPUs (which run the mma.sync kernel). 80: A100.
DEFAULT_ARCHS = ("80", "90", "90a")
KERNELS_LIB = "libtrtfuse_kernels.so"
PLUGINS_LIB = "libtrtfuse_plugins.so"


def plugins_source_dir(source: str | os.PathLike | None = None) -> Path:
    for candidate in ([Path(source)] if source else [REPO_ROOT / "plugins", Path.cwd() / "plugins"]):
        if (candidate / "common").is_dir():
            return candidate.resolve()
    raise UserError(
        "plugin sources not found (looked for plugins/common)",
        "run from a checkout of trtfuse or pass --source PATH/TO/plugins",
    )


def default_build_dir() -> Path:
    """$TRTFUSE_BUILD_DIR; else build/plugins of the checkout trtfuse runs from (an editable install);
    else (an installed package, whose folder is site-packages) $TRTFUSE_HOME/plugins."""
    if os.environ.get("TRTFUSE_BUILD_DIR"):
        return Path(os.environ["TRTFUSE_BUILD_DIR"])
    if (REPO_ROOT / "pyproject.toml").is_file() and (REPO_ROOT / "plugins").is_dir():
        return REPO_ROOT / "build" / "plugins"
    from trtfuse.models.prepared import trtfuse_home

    return trtfuse_home() / "plugins"


@dataclass
class BuildPlan:
    source_dir: Path
    build_dir: Path
    archs: tuple[str, ...] = DEFAULT_ARCHS
    tensorrt_include: Path | None = None   # None: kernels library only
    tensorrt_lib: Path | None = None
    debug: bool = False
    extra_flags: list[str] = field(default_factory=list)

    def sources(self) -> tuple[list[Path], list[Path]]:
        """(sources for both libraries, plugin-only sources)."""
        both, plugin_only = [], []
        for path in sorted(self.source_dir.rglob("*")):
            if path.suffix == ".cu":
                both.append(path)
            elif path.suffix == ".cpp":
                (plugin_only if path.name.endswith("_plugin.cpp") else both).append(path)
        return both, plugin_only

    def common_flags(self) -> list[str]:
        flags = ["-std=c++17", "-Xcompiler", "-fPIC", "-Xcompiler", "-Wall",
                 "--expt-relaxed-constexpr", "-lineinfo", f"-I{self.source_dir}",
                 "-Xcudafe", "--diag_suppress=1444",  # TensorRT's own deprecation attributes
                 "-Wno-deprecated-declarations"]
        flags += ["-O0", "-g"] if self.debug else ["-O3"]
        if self.tensorrt_include:
            flags.append(f"-I{self.tensorrt_include}")
        return flags + gencode_flags(self.archs) + self.extra_flags


def _object_path(plan: BuildPlan, src: Path, stamp: str) -> Path:
    rel = src.relative_to(plan.source_dir).with_suffix("")
    return plan.build_dir / "obj" / f"{str(rel).replace(os.sep, '__')}.{stamp}.o"


def _headers_digest(source_dir: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(source_dir.rglob("*")):
        if p.suffix in (".h", ".cuh", ".hpp"):
            h.update(p.read_bytes())
    return h.hexdigest()


def _compile(nvcc: str, plan: BuildPlan, src: Path, headers: str, progress) -> Path:
    flags = plan.common_flags()
    digest = hashlib.sha256((headers + src.read_text() + " ".join(flags)).encode()).hexdigest()[:16]
    obj = _object_path(plan, src, digest)
    if obj.exists():
        progress(f"  up to date  {src.relative_to(plan.source_dir)}")
        return obj
    obj.parent.mkdir(parents=True, exist_ok=True)
    cmd = [nvcc, *flags, "-c", str(src), "-o", str(obj) + ".tmp"]
    progress(f"  compiling   {src.relative_to(plan.source_dir)}")
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise UserError(
            f"nvcc failed on {src}:\n{res.stderr.strip()}\n(command: {' '.join(cmd)})",
            "fix the compile error above",
        )
    if res.stderr.strip():
        progress(res.stderr.strip())
    os.replace(str(obj) + ".tmp", obj)
    return obj


def _link(nvcc: str, plan: BuildPlan, objs: list[Path], out: Path, libs: list[str]) -> None:
    cmd = [nvcc, "-shared", *gencode_flags(plan.archs), *map(str, objs), "-o", str(out) + ".tmp", *libs]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise UserError(f"linking {out.name} failed:\n{res.stderr.strip()}", "see the linker error above")
    os.replace(str(out) + ".tmp", out)


def build(plan: BuildPlan, link: bool = True, jobs: int | None = None, progress=print) -> dict[str, Path]:
    """Compile (and unless link=False, link) the libraries; returns {'kernels': path, 'plugins': path}."""
    nvcc = find_nvcc()
    both, plugin_only = plan.sources()
    todo = both + (plugin_only if plan.tensorrt_include else [])
    if not todo:
        raise UserError(f"no .cu/.cpp sources under {plan.source_dir}", "check --source")
    headers = _headers_digest(plan.source_dir)
    jobs = jobs or max(1, os.cpu_count() or 1)
    progress(f"trtfuse: building {len(todo)} sources for sm_{',sm_'.join(plan.archs)} with {jobs} jobs")
    with ThreadPoolExecutor(jobs) as pool:
        objs = dict(zip(todo, pool.map(lambda s: _compile(nvcc, plan, s, headers, progress), todo)))
    if not link:
        return {}
    out: dict[str, Path] = {}
    plan.build_dir.mkdir(parents=True, exist_ok=True)
    kernels = plan.build_dir / KERNELS_LIB
    _link(nvcc, plan, [objs[s] for s in both], kernels, ["-lcudart"])
    out["kernels"] = kernels
    if plan.tensorrt_include:
        libs = ["-lcudart"]
        if plan.tensorrt_lib:
            libs = [f"-L{plan.tensorrt_lib}", "-Xlinker", f"-rpath={plan.tensorrt_lib}", "-lnvinfer"] + libs
        plugins = plan.build_dir / PLUGINS_LIB
        _link(nvcc, plan, [objs[s] for s in both + plugin_only], plugins, libs)
        out["plugins"] = plugins
    for name, path in out.items():
        progress(f"trtfuse: built {name} library {path}")
    return out


def library_path(kind: str = "plugins") -> Path:
    """Where the built library is: $TRTFUSE_PLUGIN_LIB / $TRTFUSE_KERNELS_LIB, else the build dir."""
    env = os.environ.get("TRTFUSE_PLUGIN_LIB" if kind == "plugins" else "TRTFUSE_KERNELS_LIB")
    path = Path(env) if env else default_build_dir() / (PLUGINS_LIB if kind == "plugins" else KERNELS_LIB)
    if not path.is_file():
        raise UserError(
            f"the trtfuse {kind} library is not built ({path} is missing)",
            "run `trtfuse plugins build"
            + (" --tensorrt-root DIR`" if kind == "plugins" else " --kernels-only`")
            + f" or set TRTFUSE_{'PLUGIN' if kind == 'plugins' else 'KERNELS'}_LIB",
        )
    return path


def main(argv: list[str] | None = None) -> int:
    """``trtfuse plugins build|check`` (also ``python -m trtfuse.plugin_build``)."""
    import argparse

    p = argparse.ArgumentParser(prog="trtfuse plugins", description=__doc__.split("\n")[0])
    p.add_argument("action", choices=["build", "check"],
                   help="build: compile and link; check: compile every source, no link (CI)")
    p.add_argument("--tensorrt-root", help="TensorRT folder with include/ (default: $TENSORRT_ROOT)")
    p.add_argument("--kernels-only", action="store_true", help="only the C-ABI kernels library")
    p.add_argument("--archs", default=os.environ.get("TRTFUSE_CUDA_ARCHS", ",".join(DEFAULT_ARCHS)),
                   help="comma-separated SM versions, e.g. 80,90 or 90a (default %(default)s); "
                        "the conv_int8 wgmma configurations need 90a")
    p.add_argument("--source", help="the plugins/ folder (default: this checkout's)")
    p.add_argument("--build-dir", help=f"output folder (default {default_build_dir()})")
    p.add_argument("--debug", action="store_true", help="-O0 -g")
    p.add_argument("-j", "--jobs", type=int)
    p.add_argument("--native", action="store_true",
                   help="the native run loop instead (`trtfuse run --sut native`): LoadGen from its source "
                        "distribution + the C++ SUT, with the TensorRT engine where TensorRT's headers are given")
    args = p.parse_args(argv)
    if args.native:
        from trtfuse import native_build

        root = args.tensorrt_root or os.environ.get("TENSORRT_ROOT")
        archs = tuple(a.strip() for a in args.archs.split(",") if a.strip() and a.strip() != "90a")
        native_build.build(Path(args.build_dir) if args.build_dir else None,
                           tensorrt_root=None if args.kernels_only else root, archs=archs or ("90",), jobs=args.jobs)
        return 0
    plan = BuildPlan(
        source_dir=plugins_source_dir(args.source),
        build_dir=Path(args.build_dir) if args.build_dir else default_build_dir(),
        archs=tuple(a.strip() for a in args.archs.split(",") if a.strip()),
        debug=args.debug,
    )
    if not args.kernels_only:
        plan.tensorrt_include = tensorrt_include_dir(args.tensorrt_root)
        plan.tensorrt_lib = tensorrt_lib_dir(args.tensorrt_root)
    if args.action == "check":
        plan.build_dir = plan.build_dir / ("check-" + hashlib.sha256(str(plan.tensorrt_include).encode()).hexdigest()[:8])
    build(plan, link=args.action == "build", jobs=args.jobs)
    if args.action == "check":
        print(f"trtfuse: all sources compile against {plan.tensorrt_include or 'no TensorRT'}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
