"""End-to-end int8 run on the GPU machine (TensorRT 8.5): ResNet-50 and EfficientNet-Lite0 engines,
with trtfuse's plugins off, on the tails, and on tails and projections (--plugins off,tails,all), measured: a thin caller of the harness (build_engine, the TensorRT backend,
`trtfuse profile`'s profile_engine, LoadGen runs) over the device bundle of trtfuse.bench.bundle.

    trtfuse bench bundle prepare --bundle .devcache/e2e     # here (CPU): the bundle
    python3.10 -m trtfuse bench bundle stash                           # GPU machine, once per carried part
    python3.10 -m trtfuse bench e2e run [--stages ...]         # GPU machine

Stages (each guarded: a failure is recorded in "errors" and the next stage runs; results merge into
--out, default /tmp/trtfuse-e2e/results/resnet50_e2e_h100.json beside the LoadGen logs, so stages can
be spread over several calls): build, engine, profile, agreement, accuracy, offline, offline_lite0,
server (offline and server run the last of --plugins). offline_lite0 is the GPU quick start's Offline run in committed form (EfficientNet-Lite0 int8,
plugins tails, batch 256, int8 input, LoadGen sized as `trtfuse run` sizes it): the like-for-like
figure trtfuse bench quickstart compares the quick start with (key offline_efficientnet_lite0).
"""

from __future__ import annotations

import argparse
import json
import os
import time
import traceback
from pathlib import Path

import numpy as np

from trtfuse.bench.bundle import STASH, BundleImages, log
from trtfuse.config import PLUGIN_MODES, plugin_mode  # noqa: E402

STAGES = ("build", "engine", "profile", "agreement", "accuracy", "offline", "offline_lite0", "server")


# ============================================================================= run (device)
class Results:
    """The output JSON, merged with what an earlier call wrote, saved after every stage."""

    def __init__(self, path: Path):
        self.path = path
        self.data = json.loads(path.read_text()) if path.is_file() else {}
        self.data.setdefault("engine", [])
        self.data.setdefault("errors", {})
        for r in self.data["engine"]:  # rows of earlier runs say true/false
            r["plugins"] = plugin_mode(r["plugins"])

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.data, indent=1) + "\n")

    def stage(self, name: str, fn, stages) -> None:
        """Run ``fn`` if ``name`` is one of ``stages``; a failure is recorded under "errors" (and the
        next stage runs), a success clears an earlier one; saved either way."""
        if name not in stages:
            return
        log(f"stage {name} ...")
        t0 = time.time()
        try:
            fn()
            self.data["errors"].pop(name, None)
        except BaseException as e:  # noqa: BLE001 - record and go on to the next stage
            traceback.print_exc()
            self.data["errors"][name] = f"{type(e).__name__}: {e}"
        log(f"stage {name} done in {time.time() - t0:.0f} s")
        self.save()

    def set_engine(self, model: str, batch: int, plugins: str, sps: float, key: str = "engine") -> None:
        """An engine-alone figure: ``key`` "engine" (input every byte 1), "engine_images" (real images)."""
        rows = [r for r in self.data.get(key, [])
                if not (r["model"] == model and r["batch"] == batch and r["plugins"] == plugins)]
        rows.append({"model": model, "batch": batch, "plugins": plugins, "samples_per_s": round(sps, 1)})
        self.data[key] = sorted(rows, key=lambda r: (r["model"], r["batch"], r["plugins"]))

    def engine_sps(self, model, batch, plugins, key: str = "engine"):
        return next((r["samples_per_s"] for r in self.data.get(key, [])
                     if r["model"] == model and r["batch"] == batch and r["plugins"] == plugins), None)


INPUT_FORMAT = os.environ.get("E2E_INPUT_FORMAT", "int8")  # "float" if int8 input will not build


def _engine(bundle, name, batch, plugins, streams=2):
    from trtfuse.engine import BuildConfig, build_engine

    cfg = BuildConfig(precision="int8", plugins=plugins, batch=batch, input_format=INPUT_FORMAT,
                      profiles=streams)
    return build_engine(bundle / "models" / name, cfg)


def _backend(bundle, name, batch, plugins, streams=2, serial_compute=False):
    from trtfuse.backends.tensorrt_backend import TensorRTBackend
    from trtfuse.models import load_prepared

    model = load_prepared(bundle / "models" / name)
    backend = TensorRTBackend(engine=str(_engine(bundle, name, batch, plugins, streams)),
                              plugins=plugins, streams=streams, serial_compute=serial_compute)
    backend.load(model, batch)
    return backend, model


def _from_ns(ns, ns_per_unit: float = 1e6):
    """A LoadGen latency in ns in ms (``ns_per_unit`` 1e9: in s), 3 decimals; None where LoadGen logged none."""
    return round(ns / ns_per_unit, 3) if ns else None


def is_tail_layer(name: str) -> bool:
    """A bottleneck tail in an engine's layer names: TensorRT's fused conv + residual Add (+ReLU),
    or the plugin node that replaces it (with the reformats TensorRT put around it)."""
    return "Add" in name or "TrtfuseResidualConv" in name


def run(bundle: Path, out: Path, stages, batches, seconds: float, server_batch: int = 256,
        server_tries: int = 5, offline_streams: int = 3, server_streams: int = 2,
        server_serial: bool = True, server_start_qps: float = 0.0, offline_serial: bool = True,
        modes=("off", "tails"), models=("resnet50", "efficientnet-lite0"), offline_seconds: float = 10.0,
        gc_disable: bool | None = None) -> int:
    import tensorrt as trt
    from trtfuse import cuda_runtime
    from trtfuse.engine_inspect import profile_engine
    from trtfuse.qps_search import search_server_qps

    res = Results(out)
    try:
        res.data["gpu"] = cuda_runtime.device_name()
    except Exception as e:  # noqa: BLE001 - no GPU: every stage will say why; keep the JSON going
        res.data["errors"]["gpu"] = f"{type(e).__name__}: {e}"
    res.data["trt_version"] = trt.__version__
    prep = bundle / "models" / "prepare.json"
    if prep.is_file():
        res.data["cpu_prepare"] = json.loads(prep.read_text())
    res.save()

    def stage(name, fn):
        res.stage(name, fn, stages)

    modes = list(modes)
    plugged = [m for m in modes if m != "off"]  # the modes compared with "off"
    lg_mode = plugged[-1] if plugged else "off"  # what the LoadGen stages run
    combos = [("resnet50", b, m) for b in batches for m in modes if "resnet50" in models] + \
             [("efficientnet-lite0", 256, m) for m in modes if "efficientnet-lite0" in models]

    def build():
        for name, b, p in combos:
            _engine(bundle, name, b, p)

    def engine():
        # Each engine alone twice: with every input byte 1 (the figure every record has) and with the
        # bundle's real images. At the H100's 700 W cap the images ran 1.5 % slower, at a 1.7 % lower clock
        # (trtfuse bench gap).
        data = BundleImages(bundle)
        images = data.images(np.arange(1024) % len(data))
        for name, b, p in combos:
            backend, _ = _backend(bundle, name, b, p)
            try:
                sps = backend.engine_throughput(b, seconds)
                sps_images = backend.engine_throughput(b, seconds, images=images) if name == "resnet50" else None
            finally:
                backend.close()
            res.set_engine(name, b, p, sps)
            if sps_images is not None:
                res.set_engine(name, b, p, sps_images, key="engine_images")
            log(f"engine-only {name} batch {b} plugins {p}: {sps:,.0f} samples/s"
                + (f", {sps_images:,.0f} on images" if sps_images else ""))
            res.save()
        for key, speedup in (("engine", "speedup"), ("engine_images", "speedup_images")):
            for b in batches:  # {batch: {mode: samples/s over plugins off's}}
                off = res.engine_sps("resnet50", b, "off", key)
                for m in plugged:
                    on = res.engine_sps("resnet50", b, m, key)
                    if off and on:
                        res.data.setdefault(speedup, {}).setdefault(str(b), {})[m] = round(on / off, 3)

    def profile():
        """Per-layer GPU time (TensorRT's profiler) of ResNet-50 at the largest batch, per plugin mode: how much
        of the network the bottleneck tails are, and how much runs on trtfuse's kernels (ours_ms) and on
        TensorRT's (trt_ms); "top" lists every layer, slowest first (what is left to replace is in its tail, so
        the whole list is kept)."""
        b = max(batches)
        res.data["profile"] = {}
        for m in modes:
            prof = profile_engine(_engine(bundle, "resnet50", b, m), b)
            layers = {r["layer"]: r["ms"] for r in prof["layers"]}
            total = prof["total_ms"]
            tails = {k: v for k, v in layers.items() if is_tail_layer(k)}
            ours = sum(v for k, v in layers.items() if "TrtfuseResidualConv" in k)
            res.data["profile"][m] = {
                "batch": b, "total_ms": round(total, 3), "tail_ms": round(sum(tails.values()), 3),
                "tail_layers": len(tails), "ours_ms": round(ours, 3), "trt_ms": round(total - ours, 3),
                "reformat_ms": round(sum(v for k, v in layers.items() if "reformat" in k.lower()), 3),
                "top": [[k, round(v, 4)] for k, v in sorted(layers.items(), key=lambda kv: -kv[1])]}
            log(f"profile plugins {m}: total {total:.2f} ms, ours {ours:.2f} ms, tails {sum(tails.values()):.2f} ms "
                f"in {len(tails)} layers")

    def agreement():
        data = BundleImages(bundle)
        x = data.images(np.arange(min(256, len(data))))
        logits = {}
        for m in modes:
            backend, _ = _backend(bundle, "resnet50", 256, m)
            try:
                logits[m] = backend.infer(x)
            finally:
                backend.close()
        from trtfuse.passes.residual_conv_rewrite import compare_logits

        # {mode: plugins off vs that mode}
        res.data["resnet50_agreement"] = {m: {
            **compare_logits(logits["off"], logits[m]),
            "inputs": "the carried int8 evaluation images, same int8 tensor to both engines"} for m in plugged}
        log(f"agreement {res.data['resnet50_agreement']}")

    def accuracy():
        data = BundleImages(bundle)
        top1 = {}
        for m in modes:
            backend, _ = _backend(bundle, "efficientnet-lite0", 256, m)
            try:
                preds = np.concatenate([backend.infer(data.images(np.arange(i, min(i + 256, len(data)))))
                                        .argmax(1) for i in range(0, len(data), 256)])
            finally:
                backend.close()
            top1[m] = float((preds == data.labels).mean())
            log(f"efficientnet-lite0 int8 plugins {m}: top-1 {top1[m]:.4f}")
        cpu = res.data.get("cpu_prepare", {}).get("models", {}).get("efficientnet-lite0", {})
        res.data["accuracy"] = {"model": "efficientnet-lite0", "n_images": len(data),
                                "fp32_top1": cpu.get("fp32_top1_onnxruntime"), "int8_top1": top1.get("off"),
                                "int8_plugins_top1": top1.get("tails"), "int8_plugins_all_top1": top1.get("all")}

    def best_batch():
        cands = [(res.engine_sps("resnet50", b, lg_mode) or 0, b) for b in batches]
        return max(cands)[1]

    def loadgen(scenario, batch, target_qps=None, duration_ms=10000, model_name="resnet50",
                like_trtfuse_run=False, mode=None):
        """One LoadGen run of ``model_name``'s engine with plugins ``mode`` (default: ``lg_mode``). ``like_trtfuse_run`` (Offline): the run
        `trtfuse run` makes (its default warm-up, LoadGen's query sized by the warm-up's estimate), with
        the engine-only figure measured after it, so that nothing runs on the GPU before LoadGen that a
        user's run would not run."""
        streams = offline_streams if scenario == "offline" else server_streams
        from trtfuse import config
        from trtfuse.lg_run import run_loadgen
        from trtfuse.report import read_loadgen_results

        overrides = {"run.scenario": scenario, "run.batch_size": batch, "run.threads": streams,
                     "run.mlperf_model": "resnet50", f"{scenario}.min_duration_ms": duration_ms}
        if not like_trtfuse_run:
            overrides["run.warmup_batches"] = 5
        if gc_disable is not None:
            overrides["run.gc_disable"] = gc_disable
        if scenario == "server":
            overrides.update({"server.target_qps": target_qps, "server.target_latency_ms": 15.0,
                              "server.min_query_count": 100})
        data = BundleImages(bundle)
        serial = server_serial if scenario == "server" else offline_serial
        backend, model = _backend(bundle, model_name, batch, mode or lg_mode, streams, serial)
        run_dir = out.parent / "loadgen-runs" / f"{model_name}-{scenario}-{time.time():.0f}"
        engine_only = None
        try:
            if scenario == "offline" and not like_trtfuse_run:
                # The bar's denominator: this engine (one profile per stream) alone, input on the device.
                # It also sizes LoadGen's one Offline query, padded, so the run lasts its min duration.
                engine_only = backend.engine_throughput(batch, 5.0)
                overrides["offline.target_qps"] = 1.1 * engine_only
            settings = config.load(None, overrides)
            lg_run = run_loadgen(backend, model, data, settings, run_dir, progress=False)
            if scenario == "offline" and like_trtfuse_run:
                engine_only = backend.engine_throughput(batch, 5.0)
        finally:
            backend.close()
        return {**read_loadgen_results(run_dir), "mean_batch": lg_run.mean_batch, "engine_only": engine_only,
                "graph_buckets": backend.graph_buckets,
                "cpu_per_wall": round(lg_run.cpu_s / lg_run.wall_s, 2), "gpu": lg_run.gpu, "stalls": lg_run.stalls,
                "gc_disable": settings["run"]["gc_disable"]}

    def offline():
        b = best_batch()
        r = loadgen("offline", b, duration_ms=round(offline_seconds * 1000))
        res.data["offline"] = {"model": "resnet50", "batch": b, "plugins": lg_mode, "samples_per_s": r.get("samples_per_s"),
                               "engine_samples_per_s": round(r["engine_only"], 1),
                               "valid": r.get("valid"), "cpu_per_wall": r.get("cpu_per_wall"),
                               "streams": offline_streams, "serial_compute": offline_serial,
                               "min_duration_s": offline_seconds, "gc_disable": r["gc_disable"],
                               # LoadGen's span from its log: the GPU's share of it is in "gpu"
                               "first_completion_ms": _from_ns(r.get("min_latency_ns")),
                               "timed_span_s": _from_ns(r.get("max_latency_ns"), 1e9), "gpu": r.get("gpu"),
                               "stalls": r.get("stalls")}
        log(f"offline {res.data['offline']}")

    def offline_lite0():
        """The GPU quick start's Offline run (README: `trtfuse run --model efficientnet-lite0 --backend
        tensorrt --plugins tails --batch-size 256 --input-format int8`): same model, engine settings
        (int8, plugins tails, int8 input, 2 streams, serial compute), batch and LoadGen sizing, so that
        the quick start's LoadGen figure has a LoadGen figure to match, not the engine alone."""
        b = 256
        r = loadgen("offline", b, model_name="efficientnet-lite0", like_trtfuse_run=True, mode="tails")
        sps, engine_only = r.get("samples_per_s"), r["engine_only"]
        res.data["offline_efficientnet_lite0"] = {
            "model": "efficientnet-lite0", "batch": b, "plugins": "tails", "input_format": INPUT_FORMAT,
            "samples_per_s": sps, "valid": r.get("valid"),
            "engine_samples_per_s": round(engine_only, 1),  # the same engine alone, after the run
            "ratio_to_engine_only": round(sps / engine_only, 4) if sps and engine_only else None,
            # LoadGen's clock runs from its issue: its first completion (min latency) is the handover
            # cost inside the timed span; its max latency is the span.
            "first_completion_ms": _from_ns(r.get("min_latency_ns")),
            "timed_span_s": _from_ns(r.get("max_latency_ns"), 1e9),
            "expected_qps": (r.get("effective_settings") or {}).get("target_qps"),
            "cpu_per_wall": r.get("cpu_per_wall"), "streams": offline_streams,
            "serial_compute": offline_serial,
            "sized_as": "trtfuse run: offline.target_qps 0, LoadGen's query from the warm-up's estimate"}
        log(f"offline efficientnet-lite0 {res.data['offline_efficientnet_lite0']}")

    def server():
        offline_sps = (res.data.get("offline") or {}).get("samples_per_s") or 10000.0
        tried = res.data.setdefault("server_search", [])

        def passes(qps):
            r = loadgen("server", server_batch, target_qps=qps)
            p99 = (r.get("latency_ns", {}).get("99.00") or 0) / 1e6
            tried.append({"target_qps": round(qps, 1), "valid": r.get("valid"), "p99_ms": round(p99, 3),
                          "batch": server_batch, "streams": server_streams, "serial_compute": server_serial,
                          "graph_buckets": r.get("graph_buckets"),
                          "mean_batch": r.get("mean_batch"),
                          "cpu_per_wall": r.get("cpu_per_wall"),
                          "invalid_reasons": r.get("invalid_reasons")})
            log(f"server target {qps:,.0f} valid {r.get('valid')} p99 {p99:.2f} ms")
            res.save()
            return bool(r.get("valid")) and p99 <= 15.0

        # Start at the bar (85 % of Offline); step up after a pass, bisect down after a failure.
        # Tries add to earlier calls' (other settings); "server" is the best valid one of all.
        search_server_qps(passes, server_start_qps or 0.85 * offline_sps, server_tries, up=1.1, down=0.6)
        valid = [t for t in tried if t["valid"] and t["p99_ms"] <= 15.0]
        best = max(valid, key=lambda t: t["target_qps"]) if valid else tried[-1]
        res.data["server"] = {"model": "resnet50", "plugins": lg_mode, "qps": best["target_qps"], "p99_ms": best["p99_ms"],
                              "valid": bool(valid), "batch": best.get("batch"), "streams": best.get("streams"),
                              "serial_compute": best.get("serial_compute", False)}

    for name, fn in (("build", build), ("engine", engine), ("profile", profile), ("agreement", agreement),
                     ("accuracy", accuracy), ("offline", offline), ("offline_lite0", offline_lite0),
                     ("server", server)):
        stage(name, fn)
    log(f"wrote {out}; errors: {res.data['errors'] or 'none'}")
    return 0 if not res.data["errors"] else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("run", help="device: build engines and measure")
    c.add_argument("--bundle", type=Path, default=STASH)
    # Outside the work tree: stages spread over several device calls add to one file (copy it to
    # $OUT at the end of each call to get it back).
    c.add_argument("--out", type=Path, default=Path("/tmp/trtfuse-e2e/results/resnet50_e2e_h100.json"))
    c.add_argument("--stages", default=",".join(STAGES))
    c.add_argument("--batches", default="256,2048")
    c.add_argument("--plugins", default="off,tails", help=f"plugin modes to build and compare, of {PLUGIN_MODES} "
                   "(off first: the others are compared with it; LoadGen runs the last)")
    c.add_argument("--models", default="resnet50,efficientnet-lite0")
    c.add_argument("--seconds", type=float, default=5.0, help="engine-only timing per engine")
    c.add_argument("--server-batch", type=int, default=256, help="engine batch for Server (built by 'build')")
    # Streams (and worker threads) of the LoadGen runs' backend (engines get one profile each) and whether
    # their engine runs overlap (concurrent) or go one at a time with the copies overlapping (serial).
    # Measured on the H100 (resnet50_e2e_h100.json): Offline 66.3k samples/s serial with 2 streams, 64.7k
    # concurrent with 6 (54.2k with 2); Server 59.3k QPS serial with 2 streams (16 graph buckets), 36.8k concurrent.
    # With the faster plugins=all engine (24 ms per batch of 2048), 3 streams: the GPU idled 69 ms of a 12.4 s
    # Offline run against 286-296 ms with 2 (gpu_trace; docs/int8_pipeline.md).
    c.add_argument("--offline-streams", type=int, default=3)
    c.add_argument("--server-streams", type=int, default=2)
    c.add_argument("--offline-serial-compute", action=argparse.BooleanOptionalAction, default=True)
    c.add_argument("--offline-seconds", type=float, default=10.0,
                   help="LoadGen's min duration of the ResNet-50 Offline run (MLPerf's own: 600)")
    c.add_argument("--gc-disable", action=argparse.BooleanOptionalAction, default=None,
                   help="LoadGen runs' run.gc_disable (default: the config's)")
    c.add_argument("--server-start-qps", type=float, default=0.0, help="first target of the search (0: 85 %% of Offline)")
    c.add_argument("--server-serial-compute", action=argparse.BooleanOptionalAction, default=True)
    c.add_argument("--server-tries", type=int, default=5, help="Server runs in the QPS search (~15 s each)")
    args = p.parse_args(argv)
    stages = [s for s in args.stages.split(",") if s]
    unknown = set(stages) - set(STAGES)
    if unknown:
        p.error(f"unknown stages {sorted(unknown)}; choose from {STAGES}")
    modes = [plugin_mode(m) for m in args.plugins.split(",") if m]
    if modes[0] != "off":
        p.error("--plugins must start with off (the other modes are compared with it)")
    return run(args.bundle, args.out, stages, [int(b) for b in args.batches.split(",")], args.seconds,
               args.server_batch, args.server_tries, args.offline_streams, args.server_streams,
               args.server_serial_compute, args.server_start_qps, args.offline_serial_compute, modes,
               [m for m in args.models.split(",") if m], args.offline_seconds, args.gc_disable)


if __name__ == "__main__":
    raise SystemExit(main())
