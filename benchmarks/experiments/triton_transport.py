"""What a Triton server's path costs per sample, apart from any model: `trtfuse serve --backend null`
(the bundled tritonserver and its Python backend, a model that answers at once) driven by the harness's
`triton` backend, against the null backend called directly. Batches of real-sized images (int8 or
float 3x224x224) go through `classify_rows` from `inflight` threads for a few seconds each, over
plain gRPC and over system shared memory, with 1 and 2 model instances: samples/s and the pixel
bytes per second they carry. This measures the path alone, on any machine: 2-core CPU, shm 4.1-5.2k
samples/s of 600 kB since `serve` runs the model in Triton's own Python backend, against 2.8-3.1k
through PyTriton's proxy before (triton_transport_cpu.json). (On the GPU machine, transport cuda
leaves the host out of the pixels' way altogether: triton_h100.json.)

    python benchmarks/experiments/triton_transport.py [--seconds 4] [--out benchmarks/results/triton_transport_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]


def rate(backend, store: np.ndarray, batch: int, threads: int, seconds: float) -> float:
    """Samples/s of ``classify_rows`` on ``batch``-row slices of ``store`` from ``threads`` threads."""
    done = [0] * threads
    stop = time.perf_counter() + seconds

    def worker(i: int) -> None:
        rows = np.arange(batch) + (i * batch) % (len(store) - batch + 1)
        while time.perf_counter() < stop:
            backend.classify_rows(store, rows)
            done[i] += batch

    backend.classify_rows(store, np.arange(batch))  # first request: connection, shared memory, caches
    workers = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(done) / (time.perf_counter() - t0)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--inflight", type=int, default=2)
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "triton_transport_cpu.json")
    args = p.parse_args(argv)

    from trtfuse.backends import create_backend
    from trtfuse.session import resolve_model
    from trtfuse.triton.process import ServeProcess

    model = resolve_model("efficientnet-lite0")  # its I/O only: 3x224x224 in, 1000 classes out
    store = np.random.default_rng(0).standard_normal((4 * args.batch, *model.input_shape)).astype(np.float32)
    row_mb = store[0].nbytes / 1e6
    result = {"machine": f"{platform.node()} ({os.cpu_count()} cores)", "model_io": "efficientnet-lite0: FP32 3x224x224",
              "batch": args.batch, "inflight": args.inflight, "seconds_each": args.seconds, "how": __doc__.split("\n\n")[0],
              "runs": []}

    direct = create_backend("null")
    direct.load(model, args.batch)
    sps = rate(direct, store, args.batch, args.inflight, args.seconds)
    result["runs"].append({"path": "null backend, direct", "samples_per_s": round(sps), "pixel_gb_per_s": round(sps * row_mb / 1e3, 3)})
    print(result["runs"][-1], file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        for instances in (1, 2):
            with ServeProcess([model.name, "--backend", "null", "--batch-size", str(args.batch),
                               "--instances", str(instances)], Path(tmp) / f"serve-{instances}") as server:
                for transport in ("grpc", "shm"):
                    backend = create_backend("triton", url=server.url, transport=transport, inflight=args.inflight)
                    backend.load(model, args.batch)
                    try:
                        sps = rate(backend, store, args.batch, args.inflight, args.seconds)
                    finally:
                        backend.close()
                    result["runs"].append({"path": f"trtfuse serve --backend null, {instances} instance(s), {transport}",
                                           "triton_version": backend.server_version, "samples_per_s": round(sps),
                                           "pixel_gb_per_s": round(sps * row_mb / 1e3, 3)})
                    print(result["runs"][-1], file=sys.stderr)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
