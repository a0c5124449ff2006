"""The triton backend's request slots on their own: a server that refuses shared memory leaves no
region behind in /dev/shm, and the refusal is the clear error that names the transport."""

import os
from pathlib import Path

import pytest

pytest.importorskip("tritonclient")

from conftest_harness import tiny_model  # noqa: E402
from trtfuse.errors import UserError  # noqa: E402
from trtfuse.triton.model_io import triton_model  # noqa: E402


class RefusingClient:
    """Registers the first region, refuses the second, as a server on another host would."""

    def __init__(self, error_type):
        self.error_type, self.registered, self.unregistered = error_type, [], []

    def register_system_shared_memory(self, name, key, nbytes):
        if self.registered:
            raise self.error_type("shared memory region not found")
        self.registered.append(name)

    def unregister_system_shared_memory(self, name):
        self.unregistered.append(name)


def _regions_of_this_process() -> list[str]:
    return sorted(p.name for p in Path("/dev/shm").glob(f"trtfuse_{os.getpid()}_*"))


def test_a_refused_region_leaves_nothing_behind(tmp_path):
    from trtfuse.backends.triton_backend import TritonBackend, _Slot

    model = tiny_model(tmp_path)
    backend = TritonBackend(url="localhost:1", transport="shm", inflight=2)
    backend.spec = triton_model(model, "FP32", 8)
    backend.client = RefusingClient(backend.ServerError)
    before = _regions_of_this_process()
    with pytest.raises(backend.ServerError):
        _Slot(backend, 0, 8)
    assert _regions_of_this_process() == before
    assert set(backend.client.registered) <= set(backend.client.unregistered)  # registered, then taken back


def test_load_turns_a_refusal_into_a_clear_error(tmp_path, monkeypatch):
    from trtfuse.backends import triton_backend

    model = tiny_model(tmp_path)
    backend = triton_backend.TritonBackend(url="localhost:1", transport="shm", inflight=2)
    refusing = RefusingClient(backend.ServerError)
    spec = triton_model(model, "FP32", 8)

    class Connected(RefusingClient):
        def is_server_live(self, client_timeout=None):
            return True

        def get_server_metadata(self):
            return type("M", (), {"version": "2.51.0"})()

        def is_model_ready(self, name):
            return True

        def get_model_config(self, name):
            from trtfuse.triton.model_io import model_config
            return type("C", (), {"config": model_config(spec)})()

        def close(self):
            pass

    monkeypatch.setattr(backend.grpc, "InferenceServerClient", lambda url: Connected(refusing.error_type))
    before = _regions_of_this_process()
    with pytest.raises(UserError, match="refused shm shared memory.*one host"):
        backend.load(model, 8)
    assert _regions_of_this_process() == before and backend._slots == []
