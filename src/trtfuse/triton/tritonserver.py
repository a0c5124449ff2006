"""The ``tritonserver`` binary that ``nvidia-pytriton`` bundles, run as a stock Triton server.

PyTriton's wheel carries a real Triton Inference Server (the binary, its libraries, the Python
backend and a Python backend stub per Python version). trtfuse runs that binary directly on a model
repository it writes, with its own Python-backend model inside (``python_model``): no PyTriton proxy
between the server and the model, so a request's pixels take the server's one copy into the stub's
shared memory and nothing more.

    server = TritonServer(repository, folder, grpc_port=8001, http_port=8000, metrics_port=8002)
    server.wait_ready("resnet50", timeout_s=600)
    ...
    server.stop()
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

from trtfuse.errors import UserError

EXIT_TIMEOUT_S = 20  # tritonserver's --exit-timeout-secs


@dataclass(frozen=True)
class Distribution:
    binary: Path     # bin/tritonserver
    libs: Path       # the libraries it links (libtritonserver, libcudart, ...)
    backends: Path   # backends/python: libtriton_python.so, triton_python_backend_utils.py
    stubs: Path      # python_backend_stubs/<major.minor>/triton_python_backend_stub


def bundled() -> Distribution:
    """The tritonserver of the installed nvidia-pytriton, found without importing pytriton."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("nvidia-pytriton is not installed (it bundles the tritonserver binary trtfuse runs)",
                        'pip install "trtfuse[triton]" (or: pip install nvidia-pytriton)')
    root = Path(next(iter(spec.submodule_search_locations))) / "tritonserver"
    libs = root / "external_libs"  # where a source install keeps them; a wheel keeps them beside the package
    if not libs.is_dir():
        libs = root.parent.parent / "nvidia_pytriton.libs"
    dist = Distribution(root / "bin" / "tritonserver", libs, root / "backends", root / "python_backend_stubs")
    for path in (dist.binary, dist.libs, dist.backends / "python"):
        if not path.exists():
            raise UserError(f"nvidia-pytriton's tritonserver is incomplete: {path} is missing",
                            "reinstall it: pip install --force-reinstall nvidia-pytriton")
    return dist


def stub_for_this_python(dist: Distribution) -> Path:
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    stub = dist.stubs / version / "triton_python_backend_stub"
    if not stub.is_file():
        have = sorted(p.name for p in dist.stubs.iterdir()) if dist.stubs.is_dir() else []
        raise UserError(f"nvidia-pytriton has no Python backend stub for Python {version} (it has {have})",
                        "run trtfuse serve with one of those Python versions")
    return stub


def numpy_problem(numpy_version: str, pytriton_version: str | None) -> UserError | None:
    """Why Triton's Python backend would answer wrongly with this NumPy, or None. nvidia-pytriton's stubs (0.7.0
    and before; its metadata pins numpy < 2) were built against NumPy 1: under NumPy 2 every request is
    answered, without an error, with outputs that hold no data. Where pytriton's version is unknown (unzipped
    without pip), it is taken for one of those."""
    def release(version: str) -> tuple[int, ...]:
        return tuple(int(p) for p in re.findall(r"\d+", version)[:3])

    if release(numpy_version)[:1] < (2,) or (pytriton_version and release(pytriton_version) > (0, 7, 0)):
        return None
    return UserError(f"Triton's Python backend (nvidia-pytriton {pytriton_version or '0.7.0 or older'}) answers "
                     f"empty outputs with NumPy {numpy_version}: its stub was built against NumPy 1",
                     'install numpy < 2 in this environment (pip install "numpy<2"; the triton extra pins it), '
                     "or serve an exported engine with `trtfuse triton serve` (Triton's TensorRT backend)")


def check_numpy() -> None:
    """A UserError where this environment's NumPy would make Triton's Python backend answer empty outputs."""
    import importlib.metadata

    import numpy

    try:
        pytriton = importlib.metadata.version("nvidia-pytriton")
    except importlib.metadata.PackageNotFoundError:
        pytriton = None
    problem = numpy_problem(numpy.__version__, pytriton)
    if problem is not None:
        raise problem


def backend_directory(dist: Distribution, folder: Path) -> Path:
    """A backends folder for this run: the bundled Python backend, with the stub of this Python beside
    it (the Python backend looks for its stub only in its own folder). Links, not copies."""
    python = Path(folder) / "backends" / "python"
    python.mkdir(parents=True, exist_ok=True)
    links = {p.name: p for p in (dist.backends / "python").iterdir() if p.suffix in (".so", ".py")}
    links["triton_python_backend_stub"] = stub_for_this_python(dist)
    for name, target in links.items():
        link = python / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target)
    return python.parent


def server_env(dist: Distribution) -> dict:
    """The environment tritonserver and the stubs it starts run in: its own libraries, and this
    interpreter's libpython first (the stub links libpython; the system's one of the same version
    would not see this environment's packages)."""
    env = dict(os.environ)
    paths = [str(dist.libs)]
    if sysconfig.get_config_var("Py_ENABLE_SHARED") and sysconfig.get_config_var("LIBDIR"):
        paths.insert(0, sysconfig.get_config_var("LIBDIR"))
    else:
        print("note: this Python has no shared libpython; the Python backend stub will use the system's "
              "libpython of the same version and may not find this environment's packages", file=sys.stderr)
    if env.get("LD_LIBRARY_PATH"):
        paths.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = ":".join(paths)
    return env


# tritonserver's error lines ("E1124 07:22:13.69 123 file.cc:642] ...") and model load failures.
_ERROR = re.compile(r"^E\d{4} |failed to load|Failed to initialize|error:", re.IGNORECASE)


class TritonServer:
    """tritonserver on ``repository`` as a child process (same process group: a stop of the group
    stops it), its output in ``folder/tritonserver.log``."""

    def __init__(self, repository: Path, folder: Path, *, grpc_port: int, http_port: int, metrics_port: int,
                 backend_config: dict[str, dict[str, str]] | None = None, flags: list[str] | None = None,
                 log_verbose: int = 0, dist: Distribution | None = None, backends: Path | None = None,
                 lib_paths: list[Path] | None = None):
        """``backends``: the --backend-directory (default: the bundled Python backend's, set up in
        ``folder``); ``lib_paths``: folders the backends' libraries need first on the library path."""
        dist = dist or bundled()
        folder = Path(folder)
        self.grpc_url = f"localhost:{grpc_port}"
        self.log = folder / "tritonserver.log"
        cmd = [str(dist.binary), "--model-repository", str(repository),
               "--backend-directory", str(backends or backend_directory(dist, folder)),
               "--grpc-port", str(grpc_port), "--http-port", str(http_port), "--metrics-port", str(metrics_port),
               # Room at the stop for every instance to finalize (close its engine, log what it ran):
               # on the H100 one of two TensorRT instances once needed more than 5 s.
               "--exit-timeout-secs", str(EXIT_TIMEOUT_S), "--log-verbose", str(log_verbose)]
        for backend, settings in (backend_config or {}).items():
            cmd += [f"--backend-config={backend},{k}={v}" for k, v in settings.items()]
        cmd += flags or []
        self.command = cmd
        env = server_env(dist)
        if lib_paths:
            env["LD_LIBRARY_PATH"] = ":".join([*map(str, lib_paths), env["LD_LIBRARY_PATH"]])
        self.repository = Path(repository).resolve()
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)

    def errors(self, lines: int = 12) -> str:
        """The log's error lines (the last ``lines``), else its tail."""
        text = self.log.read_text(errors="replace").splitlines() if self.log.is_file() else []
        found = [line for line in text if _ERROR.search(line)]
        return "\n".join((found or text)[-lines:])

    def wait_ready(self, model: str, timeout_s: float, stop=None) -> None:
        """Until ``model`` is ready (or the ``stop`` event is set); a UserError with the server's errors
        if it exits or times out."""
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(self.grpc_url)
        deadline = time.monotonic() + timeout_s
        try:
            while stop is None or not stop.is_set():
                if self.proc.poll() is not None:
                    raise UserError(f"tritonserver exited (code {self.proc.returncode}) before {model!r} was "
                                    f"ready:\n{self.errors()}", f"the whole log: {self.log}")
                try:
                    if client.is_model_ready(model):
                        return
                except Exception:  # noqa: BLE001 - not listening yet
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise UserError(f"tritonserver did not make {model!r} ready in {timeout_s:.0f} s:\n"
                                    f"{self.errors()}", f"the whole log: {self.log}")
                time.sleep(0.2)
        finally:
            client.close()

    def statistics(self, model: str) -> dict | None:
        """Requests and samples the server ran for ``model`` (None if it does not answer)."""
        import tritonclient.grpc as grpcclient

        try:
            client = grpcclient.InferenceServerClient(self.grpc_url)
            stats = client.get_inference_statistics(model, as_json=True, client_timeout=5)
            client.close()
        except Exception:  # noqa: BLE001 - stopping already
            return None
        s = stats.get("model_stats", [{}])[0]
        return {"requests": int(s.get("inference_stats", {}).get("success", {}).get("count", 0)),
                "samples": int(s.get("inference_count", 0)), "batches": int(s.get("execution_count", 0))}

    def kill(self) -> None:
        """At once (a second Ctrl-C): the server and its stub processes, which it started."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self._kill_stubs()

    def stop(self) -> None:
        """Cleanly (in-flight requests finish, instances finalize), then whatever of its group is left."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=EXIT_TIMEOUT_S + 10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self._kill_stubs()

    def _kill_stubs(self) -> None:
        """The Python backend's stubs of this server still alive once it has exited: one that the server started
        while it was being stopped outlives it, blocked before it watches its parent (a Ctrl-C while serve
        starts). A stub's command line names its model, inside this server's repository."""
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                args = cmdline.read_bytes().split(b"\0")
            except OSError:
                continue
            if args and b"triton_python_backend_stub" in args[0] and any(
                    str(self.repository).encode() in a for a in args[1:]):
                try:
                    os.kill(int(cmdline.parent.name), signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
