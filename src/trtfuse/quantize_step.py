"""The quantize step of ``trtfuse build``: the prepared fp32 model -> ``MODEL_DIR/model.int8.onnx``, an explicitly
quantized (Q/DQ) graph calibrated in ONNX Runtime on CPU (no TensorRT needed), with ``quantize.json`` beside it
saying how (method, calibration images, what was folded). Reused while the same calibration is asked for.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from trtfuse.errors import UserError

QDQ_FILE = "model.int8.onnx"
QUANT_META = "quantize.json"

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
