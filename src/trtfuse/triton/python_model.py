"""trtfuse's model in Triton's Python backend: the ``TritonPythonModel`` that ``trtfuse serve`` puts in
its model repository (``1/model.py`` imports it from here).

Each model instance is one Python backend stub process: ``initialize`` loads a trtfuse backend there
(TensorRT with the plugins on the instance's GPU, ONNX Runtime, or null) from the settings ``serve``
wrote into config.pbtxt's ``trtfuse`` parameter; ``execute`` runs one dynamic batch of requests on it.
A request's pixels reach ``execute`` as a numpy view of the stub's shared memory (the server's one
copy), or, where the client sent them in CUDA shared memory and the backend reads GPU memory
(``device_input``), on the GPU, read through DLPack and copied device to device into the engine's input.

An instance runs one dynamic batch at a time unless ``serve --concurrency N`` made the model decoupled:
then ``execute`` stages each batch (copies its inputs: Triton may reuse their memory once ``execute``
has returned, and on the H100 did) and hands it to one of N worker threads, so that N batches run at
the same time in the one stub (on N CUDA streams of one context, where separate instances would be
separate, time-sliced contexts); a worker answers each request through its response sender.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

PARAMETER = "trtfuse"  # the config.pbtxt parameter holding settings() (JSON)


def backend_input_dtype(backend, dims) -> np.dtype:
    """The type the (loaded) backend computes on: what its ``to_input`` makes of float pixels."""
    return np.asarray(backend.to_input(np.zeros((1, *dims), np.float32))).dtype


class ServedModel:
    """The served model's batches, run on a trtfuse backend."""

    def __init__(self, backend, spec, scale: float | None):
        self.backend, self.spec = backend, spec
        self.scale = scale
        # What the backend computes on: a float backend given int8 pixels gets them dequantized here,
        # exactly as the network's first DequantizeLinear would (x * scale); an int8 backend takes
        # either (its to_input quantizes float pixels as the QuantizeLinear would).
        self.backend_dtype = backend_input_dtype(backend, spec.input.dims)
        self.scores_name = spec.outputs[1].name
        self.requests = self.samples = 0
        self.device_requests = 0  # of them, read in GPU memory (run_device)
        self.busy_s = 0.0  # time spent running batches (summed over the workers running them at once)
        self._count = threading.Lock()

    def _backend_input(self, images: np.ndarray) -> np.ndarray:
        if images.dtype == np.int8 and self.backend_dtype != np.int8:
            return images.astype(np.float32) * np.float32(self.scale)
        return images

    def run(self, arrays: list[np.ndarray], scores: bool) -> list[dict[str, np.ndarray]]:
        """The outputs of each request of one dynamic batch (``arrays``: each request's images): its
        top classes, and its scores when ``scores``."""
        t0, sizes = time.perf_counter(), [len(a) for a in arrays]
        # One request (an Offline client's full batch) is used as it came: no copy of its pixels.
        images = self._backend_input(arrays[0] if len(arrays) == 1 else np.concatenate(arrays))
        outputs = {self.spec.top_classes.name: self.backend.classify(images, self.spec.top_k)}
        if scores:
            outputs[self.scores_name] = self.backend.infer(images).astype(self.spec.outputs[1].numpy_dtype)
        return self._split(outputs, sizes, t0)

    def stage_device(self, parts: list[tuple[int, int]]):
        """Requests whose images are in GPU memory, in the backend's input type ((device address, rows)
        each), copied into the backend's own input: done when this returns. ``run_device`` runs them."""
        return self.backend.stage_device(parts), [rows for _, rows in parts]

    def run_device(self, staged, scores: bool) -> list[dict[str, np.ndarray]]:
        """As ``run``, for requests staged by ``stage_device``."""
        batch, sizes = staged
        t0 = time.perf_counter()
        try:
            top = self.backend.run_staged(batch, top=True, release=not scores)  # kept: run again, for scores
        except BaseException:
            if scores:
                self.backend.release_staged(batch)
            raise
        outputs = {self.spec.top_classes.name: top[:, :self.spec.top_k]}
        if scores:
            outputs[self.scores_name] = self.backend.run_staged(batch, top=False).astype(
                self.spec.outputs[1].numpy_dtype)
        with self._count:
            self.device_requests += len(sizes)
        return self._split(outputs, sizes, t0)

    def drop_staged(self, staged) -> None:
        """Give back what ``stage_device`` took, unrun (its batch failed before it ran)."""
        self.backend.release_staged(staged[0])

    def _split(self, outputs: dict, sizes: list[int], started: float) -> list[dict[str, np.ndarray]]:
        with self._count:
            self.requests += len(sizes)
            self.samples += sum(sizes)
            self.busy_s += time.perf_counter() - started
        split, start = [], 0
        for n in sizes:
            split.append({k: v[start:start + n] for k, v in outputs.items()})
            start += n
        return split


def settings(model_dir: str, backend: str, options: dict, scale: float | None, concurrency: int = 1) -> str:
    """What an instance needs to load its backend, and how many batches it runs at once (more than one:
    the model is decoupled), as the ``trtfuse`` parameter's JSON."""
    return json.dumps({"model": model_dir, "backend": backend, "options": options, "scale": scale,
                       "concurrency": concurrency})


@dataclass
class _Batch:
    """A dynamic batch, staged (``TritonPythonModel._stage``): what each request wants, where its images
    were, those from GPU memory copied into the backend's input, and those from the host."""
    wanted: list[set[str]]
    on_gpu: list[bool]
    staged: object | None     # ServedModel.stage_device's
    host: list[np.ndarray]


class TritonPythonModel:
    """Triton's Python backend calls these, in the stub process of each model instance."""

    def initialize(self, args: dict) -> None:
        import triton_python_backend_utils as pb_utils  # the stub provides it
        from google.protobuf import json_format
        from trtfuse.backends import create_backend
        from trtfuse.session import resolve_model
        from trtfuse.triton.model_io import _schema, model_from_config

        self.pb = pb_utils
        self.name = args.get("model_instance_name", "instance")
        config = json.loads(args["model_config"])
        spec = model_from_config(json_format.ParseDict(config, _schema().ModelConfig(), ignore_unknown_fields=True))
        wanted = json.loads(config["parameters"][PARAMETER]["string_value"])
        options = dict(wanted["options"])
        if args.get("model_instance_kind") == "GPU":
            options["devices"] = str(args["model_instance_device_id"])  # the GPU of this instance's group
        backend = create_backend(wanted["backend"], **options)
        backend.load(resolve_model(wanted["model"]), spec.max_batch_size)
        self.model = ServedModel(backend, spec, wanted["scale"])
        self.workers = None
        if pb_utils.using_decoupled_model_transaction_policy(config):
            self.workers = ThreadPoolExecutor(int(wanted.get("concurrency", 1)), thread_name_prefix="trtfuse")

    def execute(self, requests) -> list | None:
        """The responses of one dynamic batch; decoupled, none: a worker runs the batch and sends them.
        Its inputs are staged here first (``_stage``): Triton may reuse their memory once this returns."""
        if self.workers is None:
            try:
                batch = self._stage(requests, own=False)
            except Exception as e:  # noqa: BLE001 - every request answers, with the error
                return [self._error(e) for _ in requests]
            return self._answers(batch)
        senders = [r.get_response_sender() for r in requests]
        try:
            batch = self._stage(requests, own=True)
        except Exception as e:  # noqa: BLE001 - every request answers, with the error
            batch = e
        self.workers.submit(self._send, batch, senders)
        return None

    def _send(self, batch, senders) -> None:
        """A worker's: run a staged batch, and send each request its one (final) response."""
        final = self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        try:
            if isinstance(batch, Exception):  # it could not be staged
                raise batch
            responses = self._answers(batch)
        except BaseException as e:  # noqa: BLE001 - an unanswered request would hang its client
            responses = [self._error(e) for _ in senders]
        for sender, response in zip(senders, responses):
            try:
                sender.send(response, flags=final)
            except Exception as e:  # noqa: BLE001 - a client gone is not the others' problem
                print(f"trtfuse: {self.name} could not answer a request: {e}", file=sys.stderr, flush=True)

    def _error(self, e: BaseException):
        return self.pb.InferenceResponse(error=self.pb.TritonError(f"trtfuse: {type(e).__name__}: {e}"))

    def _stage(self, requests, own: bool) -> _Batch:
        """A dynamic batch ready to run. Images in GPU memory (only where ``device_input`` let them stay
        there) are copied into the backend's input now (``stage_device``); images on the host are kept
        as arrays, copied into arrays of the model's ``own`` for a worker that runs them after
        ``execute`` has returned."""
        from trtfuse.triton import dlpack

        pb, spec = self.pb, self.model.spec
        tensors = [pb.get_input_tensor_by_name(r, spec.input.name) for r in requests]
        wanted = [set(r.requested_output_names()) for r in requests]
        on_gpu = [not t.is_cpu() for t in tensors]
        staged = None
        if any(on_gpu):
            places = [dlpack.placement(t.to_dlpack()) for t, g in zip(tensors, on_gpu) if g]
            staged = self.model.stage_device([(p.address, p.shape[0]) for p in places])
        try:
            host = [np.array(t.as_numpy()) if own else t.as_numpy() for t, g in zip(tensors, on_gpu) if not g]
        except BaseException:
            if staged is not None:
                self.model.drop_staged(staged)
            raise
        return _Batch(wanted, on_gpu, staged, host)

    def _answers(self, batch: _Batch) -> list:
        """Each request's response: its outputs, or (the batch failed) the error. The requests in GPU
        memory run first, so that their slot is free again before the others need one."""
        pb, model = self.pb, self.model
        scores = any(model.scores_name in w for w in batch.wanted)
        outputs: list = [None] * len(batch.on_gpu)
        try:
            if batch.staged is not None:
                answers = iter(model.run_device(batch.staged, scores))
                for i in (i for i, g in enumerate(batch.on_gpu) if g):
                    outputs[i] = next(answers)
            if batch.host:
                answers = iter(model.run(batch.host, scores))
                for i in (i for i, g in enumerate(batch.on_gpu) if not g):
                    outputs[i] = next(answers)
        except Exception as e:  # noqa: BLE001 - every request answers, with the error
            return [self._error(e) for _ in batch.on_gpu]
        return [pb.InferenceResponse(output_tensors=[pb.Tensor(k, np.ascontiguousarray(v))
                                                    for k, v in out.items() if k in w])
                for out, w in zip(outputs, batch.wanted)]

    def finalize(self) -> None:
        if self.workers is not None:
            self.workers.shutdown(wait=True)  # the batches handed out are answered first
        m = self.model
        print(f"trtfuse: {self.name} ran {m.requests} requests ({m.device_requests} read in GPU memory), "
              f"{m.samples} samples, busy {m.busy_s:.3f} s", flush=True)  # into tritonserver's log
        m.backend.close()

