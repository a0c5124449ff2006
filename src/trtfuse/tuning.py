"""Tile-configuration tuner for the fused int8 residual conv (``python -m trtfuse.tuning``).

For every (shape, batch) it times each tile configuration the kernels library offers on the current GPU
(CUDA events, median of many launches, inputs rotated so that L2 does not hold them), and writes the
winners to a JSON cache that the C ABI and the TensorRT plugin read (``$TRTFUSE_RESIDUAL_CONV_CACHE``):

    {"version": 1, "entries": [{"gpu", "cin", "cout", "hw", "batch", "residual", "stride", "config", "ms",
                                "candidates_ms"}, ...]}

(hw: output positions per image; residual 1 for a bottleneck tail, 0 for a projection; a stage's first block with its
projection fused into the tail (trtfuse_proj_tail_create) also has "proj_cin", the projection's input channels, and
"stride" is the projection's. The 3x3 convs' and the stem's entries have "family": "conv3x3" or "stem", and name a
configuration of that family.)

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
# a stage's first block, its projection and tail in one kernel: name: (proj_cin, cin, cout, input h == w, stride);
# its candidates also include "separate": the two layers as two launches, each on its own tuned configuration
RESNET50_FUSED = {
    "fused1": (64, 64, 256, 56, 1),
    "fused2": (256, 128, 512, 56, 2),
    "fused3": (512, 256, 1024, 28, 2),  # never fits the fused kernel: timed to show it
}
SEPARATE = "separate"
# The other families of the cache (an entry's "family"): ResNet-50's stride-1 3x3 convs (name: channels, input
# h == w, stride) and its stem (cin, cout, input h == w). Their library defaults were set at batch 2048.
RESNET50_CONV3X3 = {"conv3x3_1": (64, 56, 1), "conv3x3_2": (128, 28, 1), "conv3x3_3": (256, 14, 1)}
RESNET50_STEM = {"stem": (3, 64, 224)}
ALL_STAGES = [*RESNET50_STAGES, *RESNET50_FUSED, *RESNET50_CONV3X3, *RESNET50_STEM]
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
    """Median milliseconds of one launch (CUDA events around each, inputs rotated among `sets`), queued behind a spin
    (trtfuse.ops.gpu_timing): the GPU's time, also at batch 1, where a launch costs the host more."""
    import torch
    from trtfuse.ops.gpu_timing import queue_ahead, warm_up

    host = warm_up(lambda i: launch(i % sets), warmup)
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    queue_ahead(torch.cuda.current_stream().cuda_stream, reps, host)
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
    shape = {"cin": cin, "cout": cout, "hw": (-(-hw // stride)) ** 2, "batch": batch, "residual": int(residual),
             "stride": stride}
    return cache_entry(shape, times, mismatched, unsupported, unfit)


def cache_entry(shape: dict, times: dict, mismatched: list, unsupported: list, unfit: list) -> dict:
    """A cache entry: this GPU, the layer's shape keys, the fastest candidate of `times` (name -> ms) and why the
    others were not timed."""
    import torch

    best = min(times, key=times.get)
    return {
        "gpu": torch.cuda.get_device_name(),
        **shape,
        "config": best,
        "ms": times[best],
        "candidates_ms": times,
        "mismatched": mismatched,  # configs whose output differed from config 0's (not timed, never chosen)
        "unsupported": unsupported,  # configs this build/GPU cannot run (sm90 without sm_90a; not timed)
        "unfit": unfit,  # sm90 configs that cannot hold this layer's weight slice (not timed)
    }


def tune_fused_shape(proj_cin: int, cin: int, cout: int, hw: int, stride: int, batch: int, reps: int = 60,
                     only: list[str] | None = None) -> dict:
    """Times a stage's first block (hw: the block input's side) on every configuration that runs it: the sm90 ones
    that fuse it, the sm80 ones (two launches each on that config), and SEPARATE (two launches on their own tuned
    configurations: what the network ran before the fused form). The gate: config 0's output, byte for byte."""
    import torch
    from trtfuse.ops import residual_conv as op
    from trtfuse.ops import residual_conv_reference as ref

    rng = np.random.default_rng(0)
    T, P = ref.random_layer(rng, cin, cout, True), ref.random_layer(rng, proj_cin, cout, False)
    layer = op.ProjTail(T["w"], T["w_scale"], T["bias"], T["x_scale"], T["r_scale"], T["out_scale"], True,
                        P["w"], P["w_scale"], P["bias"], P["x_scale"], P["out_scale"], stride)
    ho = -(-hw // stride)
    xb, xpb = batch * -(-cin // 32) * ho * ho * 32, batch * -(-proj_cin // 32) * hw * hw * 32
    ob = batch * -(-cout // 32) * ho * ho * 32
    sets = max(1, min(8, -(-L2_FLUSH_BYTES // (xb + xpb + ob))))
    g = torch.Generator(device="cuda").manual_seed(0)
    bufs = [(torch.randint(-128, 128, (xb,), dtype=torch.int8, device="cuda", generator=g),
             torch.randint(-128, 128, (xpb,), dtype=torch.int8, device="cuda", generator=g),
             torch.empty(ob, dtype=torch.int8, device="cuda")) for _ in range(sets)]
    ws = torch.empty(ob, dtype=torch.int8, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    names = op.config_names()
    skipped = {n for n in names if only and not n.startswith(tuple(only)) and n != names[0]}
    unsupported = [name for c, name in enumerate(names) if not op.config_supported(c)]
    sm90 = [name for name in names if name.startswith("wgw_")]
    # sm90 configurations that cannot hold both weight matrices would only repeat SEPARATE: not candidates
    unfit = [name for c, name in enumerate(names) if name in sm90 and name not in unsupported and not layer.fuses(c)]
    candidates = {name: c for c, name in enumerate(names)
                  if name not in skipped and name not in unsupported and name not in unfit}
    candidates[SEPARATE] = -1

    def run(c, i):  # fused where config c holds the layer, else its two launches on c
        x, xp, o = bufs[i]
        layer.forward(x.data_ptr(), xp.data_ptr(), o.data_ptr(), batch, hw, hw, ws.data_ptr(), c, stream)

    # SEPARATE: the projection and the tail as plain layers, each on its own tuned configuration
    proj = op.ResidualConv(P["w"], P["w_scale"], P["bias"], P["x_scale"], 0.0, P["out_scale"], False, stride)
    tail = op.ResidualConv(T["w"], T["w_scale"], T["bias"], T["x_scale"], T["r_scale"], T["out_scale"], True)

    def separate(i):
        x, xp, o = bufs[i]
        proj.forward(xp.data_ptr(), 0, ws.data_ptr(), batch, hw, hw, -1, stream)
        tail.forward(x.data_ptr(), ws.data_ptr(), o.data_ptr(), batch, ho, ho, -1, stream)

    o0 = bufs[0][2]
    run(0, 0)
    want = o0.clone()
    mismatched = []
    for name, c in candidates.items():
        o0.fill_(0x5A)
        separate(0) if c == -1 else run(c, 0)
        if not torch.equal(o0, want):
            print(f"tune fused {proj_cin}+{cin}->{cout} {hw}x{hw} s{stride} batch {batch}: {name} MISMATCH "
                  f"({int((o0 != want).sum())} bytes differ from {names[0]}): excluded", flush=True)
            mismatched.append(name)
    times = {}
    for name, c in candidates.items():
        if name not in mismatched:
            times[name] = time_launches(separate if c == -1 else (lambda i, c=c: run(c, i)), sets, reps=reps)
    for obj in (layer, proj, tail):
        obj.close()
    del bufs, ws
    torch.cuda.empty_cache()
    # the choice may be SEPARATE: the library then runs the two layers on their own choices (select_config)
    shape = {"cin": cin, "cout": cout, "hw": ho * ho, "batch": batch, "residual": 1, "stride": stride,
             "proj_cin": proj_cin}
    return cache_entry(shape, times, mismatched, unsupported, unfit)


def tune_family_shape(family: str, layer, configs: list[str], n: int, h: int, in_bytes: int, out_bytes: int,
                      shape: dict, reps: int = 60) -> dict:
    """Times every configuration of a 3x3 or stem `layer` (its forward(x, out, n, h, w, config, stream)) on an
    n x h x h input: the gate is the first configuration that holds the layer, byte for byte (the GPU tests hold each
    against the reference); one that cannot hold it (-9) is unfit. shape: the entry's keys besides these."""
    import torch

    sets = max(1, min(8, -(-L2_FLUSH_BYTES // (in_bytes + out_bytes))))
    g = torch.Generator(device="cuda").manual_seed(0)
    bufs = [(torch.randint(-128, 128, (in_bytes,), dtype=torch.int8, device="cuda", generator=g),
             torch.empty(out_bytes, dtype=torch.int8, device="cuda")) for _ in range(sets)]
    stream = torch.cuda.current_stream().cuda_stream

    def run(c, i):
        x, o = bufs[i]
        layer.forward(x.data_ptr(), o.data_ptr(), n, h, h, c, stream)

    want, mismatched, unfit, times = None, [], [], {}
    for c, name in enumerate(configs):
        o0 = bufs[0][1]
        o0.fill_(0x5A)
        try:
            run(c, 0)
        except RuntimeError as e:
            if "(-9)" in str(e):   # TRTFUSE_RCONV_ERR_FIT: this configuration cannot hold the layer
                unfit.append(name)
                continue
            raise
        torch.cuda.synchronize()
        if want is None:
            want = o0.clone()
        elif not torch.equal(o0, want):
            print(f"tune {family} {shape} batch {n}: {name} MISMATCH ({int((o0 != want).sum())} bytes differ): "
                  "excluded", flush=True)
            mismatched.append(name)
            continue
        times[name] = time_launches(lambda i, c=c: run(c, i), sets, reps=reps)
    del bufs
    torch.cuda.empty_cache()
    return cache_entry({"family": family, **shape, "batch": n}, times, mismatched, [], unfit)


def tune_conv3x3_shape(c: int, hw: int, stride: int, batch: int, reps: int = 60) -> dict:
    """Every halo configuration on a c -> c 3x3 conv of an hw x hw input."""
    from trtfuse.ops import residual_conv as op
    from trtfuse.ops import residual_conv_reference as ref

    L = ref.random_layer(np.random.default_rng(0), 9 * c, c, True)
    layer = op.Conv3x3(L["w"].reshape(c, c, 3, 3), L["w_scale"], L["bias"], L["x_scale"], L["out_scale"], True, stride)
    ho, slabs = -(-hw // stride), -(-c // 32)
    try:
        return tune_family_shape("conv3x3", layer, op.conv3x3_config_names(), batch, hw, batch * slabs * hw * hw * 32,
                                 batch * slabs * ho * ho * 32,
                                 {"cin": c, "cout": c, "hw": ho * ho, "residual": 0, "stride": stride}, reps)
    finally:
        layer.close()


def tune_stem_shape(cin: int, cout: int, hw: int, batch: int, reps: int = 60) -> dict:
    """Every stem configuration (pooled rows per block) on an hw x hw input of cin channels."""
    from trtfuse.ops import residual_conv as op
    from trtfuse.ops import residual_conv_reference as ref

    L = ref.random_layer(np.random.default_rng(0), 49 * cin, cout, True)
    layer = op.Stem(L["w"].reshape(cout, cin, 7, 7), L["w_scale"], L["bias"], L["x_scale"], L["out_scale"], True)
    hp, wp = op.stem_output_hw(hw, hw)
    try:
        return tune_family_shape("stem", layer, op.stem_config_names(), batch, hw, batch * cin * hw * hw,
                                 batch * -(-cout // 32) * hp * wp * 32,
                                 {"cin": cin, "cout": cout, "hw": hp * wp, "residual": 0, "stride": 2}, reps)
    finally:
        layer.close()


def merge_cache(path: Path, new: list[dict]) -> dict:
    old = json.loads(path.read_text()) if path.is_file() else {"version": 1, "entries": []}
    def key(e):  # residual, stride, proj_cin and family are absent from older caches
        return (e.get("family", ""), e["gpu"], e["cin"], e["cout"], e["hw"], e["batch"], e.get("residual", 1),
                e.get("stride", 1), e.get("proj_cin", 0))

    keys = {key(e) for e in new}
    kept = [e for e in old.get("entries", []) if key(e) not in keys]
    return {"version": 1, "entries": kept + new}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trtfuse.tuning", description=__doc__.split("\n")[0])
    p.add_argument(
        "--stages",
        default=",".join(ALL_STAGES),
        help=f"ResNet-50 layers (comma-separated, of {', '.join(ALL_STAGES)})",
    )
    p.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="CIN,COUT,HW",
        help="an extra tail shape: input channels, output channels, spatial side (square)",
    )
    # 1 and 8: SingleStream's and MultiStream's engines (few rows: small tiles may win there)
    p.add_argument("--batches", default="1,8,256,2048")
    p.add_argument("--reps", type=int, default=60)
    p.add_argument("--configs", default="", help="time only configs whose names start with these (comma-separated)")
    p.add_argument("--out", required=True, help="the cache JSON (merged with an existing one)")
    args = p.parse_args(argv)
    stages = [s for s in args.stages.split(",") if s]
    unknown = [s for s in stages if s not in ALL_STAGES]
    if unknown:
        p.error(f"unknown stage(s) {', '.join(unknown)}: choose from {', '.join(ALL_STAGES)}")
    shapes = [RESNET50_STAGES[s] for s in stages if s in RESNET50_STAGES]
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
    for proj_cin, cin, cout, hw, stride in (RESNET50_FUSED[s] for s in stages if s in RESNET50_FUSED):
        for batch in (int(b) for b in args.batches.split(",")):
            only = [c for c in args.configs.split(",") if c] or None
            e = tune_fused_shape(proj_cin, cin, cout, hw, stride, batch, args.reps, only)
            entries.append(e)
            cands = "  ".join(f"{k}={v:.4f}" for k, v in e["candidates_ms"].items())
            print(f"tune {cin}->{cout} {hw}x{hw} fused+{proj_cin} s{stride} batch {batch}: "
                  f"best {e['config']} {e['ms']:.4f} ms | {cands}", flush=True)
    for name in stages:
        for batch in (int(b) for b in args.batches.split(",")):
            if name in RESNET50_CONV3X3:
                e = tune_conv3x3_shape(*RESNET50_CONV3X3[name], batch, args.reps)
            elif name in RESNET50_STEM:
                e = tune_stem_shape(*RESNET50_STEM[name], batch, args.reps)
            else:
                continue
            entries.append(e)
            cands = "  ".join(f"{k}={v:.4f}" for k, v in e["candidates_ms"].items())
            print(f"tune {name} batch {batch}: best {e['config']} {e['ms']:.4f} ms | {cands}", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(merge_cache(out, entries), indent=1) + "\n")
    print(f"wrote {out} ({len(entries)} entries)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
