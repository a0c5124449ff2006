"""LayerNorm on the GPU: ours (C ABI) and torch.nn.functional.layer_norm side by side, in one run.

    python3 -m trtfuse.bench.layernorm --json OUT.json [--explore] [--rows 49152]
    python3 -m trtfuse.bench.layernorm --sanitize      # small checked launches of every path, for
                                                          # compute-sanitizer memcheck / racecheck

Timing: each implementation's launches are captured in a CUDA graph (host launch cost out of the
numbers), cycling over enough input/output buffer sets that a launch never finds its data in L2 from
the previous one; the graph is replayed `--reps` times between CUDA events and the median per launch is
kept. GB/s = (bytes of x read + bytes of y written) / time; gamma/beta (2 * cols floats) are left out.
Device-copy bandwidth (a 1 GiB device-to-device copy, read + write) is measured in the same run.
Inputs are random (never zeros). Ours takes float32 gamma/beta (its interface); torch takes them in x's
dtype (its native form for this call).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from trtfuse.ops import layernorm as ln

COLS = [32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 4096, 8192, 16384, 32768]
FP32_MAX_COLS = 16384
TDTYPE = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
L2_CHURN_BYTES = 160 << 20  # > 3x the H100's 50 MB L2


def time_graph(fn_for_set, n_sets: int, calls: int, reps: int) -> float:
    """Median seconds per call of fn_for_set(i) (i cycling over n_sets), from graph replays."""
    fn_for_set(0)  # warm-up outside capture: module load, first-call host work
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(n_sets):  # warm the side stream too, as torch recommends before capture
            fn_for_set(i)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        for i in range(calls):
            fn_for_set(i % n_sets)
    g.replay()
    torch.cuda.synchronize()
    times = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(reps):
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / calls)
    del g
    return statistics.median(times)


def copy_gbps(reps: int = 20) -> float:
    n = 1 << 30
    a = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    torch.cuda.synchronize()
    times = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(reps):
        start.record()
        b.copy_(a)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del a, b
    torch.cuda.empty_cache()
    return 2 * n / statistics.median(times) / 1e9


class Cell:
    """Buffers for one (dtype, rows, cols) measurement."""

    def __init__(self, dtype: str, rows: int, cols: int):
        self.dtype, self.rows, self.cols = dtype, rows, cols
        td = TDTYPE[dtype]
        self.bytes = 2 * rows * cols * torch.tensor([], dtype=td).element_size()
        self.n_sets = max(1, min(16, math.ceil(L2_CHURN_BYTES / self.bytes)))
        self.xs = [self._random((rows, cols), td) for _ in range(self.n_sets)]
        self.ys = [torch.empty_like(x) for x in self.xs]
        self.gamma = torch.rand(cols, device="cuda") + 0.5
        self.beta = torch.randn(cols, device="cuda")
        self.gamma_t, self.beta_t = self.gamma.to(td), self.beta.to(td)
        self.calls = max(20, self.n_sets)

    @staticmethod
    def _random(shape, td):
        return (torch.randn(*shape, device="cuda", dtype=torch.float32) * 2 + 0.5).to(td)

    def ours(self, algo="auto", tune=0):
        lib = ln.load_library()
        dt, rows, cols = self.dtype, self.rows, self.cols
        g, b = self.gamma.data_ptr(), self.beta.data_ptr()

        def call(i):
            ln.layernorm_raw(
                dt,
                rows,
                cols,
                self.xs[i].data_ptr(),
                self.ys[i].data_ptr(),
                gamma=g,
                beta=b,
                eps=1e-5,
                algo=algo,
                tune=tune,
                stream=torch.cuda.current_stream().cuda_stream,
                lib=lib,
            )

        return call

    def torch_fn(self):
        def call(i):
            F.layer_norm(self.xs[i], (self.cols,), self.gamma_t, self.beta_t, 1e-5)

        return call

    def check(self, algo="auto", tune=0):
        """Ours against torch in float32 on this cell's first buffer set (guards the timed config)."""
        self.ours(algo, tune)(0)
        ref = F.layer_norm(self.xs[0].float(), (self.cols,), self.gamma, self.beta, 1e-5)
        err = (self.ys[0].float() - ref).abs().max().item()
        tol = {"fp32": 1e-3, "fp16": 2e-2, "bf16": 1.5e-1}[self.dtype]
        if not (err <= tol):
            raise AssertionError(
                f"{self.dtype} cols={self.cols} algo={algo} tune={tune}: max err {err}"
            )

    def gbps(self, fn, reps):
        return self.bytes / time_graph(fn, self.n_sets, self.calls, reps) / 1e9

    def free(self):
        del self.xs, self.ys
        torch.cuda.empty_cache()


def explore_configs(cols: int, dtype: str):
    """Alternative kernel paths for one width (what holds each width back, in one run)."""
    out = [("warp", 0)]
    out += [("block_registers", t) for t in (64, 128, 256, 512)]
    out += [("block_shared", 0)]
    return out


def run_bench(args) -> dict:
    props = torch.cuda.get_device_properties(0)
    result = {"gpu": props.name, "copy_gbps": round(copy_gbps(), 1), "rows": []}
    print(
        f"# {props.name}, {props.multi_processor_count} SMs; copy {result['copy_gbps']} GB/s",
        flush=True,
    )
    explore = []
    for dtype in args.dtypes:
        for cols in args.cols:
            if dtype == "fp32" and cols > FP32_MAX_COLS:
                continue
            cell = Cell(dtype, args.rows, cols)
            cell.check()
            ours = cell.gbps(cell.ours(), args.reps)
            theirs = cell.gbps(cell.torch_fn(), args.reps)
            result["rows"].append(
                {
                    "dtype": dtype,
                    "rows": args.rows,
                    "cols": cols,
                    "ours_gbps": round(ours, 1),
                    "torch_gbps": round(theirs, 1),
                }
            )
            print(
                f"{dtype:5s} {cols:6d} ours {ours:7.1f} torch {theirs:7.1f} x{ours / theirs:5.2f}",
                flush=True,
            )
            if args.explore and dtype in args.explore_dtypes:
                for algo, tune in explore_configs(cols, dtype):
                    try:
                        cell.check(algo, tune)
                    except ln.LayerNormError as e:
                        if e.status == ln.ALGO_NOT_APPLICABLE:
                            continue
                        raise
                    v = cell.gbps(cell.ours(algo, tune), args.reps)
                    explore.append(
                        {
                            "dtype": dtype,
                            "cols": cols,
                            "algo": algo,
                            "tune": tune,
                            "gbps": round(v, 1),
                        }
                    )
                    print(f"   explore {algo:16s} tune {tune:4d}: {v:7.1f}", flush=True)
            cell.free()
    if explore:
        result["explore"] = explore
    return result


def summary(result: dict) -> str:
    lines = [f"{'dtype':5s} {'cols':>6s} {'ours':>8s} {'torch':>8s} {'ratio':>6s} {'%copy':>6s}"]
    ratios = []
    for r in result["rows"]:
        ratio = r["ours_gbps"] / r["torch_gbps"]
        ratios.append(ratio)
        lines.append(
            f"{r['dtype']:5s} {r['cols']:6d} {r['ours_gbps']:8.1f} {r['torch_gbps']:8.1f} {ratio:6.2f} "
            f"{100 * r['ours_gbps'] / result['copy_gbps']:6.1f}"
        )
    geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
    wide = [100 * r["ours_gbps"] / result["copy_gbps"] for r in result["rows"] if r["cols"] >= 1024]
    lines.append(
        f"geomean ours/torch {geo:.3f}; min ratio {min(ratios):.3f}; cells below torch: "
        f"{sum(x < 1 for x in ratios)}; min %copy at cols>=1024: {min(wide) if wide else float('nan'):.1f}"
    )
    return "\n".join(lines)


def run_sanitize_launch_only() -> int:
    """For racecheck (slow, and it only looks at shared memory): launches of the paths that use shared
    memory, no reference computation; each output checked for unwritten (NaN) elements."""
    n = 0
    for dtype in ("fp32", "fp16", "bf16"):
        td = TDTYPE[dtype]
        for cols in (33, 1000, 4096, 12289, 65536):
            rows = 5
            x = torch.randn(rows, cols, device="cuda").to(td)
            r = torch.randn(rows, cols, device="cuda").to(td)
            g, b = torch.rand(cols, device="cuda"), torch.randn(cols, device="cuda")
            for algo in ("block_registers", "block_shared", "block_uncached"):
                for skip in (False, True):
                    y = torch.full_like(x, float("nan"))
                    s = torch.full_like(x, float("nan")) if skip else None
                    try:
                        ln.layernorm_raw(
                            dtype,
                            rows,
                            cols,
                            x.data_ptr(),
                            y.data_ptr(),
                            gamma=g.data_ptr(),
                            beta=b.data_ptr(),
                            residual=r.data_ptr() if skip else None,
                            bias=g.data_ptr() if skip else None,
                            sum_out=s.data_ptr() if skip else None,
                            algo=algo,
                            stream=torch.cuda.current_stream().cuda_stream,
                        )
                    except ln.LayerNormError as e:
                        if e.status != ln.ALGO_NOT_APPLICABLE:
                            raise
                        continue
                    torch.cuda.synchronize()
                    assert torch.isfinite(y.float()).all(), (dtype, cols, algo, skip)
                    n += 1
    print(f"sanitize driver (launch only): {n} launches, outputs fully written")
    return 0


def run_sanitize() -> int:
    """Small launches of every path/dtype/variant (and misaligned ones), each checked, for the sanitizers."""
    sys.path.insert(0, "tests")
    import test_layernorm_kernel as t  # the same checked launcher as the GPU tests

    n = 0
    for dtype in ("fp32", "fp16", "bf16"):
        for cols in (1, 33, 384, 1000, 4096, 12289, 65536):
            for algo in ("auto",) + tuple(t.PATHS):
                for skip in (False, True):
                    try:
                        t._run(torch, dtype, 7, cols, algo=algo, skip=skip, bias=skip, sum_out=skip)
                        n += 1
                    except ln.LayerNormError as e:
                        if e.status != ln.ALGO_NOT_APPLICABLE:
                            raise
        for cols in (8, 768, 4096):
            t._run(torch, dtype, 5, cols, offset=1, skip=True, bias=True, sum_out=True)
            n += 1
    print(f"sanitize driver: {n} checked launches passed")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", help="write results here")
    p.add_argument("--rows", type=int, default=49152)
    p.add_argument("--cols", type=lambda s: [int(c) for c in s.split(",")], default=COLS)
    p.add_argument("--dtypes", type=lambda s: s.split(","), default=["fp16", "bf16", "fp32"])
    p.add_argument("--reps", type=int, default=15)
    p.add_argument(
        "--explore", action="store_true", help="also time every forced path / block size"
    )
    p.add_argument("--explore-dtypes", type=lambda s: s.split(","), default=["fp16", "fp32"])
    p.add_argument(
        "--sanitize", action="store_true", help="checked small launches (memcheck driver)"
    )
    p.add_argument(
        "--sanitize-launch-only", action="store_true", help="shared-memory paths (racecheck driver)"
    )
    args = p.parse_args(argv)
    if args.sanitize:
        return run_sanitize()
    if args.sanitize_launch_only:
        return run_sanitize_launch_only()
    t0 = time.time()
    result = run_bench(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(f"# {time.time() - t0:.0f} s")
    print(summary(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
