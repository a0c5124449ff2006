"""Any ResNet a user brings (issue 41): our export of ResNet-50 against torchvision's (as a user exports it), and
torchvision's ResNet-101: the fusions per kind and the engine alone at batch 2048, plugins off and all, one lease.

    # here (CPU): export, calibrate (random inputs, max; random weights), quantize, count the fusions, and write a
    # bundle small enough to carry (each int8 weight tensor's bytes left out: see strip_weights)
    trtfuse bench any-resnet prepare --bundle .devcache/any_resnet
    # the GPU machine (carry .devcache/any_resnet): tools/device_trt.sh's step any-resnet runs
    python3.10 -m trtfuse bench any-resnet run --bundle .devcache/any_resnet --out RESULTS/any_resnet_h100.json

Weights: the device machine has no torch export path, and the three Q/DQ graphs' int8 weights (about 95 MB) do not
fit one carry (64 MiB). So ``prepare`` keeps each graph whole but the bytes of its large initializers (the int8 conv
weights, the fp32 fc weight), and ``run`` refills them from a seed (int8 ~ N(0, 32) clipped to [-127, 127], the
spread of a per-channel max-scaled weight; fp32 ~ N(0, 0.01)), the same way for every model, so the three engines
see one weight distribution; every other tensor (the scales, the biases) is the export's own. The fusion counts are
taken on the graphs as exported (``prepare``) and again on the refilled ones (``run``), and must agree. Random
weights: performance only.

``run`` stages (``--stages``, results merge into ``--out``): ``build`` (every engine: batch 2048, plugins off and
all; TensorRT's engine cache keeps them for a later call on a warm machine), ``engine`` (each engine alone for
``--seconds``, input every byte 1, 2 profiles as the e2e suite's engine stage). Bars (issue 41): torchvision's
ResNet-50 all/off within 2 % of our export's all/off; ResNet-101 all/off >= 1.30x; every bottleneck tail of
ResNet-50/101 fused in both exports.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import zlib
from pathlib import Path

import numpy as np

from trtfuse.sysinfo import cpu_model

MODELS = ("ours_resnet50", "tv_resnet50", "tv_resnet101")
HW = 224
STRIP_MIN_ELEMENTS = 4096   # initializers at least this large travel without their bytes
STRIPPED_FILE = "model.int8.stripped.onnx"
PREPARE_FILE = "prepare.json"
MODES = ("off", "all")


def log(msg: str) -> None:
    print(f"[any_resnet {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- weights out, weights back
def strip_weights(model) -> list[str]:
    """Drop, in place, the bytes of every initializer of at least STRIP_MIN_ELEMENTS elements (name, type and shape
    stay); returns their names."""
    stripped = []
    for t in model.graph.initializer:
        if int(np.prod(t.dims)) >= STRIP_MIN_ELEMENTS:
            for f in ("raw_data", "float_data", "int32_data", "int64_data", "double_data"):
                t.ClearField(f)
            stripped.append(t.name)
    return stripped


def fill_weights(model, names: list[str], seed: int = 41) -> None:
    """Refill, in place, the initializers ``names`` from ``seed`` and each name (the same bytes on every call, so
    TensorRT's engine cache, keyed by the ONNX bytes, finds the engine a previous call built)."""
    from onnx import TensorProto, numpy_helper

    wanted = set(names)
    for t in model.graph.initializer:
        if t.name not in wanted:
            continue
        rng = np.random.default_rng([seed, zlib.crc32(t.name.encode())])
        shape = tuple(t.dims)
        if t.data_type == TensorProto.INT8:
            value = np.clip(np.rint(rng.normal(0, 32, shape)), -127, 127).astype(np.int8)
        elif t.data_type == TensorProto.FLOAT:
            value = rng.normal(0, 0.01, shape).astype(np.float32)
        else:
            raise ValueError(f"cannot refill initializer {t.name} of type {t.data_type}")
        t.CopyFrom(numpy_helper.from_array(value, t.name))


# ----------------------------------------------------------------------------- counts
def fusion_counts(qdq) -> dict:
    """plugin_counts under --plugins tails and all (as trtfuse build rewrites), the all report's rows, and the tails
    found / fused."""
    from trtfuse.passes.fusions import rewrite
    from trtfuse.passes.residual_conv_rewrite import plugin_counts

    out = {}
    for mode in ("tails", "all"):
        result = rewrite(qdq, mode, "int8")
        out[mode] = {"nodes": result.nodes, **plugin_counts(result.model)}
        out[f"report_{mode}"] = result.report.rows()
    tail = next(r for r in out["report_all"] if r["kind"] == "tail")
    out["tails_found"], out["tails_fused"] = tail["found"], tail["fused"]
    return out


# ----------------------------------------------------------------------------- prepare (CPU)
def _export(name: str):
    from trtfuse.models import resnet50, torchvision_resnet
    from trtfuse.models.onnx_model import export_torch

    if name == "ours_resnet50":   # models/resnet50.py through our exporter: BN kept, folded by the quantizer
        return export_torch(resnet50.build()[0], (3, HW, HW)), "trtfuse export_torch (BN kept)"
    module, source = torchvision_resnet.build(name.removeprefix("tv_"))
    return torchvision_resnet.export(module, HW), f"torch.onnx.export opset 17, dynamic batch ({source} module)"


def prepare(bundle: Path, models=MODELS) -> dict:
    import onnx
    from trtfuse.passes.bn_fold import fold_pad_into_conv
    from trtfuse.models.prepared import PreparedModel, PreprocessSpec
    from trtfuse.passes.quantize import calibrate, quantize

    summary = {}
    for name in models:
        log(f"{name}: export, calibrate, quantize")
        fp32, source = _export(name)
        identities = sum(n.op_type == "Identity" for n in fp32.graph.node)
        model, _ = fold_pad_into_conv(fp32)
        x = np.random.default_rng(0).normal(size=(2, 3, HW, HW)).astype(np.float32)
        q = quantize(model, calibrate(model, [x], progress=False), "max")
        counts = fusion_counts(q.model)
        stripped_model = onnx.ModelProto.FromString(q.model.SerializeToString())
        stripped = strip_weights(stripped_model)
        # model.onnx: the stripped exported graph (the int8 build reads model.int8.onnx only; load_prepared wants
        # the file there)
        stub = onnx.ModelProto.FromString(fp32.SerializeToString())
        strip_weights(stub)
        prepared = PreparedModel(name=name, onnx_path=Path("model.onnx"), input_name=q.model.graph.input[0].name,
                                 input_shape=(3, HW, HW), num_classes=1000, label_offset=0,
                                 preprocess=PreprocessSpec(), random_weights=True,
                                 output_name=q.model.graph.output[0].name, notes={"source": source})
        out_dir = bundle / name
        out_dir.mkdir(parents=True, exist_ok=True)
        onnx.save(stripped_model, out_dir / STRIPPED_FILE)
        (out_dir / "model.onnx").write_bytes(stub.SerializeToString())
        write_meta = {"stripped": stripped, "source": source, "identity_nodes_in_export": identities,
                      "folded_bn": q.folded_bn, "activation_qdq": q.activation_qdq, "weight_qdq": q.weight_qdq,
                      "identity_adds": q.identity_adds, "counts": counts}
        (out_dir / "model.json").write_text(json.dumps(prepared.to_json(), indent=2, sort_keys=True) + "\n")
        (out_dir / "bundle.json").write_text(json.dumps(write_meta, indent=1) + "\n")
        summary[name] = {k: v for k, v in write_meta.items() if k != "stripped"}
        log(f"{name}: tails {counts['tails']}, all {counts['all']}")
    (bundle / PREPARE_FILE).write_text(json.dumps(summary, indent=1) + "\n")
    return summary


# ----------------------------------------------------------------------------- run (GPU)
def _materialize(bundle: Path, name: str) -> dict:
    """Write ``model.int8.onnx`` (the refilled Q/DQ graph) unless it is there; the counts on it."""
    import onnx

    d = bundle / name
    meta = json.loads((d / "bundle.json").read_text())
    qdq_path = d / "model.int8.onnx"
    if qdq_path.is_file():
        qdq = onnx.load(qdq_path)
    else:
        qdq = onnx.load(d / STRIPPED_FILE)
        fill_weights(qdq, meta["stripped"])
        tmp = d / ".model.int8.onnx.tmp"
        onnx.save(qdq, tmp)
        tmp.replace(qdq_path)
    counts = fusion_counts(qdq)
    if {m: counts[m] for m in ("tails", "all")} != {m: meta["counts"][m] for m in ("tails", "all")}:
        raise RuntimeError(f"{name}: the refilled graph's fusion counts {counts['all']} differ from the export's "
                           f"{meta['counts']['all']}")
    return {**meta, "counts": counts}


def run(bundle: Path, out: Path, stages, models=MODELS, batch: int = 2048, seconds: float = 5.0,
        streams: int = 2) -> int:
    from trtfuse.engine import BuildConfig, build_engine

    data = json.loads(out.read_text()) if out.is_file() else {}
    data.setdefault("models", {})
    data.setdefault("errors", {})
    try:
        import tensorrt as trt
        from trtfuse import cuda_runtime
        data["trt_version"] = trt.__version__
        data["gpu"] = cuda_runtime.device_name()
    except Exception as e:  # noqa: BLE001 - keep the JSON going; the stages say why they fail
        data["errors"]["gpu"] = f"{type(e).__name__}: {e}"
    data["cpu_model"] = cpu_model()
    data["batch"], data["streams"], data["seconds"] = batch, streams, seconds
    data["weights"] = "random (int8 refilled from a seed, see trtfuse.bench.any_resnet): performance only"

    def save():
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        tmp.replace(out)

    failed = 0
    for name in models:
        rec = data["models"].setdefault(name, {})
        try:
            meta = _materialize(bundle, name)
            rec.update(source=meta["source"], folded_bn=meta["folded_bn"], counts=meta["counts"],
                       identity_nodes_in_export=meta["identity_nodes_in_export"])
            for mode in MODES:
                cfg = BuildConfig(precision="int8", plugins=mode, batch=batch, input_format="int8",
                                  profiles=streams)
                if "build" in stages or "engine" in stages:
                    t0 = time.perf_counter()
                    engine = build_engine(bundle / name, cfg)
                    rec.setdefault("engine_file", {})[mode] = Path(engine).name
                    log(f"{name} {mode}: engine {engine} ({time.perf_counter() - t0:.0f} s)")
                if "engine" in stages:
                    sps, energy = _engine_alone(bundle / name, engine, mode, batch, seconds, streams)
                    rec.setdefault("samples_per_s", {})[mode] = round(sps, 1)
                    rec.setdefault("energy", {})[mode] = energy
                    watts = f", {energy['avg_watts']:.0f} W" if energy else ""
                    if energy and "sm_clock_mhz" in energy:
                        watts += (f", SM {energy['sm_clock_mhz']} MHz, power-capped "
                                  f"{100 * energy['power_capped_fraction']:.0f} % of the time")
                    log(f"{name} {mode}: {sps:,.0f} samples/s at batch {batch}{watts}")
                save()
            s = rec.get("samples_per_s", {})
            if s.get("off") and s.get("all"):
                rec["all_over_off"] = round(s["all"] / s["off"], 4)
        except Exception as e:  # noqa: BLE001 - one model's failure must not lose the others'
            failed += 1
            data["errors"][name] = f"{type(e).__name__}: {e}"
            log(f"{name}: FAILED {type(e).__name__}: {e}")
        save()
    data["bars"] = _bars(data["models"])
    save()
    return failed


def _engine_alone(model_dir: Path, engine, mode: str, batch: int, seconds: float,
                  streams: int) -> tuple[float, dict | None]:
    """The engine's samples/s and the GPU's energy over that span: the H100/H200 run these engines at their power
    cap, where the clock, so the rate, follows how much the weights and activations switch, not only the code."""
    from trtfuse.backends.tensorrt_backend import TensorRTBackend
    from trtfuse.gpu_energy import EnergySpan
    from trtfuse.models import load_prepared

    backend = TensorRTBackend(engine=str(engine), plugins=mode, streams=streams)
    backend.load(load_prepared(model_dir), batch)
    try:
        with EnergySpan([0]) as span:
            sps = backend.engine_throughput(batch, seconds)
        return sps, span.result(int(sps * seconds))
    finally:
        backend.close()


def _bars(models: dict) -> dict:
    ours, tv50, tv101 = (models.get(k, {}) for k in MODELS)
    bars = {}
    if ours.get("all_over_off") and tv50.get("all_over_off"):
        rel = tv50["all_over_off"] / ours["all_over_off"]
        bars["tv_resnet50_vs_ours_all_over_off"] = {"ratio": round(rel, 4), "bar": "within 2 %",
                                                    "met": abs(rel - 1) <= 0.02}
    if tv101.get("all_over_off"):
        bars["tv_resnet101_all_over_off"] = {"value": tv101["all_over_off"], "bar": ">= 1.30",
                                             "met": tv101["all_over_off"] >= 1.30}
    tails = {k: (m["counts"]["tails_fused"], m["counts"]["tails_found"]) for k, m in models.items() if "counts" in m}
    bars["every_tail_fused"] = {"tails": {k: f"{a} of {b}" for k, (a, b) in tails.items()},
                                "met": bool(tails) and all(a == b for a, b in tails.values())}
    return bars


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pp = sub.add_parser("prepare", help="CPU: export, quantize, count, write the bundle")
    pp.add_argument("--bundle", type=Path, default=Path(".devcache/any_resnet"))
    pp.add_argument("--models", default=",".join(MODELS))
    pr = sub.add_parser("run", help="GPU: build the engines and measure them alone")
    pr.add_argument("--bundle", type=Path, default=Path(".devcache/any_resnet"))
    pr.add_argument("--out", type=Path, default=Path("benchmarks/results/any_resnet_h100.json"))
    pr.add_argument("--stages", default="build,engine")
    pr.add_argument("--models", default=",".join(MODELS))
    pr.add_argument("--batch", type=int, default=2048)
    pr.add_argument("--seconds", type=float, default=5.0)
    pr.add_argument("--streams", type=int, default=2)
    args = p.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        p.error(f"unknown models {unknown}: choose from {', '.join(MODELS)}")
    if args.cmd == "prepare":
        prepare(args.bundle, models)
        return 0
    if not (args.bundle / PREPARE_FILE).is_file():
        p.error(f"{args.bundle} holds no bundle: run `trtfuse bench any-resnet prepare --bundle "
                f"{args.bundle}` on the CPU machine and carry it")
    return run(args.bundle, args.out, set(args.stages.split(",")), models, args.batch, args.seconds, args.streams)


if __name__ == "__main__":
    raise SystemExit(main())
