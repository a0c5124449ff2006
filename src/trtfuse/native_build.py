"""Build the native run loop (native/): LoadGen from its source distribution plus trtfuse's C++ SUT.

One shared library, ``libtrtfuse_sut.so``, with a C ABI (native/include/trtfuse_sut.h) that
``trtfuse.native_sut`` loads by ctypes:
  LoadGen's C++ sources   the ``mlcommons-loadgen`` sdist of the installed wheel's version (PyPI), unpacked
                          under the build folder once; never a copy in this project
  native/src/*.cc         the SUT, the QSL, the settings and the null (host-only) engine: g++ only
  tensorrt_engine.cu      the TensorRT engine, with TensorRT's headers and nvcc (else tensorrt_stub.cc)

Everything is compiled with hidden visibility: the process also holds the Python binding's own LoadGen,
and the two must not share a symbol.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from trtfuse.errors import UserError
from trtfuse.toolchain import REPO_ROOT, find_nvcc, gencode_flags, tensorrt_include_dir, tensorrt_lib_dir

NATIVE_LIB = "libtrtfuse_sut.so"
LOADGEN_SOURCES = ("early_stopping.cc", "issue_query_controller.cc", "loadgen.cc", "logging.cc",
                   "test_settings_internal.cc", "utils.cc", "version.cc", "results.cc",
                   "generated/version_generated.cc")
HOST_SOURCES = ("session.cc", "settings.cc", "null_engine.cc")


def native_source_dir() -> Path:
    path = REPO_ROOT / "native"
    if not (path / "src" / "session.cc").is_file():
        raise UserError(f"the native SUT's sources are not at {path}",
                        "run from a checkout of trtfuse (pip install -e .)")
    return path


def default_build_dir() -> Path:
    return Path(os.environ.get("TRTFUSE_NATIVE_BUILD_DIR", REPO_ROOT / "build" / "native"))


def loadgen_version() -> str:
    try:
        return importlib.metadata.version("mlcommons-loadgen")
    except importlib.metadata.PackageNotFoundError as e:
        raise UserError("mlcommons-loadgen is not installed", "pip install mlcommons-loadgen") from e


def loadgen_source(build_dir: Path, version: str | None = None, progress=print) -> Path:
    """LoadGen's source tree of ``version`` (default: the installed wheel's), unpacked under
    ``build_dir``: from $TRTFUSE_LOADGEN_SDIST (a .tar.gz) if set, else downloaded from PyPI once."""
    version = version or loadgen_version()
    tree = build_dir / f"loadgen-{version}"
    if (tree / "loadgen.h").is_file():
        return tree
    sdist = os.environ.get("TRTFUSE_LOADGEN_SDIST")
    with tempfile.TemporaryDirectory() as tmp:
        if sdist:
            archive = Path(sdist)
            if not archive.is_file():
                raise UserError(f"TRTFUSE_LOADGEN_SDIST={sdist} does not exist",
                                "point it at mlcommons_loadgen-<version>.tar.gz, or unset it to download")
        else:
            progress(f"trtfuse: downloading LoadGen {version}'s source distribution from PyPI")
            cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                   f"mlcommons-loadgen=={version}", "-d", tmp]
            res = subprocess.run(cmd, capture_output=True, text=True)
            found = list(Path(tmp).glob("mlcommons_loadgen-*.tar.gz"))
            if res.returncode != 0 or not found:
                raise UserError(f"could not download mlcommons-loadgen=={version}'s sources: "
                                f"{res.stderr.strip().splitlines()[-1] if res.stderr.strip() else 'no sdist'}",
                                "run where PyPI is reachable, or set TRTFUSE_LOADGEN_SDIST to the .tar.gz")
            archive = found[0]
        with tarfile.open(archive) as tar:
            top = tar.getnames()[0].split("/")[0]
            tar.extractall(tmp, filter="data") if hasattr(tarfile, "data_filter") else tar.extractall(tmp)
        unpacked = Path(tmp) / top
        if not (unpacked / "loadgen.h").is_file():
            raise UserError(f"{archive} holds no loadgen.h", "give mlcommons-loadgen's source distribution")
        tree.parent.mkdir(parents=True, exist_ok=True)
        staging = tree.with_name(tree.name + ".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(unpacked, staging)
        os.replace(staging, tree)  # a half-unpacked tree never looks complete
    return tree


def _compile(cmd: list[str], src: Path, obj: Path, progress) -> Path:
    if obj.exists():
        return obj
    obj.parent.mkdir(parents=True, exist_ok=True)
    progress(f"  compiling   {src.name}")
    res = subprocess.run([*cmd, "-c", str(src), "-o", f"{obj}.tmp"], capture_output=True, text=True)
    if res.returncode != 0:
        raise UserError(f"compiling {src} failed:\n{res.stderr.strip()[-4000:]}", "fix the compile error above")
    os.replace(f"{obj}.tmp", obj)
    return obj


def build(build_dir: Path | None = None, tensorrt_root: str | None = None, archs: tuple[str, ...] = ("90",),
          jobs: int | None = None, progress=print) -> Path:
    """Compile and link ``libtrtfuse_sut.so``; with ``tensorrt_root`` (or $TENSORRT_ROOT when
    ``tensorrt_root`` is "env") the TensorRT engine too. Returns the library's path."""
    build_dir = Path(build_dir or default_build_dir())
    src_dir = native_source_dir()
    lg_dir = loadgen_source(build_dir, progress=progress)
    version = (lg_dir / "VERSION.txt").read_text().strip().split(".")
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        raise UserError("no C++ compiler found", "install g++ (apt-get install g++) or set CXX")
    base = ["-O3", "-fPIC", "-fvisibility=hidden", "-fvisibility-inlines-hidden", "-pthread",
            f"-I{lg_dir}", f"-I{src_dir / 'include'}", f"-I{src_dir / 'src'}"]
    lg_flags = [cxx, "-std=c++14", *base, f"-DMAJOR_VERSION={version[0]}", f"-DMINOR_VERSION={version[1]}", "-w"]
    host_flags = [cxx, "-std=c++17", "-Wall", *base]
    with_trt = tensorrt_root is not None
    units = [(lg_flags, lg_dir / s) for s in LOADGEN_SOURCES] + [(host_flags, src_dir / "src" / s) for s in HOST_SOURCES]
    link, libs = [cxx, "-shared", "-pthread"], []
    if with_trt:
        inc = tensorrt_include_dir(None if tensorrt_root == "env" else tensorrt_root)
        lib = tensorrt_lib_dir(None if tensorrt_root == "env" else tensorrt_root)
        nvcc = find_nvcc()
        cuda_flags = [nvcc, "-std=c++17", "-O3", *gencode_flags(archs), f"-I{inc}", f"-I{src_dir / 'include'}",
                      f"-I{src_dir / 'src'}", "-Xcompiler", "-fPIC,-fvisibility=hidden,-Wno-deprecated-declarations",
                      "-Xcudafe", "--diag_suppress=1444"]
        units.append((cuda_flags, src_dir / "src" / "tensorrt_engine.cu"))
        cuda_lib = Path(nvcc).resolve().parent.parent / "lib64"
        link = [nvcc, "-shared", *gencode_flags(archs), "-Xcompiler", "-pthread"]
        libs = ([f"-L{lib}", "-Xlinker", f"-rpath={lib}"] if lib else []) + ["-lnvinfer", f"-L{cuda_lib}", "-lcudart"]
    else:
        units.append((host_flags, src_dir / "src" / "tensorrt_stub.cc"))

    headers = hashlib.sha256()
    for p in sorted([*src_dir.rglob("*.h"), *lg_dir.glob("*.h")]):
        headers.update(p.read_bytes())

    def obj_of(flags: list[str], src: Path) -> Path:
        digest = hashlib.sha256((headers.hexdigest() + src.read_text() + " ".join(flags)).encode()).hexdigest()[:16]
        return build_dir / "obj" / f"{src.stem}.{digest}.o"

    jobs = jobs or max(1, os.cpu_count() or 1)
    progress(f"trtfuse: building the native SUT (LoadGen {'.'.join(version)}"
             f"{', TensorRT engine' if with_trt else ', no TensorRT'}) with {jobs} jobs")
    with ThreadPoolExecutor(jobs) as pool:
        objs = list(pool.map(lambda u: _compile(u[0], u[1], obj_of(*u), progress), units))
    out = build_dir / NATIVE_LIB
    # the libraries after the objects: the linker resolves left to right
    res = subprocess.run([*link, *map(str, objs), "-o", f"{out}.tmp", *libs], capture_output=True, text=True)
    if res.returncode != 0:
        raise UserError(f"linking {NATIVE_LIB} failed:\n{res.stderr.strip()[-4000:]}", "see the linker error above")
    os.replace(f"{out}.tmp", out)
    _stamp(out).write_text(json.dumps({"sources": sources_digest(), "tensorrt": with_trt}) + "\n")
    progress(f"trtfuse: built the native SUT {out}")
    return out


def sources_digest() -> str:
    """What the library is built from: every file of native/ (a library built from older sources lacks
    what the Python side calls, or behaves as those sources did)."""
    h = hashlib.sha256()
    src_dir = native_source_dir()
    for p in sorted(q for q in src_dir.rglob("*") if q.is_file() and q.suffix in (".h", ".cc", ".cu")):
        h.update(str(p.relative_to(src_dir)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:16]


def _stamp(lib: Path) -> Path:
    return lib.with_name(lib.name + ".json")


def built_from(lib: Path) -> dict | None:
    """The build stamp beside ``lib`` (its sources' digest, with TensorRT or not), None without one."""
    try:
        return json.loads(_stamp(lib).read_text())
    except (OSError, ValueError):
        return None


def is_stale(lib: Path) -> bool:
    """True when ``lib`` was built here from other sources than native/'s now (a user's own
    $TRTFUSE_NATIVE_LIB is taken as it is)."""
    if os.environ.get("TRTFUSE_NATIVE_LIB"):
        return False
    stamp = built_from(lib)
    return stamp is None or stamp.get("sources") != sources_digest()


def library_path() -> Path | None:
    """The built library ($TRTFUSE_NATIVE_LIB, else the build folder's), or None."""
    env = os.environ.get("TRTFUSE_NATIVE_LIB")
    path = Path(env) if env else default_build_dir() / NATIVE_LIB
    return path if path.is_file() else None
