"""``trtfuse profile ENGINE`` and ``trtfuse compare ENGINE_A ENGINE_B``: what an engine spends its time
on, layer by layer (TensorRT's own profiler), and whether two engines answer alike.

    trtfuse profile ENGINE [--batch N] [--runs 20] [--out FILE.json]
    trtfuse compare ENGINE_A ENGINE_B --model MODEL_DIR --dataset DIR [--images 256]

profile runs the engine ``--runs`` times on device-resident input with an IProfiler attached (no CUDA
graph: the profiler needs per-layer launches) and reports each layer's mean time, its share, and
whether it is trtfuse's (a layer named after one of its plugins); a table, the JSON and a bar chart.
compare feeds both engines the same inputs, quantized once on the host exactly as the network's
first QuantizeLinear would, and reports top-1 agreement and the largest logit difference.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from trtfuse.errors import UserError

TOP_LAYERS = 25


def our_layers() -> tuple[str, ...]:
    """What the names of the fusion registry's plugin nodes hold (src/trtfuse/passes/fusions.py: layer_marks), imported when first
    asked: the CLI's start stays without onnx."""
    from trtfuse.passes.fusions import layer_marks

    return layer_marks()


def is_ours(layer_name: str) -> bool:
    """A layer of trtfuse's plugins (TensorRT names a plugin layer after its ONNX node, which the
    rewrites name after the plugin, or the LayerNorm rewrite with "_trtfuse")."""
    return any(name in layer_name for name in our_layers())


def summarize(layers: dict[str, float], batch: int) -> dict:
    """Per-layer mean ms -> the profile: rows sorted by time with share and ownership, and totals."""
    total = sum(layers.values())
    # to the nanosecond: at batch 1 a layer takes a few microseconds (trtfuse.plugin_sites compares them)
    rows = [{"layer": name, "ms": round(ms, 6), "share": round(ms / total, 4) if total else 0.0,
             "ours": is_ours(name)} for name, ms in sorted(layers.items(), key=lambda kv: -kv[1])]
    ours = sum(r["ms"] for r in rows if r["ours"])
    return {"batch": batch, "total_ms": round(total, 4), "ours_ms": round(ours, 4),
            "trt_ms": round(total - ours, 4), "ours_layers": sum(r["ours"] for r in rows),
            "layers": rows}


def format_profile(profile: dict, top: int = TOP_LAYERS) -> str:
    lines = [f"  {'ms':>8}  {'share':>6}  {'':4}  layer"]
    for r in profile["layers"][:top]:
        lines.append(f"  {r['ms']:8.3f}  {r['share'] * 100:5.1f}%  {'ours' if r['ours'] else '':4}  {r['layer'][:100]}")
    rest = profile["layers"][top:]
    if rest:
        lines.append(f"  {sum(r['ms'] for r in rest):8.3f}  {sum(r['share'] for r in rest) * 100:5.1f}%        "
                     f"({len(rest)} more layers)")
    t = profile["total_ms"]
    lines.append(f"  total {t:.3f} ms per batch of {profile['batch']}: trtfuse's {profile['ours_ms']:.3f} ms "
                 f"({profile['ours_ms'] / t * 100 if t else 0:.1f} %, {profile['ours_layers']} layers), "
                 f"TensorRT's {profile['trt_ms']:.3f} ms")
    return "\n".join(lines)


def plot_profile(profile: dict, path: Path, top: int = TOP_LAYERS) -> Path | None:
    """A horizontal bar chart of the ``top`` slowest layers, trtfuse's in another colour."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: no bar chart (pip install matplotlib)", file=sys.stderr)
        return None
    rows = profile["layers"][:top][::-1]
    fig, ax = plt.subplots(figsize=(10, 0.28 * len(rows) + 1.5))
    ax.barh([r["layer"][:60] for r in rows], [r["ms"] for r in rows],
            color=["tab:orange" if r["ours"] else "tab:blue" for r in rows])
    ax.set_xlabel("ms per batch (TensorRT profiler, mean)")
    ax.set_title(f"slowest {len(rows)} layers, batch {profile['batch']}: total {profile['total_ms']:.2f} ms, "
                 f"trtfuse (orange) {profile['ours_ms']:.2f} ms", fontsize=9)
    ax.tick_params(axis="y", labelsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------- on the GPU
def _load_engine(trt, path: Path, plugin_lib: str | None):
    from trtfuse.trt_graph import load_plugin_library

    if not path.is_file():
        raise UserError(f"engine file {path} does not exist", "build one with `trtfuse build`")
    logger = trt.Logger(trt.Logger.WARNING)
    trt.init_libnvinfer_plugins(logger, "")
    try:  # an engine with trtfuse's plugins needs their creators to deserialize
        load_plugin_library(plugin_lib)
    except UserError:
        pass
    engine = trt.Runtime(logger).deserialize_cuda_engine(path.read_bytes())
    if engine is None:
        raise UserError(f"TensorRT could not deserialize {path}",
                        "rebuild it with this TensorRT version (and build the plugin library it uses)")
    return engine


def profile_engine(path: str | Path, batch: int | None = None, runs: int = 20,
                   plugin_lib: str | None = None) -> dict:
    """TensorRT's per-layer times of the engine at ``batch`` (default: its profile's largest)."""
    from trtfuse.engine import import_tensorrt

    trt = import_tensorrt()
    from trtfuse import cuda_runtime

    cuda_runtime.require_gpu()
    engine = _load_engine(trt, Path(path), plugin_lib)
    context = engine.create_execution_context()
    stream = cuda_runtime.Stream()
    buffers = []
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    for name in names:
        if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT:
            shape = list(engine.get_tensor_profile_shape(name, 0)[2])
            batch = batch or shape[0]
            context.set_input_shape(name, (batch, *shape[1:]))
    for name in names:
        shape = context.get_tensor_shape(name)
        nbytes = int(np.prod(shape)) * np.dtype(_NP[engine.get_tensor_dtype(name).name]).itemsize
        buf = cuda_runtime.DeviceBuffer(max(nbytes, 1))
        cuda_runtime.memset(buf, 0)
        context.set_tensor_address(name, buf.ptr)
        buffers.append(buf)

    class Profiler(trt.IProfiler):
        def __init__(self):
            trt.IProfiler.__init__(self)
            self.ms: dict[str, float] = {}

        def report_layer_time(self, layer_name, ms):
            self.ms[layer_name] = self.ms.get(layer_name, 0.0) + ms

    try:
        for _ in range(3):  # warm-up, unprofiled
            context.execute_async_v3(stream.ptr)
        stream.synchronize()
        profiler = Profiler()
        context.profiler = profiler
        for _ in range(runs):
            if not context.execute_async_v3(stream.ptr):
                raise RuntimeError("TensorRT execute_async_v3 failed")
            stream.synchronize()
    finally:
        for buf in buffers:
            buf.free()
        stream.destroy()
    result = summarize({k: v / runs for k, v in profiler.ms.items()}, batch)
    result.update(engine=str(path), runs=runs, tensorrt=trt.__version__, gpu=cuda_runtime.device_name())
    return result


_NP = {"FLOAT": np.float32, "HALF": np.float16, "INT8": np.int8, "INT32": np.int32, "BOOL": np.bool_}


def compare_engines(engine_a: str | Path, engine_b: str | Path, model_dir: str | Path, dataset: str,
                    images: int = 256, plugin_lib: str | None = None) -> dict:
    """Both engines on the same inputs: top-1 agreement and logit differences (compare_logits)."""
    from trtfuse.engine import import_tensorrt

    import_tensorrt()  # before reading images: without TensorRT there is nothing to compare
    from trtfuse.backends.tensorrt_backend import TensorRTBackend
    from trtfuse.data import open_dataset
    from trtfuse.models import load_prepared
    from trtfuse.passes.residual_conv_rewrite import compare_logits

    model = load_prepared(Path(model_dir))
    data = open_dataset(dataset, model.preprocess, count=images)
    x = data.images(np.arange(len(data)))
    logits = []
    for path in (engine_a, engine_b):
        backend = TensorRTBackend(engine=str(path), plugin_lib=plugin_lib, streams=1)
        backend.load(model, 0)
        try:
            # infer quantizes float images exactly as the network's first QuantizeLinear would, so an
            # int8-input engine and a float-input one see the same int8 tensor.
            logits.append(np.concatenate([backend.infer(x[i:i + backend.max_batch])
                                          for i in range(0, len(x), backend.max_batch)]))
        finally:
            backend.close()
    result = compare_logits(logits[0], logits[1])
    labels = np.asarray(data.labels) + model.label_offset
    result.update(engine_a=str(engine_a), engine_b=str(engine_b), dataset=str(dataset),
                  top1_a=float((logits[0].argmax(1) == labels).mean()),
                  top1_b=float((logits[1].argmax(1) == labels).mean()),
                  random_weights=bool(model.random_weights))
    return result


# ----------------------------------------------------------------------------- the commands
def add_parsers(subparsers) -> None:
    p = subparsers.add_parser("profile", help="per-layer times of a TensorRT engine (needs TensorRT and a GPU)")
    p.add_argument("engine", metavar="ENGINE")
    p.add_argument("--batch", type=int, help="batch to time (default: the engine's largest)")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--out", metavar="FILE.json", help="default: ENGINE.profile.json (and .png beside it)")
    p.add_argument("--plugin-lib", help="libtrtfuse_plugins.so (default: the built one)")
    c = subparsers.add_parser("compare", help="two engines on the same inputs: top-1 agreement, logit difference")
    c.add_argument("engine_a", metavar="ENGINE_A")
    c.add_argument("engine_b", metavar="ENGINE_B")
    c.add_argument("--model", required=True, metavar="MODEL_DIR", help="the prepared model both were built from")
    c.add_argument("--dataset", required=True, metavar="DIR", help="labelled images (as `trtfuse run --dataset`)")
    c.add_argument("--images", type=int, default=256)
    c.add_argument("--out", metavar="FILE.json", help="where to write the result (default: print only)")
    c.add_argument("--plugin-lib", help="libtrtfuse_plugins.so (default: the built one)")


def cmd_profile(args: argparse.Namespace) -> int:
    if args.runs < 1 or (args.batch is not None and args.batch < 1):
        raise UserError("--runs and --batch must be at least 1", "e.g. --runs 20 --batch 256")
    profile = profile_engine(args.engine, args.batch, args.runs, args.plugin_lib)
    out = Path(args.out) if args.out else Path(str(args.engine) + ".profile.json")
    out.write_text(json.dumps(profile, indent=1) + "\n")
    chart = plot_profile(profile, out.with_suffix(".png"))
    print(format_profile(profile))
    print(f"  wrote {out}" + (f" and {chart}" if chart else ""))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    result = compare_engines(args.engine_a, args.engine_b, args.model, args.dataset, args.images, args.plugin_lib)
    rows = [("images", str(result["n"])),
            ("top-1 agreement", f"{result['top1_agreement'] * 100:.2f} % ({result['distinct_top1']} distinct classes)"),
            ("centered agreement", f"{result['centered_top1_agreement'] * 100:.2f} %"),
            ("max |logit diff|", f"{result['max_abs_logit_diff']:.4g} (largest |logit| {result['max_abs_logit']:.4g})"),
            ("top-1 A / B", f"{result['top1_a'] * 100:.2f} % / {result['top1_b'] * 100:.2f} %"
             + ("  (random weights: meaningless)" if result["random_weights"] else ""))]
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"  {k:<{width}}  {v}" for k, v in rows))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0
