"""The ``trtfuse`` command.

  trtfuse                      a short Offline run on the demo images, then what to do next
  trtfuse prepare MODEL        export/import a model to ONNX (resnet50, efficientnet-lite0, --onnx FILE)
  trtfuse run                  one MLPerf LoadGen test (Offline, Server, SingleStream, MultiStream)
  trtfuse accuracy RUN_DIR     top-1/top-5 of an accuracy run, optionally against a reference run
  trtfuse compliance TEST      an MLPerf compliance test (TEST01, TEST04) and MLCommons' verification
  trtfuse submission DIR ...   an MLPerf submission tree from run and compliance folders
  trtfuse build ...            build a TensorRT engine (needs TensorRT)
  trtfuse profile ENGINE       per-layer times of an engine, which layers are trtfuse's (needs TensorRT)
  trtfuse compare A B ...      two engines on the same inputs: top-1 agreement, logit difference
  trtfuse report RUN ...       runs side by side: a table, NAME.json and NAME.png
  trtfuse serve MODEL          a real Triton server serving the model on our backend
  trtfuse triton export ...    a Triton model repository for an engine (Triton's TensorRT backend)
  trtfuse plugins ...          build/check the CUDA kernels and TensorRT plugins
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from trtfuse import session
from trtfuse.config import PLUGINS_HELP
from trtfuse.errors import UserError

NEXT_STEPS = """\
Next steps:
  your ImageNet folder, real weights:
    trtfuse run --dataset DIR --model resnet50 --weights resnet50.pth
  Server (a CPU cannot meet MLPerf's 15 ms; enough queries for LoadGen's early stopping):
    trtfuse run --scenario server --target-qps 20 --latency-bound-ms 100 --min-duration-s 40
  accuracy, then top-1/top-5 (and --reference RUN_DIR for the 99 % check):
    trtfuse run --mode accuracy --dataset DIR && trtfuse accuracy RUN_DIR
  every setting: trtfuse run --help, src/trtfuse/configs/default.toml (--config FILE)"""


def _add_run_arguments(p: argparse.ArgumentParser, compliance: bool = False) -> None:
    # Each flag maps onto a key of src/trtfuse/configs/default.toml; None means "not given, keep the config's".
    p.add_argument("--config", metavar="FILE", help="TOML settings on top of src/trtfuse/configs/default.toml")
    p.add_argument("--model", dest="run.model",
                   help="resnet50, efficientnet-lite0, a prepared model folder, or an .onnx file")
    p.add_argument("--weights", metavar="FILE", help="torchvision state dict for --model resnet50")
    p.add_argument("--dataset", dest="run.dataset",
                   help="'demo', an ImageNet folder with val_map.txt, or a folder of <wnid>_*.JPEG")
    p.add_argument("--scenario", dest="run.scenario", choices=["offline", "server", "singlestream", "multistream"])
    if not compliance:  # a compliance test runs the modes it needs
        p.add_argument("--mode", dest="run.mode", choices=["performance", "accuracy"])
    p.add_argument("--backend", dest="run.backend", choices=["auto", "onnxruntime", "tensorrt", "triton", "null"],
                   help="what runs the batches (triton: Triton servers at --triton-url)")
    p.add_argument("--sut", dest="run.sut", choices=["auto", "python", "native"],
                   help="the run loop: python, native (C++ SUT and LoadGen; --backend tensorrt or null), or auto "
                        "(default: native for TensorRT once built with `trtfuse plugins build --native`)")
    p.add_argument("--batch-timeout-us", dest="native.batch_timeout_us", type=float,
                   help="--sut native: how long a free slot waits after the oldest query for a fuller batch")
    p.add_argument("--batch-size", dest="run.batch_size", type=int)
    p.add_argument("--sample-count", dest="run.sample_count", type=int,
                   help="use the first N images of the dataset (0: all)")
    p.add_argument("--threads", dest="run.threads", type=int, help="worker threads calling the backend (0: one per batch it runs at once)")
    p.add_argument("--target-qps", type=float,
                   help="Server: queries/s LoadGen sends; Offline: expected samples/s")
    p.add_argument("--latency-bound-ms", dest="server.target_latency_ms", type=float,
                   help="Server p99 latency bound")
    p.add_argument("--expected-latency-ms", type=float,
                   help="SingleStream/MultiStream: a query's expected latency (sizes LoadGen's query list; "
                        "default: from the warm-up)")
    p.add_argument("--min-duration-s", type=float, help="LoadGen's minimum test duration")
    p.add_argument("--min-query-count", type=int)
    p.add_argument("--official", dest="run.official", action="store_const", const=True,
                   help="keep every mlperf.conf value (600 s, 24576 Offline queries, 15 ms); set only the QPS")
    if not compliance:  # a compliance test uses its own audit.config
        p.add_argument("--audit-config", dest="run.audit_config", metavar="FILE",
                       help="run with an MLPerf compliance test's audit.config (TEST01, TEST04)")
    p.add_argument("--output-dir", dest="run.output_dir", help="where run folders go (default runs/)")
    p.add_argument("--engine", dest="tensorrt.engine", metavar="FILE", help="TensorRT: a built engine")
    p.add_argument("--precision", dest="tensorrt.precision", help="TensorRT: int8, fp16, ...")
    p.add_argument("--input-format", dest="tensorrt.input_format", choices=["float", "int8"],
                   help="TensorRT: the engine's input (int8: quantized on the host once, a quarter of the bytes)")
    p.add_argument("--plugins", dest="tensorrt.plugins", choices=["off", "tails", "all", "on"],
                   help=f"TensorRT: {PLUGINS_HELP} (on: the same as tails)")
    p.add_argument("--devices", dest="tensorrt.devices",
                   help="TensorRT: the GPUs to run on, one engine each (all, or e.g. 0,1; default GPU 0)")
    p.add_argument("--triton-url", dest="triton.url", metavar="HOST:PORT", nargs="+",
                   help="--backend triton: the gRPC address of each server (several: each batch goes to the "
                        "least busy); also comma-separated")
    p.add_argument("--triton-model", dest="triton.model_name", help="--backend triton: the served model's "
                   "name (default: the model's)")
    p.add_argument("--triton-transport", dest="triton.transport", choices=["grpc", "shm", "cuda"],
                   help="--backend triton: pixels in the request (grpc), in system shared memory (shm: same host) or in GPU "
                        "memory shared with the server (cuda: same host and GPU; no host copy)")
    p.add_argument("--triton-inflight", dest="triton.inflight", type=int,
                   help="--backend triton: requests in flight per server")
    p.add_argument("--quiet", action="store_true", help="no progress output")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trtfuse")
    except PackageNotFoundError:
        return "(not installed)"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trtfuse", description=__doc__.split("\n")[0].replace("``", ""),
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.split("\n")[2:]))
    p.add_argument("--version", action="version", version=f"trtfuse {_version()}")
    sub = p.add_subparsers(dest="command")

    prep = sub.add_parser("prepare", help="write a model's ONNX and description")
    prep.add_argument("model", nargs="?", help="resnet50 or efficientnet-lite0 (a name for --onnx)")
    prep.add_argument("--weights", metavar="FILE", help="torchvision state dict (resnet50)")
    prep.add_argument("--onnx", metavar="FILE", help="an ONNX classifier, e.g. MLPerf's resnet50_v1.onnx")
    prep.add_argument("--out", metavar="DIR", help="output folder (default $TRTFUSE_HOME/models/NAME)")

    run = sub.add_parser("run", help="one MLPerf LoadGen test")
    _add_run_arguments(run)
    run.add_argument("--run-dir", metavar="DIR", help="write the run into exactly this new folder")

    acc = sub.add_parser("accuracy", help="top-1/top-5 of an accuracy run")
    acc.add_argument("run_dir", help="a run folder of `trtfuse run --mode accuracy`")
    acc.add_argument("--reference", metavar="RUN_DIR", help="a reference (e.g. fp32) accuracy run")

    comp = sub.add_parser("compliance", help="an MLPerf compliance test and MLCommons' verification")
    comp.add_argument("test", choices=["TEST01", "TEST04"], help="the compliance test")
    comp.add_argument("--out", metavar="DIR", help="the test's folder (default: runs/compliance-TEST-SCENARIO-time)")
    comp.add_argument("--performance-run", metavar="RUN_DIR",
                      help="reuse this performance run as the reference (default: run one first)")
    comp.add_argument("--accuracy-run", metavar="RUN_DIR",
                      help="TEST01: reuse this accuracy run as the reference (default: run one first)")
    comp.add_argument("--mlperf-dir", dest="mlperf.inference_dir", metavar="DIR",
                      help="a checkout of mlcommons/inference (default $MLPERF_INFERENCE_DIR)")
    _add_run_arguments(comp, compliance=True)

    from trtfuse import compare_runs, engine_inspect, submission
    from trtfuse.triton import export, serve

    submission.add_parser(sub)
    engine_inspect.add_parsers(sub)
    compare_runs.add_parser(sub)
    serve.add_parser(sub)
    export.add_parser(sub)
    # Listed for --help only: main() hands these to their own parsers before this one runs.
    sub.add_parser("build", help="quantize and build a TensorRT engine (see `trtfuse build -h`)")
    sub.add_parser("plugins", help="build/check the CUDA kernels and TensorRT plugins (`trtfuse plugins -h`)")
    sub.add_parser("bench", help="the benchmark suites (`trtfuse bench --help` lists them)")
    return p


OFFICIAL_CONFLICTS = {"min_duration_s": "--min-duration-s", "min_query_count": "--min-query-count",
                      "server.target_latency_ms": "--latency-bound-ms"}


def load_settings(args: argparse.Namespace) -> dict:
    from trtfuse import config

    plain = {k: v for k, v in vars(args).items() if "." in k}
    if plain.get("run.official"):
        given = [flag for key, flag in OFFICIAL_CONFLICTS.items() if getattr(args, key, None) is not None]
        if given:
            raise UserError(f"--official keeps mlperf.conf's values, but {', '.join(given)} would override them",
                            f"drop {', '.join(given)}, or drop --official for a quick run")
    if isinstance(plain.get("triton.url"), list):  # --triton-url A B, or A,B: one comma-separated list
        plain["triton.url"] = ",".join(plain["triton.url"])
    # The scenario flags apply to the scenario being run: the config's, unless --scenario.
    scenario = config.load(args.config, plain)["run"]["scenario"]
    min_duration_ms = None if args.min_duration_s is None else int(args.min_duration_s * 1000)
    if args.target_qps is not None and scenario in ("singlestream", "multistream"):
        raise UserError(f"--target-qps does not apply to {scenario} (LoadGen sends the next query when the last is "
                        "answered)", "drop --target-qps; --expected-latency-ms sizes the run instead")
    if args.expected_latency_ms is not None and scenario not in ("singlestream", "multistream"):
        raise UserError(f"--expected-latency-ms applies to singlestream and multistream, not {scenario}",
                        "drop it, or use --target-qps")
    scenario_flags = {f"{scenario}.target_qps": args.target_qps,
                      f"{scenario}.expected_latency_ms": args.expected_latency_ms,
                      f"{scenario}.min_duration_ms": min_duration_ms,
                      f"{scenario}.min_query_count": args.min_query_count}
    return config.load(args.config, {**plain, **scenario_flags})


def _cmd_run(args) -> int:
    from trtfuse.report import format_table

    settings = load_settings(args)
    if args.run_dir and Path(args.run_dir).exists():
        raise UserError(f"--run-dir {args.run_dir} already exists", "give a new folder, or leave --run-dir out")
    result = session.run(settings, progress=not args.quiet, weights=args.weights, run_dir=args.run_dir,
                 command=["trtfuse", *args.argv])
    print(format_table(result))
    return _invalid_exit(result)


def _invalid_exit(result: dict) -> int:
    """1, with one line that says why and what to change, for a run LoadGen called INVALID."""
    from trtfuse.report import invalid_verdict

    verdict = invalid_verdict(result)
    if verdict:
        print(f"error: {verdict}", file=sys.stderr)
    return 1 if verdict else 0


def _cmd_demo() -> int:
    from trtfuse import config
    from trtfuse.report import format_table

    print("trtfuse: no command given; a short Offline run on the 20 demo images "
          "(EfficientNet-Lite0, CPU unless TensorRT is usable).", file=sys.stderr)
    from trtfuse.report import invalid_verdict

    for mode in ("performance", "accuracy"):
        result = session.run(config.load(overrides={"run.mode": mode}), progress=True, command=["trtfuse"])
        print(format_table(result))
        if invalid_verdict(result):  # a demonstration: said, not failed
            print(f"note: {invalid_verdict(result)}", file=sys.stderr)
        print()
    print(NEXT_STEPS)
    return 0


def _cmd_prepare(args) -> int:
    from trtfuse import models

    if not args.model and not args.onnx:
        raise UserError("no model given", "use `trtfuse prepare resnet50`, `trtfuse prepare "
                        "efficientnet-lite0` or `trtfuse prepare --onnx FILE`")
    prepared = models.prepare(args.model, args.out, weights=args.weights, onnx=args.onnx)
    print(f"{prepared.name}: {prepared.onnx_path}  input {prepared.input_name} "
          f"{list(prepared.input_shape)}, {prepared.num_classes} classes")
    if prepared.random_weights:
        print("note: random weights: performance only (give --weights FILE or --onnx FILE for accuracy)")
    return 0


def _cmd_accuracy(args) -> int:
    from trtfuse import accuracy

    result = accuracy.evaluate(Path(args.run_dir))
    lines = [f"top-1  {result['top1'] * 100:.2f} %", f"top-5  {result['top5'] * 100:.2f} %",
             f"images {result['n']}"]
    if args.reference:
        accuracy.check_same_images(Path(args.run_dir), Path(args.reference))
        verdict = accuracy.compare(result, accuracy.evaluate(Path(args.reference)))
        result["reference"] = verdict
        lines.append(f"ratio  {verdict['ratio'] * 100:.2f} % of the reference top-1 "
                     f"({verdict['reference_top1'] * 100:.2f} %): "
                     + ("PASS" if verdict["passed"] else "FAIL") + " at 99 %")
    report_path = Path(args.run_dir) / "report.json"
    if report_path.is_file() and json.loads(report_path.read_text()).get("random_weights"):
        from trtfuse.report import RANDOM_WEIGHTS_NOTE

        lines.append(f"note: {RANDOM_WEIGHTS_NOTE}")
    print("\n".join(lines))
    (Path(args.run_dir) / "accuracy.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0 if not args.reference or result["reference"]["passed"] else 1


def _cmd_compliance(args) -> int:
    from trtfuse.compliance import run_compliance

    settings = load_settings(args)
    verdict = run_compliance(args.test, settings, out=args.out, performance_run=args.performance_run,
                             accuracy_run=args.accuracy_run, progress=not args.quiet, weights=args.weights)
    return 0 if verdict["passed"] else 1


# Sub-commands whose parser and code live in their own module: command -> (module, function(args)).
MODULE_COMMANDS = {"submission": ("trtfuse.submission", "main"),
                   "profile": ("trtfuse.engine_inspect", "cmd_profile"),
                   "compare": ("trtfuse.engine_inspect", "cmd_compare"),
                   "report": ("trtfuse.compare_runs", "main"),
                   "serve": ("trtfuse.triton.serve", "main"),
                   "triton": ("trtfuse.triton.export", "main")}


def _delegate(command: str, argv: list[str]) -> int:
    if command == "plugins":
        from trtfuse.plugin_build import main as plugins_main

        return plugins_main(argv)
    try:
        from trtfuse.build_command import cli_main
    except ImportError as e:
        from trtfuse.backends import TENSORRT_MISSING

        raise TENSORRT_MISSING from e
    return cli_main(argv)


def main(argv: list[str] | None = None) -> int:
    from trtfuse import interrupts

    with interrupts.handled():  # Ctrl-C, SIGTERM: exit 130, nothing half-written
        return _main(sys.argv[1:] if argv is None else list(argv))


def _main(argv: list[str]) -> int:
    try:
        if argv and argv[0] in ("build", "plugins"):
            return _delegate(argv[0], argv[1:])
        if argv and argv[0] == "bench":
            from trtfuse import bench

            return bench.main(argv[1:])
        args = _parser().parse_args(argv)
        args.argv = argv
        if args.command is None:
            return _cmd_demo()
        if args.command in MODULE_COMMANDS:
            module, function = MODULE_COMMANDS[args.command]
            return getattr(importlib.import_module(module), function)(args)
        commands = {"prepare": _cmd_prepare, "run": _cmd_run, "accuracy": _cmd_accuracy,
                    "compliance": _cmd_compliance}
        return commands[args.command](args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130  # 128 + SIGINT
