"""ResNet-50 on every GPU of one machine, one lane per GPU (`--devices`): the engine alone on each GPU,
then LoadGen Offline (and, with --server-tries, the Server QPS search) on 1, 2, 4 ... N GPUs, all in
one process and one run per count. A thin caller of the harness; ResNet-50 with random weights
(performance only), the int8 plugin engine built from tools/device_bundle.py's model; the samples are
synthetic int8 images (performance runs read no labels), so no image part of the bundle is needed.

    python3.10 benchmarks/multigpu.py run [--server-tries N]      # GPU machine with several GPUs
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
sys.path.insert(0, str(REPO / "benchmarks"))
from device_bundle import STASH, log  # noqa: E402
from bench_runs import loadgen_row, server_search  # noqa: E402
from resnet50_e2e import Results  # noqa: E402


class SyntheticInt8:
    """``count`` random int8 images (a fixed seed): what a performance run needs of a dataset."""

    def __init__(self, shape, count: int = 1024, seed: int = 0):
        self._images = np.random.default_rng(seed).integers(-128, 128, (count, *shape), dtype=np.int8)
        self.names = [f"synthetic_{i}" for i in range(count)]
        self.labels = np.zeros(count, np.int64)

    def __len__(self) -> int:
        return len(self.names)

    def images(self, indices) -> np.ndarray:
        return self._images[np.asarray(indices)]


def gpu_counts(n: int) -> list[int]:
    """1, 2, 4, ... up to n, and n itself."""
    counts, k = [], 1
    while k < n:
        counts.append(k)
        k *= 2
    return counts + [n]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("run", help="device: measure")
    c.add_argument("--bundle", type=Path, default=STASH)
    c.add_argument("--out", type=Path, default=Path("/tmp/trtfuse-e2e/results/multigpu.json"))
    c.add_argument("--batch", type=int, default=2048)
    c.add_argument("--server-batch", type=int, default=256)
    c.add_argument("--server-tries", type=int, default=0, help="Server runs per GPU count (0: Offline only)")
    c.add_argument("--seconds", type=float, default=5.0, help="engine-only timing per GPU")
    args = p.parse_args(argv)

    import tensorrt as trt
    from trtfuse import cuda_runtime
    from trtfuse.backends import create_backend
    from trtfuse.engine import BuildConfig, build_engine
    from trtfuse.models import load_prepared

    res = Results(args.out)
    n = cuda_runtime.device_count()
    res.data.update(gpu=cuda_runtime.device_name(), gpus=n, trt_version=trt.__version__,
                    note="ResNet-50 with random weights: performance only; synthetic int8 samples")
    model_dir = args.bundle / "models" / "resnet50"
    model = load_prepared(model_dir)
    data = SyntheticInt8(model.input_shape)

    def engine(batch: int) -> Path:
        return build_engine(model_dir, BuildConfig(precision="int8", plugins=True, batch=batch,
                                                   input_format="int8", profiles=2))

    def backend_on(k: int, batch: int):
        backend = create_backend("tensorrt", engine=str(engine(batch)), plugins=True, streams=2,
                                 devices=",".join(str(d) for d in range(k)))
        backend.load(model, batch)
        return backend

    def loadgen(backend, scenario: str, batch: int, qps: float, name: str) -> dict:
        return loadgen_row(backend, model, data, scenario, batch, qps, args.out.parent / "multigpu-runs", name)

    def measure():
        rows = res.data["runs"] = []
        for k in gpu_counts(n):
            backend = backend_on(k, args.batch)
            try:
                lanes = getattr(backend, "lanes", [backend])
                per_gpu = [round(lane.engine_throughput(args.batch, args.seconds), 1) for lane in lanes]
                offline = loadgen(backend, "offline", args.batch, 1.1 * sum(per_gpu), f"offline-{k}gpu")
            finally:
                backend.close()
            row = {"devices": k, "engine_samples_per_s_per_gpu": round(sum(per_gpu) / k, 1),
                   "engine_samples_per_s_each": per_gpu, "offline_samples_per_s": offline["samples_per_s"],
                   "offline_valid": offline["valid"], "offline_lanes": offline["lanes"],
                   "server_qps": None, "p99_ms": None, "valid": None}
            rows.append(row)
            res.save()
            if args.server_tries:
                def run_at(qps, k=k):
                    b = backend_on(k, args.server_batch)
                    try:
                        return loadgen(b, "server", args.server_batch, qps, f"server-{k}gpu")
                    finally:
                        b.close()

                found = server_search(run_at, 0.85 * (offline["samples_per_s"] or 1e4), args.server_tries, res.save)
                row.update(server_qps=found["qps"], p99_ms=found["p99_ms"], valid=found["valid"],
                           server_tries=found["tries"])
        one = rows[0]
        for row in rows[1:]:
            k = row["devices"]
            if one["offline_samples_per_s"] and row["offline_samples_per_s"]:
                row["offline_scaling"] = round(row["offline_samples_per_s"] / (k * one["offline_samples_per_s"]), 4)
            if one.get("server_qps") and row.get("server_qps"):
                row["server_scaling"] = round(row["server_qps"] / (k * one["server_qps"]), 4)

    res.stage("measure", measure, ["measure"])
    log(f"wrote {args.out}; errors: {res.data['errors'] or 'none'}")
    return 0 if not res.data["errors"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
