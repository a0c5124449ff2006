"""What the LoadGen harness costs on CPU: writes benchmarks/results/harness_cpu.json.

  rows          per model and batch: LoadGen Offline (PerformanceOnly) samples/s against a plain
                loop over the same backend, batch and data (the harness should cost almost nothing)
  null_backend  a backend that answers at once: Offline samples/s, and the highest Server target QPS
                that LoadGen calls VALID with p99 <= 15 ms
  accuracy      EfficientNet-Lite0 fp32 top-1 on ../shared/data/imagenet-sample (if present)

Usage: trtfuse bench harness-cpu [--quick] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from trtfuse import config, session
from trtfuse.backends import create_backend
from trtfuse.data import open_dataset
from trtfuse.models import PreparedModel, PreprocessSpec

from trtfuse.bench import REPO
SAMPLE = REPO.parent / "shared" / "data" / "imagenet-sample"


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} logical CPUs, Python {platform.python_version()}"


def cpu_seconds() -> float:
    """CPU time of this process, all threads: neighbours on a shared machine barely change it."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def loop_samples_per_s(backend, images: np.ndarray, batch: int, seconds: float) -> tuple[float, float]:
    """The baseline: infer consecutive batches of in-RAM images for ``seconds``.

    Returns samples per wall-clock second and samples per CPU second.
    """
    batches = [images[i:i + batch] for i in range(0, len(images) - batch + 1, batch)]
    backend.infer(batches[0])
    done, start, cpu = 0, time.perf_counter(), cpu_seconds()
    while time.perf_counter() - start < seconds:
        for b in batches:
            backend.infer(b)
            done += len(b)
    return done / (time.perf_counter() - start), done / (cpu_seconds() - cpu)


def settings(out_dir: Path, **overrides) -> dict:
    return config.load(overrides={"run.output_dir": str(out_dir), "run.warmup_batches": 2, **overrides})


def model_row(name: str, batch: int, dataset, out_dir: Path, seconds: float, rounds: int) -> dict:
    model = session.resolve_model(name)
    backend = create_backend("onnxruntime")
    backend.load(model, batch)
    images = dataset.images(np.arange(len(dataset)))  # the very samples LoadGen's QSL holds
    # Alternate loop and LoadGen for a few rounds and keep each side's best: on a shared machine
    # neighbours only ever slow a measurement down, so the best is the least disturbed one.
    # CPU seconds tell the same story without the neighbours' noise: the harness's own threads are
    # what LoadGen's runs spend beyond the loop's.
    loops, loadgens, loop_cpu, loadgen_cpu = [], [], [], []
    for _ in range(rounds):
        wall, per_cpu = loop_samples_per_s(backend, images, batch, seconds)
        loops.append(wall)
        loop_cpu.append(per_cpu)
        s = settings(out_dir, **{"run.batch_size": batch, "offline.min_duration_ms": int(seconds * 1000),
                                 # above the loop's rate, so LoadGen's one query lasts min_duration
                                 "offline.target_qps": max(loops) * 1.2})
        report = session.run(s, progress=False, model=model, dataset=dataset, backend=backend)
        loadgens.append(report["loadgen"]["samples_per_s"])
        # CPU of the whole process during StartTest (QSL load included), over the samples done.
        loadgen_cpu.append(report["harness"]["completed"] / report["harness"]["cpu_s"])
    backend.close()
    lg, loop = max(loadgens), max(loops)
    row = {"model": name, "batch": batch, "loadgen_samples_per_s": round(lg, 2),
           "loop_samples_per_s": round(loop, 2), "ratio": round(lg / loop, 4),
           "loadgen_runs": [round(x, 2) for x in loadgens], "loop_runs": [round(x, 2) for x in loops],
           "loadgen_samples_per_cpu_s": round(max(loadgen_cpu), 3),
           "loop_samples_per_cpu_s": round(max(loop_cpu), 3),
           "cpu_ratio": round(max(loadgen_cpu) / max(loop_cpu), 4),
           "random_weights": model.random_weights}
    print(f"  {name:<19} batch {batch:<3} LoadGen {lg:8.2f}/s {row['loadgen_runs']}  "
          f"loop {loop:8.2f}/s {row['loop_runs']}  ratio {lg / loop:.3f}  "
          f"per CPU-s: {row['loadgen_samples_per_cpu_s']} vs {row['loop_samples_per_cpu_s']} "
          f"({row['cpu_ratio']:.3f})", file=sys.stderr)
    return row


class TinySamples:
    """Synthetic preprocessed samples: the null backend measures the harness, not memory copies."""

    def __init__(self, n: int, shape: tuple[int, ...]):
        self.names = [f"s{i}" for i in range(n)]
        self.labels = np.zeros(n, dtype=np.int64)
        self._x = np.zeros((n, *shape), dtype=np.float32)

    def __len__(self):
        return len(self.names)

    def images(self, indices):
        return self._x[np.asarray(indices, dtype=np.int64)]


def null_model(shape) -> PreparedModel:
    return PreparedModel(name="null", onnx_path=Path("none.onnx"), input_name="input",
                         input_shape=tuple(shape), num_classes=1000, label_offset=0,
                         preprocess=PreprocessSpec(), random_weights=False, output_name="logits")


def null_run(out_dir: Path, shape, **overrides) -> dict:
    s = settings(out_dir, **{"run.batch_size": 64, **overrides})
    model = null_model(shape)
    backend = create_backend("null")
    backend.load(model, s["run"]["batch_size"])
    return session.run(s, progress=False, model=model, dataset=TinySamples(1024, shape), backend=backend)


def null_backend(out_dir: Path, seconds: float, qps_ladder: list[float]) -> dict:
    shape = (3, 8, 8)
    offline = null_run(out_dir, shape, **{"offline.target_qps": 1e6,
                                          "offline.min_duration_ms": int(seconds * 1000)})
    offline_224 = null_run(out_dir, (3, 224, 224), **{"offline.target_qps": 2e4,
                                                      "offline.min_duration_ms": int(seconds * 1000)})
    print(f"  null Offline: {offline['loadgen']['samples_per_s']:,.0f} samples/s ({shape} inputs), "
          f"{offline_224['loadgen']['samples_per_s']:,.0f} with 3x224x224 inputs", file=sys.stderr)
    best, tried, misses = 0.0, [], 0
    for qps in qps_ladder:
        r = null_run(out_dir, shape, **{"run.scenario": "server", "server.target_qps": qps,
                                        "server.target_latency_ms": 15.0,
                                        "server.min_duration_ms": int(seconds * 1000),
                                        "server.min_query_count": 1})
        lg = r["loadgen"]
        p99 = lg["latency_ns"].get("99.00", float("inf"))
        ok = lg["valid"] and p99 <= 15e6
        tried.append({"target_qps": qps, "valid": ok, "p99_ms": round(p99 / 1e6, 3)})
        print(f"  null Server {qps:>9,.0f} QPS: {'VALID' if ok else 'INVALID'} p99 {p99 / 1e6:.2f} ms",
              file=sys.stderr)
        if ok:
            best, misses = max(best, qps), 0
        else:
            misses += 1
            if misses == 2:  # one miss may be a neighbour's job; two in a row is the limit
                break
    return {"offline_samples_per_s": round(offline["loadgen"]["samples_per_s"], 1),
            "server_valid_qps": best,
            "input_shape": list(shape),
            "offline_samples_per_s_3x224x224": round(offline_224["loadgen"]["samples_per_s"], 1),
            "server_ladder": tried,
            "batch": 64, "min_duration_s": seconds}


def accuracy(out_dir: Path) -> dict | None:
    if not SAMPLE.is_dir():
        print(f"  {SAMPLE} not found: no accuracy row", file=sys.stderr)
        return None
    s = settings(out_dir, **{"run.model": "efficientnet-lite0", "run.dataset": str(SAMPLE),
                             "run.mode": "accuracy", "run.backend": "onnxruntime",
                             "run.batch_size": 16})
    report = session.run(s, progress=True)
    acc = report["accuracy"]
    print(f"  efficientnet-lite0 fp32 top-1 {acc['top1'] * 100:.2f} % top-5 {acc['top5'] * 100:.2f} % "
          f"on {acc['n']} images", file=sys.stderr)
    return {"model": "efficientnet-lite0", "fp32_top1": round(acc["top1"], 4),
            "fp32_top5": round(acc["top5"], 4), "n_images": acc["n"],
            "dataset": "../shared/data/imagenet-sample"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "harness_cpu.json"))
    p.add_argument("--seconds", type=float, default=6.0, help="per measurement (default 6)")
    p.add_argument("--rounds", type=int, default=4, help="loop/LoadGen alternations per row (default 3)")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--quick", action="store_true", help="2 s measurements, batch 8 only (a smoke test)")
    args = p.parse_args(argv)
    seconds = 2.0 if args.quick else args.seconds
    batches = [8] if args.quick else [int(b) for b in args.batches.split(",")]
    data = str(SAMPLE) if SAMPLE.is_dir() else "demo"
    data_label = "../shared/data/imagenet-sample" if SAMPLE.is_dir() else "demo"
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="trtfuse-bench-") as tmp:
        out_dir = Path(tmp)
        rows = []
        for name in ("resnet50", "efficientnet-lite0"):
            model = session.resolve_model(name)
            dataset = open_dataset(data, model.preprocess, count=64)
            for batch in batches:
                rows.append(model_row(name, batch, dataset, out_dir, seconds, args.rounds))
        null = null_backend(out_dir, min(seconds, 5.0),
                            [float(q) for q in range(60_000, 200_001, 20_000)])
        acc = accuracy(out_dir)
    result = {"backend": "onnxruntime", "machine": machine(),
              "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
              "data": data_label + " (first 64 images)", "seconds_per_measurement": seconds,
              "method": ("rows: best of the rounds for each side, loop and LoadGen alternating; "
                         "cpu_ratio: samples per CPU-second of the whole process, LoadGen over loop"),
              "rows": rows, "null_backend": null, "accuracy": acc}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))
    return 0


def table(r: dict) -> str:
    lines = [f"machine: {r['machine']}", "",
             f"{'model':<20}{'batch':>6}{'LoadGen/s':>12}{'loop/s':>12}{'ratio':>8}{'CPU-s ratio':>13}"]
    for row in r["rows"]:
        lines.append(f"{row['model']:<20}{row['batch']:>6}{row['loadgen_samples_per_s']:>12.2f}"
                     f"{row['loop_samples_per_s']:>12.2f}{row['ratio']:>8.3f}{row['cpu_ratio']:>13.3f}")
    n = r["null_backend"]
    lines += ["", (f"null backend Offline: {n['offline_samples_per_s']:,.0f} samples/s "
                   f"(inputs {n['input_shape']}); {n['offline_samples_per_s_3x224x224']:,.0f} with 3x224x224"),
              f"null backend Server:  highest VALID target {n['server_valid_qps']:,.0f} QPS (p99 <= 15 ms)"]
    if r["accuracy"]:
        a = r["accuracy"]
        lines.append(f"EfficientNet-Lite0 fp32 top-1: {a['fp32_top1'] * 100:.2f} % on {a['n_images']} images")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
