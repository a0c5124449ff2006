"""``trtfuse triton serve REPO``: a repository that ``trtfuse triton export`` wrote, served by Triton's
own TensorRT backend (built by ``trtfuse triton build-backend``) in the ``tritonserver`` that
nvidia-pytriton bundles: the path a deployer takes, with no Python between the server and the engine.

    trtfuse triton serve REPO [--backend-dir build/triton_backend] [--tensorrt-lib DIR] [--grpc-port 8001]

The server runs with ``--backend-directory`` holding ``tensorrt/libtriton_tensorrt.so`` and
``--backend-config=tensorrt,plugins=LIB;LIB`` naming every model's shipped plugin library
(``REPO/<model>/plugins/*.so``) and any ``--plugin-lib``. Before it starts, what a deployer gets wrong
is checked and named in one line: the backend not built, or built for another nvidia-pytriton; a
``config.pbtxt`` Triton's schema rejects or that is not for the TensorRT backend; a plan missing or
written by another TensorRT; a plugin library missing or linked against another TensorRT. What only
the server can tell (no GPU, a plugin library that does not load, an engine TensorRT refuses) is read
from its log and said in one line too.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import struct
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from trtfuse.errors import UserError

BACKEND = "tensorrt"
PLATFORM = "tensorrt_plan"
PLAN_FILE = "model.plan"
# A TensorRT plan's serialization tag: the 32-bit word at byte 8 (TensorRT refuses a plan whose tag is not
# its own: "Version tag does not match. Current Version: 232, Serialized Engine Version: 205").
SERIALIZATION_TAGS = {205: "8.2", 213: "8.4", 232: "8.5"}


# ----------------------------------------------------------------------------- the backend
@dataclass(frozen=True)
class Backend:
    directory: Path      # --backend-directory: holds tensorrt/libtriton_tensorrt.so
    library: Path
    tensorrt: str        # the TensorRT version it was built against ("" where BUILD.json is missing)
    runtime: Path        # the folder with the TensorRT libraries it loads


def find_backend(backend_dir: str | os.PathLike | None, tensorrt_lib: str | os.PathLike | None, dist) -> Backend:
    from trtfuse.triton.backend_build import TRT_LIBS, backend_library
    from trtfuse.triton.elf import read_dynamic

    library = backend_library(backend_dir)
    directory = library.parent.parent
    needed = read_dynamic(library).needed
    for prefix in ("libtritonserver", "libcudart"):
        names = [n for n in needed if n.startswith(prefix)]
        missing = [n for n in names if not (dist.libs / n).exists()]
        if missing:
            have = sorted(p.name for p in dist.libs.glob(prefix + "*"))
            raise UserError(f"{library} was built for another nvidia-pytriton: it needs {missing[0]}, the installed "
                            f"tritonserver has {have}", "rebuild it: trtfuse triton build-backend")
    build = directory / "tensorrt" / "BUILD.json"
    tensorrt = json.loads(build.read_text()).get("tensorrt", "") if build.is_file() else ""
    runtime = Path(tensorrt_lib or os.environ.get("TENSORRT_LIB_DIR") or directory / "runtime").expanduser()
    missing = [lib for lib in TRT_LIBS if lib in needed and not (runtime / lib).exists()]
    if missing:
        raise UserError(f"TensorRT's {', '.join(missing)} (which the backend loads) not found in {runtime}",
                        "pass --tensorrt-lib DIR (TensorRT 8.5's libraries; $TENSORRT_LIB_DIR on the lent GPU "
                        "machine), or rebuild with `trtfuse triton build-backend` (it fills BUILD/runtime)")
    return Backend(directory, library, tensorrt, runtime.absolute())


# ----------------------------------------------------------------------------- the repository
@dataclass(frozen=True)
class Served:
    name: str
    folder: Path
    plans: list[Path]
    plugins: list[Path]
    gpus: list[int]


def plan_tensorrt(plan: Path) -> tuple[int, str | None]:
    """The serialization tag of a TensorRT plan and the TensorRT it names (None where unknown)."""
    with open(plan, "rb") as f:
        head = f.read(32)
    if len(head) < 32:
        raise UserError(f"{plan} is not a TensorRT plan ({len(head)} bytes)",
                        "export the engine again: trtfuse triton export MODEL --engine ENGINE --out REPO --force")
    tag, = struct.unpack_from("<I", head, 8)
    return tag, SERIALIZATION_TAGS.get(tag)


def check_plan(plan: Path, tensorrt: str) -> None:
    """Refuse a plan another TensorRT wrote, where the backend's TensorRT's tag is known."""
    major_minor = ".".join(tensorrt.split(".")[:2])
    want = {v: k for k, v in SERIALIZATION_TAGS.items()}.get(major_minor)
    if want is None:
        return
    tag, version = plan_tensorrt(plan)
    if tag != want:
        by = f"TensorRT {version}" if version else f"another TensorRT (serialization tag {tag})"
        raise UserError(f"{plan} was built by {by}; the backend runs TensorRT {tensorrt} (tag {want}), which refuses it",
                        f"rebuild the engine with TensorRT {major_minor} (trtfuse build on the serving machine) and "
                        "export it again, or serve it with the Triton release of its own TensorRT")


def exported_tensorrt(folder: Path) -> str | None:
    """The TensorRT version `trtfuse triton export` recorded in the model's tritonserver.txt."""
    from trtfuse.triton.model_io import COMMAND_FILE

    path = folder / COMMAND_FILE
    if not path.is_file():
        return None
    m = re.search(r"the engine was built with TensorRT (\d+\.\d+[\d.]*)", path.read_text(errors="replace"))
    return m.group(1).rstrip(".") if m else None


def _export_names_plugins(folder: Path) -> bool:
    from trtfuse.triton.model_io import COMMAND_FILE

    path = folder / COMMAND_FILE
    return path.is_file() and "--backend-config=tensorrt,plugins=" in path.read_text(errors="replace")


def check_plugin(lib: Path, tensorrt: str) -> None:
    """A plugin library must exist and link the backend's TensorRT major version."""
    from trtfuse.triton.elf import read_dynamic

    if not lib.is_file():
        raise UserError(f"the TensorRT plugin library {lib} does not exist",
                        "build it (trtfuse plugins build --tensorrt-root DIR, against TensorRT 8.5) and export the "
                        "model again, or pass --plugin-lib PATH")
    major = tensorrt.split(".")[0] if tensorrt else ""
    linked = [n for n in read_dynamic(lib).needed if re.fullmatch(r"libnvinfer\.so\.\d+", n)]
    if major and linked and linked[0] != f"libnvinfer.so.{major}":
        raise UserError(f"the plugin library {lib} was built against TensorRT {linked[0].rsplit('.', 1)[1]} "
                        f"(it needs {linked[0]}); the backend runs TensorRT {tensorrt}",
                        f"rebuild it against TensorRT {tensorrt} (trtfuse plugins build --tensorrt-root DIR) and "
                        "export again, or pass --plugin-lib PATH")


def read_repository(repo: Path, backend: Backend, plugin_libs: list[Path], check_plans: bool = True) -> list[Served]:
    """Every model of ``repo``, checked as far as it can be without the server."""
    from trtfuse.triton import model_io

    if not repo.is_dir():
        raise UserError(f"model repository {repo} does not exist",
                        "write one with `trtfuse triton export MODEL --engine ENGINE --out REPO`")
    folders = sorted(p for p in repo.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not folders:
        raise UserError(f"model repository {repo} holds no model", "export one into it: trtfuse triton export ...")
    served = []
    for folder in folders:
        config = folder / "config.pbtxt"
        if not config.is_file():
            raise UserError(f"{folder} has no config.pbtxt", f"export the model again (trtfuse triton export ... "
                            f"--out {repo} --force), or remove {folder.name} from the repository")
        try:
            cfg = model_io.parse_config(config.read_text(errors="replace"))
        except UserError as e:
            raise UserError(f"{config}: {e.problem}", e.fix) from None
        name = cfg.name or folder.name
        if name != folder.name:
            raise UserError(f"{config} names the model {cfg.name!r}, but its folder is {folder.name!r}",
                            "Triton needs them equal: fix the name or export again")
        if cfg.platform != PLATFORM and cfg.backend != BACKEND:
            what = cfg.platform or cfg.backend or "no platform or backend"
            raise UserError(f"{config} is for {what!r}, not Triton's TensorRT backend (platform: \"{PLATFORM}\")",
                            "serve Python-backend models with `trtfuse serve`, or export the engine with "
                            "`trtfuse triton export`")
        if not cfg.input or not cfg.output:
            raise UserError(f"{config} declares no {'input' if not cfg.input else 'output'}",
                            "export the model again with `trtfuse triton export --force`")
        plan_name = cfg.default_model_filename or PLAN_FILE
        versions = sorted(p for p in folder.iterdir() if p.is_dir() and p.name.isdigit())
        plans = [v / plan_name for v in versions]
        if not plans or not all(p.is_file() for p in plans):
            missing = next((p for p in plans if not p.is_file()), folder / "1" / plan_name)
            raise UserError(f"{missing} is missing: model {name!r} has no plan to load",
                            "export the engine again: trtfuse triton export MODEL --engine ENGINE --out REPO --force")
        recorded = exported_tensorrt(folder)
        if recorded and backend.tensorrt and recorded.split(".")[:2] != backend.tensorrt.split(".")[:2]:
            raise UserError(f"model {name!r} holds an engine built by TensorRT {recorded} (its tritonserver.txt); "
                            f"the backend runs TensorRT {backend.tensorrt}, which refuses it",
                            f"rebuild the engine with TensorRT {backend.tensorrt} and export it again")
        if check_plans and backend.tensorrt:
            for plan in plans:
                check_plan(plan, backend.tensorrt)
        from trtfuse.triton.model_io import COMMAND_FILE, PLUGIN_DIR

        shipped = sorted((folder / PLUGIN_DIR).glob("*.so")) if (folder / PLUGIN_DIR).is_dir() else []
        if not shipped and not plugin_libs and _export_names_plugins(folder):
            raise UserError(f"model {name!r} needs trtfuse's plugin library (its {COMMAND_FILE} loads one), but "
                            f"{folder / PLUGIN_DIR} holds none", "export the model again (trtfuse triton export ... "
                            "--force ships the library), or pass --plugin-lib PATH")
        gpus = sorted({g for group in cfg.instance_group for g in group.gpus})
        served.append(Served(name, folder, plans, shipped, gpus))
    for lib in {p for s in served for p in s.plugins} | set(plugin_libs):
        check_plugin(lib, backend.tensorrt)
    return served


# ----------------------------------------------------------------------------- what the server says
_DIAGNOSES = [
    (re.compile(r"specifies invalid or unsupported gpu id (\d+)\. GPUs with at least the minimum required CUDA "
                r"compute compatibility of ([\d.]+) are: ?(.*?)\"?$"),
     lambda m: UserError(f"tritonserver sees no usable GPU {m.group(1)} (GPUs of compute capability >= "
                         f"{float(m.group(2)):g} it sees: {m.group(3).strip() or 'none'}); Triton's TensorRT backend "
                         "runs engines on a GPU only",
                         "serve on a machine with an NVIDIA GPU and its driver (nvidia-smi lists it), or export "
                         "with --gpus naming GPUs that exist")),
    (re.compile(r"unable to load shared library: (\S+?): (.*?)\"?$"),
     lambda m: UserError(f"tritonserver could not load the plugin library {m.group(1)}: {m.group(2)}",
                         "build the plugin library against the backend's TensorRT 8.5 (trtfuse plugins build "
                         "--tensorrt-root DIR) and export again, or pass --plugin-lib PATH")),
    (re.compile(r"(?:Version tag does not match|engine plan file is not compatible).*?(Current Version: \d+, "
                r"Serialized Engine Version: \d+|expecting library version [\d.]+ got [\d.]+)"),
     lambda m: UserError(f"the TensorRT backend refused the plan: it was built by another TensorRT ({m.group(1)})",
                         "rebuild the engine with the backend's TensorRT (8.5) and export it again")),
    (re.compile(r"(getPluginCreator could not find plugin:? ?\S*(?: version:? ?\S*)?)"),
     lambda m: _missing_plugin(m.group(1).strip())),
    (re.compile(r"Cannot deserialize plugin"), lambda m: _missing_plugin("a plugin creator is not registered")),
    (re.compile(r"failed to load '([^']+)' version \d+: (.*?)\"?$"),
     lambda m: UserError(f"tritonserver could not load model {m.group(1)!r}: {m.group(2)}",
                         "where config.pbtxt and the plan disagree, export the engine again (trtfuse triton export "
                         "--force); the whole log says more")),
    (re.compile(r"unable to load backend library.*?: (.*?)\"?$"),
     lambda m: UserError(f"tritonserver could not load the TensorRT backend: {m.group(1)}",
                         "rebuild it (trtfuse triton build-backend) and pass --tensorrt-lib DIR holding TensorRT 8.5's "
                         "libraries")),
]


def _missing_plugin(what: str) -> UserError:
    return UserError(f"the engine needs a TensorRT plugin the server does not have ({what})",
                     "ship trtfuse's plugin library with the model (trtfuse triton export --plugin-lib PATH) or pass "
                     "--plugin-lib PATH, built against TensorRT 8.5")


def diagnose(log_text: str) -> UserError | None:
    """The first thing in tritonserver's log that explains a model not loading, as one UserError."""
    for line in log_text.splitlines():
        for pattern, error in _DIAGNOSES:
            m = pattern.search(line)
            if m:
                return error(m)
    return None


# ----------------------------------------------------------------------------- serve
def serve(args, stop: threading.Event | None = None) -> dict:
    from trtfuse.triton import tritonserver

    dist = tritonserver.bundled()
    backend = find_backend(args.backend_dir, args.tensorrt_lib, dist)
    repo = Path(args.repository).expanduser().absolute()
    plugin_libs = [Path(p).expanduser().absolute() for p in args.plugin_lib or []]
    served = read_repository(repo, backend, plugin_libs, check_plans=not args.skip_plan_check)
    names = [s.name for s in served]
    plugins = sorted({str(p) for s in served for p in s.plugins} | {str(p) for p in plugin_libs})
    workspace = Path(args.workspace) if args.workspace else Path(tempfile.mkdtemp(prefix="trtfuse-triton-"))
    workspace.mkdir(parents=True, exist_ok=True)
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    config = {BACKEND: {"plugins": ";".join(plugins)}} if plugins else {}
    t0 = time.perf_counter()
    server = tritonserver.TritonServer(repo, workspace, grpc_port=args.grpc_port, http_port=args.http_port,
                                       metrics_port=args.metrics_port, log_verbose=args.log_verbose,
                                       backend_config=config, dist=dist, backends=backend.directory,
                                       lib_paths=[backend.runtime])
    ran = {}
    try:
        try:
            for name in names:
                server.wait_ready(name, args.ready_timeout_s)
        except UserError as e:
            server.stop()
            found = diagnose(server.log.read_text(errors="replace")) if server.log.is_file() else None
            if found is not None:
                raise UserError(found.problem, f"{found.fix} (log: {server.log})") from None
            raise e from None
        ready = {"grpc_url": server.grpc_url, "http_url": f"localhost:{args.http_port}", "model": names[0],
                 "models": names, "backend": "tensorrt-native", "tensorrt": backend.tensorrt,
                 "backend_library": str(backend.library), "plugins": plugins, "pid": os.getpid()}
        print(f"trtfuse triton serve: Triton's TensorRT backend (TensorRT {backend.tensorrt or '?'}) serving "
              f"{', '.join(names)} at grpc {server.grpc_url}, http localhost:{args.http_port}; ready in "
              f"{time.perf_counter() - t0:.1f} s; log {server.log}; Ctrl-C stops", file=sys.stderr, flush=True)
        if args.ready_file:
            tmp = Path(args.ready_file).with_suffix(".tmp")
            tmp.write_text(json.dumps(ready) + "\n")
            tmp.replace(args.ready_file)
        while not stop.wait(0.5):
            if server.proc.poll() is not None:
                raise UserError(f"tritonserver exited (code {server.proc.returncode}) while serving:\n"
                                f"{server.errors()}", f"the whole log: {server.log}")
        ran = {name: server.statistics(name) for name in names}
    finally:
        server.stop()
        if not args.workspace:
            shutil.rmtree(workspace, ignore_errors=True)
    print(f"trtfuse triton serve: stopped; ran {ran}", file=sys.stderr)
    return ran


def add_parser(sub) -> None:
    s = sub.add_parser("serve", help="serve an exported repository with Triton's own TensorRT backend",
                       description=__doc__.split("\n\n")[0].replace("``", ""))
    s.add_argument("repository", metavar="REPO", help="a model repository `trtfuse triton export` wrote")
    s.add_argument("--backend-dir", metavar="DIR", help="holds tensorrt/libtriton_tensorrt.so (default: "
                   "build/triton_backend, or $TRTFUSE_TRITON_BACKEND_DIR; `trtfuse triton build-backend` fills it)")
    s.add_argument("--tensorrt-lib", metavar="DIR", help="TensorRT 8.5's libnvinfer.so.8 and libnvinfer_plugin.so.8 "
                   "(default: $TENSORRT_LIB_DIR, else BACKEND_DIR/runtime)")
    s.add_argument("--plugin-lib", metavar="PATH", action="append",
                   help="a TensorRT plugin library to load besides the ones the models ship (repeatable)")
    s.add_argument("--skip-plan-check", action="store_true",
                   help="do not read the plans' TensorRT serialization tag before starting (the server still does)")
    s.add_argument("--grpc-port", type=int, default=8001)
    s.add_argument("--http-port", type=int, default=8000)
    s.add_argument("--metrics-port", type=int, default=8002)
    s.add_argument("--ready-file", metavar="FILE", help="write {grpc_url, model, models, pid, ...} here once ready")
    s.add_argument("--ready-timeout-s", type=float, default=600.0, help="how long the models may take to load")
    s.add_argument("--workspace", metavar="DIR", help="where tritonserver.log goes (default: a temporary folder, "
                   "removed at the stop)")
    s.add_argument("--log-verbose", type=int, default=0, help="tritonserver's log verbosity")


def main(args: argparse.Namespace) -> int:
    serve(args)
    return 0
