"""``trtfuse serve MODEL``: a real NVIDIA Triton Inference Server serving trtfuse's own backend.

PyTriton (``nvidia-pytriton``) ships the ``tritonserver`` binary with its Python backend; the model's
code runs in this process, called by the server's dynamic batcher: each batch goes to a trtfuse
``Backend`` (TensorRT with the plugins on a GPU, one lane per GPU with ``--devices``; ONNX Runtime on a
CPU). The model has the name and I/O that ``trtfuse triton export`` writes for Triton's own TensorRT
backend (``model_io``), so the harness's ``triton`` backend, and any Triton client, use either alike.
Where a ``tritonserver`` with the TensorRT backend is installed, the export is the way to serve an
engine; this command is the way everywhere else, a CPU-only CI machine included.

    trtfuse serve efficientnet-lite0 --backend onnxruntime --grpc-port 8001
    trtfuse serve resnet50 --backend tensorrt --engine FILE --plugins tails --devices all
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import sysconfig
import threading
import time
from pathlib import Path

import numpy as np
from trtfuse.errors import UserError


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve a model from a real Triton server (PyTriton), our backend inside",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="resnet50, efficientnet-lite0, a prepared model folder, or an .onnx file")
    p.add_argument("--backend", choices=["auto", "onnxruntime", "tensorrt", "null"], default="auto",
                   help="what runs the batches (auto: TensorRT if usable, else ONNX Runtime; null: answers at "
                        "once, to measure what the server and its transport cost)")
    p.add_argument("--engine", metavar="FILE", help="TensorRT: a built engine (default: built/cached for the model)")
    p.add_argument("--plugins", choices=["off", "tails"], default="off", help="TensorRT: trtfuse's fused plugins")
    p.add_argument("--precision", default="int8", help="TensorRT: int8, fp16, fp32")
    p.add_argument("--devices", default="", help='TensorRT: GPUs to serve from: "" (GPU 0), "all", or "0,1"')
    p.add_argument("--streams", type=int, default=2, help="TensorRT: streams (concurrent batches) per GPU")
    p.add_argument("--input-format", choices=["float", "int8"],
                   help="the served input: int8 (pixels quantized with the model's input scale, a quarter of "
                        "the bytes) or float; default: what the backend takes (an int8-input engine: int8)")
    p.add_argument("--batch-size", type=int, default=64, help="the model's max_batch_size (default 64)")
    p.add_argument("--name", help="the Triton model name (default: the model's name)")
    p.add_argument("--instances", type=int, default=0,
                   help="model instances, each a thread calling the backend (0: as many batches as it runs at once)")
    p.add_argument("--max-queue-delay-us", type=int, default=100,
                   help="how long Triton's dynamic batcher waits to fill a batch")
    p.add_argument("--grpc-port", type=int, default=8001)
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--metrics-port", type=int, default=8002)
    p.add_argument("--ready-file", metavar="FILE",
                   help="write {grpc_url, http_url, model, pid} here once the model is ready (for scripts)")
    p.add_argument("--shared-memory", choices=["on", "off"], default="on",
                   help="on: clients may register system shared memory (the harness's --triton-transport shm), as "
                        "a stock tritonserver allows; off: PyTriton's default, that endpoint behind a token")
    p.add_argument("--workspace", metavar="DIR", help="PyTriton's working folder (default: a new one in "
                   "~/.cache/pytriton, removed at a clean stop)")
    p.add_argument("--log-verbose", type=int, default=0, help="tritonserver's log verbosity")


def _backend_options(args) -> dict:
    trt = {"engine": args.engine, "precision": args.precision, "plugins": args.plugins == "tails",
           "input_format": args.input_format or "float", "devices": args.devices, "streams": args.streams}
    return {k: v for k, v in trt.items() if v not in (None, "")}


def backend_input_dtype(backend, dims) -> np.dtype:
    """The type the (loaded) backend computes on: what its ``to_input`` makes of float pixels."""
    return np.asarray(backend.to_input(np.zeros((1, *dims), np.float32))).dtype


class ServedModel:
    """The served model's batches, run on a trtfuse backend: the function PyTriton calls."""

    def __init__(self, backend, spec, scale: float | None):
        self.backend, self.spec = backend, spec
        self.scale = scale
        # What the backend computes on: a float backend given int8 pixels gets them dequantized here,
        # exactly as the network's first DequantizeLinear would (x * scale); an int8 backend takes
        # either (its to_input quantizes float pixels as the QuantizeLinear would).
        self.backend_dtype = backend_input_dtype(backend, spec.input.dims)
        self.scores_name = spec.outputs[1].name
        self.requests = self.samples = 0  # counted for the shutdown line
        self._count = threading.Lock()

    def _backend_input(self, images: np.ndarray) -> np.ndarray:
        if images.dtype == np.int8 and self.backend_dtype != np.int8:
            return images.astype(np.float32) * np.float32(self.scale)
        return images

    def __call__(self, requests) -> list[dict]:
        """PyTriton's inference callable: a list of requests (one dynamic batch) -> their outputs."""
        name = self.spec.input.name
        sizes = [len(r[name]) for r in requests]
        arrays = [r[name] for r in requests]
        # One request (an Offline client's full batch) is used as it came: no copy of its pixels.
        images = self._backend_input(arrays[0] if len(arrays) == 1 else np.concatenate(arrays))
        outputs = {self.spec.top_classes.name: self.backend.classify(images, self.spec.top_k)}
        wanted = [r.requested_output_names for r in requests]
        if any(w is None or self.scores_name in w for w in wanted):
            outputs[self.scores_name] = self.backend.infer(images).astype(self.spec.outputs[1].numpy_dtype)
        with self._count:
            self.requests += len(requests)
            self.samples += sum(sizes)
        split, start = [], 0
        for n in sizes:
            split.append({k: v[start:start + n] for k, v in outputs.items()})
            start += n
        return split


def _stub_finds_this_python() -> None:
    """Triton's Python backend stub links libpython; the dynamic loader must find this interpreter's
    (a pyenv or venv build), not the system's of the same version, or the stub cannot import numpy
    from here ("No module named 'numpy'" at model load)."""
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        libdir = sysconfig.get_config_var("LIBDIR")
        paths = os.environ.get("LD_LIBRARY_PATH", "")
        if libdir and libdir not in paths.split(":"):
            os.environ["LD_LIBRARY_PATH"] = f"{libdir}:{paths}" if paths else libdir
    else:
        print("note: this Python has no shared libpython; Triton's Python backend stub will use the "
              "system's libpython of the same version and may not find this environment's packages",
              file=sys.stderr)


def _import_pytriton():
    try:
        from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
        from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig
    except ImportError as e:
        raise UserError("PyTriton is not installed (it bundles the tritonserver binary `trtfuse serve` runs)",
                        'pip install "trtfuse[triton]" (or: pip install nvidia-pytriton)') from e
    return Triton, TritonConfig, TritonSecurityConfig, ModelConfig, DynamicBatcher, Tensor


def _security(TritonSecurityConfig, shared_memory: str):
    """PyTriton puts some endpoints behind a random token; a client registering shared memory (the
    fast same-host transport) cannot know it, so ``on`` lifts that one restriction, leaving the rest."""
    default = TritonSecurityConfig()
    if shared_memory == "off":
        return default
    return TritonSecurityConfig(restricted_endpoints=[e for e in default.restricted_endpoints if e != "shared-memory"])


def serve(args, stop: threading.Event | None = None) -> dict:
    """Serve until SIGINT/SIGTERM (or ``stop`` is set); returns the request counts."""
    from trtfuse.backends import create_backend
    from trtfuse.cli import resolve_model
    from trtfuse.engine import QDQ_FILE, input_scale
    from trtfuse.triton.model_io import triton_model

    Triton, TritonConfig, TritonSecurityConfig, ModelConfig, DynamicBatcher, Tensor = _import_pytriton()
    if args.batch_size < 1:
        raise UserError(f"--batch-size {args.batch_size} is impossible", "use 1 or more, e.g. --batch-size 64")
    prepared = resolve_model(args.model)
    backend = create_backend(args.backend, **_backend_options(args))
    backend.load(prepared, args.batch_size)
    try:
        probe_dtype = backend_input_dtype(backend, prepared.input_shape)
        input_format = args.input_format or ("int8" if probe_dtype == np.int8 else "float")
        scale = None
        if input_format == "int8" or probe_dtype == np.int8:
            if not (Path(prepared.onnx_path).parent / QDQ_FILE).is_file():
                raise UserError(f"int8 input needs {prepared.name}'s input scale, but it is not quantized",
                                f"quantize it first (trtfuse build {args.model} --precision int8 "
                                "--calibration DIR --quantize-only), or serve --input-format float")
            scale = input_scale(Path(prepared.onnx_path).parent)
        spec = triton_model(prepared, "INT8" if input_format == "int8" else "FP32", backend.max_batch,
                            name=args.name)
        model = ServedModel(backend, spec, scale)
        instances = args.instances or max(1, backend.concurrency)
        _stub_finds_this_python()
        config = TritonConfig(grpc_port=args.grpc_port, http_port=args.http_port, metrics_port=args.metrics_port,
                              log_verbose=args.log_verbose)
        stop = stop or threading.Event()
        if threading.current_thread() is threading.main_thread():  # signals reach the main thread only
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, lambda *_: stop.set())
        t0 = time.perf_counter()
        with Triton(config=config, workspace=args.workspace,
                    security_config=_security(TritonSecurityConfig, args.shared_memory)) as triton:
            triton.bind(
                model_name=spec.name, infer_func=[model] * instances,
                inputs=[Tensor(name=spec.input.name, dtype=spec.input.numpy_dtype, shape=spec.input.dims)],
                outputs=[Tensor(name=o.name, dtype=o.numpy_dtype, shape=o.dims) for o in spec.outputs],
                config=ModelConfig(max_batch_size=spec.max_batch_size,
                                   batcher=DynamicBatcher(max_queue_delay_microseconds=args.max_queue_delay_us,
                                                          preferred_batch_size=[spec.max_batch_size])),
                strict=True)
            triton.run()
            ready = {"grpc_url": f"localhost:{args.grpc_port}", "http_url": f"localhost:{args.http_port}",
                     "model": spec.name, "backend": backend.name, "input": spec.input.dtype,
                     "max_batch_size": spec.max_batch_size, "instances": instances, "pid": os.getpid()}
            print(f"trtfuse serve: Triton serving {spec.name!r} ({backend.name}, {spec.input.dtype} input, "
                  f"max batch {spec.max_batch_size}, {instances} instance(s)) at grpc {ready['grpc_url']}, "
                  f"http {ready['http_url']}; ready in {time.perf_counter() - t0:.1f} s; Ctrl-C stops",
                  file=sys.stderr, flush=True)
            if args.ready_file:
                tmp = Path(args.ready_file).with_suffix(".tmp")
                tmp.write_text(json.dumps(ready) + "\n")
                tmp.replace(args.ready_file)  # whole or absent: a reader never sees half a file
            stop.wait()
        print(f"trtfuse serve: stopped after {model.requests} requests, {model.samples} samples",
              file=sys.stderr)
        return {"requests": model.requests, "samples": model.samples}
    finally:
        backend.close()


def main(args: argparse.Namespace) -> int:
    serve(args)
    return 0
