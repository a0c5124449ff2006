"""`trtfuse bench layers --kind KIND`: one ResNet-50 conv layer (or a chained pair) at a time, TensorRT 8.5's own
int8 kernels against ours, on identical device-resident int8 data in one process.

Every kind runs the same way: for each layer and batch, a one-layer engine of TensorRT's own layer and one of the
plugin node (common.py builds both: int8 kCHW32 I/O through dynamic ranges, the INT8 flag, no tactic libraries), our
kernel through the C ABI where the kind has configurations to sweep, every output checked (ours bit-exact against the
rounding rule, TensorRT within 1 LSB of the float64 formula), CUDA-event medians of --reps, and the layer's DRAM
floor at the copy bandwidth measured in the same run. The record (JSON, rewritten after every row so that a crash
keeps what ran) starts with the GPU, TensorRT's version and the copy bandwidth. The weights are random: performance
only. A kind is a row of KINDS below and a module beside this one with its engines and its `run_case`.

  python3.10 -m trtfuse bench layers --kind residual --qdq --out benchmarks/results/residual_conv_h100.json
  python3.10 -m trtfuse bench layers --kind conv3x3          (-> benchmarks/results/conv3x3_h100.json)
  python3 -m trtfuse bench layers --kind stem --no-trt --out /tmp/stem.json    (ours only: no TensorRT)

Needs cuda-python and the kernels library (TensorRT and the plugin library unless --no-trt); this module itself
imports neither, so that `--help` and the table's checks run anywhere.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from trtfuse.errors import UserError

# conv3x3: name -> (cin == cout, input h == w, stride): the 3x3 convs of ResNet-50 the halo kernel holds (layer4's
# and layer3.0's: weight slices too large)
CONV3X3_LAYERS = {"layer1.conv2": (64, 56, 1), "layer2.conv2": (128, 28, 1), "layer3.conv2": (256, 14, 1),
                  "layer2.0.conv2": (128, 56, 2)}
# next: pair -> (tail cin, tail cout, next cout, projection cin or 0): the tail whose output the next block's conv1
# reads
NEXT_PAIRS = {
    "layer1.0+layer1.1.conv1": (64, 256, 64, 64),  # the stage's first block (projection + tail in one kernel)
    "layer1.1+layer1.2.conv1": (64, 256, 64, 0),
    "layer1.2+layer2.0.conv1": (64, 256, 128, 0),  # layer2.0's conv1: 256 -> 128, stride 1 (torchvision v1.5)
}
# the stem (3 x 224 x 224 -> 64 x 56 x 56) and layer1.0's conv1, chained
STEM_PAIR = "stem+layer1.0.conv1"


def _residual_layers() -> tuple[str, ...]:
    from trtfuse.tuning import RESNET50_FUSED, RESNET50_STAGES

    return (*RESNET50_STAGES, *RESNET50_FUSED)


@dataclass(frozen=True)
class Kind:
    module: str                # trtfuse.bench.layers.<module>: its engines and run_case, and run(args)
    what: str
    layers: object             # the names --layers takes (a tuple, or a function returning one)
    default: tuple[str, ...]   # what runs without --layers (empty: every name)
    out: str                   # the default record under benchmarks/results/
    reps: int
    options: frozenset = frozenset()   # which of --qdq, --config, --no-trt, --peak-tops the kind reads

    def names(self) -> tuple[str, ...]:
        return self.layers() if callable(self.layers) else self.layers


KINDS = {
    "residual": Kind("residual", "the 1x1 library: tails res2-res5, projections proj1-proj4, fused first blocks "
                     "fused1-fused2; the plugin node's round trip; --qdq the Q/DQ ONNX path",
                     _residual_layers, ("res2", "res3", "res4", "res5"), "residual_conv_h100.json", 100,
                     frozenset({"qdq"})),
    "conv3x3": Kind("conv3x3", "the 3x3 halo kernel (every configuration) against TensorRT's 3x3 convs",
                    tuple(CONV3X3_LAYERS), (), "conv3x3_h100.json", 30, frozenset({"no_trt", "peak_tops"})),
    "stem": Kind("stem", "the stem (7x7/2 conv + ReLU + 3x3/2 max pool) against TensorRT's fused stem",
                 ("stem",), (), "stem_h100.json", 30, frozenset({"no_trt", "peak_tops"})),
    "next": Kind("next", "a layer1 tail or the stem with the next conv1 chained, against TensorRT's two layers",
                 (*NEXT_PAIRS, STEM_PAIR), (), "next_conv_h100.json", 30, frozenset({"no_trt", "config"})),
}

# option dest -> (its flag, the value that means "not given")
_OPTIONS = {"qdq": ("--qdq", False), "config": ("--config", ""), "no_trt": ("--no-trt", False),
            "peak_tops": ("--peak-tops", None)}


def parser() -> argparse.ArgumentParser:
    kinds = "\n".join(f"  {name:9} {k.what}" for name, k in KINDS.items())
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=f"kinds:\n{kinds}")
    p.add_argument("--kind", required=True, help=f"one of {', '.join(KINDS)}")
    p.add_argument("--layers", "--stages", "--pairs", dest="layers", metavar="NAMES",
                   help="comma-separated layer names of the kind (default: the kind's set; a bad name lists them)")
    p.add_argument("--batches", default="256,2048")
    p.add_argument("--reps", type=int, help="timed launches per measurement (default: residual 100, others 30)")
    p.add_argument("--out", help="the JSON record (default: benchmarks/results/<the kind's>_h100.json)")
    p.add_argument("--qdq", action="store_true", help="residual: also check the explicitly quantized ONNX path")
    p.add_argument("--no-trt", action="store_true", help="conv3x3, stem, next: ours only (no TensorRT here)")
    p.add_argument("--peak-tops", type=float, help="conv3x3, stem: int8 dense tensor-core peak (default 1979, "
                                                   "H100 SXM)")
    p.add_argument("--config", default="",
                   help="next: the tail pairs' chained launch on this configuration (a name of op.config_names(); "
                        "one compiled with a chained next conv), instead of the library's pick")
    return p


def resolve(argv: list[str] | None) -> tuple[Kind, argparse.Namespace]:
    """The kind and its arguments, checked: a bad kind, layer or option for the kind is a UserError."""
    args = parser().parse_args(argv)
    kind = KINDS.get(args.kind)
    if kind is None:
        raise UserError(f"unknown layer kind '{args.kind}': choose --kind from {', '.join(KINDS)}")
    for dest, (flag, unset) in _OPTIONS.items():
        if getattr(args, dest) != unset and dest not in kind.options:
            raise UserError(f"{flag} does not apply to --kind {args.kind}: drop it (`trtfuse bench layers --help`)")
    names = kind.names()
    args.layers = args.layers.split(",") if args.layers else list(kind.default or names)
    unknown = [n for n in args.layers if n not in names]
    if unknown:
        raise UserError(f"unknown {args.kind} layer(s) {', '.join(unknown)}: choose --layers from {', '.join(names)}")
    try:
        args.batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        raise UserError(f"--batches {args.batches!r}: give comma-separated integers, e.g. 256,2048") from None
    args.reps = args.reps or kind.reps
    args.peak_tops = 1979.0 if args.peak_tops is None else args.peak_tops
    if args.out is None:
        from trtfuse.bench import RESULTS

        args.out = str(RESULTS / kind.out)
    args.command = f"trtfuse bench layers --kind {args.kind}"
    return kind, args


def measure(args, result: dict, rows: str, case) -> None:
    """Every layer of args.layers at every batch: case(name, batch) -> a row, appended to result[rows]; the record
    is rewritten after each row (partial results survive a crash)."""
    for name in args.layers:
        for n in args.batches:
            result[rows].append(case(name, n))
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    kind, args = resolve(argv)
    from trtfuse.bench import import_suite

    return import_suite(f"trtfuse.bench.layers.{kind.module}", args.command).run(args)

