"""Direct vs Triton on the GPU machine (TensorRT 8.5): the same ResNet-50 int8 plugin engine run by the
harness's TensorRT backend and through a real Triton server (`trtfuse serve`: the tritonserver that
nvidia-pytriton bundles, its Python backend running trtfuse's TensorRT backend in each model instance),
LoadGen Offline and Server back to back; and one lane per GPU (`--devices`) against today's direct path.
A thin caller of the harness over the device bundle of trtfuse.bench.bundle (ResNet-50 with random
weights: performance only).

    python3.10 -m trtfuse bench triton run [--stages direct,triton-offline,triton-server,lanes]   # GPU machine

Stages (guarded and merged into --out like the e2e suite's, so they can be spread over calls):
- direct: LoadGen Offline (batch 2048 engine) and the Server QPS search (batch 256 engine), TensorRT
  backend, as `trtfuse bench e2e` measures them;
- triton-offline: the batch-2048 engine served by `trtfuse serve`, LoadGen Offline through
  `--backend triton`, for each served configuration of --served (INSTANCESxCONCURRENCY: model instances,
  and batches each runs at once) and transport of --offline-transports;
- triton-server: the batch-256 engine served so, the Server search over --transport for each
  configuration of --server-served and requests in flight of --server-inflight;
- triton-cost: what one request costs, stage by stage: requests of --cost-batches samples sent one
  after another (no queueing) to the batch-256 engine served in each configuration of --served, over
  --transport: the client's round trip against the same call on the direct backend, split by Triton's
  own statistics (queue, compute input/infer/output, the server's whole request) and the served model's
  busy time (what the stub spent running batches, from the server's log);
- lanes: Offline with `--devices all` (the product path; one GPU here) and with an explicit one-lane
  LanesBackend (the spreading wrapper's own cost), against the direct Offline;
- native-offline, native-server: the same engines through Triton's own TensorRT backend (no Python in
  the server): `trtfuse triton export` writes the repository (one instance per optimization profile,
  dynamic batching, the plugin library shipped), `trtfuse triton serve` runs the bundled tritonserver on
  it with the backend `trtfuse triton build-backend` built (build/triton_backend, carried), LoadGen
  Offline over --native-transports, then the Server search for each of --server-inflight. Every row says
  "triton_backend": "tensorrt"; the Python-backend rows above are the "python" ones;
- native-accuracy: EfficientNet-Lite0's int8 plugin engine on the bundle's evaluation images, direct and
  through the TensorRT backend (--transport): top-1 of each and how many predictions differ.
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

import numpy as np

from trtfuse.bench.bundle import STASH, BundleImages, log
from trtfuse.bench.runs import loadgen_row, server_search
from trtfuse.bench.e2e import Results
from trtfuse.sysinfo import cpu_model

STAGES = ("direct", "triton-offline", "triton-server", "triton-cost", "lanes", "native-offline", "native-server",
          "native-accuracy")
MODEL = "resnet50"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("run", help="device: measure")
    c.add_argument("--bundle", type=Path, default=STASH)
    c.add_argument("--out", type=Path, default=Path("/tmp/trtfuse-e2e/results/triton_h100.json"))
    c.add_argument("--stages", default=",".join(STAGES))
    c.add_argument("--offline-batch", type=int, default=2048)
    c.add_argument("--server-batch", type=int, default=256)
    c.add_argument("--server-tries", type=int, default=5, help="Server runs per QPS search (~15 s each)")
    c.add_argument("--transport", choices=["cuda", "shm", "grpc"], default="cuda", help="Triton transport for Server")
    c.add_argument("--offline-transports", default="cuda", help="Triton transports measured Offline")
    c.add_argument("--inflight", type=int, default=4, help="Triton requests in flight per server, Offline")
    c.add_argument("--server-inflight", default="2,4",
                   help="Triton requests in flight per server for the Server search, each value searched in turn")
    c.add_argument("--served", default="1x1,1x2",
                   help="served configurations measured Offline, INSTANCESxCONCURRENCY each: model instances "
                        "(Python backend stub processes, each its own CUDA context) and the batches each runs at "
                        "once (trtfuse serve --concurrency: streams of its one context)")
    c.add_argument("--server-served", default="1x1,1x2", help="served configurations searched for the Server")
    c.add_argument("--cost-batches", default="8,64,256", help="triton-cost: samples per request")
    c.add_argument("--cost-requests", type=int, default=200, help="triton-cost: requests timed per batch size")
    c.add_argument("--max-queue-delay-us", type=int, default=100, help="the served model's batcher delay")
    c.add_argument("--native-instances", type=int, default=None,
                   help="native-*: model instances per GPU (default: the engine's optimization profiles, 2)")
    c.add_argument("--native-transports", default="cuda,shm", help="native-offline: Triton transports measured")
    c.add_argument("--native-skip-plan-check", action="store_true",
                   help="native-*: trtfuse triton serve --skip-plan-check (the server still checks the plan)")
    args = p.parse_args(argv)
    stages = [s for s in args.stages.split(",") if s]
    if set(stages) - set(STAGES):
        p.error(f"unknown stages {sorted(set(stages) - set(STAGES))}; choose from {STAGES}")
    return run(args, stages)


def run(args, stages) -> int:
    import tensorrt as trt
    from trtfuse import cuda_runtime
    from trtfuse.backends import create_backend
    from trtfuse.backends.lanes import LanesBackend
    from trtfuse.backends.tensorrt_backend import TensorRTBackend
    from trtfuse.engine import BuildConfig, build_engine
    from trtfuse.models import load_prepared
    from trtfuse.triton.export import export_repository
    from trtfuse.triton.model_io import parse_config
    from trtfuse.triton.process import ServeProcess

    res = Results(args.out)
    res.data.update(gpu=cuda_runtime.device_name(), cpu_model=cpu_model(), trt_version=trt.__version__,
                    gpus_visible=cuda_runtime.device_count(),
                    note="ResNet-50 with random weights: performance only")
    model_dir = args.bundle / "models" / MODEL
    model = load_prepared(model_dir)
    data = BundleImages(args.bundle)
    runs = args.out.parent / "triton-runs"

    def engine(batch: int) -> Path:
        return build_engine(model_dir, BuildConfig(precision="int8", plugins=True, batch=batch,
                                                   input_format="int8", profiles=2))

    def loadgen(backend, scenario: str, batch: int, qps: float, name: str) -> dict:
        return loadgen_row(backend, model, data, scenario, batch, qps, runs, name)

    def offline_through_triton(backend, engine_only: float, name: str) -> dict:
        """LoadGen issues target x 10 s of samples, and a run that ends sooner is INVALID: a first guess (0.8 of
        the direct engine), then, if that was too few, 1.1 x the rate it reached."""
        r = loadgen(backend, "offline", args.offline_batch, 0.8 * engine_only, name)
        if not r["valid"] and r["samples_per_s"]:
            r = loadgen(backend, "offline", args.offline_batch, 1.1 * r["samples_per_s"], name)
        return r

    def search(backend, name: str, start: float) -> dict:
        """The Server search, every try on the one loaded ``backend`` (as a submission runs it: loaded
        once, then tested)."""
        return server_search(lambda qps: loadgen(backend, "server", args.server_batch, qps, name), start,
                             args.server_tries, res.save)

    def direct_backend(batch: int, **options):
        backend = TensorRTBackend(engine=str(engine(batch)), plugins=True, streams=2, **options)
        backend.load(model, batch)
        return backend

    def direct():
        backend = direct_backend(args.offline_batch)
        try:
            engine_only = backend.engine_throughput(args.offline_batch, 5.0)
            offline = loadgen(backend, "offline", args.offline_batch, 1.1 * engine_only, "direct")
        finally:
            backend.close()
        res.data["direct"] = {"offline_samples_per_s": offline["samples_per_s"], "offline_valid": offline["valid"],
                              "engine_samples_per_s": round(engine_only, 1), "offline_batch": args.offline_batch}
        res.save()
        backend = direct_backend(args.server_batch)
        try:
            found = search(backend, "direct", 0.85 * offline["samples_per_s"])
        finally:
            backend.close()
        res.data["direct"].update(server_qps=found["qps"], server_p99_ms=found["p99_ms"],
                                  server_batch=args.server_batch, server_tries=found["tries"])

    def served(batch: int, config: str) -> ServeProcess:
        """`trtfuse serve` of the batch's engine in a configuration INSTANCESxCONCURRENCY."""
        instances, concurrency = config.split("x")
        return ServeProcess([str(model_dir), "--backend", "tensorrt", "--engine", str(engine(batch)),
                             "--plugins", "tails", "--batch-size", str(batch),
                             "--max-queue-delay-us", str(args.max_queue_delay_us), "--instances", instances,
                             "--concurrency", concurrency], runs / f"serve-{batch}-{config}")

    def client(url: str, batch: int, transport: str, inflight: int, prepared=model):
        backend = create_backend("triton", url=url, transport=transport, inflight=inflight)
        backend.load(prepared, batch)
        return backend

    def triton_offline():
        engine_only = (res.data.get("direct") or {}).get("engine_samples_per_s") or 70000.0
        out = res.data.setdefault("triton", {})
        out.update(inflight=args.inflight, max_queue_delay_us=args.max_queue_delay_us, offline=[])
        for config in args.served.split(","):
            with served(args.offline_batch, config) as server:
                for transport in args.offline_transports.split(","):
                    backend = client(server.url, args.offline_batch, transport, args.inflight)
                    try:
                        out["triton_version"] = res.data["triton_version"] = backend.server_version
                        r = offline_through_triton(backend, engine_only, f"triton-{transport}-{config}")
                    finally:
                        backend.close()
                    out["offline"].append({"transport": transport, "served": config, **r})
                    res.save()
        best = max(out["offline"], key=lambda r: (r["valid"], r["samples_per_s"] or 0))
        out.update(offline_samples_per_s=best["samples_per_s"], offline_transport=best["transport"],
                   offline_served=best["served"])

    def triton_server():
        direct_res, out = res.data.get("direct") or {}, res.data.setdefault("triton", {})
        # Server cannot go past what Offline answered through a server, nor (much) past the direct Server.
        start = 0.8 * min(out.get("offline_samples_per_s") or 60000.0, direct_res.get("server_qps") or 1e9)
        out["transport_server"] = args.transport
        searches = out.setdefault("server_searches", [])  # a later call adds configurations (or redoes them)
        for config in args.server_served.split(","):
            with served(args.server_batch, config) as server:
                for inflight in [int(i) for i in args.server_inflight.split(",")]:
                    backend = client(server.url, args.server_batch, args.transport, inflight)
                    try:
                        found = search(backend, f"triton-{config}-inflight{inflight}", start)
                    finally:
                        backend.close()
                    searches[:] = [f for f in searches if (f["served"], f["inflight"]) != (config, inflight)]
                    searches.append({"served": config, "inflight": inflight, **found})
                    res.save()
        found = max(searches, key=lambda f: (f["valid"], f["qps"] or 0))
        out.update(server_qps=found["qps"], p99_ms=found["p99_ms"], valid=found["valid"],
                   server_served=found["served"], server_inflight=found["inflight"])
        res.data["transport"] = args.transport

    def request_times(backend, store, batch: int) -> list[float]:
        """Seconds of each of --cost-requests ``classify_rows`` calls of ``batch`` rows, one after another."""
        rows, times = np.arange(batch), []
        for _ in range(10):  # warm: connections, graphs, caches
            backend.classify_rows(store, rows)
        for _ in range(args.cost_requests):
            t0 = time.perf_counter()
            backend.classify_rows(store, rows)
            times.append(time.perf_counter() - t0)
        return times

    def samples_in(backend):
        """The first images of the bundle (int8) in the backend's own (page-locked) sample store."""
        store = backend.host_array((args.server_batch, *model.input_shape), np.int8)
        store[:] = data.array[:args.server_batch]
        return store

    def ms(times, q: float) -> float:
        return round(float(np.percentile(times, q)) * 1e3, 3)

    def triton_cost():
        batches = [int(b) for b in args.cost_batches.split(",")]
        out = res.data["request_cost"] = {"transport": args.transport, "engine_batch": args.server_batch,
                                          "requests_each": args.cost_requests, "direct": [], "served": []}
        backend = direct_backend(args.server_batch)
        try:
            store = samples_in(backend)
            for batch in batches:
                t = request_times(backend, store, batch)
                out["direct"].append({"batch": batch, "p50_ms": ms(t, 50), "p99_ms": ms(t, 99)})
        finally:
            backend.close()
        res.save()
        for config in args.served.split(","):
            with served(args.server_batch, config) as server:
                backend = client(server.url, args.server_batch, args.transport, 1)
                try:
                    store = samples_in(backend)
                    for batch in batches:
                        before = server_stats(backend)
                        t = request_times(backend, store, batch)
                        after = server_stats(backend)
                        n = after["success"]["count"] - before["success"]["count"]
                        server_ms = {k: round((after[k]["ns"] - before[k]["ns"]) / max(n, 1) / 1e6, 3) for k in after}
                        out["served"].append({"served": config, "batch": batch, "p50_ms": ms(t, 50),
                                              "p99_ms": ms(t, 99), "server_mean_ms": server_ms})
                        res.save()
                finally:
                    backend.close()
            busy = [(int(r), float(b)) for r, b in re.findall(r"ran (\d+) requests .* busy ([\d.]+) s",
                                                             (server.workspace / "tritonserver.log").read_text())]
            out.setdefault("stub_busy_mean_ms", {})[config] = round(
                1e3 * sum(b for _, b in busy) / max(sum(r for r, _ in busy), 1), 3)
            res.save()

    def server_stats(backend) -> dict:
        """Triton's cumulative statistics of the served model: {success, queue, compute_*: {count, ns}}."""
        stats = backend.client.get_inference_statistics(backend.spec.name, as_json=True)
        inference = stats["model_stats"][0]["inference_stats"]
        return {k: {"count": int(v.get("count", 0)), "ns": int(v.get("ns", 0))} for k, v in inference.items()
                if k in ("success", "queue", "compute_input", "compute_infer", "compute_output")}

    def lanes():
        rows = []
        direct_res = res.data.get("direct") or {}
        target = 1.1 * (direct_res.get("engine_samples_per_s") or 70000.0)
        for how, make in (("--devices all", lambda: create_backend("tensorrt", engine=str(engine(args.offline_batch)),
                                                                   plugins=True, streams=2, devices="all")),
                          ("LanesBackend of one lane", lambda: LanesBackend([TensorRTBackend(
                              engine=str(engine(args.offline_batch)), plugins=True, streams=2, device=0)]))):
            backend = make()
            backend.load(model, args.offline_batch)
            try:
                r = loadgen(backend, "offline", args.offline_batch, target, "lanes")
            finally:
                backend.close()
            rows.append({"devices": cuda_runtime.device_count(), "path": how,
                         "offline_samples_per_s": r["samples_per_s"], "valid": r["valid"],
                         "ratio_to_direct": round(r["samples_per_s"] / direct_res["offline_samples_per_s"], 4)
                         if direct_res.get("offline_samples_per_s") else None})
            res.data["lanes"] = rows
            res.save()

    def native(batch: int, prepared=model, plan: Path | None = None) -> ServeProcess:
        """An engine (the batch's ResNet-50 one by default) exported for Triton's TensorRT backend and
        served by it; ``instances_per_gpu`` says how many instances the export made."""
        from trtfuse.triton.native import plan_tensorrt

        plan = plan or engine(batch)
        name = f"{prepared.name}-{batch}"
        repo = runs / f"native-repo-{name}"
        tag, version = plan_tensorrt(plan)  # what trtfuse triton serve checks: recorded in case it refuses
        out = res.data.setdefault("triton_tensorrt_backend", {})
        out["triton_backend"] = "tensorrt"
        out.setdefault("plan_tags", {})[name] = [tag, version]
        res.save()
        folder = export_repository(prepared, plan, repo, max_queue_delay_us=args.max_queue_delay_us, force=True,
                                   instances_per_gpu=args.native_instances)
        server = ServeProcess([str(repo), *(["--skip-plan-check"] if args.native_skip_plan_check else [])],
                              runs / f"native-serve-{name}", command=("triton", "serve"))
        # what the export made of --native-instances (its default: one per optimization profile), for each row
        config = parse_config((folder / "config.pbtxt").read_text())
        server.instances_per_gpu = sum(group.count for group in config.instance_group)
        return server

    def native_accuracy():
        """EfficientNet-Lite0's int8 plugin engine on the bundle's evaluation images, direct and through
        the TensorRT backend: every top-1 the same."""
        lite_dir = args.bundle / "models" / "efficientnet-lite0"
        lite = load_prepared(lite_dir)
        plan = build_engine(lite_dir, BuildConfig(precision="int8", plugins=True, batch=256, input_format="int8",
                                                  profiles=2))
        chunks = [np.arange(i, min(i + 256, len(data))) for i in range(0, len(data), 256)]
        backend = TensorRTBackend(engine=str(plan), plugins=True, streams=2)
        backend.load(lite, 256)
        try:
            direct_top1 = np.concatenate([backend.classify(data.images(rows))[:, 0] for rows in chunks])
        finally:
            backend.close()
        with native(256, lite, plan) as server:
            backend = client(server.url, 256, args.transport, 2, lite)
            try:
                served_top1 = np.concatenate([backend.classify(data.images(rows))[:, 0] for rows in chunks])
            finally:
                backend.close()
        labels = np.asarray(data.labels)
        out = res.data.setdefault("triton_tensorrt_backend", {"triton_backend": "tensorrt"})
        out["accuracy"] = {"model": lite.name, "n_images": len(data), "transport": args.transport,
                           "direct_top1": round(float((direct_top1 == labels).mean()), 4),
                           "triton_top1": round(float((served_top1 == labels).mean()), 4),
                           "predictions_differing": int((direct_top1 != served_top1).sum())}

    def native_offline():
        engine_only = (res.data.get("direct") or {}).get("engine_samples_per_s") or 70000.0
        out = res.data.setdefault("triton_tensorrt_backend", {})
        out.update(triton_backend="tensorrt", inflight=args.inflight, max_queue_delay_us=args.max_queue_delay_us,
                   offline=[])
        with native(args.offline_batch) as server:
            out["served"] = {k: server.ready.get(k) for k in ("tensorrt", "backend_library", "plugins")}
            for transport in args.native_transports.split(","):
                # A transport the machine refuses (CUDA IPC where the sandbox has none) is a row with its
                # error: the lease's other transports are still measured.
                try:
                    backend = client(server.url, args.offline_batch, transport, args.inflight)
                    try:
                        out["triton_version"] = backend.server_version
                        r = offline_through_triton(backend, engine_only, f"native-{transport}")
                    finally:
                        backend.close()
                except Exception as e:  # noqa: BLE001 - recorded in the row
                    log(f"native-offline over {transport}: {type(e).__name__}: {e}")
                    r = {"error": f"{type(e).__name__}: {e}"}
                out["offline"].append({"triton_backend": "tensorrt", "transport": transport,
                                       "instances": server.instances_per_gpu, **r})
                res.save()
        measured = [r for r in out["offline"] if "error" not in r]
        if not measured:
            raise RuntimeError(f"no transport measured: {[r['error'] for r in out['offline']]}")
        best = max(measured, key=lambda r: (r["valid"], r["samples_per_s"] or 0))
        direct_sps = (res.data.get("direct") or {}).get("offline_samples_per_s")
        out.update(offline_samples_per_s=best["samples_per_s"], offline_transport=best["transport"],
                   offline_ratio_to_direct=round(best["samples_per_s"] / direct_sps, 4)
                   if direct_sps and best["samples_per_s"] else None)

    def native_server():
        direct_res = res.data.get("direct") or {}
        out = res.data.setdefault("triton_tensorrt_backend", {"triton_backend": "tensorrt"})
        start = 0.8 * min(out.get("offline_samples_per_s") or 60000.0, direct_res.get("server_qps") or 1e9)
        out["transport_server"] = args.transport
        searches = out.setdefault("server_searches", [])
        with native(args.server_batch) as server:
            for inflight in [int(i) for i in args.server_inflight.split(",")]:
                backend = client(server.url, args.server_batch, args.transport, inflight)
                try:
                    found = search(backend, f"native-inflight{inflight}", start)
                finally:
                    backend.close()
                instances = server.instances_per_gpu
                searches[:] = [f for f in searches if (f.get("instances"), f["inflight"]) != (instances, inflight)]
                searches.append({"triton_backend": "tensorrt", "instances": instances, "inflight": inflight, **found})
                res.save()
        # the highest valid QPS; of equals, the one with the lower p99
        found = max(searches, key=lambda f: (f["valid"], f["qps"] or 0, -(f["p99_ms"] or 0)))
        out.update(server_qps=found["qps"], p99_ms=found["p99_ms"], valid=found["valid"],
                   server_instances=found.get("instances"), server_inflight=found["inflight"],
                   server_ratio_to_direct=round(found["qps"] / direct_res["server_qps"], 4)
                   if direct_res.get("server_qps") and found["qps"] else None)

    for name, fn in (("direct", direct), ("triton-offline", triton_offline), ("triton-server", triton_server),
                     ("triton-cost", triton_cost), ("lanes", lanes), ("native-offline", native_offline),
                     ("native-server", native_server), ("native-accuracy", native_accuracy)):
        res.stage(name, fn, stages)
    log(f"wrote {args.out}; errors: {res.data['errors'] or 'none'}")
    return 0 if not res.data["errors"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
