"""ResNet-50's stem (conv1 7x7/2 + BN + ReLU + maxpool 3x3/2): our sm_90a kernel against TensorRT 8.5's own.

For each batch, on identical int8 input (linear NCHW, 3 x 224 x 224, as the network's int8 input arrives; device
resident), in one process:
  (a) a one-layer engine of TensorRT's int8 Conv(7x7, stride 2, padding 3) + ReLU + MaxPool(3x3, stride 2, padding
      1): network API, int8 I/O through dynamic ranges (implicit quantization), input LINEAR, output CHW32, INT8
      flag, tactic sources 0 (common.py);
  (b) our kernel through the C ABI (trtfuse_stem_forward), every configuration, and the one forward(-1) picks; and
      (with TensorRT) the TrtfuseResidualConv plugin node (kernel_size 7) in an engine with the same input;
checks ours bit-exact against the rounding rule + max pool and TensorRT within 1 LSB of the float64 formula (on
three images), times each (CUDA events, median of --reps), and sets them against the DRAM floor (input + output
bytes at the copy bandwidth measured in the same run) and the int8 dense tensor-core peak (--peak-tops, H100 SXM:
1979; the stem's useful MACs, 7 x 7 x 3 per output, while the kernel computes 8 x 8 x 4 / 7 x 7 x 3 = 1.52x that).
The weights are random: performance only.

  python3.10 -m trtfuse bench layers --kind stem --out benchmarks/results/stem_h100.json   (TensorRT staged)
  python3 -m trtfuse bench layers --kind stem --no-trt --out /tmp/stem.json                (ours only)
"""

from __future__ import annotations

import numpy as np

from trtfuse.bench.cuda import DeviceBuffer, ck, cudart, layer_checks, result_header, time_ms
from trtfuse.bench.layers import measure
from trtfuse.ops import residual_conv as op
from trtfuse.ops import residual_conv_reference as ref

CIN, COUT, HW = 3, 64, 224


def random_stem(rng):
    L = ref.random_layer(rng, 49 * CIN, COUT, True)
    L["w"] = np.ascontiguousarray(L["w"].reshape(COUT, CIN, 7, 7))
    return L


def stem_input(network, L: dict, n: int):
    """The network's int8 input "x" [n, CIN, HW, HW], LINEAR (as the host sends it), at L's x_scale."""
    import tensorrt as trt

    x = network.add_input("x", trt.int8, (n, CIN, HW, HW))
    x.allowed_formats = 1 << int(trt.TensorFormat.LINEAR)
    x.dynamic_range = (-127.0 * L["x_scale"], 127.0 * L["x_scale"])
    return x


def stem_fields(L: dict) -> dict:
    """L as the TrtfuseResidualConv node's fields of a stem (kernel_size 7, what the ONNX rewrite emits)."""
    return {**L, "r_scale": 0.0, "relu": 1, "kernel_size": 7, "stride": 2}


def add_trt_stem(network, x, L: dict):
    """TensorRT's own stem on x: Conv 7x7/2 (padding 3) + ReLU + MaxPool 3x3/2 (padding 1), int8 ranges at L's
    out_scale; returns the pooled tensor (not yet an output)."""
    import tensorrt as trt

    cout = L["w"].shape[0]
    w = (L["w"].astype(np.float32) * L["w_scale"][:, None, None, None]).astype(np.float32)
    conv = network.add_convolution_nd(x, cout, (7, 7), trt.Weights(np.ascontiguousarray(w)),
                                      trt.Weights(np.ascontiguousarray(L["bias"], dtype=np.float32)))
    conv.padding_nd = (3, 3)
    conv.stride_nd = (2, 2)
    rng_out = (-127.0 * L["out_scale"], 127.0 * L["out_scale"])
    conv.get_output(0).dynamic_range = rng_out
    relu = network.add_activation(conv.get_output(0), trt.ActivationType.RELU)
    relu.get_output(0).dynamic_range = rng_out
    pool = network.add_pooling_nd(relu.get_output(0), trt.PoolingType.MAX, (3, 3))
    pool.stride_nd = (2, 2)
    pool.padding_nd = (1, 1)
    return pool.get_output(0)


def trt_engine(kind: str, L: dict, n: int):
    """kind 'trt': TensorRT's stem, Conv 7x7/2 + ReLU + MaxPool 3x3/2; 'plugin': the TrtfuseResidualConv node with
    kernel_size 7 (what the ONNX rewrite emits). int8 LINEAR in, int8 CHW32 out. Returns (engine, layer info)."""
    import tensorrt as trt
    from trtfuse.bench.layers.common import LOGGER, create_plugin, finish_engine

    builder = trt.Builder(LOGGER)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH))
    x = stem_input(network, L, n)
    if kind == "plugin":
        plugin = create_plugin("stem", stem_fields(L), CIN, COUT)
        if plugin is None:
            raise RuntimeError("create_plugin refused the stem's fields (see stderr)")
        return finish_engine(builder, network, network.add_plugin_v2([x], plugin).get_output(0), L["out_scale"],
                             "stem plugin")
    return finish_engine(builder, network, add_trt_stem(network, x, L), L["out_scale"], "stem trt")


def run_case(n: int, reps: int, stream, rng, with_trt: bool) -> dict:
    L = random_stem(rng)
    hp, wp = op.stem_output_hw(HW, HW)
    x = rng.integers(-128, 128, size=(n, CIN, HW, HW), dtype=np.int8)
    out_like = np.empty((n, COUT // 32, hp, wp, 32), np.int8)
    xb, ob = DeviceBuffer(x.nbytes).upload(x), DeviceBuffer(out_like.nbytes)
    row = {"layer": "stem", "kind": "stem", "cin": CIN, "cout": COUT, "batch": n,
           "bytes": int(x.nbytes + out_like.nbytes), "ops": int(2 * n * (HW // 2) ** 2 * 49 * CIN * COUT),
           "weights": "random"}
    layer = op.Stem(L["w"], L["w_scale"], L["bias"], L["x_scale"], L["out_scale"], True)
    outs, configs = {}, {}
    for i, cfg in enumerate(op.stem_config_names()):
        ob.fill(0x5A)
        layer.forward(xb.ptr, ob.ptr, n, HW, HW, i, int(stream))
        ck(cudart.cudaStreamSynchronize(stream))
        outs[cfg] = ref.from_nc32hw32(ob.download(out_like), COUT)
        configs[cfg] = time_ms(lambda _: layer.forward(xb.ptr, ob.ptr, n, HW, HW, i, int(stream)), stream, reps)
        print(f"  stem batch {n} ours {cfg}: {configs[cfg]:.4f} ms", flush=True)
    row["ours_configs_ms"] = configs
    row["ours_config"] = op.stem_config_names()[layer.select_config(n, HW, HW)]  # what forward(-1) takes
    row["ours_ms"] = configs[row["ours_config"]]
    row["ours_best_ms"] = min(configs.values())
    if with_trt:  # TensorRT's own stem, and ours as the plugin node inside a TensorRT engine
        from trtfuse.bench.layers.common import time_x_engines

        time_x_engines(lambda kind: trt_engine(kind, L, n), ("trt", "plugin"), xb.ptr, ob, out_like, COUT,
                       stream, reps, f"stem batch {n}", row, outs)
        row["speedup"] = row["trt_ms"] / row["ours_ms"]
    layer.close()
    xb.free()
    ob.free()

    idx = np.unique([0, n // 2, n - 1])
    acc = ref.accumulate_stem(x[idx], L["w"])
    args = (x[idx], None, L["w_scale"], L["bias"], None, L["x_scale"], 0.0, L["out_scale"], True)
    want32 = ref.maxpool3x3s2(ref.reference_fp32(*args, acc=acc))
    want64 = ref.maxpool3x3s2(ref.reference_fp64(*args, acc=acc))
    row["checks"] = layer_checks(outs, idx, want32, want64, row["ours_config"], "rounding rule + max pool")
    return row


def run(args) -> int:
    """`trtfuse bench layers --kind stem` (trtfuse.bench.layers.resolve checked args)."""
    stream = ck(cudart.cudaStreamCreate())
    rng = np.random.default_rng(0)
    result = result_header(args.command, stream, not args.no_trt, peak_tops=args.peak_tops, layers=[])
    print(f"copy bandwidth {result['copy_gbps']:.0f} GB/s", flush=True)

    def case(_name, n):   # one layer: "stem"
        row = run_case(n, args.reps, stream, rng, not args.no_trt)
        row["floor_ms"] = row["bytes"] / result["copy_gbps"] / 1e6
        row["ours_tops"] = row["ops"] / row["ours_ms"] / 1e9
        return row

    measure(args, result, "layers", case)
    print(f"\n{'layer':6} {'batch':>5} {'ours ms':>8} {'config':>8} {'TRT ms':>8} {'x TRT':>6} {'floor':>6} "
          f"{'% peak':>6}")
    for r in result["layers"]:
        trt_ms = r.get("trt_ms", float("nan"))
        print(f"{r['layer']:6} {r['batch']:5d} {r['ours_ms']:8.4f} {r['ours_config']:>8} {trt_ms:8.4f} "
              f"{trt_ms / r['ours_ms']:6.2f} {r['floor_ms']:6.3f} {100 * r['ours_tops'] / args.peak_tops:6.1f}")
    bad = [c for r in result["layers"] for c in r["checks"] if not c.get("ok", True)]
    print(f"checks: {len(bad)} failed" + (f": {bad}" if bad else ""))
    return 1 if bad else 0

