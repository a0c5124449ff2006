"""Device benchmark of the fused int8 residual conv without TensorRT.

For each ResNet-50 conv3 stage and batch: our kernel (config from the tuning cache, else the heuristic),
the strongest peer available without TensorRT (torch._int_mm = cuBLASLt int8 GEMM on the same M x K x N,
NHWC rows, int32 out; and the same plus the epilogue as separate torch ops), and the bandwidth floor
from a device-to-device copy measured in the same run. Writes JSON (--out) and prints a table.

    python3 -m trtfuse.bench.conv_kernel --out OUT.json      (the GPU machine's python3: PyTorch, no TensorRT)
    trtfuse bench conv-kernel --out OUT.json                 (the same, where the CLI's dependencies are installed)
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
from trtfuse import tuning


def copy_gbps(nbytes: int = 1 << 30) -> float:
    a = torch.empty(nbytes, dtype=torch.int8, device="cuda").random_(-128, 127)
    b = torch.empty_like(a)
    ms = tuning.time_launches(lambda i: b.copy_(a), 1, warmup=5, reps=30)
    return 2 * nbytes / ms / 1e6


def stage_bytes(cin, cout, hw, batch) -> int:
    m = batch * hw * hw
    return m * cin + 2 * m * cout + cin * cout


def peer_ms(cin, cout, hw, batch, reps):
    m = batch * hw * hw
    a = torch.randint(-128, 128, (m, cin), dtype=torch.int8, device="cuda")
    b = torch.randint(-127, 128, (cout, cin), dtype=torch.int8, device="cuda").t()
    r = torch.randint(-128, 128, (m, cout), dtype=torch.int8, device="cuda")
    alpha = torch.rand(cout, device="cuda") * 1e-3
    bias = torch.randn(cout, device="cuda")
    try:
        gemm = tuning.time_launches(lambda i: torch._int_mm(a, b), 1, reps=reps)

        def full(i):
            acc = torch._int_mm(a, b)
            v = torch.relu(acc.float() * alpha + bias + r.float() * 0.02)
            return torch.clamp(torch.round(v * 30.0), -128, 127).to(torch.int8)

        fused = tuning.time_launches(full, 1, warmup=3, reps=max(10, reps // 4))
    except (
        RuntimeError
    ) as e:  # e.g. out of memory at res2 batch 2048 with int32 + float intermediates
        print(f"peer {cin}->{cout} batch {batch}: {e}".splitlines()[0], file=sys.stderr)
        gemm = fused = float("nan")
    del a, b, r
    torch.cuda.empty_cache()
    return gemm, fused


def tail_stage(stage: str) -> tuple[int, int, int]:
    """(cin, cout, hw) of a bottleneck tail stage (res2-res5): the only stages this script times."""
    cin, cout, hw, stride, residual = tuning.RESNET50_STAGES[stage]
    if stride != 1 or not residual:
        raise SystemExit(f"--stages {stage}: not a bottleneck tail (res2-res5); time projections with "
                         "trtfuse bench layers --kind residual")
    return cin, cout, hw


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--batches", default="256,2048")
    p.add_argument("--stages", default="res2,res3,res4,res5")
    p.add_argument("--reps", type=int, default=100)
    p.add_argument("--no-peer", action="store_true")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    from trtfuse.ops import residual_conv as op

    gbps = copy_gbps()
    names = op.config_names()
    rows = []
    for stage in args.stages.split(","):
        cin, cout, hw = tail_stage(stage)
        for batch in (int(b) for b in args.batches.split(",")):
            layer, L, bufs = tuning.make_problem(cin, cout, hw, batch, seed=1)
            cfg = op.select_config(cin, cout, batch, hw * hw)
            stream = torch.cuda.current_stream().cuda_stream

            def launch(i):
                x, r, o = bufs[i]
                layer.forward(x.data_ptr(), r.data_ptr(), o.data_ptr(), batch, hw, hw, -1, stream)

            ours = tuning.time_launches(launch, len(bufs), reps=args.reps)
            ours2 = tuning.time_launches(
                launch, len(bufs), reps=args.reps
            )  # same version twice: the spread
            layer.close()
            del bufs
            torch.cuda.empty_cache()
            nbytes = stage_bytes(cin, cout, hw, batch)
            floor = nbytes / gbps / 1e6
            ops = 2 * batch * hw * hw * cin * cout
            rows.append(
                dict(
                    stage=stage,
                    batch=batch,
                    config=names[cfg],
                    ours_ms=ours,
                    ours_ms_repeat=ours2,
                    peer_int_mm_ms=float("nan"),
                    peer_int_mm_plus_epilogue_ms=float("nan"),
                    bytes=nbytes,
                    ops=ops,
                    floor_ms=floor,
                    pct_of_floor=100 * floor / ours,
                    ours_gbps=nbytes / ours / 1e6,
                    ours_tops=ops / ours / 1e9,
                )
            )
    # The peers after all of ours, smallest first: every kernel timed after the res2 batch 2048 peer (~GBs of int32
    # and float intermediates, freed) ran slower, ours and cuBLASLt's alike (res3 batch 256: ours 0.088 -> 0.111
    # ms, torch._int_mm 0.157 -> 0.183 ms; ours alone or without the peers: 0.088-0.090).
    if not args.no_peer:
        for row in sorted(rows, key=lambda r: r["bytes"]):
            cin, cout, hw = tail_stage(row["stage"])
            gemm, fused = peer_ms(cin, cout, hw, row["batch"], args.reps)
            row.update(peer_int_mm_ms=gemm, peer_int_mm_plus_epilogue_ms=fused)
    result = {"gpu": torch.cuda.get_device_name(), "copy_gbps": gbps, "rows": rows}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"\n{result['gpu']}: device copy {gbps:.0f} GB/s (read + write)")
    print(
        f"{'stage':5} {'batch':>5} {'config':27} {'ours ms':>8} {'again':>8} {'floor':>7} {'%floor':>6} "
        f"{'TOPS':>6} {'int_mm':>8} {'+epi':>8}"
    )
    for r in rows:
        print(
            f"{r['stage']:5} {r['batch']:5d} {r['config']:27} {r['ours_ms']:8.4f} {r['ours_ms_repeat']:8.4f} "
            f"{r['floor_ms']:7.4f} {r['pct_of_floor']:6.1f} {r['ours_tops']:6.0f} {r['peer_int_mm_ms']:8.4f} "
            f"{r['peer_int_mm_plus_epilogue_ms']:8.4f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
