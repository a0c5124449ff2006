"""The device bundle: what only the lent GPU machine needs, out of the product's code path.

That machine has TensorRT 8.5 but no PyTorch/ONNX Runtime, and a call carries at most 64 MiB. So the
models are prepared here (CPU: export, calibrate, quantize, check the rewrite on ONNX Runtime) into a
bundle of parts that each fit one call, and each carried part is stashed on the machine outside the
work tree (which every call replaces), where the benchmarks read them.

    trtfuse bench bundle prepare [--bundle .devcache/e2e] [--methods all]   # here (CPU)
    python3.10 -m trtfuse bench bundle stash                                           # on the GPU machine

Bundle: models/ (the Q/DQ models of ResNet-50 (random weights) and EfficientNet-Lite0, labels,
prepare.json with the CPU numbers) and images0..2 (EfficientNet-Lite0's evaluation images, already
quantized to its int8 input). Calibration images: ../shared/data/imagenet-sample in sorted-name
order whose index % 7 == 0; all others evaluate.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
from trtfuse.passes.quantize import METHOD_CANDIDATES as METHODS

from trtfuse.bench import REPO
IMAGES = REPO.parent / "shared" / "data" / "imagenet-sample"
IMAGE_PARTS = 3
STASH = Path("/tmp/trtfuse-e2e")


def log(msg: str) -> None:
    print(f"[e2e {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ============================================================================= prepare (CPU)

# ============================================================================= prepare (CPU)
def prepare(bundle: Path, methods=METHODS, agreement_images: int = 64) -> dict:
    import onnx
    from trtfuse.data import open_dataset
    from trtfuse.quantize_step import QDQ_FILE, QUANT_META
    from trtfuse.models import prepare as prepare_model
    from trtfuse.passes.bn_fold import fold_pad_into_conv
    from trtfuse.passes.quantize import calibrate, calibration_split, choose_method, quantize, top1_onnxruntime
    from trtfuse.passes.residual_conv_rewrite import (
        compare_logits,
        evaluate_with_reference,
        rewrite,
    )

    models_dir = bundle / "models"
    if bundle.exists():
        shutil.rmtree(bundle)
    models_dir.mkdir(parents=True)
    report = {"calibration_rule": "images of ../shared/data/imagenet-sample in sorted-name order whose "
                                  "index % 7 == 0 calibrate; all others evaluate", "models": {}}
    chosen = None
    for name in ("efficientnet-lite0", "resnet50"):  # EfficientNet first: it picks the method
        pm = prepare_model(name)
        ds = open_dataset(IMAGES, pm.preprocess)
        calib, evaluation = calibration_split(ds.names)
        fp32, pads = fold_pad_into_conv(onnx.load(pm.onnx_path))
        log(f"{name}: calibrating on {len(calib)} images, {len(evaluation)} for evaluation")
        imgs = ds.images(calib)
        stats = calibrate(fp32, [imgs[i:i + 16] for i in range(0, len(imgs), 16)])
        entry = {"calibration_images": len(calib), "evaluation_images": len(evaluation),
                 "folded_pad": pads}
        eval_x, eval_y = ds.images(evaluation), ds.labels[evaluation]
        if name == "efficientnet-lite0":
            entry["fp32_top1_onnxruntime"], _ = top1_onnxruntime(fp32, eval_x, eval_y)
            log(f"{name}: fp32 top-1 {entry['fp32_top1_onnxruntime']:.4f}")
            result, entry["int8_top1_onnxruntime"] = choose_method(fp32, stats, eval_x, eval_y, candidates=methods)
            method, pct = result.method, result.percentile
            chosen = (method, pct)
        else:
            method, pct = chosen
            result = quantize(fp32, stats, method, pct or 99.99)
        entry.update(method=method, percentile=pct, folded_bn=result.folded_bn,
                     activation_qdq=result.activation_qdq, weight_qdq=result.weight_qdq,
                     identity_adds=result.identity_adds)
        out_dir = models_dir / name
        out_dir.mkdir()
        onnx.save(result.model, out_dir / QDQ_FILE)
        meta = pm.to_json()
        meta["onnx_path"] = QDQ_FILE  # the bundle carries the int8 model only
        meta["notes"] = {**meta.get("notes", {}), "bundle": "int8 Q/DQ model only (trtfuse bench e2e)"}
        (out_dir / "model.json").write_text(json.dumps(meta, indent=1) + "\n")
        (out_dir / QUANT_META).write_text(json.dumps(
            {"calibration": str(IMAGES), "method": method, "percentile": pct, "every": 7,
             "calibration_images": [ds.names[i] for i in calib]}, indent=1) + "\n")

        rewritten, n = rewrite(result.model)
        entry["plugin_tails_replaced"] = n
        k = min(agreement_images, len(evaluation))
        _, ref = top1_onnxruntime(result.model, eval_x[:k], eval_y[:k], progress=False)
        got = evaluate_with_reference(rewritten, {pm.input_name: eval_x[:k]})[0]
        entry["rewrite_cpu_check"] = compare_logits(ref, got)
        log(f"{name}: {n} tails -> TrtfuseResidualConv; CPU check {entry['rewrite_cpu_check']}")

        if name == "efficientnet-lite0":
            scale = _input_scale(result.model)
            q = np.clip(np.rint(eval_x / scale), -128, 127).astype(np.int8)
            for part, chunk in enumerate(np.array_split(np.arange(len(q)), IMAGE_PARTS)):
                d = bundle / f"images{part}"
                d.mkdir()
                np.save(d / f"eval_int8_{part}.npy", q[chunk])
            np.save(models_dir / "eval_labels.npy", eval_y)
            (models_dir / "eval_names.txt").write_text("\n".join(ds.names[i] for i in evaluation) + "\n")
            entry["input_scale"] = scale
        report["models"][name] = entry
    (models_dir / "prepare.json").write_text(json.dumps(report, indent=1) + "\n")
    for d in sorted(bundle.iterdir()):
        size = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
        log(f"bundle part {d}: {size / 2**20:.1f} MiB")
    return report


def _input_scale(model) -> float:
    from onnx import numpy_helper

    inits = {t.name: t for t in model.graph.initializer}
    first = next(n for n in model.graph.node if n.op_type == "QuantizeLinear"
                 and n.input[0] == model.graph.input[0].name)
    return float(numpy_helper.to_array(inits[first.input[1]]))


# ============================================================================= stash (device)
def stash(carried: Path, dest: Path) -> None:
    """Copy the carried bundle parts to ``dest`` (outside the work tree, kept between calls)."""
    dest.mkdir(parents=True, exist_ok=True)
    for part in sorted(carried.iterdir()):
        if part.is_dir():
            shutil.copytree(part, dest / part.name, dirs_exist_ok=True)
            log(f"stashed {part.name}")
    have = sorted(p.name for p in dest.iterdir())
    missing = [p for p in ["models", *(f"images{i}" for i in range(IMAGE_PARTS))] if p not in have]
    log(f"{dest} holds {have}; missing: {missing or 'nothing'}")


# ============================================================================= read (device)
class BundleImages:
    """The carried int8 evaluation images as a dataset (``names``, ``labels``, ``images(idx)``)."""

    def __init__(self, bundle: Path):
        # The parts carried (a performance run needs no more than the first): the images are in order.
        here = [i for i in range(IMAGE_PARTS) if (bundle / f"images{i}").is_dir()]
        if here != list(range(len(here))) or not here:
            raise FileNotFoundError(f"{bundle}: image parts {here} of {IMAGE_PARTS}; need images0 and each part before")
        if len(here) < IMAGE_PARTS:
            log(f"{bundle}: {len(here)} of {IMAGE_PARTS} image parts carried: their images only")
        self.array = np.concatenate([np.load(bundle / f"images{i}" / f"eval_int8_{i}.npy", mmap_mode="r")
                                     for i in here])
        self.labels = np.load(bundle / "models" / "eval_labels.npy")[:len(self.array)]
        self.names = (bundle / "models" / "eval_names.txt").read_text().split()[:len(self.array)]

    def __len__(self) -> int:
        return len(self.array)

    def images(self, indices) -> np.ndarray:
        return self.array[np.asarray(indices, dtype=np.int64).reshape(-1)]



def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("prepare", help="CPU: quantize, check, write the bundle")
    a.add_argument("--bundle", type=Path, default=REPO / ".devcache" / "e2e")
    a.add_argument("--methods", default="all", help="comma list of max,percentile-99.99,... or all")
    b = sub.add_parser("stash", help="device: copy carried bundle parts to --dest")
    b.add_argument("--carried", type=Path, default=REPO / ".devcache" / "e2e")
    b.add_argument("--dest", type=Path, default=STASH)
    args = p.parse_args(argv)
    if args.cmd == "prepare":
        methods = METHODS if args.methods == "all" else [
            (m.split("-")[0], float(m.split("-")[1]) if "-" in m else None) for m in args.methods.split(",")]
        prepare(args.bundle, methods)
    else:
        stash(args.carried, args.dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
