"""The native run loop (``--sut native``): LoadGen's test with the SUT, QSL and engine in C++.

Python keeps what is not per query: the settings (LoadGen's own, computed through the Python binding as
for the Python SUT, then handed over field by field), the engine build, loading samples when LoadGen
asks (untimed), the run folder, the monitor, and everything after the test (report, plots, accuracy,
compliance) reads the same LoadGen logs as before. The C++ side (native/, ``libtrtfuse_sut.so``) owns
the hot path: queue, batching, the engine's slots, completions; no query takes the GIL.

Engines: ``tensorrt`` (a TensorRT plan, samples resident on the GPU, one lane per device) and ``null``
(host only: answers from a hash of each sample, to measure the host path and to test the loop on a
machine without a GPU).
"""

from __future__ import annotations

import ctypes
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from trtfuse import native_build
from trtfuse.errors import UserError

NATIVE_BACKENDS = ("tensorrt", "null")
_DTYPES = {0: np.float32, 1: np.int8, 2: np.uint8}
_DTYPE_CODES = {np.dtype(v): k for k, v in _DTYPES.items()}


class _Info(ctypes.Structure):
    _fields_ = [("sample_bytes", ctypes.c_int64), ("dtype", ctypes.c_int32), ("dims", ctypes.c_int32 * 3),
                ("top_k", ctypes.c_int32), ("max_batch", ctypes.c_int32), ("lanes", ctypes.c_int32),
                ("slots", ctypes.c_int32)]


class _Stats(ctypes.Structure):
    _fields_ = [("issued", ctypes.c_int64), ("completed", ctypes.c_int64), ("batches", ctypes.c_int64),
                ("batch_samples", ctypes.c_int64), ("qsl_load_calls", ctypes.c_int64),
                ("qsl_loaded_samples", ctypes.c_int64), ("failed", ctypes.c_int64),
                ("gpu_busy_ms", ctypes.c_double), ("last_progress_s", ctypes.c_double)]


class _LaneStats(ctypes.Structure):
    _fields_ = [("batches", ctypes.c_int64), ("samples", ctypes.c_int64), ("busy_ms", ctypes.c_double)]


_LOAD_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64), ctypes.c_size_t,
                            ctypes.c_void_p)
_ERR_LEN = 4096


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    P, i32, i64, dbl = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64, ctypes.c_double
    s, sz = ctypes.c_char_p, ctypes.c_size_t
    sig = {
        "tf_engine_null": (P, [i64, i32, i32, i32, i32, i32, i32, i32, i32, i32, dbl, dbl]),
        "tf_engine_tensorrt": (P, [s, ctypes.POINTER(i32), i32, i32, i32, i32, i32, s, s, sz]),
        "tf_engine_get_info": (ctypes.c_int, [P, ctypes.POINTER(_Info)]),
        "tf_engine_free": (None, [P]),
        "tf_has_tensorrt": (ctypes.c_int, []),
        "tf_session_new": (P, [P, i64, i64, _LOAD_FN, P, i32, dbl, i32]),
        "tf_session_warmup": (dbl, [P, i32, s, sz]),
        "tf_session_run": (ctypes.c_int, [P, s, s, s, s, s, s, sz]),
        "tf_session_stats": (None, [P, ctypes.POINTER(_Stats)]),
        "tf_session_lane_stats": (ctypes.c_int, [P, i32, ctypes.POINTER(_LaneStats)]),
        "tf_session_stop": (None, [P, s]),
        "tf_session_abandon": (i64, [P, s]),
        "tf_session_free": (None, [P]),
        "tf_loadgen_version": (s, []),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


_lib: ctypes.CDLL | None = None


def library(tensorrt: bool = False, progress=print) -> ctypes.CDLL:
    """The native library, built first when missing or built from other sources than native/'s (or when
    a TensorRT engine is wanted and the built one has none: then with $TENSORRT_ROOT)."""
    global _lib
    if _lib is not None and (not tensorrt or _lib.tf_has_tensorrt()):
        return _lib
    if _lib is not None:
        raise UserError("the native SUT was loaded without TensorRT in this process",
                        "build it with TensorRT first: trtfuse plugins build --native --tensorrt-root DIR")
    path = native_build.library_path()
    if path is None:
        path = native_build.build(tensorrt_root="env" if tensorrt else None, progress=progress)
    elif native_build.is_stale(path):
        progress("trtfuse: native/ changed since the native SUT was built: rebuilding it")
        with_trt = tensorrt or bool((native_build.built_from(path) or {}).get("tensorrt"))
        path = native_build.build(tensorrt_root="env" if with_trt else None, progress=progress)
    lib = _declare(ctypes.CDLL(str(path)))
    if tensorrt and not lib.tf_has_tensorrt():
        raise UserError(f"the native SUT at {path} was built without TensorRT",
                        "rebuild it with `trtfuse plugins build --native --tensorrt-root DIR` "
                        "(or use --backend null to time the host path alone)")
    _lib = lib
    return lib


@dataclass
class NativeEngine:
    """An engine of the native library, and how samples become its input."""

    lib: ctypes.CDLL
    handle: int
    name: str
    in_dtype: np.dtype
    scale: float | None  # the input QuantizeLinear's scale (int8 input), where the model has one
    sample_shape: tuple[int, ...]
    top_k: int
    max_batch: int
    lanes: int
    slots: int
    engine_path: str | None = None
    hung: bool = False  # a session abandoned batches inside it: a slot may still be in there
    devices: tuple[int, ...] = ()  # the GPU of each lane (TensorRT)
    last_lanes: list[dict] | None = None  # the last run's per-lane rows (run_native)

    def lane_stats(self) -> list[dict]:
        """Per lane (GPU) of the last run: samples, batches, device busy time and the rates over
        LoadGen's span (``lane_rows``); the report's per-GPU rows."""
        return list(self.last_lanes or [])

    def to_input(self, images: np.ndarray) -> np.ndarray:
        from trtfuse.backends.tensorrt_backend import engine_input

        return np.ascontiguousarray(engine_input(images, self.in_dtype, self.scale))

    def close(self) -> None:
        if self.handle and not self.hung:
            self.lib.tf_engine_free(self.handle)
        self.handle = 0


def _engine(lib, handle, name: str, scale, engine_path=None) -> NativeEngine:
    info = _Info()
    lib.tf_engine_get_info(handle, ctypes.byref(info))
    return NativeEngine(lib, handle, name, np.dtype(_DTYPES[info.dtype]), scale, tuple(info.dims),
                        info.top_k, info.max_batch, info.lanes, info.slots, engine_path)


def null_engine(sample: np.ndarray, classes: int, batch: int, lanes: int = 1, slots_per_lane: int = 2,
                us_per_batch: float = 0.0, us_per_sample: float = 0.0) -> NativeEngine:
    """The host-only engine for samples like ``sample`` (one sample, C x H x W). ``us_per_batch`` +
    n x ``us_per_sample``: an emulated device's run time, one batch at a time (0: none)."""
    lib = library()
    sample = np.ascontiguousarray(sample)
    code = _DTYPE_CODES.get(sample.dtype)
    if code is None or sample.ndim != 3:
        raise UserError(f"the null engine takes C x H x W float32/int8/uint8 samples, not {sample.dtype}{list(sample.shape)}",
                        "preprocess the dataset for an image model")
    handle = lib.tf_engine_null(sample.nbytes, *sample.shape, code, 5, classes, batch, lanes, slots_per_lane,
                                us_per_batch, us_per_sample)
    if not handle:
        raise UserError("the null engine refused its settings", "check batch size, lanes and slots (all >= 1)")
    return _engine(lib, handle, "null", None)


def tensorrt_engine(model, settings: dict, progress=print) -> NativeEngine:
    """The TensorRT engine of the run's settings ([tensorrt]: the engine file, or the cached build for
    the model), on each device of ``tensorrt.devices``."""
    from trtfuse.backends.tensorrt_backend import engine_file, register_plugins
    from trtfuse.engine import import_tensorrt
    from trtfuse.quantize_step import QDQ_FILE, input_scale
    from trtfuse.trt_graph import TOP_CLASSES

    trt_opts, batch = settings["tensorrt"], settings["run"]["batch_size"]
    import_tensorrt()  # a clear error where TensorRT's Python API is missing (it builds the engine)
    lib = library(tensorrt=True, progress=progress)
    path = trt_opts["engine"] or None
    if path is None:
        path = engine_file(model, batch, trt_opts["precision"], trt_opts["plugins"], trt_opts["input_format"],
                           int(trt_opts["streams"]), trt_opts["tactic_sources"] or None, trt_opts.get("plugin_lib"),
                           trt_opts.get("plugin_exclude", ()))
    path = Path(path)
    if not path.is_file():
        raise UserError(f"engine file {path} does not exist", "build one with `trtfuse build`")
    register_plugins(trt_opts["plugins"], trt_opts.get("plugin_lib"))
    devices = _devices(trt_opts["devices"])
    arr = (ctypes.c_int32 * len(devices))(*devices)
    buckets = int(trt_opts["graph_buckets"]) if trt_opts["cuda_graphs"] else 0
    err = ctypes.create_string_buffer(_ERR_LEN)
    on_device = settings["native"]["samples"] == "device"
    handle = lib.tf_engine_tensorrt(str(path).encode(), arr, len(devices), batch, int(trt_opts["streams"]), buckets,
                                    int(on_device), TOP_CLASSES.encode(), err, _ERR_LEN)
    if not handle:
        raise UserError(f"the native SUT could not open {path}: {err.value.decode()}",
                        "rebuild the engine with this TensorRT (`trtfuse build`), and build the plugin library")
    scale = None
    if (Path(model.dir) / QDQ_FILE).is_file():
        scale = np.float32(input_scale(model.dir))
    engine = _engine(lib, handle, "tensorrt", scale, str(path))
    engine.devices = tuple(devices)
    if engine.in_dtype == np.int8 and scale is None:
        engine.close()
        raise UserError(f"{path} takes int8 input but {model.name} has no Q/DQ model to quantize images with",
                        "build the engine from this model with `trtfuse build`")
    return engine


def _devices(spec: str) -> list[int]:
    if not spec:
        return [0]
    from trtfuse.backends.tensorrt_backend import parse_devices
    from trtfuse.cuda_runtime import device_count

    return parse_devices(spec, device_count())


def built_with_tensorrt() -> bool:
    """A native library with TensorRT, built from native/'s sources as they are now, is here (nothing is
    built or loaded to tell)."""
    path = native_build.library_path()
    if path is None or native_build.is_stale(path):
        return False
    stamp = native_build.built_from(path)
    return stamp is None or bool(stamp.get("tensorrt"))  # no stamp: a user's own $TRTFUSE_NATIVE_LIB, taken as is


def _tensorrt_usable() -> bool:
    """Whether backend "auto" means TensorRT here: its Python API imports and a GPU is visible."""
    import importlib.util

    if importlib.util.find_spec("tensorrt") is None:
        return False
    from trtfuse import cuda_runtime

    try:
        return cuda_runtime.device_count() > 0
    except Exception:  # noqa: BLE001 - no driver, no CUDA Python: no GPU to run on
        return False


_NOTED: set[str] = set()


def resolve_sut(settings: dict, backend=None) -> dict:
    """The settings with ``run.sut`` "auto" made python or native: native where the run's engine is
    TensorRT's and the native library is built with TensorRT (``built_with_tensorrt``; it is never built
    here unasked), else python, with a note when only the build is missing. A backend given ready-made
    decides: a native engine, native; any other, python. The Python SUT's own diagnostics
    (server.query_timeline) keep it."""
    run = settings["run"]
    if run["sut"] != "auto":
        return settings
    if backend is not None:
        sut = "native" if isinstance(backend, NativeEngine) else "python"
    elif run["backend"] not in ("tensorrt", "auto") or settings["server"]["query_timeline"]:
        sut = "python"
    elif run["backend"] == "auto" and not _tensorrt_usable():
        sut = "python"  # auto's backend is onnxruntime here
    elif built_with_tensorrt():
        sut = "native"
    else:
        sut = "python"
        note = ("note: the native SUT is not built (trtfuse plugins build --native --tensorrt-root DIR): "
                "the Python SUT runs this")
        if note not in _NOTED:
            _NOTED.add(note)
            print(note, file=sys.stderr)
    return {**settings, "run": {**run, "sut": sut}}


def open_engine(settings: dict, model, dataset, progress=print) -> NativeEngine:
    """The native engine the run's settings ask for (``run.backend``)."""
    backend = settings["run"]["backend"]
    if backend == "null":
        sample = dataset.images(np.array([0]))[0]
        lanes = max(1, len(settings["tensorrt"]["devices"].split(","))) if settings["tensorrt"]["devices"] else 1
        return null_engine(sample, model.num_classes, settings["run"]["batch_size"], lanes=lanes,
                           slots_per_lane=max(1, int(settings["tensorrt"]["streams"])),
                           us_per_batch=float(settings["native"]["null_batch_us"]))
    if backend in ("tensorrt", "auto"):
        return tensorrt_engine(model, settings, progress=progress)
    raise UserError(f"the native SUT runs TensorRT engines and the null engine, not --backend {backend}",
                    "use --sut python for onnxruntime or triton, or --backend tensorrt / null")


class _NativeLedger:
    """The session's counts, read from C, in the shape RunMonitor reads (``lg_sut.Ledger``)."""

    def __init__(self, session: NativeSession):
        self._s = session

    @property
    def completed(self) -> int:
        return self._s.stats().completed

    @property
    def outstanding(self) -> int:
        st = self._s.stats()
        return st.issued - st.completed

    @property
    def last_progress(self) -> float:
        return self._s.stats().last_progress_s or time.monotonic()


class NativeSession:
    """One LoadGen test's session in the native library: its QSL, SUT and worker slots."""

    def __init__(self, engine: NativeEngine, dataset, performance_sample_count: int, batch: int,
                 batch_timeout_us: float, label_offset: int):
        self.engine, self.dataset = engine, dataset
        self.errors: list[BaseException] = []
        self.ledger = _NativeLedger(self)
        self._load_cb = _LOAD_FN(self._load)  # kept referenced: C calls it during the run
        self._handle = engine.lib.tf_session_new(engine.handle, len(dataset), performance_sample_count,
                                                 self._load_cb, None, batch, batch_timeout_us, label_offset)
        if not self._handle:
            raise UserError("the native SUT refused the session", "check the dataset size and batch size")

    def _load(self, _user, idx, n, dst) -> int:
        """LoadGen's load, from C: samples ``idx[:n]`` in the engine's input type into ``dst``. After a
        Ctrl-C nothing is loaded: the session answers without inference and the run is discarded."""
        from trtfuse import interrupts

        if interrupts.requested():
            return 0
        try:
            indices = np.ctypeslib.as_array(idx, shape=(n,)).copy()
            images = self.engine.to_input(self.dataset.images(indices))
            if images.nbytes != n * int(np.prod(self.engine.sample_shape)) * self.engine.in_dtype.itemsize:
                raise ValueError(f"samples of {images.dtype}{list(images.shape[1:])} do not fit the engine's "
                                 f"{self.engine.in_dtype}{list(self.engine.sample_shape)}")
            ctypes.memmove(dst, images.ctypes.data, images.nbytes)
            return 0
        except BaseException as e:  # noqa: BLE001 - an exception must not cross into C
            self.errors.append(e)
            return 1

    def warmup(self, batches: int) -> float | None:
        err = ctypes.create_string_buffer(_ERR_LEN)
        rate = self.engine.lib.tf_session_warmup(self._handle, batches, err, _ERR_LEN)
        if rate < 0:
            raise self._error(f"the warm-up failed: {err.value.decode()}")
        return rate or None

    def run(self, model_name: str, scenario: str, settings_lines: str, log_dir: Path, audit_config: Path,
            grace_s: float) -> None:
        """StartTest in C, on a worker thread while the main thread waits (``interrupts.call``): a Ctrl-C
        stops the session (every sample answered at once, no more inference) so that StartTest returns."""
        from trtfuse import interrupts

        err = ctypes.create_string_buffer(_ERR_LEN)
        rc = [None]

        def start_test():
            rc[0] = self.engine.lib.tf_session_run(self._handle, model_name.encode(), scenario.encode(),
                                                   settings_lines.encode(), str(log_dir).encode(),
                                                   str(audit_config).encode(), err, _ERR_LEN)

        interrupts.call(start_test, on_interrupt=lambda: self.stop("interrupted"), grace_s=grace_s)
        if rc[0] != 0 and not interrupts.requested():
            raise self._error(err.value.decode() or "the native run failed")

    def _error(self, message: str) -> Exception:
        if self.errors:
            first = self.errors[0]
            if isinstance(first, UserError):
                return first
            return RuntimeError(f"{message} (first error: {first!r})")
        return RuntimeError(message)

    def stats(self) -> _Stats:
        out = _Stats()
        self.engine.lib.tf_session_stats(self._handle, ctypes.byref(out))
        return out

    def lane_stats(self) -> list[dict]:
        """Each lane's batches, samples and device busy ms in the last run."""
        rows = []
        for lane in range(self.engine.lanes):
            st = _LaneStats()
            if self.engine.lib.tf_session_lane_stats(self._handle, lane, ctypes.byref(st)) != 0:
                raise RuntimeError(f"the native session has no lane {lane}")
            rows.append({"batches": st.batches, "samples": st.samples, "busy_ms": st.busy_ms})
        return rows

    def stop(self, reason: str) -> None:
        self.engine.lib.tf_session_stop(self._handle, reason.encode())

    def abandon(self) -> int:
        """RunMonitor's watchdog: stop, and answer what the slots hold (a hung engine)."""
        self.engine.hung = True
        return int(self.engine.lib.tf_session_abandon(self._handle, b"the engine hung"))

    def close(self) -> None:
        if self._handle:
            self.engine.lib.tf_session_free(self._handle)
            self._handle = 0


def settings_lines(ts) -> str:
    """The Python binding's TestSettings as "name=value" lines for the native LoadGen (every field both
    know; enums as numbers)."""
    lines = []
    for name in _SETTINGS_FIELDS:
        if not hasattr(ts, name):
            continue
        value = getattr(ts, name)
        if name in ("scenario", "mode"):
            value = int(value)
        elif isinstance(value, bool):
            value = int(value)
        elif isinstance(value, float):
            value = repr(value)
        lines.append(f"{name}={value}")
    return "\n".join(lines) + "\n"


_SETTINGS_FIELDS = (
    "scenario", "mode", "single_stream_expected_latency_ns", "single_stream_target_latency_percentile",
    "multi_stream_expected_latency_ns", "multi_stream_target_latency_percentile", "multi_stream_samples_per_query",
    "server_target_qps", "server_target_latency_ns", "server_target_latency_percentile", "server_coalesce_queries",
    "server_max_async_queries", "server_num_issue_query_threads", "offline_expected_qps",
    "sample_concatenate_permutation", "min_duration_ms", "max_duration_ms", "min_query_count", "max_query_count",
    "qsl_rng_seed", "sample_index_rng_seed", "schedule_rng_seed", "accuracy_log_rng_seed",
    "accuracy_log_probability", "accuracy_log_sampling_target", "performance_issue_unique",
    "performance_issue_same", "performance_issue_same_index", "performance_sample_count_override",
    "accuracy_sample_count_override",
)


def lane_rows(raw: list[dict], names: list[str], samples_per_s: float | None) -> list[dict]:
    """Per-lane report rows: each lane's share of LoadGen's rate (its samples over LoadGen's span, the
    span being all samples over LoadGen's samples/s), its mean batch and its device busy fraction of
    that span (None where LoadGen logged no rate)."""
    total = sum(r["samples"] for r in raw)
    span_s = total / samples_per_s if samples_per_s and total else None
    rows = []
    for i, (r, name) in enumerate(zip(raw, names)):
        rows.append({
            "lane": i, "name": name, "samples": r["samples"], "batches": r["batches"],
            "mean_batch": round(r["samples"] / r["batches"], 1) if r["batches"] else None,
            "share": round(r["samples"] / total, 4) if total else None,
            "samples_per_s": round(r["samples"] / span_s, 1) if span_s else None,
            "busy_ms": round(r["busy_ms"], 3),
            "busy_fraction": round(r["busy_ms"] / 1e3 / span_s, 4) if span_s else None,
        })
    return rows


def loadgen_version() -> str:
    return library().tf_loadgen_version().decode()


def _run_lanes(engine: NativeEngine, session: NativeSession, run_dir: Path) -> list[dict]:
    from trtfuse.report import read_loadgen_results

    lg = read_loadgen_results(run_dir)
    rate = lg.get("samples_per_s") or lg.get("completed_samples_per_s")
    names = ([f"GPU {d}" for d in engine.devices] if len(engine.devices) == engine.lanes
             else [f"{engine.name} lane {i}" for i in range(engine.lanes)])
    return lane_rows(session.lane_stats(), names, rate)


def run_native(engine: NativeEngine, model, dataset, settings: dict, run_dir: Path, progress: bool = True):
    """``lg_run.run_loadgen`` with the native SUT: the same settings, run folder, user.conf, warm-up
    and monitor; the test itself in C++. Returns an ``lg_run.LoadGenRun``."""
    from trtfuse import interrupts, run_stalls
    from trtfuse.gpu_energy import EnergySpan, gpus
    from trtfuse.lg_monitor import RunMonitor
    from trtfuse.lg_run import (INTERRUPT_GRACE_S, LoadGenRun, _cpu_seconds, audit_config_path, loadgen_settings,
                                offline_expected_qps, write_user_conf)
    from trtfuse.lg_scenarios import (SCENARIO_NAME, STREAM_SCENARIOS, set_expected_latency,
                                      stream_expected_latency_ns)

    run = settings["run"]
    scenario, accuracy = run["scenario"], run["mode"] == "accuracy"
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if len(dataset) == 0:
        raise UserError("the dataset has no images", "point --dataset at a folder with labelled images")
    if run["batch_size"] > engine.max_batch:
        raise UserError(f"batch size {run['batch_size']} is larger than the engine's {engine.max_batch}",
                        f"pass --batch-size {engine.max_batch} or less, or build the engine for a larger batch")
    engine.last_lanes = None
    audit_config = audit_config_path(run_dir, run["audit_config"])
    ts = loadgen_settings(settings, len(dataset), None)
    session = NativeSession(engine, dataset, ts.performance_sample_count_override, run["batch_size"],
                            float(settings["native"]["batch_timeout_us"]), model.label_offset)
    try:
        measured = session.warmup(run["warmup_batches"])
        if scenario == "offline":
            ts.offline_expected_qps = offline_expected_qps(settings["offline"], measured)
        elif scenario in STREAM_SCENARIOS:
            set_expected_latency(ts, scenario, stream_expected_latency_ns(settings[scenario], ts, scenario, measured))
        write_user_conf(run_dir, settings, ts)
        expected_s = max(ts.min_duration_ms / 1e3, 0) if scenario == "offline" and not accuracy else None
        monitor = RunMonitor(session, stall_s=run["watchdog_s"], expected_s=expected_s, progress=progress)
        start, cpu_start = time.perf_counter(), _cpu_seconds()
        failure = None
        with monitor, run_stalls.watch() as stalls, EnergySpan(*gpus(engine, settings)) as energy:
            try:
                session.run(run["mlperf_model"], SCENARIO_NAME[scenario], settings_lines(ts), run_dir, audit_config,
                            grace_s=INTERRUPT_GRACE_S.get(scenario, 1.0))
            except RuntimeError as e:
                failure = e
        wall, cpu = time.perf_counter() - start, _cpu_seconds() - cpu_start
        interrupts.raise_if_requested()
        if monitor.stalled:
            raise UserError(f"the run failed: {monitor.stalled}",
                            f"LoadGen's logs are in {run_dir}; check the engine, or raise run.watchdog_s")
        if failure is not None:
            raise failure
        if session.errors:
            raise session._error("the sample loader failed")
        st = session.stats()
        engine.last_lanes = _run_lanes(engine, session, run_dir)
        return LoadGenRun(
            run_dir=run_dir, warmup_samples_per_s=measured, issued=st.issued, completed=st.completed,
            qsl_load_calls=st.qsl_load_calls, qsl_loaded_samples=st.qsl_loaded_samples, wall_s=wall,
            cpu_s=cpu, mean_batch=st.batch_samples / st.batches if st.batches else None,
            timeline=monitor.timeline + [(round(wall, 3), st.completed)], stalls=stalls,
            gpu={"busy_ms": st.gpu_busy_ms} if engine.name == "tensorrt" else None,
            energy=energy.result(st.completed),
            effective={"offline_expected_qps": ts.offline_expected_qps,
                       "performance_sample_count": ts.performance_sample_count_override,
                       "min_duration_ms": ts.min_duration_ms, "min_query_count": ts.min_query_count,
                       "server_target_qps": ts.server_target_qps,
                       "server_target_latency_ns": ts.server_target_latency_ns,
                       "native_batch_timeout_us": float(settings["native"]["batch_timeout_us"])},
        )
    finally:
        session.close()
