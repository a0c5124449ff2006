"""A ResNet-50 layer1 tail, or the stem, with the next bottleneck's conv1 chained onto it: our one sm_90a kernel
against TensorRT 8.5's two (the tail's conv + Add + ReLU, or its stem's conv + ReLU + max pool, then the conv1 + ReLU
reading that output back from memory).

Pairs: the three layer1 tails with the next block's conv1 (kind "fused-tail-conv1", int8 kCHW32 inputs), and the stem
with layer1.0's conv1 ("stem+layer1.0.conv1", kind "fused-stem-conv1": the int8 LINEAR input [n, 3, 224, 224] as the
network's, the stem 3 -> 64, the conv1 64 -> 64 1x1 + ReLU on the 56 x 56 pooled output; TensorRT's stem as
the stem kind (stem.py) builds it). For each pair and batch, on identical int8 inputs (device resident), in one process:
  (a) ours through the C ABI: forward_next (one kernel where it chains), and the same two layers as two of our own
      launches (the tail or the stem, then the conv1), which shows what the chaining itself saves;
  (b) with TensorRT: a two-output engine of TensorRT's own kernels (network API, int8 I/O through dynamic ranges,
      INT8 flag, tactic sources 0, as common.py), and the TrtfuseResidualConv node with next_* fields (two
      outputs) in an engine;
checks both of our outputs bit-exact against the composed rounding rule on three images (the conv1 reads the tail's
or the stem's int8 output) and every engine against ours, times each (CUDA events, median of --reps), and sets them
against the DRAM floor (every input, both outputs, at the copy bandwidth measured in the same run). Random weights:
performance only.

  python3.10 -m trtfuse bench layers --kind next --out benchmarks/results/next_conv_h100.json   (TensorRT staged)
  python3 -m trtfuse bench layers --kind next --no-trt --out /tmp/next.json                     (ours only)
"""

from __future__ import annotations

import numpy as np

from trtfuse.bench.cuda import DeviceBuffer, ck, compare, cudart, result_header, time_ms
from trtfuse.bench.layers import NEXT_PAIRS as PAIRS
from trtfuse.bench.layers import STEM_PAIR, measure
from trtfuse.errors import UserError
from trtfuse.ops import residual_conv as op
from trtfuse.ops import residual_conv_reference as ref

HW = 56
# PAIRS (the layers table's NEXT_PAIRS): pair -> (tail cin, tail cout, next cout, projection cin or 0); STEM_PAIR: the
# stem (stem.py's: 3 x 224 x 224 -> 64 x 56 x 56) and layer1.0's conv1 (64 -> STEM_NEXT_COUT, 1x1 + ReLU)
STEM_NEXT_COUT = 64
NAMES = [*PAIRS, STEM_PAIR]


def random_pair(rng, cin, cout, next_cout, proj_cin):
    T, N = ref.random_layer(rng, cin, cout, True), ref.random_layer(rng, cout, next_cout, True)
    N["x_scale"] = T["out_scale"]  # the conv1 reads the tail's int8 output at the scale it was quantized by
    P = None
    if proj_cin:
        P = ref.random_layer(rng, proj_cin, cout, False)
        P["stride"] = 1
        T["r_scale"] = P["out_scale"]  # the tail reads the projection's int8 output at its scale
    return T, N, P


def trt_engine(kind: str, T: dict, N: dict, P: dict | None, n: int):
    """kind 'trt': TensorRT's own layers (the projection, if any; the tail's conv + Add + ReLU; the conv1 + ReLU),
    both the tail's output and the conv1's marked as outputs; 'plugin': one TrtfuseResidualConv node with the next_*
    (and proj_*) fields. Inputs "x" and "r" (or "xp"), outputs "out" and "next". Returns (engine, layer info)."""
    import tensorrt as trt
    from trtfuse.bench.layers.common import LOGGER, _int8_io, create_plugin, finish_engine

    builder = trt.Builder(LOGGER)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH))
    cout, cin = T["w"].shape
    x = network.add_input("x", trt.int8, (n, cin, HW, HW))
    _int8_io(x, T["x_scale"])
    if P is None:
        second = network.add_input("r", trt.int8, (n, cout, HW, HW))
        _int8_io(second, T["r_scale"])
    else:
        second = network.add_input("xp", trt.int8, (n, P["w"].shape[1], HW, HW))
        _int8_io(second, P["x_scale"])
    more = lambda nxt: ((nxt, "next", N["out_scale"]),)  # noqa: E731
    if kind == "plugin":
        plugin = create_plugin("tail_next", {**T, "relu": 1}, cin, cout, P, N)
        if plugin is None:
            raise RuntimeError("create_plugin refused the next_* fields (see stderr)")
        node = network.add_plugin_v2([x, second], plugin)
        return finish_engine(builder, network, node.get_output(0), T["out_scale"], "tail+next plugin",
                             more(node.get_output(1)))

    r = second if P is None else trt_conv1x1(network, second, P, False, P["out_scale"])
    y = trt_conv1x1(network, x, T, False, T["out_scale"])
    add = network.add_elementwise(y, r, trt.ElementWiseOperation.SUM).get_output(0)
    add.dynamic_range = (-127.0 * T["out_scale"], 127.0 * T["out_scale"])
    out = network.add_activation(add, trt.ActivationType.RELU).get_output(0)
    out.dynamic_range = (-127.0 * T["out_scale"], 127.0 * T["out_scale"])
    return finish_engine(builder, network, out, T["out_scale"], "tail+next trt",
                         more(trt_conv1x1(network, out, N, True, N["out_scale"])))


def trt_conv1x1(network, inp, L: dict, relu: bool, scale: float):
    """TensorRT's 1x1 conv of L (+ ReLU) on inp, its int8 range at `scale`; returns its output tensor."""
    import tensorrt as trt

    co, ci = L["w"].shape
    w = (L["w"].astype(np.float32) * L["w_scale"][:, None]).astype(np.float32).reshape(co, ci, 1, 1)
    t = network.add_convolution_nd(inp, co, (1, 1), trt.Weights(np.ascontiguousarray(w)),
                                   trt.Weights(np.ascontiguousarray(L["bias"], dtype=np.float32))).get_output(0)
    t.dynamic_range = (-127.0 * scale, 127.0 * scale)
    if relu:
        t = network.add_activation(t, trt.ActivationType.RELU).get_output(0)
    return t


def stem_trt_engine(kind: str, S: dict, N: dict, n: int):
    """The stem pair. kind 'trt': TensorRT's own stem (stem.py's Conv 7x7/2 + ReLU + MaxPool 3x3/2), then its
    1x1 conv + ReLU of the pooled output; 'plugin': one TrtfuseResidualConv node with kernel_size 7 and the next_*
    fields. Input "x" (int8 LINEAR, as the network's), outputs "out" and "next" (kCHW32). Returns (engine, info)."""
    import tensorrt as trt
    from trtfuse.bench.layers.common import LOGGER, create_plugin, finish_engine
    from trtfuse.bench.layers.stem import CIN, COUT, add_trt_stem, stem_fields, stem_input

    builder = trt.Builder(LOGGER)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH))
    x = stem_input(network, S, n)
    more = lambda nxt: ((nxt, "next", N["out_scale"]),)  # noqa: E731
    if kind == "plugin":
        plugin = create_plugin("stem_next", stem_fields(S), CIN, COUT, None, N)
        if plugin is None:
            raise RuntimeError("create_plugin refused the stem's next_* fields (see stderr)")
        node = network.add_plugin_v2([x], plugin)
        return finish_engine(builder, network, node.get_output(0), S["out_scale"], "stem+next plugin",
                             more(node.get_output(1)))
    out = add_trt_stem(network, x, S)
    return finish_engine(builder, network, out, S["out_scale"], "stem+next trt",
                         more(trt_conv1x1(network, out, N, True, N["out_scale"])))


class PairOutputs:
    """A pair's two device outputs, int8 kCHW32 [n, cout, h, w] and [n, next_cout, h, w]: poisoned before each run,
    read back as NCHW."""

    def __init__(self, n: int, cout: int, next_cout: int, h: int, w: int):
        self.cout, self.next_cout = cout, next_cout
        self.out_like = np.empty((n, -(-cout // 32), h, w, 32), np.int8)
        self.next_like = np.empty((n, -(-next_cout // 32), h, w, 32), np.int8)
        self.ob, self.nb = DeviceBuffer(self.out_like.nbytes), DeviceBuffer(self.next_like.nbytes)
        self.nbytes = self.out_like.nbytes + self.next_like.nbytes

    def poison(self) -> None:
        self.ob.fill(0x5A)
        self.nb.fill(0x5A)

    def read(self) -> tuple[np.ndarray, np.ndarray]:
        return (ref.from_nc32hw32(self.ob.download(self.out_like), self.cout),
                ref.from_nc32hw32(self.nb.download(self.next_like), self.next_cout))

    def free(self) -> None:
        self.ob.free()
        self.nb.free()


def time_ours(row: dict, label: str, fns, dev: PairOutputs, stream, reps: int, outs: dict) -> None:
    """For each (kind, fn) of ours: one run into the poisoned outputs (read into outs[kind]), then CUDA-event timing
    (median of reps) into row[kind + "_ms"]."""
    for kind, fn in fns:
        dev.poison()
        fn(0)
        ck(cudart.cudaStreamSynchronize(stream))
        outs[kind] = dev.read()
        row[f"{kind}_ms"] = time_ms(fn, stream, reps)
        print(f"  {label} {kind}: {row[f'{kind}_ms']:.4f} ms", flush=True)


def time_engines(row: dict, label: str, build, ptrs: dict, dev: PairOutputs, stream, reps: int, outs: dict) -> None:
    """TensorRT's two layers ('trt') and the plugin node ('plugin'), each build(kind) -> (engine, info) bound by
    name (ptrs: the inputs'; "out" and "next" are dev's): one run into the poisoned outputs (outs[kind]), then timing
    into row["trt_ms"] / row["plugin_engine_ms"], the engine's layers into row[kind + "_layers"]; row["speedup"]."""
    from trtfuse.bench.layers.common import layer_summary

    ptrs = {**ptrs, "out": dev.ob.ptr, "next": dev.nb.ptr}
    for kind in ("trt", "plugin"):
        engine, info = build(kind)
        ctx = engine.create_execution_context()
        bindings = [ptrs[engine.get_binding_name(i)] for i in range(engine.num_bindings)]
        dev.poison()
        if not ctx.execute_async_v2(bindings, int(stream)):
            raise RuntimeError(f"{kind}: execute_async_v2 failed")
        ck(cudart.cudaStreamSynchronize(stream))
        outs[kind] = dev.read()
        key = "trt_ms" if kind == "trt" else "plugin_engine_ms"
        row[key] = time_ms(lambda _, c=ctx: c.execute_async_v2(bindings, int(stream)), stream, reps)
        row[f"{kind}_layers"] = layer_summary(info)
        print(f"  {label} {kind} engine: {row[key]:.4f} ms; {row[f'{kind}_layers']}", flush=True)
        del ctx, engine
    row["speedup"] = row["trt_ms"] / row["ours_ms"]


def time_pair(row: dict, label: str, chained, separate, layers, build, ptrs: dict, dev: PairOutputs, stream,
              reps: int, with_trt: bool) -> dict:
    """One pair's timings into row: ours chained ('ours') and as two launches ('ours_separate'), then the layers are
    closed, then (with_trt) TensorRT's two layers and the plugin node (time_engines). Returns each one's outputs."""
    outs = {}
    time_ours(row, label, (("ours", chained), ("ours_separate", separate)), dev, stream, reps, outs)
    for layer in layers:
        layer.close()
    if with_trt:
        time_engines(row, label, build, ptrs, dev, stream, reps, outs)
    return outs


def check_images(n: int) -> np.ndarray:
    """The images of a batch of n whose outputs are checked against the rounding rule: first, middle, last."""
    return np.unique([0, n // 2, n - 1])


def record_checks(row: dict, outs: dict, idx, want: np.ndarray, N: dict, what: str) -> dict:
    """row["checks"]: the exact checks of every run but TensorRT's, both outputs on images idx (want: `what`'s output
    there by the rounding rule; the conv1 N's, of that int8 output, is computed here); row["trt_agreement"], where
    TensorRT ran: its agreement with ours at `what`'s output, informational. Returns row."""
    want_next = ref.reference_fp32(want, N["w"], N["w_scale"], N["bias"], None, N["x_scale"], 0.0, N["out_scale"],
                                   True)
    row["checks"] = []
    for kind, (got, got_next) in outs.items():
        if kind == "trt":  # TensorRT's own kernels: within 1 LSB of ours at the first layer (its rounding)
            row["trt_agreement"] = compare(f"TensorRT vs ours, {what} output (all images)", got, outs["ours"][0],
                                           exact=False)
            continue
        row["checks"] += [compare(f"{kind}: {what} vs rounding rule (exact)", got[idx], want, exact=True),
                          compare(f"{kind}: conv1 vs rounding rule of the {what}'s output (exact)", got_next[idx],
                                  want_next, exact=True)]
    return row


def run_case(name: str, n: int, reps: int, stream, rng, with_trt: bool, config: int = -1) -> dict:
    """One pair at batch n; `config` (>= 0): the tail pair's chained launch on that configuration."""
    if name == STEM_PAIR:
        return run_stem_case(n, reps, stream, rng, with_trt)
    cin, cout, next_cout, proj_cin = PAIRS[name]
    T, N, P = random_pair(rng, cin, cout, next_cout, proj_cin)
    x = rng.integers(-128, 128, size=(n, cin, HW, HW), dtype=np.int8)
    second = rng.integers(-128, 128, size=(n, proj_cin or cout, HW, HW), dtype=np.int8)
    xb, sb = DeviceBuffer(x.nbytes).upload(ref.to_nc32hw32(x)), DeviceBuffer(second.nbytes).upload(
        ref.to_nc32hw32(second))
    dev = PairOutputs(n, cout, next_cout, HW, HW)
    row = {"layer": name, "kind": "fused-tail-conv1", "batch": n, "weights": "random",
           "bytes": int(x.nbytes + second.nbytes + dev.nbytes),
           "ops": int(2 * n * HW * HW * (cin * cout + proj_cin * cout + cout * next_cout))}
    tail = (T["w"], T["w_scale"], T["bias"], T["x_scale"], T["r_scale"], T["out_scale"], True)
    layer = op.ProjTail(*tail, P["w"], P["w_scale"], P["bias"], P["x_scale"], P["out_scale"], 1) if P else \
        op.ResidualConv(*tail)
    layer.attach_next(N["w"], N["w_scale"], N["bias"], N["x_scale"], N["out_scale"], True)
    conv1 = op.ResidualConv(N["w"], N["w_scale"], N["bias"], N["x_scale"], 0.0, N["out_scale"], True)
    ws = DeviceBuffer(layer.workspace_size(n, HW, HW) if P else 0)
    row["ours_chained"] = layer.next_fuses(config, n, HW, HW)
    if config >= 0:
        row["ours_config"] = op.config_names()[config]
    ob, nb = dev.ob, dev.nb

    def ours_chained(_):
        layer.forward_next(xb.ptr, sb.ptr, ob.ptr, nb.ptr, n, HW, HW, ws.ptr, config, int(stream))

    def ours_separate(_):
        if P:
            layer.forward(xb.ptr, sb.ptr, ob.ptr, n, HW, HW, ws.ptr, -1, int(stream))
        else:
            layer.forward(xb.ptr, sb.ptr, ob.ptr, n, HW, HW, -1, int(stream))
        conv1.forward(ob.ptr, 0, nb.ptr, n, HW, HW, -1, int(stream))

    outs = time_pair(row, f"{name} batch {n}", ours_chained, ours_separate, (layer, conv1),
                     lambda kind: trt_engine(kind, T, N, P, n), {"x": xb.ptr, "r": sb.ptr, "xp": sb.ptr}, dev, stream,
                     reps, with_trt)
    for b in (xb, sb, ws):
        b.free()
    dev.free()

    idx = check_images(n)
    r = second[idx] if P is None else ref.reference_fp32(second[idx], P["w"], P["w_scale"], P["bias"], None,
                                                         P["x_scale"], 0.0, P["out_scale"], False)
    want = ref.reference_fp32(x[idx], T["w"], T["w_scale"], T["bias"], r, T["x_scale"], T["r_scale"], T["out_scale"],
                              True)
    return record_checks(row, outs, idx, want, N, "tail")


def run_stem_case(n: int, reps: int, stream, rng, with_trt: bool) -> dict:
    """The stem (int8 LINEAR input, as the network's) with layer1.0's conv1 chained: forward_next, the stem's forward
    then the conv1's as two of our launches, and (with TensorRT) its stem and conv1 and the plugin node."""
    from trtfuse.bench.layers.stem import CIN, COUT, random_stem
    from trtfuse.bench.layers.stem import HW as IN_HW

    S = random_stem(rng)
    N = ref.random_layer(rng, COUT, STEM_NEXT_COUT, True)
    N["x_scale"] = S["out_scale"]  # the conv1 reads the stem's int8 output at the scale it was quantized by
    hp, wp = op.stem_output_hw(IN_HW, IN_HW)
    x = rng.integers(-128, 128, size=(n, CIN, IN_HW, IN_HW), dtype=np.int8)
    xb = DeviceBuffer(x.nbytes).upload(x)   # linear NCHW
    dev = PairOutputs(n, COUT, STEM_NEXT_COUT, hp, wp)
    row = {"layer": STEM_PAIR, "kind": "fused-stem-conv1", "batch": n, "weights": "random",
           "bytes": int(x.nbytes + dev.nbytes),
           "ops": int(2 * n * (IN_HW // 2) ** 2 * 49 * CIN * COUT + 2 * n * hp * wp * COUT * STEM_NEXT_COUT)}
    layer = op.Stem(S["w"], S["w_scale"], S["bias"], S["x_scale"], S["out_scale"], True)
    layer.attach_next(N["w"], N["w_scale"], N["bias"], N["x_scale"], N["out_scale"], True)
    conv1 = op.ResidualConv(N["w"], N["w_scale"], N["bias"], N["x_scale"], 0.0, N["out_scale"], True)
    row["ours_chained"] = layer.next_fuses(-1, n, IN_HW, IN_HW)
    ob, nb = dev.ob, dev.nb

    def ours_chained(_):
        layer.forward_next(xb.ptr, ob.ptr, nb.ptr, n, IN_HW, IN_HW, -1, int(stream))

    def ours_separate(_):
        layer.forward(xb.ptr, ob.ptr, n, IN_HW, IN_HW, -1, int(stream))
        conv1.forward(ob.ptr, 0, nb.ptr, n, hp, wp, -1, int(stream))

    outs = time_pair(row, f"{STEM_PAIR} batch {n}", ours_chained, ours_separate, (layer, conv1),
                     lambda kind: stem_trt_engine(kind, S, N, n), {"x": xb.ptr}, dev, stream, reps, with_trt)
    xb.free()
    dev.free()

    idx = check_images(n)
    acc = ref.accumulate_stem(x[idx], S["w"])
    want = ref.maxpool3x3s2(ref.reference_fp32(x[idx], None, S["w_scale"], S["bias"], None, S["x_scale"], 0.0,
                                               S["out_scale"], True, acc=acc))
    return record_checks(row, outs, idx, want, N, "stem")


def run(args) -> int:
    """`trtfuse bench layers --kind next` (trtfuse.bench.layers.resolve checked args)."""
    names = op.config_names()
    if args.config and args.config not in names:
        raise UserError(f"unknown configuration {args.config}: choose --config from {', '.join(names)}")
    config = names.index(args.config) if args.config else -1
    stream = ck(cudart.cudaStreamCreate())
    rng = np.random.default_rng(0)
    result = result_header(args.command, stream, not args.no_trt, layers=[])
    print(f"copy bandwidth {result['copy_gbps']:.0f} GB/s", flush=True)

    def case(name, n):
        row = run_case(name, n, args.reps, stream, rng, not args.no_trt, config)
        row["floor_ms"] = row["bytes"] / result["copy_gbps"] / 1e6
        return row

    measure(args, result, "layers", case)
    ok = all(c["ok"] for r in result["layers"] for c in r["checks"])
    print(f"\n{'pair':24} {'batch':>5} {'ours ms':>8} {'2 launches':>10} {'TRT ms':>8} {'x TRT':>6} {'plugin':>7} "
          f"{'floor':>6} {'checks':>6}")
    for r in result["layers"]:
        trt_ms = f"{r['trt_ms']:8.4f}" if "trt_ms" in r else f"{'-':>8}"
        speed = f"{r['speedup']:6.2f}" if "speedup" in r else f"{'-':>6}"
        plug = f"{r['plugin_engine_ms']:7.4f}" if "plugin_engine_ms" in r else f"{'-':>7}"
        print(f"{r['layer']:24} {r['batch']:5d} {r['ours_ms']:8.4f} {r['ours_separate_ms']:10.4f} {trt_ms} {speed} "
              f"{plug} {r['floor_ms']:6.3f} {'ok' if all(c['ok'] for c in r['checks']) else 'FAIL':>6}")
    print(f"wrote {args.out}; all checks {'passed' if ok else 'FAILED'}")
    return 0 if ok else 1

