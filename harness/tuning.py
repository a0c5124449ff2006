"""Tile-configuration tuner for the fused int8 residual conv (``python -m trtfuse.tuning``).

For every (shape, batch) it times each tile configuration the kernels library offers on the current GPU
(CUDA events, median of many launches, inputs rotated so that L2 does not hold them), and writes the
winners to a JSON cache that the C ABI and the TensorRT plugin read (``$TRTFUSE_RESIDUAL_CONV_CACHE``):

    {"version": 1, "entries": [{"gpu", "cin", "cout", "hw", "batch", "residual", "stride", "config", "ms",
                                "candidates_ms"}, ...]}

(hw: output positions per image; residual 1 for a bottleneck tail, 0 for a projection.)

Entries of other GPUs in an existing cache are kept. Needs torch with CUDA (device buffers and events).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

RESNET50_STAGES = {  # name: (cin, cout, input h == w, stride, residual)
    "res2": (64, 256, 56, 1, True),  # the bottleneck tails (conv3 + BN + Add + ReLU)
    "res3": (128, 512, 28, 1, True),
    "res4": (256, 1024, 14, 1, True),
    "res5": (512, 2048, 7, 1, True),
    "proj1": (64, 256, 56, 1, False),  # the stage-opening projections (downsample conv + BN)
    "proj2": (256, 512, 56, 2, False),
    "proj3": (512, 1024, 28, 2, False),
    "proj4": (1024, 2048, 14, 2, False),
}
L2_FLUSH_BYTES = 256 << 20  # rotate among enough input sets that every launch reads from DRAM


def make_problem(cin: int, cout: int, hw: int, batch: int, seed: int = 0, stride: int = 1, residual: bool = True):
    """Random int8 layer + kCHW32 device buffers (several sets when one set would fit in L2); hw: the input side.
    Each set is (x, r or None, out)."""
    import torch
    from trtfuse.ops import residual_conv as op
    from trtfuse.ops import residual_conv_reference as ref

    rng = np.random.default_rng(seed)
    L = ref.random_layer(rng, cin, cout, True)
    ho = -(-hw // stride)
    kc, nc = -(-cin // 32), -(-cout // 32)
    xb, rb = batch * kc * hw * hw * 32, batch * nc * ho * ho * 32
    sets = max(1, min(8, -(-L2_FLUSH_BYTES // (xb + (2 if residual else 1) * rb))))
    g = torch.Generator(device="cuda").manual_seed(seed)
    bufs = []
    for _ in range(sets):
        x = torch.randint(-128, 128, (xb,), dtype=torch.int8, device="cuda", generator=g)
        r = torch.randint(-128, 128, (rb,), dtype=torch.int8, device="cuda", generator=g) if residual else None
        o = torch.empty(rb, dtype=torch.int8, device="cuda")
        bufs.append((x, r, o))
    layer = op.ResidualConv(
        L["w"], L["w_scale"], L["bias"], L["x_scale"], L["r_scale"] if residual else 0.0, L["out_scale"], True,
        stride,
    )
    return layer, L, bufs


def time_launches(launch, sets: int, warmup: int = 10, reps: int = 60) -> float:
    """Median milliseconds of one launch (CUDA events around each, inputs rotated among `sets`)."""
    import torch

    for i in range(warmup):
        launch(i % sets)
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        starts[i].record()
        launch(i % sets)
        ends[i].record()
    torch.cuda.synchronize()
    return float(np.median([s.elapsed_time(e) for s, e in zip(starts, ends)]))


def tune_shape(
    cin: int,
    cout: int,
    hw: int,
    batch: int,
    reps: int = 60,
    only: list[str] | None = None,
    stride: int = 1,
    residual: bool = True,
) -> dict:
    """Times every candidate configuration on one layer (hw: the input side)."""
    import torch
    from trtfuse.ops import residual_conv as op

    layer, L, bufs = make_problem(cin, cout, hw, batch, stride=stride, residual=residual)
    ptr = lambda t: t.data_ptr() if t is not None else 0  # noqa: E731 (no residual input: r is NULL)
    stream = torch.cuda.current_stream().cuda_stream
    names = op.config_names()
    # only: name prefixes of the candidates to time (quick device iterations); config 0 is always the gate
    skipped = [n for n in names if only and not n.startswith(tuple(only)) and n != names[0]]
    # sm90 configurations ("wgw_*") run only from an sm_90a build on a compute capability 9.0 GPU: skip the others
    unsupported = [name for c, name in enumerate(names) if not op.config_supported(c)]
    # sm90 configurations that cannot hold this layer's weight slice in shared memory: not candidates
    unfit = [name for c, name in enumerate(names) if not op.config_fits(c, cin, cout)]
    if unsupported:
        print(f"tune {cin}->{cout} {hw}x{hw} s{stride} batch {batch}: skipping {len(unsupported)} configs this build/GPU "
              f"cannot run ({', '.join(unsupported)}): they need the library built with sm_90a (--archs 90a) "
              "on a compute capability 9.0 GPU", flush=True)
    # Bit-exactness gate at the full shape: every candidate must reproduce, byte for byte, the output of
    # config 0 (an sm80 config: it runs on every GPU) on input set 0, whose exactness the GPU tests establish
    # against the reference.
    # A candidate that differs is reported and never becomes the cached choice: a fast but wrong kernel
    # (say, a new config with an indexing bug only large shapes reach) cannot win the tuning.
    x0, r0, o0 = bufs[0]
    layer.forward(x0.data_ptr(), ptr(r0), o0.data_ptr(), batch, hw, hw, 0, stream)
    want = o0.clone()
    mismatched = []
    for c, name in enumerate(names):
        if name in unsupported or name in skipped or name in unfit:
            continue
        o0.fill_(0x5A)
        layer.forward(x0.data_ptr(), ptr(r0), o0.data_ptr(), batch, hw, hw, c, stream)
        if not torch.equal(o0, want):
            bad = int((o0 != want).sum())
            print(f"tune {cin}->{cout} {hw}x{hw} s{stride} batch {batch}: {name} MISMATCH ({bad} bytes differ from "
                  f"{names[0]}): excluded", flush=True)
            mismatched.append(name)
    del want
    times = {}
    for c, name in enumerate(names):
        if name in mismatched or name in unsupported or name in skipped or name in unfit:
            continue

        def launch(i, c=c):
            x, r, o = bufs[i]
            layer.forward(x.data_ptr(), ptr(r), o.data_ptr(), batch, hw, hw, c, stream)

        times[name] = time_launches(launch, len(bufs), reps=reps)
    layer.close()
    del bufs
    torch.cuda.empty_cache()
    best = min(times, key=times.get)
    return {
        "gpu": torch.cuda.get_device_name(),
        "cin": cin,
        "cout": cout,
        "hw": (-(-hw // stride)) ** 2,
        "batch": batch,
        "residual": int(residual),
        "stride": stride,
        "config": best,
        "ms": times[best],
        "candidates_ms": times,
        "mismatched": mismatched,  # configs whose output differed from config 0's (not timed, never chosen)
        "unsupported": unsupported,  # configs this build/GPU cannot run (sm90 without sm_90a; not timed)
        "unfit": unfit,  # sm90 configs that cannot hold this layer's weight slice (not timed)
    }


def merge_cache(path: Path, new: list[dict]) -> dict:
    old = json.loads(path.read_text()) if path.is_file() else {"version": 1, "entries": []}
    def key(e):  # residual and stride are absent from caches that hold tails only
        return (e["gpu"], e["cin"], e["cout"], e["hw"], e["batch"], e.get("residual", 1), e.get("stride", 1))

    keys = {key(e) for e in new}
    kept = [e for e in old.get("entries", []) if key(e) not in keys]
    return {"version": 1, "entries": kept + new}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trtfuse.tuning", description=__doc__.split("\n")[0])
    p.add_argument(
        "--stages",
        default=",".join(RESNET50_STAGES),
        help=f"ResNet-50 layers (comma-separated, of {', '.join(RESNET50_STAGES)})",
    )
    p.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="CIN,COUT,HW",
        help="an extra tail shape: input channels, output channels, spatial side (square)",
    )
    p.add_argument("--batches", default="256,2048")
    p.add_argument("--reps", type=int, default=60)
    p.add_argument("--configs", default="", help="time only configs whose names start with these (comma-separated)")
    p.add_argument("--out", required=True, help="the cache JSON (merged with an existing one)")
    args = p.parse_args(argv)
    stages = [s for s in args.stages.split(",") if s]
    unknown = [s for s in stages if s not in RESNET50_STAGES]
    if unknown:
        p.error(f"unknown stage(s) {', '.join(unknown)}: choose from {', '.join(RESNET50_STAGES)}")
    shapes = [RESNET50_STAGES[s] for s in stages]
    shapes += [tuple(int(v) for v in s.split(",")) + (1, True) for s in args.shape]
    entries = []
    for cin, cout, hw, stride, residual in shapes:
        for batch in (int(b) for b in args.batches.split(",")):
            only = [c for c in args.configs.split(",") if c] or None
            e = tune_shape(cin, cout, hw, batch, args.reps, only, stride, residual)
            entries.append(e)
            cands = "  ".join(f"{k}={v:.4f}" for k, v in e["candidates_ms"].items())
            print(
                f"tune {cin}->{cout} {hw}x{hw} {'tail' if residual else 'proj'} s{stride} batch {batch}: "
                f"best {e['config']} {e['ms']:.4f} ms | {cands}",
                flush=True,
            )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(merge_cache(out, entries), indent=1) + "\n")
    print(f"wrote {out} ({len(entries)} entries)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
