"""ResNet-50's 3x3 convs (conv2 + BN + ReLU of layer1-layer3, and layer2.0's at stride 2): the halo kernel against
TensorRT 8.5's own.

For each layer and batch, on identical int8 kCHW32 data (device resident), in one process:
  (a) a one-layer engine of TensorRT's int8 Conv(3x3, padding 1) + ReLU: network API, int8 I/O through dynamic
      ranges (implicit quantization), allowed formats CHW32, INT8 flag, tactic sources 0 (common.py);
  (b) our kernel through the C ABI (trtfuse_conv3x3_forward), every halo configuration that holds the layer, and the
      one forward(-1) picks; and (with TensorRT) the TrtfuseResidualConv plugin node (kernel_size 3) in an engine;
checks ours bit-exact against the rounding rule and TensorRT within 1 LSB of the float64 formula (on three images),
times each (CUDA events, median of --reps), and sets them against two limits measured or known in the same run:
the DRAM floor (input + output bytes at the measured device copy bandwidth) and the int8 dense tensor-core peak of
the GPU (--peak-tops, H100 SXM: 1979). ResNet-50 has random weights here: performance only.

  python3.10 -m trtfuse bench layers --kind conv3x3 --out benchmarks/results/conv3x3_h100.json   (TensorRT staged)
  python3 -m trtfuse bench layers --kind conv3x3 --no-trt --out /tmp/conv3x3.json                (ours only)
"""

from __future__ import annotations

import numpy as np

from trtfuse.bench.cuda import DeviceBuffer, ck, cudart, layer_checks, result_header, time_ms
from trtfuse.bench.layers import CONV3X3_LAYERS as LAYERS
from trtfuse.bench.layers import measure
from trtfuse.ops import residual_conv as op
from trtfuse.ops import residual_conv_reference as ref


def random_conv3x3(rng, c):
    L = ref.random_layer(rng, 9 * c, c, True)
    L["w"] = np.ascontiguousarray(L["w"].reshape(c, c, 3, 3))
    return L


def trt_engine(kind: str, L: dict, n: int, c: int, hw: int, stride: int):
    """kind 'trt': TensorRT's Conv 3x3 (padding 1) + ReLU; 'plugin': the TrtfuseResidualConv node with kernel_size 3
    (what the ONNX rewrite emits). Returns (engine, layer info)."""
    import tensorrt as trt
    from trtfuse.bench.layers.common import LOGGER, _int8_io, create_plugin, finish_engine

    builder = trt.Builder(LOGGER)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH))
    x = network.add_input("x", trt.int8, (n, c, hw, hw))
    _int8_io(x, L["x_scale"])
    if kind == "plugin":
        plugin = create_plugin("conv3x3", {**L, "r_scale": 0.0, "relu": 1, "kernel_size": 3, "stride": stride}, c, c)
        if plugin is None:
            raise RuntimeError("create_plugin refused the 3x3 fields (see stderr)")
        return finish_engine(builder, network, network.add_plugin_v2([x], plugin).get_output(0), L["out_scale"],
                             "3x3 plugin")
    w = (L["w"].astype(np.float32) * L["w_scale"][:, None, None, None]).astype(np.float32)
    conv = network.add_convolution_nd(x, c, (3, 3), trt.Weights(np.ascontiguousarray(w)),
                                      trt.Weights(np.ascontiguousarray(L["bias"], dtype=np.float32)))
    conv.padding_nd = (1, 1)
    conv.stride_nd = (stride, stride)
    conv.get_output(0).dynamic_range = (-127.0 * L["out_scale"], 127.0 * L["out_scale"])
    relu = network.add_activation(conv.get_output(0), trt.ActivationType.RELU)
    return finish_engine(builder, network, relu.get_output(0), L["out_scale"], "3x3 trt")


def run_case(name: str, n: int, reps: int, stream, rng, with_trt: bool) -> dict:
    c, hw, stride = LAYERS[name]
    ho = -(-hw // stride)
    L = random_conv3x3(rng, c)
    x = rng.integers(-128, 128, size=(n, c, hw, hw), dtype=np.int8)
    x32 = ref.to_nc32hw32(x)
    out_like = np.empty((n, c // 32, ho, ho, 32), np.int8)
    xb, ob = DeviceBuffer(x32.nbytes).upload(x32), DeviceBuffer(out_like.nbytes)
    row = {"layer": name, "kind": "conv3x3", "cin": c, "cout": c, "stride": stride, "batch": n,
           "bytes": int(x32.nbytes + out_like.nbytes + L["w"].nbytes), "ops": int(2 * n * ho * ho * 9 * c * c),
           "weights": "random"}
    layer = op.Conv3x3(L["w"], L["w_scale"], L["bias"], L["x_scale"], L["out_scale"], True, stride)
    outs, configs = {}, {}
    auto = layer.select_config(n, hw, hw)
    for i, cfg in enumerate(op.conv3x3_config_names()):
        ob.fill(0x5A)
        try:
            layer.forward(xb.ptr, ob.ptr, n, hw, hw, i, int(stream))
        except RuntimeError as e:
            if "(-9)" in str(e):  # this configuration cannot hold the layer
                continue
            raise
        ck(cudart.cudaStreamSynchronize(stream))
        outs[cfg] = ref.from_nc32hw32(ob.download(out_like), c)
        configs[cfg] = time_ms(lambda _: layer.forward(xb.ptr, ob.ptr, n, hw, hw, i, int(stream)), stream, reps)
        print(f"  {name} batch {n} ours {cfg}: {configs[cfg]:.4f} ms", flush=True)
    row["ours_configs_ms"] = configs
    row["ours_config"] = op.conv3x3_config_names()[auto]
    row["ours_ms"] = configs[row["ours_config"]]
    row["ours_best_ms"] = min(configs.values())
    if with_trt:  # TensorRT's own kernel, and ours as the plugin node inside a TensorRT engine
        from trtfuse.bench.layers.common import time_x_engines

        time_x_engines(lambda kind: trt_engine(kind, L, n, c, hw, stride), ("trt", "plugin"), xb.ptr, ob,
                       out_like, c, stream, reps, f"{name} batch {n}", row, outs)
        row["speedup"] = row["trt_ms"] / row["ours_ms"]
    layer.close()
    xb.free()
    ob.free()

    idx = np.unique([0, n // 2, n - 1])
    acc = ref.accumulate3x3(x[idx], L["w"], stride)
    args = (x[idx], None, L["w_scale"], L["bias"], None, L["x_scale"], 0.0, L["out_scale"], True)
    want32, want64 = ref.reference_fp32(*args, acc=acc), ref.reference_fp64(*args, acc=acc)
    row["checks"] = layer_checks(outs, idx, want32, want64, row["ours_config"])
    return row


def run(args) -> int:
    """`trtfuse bench layers --kind conv3x3` (trtfuse.bench.layers.resolve checked args)."""
    stream = ck(cudart.cudaStreamCreate())
    rng = np.random.default_rng(0)
    result = result_header(args.command, stream, not args.no_trt, peak_tops=args.peak_tops, layers=[])
    print(f"copy bandwidth {result['copy_gbps']:.0f} GB/s", flush=True)

    def case(name, n):
        row = run_case(name, n, args.reps, stream, rng, not args.no_trt)
        row["floor_ms"] = row["bytes"] / result["copy_gbps"] / 1e6
        row["ours_tops"] = row["ops"] / row["ours_ms"] / 1e9
        return row

    measure(args, result, "layers", case)
    print(f"\n{'layer':14} {'batch':>5} {'ours ms':>8} {'config':>20} {'TRT ms':>8} {'x TRT':>6} {'floor':>6} "
          f"{'% peak':>6}")
    for r in result["layers"]:
        trt_ms = r.get("trt_ms", float("nan"))
        print(f"{r['layer']:14} {r['batch']:5d} {r['ours_ms']:8.4f} {r['ours_config']:>20} {trt_ms:8.4f} "
              f"{trt_ms / r['ours_ms']:6.2f} {r['floor_ms']:6.3f} {100 * r['ours_tops'] / args.peak_tops:6.1f}")
    bad = [c for r in result["layers"] for c in r["checks"] if not c.get("ok", True)]
    print(f"checks: {len(bad)} failed" + (f": {bad}" if bad else ""))
    return 1 if bad else 0

