"""ResNet-50 int8 with the plugins on N GPUs of one host through the native run loop (one lane per GPU, one
process), against N times one GPU; and the host path alone (the null engine) at 1, 2, 4, 8 lanes.

    python3.10 -m trtfuse bench multigpu run --stages engines,engine,offline,server --counts 1,2,4   # GPU host
    python3.10 -m trtfuse bench multigpu run --stages host-path --host-path-seconds 2              # any host

Stages add to one JSON (--out, issue 44's schema) so that they can spread over several device calls:
  engines    build the int8 plugin engines (2 optimization profiles) at batch 2048 and 256
  engine     the 2048 engine alone on each GPU in turn (TensorRTBackend.engine_throughput, serial runs)
  offline    LoadGen Offline at batch 2048 on the first N GPUs for each N of --counts, target 1.1 x N x the
             one-GPU engine rate, --seconds long
  server     LoadGen Server at batch 256, --server-qps-per-gpu x N, p99 bound 15 ms: one try per N, no search
  host-path  the native session over the null engine (no GPU, emulated device time 0) at 1, 2, 4, 8 lanes,
             ResNet-50's int8 sample (3 x 224 x 224), LoadGen Offline: where one process stops scaling. The null
             engine reads 64 words of each sample: LoadGen, the queue and the completions, not the bytes' copies
Every run's report carries per-lane rows (samples, batches, rate over LoadGen's span, device busy %), copied
here. Inputs: --images random int8 images (seeded; performance runs read no labels), random weights.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from trtfuse.bench import native as nbench  # RandomImages, settings_for
from trtfuse.bench.runs import run_stage, save_record
from trtfuse.sysinfo import cpu_model

STAGES = ("engines", "engine", "offline", "server", "host-path")
RUNS_DIR = "/tmp/trtfuse-multigpu-runs"


def log(msg: str) -> None:
    print(f"[multigpu {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def numa_nodes() -> int | None:
    try:
        text = Path("/sys/devices/system/node/online").read_text().strip()
    except OSError:
        return None
    n = 0
    for part in text.split(","):
        a, _, b = part.partition("-")
        n += int(b or a) - int(a) + 1
    return n


def stand_in_model():
    """ResNet-50's shape without its files: what a null-engine run reads of a model."""
    from trtfuse.models.prepared import PreparedModel, PreprocessSpec

    return PreparedModel(name="resnet50", onnx_path=Path("/nonexistent/resnet50.onnx"), input_name="input",
                         input_shape=(3, 224, 224), num_classes=1000, label_offset=0, preprocess=PreprocessSpec(),
                         random_weights=True, output_name="output")


def run_row(report: dict) -> dict:
    """What a LoadGen run's report gives a row: rate, verdict, latencies, per-lane rows."""
    lg, h = report["loadgen"], report["harness"]
    lat = lg.get("latency_ns") or {}
    row = {"valid": bool(lg.get("valid")), "invalid_reasons": lg.get("invalid_reasons"),
           "mean_batch": h.get("mean_batch"), "run_dir": report["run_dir"],
           "cpu_per_wall": round(h["cpu_s"] / h["wall_s"], 2) if h.get("wall_s") else None,
           "lanes": report.get("lanes") or []}
    if lg.get("scenario") == "server":
        row.update(samples_per_s=lg.get("completed_samples_per_s"), target_qps=lg.get("target_qps"),
                   p50_ms=round(lat.get("50.00", 0) / 1e6, 3), p99_ms=round(lat.get("99.00", 0) / 1e6, 3))
    else:
        row["samples_per_s"] = lg.get("samples_per_s")
    samples = [lane["samples"] for lane in row["lanes"]]
    if len(samples) >= 2 and min(samples) > 0:
        row["lane_spread"] = round(max(samples) / min(samples), 4)  # max/min samples across lanes
    return row


def loadgen(model, images, scenario: str, sut: str, engine: Path | None, batch: int, seconds: float,
            backend=None, **extra) -> dict:
    from trtfuse import session

    s = nbench.settings_for(scenario, sut, engine or "", batch, seconds, **{"run.output_dir": RUNS_DIR, **extra})
    report = session.run(s, progress=False, model=model, dataset=images, backend=backend)
    row = run_row(report)
    log(f"{scenario} {sut} {extra.get('tensorrt.devices', '')}: {row['samples_per_s']} samples/s, "
        f"valid {row['valid']}, lanes {[lane['samples'] for lane in row['lanes']]}")
    return row


def run(args) -> int:
    from trtfuse import native_sut

    out = Path(args.out)
    data = json.loads(out.read_text()) if out.is_file() else {}
    data.setdefault("errors", {})
    data.update(sut=args.sut, cpu_model=cpu_model(), numa_nodes=numa_nodes(), cpus=os.cpu_count(),
                loadgen_version=native_sut.loadgen_version(), weights="random: performance only",
                inputs=f"{args.images} random int8 images 3x224x224 (seed 0)",
                how="trtfuse bench multigpu (tools/device_trt.sh multigpu-native)")
    data.setdefault("runs", [])
    data.setdefault("host_path_null_engine", [])
    images = nbench.RandomImages(args.images)
    gpu_stages = [s for s in args.stages if s != "host-path"]
    model = None
    if gpu_stages:
        import tensorrt as trt
        from trtfuse import cuda_runtime
        from trtfuse.models import load_prepared

        data.update(gpu=cuda_runtime.device_name(), gpus=cuda_runtime.device_count(), trt_version=trt.__version__)
        model = load_prepared(nbench.BUNDLE / "models" / "resnet50")
    else:
        data.setdefault("gpu", None)
        data.setdefault("gpus", None)
        data.setdefault("trt_version", None)

    def save():
        save_record(out, data)

    def row_for(n: int) -> dict:
        for row in data["runs"]:
            if row["devices"] == n:
                return row
        row = {"devices": n, "engine_samples_per_s_per_gpu": None, "offline_samples_per_s": None,
               "offline_valid": None, "server_qps": None, "p99_ms": None, "valid": None}
        data["runs"].append(row)
        data["runs"].sort(key=lambda r: r["devices"])
        return row

    def engine_rate(n: int) -> float | None:
        per = {e["device"]: e["samples_per_s"] for e in data.get("engine_per_gpu", [])}
        rates = [per.get(d) for d in range(n)]
        return sum(rates) / n if all(rates) else None

    def devices(n: int) -> str:
        return ",".join(str(d) for d in range(n))

    def stage(name, fn):
        if name in args.stages:
            run_stage(data, name, fn, save, log)

    def engines():
        for b in (args.batch, args.server_batch):
            log(f"engine {b}: {nbench.engine_path(model.dir, b)}")

    def engine():
        from trtfuse import cuda_runtime
        from trtfuse.backends.tensorrt_backend import TensorRTBackend

        rows = []
        for d in range(min(cuda_runtime.device_count(), max(args.counts))):
            b = TensorRTBackend(engine=str(nbench.engine_path(model.dir, args.batch)), plugins="all", streams=2,
                                input_format="int8", device=d)
            b.load(model, args.batch)
            try:
                rate = b.engine_throughput(args.batch, 8.0, images=images.images(range(256)), serial=True)
            finally:
                b.close()
            rows.append({"device": d, "samples_per_s": round(rate, 1)})
            log(f"engine alone on GPU {d}: {rate:,.0f} samples/s")
        data["engine_per_gpu"] = rows
        for n in args.counts:
            row_for(n)["engine_samples_per_s_per_gpu"] = engine_rate(n)

    def scaling():
        one = next((r for r in data["runs"] if r["devices"] == 1), None)
        for row in data["runs"]:
            n = row["devices"]
            if one and one.get("offline_samples_per_s") and row.get("offline_samples_per_s"):
                row["offline_of_n_x_one"] = round(row["offline_samples_per_s"] / (n * one["offline_samples_per_s"]), 4)
            if one and one.get("server_qps") and row.get("server_qps"):
                row["server_of_n_x_one"] = round(row["server_qps"] / (n * one["server_qps"]), 4)
            if row.get("engine_samples_per_s_per_gpu") and row.get("offline_samples_per_s"):
                row["offline_of_engine_alone"] = round(
                    row["offline_samples_per_s"] / (n * row["engine_samples_per_s_per_gpu"]), 4)

    def offline():
        eng = nbench.engine_path(model.dir, args.batch)
        for n in args.counts:
            row = row_for(n)
            per_gpu = row.get("engine_samples_per_s_per_gpu") or engine_rate(n) or args.engine_rate_guess
            r = loadgen(model, images, "offline", args.sut, eng, args.batch, args.seconds,
                        **{"offline.target_qps": 1.1 * n * per_gpu, "tensorrt.devices": devices(n),
                           "native.samples": args.samples})
            row.update(offline_samples_per_s=r["samples_per_s"], offline_valid=r["valid"],
                       offline_target_qps=round(1.1 * n * per_gpu, 1), offline=r)
            scaling()
            save()

    def server():
        eng = nbench.engine_path(model.dir, args.server_batch)
        for n in args.counts:
            row = row_for(n)
            extra = {"server.target_qps": args.server_qps_per_gpu * n, "server.target_latency_ms": 15.0,
                     "server.min_query_count": 100, "native.batch_timeout_us": args.batch_timeout_us,
                     "native.samples": args.samples, "tensorrt.devices": devices(n)}
            r = loadgen(model, images, "server", args.sut, eng, args.server_batch, args.seconds, **extra)
            row.update(server_qps=r["samples_per_s"], server_target_qps=args.server_qps_per_gpu * n,
                       p99_ms=r["p99_ms"], valid=r["valid"], server=r)
            scaling()
            save()

    def host_path():
        model_ = stand_in_model()
        sample = images.images([0])[0]
        rows = []
        for lanes in args.host_lanes:
            def once(target: float, seconds: float, lanes: int = lanes) -> dict:
                eng = native_sut.null_engine(sample, model_.num_classes, args.batch, lanes=lanes, slots_per_lane=2)
                try:
                    return loadgen(model_, images, "offline", "native", None, args.batch, seconds, backend=eng,
                                   **{"run.backend": "null", "offline.target_qps": target})
                finally:
                    eng.close()

            target = args.host_path_qps
            if not target:  # a short run sizes the real one (LoadGen issues target x seconds samples at once)
                target = 1.1 * (once(1e6, min(1.0, args.host_path_seconds))["samples_per_s"] or 1e6)
            r = once(target, args.host_path_seconds)
            rows.append({"lanes": lanes, "samples_per_s": r["samples_per_s"], "valid": r["valid"],
                         "target_qps": round(target, 1), "seconds": args.host_path_seconds, "lane_rows": r["lanes"],
                         "lane_spread": r.get("lane_spread"), "cpu_per_wall": r["cpu_per_wall"]})
            data["host_path_null_engine"] = rows
            save()

    for name, fn in (("engines", engines), ("engine", engine), ("offline", offline), ("server", server),
                     ("host-path", host_path)):
        stage(name, fn)
    log(f"wrote {out}; errors: {data['errors'] or 'none'}")
    return 1 if data["errors"] else 0


def _ints(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise SystemExit(f"error: {what} takes comma-separated counts >= 1 (e.g. 1,2,4), not {text!r}")
    return values


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", default="/tmp/trtfuse-results/multigpu_h100.json")
    r.add_argument("--stages", default="engines,engine,offline,server,host-path")
    r.add_argument("--counts", default="1,2,4", help="GPU counts of the offline and server stages")
    r.add_argument("--sut", default="native", choices=("native", "python"))
    r.add_argument("--seconds", type=float, default=60.0, help="LoadGen's min duration of each run")
    r.add_argument("--images", type=int, default=1024)
    r.add_argument("--batch", type=int, default=2048)
    r.add_argument("--server-batch", type=int, default=256)
    r.add_argument("--server-qps-per-gpu", type=float, default=73000.0)
    r.add_argument("--batch-timeout-us", type=float, default=0.0)
    r.add_argument("--samples", default="host", help="native.samples: host or device")
    r.add_argument("--engine-rate-guess", type=float, default=85000.0,
                   help="per-GPU engine rate that sizes Offline where the engine stage has not run")
    r.add_argument("--host-lanes", default="1,2,4,8", help="lane counts of the host-path stage")
    r.add_argument("--host-path-seconds", type=float, default=10.0,
                   help="each host-path run's min duration (LoadGen holds every sample of an Offline query: "
                        "millions a second here)")
    r.add_argument("--host-path-qps", type=float, default=0.0,
                   help="host-path Offline target (0: sized by a 1 s run first)")
    args = p.parse_args(argv)
    args.stages = [s for s in args.stages.split(",") if s]
    unknown = sorted(set(args.stages) - set(STAGES))
    if unknown:
        raise SystemExit(f"error: unknown stage(s) {', '.join(unknown)}; the stages are {', '.join(STAGES)}")
    args.counts = _ints(args.counts, "--counts")
    args.host_lanes = _ints(args.host_lanes, "--host-lanes")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
