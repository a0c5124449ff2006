"""Launches one of our kernels three times on a ResNet-50 shape, for Nsight Compute to profile the third:

  ncu --launch-skip 2 --launch-count 1 -k regex:"conv|stem" --section WarpStateStats ... \\
      python3 benchmarks/experiments/ncu_kernel.py fused1

Kinds (batch 512, the configuration forward picks): fused1, layer1.0's projection + tail; fused0, the same with
layer1.1's conv1 chained (the network's node); stem0, the stem with layer1.0's conv1 chained; halo1, a layer1 3x3
conv. A second argument names the configuration for fused1 / fused0 (op.config_names()) instead of forward's pick.
Inputs are constant bytes (what ncu counts does not depend on them)."""

from __future__ import annotations

import sys

from trtfuse.bench.cuda import DeviceBuffer, ck, cudart

KINDS = ("fused1", "fused0", "stem0", "halo1")


def main(argv=None) -> int:
    import numpy as np

    from trtfuse.ops import residual_conv as op
    from trtfuse.ops import residual_conv_reference as ref

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) not in (1, 2) or argv[0] not in KINDS:
        raise SystemExit(f"usage: ncu_kernel.py {{{','.join(KINDS)}}} [CONFIG]")
    kind, n, rng = argv[0], 512, np.random.default_rng(0)
    names = op.config_names()
    if len(argv) == 2 and (kind not in ("fused1", "fused0") or argv[1] not in names):
        raise SystemExit(f"a configuration is taken for fused1 / fused0 only, one of: {', '.join(names)}")
    config = names.index(argv[1]) if len(argv) == 2 else -1

    def buf(nbytes):
        b = DeviceBuffer(nbytes)
        b.fill(3)
        return b

    def random_weights(cin, cout, relu, taps=1):
        L = ref.random_layer(rng, taps * cin, cout, relu)
        if taps > 1:
            k = int(round(taps ** 0.5))
            L["w"] = np.ascontiguousarray(L["w"].reshape(cout, cin, k, k))
        return L

    if kind in ("fused1", "fused0"):
        T, P, N = random_weights(64, 256, True), random_weights(64, 256, False), random_weights(256, 64, True)
        layer = op.ProjTail(T["w"], T["w_scale"], T["bias"], T["x_scale"], P["out_scale"], T["out_scale"], True,
                          P["w"], P["w_scale"], P["bias"], P["x_scale"], P["out_scale"], 1)
        x, xp, out, nxt = buf(n * 64 * 3136), buf(n * 64 * 3136), buf(n * 256 * 3136), buf(n * 64 * 3136)
        if kind == "fused0":
            layer.attach_next(N["w"], N["w_scale"], N["bias"], T["out_scale"], N["out_scale"], True)
            run = lambda: layer.forward_next(x.ptr, xp.ptr, out.ptr, nxt.ptr, n, 56, 56, 0, config, 0)  # noqa: E731
        else:
            run = lambda: layer.forward(x.ptr, xp.ptr, out.ptr, n, 56, 56, 0, config, 0)  # noqa: E731
    elif kind == "stem0":
        S, N = random_weights(3, 64, True, taps=49), random_weights(64, 64, True)
        layer = op.Stem(S["w"], S["w_scale"], S["bias"], S["x_scale"], S["out_scale"], True)
        layer.attach_next(N["w"], N["w_scale"], N["bias"], S["out_scale"], N["out_scale"], True)
        x, out, nxt = buf(n * 3 * 224 * 224), buf(n * 64 * 3136), buf(n * 64 * 3136)
        run = lambda: layer.forward_next(x.ptr, out.ptr, nxt.ptr, n, 224, 224, -1, 0)  # noqa: E731
    else:
        C = random_weights(64, 64, True, taps=9)
        layer = op.Conv3x3(C["w"], C["w_scale"], C["bias"], C["x_scale"], C["out_scale"], True, 1)
        x, out = buf(n * 64 * 3136), buf(n * 64 * 3136)
        run = lambda: layer.forward(x.ptr, out.ptr, n, 56, 56, -1, 0)  # noqa: E731
    for _ in range(3):
        run()
    ck(cudart.cudaDeviceSynchronize())
    print(kind, "launched 3 times")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
