"""bench triton's stages through Triton's own TensorRT backend (native-offline, native-server, native-accuracy)
on CPU: what needs the GPU (TensorRT, the engines, the server, LoadGen) is replaced by stand-ins that check each
call against the real function's signature, so that the device run calls what exists with arguments it takes,
and the record holds what issue 42 asks: "triton_backend": "tensorrt" rows, the ratios to direct on the same
lease, and EfficientNet-Lite0's top-1 direct and through Triton with the predictions that differ."""

from __future__ import annotations

import inspect
import json
import struct
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import trtfuse
from trtfuse import backends
from trtfuse.bench import triton as bench_triton

N_IMAGES = 300  # two chunks of native-accuracy's 256
DIRECT = {"offline_samples_per_s": 80000.0, "server_qps": 60000.0, "engine_samples_per_s": 82000.0}


def checked(real):
    """A stand-in's guard: the call must bind to ``real``'s signature."""
    sig = inspect.signature(real)

    def bind(*args, **kwargs):
        sig.bind(*args, **kwargs)
    return bind


def top1_of(images: np.ndarray) -> np.ndarray:
    return images.reshape(len(images), -1)[:, 0].astype(np.int64) % 10


class FakeImages:
    def __init__(self, bundle: Path):
        rng = np.random.default_rng(3)
        self.array = rng.integers(-128, 128, size=(N_IMAGES, 3, 4, 4), dtype=np.int8)
        self.labels = top1_of(self.array)
        self.labels[:30] = (self.labels[:30] + 1) % 10  # direct top-1 0.9

    def __len__(self):
        return len(self.array)

    def images(self, indices):
        return self.array[np.asarray(indices, dtype=np.int64).reshape(-1)]


@pytest.fixture
def stand_ins(tmp_path, monkeypatch):
    from trtfuse import engine, models
    from trtfuse.backends import tensorrt_backend
    from trtfuse.triton import export, process

    calls = {"serve": [], "clients": [], "loadgen": []}
    monkeypatch.setitem(sys.modules, "tensorrt", types.SimpleNamespace(__version__="8.5.3.1"))
    cuda = types.ModuleType("trtfuse.cuda_runtime")
    cuda.device_name = lambda device=0: "NVIDIA H200"
    cuda.device_count = lambda: 1
    monkeypatch.setitem(sys.modules, "trtfuse.cuda_runtime", cuda)
    monkeypatch.setattr(trtfuse, "cuda_runtime", cuda, raising=False)

    build_check = checked(engine.build_engine)

    def build_engine(model_dir, cfg, *args, **kwargs):
        build_check(model_dir, cfg, *args, **kwargs)
        plan = tmp_path / "engines" / f"{Path(model_dir).name}-b{cfg.batch}.engine"
        plan.parent.mkdir(exist_ok=True)
        plan.write_bytes(b"ptrt" + bytes(4) + struct.pack("<I", 232) + bytes(64))  # TensorRT 8.5's tag
        return plan
    monkeypatch.setattr(engine, "build_engine", build_engine)
    monkeypatch.setattr(models, "load_prepared",
                        lambda folder: types.SimpleNamespace(name=Path(folder).name, input_shape=(3, 4, 4)))
    monkeypatch.setattr(bench_triton, "BundleImages", FakeImages)

    direct_check = checked(tensorrt_backend.TensorRTBackend.__init__)

    class Direct:
        def __init__(self, *args, **kwargs):
            direct_check(self, *args, **kwargs)

        def load(self, model, batch):
            assert batch == 256

        def classify(self, x, k=5):
            assert len(x) <= 256 and x.dtype == np.int8
            return np.repeat(top1_of(x)[:, None], k, axis=1)

        def close(self):
            pass
    monkeypatch.setattr(tensorrt_backend, "TensorRTBackend", Direct)

    export_check = checked(export.export_repository)

    def export_repository(prepared, plan, repo, **kwargs):
        export_check(prepared, plan, repo, **kwargs)
        assert Path(plan).is_file() and kwargs.get("force") is True
        folder = Path(repo) / prepared.name
        folder.mkdir(parents=True, exist_ok=True)
        # the instance groups the export writes: one per optimization profile (2) unless asked otherwise
        groups = kwargs.get("instances_per_gpu") or 2
        (folder / "config.pbtxt").write_text("instance_group { count: 1 kind: KIND_GPU gpus: [0] }\n" * groups)
        return folder
    monkeypatch.setattr(export, "export_repository", export_repository)

    serve_check = checked(process.ServeProcess.__init__)

    class Served:
        def __init__(self, *args, **kwargs):
            serve_check(self, *args, **kwargs)
            calls["serve"].append((args, kwargs))
            self.url = "localhost:1"
            # the models of the repository it serves: a client may load only those
            self.models = {d.name for d in Path(args[0][0]).iterdir() if d.is_dir()}
            self.ready = {"backend": "tensorrt-native", "tensorrt": "8.5.3", "backend_library": "/tmp/lib.so",
                          "plugins": ["/tmp/plugins.so"]}

        def __enter__(self):
            serving.append(self)
            return self

        def __exit__(self, *exc):
            serving.remove(self)
    serving = []
    monkeypatch.setattr(process, "ServeProcess", Served)

    class Client:
        server_version = "2.51.0"

        def load(self, model, batch):
            assert any(model.name in s.models for s in serving), f"{model.name} is not served"

        def classify(self, x, k=5):
            top = top1_of(x)
            top[:1] = (top[:1] + 3) % 10  # one answer through Triton differs from direct
            return np.repeat(top[:, None], k, axis=1)

        def close(self):
            pass

    def create_backend(name, **options):
        assert name == "triton" and options["transport"] in ("cuda", "shm", "grpc")
        calls["clients"].append(options)
        return Client()
    monkeypatch.setattr(backends, "create_backend", create_backend)
    row_check = checked(bench_triton.loadgen_row)

    def loadgen_row(backend, model, dataset, scenario, batch, qps, runs, name):
        row_check(backend, model, dataset, scenario, batch, qps, runs, name)
        calls["loadgen"].append((scenario, batch, name))
        return {"samples_per_s": 0.9 * qps if scenario == "offline" else None, "valid": qps <= 50000.0,
                "p99_ms": 9.0 if qps <= 50000.0 else 20.0}
    monkeypatch.setattr(bench_triton, "loadgen_row", loadgen_row)
    return calls


def test_the_tensorrt_backend_stages_write_their_rows_beside_direct(tmp_path, stand_ins):
    out = tmp_path / "triton_h200.json"
    out.write_text(json.dumps({"direct": DIRECT, "errors": {}}))  # an earlier call's direct stage
    rc = bench_triton.main(["run", "--bundle", str(tmp_path / "bundle"), "--out", str(out), "--server-tries", "3",
                            "--stages", "native-offline,native-server,native-accuracy"])
    data = json.loads(out.read_text())
    assert rc == 0 and data["errors"] == {}
    native = data["triton_tensorrt_backend"]
    assert native["triton_backend"] == "tensorrt" and native["triton_version"] == "2.51.0"
    assert native["served"] == {"tensorrt": "8.5.3", "backend_library": "/tmp/lib.so", "plugins": ["/tmp/plugins.so"]}
    # Offline over each of --native-transports, the best one against direct Offline of the same lease.
    assert [(r["triton_backend"], r["transport"]) for r in native["offline"]] == [("tensorrt", "cuda"),
                                                                                 ("tensorrt", "shm")]
    assert native["offline_ratio_to_direct"] == pytest.approx(native["offline_samples_per_s"] / 80000.0, abs=1e-4)
    assert all(r["instances"] == 2 for r in native["offline"])
    # The Server search for each of --server-inflight on one server, with the instances it served.
    assert [(s["instances"], s["inflight"]) for s in native["server_searches"]] == [(2, 2), (2, 4)]
    assert all(s["triton_backend"] == "tensorrt" and len(s["tries"]) == 3 for s in native["server_searches"])
    assert native["server_ratio_to_direct"] == pytest.approx(native["server_qps"] / 60000.0, abs=1e-4)
    # Each served repository: the plan's TensorRT, read from its serialization tag.
    assert native["plan_tags"] == {"resnet50-2048": [232, "8.5"], "resnet50-256": [232, "8.5"],
                                   "efficientnet-lite0-256": [232, "8.5"]}
    assert native["accuracy"] == {"model": "efficientnet-lite0", "n_images": N_IMAGES, "transport": "cuda",
                                  "direct_top1": 0.9, "triton_top1": round(269 / N_IMAGES, 4),
                                  "predictions_differing": 2}  # one per chunk of 256
    # Each stage served its exported repository with `trtfuse triton serve`, not the Python backend's serve.
    assert [kw.get("command") for _, kw in stand_ins["serve"]] == [("triton", "serve")] * 3


def test_a_native_stage_alone_still_says_which_backend(tmp_path, stand_ins):
    out = tmp_path / "triton_h200.json"
    rc = bench_triton.main(["run", "--bundle", str(tmp_path / "bundle"), "--out", str(out),
                            "--stages", "native-accuracy"])
    data = json.loads(out.read_text())
    assert rc == 0 and data["errors"] == {}
    assert data["triton_tensorrt_backend"]["triton_backend"] == "tensorrt"
    assert data["triton_tensorrt_backend"]["accuracy"]["n_images"] == N_IMAGES


def test_a_transport_the_machine_refuses_leaves_the_others_measured(tmp_path, stand_ins, monkeypatch):
    make = backends.create_backend

    def create_backend(name, **options):
        if options["transport"] == "cuda":
            raise RuntimeError("cudaIpcGetMemHandle failed: cudaErrorNotSupported")
        return make(name, **options)
    monkeypatch.setattr(backends, "create_backend", create_backend)
    out = tmp_path / "triton_h200.json"
    out.write_text(json.dumps({"direct": DIRECT, "errors": {}}))
    rc = bench_triton.main(["run", "--bundle", str(tmp_path / "bundle"), "--out", str(out),
                            "--stages", "native-offline"])
    native = json.loads(out.read_text())["triton_tensorrt_backend"]
    assert rc == 0 and native["offline"][0] == {"triton_backend": "tensorrt", "transport": "cuda", "instances": 2,
                                                "error": "RuntimeError: cudaIpcGetMemHandle failed: "
                                                         "cudaErrorNotSupported"}
    assert native["offline_transport"] == "shm" and native["offline_ratio_to_direct"]
    # Every transport refused: the stage fails, with each reason.
    rc = bench_triton.main(["run", "--bundle", str(tmp_path / "bundle"), "--out", str(out),
                            "--stages", "native-offline", "--native-transports", "cuda"])
    assert rc == 1 and "no transport measured" in json.loads(out.read_text())["errors"]["native-offline"]


def test_searches_of_other_instances_stay_beside_and_ties_go_to_the_lower_p99(tmp_path, stand_ins, monkeypatch):
    out = tmp_path / "triton_h200.json"
    out.write_text(json.dumps({"direct": DIRECT, "errors": {}}))
    run = ["run", "--bundle", str(tmp_path / "bundle"), "--out", str(out), "--server-tries", "3",
           "--stages", "native-server"]
    assert bench_triton.main([*run, "--server-inflight", "4"]) == 0
    searches = json.loads(out.read_text())["triton_tensorrt_backend"]["server_searches"]
    # a second call serving one instance: found the same QPS at a lower p99
    monkeypatch.setattr(bench_triton, "server_search", lambda *a, **k: {"qps": searches[0]["qps"], "p99_ms": 5.0,
                                                                        "valid": True, "tries": []})
    assert bench_triton.main([*run, "--server-inflight", "4", "--native-instances", "1"]) == 0
    native = json.loads(out.read_text())["triton_tensorrt_backend"]
    assert [(s["instances"], s["inflight"]) for s in native["server_searches"]] == [(2, 4), (1, 4)]
    assert (native["server_instances"], native["server_inflight"], native["p99_ms"]) == (1, 4, 5.0)
