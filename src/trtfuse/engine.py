"""``trtfuse build``: quantize (CPU, ONNX Runtime), rewrite for the fused plugin, build a TensorRT engine.

    trtfuse build MODEL_DIR --precision int8 --calibration IMAGES [--calibration-method auto] --plugins tails --batch 256
    trtfuse build MODEL_DIR --precision int8 --calibration IMAGES --quantize-only   # no TensorRT needed

int8 needs an explicitly quantized graph: ``MODEL_DIR/model.int8.onnx`` (written by the quantize step
from ``--calibration``, reused afterwards). ``--plugins tails`` rewrites its residual tails into
TrtfuseResidualConv nodes (``model.int8.plugins.onnx``), ``--plugins all`` its projections too, each one that only a
tail reads fused with that tail into one node where the kernel holds both, and every other fusion of the registry
(src/trtfuse/passes/fusions.py: the stem, 3x3 convs, chained conv1s, the pool head; in a fp32/fp16 build the LayerNorms) into
``model.int8.plugins-all.onnx``; the counts per kind are printed, and the plugin library is loaded before parsing.
Engines are cached under ``$TRTFUSE_HOME/engines/`` keyed by the hash of the ONNX bytes handed to
the parser + the build config + the TensorRT version (its major also in the file name) + the GPU name;
a timing cache lives beside them. TensorRT 8.5 to 11 (``trt_compat``): where weak typing is gone (11),
the explicitly quantized graph builds strongly typed, its Q/DQ nodes stating every type.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import hashlib
import json
import os
import sys
import time
from pathlib import Path

from trtfuse.config import PLUGINS_HELP
from trtfuse.errors import UserError

QDQ_FILE = "model.int8.onnx"
# The engine's response output: the top-k class indices (int32, best first), ranked on the GPU so
# that k int32 per sample leave the device instead of the scores. The scores stay an output too
# (for `infer`, agreement checks); the serving path copies back only this one.
TOP_CLASSES = "top_classes"
QUANT_META = "quantize.json"


@dataclasses.dataclass
class BuildConfig:
    precision: str = "int8"          # int8 | fp16 | fp32
    plugins: str = "off"             # off | tails | all (config.PLUGIN_MODES; true/false accepted, see __post_init__)
    batch: int = 256                 # max (= opt) batch of the optimization profile
    min_batch: int = 1
    workspace_gb: float = 8.0
    input_format: str = "float"      # float | int8 (CHW4 int8 input: the host sends quantized pixels)
    # TensorRT's own ("default"), or "none": no cuBLAS/cuDNN tactics, for a TensorRT install without
    # those libraries; a property of the install, so its default comes from $TRTFUSE_TACTIC_SOURCES.
    tactic_sources: str = dataclasses.field(default_factory=lambda: default_tactic_sources())
    weight_dtype: str = "int32"      # how the plugin's int8 weights travel in the ONNX attribute
    profiles: int = 2                # one optimization profile per concurrent context (stream)
    top_k: int = 5                   # a TopK output (TOP_CLASSES) of this many classes; 0: scores only

    def __post_init__(self):
        from trtfuse.config import plugin_mode

        self.plugins = plugin_mode(self.plugins)

    def key(self) -> dict:
        return dataclasses.asdict(self)


TACTIC_SOURCES = ("default", "none")


def default_tactic_sources() -> str:
    value = os.environ.get("TRTFUSE_TACTIC_SOURCES", "default")
    if value not in TACTIC_SOURCES:
        raise UserError(f"TRTFUSE_TACTIC_SOURCES={value!r} is not one of {', '.join(TACTIC_SOURCES)}",
                        "unset it (TensorRT's own tactics) or set it to none (no cuBLAS/cuDNN installed)")
    return value


# ----------------------------------------------------------------------------- quantize step
CALIBRATION_METHODS = ("auto", "max", "percentile", "entropy")


def quantize_model_dir(model_dir: Path, calibration: str, method: str = "auto", percentile: float = 99.99,
                       every: int = 7, batch: int = 16, force: bool = False) -> Path:
    """Write ``model_dir/model.int8.onnx`` (Q/DQ, per-channel int8 weights) from the fp32 model,
    calibrated on the images of ``calibration`` whose sorted index i has ``i % every == 0``.
    ``auto``: the method (max, percentile 99.99/99.999, entropy) whose int8 model scores the best
    top-1 in ONNX Runtime on the other images of ``calibration``; a model with random weights has no
    accuracy to measure and gets max."""
    import onnx
    from trtfuse.data import open_dataset
    from trtfuse.models import load_prepared
    from trtfuse.passes.bn_fold import fold_pad_into_conv
    from trtfuse.passes.canonical import canonicalize
    from trtfuse.passes.quantize import calibrate, calibration_split, choose_method, method_label, quantize

    if method not in CALIBRATION_METHODS:
        raise UserError(f"unknown calibration method {method!r}", f"use one of: {', '.join(CALIBRATION_METHODS)}")
    out = model_dir / QDQ_FILE
    meta_path = model_dir / QUANT_META
    wanted = {"calibration": str(Path(calibration).resolve()) if calibration != "demo" else "demo",
              "method_asked": method, "percentile_asked": percentile, "every": every}
    if out.is_file() and meta_path.is_file() and not force:
        meta = json.loads(meta_path.read_text())
        if {k: meta.get(k) for k in wanted} == wanted:
            return out
    prepared = load_prepared(model_dir)
    dataset = open_dataset(calibration, prepared.preprocess)
    calib, held_apart = calibration_split(dataset.names, every)
    print(f"trtfuse: calibrating {prepared.name} on {len(calib)} of {len(dataset)} images "
          f"(sorted index % {every} == 0), method {method}", file=sys.stderr)
    model, pads = fold_pad_into_conv(canonicalize(onnx.load(prepared.onnx_path)))
    images = dataset.images(calib)
    batches = [images[i:i + batch] for i in range(0, len(images), batch)]
    stats = calibrate(model, batches)
    scores = None
    if method == "auto" and prepared.random_weights:
        print("trtfuse: random weights: no accuracy to choose a method by; using max", file=sys.stderr)
        result = quantize(model, stats, "max")
    elif method == "auto":
        if not held_apart:
            raise UserError(f"{calibration} has too few images to hold some apart for choosing a method",
                            "give more labelled images, or name the method: --calibration-method max")
        result, scores = choose_method(model, stats, dataset.images(held_apart), dataset.labels[held_apart],
                                       prepared.label_offset)
    else:
        result = quantize(model, stats, method, percentile)
    onnx.save(result.model, out)
    meta = {**wanted, "method": result.method, "percentile": result.percentile,
            "chosen": method_label(result.method, result.percentile), "top1_by_method": scores,
            "evaluation_images": len(held_apart) if scores else 0,
            "calibration_images": [dataset.names[i] for i in calib], "folded_pad": pads,
            "folded_bn": result.folded_bn, "activation_qdq": result.activation_qdq,
            "weight_qdq": result.weight_qdq, "identity_adds": result.identity_adds}
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")
    print(f"trtfuse: wrote {out} ({meta['chosen']}; {result.activation_qdq} activation Q/DQ, {result.weight_qdq} "
          f"per-channel weights, {result.folded_bn} BN folded)", file=sys.stderr)
    return out


def onnx_for_build(model_dir: Path, cfg: BuildConfig) -> bytes:
    """The ONNX bytes the parser gets for ``cfg`` (int8: Q/DQ graph), rewritten by the fusions ``cfg.plugins`` enables
    at ``cfg.precision`` (src/trtfuse/passes/fusions.py)."""
    import onnx
    from trtfuse.models import load_prepared
    from trtfuse.passes.fusions import enabled
    from trtfuse.passes.quantize import weights_as_float_qdq

    if cfg.precision != "int8":
        source = Path(load_prepared(model_dir).onnx_path)
        if cfg.plugins == "off":
            return source.read_bytes()
        if not enabled(cfg.plugins, cfg.precision):
            raise UserError(f"--plugins {cfg.plugins} needs --precision int8 (the fused plugin is int8)",
                            "add --precision int8, or use --plugins off")
        return rewrite_for_build(model_dir, onnx.load(source), cfg).SerializeToString()
    qdq = model_dir / QDQ_FILE
    if not qdq.is_file():
        raise UserError(f"{qdq} does not exist: int8 needs a calibrated Q/DQ model",
                        f"quantize first: `trtfuse build {model_dir} --precision int8 --calibration "
                        "IMAGES --quantize-only` (IMAGES: a folder of labelled images)")
    model = onnx.load(qdq)
    if cfg.plugins != "off":
        model = rewrite_for_build(model_dir, model, cfg)
    # TensorRT 8.5's parser wants quantized weights as float constants behind a QuantizeLinear; every
    # later version parses that form too, so it is the one handed over.
    model = weights_as_float_qdq(model)
    if cfg.input_format == "int8":
        model = int8_input_graph(model)
    return model.SerializeToString()


def rewritten_file(precision: str, plugins: str) -> str:
    """Where the rewritten graph is kept in the model folder, for a look at it: model.int8.plugins.onnx (tails),
    model.int8.plugins-all.onnx (all); model.fp32.plugins-all.onnx ..."""
    return f"model.{precision}.plugins{'' if plugins == 'tails' else '-' + plugins}.onnx"


def rewrite_for_build(model_dir: Path, model, cfg: BuildConfig):
    """``model`` rewritten for ``cfg`` (fusions.rewrite); prints the counts per kind and, where a candidate was
    refused, the refusal table; keeps the graph in the model folder (rewritten_file)."""
    import onnx
    from trtfuse.passes.fusions import FUSIONS, rewrite

    result = rewrite(model, cfg.plugins, cfg.precision, cfg.weight_dtype)
    print(f"trtfuse: {result.summary()}", file=sys.stderr)
    if result.report.any_refused():   # what the plugins did not take, and the first reason per kind
        print("trtfuse: not fused (candidates per kind; the first refusal):\n  "
              + result.report.table().replace("\n", "\n  "), file=sys.stderr)
    if result.nodes == 0:
        # the precisions whose builds this mode has other fusions for (int8: the conv family; fp32/fp16: LayerNorms)
        elsewhere = sorted({p for f in FUSIONS if cfg.plugins in f.modes and cfg.precision not in f.precisions
                            for p in f.precisions}, reverse=True)
        raise UserError(f"--plugins {cfg.plugins} found no layer to fuse in this model at --precision {cfg.precision}",
                        "use --plugins off for it" + (f" (or --precision {' or '.join(elsewhere)}, whose fusions "
                                                      "differ)" if elsewhere else ""))
    onnx.save(result.model, model_dir / rewritten_file(cfg.precision, cfg.plugins))
    return result.model


def int8_input_graph(model):
    """The graph with an int8 input: the input's QuantizeLinear goes and its DequantizeLinear reads the
    input directly, so the host sends round(x / s) itself. In an explicitly quantized network this is how
    an int8 input is said (TensorRT refuses dynamic ranges once Q/DQ layers are present)."""
    import onnx

    graph = model.graph
    name = graph.input[0].name
    quant = [n for n in graph.node if n.op_type == "QuantizeLinear" and n.input[0] == name]
    if len(quant) != 1:
        raise UserError("int8 input needs exactly one QuantizeLinear on the model input",
                        "use --input-format float for this model")
    q = quant[0]
    for node in graph.node:
        for i, value in enumerate(node.input):
            if value == q.output[0]:
                node.input[i] = name
    graph.node.remove(q)
    graph.input[0].type.tensor_type.elem_type = onnx.TensorProto.INT8
    return model


# ----------------------------------------------------------------------------- TensorRT
def import_tensorrt():
    try:
        import tensorrt as trt
    except ImportError as e:
        from trtfuse.backends import TENSORRT_MISSING

        raise TENSORRT_MISSING from e
    return trt


def load_plugin_library(path: str | None = None) -> Path:
    """dlopen libtrtfuse_plugins.so (RTLD_GLOBAL) so its creators register before parsing."""
    from trtfuse.ops.residual_conv import use_shipped_tuning_cache
    from trtfuse.plugin_build import library_path

    lib = Path(path) if path else Path(library_path("plugins"))
    if not lib.is_file():
        raise UserError(f"the TensorRT plugin library {lib} does not exist",
                        "build it with `trtfuse plugins build --tensorrt-root $TENSORRT_ROOT` "
                        "(or set TRTFUSE_PLUGIN_LIB)")
    use_shipped_tuning_cache()  # before the plugin's first forward reads it
    ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    return lib


def engine_cache_dir() -> Path:
    from trtfuse.models.prepared import trtfuse_home

    return trtfuse_home() / "engines"


def engine_key(onnx_bytes: bytes, cfg: BuildConfig, trt_version: str, gpu: str) -> str:
    text = json.dumps({"onnx": hashlib.sha256(onnx_bytes).hexdigest(), "config": cfg.key(),
                       "tensorrt": trt_version, "gpu": gpu}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def build_engine(model_dir: str | Path, cfg: BuildConfig, plugin_lib: str | None = None,
                 rebuild: bool = False) -> Path:
    """Build (or find in the cache) the engine for ``model_dir`` and ``cfg``; returns its path."""
    model_dir = Path(model_dir)
    trt = import_tensorrt()
    from trtfuse import cuda_runtime, trt_compat
    from trtfuse.models import load_prepared

    cuda_runtime.require_gpu()
    gpu = cuda_runtime.device_name()
    prepared = load_prepared(model_dir)
    onnx_bytes = onnx_for_build(model_dir, cfg)
    key = engine_key(onnx_bytes, cfg, trt.__version__, gpu)
    cache = engine_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    kind = {"off": "stock", "tails": "plugins", "all": "plugins-all"}[cfg.plugins]
    path = cache / f"{prepared.name}-{cfg.precision}-{kind}-b{cfg.batch}-trt{trt_compat.major_version(trt)}-{key}.engine"
    if path.is_file() and not rebuild:
        print(f"trtfuse: engine cached: {path}", file=sys.stderr)
        return path

    logger = trt.Logger(trt.Logger.WARNING)
    trt.init_libnvinfer_plugins(logger, "")
    if cfg.plugins != "off":
        from trtfuse.ops.residual_conv import use_shipped_tuning_cache

        print(f"trtfuse: plugin library {load_plugin_library(plugin_lib)}; fused conv tile choices from "
              f"{use_shipped_tuning_cache() or 'the heuristic (no tuning cache)'}", file=sys.stderr)
    builder = trt.Builder(logger)
    network = builder.create_network(trt_compat.network_flags(trt))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx_bytes):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise UserError(f"TensorRT's ONNX parser rejected the model: {errors}",
                        "check the plugin library is built for this TensorRT (trtfuse plugins build)")
    pin_int8_plugin_outputs(trt, network)
    if cfg.top_k:
        add_top_classes(trt, network, prepared.output_name, cfg.top_k)
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(cfg.workspace_gb * (1 << 30)))
    for flag in trt_compat.precision_flags(trt, cfg.precision):
        config.set_flag(flag)
    if cfg.tactic_sources == "none":
        config.set_tactic_sources(0)

    inp = network.get_input(0)
    c, h, w = prepared.input_shape
    for _ in range(max(cfg.profiles, 1)):  # identical profiles: one per concurrent context
        profile = builder.create_optimization_profile()
        profile.set_shape(inp.name, (cfg.min_batch, c, h, w), (cfg.batch, c, h, w), (cfg.batch, c, h, w))
        config.add_optimization_profile(profile)
    if cfg.input_format == "int8":
        if cfg.precision != "int8":
            raise UserError("--input-format int8 needs --precision int8", "use --input-format float")
        # The graph's input is int8 already (int8_input_graph); linear NCHW, as the host writes it.
        inp.allowed_formats = 1 << int(trt.TensorFormat.LINEAR)

    timing_path = cache / f"timing-{hashlib.sha256((trt.__version__ + gpu).encode()).hexdigest()[:12]}.cache"
    timing = config.create_timing_cache(timing_path.read_bytes() if timing_path.is_file() else b"")
    config.set_timing_cache(timing, ignore_mismatch=False)

    print(f"trtfuse: building {path.name} on {gpu} with TensorRT {trt.__version__} "
          f"(precision {cfg.precision}, plugins {cfg.plugins}, batch {cfg.batch}) ...",
          file=sys.stderr, flush=True)
    t0 = time.time()
    serialized = builder.build_serialized_network(network, config)
    if serialized is None and cfg.input_format == "int8":
        print("trtfuse: the int8-input build failed; building with float input instead",
              file=sys.stderr, flush=True)
        return build_engine(model_dir, dataclasses.replace(cfg, input_format="float"), plugin_lib, rebuild)
    if serialized is None:
        raise UserError("TensorRT failed to build the engine (see its log above)",
                        "try --workspace with more GB, or --plugins off to isolate the plugin")
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(bytes(serialized))
    tmp.replace(path)
    timing_path.write_bytes(bytes(config.get_timing_cache().serialize()))
    meta = {"model": prepared.name, "config": cfg.key(), "tensorrt": trt.__version__, "gpu": gpu,
            "build_s": round(time.time() - t0, 1)}
    path.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"trtfuse: built in {meta['build_s']} s -> {path}", file=sys.stderr)
    return path


def pin_int8_plugin_outputs(trt, network) -> int:
    """Pins every output of a TrtfuseResidualConv layer to int8 (the type the plugin declares for all of them); returns
    how many. TensorRT 8.5 does not carry a plugin's int8 type to a second output that feeds another plugin directly
    (no Q/DQ between them, as a chained tail's next-conv output feeding the 3x3 plugin): its Q/DQ optimizer then
    finds no format for that edge and stops the build ("All of the candidates were removed ... incorrectly marked as
    an int8 node"). Before the build the parsed network reports these outputs as float, so the pin goes by the
    plugin's type, not by the tensor's; other plugins (LayerNorm, whose outputs are float) are left alone."""
    from trtfuse.passes.residual_conv_rewrite import PLUGIN_OP

    pinned = 0
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        if layer.type != trt.LayerType.PLUGIN_V2:
            continue
        layer.__class__ = trt.IPluginV2Layer   # the Python API's way to reach a layer's plugin
        if layer.plugin.plugin_type != PLUGIN_OP:
            continue
        for j in range(layer.num_outputs):
            layer.set_output_type(j, trt.int8)
            pinned += 1
    return pinned


def add_top_classes(trt, network, scores_name: str, k: int) -> None:
    """Append TopK(k) over the class axis of the scores output and mark its indices TOP_CLASSES
    (int32, as MLPerf submitters' engines do; a Cast where a TensorRT gives other index types)."""
    outputs = {network.get_output(i).name: network.get_output(i) for i in range(network.num_outputs)}
    scores = outputs.get(scores_name) or network.get_output(0)
    if len(scores.shape) < 2 or (scores.shape[1] > 0 and k > scores.shape[1]):
        raise UserError(f"cannot rank the top {k} classes of output {scores.name!r} with shape {tuple(scores.shape)}",
                        "build with top_k=0 for a model whose output is not [batch, classes]")
    indices = network.add_topk(scores, trt.TopKOperation.MAX, k, 1 << 1).get_output(1)
    if indices.dtype != trt.int32:
        indices = network.add_cast(indices, trt.int32).get_output(0)
    indices.name = TOP_CLASSES
    network.mark_output(indices)


def input_scale(model_dir: Path) -> float:
    """The scale of the QuantizeLinear that reads the network input (int8 input = its output)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(Path(model_dir) / QDQ_FILE)
    name = model.graph.input[0].name
    inits = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear" and node.input[0] == name:
            return float(numpy_helper.to_array(inits[node.input[1]]))
    raise UserError(f"{QDQ_FILE} has no QuantizeLinear on its input", "quantize it again with trtfuse build")


# ----------------------------------------------------------------------------- CLI
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trtfuse build", description=__doc__.splitlines()[0])
    p.add_argument("model_dir", metavar="MODEL", help="a model `trtfuse prepare` made: its name or its folder")
    p.add_argument("--precision", choices=("int8", "fp16", "fp32"), default="int8")
    p.add_argument("--plugins", choices=("off", "tails", "all", "on"), default="off",
                   help=f"{PLUGINS_HELP} (on: the same as tails)")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--workspace", type=float, default=8.0, metavar="GB")
    p.add_argument("--input-format", choices=("float", "int8"), default="float")
    p.add_argument("--tactic-sources", choices=TACTIC_SOURCES,
                   help="default: TensorRT's own; none: no cuBLAS/cuDNN tactics (a TensorRT install without "
                        "those libraries); when not given, $TRTFUSE_TACTIC_SOURCES, else default")
    p.add_argument("--weight-dtype", choices=("int8", "int32", "float"), default="int32",
                   help="type of the plugin's weights attribute")
    p.add_argument("--calibration", help="labelled images to calibrate int8 on (quantize step)")
    p.add_argument("--calibration-method", "--calib-method", dest="calib_method", choices=CALIBRATION_METHODS,
                   default="auto", help="auto: the method with the best top-1 on the images held apart from "
                                        "calibration (ONNX Runtime); max, percentile, entropy: that one")
    p.add_argument("--percentile", type=float, default=99.99)
    p.add_argument("--calib-every", type=int, default=7,
                   help="calibrate on the images whose sorted index %% N == 0 (never evaluate on them)")
    p.add_argument("--quantize-only", action="store_true", help="write model.int8.onnx and stop")
    p.add_argument("--streams", type=int, default=2, help="optimization profiles (concurrent contexts)")
    p.add_argument("--top-k", type=int, default=5,
                   help="rank the top K classes in the engine (the harness's responses); 0: scores only")
    p.add_argument("--plugin-lib", help="libtrtfuse_plugins.so (default: the built one)")
    p.add_argument("--rebuild", action="store_true", help="ignore the engine cache")
    return p


def cli_main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    model_dir = Path(args.model_dir).expanduser()
    if not model_dir.is_dir() and "/" not in args.model_dir:
        from trtfuse.models import default_model_dir

        model_dir = default_model_dir(args.model_dir)  # a name: where `trtfuse prepare NAME` put it
    if not (model_dir / "model.json").is_file():
        raise UserError(f"{model_dir} is not a prepared model folder (no model.json)",
                        "run `trtfuse prepare MODEL` first and pass its folder")
    if args.batch < 1:
        raise UserError(f"--batch {args.batch} must be at least 1", "pass a positive batch size")
    if args.top_k < 0:
        raise UserError(f"--top-k {args.top_k} is negative", "pass 5 (MLPerf's responses) or 0 (scores only)")
    if not args.quantize_only:
        import_tensorrt()  # before the calibration (minutes): without TensorRT the build would fail after it
    if args.precision == "int8" and args.calibration:
        quantize_model_dir(model_dir, args.calibration, args.calib_method, args.percentile, args.calib_every)
    if args.quantize_only:
        if not args.calibration:
            raise UserError("--quantize-only needs --calibration IMAGES", "pass the calibration images")
        return 0
    cfg = BuildConfig(precision=args.precision, plugins=args.plugins, batch=args.batch,
                      workspace_gb=args.workspace, input_format=args.input_format,
                      tactic_sources=args.tactic_sources or default_tactic_sources(),
                      weight_dtype=args.weight_dtype,
                      profiles=args.streams, top_k=args.top_k)
    print(build_engine(model_dir, cfg, args.plugin_lib, args.rebuild))
    return 0
