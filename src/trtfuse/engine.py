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

The steps live apart: ``quantize_step`` (the calibrated Q/DQ model), ``trt_graph`` (the ONNX bytes the parser gets,
the plugin library, the edits to the parsed network), ``build_config`` (``BuildConfig``, what an engine is built for);
here the build, the engine cache and the command.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import sys
import time
from pathlib import Path

from trtfuse.build_config import TACTIC_SOURCES, BuildConfig, default_tactic_sources
from trtfuse.config import PLUGINS_HELP
from trtfuse.errors import UserError
from trtfuse.quantize_step import CALIBRATION_METHODS, quantize_model_dir
from trtfuse.trt_graph import add_top_classes, load_plugin_library, onnx_for_build, pin_int8_plugin_outputs


# ----------------------------------------------------------------------------- TensorRT
def import_tensorrt():
    try:
        import tensorrt as trt
    except ImportError as e:
        from trtfuse.backends import TENSORRT_MISSING

        raise TENSORRT_MISSING from e
    return trt


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
    kind += f"-x{len(cfg.plugin_exclude)}" if cfg.plugin_exclude else ""
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
    # Whole files only, under a name of this process: runs on the other GPUs of a host may build the same
    # engine, and read the timing cache, at the same moment.
    for dest, data in ((path, serialized), (timing_path, config.get_timing_cache().serialize())):
        tmp = dest.with_name(f"{dest.name}.{os.getpid()}.tmp")
        tmp.write_bytes(bytes(data))
        tmp.replace(dest)
    meta = {"model": prepared.name, "config": cfg.key(), "tensorrt": trt.__version__, "gpu": gpu,
            "build_s": round(time.time() - t0, 1)}
    path.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"trtfuse: built in {meta['build_s']} s -> {path}", file=sys.stderr)
    return path


# ----------------------------------------------------------------------------- CLI
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trtfuse build", description=__doc__.splitlines()[0])
    p.add_argument("model_dir", metavar="MODEL", help="a model `trtfuse prepare` made: its name or its folder")
    p.add_argument("--precision", choices=("int8", "fp16", "fp32"), default="int8")
    p.add_argument("--plugins", choices=("off", "tails", "all", "on", "auto"), default="off",
                   help=f"{PLUGINS_HELP} (on: the same as tails; auto: all, then each plugin node profiled against "
                        "TensorRT's layers for the same nodes at --batch, and the engine rebuilt without the sites "
                        "that lose, twice at most: it prints them for tensorrt.plugin_exclude and writes "
                        "ENGINE.sites.json)")
    p.add_argument("--plugin-exclude", default="", metavar="SITE[,SITE...]",
                   help="fusion sites left to TensorRT (<kind>:<node name>, as the build's "
                        "model.int8.plugins-all.sites.json lists them)")
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
    cfg = BuildConfig(precision=args.precision, plugins="all" if args.plugins == "auto" else args.plugins,
                      batch=args.batch, workspace_gb=args.workspace, input_format=args.input_format,
                      tactic_sources=args.tactic_sources or default_tactic_sources(),
                      weight_dtype=args.weight_dtype,
                      profiles=args.streams, top_k=args.top_k, plugin_exclude=args.plugin_exclude)
    records = None
    if args.plugins == "auto":
        from trtfuse import plugin_sites

        exclude, records = plugin_sites.auto_exclude(model_dir, cfg, args.plugin_lib)
        cfg = dataclasses.replace(cfg, plugin_exclude=exclude)
        print(f"trtfuse: tensorrt.plugin_exclude = {json.dumps(list(exclude))}", file=sys.stderr)
    path = build_engine(model_dir, cfg, args.plugin_lib, args.rebuild and records is None)
    if records is not None:
        from trtfuse.plugin_sites import write_json

        write_json(Path(f"{path}.sites.json"), {"batch": cfg.batch, "exclude": list(cfg.plugin_exclude),
                                                "rounds": records})
    print(path)
    return 0
