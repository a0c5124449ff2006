"""`trtfuse bench SUITE ...`: the measurements behind the README's and the docs' figures, one suite a module here.

Each suite keeps its own arguments (`trtfuse bench SUITE --help`) and writes its JSON record; benchmarks/README.md
says what each measures and which record under benchmarks/results/ it wrote. This module only names the suites:
importing it loads nothing else, so that `python3 -m trtfuse.bench.SUITE` also runs under a Python that has only
the suite's own needs (the GPU machine's python3 with PyTorch, no TensorRT).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

# The checkout the suites read their inputs from and write their records to (src/trtfuse/bench -> the root).
REPO = Path(__file__).resolve().parents[3]
RESULTS = REPO / "benchmarks" / "results"

# name: (module under trtfuse.bench, what it measures)
SUITES: dict[str, tuple[str, str]] = {
    "layers": ("layers", "one conv layer: TensorRT's own int8 layer vs our kernel and the plugin node (--kind)"),
    "conv-kernel": ("conv_kernel", "the 1x1 kernel without TensorRT, vs torch._int_mm and the copy floor (PyTorch)"),
    "layernorm": ("layernorm", "the LayerNorm kernels vs torch's layer_norm (PyTorch)"),
    "minilm": ("minilm", "MiniLM-L6 with the LayerNorm plugins in TensorRT vs PyTorch (prepare / check)"),
    "bundle": ("bundle", "the device bundle of the network runs: prepare here, stash on the GPU machine"),
    "e2e": ("e2e", "ResNet-50 / EfficientNet-Lite0 engines with --plugins off,tails,all: engine alone, LoadGen"),
    "fullnet": ("fullnet", "the full-network record composed from the layer records and the e2e runs (CPU)"),
    "conformance": ("conformance", "MLPerf-conformant Offline, Server, TEST01/TEST04 and MLCommons' scorer"),
    "edge": ("edge", "an MLPerf edge submission tree, unit by unit, checked by MLCommons' checker"),
    "quickstart": ("quickstart", "the README's GPU quick start verbatim, then profile and compare"),
    "triton": ("triton", "direct vs Triton (trtfuse serve, each transport) and lanes: Offline, Server"),
    "native": ("native", "the native (C++) SUT against the Python one on one GPU"),
    "multigpu": ("multigpu", "the native SUT on N GPUs vs N x one, and the null engine's host path"),
    "any-resnet": ("any_resnet", "our ResNet-50 export vs torchvision's, and torchvision's ResNet-101"),
    "probe": ("probe", "the serving path without LoadGen: row copies, the backend loop's phases"),
    "gap": ("gap", "where an Offline batch loses time against the engine alone"),
    "harness-cpu": ("harness_cpu", "what the LoadGen harness costs on the CPU machine (null backend)"),
    "ab": ("ab", "two commits on one lease, one timer: engines alone and each kernel family's layers"),
}


def _usage() -> str:
    width = max(map(len, SUITES))
    rows = "\n".join(f"  {name:{width}}  {text}" for name, (_, text) in SUITES.items())
    return (f"usage: trtfuse bench SUITE [ARGS ...]   (`trtfuse bench SUITE --help`: the suite's arguments)\n\n"
            f"suites:\n{rows}\n\nWhat each writes, and the device steps that run them: benchmarks/README.md.")


def suite_module(name: str):
    """The suite's module (imported only now: most need TensorRT, CUDA or PyTorch)."""
    from trtfuse.errors import UserError

    if name not in SUITES:
        raise UserError(f"unknown bench suite '{name}': choose from {', '.join(SUITES)} (`trtfuse bench --help`)")
    return import_suite(f"trtfuse.bench.{SUITES[name][0]}", f"trtfuse bench {name}")


# what a suite may need that the CPU machine lacks, and where it is
NEEDS = {"tensorrt": "TensorRT 8.5 (the GPU machine: source /opt/trt85/env.sh)", "cuda": "cuda-python",
         "torch": "PyTorch", "onnxruntime": "ONNX Runtime"}


def import_suite(module: str, command: str):
    """The module; a missing GPU-side dependency is one line naming it, not a traceback."""
    from trtfuse.errors import UserError

    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        root = (e.name or "").split(".")[0]
        if root not in NEEDS:
            raise
        raise UserError(f"`{command}` needs {NEEDS[root]}, which this Python lacks: run it where that is installed "
                        "(benchmarks/README.md says where each suite runs)") from e


def main(argv: list[str]) -> int:
    """`trtfuse bench SUITE ARGS`: the suite's main(ARGS), its --help under the name `trtfuse bench SUITE`."""
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    module = suite_module(argv[0])
    prog, sys.argv[0] = sys.argv[0], f"trtfuse bench {argv[0]}"   # argparse names the command from argv[0]
    try:
        return module.main(argv[1:]) or 0
    finally:
        sys.argv[0] = prog
