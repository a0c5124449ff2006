"""TensorRT backend: a deserialized engine, N streams each with its own context and pinned buffers.

Why N slots: LoadGen's issue threads call ``infer`` concurrently; while one slot's batch computes,
another's host->device copy runs, so copies hide behind compute. Each slot owns one optimization
profile (TensorRT 8.x lets a profile serve one context at a time; the engine is built with one per
slot) and a CUDA graph of the engine launch per batch-size bucket, captured at load (graphs remove
the per-layer launch cost; copies stay outside the graph so the buffers can be reused).
The serving path (``infer_rows``): the QSL keeps its samples in pinned memory from ``host_array``,
already in the engine's input type (``to_input``), and each batch's rows are copied from there to
the device in one batched copy: no per-query conversion, no batch assembled on the host.
Input in int8: when the engine was built with int8 input, the host sends ``round(x / s)``, exactly
what the network's first QuantizeLinear would compute, in a quarter of the bytes.
Responses (``classify_rows``): an engine built with a TopK output (``trt_graph.TOP_CLASSES``) ranks the
classes on the GPU and only its k int32 per sample are copied back; the scores stay on the device.
Several GPUs (``devices``): one backend per GPU, each with its own engine, spread as lanes
(``lanes.LanesBackend``). CUDA's current device belongs to the host thread, and the harness's worker
threads call whichever lane is least busy, so every call sets its backend's device first.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from trtfuse.backends import TOP_K, Backend
from trtfuse.backends.lanes import LanesBackend
from trtfuse.config import plugin_mode
from trtfuse.engine import BuildConfig, build_engine, import_tensorrt
from trtfuse.errors import UserError
from trtfuse.gpu_trace import BatchSpan, summarize
from trtfuse.quantize_step import QDQ_FILE, input_scale
from trtfuse.trt_graph import TOP_CLASSES, load_plugin_library

_NP = {"FLOAT": np.float32, "HALF": np.float16, "INT8": np.int8, "INT32": np.int32}


def engine_file(model, batch_size: int, precision: str = "int8", plugins: str = "off", input_format: str = "float",
                streams: int = 2, tactic_sources: str | None = None, plugin_lib: str | None = None,
                plugin_exclude=()) -> Path:
    """The engine for ``model`` with these settings: found in the cache, else built (and cached)."""
    cfg = BuildConfig(precision=precision, plugins=plugins, batch=batch_size,
                      input_format=input_format, profiles=streams, plugin_exclude=plugin_exclude)
    if tactic_sources:
        cfg.tactic_sources = tactic_sources
    return Path(build_engine(model.dir, cfg, plugin_lib))


def register_plugins(plugins: str, plugin_lib: str | None = None) -> None:
    """Register trtfuse's plugin creators with TensorRT before an engine is deserialized. An engine
    built with plugins needs them even when the caller did not say so: with ``plugins`` off the library
    is loaded if it is built, and quietly skipped if not. ``plugins``: a normalized mode (config.plugin_mode)."""
    if plugins != "off":
        load_plugin_library(plugin_lib)
        return
    try:
        load_plugin_library(plugin_lib)
    except UserError:
        pass


def engine_input(images: np.ndarray, in_dtype, scale) -> np.ndarray:
    """``images`` in the engine's input type. int8 images are already quantized with the input scale
    (the QuantizeLinear's output): passed through to an int8 engine, dequantized for a float one; float
    images are quantized for an int8 engine exactly as that QuantizeLinear would."""
    int8_input = np.dtype(in_dtype) == np.int8
    if int8_input and images.dtype != np.int8:
        return np.clip(np.rint(images / scale), -128, 127).astype(np.int8)
    if not int8_input and images.dtype == np.int8:
        if scale is None:
            raise ValueError("int8 input batch for a float engine without a Q/DQ model to scale it")
        return images.astype(np.float32) * scale
    return images.astype(in_dtype, copy=False)


def parse_devices(spec: str, count: int) -> list[int]:
    """The GPUs that ``spec`` names, of ``count`` visible: "" or "0": GPU 0 (one backend, as before
    devices existed); "all": every one; "0,1,3": those."""
    if count < 1:
        raise UserError("no CUDA GPU is visible (cudaGetDeviceCount found none or the driver is missing)",
                        "run on a machine with an NVIDIA GPU and driver, or on the CPU: "
                        "`trtfuse run --backend onnxruntime`")
    spec = str(spec).strip()
    if spec == "":
        return [0]
    if spec.lower() == "all":
        return list(range(count))
    devices = []
    for part in spec.split(","):
        part = part.strip()
        if not part.isdigit():
            raise UserError(f"--devices {spec!r} is not a list of GPU numbers ({part!r})",
                            'use "all", or GPU numbers separated by commas, e.g. --devices 0,1')
        device = int(part)
        if device >= count:
            raise UserError(f"GPU {device} does not exist: {count} GPU(s) are visible "
                            f"(numbered 0 to {count - 1})",
                            "use --devices all, or numbers below the count (CUDA_VISIBLE_DEVICES renumbers them)")
        if device in devices:
            raise UserError(f"--devices {spec!r} names GPU {device} twice",
                            "name each GPU once (one engine per GPU)")
        devices.append(device)
    return devices


class _Slot:
    def __init__(self, cr, engine, index, max_batch, in_name, out_name, in_shape, out_shape,
                 in_dtype, out_dtype, top_shape=None):
        self.cr, self.index = cr, index
        self.stream = cr.Stream()
        self.context = engine.create_execution_context()
        if engine.num_optimization_profiles > 1:
            self.context.set_optimization_profile_async(index, self.stream.ptr)
        self.in_name, self.out_name = in_name, out_name
        self.in_shape, self.out_shape = in_shape, out_shape
        self.host_in = cr.PinnedBuffer((max_batch, *in_shape), in_dtype)
        self.host_out = cr.PinnedBuffer((max_batch, *out_shape), out_dtype)
        self.dev_in = cr.DeviceBuffer(self.host_in.nbytes)
        self.dev_out = cr.DeviceBuffer(self.host_out.nbytes)
        self.context.set_tensor_address(in_name, self.dev_in.ptr)
        self.context.set_tensor_address(out_name, self.dev_out.ptr)
        self.host_top = self.dev_top = None  # the TopK output, where the engine has one
        if top_shape is not None:
            self.host_top = cr.PinnedBuffer((max_batch, *top_shape), np.int32)
            self.dev_top = cr.DeviceBuffer(self.host_top.nbytes)
            self.context.set_tensor_address(TOP_CLASSES, self.dev_top.ptr)
        self.graphs: dict[int, object] = {}
        self.shape_n = None
        self.computed = cr.Event()  # recorded after each engine run (serial_compute orders runs by it)
        # While a trace is on (TensorRTBackend.start_trace): timing events around the batch's input copy
        # and its engine run, and whether the batch in this slot now was staged with them recorded.
        self.marks: tuple | None = None
        self.traced = False

    def enqueue(self, n: int, use_graph: bool) -> None:
        """Launch the engine for batch n on this slot's stream (graph when captured; one plain run,
        then a capture, the first time a batch size is seen). A graph holds its shapes: the context's
        input shape is set only for a plain run (TensorRT 8.5 also logs a warning for each shape set
        on a context of a second optimization profile: hundreds a second in a Server run)."""
        graph = self.graphs.get(n)
        if graph is not None:
            graph.launch()
            return
        if self.shape_n != n:
            self.context.set_input_shape(self.in_name, (n, *self.in_shape))
            self.shape_n = n
        if not self.context.execute_async_v3(self.stream.ptr):
            raise RuntimeError("TensorRT execute_async_v3 failed")
        if use_graph and n not in self.graphs:
            # Capture after one plain run with this shape (TensorRT settles its state on the first).
            self.stream.synchronize()
            try:
                with self.cr.Graph.capture(self.stream) as g:
                    self.context.execute_async_v3(self.stream.ptr)
                self.graphs[n] = g
            except Exception as e:  # noqa: BLE001 - any capture failure: run this batch size plainly
                print(f"note: CUDA graph capture failed for batch {n} ({e}); running without",
                      file=sys.stderr)
                self.graphs[n] = None

    def span(self, origin) -> BatchSpan:
        """The traced batch's copy and run, ms after ``origin`` (once its stream has synchronized)."""
        return BatchSpan(*(mark.elapsed_ms(origin) for mark in self.marks))

    def free(self) -> None:
        for g in self.graphs.values():
            if g is not None:
                g.destroy()
        for b in (self.host_in, self.host_out, self.dev_in, self.dev_out, self.host_top, self.dev_top):
            if b is not None:
                b.free()
        for mark in self.marks or ():
            mark.destroy()
        self.computed.destroy()
        self.stream.destroy()


@dataclass(frozen=True)
class StagedBatch:
    """A batch copied into a slot's input by ``stage_device``, waiting for ``run_staged``."""
    slot: _Slot
    n: int


class TensorRTBackend(Backend):
    """Options: engine (a built engine file; else one is built for the model), precision ("int8"),
    plugins ("off" | "tails" | "all"; true/false as "tails"/"off"), streams (2), cuda_graphs (True),
    input_format ("float" | "int8"), plugin_lib, plugin_exclude (fusion sites left to TensorRT: config.plugin_exclude),
    graph_buckets (16: batch sizes with a CUDA graph, max_batch / 16 apart; a batch runs at the next one up),
    serial_compute (True: the streams' engine runs go one after another, in launch order, while the
    copies overlap them; False: they may overlap each other), tactic_sources ("default": TensorRT's;
    "none": no cuBLAS/cuDNN tactics, for an install without those libraries; None: $TRTFUSE_TACTIC_SOURCES,
    else "default"), device (0: the GPU this backend runs on; ``create``'s ``devices`` makes one per GPU).
    Measured on the H100 with ResNet-50,
    serial is better both ways: two engine runs sharing the GPU are slower together than one after the
    other (2 threads: 66.6k vs 57.7k samples/s at batch 2048), and a batch that has the GPU to itself
    finishes sooner (Server, 8 graph buckets: 56.0k vs 36.8k QPS within p99 15 ms)."""

    name = "tensorrt"

    @classmethod
    def create(cls, devices: str = "", **options) -> Backend:
        """One backend on one GPU; for several ``devices`` ("all", "0,1"), one per GPU, as lanes."""
        import_tensorrt()  # without TensorRT, that is what to hear first (``auto`` falls back on it)
        from trtfuse import cuda_runtime

        lanes = [cls(device=d, **options) for d in parse_devices(devices, cuda_runtime.device_count())]
        for lane in lanes[1:]:
            lane._engine_of = lanes[0]  # LanesBackend loads the first lane alone, then the others
        return lanes[0] if len(lanes) == 1 else LanesBackend(lanes)

    def __init__(self, engine: str | None = None, precision: str = "int8", plugins: str | bool = "off",
                 streams: int = 2, cuda_graphs: bool = True, input_format: str = "float",
                 plugin_lib: str | None = None, serial_compute: bool = True, graph_buckets: int = 16,
                 tactic_sources: str | None = None, device: int = 0, plugin_exclude=(), **_ignored):
        self.trt = import_tensorrt()
        from trtfuse import cuda_runtime

        cuda_runtime.require_gpu()
        self.cr = cuda_runtime
        self.device = int(device)
        self.engine_path = engine
        self._engine_of = None  # a lane loaded before this one, whose engine this one loads too (create)
        # Settings arrive normalized (config.load); callers of the Python API may still say true/false.
        self.precision, self.plugins = precision, plugin_mode(plugins)
        self.n_streams, self.cuda_graphs, self.input_format = int(streams), bool(cuda_graphs), input_format
        self.plugin_lib = plugin_lib
        self.plugin_exclude = tuple(plugin_exclude or ())
        self.serial_compute = bool(serial_compute)
        self.graph_buckets = max(1, int(graph_buckets))
        self.tactic_sources = tactic_sources
        self._order = threading.Lock()  # serial_compute: launch order = run order
        self._last_run = None           # the Event recorded after the last launched run
        self.slots: list[_Slot] = []
        self._free: queue.Queue = queue.Queue()
        self._scale = None
        self._int8_input = False
        self._in_dtype = None
        self._buckets: list[int] = []        # batch sizes the engine runs at (see _bucket)
        self.top_k = 0                       # classes the engine's TopK output ranks (0: none)
        self._stores = cuda_runtime.PinnedStores()  # the stores infer_rows reads in place (own and adopted)
        self._trace: list[BatchSpan] | None = None  # the traced batches while a trace is on (start_trace)
        self._trace_origin = None                   # the event the trace's times count from
        self._trace_host_start = 0.0

    def load(self, model, batch_size: int) -> None:
        trt = self.trt
        # Everything below (a build, the engine, contexts, streams, buffers, graphs) on this GPU.
        self.cr.set_device(self.device)
        if self.engine_path is None and self._engine_of is not None:
            self.engine_path = self._engine_of.engine_path  # built or found once, by the first lane
        if self.engine_path is None:
            self.engine_path = str(engine_file(model, batch_size, self.precision, self.plugins, self.input_format,
                                               self.n_streams, self.tactic_sources, self.plugin_lib,
                                               self.plugin_exclude))
        path = Path(self.engine_path)
        if not path.is_file():
            raise UserError(f"engine file {path} does not exist", "build one with `trtfuse build`")
        self.logger = trt.Logger(trt.Logger.WARNING)
        trt.init_libnvinfer_plugins(self.logger, "")
        register_plugins(self.plugins, self.plugin_lib)
        runtime = trt.Runtime(self.logger)
        self.engine = runtime.deserialize_cuda_engine(path.read_bytes())
        if self.engine is None:
            raise UserError(f"TensorRT could not deserialize {path}",
                            "rebuild it with this TensorRT version (and load the plugins it uses)")
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        outputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        in_name = inputs[0]
        out_name = model.output_name if model.output_name in outputs else outputs[0]
        if hasattr(self.engine, "get_tensor_profile_shape"):  # TensorRT >= 8.5
            profile_max = self.engine.get_tensor_profile_shape(in_name, 0)[2]
        else:
            profile_max = self.engine.get_profile_shape(0, in_name)[2]
        self.max_batch = min(int(profile_max[0]), batch_size) if batch_size else int(profile_max[0])
        in_shape = tuple(int(d) for d in profile_max[1:])
        out_shape = tuple(int(d) for d in self.engine.get_tensor_shape(out_name)[1:])
        in_dtype = _NP[self.engine.get_tensor_dtype(in_name).name]
        out_dtype = _NP[self.engine.get_tensor_dtype(out_name).name]
        top_shape = None
        if TOP_CLASSES in outputs:
            top_shape = tuple(int(d) for d in self.engine.get_tensor_shape(TOP_CLASSES)[1:])
            self.top_k = int(np.prod(top_shape))
        self._int8_input = in_dtype == np.int8
        self._in_dtype = np.dtype(in_dtype)
        if self._int8_input or (Path(model.dir) / QDQ_FILE).is_file():
            self._scale = np.float32(input_scale(model.dir))
        n_slots = min(self.n_streams, self.engine.num_optimization_profiles)
        if n_slots < self.n_streams:
            print(f"note: engine has {n_slots} optimization profile(s); using {n_slots} stream(s)",
                  file=sys.stderr)
        for i in range(n_slots):
            slot = _Slot(self.cr, self.engine, i, self.max_batch, in_name, out_name,
                         in_shape, out_shape, in_dtype, out_dtype, top_shape)
            self.slots.append(slot)
            self._free.put(slot)
        self.concurrency = len(self.slots)
        if self.cuda_graphs:
            # Graphs for every batch size the engine will run at, now: a capture in the middle of a
            # Server run would stall that batch (and LoadGen's p99) for tens of milliseconds.
            step = max(1, self.max_batch // self.graph_buckets)
            self._buckets = sorted({*range(step, self.max_batch + 1, step), self.max_batch})
            for slot in self.slots:
                self.cr.memset(slot.dev_in, 0)  # rows past n in a bucket: defined values, answers ignored
                for b in self._buckets:
                    slot.enqueue(b, True)
                slot.stream.synchronize()

    def _bucket(self, n: int) -> int:
        """The batch size to run n samples at: with CUDA graphs, the next of a few fixed sizes
        (max_batch / graph_buckets apart), so that a Server run's ragged batches reuse a few graphs; the
        rows padded up to the bucket cost GPU time (half a step on average)."""
        if not self._buckets:
            return n
        return next(b for b in self._buckets if b >= n)

    def to_input(self, images: np.ndarray) -> np.ndarray:
        return engine_input(images, self._in_dtype, self._scale)

    def host_array(self, shape, dtype) -> np.ndarray:
        self.cr.set_device(self.device)
        return self._stores.allocate(shape, dtype)

    def adopt_host_array(self, array: np.ndarray) -> None:
        """A store another lane's ``host_array`` allocated (pinned, portable): read in place by
        ``infer_rows`` like this backend's own; its owner frees it."""
        self._stores.adopt(array)

    def _is_pinned_store(self, store: np.ndarray) -> bool:
        return self._stores.holds(store, self._in_dtype)

    def infer(self, batch: np.ndarray) -> np.ndarray:
        self.cr.set_device(self.device)
        return self._run_batch(batch, top=False)

    def classify(self, batch: np.ndarray, k: int = TOP_K) -> np.ndarray:
        """The top-k classes of a batch from anywhere (copied into a slot's pinned input, as by
        ``infer``), ranked by the engine's TopK where it has one, else on the host."""
        self.cr.set_device(self.device)
        if k > self.top_k:
            return super().classify(batch, k)
        return self._run_batch(batch, top=True)[:, :k]

    def _run_batch(self, batch: np.ndarray, top: bool) -> np.ndarray:
        def fill(slot: _Slot) -> None:  # through the slot's pinned input
            slot.host_in.array[:len(batch)] = self.to_input(batch)
            self.cr.copy_htod_async(slot.dev_in, slot.host_in, slot.host_in.array[:len(batch)].nbytes, slot.stream)
        return self._on_a_slot(len(batch), fill, top)

    def _on_a_slot(self, n: int, fill, top: bool) -> np.ndarray:
        """``fill(slot)`` queues the copies of n samples into a free slot's device input; then the
        engine runs on them (``_run``)."""
        staged = self._staged(n, fill)
        try:
            return self._run(staged.slot, n, top)
        finally:
            self._free.put(staged.slot)

    def _staged(self, n: int, fill) -> StagedBatch:
        """A free slot (waits for one) with ``fill(slot)`` queued on its stream: the copies of n samples
        into its device input. The slot is the caller's until it puts it back."""
        if n > self.max_batch:
            raise ValueError(f"batch {n} exceeds max_batch {self.max_batch}")
        slot = self._free.get()
        try:
            slot.traced = self._trace is not None
            if slot.traced:
                slot.marks[0].record(slot.stream)
            fill(slot)
            if slot.traced:
                slot.marks[1].record(slot.stream)
        except BaseException:
            self._free.put(slot)
            raise
        return StagedBatch(slot, n)

    def infer_rows(self, store: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Rows of a store from ``host_array`` go host -> device directly, one batched copy per
        batch (the batch is assembled on the device); any other store takes the gathering path."""
        self.cr.set_device(self.device)
        if not self._is_pinned_store(store):
            return super().infer_rows(store, rows)
        return self._run_rows(store, rows, top=False)

    def classify_rows(self, store: np.ndarray, rows: np.ndarray, k: int = TOP_K) -> np.ndarray:
        """The top-k classes, ranked by the engine's TopK where it has one (k int32 per sample come
        back), else on the host from the scores."""
        self.cr.set_device(self.device)
        if k > self.top_k or not self._is_pinned_store(store):
            return super().classify_rows(store, rows, k)
        return self._run_rows(store, rows, top=True)[:, :k]

    def _run_rows(self, store: np.ndarray, rows: np.ndarray, top: bool) -> np.ndarray:
        def fill(slot: _Slot) -> None:  # each row host -> device, straight from the pinned store
            srcs = store.ctypes.data + np.asarray(rows, dtype=np.int64) * store.strides[0]
            self.cr.copy_rows_htod_async(slot.dev_in, srcs, store.strides[0], slot.stream, self.device)
        return self._on_a_slot(len(rows), fill, top)

    def classify_device(self, parts: list[tuple[int, int]], k: int = TOP_K) -> np.ndarray:
        """The top-k classes of images already in this GPU's memory, in the engine's input type,
        contiguous: ``parts`` is (device address, rows) of each run of them (a Triton server's requests
        in CUDA shared memory). They go device to device into a slot's input, in order."""
        if k > self.top_k:
            raise ValueError(f"the engine ranks {self.top_k} classes, {k} asked (rank on the host: classify)")
        self.cr.set_device(self.device)
        return self._on_a_slot(sum(rows for _, rows in parts), self._device_fill(parts), top=True)[:, :k]

    def infer_device(self, parts: list[tuple[int, int]]) -> np.ndarray:
        """Scores of images already in this GPU's memory (as ``classify_device``)."""
        self.cr.set_device(self.device)
        return self._on_a_slot(sum(rows for _, rows in parts), self._device_fill(parts), top=False)

    def _device_fill(self, parts: list[tuple[int, int]]):
        def fill(slot: _Slot) -> None:  # each request's run device -> device, one after another
            row_bytes, offset = slot.host_in.array[0].nbytes, 0
            for address, rows in parts:
                self.cr.copy_dtod_async(slot.dev_in.ptr + offset, address, rows * row_bytes, slot.stream)
                offset += rows * row_bytes
        return fill

    def stage_device(self, parts: list[tuple[int, int]]) -> StagedBatch:
        """Images in this GPU's memory (as ``classify_device`` takes them) copied into a free slot's
        input, the copies done when this returns: the memory they came from may be reused from then on
        (a decoupled Triton model's inputs, once its ``execute`` has returned). The slot is the
        batch's until ``run_staged`` has run it (waits while every slot is taken)."""
        self.cr.set_device(self.device)
        staged = self._staged(sum(rows for _, rows in parts), self._device_fill(parts))
        try:
            staged.slot.stream.synchronize()
        except BaseException:
            self.release_staged(staged)
            raise
        return staged

    def run_staged(self, staged: StagedBatch, top: bool, release: bool = True) -> np.ndarray:
        """Run the engine on a staged batch: its TopK classes (``top``) or its scores. ``release``
        False keeps the slot, and its input, for one more run of the same batch."""
        self.cr.set_device(self.device)
        try:
            return self._run(staged.slot, staged.n, top)
        finally:
            if release:
                self._free.put(staged.slot)

    def release_staged(self, staged: StagedBatch) -> None:
        """Give a staged batch's slot back without running it."""
        self._free.put(staged.slot)

    def _run(self, slot: _Slot, n: int, top: bool = False) -> np.ndarray:
        """Run the engine on the n samples in the slot's device input; their scores (or, ``top``,
        their TopK class indices) on the host."""
        trace = self._trace if slot.traced else None  # this list, even if the trace stops meanwhile
        traced = trace is not None
        if self.serial_compute:
            with self._order:
                if self._last_run is not None and self._last_run is not slot.computed:
                    slot.stream.wait(self._last_run)  # after the run launched before, on any stream
                self._enqueue_run(slot, n, traced)
                slot.computed.record(slot.stream)
                self._last_run = slot.computed
        else:
            self._enqueue_run(slot, n, traced)
        host, dev = (slot.host_top, slot.dev_top) if top else (slot.host_out, slot.dev_out)
        self.cr.copy_dtoh_async(host, dev, host.array[:n].nbytes, slot.stream)
        slot.stream.synchronize()
        if traced:
            trace.append(slot.span(self._trace_origin))
        out = host.array[:n].reshape(n, -1)
        return out.copy() if top else out.astype(np.float32, copy=True)

    def _enqueue_run(self, slot: _Slot, n: int, traced: bool) -> None:
        """The engine run for n samples on the slot's stream, between its trace marks when traced."""
        if traced:
            slot.marks[2].record(slot.stream)
        slot.enqueue(self._bucket(n), self.cuda_graphs)
        if traced:
            slot.marks[3].record(slot.stream)

    def start_trace(self) -> None:
        """Time every batch from now on (gpu_trace): four timing events per batch, read after the batch's
        own synchronize, so the serving path gains no wait. Call it with no batch in flight."""
        self.cr.set_device(self.device)
        for slot in self.slots:
            if slot.marks is None:
                slot.marks = tuple(self.cr.Event(timing=True) for _ in range(4))
        if self._trace_origin is None:
            self._trace_origin = self.cr.Event(timing=True)
        self._trace_origin.record(self.slots[0].stream)
        self._trace_origin.synchronize()
        self._trace_host_start = time.perf_counter()
        self._trace = []

    def stop_trace(self) -> dict | None:
        """The batches timed since ``start_trace``, summed up (gpu_trace.summarize); None without a trace."""
        spans, self._trace = self._trace, None
        if spans is None:
            return None
        return summarize(spans, (time.perf_counter() - self._trace_host_start) * 1e3)

    def engine_throughput(self, batch: int, seconds: float = 5.0, warmup: int = 10,
                          images: np.ndarray | None = None, serial: bool = False) -> float:
        """Samples/s of the engine alone, its input resident on the device (no copies).
        ``images``: what each slot's input holds (repeated to fill the batch); None: every byte 1, as
        every record before `trtfuse bench gap` measured it. ``serial``: every run on the first
        slot's stream, one after another, as an Offline run with serial_compute orders them; else all
        slots at once, their runs free to overlap."""
        self.cr.set_device(self.device)
        slots = self.slots[:1] if serial else self.slots
        rows = None if images is None else self.to_input(np.asarray(images))
        for slot in slots:
            if rows is None:
                self.cr.memset(slot.dev_in, 1)
            else:
                slot.host_in.array[:batch] = np.resize(rows, (batch, *rows.shape[1:]))
                self.cr.copy_htod_async(slot.dev_in, slot.host_in, slot.host_in.array[:batch].nbytes, slot.stream)
            for _ in range(warmup):
                slot.enqueue(batch, self.cuda_graphs)
            slot.stream.synchronize()
        runs = 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            for slot in slots:
                for _ in range(4):
                    slot.enqueue(batch, self.cuda_graphs)
                runs += 4
            for slot in slots:
                slot.stream.synchronize()
        return runs * batch / (time.perf_counter() - start)

    def close(self) -> None:
        self.cr.set_device(self.device)
        for slot in self.slots:
            slot.free()
        self.slots = []
        if self._trace_origin is not None:
            self._trace_origin.destroy()
            self._trace_origin = None
        self._stores.free()  # after the slots: their streams are done with these
