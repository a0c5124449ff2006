"""ResNet-50 as an MLPerf edge submission on one GPU (TensorRT, trtfuse's plugins): SingleStream,
MultiStream and Offline at the official settings with TEST01/TEST04 each, the tree, MLCommons' checker
on it, and SingleStream p90 / MultiStream p99 latency against TensorRT's own (plugins off).

A thin caller of the harness (``session.run``, ``compliance.run_compliance``, ``submission.main``): it adds
the device bundle's model and images (trtfuse.bench.bundle) and the order of the work.

    python3.10 -m trtfuse bench edge UNIT [UNIT ...] [--out DIR] [--mlperf-dir DIR]

Units (a unit whose folder is complete is skipped, so units spread over several leases resume):
  latency            SingleStream and MultiStream, --latency-s each, plugins off then each of
                     --latency-plugins (default --plugins; "auto": all without the sites latency-profile found
                     slower than TensorRT at that batch), one process and lease: the record's "latency"
                     (p90 / p99, early stopping's estimate and measured)
  latency-profile    per plugin node of --plugins all, at the latency unit's batches (1 and 8): its time
                     against TensorRT's layers for the same nodes (TensorRT's per-layer profile of the engines
                     the latency unit runs; trtfuse.plugin_sites), and the sites to exclude, over
                     --profile-rounds rounds of profile, exclude, rebuild: the record's "latency_profile", the
                     profiles in OUT/latency_profile/
  ss-perf ss-acc ss-test01 ss-test04     SingleStream (batch-1 engine, one stream): official runs (600 s)
  ms-perf ms-acc ms-test01 ms-test04     MultiStream (batch-8 engine, one stream)
  off-perf off-acc off-test01 off-test04 Offline (batch --offline-batch, two streams)
  ss ms off          the four units of that scenario
  tree               `trtfuse submission` of every run into OUT/tree/closed/<submitter>, then MLCommons'
                     submission checker (--check): OUT/checker.txt, OUT/edge_submission.json
With --plugins auto the SingleStream and MultiStream units run all without the sites latency-profile found slower
at their batch (one list per scenario, kept in the record); Offline keeps all. With --sut native every run goes
through the C++ SUT (the device step native-build first): the host's part of a query's latency shrinks, the
engines' part is the same.
A unit takes 600 s of LoadGen and more (engine builds, warm-up): start it detached and poll, e.g.
    nohup python3.10 -m trtfuse bench edge ss > /tmp/edge-ss.log 2>&1 &

ResNet-50 has random weights: performance is real; its accuracy runs are real runs of that model and fail
MLPerf's target (the checker says so; the tree takes them with --allow-invalid). Without --dataset, the
accuracy runs go over the bundle's images repeated to ImageNet's 50,000 (the size the checker wants of
an accuracy run's QSL; each repeat carries its image's label).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from trtfuse.bench import REPO
from trtfuse.build_config import BuildConfig

SCENARIOS = {"ss": "singlestream", "ms": "multistream", "off": "offline"}
KINDS = ("perf", "acc", "test01", "test04")
IMAGENET_VAL = 50000
PSC = 1024  # mlperf.conf's performance_sample_count for resnet50


def log(msg: str) -> None:
    print(f"[edge {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Tiled:
    """``base`` repeated to ``n`` samples (names made unique, labels carried)."""

    def __init__(self, base, n: int):
        reps = -(-n // len(base))
        self._base, self._n = base, n
        self.names = [f"{name}#{r}" for r in range(reps) for name in base.names][:n]
        self.labels = np.tile(np.asarray(base.labels), reps)[:n]

    def __len__(self) -> int:
        return self._n

    def images(self, indices):
        return self._base.images(np.asarray(indices, dtype=np.int64) % len(self._base))


def units(names: list[str]) -> list[str]:
    out = []
    for n in [part for name in names for part in name.split(",") if part]:
        if n in SCENARIOS:
            out += [f"{n}-{k}" for k in KINDS]
        elif n in ("latency", "latency-profile", "tree") or (
                n.split("-")[0] in SCENARIOS and n.split("-", 1)[-1] in KINDS):
            out.append(n)
        else:
            raise SystemExit(f"unknown unit {n!r}: latency, latency-profile, tree, ss|ms|off, or "
                             "ss|ms|off-perf|acc|test01|test04")
    return out


def per_query(report: dict) -> dict:
    """Where a query's time went (the harness's CUDA events, means over the run): the engine's run on the GPU, the
    copies, and the host's gap between queries. The latency metric holds all three; the engines differ in the first."""
    g = (report.get("harness") or {}).get("gpu") or {}
    out = {"gpu_run_ms": (g.get("run_ms") or {}).get("mean"), "copy_ms": (g.get("copy_ms") or {}).get("mean"),
           "host_gap_ms": (g.get("gaps") or {}).get("mean")}
    return {k: v for k, v in out.items() if v is not None}


class Edge:
    def __init__(self, args):
        self.args = args
        self.out = args.out
        self.runs = self.out / "runs"
        self.results_path = self.out / "edge_submission.json"
        self.data = json.loads(self.results_path.read_text()) if self.results_path.is_file() else {"errors": {}}

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        self.results_path.write_text(json.dumps(self.data, indent=1) + "\n")

    # -- inputs -------------------------------------------------------------------------------------
    def model(self):
        from trtfuse.models import load_prepared

        return load_prepared(self.args.bundle / "models" / "resnet50")

    def datasets(self):
        """(performance dataset, accuracy dataset)."""
        if self.args.dataset:
            from trtfuse.data import open_dataset

            d = open_dataset(self.args.dataset, self.model().preprocess, progress=False)
            return d, d
        from trtfuse.bench.bundle import BundleImages

        images = BundleImages(self.args.bundle)
        return Tiled(images, max(PSC, len(images))), Tiled(images, IMAGENET_VAL)

    def settings(self, scenario: str, plugins: str, **extra) -> dict:
        from trtfuse import config

        batch = {"singlestream": 1, "multistream": 8, "offline": self.args.offline_batch}[scenario]
        streams = 2 if scenario == "offline" else 1  # one query at a time: one stream, one worker
        overrides = {"run.scenario": scenario, "run.batch_size": batch, "run.threads": streams, "run.sut": self.args.sut,
                     "run.warmup_batches": 20, "run.output_dir": str(self.runs), "run.mlperf_model": "resnet50",
                     "run.backend": "tensorrt", "tensorrt.plugins": plugins, "tensorrt.streams": streams,
                     "tensorrt.input_format": "float" if self.args.dataset else "int8",
                     "mlperf.inference_dir": str(self.args.mlperf_dir), **extra}
        if self.args.expected_latency_ms.get(scenario):
            overrides[f"{scenario}.expected_latency_ms"] = self.args.expected_latency_ms[scenario]
        return config.load(None, overrides)

    def backend(self, s: dict, model):
        """The run's engine: TensorRT's Python backend, or with --sut native the native library's (the C++ SUT)."""
        if s["run"]["sut"] == "native":
            from trtfuse import native_sut

            return native_sut.open_engine(s, model, None)
        from trtfuse.backends import create_backend

        options = {k: v for k, v in s["tensorrt"].items() if v != ""}
        b = create_backend("tensorrt", **options)
        b.load(model, s["run"]["batch_size"])
        return b

    def offline_target(self, s: dict, model) -> float:
        """Offline's expected rate: the engine's own (timed through the Python backend, which both SUTs' engines
        share), a little over."""
        from trtfuse.backends import create_backend

        b = create_backend("tensorrt", **{k: v for k, v in s["tensorrt"].items() if v != ""})
        try:
            b.load(model, s["run"]["batch_size"])
            return 1.02 * b.engine_throughput(s["run"]["batch_size"], 5.0)
        finally:
            b.close()

    # -- units --------------------------------------------------------------------------------------
    def latency(self) -> None:
        """SingleStream p90 and MultiStream p99, TensorRT's own engine (plugins off) then ours."""
        from trtfuse import session

        model = self.model()
        perf, _ = self.datasets()
        rows = self.data.setdefault("latency", {})
        for scenario in self.args.latency_scenarios:
            for plugins in ("off", *self.args.latency_plugins):
                extra = {f"{scenario}.min_duration_ms": int(self.args.latency_s * 1000)}
                if plugins == "auto":   # all, but at the sites that lose at this batch
                    extra["tensorrt.plugin_exclude"] = list(self.excluded(scenario))
                s = self.settings(scenario, "all" if plugins == "auto" else plugins, **extra)
                backend = self.backend(s, model)
                try:
                    run_dir = self.runs / "latency" / f"{scenario}-{plugins}-{time.strftime('%H%M%S')}"
                    r = session.run(s, progress=False, model=model, dataset=perf, backend=backend, run_dir=run_dir)
                finally:
                    backend.close()
                lg = r["loadgen"]
                rows.setdefault(scenario, {})[plugins] = {
                    "percentile": lg["metric_percentile"], "early_stopping_ms": lg["latency_metric_ns"] / 1e6,
                    "measured_ms": lg["latency_percentile_ns"] / 1e6, "p50_ms": lg["latency_ns"]["50.00"] / 1e6,
                    "queries": lg["query_count"], "valid": lg["valid"], "run_dir": str(run_dir),
                    "batch": s["run"]["batch_size"], "gpu": (r.get("sysinfo") or {}).get("gpu_names"),
                    "plugin_exclude": s["tensorrt"]["plugin_exclude"], **per_query(r)}
                log(f"{scenario} plugins {plugins}: p{lg['metric_percentile']} {lg['latency_metric_ns'] / 1e6:.3f} ms")
                self.save()
            trt = rows[scenario]["off"]
            for plugins in self.args.latency_plugins:
                ratio = round(rows[scenario][plugins]["early_stopping_ms"] / trt["early_stopping_ms"], 4)
                rows[scenario][f"{plugins}_over_tensorrt"] = ratio
                if rows[scenario][plugins].get("gpu_run_ms") and trt.get("gpu_run_ms"):
                    rows[scenario][f"{plugins}_gpu_over_tensorrt"] = round(
                        rows[scenario][plugins]["gpu_run_ms"] / trt["gpu_run_ms"], 4)
                if plugins == self.args.latency_plugins[0]:
                    rows[scenario]["ours_over_tensorrt"] = ratio

    def excluded(self, scenario: str) -> list[str]:
        """The sites latency-profile found slower than TensorRT's layers at this scenario's batch (profiled now if
        this record has none)."""
        if scenario not in self.data.get("latency_profile", {}):
            self.latency_profile([scenario])
        return self.data["latency_profile"][scenario]["exclude"]

    def latency_profile(self, scenarios: list[str] | None = None) -> None:
        """Per plugin node of --plugins all at the scenario's batch: its time against TensorRT's for the nodes it
        replaced, from TensorRT's per-layer profiles of the engines the latency unit runs (plugins off, and all with
        the exclusion so far; the same settings, so the same cached engines), over --profile-rounds rounds: an
        excluded chained conv1 or pair leaves a node whose own verdict only the next round's profile gives
        (trtfuse.plugin_sites.auto_exclude, as `trtfuse build --plugins auto`)."""
        from trtfuse import plugin_sites

        model = self.model()
        record = self.data.setdefault("latency_profile", {})
        for scenario in scenarios or self.args.latency_scenarios:
            s = self.settings(scenario, "all")
            t, batch = s["tensorrt"], s["run"]["batch_size"]
            cfg = BuildConfig(precision=t["precision"], plugins="all", batch=batch, input_format=t["input_format"],
                              profiles=int(t["streams"]))
            if t["tactic_sources"]:
                cfg.tactic_sources = t["tactic_sources"]
            exclude, rounds = plugin_sites.auto_exclude(model.dir, cfg, runs=self.args.profile_runs,
                                                        rounds=self.args.profile_rounds)
            path = plugin_sites.write_json(self.out / "latency_profile" / f"{scenario}-b{batch}.json",
                                           {"rounds": rounds, "exclude": list(exclude)})
            record[scenario] = {
                "batch": batch, "gpu": rounds[0]["gpu"], "runs": rounds[0]["runs"], "exclude": list(exclude),
                "file": str(path),
                "rounds": [{"excluded_before": r["exclude"], "ours_ms": r["ours_ms"], "tensorrt_ms": r["tensorrt_ms"],
                            "total_on_ms": r["total_on_ms"], "total_off_ms": r["total_off_ms"],
                            "rows": [{k: row[k] for k in ("node", "kind", "sites", "ours_ms", "tensorrt_ms", "ratio",
                                                          "verdict")} for row in r["rows"]]} for r in rounds]}
            log(f"{scenario} (batch {batch}): {len(exclude)} sites left to TensorRT after {len(rounds)} round(s)")
            self.save()

    def unit(self, name: str) -> None:
        from trtfuse import session
        from trtfuse.compliance import run_compliance

        key, kind = name.split("-", 1)
        scenario = SCENARIOS[key]
        folder = self.runs / name
        done = folder / ("compliance.json" if kind.startswith("test") else "report.json")
        if done.is_file():
            log(f"{name}: done in an earlier call ({folder})")
            return
        if folder.exists():
            shutil.rmtree(folder)  # an unfinished unit: start it again
        model = self.model()
        perf, acc = self.datasets()
        s = self.unit_settings(scenario)
        if scenario == "offline":
            s["offline"]["target_qps"] = self.offline_target(s, model)
        backend = self.backend(s, model)
        try:
            if kind == "perf":
                r = session.run(s, progress=False, model=model, dataset=perf, backend=backend, run_dir=folder,
                                command=self.command(scenario))
            elif kind == "acc":
                s["run"]["mode"] = "accuracy"
                r = session.run(s, progress=False, model=model, dataset=acc, backend=backend, run_dir=folder,
                                command=self.command(scenario, "accuracy"))
            else:
                ref = self.runs / f"{key}-perf"
                r = run_compliance(kind.upper(), s, out=folder, performance_run=ref,
                                   accuracy_run=self.runs / f"{key}-acc" if kind == "test01" else None,
                                   progress=False, model=model, dataset=perf, backend=backend)
        finally:
            backend.close()
        entry = {"folder": str(folder), "lease_started": self.data.get("lease_started"),
                 "gpu": self.data.get("gpu")}
        if kind.startswith("test"):
            entry.update(passed=r["passed"], scores=r["scores"])
        else:
            lg = r["loadgen"]
            entry.update(valid=lg["valid"], invalid_reasons=lg["invalid_reasons"], round=lg["mlperf_round"],
                         samples_per_s=lg.get("samples_per_s"), latency_metric_ms=(lg.get("latency_metric_ns") or 0) / 1e6,
                         accuracy=r.get("accuracy"))
        self.data.setdefault("units", {})[name] = entry
        log(f"{name}: {entry}")

    def unit_settings(self, scenario: str) -> dict:
        """An official unit's settings. --plugins auto: all, less the sites latency-profile found slower at this
        scenario's batch (profiled now if the record has none; the same list for every unit of the scenario), at
        batch 1 and 8 only: Offline's batch is where the kernels were tuned, and keeps all."""
        plugins, extra = self.args.plugins, {"run.official": True}
        if plugins == "auto":
            plugins = "all"
            if scenario in ("singlestream", "multistream"):
                extra["tensorrt.plugin_exclude"] = list(self.excluded(scenario))
        return self.settings(scenario, plugins, **extra)

    def command(self, scenario: str, mode: str = "performance") -> list[str]:
        return ["python3.10", "-m", "trtfuse", "bench", "edge", f"{[k for k, v in SCENARIOS.items() if v == scenario][0]}-"
                + {"performance": "perf", "accuracy": "acc"}[mode], "--plugins", self.args.plugins, "--sut",
                self.args.sut]

    def tree(self) -> None:
        from trtfuse import submission, submission_check

        folders = [self.runs / f"{k}-{u}" for k in SCENARIOS for u in KINDS if (self.runs / f"{k}-{u}").is_dir()]
        dest = self.out / "tree" / "closed" / self.args.submitter
        parser = argparse.ArgumentParser(prog="trtfuse")
        submission.add_parser(parser.add_subparsers(dest="command"))
        argv = ["submission", str(dest), *map(str, folders), "--system", self.args.system, "--system-type", "edge",
                "--mlperf-dir", str(self.args.mlperf_dir), "--allow-invalid", "--force"]
        submission.main(parser.parse_args(argv))
        summary = json.loads((dest / "submission.json").read_text())
        verdict = submission_check.run_checker(dest, "closed", self.args.submitter, summary["mlperf_round"],
                                               self.args.mlperf_dir)
        (self.out / "checker.txt").write_text(verdict.output)
        self.data["checker"] = {"version": verdict.version, "passed": verdict.passed, "errors": verdict.errors,
                                "results": verdict.results, "no_results": verdict.no_results}
        log(submission_check.format_verdict(verdict))

    def run(self, todo: list[str]) -> int:
        if set(todo) - {"tree"}:   # the machine of the runs; the tree is written anywhere and keeps theirs
            from trtfuse.sysinfo import cpu_model

            try:
                from trtfuse import cuda_runtime

                self.data["gpu"] = cuda_runtime.device_name()
            except Exception as e:  # noqa: BLE001 - the units say what is missing
                self.data["gpu"] = f"none ({type(e).__name__})"
            self.data["lease_started"] = time.strftime("%Y-%m-%dT%H:%M:%S")
            self.data["cpu_model"] = cpu_model()
        for name in todo:
            log(f"{name} ...")
            t0 = time.time()
            try:
                {"latency": self.latency, "latency-profile": self.latency_profile,
                 "tree": self.tree}.get(name, lambda: self.unit(name))()
                self.data["errors"].pop(name, None)
            except BaseException as e:  # noqa: BLE001 - record and go on to the next unit
                import traceback

                traceback.print_exc()
                self.data["errors"][name] = f"{type(e).__name__}: {e}"
            log(f"{name} done in {time.time() - t0:.0f} s")
            self.save()
        return 0 if not self.data["errors"] else 1


def main(argv=None) -> int:
    from trtfuse.bench.bundle import STASH

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("units", nargs="+")
    p.add_argument("--out", type=Path, default=Path("/tmp/trtfuse-edge"))
    p.add_argument("--bundle", type=Path, default=STASH)
    p.add_argument("--dataset", help="an ImageNet validation folder (val_map.txt): accuracy on real images")
    p.add_argument("--mlperf-dir", type=Path,
                   default=REPO / ".devcache" / "mlperf")
    p.add_argument("--plugins", default="all", choices=["tails", "all", "auto"],
                   help="the official units' plugins; auto: all, less the sites that lose at SingleStream's and "
                        "MultiStream's batch (latency-profile's list)")
    p.add_argument("--offline-batch", type=int, default=2048)
    p.add_argument("--sut", default="python", choices=["python", "native"],
                   help="the run loop: Python's, or the C++ SUT (after the device step native-build)")
    p.add_argument("--latency-s", type=float, default=60.0)
    p.add_argument("--latency-plugins", default="",
                   help="the latency unit's plugin modes after off, comma-separated: tails, all, auto (default: "
                        "--plugins)")
    p.add_argument("--profile-runs", type=int, default=200,
                   help="latency-profile: engine runs per profile (TensorRT's per-layer mean)")
    p.add_argument("--profile-rounds", type=int, default=3,
                   help="latency-profile: rounds of profile, exclude, rebuild (each leaves the losers' sites)")
    p.add_argument("--latency-scenarios", default="singlestream,multistream",
                   help="the latency unit's scenarios (one per GPU of a host: run two processes)")
    p.add_argument("--ss-expected-ms", type=float, default=0.0,
                   help="SingleStream's expected latency (default: from the warm-up)")
    p.add_argument("--ms-expected-ms", type=float, default=0.0)
    p.add_argument("--system", default="1xH100-SXM_TRT_trtfuse")
    p.add_argument("--submitter", default="trtfuse")
    args = p.parse_args(argv)
    args.expected_latency_ms = {k: v for k, v in (("singlestream", args.ss_expected_ms),
                                                  ("multistream", args.ms_expected_ms)) if v}
    args.latency_scenarios = [x for x in args.latency_scenarios.split(",") if x]
    args.latency_plugins = [x for x in (args.latency_plugins or args.plugins).split(",") if x]
    if set(args.latency_plugins) - {"tails", "all", "auto"} or not args.latency_plugins:
        p.error(f"--latency-plugins: {args.latency_plugins} (tails, all, auto)")
    unknown = set(args.latency_scenarios) - {"singlestream", "multistream"}
    if unknown:
        p.error(f"--latency-scenarios: {sorted(unknown)} (singlestream, multistream)")
    return Edge(args).run(units(args.units))


if __name__ == "__main__":
    raise SystemExit(main())
