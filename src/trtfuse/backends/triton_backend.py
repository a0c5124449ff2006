"""Triton backend: the harness as a client of NVIDIA Triton Inference Server (gRPC, asynchronous).

One ``TritonBackend`` is one server (one URL). Several URLs become lanes of a ``LanesBackend``, which
hands each batch to the server with the least outstanding work: that is how one LoadGen run covers
several hosts. LoadGen, the QSL and the SUTs are the same as for every backend.

A batch: the rows of the QSL's store are gathered into one of this backend's request slots (``inflight``
per server, each a worker thread's), sent with ``async_infer`` for the ``top_classes`` output only (k
int32 per sample come back), and waited for with a deadline. A decoupled model (``trtfuse serve
--concurrency N``: Triton's unary infer refuses those) gets its requests over one gRPC stream per server
instead (``async_stream_infer``), each answered by id. Transport ``grpc`` puts the pixels in the
request; ``shm`` (client and server on one host) gathers them straight into a system shared-memory
region registered with the server, and the answer comes back through another, so no pixel crosses
the socket; ``cuda`` (one host with a GPU) copies them from the QSL's page-locked store straight into
GPU memory shared with the server (CUDA IPC), as the TensorRT backend copies them into its engine's
input, so the server's model reads them on the GPU and no pixel is copied on the host at all.

The server's model must be trtfuse's (``trtfuse.triton.model_io``): ``trtfuse serve``, or an engine
exported with ``trtfuse triton export``; it is checked at load.

A server that fails a request, dies, or does not answer within ``timeout_s`` fails the run with an
error naming its URL: the SUT records the error, finishes the run without inferring, and the run is
reported as failed, never VALID. Nothing waits forever.
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
import time

import numpy as np

from trtfuse.backends import TOP_K, Backend, gather_rows
from trtfuse.errors import UserError
from trtfuse.request_trace import RequestSpan, server_side
from trtfuse.request_trace import summarize as summarize_requests

TRANSPORTS = ("grpc", "shm", "cuda")
_region_ids = itertools.count()


class _Answer:
    """A request's answer, set by the client's callback (any thread): (result, error), once."""

    def __init__(self):
        self.done = threading.Event()
        self.result = self.error = None

    def set(self, result, error) -> None:
        self.result, self.error = result, error
        self.done.set()


def _import_client():
    try:
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import InferenceServerException
    except ImportError as e:
        raise UserError("tritonclient is not installed (the triton backend talks gRPC through it)",
                        'pip install "trtfuse[triton]" (or: pip install "tritonclient[grpc]")') from e
    return grpcclient, InferenceServerException


def parse_urls(urls) -> list[str]:
    """``"host:8001,host2:8001"`` or a list of them -> the URLs, in order, each once."""
    items = urls.split(",") if isinstance(urls, str) else list(urls)
    found = [u.strip().removeprefix("grpc://") for u in items if u and u.strip()]
    if not found:
        raise UserError("no Triton server URL given", "pass --triton-url HOST:PORT (gRPC, e.g. localhost:8001)")
    for u in found:
        host, _, port = u.rpartition(":")
        if not host or not port.isdigit():
            raise UserError(f"Triton URL {u!r} is not HOST:PORT", "e.g. --triton-url localhost:8001 (the gRPC port)")
    if len(set(found)) != len(found):
        raise UserError(f"a Triton URL is given twice in {','.join(found)}",
                        "name each server once (more requests in flight per server: --triton-inflight)")
    return found


class _Slot:
    """One request in flight: its input (an array, or a shared-memory region: ``in_name``) and, with
    shm or cuda, its output region. With cuda, ``input`` is a page-locked staging array whose rows
    ``upload`` copies to the device region (for batches that do not come from a page-locked store)."""

    def __init__(self, backend: TritonBackend, index: int, max_batch: int):
        spec = backend.spec
        self.input_shape = (max_batch, *spec.input.dims)
        self.row_bytes = int(np.prod(spec.input.dims)) * spec.input.numpy_dtype.itemsize
        self.in_bytes, self.out_bytes = max_batch * self.row_bytes, max_batch * spec.top_k * 4
        self.in_name = self.system_regions = None
        self.device = self.staging = self.device_in = self.stream = None
        if backend.transport == "grpc":
            self.input = np.empty(self.input_shape, spec.input.numpy_dtype)
            return
        try:
            self._shared(backend, max_batch)
        except BaseException:
            self.free(backend.client)  # what was made so far: no region or buffer outlives a refusal
            raise

    def _shared(self, backend: TritonBackend, max_batch: int) -> None:
        """The regions of transports shm and cuda, made and registered with the server."""
        from tritonclient.utils import shared_memory as shm

        spec = backend.spec
        uid = f"trtfuse_{os.getpid()}_{next(_region_ids)}"
        self.out_name, self.in_name = f"{uid}_out", f"{uid}_in"
        regions = [(self.out_name, self.out_bytes)]
        if backend.transport == "shm":
            regions.append((self.in_name, self.in_bytes))
        self.system_regions = {}
        for name, nbytes in regions:
            self.system_regions[name] = shm.create_shared_memory_region(name, f"/{name}", nbytes)
        self.output = shm.get_contents_as_numpy(self.system_regions[self.out_name], np.int32, (max_batch, spec.top_k))
        for name, nbytes in regions:
            backend.client.register_system_shared_memory(name, f"/{name}", nbytes)
        if backend.transport == "shm":
            self.input = shm.get_contents_as_numpy(self.system_regions[self.in_name], spec.input.numpy_dtype,
                                                   self.input_shape)
            return
        import base64

        from trtfuse import cuda_runtime as cr

        self.cr, self.device = cr, backend.cuda_device
        cr.set_device(self.device)
        self.stream = cr.Stream()
        self.device_in = cr.DeviceBuffer(self.in_bytes)
        self.staging = cr.PinnedBuffer(self.input_shape, spec.input.numpy_dtype)
        self.input = self.staging.array
        backend.client.register_cuda_shared_memory(self.in_name, base64.b64encode(cr.ipc_handle(self.device_in)),
                                                   self.device, self.in_bytes)

    def upload(self, n: int) -> None:
        """cuda: the first n staged rows to the device region (done when this returns)."""
        if self.device_in is not None:
            self.cr.set_device(self.device)
            self.cr.copy_htod_async(self.device_in, self.staging, n * self.row_bytes, self.stream)
            self.stream.synchronize()

    def upload_rows(self, store: np.ndarray, rows: np.ndarray) -> None:
        """cuda: rows of a page-locked store straight to the device region (done when this returns)."""
        self.cr.set_device(self.device)
        srcs = store.ctypes.data + np.asarray(rows, dtype=np.int64) * store.strides[0]
        self.cr.copy_rows_htod_async(self.device_in, srcs, self.row_bytes, self.stream, self.device)
        self.stream.synchronize()

    def free(self, client) -> None:
        if self.system_regions is None:
            return
        from tritonclient.utils import shared_memory as shm

        names = [*self.system_regions, *([self.in_name] if self.device_in is not None else [])]
        for name in names:
            try:
                if name in self.system_regions:
                    client.unregister_system_shared_memory(name)
                else:
                    client.unregister_cuda_shared_memory(name)
            except Exception:  # noqa: BLE001 - a dead server has nothing to unregister
                pass
        for handle in self.system_regions.values():
            shm.destroy_shared_memory_region(handle)
        if self.stream is not None:
            self.cr.set_device(self.device)
            self.stream.synchronize()
            for buf in (self.device_in, self.staging):
                if buf is not None:
                    buf.free()
            self.stream.destroy()
        self.system_regions = self.device_in = self.staging = self.stream = None
        self.input = self.output = None


class TritonBackend(Backend):
    """Options: url (gRPC HOST:PORT), model_name ("": the model's name), transport ("grpc" | "shm" |
    "cuda"), inflight (requests in flight at once: worker threads feeding this server), timeout_s (a
    request's deadline), cuda_device (cuda: the GPU whose memory the requests' pixels go to)."""

    name = "triton"

    @classmethod
    def create(cls, url="localhost:8001", **options) -> Backend:
        """One server: a TritonBackend; several (comma-separated, or a list): one lane each."""
        urls = parse_urls(url)
        if len(urls) == 1:
            return cls(url=urls[0], **options)
        from trtfuse.backends.lanes import LanesBackend

        return LanesBackend([cls(url=u, **options) for u in urls])

    def __init__(self, url: str = "localhost:8001", model_name: str = "", transport: str = "grpc",
                 inflight: int = 2, timeout_s: float = 60.0, cuda_device: int = 0, **_ignored):
        self.grpc, self.ServerError = _import_client()
        (self.url,) = parse_urls(url)
        if transport not in TRANSPORTS:
            raise UserError(f"unknown Triton transport {transport!r}", f"use one of: {', '.join(TRANSPORTS)}")
        if inflight < 1 or timeout_s <= 0:
            raise UserError("triton.inflight must be 1 or more and triton.timeout_s positive",
                            "e.g. --triton-inflight 2, triton.timeout_s = 60")
        self.model_name, self.transport = model_name, transport
        self.inflight, self.timeout_s = int(inflight), float(timeout_s)
        self.cuda_device = int(cuda_device)
        self._stores = None  # cuda: the page-locked sample stores host_array hands out (and adopted ones)
        if transport == "cuda":
            from trtfuse import cuda_runtime

            cuda_runtime.require_gpu()
            self._stores = cuda_runtime.PinnedStores()
        self.client = None
        self.spec = None
        self.server_version = ""
        self._slots: list[_Slot] = []
        self._free: queue.Queue = queue.Queue()
        self._scale = None
        self.decoupled = False  # the model answers through a stream: requests go over one (_stream)
        self._streamed: dict[str, _Answer] = {}  # by request id, those sent over the stream and not answered
        self._stream_lock = threading.Lock()
        self._stream_ids = itertools.count()
        self._trace: list[RequestSpan] | None = None  # the requests while a trace is on (start_trace)
        self._stats_before: dict | None = None  # the server's statistics when the trace started

    # -- load: the server's model, checked against ours ----------------------------------------
    def load(self, model, batch_size: int) -> None:
        from trtfuse.triton.model_io import model_from_config

        self.client = self.grpc.InferenceServerClient(self.url)
        try:
            live = self.client.is_server_live(client_timeout=10)
        except self.ServerError as e:
            live, why = False, e.message()
        else:
            why = "it says it is not live"
        if not live:
            raise UserError(f"no Triton server answers at {self.url} ({why})",
                            "start one (trtfuse serve MODEL --grpc-port PORT) or fix --triton-url (its gRPC port)")
        self.server_version = self.client.get_server_metadata().version
        name = self.model_name or model.name
        if not self.client.is_model_ready(name):
            try:
                served = "it has: " + (", ".join(m.name for m in self.client.get_model_repository_index().models)
                                       or "none")
            except self.ServerError:  # the repository endpoint may be restricted
                served = "its model list is not readable"
            raise UserError(f"Triton server {self.url} has no ready model {name!r} ({served})",
                            "serve it (trtfuse serve MODEL), or name the served model with --triton-model")
        config = self.client.get_model_config(name).config
        self.spec = spec = model_from_config(config)
        if spec.input.dims != tuple(model.input_shape) or spec.input.dtype not in ("INT8", "FP32"):
            raise UserError(f"Triton model {name!r} at {self.url} takes {spec.input.dtype} {list(spec.input.dims)}, "
                            f"but {model.name} takes {list(model.input_shape)} images",
                            "serve the same model the run uses (--model)")
        if batch_size > spec.max_batch_size:
            raise UserError(f"batch size {batch_size} is larger than Triton model {name!r}'s max_batch_size "
                            f"{spec.max_batch_size} at {self.url}",
                            f"use --batch-size {spec.max_batch_size} or less, or serve it with a larger batch")
        if spec.input.dtype == "INT8":
            from pathlib import Path

            from trtfuse.quantize_step import input_scale

            self._scale = np.float32(input_scale(Path(model.onnx_path).parent))
        self.max_batch = batch_size
        self.concurrency = self.inflight
        self.decoupled = config.model_transaction_policy.decoupled
        if self.decoupled:
            self.client.start_stream(callback=self._stream_answer)
        try:
            for i in range(self.inflight):
                slot = _Slot(self, i, batch_size)
                self._slots.append(slot)
                self._free.put(slot)
        except self.ServerError as e:
            self.close()
            raise UserError(f"Triton server {self.url} refused {self.transport} shared memory ({e.message()})",
                            f"transport {self.transport} needs client and server on one host"
                            f"{' and a GPU both see' if self.transport == 'cuda' else ''}; "
                            "use --triton-transport grpc") from e

    def host_array(self, shape, dtype) -> np.ndarray:
        """cuda: page-locked, so that a batch's rows go from it to the GPU directly."""
        if self._stores is None:
            return super().host_array(shape, dtype)
        from trtfuse import cuda_runtime

        cuda_runtime.set_device(self.cuda_device)
        return self._stores.allocate(shape, dtype)

    def adopt_host_array(self, array: np.ndarray) -> None:
        if self._stores is not None:
            self._stores.adopt(array)

    def to_input(self, images: np.ndarray) -> np.ndarray:
        """Images in the served input type: int8 pixels are quantized exactly as the network's first
        QuantizeLinear would (the server's model expects them so)."""
        if self.spec is not None and self.spec.input.dtype == "INT8" and images.dtype != np.int8:
            return np.clip(np.rint(images / self._scale), -128, 127).astype(np.int8)
        return images.astype(self.spec.input.numpy_dtype if self.spec else np.float32, copy=False)

    # -- batches --------------------------------------------------------------------------------
    def classify_rows(self, store: np.ndarray, rows: np.ndarray, k: int = TOP_K) -> np.ndarray:
        if self._stores is not None and self._stores.holds(store, self.spec.input.numpy_dtype):
            return self._on_a_slot(len(rows), lambda slot, n: slot.upload_rows(store, rows), k)
        return self._on_a_slot(len(rows), self._staged(lambda into: gather_rows(store, rows, into)), k)

    def classify(self, batch: np.ndarray, k: int = TOP_K) -> np.ndarray:
        return self._on_a_slot(len(batch), self._staged(self._copy_of(batch)), k)

    def infer_rows(self, store: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return self.infer(store[rows])

    def infer(self, batch: np.ndarray) -> np.ndarray:
        """Scores of a batch (the served model's scores output): for checks, not the serving path."""
        return self._on_a_slot(len(batch), self._staged(self._copy_of(batch)), None)

    def _copy_of(self, batch: np.ndarray):
        """Fills rows: ``batch`` in the served input type."""
        def fill(into: np.ndarray) -> None:
            into[...] = self.to_input(batch)
        return fill

    @staticmethod
    def _staged(fill_rows):
        """A slot filler from a filler of the first n rows of the slot's host input (then uploaded, with cuda)."""
        def fill(slot: _Slot, n: int) -> None:
            fill_rows(slot.input[:n])
            slot.upload(n)
        return fill

    def _on_a_slot(self, n: int, fill, k: int | None) -> np.ndarray:
        """``fill(slot, n)`` a free slot's input with n rows, then one request: the top ``k`` classes,
        or (``k`` None) the scores."""
        if k is not None and k > self.spec.top_k:
            raise ValueError(f"the served model ranks {self.spec.top_k} classes, {k} asked")
        if n > self.max_batch:
            raise ValueError(f"batch {n} exceeds max_batch {self.max_batch}")
        slot = self._free.get()
        try:
            start = time.perf_counter()
            fill(slot, n)
            sent = time.perf_counter()
            answer = self._request(slot, n, top=k is not None)
            trace = self._trace
            if trace is not None:
                trace.append(RequestSpan(n, start, sent, time.perf_counter()))
            return answer.astype(np.float32) if k is None else answer[:, :k]
        finally:
            self._free.put(slot)

    def start_trace(self) -> None:
        """Time every request from now on on the client's clock (request_trace): its fill and its answer; and
        read the server's statistics, for what it counted in between."""
        self._trace = []
        self._stats_before = self._server_statistics()

    def stop_trace(self) -> dict | None:
        """The requests since ``start_trace``, summed up (request_trace.summarize), with the server's own share
        (request_trace.server_side) where it could be read; None without a trace."""
        spans, self._trace = self._trace, None
        if spans is None:
            return None
        out = summarize_requests(spans, self.inflight)
        server = server_side(self._stats_before, self._server_statistics(), self.spec.name)
        if server is not None:
            out["server"] = server
        return out

    def _server_statistics(self) -> dict | None:
        """The served model's statistics, or None where the server does not give them (they only explain)."""
        try:
            return self.client.get_inference_statistics(self.spec.name, as_json=True, client_timeout=10)
        except Exception:  # noqa: BLE001 - a server without statistics still serves
            return None

    def _request(self, slot: _Slot, n: int, top: bool) -> np.ndarray:
        """One asynchronous request for the first n rows of the slot's input; its answer, or a
        UserError naming this server."""
        grpc, spec = self.grpc, self.spec
        inp = grpc.InferInput(spec.input.name, [n, *spec.input.dims], spec.input.dtype)
        out_name = spec.top_classes.name if top else spec.outputs[1].name
        out = grpc.InferRequestedOutput(out_name)
        shm_out = top and slot.system_regions is not None
        if slot.in_name is not None:
            inp.set_shared_memory(slot.in_name, n * slot.row_bytes)
        else:
            inp.set_data_from_numpy(slot.input[:n])
        if shm_out:
            out.set_shared_memory(slot.out_name, n * spec.top_k * 4)
        answer = self._send(inp, out)
        # The client's own deadline fires first; this one guards against a callback never coming.
        if not answer.done.wait(self.timeout_s + 5):
            raise self._failed(f"no answer in {self.timeout_s + 5:.0f} s")
        result, error = answer.result, answer.error
        if error is not None:
            raise self._failed(error.message() if hasattr(error, "message") else str(error))
        if shm_out:
            return slot.output[:n].copy()
        return result.as_numpy(out_name)[:n].reshape(n, -1).copy()

    def _send(self, inp, out) -> _Answer:
        """One request, unary (``async_infer``) or, to a decoupled model, over this server's stream."""
        answer = _Answer()
        if not self.decoupled:
            try:
                self.client.async_infer(self.spec.name, [inp], answer.set, outputs=[out],
                                        client_timeout=self.timeout_s)
            except self.ServerError as e:
                raise self._failed(e.message()) from e
            return answer
        with self._stream_lock:
            request_id = str(next(self._stream_ids))
            self._streamed[request_id] = answer
        try:
            self.client.async_stream_infer(self.spec.name, [inp], outputs=[out], request_id=request_id)
        except self.ServerError as e:  # the stream broke before (its callback has said why)
            with self._stream_lock:
                self._streamed.pop(request_id, None)
            raise self._failed(e.message()) from e
        return answer

    def _stream_answer(self, result, error) -> None:
        """The stream's callback. An answer names its request; an error does not (the client drops the
        id), and a broken stream fails every request on it: both fail all those waiting, the run with them."""
        if error is None:
            with self._stream_lock:
                answer = self._streamed.pop(result.get_response().id, None)
            if answer is not None:
                answer.set(result, None)
            return
        with self._stream_lock:
            waiting, self._streamed = list(self._streamed.values()), {}
        for answer in waiting:
            answer.set(None, error)

    def _failed(self, why: str) -> UserError:
        return UserError(f"Triton server {self.url} failed during the run: {why}",
                         "check that server (is it up? its log); a run with a failed request is not valid")

    def close(self) -> None:
        for slot in self._slots:
            slot.free(self.client)
        self._slots = []
        if self._stores is not None:
            self._stores.free()
        self._free = queue.Queue()
        if self.client is not None:
            if self.decoupled:
                self.client.stop_stream(cancel_requests=True)  # nothing is waiting for an answer now
            self.client.close()
            self.client = None
