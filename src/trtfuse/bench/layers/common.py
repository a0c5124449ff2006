"""What the layer benchmarks share on the TensorRT side: the plugin library and its creator, the plugin node's
fields, one-layer engines built the same way for TensorRT's own layer and for the plugin node (int8 kCHW32 I/O
through dynamic ranges, the INT8 flag, no tactic libraries), and timing engines side by side on one device input.
Imports TensorRT: the kinds import it only when they build engines (`--no-trt` runs without it)."""

from __future__ import annotations

import json
import time

import numpy as np

import tensorrt as trt
from trtfuse.bench.cuda import DeviceBuffer, ck, cudart, time_ms
from trtfuse.ops import residual_conv_reference as ref

LOGGER = trt.Logger(trt.Logger.WARNING)


def load_plugin_library() -> str:
    from trtfuse import trt_graph

    return str(trt_graph.load_plugin_library())


def plugin_creator():
    creator = trt.get_plugin_registry().get_plugin_creator("TrtfuseResidualConv", "1", "")
    if creator is None:
        raise RuntimeError(
            "TrtfuseResidualConv is not registered: was libtrtfuse_plugins.so loaded?"
        )
    return creator


class PluginFields:
    """The plugin's fields. A trt.PluginField keeps only a pointer into its numpy array, so the arrays
    live as long as this object (inline temporaries arrive as garbage: NVIDIA/TensorRT#238)."""

    def __init__(self, L: dict, cin: int, cout: int, P: dict | None = None, N: dict | None = None):
        F = trt.PluginFieldType
        # P: the projection fused into this tail (its fields as proj_*); N: the next conv chained onto it (next_*,
        # the node's second output)
        proj = [] if P is None else self._layer("proj_", P) + [
            ("proj_cin", np.array([P["w"].shape[1]], dtype=np.int32), F.INT32),
            ("proj_stride", np.array([P["stride"]], dtype=np.int32), F.INT32),
        ]
        nxt = [] if N is None else self._layer("next_", N) + [
            ("next_cout", np.array([N["w"].shape[0]], dtype=np.int32), F.INT32),
            ("next_relu", np.array([1], dtype=np.int32), F.INT32),
        ]
        self.arrays = proj + nxt + self._layer("", L) + [
            ("r_scale", np.array([L["r_scale"]], dtype=np.float32), F.FLOAT32),
            ("relu", np.array([int(L["relu"])], dtype=np.int32), F.INT32),
            ("cin", np.array([cin], dtype=np.int32), F.INT32),
            ("cout", np.array([cout], dtype=np.int32), F.INT32),
            ("stride", np.array([L.get("stride", 1)], dtype=np.int32), F.INT32),
        ] + ([("kernel_size", np.array([L["kernel_size"]], dtype=np.int32), F.INT32)] if "kernel_size" in L else [])
        self.fields = [trt.PluginField(*a) for a in self.arrays]
        self.collection = trt.PluginFieldCollection(self.fields)

    @staticmethod
    def _layer(prefix: str, L: dict) -> list:
        """A layer's weights, scales and bias as `prefix`-named fields ("": the node's own; proj_*, next_*). The
        weights as INT32: what the ONNX rewrite emits (the creator also takes INT8 and FLOAT)."""
        F = trt.PluginFieldType
        return [
            (f"{prefix}weights", np.ascontiguousarray(L["w"], dtype=np.int32).reshape(-1), F.INT32),
            (f"{prefix}w_scale", np.ascontiguousarray(L["w_scale"], dtype=np.float32), F.FLOAT32),
            (f"{prefix}bias", np.ascontiguousarray(L["bias"], dtype=np.float32), F.FLOAT32),
            (f"{prefix}x_scale", np.array([L["x_scale"]], dtype=np.float32), F.FLOAT32),
            (f"{prefix}out_scale", np.array([L["out_scale"]], dtype=np.float32), F.FLOAT32),
        ]


def create_plugin(name: str, L: dict, cin: int, cout: int, P: dict | None = None, N: dict | None = None):
    fields = PluginFields(L, cin, cout, P, N)
    return plugin_creator().create_plugin(name, fields.collection)


def _int8_io(t: trt.ITensor, scale: float):
    t.dtype = trt.int8
    t.allowed_formats = 1 << int(trt.TensorFormat.CHW32)
    t.dynamic_range = (-127.0 * scale, 127.0 * scale)  # TensorRT's int8 scale = range / 127


def finish_engine(builder, network, out: trt.ITensor, out_scale: float, what: str, more=()):
    """Marks `out` (int8 kCHW32 at out_scale) as the output ("out"; and each (tensor, name, scale) of `more`), builds
    with the INT8 flag and no tactic libraries (no cuBLAS/cuDNN/cuBLASLt on the GPU machine); returns (engine, its
    layer information)."""
    for t, name, scale in ((out, "out", out_scale), *more):
        t.name = name
        network.mark_output(t)
        _int8_io(t, scale)
    config = builder.create_builder_config()
    config.set_flag(trt.BuilderFlag.INT8)
    config.set_tactic_sources(0)
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, 1 << 30)
    blob = builder.build_serialized_network(network, config)
    if blob is None:
        raise RuntimeError(f"building the {what} engine failed")
    engine = trt.Runtime(LOGGER).deserialize_cuda_engine(blob)
    info = engine.create_engine_inspector().get_engine_information(trt.LayerInformationFormat.JSON)
    return engine, json.loads(info)


def time_x_engines(build, kinds, x_ptr: int, ob: DeviceBuffer, out_like: np.ndarray, cout: int, stream, reps: int,
                   label: str, row: dict, outs: dict) -> None:
    """One-input ("x") engines side by side on the same device input: for each kind, build(kind) -> (engine, info);
    one run into the poisoned output buffer `ob` (kCHW32 like out_like), whose first cout channels go to outs[kind],
    then CUDA-event timing (median of reps) into row["trt_ms"] for "trt", else row["plugin_engine_ms"], and the
    engine's layers into row[kind + "_layers"]."""
    for kind in kinds:
        t0 = time.time()
        engine, info = build(kind)
        ctx = engine.create_execution_context()
        ob.fill(0x5A)
        bindings = [x_ptr if engine.get_binding_name(i) == "x" else ob.ptr for i in range(engine.num_bindings)]
        if not ctx.execute_async_v2(bindings, int(stream)):
            raise RuntimeError(f"{kind}: execute_async_v2 failed")
        ck(cudart.cudaStreamSynchronize(stream))
        outs[kind] = ref.from_nc32hw32(ob.download(out_like), cout)
        key = "trt_ms" if kind == "trt" else "plugin_engine_ms"
        row[key] = time_ms(lambda _: ctx.execute_async_v2(bindings, int(stream)), stream, reps)
        row[f"{kind}_layers"] = layer_summary(info)
        print(f"  {label} {kind} engine: built in {time.time() - t0:.0f} s, {row[key]:.4f} ms; "
              f"{row[f'{kind}_layers']}", flush=True)
        del ctx, engine


def layer_summary(info: dict) -> list[str]:
    out = []
    for layer in info.get("Layers", []):
        if isinstance(layer, str):
            out.append(layer)
            continue
        fmt = [i.get("Format/Datatype", "") for i in layer.get("Inputs", [])]
        out.append(
            f"{layer.get('LayerType', '?')} {layer.get('Name', '')} tactic={layer.get('TacticName', '')} "
            f"in={fmt}"
        )
    return out


def check_binding_formats(engine):
    for i in range(engine.num_bindings):
        assert engine.get_binding_dtype(i) == trt.int8, (
            engine.get_binding_name(i),
            engine.get_binding_dtype(i),
        )
        assert engine.get_binding_format(i) == trt.TensorFormat.CHW32, (
            engine.get_binding_format_desc(i)
        )
