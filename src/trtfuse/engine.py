"""Build a TensorRT engine for a prepared model and a ``BuildConfig``, and cache it.

Engines are cached under ``$TRTFUSE_HOME/engines/`` keyed by the hash of the ONNX bytes handed to
the parser + the build config + the TensorRT version (its major also in the file name) + the GPU name;
a timing cache lives beside them. TensorRT 8.5 to 11 (``trt_compat``): where weak typing is gone (11),
the explicitly quantized graph builds strongly typed, its Q/DQ nodes stating every type.

The steps live apart: ``quantize_step`` (the calibrated Q/DQ model), ``trt_graph`` (the ONNX bytes the parser gets,
the plugin library, the edits to the parsed network), ``build_config`` (``BuildConfig``, what an engine is built for),
``build_command`` (the ``trtfuse build`` command); here the build and the engine cache.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import time
from pathlib import Path

from trtfuse.build_config import BuildConfig
from trtfuse.errors import UserError
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
