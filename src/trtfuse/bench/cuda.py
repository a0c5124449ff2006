"""CUDA helpers of the benchmark scripts that time kernels and engines on device buffers (cuda-python, no torch):
error checks, device buffers, CUDA-event timing, the device copy bandwidth, and the LSB comparison of outputs."""

from __future__ import annotations

import numpy as np

try:
    from cuda.bindings import runtime as cudart  # cuda-python >= 12.6
except ImportError:  # older cuda-python
    from cuda import cudart

from trtfuse.ops import residual_conv_reference as ref


def ck(result):
    """cuda-python returns (err, values...): raise on error, return the values."""
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise RuntimeError(f"CUDA error {err}")
    return rest[0] if len(rest) == 1 else (tuple(rest) if rest else None)


class DeviceBuffer:
    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.ptr = int(ck(cudart.cudaMalloc(max(nbytes, 1))))

    def upload(self, a: np.ndarray):
        a = np.ascontiguousarray(a)
        assert a.nbytes == self.nbytes
        ck(
            cudart.cudaMemcpy(
                self.ptr, a.ctypes.data, a.nbytes, cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
            )
        )
        return self

    def download(self, like: np.ndarray) -> np.ndarray:
        out = np.empty_like(like)
        ck(
            cudart.cudaMemcpy(
                out.ctypes.data, self.ptr, out.nbytes, cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
            )
        )
        return out

    def fill(self, byte: int):
        ck(cudart.cudaMemset(self.ptr, byte, self.nbytes))

    def free(self):
        if self.ptr:
            ck(cudart.cudaFree(self.ptr))
            self.ptr = 0


def time_ms(fn, stream, reps: int, warmup: int = 10) -> float:
    """Median of `reps` CUDA-event-timed calls of fn(i) on `stream`, queued behind a spin (trtfuse.ops.gpu_timing):
    the GPU's time, also where a call costs the host more."""
    from trtfuse.ops.gpu_timing import queue_ahead, warm_up

    host = warm_up(fn, warmup)
    ck(cudart.cudaStreamSynchronize(stream))
    evs = [(ck(cudart.cudaEventCreate()), ck(cudart.cudaEventCreate())) for _ in range(reps)]
    queue_ahead(int(stream), reps, host)
    for i, (a, b) in enumerate(evs):
        ck(cudart.cudaEventRecord(a, stream))
        fn(i)
        ck(cudart.cudaEventRecord(b, stream))
    ck(cudart.cudaStreamSynchronize(stream))
    times = [ck(cudart.cudaEventElapsedTime(a, b)) for a, b in evs]
    for a, b in evs:
        ck(cudart.cudaEventDestroy(a))
        ck(cudart.cudaEventDestroy(b))
    return float(np.median(times))


def result_header(script: str, stream, with_trt: bool, **fields) -> dict:
    """What a layer benchmark's JSON starts with: the GPU, the host CPU, the script, the weights note, the copy
    bandwidth measured now, then `fields`; with TensorRT also its version and the plugin library (loaded here)."""
    prop = ck(cudart.cudaGetDeviceProperties(0))
    from trtfuse.sysinfo import cpu_model

    result = {"gpu": prop.name.decode() if isinstance(prop.name, bytes) else str(prop.name), "cpu_model": cpu_model(),
              "script": script,
              "weights": "random (performance only)", "copy_gbps": copy_gbps(stream), **fields}
    if with_trt:
        import tensorrt as trt
        from trtfuse.trt_graph import load_plugin_library

        result["trt_version"] = trt.__version__
        result["plugin_library"] = str(load_plugin_library())
    return result


def copy_gbps(stream, nbytes: int = 1 << 30) -> float:
    a, b = DeviceBuffer(nbytes), DeviceBuffer(nbytes)
    a.fill(7)
    kind = cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice
    ms = time_ms(
        lambda i: ck(cudart.cudaMemcpyAsync(b.ptr, a.ptr, nbytes, kind, stream)), stream, 30, 5
    )
    a.free()
    b.free()
    return 2 * nbytes / ms / 1e6


def compare(name: str, got: np.ndarray, want: np.ndarray, exact: bool, bound: int = 1) -> dict:
    """exact: every element equal; else none differs by more than `bound` LSB."""
    one, more = ref.count_lsb_diffs(got, want)
    max_diff = int(np.abs(got.astype(np.int16) - want.astype(np.int16)).max(initial=0))
    res = {
        "name": name,
        "elements": int(got.size),
        "diff_1lsb": one,
        "diff_more": more,
        "max_diff": max_diff,
        "bound": 0 if exact else bound,
        "ok": (one == 0 and more == 0) if exact else max_diff <= bound,
    }
    print(
        f"    {name}: {got.size} elements, {one} differ by 1 LSB, {more} by more (max {max_diff}, bound "
        f"{res['bound']}) -> {'ok' if res['ok'] else 'FAIL'}",
        flush=True,
    )
    return res


def layer_checks(outs: dict, idx: np.ndarray, want32: np.ndarray, want64: np.ndarray, ours: str,
                 rule: str = "rounding rule") -> list[dict]:
    """A layer benchmark's checks: every configuration of ours (and the plugin engine) bit-exact against ``rule`` on
    the images ``idx``; where TensorRT ran ("trt"), TensorRT within 1 LSB of the float64 formula, and ``ours`` within
    1 LSB of TensorRT on all images."""
    checks = [compare(f"ours {cfg} vs {rule} (exact)", got[idx], want32, exact=True)
              for cfg, got in outs.items() if cfg != "trt"]
    if "trt" in outs:
        checks += [compare("TensorRT vs float64 formula", outs["trt"][idx], want64, exact=False),
                   compare("ours vs TensorRT (all images)", outs[ours], outs["trt"], exact=False)]
    return checks

