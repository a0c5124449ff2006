"""README.md's "GPU quick start", run verbatim on the GPU machine, then `trtfuse profile` of the
ResNet-50 plugin engine and `trtfuse compare` of plugins off vs tails; writes
benchmarks/results/gpu_quickstart_h100.json.

    python3.10 trtfuse bench quickstart --images VAL_DIR --calibration CALIB_DIR --resnet50 MODEL_DIR

The commands are read from the README's quick-start block, not written here again: what runs is what
a user pastes (with $IMAGES and $CALIBRATION set to the folders given). `trtfuse` must be on PATH.
Each command's wall time and output tail are kept; the run folders' report.json give samples/s and
top-1, set beside the committed figures they should match (within 5 %). The Offline samples/s is
matched with the e2e suite's committed LoadGen Offline run of the same model, engine settings and
batch (offline_efficientnet_lite0, its offline_lite0 stage) where there is one; the engine-only figure
(no LoadGen, no host) is reported beside it, labelled as such.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from trtfuse.bench import REPO
RESULTS = REPO / "benchmarks" / "results"


def quickstart_commands(readme: Path = REPO / "README.md") -> list[str]:
    """The `trtfuse ...` lines of the first bash block under '## GPU quick start'."""
    text = readme.read_text()
    section = text.split("## GPU quick start", 1)
    if len(section) < 2:
        raise SystemExit("README.md has no '## GPU quick start' section")
    block = re.search(r"```bash\n(.*?)```", section[1], re.S)
    if block is None:
        raise SystemExit("the GPU quick start has no ```bash block")
    return [line.strip() for line in block.group(1).splitlines() if line.strip().startswith("trtfuse ")]


def sh(command: str, env: dict, log) -> tuple[float, int, str]:
    """Run one command line with bash; (wall s, exit code, output)."""
    print(f"$ {command}", file=log, flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(["bash", "-c", command], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, check=False)
    wall = time.perf_counter() - t0
    print(proc.stdout, file=log, flush=True)
    print(f"[rc {proc.returncode}, {wall:.1f} s]", file=log, flush=True)
    return wall, proc.returncode, proc.stdout


def newest_report(runs: Path, mode: str) -> dict | None:
    reports = sorted(runs.glob(f"*-{mode}*/report.json"), key=lambda p: p.stat().st_mtime)
    return json.loads(reports[-1].read_text()) if reports else None


def committed(name: str) -> dict:
    path = RESULTS / name
    return json.loads(path.read_text()) if path.is_file() else {}


def offline_comparison(samples_per_s: float | None, model: str, batch: int, input_format: str,
                       e2e: dict) -> dict:
    """The quick start's Offline samples/s beside the e2e suite's committed figures of the same model
    and batch (plugins on): its LoadGen Offline run of the same engine (input format too), VALID, like
    for like; and the engine alone. ``ratio_to_committed`` is the like-for-like ratio where that run
    is committed, else the engine-only one; ``compared_with`` says which."""
    engine_only = next((r["samples_per_s"] for r in e2e.get("engine", []) if r["model"] == model
                        and r["batch"] == batch and r["plugins"] in (True, "tails")), None)  # (older runs: true)
    like = e2e.get("offline_efficientnet_lite0") or {}
    same_run = [like.get(k) for k in ("model", "batch", "input_format")] == [model, batch, input_format]
    loadgen = like.get("samples_per_s") if same_run and like.get("valid") else None

    def ratio(ref):
        return round(samples_per_s / ref, 4) if samples_per_s and ref else None

    return {"committed_loadgen_offline_samples_per_s": loadgen,
            "ratio_to_committed_loadgen_offline": ratio(loadgen),
            "committed_engine_only_samples_per_s": engine_only,
            "ratio_to_committed_engine_only": ratio(engine_only),
            "ratio_to_committed": ratio(loadgen) if loadgen else ratio(engine_only),
            "compared_with": ("LoadGen Offline, same model, engine settings and batch "
                              "(resnet50_e2e_h100.json offline_efficientnet_lite0)" if loadgen else
                              "the engine alone (no committed LoadGen Offline run of this model and batch)")}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", required=True, help="$IMAGES: labelled images to run on")
    p.add_argument("--calibration", required=True, help="$CALIBRATION: labelled images to calibrate on")
    p.add_argument("--resnet50", required=True, help="a prepared ResNet-50 folder with its model.int8.onnx")
    p.add_argument("--workdir", default="/tmp/trtfuse-quickstart", help="where the commands run (runs/ goes here)")
    p.add_argument("--out", default="/tmp/trtfuse-results/gpu_quickstart_h100.json")
    p.add_argument("--e2e-results", type=Path, default=RESULTS / "resnet50_e2e_h100.json",
                   help="the e2e suite's results to compare with (default the committed ones; on the GPU "
                        "machine, a fresh offline_lite0 stage's file, merged over the committed ones)")
    args = p.parse_args(argv)
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "IMAGES": args.images, "CALIBRATION": args.calibration}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    log = open(out.with_suffix(".log"), "w")
    result = {"readme_commands": [], "errors": []}
    os.chdir(work)

    for command in quickstart_commands():
        wall, rc, text = sh(command, env, log)
        result["readme_commands"].append({"command": command, "wall_s": round(wall, 1), "rc": rc,
                                          "output_tail": text.strip().splitlines()[-12:]})
        if rc != 0:
            result["errors"].append(f"{command!r} exited {rc}")
    perf, acc = newest_report(work / "runs", "performance"), newest_report(work / "runs", "accuracy")
    e2e, conf = committed("resnet50_e2e_h100.json"), committed("mlperf_conformance_h100.json")
    if args.e2e_results.is_file() and args.e2e_results != RESULTS / "resnet50_e2e_h100.json":
        fresh = json.loads(args.e2e_results.read_text())
        e2e = {**e2e, **{k: v for k, v in fresh.items() if v}}  # what a fresh stage measured, over the committed
    if perf:
        lg = perf["loadgen"]
        result["run"] = {"model": perf["model"], "scenario": lg["scenario"], "batch": perf["batch_size"],
                         "samples_per_s": lg.get("samples_per_s"), "valid": lg["valid"],
                         # LoadGen's clock runs from its issue: the wait for the first completion counts.
                         "first_completion_ms": round(lg["min_latency_ns"] / 1e6, 1)
                         if lg.get("min_latency_ns") else None,
                         **offline_comparison(lg.get("samples_per_s"), perf["model"], perf["batch_size"],
                                              perf["settings"]["tensorrt"]["input_format"], e2e)}
    if acc:
        ref = (conf.get("accuracy") or {}).get("trtfuse_top1")
        result["accuracy"] = {"model": acc["model"], "n_images": acc["accuracy"]["n"],
                              "top1": acc["accuracy"]["top1"], "committed_top1": ref,
                              "ratio_to_committed": round(acc["accuracy"]["top1"] / ref, 4) if ref else None}

    # ResNet-50 (random weights): the plugin engine's profile, and plugins off vs tails on one input set.
    engines = {}
    for plugins in ("off", "tails"):
        cmd = (f"trtfuse build {args.resnet50} --precision int8 --plugins {plugins} --batch 2048 "
               "--input-format int8")
        wall, rc, text = sh(cmd, env, log)
        lines = [line for line in text.strip().splitlines() if line.endswith(".engine")]
        if rc or not lines:
            result["errors"].append(f"{cmd!r} exited {rc}")
            continue
        engines[plugins] = lines[-1].split()[-1]
    if "tails" in engines:
        prof = Path(engines["tails"] + ".profile.json")
        wall, rc, text = sh(f"trtfuse profile {engines['tails']} --out {prof}", env, log)
        if rc == 0:
            data = json.loads(prof.read_text())
            prof_e2e = e2e.get("profile") or {}
            ref = (prof_e2e.get("tails") or prof_e2e.get("plugins") or {}).get("total_ms")  # (older runs: "plugins")
            result["profile"] = {k: data[k] for k in ("batch", "total_ms", "ours_ms", "trt_ms", "ours_layers")}
            result["profile"].update(top=[[r["layer"], r["ms"], r["ours"]] for r in data["layers"][:10]],
                                     committed_total_ms=ref, command="trtfuse profile ENGINE",
                                     ratio_to_committed=round(data["total_ms"] / ref, 4) if ref else None)
            result["profile_table"] = text.strip().splitlines()
        else:
            result["errors"].append(f"profile exited {rc}")
    if len(engines) == 2:
        cmp_out = work / "compare.json"
        wall, rc, text = sh(f"trtfuse compare {engines['off']} {engines['tails']} --model {args.resnet50} "
                            f"--dataset {args.images} --images 256 --out {cmp_out}", env, log)
        if rc == 0:
            result["compare"] = {**json.loads(cmp_out.read_text()), "command": "trtfuse compare OFF TAILS ..."}
        else:
            result["errors"].append(f"compare exited {rc}")
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result.get(k) for k in ("run", "accuracy", "profile", "errors")}, indent=1))
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
