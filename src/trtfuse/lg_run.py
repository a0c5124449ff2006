"""One LoadGen test: settings, run folder, QSL + SUT, warm-up, StartTest, and failure handling.

LoadGen traps this module exists to avoid:
- ``TestSettings.FromConfig`` with a user.conf loads LoadGen's built-in mlperf.conf only on its first
  call in a process; later calls silently drop it. Here the built-in file alone is loaded
  (conf_type 0, which loads it every time) and our own settings are assigned field by field.
- StartTest reads ``audit.config`` from the working directory when present; we pass a path inside
  the run folder, which holds one only when the user gave it on purpose (``run.audit_config``, for
  MLPerf's compliance tests); a stray one in the working directory is ignored, and said so.
- A missing log folder aborts the process: the run folder is made before LoadGen sees it.
- LoadGen has no warm-up: the backend runs ``warmup_batches`` batches before StartTest.
"""

from __future__ import annotations

import gc
import resource
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import mlperf_loadgen as lg
from trtfuse import interrupts, run_stalls
from trtfuse.errors import UserError
from trtfuse.gpu_energy import EnergySpan, gpus
from trtfuse.lg_monitor import RunMonitor
from trtfuse.lg_qsl import SampleLibrary
from trtfuse.lg_scenarios import (SCENARIO_NAME, STREAM_SCENARIOS, samples_per_query, set_expected_latency,
                                  stream_expected_latency_ns)
from trtfuse.lg_sut import OfflineSUT, ServerSUT, StreamSUT
from trtfuse.query_timeline import QueryTimeline

LOADGEN_SCENARIO = {"offline": lg.TestScenario.Offline, "server": lg.TestScenario.Server,
                    "singlestream": lg.TestScenario.SingleStream, "multistream": lg.TestScenario.MultiStream}
LOADGEN_MODE = {"performance": lg.TestMode.PerformanceOnly, "accuracy": lg.TestMode.AccuracyOnly}
AUDIT_CONFIG = "audit.config"  # the name LoadGen looks for
USER_CONF = "user.conf"
# Ctrl-C: how long StartTest may take to return once the SUT has answered everything. Offline then
# only writes its logs; the other scenarios go on issuing queries until their duration is over however
# fast they are answered (LoadGen has no stop), so the process exits sooner, the run folder removed
# (interrupts.wait_for).
INTERRUPT_GRACE_S = {"offline": 30.0}


@dataclass
class LoadGenRun:
    run_dir: Path
    warmup_samples_per_s: float | None
    issued: int
    completed: int
    qsl_load_calls: int
    qsl_loaded_samples: int
    wall_s: float
    cpu_s: float  # CPU time of the whole process during StartTest: backend plus harness plus LoadGen
    effective: dict = field(default_factory=dict)
    mean_batch: float | None = None  # samples per backend call (Server: set by the load)
    timeline: list = field(default_factory=list)  # (s since StartTest, samples completed), every 0.5 s
    stalls: dict = field(default_factory=dict)  # what took the CPU away during StartTest (run_stalls)
    gpu: dict | None = None  # the backend's trace of StartTest's batches (gpu_trace), where it keeps one
    energy: dict | None = None  # the GPUs' energy over StartTest (gpu_energy), on a GPU backend
    query_timeline: QueryTimeline | None = None  # Server, server.query_timeline: where each query's time went


def loadgen_settings(settings: dict, total_count: int, measured_qps: float | None) -> lg.TestSettings:
    """LoadGen's settings: its built-in mlperf.conf for ``run.mlperf_model``, then ours on top
    (``user_conf_lines`` lists exactly those). ``run.official`` keeps every mlperf.conf value and sets
    only what a user.conf must say (the target QPS)."""
    run = settings["run"]
    scenario = run["scenario"]
    ts = lg.TestSettings()
    rc = ts.FromConfig("", run["mlperf_model"], SCENARIO_NAME[scenario], 0)
    if rc != 0:
        raise UserError(f"LoadGen rejected its built-in mlperf.conf for {run['mlperf_model']!r} (code {rc})",
                        "set run.mlperf_model to a benchmark LoadGen knows, e.g. resnet50")
    ts.scenario = LOADGEN_SCENARIO[scenario]
    ts.mode = LOADGEN_MODE[run["mode"]]
    section = settings[scenario]
    official = run["official"]
    if not official:
        ts.min_duration_ms = section["min_duration_ms"]
        ts.min_query_count = section["min_query_count"]
    psc = (not official and run["performance_sample_count"]) or ts.performance_sample_count_override or total_count
    if psc > total_count:
        if official:
            print(f"note: mlperf.conf's performance_sample_count is {psc} but the dataset has "
                  f"{total_count} samples; using {total_count} (not a submittable run)", file=sys.stderr)
        psc = total_count
    ts.performance_sample_count_override = psc
    if scenario == "offline":
        ts.offline_expected_qps = offline_expected_qps(section, measured_qps)
    elif scenario in STREAM_SCENARIOS:
        set_expected_latency(ts, scenario, stream_expected_latency_ns(section, ts, scenario, measured_qps))
    else:
        ts.server_target_qps = section["target_qps"]
        if not official:
            ts.server_target_latency_ns = int(section["target_latency_ms"] * 1e6)
        ts.server_coalesce_queries = section["coalesce_queries"]
    return ts


def offline_expected_qps(section: dict, measured_qps: float | None) -> float:
    """The Offline target: the user's, else the warm-up's estimate. LoadGen issues expected_qps x
    min_duration samples, and finishing them sooner makes the run INVALID: the estimate is padded."""
    return section["target_qps"] or (measured_qps or 1.0) * 1.5


def user_conf_lines(settings: dict, ts: lg.TestSettings) -> list[str]:
    """What this run set on top of mlperf.conf, as LoadGen's user.conf says it (times in ms)."""
    run = settings["run"]
    prefix = f"{run['mlperf_model']}.{SCENARIO_NAME[run['scenario']]}."
    values: dict[str, object] = {}
    if run["scenario"] == "offline":
        values["target_qps"] = ts.offline_expected_qps
    elif run["scenario"] == "singlestream":  # user.conf's target_latency: the expected latency, in ms
        values["target_latency"] = ts.single_stream_expected_latency_ns / 1e6
    elif run["scenario"] == "multistream":
        values["target_latency"] = ts.multi_stream_expected_latency_ns / 1e6
    else:
        values["target_qps"] = ts.server_target_qps
    if not run["official"]:
        values["min_duration"] = ts.min_duration_ms
        values["min_query_count"] = ts.min_query_count
        if run["scenario"] == "server":
            values["target_latency"] = ts.server_target_latency_ns / 1e6
    defaults = lg.TestSettings()
    defaults.FromConfig("", run["mlperf_model"], SCENARIO_NAME[run["scenario"]], 0)
    if ts.performance_sample_count_override != defaults.performance_sample_count_override:
        values["performance_sample_count_override"] = ts.performance_sample_count_override
    return [f"{prefix}{key} = {_conf_value(v)}" for key, v in values.items()]


def _conf_value(v) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def write_user_conf(run_dir: Path, settings: dict, ts: lg.TestSettings) -> None:
    (run_dir / USER_CONF).write_text(
        "# What this run set on top of LoadGen's built-in mlperf.conf (written by trtfuse).\n"
        + "\n".join(user_conf_lines(settings, ts)) + "\n")


def audit_config_path(run_dir: Path, given: str) -> Path:
    """The audit.config LoadGen gets: a copy of ``given`` in the run folder (a compliance test), or a
    path in the run folder that holds none. A stray ./audit.config is never read, but named."""
    path = run_dir / AUDIT_CONFIG
    if given:
        source = Path(given).expanduser()
        if not source.is_file():
            raise UserError(f"audit config {source} does not exist",
                            "pass the audit.config of an MLPerf compliance test, e.g. "
                            "compliance/TEST01/resnet50/audit.config of mlcommons/inference")
        shutil.copyfile(source, path)
    elif Path(AUDIT_CONFIG).is_file():
        print(f"note: ignoring {Path(AUDIT_CONFIG).resolve()} (LoadGen would read it); "
              "pass --audit-config FILE to run a compliance test on purpose", file=sys.stderr)
    return path


def warm_up(backend, qsl: SampleLibrary, batch_size: int, batches: int, threads: int = 1) -> float | None:
    """Run ``batches`` batches through the serving path: the first samples loaded into the QSL's store
    (the backend's memory, its input type), answered by ``classify_rows`` as the SUT will; then
    unloaded, leaving the store for LoadGen. Samples/s of all but the first batch (which pays
    one-time setup), run as the SUT runs them: ``threads`` at once; with several threads, after an
    untimed batch per thread (its own setup), and at least two timed per thread.
    Timing plain ``infer`` instead counted a host conversion no query pays, and timing one batch at a
    time a backend that runs several at once (streams, lanes, servers): Offline runs sized by either
    ended before their min duration."""
    if batches == 0:
        return None
    indices = list(range(min(batch_size, qsl.total_count)))
    qsl.load(indices)
    rows = qsl.rows(indices)
    try:
        backend.classify_rows(qsl.store, rows)
        if batches == 1:
            return None
        timed = max(batches - 1, threads if threads == 1 else 2 * threads)
        with ThreadPoolExecutor(threads) as pool:
            if threads > 1:
                # A round untimed first: each worker's first batch pays its own setup (its scratch
                # buffers, its requests' first trip). Timing that round too put Triton's estimate at
                # 0.5-0.65 of the rate LoadGen then measured: short Offline runs ended before their min
                # duration.
                for _ in pool.map(lambda _: backend.classify_rows(qsl.store, rows), range(threads)):
                    pass
            start = time.perf_counter()
            for _ in pool.map(lambda _: backend.classify_rows(qsl.store, rows), range(timed)):
                pass
        return len(rows) * timed / (time.perf_counter() - start)
    finally:
        qsl.unload(indices)
        qsl.load_calls.clear()  # the record is of what LoadGen asked for
        qsl.unload_calls.clear()


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_loadgen(backend, model, dataset, settings: dict, run_dir: Path, progress: bool = True) -> LoadGenRun:
    """Run one LoadGen test of ``backend`` (loaded with ``model``) over ``dataset`` into ``run_dir``."""
    run = settings["run"]
    scenario, accuracy = run["scenario"], run["mode"] == "accuracy"
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    total = len(dataset)
    if total == 0:
        raise UserError("the dataset has no images", "point --dataset at a folder with labelled images")

    audit_config = audit_config_path(run_dir, run["audit_config"])
    ts = loadgen_settings(settings, total, None)
    qsl = SampleLibrary(dataset, ts.performance_sample_count_override, backend)
    threads = run["threads"] or backend.concurrency
    measured = warm_up(backend, qsl, run["batch_size"], run["warmup_batches"], threads)
    if scenario == "offline":
        ts.offline_expected_qps = offline_expected_qps(settings["offline"], measured)
    elif scenario in STREAM_SCENARIOS:
        set_expected_latency(ts, scenario, stream_expected_latency_ns(settings[scenario], ts, scenario, measured))
    write_user_conf(run_dir, settings, ts)

    common = {"batch_size": run["batch_size"], "threads": threads, "label_offset": model.label_offset}
    if scenario == "offline":
        sut = OfflineSUT(backend, qsl, **common)
    elif scenario in STREAM_SCENARIOS:
        if run["batch_size"] > samples_per_query(ts, scenario):  # an engine built for more runs each query slower
            print(f"note: {scenario} queries hold {samples_per_query(ts, scenario)} sample(s); --batch-size "
                  f"{samples_per_query(ts, scenario)} builds the engine for that", file=sys.stderr)
        sut = StreamSUT(backend, qsl, **common)
    else:
        sut = ServerSUT(backend, qsl, **common)
        if settings["server"]["query_timeline"]:
            sut.timeline = QueryTimeline()

    def guarded(fn):
        def callback(*args):
            try:
                fn(*args)
            except BaseException as e:  # noqa: BLE001 - an exception here would abort the process
                sut.errors.append(e)
        return callback

    log_output = lg.LogOutputSettings()
    log_output.outdir = str(run_dir)
    log_output.copy_summary_to_stdout = False
    log_settings = lg.LogSettings()
    log_settings.log_output = log_output
    log_settings.enable_trace = False

    expected_s = None
    if scenario == "offline" and not accuracy:
        expected_s = max(ts.min_duration_ms / 1e3, 0)

    def load(indices):
        if not sut.interrupted:  # its samples are answered without being read
            qsl.load(indices)

    lg_qsl = lg.ConstructQSL(total, qsl.performance_sample_count, guarded(load), guarded(qsl.unload))
    lg_sut = lg.ConstructFastSUT(sut.guarded_issue, guarded(sut.flush))
    backend.start_trace()
    sut.start()
    start, cpu_start = time.perf_counter(), _cpu_seconds()
    monitor = RunMonitor(sut, stall_s=run["watchdog_s"], expected_s=expected_s, progress=progress)
    # A collection stops every Python thread while it walks the young objects, and the two lists of an Offline
    # query (a million ints each, built by LoadGen's binding) are young: 17-22 ms with the workers stopped, where
    # the GPU idles (ResNet-50 on the H100, docs/int8_pipeline.md). The run's own objects are freed by their
    # reference counts; what cycles it leaves is collected after it.
    gc_was_enabled = gc.isenabled()
    if run["gc_disable"]:
        gc.disable()
    try:
        with monitor, run_stalls.watch() as stalls, EnergySpan(*gpus(backend, settings)) as energy:
            interrupts.call(lambda: lg.StartTestWithLogSettings(lg_sut, lg_qsl, ts, log_settings, str(audit_config)),
                            on_interrupt=sut.interrupt, grace_s=INTERRUPT_GRACE_S.get(scenario, 1.0))
    finally:
        if gc_was_enabled:
            gc.enable()
        wall, cpu = time.perf_counter() - start, _cpu_seconds() - cpu_start
        gpu = backend.stop_trace()
        # A worker stuck in a hung backend never returns: don't wait for it (it is a daemon thread).
        sut.stop(timeout=0.1 if monitor.stalled or sut.interrupted else 5.0)
        lg.DestroyFastSUT(lg_sut)
        lg.DestroyQSL(lg_qsl)

    interrupts.raise_if_requested()
    if monitor.stalled:
        raise UserError(f"the run failed: {monitor.stalled}",
                        f"LoadGen's logs are in {run_dir}; check the backend, or raise run.watchdog_s")
    if sut.errors:
        first = sut.errors[0]
        if isinstance(first, UserError):
            raise first
        raise RuntimeError(f"{len(sut.errors)} error(s) during the LoadGen run (logs in {run_dir}); "
                           f"the first: {first!r}") from first
    return LoadGenRun(
        run_dir=run_dir, warmup_samples_per_s=measured, issued=sut.ledger.issued,
        completed=sut.ledger.completed, qsl_load_calls=len(qsl.load_calls), mean_batch=sut.mean_batch(),
        qsl_loaded_samples=sum(len(c) for c in qsl.load_calls), wall_s=wall, cpu_s=cpu,
        timeline=monitor.timeline + [(round(wall, 3), sut.ledger.completed)], stalls=stalls, gpu=gpu,
        energy=energy.result(sut.ledger.completed), query_timeline=sut.timeline,
        effective={"offline_expected_qps": ts.offline_expected_qps,
                   "performance_sample_count": ts.performance_sample_count_override,
                   "min_duration_ms": ts.min_duration_ms, "min_query_count": ts.min_query_count,
                   "server_target_qps": ts.server_target_qps,
                   "server_target_latency_ns": ts.server_target_latency_ns,
                   "samples_per_query": samples_per_query(ts, scenario),
                   "expected_latency_ns": {"singlestream": ts.single_stream_expected_latency_ns,
                                           "multistream": ts.multi_stream_expected_latency_ns}.get(scenario)},
    )
