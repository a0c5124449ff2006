"""Times the fused projection + tail (a stage's first block, `ProjTail.forward`) on every configuration that fuses it,
ours only (no TensorRT): ResNet-50's layer1.0 and layer2.0 at batch 256 and 2048, CUDA events, median of 30.

One kernels library per run (TRTFUSE_KERNELS_LIB), so an A/B of two builds is two runs, alternated:

  for L in old new old new; do TRTFUSE_KERNELS_LIB=$L.so python3 benchmarks/proj_tail_configs.py --label $L \\
      --out $OUT/proj_tail_$L.json; done

Inputs are constant bytes (the timing does not depend on the values; exactness is the GPU tests' job:
tests/test_residual_conv.py -k proj_tail)."""

from __future__ import annotations

import argparse
import json

from bench_cuda import DeviceBuffer, ck, cudart, time_ms

# block: (projection cin, tail cin, cout, block input h == w, projection stride)
BLOCKS = {"layer1.0": (64, 64, 256, 56, 1), "layer2.0": (256, 128, 512, 56, 2)}


def main(argv=None) -> int:
    import numpy as np

    from trtfuse.ops import residual_conv as op
    from trtfuse.ops import residual_conv_reference as ref

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--label", default="", help="names this library in the rows (e.g. old, new)")
    ap.add_argument("--batches", default="256,2048")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    stream = ck(cudart.cudaStreamCreate())
    names, rows = op.config_names(), []
    for block, (pcin, cin, cout, hw, stride) in BLOCKS.items():
        T, P = ref.random_layer(rng, cin, cout, True), ref.random_layer(rng, pcin, cout, False)
        layer = op.ProjTail(T["w"], T["w_scale"], T["bias"], T["x_scale"], P["out_scale"], T["out_scale"], True,
                            P["w"], P["w_scale"], P["bias"], P["x_scale"], P["out_scale"], stride)
        for n in (int(b) for b in args.batches.split(",")):
            ho = -(-hw // stride)
            x, xp, out = DeviceBuffer(n * cin * ho * ho), DeviceBuffer(n * pcin * hw * hw), DeviceBuffer(
                n * cout * ho * ho)
            x.fill(3)
            xp.fill(5)
            for config in [-1, *range(len(names))]:  # -1: what forward picks (the tuning cache)
                if config >= 0 and not layer.fuses(config):
                    continue
                ms = time_ms(lambda _: layer.forward(x.ptr, xp.ptr, out.ptr, n, hw, hw, 0, config, int(stream)),
                             stream, args.reps)
                name = "auto" if config < 0 else names[config]
                rows.append({"lib": args.label, "block": block, "batch": n, "config": name, "ms": round(ms, 4)})
                print(f"{args.label:5s} {block} {n:5d} {name:32s} {ms:.4f} ms", flush=True)
            for b in (x, xp, out):
                b.free()
        layer.close()
    with open(args.out, "w") as f:
        json.dump({"script": "benchmarks/proj_tail_configs.py", "weights": "random (performance only)",
                   "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
