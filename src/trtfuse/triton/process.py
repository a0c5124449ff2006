"""``trtfuse serve`` as a child process: started on free ports, ready when its ready file appears,
stopped whole (python, tritonserver and the Python backend stubs share its process group). Its log,
and tritonserver's (``workspace/tritonserver.log``), stay in its folder.

For scripts and tests that need a real Triton server beside the harness:

    with ServeProcess(["efficientnet-lite0", "--backend", "onnxruntime"], folder) as server:
        trtfuse run --backend triton --triton-url server.url ...
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from trtfuse.errors import UserError
from trtfuse.triton.tritonserver import EXIT_TIMEOUT_S


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServeProcess:
    """``python -m trtfuse serve ARGS`` in its own process group; ``url`` is its gRPC address."""

    def __init__(self, args: list[str], folder: Path, env: dict | None = None, timeout_s: float = 300.0,
                 command: tuple[str, ...] = ("serve",)):
        """``command``: the trtfuse command that serves (``("triton", "serve")``: an exported repository on
        Triton's own TensorRT backend)."""
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.ready_file, self.log = self.folder / "ready.json", self.folder / "serve.log"
        self.ready_file.unlink(missing_ok=True)
        self.workspace = self.folder / "workspace"  # the model repository and tritonserver.log, kept
        self.grpc_port = free_port()
        self.url = f"localhost:{self.grpc_port}"
        cmd = [sys.executable, "-m", "trtfuse", *command, *args, "--grpc-port", str(self.grpc_port),
               "--http-port", str(free_port()), "--metrics-port", str(free_port()),
               "--ready-file", str(self.ready_file), "--workspace", str(self.workspace)]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(cmd, env={**os.environ, **(env or {})}, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while not self.ready_file.is_file():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop(signal.SIGKILL)
                raise UserError(f"trtfuse {' '.join(command)} did not come up (exit code {self.proc.returncode}); "
                                f"its log ends:\n{self.tail()}", f"read {self.log}")
            time.sleep(0.2)
        self.ready = json.loads(self.ready_file.read_text())

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """SIGTERM: a clean stop (serve stops tritonserver, which finalizes its model instances);
        SIGKILL: a crash of the whole process group. Then wait for it."""
        if self.proc.poll() is None:
            try:
                if sig == signal.SIGTERM:
                    self.proc.send_signal(sig)
                else:
                    os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=EXIT_TIMEOUT_S + 20)  # serve waits for tritonserver, which waits for its instances
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        try:  # whatever of the group is left (a stub whose server was killed)
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
