"""Where the serving path's time goes, without LoadGen: host->device row copies and the backend loop.

GPU machine, after the e2e suite's bundle is stashed (its engines are built or cached):
    python3.10 -m trtfuse bench probe --out /tmp/trtfuse-results/serving_probe.json

1. Copies: a batch of random store rows to the device as one cudaMemcpyBatchAsync, as one
   cudaMemcpyAsync per row, and the same bytes as one contiguous copy (the PCIe rate to compare with).
2. The backend loop: T threads calling ``infer_rows`` on random rows of a pinned store, as the
   SUT's workers do, for a few seconds: samples/s against engine-only throughput, and one thread's
   host time per batch split into phases (row copy call, engine launch, wait, output copy); with the
   streams' engine runs overlapping and serialised (serial_compute).
3. A check: infer_rows gives exactly what infer gives on the same samples (rows_match_infer).
LoadGen Offline/Server numbers divided by these say how much LoadGen's callbacks and the SUT cost.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import numpy as np

from trtfuse.bench.e2e import BundleImages, _backend, log


def copy_rates(cr, store: np.ndarray, n: int, reps: int = 10) -> dict:
    rng = np.random.default_rng(0)
    row_bytes = store.strides[0]
    dev = cr.DeviceBuffer(n * row_bytes)
    stream = cr.Stream()
    start, stop = cr.Event(timing=True), cr.Event(timing=True)
    out = {}
    try:
        def timed(fn):
            fn()
            stream.synchronize()
            start.record(stream)
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            host_ms = (time.perf_counter() - t0) * 1e3 / reps
            stop.record(stream)
            stop.synchronize()
            gpu_ms = stop.elapsed_ms(start) / reps
            return {"gbps": round(n * row_bytes / gpu_ms / 1e6, 2), "ms": round(gpu_ms, 3),
                    "host_call_ms": round(host_ms, 3)}

        rows = rng.integers(0, len(store), n)
        srcs = store.ctypes.data + rows * row_bytes
        if cr._batch_copy.usable():
            out["batched_rows"] = timed(lambda: cr.copy_rows_htod_async(dev, srcs, row_bytes, stream))
        usable = cr._batch_copy._usable
        cr._batch_copy._usable = False
        out["per_row"] = timed(lambda: cr.copy_rows_htod_async(dev, srcs, row_bytes, stream))
        cr._batch_copy._usable = usable
        contiguous = store.ctypes.data + np.arange(n) % len(store) * row_bytes
        if n <= len(store):
            out["contiguous"] = timed(lambda: cr.copy_rows_htod_async(dev, contiguous, row_bytes, stream))
    finally:
        stream.destroy()
        dev.free()
    return out


def backend_loop(backend, store: np.ndarray, batch: int, threads: int, seconds: float, top: bool = False) -> dict:
    """Samples/s of ``threads`` threads each calling infer_rows on random rows (``top``: classify_rows, the
    SUT's call, the engine's TopK answers coming back instead of the scores)."""
    counts = [0] * threads
    stop = time.perf_counter() + seconds
    call = backend.classify_rows if top else backend.infer_rows

    def work(k):
        rng = np.random.default_rng(k)
        while time.perf_counter() < stop:
            call(store, rng.integers(0, len(store), batch))
            counts[k] += batch

    ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return {"threads": threads, "batch": batch, "samples_per_s": round(sum(counts) / (time.perf_counter() - t0), 1)}


def phases(backend, store: np.ndarray, batch: int, reps: int = 20) -> dict:
    """One thread, one slot: host ms per batch in each phase of infer_rows (after a warm-up)."""
    cr = backend.cr
    slot = backend.slots[0]
    rng = np.random.default_rng(1)
    row_bytes = store.strides[0]
    acc = {"row_copy_call": 0.0, "launch": 0.0, "wait": 0.0, "output": 0.0}
    for i in range(reps + 2):
        rows = rng.integers(0, len(store), batch)
        t0 = time.perf_counter()
        cr.copy_rows_htod_async(slot.dev_in, store.ctypes.data + rows * row_bytes, row_bytes, slot.stream)
        t1 = time.perf_counter()
        slot.enqueue(backend._bucket(batch), backend.cuda_graphs)
        cr.copy_dtoh_async(slot.host_out, slot.dev_out, slot.host_out.array[:batch].nbytes, slot.stream)
        t2 = time.perf_counter()
        slot.stream.synchronize()
        t3 = time.perf_counter()
        slot.host_out.array[:batch].reshape(batch, -1).astype(np.float32, copy=True)
        t4 = time.perf_counter()
        if i >= 2:
            for k, v in zip(acc, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                acc[k] += v
    return {k: round(v * 1e3 / reps, 3) for k, v in acc.items()}


def rows_match_infer(backend, store: np.ndarray, samples: np.ndarray, batch: int) -> bool:
    """infer_rows on store rows (a repeat, a run, ragged sizes) == infer on the same samples gathered."""
    rng = np.random.default_rng(2)
    for n in (batch, batch // 2 + 3, 1):
        rows = rng.integers(0, len(store), n)
        rows[:2] = rows[0]
        if not np.array_equal(backend.infer_rows(store, rows), backend.infer(samples[rows])):
            return False
    return True


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", type=Path, default=Path("/tmp/trtfuse-e2e"))
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--batches", default="256,2048")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--store", type=int, default=2048, help="samples in the pinned store")
    args = p.parse_args(argv)
    data = BundleImages(args.bundle)
    result = {"store_samples": args.store, "rows": []}
    for b in (int(x) for x in args.batches.split(",")):
        for serial in (False, True):
            backend, _ = _backend(args.bundle, "resnet50", b, True, serial_compute=serial)
            try:
                samples = backend.to_input(data.images(np.arange(args.store) % len(data)))
                store = backend.host_array(samples.shape, samples.dtype)
                store[:] = samples
                row = {"batch": b, "serial_compute": serial,
                       "rows_match_infer": rows_match_infer(backend, store, samples, b),
                       "engine_only": round(backend.engine_throughput(b, 3.0), 1),
                       "loops": [backend_loop(backend, store, b, int(t), args.seconds)
                                 for t in args.threads.split(",")]}
                if not serial:
                    row.update(copies=copy_rates(backend.cr, store, b), phases_ms=phases(backend, store, b))
            finally:
                backend.close()
            result["rows"].append(row)
            log(f"probe batch {b}: {json.dumps(row)}")
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
