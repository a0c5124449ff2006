"""The native run loop against the Python SUT on one GPU lease: ResNet-50 int8 with the plugins (random weights:
performance only), the engine alone, LoadGen Offline and Server, each SUT on the same engine and inputs.

    python3.10 -m trtfuse bench native run --stages engines,engine,offline,server [--seconds 60]   # GPU machine

Stages add to one JSON (--out) so that they can spread over several device calls on one warm machine:
  engines   build the engines (plugins all, int8 input, 2 optimization profiles) at batch 2048 and 256
  engine    the 2048 engine alone on the run's inputs (TensorRTBackend.engine_throughput), the Offline bar's denominator:
            8 s, then --seconds as long as a LoadGen run, each with the GPU's power and SM clock (a 700 W cap
            lowers the clock over a long run: the engine over the run's length tells that from a run-loop loss)
  offline   LoadGen Offline at batch 2048, native then Python, --seconds each
  server    LoadGen Server at batch 256: native at each --server-qps, then Python at the first
  attribution  the Python SUT's Server at each --attribution-qps with server.query_timeline: where its p99 goes
            (queued, inference, completion, and LoadGen's p99 beyond the SUT's: before the SUT saw the query)
Inputs: --images N random int8 images (seeded), the same bytes for every run: the bundle's photos are not needed
for a throughput A/B of two run loops. GPU energy: NVML's counter over LoadGen's span (not MLPerf Power).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from trtfuse.bench.runs import run_stage, save_record
from trtfuse.sysinfo import cpu_model

BUNDLE = Path("/tmp/trtfuse-e2e")
STAGES = ("engines", "engine", "offline", "server", "attribution")


def log(msg: str) -> None:
    print(f"[native {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class RandomImages:
    """``n`` int8 images 3 x 224 x 224 from a fixed seed, as a dataset (names, labels, images)."""

    def __init__(self, n: int, seed: int = 0):
        self.array = np.random.default_rng(seed).integers(-128, 128, size=(n, 3, 224, 224), dtype=np.int8)
        self.labels = np.zeros(n, dtype=np.int64)
        self.names = [f"random_{i:05d}" for i in range(n)]

    def __len__(self) -> int:
        return len(self.array)

    def images(self, indices) -> np.ndarray:
        return self.array[np.asarray(indices, dtype=np.int64).reshape(-1)]


class GpuSampler:
    """The GPU's SM clock and power every 0.2 s (NVML) while in the block: mean and min of each."""

    def __init__(self, device: int = 0):
        self.device, self.clocks, self.watts = device, [], []

    def __enter__(self):
        import threading

        try:
            import pynvml

            from trtfuse import cuda_runtime

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByPciBusId(cuda_runtime.pci_bus_id(self.device))
        except Exception as e:  # noqa: BLE001 - no NVML: no samples, the figures stand without them
            log(f"no GPU sampling: {e}")
            return self
        self._stop = threading.Event()

        def sample():
            while not self._stop.wait(0.2):
                self.clocks.append(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))
                self.watts.append(pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        if getattr(self, "_thread", None):
            self._stop.set()
            self._thread.join()

    def summary(self) -> dict:
        if not self.clocks:
            return {}
        return {"sm_clock_mhz_mean": round(float(np.mean(self.clocks)), 1), "sm_clock_mhz_min": int(min(self.clocks)),
                "power_w_mean": round(float(np.mean(self.watts)), 1), "power_w_max": round(max(self.watts), 1)}


def engine_path(model_dir: Path, batch: int) -> Path:
    from trtfuse.engine import BuildConfig, build_engine

    cfg = BuildConfig(precision="int8", plugins="all", batch=batch, input_format="int8", profiles=2)
    return Path(build_engine(model_dir, cfg))


def half_load(server_rows: list[dict]) -> dict | None:
    """The bar's half-load row: the native Server run at the lowest target of those at no more than about half
    (0.55 x) of the highest native target in ``server_rows``; None when no run was that light."""
    native = [r for r in server_rows if r["sut"] == "native" and r.get("target_qps")]
    top = max((r["target_qps"] for r in native), default=0.0)
    halves = [r for r in native if r["target_qps"] <= 0.55 * top]
    if not halves:
        return None
    lowest = min(halves, key=lambda r: r["target_qps"])
    return {"sut": "native", "target_qps": lowest["target_qps"], "p99_ms": lowest["p99_ms"]}


def settings_for(scenario: str, sut: str, engine: Path, batch: int, seconds: float, **extra) -> dict:
    from trtfuse import config

    overrides = {"run.scenario": scenario, "run.sut": sut, "run.backend": "tensorrt", "run.batch_size": batch,
                 "run.threads": 2, "run.warmup_batches": 5, "run.mlperf_model": "resnet50",
                 "run.output_dir": "/tmp/trtfuse-native-runs", "tensorrt.engine": str(engine),
                 "tensorrt.plugins": "all", "tensorrt.input_format": "int8", "tensorrt.streams": 2,
                 f"{scenario}.min_duration_ms": round(seconds * 1000)}
    overrides.update(extra)
    return config.load(None, overrides)



def loadgen_run(model, data, scenario: str, sut: str, engine: Path, batch: int, seconds: float, **extra) -> dict:
    from trtfuse import native_sut, session
    from trtfuse.backends.tensorrt_backend import TensorRTBackend

    s = settings_for(scenario, sut, engine, batch, seconds, **extra)
    if sut == "native":
        backend = native_sut.tensorrt_engine(model, s, progress=log)
    else:
        backend = TensorRTBackend(engine=str(engine), plugins="all", streams=2, serial_compute=True,
                                  input_format="int8")
        backend.load(model, batch)
    try:
        with GpuSampler() as gpu:
            report = session.run(s, progress=False, model=model, dataset=data, backend=backend)
    finally:
        backend.close()
    lg, h = report["loadgen"], report["harness"]
    energy = h.get("energy") or {}
    row = {"sut": sut, "valid": bool(lg.get("valid")), "min_duration_ms": round(seconds * 1000),
           "batch": batch, "mean_batch": h.get("mean_batch"), "invalid_reasons": lg.get("invalid_reasons"),
           "avg_watts": energy.get("avg_watts"), "samples_per_joule": energy.get("samples_per_joule"),
           "cpu_per_wall": round(h["cpu_s"] / h["wall_s"], 2) if h.get("wall_s") else None,
           "run_dir": report["run_dir"], "samples": s["native"]["samples"] if sut == "native" else "host",
           **gpu.summary()}
    if scenario == "offline":
        row["samples_per_s"] = lg.get("samples_per_s")
    else:
        lat = lg.get("latency_ns") or {}
        row.update(target_qps=extra.get("server.target_qps"), completed_samples_per_s=lg.get("completed_samples_per_s"),
                   p50_ms=round(lat.get("50.00", 0) / 1e6, 3), p99_ms=round(lat.get("99.00", 0) / 1e6, 3),
                   batch_timeout_us=s["native"]["batch_timeout_us"] if sut == "native" else None)
        if h.get("query_timeline"):
            row["query_timeline"] = h["query_timeline"]
    log(f"{scenario} {sut}: {row}")
    return row


def run(args) -> int:
    import tensorrt as trt
    from trtfuse import cuda_runtime, native_sut
    from trtfuse.backends.tensorrt_backend import TensorRTBackend
    from trtfuse.models import load_prepared

    out = Path(args.out)
    data = json.loads(out.read_text()) if out.is_file() else {}
    data.setdefault("errors", {})
    data.update(gpu=cuda_runtime.device_name(), trt_version=trt.__version__,
                loadgen_version=native_sut.loadgen_version(), weights="random: performance only",
                how="trtfuse bench native (tools/device_trt.sh native:STAGES)")
    lease = data.setdefault("leases", [])
    if not lease or lease[-1].get("lease") != args.lease:
        lease.append({"lease": args.lease, "cpu_model": cpu_model(), "offline": [], "server": []})
    this = lease[-1]
    model = load_prepared(BUNDLE / "models" / "resnet50")
    images = RandomImages(args.images)
    this["inputs"] = f"{args.images} random int8 images (seed 0), the same for every run"

    def save():
        save_record(out, data)

    def stage(name, fn):
        if name in args.stages:
            run_stage(data, name, fn, save, log)

    def engines():
        for b in (2048, 256):
            log(f"engine {b}: {engine_path(model.dir, b)}")

    def engine():
        b = TensorRTBackend(engine=str(engine_path(model.dir, 2048)), plugins="all", streams=2, input_format="int8")
        b.load(model, 2048)
        try:
            for seconds, key in ((8.0, "engine_samples_per_s"), (args.seconds, "engine_long")):
                with GpuSampler() as gpu:
                    rate = round(b.engine_throughput(2048, seconds, images=images.images(range(256)), serial=True), 1)
                if key == "engine_long":
                    this[key] = {"seconds": seconds, "samples_per_s": rate, **gpu.summary()}
                else:
                    this[key], this["engine_gpu"] = rate, gpu.summary()
                log(f"engine alone, {seconds:g} s: {rate:,.0f} samples/s {gpu.summary()}")
        finally:
            b.close()

    def offline():
        eng = engine_path(model.dir, 2048)
        target = 1.1 * (this.get("engine_samples_per_s") or 90000.0)
        for sut in args.suts:
            this["offline"].append(loadgen_run(model, images, "offline", sut, eng, 2048, args.seconds,
                                               **{"offline.target_qps": target, "native.samples": args.samples}))
            save()
        alone = this.get("engine_samples_per_s")
        long = (this.get("engine_long") or {}).get("samples_per_s")
        for row in this["offline"]:
            if alone and row.get("samples_per_s"):
                row["of_engine_alone"] = round(row["samples_per_s"] / alone, 4)
            if long and row.get("samples_per_s"):
                row["of_engine_alone_same_length"] = round(row["samples_per_s"] / long, 4)

    def server():
        eng = engine_path(model.dir, 256)
        runs = [("native", q) for q in args.server_qps] + [(s, args.server_qps[0]) for s in args.suts if s != "native"]
        for sut, qps in runs:
            extra = {"server.target_qps": qps, "server.target_latency_ms": 15.0, "server.min_query_count": 100,
                     "native.batch_timeout_us": args.batch_timeout_us, "native.samples": args.samples}
            row = loadgen_run(model, images, "server", sut, eng, 256, args.seconds, **extra)
            this["server"].append(row)
            save()
        half = half_load(this["server"])
        if half is not None:
            this["server_half_load"] = half

    def attribution():
        eng = engine_path(model.dir, 256)
        rows = this.setdefault("tail_attribution", [])
        for qps in args.attribution_qps:
            extra = {"server.target_qps": qps, "server.target_latency_ms": 15.0, "server.min_query_count": 100,
                     "server.query_timeline": True}
            rows.append(loadgen_run(model, images, "server", "python", eng, 256, args.seconds, **extra))
            save()
        data["tail_attribution"] = {"lease": args.lease, "cpu_model": this["cpu_model"], "sut": "python",
                                    "runs": [{k: r.get(k) for k in ("target_qps", "completed_samples_per_s", "p50_ms",
                                                                    "p99_ms", "valid", "query_timeline")}
                                             for r in rows]}

    for name, fn in (("engines", engines), ("engine", engine), ("offline", offline), ("server", server),
                     ("attribution", attribution)):
        stage(name, fn)
    return 1 if data["errors"] else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", default="/tmp/trtfuse-results/native_sut_h100.json")
    r.add_argument("--stages", default=",".join(STAGES))
    r.add_argument("--lease", default=time.strftime("%Y-%m-%d"), help="names this machine's lease in the record")
    r.add_argument("--seconds", type=float, default=60.0)
    r.add_argument("--images", type=int, default=1024)
    r.add_argument("--suts", default="native,python")
    r.add_argument("--server-qps", default="73500,36750")
    r.add_argument("--attribution-qps", default="12000,36750", help="the Python SUT's loads for the attribution")
    r.add_argument("--batch-timeout-us", type=float, default=0.0)
    r.add_argument("--samples", default="host", help="native.samples of the native runs: host or device")
    args = p.parse_args(argv)
    args.stages = [s for s in args.stages.split(",") if s]
    args.suts = [s for s in args.suts.split(",") if s]
    args.server_qps = [float(q) for q in args.server_qps.split(",") if q]
    args.attribution_qps = [float(q) for q in args.attribution_qps.split(",") if q]
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
