"""``trtfuse serve MODEL``: a real NVIDIA Triton Inference Server serving trtfuse's own backend.

The ``tritonserver`` that ``nvidia-pytriton`` bundles runs a model repository written here: the
model has the name and I/O that ``trtfuse triton export`` writes for Triton's TensorRT backend
(``model_io``), and Triton's Python backend runs it (``python_model``): each model instance is a stub
process with its own trtfuse backend (TensorRT with the plugins on the instance's GPU, ONNX Runtime
on a CPU), fed by Triton's dynamic batcher. The harness's ``triton`` backend, and any Triton client,
use it as they would the export. Where a ``tritonserver`` with the TensorRT backend is installed, the
export is the way to serve an engine; this command is the way everywhere else, a CPU-only CI machine
included.

    trtfuse serve efficientnet-lite0 --backend onnxruntime --grpc-port 8001
    trtfuse serve resnet50 --backend tensorrt --engine FILE --plugins tails --devices all
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from trtfuse import interrupts
from trtfuse.config import PLUGINS_HELP
from trtfuse.errors import UserError


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve a model from a real Triton server, our backend inside",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="resnet50, efficientnet-lite0, a prepared model folder, or an .onnx file")
    p.add_argument("--backend", choices=["auto", "onnxruntime", "tensorrt", "null"], default="auto",
                   help="what runs the batches (auto: TensorRT if usable, else ONNX Runtime; null: answers at "
                        "once, to measure what the server and its transport cost)")
    p.add_argument("--engine", metavar="FILE", help="TensorRT: a built engine (default: built/cached for the model)")
    p.add_argument("--plugins", choices=["off", "tails", "all"], default="off",
                   help=f"TensorRT: {PLUGINS_HELP}")
    p.add_argument("--precision", default="int8", help="TensorRT: int8, fp16, fp32")
    p.add_argument("--devices", default="", help='TensorRT: GPUs to serve from: "" (GPU 0), "all", or "0,1"')
    p.add_argument("--input-format", choices=["float", "int8"],
                   help="the served input: int8 (pixels quantized with the model's input scale, a quarter of "
                        "the bytes) or float; default: what the backend takes (an int8-input engine: int8)")
    p.add_argument("--batch-size", type=int, default=64, help="the model's max_batch_size (default 64)")
    p.add_argument("--name", help="the Triton model name (default: the model's name)")
    p.add_argument("--instances", type=int, default=1,
                   help="model instances per GPU (or on the CPU): each a Python backend stub process with its "
                        "own backend (default 1)")
    p.add_argument("--concurrency", type=int, default=1,
                   help="dynamic batches each instance runs at once (default 1). More than 1 makes the model "
                        "decoupled: N worker threads in the one stub (TensorRT: N streams of one CUDA context), "
                        "answering through Triton's streaming API (gRPC ModelStreamInfer), which the harness's "
                        "triton backend uses by itself; Triton's unary infer refuses decoupled models. On the "
                        "H100: Offline 0.996 of direct with 2 against 0.955 with 1; Server worse (a small batch "
                        "pays the hand-off to a worker)")
    p.add_argument("--max-queue-delay-us", type=int, default=100,
                   help="how long Triton's dynamic batcher waits to fill a batch")
    p.add_argument("--grpc-port", type=int, default=8001)
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--metrics-port", type=int, default=8002)
    p.add_argument("--ready-file", metavar="FILE",
                   help="write {grpc_url, http_url, model, pid} here once the model is ready (for scripts)")
    p.add_argument("--ready-timeout-s", type=float, default=600.0,
                   help="how long the model may take to load in every instance (default 600)")
    p.add_argument("--workspace", metavar="DIR", help="where the model repository and tritonserver.log go "
                   "(default: a new temporary folder, removed at the stop)")
    p.add_argument("--log-verbose", type=int, default=0, help="tritonserver's log verbosity")


def _backend_options(args) -> dict:
    trt = {"engine": args.engine, "precision": args.precision, "plugins": args.plugins,
           "input_format": args.input_format or "float"}
    return {k: v for k, v in trt.items() if v not in (None, "")}


MODEL_PY = """# Written by `trtfuse serve`: Triton's Python backend runs trtfuse's model.
from trtfuse.triton.python_model import TritonPythonModel  # noqa: F401
"""


@dataclass(frozen=True)
class Plan:
    """What ``serve`` found out by loading the backend once: what the instances load and serve."""
    spec: object                 # model_io.TritonModel
    settings: str                # python_model.settings(): the instances' backend, concretely
    backend: str                 # its name
    gpus: list[int] | None       # TensorRT: one instance group per GPU
    device_input: bool           # inputs in CUDA shared memory stay on the GPU (the backend reads them there)
    concurrency: int             # batches an instance runs at once (more than 1: a decoupled model)


def plan(args) -> Plan:
    """Load the backend once here (a TensorRT engine is built or found once, not by every instance),
    learn what it serves, and hand the instances concrete settings."""
    from trtfuse.backends import create_backend
    from trtfuse.session import resolve_model
    from trtfuse.quantize_step import QDQ_FILE, input_scale
    from trtfuse.triton.model_io import triton_model
    from trtfuse.triton.python_model import backend_input_dtype, settings

    if args.batch_size < 1:
        raise UserError(f"--batch-size {args.batch_size} is impossible", "use 1 or more, e.g. --batch-size 64")
    if args.instances < 1:
        raise UserError(f"--instances {args.instances} is impossible", "use 1 or more model instances")
    if args.concurrency < 1:
        raise UserError(f"--concurrency {args.concurrency} is impossible", "use 1 or more batches at once")
    prepared = resolve_model(args.model)
    # On GPU 0 (the instances go to --devices); a TensorRT engine built here gets a profile per stream of
    # an instance (2 at least, the direct backend's default, so that both find it in the cache).
    backend = create_backend(args.backend, **_backend_options(args), streams=max(2, args.concurrency))
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
            scale = float(input_scale(Path(prepared.onnx_path).parent))
        spec = triton_model(prepared, "INT8" if input_format == "int8" else "FP32", backend.max_batch,
                            name=args.name)
        options = {} if backend.name == "null" else _backend_options(args)
        gpus = None
        if backend.name == "tensorrt":
            from trtfuse import cuda_runtime
            from trtfuse.backends.tensorrt_backend import parse_devices

            # One stream per batch an instance runs at once.
            if args.concurrency > backend.engine.num_optimization_profiles:
                raise UserError(f"--concurrency {args.concurrency} needs as many optimization profiles, but "
                                f"{backend.engine_path} has {backend.engine.num_optimization_profiles}",
                                "serve with a smaller --concurrency, or without --engine (one is built with "
                                "a profile per stream)")
            options.update(engine=str(backend.engine_path), streams=args.concurrency)
            gpus = parse_devices(args.devices, cuda_runtime.device_count())
        elif args.devices:
            raise UserError(f"--devices is for the TensorRT backend, not {backend.name}",
                            "leave --devices out, or serve with --backend tensorrt")
        return Plan(spec, settings(str(prepared.dir), backend.name, options, scale, args.concurrency),
                    backend.name, gpus, device_input=gpus is not None and spec.input.numpy_dtype == probe_dtype,
                    concurrency=args.concurrency)
    finally:
        backend.close()


def write_repository(folder: Path, served: Plan, instances: int, max_queue_delay_us: int) -> Path:
    """The model repository tritonserver loads: ``<name>/config.pbtxt`` (Triton's Python backend,
    trtfuse's settings as a parameter) and ``<name>/1/model.py``."""
    from trtfuse.triton.model_io import config_text, model_config
    from trtfuse.triton.python_model import PARAMETER

    spec = served.spec
    cfg = model_config(spec, backend="python", gpus=served.gpus, instances_per_gpu=instances,
                       max_queue_delay_us=max_queue_delay_us)
    cfg.parameters[PARAMETER].string_value = served.settings
    if served.concurrency > 1:  # execute hands batches to workers, which answer later
        cfg.model_transaction_policy.decoupled = True
    if served.device_input:  # the Python backend's default is to bring every input to the host
        cfg.parameters["FORCE_CPU_ONLY_INPUT_TENSORS"].string_value = "no"
    repo = Path(folder) / "repository"
    (repo / spec.name / "1").mkdir(parents=True, exist_ok=True)
    (repo / spec.name / "config.pbtxt").write_text(config_text(cfg))
    (repo / spec.name / "1" / "model.py").write_text(MODEL_PY)
    return repo


def _batch_bytes(spec) -> int:
    """A full batch's inputs and outputs, and a MB to spare."""
    per_sample = int(np.prod(spec.input.dims)) * spec.input.numpy_dtype.itemsize + sum(
        int(np.prod(o.dims)) * o.numpy_dtype.itemsize for o in spec.outputs)
    return spec.max_batch_size * per_sample + (1 << 20)


def _server_options(served: Plan, instances: int) -> tuple[dict, list[str]]:
    """tritonserver's --backend-config for the Python backend, and its other flags.

    The Python backend's shared memory with its stubs: room for a full batch from the start (its
    default of 1 MB grows 1 MB at a time), named per server so that several on one host do not meet.
    Inputs that stay on the GPU reach the stubs through Triton's CUDA memory pool: room for every
    batch in flight on each GPU, and one more per instance (its default is 64 MB)."""
    batch = _batch_bytes(served.spec)
    python = {"shm-default-byte-size": str(batch), "shm-growth-byte-size": str(batch),
              "shm-region-prefix-name": f"trtfuse{os.getpid()}_"}
    flags = []
    if served.device_input:
        in_flight = instances * (served.concurrency + 1)
        flags = [f"--cuda-memory-pool-byte-size={gpu}:{in_flight * batch}" for gpu in served.gpus]
    return {"python": python}, flags


def serve(args, stop: threading.Event | None = None) -> dict:
    """Serve until SIGINT/SIGTERM (or ``stop`` is set); returns what the server ran."""
    from trtfuse.triton import tritonserver

    dist = tritonserver.bundled()  # before any model work: without it, that is what to hear first
    tritonserver.stub_for_this_python(dist)
    tritonserver.check_numpy()
    served = plan(args)
    spec = served.spec
    workspace = Path(args.workspace) if args.workspace else Path(tempfile.mkdtemp(prefix="trtfuse-serve-"))
    workspace.mkdir(parents=True, exist_ok=True)
    stop = stop or threading.Event()
    t0 = time.perf_counter()
    repo = write_repository(workspace, served, args.instances, args.max_queue_delay_us)
    backend_config, flags = _server_options(served, args.instances)
    ran = None
    # Ctrl-C, SIGTERM: the server stops cleanly (in-flight requests finish, instances finalize); a
    # second signal kills it and exits at once. The ready file goes first: a reader never finds one of
    # a server that is stopping. The section starts before the server does: a signal while it starts
    # stops it the same way.
    ready_file = Path(args.ready_file) if args.ready_file else None
    with contextlib.ExitStack() as section:
        section.enter_context(interrupts.deferred(on_interrupt=stop.set, stopping="the server"))
        section.enter_context(interrupts.on_exit(lambda: _remove_ready_file(ready_file)))
        server = tritonserver.TritonServer(repo, workspace, grpc_port=args.grpc_port, http_port=args.http_port,
                                           metrics_port=args.metrics_port, log_verbose=args.log_verbose,
                                           backend_config=backend_config, flags=flags, dist=dist)
        section.enter_context(interrupts.on_exit(server.kill))
        try:
            server.wait_ready(spec.name, args.ready_timeout_s, stop)
            instances = args.instances * (len(served.gpus) if served.gpus else 1)
            ready = {"grpc_url": server.grpc_url, "http_url": f"localhost:{args.http_port}",
                     "model": spec.name, "backend": served.backend, "input": spec.input.dtype,
                     "max_batch_size": spec.max_batch_size, "instances": instances, "gpus": served.gpus,
                     "device_input": served.device_input, "concurrency": served.concurrency,
                     "decoupled": served.concurrency > 1, "pid": os.getpid()}
            if not stop.is_set():
                print(f"trtfuse serve: Triton serving {spec.name!r} ({served.backend}, {spec.input.dtype} input, "
                      f"max batch {spec.max_batch_size}, {instances} instance(s)) at grpc {ready['grpc_url']}, "
                      f"http {ready['http_url']}; ready in {time.perf_counter() - t0:.1f} s; log {server.log}; "
                      "Ctrl-C stops", file=sys.stderr, flush=True)
                if ready_file:
                    tmp = ready_file.with_suffix(".tmp")
                    tmp.write_text(json.dumps(ready) + "\n")
                    tmp.replace(ready_file)  # whole or absent: a reader never sees half a file
            while not stop.wait(0.5):
                if server.proc.poll() is not None:
                    raise UserError(f"tritonserver exited (code {server.proc.returncode}) while serving:\n"
                                    f"{server.errors()}", f"the whole log: {server.log}")
            ran = server.statistics(spec.name)
        finally:
            _remove_ready_file(ready_file)
            server.stop()
            if not args.workspace:
                shutil.rmtree(workspace, ignore_errors=True)
    counts = (f"{ran['requests']} requests, {ran['samples']} samples in {ran['batches']} batches" if ran
              else "counts unknown (the server stopped first)")
    print(f"trtfuse serve: stopped after {counts}", file=sys.stderr)
    return ran or {}


def _remove_ready_file(path: Path | None) -> None:
    if path is not None:
        path.unlink(missing_ok=True)
        path.with_suffix(".tmp").unlink(missing_ok=True)


def main(args: argparse.Namespace) -> int:
    serve(args)
    return interrupts.EXIT_CODE if interrupts.requested() else 0  # stopped by Ctrl-C/SIGTERM: 130
