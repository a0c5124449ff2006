"""``trtfuse build``: quantize (CPU, ONNX Runtime), rewrite for the fused plugin, build a TensorRT engine.

    trtfuse build MODEL_DIR --precision int8 --calibration IMAGES [--calibration-method auto] --plugins tails --batch 256
    trtfuse build MODEL_DIR --precision int8 --calibration IMAGES --quantize-only   # no TensorRT needed

int8 needs an explicitly quantized graph: ``MODEL_DIR/model.int8.onnx`` (written by the quantize step
from ``--calibration``, reused afterwards). ``--plugins tails`` rewrites its residual tails into
TrtfuseResidualConv nodes (``model.int8.plugins.onnx``), ``--plugins all`` its projections too, each one that only a
tail reads fused with that tail into one node where the kernel holds both, and every other fusion of the registry
(src/trtfuse/passes/fusions.py: the stem, 3x3 convs, chained conv1s, the pool head; in a fp32/fp16 build the LayerNorms) into
``model.int8.plugins-all.onnx``; the counts per kind are printed, and the plugin library is loaded before parsing.
The build and its engine cache: ``engine``; ``--plugins auto``'s rounds of build and profile: ``plugin_sites``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from trtfuse import engine
from trtfuse.build_config import TACTIC_SOURCES, BuildConfig, default_tactic_sources
from trtfuse.config import PLUGINS_HELP
from trtfuse.errors import UserError
from trtfuse.quantize_step import CALIBRATION_METHODS, quantize_model_dir


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
        engine.import_tensorrt()  # before the calibration (minutes): without TensorRT the build would fail after it
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
    path = engine.build_engine(model_dir, cfg, args.plugin_lib, args.rebuild and records is None)
    if records is not None:
        from trtfuse.plugin_sites import write_json

        write_json(Path(f"{path}.sites.json"), {"batch": cfg.batch, "exclude": list(cfg.plugin_exclude),
                                                "rounds": records})
    print(path)
    return 0
