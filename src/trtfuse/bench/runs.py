"""LoadGen runs for the benchmark suites of the GPU machine (the triton and multigpu suites, experiments/server_switch_interval.py): one run
through `trtfuse.session.run`, summed up as a row of a results JSON, and the Server search over such runs
(the highest target LoadGen calls VALID within MLPerf ResNet-50's 15 ms)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from trtfuse.bench.bundle import log

BOUND_MS = 15.0


def loadgen_row(backend, model, dataset, scenario: str, batch: int, qps: float, runs: Path, name: str) -> dict:
    """One LoadGen run of ``backend`` (loaded) at ``qps`` (Offline: expected samples/s; Server: the target),
    10 s, its run folder under ``runs``; what a results row keeps of it."""
    from trtfuse import config, session

    overrides = {"run.scenario": scenario, "run.batch_size": batch, "run.warmup_batches": 5,
                 "run.mlperf_model": "resnet50", f"{scenario}.target_qps": qps, f"{scenario}.min_duration_ms": 10000}
    if scenario == "server":
        overrides.update({"server.target_latency_ms": BOUND_MS, "server.min_query_count": 100})
    result = session.run(config.load(None, overrides), progress=False, model=model, dataset=dataset,
                         backend=backend, run_dir=Path(runs) / f"{name}-{time.time():.0f}")
    lg, harness = result["loadgen"], result["harness"]
    latency = lg.get("latency_ns", {})
    row = {"samples_per_s": lg.get("samples_per_s"), "valid": lg.get("valid"),
           "p99_ms": round((latency.get("99.00") or 0) / 1e6, 3), "p50_ms": round((latency.get("50.00") or 0) / 1e6, 3),
           "invalid_reasons": lg.get("invalid_reasons"), "mean_batch": harness["mean_batch"],
           "cpu_per_wall": round(harness["cpu_s"] / harness["wall_s"], 2), "lanes": result.get("lanes"),
           "stalls": harness.get("stalls"), "trace": harness.get("gpu")}
    log(f"{name} {scenario} batch {batch} target {qps:,.0f}: {row}")
    return row


def server_search(run_at: Callable[[float], dict], start: float, tries: int,
                  after_try: Callable[[], None] = lambda: None) -> dict:
    """``run_at(qps)`` makes one Server run and returns its row; the search steps up after a pass and
    down after a failure (trtfuse.qps_search). ``after_try`` runs after each (e.g. save the JSON).
    Returns the highest passing target, its p99, whether any passed, and every try."""
    from trtfuse.qps_search import search_server_qps

    tried = []

    def passes(qps: float) -> bool:
        row = run_at(qps)
        tried.append({"target_qps": round(qps, 1), **row})
        after_try()
        return bool(row["valid"]) and row["p99_ms"] <= BOUND_MS

    best, _ = search_server_qps(passes, start, tries, up=1.08, down=0.7)
    shown = next(t for t in tried if t["target_qps"] == round(best, 1)) if best else tried[-1]
    return {"qps": round(best, 1) if best else None, "p99_ms": shown["p99_ms"], "valid": best is not None,
            "tries": tried}


def save_record(out: Path, data: dict) -> None:
    """Write a suite's results JSON in one step (never half-written)."""
    import json
    import os

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, out)


def run_stage(data: dict, name: str, fn: Callable[[], None], save: Callable[[], None],
              log: Callable[[str], None]) -> None:
    """One stage of a suite whose record adds up over several calls: a failure is recorded in data["errors"] and the
    next stage goes on; the stage's seconds; the record saved after it. Ctrl-C saves, then stops the suite."""
    import traceback

    t0 = time.time()
    try:
        fn()
        data["errors"].pop(name, None)
    except BaseException as e:  # noqa: BLE001 - record it, go on with the next stage
        traceback.print_exc()
        data["errors"][name] = f"{type(e).__name__}: {e}"
        if isinstance(e, KeyboardInterrupt):
            save()
            raise
    data.setdefault("stage_seconds", {})[name] = round(time.time() - t0, 1)
    log(f"stage {name} done in {time.time() - t0:.0f} s")
    save()
