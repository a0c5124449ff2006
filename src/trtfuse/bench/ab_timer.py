"""The one timer of `trtfuse bench ab`: a worker process that loads ONE side's plugin library and engines and times them
on request, so that two commits' engines are timed by the same code and only the code that built them differs.

Standalone on purpose: it imports TensorRT, cuda-python and numpy, never ``trtfuse`` (either side's package would
carry its own helpers into the timing), and it runs as a file (``python3.10 PATH/ab_timer.py``). The two sides run in
two such processes, because their plugin libraries register the same plugin names.

Protocol: one JSON object a line on stdin, one answer a line on the process's original stdout (TensorRT's and the
plugin's own prints go to stderr):

    {"cmd": "load", "lib": PATH, "engines": {KEY: {"path": PATH, "batch": N}}}
        -> {"ok": true, "gpu": NAME, "trt": VERSION, "engines": {KEY: {"io": [...], "device_memory": BYTES}}}
    {"cmd": "time", "key": KEY, "iters": N, "reps": R, "warmup": W}
        -> {"ok": true, "ms": [R times: one inference's ms, the mean of N back-to-back enqueues between CUDA events]}
    {"cmd": "profile", "key": KEY, "runs": N}
        -> {"ok": true, "layers": {LAYER: median ms over the N runs}, "total_ms": median of the runs' sums}
    {"cmd": "quit"}
A failing command answers {"ok": false, "error": "..."} and the worker goes on.
"""

from __future__ import annotations

import json
import os
import sys


def median(values) -> float:
    v = sorted(float(x) for x in values)
    if not v:
        raise ValueError("median of nothing")
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2


def layer_medians(runs: list[dict[str, float]]) -> tuple[dict[str, float], float]:
    """Per-layer median over profiled runs (a layer missing from a run counts as absent there), and the median of
    the runs' totals."""
    names = dict.fromkeys(n for r in runs for n in r)
    layers = {n: median([r[n] for r in runs if n in r]) for n in names}
    return layers, median([sum(r.values()) for r in runs])


# ----------------------------------------------------------------------------- GPU side (imported when loading)
class _Cuda:
    def __init__(self):
        try:
            from cuda.bindings import runtime as cudart  # cuda-python >= 12.6
        except ImportError:  # older cuda-python
            from cuda import cudart
        self.rt = cudart

    def ck(self, result):
        err, *rest = result if isinstance(result, tuple) else (result,)
        if int(err) != 0:
            raise RuntimeError(f"CUDA error {err}")
        return rest[0] if len(rest) == 1 else (tuple(rest) if rest else None)


class Worker:
    def __init__(self):
        self.engines = {}
        self.keep = []  # device buffers, runtime: alive as long as the engines

    def load(self, lib: str, engines: dict) -> dict:
        import ctypes

        import numpy as np
        import tensorrt as trt

        self.trt, self.np, self.cuda = trt, np, _Cuda()
        rt, ck = self.cuda.rt, self.cuda.ck
        logger = trt.Logger(trt.Logger.WARNING)
        ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)  # its plugin creators register with TensorRT's registry
        runtime = trt.Runtime(logger)
        self.keep.append(runtime)
        self.stream = ck(rt.cudaStreamCreate())
        info = {}
        for key, e in engines.items():
            with open(e["path"], "rb") as f:
                engine = runtime.deserialize_cuda_engine(f.read())
            if engine is None:
                raise RuntimeError(f"TensorRT could not deserialize {e['path']} (plugin library {lib})")
            ctx, rows = self._context(engine, int(e["batch"]))
            self.engines[key] = {"engine": engine, "batch": int(e["batch"]), "ctx": ctx, "profiled": False}
            info[key] = {"io": rows, "device_memory": int(getattr(engine, "device_memory_size", 0))}
        prop = ck(rt.cudaGetDeviceProperties(0))
        gpu = prop.name.decode(errors="replace").rstrip("\0") if isinstance(prop.name, bytes) else str(prop.name)
        return {"gpu": gpu, "trt": trt.__version__, "engines": info}

    def _context(self, engine, batch: int):
        """An execution context at ``batch`` with its own device buffers: every input byte 1 (as the e2e suite's
        engine-alone figure), outputs zeroed."""
        trt, np, rt, ck = self.trt, self.np, self.cuda.rt, self.cuda.ck
        ctx = engine.create_execution_context()
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        inputs = {n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT}
        for name in inputs:
            shape = list(engine.get_tensor_profile_shape(name, 0)[2])
            ctx.set_input_shape(name, (batch, *shape[1:]))
        rows = []
        for name in names:
            shape = list(ctx.get_tensor_shape(name))
            try:  # a vectorized format pads its vector dimension
                comps, vdim = engine.get_tensor_components_per_element(name), engine.get_tensor_vectorized_dim(name)
            except AttributeError:
                comps, vdim = 1, -1
            if comps > 1 and 0 <= vdim < len(shape):
                shape[vdim] = -(-shape[vdim] // comps) * comps
            nbytes = max(int(np.prod(shape)) * np.dtype(trt.nptype(engine.get_tensor_dtype(name))).itemsize, 1)
            ptr = int(ck(rt.cudaMalloc(nbytes)))
            self.keep.append(ptr)
            ck(rt.cudaMemset(ptr, 1 if name in inputs else 0, nbytes))
            ctx.set_tensor_address(name, ptr)
            rows.append({"name": name, "input": name in inputs, "shape": shape,
                         "dtype": str(engine.get_tensor_dtype(name))})
        return ctx, rows

    def _enqueue(self, ctx):
        if not ctx.execute_async_v3(int(self.stream)):
            raise RuntimeError("TensorRT execute_async_v3 failed")

    def _own_context(self, key: str, profiled: bool):
        """The engine's one context, made anew when the use changes: a context that carries a profiler keeps it,
        and the engine's one optimization profile serves one context at a time (TensorRT 8.5 refuses to enqueue
        a second context, which has none)."""
        e = self.engines[key]
        if e["profiled"] != profiled:
            e["ctx"] = None  # releases the profile before the next context takes it
            e["ctx"], _ = self._context(e["engine"], e["batch"])
            e["profiled"] = profiled
        return e["ctx"]

    def time(self, key: str, iters: int, reps: int, warmup: int = 3) -> dict:
        rt, ck = self.cuda.rt, self.cuda.ck
        ctx = self._own_context(key, profiled=False)
        for _ in range(warmup):
            self._enqueue(ctx)
        ck(rt.cudaStreamSynchronize(self.stream))
        events = [(ck(rt.cudaEventCreate()), ck(rt.cudaEventCreate())) for _ in range(reps)]
        for a, b in events:
            ck(rt.cudaEventRecord(a, self.stream))
            for _ in range(iters):
                self._enqueue(ctx)
            ck(rt.cudaEventRecord(b, self.stream))
        ck(rt.cudaStreamSynchronize(self.stream))
        ms = [ck(rt.cudaEventElapsedTime(a, b)) / iters for a, b in events]
        for a, b in events:
            ck(rt.cudaEventDestroy(a))
            ck(rt.cudaEventDestroy(b))
        return {"ms": ms}

    def profile(self, key: str, runs: int) -> dict:
        trt, rt, ck = self.trt, self.cuda.rt, self.cuda.ck
        prof = self._own_context(key, profiled=True)

        class Profiler(trt.IProfiler):
            def __init__(self):
                trt.IProfiler.__init__(self)
                self.ms = {}

            def report_layer_time(self, layer_name, ms):
                self.ms[layer_name] = self.ms.get(layer_name, 0.0) + ms

        for _ in range(2):  # warm-up, unprofiled
            self._enqueue(prof)
        ck(rt.cudaStreamSynchronize(self.stream))
        profiler = Profiler()
        prof.profiler = profiler
        per_run = []
        for _ in range(runs):
            profiler.ms = {}
            self._enqueue(prof)
            ck(rt.cudaStreamSynchronize(self.stream))
            per_run.append(dict(profiler.ms))
        layers, total = layer_medians(per_run)
        return {"layers": layers, "total_ms": total}


def serve(lines, answer, worker) -> None:
    """The command loop: each line of ``lines`` one command, each answer through ``answer(dict)``."""
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            cmd = json.loads(line)
            op = cmd.get("cmd")
            if op == "quit":
                answer({"ok": True})
                return
            if op == "load":
                out = worker.load(cmd["lib"], cmd["engines"])
            elif op == "time":
                out = worker.time(cmd["key"], int(cmd["iters"]), int(cmd["reps"]), int(cmd.get("warmup", 3)))
            elif op == "profile":
                out = worker.profile(cmd["key"], int(cmd["runs"]))
            else:
                raise ValueError(f"unknown command {op!r}")
            answer({"ok": True, **out})
        except Exception as e:  # noqa: BLE001 - answer it; the driver decides
            answer({"ok": False, "error": f"{type(e).__name__}: {e}"})


def main() -> int:
    # Run as a file, its own folder heads sys.path, and trtfuse/bench/cuda.py there would shadow cuda-python.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    # The answers keep the original stdout; everything else written to fd 1 (TensorRT's logger, the plugin's
    # prints) goes to stderr, so that no foreign line lands in the protocol.
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def answer(obj):
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    serve(sys.stdin, answer, Worker())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
