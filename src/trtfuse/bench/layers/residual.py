"""TensorRT 8.5 side by side: TensorRT's own int8 1x1 convs vs the TrtfuseResidualConv plugin.

For each layer and batch, on identical int8 data (kCHW32 in and out, device resident). Layers: the ResNet-50
bottleneck tails res2-res5 (conv3 + BN + Add + ReLU), the stage-opening projections proj1-proj4 (downsample
conv + BN, stride 1 at layer1 and 2 after, no residual, no ReLU), and fused1-fused2: a stage's first block, its
projection and its tail, which the plugin computes in one kernel (TensorRT: the projection conv, then the tail conv
with the Add and ReLU fused into it, as in the network):
  (a) a one-layer engine of TensorRT's own int8 Conv(1x1) (+ Add(residual) + ReLU for a tail): network API, int8
      I/O through dynamic ranges (implicit quantization; scale = range / 127), allowed formats CHW32, INT8 flag,
      tactic sources 0 (no cuBLAS/cuDNN on the GPU machine);
  (b) a one-layer engine with the plugin on the same int8 tensors;
checks both against the exact integer reference (the plugin: bit-exact with the rounding rule; TensorRT: within
1 LSB of the float64 formula, counted) and against each other; times both (CUDA events, median); measures device
copy bandwidth (cudaMemcpy D2D, bytes read + written); records the layers/tactics TensorRT picked; writes
benchmarks/results/residual_conv_h100.json. With --qdq it also builds the explicitly quantized ONNX graph
Q -> TrtfuseResidualConv -> DQ (the form the ONNX rewrite emits) and checks its output.

Run on the GPU machine with TensorRT 8.5 staged (see ../shared/device/README.md):
  source /opt/trt85/env.sh && source tools/dev_env.sh
  python3 -m trtfuse.plugin_build build --tensorrt-root /opt/trt85 --archs 90
  TRTFUSE_RESIDUAL_CONV_CACHE=benchmarks/results/residual_conv_tuning_h100.json \\
    python3.10 -m trtfuse bench layers --kind residual --qdq --out benchmarks/results/residual_conv_h100.json
"""

from __future__ import annotations

import json
import time

import numpy as np

import tensorrt as trt
from trtfuse.bench.cuda import DeviceBuffer, ck, compare, copy_gbps, cudart, time_ms
from trtfuse.sysinfo import cpu_model
from trtfuse.bench.layers import measure
# the tests drive this kind's cases and the plugin node through these names
from trtfuse.bench.layers.common import (LOGGER, PluginFields, _int8_io, check_binding_formats,  # noqa: F401
                                         create_plugin, finish_engine, layer_summary, load_plugin_library,
                                         plugin_creator, time_x_engines)
from trtfuse.ops import residual_conv_reference as ref
# the layers, as the tuner names them: STAGES (cin, cout, input h == w, stride, residual + ReLU (a tail) or neither (a
# projection)); FUSED, a stage's first block (proj_cin, cin, cout, input h == w, stride)
from trtfuse.tuning import RESNET50_FUSED as FUSED
from trtfuse.tuning import RESNET50_STAGES as STAGES


# ------------------------------------------------------------------------------------------------ engines
def build_engine(kind: str, L: dict, n: int, cin: int, cout: int, hw: int):
    """kind 'trt': Conv (+ Add + ReLU with a residual input) by TensorRT; 'plugin': TrtfuseResidualConv. L["r_scale"]
    0: no residual input; L["stride"] (default 1). Returns (engine, layer info)."""
    builder = trt.Builder(LOGGER)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH))
    stride = L.get("stride", 1)
    residual = L["r_scale"] != 0
    x = network.add_input("x", trt.int8, (n, cin, hw, hw))
    _int8_io(x, L["x_scale"])
    inputs = [x]
    if residual:
        ho = -(-hw // stride)
        r = network.add_input("r", trt.int8, (n, cout, ho, ho))
        _int8_io(r, L["r_scale"])
        inputs.append(r)
    if kind == "trt":
        w_float = (L["w"].astype(np.float32) * L["w_scale"][:, None]).astype(np.float32).reshape(cout, cin, 1, 1)
        conv = network.add_convolution_nd(
            x,
            cout,
            (1, 1),
            trt.Weights(np.ascontiguousarray(w_float)),
            trt.Weights(np.ascontiguousarray(L["bias"], dtype=np.float32)),
        )
        conv.stride_nd = (stride, stride)
        # the conv output is not materialized when TensorRT fuses the Add and ReLU into the conv (inspector
        # shows it); a range is still required on every tensor in implicit int8 mode
        conv.get_output(0).dynamic_range = (-127.0 * L["out_scale"], 127.0 * L["out_scale"])
        last = conv
        if residual:
            last = network.add_elementwise(conv.get_output(0), r, trt.ElementWiseOperation.SUM)
            last.get_output(0).dynamic_range = (-127.0 * L["out_scale"], 127.0 * L["out_scale"])
        if L["relu"]:
            last = network.add_activation(last.get_output(0), trt.ActivationType.RELU)
        out = last.get_output(0)
    else:
        plugin = create_plugin("residual_conv", L, cin, cout)
        if plugin is None:
            raise RuntimeError("create_plugin refused the fields (see stderr)")
        out = network.add_plugin_v2(inputs, plugin).get_output(0)
    return finish_engine(builder, network, out, L["out_scale"], kind)


def build_fused_engine(kind: str, T: dict, P: dict, n: int, hw: int):
    """A stage's first block: inputs x (the tail's, ceil(hw / stride) square) and xp (the block input, hw square).
    kind 'trt': the projection Conv (its int8 output range: P's out_scale), then the tail Conv + Add(projection) +
    ReLU, by TensorRT; 'plugin': one TrtfuseResidualConv with the projection's fields. Returns (engine, info)."""
    builder = trt.Builder(LOGGER)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH))
    cout, cin = T["w"].shape
    pcin, stride = P["w"].shape[1], P["stride"]
    ho = -(-hw // stride)
    x = network.add_input("x", trt.int8, (n, cin, ho, ho))
    _int8_io(x, T["x_scale"])
    xp = network.add_input("xp", trt.int8, (n, pcin, hw, hw))
    _int8_io(xp, P["x_scale"])

    def conv(inp, L, c_in, s):
        w = (L["w"].astype(np.float32) * L["w_scale"][:, None]).astype(np.float32).reshape(cout, c_in, 1, 1)
        layer = network.add_convolution_nd(inp, cout, (1, 1), trt.Weights(np.ascontiguousarray(w)),
                                           trt.Weights(np.ascontiguousarray(L["bias"], dtype=np.float32)))
        layer.stride_nd = (s, s)
        return layer.get_output(0)

    if kind == "trt":
        r = conv(xp, P, pcin, stride)
        r.dynamic_range = (-127.0 * P["out_scale"], 127.0 * P["out_scale"])
        y = conv(x, T, cin, 1)
        y.dynamic_range = (-127.0 * T["out_scale"], 127.0 * T["out_scale"])
        add = network.add_elementwise(y, r, trt.ElementWiseOperation.SUM)
        add.get_output(0).dynamic_range = (-127.0 * T["out_scale"], 127.0 * T["out_scale"])
        out = network.add_activation(add.get_output(0), trt.ActivationType.RELU).get_output(0)
    else:
        plugin = create_plugin("proj_tail", T, cin, cout, P)
        if plugin is None:
            raise RuntimeError("create_plugin refused the fused fields (see stderr)")
        out = network.add_plugin_v2([x, xp], plugin).get_output(0)
    return finish_engine(builder, network, out, T["out_scale"], f"fused {kind}")


# ------------------------------------------------------------------------------------------------ one case
def run_case(stage: str, n: int, reps: int, stream, rng) -> dict:
    cin, cout, hw, stride, residual = STAGES[stage]
    ho = -(-hw // stride)
    L = ref.random_layer(rng, cin, cout, relu=residual)
    L["stride"] = stride
    if not residual:
        L["r_scale"] = 0.0
    x = rng.integers(-128, 128, size=(n, cin, hw, hw), dtype=np.int8)
    # the residual (zeros for a projection: the reference's residual term is then 0)
    r = rng.integers(-128, 128, size=(n, cout, ho, ho), dtype=np.int8) if residual else None
    x32 = ref.to_nc32hw32(x)
    r32 = ref.to_nc32hw32(r) if residual else None
    out_like = np.empty((n, cout // 32, ho, ho, 32), dtype=np.int8)
    # Rotate among input sets when one set would sit in L2 (50 MB) between runs; both engines get the same.
    set_bytes = x32.nbytes + out_like.nbytes + (r32.nbytes if residual else 0)
    sets = int(max(1, min(4, np.ceil((256 << 20) / set_bytes))))
    bufs = [
        (
            DeviceBuffer(x32.nbytes).upload(x32),
            DeviceBuffer(r32.nbytes).upload(r32) if residual else None,
            DeviceBuffer(out_like.nbytes),
        )
        for _ in range(sets)
    ]

    row = {
        "stage": stage,
        "kind": "tail" if residual else "proj",
        "batch": n,
        "stride": stride,
        # bytes a kernel must move: x (read once per output position: every stride-th pixel; kCHW32 keeps a
        # pixel's 32 channels in one 32-byte sector), the residual, the output, the weights
        "bytes": int(x.nbytes // (stride * stride) + out_like.nbytes * (2 if residual else 1) + L["w"].nbytes),
        "ops": int(2 * n * ho * ho * cin * cout),
    }
    outs = {}
    for kind in ("trt", "plugin"):
        t0 = time.time()
        engine, info = build_engine(kind, L, n, cin, cout, hw)
        check_binding_formats(engine)
        ctx = engine.create_execution_context()
        names = [engine.get_binding_name(i) for i in range(engine.num_bindings)]
        bindings = [
            [{"x": xb.ptr, "r": rb.ptr if rb else 0, "out": ob.ptr}[nm] for nm in names] for xb, rb, ob in bufs
        ]
        for _, _, ob in bufs:
            ob.fill(0x5A)  # poison
        if not ctx.execute_async_v2(bindings[0], int(stream)):
            raise RuntimeError(f"{kind}: execute_async_v2 failed")
        ck(cudart.cudaStreamSynchronize(stream))
        outs[kind] = ref.from_nc32hw32(bufs[0][2].download(out_like), cout)
        row[f"{'ours' if kind == 'plugin' else 'trt'}_ms"] = time_ms(
            lambda i: ctx.execute_async_v2(bindings[i % sets], int(stream)), stream, reps
        )
        row[f"{kind}_layers"] = layer_summary(info)
        print(
            f"  {stage} batch {n} {kind}: built in {time.time() - t0:.0f} s, "
            f"{row['ours_ms' if kind == 'plugin' else 'trt_ms']:.4f} ms; layers: {row[f'{kind}_layers']}",
            flush=True,
        )
        del ctx, engine
    for b in bufs:
        for buf in b:
            if buf:
                buf.free()

    # Exact reference on a few images (all of them when small): the first, the last, one in the middle.
    idx = np.unique([0, n // 2, n - 1]) if n > 8 else np.arange(n)
    args = (x[idx], L["w"], L["w_scale"], L["bias"], r[idx] if residual else None, L["x_scale"], L["r_scale"],
            L["out_scale"], residual)
    acc = ref.accumulate(x[idx], L["w"], stride)
    want32, want64 = ref.reference_fp32(*args, acc=acc), ref.reference_fp64(*args, acc=acc)
    row["checks"] = [
        compare("plugin vs rounding rule (exact)", outs["plugin"][idx], want32, exact=True),
        compare("plugin vs float64 formula", outs["plugin"][idx], want64, exact=False),
        compare("TensorRT vs float64 formula", outs["trt"][idx], want64, exact=False),
        compare("plugin vs TensorRT (all images)", outs["plugin"], outs["trt"], exact=False),
    ]
    row["speedup"] = row["trt_ms"] / row["ours_ms"]
    return row


def run_fused_case(stage: str, n: int, reps: int, stream, rng) -> dict:
    """A stage's first block: TensorRT's two convs (projection; tail + Add + ReLU) against the plugin's one kernel,
    on the same int8 inputs; the plugin exact against the composed rounding rule."""
    pcin, cin, cout, hw, stride = FUSED[stage]
    ho = -(-hw // stride)
    T, P = ref.random_layer(rng, cin, cout, True), ref.random_layer(rng, pcin, cout, False)
    P["stride"] = stride
    T["r_scale"] = P["out_scale"]  # the tail reads the projection's int8 output at its scale, as in the network
    x = rng.integers(-128, 128, size=(n, cin, ho, ho), dtype=np.int8)
    xp = rng.integers(-128, 128, size=(n, pcin, hw, hw), dtype=np.int8)
    x32, xp32 = ref.to_nc32hw32(x), ref.to_nc32hw32(xp)
    out_like = np.empty((n, cout // 32, ho, ho, 32), dtype=np.int8)
    sets = int(max(1, min(4, np.ceil((256 << 20) / (x32.nbytes + xp32.nbytes + out_like.nbytes)))))
    bufs = [(DeviceBuffer(x32.nbytes).upload(x32), DeviceBuffer(xp32.nbytes).upload(xp32),
             DeviceBuffer(out_like.nbytes)) for _ in range(sets)]
    row = {
        "stage": stage,
        "kind": "fused-proj-tail",
        "batch": n,
        "stride": stride,
        # what one kernel must move: x, xp (every stride-th pixel), the output, both weight matrices
        "bytes": int(x.nbytes + xp.nbytes // (stride * stride) + out_like.nbytes + T["w"].nbytes + P["w"].nbytes),
        "ops": int(2 * n * ho * ho * (cin + pcin) * cout),
    }
    outs = {}
    for kind in ("trt", "plugin"):
        t0 = time.time()
        engine, info = build_fused_engine(kind, T, P, n, hw)
        check_binding_formats(engine)
        ctx = engine.create_execution_context()
        names = [engine.get_binding_name(i) for i in range(engine.num_bindings)]
        bindings = [[{"x": xb.ptr, "xp": pb.ptr, "out": ob.ptr}[nm] for nm in names] for xb, pb, ob in bufs]
        for _, _, ob in bufs:
            ob.fill(0x5A)
        if not ctx.execute_async_v2(bindings[0], int(stream)):
            raise RuntimeError(f"{kind}: execute_async_v2 failed")
        ck(cudart.cudaStreamSynchronize(stream))
        outs[kind] = ref.from_nc32hw32(bufs[0][2].download(out_like), cout)
        key = "ours_ms" if kind == "plugin" else "trt_ms"
        row[key] = time_ms(lambda i: ctx.execute_async_v2(bindings[i % sets], int(stream)), stream, reps)
        row[f"{kind}_layers"] = layer_summary(info)
        print(f"  {stage} batch {n} {kind}: built in {time.time() - t0:.0f} s, {row[key]:.4f} ms; "
              f"layers: {row[f'{kind}_layers']}", flush=True)
        del ctx, engine
    for b in bufs:
        for buf in b:
            buf.free()
    idx = np.unique([0, n // 2, n - 1]) if n > 8 else np.arange(n)
    r = ref.reference_fp32(xp[idx], P["w"], P["w_scale"], P["bias"], None, P["x_scale"], 0.0, P["out_scale"], False,
                           stride=stride)
    args = (x[idx], T["w"], T["w_scale"], T["bias"], r, T["x_scale"], T["r_scale"], T["out_scale"], True)
    row["checks"] = [
        compare("plugin vs rounding rule, projection then tail (exact)", outs["plugin"][idx],
                ref.reference_fp32(*args), exact=True),
    ]
    # Informational, not a check: in this implicitly quantized network TensorRT may fuse the Add into the
    # projection's conv instead of the tail's (trt_layers says which), quantizing the tail conv's output to int8 at
    # the output's scale first: another function than the network's Q/DQ graph, where the projection's output is
    # the quantized tensor (the engines built from that graph are compared by the e2e suite's agreement stage).
    # Where TensorRT fuses as the graph does, a 1-LSB difference in the projection's output moves the tail's value
    # by r_scale / out_scale LSB, on top of the tail's own 1 LSB.
    row["trt_agreement"] = compare("plugin vs TensorRT (all images, informational)", outs["plugin"], outs["trt"],
                                   exact=False, bound=1 + int(np.ceil(T["r_scale"] / T["out_scale"])))
    row["speedup"] = row["trt_ms"] / row["ours_ms"]
    return row


# ------------------------------------------------------------------------------------------------ small checks
def run_engine_once(engine, x32: np.ndarray, r32, out_like: np.ndarray, stream) -> np.ndarray:
    """One run of a built engine on host arrays (r32 None: the engine has no residual input)."""
    bx, bo = DeviceBuffer(x32.nbytes), DeviceBuffer(out_like.nbytes)
    br = DeviceBuffer(r32.nbytes) if r32 is not None else None
    bx.upload(x32)
    if br:
        br.upload(r32)
    bo.fill(0x5A)  # poison
    ctx = engine.create_execution_context()
    ptrs = {"x": bx.ptr, "r": br.ptr if br else 0, "out": bo.ptr}
    if not ctx.execute_async_v2(
        [ptrs[engine.get_binding_name(i)] for i in range(engine.num_bindings)], int(stream)
    ):
        raise RuntimeError("execute_async_v2 failed")
    ck(cudart.cudaStreamSynchronize(stream))
    out = bo.download(out_like)
    for b in (bx, br, bo):
        if b:
            b.free()
    return out


def plugin_round_trip_check(rng, stream, relu: bool = True, residual: bool = True, stride: int = 1) -> dict:
    """One small plugin layer (odd N*H*W, Cout not a multiple of 64): exact against the rounding rule, before and
    after engine serialization + deserialization. residual False: the projection form (x only, r_scale 0); stride
    2: an odd input size."""
    n, cin, cout, hw = 3, 96, 160, 5
    ho = -(-hw // stride)
    L = ref.random_layer(rng, cin, cout, relu)
    L["stride"] = stride
    if not residual:
        L["r_scale"] = 0.0
    x = rng.integers(-128, 128, size=(n, cin, hw, hw), dtype=np.int8)
    r = rng.integers(-128, 128, size=(n, cout, ho, ho), dtype=np.int8)
    x32 = ref.to_nc32hw32(x)
    r32 = ref.to_nc32hw32(r) if residual else None
    out_like = np.empty((n, cout // 32, ho, ho, 32), np.int8)
    engine, info = build_engine("plugin", L, n, cin, cout, hw)
    check_binding_formats(engine)
    want = ref.reference_fp32(x, L["w"], L["w_scale"], L["bias"], r if residual else None, L["x_scale"],
                              L["r_scale"], L["out_scale"], relu, stride=stride)
    got = ref.from_nc32hw32(run_engine_once(engine, x32, r32, out_like, stream), cout)
    engine2 = trt.Runtime(LOGGER).deserialize_cuda_engine(engine.serialize())
    if engine2 is None:
        raise RuntimeError("deserializing the plugin engine failed")
    got2 = ref.from_nc32hw32(run_engine_once(engine2, x32, r32, out_like, stream), cout)
    what = f"small plugin layer relu={relu} residual={residual} stride={stride}"
    res = {
        "built": compare(what, got, want, exact=True),
        "round_trip": compare(f"{what} after serialize/deserialize", got2, want, exact=True),
        "layers": layer_summary(info),
    }
    res["ok"] = res["built"]["ok"] and res["round_trip"]["ok"]
    return res


# ------------------------------------------------------------------------------------------------ Q/DQ ONNX
def qdq_onnx_check(rng, stream) -> dict:
    """x, r float -> QuantizeLinear -> TrtfuseResidualConv (domain trtfuse; weights an INT32 tensor attribute, as
    src/trtfuse/passes/residual_conv_rewrite.py emits them) -> DequantizeLinear -> float,
    parsed by TensorRT's ONNX parser, built with the INT8 flag: the plugin must see int8 in and out."""
    from onnx import TensorProto, helper, numpy_helper

    n, cin, cout, hw = 2, 256, 1024, 14
    L = ref.random_layer(rng, cin, cout, relu=True)
    xq = rng.integers(-128, 128, size=(n, cin, hw, hw), dtype=np.int8)
    rq = rng.integers(-128, 128, size=(n, cout, hw, hw), dtype=np.int8)
    xf = xq.astype(np.float32) * np.float32(
        L["x_scale"]
    )  # exactly representable, re-quantizes to xq
    rf = rq.astype(np.float32) * np.float32(L["r_scale"])

    def scal(name, v, dt=TensorProto.FLOAT):
        return helper.make_tensor(name, dt, [], [v])

    node = helper.make_node(
        "TrtfuseResidualConv",
        ["xq", "rq"],
        ["yq"],
        domain="trtfuse",
        plugin_version="1",
        plugin_namespace="",
        weights=numpy_helper.from_array(L["w"].astype(np.int32), "weights"),
        w_scale=[float(v) for v in L["w_scale"]],
        bias=[float(v) for v in L["bias"]],
        x_scale=float(L["x_scale"]),
        r_scale=float(L["r_scale"]),
        out_scale=float(L["out_scale"]),
        relu=1,
        cin=cin,
        cout=cout,
    )
    graph = helper.make_graph(
        [
            helper.make_node("QuantizeLinear", ["x", "xs", "zp"], ["xq"]),
            helper.make_node("QuantizeLinear", ["r", "rs", "zp"], ["rq"]),
            node,
            helper.make_node("DequantizeLinear", ["yq", "ys", "zp"], ["y"]),
        ],
        "qdq_residual_conv",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, cin, hw, hw]),
            helper.make_tensor_value_info("r", TensorProto.FLOAT, [n, cout, hw, hw]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, cout, hw, hw])],
        initializer=[
            scal("xs", L["x_scale"]),
            scal("rs", L["r_scale"]),
            scal("ys", L["out_scale"]),
            scal("zp", 0, TensorProto.INT8),
        ],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("trtfuse", 1)]
    )
    builder = trt.Builder(LOGGER)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH))
    parser = trt.OnnxParser(network, LOGGER)
    if not parser.parse(model.SerializeToString()):
        raise RuntimeError(
            "ONNX parse failed: "
            + "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        )
    config = builder.create_builder_config()
    config.set_flag(trt.BuilderFlag.INT8)
    config.set_tactic_sources(0)
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    blob = builder.build_serialized_network(network, config)
    if blob is None:
        raise RuntimeError("building the Q/DQ engine failed")
    engine = trt.Runtime(LOGGER).deserialize_cuda_engine(blob)
    info = json.loads(
        engine.create_engine_inspector().get_engine_information(trt.LayerInformationFormat.JSON)
    )
    ctx = engine.create_execution_context()
    bx, br = DeviceBuffer(xf.nbytes).upload(xf), DeviceBuffer(rf.nbytes).upload(rf)
    y_like = np.empty((n, cout, hw, hw), np.float32)
    by = DeviceBuffer(y_like.nbytes)
    by.fill(0x7F)
    ptrs = {"x": bx.ptr, "r": br.ptr, "y": by.ptr}
    if not ctx.execute_async_v2(
        [ptrs[engine.get_binding_name(i)] for i in range(engine.num_bindings)], int(stream)
    ):
        raise RuntimeError("Q/DQ engine: execute_async_v2 failed")
    ck(cudart.cudaStreamSynchronize(stream))
    y = by.download(y_like)
    for b in (bx, br, by):
        b.free()
    want = ref.reference_fp32(
        xq, L["w"], L["w_scale"], L["bias"], rq, L["x_scale"], L["r_scale"], L["out_scale"], True
    )
    yq = np.rint(y / np.float32(L["out_scale"])).astype(np.int32)
    res = compare(
        "Q/DQ ONNX graph with the plugin vs rounding rule",
        yq.clip(-128, 127).astype(np.int8),
        want,
        exact=True,
    )
    res["layers"] = layer_summary(info)
    print(f"    Q/DQ engine layers: {res['layers']}")
    return res


# ------------------------------------------------------------------------------------------------ main
def run(args) -> int:
    """`trtfuse bench layers --kind residual` (trtfuse.bench.layers.resolve checked args)."""
    lib = load_plugin_library()
    print(f"TensorRT {trt.__version__}, plugin library {lib}")
    ck(cudart.cudaSetDevice(0))
    props = ck(cudart.cudaGetDeviceProperties(0))
    gpu = props.name.decode() if isinstance(props.name, bytes) else str(props.name)
    stream = ck(cudart.cudaStreamCreate())
    rng = np.random.default_rng()
    gbps = copy_gbps(stream)
    print(f"{gpu}: device copy {gbps:.0f} GB/s (read + write)", flush=True)

    result = {"gpu": gpu, "cpu_model": cpu_model(), "copy_gbps": gbps, "tensorrt": trt.__version__, "rows": []}
    result["round_trip_check"] = [
        plugin_round_trip_check(rng, stream, relu) for relu in (True, False)
    ] + [plugin_round_trip_check(rng, stream, False, residual=False, stride=stride) for stride in (1, 2)]
    if args.qdq:
        result["qdq_check"] = qdq_onnx_check(rng, stream)
    measure(args, result, "rows",
            lambda stage, n: (run_fused_case if stage in FUSED else run_case)(stage, n, args.reps, stream, rng))

    ok = (
        all(c["ok"] for row in result["rows"] for c in row["checks"])
        and all(c["ok"] for c in result["round_trip_check"])
        and result.get("qdq_check", {}).get("ok", True)
    )
    print(f"\n{gpu}, TensorRT {trt.__version__}: copy {gbps:.0f} GB/s")
    print(
        f"{'stage':5} {'batch':>5} {'ours ms':>8} {'trt ms':>8} {'speedup':>7} {'floor ms':>8} {'%floor':>6} {'checks':>6}"
    )
    for row in result["rows"]:
        floor = row["bytes"] / gbps / 1e6
        print(
            f"{row['stage']:5} {row['batch']:5d} {row['ours_ms']:8.4f} {row['trt_ms']:8.4f} {row['speedup']:7.3f} "
            f"{floor:8.4f} {100 * floor / row['ours_ms']:6.1f} {'ok' if all(c['ok'] for c in row['checks']) else 'FAIL':>6}"
        )
    print(f"wrote {args.out}; all checks {'passed' if ok else 'FAILED'}")
    return 0 if ok else 1

