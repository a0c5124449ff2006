"""MLPerf-conformant ResNet-50 runs on the GPU machine (TensorRT 8.5): real responses, an official
Offline run, Server, TEST01/TEST04 judged by MLCommons' scripts, and MLCommons' ImageNet scorer.

A thin caller of the harness (``trtfuse.session.run``, ``trtfuse.compliance.run_compliance``); it adds
only the device bundle (trtfuse.bench.bundle's stashed models and int8 images) and the JSON of
benchmarks/results/mlperf_conformance_h100.json. ResNet-50 has random weights: performance only.

    python3.10 -m trtfuse bench conformance run --stages STAGES [--mlperf-dir DIR] [--out FILE]

Stages (each guarded: a failure is recorded under "errors" and the next one runs; results merge
into --out, so stages can be spread over several device calls):
  engine              engine-only samples/s with the TopK output and without (scores only), and the
                      Offline LoadGen rate of each: what the response path costs on the GPU
  accuracy            EfficientNet-Lite0 int8 + plugins, LoadGen accuracy mode; top-1 by trtfuse and
                      by MLCommons' accuracy-imagenet.py (--dtype int32)
  server              Server target search (short runs), then the chosen target for --server-s
  offline-short       an Offline run of --offline-s (a reference for compliance when no official run)
  offline-official    the official profile: every mlperf.conf value (600 s, 24576 queries)
  compliance-server   TEST01 and TEST04 against the server reference
  compliance-offline  TEST01 and TEST04 against the newest offline reference (official if it ran)
Run folders go under RESULTS/<scenario>/ in the submission layout (performance/run_1, accuracy),
with RESULTS = the folder of --out.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from trtfuse.bench import REPO
from trtfuse.bench.bundle import STASH, BundleImages, log
from trtfuse.bench.e2e import Results

STAGES = ("engine", "accuracy", "server", "offline-short", "offline-official", "compliance-server",
          "compliance-offline")
PSC = 1024  # mlperf.conf's performance_sample_count for resnet50


class TiledImages:
    """The bundle's images repeated to ``n`` samples: ResNet-50 (random weights) needs mlperf.conf's
    1024 resident samples for an official run; their content does not change its speed."""

    def __init__(self, base: BundleImages, n: int):
        reps = -(-n // len(base))
        self._base, self._n = base, n
        self.names = [f"{name}#{r}" for r in range(reps) for name in base.names][:n]
        self.labels = np.tile(base.labels, reps)[:n]

    def __len__(self) -> int:
        return self._n

    def images(self, indices) -> np.ndarray:
        return self._base.images(np.asarray(indices, dtype=np.int64) % len(self._base))


def settings_for(scenario: str, batch: int, out_dir: Path, mlperf_dir: str, **extra) -> dict:
    from trtfuse import config

    overrides = {"run.scenario": scenario, "run.batch_size": batch, "run.threads": 2,
                 "run.warmup_batches": 5, "run.output_dir": str(out_dir), "run.mlperf_model": "resnet50",
                 "mlperf.inference_dir": mlperf_dir, **extra}
    return config.load(None, overrides)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cmd", choices=["run"])
    p.add_argument("--stages", default=",".join(s for s in STAGES if s != "offline-official"))
    p.add_argument("--bundle", type=Path, default=STASH)
    p.add_argument("--out", type=Path, default=Path("/tmp/trtfuse-conf/mlperf_conformance_h100.json"))
    p.add_argument("--mlperf-dir", default=str(REPO / ".devcache" / "mlperf"))
    p.add_argument("--offline-batch", type=int, default=2048)
    p.add_argument("--server-batch", type=int, default=256)
    p.add_argument("--server-start-qps", type=float, default=60000.0)
    p.add_argument("--server-tries", type=int, default=4)
    p.add_argument("--server-s", type=float, default=60.0, help="the chosen Server target's run")
    p.add_argument("--offline-s", type=float, default=60.0, help="offline-short's duration")
    p.add_argument("--compliance-s", type=float, default=60.0, help="each audited run's duration")
    args = p.parse_args(argv)
    stages = [s for s in args.stages.split(",") if s]
    unknown = set(stages) - set(STAGES)
    if unknown:
        p.error(f"unknown stages {sorted(unknown)}; choose from {STAGES}")
    return run(args, stages)


def run(args, stages) -> int:
    import tensorrt as trt
    from trtfuse import accuracy as acc
    from trtfuse import cuda_runtime, mlperf_tools, session
    from trtfuse.compliance import run_compliance
    from trtfuse.engine import BuildConfig, build_engine
    from trtfuse.qps_search import search_server_qps
    from trtfuse.models import load_prepared

    res = Results(args.out)
    results_dir = args.out.parent
    d = res.data
    d["gpu"], d["trt_version"] = cuda_runtime.device_name(), trt.__version__
    d["note"] = "ResNet-50 with random weights: performance only"
    res.save()
    images = BundleImages(args.bundle)
    resnet_images = TiledImages(images, max(PSC, len(images)))

    def stage(name, fn):
        res.stage(name, fn, stages)

    def resnet(batch, top_k=5):
        from trtfuse.backends.tensorrt_backend import TensorRTBackend

        model = load_prepared(args.bundle / "models" / "resnet50")
        engine = build_engine(model.dir, BuildConfig(precision="int8", plugins=True, batch=batch,
                                                      input_format="int8", profiles=2, top_k=top_k))
        backend = TensorRTBackend(engine=str(engine), plugins=True, streams=2, serial_compute=True)
        backend.load(model, batch)
        return model, backend

    def loadgen_run(scenario, batch, run_dir, mode="performance", top_k=5, backend_model=None, **extra):
        """One trtfuse run (report.json, user.conf, LoadGen logs) of ResNet-50 + plugins."""
        model, backend = backend_model or resnet(batch, top_k)
        try:
            s = settings_for(scenario, batch, results_dir, args.mlperf_dir, **{"run.mode": mode, **extra})
            return session.run(s, progress=False, model=model, dataset=resnet_images, backend=backend,
                               run_dir=run_dir)
        finally:
            if backend_model is None:
                backend.close()

    def summary(report):
        lg = report["loadgen"]
        eff = lg["effective_settings"]
        return {"samples_per_s": lg.get("samples_per_s"), "completed_samples_per_s": lg.get("completed_samples_per_s"),
                "scheduled_qps": lg.get("scheduled_qps"), "target_qps": eff.get("target_qps"),
                "p99_ms": (lg["latency_ns"].get("99.00") or 0) / 1e6, "valid": lg["valid"],
                "invalid_reasons": lg["invalid_reasons"], "min_duration_ms": eff.get("min_duration_ms"),
                "min_query_count": eff.get("min_query_count"),
                # Offline turns mlperf.conf's min_query_count into one query of min_sample_count samples.
                "requested_min_query_count": lg["requested_settings"].get("min_query_count"),
                "min_sample_count": eff.get("min_sample_count"),
                "performance_sample_count": eff.get("performance_sample_count"),
                "loadgen_version": lg["loadgen_version"], "mlperf_round": lg["mlperf_round"],
                "run_dir": report["run_dir"]}

    def engine():
        b = args.offline_batch
        rows = {}
        for top_k in (5, 0):
            model, backend = resnet(b, top_k)
            try:
                sps = backend.engine_throughput(b, 5.0)
                r = loadgen_run("offline", b, results_dir / "cost" / f"offline-top{top_k}", top_k=top_k,
                                backend_model=(model, backend),
                                **{"offline.min_duration_ms": 20000, "offline.target_qps": 1.05 * sps})
            finally:
                backend.close()
            rows[f"top{top_k}"] = {"engine_samples_per_s": round(sps, 1), **summary(r)}
            log(f"top_k {top_k}: engine {sps:,.0f}, LoadGen Offline {r['loadgen'].get('samples_per_s'):,.0f} samples/s")
        scores = np.random.default_rng(0).standard_normal((b, 1000)).astype(np.float32)
        from trtfuse.backends import top_k_classes

        t0 = time.perf_counter()
        for _ in range(20):
            top_k_classes(scores)
        host_ms = (time.perf_counter() - t0) / 20 * 1e3
        d["response_cost"] = {
            "batch": b, "gpu_topk": rows["top5"], "host_topk_from_scores": rows["top0"],
            "host_topk_ms_per_batch": round(host_ms, 3),
            "how": "same ResNet-50 int8 + plugins engine built with a TopK(5) output (responses ranked on the "
                   "GPU, 20 bytes/sample back) and without (scores back, ranked on the host); engine-only "
                   "5 s each, then a 20 s LoadGen Offline run of each, back to back in one process"}

    def accuracy():
        from trtfuse.backends.tensorrt_backend import TensorRTBackend

        model = load_prepared(args.bundle / "models" / "efficientnet-lite0")
        engine = build_engine(model.dir, BuildConfig(precision="int8", plugins=True, batch=256,
                                                      input_format="int8", profiles=2, top_k=5))
        backend = TensorRTBackend(engine=str(engine), plugins=True, streams=2, serial_compute=True)
        backend.load(model, 256)
        try:
            s = settings_for("offline", 256, results_dir, args.mlperf_dir, **{"run.mode": "accuracy"})
            r = session.run(s, progress=False, model=model, dataset=images, backend=backend,
                            run_dir=results_dir / "efficientnet-lite0" / "accuracy")
        finally:
            backend.close()
        run_dir = Path(r["run_dir"])
        val_map = run_dir / "val_map.txt"
        val_map.write_text("".join(f"{n} {int(lbl)}\n" for n, lbl in zip(images.names, images.labels)))
        mlperf = mlperf_tools.inference_dir(args.mlperf_dir)
        proc = mlperf_tools.run_script(mlperf, mlperf_tools.accuracy_script(mlperf),
                                       ["--mlperf-accuracy-file", run_dir / acc.ACCURACY_LOG,
                                        "--imagenet-val-file", val_map, "--dtype", mlperf_tools.RESPONSE_DTYPE],
                                       cwd=run_dir)
        (run_dir / "accuracy.txt").write_text(proc.stdout)
        ref = float(proc.stdout.split("accuracy=")[1].split("%")[0]) / 100
        d["accuracy"] = {"model": "efficientnet-lite0", "n_images": r["accuracy"]["n"],
                         "reference_script_top1": ref, "trtfuse_top1": r["accuracy"]["top1"],
                         "reference_script_output": proc.stdout.strip(), "backend": "tensorrt int8 + plugins, TopK on GPU"}
        log(f"accuracy {d['accuracy']}")

    def server():
        b = args.server_batch
        model, backend = resnet(b)
        tried = d.setdefault("server_search", [])

        def passes(qps):
            r = loadgen_run("server", b, results_dir / "server-search" / f"try{len(tried)}", backend_model=(model, backend),
                            **{"server.target_qps": qps, "server.min_duration_ms": 15000})
            sm = summary(r)
            tried.append({k: sm[k] for k in ("target_qps", "completed_samples_per_s", "p99_ms", "valid")})
            log(f"server target {qps:,.0f}: valid {sm['valid']} p99 {sm['p99_ms']:.2f} ms")
            res.save()
            return sm["valid"] and sm["p99_ms"] <= 15.0

        try:
            best, _ = search_server_qps(passes, args.server_start_qps, args.server_tries)
            target = 0.98 * best if best else 0.8 * args.server_start_qps
            r = loadgen_run("server", b, results_dir / "server" / "performance" / "run_1", backend_model=(model, backend),
                            **{"server.target_qps": target, "server.min_duration_ms": int(args.server_s * 1000)})
            r_acc = loadgen_run("server", b, results_dir / "server" / "accuracy", mode="accuracy",
                                backend_model=(model, backend), **{"server.target_qps": target})
        finally:
            backend.close()
        d["server"] = {"model": "resnet50", "batch": b, **summary(r), "responses": "top5-int32",
                       "accuracy_run": r_acc["run_dir"]}
        log(f"server {d['server']}")

    def offline(official: bool):
        b = args.offline_batch
        model, backend = resnet(b)
        try:
            engine_sps = backend.engine_throughput(b, 5.0)
            extra = {"offline.target_qps": 1.02 * engine_sps}
            if official:
                extra["run.official"] = True
            else:
                extra["offline.min_duration_ms"] = int(args.offline_s * 1000)
            name = "offline" if official else "offline-short"
            r = loadgen_run("offline", b, results_dir / name / "performance" / "run_1", backend_model=(model, backend),
                            **extra)
            r_acc = loadgen_run("offline", b, results_dir / name / "accuracy", mode="accuracy",
                                backend_model=(model, backend))
        finally:
            backend.close()
        entry = {"model": "resnet50", "batch": b, **summary(r), "engine_samples_per_s": round(engine_sps, 1),
                 "responses": "top5-int32", "official": official, "accuracy_run": r_acc["run_dir"],
                 "dataset": f"{len(resnet_images)} samples: the bundle's {len(images)} int8 images, repeated"}
        entry["share_of_engine"] = round(entry["samples_per_s"] / engine_sps, 4)
        d["offline" if official else "offline_short"] = entry
        log(f"{name} {entry}")

    def compliance(scenario):
        b = args.offline_batch if scenario == "offline" else args.server_batch
        if scenario == "offline":
            ref = results_dir / ("offline" if (results_dir / "offline" / "accuracy").is_dir() else "offline-short")
            extra = {"offline.min_duration_ms": int(args.compliance_s * 1000),
                     "offline.target_qps": (d.get("offline") or d["offline_short"])["engine_samples_per_s"] * 1.02}
        else:
            ref = results_dir / "server"
            extra = {"server.target_qps": d["server"]["target_qps"],
                     "server.min_duration_ms": int(args.compliance_s * 1000)}
        model, backend = resnet(b)
        out = d.setdefault("compliance", {})
        try:
            for test in ("TEST01", "TEST04"):
                s = settings_for(scenario, b, results_dir, args.mlperf_dir, **extra)
                stamp = time.strftime("%H%M%S")
                v = run_compliance(test, s, out=results_dir / "compliance" / f"{test}-{scenario}-{stamp}",
                                   performance_run=ref / "performance" / "run_1", accuracy_run=ref / "accuracy",
                                   progress=False, model=model, dataset=resnet_images, backend=backend)
                out.setdefault(test, {})[scenario] = "pass" if v["passed"] else "fail"
                out.setdefault("details", {})[f"{test}-{scenario}"] = {
                    k: v.get(k) for k in ("passed", "accuracy_check", "performance_check", "scores", "reference",
                                          "audited_run", "verification_tail")}
                log(f"{test} {scenario}: {'PASS' if v['passed'] else 'FAIL'}")
                res.save()
        finally:
            backend.close()

    stage("engine", engine)
    stage("accuracy", accuracy)
    stage("server", server)
    stage("offline-short", lambda: offline(False))
    stage("offline-official", lambda: offline(True))
    stage("compliance-server", lambda: compliance("server"))
    stage("compliance-offline", lambda: compliance("offline"))
    d["loadgen_version"] = next((v.get("loadgen_version") for v in (d.get("offline"), d.get("server"),
                                                                     d.get("offline_short")) if v), None)
    log(f"wrote {args.out}; errors: {d['errors'] or 'none'}")
    res.save()
    return 0 if not d["errors"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
