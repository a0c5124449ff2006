"""Server latency against Python's GIL switch interval, on the GPU machine: the same ResNet-50 int8
plugin engine (batch 256) through the harness's TensorRT backend, LoadGen Server at fixed targets,
each switch interval in turn and the rounds interleaved, so that a drift of the machine shows as a
spread within one interval, not as a difference between them. ResNet-50 has random weights:
performance only. Found (server_switch_interval_h100.json): no difference; Python's default stays.

Why: on some H100 machines every Server run missed MLPerf's 15 ms p99 even at 14k QPS (p50 1.7 ms,
p99 19-58 ms) with no garbage collection, no CPU quota and little steal during the runs (report.json's
harness.stalls). Each CUDA call gives the GIL up and takes it back; a thread coming back waits for
the holder to let go, up to the switch interval (5 ms by default) each time, several times a batch.

    python3.10 benchmarks/experiments/server_switch_interval.py [--intervals-ms 5,1,0.2] [--targets 14000,30000]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from trtfuse.bench.bundle import STASH, BundleImages, log
from trtfuse.bench.runs import BOUND_MS, loadgen_row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", type=Path, default=STASH)
    p.add_argument("--out", type=Path, default=Path("/tmp/trtfuse-results/server_switch_interval_h100.json"))
    p.add_argument("--intervals-ms", default="5,1,0.2")
    p.add_argument("--targets", default="14000,30000", help="Server target QPS values")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--offline-between", action="store_true",
                   help="between round 0 and round 1, a LoadGen Offline run of the batch-2048 engine in this process "
                        "(as `trtfuse bench triton`'s direct stage runs before its Server search)")
    args = p.parse_args(argv)

    import tensorrt as trt
    from trtfuse import cuda_runtime
    from trtfuse.backends.tensorrt_backend import TensorRTBackend
    from trtfuse.engine import BuildConfig, build_engine
    from trtfuse.models import load_prepared

    model_dir = args.bundle / "models" / "resnet50"
    model, data = load_prepared(model_dir), BundleImages(args.bundle)
    engine = build_engine(model_dir, BuildConfig(precision="int8", plugins=True, batch=args.batch,
                                                 input_format="int8", profiles=2))
    backend = TensorRTBackend(engine=str(engine), plugins=True, streams=2)
    backend.load(model, args.batch)
    result = {"gpu": cuda_runtime.device_name(), "trt_version": trt.__version__, "batch": args.batch,
              "bound_ms": BOUND_MS, "note": "ResNet-50 with random weights: performance only",
              "how": __doc__.split("\n\n")[0], "runs": []}
    try:
        for round_ in range(args.rounds):
            if round_ == 1 and args.offline_between:
                offline = TensorRTBackend(engine=str(build_engine(model_dir, BuildConfig(
                    precision="int8", plugins=True, batch=2048, input_format="int8", profiles=2))), plugins=True, streams=2)
                offline.load(model, 2048)
                try:
                    row = loadgen_row(offline, model, data, "offline", 2048, 75000.0, args.out.parent / "switch-runs",
                                      "offline-between")
                finally:
                    offline.close()
                result["runs"].append({"round": "between", "offline_samples_per_s": row["samples_per_s"],
                                       "valid": row["valid"]})
            for target in [float(t) for t in args.targets.split(",")]:
                for interval in [float(i) for i in args.intervals_ms.split(",")]:
                    default = sys.getswitchinterval()
                    sys.setswitchinterval(interval / 1e3)  # the run is in this process: its threads use it
                    try:
                        row = loadgen_row(backend, model, data, "server", args.batch, target,
                                          args.out.parent / "switch-runs", f"switch-{interval}")
                    finally:
                        sys.setswitchinterval(default)
                    result["runs"].append({"round": round_, "target_qps": target, "switch_interval_ms": interval,
                                           **{k: row[k] for k in ("valid", "p50_ms", "p99_ms", "mean_batch",
                                                                  "cpu_per_wall", "stalls")}})
                    args.out.write_text(json.dumps(result, indent=1) + "\n")
    finally:
        backend.close()
    for r in result["runs"]:
        if r["round"] == "between":
            log(f"Offline in between: {r['offline_samples_per_s']} samples/s")
            continue
        log(f"target {r['target_qps']:>8,.0f}  interval {r['switch_interval_ms']:>4} ms  p50 {r['p50_ms']:6.2f}  "
            f"p99 {r['p99_ms']:7.2f}  {'VALID' if r['valid'] else 'INVALID'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
