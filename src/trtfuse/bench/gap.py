"""Where an Offline batch loses time against the engine alone: the input's data, the copies, the run order.

A LoadGen Offline run of ResNet-50 (``--plugins all``, batch 2048, 3 streams) spends about 1.8 % longer per
engine run than the engine-alone figure it is compared with (docs/int8_pipeline.md, "Where an Offline run
loses to the engine alone"). The engine-alone figure differs from the Offline path three ways: its input is
every byte 1, not images; no copy runs beside it; the streams' runs overlap, where Offline orders them
(serial_compute). This script measures each step from one to the other on the same engine, in alternated
rounds (the GPU sits at its 700 W cap, so its clock drifts with what ran before), with the SM clock and
board power (and the active throttle reasons) sampled by nvidia-smi over each phase:

    ones_overlap    the engine alone as every record measured it (memset 1, all slots at once)
    images_overlap  the same with the bundle's real images in the input
    images_serial   real images, every run on one stream (the order Offline keeps)
    rows_serial     the SUT's path without LoadGen: 3 threads, classify_rows on random rows of a pinned
                    store of 1024 images (MLPerf's ResNet-50 performance sample count), runs ordered
    rows_overlap    the same with the runs free to overlap (serial_compute off)

GPU machine, after the e2e suite's bundle is stashed (the engine is built or taken from its cache):
    python3.10 -m trtfuse bench gap --out /tmp/trtfuse-results/offline_gap_h100.json
Weights are random: every figure is performance only.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
from pathlib import Path

import numpy as np

from trtfuse.bench.e2e import BundleImages, _backend, log
from trtfuse.bench.probe import backend_loop

PHASES = ("ones_overlap", "images_overlap", "images_serial", "rows_serial", "rows_overlap")
SMI_FIELDS = "timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active"


class PowerLog:
    """nvidia-smi sampling the SM clock, board power, temperature and throttle reasons every ``ms`` into a file."""

    def __init__(self, path: Path, ms: int = 200):
        self.path = path
        self._file = path.open("w")
        self._proc = subprocess.Popen(["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits",
                                       f"-lms={ms}"], stdout=self._file, stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        self._proc.terminate()
        self._proc.wait(timeout=10)
        self._file.close()

    def means(self, start: dt.datetime, end: dt.datetime) -> dict:
        """Mean SM MHz, W and deg C of the samples taken between ``start`` and ``end``, and the throttle
        reasons (nvidia-smi's bit masks) that were active in any of them."""
        rows = []
        for line in self.path.read_text().splitlines():
            parts = [p.strip() for p in line.split(",")]
            try:
                when = dt.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f")
                rows.append((when, float(parts[1]), float(parts[2]), float(parts[3]), parts[4:5]))
            except (ValueError, IndexError):
                continue  # a partial last line, or a field nvidia-smi could not read
        inside = [r for r in rows if start <= r[0] <= end]
        if not inside:
            return {"samples": 0}
        reasons = sorted({r[4][0] for r in inside if r[4]})
        return {"samples": len(inside), "sm_mhz": round(statistics.fmean(r[1] for r in inside)),
                "power_w": round(statistics.fmean(r[2] for r in inside), 1),
                "temp_c": round(statistics.fmean(r[3] for r in inside), 1),
                **({"throttle_reasons": reasons} if reasons else {})}


def summarize(rounds: list[dict]) -> dict:
    """Per phase: the median samples/s over the rounds, its ratio to ``ones_overlap``'s, and the mean SM clock and
    power over the rounds that had nvidia-smi samples (None where none had)."""
    def mean_of(rows, key, digits):
        values = [r[key] for r in rows if key in r]
        return round(statistics.fmean(values), digits) if values else None

    summary = {}
    for phase in PHASES:
        rows = [r for r in rounds if r["phase"] == phase]
        summary[phase] = {"samples_per_s": round(statistics.median(r["samples_per_s"] for r in rows), 1),
                          "sm_mhz": mean_of(rows, "sm_mhz", None), "power_w": mean_of(rows, "power_w", 1)}
    base = summary["ones_overlap"]["samples_per_s"]
    for s in summary.values():
        s["vs_ones_overlap"] = round(s["samples_per_s"] / base, 4)
    return summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", type=Path, default=Path("/tmp/trtfuse-e2e"))
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--plugins", default="all")
    p.add_argument("--streams", type=int, default=3, help="as the e2e suite's Offline (one profile each)")
    p.add_argument("--seconds", type=float, default=5.0, help="per phase")
    p.add_argument("--rounds", type=int, default=2, help="each round runs every phase; odd rounds in reverse")
    p.add_argument("--store", type=int, default=1024, help="images in the pinned store")
    args = p.parse_args(argv)

    data = BundleImages(args.bundle)
    images = data.images(np.arange(args.store) % len(data))
    backend, _ = _backend(args.bundle, "resnet50", args.batch, args.plugins, args.streams, serial_compute=True)
    power = PowerLog(args.out.with_suffix(".smi.csv"))
    method = __doc__.split("\n\nGPU machine")[0].split("\n\n", 1)[1]  # the paragraphs that say what is measured
    result = {"gpu": None, "batch": args.batch, "plugins": args.plugins, "streams": args.streams,
              "seconds_per_phase": args.seconds, "store_images": args.store, "weights": "random",
              "images": f"{len(data)} bundle images (int8), repeated", "method": method, "rounds": []}
    try:
        from trtfuse import cuda_runtime
        result["gpu"] = cuda_runtime.device_name(backend.device)
        samples = backend.to_input(images)
        store = backend.host_array(samples.shape, samples.dtype)
        store[:] = samples

        def rows_loop() -> float:  # the SUT's workers without LoadGen: one thread per stream
            return backend_loop(backend, store, args.batch, args.streams, args.seconds, top=True)["samples_per_s"]

        runs = {
            "ones_overlap": lambda: backend.engine_throughput(args.batch, args.seconds),
            "images_overlap": lambda: backend.engine_throughput(args.batch, args.seconds, images=samples),
            "images_serial": lambda: backend.engine_throughput(args.batch, args.seconds, images=samples, serial=True),
            "rows_serial": rows_loop,
            "rows_overlap": rows_loop,
        }
        for r in range(args.rounds):
            for phase in (PHASES if r % 2 == 0 else PHASES[::-1]):
                backend.serial_compute = phase != "rows_overlap"
                start = dt.datetime.now()
                sps = runs[phase]()
                row = {"round": r, "phase": phase, "samples_per_s": round(sps, 1),
                       "ms_per_batch": round(args.batch / sps * 1e3, 3), **power.means(start, dt.datetime.now())}
                result["rounds"].append(row)
                log(f"offline_gap {json.dumps(row)}")
    finally:
        power.stop()
        backend.close()
    result["summary"] = summary = summarize(result["rounds"])
    print(f"{'phase':16} {'samples/s':>10} {'vs ones':>8} {'SM MHz':>7} {'W':>6}")
    for phase, s in summary.items():
        print(f"{phase:16} {s['samples_per_s']:>10,.0f} {s['vs_ones_overlap']:>8.4f} {s['sm_mhz']!s:>7} {s['power_w']!s:>6}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
